//! A singleton writer, and why the fencing token matters: two writers take
//! turns at a lock; the first is paused past its ttl (as by a GC pause or
//! SIGSTOP), the second takes over, and when the first wakes up its write is
//! rejected by the store because its token is older.
//!
//! ```text
//! cargo run --example singleton_writer                    # starts an in-process coordinator
//! FENCER_ENDPOINTS=127.0.0.1:7420 cargo run --example singleton_writer
//! ```
//!
//! The store here checks tokens itself, like a database row guarded with
//! `UPDATE … SET value = $v, token = $t WHERE token <= $t`. A database that
//! cannot check goes behind `fencer proxy` instead (see proxy_writer).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencer_client::{Client, FencingToken};

/// A store that remembers the highest token it accepted and refuses older ones.
#[derive(Default)]
struct Store {
    highest: u64,
    value: String,
}

impl Store {
    /// The fenced write: the token is compared and the value set atomically.
    fn write(&mut self, token: FencingToken, value: &str) -> Result<(), String> {
        if token.get() < self.highest {
            return Err(format!("stale token {token} < {}", self.highest));
        }
        self.highest = token.get();
        self.value = value.to_string();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (endpoint, node) = match std::env::var("FENCER_ENDPOINTS") {
        Ok(ep) => (ep, None),
        Err(_) => {
            // Fast timings so the example's ttl can be 1 s.
            let mut config = fencer_coordinator::NodeConfig::single(dir.path(), "127.0.0.1:0".parse()?);
            config.heartbeat = Duration::from_millis(50);
            config.election_timeout = (Duration::from_millis(150), Duration::from_millis(300));
            let node = fencer_coordinator::Node::start(config).await?;
            node.wait_for_leader(Duration::from_secs(10)).await.map_err(anyhow::Error::msg)?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            (node.local_addr().to_string(), Some(node))
        }
    };
    let ttl = if node.is_some() { Duration::from_secs(1) } else { Duration::from_secs(3) };
    let client = Client::new(endpoint.split(','))?;
    let store = Arc::new(Mutex::new(Store::default()));
    let resource = "examples/singleton-writer";

    // Writer A runs on a runtime of its own thread, so that blocking the
    // thread pauses all of A, its lease renewal included: a faithful GC
    // pause or SIGSTOP.
    let (a_wrote, a_wrote_rx) = tokio::sync::oneshot::channel();
    let a = {
        // A client of its own: connections belong to the runtime that made them.
        let (client, store) = (Client::new(endpoint.split(','))?, store.clone());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let lease = client.acquire(resource).ttl(ttl).holder("writer-a").await?;
                store.lock().unwrap().write(lease.token(), "from A").map_err(anyhow::Error::msg)?;
                println!("A wrote with token {}", lease.token());
                let _ = a_wrote.send(lease.token());

                std::thread::sleep(ttl * 3); // the pause

                // A careful client checks before writing, and stops …
                println!("A wakes up; its lease is {}", lease.check());
                // … but a zombie that writes anyway is stopped by the store.
                match store.lock().unwrap().write(lease.token(), "from A, too late") {
                    Ok(()) => anyhow::bail!("the store accepted a stale write"),
                    Err(e) => println!("A's late write was rejected: {e}"),
                }
                Ok(())
            })
        })
    };
    let a_token = a_wrote_rx.await?;

    // Meanwhile B waits for the lock, gets it once A's lease expired, writes.
    let b = client.acquire(resource).ttl(ttl).wait(ttl * 5).holder("writer-b").await?;
    store.lock().unwrap().write(b.token(), "from B").map_err(anyhow::Error::msg)?;
    println!("B wrote with token {} (> {a_token})", b.token());
    a.join().map_err(|_| anyhow::anyhow!("writer A panicked"))??;
    let (value, highest) = {
        let s = store.lock().unwrap();
        (s.value.clone(), s.highest)
    };
    println!("the store holds {value:?} with token {highest}");
    b.release().await?;
    if let Some(node) = node {
        node.shutdown().await;
    }
    Ok(())
}
