//! A client's node guard in the model: the observations it made of one
//! node, judged by the library's own [`Health`] (replayed from them, so the
//! state stays plain data), or by the old, defective rule of the negative
//! control.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::guard::judge::NodeFacts;
use crate::guard::observe::facts_from_observation;

use super::hashing::digest;
use super::redis::Reply;
use super::world::instant;

// The model judges with the very rules the run-time guard uses, not a
// copy of them.
use crate::guard::health::{Health, Rules};

/// How restarts are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// The library's guard ([`Health::on_observed`]).
    Library,
    /// The rule before the fix (defect 1): a restart is unsafe only if the
    /// *new* process does not persist every write, a same-process
    /// observation never shows a loss, and there is no data-set mark.
    BeforeFix,
}

/// One observation: when (node ms), what the script answered and what
/// `CONFIG GET appendfsync` said, the facts read from them, and a digest
/// that stands for it in the state's hash.
#[derive(Debug)]
pub(super) struct Observation {
    at_ms: i64,
    facts: NodeFacts,
    digest: u128,
}

impl Observation {
    pub(super) fn new(at_ms: i64, reply: Reply, fsync: &'static str) -> Arc<Self> {
        let facts = facts_from_observation("node", reply.to_value(), Some(fsync.to_owned()))
            .expect("the model's observation script answers as Redis does");
        Arc::new(Self {
            at_ms,
            facts,
            digest: digest(&(at_ms, &reply, fsync)),
        })
    }
}

impl PartialEq for Observation {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}
impl Eq for Observation {}
impl Hash for Observation {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

/// What a client's guard knows of one node: every observation, in order,
/// and the verdict they lead to (worked out once per observation: it only
/// changes with one, or as the quarantine runs out).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct GuardView {
    observations: Vec<Arc<Observation>>,
    /// Quarantined while the time is below this (node ms).
    until_ms: i64,
    epoch: u64,
}

impl Default for GuardView {
    fn default() -> Self {
        // Never observed: nothing against it yet, as for `Health` (the
        // connection that the first request opens observes it first).
        Self {
            observations: Vec::new(),
            until_ms: i64::MIN,
            epoch: 0,
        }
    }
}

/// The guard's verdict at some instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Verdict {
    pub(super) quarantined: bool,
    /// Moves on whenever the node may have lost keys (see `Health::epoch`).
    pub(super) epoch: u64,
}

impl GuardView {
    /// Adds an observation, judged under `rule` with a quarantine `window`.
    pub(super) fn observed(&mut self, observation: Arc<Observation>, rule: Rule, window: Duration) {
        let now_ms = observation.at_ms;
        self.observations.push(observation);
        let (until_ms, epoch) = match rule {
            Rule::Library => {
                let rules = Rules {
                    window,
                    drift_factor: crate::DEFAULT_DRIFT_FACTOR,
                    sample_every: (window / 10)
                        .clamp(Duration::from_millis(10), Duration::from_secs(1)),
                };
                // The model's clocks agree: their rate needs no reading.
                let mut health = Health::rate_taken_as_measured();
                for o in &self.observations {
                    health.on_observed(&o.facts, &[], instant(o.at_ms), &rules);
                }
                let until = match health.quarantine(instant(now_ms), &rules) {
                    None => i64::MIN,
                    Some(quarantine) => quarantine
                        .remaining
                        .map_or(i64::MAX, |left| now_ms + left.as_millis() as i64),
                };
                (until, health.epoch())
            }
            Rule::BeforeFix => before_fix(&self.observations, window),
        };
        self.until_ms = until_ms;
        self.epoch = epoch;
    }

    /// When the node's quarantine ends (`i64::MIN` if it is counted).
    pub(super) fn quarantined_until(&self) -> i64 {
        self.until_ms
    }

    /// The verdict at `now_ms` (no earlier than the last observation).
    pub(super) fn verdict(&self, now_ms: i64) -> Verdict {
        Verdict {
            quarantined: now_ms < self.until_ms,
            epoch: self.epoch,
        }
    }
}

/// The old rule, on the facts without the data-set mark: unsafe only when
/// the new process (or one met young) does not persist every write; the
/// loss dates from its start.
fn before_fix(observations: &[Arc<Observation>], window: Duration) -> (i64, u64) {
    let window_ms = window.as_millis() as i64;
    let mut known: Option<&str> = None;
    let mut lost_at: Option<i64> = None;
    let mut epoch = 0;
    for o in observations {
        let mut facts = o.facts.clone();
        facts.dataset = None;
        let Some(run_id) = facts.run_id.as_deref() else {
            continue;
        };
        let uptime_ms = facts.uptime.map_or(0, |u| u.at_least().as_millis() as i64);
        let restarted = match known {
            None => uptime_ms < window_ms,
            Some(before) => before != run_id,
        };
        if restarted && !facts.persists_every_write() {
            let at = o.at_ms - uptime_ms;
            lost_at = Some(lost_at.map_or(at, |l| l.max(at)));
            epoch += 1;
        }
        known = o.facts.run_id.as_deref();
    }
    (lost_at.map_or(i64::MIN, |at| at + window_ms), epoch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_check::restarts;
    use crate::model_check::world::{Model, Step, World};

    /// A node without persistence restarts empty, persisting every write
    /// now; a client that knew the old process observes the new one.
    fn restarted(rule: Rule) -> Verdict {
        let mut scenario = restarts(rule);
        scenario.budget.observes = 1;
        let model = Model::new(scenario);
        let mut world = World::initial(&model);
        assert!(!world.verdict(1, 0).quarantined, "met long after its start");
        world.apply(Step::NodeCrash { node: 0 }, &model, false);
        world.apply(
            Step::NodeRestart {
                node: 0,
                persists: true,
            },
            &model,
            false,
        );
        world.apply(Step::Observe { client: 1, node: 0 }, &model, false);
        world.verdict(1, 0)
    }

    #[test]
    fn a_restart_after_a_process_that_lost_writes_is_quarantined() {
        let verdict = restarted(Rule::Library);
        assert!(verdict.quarantined);
        assert_eq!(verdict.epoch, 1);
    }

    #[test]
    fn the_old_rule_trusts_it_for_its_new_settings() {
        let verdict = restarted(Rule::BeforeFix);
        assert!(!verdict.quarantined);
    }
}
