//! [`NodeWatch`]: one node's [`Health`] behind a lock, with the
//! announcements (a `warn` event and metrics) of each move into or out of
//! quarantine.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::health::Health;
use super::judge::{ClockSample, NodeFacts, Quarantine};
use super::policy::{ClockCheck, NodeGuard, Policy};
use crate::telemetry;

/// The guard's view of one node, for one manager.
#[derive(Debug)]
pub(crate) struct NodeWatch {
    node: String,
    policy: Arc<Policy>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    health: Health,
    /// The reason last announced, while quarantined.
    announced: Option<&'static str>,
    /// Whether we said that the node does not answer `TIME`.
    told_no_clock: bool,
}

impl NodeWatch {
    pub(crate) fn new(node: String, policy: Arc<Policy>) -> Self {
        Self {
            node,
            policy,
            state: Mutex::default(),
        }
    }

    /// A watch that never quarantines (a node that is no lock node, such as
    /// the storage behind [`FencedRedis`](crate::FencedRedis)).
    pub(crate) fn off(node: String) -> Self {
        let policy = Policy::new(&NodeGuard::disabled(), Duration::ZERO, 0.0);
        Self::new(node, Arc::new(policy))
    }

    /// Whether the guard is on.
    pub(crate) fn enabled(&self) -> bool {
        self.policy.enabled
    }

    /// Whether a request that sets keys carries `TIME` now: every one, or
    /// with [`ClockCheck::Sampled`] one per clock interval (claimed, so
    /// that one request takes it).
    pub(crate) fn wants_time(&self) -> bool {
        match self.policy.clock_check {
            _ if !self.enabled() => false,
            ClockCheck::EveryRequest => true,
            ClockCheck::Sampled => self.claim_sample(),
        }
    }

    /// A new connection observed `facts` and maybe a clock sample.
    pub(crate) fn on_connect(&self, facts: &NodeFacts, sample: Option<ClockSample>) {
        if !self.enabled() {
            return;
        }
        let rules = self.policy.rules();
        let mut state = self.lock();
        state
            .health
            .on_connect(facts, sample, Instant::now(), &rules);
        self.announce(&mut state);
    }

    /// A new connection whose observation failed or timed out.
    pub(crate) fn on_unobserved(&self) {
        if !self.enabled() {
            return;
        }
        let mut state = self.lock();
        state.health.on_unobserved(Instant::now());
        self.announce(&mut state);
    }

    /// Judges the clock reading that came with a key-setting request's
    /// answer (`None`: the node gave no usable `TIME`, e.g. an ACL user
    /// without `+time`, which is said once), and returns the node's
    /// quarantine now: with one, the answer does not count.
    pub(crate) fn judge_answer(&self, sample: Option<ClockSample>) -> Option<Quarantine> {
        if !self.enabled() {
            return None;
        }
        let rules = self.policy.rules();
        let mut state = self.lock();
        match sample {
            Some(sample) => state.health.on_clock(sample, &rules),
            None if !std::mem::replace(&mut state.told_no_clock, true) => {
                tracing::warn!(node = %self.node, "node answers no TIME (an ACL without +time?): its clock cannot be checked");
            }
            None => {}
        }
        self.announce(&mut state)
    }

    /// A key-setting request's answer that came without a clock sample
    /// ([`ClockCheck::Sampled`]) at `received`: the node's quarantine now,
    /// with which the answer does not count.
    pub(crate) fn judge_untimed_answer(&self, received: Instant) -> Option<Quarantine> {
        if !self.enabled() {
            return None;
        }
        let mut state = self.lock();
        state.health.heard(received);
        self.announce(&mut state)
    }

    /// The node's quarantine now, if any (announcing a change).
    pub(crate) fn quarantine(&self) -> Option<Quarantine> {
        if !self.enabled() {
            return None;
        }
        let mut state = self.lock();
        self.announce(&mut state)
    }

    /// See [`Health::epoch`].
    pub(crate) fn epoch(&self) -> u64 {
        self.lock().health.epoch()
    }

    /// Whether the node's clock should be read again now (and marks it
    /// done, so one caller does it): once per clock interval. For the
    /// observation of a quarantined node, and for [`ClockCheck::Sampled`].
    pub(crate) fn claim_sample(&self) -> bool {
        if !self.enabled() {
            return false;
        }
        let now = Instant::now();
        let mut state = self.lock();
        let due = state.health.sample_due(now, self.policy.clock_interval);
        if due {
            state.health.mark_sampling(now);
        }
        due
    }

    /// Compares the quarantine now with the one last announced, and
    /// announces a change: entering (or changing reason) and leaving.
    fn announce(&self, state: &mut State) -> Option<Quarantine> {
        let quarantine = state
            .health
            .quarantine(Instant::now(), &self.policy.rules());
        let now = quarantine.as_ref().map(|q| q.reason.label());
        if now != state.announced {
            match &quarantine {
                Some(quarantine) => {
                    tracing::warn!(node = %self.node, reason = now, %quarantine, "node quarantined: not counted toward a quorum");
                }
                None => {
                    tracing::warn!(node = %self.node, "node out of quarantine: counted again");
                }
            }
            telemetry::quarantine_changed(&self.node, state.announced, now);
            state.announced = now;
        }
        quarantine
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements: a panic elsewhere
        // while holding it leaves nothing half-done.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
