//! The exploration: breadth-first over every interleaving of the steps
//! the bounds allow, each state once (by a 128-bit hash of the whole
//! state, taken up to the interchangeable nodes' labels), with the
//! properties checked on every new state. A violation comes back with the
//! shortest path to it, replayed step by step in words.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::hashing::{Digested, digest};
use super::properties::{self, Progress};
use super::world::{Event, Model, Step, World};

/// What an exploration found.
pub(super) struct Report {
    pub(super) name: &'static str,
    pub(super) states: usize,
    pub(super) transitions: usize,
    pub(super) depth: usize,
    pub(super) elapsed: Duration,
    /// Script and command runs, and how many the memo answered.
    pub(super) runs: u64,
    pub(super) memo_hits: u64,
    /// Nodes that are interchangeable (states that differ only by their
    /// labels count once).
    pub(super) symmetric_nodes: usize,
    /// Deadlock checks that needed a frozen search, and its states.
    pub(super) frozen_searches: usize,
    pub(super) frozen_states: usize,
    /// The events of note some step reached.
    pub(super) reached: BTreeSet<Event>,
    /// The scripts run, by their place in `scripts::SENT`.
    pub(super) scripts_run: BTreeSet<usize>,
    pub(super) violation: Option<Violation>,
}

/// A property broken, and the steps that break it.
pub(super) struct Violation {
    pub(super) property: String,
    pub(super) trace: String,
    /// Steps from the initial state.
    pub(super) steps: usize,
}

impl Report {
    pub(super) fn summary(&self) -> String {
        format!(
            "{}: {} states ({} interchangeable nodes), {} transitions, depth {}, {:.1?} ({} script runs, {} from the memo; {} frozen searches over {} states){}",
            self.name,
            self.states,
            self.symmetric_nodes,
            self.transitions,
            self.depth,
            self.elapsed,
            self.runs,
            self.memo_hits,
            self.frozen_searches,
            self.frozen_states,
            match &self.violation {
                Some(v) => format!("; VIOLATION: {}", v.property),
                None => "; no violation".to_owned(),
            }
        )
    }
}

/// The state's digest up to the nodes' symmetry: every node but the
/// counter node plays the same part, so states that differ only by which
/// node is which are one state. Each node's part of the state is digested
/// on its own ([`World::column`]); the counter node's stays in its place,
/// the others are sorted.
fn canonical(world: &World, fixed: Option<usize>) -> u128 {
    let mut columns: Vec<u128> = (0..world.nodes.len())
        .filter(|&n| Some(n) != fixed)
        .map(|n| world.column(n))
        .collect();
    columns.sort_unstable();
    digest(&(world.skeleton(), fixed.map(|n| world.column(n)), columns))
}

/// The node that is not like the others (the counter node), if any.
fn fixed_node(model: &Model) -> Option<usize> {
    match model.scenario.fencing {
        crate::fencing::Fencing::CounterNode { node } => Some(node),
        _ => None,
    }
}

/// The properties of one state.
fn check(world: &World, model: &Model, progress: &mut Progress) -> Option<String> {
    properties::exclusion(world, model)
        .or_else(|| properties::keys_expire(world))
        .or_else(|| properties::deadlock(world, model, progress))
}

/// Explores every state within the model's bounds (at most `cap` of them:
/// beyond that the bounds are too large for the run, which panics).
pub(super) fn explore(model: &Model, cap: usize) -> Report {
    explore_up_to(model, cap, true)
}

/// Explores the first `states` states, breadth first, and stops there
/// without complaint (for what the first steps of a scenario reach).
pub(super) fn explore_first(model: &Model, states: usize) -> Report {
    explore_up_to(model, states, false)
}

fn explore_up_to(model: &Model, cap: usize, all: bool) -> Report {
    let started = Instant::now();
    let initial = World::initial(model);
    let mut progress = Progress::default();
    let mut seen: HashMap<u128, u32, Digested> = HashMap::default();
    // For each state, its parent and the step from it (the root's own).
    let mut parents: Vec<(u32, Option<Step>, u16)> = vec![(0, None, 0)];
    let fixed = fixed_node(model);
    seen.insert(canonical(&initial, fixed), 0);
    let mut queue = VecDeque::from([(initial.clone(), 0u32)]);
    let mut transitions = 0;
    let mut depth = 0;
    let mut violation = None;
    let mut reached = BTreeSet::new();
    if let Some(property) = check(&initial, model, &mut progress) {
        violation = Some(Violation {
            trace: trace(model, &[]),
            property,
            steps: 0,
        });
    }
    'search: while let Some((world, index)) = queue.pop_front() {
        if violation.is_some() {
            break;
        }
        let steps = world.steps(model);
        if steps.is_empty()
            && let Some(property) = properties::woken(&world, model)
        {
            let steps = path(&parents, index);
            violation = Some(Violation {
                trace: trace(model, &steps),
                property,
                steps: steps.len(),
            });
            break;
        }
        for step in steps {
            let mut next = world.clone();
            let outcome = next.apply(step, model, false);
            reached.extend(outcome.reached.iter().copied());
            transitions += 1;
            // What a step breaks by itself is checked on every transition:
            // the state it leads to may have been reached before by a
            // step that broke nothing (a stale write after a read that
            // claimed nothing ends where the write before the read does).
            if let Some(property) = outcome.flaws.into_iter().next() {
                let mut steps = path(&parents, index);
                steps.push(step);
                violation = Some(Violation {
                    trace: trace(model, &steps),
                    property,
                    steps: steps.len(),
                });
                break 'search;
            }
            let id = parents.len() as u32;
            match seen.entry(canonical(&next, fixed)) {
                Entry::Occupied(_) => continue,
                Entry::Vacant(slot) => {
                    slot.insert(id);
                }
            }
            let level = parents[index as usize].2 + 1;
            depth = depth.max(usize::from(level));
            parents.push((index, Some(step), level));
            if parents.len() > cap {
                assert!(
                    !all,
                    "{}: more than {cap} states; lower the bounds",
                    model.scenario.name
                );
                break 'search;
            }
            if let Some(property) = check(&next, model, &mut progress) {
                let steps = path(&parents, id);
                violation = Some(Violation {
                    trace: trace(model, &steps),
                    property,
                    steps: steps.len(),
                });
                break 'search;
            }
            queue.push_back((next, id));
        }
    }
    if progress.after_quarantine > 0 {
        reached.insert(Event::JudgedAfterQuarantine);
    }
    let host = model.host.borrow();
    Report {
        name: model.scenario.name,
        states: parents.len(),
        transitions,
        depth,
        elapsed: started.elapsed(),
        runs: host.runs,
        memo_hits: host.memo_hits,
        symmetric_nodes: model.scenario.nodes - usize::from(fixed.is_some()),
        frozen_searches: progress.searches,
        frozen_states: progress.visited,
        reached,
        scripts_run: host
            .ran()
            .filter_map(|source| model.script_index(source))
            .collect(),
        violation,
    }
}

/// The steps from the initial state to state `id`.
fn path(parents: &[(u32, Option<Step>, u16)], mut id: u32) -> Vec<Step> {
    let mut steps = Vec::new();
    while let (parent, Some(step), _) = parents[id as usize] {
        steps.push(step);
        id = parent;
    }
    steps.reverse();
    steps
}

/// `steps` replayed from the initial state, in words: each step, what the
/// node ran and answered and its keys after, and the clients' decisions.
fn trace(model: &Model, steps: &[Step]) -> String {
    let mut world = World::initial(model);
    let mut text = String::new();
    let names: Vec<&str> = (0..world.clients.len()).map(|c| model.name(c)).collect();
    let late = model.scenario.late;
    let _ = writeln!(
        text,
        "scenario {}: {} nodes, clients {}; {} observed every node at t=0",
        model.scenario.name,
        world.nodes.len(),
        names.join(", "),
        if late.is_empty() {
            "every client has".to_owned()
        } else {
            format!("all but {} have", late.join(", "))
        }
    );
    for (i, &step) in steps.iter().enumerate() {
        let t = world.seconds();
        let outcome = world.apply(step, model, true);
        let _ = writeln!(text, "{:>3}. [t={t}] {}", i + 1, step.label(model));
        for line in outcome.log {
            let _ = writeln!(text, "       {line}");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model_check::{A, B, guard::Rule, nested, restarts, wire::Scripts};

    /// Reachable states of `model`, breadth first, up to `limit`.
    fn some_states(model: &Model, limit: usize) -> Vec<World> {
        let mut seen = std::collections::HashSet::new();
        let mut out = vec![World::initial(model)];
        let mut i = 0;
        while i < out.len() && out.len() < limit {
            for step in out[i].steps(model) {
                let mut next = out[i].clone();
                next.apply(step, model, false);
                if seen.insert(digest(&next)) {
                    out.push(next);
                }
            }
            i += 1;
        }
        out
    }

    /// The canonical digest is the same for relabelled states, and tells
    /// apart states that are not relabellings of each other.
    #[test]
    fn states_are_one_exactly_when_they_are_relabellings() {
        for model in [
            Model::new(restarts(Rule::Library)),
            Model::new(nested("nested", A, B, Scripts::library())),
        ] {
            let fixed = fixed_node(&model);
            let free: Vec<usize> = (0..3).filter(|&n| Some(n) != fixed).collect();
            let relabellings: Vec<Vec<usize>> = if free.len() == 3 {
                vec![
                    vec![1, 2, 0],
                    vec![2, 0, 1],
                    vec![0, 2, 1],
                    vec![1, 0, 2],
                    vec![2, 1, 0],
                ]
            } else {
                let mut swap: Vec<usize> = (0..3).collect();
                swap.swap(free[0], free[1]);
                vec![swap]
            };
            let mut by_class: HashMap<u128, Vec<u128>> = HashMap::new();
            let states = some_states(&model, 4000);
            for state in &states {
                let class = canonical(state, fixed);
                for from in &relabellings {
                    assert_eq!(canonical(&state.relabelled(from), fixed), class);
                }
                by_class.entry(class).or_default().push(digest(state));
            }
            for state in &states {
                let class = canonical(state, fixed);
                let mut images: Vec<u128> = relabellings
                    .iter()
                    .map(|from| digest(&state.relabelled(from)))
                    .collect();
                images.push(digest(state));
                for other in &by_class[&class] {
                    assert!(
                        images.contains(other),
                        "two states merged that are not relabellings of each other"
                    );
                }
            }
        }
    }
}
