//! A leader job: of all the copies of this program that run, one does the
//! periodic work; the others wait in line and take over when it stops or
//! loses the lock.
//!
//! ```text
//! fencer dev &                                   # a coordinator on 127.0.0.1:7420
//! cargo run --example leader_job -- jobs/report   # in two or three terminals
//! ```
//! Stop the leader (Ctrl-C releases the lock at once; `kill -STOP` makes it
//! lose the lock after its ttl) and watch another copy take over with a
//! larger fencing token. `FENCER_ENDPOINTS` names the cluster.
//!
//! The rules it follows (docs/client.md):
//! - start a piece of work only while the lease is Held (`lease.is_held()`);
//! - keep each piece shorter than the time left before the deadline and pass
//!   the token with every write it makes;
//! - on Uncertain start nothing new, and wait to see whether it recovers;
//! - on Lost stop at once and go back to waiting for the lock.

use std::time::Duration;

use fencer_client::{Client, Lease, LeaseState};

const TTL: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let resource = std::env::args().nth(1).unwrap_or_else(|| "jobs/leader-example".into());
    let endpoints = std::env::var("FENCER_ENDPOINTS").unwrap_or_else(|_| fencer_client::DEFAULT_ENDPOINT.into());
    let client = Client::new(endpoints.split(','))?;
    loop {
        eprintln!("waiting to become the leader of {resource} …");
        let lease = tokio::select! {
            lease = client.acquire(resource.as_str()).ttl(TTL).wait(Duration::from_secs(60)) => lease,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(e) => {
                eprintln!("not the leader yet ({e}); trying again");
                continue;
            }
        };
        eprintln!("leader with fencing token {}", lease.token());
        match lead(&lease).await {
            Ending::Lost => eprintln!("lost the lock ({}); back in line", lease.check()),
            Ending::Stop => {
                lease.release().await?;
                eprintln!("released; bye");
                return Ok(());
            }
        }
    }
}

enum Ending {
    Lost,
    Stop,
}

/// Does the work while the lease allows it.
async fn lead(lease: &Lease) -> Ending {
    let mut states = lease.state();
    let mut tick = 0u64;
    loop {
        match lease.check() {
            LeaseState::Held => {
                tick += 1;
                // One bounded piece of work. Real code passes the token with
                // every write (see singleton_writer and proxy_writer).
                println!("tick {tick}: working with token {}", lease.token());
            }
            LeaseState::Uncertain => eprintln!("lease uncertain: starting nothing new"),
            LeaseState::Lost(_) => return Ending::Lost,
        }
        tokio::select! {
            () = tokio::time::sleep(TICK) => {}
            _ = states.changed() => {}
            _ = tokio::signal::ctrl_c() => return Ending::Stop,
        }
    }
}
