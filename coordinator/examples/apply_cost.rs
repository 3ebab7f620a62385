//! What applying one log entry costs on one core, at the seed state
//! (DESIGN §0): 100,000 resources, 20,000 held, the request-id and
//! ended-lease tables filled for their 2-minute retention (~240,000 records
//! each), then an uncontended acquire and release mix — what every node's
//! state machine does 4,000 times a second at the seed rate. A snapshot
//! clone is taken every 50,000 entries (the coordinator's default when the
//! figures in docs/performance.md were taken; 100,000 since), so
//! the copy-on-write of the persistent maps is in the figure too.
//!
//! ```text
//! cargo run --release -p fencer-coordinator --example apply_cost -- [ENTRIES]
//! ```
#![allow(clippy::disallowed_types)] // wall time of a loop; no lease or test clock is involved

use std::time::Instant;

use fencer_coordinator::{AcquireCmd, Command, Holder, LeaseId, LockState, LogCommand, RequestId, ResourceName};

const RESOURCES: u64 = 100_000;
const HELD: u64 = 20_000;
const RETAINED: u64 = 240_000;

/// A small deterministic generator (xorshift), so runs compare.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn acquire(n: u64, resource: u64) -> Command {
    Command::Acquire(AcquireCmd {
        request_id: RequestId::new(format!("bench-{n:016x}-request")).expect("request id"),
        resource: ResourceName::new(format!("orders/customer-{resource}")).expect("resource"),
        holder: Holder::new("worker-7@host-3/4242").expect("holder"),
        ttl_ms: 30_000,
        wait: false,
        lease_id: LeaseId::from_u128(u128::from(n) << 32 | 0x5eed),
        max_waiters: 1024,
    })
}

/// The bench's state: the lock state, what it holds, the log index and
/// the time spent in `apply` alone.
struct Bench {
    state: LockState,
    rng: Rng,
    index: u64,
    held: Vec<(u64, LeaseId)>,
    is_held: std::collections::HashSet<u64>,
    snapshot: Option<LockState>,
    in_apply: std::time::Duration,
    /// The retention prunes apart: (records removed, time), each.
    prunes: Vec<(u64, std::time::Duration)>,
}

impl Bench {
    fn apply(&mut self, cmd: Command) -> fencer_coordinator::Outcome {
        self.index += 1;
        let entry = LogCommand { at_ms: self.index, cmd };
        let started = Instant::now();
        if self.index.is_multiple_of(50_000) {
            self.snapshot = Some(self.state.clone());
        }
        let applied = self.state.apply(self.index, &entry);
        self.in_apply += started.elapsed();
        applied.outcome
    }

    /// One acquire of a free resource and, once the held set is full, one
    /// release of a random held lease; the retention prune every 4,000
    /// entries (the leader proposes one a second), of what is older than
    /// 480,000 entries (2 minutes at the seed rate).
    fn step(&mut self) {
        let r = loop {
            let r = self.rng.next() % RESOURCES;
            if !self.is_held.contains(&r) {
                break r;
            }
        };
        if let fencer_coordinator::Outcome::Granted(g) = self.apply(acquire(self.index + 1, r)) {
            self.held.push((r, g.lease_id));
            self.is_held.insert(r);
        }
        if self.held.len() as u64 > HELD {
            let k = (self.rng.next() % self.held.len() as u64) as usize;
            let (r, lease_id) = self.held.swap_remove(k);
            self.is_held.remove(&r);
            let resource = ResourceName::new(format!("orders/customer-{r}")).expect("resource");
            self.apply(Command::Release { resource, lease_id });
        }
        if self.index % 4_000 < 2 && self.index > 2 * RETAINED {
            let before = self.in_apply;
            let outcome = self.apply(Command::PruneDedup { older_than_ms: self.index - 2 * RETAINED });
            if let fencer_coordinator::Outcome::Pruned { dedup, ended } = outcome {
                self.prunes.push((dedup + ended, self.in_apply - before));
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let measured: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(400_000);
    let mut b = Bench {
        state: LockState::new(),
        rng: Rng(0x2545_f491_4f6c_dd1d),
        index: 0,
        held: Vec::with_capacity(HELD as usize + 1),
        is_held: std::collections::HashSet::new(),
        snapshot: None,
        in_apply: std::time::Duration::ZERO,
        prunes: Vec::new(),
    };
    // Fill: the held set, then the retained records of 2 minutes at the seed rate.
    while b.index < 2 * RETAINED {
        b.step();
    }
    b.in_apply = std::time::Duration::ZERO;
    b.prunes.clear();
    let from = b.index;
    while b.index < from + measured {
        b.step();
    }
    let per_entry = b.in_apply / (b.index - from) as u32;
    println!(
        "{} entries applied at {} locks, {} request-id and {} ended-lease records: {:.2} µs per entry ({:.0}/s on one core)",
        b.index - from,
        b.state.lock_count(),
        b.state.dedup_records().len(),
        b.state.ended_records().len(),
        per_entry.as_secs_f64() * 1e6,
        1.0 / per_entry.as_secs_f64(),
    );
    if let Some(longest) = b.prunes.iter().map(|(_, t)| *t).max() {
        let removed: u64 = b.prunes.iter().map(|(n, _)| n).sum();
        println!(
            "  {} retention prunes (one a second at the seed rate) removed {:.0} records each, the longest in {:.2} ms (one apply)",
            b.prunes.len(),
            removed as f64 / b.prunes.len() as f64,
            longest.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
