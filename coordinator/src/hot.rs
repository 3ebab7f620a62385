//! The busiest resources, in bounded memory (DESIGN §6: resource names are
//! never metric labels; operators find hot resources here instead).
//!
//! Every node counts the Acquire entries it applies per resource with the
//! *space-saving* algorithm (Metwally et al., 2005) over exponentially
//! decayed counts (forward decay, Cormode et al., 2009; half-life
//! [`HOT_HALF_LIFE`]): at most `capacity` resources are tracked. When an
//! untracked resource arrives and the table is full, it takes the place of
//! the least busy one and inherits its count as its error bound. So:
//!
//! - memory is fixed: `capacity` slots (default [`DEFAULT_HOT_CAPACITY`]),
//!   each a resource name (≤ 256 bytes, held twice) and four numbers;
//! - a reported rate overestimates the true decayed rate by at most its
//!   `error`; any resource whose decayed rate is above `1/capacity` of the
//!   total is guaranteed to be tracked;
//! - queue lengths, holders and hold ages come from the applied state at
//!   query time, exact — but only for tracked resources: a resource with a
//!   long queue that built up long ago, while `capacity` others were busier,
//!   is not listed (`fencer get` shows any one resource exactly).
//!
//! The mean hold time is the decayed mean of leases that ended while the
//! resource was tracked. Counting starts when the node starts: after a
//! restart the re-applied tail of the log counts as fresh activity.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::Instant;
use crate::types::ResourceName;

/// Resources tracked by default.
pub const DEFAULT_HOT_CAPACITY: usize = 1024;
/// Half-life of the decayed acquire counts: a burst a minute ago weighs half.
pub const HOT_HALF_LIFE: Duration = Duration::from_secs(60);
/// Rescale the forward-decay weights before they grow past 2^32.
const RESCALE_AT: f64 = 4_294_967_296.0;

/// One tracked resource, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HotResource {
    /// The resource.
    pub resource: String,
    /// Decayed rate of applied Acquire entries (granted, queued or refused), per second.
    pub acquires_per_sec: f64,
    /// Upper bound of the overestimate in `acquires_per_sec`.
    pub error_per_sec: f64,
    /// Requests queued now.
    pub waiters: u32,
    /// Whether a lease holds it now.
    pub held: bool,
    /// The current holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The current holder's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// How long the current holder has held it (leader wall clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_for_secs: Option<f64>,
    /// Decayed mean hold time of leases that ended while tracked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_hold_secs: Option<f64>,
}

/// The answer of the hot-resources endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HotResources {
    /// The node that answered.
    pub node_id: u64,
    /// How the list is ordered: `acquires`, `waiters` or `hold`.
    pub by: String,
    /// Slots of the tracker.
    pub capacity: usize,
    /// Resources tracked now.
    pub tracked: usize,
    /// Half-life of the decayed counts.
    pub half_life_secs: f64,
    /// The busiest resources, busiest first.
    pub resources: Vec<HotResource>,
}

/// The order of a hot-resources listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HotOrder {
    /// By decayed acquire rate.
    Acquires,
    /// By current queue length.
    Waiters,
    /// By how long the current holder has held it.
    Hold,
}

impl std::str::FromStr for HotOrder {
    type Err = ();

    /// The name used in queries.
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "acquires" => Ok(Self::Acquires),
            "waiters" => Ok(Self::Waiters),
            "hold" => Ok(Self::Hold),
            _ => Err(()),
        }
    }
}

impl HotOrder {
    /// The name used in queries.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Acquires => "acquires",
            Self::Waiters => "waiters",
            Self::Hold => "hold",
        }
    }
}

/// A tracked resource's counters, read out of the tracker.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tracked {
    pub(crate) resource: ResourceName,
    pub(crate) acquires_per_sec: f64,
    pub(crate) error_per_sec: f64,
    pub(crate) mean_hold_secs: Option<f64>,
}

struct Slot {
    resource: ResourceName,
    /// Forward-decayed count: Σ 2^((t_i − landmark)/half-life).
    weight: f64,
    /// The count inherited at takeover (same units).
    error: f64,
    /// Forward-decayed sum of hold times (ms) and count of ended leases.
    hold_ms: f64,
    ended: f64,
}

struct Tracker {
    capacity: usize,
    half_life: Duration,
    landmark: Option<Instant>,
    slots: Vec<Slot>,
    by_name: HashMap<ResourceName, usize>,
    /// (weight as ordered bits, slot): the least busy slot first.
    order: BTreeSet<(u64, usize)>,
}

/// Non-negative finite floats order like their bit patterns.
fn key(w: f64) -> u64 {
    w.max(0.0).to_bits()
}

impl Tracker {
    /// The forward-decay weight of an event at `now`, rescaling first when
    /// weights would grow too large.
    fn weight(&mut self, now: Instant) -> f64 {
        let landmark = *self.landmark.get_or_insert(now);
        let g = self.growth(landmark, now);
        if g < RESCALE_AT {
            return g;
        }
        for s in &mut self.slots {
            s.weight /= g;
            s.error /= g;
            s.hold_ms /= g;
            s.ended /= g;
        }
        self.order = self.slots.iter().enumerate().map(|(i, s)| (key(s.weight), i)).collect();
        self.landmark = Some(now);
        1.0
    }

    fn growth(&self, landmark: Instant, now: Instant) -> f64 {
        let halves = now.saturating_duration_since(landmark).as_secs_f64() / self.half_life.as_secs_f64();
        halves.exp2()
    }

    fn acquired(&mut self, resource: &ResourceName, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        let w = self.weight(now);
        if let Some(&i) = self.by_name.get(resource) {
            let s = &mut self.slots[i];
            self.order.remove(&(key(s.weight), i));
            s.weight += w;
            self.order.insert((key(s.weight), i));
            return;
        }
        if self.slots.len() < self.capacity {
            let i = self.slots.len();
            self.slots.push(Slot { resource: resource.clone(), weight: w, error: 0.0, hold_ms: 0.0, ended: 0.0 });
            self.by_name.insert(resource.clone(), i);
            self.order.insert((key(w), i));
            return;
        }
        let Some((_, i)) = self.order.pop_first() else { return };
        let s = &mut self.slots[i];
        self.by_name.remove(&s.resource);
        let inherited = s.weight;
        *s = Slot { resource: resource.clone(), weight: inherited + w, error: inherited, hold_ms: 0.0, ended: 0.0 };
        self.by_name.insert(resource.clone(), i);
        self.order.insert((key(inherited + w), i));
    }

    fn lease_ended(&mut self, resource: &ResourceName, held: Duration, now: Instant) {
        if !self.by_name.contains_key(resource) {
            return;
        }
        let w = self.weight(now);
        if let Some(&i) = self.by_name.get(resource) {
            let s = &mut self.slots[i];
            s.hold_ms += held.as_millis() as f64 * w;
            s.ended += w;
        }
    }

    fn snapshot(&self, now: Instant) -> Vec<Tracked> {
        let Some(landmark) = self.landmark else { return Vec::new() };
        let g = self.growth(landmark, now);
        let per_sec = std::f64::consts::LN_2 / self.half_life.as_secs_f64() / g;
        self.slots
            .iter()
            .map(|s| Tracked {
                resource: s.resource.clone(),
                acquires_per_sec: s.weight * per_sec,
                error_per_sec: s.error * per_sec,
                mean_hold_secs: (s.ended > 0.0).then(|| s.hold_ms / s.ended / 1000.0),
            })
            .collect()
    }
}

/// The hot-resources tracker of a node. Called on the apply path: each
/// event costs a hash lookup and an O(log capacity) reordering.
pub(crate) struct HotTracker {
    inner: Mutex<Tracker>,
}

impl HotTracker {
    /// A tracker of at most `capacity` resources.
    pub(crate) fn new(capacity: usize, half_life: Duration) -> Self {
        Self {
            inner: Mutex::new(Tracker {
                capacity,
                half_life,
                landmark: None,
                slots: Vec::with_capacity(capacity.min(DEFAULT_HOT_CAPACITY)),
                by_name: HashMap::new(),
                order: BTreeSet::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An Acquire entry for `resource` was applied.
    pub(crate) fn acquired(&self, resource: &ResourceName, now: Instant) {
        self.lock().acquired(resource, now);
    }

    /// A lease of `resource` ended after being held for `held`.
    pub(crate) fn lease_ended(&self, resource: &ResourceName, held: Duration, now: Instant) {
        self.lock().lease_ended(resource, held, now);
    }

    /// The slots of the tracker.
    pub(crate) fn capacity(&self) -> usize {
        self.lock().capacity
    }

    /// The half-life of the counts.
    pub(crate) fn half_life(&self) -> Duration {
        self.lock().half_life
    }

    /// Every tracked resource's counters at `now`, in no order.
    pub(crate) fn snapshot(&self, now: Instant) -> Vec<Tracked> {
        self.lock().snapshot(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(i: usize) -> ResourceName {
        ResourceName::new(format!("r/{i}")).unwrap()
    }

    fn rate_of(t: &HotTracker, r: &ResourceName, now: Instant) -> Option<(f64, f64)> {
        t.snapshot(now).into_iter().find(|x| &x.resource == r).map(|x| (x.acquires_per_sec, x.error_per_sec))
    }

    #[test]
    fn t10_memory_is_bounded_and_heavy_hitters_are_found() {
        let t = HotTracker::new(16, HOT_HALF_LIFE);
        let now = Instant::now();
        // 4 hot resources among 10,000 that are touched once each.
        for i in 0..10_000 {
            t.acquired(&name(1_000_000 + i), now);
            if i % 10 == 0 {
                for h in 0..4 {
                    t.acquired(&name(h), now);
                }
            }
        }
        let snap = t.snapshot(now);
        assert_eq!(snap.len(), 16, "never more than the capacity");
        assert!(t.lock().by_name.len() == 16 && t.lock().order.len() == 16);
        let mut top: Vec<_> = snap.clone();
        top.sort_by(|a, b| b.acquires_per_sec.total_cmp(&a.acquires_per_sec));
        let names: BTreeSet<String> = top[..4].iter().map(|x| x.resource.to_string()).collect();
        let want: BTreeSet<String> = (0..4).map(|h| name(h).to_string()).collect();
        assert_eq!(names, want, "the four heavy hitters rank first");
        // Each was counted 1,000 times; the estimate is within its error bound.
        let per_count = std::f64::consts::LN_2 / 60.0;
        for x in &top[..4] {
            let true_rate = 1_000.0 * per_count;
            assert!(x.acquires_per_sec >= true_rate - 1e-9, "never underestimates");
            assert!(x.acquires_per_sec - x.error_per_sec <= true_rate + 1e-9, "error bounds the overestimate");
        }
    }

    #[test]
    fn t11_counts_decay_with_the_half_life() {
        let t = HotTracker::new(4, Duration::from_secs(10));
        let start = Instant::now();
        for _ in 0..100 {
            t.acquired(&name(1), start);
        }
        let (now_rate, _) = rate_of(&t, &name(1), start).unwrap();
        let (later, _) = rate_of(&t, &name(1), start + Duration::from_secs(10)).unwrap();
        assert!((later / now_rate - 0.5).abs() < 1e-9, "halves after one half-life: {now_rate} → {later}");
        // A newer burst outranks an older, equal one.
        for _ in 0..100 {
            t.acquired(&name(2), start + Duration::from_secs(10));
        }
        let at = start + Duration::from_secs(10);
        assert!(rate_of(&t, &name(2), at).unwrap().0 > rate_of(&t, &name(1), at).unwrap().0);
    }

    #[test]
    fn t12_rescaling_keeps_rates_and_order() {
        let t = HotTracker::new(4, Duration::from_millis(100));
        let start = Instant::now();
        t.acquired(&name(1), start);
        t.acquired(&name(1), start);
        t.acquired(&name(2), start);
        // 40 half-lives later the weights would pass 2^32: rescaled.
        let later = start + Duration::from_secs(4);
        t.acquired(&name(3), later);
        assert_eq!(t.lock().landmark, Some(later));
        let r1 = rate_of(&t, &name(1), later).unwrap().0;
        let r2 = rate_of(&t, &name(2), later).unwrap().0;
        let r3 = rate_of(&t, &name(3), later).unwrap().0;
        assert!((r1 / r2 - 2.0).abs() < 1e-6 && r3 > r1, "{r1} {r2} {r3}");
        let firsts: Vec<usize> = t.lock().order.iter().map(|(_, i)| *i).collect();
        assert_eq!(firsts.len(), 3);
    }

    #[test]
    fn t13_mean_hold_time_of_tracked_resources() {
        let t = HotTracker::new(4, HOT_HALF_LIFE);
        let now = Instant::now();
        t.lease_ended(&name(1), Duration::from_secs(9), now); // not tracked: ignored
        t.acquired(&name(1), now);
        t.lease_ended(&name(1), Duration::from_secs(2), now);
        t.lease_ended(&name(1), Duration::from_secs(4), now);
        let snap = t.snapshot(now);
        assert_eq!(snap[0].mean_hold_secs, Some(3.0));
    }
}
