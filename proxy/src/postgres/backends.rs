//! What the sidecar knows about PostgreSQL's backends: the cancel keys it
//! relayed (so a CancelRequest reaches the right backend, G1), which
//! connections hold a resource's shared guard with which backend (so a
//! higher token can end the older transactions, G5), and the admin
//! connection that ends them with `pg_terminate_backend` and confirms they
//! exited (G5, G7).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Mutex as AsyncMutex;

use crate::core::clock;
use crate::core::names::ResourceName;
use crate::postgres::config::{PgAddress, PgAdmin, PgSecret, PostgresConfig};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The backends of every relayed connection.
#[derive(Debug, Default)]
pub(crate) struct Backends {
    /// pid → cancel key, as PostgreSQL sent them in BackendKeyData.
    cancel_keys: Mutex<HashMap<u32, Bytes>>,
    /// resource → (connection → backend pid) for the connections holding
    /// the resource's shared guard (an open transaction).
    holders: Mutex<HashMap<ResourceName, HashMap<u64, u32>>>,
}

impl Backends {
    pub(crate) fn register_key(&self, pid: u32, key: Bytes) {
        lock(&self.cancel_keys).insert(pid, key);
    }

    pub(crate) fn forget_key(&self, pid: u32) {
        lock(&self.cancel_keys).remove(&pid);
    }

    /// Whether `key` is the cancel key PostgreSQL gave backend `pid`.
    pub(crate) fn cancel_key_matches(&self, pid: u32, key: &[u8]) -> bool {
        lock(&self.cancel_keys).get(&pid).is_some_and(|k| k.as_ref() == key)
    }

    pub(crate) fn hold(&self, resource: &ResourceName, connection: u64, pid: u32) {
        lock(&self.holders).entry(resource.clone()).or_default().insert(connection, pid);
    }

    pub(crate) fn release(&self, resource: &ResourceName, connection: u64) {
        let mut holders = lock(&self.holders);
        if let Some(m) = holders.get_mut(resource) {
            m.remove(&connection);
            if m.is_empty() {
                holders.remove(resource);
            }
        }
    }

    /// The backends of the connections holding `resource`'s guard.
    pub(crate) fn holders(&self, resource: &ResourceName) -> Vec<u32> {
        lock(&self.holders).get(resource).map(|m| m.values().copied().collect()).unwrap_or_default()
    }
}

/// A PostgreSQL error with its SQLSTATE and message (tokio-postgres'
/// `Display` says only "db error").
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Why the admin connection could not end or confirm a backend.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum AdminConnError {
    #[error("the admin connection to PostgreSQL failed: {0}")]
    Connect(String),
    #[error("PostgreSQL refused the admin query: {0}")]
    Query(String),
    #[error("backend {pid} is still running {waited:?} after pg_terminate_backend")]
    StillRunning { pid: u32, waited: Duration },
}

/// The sidecar's own connection to PostgreSQL (G5, G7).
pub(crate) struct AdminConn {
    config: tokio_postgres::Config,
    describe: String,
    terminate_timeout: Duration,
    client: AsyncMutex<Option<Arc<tokio_postgres::Client>>>,
}

impl std::fmt::Debug for AdminConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConn").field("to", &self.describe).finish_non_exhaustive()
    }
}

/// Reads the admin password from where the configuration says (at start;
/// never logged).
pub(crate) fn read_secret(secret: &PgSecret) -> Result<Option<String>, String> {
    match secret {
        PgSecret::None => Ok(None),
        PgSecret::Env(var) => std::env::var(var)
            .map(Some)
            .map_err(|_| format!("the admin password variable {var} is not set (or not UTF-8)")),
        PgSecret::File(path) => std::fs::read_to_string(path)
            .map(|s| Some(s.trim_end_matches(['\r', '\n']).to_owned()))
            .map_err(|e| format!("cannot read the admin password file {}: {e}", path.display())),
    }
}

impl AdminConn {
    /// The connection's settings; nothing is opened until it is needed.
    pub(crate) fn new(pg: &PostgresConfig, admin: &PgAdmin, password: Option<String>) -> Self {
        let mut config = tokio_postgres::Config::new();
        config.user(&admin.user).dbname(&admin.database).application_name("fencer-sidecar-admin");
        config.connect_timeout(Duration::from_secs(5));
        if let Some(p) = password {
            config.password(p);
        }
        let address = admin.address.as_ref().unwrap_or(&pg.upstream);
        match address {
            PgAddress::Tcp(a) => {
                config.host(a.ip().to_string()).port(a.port());
            }
            PgAddress::Unix(file) => {
                // tokio-postgres takes the directory and the port of the
                // socket `.s.PGSQL.<port>`.
                let dir = file.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
                let port = file
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_prefix(".s.PGSQL."))
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(5432);
                config.host_path(dir).port(port);
            }
        }
        Self {
            config,
            describe: format!("{}@{address}/{}", admin.user, admin.database),
            terminate_timeout: pg.terminate_timeout,
            client: AsyncMutex::new(None),
        }
    }

    async fn client(&self) -> Result<Arc<tokio_postgres::Client>, AdminConnError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let (client, connection) = self
            .config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| AdminConnError::Connect(format!("{}: {}", self.describe, describe(&e))))?;
        // The connection's task ends when the client is dropped.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "the PostgreSQL admin connection ended");
            }
        });
        let client = Arc::new(client);
        *slot = Some(client.clone());
        Ok(client)
    }

    /// Checks the admin connection works (at start and for `/readyz`).
    pub(crate) async fn ping(&self) -> Result<(), AdminConnError> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map(drop).map_err(|e| AdminConnError::Query(describe(&e)))
    }

    /// Whether backend `pid` is gone from `pg_stat_activity`.
    pub(crate) async fn is_gone(&self, pid: u32) -> Result<bool, AdminConnError> {
        let client = self.client().await?;
        let pid = i32::try_from(pid).map_err(|_| AdminConnError::Query(format!("pid {pid} is out of range")))?;
        let rows = client
            .query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
            .await
            .map_err(|e| AdminConnError::Query(describe(&e)))?;
        Ok(rows.is_empty())
    }

    /// Ends backend `pid` and returns once it has exited (G5: "moves E only
    /// once every older backend has exited"): `pg_terminate_backend(pid,
    /// timeout)`, then `pg_stat_activity` until the pid is gone, both
    /// within `terminate_timeout`.
    pub(crate) async fn terminate(&self, pid: u32) -> Result<(), AdminConnError> {
        let client = self.client().await?;
        let pid_i32 = i32::try_from(pid).map_err(|_| AdminConnError::Query(format!("pid {pid} is out of range")))?;
        let ms = i64::try_from(self.terminate_timeout.as_millis()).unwrap_or(i64::MAX);
        let started = clock::now();
        tracing::warn!(pid, "ending an older transaction's backend with pg_terminate_backend (G5)");
        let result = client.query("SELECT pg_terminate_backend($1, $2)", &[&pid_i32, &ms]).await;
        if let Err(e) = result {
            if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) {
                // PostgreSQL before 14 has no timeout argument.
                client
                    .query("SELECT pg_terminate_backend($1)", &[&pid_i32])
                    .await
                    .map_err(|e| AdminConnError::Query(describe(&e)))?;
            } else {
                return Err(AdminConnError::Query(describe(&e)));
            }
        }
        loop {
            if self.is_gone(pid).await? {
                return Ok(());
            }
            let waited = clock::now() - started;
            if waited >= self.terminate_timeout {
                return Err(AdminConnError::StillRunning { pid, waited });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends backend `pid` and keeps trying until it is confirmed gone (G7:
    /// an unknown outcome's quarantine starts only then). Logs each failed
    /// attempt; runs until it succeeds or the proxy stops.
    pub(crate) async fn until_gone(self: Arc<Self>, pid: u32) {
        let mut pause = Duration::from_millis(200);
        loop {
            match self.terminate(pid).await {
                Ok(()) => {
                    tracing::info!(pid, "the backend of an unknown outcome has exited; its quarantine starts");
                    return;
                }
                Err(e) => {
                    tracing::warn!(pid, error = %e, "the backend of an unknown outcome is not confirmed gone yet")
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}
