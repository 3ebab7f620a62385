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
/// given twice keeps its last row.
#[derive(Default)]
pub(super) struct StateRows {
    resources: imbl::OrdMap<ResourceName, ResourceState>,
    dedup: imbl::OrdMap<RequestKey, DedupRecord>,
    ended: imbl::OrdMap<LeaseId, EndedLease>,
    keys: BTreeMap<KeyId, SigningKeyRecord>,
}

impl StateRows {
    /// A row of `resources`: the resource's name and its encoded state.
    pub(super) fn resource(&mut self, name: &str, value: &[u8]) -> io::Result<()> {
        let name = ResourceName::new(name).map_err(|e| io_err("stored resource name", e))?;
        self.resources.insert(name, decode(value, "resource state")?);
        Ok(())
    }

    /// A row of `dedup`: a [`RequestKey`] and its encoded record.
    pub(super) fn dedup(&mut self, key: u128, value: &[u8]) -> io::Result<()> {
        let record = DedupRecord::from_stored(value)
            .map_err(|e| io_err("decode dedup record", format!("{e} ({} bytes)", value.len())))?;
        self.dedup.insert(RequestKey::from_u128(key), record);
        Ok(())
    }

    /// A row of `ended`: a lease id and its encoded record.
    pub(super) fn ended(&mut self, lease: u128, value: &[u8]) -> io::Result<()> {
        self.ended.insert(LeaseId::from_u128(lease), decode(value, "ended lease")?);
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
        LockState::from_parts(self.resources, self.dedup, self.ended).with_signing_keys(self.keys)
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
