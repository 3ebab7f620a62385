//! Property tests of [`LockState::apply`] against a small reference model
//! (DESIGN §8): random command sequences over a few resources and request ids,
//! with I1, I2, I4 and I7 checked after every step.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;

use super::*;
use crate::types::AuditText;

/// The reference model: the rules of DESIGN §3.1 written as plainly as possible.
#[derive(Default, Clone)]
struct Model {
    holders: BTreeMap<String, (u128, u64, String, u64)>, // resource -> (lease, token, request id, renewed index)
    queues: BTreeMap<String, Vec<(String, u128, u64)>>,  // resource -> [(request id, lease, ttl)]
    dedup: HashMap<String, Recorded>,                    // request id -> what it led to
    ended: HashMap<u128, (EndReason, String)>,
}

/// What a request id led to, in the model.
#[derive(Clone)]
struct Recorded {
    resource: String,
    /// The holder and ttl it asked for.
    asked: (String, u64),
    outcome: DedupOutcome,
    /// Leader time of the entry that decided the outcome last.
    at_ms: u64,
}

/// Leader time of the entry at `index` in these tests.
fn at(index: u64) -> u64 {
    1_000 + index
}

impl Model {
    fn step(&mut self, index: u64, cmd: &Command) -> Outcome {
        match cmd {
            Command::Acquire(AcquireCmd { request_id, resource, holder, ttl_ms, wait, lease_id, max_waiters }) => {
                let (rid, res) = (request_id.as_str().to_string(), resource.as_str().to_string());
                if let Some(rec) = self.dedup.get(&rid) {
                    if rec.resource != res {
                        return Outcome::Rejected(Rejection::RequestIdReused(Reuse::Resource));
                    }
                    if rec.asked != (holder.as_str().to_string(), *ttl_ms) {
                        return Outcome::Rejected(Rejection::RequestIdReused(Reuse::HolderOrTtl));
                    }
                    return match &rec.outcome {
                        DedupOutcome::Granted { .. } => self.granted_or_ended(rec, resource),
                        DedupOutcome::Queued { lease_id } => {
                            let q = self.queues.get(&res).cloned().unwrap_or_default();
                            let pos = q.iter().position(|(r, _, _)| *r == rid).map_or(0, |p| p as u32 + 1);
                            Outcome::Queued { lease_id: *lease_id, position: pos }
                        }
                        DedupOutcome::LockHeld => Outcome::Rejected(Rejection::LockHeld {
                            holder: Holder::default(),
                            token: FencingToken(self.holders.get(&res).map_or(0, |h| h.1)),
                        }),
                        DedupOutcome::TooManyWaiters { limit } => {
                            Outcome::Rejected(Rejection::TooManyWaiters { limit: *limit })
                        }
                        DedupOutcome::WaitCancelled => Outcome::Rejected(Rejection::WaitCancelled),
                    };
                }
                let lease = lease_id.to_u128();
                let (out, rec) = if !self.holders.contains_key(&res) {
                    self.holders.insert(res.clone(), (lease, index, rid.clone(), index));
                    (
                        Outcome::Granted(Grant {
                            resource: resource.clone(),
                            lease_id: *lease_id,
                            token: FencingToken(index),
                            ttl_ms: *ttl_ms,
                            waited: false,
                        }),
                        DedupOutcome::Granted {
                            lease_id: *lease_id,
                            token: FencingToken(index),
                            ttl_ms: *ttl_ms,
                            waited: false,
                        },
                    )
                } else if !wait {
                    (
                        Outcome::Rejected(Rejection::LockHeld {
                            holder: Holder::default(),
                            token: FencingToken(self.holders[&res].1),
                        }),
                        DedupOutcome::LockHeld,
                    )
                } else {
                    let q = self.queues.entry(res.clone()).or_default();
                    if q.len() >= *max_waiters as usize {
                        (
                            Outcome::Rejected(Rejection::TooManyWaiters { limit: *max_waiters }),
                            DedupOutcome::TooManyWaiters { limit: *max_waiters },
                        )
                    } else {
                        q.push((rid.clone(), lease, *ttl_ms));
                        (
                            Outcome::Queued { lease_id: *lease_id, position: q.len() as u32 },
                            DedupOutcome::Queued { lease_id: *lease_id },
                        )
                    }
                };
                let asked = (holder.as_str().to_string(), *ttl_ms);
                self.dedup.insert(rid, Recorded { resource: res, asked, outcome: rec, at_ms: at(index) });
                out
            }
            Command::Renew { resource, lease_id } => match self.holders.get_mut(resource.as_str()) {
                Some(h) if h.0 == lease_id.to_u128() => {
                    h.3 = index;
                    Outcome::Renewed { token: FencingToken(h.1), ttl_ms: 5000 }
                }
                _ => Outcome::Rejected(self.why_not(resource, lease_id)),
            },
            Command::Release { resource, lease_id } => {
                let res = resource.as_str();
                if self.holders.get(res).is_some_and(|h| h.0 == lease_id.to_u128()) {
                    self.end(index, res, EndReason::Released);
                    Outcome::Released { was_holder: true }
                } else if self.ended.get(&lease_id.to_u128()) == Some(&(EndReason::Released, res.to_string())) {
                    Outcome::Released { was_holder: false }
                } else {
                    Outcome::Rejected(self.why_not(resource, lease_id))
                }
            }
            Command::Expire { resource, lease_id, basis_index } => {
                let res = resource.as_str();
                let hit = self.holders.get(res).is_some_and(|h| h.0 == lease_id.to_u128() && h.3 == *basis_index);
                if hit {
                    self.end(index, res, EndReason::Expired);
                }
                Outcome::Expired { expired: hit }
            }
            Command::CancelWait { resource, request_id } => {
                let (res, rid) = (resource.as_str(), request_id.as_str());
                let q = self.queues.entry(res.to_string()).or_default();
                if let Some(p) = q.iter().position(|(r, _, _)| r == rid) {
                    q.remove(p);
                    let rec = self.dedup.get_mut(rid).unwrap();
                    (rec.outcome, rec.at_ms) = (DedupOutcome::WaitCancelled, at(index));
                    return Outcome::WaitCancel(CancelOutcome::Cancelled);
                }
                match self.dedup.get(rid) {
                    Some(rec) if rec.resource == res && matches!(rec.outcome, DedupOutcome::Granted { .. }) => {
                        Outcome::WaitCancel(match self.granted_or_ended(rec, resource) {
                            Outcome::Granted(g) => CancelOutcome::AlreadyGranted(g),
                            Outcome::Rejected(Rejection::LeaseEnded(e)) => CancelOutcome::GrantEnded(e),
                            other => unreachable!("{other:?}"),
                        })
                    }
                    _ => Outcome::WaitCancel(CancelOutcome::NotWaiting),
                }
            }
            Command::ForceRelease { resource, .. } => {
                let token = self.holders.get(resource.as_str()).map(|h| FencingToken(h.1));
                if token.is_some() {
                    self.end(index, resource.as_str(), EndReason::ForceReleased);
                }
                Outcome::ForceReleased { released_token: token }
            }
            Command::AcquireInQuota { acquire, quota } => {
                let AcquireCmd { request_id, resource, wait, .. } = acquire;
                if !self.dedup.contains_key(request_id.as_str()) {
                    let under = |name: &String| name.starts_with(&quota.prefix);
                    let held = self.holders.keys().filter(|r| under(r)).count() as u64;
                    let queued = self.queues.iter().filter(|(r, _)| under(r)).map(|(_, q)| q.len() as u64).sum::<u64>();
                    let free = !self.holders.contains_key(resource.as_str());
                    if let Some(max) = quota.max_active_locks.filter(|m| free && held >= *m) {
                        return Outcome::Rejected(Rejection::TenantLimit {
                            limit: QuotaLimit::ActiveLocks,
                            value: max,
                        });
                    }
                    if let Some(max) = quota.max_waiters.filter(|m| !free && *wait && queued >= *m) {
                        return Outcome::Rejected(Rejection::TenantLimit { limit: QuotaLimit::Waiters, value: max });
                    }
                }
                let plain = Command::Acquire(acquire.clone());
                self.step(index, &plain)
            }
            Command::PruneDedup { .. } | Command::RegisterSigningKey { .. } | Command::RetireSigningKey { .. } => {
                unreachable!("not generated for the model")
            }
        }
    }

    /// A recorded grant: live while its lease holds the lock, else ended.
    fn granted_or_ended(&self, rec: &Recorded, resource: &ResourceName) -> Outcome {
        let DedupOutcome::Granted { lease_id, token, ttl_ms, waited } = rec.outcome else { unreachable!() };
        let grant = Grant { resource: resource.clone(), lease_id, token, ttl_ms, waited };
        if self.holders.get(resource.as_str()).is_some_and(|h| h.0 == lease_id.to_u128()) {
            Outcome::Granted(grant)
        } else {
            Outcome::Rejected(Rejection::LeaseEnded(EndedGrant { grant, granted_at_ms: rec.at_ms }))
        }
    }

    fn why_not(&self, resource: &ResourceName, lease: &LeaseId) -> Rejection {
        match self.ended.get(&lease.to_u128()) {
            Some((EndReason::Expired | EndReason::ForceReleased, r)) if r == resource.as_str() => {
                Rejection::LeaseExpired
            }
            _ => Rejection::NotHolder,
        }
    }

    fn end(&mut self, index: u64, res: &str, reason: EndReason) {
        let (lease, ..) = self.holders.remove(res).unwrap();
        self.ended.insert(lease, (reason, res.to_string()));
        let q = self.queues.entry(res.to_string()).or_default();
        if !q.is_empty() {
            let (rid, lease, ttl) = q.remove(0);
            self.holders.insert(res.to_string(), (lease, index, rid.clone(), index));
            let rec = self.dedup.get_mut(&rid).unwrap();
            rec.outcome = DedupOutcome::Granted {
                lease_id: LeaseId::from_u128(lease),
                token: FencingToken(index),
                ttl_ms: ttl,
                waited: true,
            };
            rec.at_ms = at(index);
        }
    }
}

/// A command template; lease ids and indexes are resolved against the state.
#[derive(Debug, Clone)]
enum Op {
    /// `odd` asks, now and then, with another holder or ttl than the
    /// request id's other uses (a request id reused by mistake).
    Acquire {
        req: u8,
        res: u8,
        wait: bool,
        odd: u8,
    },
    AcquireInQuota {
        req: u8,
        res: u8,
        wait: bool,
        odd: u8,
        max_locks: u8,
        max_waiters: u8,
    },
    Renew {
        res: u8,
        pick: u8,
    },
    Release {
        res: u8,
        pick: u8,
    },
    Expire {
        res: u8,
        pick: u8,
        stale_basis: bool,
    },
    Cancel {
        req: u8,
        res: u8,
    },
    Force {
        res: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..8, 0u8..3, any::<bool>(), any::<u8>()).prop_map(|(req, res, wait, odd)| Op::Acquire { req, res, wait, odd }),
        2 => (0u8..8, 0u8..3, any::<bool>(), any::<u8>(), 1u8..3, 1u8..3).prop_map(|(req, res, wait, odd, max_locks, max_waiters)| {
            Op::AcquireInQuota { req, res, wait, odd, max_locks, max_waiters }
        }),
        2 => (0u8..3, any::<u8>()).prop_map(|(res, pick)| Op::Renew { res, pick }),
        3 => (0u8..3, any::<u8>()).prop_map(|(res, pick)| Op::Release { res, pick }),
        2 => (0u8..3, any::<u8>(), any::<bool>()).prop_map(|(res, pick, stale_basis)| Op::Expire { res, pick, stale_basis }),
        1 => (0u8..8, 0u8..3).prop_map(|(req, res)| Op::Cancel { req, res }),
        1 => (0u8..3).prop_map(|res| Op::Force { res }),
    ]
}

fn res(i: u8) -> ResourceName {
    ResourceName::new(format!("res/{i}")).unwrap()
}

fn req(i: u8) -> RequestId {
    RequestId::new(format!("request-{i}")).unwrap()
}

/// The holder request `r` asks as: its own, or (1 in 16) another.
fn holder(r: u8, odd: u8) -> Holder {
    Holder::new(if odd.is_multiple_of(16) { format!("other-{r}") } else { format!("h{r}") }).unwrap()
}

/// The ttl a request asks for: 5 s, or (1 in 16) 6 s.
fn ttl(odd: u8) -> u64 {
    if odd % 16 == 1 { 6000 } else { 5000 }
}

/// Turns an op into a concrete command: `pick` chooses the current lease (so
/// the command can succeed) or an old or never-issued one (so I4 is exercised).
fn resolve(op: &Op, sm: &LockState, issued: &[LeaseId], index: u64) -> Command {
    let lease = |res_i: u8, pick: u8| -> LeaseId {
        let current = sm.resource(&res(res_i)).and_then(|r| r.lock.as_ref()).map(|l| l.lease_id);
        match (pick % 4, current) {
            (0 | 1, Some(l)) => l,
            (2, _) if !issued.is_empty() => issued[pick as usize % issued.len()],
            _ => LeaseId::from_u128(0xdead_0000 + u128::from(pick)),
        }
    };
    match *op {
        Op::Acquire { req: r, res: s, wait, odd } => Command::Acquire(AcquireCmd {
            request_id: req(r),
            resource: res(s),
            holder: holder(r, odd),
            ttl_ms: ttl(odd),
            wait,
            // Lease ids derive from the index: unique, like the leader's CSPRNG draws.
            lease_id: LeaseId::from_u128(u128::from(index) << 64 | 0xabc),
            max_waiters: 3,
        }),
        Op::AcquireInQuota { req: r, res: s, wait, odd, max_locks, max_waiters } => Command::AcquireInQuota {
            acquire: AcquireCmd {
                request_id: req(r),
                resource: res(s),
                holder: holder(r, odd),
                ttl_ms: ttl(odd),
                wait,
                lease_id: LeaseId::from_u128(u128::from(index) << 64 | 0xabc),
                max_waiters: 3,
            },
            // Every generated resource is under "res/": the limits bite.
            quota: Quota {
                prefix: "res/".into(),
                max_active_locks: Some(u64::from(max_locks)),
                max_waiters: Some(u64::from(max_waiters)),
            },
        },
        Op::Renew { res: s, pick } => Command::Renew { resource: res(s), lease_id: lease(s, pick) },
        Op::Release { res: s, pick } => Command::Release { resource: res(s), lease_id: lease(s, pick) },
        Op::Expire { res: s, pick, stale_basis } => {
            let basis = sm.resource(&res(s)).and_then(|r| r.lock.as_ref()).map_or(0, |l| l.renewed_index);
            Command::Expire {
                resource: res(s),
                lease_id: lease(s, pick),
                basis_index: if stale_basis { basis.saturating_sub(1) } else { basis },
            }
        }
        Op::Cancel { req: r, res: s } => Command::CancelWait { resource: res(s), request_id: req(r) },
        Op::Force { res: s } => Command::ForceRelease {
            resource: res(s),
            caller: AuditText::new("model", "caller").unwrap(),
            reason: AuditText::new("model test", "reason").unwrap(),
        },
    }
}

/// LockHeld carries the holder's description, which the model does not track.
fn normalise(o: Outcome) -> Outcome {
    match o {
        Outcome::Rejected(Rejection::LockHeld { token, .. }) => {
            Outcome::Rejected(Rejection::LockHeld { holder: Holder::default(), token })
        }
        Outcome::Renewed { token, .. } => Outcome::Renewed { token, ttl_ms: 5000 },
        o => o,
    }
}

fn check_invariants(sm: &LockState, all_tokens: &mut Vec<u64>, events: &[Event], index: u64) {
    // I1: at most one current lease per resource, and no request id both holds
    // and waits, or waits twice anywhere (I7: no second waiter).
    let mut seen_requests = HashSet::new();
    let mut seen_leases = HashSet::new();
    let mut locks = 0;
    let mut waiters = 0;
    for state in sm.resources().values() {
        assert!(!state.is_idle(), "idle records are deleted");
        if let Some(l) = &state.lock {
            locks += 1;
            assert!(seen_requests.insert(l.request_id.clone()), "request {} holds twice", l.request_id);
            assert!(seen_leases.insert(l.lease_id), "lease {} current twice", l.lease_id);
        } else {
            assert!(state.waiters.is_empty(), "a free lock has waiters");
        }
        for w in &state.waiters {
            waiters += 1;
            assert!(seen_requests.insert(w.request_id.clone()), "request {} queued twice", w.request_id);
        }
    }
    assert_eq!(sm.lock_count(), locks);
    assert_eq!(sm.waiter_count(), waiters);
    // I2: a grant's token is the index of the entry that granted it, greater than
    // every token granted before.
    for e in events {
        if let Event::LeaseStarted { token, .. } = e {
            assert_eq!(token.0, index);
            assert!(all_tokens.iter().all(|t| *t < token.0), "token {token} not above all earlier tokens");
            all_tokens.push(token.0);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn apply_matches_the_model_and_keeps_invariants(ops in proptest::collection::vec(op(), 1..120)) {
        let mut sm = LockState::new();
        let mut model = Model::default();
        let mut issued: Vec<LeaseId> = Vec::new();
        let mut tokens = Vec::new();
        let mut first_outcome: HashMap<RequestId, Outcome> = HashMap::new();
        let mut first_asked: HashMap<RequestId, (ResourceName, (String, u64))> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            let index = i as u64 + 1;
            let cmd = resolve(op, &sm, &issued, index);
            let before = sm.clone();
            let applied = sm.apply(index, &LogCommand { at_ms: at(index), cmd: cmd.clone() });
            let expected = model.step(index, &cmd);
            prop_assert_eq!(normalise(applied.outcome.clone()), normalise(expected), "step {} {:?}", index, cmd);
            check_invariants(&sm, &mut tokens, &applied.events, index);
            for e in &applied.events {
                if let Event::LeaseStarted { lease_id, .. } = e {
                    issued.push(*lease_id);
                }
            }
            // I4: a renew or release with a lease id that is not current changes nothing.
            if let Command::Renew { resource, lease_id } | Command::Release { resource, lease_id } = &cmd {
                let current = before.resource(resource).and_then(|r| r.lock.as_ref()).map(|l| l.lease_id);
                if current != Some(*lease_id) {
                    prop_assert_eq!(before.resources(), sm.resources(), "a stale lease id changed the state");
                }
            }
            // I7: a retried acquire returns the original grant or queue
            // slot; a grant only while its lease is current, else the
            // original grant as ended; a retry that asks for another
            // holder or ttl than the first use is refused.
            if let Some(AcquireCmd { request_id, resource, holder, ttl_ms, .. }) = cmd.acquire() {
                let current = |s: &LockState| s.resource(resource).and_then(|r| r.lock.as_ref()).map(|l| l.lease_id);
                match (&applied.outcome, first_outcome.get(request_id)) {
                    (Outcome::Granted(g), Some(Outcome::Granted(first))) => prop_assert_eq!(g, first),
                    (Outcome::Rejected(Rejection::LeaseEnded(e)), Some(Outcome::Granted(first))) => {
                        prop_assert_eq!(&e.grant, first)
                    }
                    (Outcome::Queued { lease_id, .. }, Some(Outcome::Queued { lease_id: first, .. })) => {
                        prop_assert_eq!(lease_id, first)
                    }
                    _ => {}
                }
                if let Outcome::Rejected(Rejection::LeaseEnded(e)) = &applied.outcome {
                    prop_assert_ne!(current(&before), Some(e.grant.lease_id), "an ended grant is current");
                    // The token is the granting entry's index (I2): its time is the grant's.
                    prop_assert_eq!(e.granted_at_ms, at(e.grant.token.0), "the time of the granting entry");
                }
                let asked = (holder.as_str().to_string(), *ttl_ms);
                match first_asked.get(request_id) {
                    Some(first) if first.0 == *resource && first.1 != asked => prop_assert_eq!(
                        &applied.outcome,
                        &Outcome::Rejected(Rejection::RequestIdReused(Reuse::HolderOrTtl))
                    ),
                    Some(_) => {}
                    None if !matches!(applied.outcome, Outcome::Rejected(Rejection::TenantLimit { .. })) => {
                        first_asked.insert(request_id.clone(), (resource.clone(), asked));
                    }
                    None => {}
                }
            }
            // Never a live answer for a lease that is not current.
            if let Outcome::Granted(g) | Outcome::WaitCancel(CancelOutcome::AlreadyGranted(g)) = &applied.outcome {
                let lock = sm.resource(&g.resource).and_then(|r| r.lock.as_ref()).map(|l| l.lease_id);
                prop_assert_eq!(lock, Some(g.lease_id), "a grant answered for a lease that is not current");
            }
            if let Some(AcquireCmd { request_id, .. }) = cmd.acquire()
                && !matches!(applied.outcome, Outcome::Rejected(Rejection::TenantLimit { .. }))
            {
                first_outcome.entry(request_id.clone()).or_insert(applied.outcome.clone());
            }
        }
    }
}

#[test]
fn release_promotes_exactly_one_waiter_with_the_release_index_as_token() {
    let mut sm = LockState::new();
    let acquire = |r: u8, wait: bool, idx: u64| LogCommand {
        at_ms: 0,
        cmd: Command::Acquire(AcquireCmd {
            request_id: req(r),
            resource: res(0),
            holder: Holder::default(),
            ttl_ms: 1000,
            wait,
            lease_id: LeaseId::from_u128(u128::from(idx)),
            max_waiters: 10,
        }),
    };
    assert!(matches!(sm.apply(1, &acquire(1, false, 1)).outcome, Outcome::Granted(_)));
    assert!(matches!(sm.apply(2, &acquire(2, true, 2)).outcome, Outcome::Queued { position: 1, .. }));
    assert!(matches!(sm.apply(3, &acquire(3, true, 3)).outcome, Outcome::Queued { position: 2, .. }));
    let rel = LogCommand { at_ms: 0, cmd: Command::Release { resource: res(0), lease_id: LeaseId::from_u128(1) } };
    let applied = sm.apply(4, &rel);
    assert_eq!(applied.outcome, Outcome::Released { was_holder: true });
    let started: Vec<_> = applied.events.iter().filter(|e| matches!(e, Event::LeaseStarted { .. })).collect();
    assert_eq!(started.len(), 1);
    let lock = sm.resource(&res(0)).unwrap().lock.as_ref().unwrap();
    assert_eq!((lock.lease_id, lock.token), (LeaseId::from_u128(2), FencingToken(4)));
    // A retry of the promoted request returns the grant, not a second slot.
    assert!(matches!(
        sm.apply(5, &acquire(2, true, 99)).outcome,
        Outcome::Granted(Grant { token: FencingToken(4), .. })
    ));
    assert_eq!(sm.waiter_count(), 1);
}

#[test]
fn expire_with_a_stale_basis_changes_nothing() {
    let mut sm = LockState::new();
    let lease = LeaseId::from_u128(7);
    sm.apply(
        1,
        &LogCommand {
            at_ms: 0,
            cmd: Command::Acquire(AcquireCmd {
                request_id: req(1),
                resource: res(0),
                holder: Holder::default(),
                ttl_ms: 1000,
                wait: false,
                lease_id: lease,
                max_waiters: 1,
            }),
        },
    );
    sm.apply(2, &LogCommand { at_ms: 0, cmd: Command::Renew { resource: res(0), lease_id: lease } });
    // The leader decided to expire on the deadline of the grant (index 1), but a
    // renewal (index 2) committed in between: the lease must survive (I6).
    let out = sm
        .apply(3, &LogCommand { at_ms: 0, cmd: Command::Expire { resource: res(0), lease_id: lease, basis_index: 1 } });
    assert_eq!(out.outcome, Outcome::Expired { expired: false });
    assert!(sm.resource(&res(0)).unwrap().lock.is_some());
    let out = sm
        .apply(4, &LogCommand { at_ms: 0, cmd: Command::Expire { resource: res(0), lease_id: lease, basis_index: 2 } });
    assert_eq!(out.outcome, Outcome::Expired { expired: true });
    let out = sm.apply(5, &LogCommand { at_ms: 0, cmd: Command::Renew { resource: res(0), lease_id: lease } });
    assert_eq!(out.outcome, Outcome::Rejected(Rejection::LeaseExpired));
    assert!(sm.resource(&res(0)).is_none(), "idle record deleted");
}

#[test]
fn prune_forgets_old_records_but_keeps_queued_ones() {
    let mut sm = LockState::new();
    let acq = |r: u8, at_ms: u64, idx: u64| LogCommand {
        at_ms,
        cmd: Command::Acquire(AcquireCmd {
            request_id: req(r),
            resource: res(0),
            holder: Holder::default(),
            ttl_ms: 1000,
            wait: true,
            lease_id: LeaseId::from_u128(u128::from(idx)),
            max_waiters: 5,
        }),
    };
    sm.apply(1, &acq(1, 100, 1));
    sm.apply(2, &acq(2, 100, 2));
    let out = sm.apply(3, &LogCommand { at_ms: 500, cmd: Command::PruneDedup { older_than_ms: 200 } });
    assert_eq!(out.outcome, Outcome::Pruned { dedup: 1, ended: 0 });
    assert!(sm.dedup(&req(1)).is_none());
    assert!(sm.dedup(&req(2)).is_some(), "the queued request keeps its record");
}

#[test]
fn a_promoted_request_keeps_its_record_for_the_retention_after_its_promotion() {
    let mut sm = LockState::new();
    let acq = |r: u8, wait: bool, at_ms: u64, idx: u64| LogCommand {
        at_ms,
        cmd: Command::Acquire(AcquireCmd {
            request_id: req(r),
            resource: res(0),
            holder: Holder::default(),
            ttl_ms: 1000,
            wait,
            lease_id: LeaseId::from_u128(u128::from(idx)),
            max_waiters: 5,
        }),
    };
    sm.apply(1, &acq(1, false, 100, 1));
    sm.apply(2, &acq(2, true, 100, 2));
    // Promoted long after it queued (a waiter can queue for minutes).
    sm.apply(
        3,
        &LogCommand { at_ms: 10_000, cmd: Command::Release { resource: res(0), lease_id: LeaseId::from_u128(1) } },
    );
    // A prune with a cut-off after the queueing but before the promotion keeps
    // the promoted request's record, so its retry still gets the grant (I7).
    sm.apply(4, &LogCommand { at_ms: 10_001, cmd: Command::PruneDedup { older_than_ms: 5_000 } });
    assert!(sm.dedup(&req(1)).is_none());
    let out = sm.apply(5, &acq(2, true, 10_002, 99)).outcome;
    assert!(matches!(out, Outcome::Granted(Grant { token: FencingToken(3), waited: true, .. })), "{out:?}");
}

mod retention {
    //! The retention prune goes through an index of the records by the
    //! second of their time (issue 18); what it removes must be exactly
    //! what a scan of the tables removes, on a state that applied every
    //! entry and on one rebuilt from its tables (a snapshot) alike, with
    //! the leader's clock going backwards at times (a new leader).

    use super::*;

    #[derive(Debug, Clone)]
    enum Step {
        Lock(Op),
        /// Prune what is older than the current time minus this.
        Prune(u64),
        /// Rebuild the second replica from its tables, as a snapshot does.
        Snapshot,
        /// Move the leader's clock by this (back when negative).
        Clock(i64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => op().prop_map(Step::Lock),
            2 => (0u64..5_000).prop_map(Step::Prune),
            1 => Just(Step::Snapshot),
            2 => (-3_000i64..3_000).prop_map(Step::Clock),
        ]
    }

    /// What a scan of the tables keeps after a prune at `older_than_ms`.
    fn scan_kept(s: &LockState, older_than_ms: u64) -> (Vec<RequestKey>, Vec<LeaseId>) {
        let dedup = s
            .dedup_records()
            .iter()
            .filter(|(_, r)| r.at_ms >= older_than_ms || matches!(r.outcome, DedupOutcome::Queued { .. }))
            .map(|(k, _)| *k)
            .collect();
        let ended = s.ended_records().iter().filter(|(_, r)| r.at_ms >= older_than_ms).map(|(k, _)| *k).collect();
        (dedup, ended)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn a_prune_removes_what_a_scan_would_on_every_replica(steps in proptest::collection::vec(step(), 1..150)) {
            let (mut a, mut b) = (LockState::new(), LockState::new());
            let mut issued = Vec::new();
            let mut now: u64 = 100_000;
            for (i, step) in steps.iter().enumerate() {
                let index = i as u64 + 1;
                now += 250;
                let cmd = match step {
                    Step::Lock(op) => resolve(op, &a, &issued, index),
                    Step::Prune(age) => Command::PruneDedup { older_than_ms: now.saturating_sub(*age) },
                    Step::Snapshot => {
                        b = LockState::from_parts(b.resources().clone(), b.dedup_records().clone(), b.ended_records().clone());
                        continue;
                    }
                    Step::Clock(d) => {
                        now = now.saturating_add_signed(*d);
                        continue;
                    }
                };
                let expected = match &cmd {
                    Command::PruneDedup { older_than_ms } => Some(scan_kept(&a, *older_than_ms)),
                    _ => None,
                };
                let entry = LogCommand { at_ms: now, cmd };
                let (ra, rb) = (a.apply(index, &entry), b.apply(index, &entry));
                prop_assert_eq!(&ra, &rb);
                prop_assert_eq!(a.dedup_records(), b.dedup_records());
                prop_assert_eq!(a.ended_records(), b.ended_records());
                prop_assert_eq!(a.resources(), b.resources());
                if let Some((dedup, ended)) = expected {
                    prop_assert_eq!(a.dedup_records().keys().copied().collect::<Vec<_>>(), dedup);
                    prop_assert_eq!(a.ended_records().keys().copied().collect::<Vec<_>>(), ended);
                }
                for e in &ra.events {
                    if let Event::LeaseStarted { lease_id, .. } = e {
                        issued.push(*lease_id);
                    }
                }
            }
        }
    }
}

mod signing_keys {
    //! RegisterSigningKey and RetireSigningKey (DESIGN P7): the rules, and
    //! that every replica applying the same entries holds the same keys.

    use fencer_token::{KeyId, Signer};

    use super::*;

    fn kid(s: &str) -> KeyId {
        KeyId::new(s).unwrap()
    }

    fn public(seed: u8) -> [u8; 32] {
        Signer::from_secret_bytes(kid("k"), &[seed; 32]).public_key().to_bytes()
    }

    fn register(k: &str, node: u64, seed: u8, not_before: u64) -> LogCommand {
        LogCommand {
            at_ms: 1_000,
            cmd: Command::RegisterSigningKey {
                kid: kid(k),
                node_id: node,
                public_key: public(seed),
                not_before_unix_ms: not_before,
            },
        }
    }

    fn retire(k: &str, not_after: u64) -> LogCommand {
        LogCommand { at_ms: 2_000, cmd: Command::RetireSigningKey { kid: kid(k), not_after_unix_ms: not_after } }
    }

    fn change(o: Outcome) -> KeyChange {
        match o {
            Outcome::SigningKey(c) => c,
            other => panic!("not a key outcome: {other:?}"),
        }
    }

    #[test]
    fn register_and_retire_follow_their_rules() {
        let mut sm = LockState::new();
        let a = sm.apply(5, &register("n1-a", 1, 1, 100));
        assert_eq!(change(a.outcome), KeyChange::Registered);
        assert!(
            matches!(&a.events[..], [Event::SigningKeyRegistered { kid: k, key }] if k.as_str() == "n1-a" && key.registered_index == 5)
        );
        assert_eq!(sm.signing_keys().len(), 1, "the state holds the new key");

        // A retry of the same registration (e.g. after an unknown outcome) changes nothing.
        let again = sm.apply(6, &register("n1-a", 1, 1, 100));
        assert_eq!(change(again.outcome), KeyChange::AlreadyRegistered);
        assert!(again.events.is_empty());
        // The same id for another key or another node: refused.
        assert_eq!(
            change(sm.apply(7, &register("n1-a", 1, 2, 100)).outcome),
            KeyChange::Refused(KeyRefusal::KeyIdTaken)
        );
        assert_eq!(
            change(sm.apply(8, &register("n1-a", 2, 1, 100)).outcome),
            KeyChange::Refused(KeyRefusal::KeyIdTaken)
        );
        // A small-order public key (the identity point) is refused.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let weak = LogCommand {
            at_ms: 0,
            cmd: Command::RegisterSigningKey {
                kid: kid("weak"),
                node_id: 1,
                public_key: identity,
                not_before_unix_ms: 0,
            },
        };
        assert_eq!(change(sm.apply(9, &weak).outcome), KeyChange::Refused(KeyRefusal::WeakPublicKey));
        assert_eq!(sm.signing_keys().len(), 1);

        assert_eq!(change(sm.apply(10, &retire("nope", 500)).outcome), KeyChange::Refused(KeyRefusal::UnknownKey));
        assert_eq!(
            change(sm.apply(11, &retire("n1-a", 100)).outcome),
            KeyChange::Refused(KeyRefusal::EmptyWindow { not_before_unix_ms: 100 })
        );
        let r = sm.apply(12, &retire("n1-a", 900));
        assert_eq!(change(r.outcome), KeyChange::Retired { not_after_unix_ms: 900 });
        assert!(matches!(&r.events[..], [Event::SigningKeyRetired { key, .. }] if key.not_after_unix_ms == Some(900)));
        // The end only moves earlier: a retired key never comes back.
        let later = sm.apply(13, &retire("n1-a", 5_000));
        assert_eq!(change(later.outcome), KeyChange::Retired { not_after_unix_ms: 900 });
        assert!(later.events.is_empty());
        assert_eq!(change(sm.apply(14, &retire("n1-a", 400)).outcome), KeyChange::Retired { not_after_unix_ms: 400 });
        let key = &sm.signing_keys()[&kid("n1-a")];
        assert!(key.valid_at(100) && key.valid_at(399) && !key.valid_at(400) && !key.valid_at(99));
    }

    #[test]
    fn a_key_set_never_outgrows_what_a_proxy_loads() {
        let mut sm = LockState::new();
        for i in 0..MAX_KEYS {
            let c = register(&format!("k{i}"), 1, (i % 200) as u8 + 1, 0);
            // Seeds repeat, ids do not: public keys may repeat across ids.
            assert_eq!(change(sm.apply(i as u64 + 1, &c).outcome), KeyChange::Registered, "key {i}");
        }
        let one_more = sm.apply(10_000, &register("k-extra", 1, 7, 0));
        assert_eq!(change(one_more.outcome), KeyChange::Refused(KeyRefusal::TooManyKeys));
    }

    #[test]
    fn the_current_key_is_the_newest_valid_one_of_the_node() {
        let mut sm = LockState::new();
        sm.apply(1, &register("n1-old", 1, 1, 100));
        sm.apply(2, &register("n1-new", 1, 2, 1_000));
        sm.apply(3, &register("n2-a", 2, 3, 50));
        sm.apply(4, &retire("n1-old", 2_000));
        let keys = sm.signing_keys();
        let current = |node, now| current_signing_key(keys, node, now, |_| true).map(|(k, _)| k.as_str().to_string());
        assert_eq!(current(1, 99), None, "nothing valid yet");
        assert_eq!(current(1, 500), Some("n1-old".into()));
        assert_eq!(current(1, 1_000), Some("n1-new".into()), "the newer key takes over at its not_before");
        assert_eq!(current(2, 1_000), Some("n2-a".into()));
        assert_eq!(current(3, 1_000), None);
        // A node signs only with keys whose secret it holds.
        assert_eq!(
            current_signing_key(keys, 1, 1_500, |k| k.as_str() == "n1-old").map(|(k, _)| k.as_str()),
            Some("n1-old")
        );
        assert_eq!(current_signing_key(keys, 1, 2_500, |k| k.as_str() == "n1-old"), None, "retired");
    }

    #[derive(Debug, Clone)]
    enum KeyOp {
        Register { k: u8, node: u64, seed: u8, not_before: u64 },
        Retire { k: u8, not_after: u64 },
        Lock(Op),
    }

    fn key_op() -> impl Strategy<Value = KeyOp> {
        prop_oneof![
            2 => (0u8..4, 1u64..3, 1u8..4, 0u64..1_000).prop_map(|(k, node, seed, not_before)| KeyOp::Register { k, node, seed, not_before }),
            2 => (0u8..5, 0u64..2_000).prop_map(|(k, not_after)| KeyOp::Retire { k, not_after }),
            3 => op().prop_map(KeyOp::Lock),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Two replicas applying the same entries agree on every outcome and
        /// on the whole state; key commands never touch a lock; a key's end
        /// only ever moves earlier and always stays after its start.
        #[test]
        fn key_commands_are_deterministic_and_leave_locks_alone(ops in proptest::collection::vec(key_op(), 1..80)) {
            let (mut a, mut b) = (LockState::new(), LockState::new());
            let mut issued = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let index = i as u64 + 1;
                let cmd = match op {
                    KeyOp::Register { k, node, seed, not_before } => register(&format!("k{k}"), *node, *seed, *not_before).cmd,
                    KeyOp::Retire { k, not_after } => retire(&format!("k{k}"), *not_after).cmd,
                    KeyOp::Lock(op) => resolve(op, &a, &issued, index),
                };
                let entry = LogCommand { at_ms: 1_000 + index, cmd };
                let before = a.clone();
                let (ra, rb) = (a.apply(index, &entry), b.apply(index, &entry));
                prop_assert_eq!(&ra, &rb);
                prop_assert_eq!(&a, &b);
                for e in &ra.events {
                    if let Event::LeaseStarted { lease_id, .. } = e {
                        issued.push(*lease_id);
                    }
                }
                if matches!(op, KeyOp::Register { .. } | KeyOp::Retire { .. }) {
                    prop_assert_eq!(before.resources(), a.resources());
                    prop_assert_eq!(before.dedup_records(), a.dedup_records());
                    for (kid, old) in before.signing_keys() {
                        let new = &a.signing_keys()[kid];
                        prop_assert_eq!((old.node_id, old.public_key, old.not_before_unix_ms), (new.node_id, new.public_key, new.not_before_unix_ms));
                        if let Some(old_end) = old.not_after_unix_ms {
                            prop_assert!(new.not_after_unix_ms.is_some_and(|e| e <= old_end), "an end moved later");
                        }
                    }
                } else {
                    prop_assert_eq!(before.signing_keys(), a.signing_keys());
                }
                for k in a.signing_keys().values() {
                    prop_assert!(k.not_after_unix_ms.is_none_or(|e| e > k.not_before_unix_ms), "empty window");
                }
            }
        }
    }
}

/// The dedup and ended-lease tables hold ~240,000 records each at the seed
/// rate (two minutes of retention): every byte of a record is ~0.3 MB of a
/// node's memory once B-tree node slack is counted. These are the
/// sizes docs/performance.md counts with; a field that grows them (a `u128`,
/// whose 16-byte alignment pads the record, or a heap-allocated key) fails here.
#[test]
fn retained_records_stay_compact() {
    use std::mem::size_of;
    assert_eq!(size_of::<LeaseId>(), 16);
    assert_eq!(std::mem::align_of::<LeaseId>(), 8, "a lease id must not force 16-byte alignment");
    // 72 bytes until the fingerprint of holder and ttl (8 bytes) let a
    // retry that asks for something else be refused (issue 15).
    assert!(size_of::<(RequestKey, DedupRecord)>() <= 80);
    assert!(size_of::<(LeaseId, EndedLease)>() <= 48);
}
