//! The seed workload as an open-loop scheduler (DESIGN §0, §9).
//!
//! Operations are dispatched at their *intended* time whatever happened to
//! earlier ones, and their latency is measured from that intended time, so a
//! stall of the system under test shows up as latency (and as shed
//! operations once the in-flight cap is reached) instead of silently lowering
//! the offered rate (coordinated omission).
//!
//! Three schedules run at once:
//! - acquires at a fixed rate, each on a resource that is free *in the
//!   bench's own view* (uncontended: the bench never races itself);
//! - releases at a fixed rate, each of a held lease with nothing in flight;
//! - renewals of every held lease every `renew_every`: the first at a random
//!   phase for leases taken during the warm-up (so the renewal load is flat
//!   from the first measured second), then every period exactly.
//!
//! A warm-up first fills the active set at `fill_rate` (no releases), then
//! the measured phase runs for `duration`. Only operations *intended* inside
//! the measured phase are measured; those still in flight at its end are
//! waited for (bounded) and counted.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::drivers::{Driver, LeaseToken, OpError};

/// Histogram bounds: 1 µs to 10 minutes, 3 significant figures.
const HIST_MAX_US: u64 = 600_000_000;

/// A new latency histogram (microseconds).
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("constant histogram bounds are valid")
}

/// Microseconds from `from` to `to`, at least 1 (HDR histograms start at 1).
pub(crate) fn micros_between(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros()).unwrap_or(u64::MAX).clamp(1, HIST_MAX_US)
}

/// The workload's knobs (all of them flags of `fencer bench`).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct WorkloadConfig {
    /// Resources the acquires pick from.
    pub(crate) resources: u32,
    /// Leases held at once in the steady state.
    pub(crate) active: u32,
    /// Acquires per second in the measured phase.
    pub(crate) acquire_rate: f64,
    /// Releases per second in the measured phase.
    pub(crate) release_rate: f64,
    /// Acquires per second while filling the active set.
    pub(crate) fill_rate: f64,
    /// Renewal period of every held lease.
    #[serde(with = "humantime_serde_ms")]
    pub(crate) renew_every: Duration,
    /// Lease ttl asked for.
    #[serde(with = "humantime_serde_ms")]
    pub(crate) ttl: Duration,
    /// Length of the measured phase.
    #[serde(with = "humantime_serde_ms")]
    pub(crate) duration: Duration,
    /// Longest the warm-up may take before the measured phase starts anyway.
    #[serde(with = "humantime_serde_ms")]
    pub(crate) warmup_max: Duration,
    /// Operations in flight at once; beyond it operations are shed (errors).
    pub(crate) max_in_flight: usize,
    /// One operation's time limit (the driver's retries included).
    #[serde(with = "humantime_serde_ms")]
    pub(crate) op_timeout: Duration,
    /// Seed of the resource picker.
    pub(crate) seed: u64,
}

/// Durations as milliseconds in the JSON report.
mod humantime_serde_ms {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl WorkloadConfig {
    /// Checks the combination of knobs; names the flag to fix.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.active == 0 || self.active > self.resources {
            return Err(format!("--active {} must be between 1 and --resources {}", self.active, self.resources));
        }
        for (flag, rate) in [
            ("--acquire-rate", self.acquire_rate),
            ("--release-rate", self.release_rate),
            ("--fill-rate", self.fill_rate),
        ] {
            if !(0.0..=1_000_000.0).contains(&rate) || rate.is_nan() {
                return Err(format!("{flag} {rate} must be between 0 and 1,000,000 per second"));
            }
        }
        if self.fill_rate <= 0.0 {
            return Err("--fill-rate must be positive".into());
        }
        if self.op_timeout >= self.renew_every {
            return Err(format!(
                "--op-timeout {:?} must be shorter than --renew-every {:?} (a lease's renewals must never overlap)",
                self.op_timeout, self.renew_every
            ));
        }
        if self.renew_every >= self.ttl {
            return Err(format!("--renew-every {:?} must be shorter than --ttl {:?}", self.renew_every, self.ttl));
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(3600) {
            return Err("--duration must be between 1 s and 1 h".into());
        }
        if self.max_in_flight == 0 || self.max_in_flight > 1_000_000 {
            return Err("--max-in-flight must be between 1 and 1,000,000".into());
        }
        Ok(())
    }

    /// The steady-state committed-operation rate offered: acquires, releases
    /// and renewals of the active set.
    pub(crate) fn offered_rate(&self) -> f64 {
        self.acquire_rate + self.release_rate + f64::from(self.active) / self.renew_every.as_secs_f64()
    }
}

/// The three operations of the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Op {
    Acquire,
    Renew,
    Release,
}

impl Op {
    pub(crate) const ALL: [Op; 3] = [Op::Acquire, Op::Renew, Op::Release];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::Release => "release",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Operations of one kind at a fixed rate: operation `i` is intended at
/// `start + i / rate`, computed from `i` (not accumulated) so it never drifts.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    start: Instant,
    rate: f64,
    next: u64,
}

impl Schedule {
    pub(crate) fn new(start: Instant, rate: f64) -> Self {
        Self { start, rate, next: 0 }
    }

    /// When operation `i` is intended; `None` at rate zero.
    pub(crate) fn intended(&self, i: u64) -> Option<Instant> {
        (self.rate > 0.0).then(|| self.start + Duration::from_secs_f64(i as f64 / self.rate))
    }

    /// When the next operation is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.intended(self.next)
    }

    /// The intended time of the next operation if it is due at `now`.
    pub(crate) fn take_due(&mut self, now: Instant) -> Option<Instant> {
        let t = self.next_due()?;
        if t <= now {
            self.next += 1;
            Some(t)
        } else {
            None
        }
    }

    /// Operations taken so far.
    #[cfg(test)]
    pub(crate) fn taken(&self) -> u64 {
        self.next
    }
}

/// SplitMix64: a tiny, seedable generator for picking resources. Picks need
/// to be spread, not unpredictable.
#[derive(Debug, Clone)]
pub(crate) struct Picker(u64);

impl Picker {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0); the modulo bias is irrelevant here.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A set of resource indexes with O(1) insert, remove and random pick.
#[derive(Debug, Clone)]
pub(crate) struct PickSet {
    items: Vec<u32>,
    pos: Vec<u32>,
}

const ABSENT: u32 = u32::MAX;

impl PickSet {
    pub(crate) fn new(capacity: u32) -> Self {
        Self { items: Vec::new(), pos: vec![ABSENT; capacity as usize] }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn contains(&self, r: u32) -> bool {
        self.pos[r as usize] != ABSENT
    }

    pub(crate) fn insert(&mut self, r: u32) {
        if !self.contains(r) {
            self.pos[r as usize] = self.items.len() as u32;
            self.items.push(r);
        }
    }

    pub(crate) fn remove(&mut self, r: u32) -> bool {
        let p = self.pos[r as usize];
        if p == ABSENT {
            return false;
        }
        let last = self.items.pop().expect("a present item means the list is not empty");
        if last != r {
            self.items[p as usize] = last;
            self.pos[last as usize] = p;
        }
        self.pos[r as usize] = ABSENT;
        true
    }

    /// Removes and returns a random member.
    pub(crate) fn pick(&mut self, picker: &mut Picker) -> Option<u32> {
        if self.items.is_empty() {
            return None;
        }
        let r = self.items[picker.below(self.items.len())];
        self.remove(r);
        Some(r)
    }
}

/// What the bench believes about one resource.
#[derive(Debug, Clone)]
enum Slot {
    Free,
    Acquiring,
    Held {
        lease: LeaseToken,
        generation: u32,
        renewing: bool,
    },
    Releasing,
    /// Outcome unknown or refused: the lock may still be held on the server
    /// (by a lease the bench does not know) until its ttl runs out, so the
    /// resource rests for longer than that before it is picked again.
    Quarantined,
}

/// Per-second figures of one operation, by intended time.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct Second {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) max_us: u64,
    pub(crate) sum_us: u64,
}

/// Everything measured about one operation kind.
#[derive(Debug, Clone)]
pub(crate) struct OpRecord {
    /// Latency of successful operations intended in the measured phase (µs).
    pub(crate) hist: Histogram<u64>,
    /// Operations intended in the measured phase.
    pub(crate) intended: u64,
    pub(crate) ok: u64,
    pub(crate) errors: BTreeMap<String, u64>,
    /// The first message of each error kind (warm-up included).
    pub(crate) examples: BTreeMap<String, String>,
    /// Per second of the measured phase.
    pub(crate) timeline: Vec<Second>,
    /// Completion times of successes, µs since the measured phase started.
    pub(crate) success_at_us: Vec<u64>,
    /// Warm-up operations (not in the figures above).
    pub(crate) warmup_ok: u64,
    pub(crate) warmup_errors: BTreeMap<String, u64>,
}

impl OpRecord {
    fn new(seconds: usize) -> Self {
        Self {
            hist: new_histogram(),
            intended: 0,
            ok: 0,
            errors: BTreeMap::new(),
            examples: BTreeMap::new(),
            timeline: vec![Second::default(); seconds],
            success_at_us: Vec::new(),
            warmup_ok: 0,
            warmup_errors: BTreeMap::new(),
        }
    }

    pub(crate) fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// The result of one workload run.
#[derive(Debug)]
pub(crate) struct WorkloadResult {
    pub(crate) ops: [OpRecord; 3],
    /// When the measured phase started.
    pub(crate) measure_start: Instant,
    /// Length of the measured phase as run.
    pub(crate) measured: Duration,
    pub(crate) warmup: Duration,
    /// Whether the warm-up reached the active target.
    pub(crate) warmup_reached: bool,
    /// Leases held at the end (bench's view).
    pub(crate) held_at_end: usize,
    /// Resources quarantined after an unknown or refused outcome.
    pub(crate) retired: usize,
    /// Operations still in flight when the drain limit ran out.
    pub(crate) abandoned: usize,
    /// The highest number of operations in flight at once.
    pub(crate) peak_in_flight: usize,
}

impl WorkloadResult {
    pub(crate) fn op(&self, op: Op) -> &OpRecord {
        &self.ops[op.index()]
    }
}

/// One finished operation, sent back to the scheduler.
struct Completion {
    op: Op,
    resource: u32,
    generation: u32,
    /// Dispatched in the measured phase.
    measured: bool,
    intended: Instant,
    done: Instant,
    result: Result<Option<LeaseToken>, OpError>,
}

/// How much longer than the ttl a resource with an unknown outcome rests:
/// the server expires a lease on its duty tick, and a new leader restarts
/// inherited leases at ttl + election timeout (DESIGN §3.2).
const QUARANTINE_MARGIN: Duration = Duration::from_secs(5);

/// Name of resource `r` (every system uses the same names).
pub(crate) fn resource_name(r: u32) -> String {
    format!("bench/r{r:07}")
}

enum Phase {
    Fill,
    Measure { end: Instant },
}

struct Runner {
    cfg: WorkloadConfig,
    driver: Arc<Driver>,
    slots: Vec<Slot>,
    free: PickSet,
    idle_held: PickSet,
    held: usize,
    retired: usize,
    quarantine: std::collections::VecDeque<(Instant, u32)>,
    renewals: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    next_generation: u32,
    picker: Picker,
    permits: Arc<Semaphore>,
    tasks: JoinSet<()>,
    tx: mpsc::UnboundedSender<Completion>,
    in_flight: usize,
    acquiring: usize,
    peak_in_flight: usize,
    ops: [OpRecord; 3],
    /// When the run (the warm-up) started.
    started: Instant,
    measure_start: Option<Instant>,
    /// Progress: successes and errors since the last line, acquire latencies.
    progress: ProgressWindow,
}

struct ProgressWindow {
    ok: [u64; 3],
    errors: u64,
    acquire: Histogram<u64>,
}

impl ProgressWindow {
    fn new() -> Self {
        Self { ok: [0; 3], errors: 0, acquire: new_histogram() }
    }
}

/// Runs the workload against `driver`. `measuring` learns when the measured
/// phase starts (scenarios schedule their faults from it).
pub(crate) async fn run(
    driver: Arc<Driver>,
    cfg: WorkloadConfig,
    label: String,
    measuring: Option<oneshot::Sender<Instant>>,
) -> WorkloadResult {
    let seconds = usize::try_from(cfg.duration.as_secs()).unwrap_or(3600) + 1;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut free = PickSet::new(cfg.resources);
    for r in 0..cfg.resources {
        free.insert(r);
    }
    let mut runner = Runner {
        slots: vec![Slot::Free; cfg.resources as usize],
        free,
        idle_held: PickSet::new(cfg.resources),
        held: 0,
        retired: 0,
        quarantine: std::collections::VecDeque::new(),
        renewals: BinaryHeap::new(),
        next_generation: 0,
        picker: Picker::new(cfg.seed),
        permits: Arc::new(Semaphore::new(cfg.max_in_flight)),
        tasks: JoinSet::new(),
        tx,
        in_flight: 0,
        acquiring: 0,
        peak_in_flight: 0,
        ops: [OpRecord::new(seconds), OpRecord::new(seconds), OpRecord::new(seconds)],
        started: Instant::now(),
        measure_start: None,
        progress: ProgressWindow::new(),
        driver,
        cfg,
    };
    let progress = Progress::new(label);
    let started = runner.started;
    let warmup_deadline = started + runner.cfg.warmup_max;
    let mut phase = Phase::Fill;
    let mut acquires = Schedule::new(started, runner.cfg.fill_rate);
    let mut releases = Schedule::new(started, 0.0);
    let mut measuring = measuring;
    let mut warmup_reached = false;
    let mut next_progress = started + Duration::from_secs(1);

    loop {
        let now = Instant::now();
        if let Phase::Fill = phase
            && (runner.filled() || now >= warmup_deadline)
        {
            // Acquires still in flight finish in the measured phase's
            // first moments (and are counted as warm-up operations).
            warmup_reached = runner.filled();
            let start = now;
            runner.measure_start = Some(start);
            acquires = Schedule::new(start, runner.cfg.acquire_rate);
            releases = Schedule::new(start, runner.cfg.release_rate);
            phase = Phase::Measure { end: start + runner.cfg.duration };
            if let Some(tx) = measuring.take() {
                let _ = tx.send(start);
            }
        }
        let end = match phase {
            Phase::Measure { end } if now >= end => break,
            Phase::Measure { end } => Some(end),
            Phase::Fill => None,
        };

        runner.end_quarantines(now);
        // Dispatch everything due, in intended-time order per schedule.
        while let Some(t) = acquires.take_due(now) {
            runner.start_acquire(t);
            if let Phase::Fill = phase
                && runner.filled()
            {
                break;
            }
        }
        while let Some(t) = releases.take_due(now) {
            runner.start_release(t);
        }
        while let Some(Reverse((due, r, generation))) = runner.renewals.peek().copied() {
            if due > now {
                break;
            }
            runner.renewals.pop();
            runner.start_renew(r, generation, due);
        }
        if now >= next_progress {
            progress.line(&mut runner, &phase, now);
            next_progress += Duration::from_secs(1);
        }

        let mut wake = next_progress;
        for t in [acquires.next_due(), releases.next_due(), runner.renewals.peek().map(|Reverse((t, _, _))| *t), end]
            .into_iter()
            .flatten()
        {
            wake = wake.min(t);
        }
        if let Phase::Fill = phase {
            wake = wake.min(warmup_deadline);
        }
        tokio::select! {
            biased;
            Some(c) = rx.recv() => {
                runner.complete(c);
                while let Ok(c) = rx.try_recv() {
                    runner.complete(c);
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        while runner.tasks.try_join_next().is_some() {}
    }

    // Drain: every operation is bounded by its timeout; give them that long.
    let measure_start = runner.measure_start.unwrap_or(started);
    let measured = Instant::now() - measure_start;
    let drain_deadline = Instant::now() + runner.cfg.op_timeout + Duration::from_secs(2);
    while runner.in_flight > 0 {
        match tokio::time::timeout_at(drain_deadline, rx.recv()).await {
            Ok(Some(c)) => runner.complete(c),
            Ok(None) | Err(_) => break,
        }
    }
    let abandoned = runner.in_flight;
    runner.tasks.abort_all();
    while runner.tasks.join_next().await.is_some() {}
    progress.finish();
    let Runner { ops, held, retired, peak_in_flight, cfg, .. } = runner;
    WorkloadResult {
        ops,
        measure_start,
        measured: measured.min(cfg.duration + Duration::from_millis(50)),
        warmup: measure_start - started,
        warmup_reached,
        held_at_end: held,
        retired,
        abandoned,
        peak_in_flight,
    }
}

/// The first renewal of a lease granted at `taken`: a uniform `phase` (in
/// `[0, 1)`) of one period later, never at the grant itself. Every later
/// renewal follows one period after the previous, so a held lease renews at
/// a rate of exactly one per period from the moment it is granted.
pub(crate) fn first_renewal(taken: Instant, period: Duration, phase: f64) -> Instant {
    taken + period.mul_f64(1.0 - phase.clamp(0.0, 1.0)).max(Duration::from_millis(1))
}

impl Runner {
    /// Whether the active set is full, counting acquires in flight.
    fn filled(&self) -> bool {
        self.held + self.acquiring >= self.cfg.active as usize
    }

    /// A slot for one more operation in flight, or `None`: the operation is
    /// shed and counted as failed (overload made visible, not hidden), and
    /// the bench's view of the resource stays as it was.
    fn permit(&mut self, op: Op, intended: Instant) -> Option<OwnedSemaphorePermit> {
        match self.permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                self.record(op, self.measuring(), intended, Instant::now(), Err(OpError::local("SHED")));
                None
            }
        }
    }

    fn start_acquire(&mut self, intended: Instant) {
        let Some(permit) = self.permit(Op::Acquire, intended) else { return };
        let Some(r) = self.free.pick(&mut self.picker) else {
            self.record(Op::Acquire, self.measuring(), intended, intended, Err(OpError::local("NO_FREE_RESOURCE")));
            return;
        };
        self.slots[r as usize] = Slot::Acquiring;
        self.acquiring += 1;
        self.spawn(permit, Op::Acquire, r, 0, None, intended);
    }

    fn start_release(&mut self, intended: Instant) {
        let Some(permit) = self.permit(Op::Release, intended) else { return };
        let Some(r) = self.idle_held.pick(&mut self.picker) else {
            self.record(Op::Release, self.measuring(), intended, intended, Err(OpError::local("NO_IDLE_LEASE")));
            return;
        };
        let lease = match std::mem::replace(&mut self.slots[r as usize], Slot::Releasing) {
            Slot::Held { lease, .. } => lease,
            other => unreachable!("idle_held holds only held slots, found {other:?}"),
        };
        self.held -= 1;
        self.spawn(permit, Op::Release, r, 0, Some(lease), intended);
    }

    fn start_renew(&mut self, r: u32, generation: u32, intended: Instant) {
        if !matches!(&self.slots[r as usize], Slot::Held { generation: g, .. } if *g == generation) {
            // Released, retired or re-acquired since: a stale entry.
            return;
        }
        // The next renewal is on the lease's own schedule, whatever this one does.
        self.schedule_renewal(r, generation, intended + self.cfg.renew_every);
        let Some(permit) = self.permit(Op::Renew, intended) else { return };
        let lease = match &mut self.slots[r as usize] {
            Slot::Held { lease, generation: g, renewing } if *g == generation => {
                if *renewing {
                    // Cannot happen while op_timeout < renew_every (validated);
                    // counted rather than raced if it ever does.
                    drop(permit);
                    let measured = self.measuring();
                    self.record(Op::Renew, measured, intended, intended, Err(OpError::local("RENEW_OVERLAP")));
                    return;
                }
                *renewing = true;
                lease.clone()
            }
            _ => return,
        };
        self.idle_held.remove(r);
        self.spawn(permit, Op::Renew, r, generation, Some(lease), intended);
    }

    fn schedule_renewal(&mut self, r: u32, generation: u32, due: Instant) {
        self.renewals.push(Reverse((due, r, generation)));
    }

    fn spawn(
        &mut self,
        permit: OwnedSemaphorePermit,
        op: Op,
        r: u32,
        generation: u32,
        lease: Option<LeaseToken>,
        intended: Instant,
    ) {
        self.in_flight += 1;
        self.peak_in_flight = self.peak_in_flight.max(self.in_flight);
        let (driver, tx, ttl, limit) = (self.driver.clone(), self.tx.clone(), self.cfg.ttl, self.cfg.op_timeout);
        let measured = self.measuring();
        self.tasks.spawn(async move {
            let name = resource_name(r);
            let work = async {
                match (op, &lease) {
                    (Op::Acquire, _) => driver.acquire(&name, ttl).await.map(Some),
                    (Op::Renew, Some(l)) => driver.renew(&name, l, ttl).await.map(|()| None),
                    (Op::Release, Some(l)) => driver.release(&name, l).await.map(|()| None),
                    (_, None) => Err(OpError::local("NO_LEASE")),
                }
            };
            let result = match tokio::time::timeout(limit, work).await {
                Ok(r) => r,
                Err(_) => Err(OpError::unknown("TIMEOUT", format!("no answer within {limit:?}"))),
            };
            let done = Instant::now();
            drop(permit);
            let _ = tx.send(Completion { op, resource: r, generation, measured, intended, done, result });
        });
    }

    /// Updates the bench's view of the resource, then records the figures.
    fn complete(&mut self, c: Completion) {
        self.in_flight -= 1;
        let r = c.resource as usize;
        if c.op == Op::Acquire {
            self.acquiring -= 1;
        }
        match (c.op, &c.result) {
            (Op::Acquire, Ok(Some(lease))) => {
                self.next_generation = self.next_generation.wrapping_add(1);
                let generation = self.next_generation;
                self.slots[r] = Slot::Held { lease: lease.clone(), generation, renewing: false };
                self.held += 1;
                self.idle_held.insert(c.resource);
                // Every lease renews once per period at its own random
                // phase, so renewals run at `held / period` — the seed's
                // arithmetic (20,000 active / 10 s = 2,000/s). Renewing one
                // full period after the grant instead would renew far less:
                // at 2,000 releases/s a lease lives 10 s on average, and
                // most would be released before their first renewal.
                let first = first_renewal(c.intended, self.cfg.renew_every, self.picker.unit());
                self.schedule_renewal(c.resource, generation, first);
            }
            (Op::Acquire, _) => self.retire(r, c.done),
            (Op::Release, Ok(_)) => {
                self.slots[r] = Slot::Free;
                self.free.insert(c.resource);
            }
            (Op::Release, Err(_)) => self.retire(r, c.done),
            (Op::Renew, result) => {
                let refused = matches!(result, Err(e) if e.lost_lease);
                if let Slot::Held { generation, renewing, .. } = &mut self.slots[r]
                    && *generation == c.generation
                {
                    *renewing = false;
                    if refused {
                        self.held -= 1;
                        self.retire(r, c.done);
                    } else {
                        self.idle_held.insert(c.resource);
                    }
                }
            }
        }
        self.record(c.op, c.measured, c.intended, c.done, c.result.map(|_| ()));
    }

    fn retire(&mut self, r: usize, now: Instant) {
        self.slots[r] = Slot::Quarantined;
        self.retired += 1;
        self.quarantine.push_back((now + self.cfg.ttl + QUARANTINE_MARGIN, r as u32));
    }

    /// Frees quarantined resources whose time is up.
    fn end_quarantines(&mut self, now: Instant) {
        while let Some(&(until, r)) = self.quarantine.front() {
            if until > now {
                break;
            }
            self.quarantine.pop_front();
            self.slots[r as usize] = Slot::Free;
            self.free.insert(r);
        }
    }

    /// Whether operations dispatched now belong to the measured phase.
    fn measuring(&self) -> bool {
        self.measure_start.is_some()
    }

    /// Records one operation; `measured` says whether it was dispatched in
    /// the measured phase (decided at dispatch, not from its intended time:
    /// the last fill operation and the first measured one may share an instant).
    fn record(&mut self, op: Op, measured: bool, intended: Instant, done: Instant, result: Result<(), OpError>) {
        let rec = &mut self.ops[op.index()];
        if let Err(e) = &result
            && !rec.examples.contains_key(&e.kind)
            && rec.examples.len() < 32
        {
            rec.examples.insert(e.kind.clone(), e.message.clone());
        }
        let Some(start) = self.measure_start.filter(|_| measured) else {
            match result {
                Ok(()) => {
                    rec.warmup_ok += 1;
                    self.progress.ok[op.index()] += 1;
                }
                Err(e) => {
                    *rec.warmup_errors.entry(e.kind).or_default() += 1;
                    self.progress.errors += 1;
                }
            }
            return;
        };
        let us = micros_between(intended, done);
        let second = usize::try_from((intended - start).as_secs()).unwrap_or(usize::MAX);
        rec.intended += 1;
        let bucket = rec.timeline.get_mut(second);
        match result {
            Ok(()) => {
                rec.ok += 1;
                let _ = rec.hist.record(us);
                rec.success_at_us.push(micros_between(start, done));
                if let Some(b) = bucket {
                    b.ok += 1;
                    b.max_us = b.max_us.max(us);
                    b.sum_us += us;
                }
                self.progress.ok[op.index()] += 1;
                if op == Op::Acquire {
                    let _ = self.progress.acquire.record(us);
                }
            }
            Err(e) => {
                *rec.errors.entry(e.kind).or_default() += 1;
                if let Some(b) = bucket {
                    b.errors += 1;
                    b.max_us = b.max_us.max(us);
                }
                self.progress.errors += 1;
            }
        }
    }
}

/// The progress line on stderr: once a second on a terminal (rewritten in
/// place), once every ten seconds otherwise (a log).
struct Progress {
    label: String,
    tty: bool,
    lines: std::cell::Cell<u64>,
}

impl Progress {
    fn new(label: String) -> Self {
        Self { label, tty: std::io::stderr().is_terminal(), lines: std::cell::Cell::new(0) }
    }

    fn line(&self, runner: &mut Runner, phase: &Phase, now: Instant) {
        let n = self.lines.get() + 1;
        self.lines.set(n);
        let w = std::mem::replace(&mut runner.progress, ProgressWindow::new());
        if !self.tty && !n.is_multiple_of(10) {
            return;
        }
        let what = match (phase, runner.measure_start) {
            (Phase::Measure { .. }, Some(s)) => {
                format!("measure {:>3}/{}s", (now - s).as_secs(), runner.cfg.duration.as_secs())
            }
            _ => format!("warm-up: {} of {} held", runner.held, runner.cfg.active),
        };
        let errors: u64 = runner.ops.iter().map(OpRecord::error_count).sum();
        let text = format!(
            "[{}] {what} | ok/s acq {} ren {} rel {} | acq p99 {:.1} ms | in flight {} | errors {} (+{})",
            self.label,
            w.ok[0],
            w.ok[1],
            w.ok[2],
            w.acquire.value_at_quantile(0.99) as f64 / 1000.0,
            runner.in_flight,
            errors,
            w.errors,
        );
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K{text}");
        } else {
            let _ = writeln!(err, "{text}");
        }
        let _ = err.flush();
    }

    fn finish(&self) {
        if self.tty {
            let _ = writeln!(std::io::stderr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn schedule_is_computed_from_the_index_and_never_drifts() {
        let start = Instant::now();
        let mut s = Schedule::new(start, 3.0);
        assert_eq!(s.take_due(start), Some(start));
        assert_eq!(s.take_due(start), None, "the second op is due a third of a second later");
        tokio::time::advance(Duration::from_secs(10)).await;
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(t) = s.take_due(now) {
            due.push(t);
        }
        // Ops 1..=30 are due by t = 10 s; each keeps its own intended time.
        assert_eq!(due.len(), 30);
        assert_eq!(due[0] - start, Duration::from_secs_f64(1.0 / 3.0));
        assert_eq!(*due.last().unwrap() - start, Duration::from_secs(10));
        assert_eq!(s.taken(), 31);
        // A million ops later the schedule is still exact.
        assert_eq!(s.intended(3_000_000).unwrap() - start, Duration::from_secs(1_000_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_rate_schedule_is_never_due() {
        let mut s = Schedule::new(Instant::now(), 0.0);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(s.take_due(Instant::now()), None);
        assert_eq!(s.next_due(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn latency_counts_from_the_intended_time() {
        let intended = Instant::now();
        tokio::time::advance(Duration::from_millis(250)).await;
        // An op sent late because the sender stalled still owes those 250 ms.
        assert_eq!(micros_between(intended, Instant::now()), 250_000);
        assert_eq!(micros_between(Instant::now(), intended), 1, "never zero or negative");
    }

    #[tokio::test(start_paused = true)]
    async fn first_renewal_is_within_one_period_after_the_grant() {
        let taken = Instant::now();
        let p = Duration::from_secs(10);
        assert_eq!(first_renewal(taken, p, 0.0), taken + p);
        assert_eq!(first_renewal(taken, p, 0.75), taken + Duration::from_millis(2500));
        assert_eq!(first_renewal(taken, p, 1.0), taken + Duration::from_millis(1), "never at the grant itself");
        let mut picker = Picker::new(7);
        let mean =
            (0..10_000).map(|_| (first_renewal(taken, p, picker.unit()) - taken).as_secs_f64()).sum::<f64>() / 10_000.0;
        assert!((mean - 5.0).abs() < 0.2, "uniform phase: mean {mean}");
    }

    fn small_config() -> WorkloadConfig {
        WorkloadConfig {
            resources: 1_000,
            active: 100,
            acquire_rate: 100.0,
            release_rate: 100.0,
            fill_rate: 200.0,
            renew_every: Duration::from_secs(1),
            ttl: Duration::from_secs(3),
            duration: Duration::from_secs(4),
            warmup_max: Duration::from_secs(10),
            max_in_flight: 1_000,
            op_timeout: Duration::from_millis(900),
            seed: 7,
        }
    }

    fn fake(delay: Duration) -> Arc<Driver> {
        use crate::drivers::FakeDriver;
        Arc::new(Driver::Fake(FakeDriver { delay, gate: tokio::sync::RwLock::new(()) }))
    }

    #[tokio::test(start_paused = true)]
    async fn the_seed_shape_in_miniature() {
        let r = run(fake(Duration::from_millis(10)), small_config(), "test".into(), None).await;
        assert!(r.warmup_reached);
        // 4 s × 100/s acquires and releases; renewals at held / period.
        assert_eq!(r.op(Op::Acquire).intended, 400);
        assert_eq!(r.op(Op::Release).intended, 400);
        let renews = r.op(Op::Renew).intended;
        assert!((340..=460).contains(&renews), "about 100 held / 1 s × 4 s renewals, got {renews}");
        for op in Op::ALL {
            let rec = r.op(op);
            assert_eq!(rec.error_count(), 0, "{op:?}: {:?}", rec.errors);
            assert_eq!(rec.ok, rec.intended);
            let p50 = rec.hist.value_at_quantile(0.5);
            assert!((10_000..=12_000).contains(&p50), "{op:?}: p50 {p50} µs from the intended time");
        }
        assert_eq!(r.held_at_end, 100, "acquires and releases balance");
        assert_eq!(r.abandoned, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_shows_as_latency_not_as_a_lower_rate() {
        let driver = fake(Duration::from_millis(5));
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(run(driver.clone(), small_config(), "test".into(), Some(tx)));
        let start = rx.await.unwrap();
        tokio::time::sleep_until(start + Duration::from_millis(1500)).await;
        let Driver::Fake(d) = &*driver else { unreachable!() };
        let stall = d.gate.write().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(stall);
        let r = task.await.unwrap();
        let acquires = r.op(Op::Acquire);
        // Open loop: the ops meant for the stalled half second were still sent
        // on time, and each owes the stall from its intended time.
        assert_eq!(acquires.intended, 400);
        assert_eq!(acquires.error_count(), 0);
        let max = acquires.hist.max();
        assert!((500_000..=510_000).contains(&max), "max {max} µs");
        assert!(acquires.timeline[1].max_us >= 500_000, "{:?}", acquires.timeline[1]);
        assert!(acquires.timeline[3].max_us < 10_000, "{:?}", acquires.timeline[3]);
    }

    #[tokio::test(start_paused = true)]
    async fn overload_is_shed_and_counted() {
        let cfg = WorkloadConfig { max_in_flight: 5, ..small_config() };
        // 50 ms per op at ~200 ops/s needs ~10 in flight: half are shed.
        let r = run(fake(Duration::from_millis(50)), cfg, "test".into(), None).await;
        let shed: u64 = Op::ALL.iter().map(|op| r.op(*op).errors.get("SHED").copied().unwrap_or(0)).sum();
        assert!(shed > 100, "shed {shed}");
        assert!(r.peak_in_flight <= 5);
    }

    #[test]
    fn pick_set_removes_what_it_picks() {
        let mut set = PickSet::new(10);
        for r in [3, 5, 7] {
            set.insert(r);
        }
        set.insert(5);
        assert_eq!(set.len(), 3);
        assert!(set.remove(5));
        assert!(!set.remove(5));
        let mut picker = Picker::new(1);
        let mut seen = vec![set.pick(&mut picker).unwrap(), set.pick(&mut picker).unwrap()];
        seen.sort();
        assert_eq!(seen, vec![3, 7]);
        assert_eq!(set.pick(&mut picker), None);
    }

    #[test]
    fn picker_is_spread_and_reproducible() {
        let mut a = Picker::new(42);
        let mut b = Picker::new(42);
        let mut counts = [0u32; 10];
        for _ in 0..10_000 {
            let x = a.below(10);
            assert_eq!(x, b.below(10));
            counts[x] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }

    #[test]
    fn validation_names_the_flag() {
        let cfg = WorkloadConfig {
            resources: 100,
            active: 200,
            acquire_rate: 1.0,
            release_rate: 1.0,
            fill_rate: 1.0,
            renew_every: Duration::from_secs(10),
            ttl: Duration::from_secs(30),
            duration: Duration::from_secs(10),
            warmup_max: Duration::from_secs(10),
            max_in_flight: 10,
            op_timeout: Duration::from_secs(5),
            seed: 1,
        };
        assert!(cfg.validate().unwrap_err().contains("--active"));
        let cfg = WorkloadConfig { active: 10, op_timeout: Duration::from_secs(10), ..cfg };
        assert!(cfg.validate().unwrap_err().contains("--op-timeout"));
        let cfg = WorkloadConfig { op_timeout: Duration::from_secs(1), ..cfg };
        assert!(cfg.validate().is_ok());
        assert!((cfg.offered_rate() - 3.0).abs() < 1e-9);
    }
}
