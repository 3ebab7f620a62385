//! Golden bytes of everything the coordinator writes to disk or sends to
//! another node: every log command (postcard, in raft log entries and in
//! append-entries messages), a raft log entry, a snapshot file (header and
//! body), and the signing-key registration a follower sends its leader.
//!
//! A node reads log entries and snapshots written by older versions and
//! exchanges them with members not yet upgraded, so these bytes may never
//! change by accident: a refactor of the types that leaves this file alone
//! keeps the format. A deliberate format change adds a new format (see
//! `store`'s snapshot formats) and new golden bytes; it never edits these.

use std::path::Path;
use std::sync::Arc;

use fencer_token::KeyId;
use futures::stream;
use openraft::alias::EntryOf;
use openraft::entry::RaftEntry as _;
use openraft::storage::RaftStateMachine as _;

use crate::signing::KeyRegistration;
use crate::{
    AcquireCmd, AcquireFingerprint, AuditText, Clock, Command, DedupOutcome, DedupRecord, Holder, KeyChange,
    KeyRefusal, LeaseId, LogCommand, Metrics, NoObserver, Quota, RequestId, ResourceHash, ResourceName, SNAPSHOT_DIR,
    STATE_FILE, SnapshotBody, StateMachineStore, TypeConfig,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares `bytes` with the golden `expected` hex (whitespace ignored) and
/// prints the actual hex when they differ, so a failure shows what changed.
fn assert_golden(what: &str, bytes: &[u8], expected: &str) {
    let expected: String = expected.split_whitespace().collect();
    let actual = hex(bytes);
    assert!(actual == expected, "{what}: the encoding changed\n  golden: {expected}\n  actual: {actual}");
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("encodes")
}

fn res(name: &str) -> ResourceName {
    ResourceName::new(name).unwrap()
}

fn req(id: &str) -> RequestId {
    RequestId::new(id).unwrap()
}

/// A lease id with bits set in both halves, so the 128-bit varint is long.
const LEASE: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;

fn public_key() -> [u8; 32] {
    fencer_token::Signer::from_secret_bytes(KeyId::new("k").unwrap(), &[9; 32]).public_key().to_bytes()
}

fn acquire(request_id: &str, resource: &str, wait: bool, lease: u128, max_waiters: u32) -> Command {
    Command::Acquire(AcquireCmd {
        request_id: req(request_id),
        resource: res(resource),
        holder: Holder::new("host-1/pid 42").unwrap(),
        ttl_ms: 30_000,
        wait,
        lease_id: LeaseId::from_u128(lease),
        max_waiters,
    })
}

fn acquire_in_quota(request_id: &str, resource: &str, lease: u128, quota: Quota) -> Command {
    Command::AcquireInQuota {
        acquire: AcquireCmd {
            request_id: req(request_id),
            resource: res(resource),
            holder: Holder::new("host-2").unwrap(),
            ttl_ms: 15_000,
            wait: true,
            lease_id: LeaseId::from_u128(lease),
            max_waiters: 1024,
        },
        quota,
    }
}

#[test]
fn every_log_command_keeps_its_bytes() {
    let commands = [
        ("Acquire", acquire("attempt-0001", "orders/42", false, LEASE, 1024), GOLDEN_ACQUIRE),
        ("Renew", Command::Renew { resource: res("orders/42"), lease_id: LeaseId::from_u128(LEASE) }, GOLDEN_RENEW),
        (
            "Release",
            Command::Release { resource: res("orders/42"), lease_id: LeaseId::from_u128(LEASE) },
            GOLDEN_RELEASE,
        ),
        (
            "Expire",
            Command::Expire { resource: res("orders/42"), lease_id: LeaseId::from_u128(LEASE), basis_index: 300 },
            GOLDEN_EXPIRE,
        ),
        (
            "CancelWait",
            Command::CancelWait { resource: res("orders/42"), request_id: req("attempt-0001") },
            GOLDEN_CANCEL,
        ),
        (
            "ForceRelease",
            Command::ForceRelease {
                resource: res("orders/42"),
                caller: AuditText::new("alice", "caller").unwrap(),
                reason: AuditText::new("stuck job, ticket OPS-7", "reason").unwrap(),
            },
            GOLDEN_FORCE_RELEASE,
        ),
        ("PruneDedup", Command::PruneDedup { older_than_ms: 1_770_000_000_000 }, GOLDEN_PRUNE),
        (
            "AcquireInQuota (limits)",
            acquire_in_quota(
                "attempt-0002",
                "tenant-a/jobs",
                7,
                Quota { prefix: "tenant-a/".into(), max_active_locks: Some(100), max_waiters: Some(5) },
            ),
            GOLDEN_ACQUIRE_IN_QUOTA,
        ),
        (
            "AcquireInQuota (no limits)",
            acquire_in_quota(
                "attempt-0003",
                "x",
                u128::MAX,
                Quota { prefix: String::new(), max_active_locks: None, max_waiters: None },
            ),
            GOLDEN_ACQUIRE_IN_QUOTA_UNLIMITED,
        ),
        (
            "RegisterSigningKey",
            Command::RegisterSigningKey {
                kid: KeyId::new("n1-20260101000000").unwrap(),
                node_id: 1,
                public_key: public_key(),
                not_before_unix_ms: 1_770_000_000_000,
            },
            GOLDEN_REGISTER_KEY,
        ),
        (
            "RetireSigningKey",
            Command::RetireSigningKey {
                kid: KeyId::new("n1-20260101000000").unwrap(),
                not_after_unix_ms: 1_780_000_000_000,
            },
            GOLDEN_RETIRE_KEY,
        ),
    ];
    for (what, cmd, golden) in commands {
        let entry = LogCommand { at_ms: 1_770_000_000_123, cmd };
        let bytes = encode(&entry);
        assert_golden(what, &bytes, golden);
        assert_eq!(postcard::from_bytes::<LogCommand>(&bytes).unwrap(), entry, "{what} decodes to itself");
    }
}

#[test]
fn a_raft_log_entry_keeps_its_bytes() {
    let entry = EntryOf::<TypeConfig>::new_normal(
        openraft::testing::log_id::<TypeConfig>(3, 2, 1_000),
        LogCommand { at_ms: 1_770_000_000_123, cmd: acquire("attempt-0001", "orders/42", true, LEASE, 8) },
    );
    assert_golden("log entry", &encode(&entry), GOLDEN_LOG_ENTRY);
}

#[test]
fn a_signing_key_registration_and_its_replies_keep_their_bytes() {
    let registration = KeyRegistration {
        kid: KeyId::new("n2-20260101000000").unwrap(),
        public_key: public_key(),
        not_before_unix_ms: 1_770_000_000_000,
    };
    assert_golden("KeyRegistration", &encode(&registration), GOLDEN_KEY_REGISTRATION);
    let replies: [Result<KeyChange, String>; 9] = [
        Ok(KeyChange::Registered),
        Ok(KeyChange::AlreadyRegistered),
        Ok(KeyChange::Retired { not_after_unix_ms: 1_780_000_000_000 }),
        Ok(KeyChange::Refused(KeyRefusal::KeyIdTaken)),
        Ok(KeyChange::Refused(KeyRefusal::WeakPublicKey)),
        Ok(KeyChange::Refused(KeyRefusal::TooManyKeys)),
        Ok(KeyChange::Refused(KeyRefusal::UnknownKey)),
        Ok(KeyChange::Refused(KeyRefusal::EmptyWindow { not_before_unix_ms: 1_770_000_000_000 })),
        Err("not the leader".into()),
    ];
    let actual: Vec<String> = replies.iter().map(|r| hex(&encode(r))).collect();
    let golden: Vec<&str> = GOLDEN_KEY_REPLIES.split_whitespace().collect();
    assert!(
        actual == golden,
        "key registration replies: the encoding changed\n  golden: {golden:?}\n  actual: {actual:?}"
    );
}

/// Commands that leave a state with every kind of record: a held lock that
/// was renewed; dedup records granted (at once and from the queue), lock
/// held, too many waiters and wait cancelled; ended leases released, expired
/// and force-released; a registered and a retired signing key; an empty
/// queue slot cancelled and a waiter still queued.
fn snapshot_commands() -> Vec<Command> {
    vec![
        Command::RegisterSigningKey {
            kid: KeyId::new("n1-a").unwrap(),
            node_id: 1,
            public_key: public_key(),
            not_before_unix_ms: 10,
        },
        Command::RetireSigningKey { kid: KeyId::new("n1-a").unwrap(), not_after_unix_ms: 99_000 },
        acquire("request-0001", "orders/1", false, 1, 2),
        acquire("request-0002", "orders/1", false, 2, 2),
        acquire("request-0003", "orders/1", true, 3, 2),
        acquire("request-0004", "orders/1", true, 4, 2),
        acquire("request-0005", "orders/1", true, 5, 2),
        Command::CancelWait { resource: res("orders/1"), request_id: req("request-0004") },
        Command::Release { resource: res("orders/1"), lease_id: LeaseId::from_u128(1) },
        acquire_in_quota(
            "request-0006",
            "orders/2",
            6,
            Quota { prefix: "orders/".into(), max_active_locks: Some(10), max_waiters: None },
        ),
        Command::Expire { resource: res("orders/2"), lease_id: LeaseId::from_u128(6), basis_index: 10 },
        acquire("request-0007", "orders/3", false, 7, 2),
        Command::ForceRelease {
            resource: res("orders/3"),
            caller: AuditText::new("alice", "caller").unwrap(),
            reason: AuditText::new("test", "reason").unwrap(),
        },
        acquire("request-0008", "jobs/nightly", false, LEASE, 2),
        acquire("request-0009", "jobs/nightly", true, 9, 2),
        Command::Renew { resource: res("jobs/nightly"), lease_id: LeaseId::from_u128(LEASE) },
        Command::PruneDedup { older_than_ms: 1 },
    ]
}

/// The newest snapshot file of a data dir.
fn snapshot_file(dir: &Path) -> Vec<u8> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join(SNAPSHOT_DIR)).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    std::fs::read(files.last().expect("a snapshot file")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_keeps_its_bytes() {
    let dir = tempfile::TempDir::new().unwrap();
    let mut sm = open_store(dir.path());
    let entries: Vec<_> = snapshot_commands()
        .into_iter()
        .enumerate()
        .map(|(i, cmd)| {
            let index = i as u64 + 1;
            let entry = EntryOf::<TypeConfig>::new_normal(
                openraft::testing::log_id::<TypeConfig>(1, 1, index),
                LogCommand { at_ms: 1_000 * index, cmd },
            );
            Ok((entry, None))
        })
        .collect();
    sm.apply(stream::iter(entries)).await.unwrap();
    {
        let state = sm.read();
        assert_eq!((state.lock_count(), state.waiter_count()), (2, 1), "a held lock with a waiter, and one more");
        assert_eq!((state.dedup_records().len(), state.ended_records().len()), (9, 3));
        assert_eq!(state.signing_keys().len(), 1);
    }
    let snapshot = sm.build_snapshot().await.unwrap();
    let body = snapshot.snapshot.into_bytes().await.unwrap();
    assert_golden("snapshot body", &body, GOLDEN_SNAPSHOT_BODY_DEDUP_V2);
    let file = snapshot_file(dir.path());
    assert!(file.ends_with(&body), "the file ends with the body");
    assert_golden("snapshot file header", &file[..file.len() - body.len()], GOLDEN_SNAPSHOT_HEADER);

    // The body installs on a fresh store and gives the same state.
    let other = tempfile::TempDir::new().unwrap();
    let mut fresh = open_store(other.path());
    fresh.install_snapshot(&snapshot.meta, SnapshotBody::from_bytes(body.clone())).await.unwrap();
    assert_eq!(*fresh.read(), *sm.read(), "the installed state is the built one");
    let again = fresh.build_snapshot().await.unwrap();
    assert_golden(
        "snapshot body rebuilt after install",
        &again.snapshot.into_bytes().await.unwrap(),
        GOLDEN_SNAPSHOT_BODY_DEDUP_V2,
    );

    // A body of the same commands from before dedup records carried their
    // fingerprint (version 1, GOLDEN_SNAPSHOT_BODY: a leader or a file not
    // upgraded yet) installs to the same state without fingerprints, and is
    // handed out with the bytes it came with.
    let old = tempfile::TempDir::new().unwrap();
    let mut from_old = open_store(old.path());
    let old_body = unhex(GOLDEN_SNAPSHOT_BODY);
    from_old.install_snapshot(&snapshot.meta, SnapshotBody::from_bytes(old_body)).await.unwrap();
    {
        let (a, b) = (from_old.read(), sm.read());
        assert_eq!(a.resources(), b.resources());
        assert_eq!(a.ended_records(), b.ended_records());
        assert_eq!(a.signing_keys(), b.signing_keys());
        let without = |r: &DedupRecord| DedupRecord { fingerprint: AcquireFingerprint::UNKNOWN, ..r.clone() };
        let expected: Vec<_> = b.dedup_records().iter().map(|(k, r)| (*k, without(r))).collect();
        let installed: Vec<_> = a.dedup_records().iter().map(|(k, r)| (*k, r.clone())).collect();
        assert_eq!(installed, expected, "version-1 records, without fingerprints");
    }
    let rebuilt = from_old.build_snapshot().await.unwrap();
    assert_golden("a version-1 body rebuilt", &rebuilt.snapshot.into_bytes().await.unwrap(), GOLDEN_SNAPSHOT_BODY);
}

fn open_store(dir: &Path) -> StateMachineStore {
    StateMachineStore::open(
        &dir.join(STATE_FILE),
        &dir.join(SNAPSHOT_DIR),
        Arc::new(NoObserver),
        Metrics::new(),
        Clock,
        None,
    )
    .unwrap()
}

pub(crate) fn unhex(golden: &str) -> Vec<u8> {
    let hex: String = golden.split_whitespace().collect();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

/// A dedup record's two stored versions: version 2 appends the
/// fingerprint, version 1 (no fingerprint known) keeps its old bytes, and
/// a version-1 reader (the serde form, which older nodes decode with
/// postcard's prefix read) reads a version-2 record without it.
#[test]
fn a_dedup_record_keeps_its_bytes_in_both_versions() {
    let record = DedupRecord {
        resource: ResourceHash::of(&res("orders/42")),
        outcome: DedupOutcome::Granted {
            lease_id: LeaseId::from_u128(LEASE),
            token: crate::FencingToken(4242),
            ttl_ms: 30_000,
            waited: true,
        },
        at_ms: 1_770_000_000_123,
        fingerprint: AcquireFingerprint::of(&Holder::new("host-1/pid 42").unwrap(), 30_000),
    };
    let v2 = record.to_stored().unwrap();
    assert_golden("dedup record, version 2", &v2, GOLDEN_DEDUP_RECORD_V2);
    assert_eq!(DedupRecord::from_stored(&v2).unwrap(), record);
    let old_reader: DedupRecord = postcard::from_bytes(&v2).unwrap();
    assert_eq!(old_reader, DedupRecord { fingerprint: AcquireFingerprint::UNKNOWN, ..record.clone() });

    let v1_record = DedupRecord { fingerprint: AcquireFingerprint::UNKNOWN, ..record };
    let v1 = v1_record.to_stored().unwrap();
    assert_golden("dedup record, version 1", &v1, GOLDEN_DEDUP_RECORD_V1);
    assert_eq!(v1, encode(&v1_record), "version 1 is the serde form");
    assert_eq!(DedupRecord::from_stored(&v1).unwrap(), v1_record);
    assert!(DedupRecord::from_stored(&[v2.as_slice(), &[1]].concat()).is_err(), "bytes after the fingerprint");
}

const GOLDEN_ACQUIRE: &str = "
    fbc8e2e1c133000c617474656d70742d30303031096f72646572732f34320d686f73742d312f706964203432b0ea0100
    90e4d0b287d3aeeefedfb7de9af1d9a2a3028008
";
const GOLDEN_RENEW: &str = "fbc8e2e1c13301096f72646572732f343290e4d0b287d3aeeefedfb7de9af1d9a2a302";
const GOLDEN_RELEASE: &str = "fbc8e2e1c13302096f72646572732f343290e4d0b287d3aeeefedfb7de9af1d9a2a302";
const GOLDEN_EXPIRE: &str = "fbc8e2e1c13303096f72646572732f343290e4d0b287d3aeeefedfb7de9af1d9a2a302ac02";
const GOLDEN_CANCEL: &str = "fbc8e2e1c13304096f72646572732f34320c617474656d70742d30303031";
const GOLDEN_FORCE_RELEASE: &str =
    "fbc8e2e1c13305096f72646572732f343205616c69636517737475636b206a6f622c207469636b6574204f50532d37";
const GOLDEN_PRUNE: &str = "fbc8e2e1c1330680c8e2e1c133";
const GOLDEN_ACQUIRE_IN_QUOTA: &str = "
    fbc8e2e1c133070c617474656d70742d303030320d74656e616e742d612f6a6f627306686f73742d3298750107800809
    74656e616e742d612f01640105
";
const GOLDEN_ACQUIRE_IN_QUOTA_UNLIMITED: &str = "
    fbc8e2e1c133070c617474656d70742d30303033017806686f73742d32987501ffffffffffffffffffffffffffffffff
    ffff038008000000
";
const GOLDEN_REGISTER_KEY: &str = "
    fbc8e2e1c13308116e312d323032363031303130303030303001fd1724385aa0c75b64fb78cd602fa1d991fdebf76b13
    c58ed702eac835e9f61880c8e2e1c133
";
const GOLDEN_RETIRE_KEY: &str = "fbc8e2e1c13309116e312d323032363031303130303030303080909282e733";
const GOLDEN_LOG_ENTRY: &str = "
    0302e80701fbc8e2e1c133000c617474656d70742d30303031096f72646572732f34320d686f73742d312f7069642034
    32b0ea010190e4d0b287d3aeeefedfb7de9af1d9a2a30208
";
const GOLDEN_KEY_REGISTRATION: &str = "
    116e322d3230323630313031303030303030fd1724385aa0c75b64fb78cd602fa1d991fdebf76b13c58ed702eac835e9
    f61880c8e2e1c133
";
const GOLDEN_KEY_REPLIES: &str =
    "0000 0001 000280909282e733 000300 000301 000302 000303 00030480c8e2e1c133 010e6e6f7420746865206c6561646572";
/// The snapshot body of `snapshot_commands` with version-1 dedup records
/// (before fingerprints): still installed, and handed out as it came.
pub(crate) const GOLDEN_SNAPSHOT_BODY: &str = "
    b4e0c8abb6ccdbb266020c6a6f62732f6e696768746c79550190e4d0b287d3aeeefedfb7de9af1d9a2a3020d686f7374
    2d312f7069642034320eb0ea010c726571756573742d3030303810b06d010c726571756573742d303030390d686f7374
    2d312f706964203432b0ea0109086f72646572732f312501030d686f73742d312f70696420343209b0ea010c72657175
    6573742d3030303309a8460009dea7fde2ad8da9f6d6b5eea5c783f095a1210d98918bd7cf90a7e0940104c03e87da94
    9089e498e185f685e9c7e989d0ac2212b19b8bd7cff0a7e0940100060a987500904edc9284fbf998f2c5b1b0d79af3a7
    e3d0bc2524ffe69e98f0beb4e384010090e4d0b287d3aeeefedfb7de9af1d9a2a3020eb0ea0100b06d8c8dcae6a2e9d6
    b3d1e9bb85cbf49e8c836f1398918bd7cf90a7e09401000309b0ea0101a8469984f4f1a0cbfcd4bae9b3eb8c899fa3aa
    ca020e98918bd7cf90a7e094010302d836e7b890bbe583b49ec5ff81e298b892e6e18c0313fe978bd7cfd0a7e0940100
    070cb0ea0100e05daaeefd98d0fdaddfe2a1d3beeabbb9f28d8f031398918bd7cf90a7e09401000103b0ea0100b817b3
    f7c3afe7e8f2edcaaa98a4a5d9abb4a5a1030effe69e98f0beb4e3840101099875fbbf82fcdfe48ceae3c8bcf986b0fb
    d395cb030d98918bd7cf90a7e0940102a01f03010e98918bd7cf90a7e094010009a846060eb19b8bd7cff0a7e0940101
    0bf855070efe978bd7cfd0a7e09401020dc86501046e312d612901fd1724385aa0c75b64fb78cd602fa1d991fdebf76b
    13c58ed702eac835e9f6180a01b8850601e807
";
/// The snapshot body of `snapshot_commands` since dedup records carry
/// their fingerprint (record version 2); the format (4) and the header are
/// the same.
pub(crate) const GOLDEN_SNAPSHOT_BODY_DEDUP_V2: &str = "
    b4e0c8abb6ccdbb266020c6a6f62732f6e696768746c79550190e4d0b287d3aeeefedfb7de9af1d9a2a3020d686f7374
    2d312f7069642034320eb0ea010c726571756573742d3030303810b06d010c726571756573742d303030390d686f7374
    2d312f706964203432b0ea0109086f72646572732f312501030d686f73742d312f70696420343209b0ea010c72657175
    6573742d3030303309a8460009dea7fde2ad8da9f6d6b5eea5c783f095a1211698918bd7cf90a7e0940104c03ef3fbde
    a6a585c19f0d87da949089e498e185f685e9c7e989d0ac221bb19b8bd7cff0a7e0940100060a987500904eb3b3848391
    baf8a354dc9284fbf998f2c5b1b0d79af3a7e3d0bc252dffe69e98f0beb4e384010090e4d0b287d3aeeefedfb7de9af1
    d9a2a3020eb0ea0100b06df3fbdea6a585c19f0d8c8dcae6a2e9d6b3d1e9bb85cbf49e8c836f1c98918bd7cf90a7e094
    01000309b0ea0101a846f3fbdea6a585c19f0d9984f4f1a0cbfcd4bae9b3eb8c899fa3aaca021798918bd7cf90a7e094
    010302d836f3fbdea6a585c19f0de7b890bbe583b49ec5ff81e298b892e6e18c031cfe978bd7cfd0a7e0940100070cb0
    ea0100e05df3fbdea6a585c19f0daaeefd98d0fdaddfe2a1d3beeabbb9f28d8f031c98918bd7cf90a7e09401000103b0
    ea0100b817f3fbdea6a585c19f0db3f7c3afe7e8f2edcaaa98a4a5d9abb4a5a10317ffe69e98f0beb4e3840101099875
    f3fbdea6a585c19f0dfbbf82fcdfe48ceae3c8bcf986b0fbd395cb031698918bd7cf90a7e0940102a01ff3fbdea6a585
    c19f0d03010e98918bd7cf90a7e094010009a846060eb19b8bd7cff0a7e09401010bf855070efe978bd7cfd0a7e09401
    020dc86501046e312d612901fd1724385aa0c75b64fb78cd602fa1d991fdebf76b13c58ed702eac835e9f6180a01b885
    0601e807
";
const GOLDEN_DEDUP_RECORD_V1: &str =
    "dfc3a5fbe4bee691a6010090e4d0b287d3aeeefedfb7de9af1d9a2a3029221b0ea0101fbc8e2e1c133";
const GOLDEN_DEDUP_RECORD_V2: &str = "
    dfc3a5fbe4bee691a6010090e4d0b287d3aeeefedfb7de9af1d9a2a3029221b0ea0101fbc8e2e1c133f3fbdea6a585c1
    9f0d
";
const GOLDEN_SNAPSHOT_HEADER: &str = "09000000040101011100000000";
