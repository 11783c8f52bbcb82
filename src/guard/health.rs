//! What one manager knows of one node's trustworthiness: its identity,
//! the settings seen on the last connect, and its recent clock samples;
//! and from them, whether it is quarantined now.
//!
//! Plain state driven by the caller's clock readings (no I/O, no clock of
//! its own), so the rules are unit-tested without a server.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::judge::{self, ClockSample, NodeFacts, Quarantine, QuarantineReason};

/// Clock samples kept per node: the oldest gives the long baseline that
/// resolves small rate errors, the newest catches steps at once.
const CLOCK_SAMPLES_KEPT: usize = 8;

/// One node's standing with the guard.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// The server process we last saw (`run_id`).
    run_id: Option<String>,
    /// Bumped whenever the node may have lost keys (an unsafe restart, a
    /// clock fault): a lock whose SET went out in an earlier epoch may
    /// have its key put back there by an extension.
    epoch: u64,
    /// When the node started without persisting every write, as words.
    unsafe_start: Option<(Instant, String)>,
    /// A settings reason (eviction, replica), until the next connect.
    settings: Option<QuarantineReason>,
    /// Samples spaced at least the sampling interval apart, oldest first.
    samples: VecDeque<ClockSample>,
    /// When we last read the node's clock.
    last_sampled: Option<Instant>,
    /// When the process `run_id` last answered us: a restart happened
    /// after that, whatever its (wall-clock based) uptime claims.
    last_heard: Option<Instant>,
    /// The last clock fault and when it was last seen.
    clock_fault: Option<(Instant, QuarantineReason)>,
}

/// How the guard judges: the window and the clock tolerance.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// A node is quarantined this long after an unsafe start or the last
    /// clock fault.
    pub(crate) window: Duration,
    pub(crate) drift_factor: f64,
    /// Spacing of the clock samples kept (see [`CLOCK_SAMPLES_KEPT`]).
    pub(crate) sample_every: Duration,
}

impl Health {
    /// The node's epoch (see the field).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A new connection observed `facts` (and maybe a clock sample).
    pub(crate) fn on_connect(
        &mut self,
        facts: &NodeFacts,
        sample: Option<ClockSample>,
        now: Instant,
        rules: &Rules,
    ) {
        if let Some(started) = judge::unsafe_start(self.run_id.as_deref(), facts) {
            // Uptime comes from the node's wall clock, which a step can
            // inflate; a restart is no earlier than the old process's last
            // answer.
            let claimed = now.checked_sub(started).unwrap_or(now);
            let at = match (self.run_id.is_some(), self.last_heard) {
                (true, Some(heard)) => claimed.max(heard.min(now)),
                _ => claimed,
            };
            self.unsafe_start = Some((at, facts.persistence()));
            self.epoch += 1;
        }
        if facts.run_id.is_some() && facts.run_id != self.run_id {
            // Another process: earlier clock samples say nothing of it.
            self.samples.clear();
            self.run_id = facts.run_id.clone();
        }
        // Settings unread (INFO failed) keep the last verdict.
        if facts.role.is_some() || facts.maxmemory_policy.is_some() {
            self.settings = judge::settings_fault(facts);
        }
        self.last_heard = Some(now);
        if let Some(sample) = sample {
            self.on_clock(sample, rules);
        }
    }

    /// A new connection to a node we knew could not be observed in time:
    /// it may have restarted unseen, so it is not counted for a window.
    pub(crate) fn on_unobserved(&mut self, now: Instant) {
        if self.run_id.is_some() {
            self.unsafe_start = Some((now, "unknown: not observed on reconnect".into()));
            self.epoch += 1;
        }
    }

    /// A reading of the node's clock.
    pub(crate) fn on_clock(&mut self, sample: ClockSample, rules: &Rules) {
        self.last_sampled = Some(sample.received);
        self.last_heard = Some(sample.received);
        let fault = [self.samples.front(), self.samples.back()]
            .into_iter()
            .flatten()
            .find_map(|older| judge::clock_fault(older, &sample, rules.drift_factor));
        if let Some(fault) = fault {
            // Keys it holds may have expired early: like a restart. Judge
            // what follows against this sample, not across the fault.
            self.clock_fault = Some((sample.received, fault.into()));
            self.epoch += 1;
            self.samples.clear();
            self.samples.push_back(sample);
            return;
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

    /// Whether the node is quarantined at `now`, why, and for how long.
    /// Settings come first (they do not pass with time), then whichever
    /// timed reason lasts longer.
    pub(crate) fn quarantine(&self, now: Instant, rules: &Rules) -> Option<Quarantine> {
        if let Some(reason) = &self.settings {
            return Some(Quarantine {
                reason: reason.clone(),
                remaining: None,
            });
        }
        // Called for every request that sets a key: decide by time first,
        // and build the reason only for a node that is quarantined.
        enum Cause<'a> {
            Restart(&'a String),
            Clock(&'a QuarantineReason),
        }
        let start = self
            .unsafe_start
            .as_ref()
            .map(|(at, persistence)| (*at + rules.window, Cause::Restart(persistence)));
        let clock = self
            .clock_fault
            .as_ref()
            .map(|(at, reason)| (*at + rules.window, Cause::Clock(reason)));
        let (until, cause) = [start, clock]
            .into_iter()
            .flatten()
            .filter(|(until, _)| *until > now)
            .max_by_key(|(until, _)| *until)?;
        let reason = match cause {
            Cause::Restart(persistence) => QuarantineReason::Restarted {
                persistence: persistence.clone(),
            },
            Cause::Clock(reason) => reason.clone(),
        };
        Some(Quarantine {
            reason,
            remaining: Some(until - now),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn rules() -> Rules {
        Rules {
            window: ms(1000),
            drift_factor: 0.01,
            sample_every: ms(100),
        }
    }

    fn facts(run_id: &str, uptime: Duration, fsync: &str) -> NodeFacts {
        NodeFacts {
            run_id: Some(run_id.into()),
            uptime: Some(uptime),
            appendonly: Some(true),
            appendfsync: Some(fsync.into()),
            maxmemory_policy: Some("noeviction".into()),
            maxmemory: Some(0),
            role: Some("master".into()),
            ..NodeFacts::named("n")
        }
    }

    fn reason(health: &Health, now: Instant) -> Option<&'static str> {
        health
            .quarantine(now, &rules())
            .map(|quarantine| quarantine.reason.label())
    }

    #[test]
    fn a_restart_without_fsync_always_is_quarantined_for_the_window() {
        let t0 = Instant::now();
        let mut health = Health::default();
        // First met long after it started: counted.
        health.on_connect(&facts("a", ms(5000), "everysec"), None, t0, &rules());
        assert_eq!(reason(&health, t0), None);
        assert_eq!(health.epoch(), 1, "first meeting is an unsafe start");
        // It restarted: quarantined from its start (50 ms ago, after we
        // last heard the old process) for the window.
        let t1 = t0 + ms(100);
        health.on_connect(&facts("b", ms(50), "everysec"), None, t1, &rules());
        assert_eq!(reason(&health, t1), Some("restart"));
        let left = health.quarantine(t1, &rules()).and_then(|q| q.remaining);
        assert_eq!(left, Some(ms(950)));
        assert_eq!(reason(&health, t1 + ms(949)), Some("restart"));
        assert_eq!(reason(&health, t1 + ms(950)), None);
        // Reconnecting to the same process changes nothing.
        health.on_connect(
            &facts("b", ms(300), "everysec"),
            None,
            t1 + ms(100),
            &rules(),
        );
        assert_eq!(health.epoch(), 2);
    }

    #[test]
    fn an_inflated_uptime_cannot_shorten_the_quarantine() {
        let t0 = Instant::now();
        let mut health = Health::default();
        health.on_connect(&facts("a", ms(5000), "everysec"), None, t0, &rules());
        // Back 100 ms later claiming an hour of uptime (its clock stepped).
        let t1 = t0 + ms(100);
        health.on_connect(&facts("b", ms(3_600_000), "everysec"), None, t1, &rules());
        let left = health.quarantine(t1, &rules()).and_then(|q| q.remaining);
        assert_eq!(
            left,
            Some(ms(900)),
            "counted from the old process's last answer"
        );
    }

    #[test]
    fn an_answer_without_a_sample_also_dates_a_later_restart() {
        let t0 = Instant::now();
        let mut health = Health::default();
        health.on_connect(&facts("a", ms(5000), "everysec"), None, t0, &rules());
        // The old process answered 300 ms later (no clock sample with it).
        health.heard(t0 + ms(300));
        let t1 = t0 + ms(400);
        health.on_connect(&facts("b", ms(3_600_000), "everysec"), None, t1, &rules());
        let left = health.quarantine(t1, &rules()).and_then(|q| q.remaining);
        assert_eq!(
            left,
            Some(ms(900)),
            "counted from the old process's last answer"
        );
        // An earlier answer reported late moves nothing back.
        health.heard(t0);
        assert_eq!(health.last_heard, Some(t1));
    }

    #[test]
    fn a_known_node_not_observed_on_reconnect_is_not_counted() {
        let t0 = Instant::now();
        let mut health = Health::default();
        health.on_unobserved(t0);
        assert_eq!(reason(&health, t0), None, "never met: nothing to compare");
        health.on_connect(&facts("a", ms(5000), "always"), None, t0, &rules());
        health.on_unobserved(t0 + ms(10));
        assert_eq!(reason(&health, t0 + ms(10)), Some("restart"));
        // Settings unread on a later connect keep the last verdict.
        let replica = NodeFacts {
            role: Some("slave".into()),
            ..facts("a", ms(5000), "always")
        };
        health.on_connect(&replica, None, t0, &rules());
        health.on_connect(&NodeFacts::named("n"), None, t0, &rules());
        assert_eq!(reason(&health, t0), Some("replica"));
    }

    #[test]
    fn a_restart_with_fsync_always_is_trusted_at_once() {
        let t0 = Instant::now();
        let mut health = Health::default();
        health.on_connect(&facts("a", ms(0), "always"), None, t0, &rules());
        health.on_connect(&facts("b", ms(0), "always"), None, t0, &rules());
        assert_eq!(reason(&health, t0), None);
        assert_eq!(health.epoch(), 0);
    }

    #[test]
    fn settings_last_until_the_next_connect() {
        let t0 = Instant::now();
        let mut health = Health::default();
        let replica = NodeFacts {
            role: Some("slave".into()),
            ..facts("a", ms(5000), "always")
        };
        health.on_connect(&replica, None, t0, &rules());
        let quarantine = health.quarantine(t0 + ms(100_000), &rules());
        assert_eq!(
            quarantine.as_ref().map(|q| (q.reason.label(), q.remaining)),
            Some(("replica", None))
        );
        health.on_connect(&facts("a", ms(5000), "always"), None, t0, &rules());
        assert_eq!(reason(&health, t0), None);
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
        let mut health = Health::default();
        health.on_connect(
            &facts("a", ms(5000), "always"),
            Some(sample(base, t0)),
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
        assert_eq!(reason(&health, t0 + ms(1049)), Some("clock_rate"));
        assert_eq!(reason(&health, t0 + ms(1052)), None);
        assert_eq!(health.epoch(), 1, "sane samples bump nothing");
    }

    #[test]
    fn a_step_is_seen_by_the_next_sample() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        let mut health = Health::default();
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
    fn a_small_drift_is_seen_against_the_oldest_sample() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        let mut health = Health::default();
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
    fn samples_are_due_once_per_interval() {
        let t0 = Instant::now();
        let mut health = Health::default();
        assert!(health.sample_due(t0, ms(100)));
        health.on_clock(sample(1, t0), &rules());
        assert!(!health.sample_due(t0 + ms(50), ms(100)));
        assert!(health.sample_due(t0 + ms(101), ms(100)));
    }
}
