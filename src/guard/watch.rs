//! [`NodeWatch`]: one node's [`Health`] behind a lock, with the
//! announcements (a `warn` event and metrics) of each move into or out of
//! quarantine.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::health::{Health, Rules};
use super::judge::{ClockSample, NodeFacts, Quarantine};
use super::policy::{ClockCheck, NodeGuard, Policy};
use crate::telemetry;

/// What an observation of a node showed, or why it failed.
pub(crate) type Observed = Result<NodeFacts, String>;

/// An observation claimed: when it began, and whether it raises the data
/// set's number.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observing {
    pub(crate) began: Instant,
    pub(crate) raise: bool,
}

/// The node's clock as a key-setting request's answer read it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ClockReading {
    /// The request carried no `TIME` ([`ClockCheck::Sampled`] between
    /// samples).
    NotAsked,
    /// It did, and the node gave no usable answer (an ACL user without
    /// `+time`): said once.
    Refused,
    Read(ClockSample),
}

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

impl State {
    /// Judges what an observation that began at `began` showed, unless a
    /// later one was judged already.
    fn observed(
        &mut self,
        began: Instant,
        observed: &Observed,
        samples: &[ClockSample],
        rules: &Rules,
        node: &str,
    ) {
        if !self.health.admit(began) {
            return;
        }
        let now = Instant::now();
        match observed {
            Ok(facts) => self.health.on_observed(facts, samples, now, rules),
            Err(why) => {
                // Announced (a `warn` event) as the quarantine it starts.
                tracing::debug!(%node, %why, "node not observed");
                self.health.on_unobserved(now, why);
            }
        }
    }
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

    /// The observation `observing` (on connect, or again later) showed
    /// `facts` (or failed, and why), with the clock samples taken with it.
    pub(crate) fn on_observed(
        &self,
        observing: Observing,
        observed: &Observed,
        samples: &[ClockSample],
    ) {
        if !self.enabled() {
            return;
        }
        let rules = self.policy.rules();
        let mut state = self.lock();
        state.observed(observing.began, observed, samples, &rules, &self.node);
        self.announce(&mut state);
    }

    /// The observation `observing` timed out (`why`): the node is not
    /// counted until one succeeds.
    pub(crate) fn on_unobserved(&self, observing: Observing, why: &str) {
        self.on_observed(observing, &Err(why.to_owned()), &[]);
    }

    /// Whether the node was never observed (its clock's rate is unknown
    /// until a second sample).
    pub(crate) fn first_sight(&self) -> bool {
        self.enabled() && self.lock().health.first_sight()
    }

    /// Judges what came with a key-setting request's answer: the clock
    /// reading, if the request asked for one, and, when one was due, an
    /// observation; returns the node's quarantine now: with one, the
    /// answer does not count.
    pub(crate) fn judge_answer(
        &self,
        clock: ClockReading,
        observed: Option<(Observing, &Observed)>,
    ) -> Option<Quarantine> {
        if !self.enabled() {
            return None;
        }
        let rules = self.policy.rules();
        let mut state = self.lock();
        if let Some((observing, observed)) = observed {
            state.observed(observing.began, observed, &[], &rules, &self.node);
        }
        match clock {
            ClockReading::Read(sample) => state.health.on_clock(sample, &rules),
            ClockReading::Refused if !std::mem::replace(&mut state.told_no_clock, true) => {
                tracing::warn!(node = %self.node, "node answers no TIME (an ACL without +time?): its clock cannot be checked");
            }
            ClockReading::Refused | ClockReading::NotAsked => {}
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

    /// Whether the node should be observed again now (and marks it done,
    /// so one caller does it): once per clock interval, or at once after
    /// [`doubt`](Self::doubt). A node that counts is observed with a
    /// key-setting request, a quarantined one in the background.
    pub(crate) fn claim_observation(&self) -> Option<Observing> {
        if !self.enabled() {
            return None;
        }
        let now = Instant::now();
        let mut state = self.lock();
        state
            .health
            .observation_due(now, self.policy.clock_interval)
            .then(|| Observing {
                began: now,
                raise: state.health.mark_observing(now),
            })
    }

    /// An observation begins now, due or not (on connect).
    pub(crate) fn observing_now(&self) -> Observing {
        let now = Instant::now();
        Observing {
            began: now,
            raise: self.lock().health.mark_observing(now),
        }
    }

    /// The node answered in a way that says its role or data may have
    /// changed (`READONLY`): it is observed again at once.
    pub(crate) fn doubt(&self) {
        if self.enabled() {
            self.lock().health.doubt();
        }
    }

    /// Whether the node's clock should be read again now (and marks it
    /// done, so one caller does it): once per clock interval, for
    /// [`ClockCheck::Sampled`].
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
