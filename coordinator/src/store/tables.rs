//! The state tables (DESIGN §3.4): what a snapshot body carries
//! ([`TableDump`]), decoding a lock state from it, and the redb state file
//! that versions before snapshot-only persistence wrote (read once, when it
//! is moved into a snapshot file). Values are postcard; the key of
//! `resources` and `signing_keys` is the name, of `dedup` a [`RequestKey`],
//! of `ended` a lease id.

use std::collections::BTreeMap;
use std::io;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::codec::{decode, io_err};
use super::{LogIdT, Membership};
use crate::state_machine::{DedupRecord, EndedLease, LockState, RequestKey, ResourceState, SigningKeyRecord};
use crate::types::{LeaseId, ResourceName};
use fencer_token::KeyId;

pub(super) const RESOURCES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("resources");

/// Dedup records by [`RequestKey`] (state files since snapshot format 4).
pub(super) const DEDUP: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("dedup_by_key");

/// Dedup records by request id text, as files before format 4 kept them;
/// moved into [`DEDUP`] when such a file is opened.
pub(super) const LEGACY_DEDUP: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("dedup");

pub(super) const ENDED: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("ended");

pub(super) const SM_META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("sm_meta");

/// Token-signing public keys by key id (DESIGN P7); added in snapshot format 3.
pub(super) const SIGNING_KEYS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("signing_keys");

pub(super) const KEY_APPLIED: &str = "applied";

pub(super) const KEY_MEMBERSHIP: &str = "membership";

/// The state tables, values still encoded: what a snapshot carries
/// (format 4, after [`FORMAT_4_TAG`]).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct TableDump {
    pub(super) resources: Vec<(String, Vec<u8>)>,
    pub(super) dedup: Vec<(u128, Vec<u8>)>,
    pub(super) ended: Vec<(u128, Vec<u8>)>,
    pub(super) signing_keys: Vec<(String, Vec<u8>)>,
}

/// Reads every state table from one consistent read transaction.
pub(super) fn dump_tables(r: &redb::ReadTransaction) -> io::Result<TableDump> {
    Ok(TableDump {
        resources: read_rows(r, RESOURCES, "resources")?,
        dedup: read_rows(r, DEDUP, "dedup")?,
        ended: read_rows(r, ENDED, "ended")?,
        signing_keys: read_rows(r, SIGNING_KEYS, "signing_keys")?,
    })
}

/// A state table's key as dumps and batches hold it: text (`resources`,
/// `signing_keys`) or a 128-bit number (`dedup`, `ended`).
pub(super) trait RowKey: Sized {
    /// The key type of the redb table.
    type Stored: redb::Key + 'static;
    /// The key as the table takes it.
    fn stored(&self) -> <Self::Stored as redb::Value>::SelfType<'_>;
    /// The key as read from the table.
    fn owned(key: <Self::Stored as redb::Value>::SelfType<'_>) -> Self;
}

impl RowKey for String {
    type Stored = &'static str;
    fn stored(&self) -> &str {
        self.as_str()
    }
    fn owned(key: &str) -> Self {
        key.to_string()
    }
}

impl RowKey for u128 {
    type Stored = u128;
    fn stored(&self) -> u128 {
        *self
    }
    fn owned(key: u128) -> Self {
        key
    }
}

/// A state table whose rows are keyed by `K`.
pub(super) type StateTable<K> = TableDefinition<'static, <K as RowKey>::Stored, &'static [u8]>;

/// Every row of a state table.
pub(super) fn read_rows<K: RowKey>(
    r: &redb::ReadTransaction,
    def: StateTable<K>,
    what: &str,
) -> io::Result<Vec<(K, Vec<u8>)>> {
    let mut rows = Vec::new();
    for item in r.open_table(def).map_err(|e| io_err("open", e))?.iter().map_err(|e| io_err("iter", e))? {
        let (k, v) = item.map_err(|e| io_err(&format!("read {what}"), e))?;
        rows.push((K::owned(k.value()), v.value().to_vec()));
    }
    Ok(rows)
}

/// Puts (`Some`) or removes (`None`) rows of a state table.
pub(super) fn write_rows<K: RowKey>(
    tx: &redb::WriteTransaction,
    def: StateTable<K>,
    rows: &[(K, Option<Vec<u8>>)],
    what: &str,
) -> io::Result<()> {
    if rows.is_empty() {
        return Ok(()); // most batches change no signing key: do not even open the table
    }
    let mut t = tx.open_table(def).map_err(|e| io_err("open", e))?;
    for (k, v) in rows {
        match v {
            Some(v) => t.insert(k.stored(), v.as_slice()).map(|_| ()),
            None => t.remove(k.stored()).map(|_| ()),
        }
        .map_err(|e| io_err(&format!("write {what}"), e))?;
    }
    Ok(())
}

/// Decodes a dump into a lock state, validating every name and record.
pub(super) fn state_from_dump(dump: &TableDump) -> io::Result<LockState> {
    let mut rows = StateRows::default();
    for (k, v) in &dump.resources {
        rows.resource(k, v)?;
    }
    for (k, v) in &dump.dedup {
        rows.dedup(*k, v)?;
    }
    for (k, v) in &dump.ended {
        rows.ended(*k, v)?;
    }
    for (k, v) in &dump.signing_keys {
        rows.signing_key(k, v)?;
    }
    Ok(rows.finish())
}

/// A lock state decoded a row at a time (from a [`TableDump`], or from a
/// snapshot body as it is read), every name and record validated. A key
/// given twice keeps its last row. The three big tables are loaded by
/// [`PackedLoad`], so a decoded state is no larger than the one it was
/// taken from.
#[derive(Default)]
pub(super) struct StateRows {
    resources: PackedLoad<ResourceName, ResourceState>,
    dedup: PackedLoad<RequestKey, DedupRecord>,
    ended: PackedLoad<LeaseId, EndedLease>,
    keys: BTreeMap<KeyId, SigningKeyRecord>,
}

/// Rows inserted per run by [`PackedLoad`] (an even number).
const PACKED_RUN: usize = 4_096;

/// Builds an `imbl::OrdMap` from rows that arrive in ascending key order,
/// as a snapshot stores them, with its leaves full rather than half full.
///
/// imbl's B-tree splits a full leaf at its middle. Inserted in ascending
/// order, every row lands in the rightmost leaf, so each split leaves a
/// leaf with half its slots empty for good, and a leaf's memory is its
/// slots, filled or not. 240,000 rows of a dedup record's size take
/// ~42 MB inserted in order, ~30 MB in random order (the fill that
/// applies leave) and ~22 MB loaded this way (`packed_load_takes_less_memory`
/// prints the three; docs/performance.md, "A decoded state's B-tree
/// leaves"). So a follower that installed a snapshot, or a node that
/// restarted from one, held more than the leader it copied.
///
/// Here the rows are taken in runs of [`PACKED_RUN`], and a run's rows at
/// even positions are inserted first, then those at odd positions: the
/// first pass seals leaves at half their slots, and each of them then
/// receives the rows that lie between its own and the next leaf's, which
/// fill it (all but about two leaves a run, at its edges). A
/// run whose keys are not strictly ascending (a body this node did not
/// write; the older state files) is inserted as it came, so a key given
/// twice keeps its last row either way; the map's contents never depend on
/// the order of insertion, only its memory does.
struct PackedLoad<K, V> {
    map: imbl::OrdMap<K, V>,
    run: Vec<(K, V)>,
    odd: Vec<(K, V)>,
}

impl<K, V> Default for PackedLoad<K, V> {
    fn default() -> Self {
        Self { map: imbl::OrdMap::new(), run: Vec::new(), odd: Vec::new() }
    }
}

impl<K: Ord + Clone, V: Clone> PackedLoad<K, V> {
    /// One row, in the order the rows are stored.
    fn push(&mut self, key: K, value: V) {
        self.run.push((key, value));
        if self.run.len() == PACKED_RUN {
            self.insert_run();
        }
    }

    /// Inserts the run held: packed when its keys are strictly ascending,
    /// else as it came.
    fn insert_run(&mut self) {
        let ascending = self.run.windows(2).all(|w| w[0].0 < w[1].0);
        for (i, (key, value)) in self.run.drain(..).enumerate() {
            if ascending && i % 2 == 1 {
                self.odd.push((key, value));
            } else {
                self.map.insert(key, value);
            }
        }
        for (key, value) in self.odd.drain(..) {
            self.map.insert(key, value);
        }
    }

    /// The map of every row pushed.
    fn finish(mut self) -> imbl::OrdMap<K, V> {
        self.insert_run();
        self.map
    }
}

impl StateRows {
    /// A row of `resources`: the resource's name and its encoded state.
    pub(super) fn resource(&mut self, name: &str, value: &[u8]) -> io::Result<()> {
        let name = ResourceName::new(name).map_err(|e| io_err("stored resource name", e))?;
        self.resources.push(name, decode(value, "resource state")?);
        Ok(())
    }

    /// A row of `dedup`: a [`RequestKey`] and its encoded record.
    pub(super) fn dedup(&mut self, key: u128, value: &[u8]) -> io::Result<()> {
        let record = DedupRecord::from_stored(value)
            .map_err(|e| io_err("decode dedup record", format!("{e} ({} bytes)", value.len())))?;
        self.dedup.push(RequestKey::from_u128(key), record);
        Ok(())
    }

    /// A row of `ended`: a lease id and its encoded record.
    pub(super) fn ended(&mut self, lease: u128, value: &[u8]) -> io::Result<()> {
        self.ended.push(LeaseId::from_u128(lease), decode(value, "ended lease")?);
        Ok(())
    }

    /// A row of `signing_keys`: a key id and its encoded record.
    pub(super) fn signing_key(&mut self, kid: &str, value: &[u8]) -> io::Result<()> {
        let kid = KeyId::new(kid).map_err(|e| io_err("stored signing key id", e))?;
        self.keys.insert(kid, decode(value, "signing key")?);
        Ok(())
    }

    /// The lock state of every row given.
    pub(super) fn finish(self) -> LockState {
        LockState::from_parts(self.resources.finish(), self.dedup.finish(), self.ended.finish())
            .with_signing_keys(self.keys)
    }
}

/// Opens a state file written by an earlier version (moving text-keyed
/// dedup rows first) and loads its state. Blocking.
pub(super) fn load_state_file(path: &std::path::Path) -> io::Result<(LockState, Option<LogIdT>, Membership)> {
    let db = Database::builder()
        .set_cache_size(8 << 20)
        .create(path)
        .map_err(|e| io_err(&format!("open state file {}", path.display()), e))?;
    {
        let w = db.begin_write().map_err(|e| io_err("begin", e))?;
        for def in [RESOURCES, SIGNING_KEYS, SM_META] {
            w.open_table(def).map_err(|e| io_err("open state table", e))?;
        }
        w.open_table(DEDUP).map_err(|e| io_err("open dedup", e))?;
        super::snapshot::migrate_legacy_dedup(&w)?;
        w.open_table(ENDED).map_err(|e| io_err("open ended", e))?;
        w.commit().map_err(|e| io_err("commit", e))?;
    }
    load(&db)
}

fn load(db: &Database) -> io::Result<(LockState, Option<LogIdT>, Membership)> {
    let r = db.begin_read().map_err(|e| io_err("begin read", e))?;
    let state = state_from_dump(&dump_tables(&r)?)?;
    let meta = r.open_table(SM_META).map_err(|e| io_err("open", e))?;
    let applied = match meta.get(KEY_APPLIED).map_err(|e| io_err("read applied", e))? {
        Some(v) => Some(decode(v.value(), "applied log id")?),
        None => None,
    };
    let membership = match meta.get(KEY_MEMBERSHIP).map_err(|e| io_err("read membership", e))? {
        Some(v) => decode(v.value(), "membership")?,
        None => Membership::default(),
    };
    Ok((state, applied, membership))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::{PACKED_RUN, PackedLoad};

    /// The map of `rows` inserted one by one, as a plain decode would.
    fn inserted<K: Ord + Clone, V: Clone>(rows: &[(K, V)]) -> imbl::OrdMap<K, V> {
        let mut map = imbl::OrdMap::new();
        for (k, v) in rows {
            map.insert(k.clone(), v.clone());
        }
        map
    }

    /// The map of `rows` through [`PackedLoad`].
    fn packed<K: Ord + Clone, V: Clone>(rows: &[(K, V)]) -> imbl::OrdMap<K, V> {
        let mut load = PackedLoad::default();
        for (k, v) in rows {
            load.push(k.clone(), v.clone());
        }
        load.finish()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Ascending keys (as a snapshot stores them), then a few rows
        /// moved or given twice: the loaded map is the one plain
        /// insertion builds, a repeated key keeping its last row.
        #[test]
        fn packed_load_holds_what_insertion_holds(
            keys in prop::collection::btree_set(any::<u32>(), 0..(2 * PACKED_RUN + 40)),
            swaps in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..3),
            repeats in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..3),
        ) {
            let mut rows: Vec<(u32, u32)> = keys.iter().enumerate().map(|(i, k)| (*k, i as u32)).collect();
            if !rows.is_empty() {
                for (a, b) in &swaps {
                    let (a, b) = (a.index(rows.len()), b.index(rows.len()));
                    rows.swap(a, b);
                }
                for (from, at) in &repeats {
                    let key = rows[from.index(rows.len())].0;
                    let at = at.index(rows.len() + 1);
                    rows.insert(at, (key, u32::MAX - at as u32));
                }
            }
            let map = packed(&rows);
            prop_assert_eq!(&map, &inserted(&rows));
            let distinct: BTreeSet<u32> = rows.iter().map(|(k, _)| *k).collect();
            prop_assert_eq!(map.len(), distinct.len());
        }
    }

    /// A key given twice in a row, at an odd then an even position: the run
    /// is not strictly ascending, so it goes in as it came and the key keeps
    /// its last row (an ascending check that let equal keys through would
    /// insert the even one first and keep the earlier row).
    #[test]
    fn packed_load_keeps_the_last_of_two_adjacent_rows() {
        let rows = [(0, 0), (1, 1), (1, 2), (2, 3)];
        assert_eq!(packed(&rows).get(&1), Some(&2));
        assert_eq!(packed(&rows), inserted(&rows));
    }

    /// Runs of exactly [`PACKED_RUN`] rows and the edges around them.
    #[test]
    fn packed_load_at_run_edges() {
        for n in [0, 1, 2, PACKED_RUN - 1, PACKED_RUN, PACKED_RUN + 1, 3 * PACKED_RUN + 5] {
            let rows: Vec<(u64, u64)> = (0..n as u64).map(|i| (i * 3, i)).collect();
            assert_eq!(packed(&rows), inserted(&rows), "{n} rows");
        }
    }

    /// Set by [`packed_load_takes_less_memory`] for the child it starts.
    const MEASURE: &str = "FENCER_TEST_PACKED_LOAD";
    const MEASURED_ROWS: u64 = 240_000;

    /// Memory is what the packed load is for: the same rows loaded in
    /// order, in random order and packed, each in a child process of its
    /// own (this test binary, running only [`packed_load_memory_child`]),
    /// compared by the resident memory the map added. Inserted in order, a
    /// leaf keeps half its slots empty; packed, almost none.
    #[test]
    fn packed_load_takes_less_memory() {
        if !std::path::Path::new("/proc/self/status").exists() {
            eprintln!("SKIP: /proc/self/status is not available here (the resident memory is read from it)");
            return;
        }
        let measure = |how: &str| -> f64 {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "store::tables::tests::packed_load_memory_child", "--ignored", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(MEASURE, how)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "child {how}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
            let line = stdout
                .lines()
                .find_map(|l| l.split_once("resident kB added: ").map(|(_, figure)| figure))
                .unwrap_or_else(|| {
                    panic!("child {how} printed no figure: {stdout}");
                });
            line.trim().parse().unwrap()
        };
        let (in_order, random, packed) = (measure("in-order"), measure("random"), measure("packed"));
        println!(
            "{MEASURED_ROWS} rows: {:.1} MB inserted in order, {:.1} MB in random order, {:.1} MB packed",
            in_order / 1024.0,
            random / 1024.0,
            packed / 1024.0
        );
        // Half-full leaves against full ones: about 2:1 (41.8 / 22.3 MB
        // measured); 0.75 leaves room for the allocator's own overhead.
        assert!(packed < 0.75 * in_order, "packed {packed} kB, in order {in_order} kB");
    }

    #[test]
    #[ignore = "a child of packed_load_takes_less_memory; measures only when it sets FENCER_TEST_PACKED_LOAD"]
    fn packed_load_memory_child() {
        let Ok(how) = std::env::var(MEASURE) else { return };
        let resident_kb = || -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        // Keys spread over the whole range, as request keys (hashes) are,
        // from a seeded xorshift: sorted as a snapshot stores them, or as
        // generated for the fill that applies leave. Values the size of a
        // dedup record.
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut keys: Vec<u128> = (0..MEASURED_ROWS)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                u128::from(x) << 64 | u128::from(i)
            })
            .collect();
        if how != "random" {
            keys.sort_unstable();
        }
        let before = resident_kb();
        let map = match how.as_str() {
            "in-order" | "random" => {
                let mut map = imbl::OrdMap::new();
                for k in &keys {
                    map.insert(*k, [*k as u64; 8]);
                }
                map
            }
            "packed" => {
                let mut load = PackedLoad::default();
                for k in &keys {
                    load.push(*k, [*k as u64; 8]);
                }
                load.finish()
            }
            other => panic!("{MEASURE}={other}: in-order, random or packed"),
        };
        let added = resident_kb().saturating_sub(before);
        assert_eq!(map.len() as u64, MEASURED_ROWS);
        println!("resident kB added: {added}");
    }
}
