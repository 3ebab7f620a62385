//! The history checkers themselves (`tests/history/`), on small hand-made
//! histories: each invariant module flags the history a broken build
//! produced (modelled on the deliberate breaks of docs/testing.md) and
//! stays quiet on the correct neighbour of that history. No cluster, no
//! processes: these run in milliseconds.

use std::time::Duration;

use fencer_testkit::history::report::render;
use fencer_testkit::history::{self, Answer, Call, Op, UpstreamEvent, Violation};

const TTL: u64 = 1_000;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn op(client: &str, call: Call, sent: u64, answered: u64, answer: Answer) -> Op {
    Op { client: client.into(), call, sent: ms(sent), answered: ms(answered), answer }
}

fn acquire(client: &str, resource: &str, rid: &str, at: (u64, u64), lease: &str, token: u64) -> Op {
    let call = Call::Acquire { resource: resource.into(), request_id: rid.into(), ttl_ms: TTL };
    op(client, call, at.0, at.1, Answer::Granted { lease_id: lease.into(), token, ttl_ms: TTL })
}

fn release(client: &str, resource: &str, lease: &str, at: (u64, u64), answer: Answer) -> Op {
    op(client, Call::Release { resource: resource.into(), lease_id: lease.into() }, at.0, at.1, answer)
}

fn renew(client: &str, resource: &str, lease: &str, at: (u64, u64), answer: Answer) -> Op {
    op(client, Call::Renew { resource: resource.into(), lease_id: lease.into() }, at.0, at.1, answer)
}

fn write(client: &str, resource: &str, token: u64, id: &str, at: (u64, u64), answer: Answer) -> Op {
    let call = Call::Write { resource: resource.into(), token, write_id: id.into() };
    op(client, call, at.0, at.1, answer)
}

fn applied(token: u64, id: &str) -> UpstreamEvent {
    UpstreamEvent::Applied { token, resource: None, write_id: Some(id.into()) }
}

fn arrived(token: u64) -> UpstreamEvent {
    UpstreamEvent::Arrived { token, resource: None }
}

/// The invariants named by `violations`, each once, in order.
fn names(violations: &[Violation]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = violations.iter().map(|v| v.invariant).collect();
    out.dedup();
    out
}

fn check(ops: &[Op], upstream: &[UpstreamEvent]) -> Vec<Violation> {
    let v = history::check(ops, upstream);
    eprintln!("{}", render("t62", ops, upstream, &[], &v));
    v
}

/// A lease A, released, then B: the correct history all checkers accept.
fn handover() -> Vec<Op> {
    vec![
        acquire("a", "r", "rid-a-000001", (0, 10), "lease-a", 5),
        write("a", "r", 5, "a-1", (10, 12), Answer::Written { status: 200 }),
        renew("a", "r", "lease-a", (300, 310), Answer::Renewed { token: 5 }),
        release("a", "r", "lease-a", (400, 410), Answer::Released),
        acquire("b", "r", "rid-b-000001", (100, 420), "lease-b", 9),
        write("b", "r", 9, "b-1", (420, 425), Answer::Written { status: 200 }),
        // A's late write after B's: fenced.
        write("a", "r", 5, "a-2", (430, 431), Answer::Fenced { epoch: 9 }),
        release("a", "r", "lease-a", (440, 445), Answer::AlreadyReleased),
    ]
}

fn handover_upstream() -> Vec<UpstreamEvent> {
    vec![arrived(5), applied(5, "a-1"), arrived(9), applied(9, "b-1")]
}

#[test]
fn t62_a_correct_handover_has_no_violation() {
    assert!(check(&handover(), &handover_upstream()).is_empty());
}

/// I1: B seen granted while A had been renewed less than a ttl earlier
/// (a grant acknowledged without quorum on the other side of a partition).
#[test]
fn t62_i1_flags_a_grant_while_the_previous_lease_is_current() {
    let ops = vec![
        acquire("a", "r", "rid-a-000001", (0, 10), "lease-a", 5),
        renew("a", "r", "lease-a", (500, 510), Answer::Renewed { token: 5 }),
        acquire("b", "r", "rid-b-000001", (900, 950), "lease-b", 9),
    ];
    let v = check(&ops, &[]);
    assert_eq!(names(&v), ["I1 single holder"], "{v:?}");
    assert_eq!(v[0].ops, [0, 1, 2], "the slice shows both leases");
    // After A's ttl ran out (renew sent at 500 + 1000), B may be granted.
    let mut later = ops.clone();
    later[2] = acquire("b", "r", "rid-b-000001", (900, 1_501), "lease-b", 9);
    assert!(check(&later, &[]).is_empty());
}

/// I2: one token for two leases (a token reused after a restart), and a
/// later acquire that got a smaller token.
#[test]
fn t62_i2_flags_a_reused_or_smaller_token() {
    let ops = vec![
        acquire("a", "r1", "rid-a-000001", (0, 10), "lease-a", 34),
        acquire("b", "r2", "rid-b-000001", (5_000, 5_010), "lease-b", 34),
        acquire("c", "r3", "rid-c-000001", (6_000, 6_010), "lease-c", 20),
    ];
    let v = check(&ops, &[]);
    assert_eq!(names(&v), ["I2 monotonic tokens"], "{v:?}");
    assert!(v.iter().any(|x| x.message.contains("token 34 was given to two leases")), "{v:?}");
    assert!(v.iter().any(|x| x.message.contains("across resources")), "{v:?}");
}

/// I3: a lower token reached the upstream after a higher one (the proxy
/// accepted a lower token), found from the upstream's own record.
#[test]
fn t62_i3_flags_a_lower_token_after_a_higher_one_at_the_upstream() {
    let mut ops = handover();
    ops[6] = write("a", "r", 5, "a-2", (430, 431), Answer::Written { status: 200 });
    let mut upstream = handover_upstream();
    upstream.extend([arrived(5), applied(5, "a-2")]);
    let v = check(&ops, &upstream);
    assert_eq!(names(&v), ["I3 fenced writes"], "{v:?}");
    assert_eq!(v.len(), 1, "one stale write, reported once: {v:?}");
    assert_eq!(v[0].upstream, [2, 4], "the slice shows the higher arrival and the stale one");
}

/// I3: a write in flight with a lower token applied after a higher token
/// arrived (the proxy forwarded the higher one without draining).
#[test]
fn t62_i3_flags_an_in_flight_lower_write_applied_after_a_higher_arrival() {
    let ops = handover();
    let upstream = vec![arrived(5), arrived(9), applied(5, "a-1"), applied(9, "b-1")];
    let v = check(&ops, &upstream);
    assert_eq!(names(&v), ["I3 fenced writes"], "{v:?}");
    assert!(v[0].message.contains("was applied"), "{v:?}");
}

/// I3: the proxy's answers against the record: a 409 that was applied.
#[test]
fn t62_i3_flags_a_fenced_answer_for_an_applied_write() {
    let ops = handover();
    let mut upstream = handover_upstream();
    upstream.push(applied(5, "a-2"));
    let v = check(&ops, &upstream);
    assert!(v.iter().any(|x| x.message.contains("answered 409, yet the upstream applied it")), "{v:?}");
}

/// I3 does not misplace writes when a broken build reused a token on two
/// resources: arrivals it cannot place are left to I2.
#[test]
fn t62_i3_places_applied_writes_by_id_when_a_token_is_reused() {
    let ops = vec![
        acquire("a", "r1", "rid-a-000001", (0, 10), "lease-a", 46),
        write("a", "r1", 46, "a-1", (10, 12), Answer::Written { status: 200 }),
        acquire("b", "r2", "rid-b-000001", (20, 30), "lease-b", 34),
        write("b", "r2", 34, "b-1", (30, 32), Answer::Written { status: 200 }),
        acquire("c", "r1", "rid-c-000001", (5_000, 5_010), "lease-c", 34),
        write("c", "r1", 34, "c-1", (5_010, 5_012), Answer::Fenced { epoch: 46 }),
    ];
    let upstream = vec![arrived(46), applied(46, "a-1"), arrived(34), applied(34, "b-1")];
    let v = check(&ops, &upstream);
    assert!(names(&v).contains(&"I2 monotonic tokens"), "{v:?}");
    assert!(!names(&v).contains(&"I3 fenced writes"), "the stale-looking token 34 was another resource's: {v:?}");
}

/// I4: a stale release reported as the holder's, after a newer lease was
/// seen (release without the lease check), and a renewal of the old lease.
#[test]
fn t62_i4_flags_a_stale_release_or_renewal_that_succeeded() {
    let mut ops = handover();
    ops[7] = release("a", "r", "lease-a", (440, 445), Answer::Released);
    ops.push(renew("a", "r", "lease-a", (450, 455), Answer::Renewed { token: 5 }));
    let v = check(&ops, &handover_upstream());
    assert_eq!(names(&v), ["I4 owner-only"], "{v:?}");
    assert_eq!(v.len(), 2, "{v:?}");
}

/// I7: one request id granted twice with different leases (a retry that
/// created a second lease).
#[test]
fn t62_i7_flags_a_retry_that_created_a_second_lease() {
    let ops = vec![
        acquire("relay->n1", "r", "rid-a-000001", (0, 10), "lease-a", 5),
        op(
            "a",
            Call::Acquire { resource: "r".into(), request_id: "rid-a-000001".into(), ttl_ms: TTL },
            0,
            11,
            Answer::Unavailable { reason: "answer lost".into() },
        ),
        acquire("a", "r", "rid-a-000001", (20, 30), "lease-a2", 7),
    ];
    let v = check(&ops, &[]);
    assert!(names(&v).contains(&"I7 exactly-once acquire"), "{v:?}");
    assert_eq!(v.iter().find(|x| x.invariant == "I7 exactly-once acquire").unwrap().ops, [0, 1, 2]);
}
