//! [`NodeWatch`]: one node's [`Health`] behind a lock, with the
//! announcements (a `warn` event and metrics) of each move into or out of
//! quarantine.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::health::{Coverage, Health};
use super::judge::{self, ClockSample, NodeFacts, Quarantine};
use super::policy::{ClockCheck, NodeGuard, Policy};
use crate::telemetry;

/// What an observation of a node showed, or why it failed.
pub(crate) type Observed = Result<NodeFacts, String>;

/// An observation claimed and not yet judged: when it began, and whether
/// it raises the data set's number. Judge it with what it showed
/// ([`NodeWatch::on_observed`]); one dropped unjudged (with its request,
/// or its task) leaves the node unobserved, and another due at once: a
/// verdict that never comes must not leave answers counted without one.
#[derive(Debug)]
pub(crate) struct Observing {
    began: Instant,
    raise: bool,
    /// Taken when judged.
    watch: Option<Arc<Shared>>,
}

impl Observing {
    /// Whether it raises the data set's number.
    pub(crate) fn raise(&self) -> bool {
        self.raise
    }

    /// The claim, for judging: it is no longer abandoned on drop.
    fn judged(mut self) -> (Instant, Option<Arc<Shared>>) {
        (self.began, self.watch.take())
    }
}

impl Drop for Observing {
    fn drop(&mut self) {
        if let Some(shared) = self.watch.take() {
            let mut state = shared.lock();
            state
                .health
                .abandon(self.began, "an observation ended without an answer");
            shared.announce(&mut state);
            drop(state);
            shared.verdicts.notify_waiters();
        }
    }
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
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    node: String,
    policy: Arc<Policy>,
    state: Mutex<State>,
    /// Rung after every verdict (or abandoned observation): answers wait
    /// on it for the verdict that covers them.
    verdicts: Notify,
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
    fn clock_refused(&mut self, node: &str) {
        self.health.clock_unreadable();
        if !std::mem::replace(&mut self.told_no_clock, true) {
            tracing::warn!(%node, "node answers no TIME (an ACL without +time?): its clock cannot be checked");
        }
    }

    /// Judges what an observation that began at `began` showed, unless a
    /// later one was judged already.
    fn observed(
        &mut self,
        began: Instant,
        observed: &Observed,
        samples: &[ClockSample],
        policy: &Policy,
        node: &str,
    ) {
        let now = Instant::now();
        if !self.health.admit(began) {
            // Judged after a later one, but it may have run on the server
            // after it (another stream, a connection held up): a loss it
            // shows still counts, from now.
            if let Ok(facts) = observed {
                self.health.on_late_observation(facts, now);
            }
            return;
        }
        match observed {
            Ok(facts) => {
                let before = self.health.run_id().map(str::to_owned);
                self.health
                    .on_observed(facts, samples, now, &policy.rules());
                // One process behind two names counts behind one only.
                if let Some(run_id) = facts.run_id.as_deref() {
                    let twin = policy.process_seen(node, run_id, before.as_deref(), now);
                    self.health.same_process_as(twin);
                }
            }
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
            shared: Arc::new(Shared {
                node,
                policy,
                state: Mutex::default(),
                verdicts: Notify::new(),
            }),
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
        self.shared.policy.enabled
    }

    /// Whether a request that sets keys carries `TIME` now: every one, or
    /// with [`ClockCheck::Sampled`] one per clock interval (claimed, so
    /// that one request takes it).
    pub(crate) fn wants_time(&self) -> bool {
        match self.shared.policy.clock_check {
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
        let (began, claimed) = observing.judged();
        if claimed.is_none() || !self.enabled() {
            return;
        }
        let shared = &self.shared;
        let mut state = shared.lock();
        state.observed(began, observed, samples, &shared.policy, &shared.node);
        shared.announce(&mut state);
        drop(state);
        shared.verdicts.notify_waiters();
    }

    /// The observation `observing` timed out or failed (`why`): the node is
    /// not counted until one succeeds.
    pub(crate) fn on_unobserved(&self, observing: Observing, why: &str) {
        self.on_observed(observing, &Err(why.to_owned()), &[]);
    }

    /// Whether the node was never observed (its clock's rate is then
    /// unknown: see `rate_measured`).
    pub(crate) fn first_sight(&self) -> bool {
        self.enabled() && self.shared.lock().health.first_sight()
    }

    /// Whether the node is observed and counted but for its clock's rate,
    /// which no pair of readings has measured yet.
    pub(crate) fn rate_pending(&self) -> bool {
        self.enabled() && self.shared.lock().health.rate_pending()
    }

    /// A reading of the node's clock taken to measure its rate (see
    /// [`rate_pending`](Self::rate_pending)), judged as a request's is;
    /// whether the rate is still not measured.
    pub(crate) fn on_rate_sample(&self, sample: ClockSample) -> bool {
        let shared = &self.shared;
        let rules = shared.policy.rules();
        let mut state = shared.lock();
        state.health.on_clock(sample, &rules);
        let pending = state.health.rate_pending();
        shared.announce(&mut state);
        drop(state);
        shared.verdicts.notify_waiters();
        pending
    }

    /// The node refused `TIME` (an ACL without `+time`): its clock cannot
    /// be checked, and is not waited for (see [`Health::clock_unreadable`]).
    pub(crate) fn clock_refused(&self) {
        self.shared.lock().clock_refused(&self.shared.node);
    }

    /// Whether `older` and `newer` bound the node's clock's rate well
    /// enough to count it (see [`judge::rate_measured`]).
    pub(crate) fn rate_measured(&self, older: &ClockSample, newer: &ClockSample) -> bool {
        let drift_factor = self.shared.policy.rules().drift_factor;
        judge::rate_measured(older, newer, drift_factor)
    }

    /// Judges what came with the answer to a key-setting request sent at
    /// `sent`: the clock reading, if the request asked for one, and, when
    /// one was due, an observation. Returns the node's quarantine, with
    /// which the answer does not count, once a verdict covers the answer
    /// (see [`Health::coverage`]); until then, what to wait for.
    ///
    /// [`Health::coverage`]: super::health::Health::coverage
    pub(crate) fn judge_answer(
        &self,
        sent: Instant,
        clock: ClockReading,
        observed: Option<(Observing, &Observed)>,
    ) -> Judged {
        if !self.enabled() {
            return Judged::Now(None);
        }
        let shared = &self.shared;
        let rules = shared.policy.rules();
        let mut state = shared.lock();
        let mut judged_one = false;
        if let Some((observing, observed)) = observed {
            drop(state);
            self.on_observed(observing, observed, &[]);
            judged_one = true;
            state = shared.lock();
        }
        match clock {
            ClockReading::Read(sample) => state.health.on_clock(sample, &rules),
            ClockReading::Refused => state.clock_refused(&shared.node),
            ClockReading::NotAsked => {}
        }
        if !judged_one && !matches!(clock, ClockReading::Read(_)) {
            state.health.heard(Instant::now());
        }
        shared.verdict_on(&mut state, sent)
    }

    /// Waits until a verdict covers the answer to a request sent at `sent`
    /// (asking `observe` for an observation when none is coming), then
    /// returns the node's quarantine, with which the answer does not
    /// count. Unbounded: the request's round bounds it.
    pub(crate) async fn verdict_for(
        &self,
        sent: Instant,
        observe: impl Fn(),
    ) -> Option<Quarantine> {
        let shared = &self.shared;
        loop {
            let rung = shared.verdicts.notified();
            let judged = {
                let mut state = shared.lock();
                shared.verdict_on(&mut state, sent)
            };
            match judged {
                Judged::Now(quarantine) => return quarantine,
                Judged::AwaitVerdict => {}
                Judged::Observe => observe(),
            }
            rung.await;
        }
    }

    /// The node's quarantine now, if any (announcing a change).
    pub(crate) fn quarantine(&self) -> Option<Quarantine> {
        if !self.enabled() {
            return None;
        }
        let mut state = self.shared.lock();
        self.shared.announce(&mut state)
    }

    /// What the node's clock reads now at the least and at the most (µs
    /// since 1970), by its latest reading; `None` with the guard off or
    /// before any reading (see [`judge::clock_bounds`]).
    ///
    /// [`judge::clock_bounds`]: super::judge::clock_bounds
    pub(crate) fn clock_now(&self, now: Instant) -> Option<(u64, u64)> {
        if !self.enabled() {
            return None;
        }
        let latest = self.shared.lock().health.latest_clock()?;
        let drift_factor = self.shared.policy.rules().drift_factor;
        Some(super::judge::clock_bounds(&latest, now, drift_factor))
    }

    /// How many replicas the node had connected when last observed (`None`
    /// with the guard off, or before an observation).
    pub(crate) fn replicas(&self) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        self.shared.lock().health.replicas()
    }

    /// See [`Health::epoch`].
    ///
    /// [`Health::epoch`]: super::health::Health::epoch
    pub(crate) fn epoch(&self) -> u64 {
        self.shared.lock().health.epoch()
    }

    /// Claims an observation if one is due now (one caller makes it): once
    /// per clock interval, or at once after [`doubt`](Self::doubt) or an
    /// observation that ended without an answer. A node that counts is
    /// observed with a key-setting request, a quarantined one in the
    /// background.
    pub(crate) fn claim_observation(&self) -> Option<Observing> {
        if !self.enabled() {
            return None;
        }
        let mut state = self.shared.lock();
        // Read under the lock: claims are kept in the order they began.
        let now = Instant::now();
        state
            .health
            .observation_due(now, self.shared.policy.clock_interval)
            .then(|| self.claimed(&mut state, now))
    }

    /// An observation begins now, due or not (on connect).
    pub(crate) fn observing_now(&self) -> Observing {
        let mut state = self.shared.lock();
        let now = Instant::now();
        self.claimed(&mut state, now)
    }

    fn claimed(&self, state: &mut State, now: Instant) -> Observing {
        Observing {
            began: now,
            raise: state.health.mark_observing(now),
            watch: self.enabled().then(|| Arc::clone(&self.shared)),
        }
    }

    /// The node answered in a way that says its role or data may have
    /// changed (`READONLY`): it is observed again at once.
    pub(crate) fn doubt(&self) {
        if self.enabled() {
            self.shared.lock().health.doubt();
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
        let mut state = self.shared.lock();
        let due = state
            .health
            .sample_due(now, self.shared.policy.clock_interval);
        if due {
            state.health.mark_sampling(now);
        }
        due
    }
}

/// What judging an answer came to.
#[derive(Debug)]
pub(crate) enum Judged {
    /// A verdict covers it: the node's quarantine now, if any (with one,
    /// the answer does not count).
    Now(Option<Quarantine>),
    /// An observation that may cover it is in flight: wait for its
    /// verdict ([`NodeWatch::verdict_for`]).
    AwaitVerdict,
    /// None covers it and none is coming: observe the node, and wait.
    Observe,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements: a panic elsewhere
        // while holding it leaves nothing half-done.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The verdict on an answer to a request sent at `sent`, if one covers
    /// it (see [`Health::coverage`]).
    ///
    /// [`Health::coverage`]: super::health::Health::coverage
    fn verdict_on(&self, state: &mut State, sent: Instant) -> Judged {
        match state.health.coverage(sent, self.policy.clock_interval) {
            Coverage::Covered => Judged::Now(self.announce(state)),
            Coverage::AwaitVerdict => Judged::AwaitVerdict,
            Coverage::Uncovered => {
                state.health.doubt();
                Judged::Observe
            }
        }
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
}
