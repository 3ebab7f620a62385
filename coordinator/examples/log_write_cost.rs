//! What one durable group commit of the raft log costs: CPU time and wall
//! time per group of 6 entries (a follower's replication round at the seed
//! rate), each group made durable before the next is written. First
//! through the log store as the coordinator runs it (the write-ahead log,
//! `pwrite` + `fdatasync`), then the same groups as the redb store of
//! earlier versions wrote them (one `Durability::Immediate` transaction
//! each), in the same directory so both see the same disk.
//!
//! ```text
//! cargo run --release -p fencer-coordinator --example log_write_cost -- [GROUPS [DIR]]
//! ```
//!
//! CPU is this process's user + system time from `/proc/self/stat` (10 ms
//! ticks), so the flusher thread's share and the kernel's `fdatasync` work
//! are in it. The log store's wall time per group is at least its gap
//! between durable commits (`COMMIT_GAP`, 1 ms: the default until
//! `--log-commit-gap`), which a group waited on by the next one always
//! meets.
#![allow(clippy::disallowed_types)] // wall time of a loop; no lease or test clock is involved

use std::time::{Duration, Instant};

use fencer_coordinator::{
    Command, LOG_DIR, LeaseId, LogCommand, LogStore, Metrics, ResourceName, TypeConfig, WalOptions,
};
use openraft::alias::EntryOf;
use openraft::entry::RaftEntry as _;
use openraft::storage::{IOFlushed, RaftLogStorage as _};
use openraft::type_config::TypeConfigExt as _;

const PER_GROUP: u64 = 6;
/// The log store's gap between durable commits in this example's figures.
const COMMIT_GAP: Duration = Duration::from_millis(1);

/// This process's CPU time so far (user + system), from `/proc/self/stat`.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name's closing parenthesis: utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

fn entry(index: u64) -> EntryOf<TypeConfig> {
    let cmd = Command::Release {
        resource: ResourceName::new(format!("orders/customer-{index}")).expect("resource"),
        lease_id: LeaseId::from_u128(u128::from(index) * 0x9e37_79b9_7f4a_7c15),
    };
    EntryOf::<TypeConfig>::new_normal(
        openraft::testing::log_id::<TypeConfig>(3, 1, index),
        LogCommand { at_ms: 1_796_000_000_000 + index, cmd },
    )
}

fn report(what: &str, groups: u64, cpu: Duration, wall: Duration) {
    println!(
        "{what}: {groups} groups of {PER_GROUP} entries, CPU {:.1} µs per group, wall {:.1} µs per group",
        cpu.as_secs_f64() * 1e6 / groups as f64,
        wall.as_secs_f64() * 1e6 / groups as f64,
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let groups: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3_000);
    let dir = tempfile::Builder::new().prefix("fencer-log-write-cost").tempdir_in(args.next().unwrap_or(".".into()))?;

    // The write-ahead log, through the store's own flusher thread.
    let mut log = LogStore::open_with(&dir.path().join(LOG_DIR), Metrics::new(), WalOptions::default(), COMMIT_GAP)?;
    let (cpu0, wall0) = (cpu(), Instant::now());
    for g in 0..groups {
        let entries: Vec<_> = (0..PER_GROUP).map(|k| entry(1 + g * PER_GROUP + k)).collect();
        let (tx, rx) = TypeConfig::oneshot();
        log.append(entries, IOFlushed::signal(tx)).await?;
        rx.await??;
    }
    report("write-ahead log", groups, cpu() - cpu0, wall0.elapsed());
    drop(log);

    // The same groups as the redb log store of earlier versions wrote them.
    const LOG: redb::TableDefinition<'_, u64, &[u8]> = redb::TableDefinition::new("log");
    let db = redb::Database::builder().set_cache_size(8 << 20).create(dir.path().join("raft-log.redb"))?;
    let (cpu0, wall0) = (cpu(), Instant::now());
    for g in 0..groups {
        let tx = db.begin_write()?;
        {
            let mut table = tx.open_table(LOG)?;
            for k in 0..PER_GROUP {
                let index = 1 + g * PER_GROUP + k;
                let bytes = postcard::to_stdvec(&entry(index))?;
                table.insert(index, bytes.as_slice())?;
            }
        }
        tx.commit()?;
    }
    report("redb, one transaction per group", groups, cpu() - cpu0, wall0.elapsed());
    Ok(())
}
