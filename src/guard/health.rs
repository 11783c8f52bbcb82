//! What one manager knows of one node's trustworthiness: what its last
//! observation showed (process, data set, settings), its recent clock
//! samples, and from them whether it is quarantined now.
//!
//! Plain state driven by the caller's clock readings (no I/O, no clock of
//! its own), so the rules are unit-tested without a server.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::judge::{self, ClockSample, Known, LostAt, NodeFacts, Quarantine, QuarantineReason};

/// Clock samples kept per node: the oldest gives the long baseline that
/// resolves small rate errors, the newest catches steps at once.
const CLOCK_SAMPLES_KEPT: usize = 8;

/// How often one manager raises a node's data-set number: a write, so an
/// fsync on a node that persists every write, which observations once per
/// clock interval would multiply by the managers. A data set that comes
/// back with a lower number lost at least this much of its history; less
/// is seen only through the settings (a process that persisted every
/// write lost nothing).
pub(crate) const RAISE_EVERY: Duration = Duration::from_secs(1);

/// One node's standing with the guard.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// What the last successful observation showed.
    known: Option<Known>,
    /// Bumped whenever the node may have lost keys (a loss, a clock
    /// fault): a lock whose SET went out in an earlier epoch may have its
    /// key put back there by an extension.
    epoch: u64,
    /// The latest instant by which the node may have lost writes, and
    /// why: it is quarantined until a window after that.
    lost: Option<(Instant, QuarantineReason)>,
    /// Why the last observation failed, until one succeeds.
    unobserved: Option<String>,
    /// A settings reason (eviction, replica), until an observation shows
    /// it fixed.
    settings: Option<QuarantineReason>,
    /// Another node of the manager that the same process answers behind,
    /// until an observation shows another process here.
    same_process_as: Option<String>,
    /// Samples spaced at least the sampling interval apart, oldest first.
    /// Kept across restarts: a restarted process on the same host has the
    /// same clock, and a step since is a fault.
    samples: VecDeque<ClockSample>,
    /// The latest reading of the node's clock, kept or not.
    latest_clock: Option<ClockSample>,
    /// When we last read the node's clock.
    last_sampled: Option<Instant>,
    /// When we last observed (or began to observe) the node.
    last_observed: Option<Instant>,
    /// When an observation of ours last raised its data-set number.
    last_raised: Option<Instant>,
    /// When the latest observation taken into account began: one that
    /// began earlier and is judged later (its reply or task was slower)
    /// says less, and its data-set number would look like a step back.
    last_admitted: Option<Instant>,
    /// When the observations claimed since then began, oldest first
    /// (usually none or one): an answer given after one of them was sent
    /// counts only once its verdict is in.
    in_flight: VecDeque<Instant>,
    /// When the node, as last observed, last answered us: a loss seen
    /// later happened after that, whatever a (wall-clock based) age claims.
    last_heard: Option<Instant>,
    /// The last clock fault and when it was last seen.
    clock_fault: Option<(Instant, QuarantineReason)>,
    /// How many replicas the last observation showed connected.
    replicas: Option<u64>,
    /// Whether two of the node's clock readings have bounded its rate
    /// (see [`judge::rate_measured`]): a node met for the first time is
    /// not counted before.
    rate_measured: bool,
}

/// Whether a verdict covers an answer (see [`Health::coverage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coverage {
    /// The latest verdict covers it: judge it by the node's standing now.
    Covered,
    /// An observation claimed before it was sent (or after, the only one
    /// that can cover it) has no verdict yet: wait for it.
    AwaitVerdict,
    /// No verdict covers it and none is coming: an observation must be
    /// made (and waited for) first.
    Uncovered,
}

/// How the guard judges: the window and the clock tolerance.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// A node is quarantined this long after a possible loss of writes or
    /// the last clock fault.
    pub(crate) window: Duration,
    pub(crate) drift_factor: f64,
    /// Spacing of the clock samples kept (see [`CLOCK_SAMPLES_KEPT`]).
    pub(crate) sample_every: Duration,
}

impl Health {
    /// A node whose clock's rate is taken as measured: the model check's,
    /// whose clocks agree and are never read.
    #[cfg(test)]
    pub(crate) fn rate_taken_as_measured() -> Self {
        Self {
            rate_measured: true,
            ..Self::default()
        }
    }

    /// The node's epoch (see the field).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The process (`run_id`) the last successful observation showed.
    pub(crate) fn run_id(&self) -> Option<&str> {
        self.known.as_ref().map(Known::run_id)
    }

    /// Notes the other node this node's process also answers behind, if
    /// any (see [`Policy::process_seen`](super::policy::Policy::process_seen)).
    pub(crate) fn same_process_as(&mut self, other: Option<String>) {
        self.same_process_as = other;
    }

    /// Whether the node was never observed (its clock's rate is then
    /// unknown: see `rate_measured`).
    pub(crate) fn first_sight(&self) -> bool {
        self.known.is_none() && self.samples.is_empty()
    }

    /// An observation showed `facts` (with the clock samples taken with
    /// it), against what the last one showed; facts without a `run_id`
    /// are an observation that failed.
    pub(crate) fn on_observed(
        &mut self,
        facts: &NodeFacts,
        samples: &[ClockSample],
        now: Instant,
        rules: &Rules,
    ) {
        self.last_observed = Some(now);
        if facts.replicas.is_some() {
            self.replicas = facts.replicas;
        }
        if facts.run_id.is_none() {
            self.on_unobserved(now, "INFO gave no run_id");
            return;
        }
        let loss = match &self.known {
            Some(known) => judge::since_known(
                known,
                facts,
                self.last_heard
                    .map(|heard| now.saturating_duration_since(heard)),
            ),
            None => judge::first_sight(facts, rules.window),
        };
        if let Some(loss) = loss {
            let at = match loss.at {
                LostAt::Now => now,
                LostAt::Ago(ago) => {
                    // Ages come from the node's wall clock, which a step
                    // can inflate. A loss seen against what we knew came
                    // after the node last answered as we knew it: an age
                    // reaching back before that is impossible, and the
                    // loss may be as late as now.
                    let claimed = now.checked_sub(ago).unwrap_or(now);
                    match (&self.known, self.last_heard) {
                        (Some(_), Some(heard)) if claimed < heard => now,
                        _ => claimed,
                    }
                }
            };
            if self.lost.as_ref().is_none_or(|(until, _)| at >= *until) {
                self.lost = Some((at, loss.reason));
            }
            self.epoch += 1;
        }
        self.unobserved = None;
        self.known = Known::of(facts);
        if facts.role.is_some() || facts.maxmemory_policy.is_some() {
            self.settings = judge::settings_fault(facts);
        }
        self.last_heard = Some(now);
        for sample in samples {
            self.on_clock(*sample, rules);
        }
    }

    /// An observation that began before the latest one judged, judged
    /// late, showed `facts`: a loss it shows against what is known (another
    /// process, data set or replication id; its data-set number, read
    /// earlier, is not compared) counts from `now`.
    pub(crate) fn on_late_observation(&mut self, facts: &NodeFacts, now: Instant) {
        let Some(known) = &self.known else {
            return;
        };
        let mut facts = facts.clone();
        if let Some(data) = &mut facts.dataset {
            data.seq = u64::MAX;
        }
        if let Some(loss) = judge::since_known(known, &facts, None) {
            if self.lost.as_ref().is_none_or(|(until, _)| now >= *until) {
                self.lost = Some((now, loss.reason));
            }
            self.epoch += 1;
        }
    }

    /// An observation failed or timed out (`why`): restarts and losses
    /// cannot be seen, so the node is not counted until one succeeds.
    pub(crate) fn on_unobserved(&mut self, now: Instant, why: &str) {
        self.last_observed = Some(now);
        self.unobserved = Some(why.to_owned());
    }

    /// The latest reading of the node's clock, if any: see
    /// [`judge::clock_bounds`].
    pub(crate) fn latest_clock(&self) -> Option<ClockSample> {
        self.latest_clock
    }

    /// How many replicas the last observation that counted them showed
    /// connected (`INFO replication`'s `connected_slaves`).
    pub(crate) fn replicas(&self) -> Option<u64> {
        self.replicas
    }

    /// A reading of the node's clock.
    pub(crate) fn on_clock(&mut self, sample: ClockSample, rules: &Rules) {
        self.last_sampled = Some(sample.received);
        // The reading before, kept or not: the nearest, with the shortest
        // round trips, may measure the rate where the oldest cannot.
        let previous = self.latest_clock;
        if self
            .latest_clock
            .is_none_or(|latest| latest.received <= sample.received)
        {
            self.latest_clock = Some(sample);
        }
        self.heard(sample.received);
        let earlier = [self.samples.front(), self.samples.back(), previous.as_ref()];
        let fault = earlier
            .into_iter()
            .flatten()
            .find_map(|older| judge::clock_fault(older, &sample, rules.drift_factor));
        if let Some(fault) = fault {
            // Keys it holds may have expired early: like a restart. Judge
            // what follows against this sample, not across the fault. A
            // clock stepped back is kept out for the step too, until it
            // reads again what it read before: fencing tokens issued
            // without the counter node are taken above the nodes' clocks.
            let back = match fault {
                judge::ClockFault::Step { by_ms } if by_ms < 0 => {
                    Duration::from_millis(by_ms.unsigned_abs())
                }
                _ => Duration::ZERO,
            };
            self.clock_fault = Some((sample.received + back, fault.into()));
            // Its rate is known now: wrong.
            self.rate_measured = true;
            self.epoch += 1;
            self.samples.clear();
            self.samples.push_back(sample);
            return;
        }
        if !self.rate_measured {
            self.rate_measured = earlier
                .into_iter()
                .flatten()
                .any(|older| judge::rate_measured(older, &sample, rules.drift_factor));
        }
        let spaced = self.samples.back().is_none_or(|last| {
            sample.received.saturating_duration_since(last.received) >= rules.sample_every
        });
        if spaced {
            if self.samples.len() == CLOCK_SAMPLES_KEPT {
                self.samples.pop_front();
            }
            self.samples.push_back(sample);
        }
    }

    /// Whether the node, observed, waits for a pair of clock readings to
    /// measure its rate (see [`quarantine`](Self::quarantine)).
    pub(crate) fn rate_pending(&self) -> bool {
        self.known.is_some() && !self.rate_measured
    }

    /// The node refused `TIME`: its clock cannot be checked (the guard is
    /// blind to it, and says so), so its rate is not waited for either.
    pub(crate) fn clock_unreadable(&mut self) {
        self.rate_measured = true;
    }

    /// The node answered at `at` (a request that carried no clock sample):
    /// its process was alive then, which bounds when a restart can have
    /// happened, as a sample does.
    pub(crate) fn heard(&mut self, at: Instant) {
        self.last_heard = Some(self.last_heard.map_or(at, |last| last.max(at)));
    }

    /// Whether a clock sample is due: none for `every`.
    pub(crate) fn sample_due(&self, now: Instant, every: Duration) -> bool {
        self.last_sampled
            .is_none_or(|last| now.saturating_duration_since(last) >= every)
    }

    /// Notes that a sample is being taken at `now`, so others are not due.
    pub(crate) fn mark_sampling(&mut self, now: Instant) {
        self.last_sampled = Some(now);
    }

    /// Whether an observation is due: none for `every`.
    pub(crate) fn observation_due(&self, now: Instant, every: Duration) -> bool {
        self.last_observed
            .is_none_or(|last| now.saturating_duration_since(last) >= every)
    }

    /// Notes that an observation is being made at `now`, so others are not
    /// due; returns whether it raises the data set's number (once per
    /// [`RAISE_EVERY`]).
    pub(crate) fn mark_observing(&mut self, now: Instant) -> bool {
        self.last_observed = Some(now);
        self.in_flight.push_back(now);
        let raise = self
            .last_raised
            .is_none_or(|last| now.saturating_duration_since(last) >= RAISE_EVERY);
        if raise {
            self.last_raised = Some(now);
        }
        raise
    }

    /// Whether an observation that began at `began` is the latest one
    /// judged (and notes it as such); an older one is ignored.
    pub(crate) fn admit(&mut self, began: Instant) -> bool {
        if self.last_admitted.is_some_and(|last| began < last) {
            return false;
        }
        self.last_admitted = Some(began);
        // Claims older than this verdict say no more than it does.
        while self
            .in_flight
            .front()
            .is_some_and(|&claimed| claimed <= began)
        {
            self.in_flight.pop_front();
        }
        true
    }

    /// An observation claimed at `began` ended without a verdict (dropped
    /// with its request, or its connection broke): whatever it would have
    /// shown is unknown, so the node is not counted until another one
    /// succeeds, and one is due at once.
    pub(crate) fn abandon(&mut self, began: Instant, why: &str) {
        if self.admit(began) {
            self.unobserved = Some(why.to_owned());
            self.last_observed = None;
        }
    }

    /// Whether an answer to a request sent at `sent` may be judged now:
    /// only once the verdict of every observation claimed before it was
    /// sent is in (that observation went out ahead of it, or on another
    /// stream, and may show a loss the answer rests on), and only if the
    /// latest verdict covers it: an observation covers the answers sent up
    /// to one clock interval (`every`) after it began, the gap the guard
    /// accepts between observations.
    pub(crate) fn coverage(&self, sent: Instant, every: Duration) -> Coverage {
        if self
            .in_flight
            .front()
            .is_some_and(|&claimed| claimed <= sent)
        {
            return Coverage::AwaitVerdict;
        }
        match self.last_admitted {
            Some(began) if sent <= began + every => Coverage::Covered,
            // A later claim is in flight: its verdict covers the answer.
            _ if !self.in_flight.is_empty() => Coverage::AwaitVerdict,
            _ => Coverage::Uncovered,
        }
    }

    /// Makes an observation due at once (the node answered in a way that
    /// says its role or data may have changed, e.g. `READONLY`).
    pub(crate) fn doubt(&mut self) {
        self.last_observed = None;
    }

    /// Whether the node is quarantined at `now`, why, and for how long.
    /// Settings come first (they do not pass with time), then a failed
    /// observation (until one succeeds), then whichever timed reason lasts
    /// longer.
    pub(crate) fn quarantine(&self, now: Instant, rules: &Rules) -> Option<Quarantine> {
        if let Some(reason) = &self.settings {
            return Some(Quarantine {
                reason: reason.clone(),
                remaining: None,
            });
        }
        if let Some(other) = &self.same_process_as {
            return Some(Quarantine {
                reason: QuarantineReason::SameProcess {
                    as_node: other.clone(),
                },
                remaining: None,
            });
        }
        if let Some(why) = &self.unobserved {
            return Some(Quarantine {
                reason: QuarantineReason::Unobserved { why: why.clone() },
                remaining: None,
            });
        }
        // Called for every request that sets a key: decide by time first,
        // and build the reason only for a node that is quarantined.
        let timed = [&self.lost, &self.clock_fault]
            .into_iter()
            .flatten()
            .map(|(at, reason)| (*at + rules.window, reason))
            .filter(|(until, _)| *until > now)
            .max_by_key(|(until, _)| *until);
        if let Some((until, reason)) = timed {
            return Some(Quarantine {
                reason: reason.clone(),
                remaining: Some(until - now),
            });
        }
        if self.rate_pending() {
            return Some(Quarantine {
                reason: QuarantineReason::Unobserved {
                    why: "its clock's rate is not measured yet: its readings so far were too \
                          close together for their round trips"
                        .to_owned(),
                },
                remaining: None,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::judge::{DataSet, Reported};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn rules() -> Rules {
        Rules {
            window: secs(10),
            drift_factor: 0.01,
            sample_every: ms(100),
        }
    }

    /// A long uptime, in whole seconds as `INFO` reports it.
    const OLD: u64 = 3_600;

    /// Node facts: process `run_id` up for `uptime` (whole seconds, as
    /// `INFO` says), persisting with `fsync`, its data set `data` ("<id>
    /// <born_in> <seq>", marked an hour ago).
    fn facts(run_id: &str, uptime: u64, fsync: &str, data: &str) -> NodeFacts {
        let parts: Vec<&str> = data.split(' ').collect();
        let now_ms = 10_000_000;
        NodeFacts {
            run_id: Some(run_id.into()),
            uptime: Some(Reported::whole_seconds(uptime)),
            appendonly: Some(true),
            appendfsync: Some(fsync.into()),
            maxmemory_policy: Some("noeviction".into()),
            maxmemory: Some(0),
            role: Some("master".into()),
            replid: Some(format!("repl-{run_id}")),
            dataset: DataSet::from_mark(
                &format!("{} {} {}", parts[0], parts[1], now_ms - 3_600_000),
                now_ms,
                parts[2].parse().expect("seq"),
            ),
            ..NodeFacts::named("n")
        }
    }

    /// A node whose clock's rate an earlier pair of readings measured
    /// (see `a_node_is_not_counted_before_its_clocks_rate_is_measured`).
    fn measured() -> Health {
        Health::rate_taken_as_measured()
    }

    /// A clock reading `server_ms` (a clock that reads our elapsed time)
    /// taken from `sent_ms` over a round trip of `took_ms`.
    fn reading(t0: Instant, sent_ms: u64, took_ms: u64, server_ms: u64) -> ClockSample {
        ClockSample {
            server_us: server_ms * 1000,
            sent: t0 + ms(sent_ms),
            received: t0 + ms(sent_ms + took_ms),
        }
    }

    #[test]
    fn a_node_is_not_counted_before_its_clocks_rate_is_measured() {
        let t0 = Instant::now();
        let mut health = Health::default();
        // Two readings 10 ms apart over 15 ms round trips: a clock twice
        // as fast would fit them, so they do not vouch for it.
        let samples = [
            reading(t0, 0, 15, 1_000_000),
            reading(t0, 25, 15, 1_000_030),
        ];
        health.on_observed(&facts("a", OLD, "always", "d a 5"), &samples, t0, &rules());
        let why = health
            .quarantine(t0 + ms(40), &rules())
            .map(|q| q.to_string());
        assert!(
            why.as_deref()
                .is_some_and(|why| why.contains("rate is not measured")),
            "{why:?}"
        );
        // A reading further out measures it: counted.
        health.on_clock(reading(t0, 200, 15, 1_000_205), &rules());
        assert_eq!(reason(&health, t0 + ms(215)), None);
        // Quick round trips measure it at the first pair.
        let mut quick = Health::default();
        let samples = [reading(t0, 0, 0, 1_000_000), reading(t0, 10, 0, 1_000_010)];
        quick.on_observed(&facts("a", OLD, "always", "d a 5"), &samples, t0, &rules());
        assert_eq!(reason(&quick, t0 + ms(10)), None);
    }

    fn reason(health: &Health, now: Instant) -> Option<&'static str> {
        health
            .quarantine(now, &rules())
            .map(|quarantine| quarantine.reason.label())
    }

    fn left(health: &Health, now: Instant) -> Option<Duration> {
        health.quarantine(now, &rules()).and_then(|q| q.remaining)
    }

    #[test]
    fn a_restart_without_fsync_always_is_quarantined_for_the_window() {
        let t0 = Instant::now();
        let mut health = measured();
        // First met long after it started: counted.
        health.on_observed(&facts("a", OLD, "everysec", "d a 5"), &[], t0, &rules());
        assert_eq!(reason(&health, t0), None);
        assert_eq!(health.epoch(), 0);
        // It restarted: quarantined from its start for the window. It
        // reports "2 s" of uptime, which is anything above 1 s: counted
        // from 1 s ago, as late as the reading allows.
        let t1 = t0 + secs(5);
        health.on_observed(&facts("b", 2, "everysec", "d a 6"), &[], t1, &rules());
        assert_eq!(reason(&health, t1), Some("restart"));
        assert_eq!(left(&health, t1), Some(secs(9)));
        assert_eq!(reason(&health, t1 + secs(9) - ms(1)), Some("restart"));
        assert_eq!(reason(&health, t1 + secs(9)), None);
        // Observing the same process again changes nothing.
        health.on_observed(
            &facts("b", 3, "everysec", "d a 7"),
            &[],
            t1 + secs(1),
            &rules(),
        );
        assert_eq!(health.epoch(), 1);
    }

    #[test]
    fn an_uptime_in_whole_seconds_is_taken_as_short_as_it_can_be() {
        let t0 = Instant::now();
        let mut health = measured();
        // Met for the first time up "10 s" (9 to 11): young enough that an
        // empty data set may have forgotten locks granted 9.x s ago.
        health.on_observed(&facts("a", 10, "everysec", "d a 1"), &[], t0, &rules());
        assert_eq!(reason(&health, t0), Some("restart"));
        assert_eq!(left(&health, t0), Some(secs(1)));
        // Up "11 s": at least 10 s, the window: counted.
        let mut met_older = measured();
        met_older.on_observed(&facts("a", 11, "everysec", "d a 1"), &[], t0, &rules());
        assert_eq!(reason(&met_older, t0), None);
    }

    #[test]
    fn a_restart_into_fsync_always_after_running_without_it_is_quarantined() {
        let t0 = Instant::now();
        let mut health = measured();
        health.on_observed(&facts("a", OLD, "everysec", "d a 5"), &[], t0, &rules());
        // Back persisting every write, with its data set: but the old
        // process may have acknowledged writes it never wrote down.
        let t1 = t0 + ms(100);
        health.on_observed(&facts("b", 0, "always", "d a 6"), &[], t1, &rules());
        let quarantine = health.quarantine(t1, &rules()).expect("quarantined");
        assert_eq!(quarantine.reason.label(), "restart");
        assert!(
            quarantine
                .reason
                .to_string()
                .contains("previous process ran with appendfsync everysec"),
            "{quarantine}"
        );
    }

    #[test]
    fn a_setting_seen_between_connects_counts_for_the_next_restart() {
        let t0 = Instant::now();
        let mut health = measured();
        health.on_observed(&facts("a", OLD, "always", "d a 5"), &[], t0, &rules());
        // Observed again while counted: appendfsync set to everysec at run time.
        health.on_observed(
            &facts("a", OLD, "everysec", "d a 6"),
            &[],
            t0 + ms(100),
            &rules(),
        );
        assert_eq!(reason(&health, t0 + ms(100)), None, "nothing lost yet");
        // Set back to always, then restarted: fine.
        health.on_observed(
            &facts("a", OLD, "always", "d a 7"),
            &[],
            t0 + ms(200),
            &rules(),
        );
        health.on_observed(
            &facts("b", 0, "always", "d a 8"),
            &[],
            t0 + ms(300),
            &rules(),
        );
        assert_eq!(reason(&health, t0 + ms(300)), None);
        // Set to everysec again, and restarted before it was set back.
        health.on_observed(
            &facts("b", 0, "everysec", "d a 9"),
            &[],
            t0 + ms(400),
            &rules(),
        );
        health.on_observed(
            &facts("c", 0, "always", "d a 10"),
            &[],
            t0 + ms(500),
            &rules(),
        );
        assert_eq!(reason(&health, t0 + ms(500)), Some("restart"));
    }

    #[test]
    fn a_data_set_lost_under_a_running_process_is_quarantined_from_when_it_was_seen() {
        let t0 = Instant::now();
        let mut health = measured();
        health.on_observed(&facts("a", OLD, "always", "d a 5"), &[], t0, &rules());
        // FLUSHALL: the mark was written again, by this process.
        let t1 = t0 + ms(300);
        health.on_observed(&facts("a", OLD, "always", "e a 1"), &[], t1, &rules());
        assert_eq!(reason(&health, t1), Some("data_set"));
        assert_eq!(left(&health, t1), Some(secs(10)));
        // REPLICAOF and back: a new replication id.
        let t2 = t1 + secs(2);
        let mut promoted = facts("a", OLD, "always", "e a 2");
        promoted.replid = Some("another".into());
        health.on_observed(&promoted, &[], t2, &rules());
        assert_eq!(reason(&health, t2), Some("data_set"));
        assert_eq!(health.epoch(), 2);
    }

    #[test]
    fn an_inflated_uptime_cannot_shorten_the_quarantine() {
        let t0 = Instant::now();
        let mut health = measured();
        health.on_observed(&facts("a", OLD, "everysec", "d a 5"), &[], t0, &rules());
        // Back 100 ms later claiming an hour of uptime (its clock stepped).
        let t1 = t0 + ms(100);
        health.on_observed(&facts("b", OLD, "everysec", "d a 6"), &[], t1, &rules());
        assert_eq!(
            left(&health, t1),
            Some(secs(10)),
            "an age before the old process's last answer is impossible: counted from now"
        );
    }

    #[test]
    fn an_answer_without_a_sample_also_dates_a_later_restart() {
        let t0 = Instant::now();
        let mut health = measured();
        health.on_observed(&facts("a", OLD, "everysec", "d a 5"), &[], t0, &rules());
        // The old process answered 3 s later (no clock sample with it).
        health.heard(t0 + secs(3));
        let t1 = t0 + secs(4);
        // Back 1 s after that answer, claiming "3 s" of uptime (at least
        // 2 s): it cannot have started before the old process's last
        // answer.
        health.on_observed(&facts("b", 3, "everysec", "d a 6"), &[], t1, &rules());
        assert_eq!(left(&health, t1), Some(secs(10)), "counted from now");
        // Claiming "2 s" (at least 1 s) 3 s after the last answer: counted
        // from 1 s ago.
        let t2 = t1 + secs(1);
        health.heard(t2);
        let t3 = t2 + secs(3);
        health.on_observed(&facts("c", 2, "everysec", "d a 7"), &[], t3, &rules());
        assert_eq!(left(&health, t3), Some(secs(9)));
        // An earlier answer reported late moves nothing back.
        health.heard(t0);
        assert_eq!(health.last_heard, Some(t3));
    }

    #[test]
    fn a_node_that_cannot_be_observed_is_not_counted_until_it_is() {
        let t0 = Instant::now();
        let mut health = measured();
        // Never met, and the first observation failed: not counted.
        health.on_unobserved(t0, "timed out");
        assert_eq!(reason(&health, t0), Some("unobserved"));
        assert_eq!(left(&health, t0), None, "until observed, not for a time");
        health.on_observed(&facts("a", OLD, "always", "d a 5"), &[], t0, &rules());
        assert_eq!(reason(&health, t0), None);
        // INFO refused later (an ACL, -BUSY): facts without a run_id.
        health.on_observed(&NodeFacts::named("n"), &[], t0 + ms(10), &rules());
        assert_eq!(reason(&health, t0 + ms(10)), Some("unobserved"));
        // Observed again, the same process: counted at once.
        health.on_observed(
            &facts("a", OLD, "always", "d a 6"),
            &[],
            t0 + ms(20),
            &rules(),
        );
        assert_eq!(reason(&health, t0 + ms(20)), None);
    }

    #[test]
    fn a_restart_with_fsync_always_and_its_data_is_trusted_at_once() {
        let t0 = Instant::now();
        let mut health = measured();
        health.on_observed(&facts("a", 0, "always", "d x 5"), &[], t0, &rules());
        health.on_observed(&facts("b", 0, "always", "d x 6"), &[], t0, &rules());
        assert_eq!(reason(&health, t0), None);
        assert_eq!(health.epoch(), 0);
    }

    #[test]
    fn settings_last_until_an_observation_shows_them_fixed() {
        let t0 = Instant::now();
        let mut health = measured();
        let replica = NodeFacts {
            role: Some("slave".into()),
            ..facts("a", OLD, "always", "d a 5")
        };
        health.on_observed(&replica, &[], t0, &rules());
        let quarantine = health.quarantine(t0 + ms(100_000), &rules());
        assert_eq!(
            quarantine.as_ref().map(|q| (q.reason.label(), q.remaining)),
            Some(("replica", None))
        );
        // A master again (REPLICAOF NO ONE): its data set came from the
        // other master, with another replication id; not counted at once.
        let mut promoted = facts("a", OLD, "always", "o o 7");
        promoted.replid = Some("new".into());
        health.on_observed(&promoted, &[], t0 + ms(100), &rules());
        assert_eq!(reason(&health, t0 + ms(100)), Some("data_set"));
    }

    fn sample(server_ms: u64, at: Instant) -> ClockSample {
        ClockSample {
            server_us: server_ms * 1000,
            sent: at,
            received: at + ms(1),
        }
    }

    #[test]
    fn a_fast_clock_is_quarantined_until_a_window_after_it_looks_sane() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        let mut health = measured();
        health.on_observed(
            &facts("a", OLD, "always", "d a 5"),
            &[sample(base, t0)],
            t0,
            &rules(),
        );
        // 50 ms later its clock says 100 ms passed.
        health.on_clock(sample(base + 100, t0 + ms(50)), &rules());
        assert_eq!(reason(&health, t0 + ms(51)), Some("clock_rate"));
        assert_eq!(health.epoch(), 1);
        // Sane from then on: counted again a window after the last fault.
        for i in 1..=20 {
            health.on_clock(
                sample(base + 100 + i * 100, t0 + ms(50 + i * 100)),
                &rules(),
            );
        }
        assert_eq!(reason(&health, t0 + ms(10_049)), Some("clock_rate"));
        assert_eq!(reason(&health, t0 + ms(10_052)), None);
        assert_eq!(health.epoch(), 1, "sane samples bump nothing");
    }

    #[test]
    fn a_step_across_a_restart_is_seen_against_the_old_process_samples() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        let mut health = measured();
        health.on_observed(
            &facts("a", OLD, "everysec", "d a 5"),
            &[sample(base, t0)],
            t0,
            &rules(),
        );
        // Restarted 200 ms later, its clock an hour ahead, so its uptime
        // looks like an hour.
        let t1 = t0 + ms(200);
        health.on_observed(
            &facts("b", OLD, "everysec", "d a 6"),
            &[sample(base + 3_600_200, t1)],
            t1,
            &rules(),
        );
        let quarantine = health.quarantine(t1, &rules()).expect("quarantined");
        // A window from the sample that showed the step, not from an hour ago.
        assert_eq!(quarantine.remaining, Some(ms(10_001)));
        assert!(
            matches!(quarantine.reason, QuarantineReason::ClockStep { .. }),
            "{quarantine}"
        );
    }

    #[test]
    fn a_step_is_seen_by_the_next_sample() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        let mut health = measured();
        health.on_clock(sample(base, t0), &rules());
        health.on_clock(sample(base + 10_005, t0 + ms(5)), &rules());
        let quarantine = health
            .quarantine(t0 + ms(6), &rules())
            .expect("quarantined");
        assert_eq!(
            quarantine.reason,
            QuarantineReason::ClockStep { by_ms: 10_000 }
        );
    }

    #[test]
    fn a_clock_stepped_back_stays_out_for_the_window_and_the_step() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        let mut health = measured();
        health.on_clock(sample(base, t0), &rules());
        // 60 s back: out until it reads again what it read before, and a
        // window more.
        health.on_clock(sample(base - 60_000 + 5, t0 + ms(5)), &rules());
        let quarantine = health
            .quarantine(t0 + ms(6), &rules())
            .expect("quarantined");
        assert_eq!(
            quarantine.reason,
            QuarantineReason::ClockStep { by_ms: -60_000 }
        );
        assert_eq!(quarantine.remaining, Some(ms(70_000)));
        // Forward: the window alone.
        let mut ahead = measured();
        ahead.on_clock(sample(base, t0), &rules());
        ahead.on_clock(sample(base + 60_005, t0 + ms(5)), &rules());
        let quarantine = ahead.quarantine(t0 + ms(6), &rules()).expect("quarantined");
        assert_eq!(quarantine.remaining, Some(ms(10_000)));
    }

    #[test]
    fn a_small_drift_is_seen_against_the_oldest_sample() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        let mut health = measured();
        // 3 % fast: too little to see between samples 100 ms apart with
        // 1 ms round trips, plain against one 700 ms earlier.
        let mut faulted_at = None;
        for i in 0..8u64 {
            health.on_clock(sample(base + i * 103, t0 + ms(i * 100)), &rules());
            if faulted_at.is_none() && reason(&health, t0 + ms(i * 100 + 1)).is_some() {
                faulted_at = Some(i);
            }
        }
        let seen = faulted_at.expect("the drift is seen");
        assert!(seen >= 2, "not from one short interval: sample {seen}");
    }

    #[test]
    fn samples_and_observations_are_due_once_per_interval() {
        let t0 = Instant::now();
        let mut health = measured();
        assert!(health.sample_due(t0, ms(100)));
        health.on_clock(sample(1, t0), &rules());
        assert!(!health.sample_due(t0 + ms(50), ms(100)));
        assert!(health.sample_due(t0 + ms(101), ms(100)));
        assert!(health.observation_due(t0, ms(100)));
        assert!(health.mark_observing(t0), "the first raises the number");
        assert!(!health.observation_due(t0 + ms(50), ms(100)));
        assert!(!health.mark_observing(t0 + ms(100)), "then once per second");
        assert!(health.mark_observing(t0 + RAISE_EVERY));
        health.doubt();
        assert!(health.observation_due(t0 + ms(50), ms(100)), "due at once");
    }

    #[test]
    fn an_answer_counts_only_once_a_verdict_covers_it() {
        let t0 = Instant::now();
        let every = ms(100);
        let mut health = measured();
        // Observed (on connect) at t0: answers sent within the interval
        // are covered.
        health.mark_observing(t0);
        assert_eq!(health.coverage(t0 + ms(1), every), Coverage::AwaitVerdict);
        assert!(health.admit(t0));
        health.on_observed(&facts("a", OLD, "always", "d a 5"), &[], t0, &rules());
        assert_eq!(health.coverage(t0 + ms(100), every), Coverage::Covered);
        // Past the interval with nothing claimed: not covered.
        assert_eq!(health.coverage(t0 + ms(101), every), Coverage::Uncovered);
        // An observation claimed at t1 (it went out ahead of, or beside,
        // what is sent after it): answers sent since wait for its verdict,
        // even within the interval of the one before.
        let t1 = t0 + ms(50);
        health.mark_observing(t1);
        assert_eq!(health.coverage(t1, every), Coverage::AwaitVerdict);
        assert_eq!(health.coverage(t1 + ms(80), every), Coverage::AwaitVerdict);
        // Sent before it: the earlier verdict covers them.
        assert_eq!(health.coverage(t1 - ms(1), every), Coverage::Covered);
        // Past the earlier interval, sent before the claim: only the claim
        // in flight can cover it.
        let t2 = t0 + ms(150);
        health.mark_observing(t2);
        assert_eq!(health.coverage(t2 - ms(1), every), Coverage::AwaitVerdict);
        // Both judged: covered up to an interval after the later one.
        assert!(health.admit(t2));
        assert_eq!(health.coverage(t2 + ms(100), every), Coverage::Covered);
        assert_eq!(health.coverage(t2 + ms(101), every), Coverage::Uncovered);
    }

    #[test]
    fn an_observation_that_ends_without_an_answer_leaves_the_node_unobserved() {
        let t0 = Instant::now();
        let mut health = measured();
        health.mark_observing(t0);
        assert!(health.admit(t0));
        health.on_observed(&facts("a", OLD, "always", "d a 5"), &[], t0, &rules());
        // Claimed with a request that was dropped (its round's deadline).
        let t1 = t0 + ms(200);
        health.mark_observing(t1);
        assert!(!health.observation_due(t1 + ms(1), ms(100)));
        health.abandon(t1, "dropped");
        assert_eq!(reason(&health, t1 + ms(1)), Some("unobserved"));
        assert_eq!(health.coverage(t1 + ms(1), ms(100)), Coverage::Covered);
        assert!(
            health.observation_due(t1 + ms(1), ms(100)),
            "another one is due at once"
        );
        // The next succeeds: counted again.
        let t2 = t1 + ms(2);
        health.mark_observing(t2);
        assert!(health.admit(t2));
        health.on_observed(&facts("a", OLD, "always", "d a 6"), &[], t2, &rules());
        assert_eq!(reason(&health, t2), None);
        // An abandoned claim older than a verdict changes nothing.
        health.abandon(t1, "dropped late");
        assert_eq!(reason(&health, t2), None);
    }

    #[test]
    fn an_observation_judged_late_still_counts_a_loss_it_shows() {
        let t0 = Instant::now();
        let mut health = measured();
        let observed = |health: &mut Health, began: Instant, facts: &NodeFacts, now: Instant| {
            if health.admit(began) {
                health.on_observed(facts, &[], now, &rules());
            } else {
                health.on_late_observation(facts, now);
            }
        };
        observed(&mut health, t0, &facts("a", OLD, "always", "d a 5"), t0);
        // Began at t1 on a connection held up; one that began at t2 (a new
        // connection's) is judged first and sees nothing wrong.
        let (t1, t2) = (t0 + ms(10), t0 + ms(20));
        observed(
            &mut health,
            t2,
            &facts("a", OLD, "always", "d a 7"),
            t0 + ms(30),
        );
        assert_eq!(reason(&health, t0 + ms(30)), None);
        // The held-up one ran after a FLUSHALL: it found another mark (and
        // a lower number, which a late one may well read).
        observed(
            &mut health,
            t1,
            &facts("a", OLD, "always", "e a 1"),
            t0 + ms(40),
        );
        assert_eq!(reason(&health, t0 + ms(40)), Some("data_set"));
        assert_eq!(left(&health, t0 + ms(40)), Some(secs(10)));
        // A late one that only read a lower number changes nothing.
        let mut calm = measured();
        observed(&mut calm, t0, &facts("a", OLD, "always", "d a 5"), t0);
        observed(
            &mut calm,
            t2,
            &facts("a", OLD, "always", "d a 7"),
            t0 + ms(30),
        );
        observed(
            &mut calm,
            t1,
            &facts("a", OLD, "always", "d a 6"),
            t0 + ms(40),
        );
        assert_eq!(reason(&calm, t0 + ms(40)), None);
    }

    #[test]
    fn an_observation_judged_after_a_later_one_is_ignored() {
        let t0 = Instant::now();
        let mut health = measured();
        assert!(health.admit(t0 + ms(10)));
        assert!(!health.admit(t0), "began before the one already judged");
        assert!(health.admit(t0 + ms(10)) && health.admit(t0 + ms(20)));
    }
}
