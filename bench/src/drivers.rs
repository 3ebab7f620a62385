//! One driver per system under test, each mapping acquire / renew / release
//! onto that system's own API (the mapping is documented in
//! `docs/performance.md`):
//!
//! | | fencer | etcd (lease + txn) | Redis (unsafe reference) |
//! |---|---|---|---|
//! | acquire | `Acquire` (wait 0) | `LeaseGrant(ttl)` + `Txn(if create_revision(key) == 0 then put(key, lease))` | `SET key token NX PX ttl` |
//! | renew | `Renew` | one `LeaseKeepAlive` round trip | compare-and-`PEXPIRE` script |
//! | release | `Release` | `LeaseRevoke` (deletes the key) | compare-and-`DEL` script |
//!
//! The etcd and Redis drivers exist only with the `bench-peers` feature.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencer_client::{Client, ClientError};

/// What a successful acquire hands back, to renew and release with.
#[derive(Debug, Clone)]
pub(crate) enum LeaseToken {
    Fencer(Arc<str>),
    #[cfg(feature = "bench-peers")]
    Etcd(i64),
    #[cfg(feature = "bench-peers")]
    Redis(u64),
}

/// Why an operation failed, as a short kind for the report.
#[derive(Debug, Clone)]
pub(crate) struct OpError {
    /// `LOCK_HELD`, `UNAVAILABLE/NOT_LEADER`, `TIMEOUT`, `SHED`, …
    pub(crate) kind: String,
    /// The error's own words (the report keeps one per kind).
    pub(crate) message: String,
    /// The server said the lease is gone (renew): stop renewing it.
    pub(crate) lost_lease: bool,
}

impl OpError {
    /// A failure decided by the bench itself (shed, nothing to pick).
    pub(crate) fn local(kind: &str) -> Self {
        Self { kind: kind.to_string(), message: String::new(), lost_lease: false }
    }

    /// The outcome is unknown (timeout, transport).
    pub(crate) fn unknown(kind: &str, message: String) -> Self {
        Self { kind: kind.to_string(), message, lost_lease: false }
    }

    fn refused(kind: &str, lost_lease: bool) -> Self {
        Self { kind: kind.to_string(), message: String::new(), lost_lease }
    }
}

/// A system under test.
pub(crate) enum Driver {
    Fencer(FencerDriver),
    #[cfg(feature = "bench-peers")]
    Etcd(peers::EtcdDriver),
    #[cfg(feature = "bench-peers")]
    Redis(peers::RedisDriver),
    /// Answers after a delay, or after a test opens its gate (tests only).
    #[cfg(test)]
    Fake(FakeDriver),
}

/// A system that takes `delay` per operation and can be stalled by holding
/// `gate` for writing.
#[cfg(test)]
pub(crate) struct FakeDriver {
    pub(crate) delay: Duration,
    pub(crate) gate: tokio::sync::RwLock<()>,
}

#[cfg(test)]
impl FakeDriver {
    async fn op(&self) -> Result<(), OpError> {
        drop(self.gate.read().await);
        tokio::time::sleep(self.delay).await;
        Ok(())
    }
}

impl Driver {
    pub(crate) async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LeaseToken, OpError> {
        match self {
            Driver::Fencer(d) => d.acquire(resource, ttl).await,
            #[cfg(feature = "bench-peers")]
            Driver::Etcd(d) => d.acquire(resource, ttl).await,
            #[cfg(feature = "bench-peers")]
            Driver::Redis(d) => d.acquire(resource, ttl).await,
            #[cfg(test)]
            Driver::Fake(d) => d.op().await.map(|()| LeaseToken::Fencer("fake".into())),
        }
    }

    #[cfg_attr(not(feature = "bench-peers"), allow(unused_variables, reason = "only Redis renews with a ttl"))]
    pub(crate) async fn renew(&self, resource: &str, lease: &LeaseToken, ttl: Duration) -> Result<(), OpError> {
        match (self, lease) {
            (Driver::Fencer(d), LeaseToken::Fencer(id)) => d.renew(resource, id).await,
            #[cfg(feature = "bench-peers")]
            (Driver::Etcd(d), LeaseToken::Etcd(id)) => d.renew(*id).await,
            #[cfg(feature = "bench-peers")]
            (Driver::Redis(d), LeaseToken::Redis(token)) => d.renew(resource, *token, ttl).await,
            #[cfg(test)]
            (Driver::Fake(d), _) => d.op().await,
            #[cfg(feature = "bench-peers")]
            _ => Err(OpError::local("WRONG_LEASE_KIND")),
        }
    }

    pub(crate) async fn release(&self, resource: &str, lease: &LeaseToken) -> Result<(), OpError> {
        match (self, lease) {
            (Driver::Fencer(d), LeaseToken::Fencer(id)) => d.release(resource, id).await,
            #[cfg(feature = "bench-peers")]
            (Driver::Etcd(d), LeaseToken::Etcd(id)) => d.release(*id).await,
            #[cfg(feature = "bench-peers")]
            (Driver::Redis(d), LeaseToken::Redis(token)) => d.release(resource, *token).await,
            #[cfg(test)]
            (Driver::Fake(d), _) => d.op().await,
            #[cfg(feature = "bench-peers")]
            _ => Err(OpError::local("WRONG_LEASE_KIND")),
        }
    }
}

/// fencer through `fencer_client::Client`, several connections round robin
/// (one `Client` holds one HTTP/2 connection per node).
pub(crate) struct FencerDriver {
    clients: Vec<Client>,
    next: AtomicUsize,
}

impl FencerDriver {
    pub(crate) fn new(
        endpoints: &[String],
        connections: usize,
        batching: usize,
        op_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let clients = (0..connections.max(1))
            .map(|_| {
                Client::new(endpoints.iter().cloned()).map(|c| c.with_call_timeout(op_timeout).with_batching(batching))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { clients, next: AtomicUsize::new(0) })
    }

    fn client(&self) -> &Client {
        &self.clients[self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len()]
    }

    async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LeaseToken, OpError> {
        // One routed attempt, no library-level resends: the bench classifies
        // and counts every failure itself.
        let grant = self
            .client()
            .acquire(resource)
            .ttl(ttl)
            .holder("fencer-bench")
            .retry_budget(Duration::ZERO)
            .grant()
            .await
            .map_err(|e| fencer_error(e.client_error().clone()))?;
        Ok(LeaseToken::Fencer(grant.lease_id.to_string().into()))
    }

    async fn renew(&self, resource: &str, lease_id: &str) -> Result<(), OpError> {
        self.client().renew(resource, lease_id).await.map(drop).map_err(fencer_error)
    }

    async fn release(&self, resource: &str, lease_id: &str) -> Result<(), OpError> {
        let r = self.client().release(resource, lease_id).await.map_err(fencer_error)?;
        if r.released { Ok(()) } else { Err(OpError::refused("NOT_RELEASED", true)) }
    }
}

/// The report's kind of a client error: the server's reason when it gave one.
pub(crate) fn fencer_error(e: ClientError) -> OpError {
    let kind = match &e {
        ClientError::Refused { reason, .. } => reason.as_str().to_string(),
        ClientError::Unavailable { reason: Some(r), .. } => format!("UNAVAILABLE/{}", r.as_str()),
        ClientError::Unavailable { reason: None, .. } => "UNAVAILABLE".to_string(),
        ClientError::Config(_) => "CONFIG".to_string(),
    };
    let lost_lease = matches!(&e, ClientError::Refused { .. });
    OpError { kind, message: e.to_string(), lost_lease }
}

#[cfg(feature = "bench-peers")]
pub(crate) mod peers {
    //! etcd and Redis drivers (feature `bench-peers`).

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

    use super::{LeaseToken, OpError};

    /// etcd's lease + txn lock recipe (what its `concurrency` package does,
    /// minus the waiting): the key exists only while its lease lives.
    pub(crate) struct EtcdDriver {
        clients: Vec<etcd_client::Client>,
        next: AtomicUsize,
    }

    fn etcd_error(e: etcd_client::Error) -> OpError {
        let kind = match &e {
            etcd_client::Error::GRpcStatus(s) => format!("GRPC_{:?}", s.code()).to_uppercase(),
            etcd_client::Error::TransportError(_) => "TRANSPORT".into(),
            etcd_client::Error::LeaseKeepAliveError(m) if m.contains("not found") => {
                return OpError::refused("LEASE_EXPIRED", true);
            }
            _ => "ETCD".into(),
        };
        OpError::unknown(&kind, e.to_string())
    }

    impl EtcdDriver {
        pub(crate) async fn connect(endpoints: &[String], connections: usize) -> anyhow::Result<Self> {
            let mut clients = Vec::new();
            for _ in 0..connections.max(1) {
                let opts = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(2))
                    .with_timeout(Duration::from_secs(10));
                clients.push(etcd_client::Client::connect(endpoints, Some(opts)).await?);
            }
            Ok(Self { clients, next: AtomicUsize::new(0) })
        }

        fn client(&self) -> etcd_client::Client {
            self.clients[self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len()].clone()
        }

        pub(super) async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LeaseToken, OpError> {
            let mut c = self.client();
            let ttl_s = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
            let lease = c.lease_grant(ttl_s, None).await.map_err(etcd_error)?.id();
            let key = resource.as_bytes();
            let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(
                key,
                "fencer-bench",
                Some(PutOptions::new().with_lease(lease)),
            )]);
            let resp = c.txn(txn).await.map_err(etcd_error)?;
            if resp.succeeded() {
                Ok(LeaseToken::Etcd(lease))
            } else {
                let _ = c.lease_revoke(lease).await;
                Err(OpError::refused("LOCK_HELD", false))
            }
        }

        pub(super) async fn renew(&self, lease: i64) -> Result<(), OpError> {
            // One keep-alive round trip: the call sends a keep-alive and
            // waits for its answer (ttl <= 0 means the lease is gone).
            self.client().lease_keep_alive(lease).await.map(drop).map_err(etcd_error)
        }

        pub(super) async fn release(&self, lease: i64) -> Result<(), OpError> {
            match self.client().lease_revoke(lease).await {
                Ok(_) => Ok(()),
                Err(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound => {
                    Err(OpError::refused("NOT_HOLDER", true))
                }
                Err(e) => Err(etcd_error(e)),
            }
        }
    }

    /// Redis `SET NX PX` with compare-and-delete / compare-and-pexpire
    /// scripts: fast, and unsafe (no fencing, no replication, no fsync).
    pub(crate) struct RedisDriver {
        connections: Vec<redis::aio::MultiplexedConnection>,
        next: AtomicUsize,
        renew: redis::Script,
        release: redis::Script,
    }

    const RENEW: &str = r"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
    const RELEASE: &str =
        r"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

    fn redis_error(e: redis::RedisError) -> OpError {
        let kind = if e.is_timeout() {
            "TIMEOUT"
        } else if e.is_io_error() || e.is_connection_dropped() {
            "TRANSPORT"
        } else {
            "REDIS"
        };
        OpError::unknown(kind, e.to_string())
    }

    impl RedisDriver {
        pub(crate) async fn connect(addr: &str, connections: usize) -> anyhow::Result<Self> {
            let client = redis::Client::open(format!("redis://{addr}/"))?;
            let mut conns = Vec::new();
            for _ in 0..connections.max(1) {
                conns.push(client.get_multiplexed_async_connection().await?);
            }
            Ok(Self {
                connections: conns,
                next: AtomicUsize::new(0),
                renew: redis::Script::new(RENEW),
                release: redis::Script::new(RELEASE),
            })
        }

        fn conn(&self) -> redis::aio::MultiplexedConnection {
            self.connections[self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len()].clone()
        }

        pub(super) async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LeaseToken, OpError> {
            let token = random_token();
            let ok: Option<String> = redis::cmd("SET")
                .arg(resource)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut self.conn())
                .await
                .map_err(redis_error)?;
            match ok {
                Some(_) => Ok(LeaseToken::Redis(token)),
                None => Err(OpError::refused("LOCK_HELD", false)),
            }
        }

        pub(super) async fn renew(&self, resource: &str, token: u64, ttl: Duration) -> Result<(), OpError> {
            let n: i64 = self
                .renew
                .key(resource)
                .arg(token)
                .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
                .invoke_async(&mut self.conn())
                .await
                .map_err(redis_error)?;
            if n == 1 { Ok(()) } else { Err(OpError::refused("NOT_HOLDER", true)) }
        }

        pub(super) async fn release(&self, resource: &str, token: u64) -> Result<(), OpError> {
            let n: i64 =
                self.release.key(resource).arg(token).invoke_async(&mut self.conn()).await.map_err(redis_error)?;
            if n == 1 { Ok(()) } else { Err(OpError::refused("NOT_HOLDER", true)) }
        }
    }

    fn random_token() -> u64 {
        let id = fencer_client::new_request_id();
        u64::from_str_radix(&id[..16], 16).unwrap_or(0)
    }
}
