//! The model's state and its steps: nodes (data, process, up or down),
//! clients, the requests in flight on each client's connection to each
//! node (first in, first out), and the clock. Every step is one atomic
//! event: a node runs one request, a client starts or ends something, a
//! node or client crashes, time moves on to the next instant at which
//! something changes by itself.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::hash::Hash;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::fencing::{
    CounterGrants, CounterToken, Fencing, clock_ceiling, clock_floor, clock_lowest,
    counter_node_token,
};
use crate::keys::{Access, Keys};
use crate::ops::{Answer, Counting, Op};
use crate::quorum::{self, Decision, Loss};

use super::client::{
    Act, Attempt, Ballot, Client, Hold, MAX_NODES, NodeTrail, Purpose, Round, Sleep, Storing,
    ValueId, Wait, cleanup_on, wake_tick,
};
use super::guard::{Observation, Rule, Verdict};
use super::hashing::{Fold, digest};
use super::redis::{Data, Host, Invocation, Keyspace, Limits, Process, Reply, Store, Text};
use super::wire::{self, Scripts};

/// Model time starts here (node clocks, ms since 1970).
pub(super) const EPOCH_MS: i64 = 1_700_000_000_000;
/// One tick of model time: a second, far above every round trip. Time
/// also stops between ticks where something changes by itself (see
/// [`World::next_instant`]).
pub(super) const TICK_MS: i64 = 1000;
/// `node_timeout` (the library's default): a round is decided within it.
const NODE_TIMEOUT_MS: i64 = 50;
/// How long before the model starts the nodes' processes and marks began.
const NODES_UP_FOR_MS: i64 = 100_000;

/// Model milliseconds as the library's monotonic instants, anchored an
/// hour ahead so that the ages the guard subtracts stay in range.
pub(super) fn instant(ms: i64) -> Instant {
    static ANCHOR: LazyLock<Instant> = LazyLock::new(|| Instant::now() + Duration::from_secs(3600));
    let from = ms - EPOCH_MS;
    if from >= 0 {
        *ANCHOR + Duration::from_millis(from as u64)
    } else {
        *ANCHOR - Duration::from_millis(from.unsigned_abs())
    }
}

/// How a client asks for a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    /// One attempt (`no_wait`).
    Once,
    /// Up to this many attempts while it is held (`lock`).
    Retry(u8),
    /// Queued and woken until it gets it or gives up (a waiting request).
    Wait,
}

/// One line of a client's program.
#[derive(Debug, Clone, Copy)]
pub(super) enum Intent {
    Lock {
        resources: &'static [&'static str],
        access: Access,
        how: How,
    },
    /// Release the lock taken by intent number `.0` (if it was taken).
    Release(u8),
    /// Write to the fenced storage under the token of the lock taken by
    /// intent number `.0`, whether or not it is still valid (a client that
    /// paused past its lock's end writes as if it were).
    Write(u8),
    /// Read from the fenced storage, as `Write` writes.
    Read(u8),
}

/// What a client does with the fenced storage.
#[derive(Debug, Clone, Copy)]
enum StorageUse {
    Write,
    Read,
}

/// How many of the rarer events the whole run may contain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(super) struct Budget {
    pub(super) node_crashes: u8,
    pub(super) client_crashes: u8,
    pub(super) pauses: u8,
    pub(super) drops: u8,
    pub(super) give_ups: u8,
    pub(super) extends: u8,
    pub(super) observes: u8,
}

/// A configuration to explore.
pub(super) struct Scenario {
    pub(super) name: &'static str,
    /// Each client's name (for traces) and program.
    pub(super) clients: Vec<(&'static str, Vec<Intent>)>,
    pub(super) nodes: usize,
    pub(super) ttl_ms: u64,
    pub(super) fencing: Fencing,
    pub(super) max_ticks: u8,
    /// Acquisition attempts per client.
    pub(super) max_attempts: u8,
    pub(super) budget: Budget,
    /// Whether the nodes start persisting every write.
    pub(super) persist_at_start: bool,
    /// The settings a restarted node may come back with.
    pub(super) restarts_persist: &'static [bool],
    pub(super) rule: Rule,
    /// The scripts the nodes run (the library's, or a mutant's).
    pub(super) scripts: Scripts,
    /// Whether a tick may pass while requests are in flight (a slow node:
    /// they land after their round timed out).
    pub(super) slow_requests: bool,
    /// Clients that meet the nodes only with their first request (the
    /// others connect to every node at the start).
    pub(super) late: &'static [&'static str],
    /// Whether a waiter's timer wakes it: without, only a ring does (after
    /// the retry at once that follows its first refusal), so a lost
    /// wake-up leaves it waiting for good (see `properties::woken`).
    pub(super) timers: bool,
    /// A client whose exclusive locks are taken `at_least` this many ms
    /// (their keys live that long from the start; a release before then
    /// keeps them for the time left, `keep.lua`).
    pub(super) at_least: Option<(&'static str, u64)>,
    /// Which rings wake a waiter before its timer.
    pub(super) news: News,
    /// How a client turns a counter-node round into a token (the library's
    /// rule, or a mutant's).
    pub(super) token_rule: TokenRule,
    /// Clients cut off from the counter node (a partition): their requests
    /// to it fail at once.
    pub(super) cut_off: &'static [&'static str],
    /// How many seconds the counter node's clock runs ahead of the others'
    /// (its tokens follow it).
    pub(super) counter_clock_ahead_s: u8,
}

/// How a client turns a counter-node round into a token: the library's
/// `counter_node_token`, fed what the round said, or a mutant's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenRule {
    Library,
    /// A mutant: a token issued without the counter node is one above the
    /// counters reported, not above the nodes' clocks.
    NoClockFloor,
    /// A mutant: the counter node's token counts however far its clock
    /// runs ahead of the others'.
    NoCeiling,
    /// A mutant: the counter node's token counts whatever the others
    /// report (a counter node back with a lower counter is used at once).
    CounterNodeTrusted,
}

/// Which rings wake a waiter before its timer (`Refusals::news_from` in
/// `wait/plan.rs`): the library's rule, or a mutant's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum News {
    /// Rings from the nodes that refused its last attempt, counted from
    /// when the attempt went out (every node's when none refused).
    FromRefusers,
    /// A mutant: after a ring that was no news set off its attempt, no
    /// ring wakes it (only its timer).
    NothingAfterAnEcho,
    /// A mutant: rings that came while the attempt was out are forgotten.
    AfterTheAnswer,
}

/// A scenario with what its runs share: every lock's keys, and the host.
pub(super) struct Model {
    pub(super) scenario: Scenario,
    /// The scripts the counter node runs: the scenario's, with its clock
    /// ahead where the scenario says so.
    counter_scripts: Scripts,
    /// Per client, per intent: the lock's keys (`None` for a release).
    keys: Vec<Vec<Option<Keys>>>,
    /// Every resource named, sorted: the index of a fencing high-water mark.
    pub(super) resources: Vec<&'static str>,
    pub(super) host: RefCell<Host>,
}

impl Model {
    pub(super) fn new(scenario: Scenario) -> Self {
        assert!(
            (1..=MAX_NODES).contains(&scenario.nodes),
            "{}: 1 to {MAX_NODES} nodes",
            scenario.name
        );
        let at_least_of = |name: &str| {
            scenario
                .at_least
                .filter(|&(client, _)| client == name)
                .map(|(_, ms)| Duration::from_millis(ms))
        };
        let keys = scenario
            .clients
            .iter()
            .map(|(name, program)| {
                program
                    .iter()
                    .map(|intent| match intent {
                        Intent::Lock {
                            resources, access, ..
                        } => Some(match access {
                            Access::Exclusive => {
                                let mut keys = Keys::exclusive_many(resources)
                                    .expect("the scenario's resources are valid");
                                keys.at_least = at_least_of(name);
                                keys
                            }
                            Access::Shared => Keys::shared(resources[0])
                                .expect("the scenario's resources are valid"),
                        }),
                        Intent::Release(_) | Intent::Write(_) | Intent::Read(_) => None,
                    })
                    .collect()
            })
            .collect();
        let mut resources: Vec<&'static str> = scenario
            .clients
            .iter()
            .flat_map(|(_, program)| program)
            .filter_map(|intent| match intent {
                Intent::Lock { resources, .. } => Some(resources.iter().copied()),
                Intent::Release(_) | Intent::Write(_) | Intent::Read(_) => None,
            })
            .flatten()
            .collect();
        resources.sort_unstable();
        resources.dedup();
        // The longest a key may live: the TTL, or an `at_least`.
        let ttl = scenario
            .ttl_ms
            .max(scenario.at_least.map_or(0, |(_, ms)| ms)) as i64;
        let host = Host::new(Limits {
            lock_ms: ttl,
            lease_ms: ttl,
            queue_ms: ttl + 1000,
        });
        let counter_scripts = scenario
            .scripts
            .with_clock_ahead(scenario.counter_clock_ahead_s);
        Self {
            scenario,
            counter_scripts,
            keys,
            resources,
            host: RefCell::new(host),
        }
    }

    /// The scripts node `n` runs.
    pub(super) fn scripts_of(&self, n: usize) -> &Scripts {
        if self.counter_node() == Some(n as u8) {
            &self.counter_scripts
        } else {
            &self.scenario.scripts
        }
    }

    /// Where script `source` sits in `scripts::SENT`, on any node.
    pub(super) fn script_index(&self, source: &str) -> Option<usize> {
        self.scenario
            .scripts
            .index_of(source)
            .or_else(|| self.counter_scripts.index_of(source))
    }

    /// Whether client `c` is cut off from node `n`.
    fn cut_off(&self, c: usize, n: usize) -> bool {
        self.counter_node() == Some(n as u8) && self.scenario.cut_off.contains(&self.name(c))
    }

    pub(super) fn ttl(&self) -> Duration {
        Duration::from_millis(self.scenario.ttl_ms)
    }

    /// How long client `c`'s keys of lock intent `intent` are set to live:
    /// the TTL, or its `at_least` when longer (`Engine::acquire`).
    fn key_ttl_ms(&self, c: usize, intent: u8) -> u64 {
        let at_least = self
            .keys(c, intent)
            .at_least
            .map_or(0, |d| d.as_millis() as u64);
        self.scenario.ttl_ms.max(at_least)
    }

    /// Client `c`'s guard window: the longest a key it sets lives (each
    /// manager notes every TTL and `at_least` it sets itself).
    fn window_of(&self, c: usize) -> Duration {
        let at_least = self
            .scenario
            .at_least
            .filter(|&(client, _)| client == self.name(c))
            .map_or(0, |(_, ms)| ms);
        Duration::from_millis(self.scenario.ttl_ms.max(at_least))
    }

    pub(super) fn name(&self, client: usize) -> &'static str {
        self.scenario.clients[client].0
    }

    pub(super) fn intent(&self, client: usize, intent: u8) -> Intent {
        self.scenario.clients[client].1[usize::from(intent)]
    }

    fn keys(&self, client: usize, intent: u8) -> &Keys {
        self.keys[client][usize::from(intent)]
            .as_ref()
            .expect("requests are made for lock intents")
    }

    /// The resources and access of a lock intent.
    pub(super) fn lock_of(
        &self,
        client: usize,
        intent: u8,
    ) -> (&'static [&'static str], Access, How) {
        match self.intent(client, intent) {
            Intent::Lock {
                resources,
                access,
                how,
            } => (resources, access, how),
            Intent::Release(_) | Intent::Write(_) | Intent::Read(_) => {
                panic!("intent {intent} of client {client} takes no lock")
            }
        }
    }

    /// Where resource `r` sits in [`Model::resources`].
    pub(super) fn index_of(&self, r: &str) -> usize {
        self.resources
            .iter()
            .position(|x| *x == r)
            .expect("a known resource")
    }

    pub(super) fn counter_node(&self) -> Option<u8> {
        match self.scenario.fencing {
            Fencing::CounterNode { node } => Some(node as u8),
            Fencing::Off | Fencing::Quorum => None,
        }
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Node {
    pub(super) keys: Store,
    pub(super) process: Process,
    pub(super) up: bool,
}

/// An operation, as the state keeps it (the keys and arguments are built
/// when a node runs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Call {
    /// `counting`: 0 none, 1 the counter node's increment, 2 its read
    /// (or quorum mode's), 3 another node's report of its counter;
    /// `queued`: a waiter's ticket and id.
    Acquire {
        counting: u8,
        queued: Option<(u64, u64)>,
    },
    Extend {
        repair: bool,
    },
    /// `quiet`: the winner leaving the queues (`keep.lua` with no value:
    /// it dequeues and wakes no one).
    Release {
        waiter: Option<u64>,
        quiet: bool,
    },
    /// Quorum-mode fencing's second round: store the token on the node.
    StoreToken {
        token: u64,
    },
    /// The release of an `at_least` lock before its time is up: the keys
    /// stay `keep_ms` more (`keep.lua`).
    Keep {
        waiter: Option<u64>,
        keep_ms: u64,
    },
}

impl Call {
    fn sets_keys(self) -> bool {
        !matches!(self, Call::Release { .. } | Call::Keep { .. })
    }

    /// The library's operation: keys set to live `key_ttl_ms` (the TTL,
    /// or an `at_least` when longer), a waiter's lease and an extension
    /// `ttl_ms` (the lock's TTL).
    fn op(self, key_ttl_ms: u64, ttl_ms: u64) -> Op {
        match self {
            Call::Acquire { counting, queued } => {
                let counting = match counting {
                    1 => Counting::Increment,
                    2 => Counting::Read,
                    3 => Counting::Peek,
                    _ => Counting::Off,
                };
                match (queued, counting) {
                    (Some((ticket, waiter)), counting) => Op::AcquireQueued {
                        ttl_ms: key_ttl_ms,
                        counting,
                        ticket,
                        waiter,
                        lease_ms: crate::wait::plan::waiter_lease(Duration::from_millis(ttl_ms))
                            .as_millis() as u64,
                    },
                    (None, Counting::Off) => Op::Acquire { ttl_ms: key_ttl_ms },
                    (None, Counting::Increment) => Op::AcquireCounted { ttl_ms: key_ttl_ms },
                    (None, Counting::Read) => Op::AcquireReadCounter { ttl_ms: key_ttl_ms },
                    (None, Counting::Peek) => Op::AcquirePeek { ttl_ms: key_ttl_ms },
                }
            }
            Call::Extend { repair } => Op::Extend { ttl_ms, repair },
            Call::Release { waiter, quiet } => Op::Release {
                waiter,
                keep_ms: quiet.then_some(crate::limits::MAX_TTL.as_millis() as u64),
            },
            Call::StoreToken { token } => Op::StoreToken { token },
            Call::Keep { waiter, keep_ms } => Op::Release {
                waiter,
                keep_ms: Some(keep_ms),
            },
        }
    }
}

/// A request in flight on a connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Request {
    pub(super) call: Call,
    /// The lock: the sending client's intent.
    pub(super) intent: u8,
    /// The lock's value; `None` for a waiter's dequeue.
    pub(super) value: Option<ValueId>,
    pub(super) purpose: Purpose,
}

/// One step of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Step {
    /// Time moves on to the next instant: keys expire, rounds past their
    /// deadline time out.
    Time,
    /// Node `node` runs the oldest request in flight from `client`.
    Deliver {
        client: u8,
        node: u8,
    },
    /// The client starts its next intent.
    Begin {
        client: u8,
    },
    /// A retrying or waiting client makes its next attempt.
    Retry {
        client: u8,
    },
    /// The client extends the lock of intent `intent`.
    Extend {
        client: u8,
        intent: u8,
    },
    /// A waiter gives up between attempts (its deadline).
    GiveUp {
        client: u8,
    },
    /// The acquiring future is dropped in the middle of an attempt.
    Drop {
        client: u8,
    },
    /// The client's process dies: it forgets everything.
    Crash {
        client: u8,
    },
    Pause {
        client: u8,
    },
    Resume {
        client: u8,
    },
    /// The client's guard observes the node again.
    Observe {
        client: u8,
        node: u8,
    },
    NodeCrash {
        node: u8,
    },
    NodeRestart {
        node: u8,
        persists: bool,
    },
}

impl Step {
    /// The step in words, with the clients' names.
    pub(super) fn label(self, model: &Model) -> String {
        let name = |c: u8| model.name(usize::from(c));
        match self {
            Step::Time => "time passes".to_owned(),
            Step::Deliver { client, node } => {
                format!("n{node} receives {}'s oldest request", name(client))
            }
            Step::Begin { client } => format!("{} starts its next intent", name(client)),
            Step::Retry { client } => format!("{} tries again", name(client)),
            Step::Extend { client, intent } => {
                format!("{} extends its lock of intent {intent}", name(client))
            }
            Step::GiveUp { client } => format!("{} gives up", name(client)),
            Step::Drop { client } => format!("{}'s future is dropped", name(client)),
            Step::Crash { client } => format!("{} crashes", name(client)),
            Step::Pause { client } => format!("{} pauses", name(client)),
            Step::Resume { client } => format!("{} resumes", name(client)),
            Step::Observe { client, node } => format!("{} observes n{node}", name(client)),
            Step::NodeCrash { node } => format!("n{node} crashes"),
            Step::NodeRestart { node, persists } => format!(
                "n{node} restarts {}",
                if persists {
                    "persisting every write"
                } else {
                    "without persistence"
                }
            ),
        }
    }
}

/// What a step did besides changing the state.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    /// Properties broken by the step itself (token order, an overlong
    /// write, a script error).
    pub(super) flaws: Vec<String>,
    /// What happened, for a trace (only when asked for).
    pub(super) log: Vec<String>,
    /// A waiter was granted its lock.
    pub(super) waiter_won: bool,
    /// Events of note the step reached (see [`Event`]).
    pub(super) reached: Vec<Event>,
}

/// Events a scenario must reach to show its point was explored (a check
/// on states no run gets to proves nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Event {
    /// A lock was granted.
    Granted,
    /// A waiter was granted.
    WaiterGranted,
    /// An extension was decided and won.
    Extended,
    /// An extension reached a node after the keys its lock's acquisition
    /// set there expired (it was sent near the end of the lock).
    ExtensionLandedLate,
    /// A client paused while it held a lock.
    PausedHolding,
    /// The fenced storage refused a write under a stale token.
    FencedOut,
    /// A node came back without the keys it held (it did not persist).
    RestartedEmpty,
    /// An acquiring future was dropped mid-attempt.
    Dropped,
    /// Time passed a round's deadline (or moved on after it closed) with
    /// an acquire or extension of it still in flight: it lands after the
    /// round timed out on its node.
    LandedAfterDeadline,
    /// The deadlock check judged waiters as they stand when a quarantine
    /// ends.
    JudgedAfterQuarantine,
    /// An `at_least` lock was released before its time: its keys kept.
    KeptAtLeast,
    /// Another client was granted a resource once an `at_least` lock's
    /// time on it was up.
    GrantedAfterAtLeast,
    /// A counter-node round won without the counter node's grant: its
    /// token was stored on the others.
    GrantedWithoutCounterNode,
    /// The counter node granted, but its token could not count alone (a
    /// higher counter elsewhere, or its clock ahead): stored on the others.
    CounterNodeTokenStored,
}

/// The whole model state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct World {
    /// Model time: ms since `EPOCH_MS`.
    pub(super) ms: u32,
    pub(super) nodes: Vec<Node>,
    /// In flight from client `c` to node `n`: `links[c * nodes + n]`.
    pub(super) links: Vec<VecDeque<Request>>,
    pub(super) clients: Vec<Client>,
    /// Per resource (in `Model::resources`), the last writer's token.
    pub(super) tokens: Vec<u64>,
    /// The fenced storage (`FencedRedis`'s server: always up).
    pub(super) storage: Store,
    /// Per resource, the highest token the storage accepted a write under
    /// or read under (kept here, apart from the storage's own record).
    pub(super) accepted: Vec<u64>,
    /// Per resource, the `at_least` lock granted last: its client, and
    /// the time before which no one else may be granted the resource.
    pub(super) kept: Vec<Option<(u8, i64)>>,
    pub(super) left: Budget,
    /// Waits begun so far: their order of arrival within a tick.
    pub(super) arrivals: u8,
}

/// A step being applied: the model, and what it found.
struct Cx<'a> {
    model: &'a Model,
    out: Outcome,
    trace: bool,
}

impl Cx<'_> {
    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.trace {
            self.out.log.push(line());
        }
    }
}

impl World {
    /// Nodes up for a while with their data-set mark, every client
    /// connected to every node (and its guard's first look at it).
    pub(super) fn initial(model: &Model) -> Self {
        let s = &model.scenario;
        let started_ms = EPOCH_MS - NODES_UP_FOR_MS;
        let nodes = (0..s.nodes)
            .map(|_| {
                let process = Process {
                    run: 1,
                    started_ms,
                    persists: s.persist_at_start,
                };
                let mark = format!("init {} {started_ms}", process.run_id());
                let set = ["SET", crate::guard::judge::DATA_SET_KEY, &mark].map(str::to_owned);
                let mut keys = Store::new(Keyspace::default());
                model
                    .host
                    .borrow_mut()
                    .run(&mut keys, process, started_ms, 0, || {
                        Invocation::Command(set.to_vec())
                    });
                Node {
                    keys,
                    process,
                    up: true,
                }
            })
            .collect();
        let mut world = Self {
            ms: 0,
            nodes,
            links: vec![VecDeque::new(); s.clients.len() * s.nodes],
            clients: vec![Client::new(s.nodes); s.clients.len()],
            tokens: vec![0; model.resources.len()],
            storage: Store::new(Keyspace::default()),
            accepted: vec![0; model.resources.len()],
            kept: vec![None; model.resources.len()],
            left: s.budget,
            arrivals: 0,
        };
        let mut cx = Cx {
            model,
            out: Outcome::default(),
            trace: false,
        };
        for c in 0..s.clients.len() {
            if !s.late.contains(&model.name(c)) {
                for n in 0..s.nodes {
                    world.connect(&mut cx, c, n);
                }
            }
        }
        world
    }

    pub(super) fn now_ms(&self) -> i64 {
        EPOCH_MS + i64::from(self.ms)
    }

    /// This world at `end_ms`, the end of every quarantine, with nothing
    /// else done: keys expire; no one gives up, retries or extends (for
    /// the deadlock check, which then takes its own steps).
    pub(super) fn after_quarantines(&self, end_ms: i64) -> World {
        let mut later = self.clone();
        later.ms =
            u32::try_from(end_ms - EPOCH_MS).expect("a quarantine ends within the model's time");
        for node in &mut later.nodes {
            node.keys.expire(end_ms);
        }
        later
    }

    /// Whole ticks passed.
    pub(super) fn tick(&self) -> u8 {
        (i64::from(self.ms) / TICK_MS) as u8
    }

    /// Model time in seconds, for traces.
    pub(super) fn seconds(&self) -> String {
        format!("{:.3}", f64::from(self.ms) / 1000.0)
    }

    /// The next instant at which something changes by itself: the next
    /// whole tick or, before it, a key's expiry (Redis drops a key once
    /// its time is past: at `at + 1`; a key kept for the queue holds its
    /// holder until its own expiry, likewise) or, while extensions are left, the
    /// last instant a lock is valid (an extension sent then can land after
    /// its keys expired). So a key that dies before its holder stops
    /// believing in it, by any amount, opens a state where both hold.
    fn next_instant(&self) -> i64 {
        let now = self.now_ms();
        let mut next = EPOCH_MS + (i64::from(self.tick()) + 1) * TICK_MS;
        for node in self.nodes.iter().filter(|n| n.up) {
            for (_, entry) in node.keys.keys().iter() {
                if let Some(at) = entry.expires_at
                    && at + 1 > now
                {
                    next = next.min(at + 1);
                }
                // A key kept for the queue: its holder's own expiry, after
                // "\0" (see holders.lua), is as much an expiry.
                if let Data::Str(text) = &entry.data
                    && let Some((_, due)) = text.split_once('\0')
                    && let Ok(due) = due.parse::<i64>()
                    && due + 1 > now
                {
                    next = next.min(due + 1);
                }
            }
        }
        if self.left.extends > 0 {
            for client in self.clients.iter().filter(|c| !c.crashed) {
                for hold in client.holds.iter().filter(|h| h.extending.is_none()) {
                    let last = hold.valid_until() - 1;
                    if last > now {
                        next = next.min(last);
                    }
                }
            }
        }
        next
    }

    /// Whether time may move on to `next` with the requests in flight:
    /// each must belong to a round still open then (its deadline is
    /// `NODE_TIMEOUT_MS` after it began), unless requests may be slow.
    fn may_pass_to(&self, next: i64, slow: bool) -> bool {
        slow || self.in_flight_at(next).all(|late| late == Some(false))
    }

    /// For each request in flight, if time moved on to `next`: whether it
    /// would land after its round timed out (its round is closed, or its
    /// deadline passed); `None` for cleanup, which has no round.
    fn in_flight_at(&self, next: i64) -> impl Iterator<Item = Option<bool>> + '_ {
        let nodes = self.nodes.len();
        self.links.iter().enumerate().flat_map(move |(i, link)| {
            let client = &self.clients[i / nodes];
            link.iter().map(move |request| {
                let started = match request.purpose {
                    Purpose::Attempt { seq } => match &client.act {
                        Act::Attempt(a) if a.round.seq == seq => a.round.started_ms,
                        _ => return Some(true),
                    },
                    Purpose::Extend { intent, seq } => {
                        match client.holds.iter().find(|h| h.intent == intent) {
                            Some(Hold {
                                extending: Some(round),
                                ..
                            }) if round.seq == seq => round.started_ms,
                            _ => return Some(true),
                        }
                    }
                    Purpose::Cleanup => return None,
                };
                Some(next > started + NODE_TIMEOUT_MS)
            })
        })
    }

    fn link(&mut self, client: usize, node: usize) -> &mut VecDeque<Request> {
        let n = self.nodes.len();
        &mut self.links[client * n + node]
    }

    pub(super) fn in_flight(&self) -> bool {
        self.links.iter().any(|link| !link.is_empty())
    }

    /// Client `c`'s guard on node `n` now.
    pub(super) fn verdict(&self, c: usize, n: usize) -> Verdict {
        self.clients[c].guards[n].verdict(self.now_ms())
    }

    /// The steps possible now.
    pub(super) fn steps(&self, model: &Model) -> Vec<Step> {
        let s = &model.scenario;
        let mut steps = Vec::new();
        let next = self.next_instant();
        if next <= EPOCH_MS + i64::from(s.max_ticks) * TICK_MS
            && self.may_pass_to(next, s.slow_requests)
        {
            steps.push(Step::Time);
        }
        for (n, node) in self.nodes.iter().enumerate() {
            let node_id = n as u8;
            if node.up && self.left.node_crashes > 0 {
                steps.push(Step::NodeCrash { node: node_id });
            }
            if !node.up {
                for &persists in s.restarts_persist {
                    steps.push(Step::NodeRestart {
                        node: node_id,
                        persists,
                    });
                }
            }
        }
        for c in 0..self.clients.len() {
            for n in 0..self.nodes.len() {
                if self.nodes[n].up && !self.links[c * self.nodes.len() + n].is_empty() {
                    steps.push(Step::Deliver {
                        client: c as u8,
                        node: n as u8,
                    });
                }
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            let id = c as u8;
            if client.crashed {
                continue;
            }
            if client.paused {
                steps.push(Step::Resume { client: id });
                continue;
            }
            let program = &s.clients[c].1;
            match &client.act {
                Act::Idle if usize::from(client.pc) < program.len() => {
                    steps.push(Step::Begin { client: id });
                }
                Act::Sleep(sleep)
                    if (client.rung_by & sleep.news_from != 0
                        || (sleep.any_ring && client.rung_by != 0)
                        || self.tick() >= sleep.wake_tick)
                        && client.attempts < s.max_attempts =>
                {
                    steps.push(Step::Retry { client: id });
                }
                _ => {}
            }
            if let Act::Sleep(Sleep { wait: Some(_), .. }) = client.act
                && self.left.give_ups > 0
            {
                steps.push(Step::GiveUp { client: id });
            }
            if matches!(client.act, Act::Attempt(_)) && self.left.drops > 0 {
                steps.push(Step::Drop { client: id });
            }
            if self.left.extends > 0 {
                for hold in &client.holds {
                    if hold.extending.is_none() && hold.is_valid(self.now_ms()) {
                        steps.push(Step::Extend {
                            client: id,
                            intent: hold.intent,
                        });
                    }
                }
            }
            let busy = !client.holds.is_empty() || client.act != Act::Idle;
            if busy && self.left.client_crashes > 0 {
                steps.push(Step::Crash { client: id });
            }
            if busy && self.left.pauses > 0 {
                steps.push(Step::Pause { client: id });
            }
            if self.left.observes > 0 {
                for (n, node) in self.nodes.iter().enumerate() {
                    if node.up {
                        steps.push(Step::Observe {
                            client: id,
                            node: n as u8,
                        });
                    }
                }
            }
        }
        steps
    }

    /// Applies `step` (which must be possible now); with `trace`, the
    /// outcome says what happened in words.
    pub(super) fn apply(&mut self, step: Step, model: &Model, trace: bool) -> Outcome {
        let mut cx = Cx {
            model,
            out: Outcome::default(),
            trace,
        };
        let now = self.now_ms();
        match step {
            Step::Time => {
                let next = self.next_instant();
                if self.in_flight_at(next).any(|late| late == Some(true)) {
                    cx.out.reached.push(Event::LandedAfterDeadline);
                }
                self.ms = (next - EPOCH_MS) as u32;
                let now = self.now_ms();
                cx.log(|| format!("time passes: t={}", self.seconds()));
                for node in &mut self.nodes {
                    node.keys.expire(now);
                }
                for c in 0..self.clients.len() {
                    if !self.clients[c].paused && !self.clients[c].crashed {
                        self.time_out_rounds(&mut cx, c);
                    }
                }
            }
            Step::Deliver { client, node } => {
                self.deliver(&mut cx, usize::from(client), usize::from(node))
            }
            Step::Begin { client } => self.begin(&mut cx, usize::from(client)),
            Step::Retry { client } => {
                let c = usize::from(client);
                let Act::Sleep(sleep) = std::mem::replace(&mut self.clients[c].act, Act::Idle)
                else {
                    panic!("retry of a client that is not between attempts");
                };
                // Neither news nor its timer: an echo set it off. After a
                // renewal or a poll, only news counts (`wait_loop`).
                self.clients[c].echo_spent = if self.tick() < sleep.wake_tick {
                    self.clients[c].rung_by & sleep.news_from == 0
                } else {
                    sleep.renewal
                };
                self.clients[c].rung_by = 0;
                cx.log(|| {
                    format!(
                        "{} tries again (attempt {})",
                        model.name(c),
                        sleep.tries + 1
                    )
                });
                self.start_attempt(&mut cx, c, sleep.intent, sleep.wait, sleep.tries + 1);
            }
            Step::Extend { client, intent } => self.extend(&mut cx, usize::from(client), intent),
            Step::GiveUp { client } => {
                self.left.give_ups -= 1;
                let c = usize::from(client);
                let Act::Sleep(sleep) = std::mem::replace(&mut self.clients[c].act, Act::Idle)
                else {
                    panic!("a client gives up only between attempts");
                };
                cx.log(|| format!("{} gives up waiting", model.name(c)));
                self.clients[c].rung_by = 0;
                self.clients[c].echo_spent = false;
                if let Some(wait) = sleep.wait {
                    self.dequeue(&mut cx, c, sleep.intent, wait, &[]);
                }
            }
            Step::Drop { client } => {
                self.left.drops -= 1;
                let c = usize::from(client);
                let Act::Attempt(attempt) = std::mem::replace(&mut self.clients[c].act, Act::Idle)
                else {
                    panic!("only an attempt in flight is dropped");
                };
                cx.out.reached.push(Event::Dropped);
                cx.log(|| {
                    format!(
                        "{}'s acquiring future is dropped mid-attempt",
                        model.name(c)
                    )
                });
                self.clients[c].rung_by = 0;
                self.clients[c].echo_spent = false;
                self.roll_back(&mut cx, c, &attempt);
                if let Some(wait) = attempt.wait {
                    self.dequeue(&mut cx, c, attempt.intent, wait, &attempt.round.trail);
                }
            }
            Step::Crash { client } => {
                self.left.client_crashes -= 1;
                let c = usize::from(client);
                cx.log(|| format!("{} crashes: it forgets its locks and waits", model.name(c)));
                let client = &mut self.clients[c];
                client.crashed = true;
                client.paused = false;
                client.holds.clear();
                client.act = Act::Idle;
                client.inbox.clear();
            }
            Step::Pause { client } => {
                self.left.pauses -= 1;
                let c = usize::from(client);
                if !self.clients[c].holds.is_empty() {
                    cx.out.reached.push(Event::PausedHolding);
                }
                cx.log(|| format!("{} pauses", model.name(c)));
                self.clients[c].paused = true;
            }
            Step::Resume { client } => {
                let c = usize::from(client);
                cx.log(|| format!("{} resumes", model.name(c)));
                self.clients[c].paused = false;
                for (node, request, reply) in std::mem::take(&mut self.clients[c].inbox) {
                    self.answer(&mut cx, c, usize::from(node), &request, &reply);
                }
                self.time_out_rounds(&mut cx, c);
            }
            Step::Observe { client, node } => {
                self.left.observes -= 1;
                let (c, n) = (usize::from(client), usize::from(node));
                self.observe(&mut cx, c, n);
            }
            Step::NodeCrash { node } => {
                self.left.node_crashes -= 1;
                let n = usize::from(node);
                let persists = self.nodes[n].process.persists;
                cx.log(|| {
                    format!(
                        "n{n} crashes ({})",
                        if persists {
                            "its data is on disk"
                        } else {
                            "its data is lost"
                        }
                    )
                });
                self.nodes[n].up = false;
                if !persists {
                    self.nodes[n].keys = Store::new(Keyspace::default());
                }
                // Connections break: what was in flight fails.
                for c in 0..self.clients.len() {
                    for request in std::mem::take(self.link(c, n)) {
                        let lost = Reply::Error(Text::from("connection lost"));
                        self.route(&mut cx, c, n, request, lost);
                    }
                }
            }
            Step::NodeRestart { node, persists } => {
                let n = usize::from(node);
                let run = self.nodes[n].process.run + 1;
                self.nodes[n].process = Process {
                    run,
                    started_ms: now,
                    persists,
                };
                self.nodes[n].up = true;
                // The crash lost everything, the data-set mark included.
                if self.nodes[n].keys.keys().iter().next().is_none() {
                    cx.out.reached.push(Event::RestartedEmpty);
                }
                cx.log(|| {
                    format!(
                        "n{n} restarts ({}; {} keys)",
                        if persists {
                            "appendonly yes, appendfsync always"
                        } else {
                            "no persistence"
                        },
                        self.nodes[n].keys.keys().iter().count()
                    )
                });
                // Each manager's subscription reconnects and rings its
                // waiters, as if from every node (a notice may be lost).
                let every_node = ((1u16 << self.nodes.len()) - 1) as u8;
                for client in &mut self.clients {
                    if client.is_waiting() {
                        client.rung_by = every_node;
                    }
                }
            }
        }
        cx.out
    }

    /// Connects client `c` to node `n` if its connection is not to the
    /// node's current process: a new connection observes the node first.
    fn connect(&mut self, cx: &mut Cx<'_>, c: usize, n: usize) {
        if self.clients[c].conns[n] != Some(self.nodes[n].process.run) {
            self.observe(cx, c, n);
        }
    }

    /// Client `c`'s guard observes node `n` (`observe.lua`).
    fn observe(&mut self, cx: &mut Cx<'_>, c: usize, n: usize) {
        let now = self.now_ms();
        let node = &mut self.nodes[n];
        let mark_id = format!("c{c}r{}", node.process.run);
        let call = digest(&("observe", &mark_id));
        let (reply, _) =
            cx.model
                .host
                .borrow_mut()
                .run(&mut node.keys, node.process, now, call, || {
                    wire::observation(&mark_id, cx.model.scripts_of(n))
                });
        let fsync = if node.process.persists {
            "always"
        } else {
            "everysec"
        };
        let run = node.process.run;
        let client = &mut self.clients[c];
        client.conns[n] = Some(run);
        Arc::make_mut(&mut client.guards)[n].observed(
            Observation::new(now, reply, fsync),
            cx.model.scenario.rule,
            cx.model.window_of(c),
        );
        let verdict = self.verdict(c, n);
        cx.log(|| {
            format!(
                "{} observes n{n} (process {run}){}",
                cx.model.name(c),
                if verdict.quarantined {
                    ": quarantined"
                } else {
                    ": counted"
                }
            )
        });
    }

    /// Sends `request` to node `n` for client `c`, unless the guard keeps
    /// keys off the node or it is down: then the vote is a failure.
    /// Records where it went in `trail`.
    fn send(
        &mut self,
        cx: &mut Cx<'_>,
        c: usize,
        n: usize,
        request: Request,
        trail: Option<&mut NodeTrail>,
    ) -> Option<Ballot> {
        if request.call.sets_keys() && self.verdict(c, n).quarantined {
            return Some(Ballot::Failed);
        }
        if !self.nodes[n].up || cx.model.cut_off(c, n) {
            return Some(Ballot::Failed);
        }
        self.connect(cx, c, n);
        if let Some(trail) = trail {
            trail.sent = Some(self.verdict(c, n).epoch);
        }
        self.link(c, n).push_back(request);
        None
    }

    /// Sends a cleanup (rollback, release, dequeue) where it is needed.
    fn clean_up(
        &mut self,
        cx: &mut Cx<'_>,
        c: usize,
        intent: u8,
        value: Option<ValueId>,
        call: Call,
        nodes: impl Iterator<Item = usize>,
    ) {
        for n in nodes.collect::<Vec<_>>() {
            let request = Request {
                call,
                intent,
                value,
                purpose: Purpose::Cleanup,
            };
            self.send(cx, c, n, request, None);
        }
    }

    fn begin(&mut self, cx: &mut Cx<'_>, c: usize) {
        let intent = self.clients[c].pc;
        self.clients[c].pc += 1;
        match cx.model.intent(c, intent) {
            Intent::Lock {
                resources,
                access,
                how,
            } => {
                let now = self.now_ms();
                if how == How::Wait {
                    self.arrivals += 1;
                }
                let arrival = u64::from(self.arrivals);
                let wait = (how == How::Wait).then(|| {
                    let client = &mut self.clients[c];
                    client.waits += 1;
                    Wait {
                        // The wall clock in µs when the wait began: steps in
                        // one tick are microseconds apart, in their order.
                        ticket: (now * 1000) as u64 + arrival,
                        waiter: (c as u64 + 1) * 100 + u64::from(client.waits),
                        reached: 0,
                    }
                });
                cx.log(|| {
                    format!(
                        "{} asks for {:?} ({}, {})",
                        cx.model.name(c),
                        resources,
                        if access == Access::Exclusive {
                            "exclusive"
                        } else {
                            "read"
                        },
                        match how {
                            How::Once => "one attempt".to_owned(),
                            How::Retry(n) => format!("up to {n} attempts"),
                            How::Wait => format!("waiting as w{}", wait.map_or(0, |w| w.waiter)),
                        }
                    )
                });
                self.start_attempt(cx, c, intent, wait, 1);
            }
            Intent::Write(of) => self.use_storage(cx, c, of, StorageUse::Write),
            Intent::Read(of) => self.use_storage(cx, c, of, StorageUse::Read),
            Intent::Release(of) => {
                let Some(at) = self.clients[c].holds.iter().position(|h| h.intent == of) else {
                    cx.log(|| {
                        format!("{} has no lock of intent {of} to release", cx.model.name(c))
                    });
                    return;
                };
                let hold = self.clients[c].holds.remove(at);
                cx.log(|| {
                    format!(
                        "{} releases {} (its lock of intent {of})",
                        cx.model.name(c),
                        hold.value.text()
                    )
                });
                let nodes: Vec<usize> = (0..self.nodes.len())
                    .filter(|&n| cleanup_on(&hold.trail, n, hold.waiter.is_some()))
                    .collect();
                let now = self.now_ms();
                let call = match hold.keep_until_ms {
                    Some(until) if until > now => {
                        cx.out.reached.push(Event::KeptAtLeast);
                        Call::Keep {
                            waiter: hold.waiter,
                            keep_ms: (until - now) as u64,
                        }
                    }
                    _ => release(hold.waiter),
                };
                self.clean_up(cx, c, of, Some(hold.value), call, nodes.into_iter());
            }
        }
    }

    /// Client `c` writes to (or reads from) the fenced storage under the
    /// token of its lock of intent `of`, on each of the lock's resources.
    /// Both claim the token; the storage letting anyone in under a token
    /// below one it let in before is a stale write (or read).
    fn use_storage(&mut self, cx: &mut Cx<'_>, c: usize, of: u8, use_: StorageUse) {
        let model = cx.model;
        let verb = match use_ {
            StorageUse::Write => "write",
            StorageUse::Read => "read",
        };
        let Some(hold) = self.clients[c].holds.iter().find(|h| h.intent == of) else {
            cx.log(|| {
                format!(
                    "{} has no lock of intent {of} to {verb} under",
                    model.name(c)
                )
            });
            return;
        };
        let (Some(token), value) = (hold.token, hold.value) else {
            cx.log(|| format!("{}'s lock of intent {of} has no token", model.name(c)));
            return;
        };
        let (resources, _, _) = model.lock_of(c, of);
        let now = self.now_ms();
        for &r in resources {
            let data_key = format!("data:{r}");
            let call = digest(&("fenced", verb, r, token, value));
            let scripts = &model.scenario.scripts;
            let (reply, _) =
                model
                    .host
                    .borrow_mut()
                    .run(
                        &mut self.storage,
                        Process::STORAGE,
                        now,
                        call,
                        || match use_ {
                            StorageUse::Write => {
                                wire::fenced_write(r, &data_key, token, &value.text(), scripts)
                            }
                            StorageUse::Read => wire::fenced_read(r, &data_key, token, scripts),
                        },
                    );
            let let_in =
                matches!(&reply, Reply::Array(items) if items.first() == Some(&Reply::Int(1)));
            cx.log(|| {
                format!(
                    "{} {verb}s {r} under token {token} → {reply}{}",
                    model.name(c),
                    if let_in { "" } else { " (fenced out)" }
                )
            });
            if let Reply::Error(error) = &reply {
                cx.out.flaws.push(format!(
                    "the storage failed {}'s {verb}: {error}",
                    model.name(c)
                ));
            }
            let i = model.index_of(r);
            if !let_in {
                cx.out.reached.push(Event::FencedOut);
                continue;
            }
            if token < self.accepted[i] {
                cx.out.flaws.push(format!(
                    "stale {verb}: the storage let {} {verb} {r} under token {token}, after \
                     it let someone in under {}",
                    model.name(c),
                    self.accepted[i]
                ));
            }
            self.accepted[i] = self.accepted[i].max(token);
        }
    }

    fn start_attempt(
        &mut self,
        cx: &mut Cx<'_>,
        c: usize,
        intent: u8,
        wait: Option<Wait>,
        tries: u8,
    ) {
        let model = cx.model;
        let (_, access, _) = model.lock_of(c, intent);
        let now = self.now_ms();
        let client = &mut self.clients[c];
        client.attempts += 1;
        let value = client.new_value(c as u8);
        let seq = client.new_round();
        let counter = model.counter_node();
        let mut round = Round::new(seq, now, self.nodes.len(), counter);
        // A wait's first attempt at a lone exclusive resource is plain
        // (`wait_loop`): it queues nowhere.
        let queued = wait
            .filter(|_| !(tries == 1 && model.keys(c, intent).simple().is_some()))
            .map(|w| (w.ticket, w.waiter));
        let quorum_fencing = model.scenario.fencing == Fencing::Quorum;
        for n in 0..self.nodes.len() {
            let counting = match (counter == Some(n as u8), access) {
                // Every node reads its counter (`Fencing::Quorum`).
                _ if quorum_fencing => 2,
                (false, _) if counter.is_some() => 3,
                (false, _) => 0,
                (true, Access::Exclusive) => 1,
                (true, Access::Shared) => 2,
            };
            let request = Request {
                call: Call::Acquire { counting, queued },
                intent,
                value: Some(value),
                purpose: Purpose::Attempt { seq },
            };
            let mut trail = round.trail[n];
            if let Some(ballot) = self.send(cx, c, n, request, Some(&mut trail)) {
                round.votes[n] = Some(ballot);
            }
            round.trail[n] = trail;
        }
        self.clients[c].act = Act::Attempt(Attempt {
            intent,
            value,
            round,
            wait,
            tries,
            storing: None,
        });
        self.settle_attempt(cx, c);
    }

    /// A token's second round for `attempt`, whose first round won:
    /// `token` is stored on every node but `skip` (`Engine::store_token`:
    /// quorum-mode fencing, and counter-node fencing without the counter
    /// node's token, which skips that node where it did not grant). The attempt's trail stays the
    /// first round's: only that one set keys.
    fn store_token(
        &mut self,
        cx: &mut Cx<'_>,
        c: usize,
        attempt: Attempt,
        token: u64,
        skip: Option<usize>,
    ) {
        let now = self.now_ms();
        let seq = self.clients[c].new_round();
        let mut round = Round::new(seq, now, self.nodes.len(), None);
        round.trail = attempt.round.trail;
        for n in 0..self.nodes.len() {
            if Some(n) == skip {
                // Not asked: it cannot store, whatever happens.
                round.votes[n] = Some(Ballot::Failed);
                continue;
            }
            let request = Request {
                call: Call::StoreToken { token },
                intent: attempt.intent,
                value: Some(attempt.value),
                purpose: Purpose::Attempt { seq },
            };
            if let Some(ballot) = self.send(cx, c, n, request, None) {
                round.votes[n] = Some(ballot);
            }
        }
        cx.log(|| {
            format!(
                "{} stores token {token} for {}",
                cx.model.name(c),
                attempt.value.text()
            )
        });
        self.clients[c].act = Act::Attempt(Attempt {
            round,
            storing: Some(Storing {
                token,
                began_ms: attempt.round.started_ms,
                first_seq: attempt.round.seq,
            }),
            ..attempt
        });
        self.settle_attempt(cx, c);
    }

    /// Node `n` runs client `c`'s oldest request in flight to it.
    fn deliver(&mut self, cx: &mut Cx<'_>, c: usize, n: usize) {
        let request = self.link(c, n).pop_front().expect("a request is in flight");
        let model = cx.model;
        if let Purpose::Extend { intent, .. } = request.purpose
            && self.clients[c].holds.iter().any(|h| {
                h.intent == intent && self.now_ms() > h.acquired_ms + model.scenario.ttl_ms as i64
            })
        {
            cx.out.reached.push(Event::ExtensionLandedLate);
        }
        let keys = model.keys(c, request.intent);
        let value = request.value.map_or(String::new(), ValueId::text);
        let op = request
            .call
            .op(model.key_ttl_ms(c, request.intent), model.scenario.ttl_ms);
        // The counter node's scripts may differ (its clock ahead): a reply
        // memoized on another node is not its reply.
        let counter_node = model.counter_node() == Some(n as u8);
        let call = digest(&(c, request.intent, request.value, request.call, counter_node));
        let now = self.now_ms();
        // A call that does not wait has every live waiter ahead of it: it
        // passes none (queue.lua's `waiter_ahead`; a plain SET NX meets the
        // key the queue keeps).
        let ahead = match request.call {
            Call::Acquire { queued, .. } => {
                let (ticket, waiter) = queued.unwrap_or((u64::MAX, 0));
                waiters_ahead(self.nodes[n].keys.keys(), keys, now, ticket, waiter)
            }
            _ => Vec::new(),
        };
        let node = &mut self.nodes[n];
        let (reply, effects) =
            model
                .host
                .borrow_mut()
                .run(&mut node.keys, node.process, now, call, || {
                    wire::invocation(op, keys, &value, model.scripts_of(n))
                });
        if !ahead.is_empty()
            && matches!(
                wire::answer(op, &reply),
                Ok(Answer::Yes | Answer::YesWith(_) | Answer::YesInLine(_))
            )
        {
            cx.out.flaws.push(format!(
                "out of turn: n{n} granted {}'s {} {} while {} waited there{}",
                model.name(c),
                if matches!(request.call, Call::Acquire { queued: None, .. }) {
                    "unqueued"
                } else {
                    "waiting"
                },
                keys.label(),
                ahead.join(", "),
                if matches!(request.call, Call::Acquire { queued: None, .. }) {
                    ""
                } else {
                    " with an earlier ticket"
                }
            ));
        }
        cx.log(|| {
            format!(
                "n{n} runs {}'s {} → {reply}    n{n}: {}",
                model.name(c),
                describe_call(request.call, keys, &value),
                describe_keys(self.nodes[n].keys.keys(), now)
            )
        });
        if let Reply::Error(error) = &reply {
            cx.out.flaws.push(format!(
                "n{n} failed {}'s {}: {error}",
                model.name(c),
                describe_call(request.call, keys, &value)
            ));
        }
        cx.out.flaws.extend(effects.overlong.iter().cloned());
        for (channel, message) in &effects.published {
            self.ring(cx, n, channel, message);
        }
        self.route(cx, c, n, request, reply);
    }

    /// A release on node `n` named waiter `message` on `channel`: its
    /// manager rings it.
    fn ring(&mut self, cx: &mut Cx<'_>, n: usize, channel: &str, message: &str) {
        for c in 0..self.clients.len() {
            let client = &self.clients[c];
            let Some(wait) = client.wait() else { continue };
            if client.crashed || wait.waiter.to_string() != message {
                continue;
            }
            let intent = match &client.act {
                Act::Attempt(a) => a.intent,
                Act::Sleep(s) => s.intent,
                Act::Idle => continue,
            };
            let (resources, _, _) = cx.model.lock_of(c, intent);
            if resources
                .iter()
                .any(|r| channel == crate::keys::wake_channel(r))
            {
                cx.log(|| format!("{} is rung on {channel} by n{n}", cx.model.name(c)));
                self.clients[c].rung_by |= 1 << n;
            }
        }
    }

    /// The answer to `request` reaches client `c` (read now, or when it
    /// resumes).
    fn route(&mut self, cx: &mut Cx<'_>, c: usize, n: usize, request: Request, reply: Reply) {
        let client = &mut self.clients[c];
        if client.crashed || request.purpose == Purpose::Cleanup {
            return;
        }
        if client.paused {
            client.inbox.push((n as u8, request, reply));
            return;
        }
        self.answer(cx, c, n, &request, &reply);
    }

    /// How client `c` counts node `n`'s `reply` to `call`: a node the guard
    /// quarantines by now is a failure, whatever it answered.
    fn ballot(
        &self,
        ttl_ms: u64,
        c: usize,
        n: usize,
        call: Call,
        reply: &Reply,
    ) -> (Ballot, Option<Answer>) {
        if call.sets_keys() && self.verdict(c, n).quarantined {
            return (Ballot::Failed, None);
        }
        match wire::answer(call.op(ttl_ms, ttl_ms), reply) {
            Ok(
                answer @ (Answer::Yes
                | Answer::YesWith(_)
                | Answer::YesInLine(_)
                | Answer::Restored),
            ) => (Ballot::Granted, Some(answer)),
            Ok(answer @ (Answer::No | Answer::Waiting { .. })) => (Ballot::Refused, Some(answer)),
            Err(_) => (Ballot::Failed, None),
        }
    }

    /// Client `c` reads node `n`'s `reply` to `request`.
    fn answer(&mut self, cx: &mut Cx<'_>, c: usize, n: usize, request: &Request, reply: &Reply) {
        let (ballot, answer) = self.ballot(cx.model.scenario.ttl_ms, c, n, request.call, reply);
        let client = &mut self.clients[c];
        match request.purpose {
            Purpose::Cleanup => {}
            Purpose::Attempt { seq } => {
                if let Act::Attempt(attempt) = &mut client.act
                    && attempt.round.seq == seq
                    && attempt.round.votes[n].is_none()
                {
                    let trail = attempt.round.trail[n];
                    record(&mut attempt.round, n, ballot, answer);
                    if attempt.storing.is_some() {
                        // The token's round sets no key: a refusal there
                        // says nothing of where the first round's keys are
                        // (the library cleans up by the first round's trail).
                        attempt.round.trail[n] = trail;
                    }
                    self.settle_attempt(cx, c);
                } else if let Act::Attempt(attempt) = &mut client.act
                    && attempt.storing.is_some_and(|s| s.first_seq == seq)
                {
                    // A late answer to the first round of a quorum-mode
                    // attempt now storing its token.
                    if matches!(answer, Some(Answer::No | Answer::Waiting { .. })) {
                        attempt.round.trail[n].refused = true;
                    }
                } else if let Some(hold) = client.holds.iter_mut().find(|h| h.round_seq == seq)
                    && matches!(answer, Some(Answer::No | Answer::Waiting { .. }))
                {
                    // A late answer to the round that won: a refusal means
                    // the node holds nothing of it (`Trail::set_refused`).
                    hold.trail[n].refused = true;
                }
            }
            Purpose::Extend { intent, seq } => {
                let Some(at) = client.holds.iter().position(|h| {
                    h.intent == intent
                        && h.extending
                            .as_ref()
                            .is_some_and(|r| r.seq == seq && r.votes[n].is_none())
                }) else {
                    return;
                };
                if let Some(round) = &mut client.holds[at].extending {
                    record(round, n, ballot, answer);
                }
                self.settle_extend(cx, c, at);
            }
        }
    }

    /// Ends client `c`'s attempt if its round is decided.
    fn settle_attempt(&mut self, cx: &mut Cx<'_>, c: usize) {
        let decision = match &self.clients[c].act {
            Act::Attempt(attempt) => attempt.round.decision(),
            _ => return,
        };
        if decision == Decision::Pending {
            return;
        }
        let Act::Attempt(attempt) = std::mem::replace(&mut self.clients[c].act, Act::Idle) else {
            return;
        };
        let model = cx.model;
        let now = self.now_ms();
        let ttl = model.ttl();
        let (resources, access, how) = model.lock_of(c, attempt.intent);
        // Validity counts from the first round's start (both rounds, in
        // quorum-mode fencing).
        let began_ms = attempt
            .storing
            .map_or(attempt.round.started_ms, |s| s.began_ms);
        let elapsed = Duration::from_millis((now - began_ms) as u64);
        let validity = quorum::validity(
            ttl,
            elapsed,
            quorum::drift(ttl, crate::DEFAULT_DRIFT_FACTOR),
        );
        let won = decision == Decision::Won && quorum::is_usable(validity, Duration::ZERO);
        if won
            && model.scenario.fencing == Fencing::Quorum
            && access == Access::Exclusive
            && attempt.storing.is_none()
        {
            let counters = attempt.round.numbers[..self.nodes.len()].iter().flatten();
            let token = crate::fencing::quorum_token(counters.copied()).get();
            self.store_token(cx, c, attempt, token, None);
            return;
        }
        // Counter-node fencing: the counter node's token as it is, or one
        // to store on the others first.
        let mut counted = None;
        if won
            && attempt.storing.is_none()
            && let Some(counter) = model.counter_node()
        {
            match self.counter_token(model, &attempt.round, access, counter) {
                CounterToken::Use(token) => counted = Some(token.get()),
                CounterToken::Store(token) => {
                    // The counter node takes it too where it granted.
                    let granted = attempt.round.number_from(counter).is_some();
                    cx.out.reached.push(if granted {
                        Event::CounterNodeTokenStored
                    } else {
                        Event::GrantedWithoutCounterNode
                    });
                    let skip = (!granted).then_some(usize::from(counter));
                    self.store_token(cx, c, attempt, token.get(), skip);
                    return;
                }
            }
        }
        if won {
            let token = match (model.scenario.fencing, attempt.storing) {
                (_, Some(storing)) => Some(storing.token),
                (Fencing::CounterNode { .. }, None) => counted,
                // A reader is given the highest counter of its quorum.
                (Fencing::Quorum, None) => attempt.round.numbers[..self.nodes.len()]
                    .iter()
                    .flatten()
                    .max()
                    .copied()
                    .or(Some(0)),
                (Fencing::Off, None) => None,
            };
            let valid_until_ms = now + validity.as_millis() as i64;
            cx.log(|| {
                format!(
                    "{} is granted {:?} as {}{}, valid until t={:.3}",
                    model.name(c),
                    resources,
                    attempt.value.text(),
                    token.map_or(String::new(), |t| format!(" with token {t}")),
                    (valid_until_ms - EPOCH_MS) as f64 / 1000.0
                )
            });
            if access == Access::Exclusive
                && let Some(token) = token
            {
                for r in resources {
                    let i = model.index_of(r);
                    if token <= self.tokens[i] {
                        cx.out.flaws.push(format!(
                            "{} was granted {r} with token {token}, not above the last writer's {}",
                            model.name(c),
                            self.tokens[i]
                        ));
                    }
                    self.tokens[i] = self.tokens[i].max(token);
                }
            }
            // An `at_least` lock keeps everyone else out until its time
            // is up, released or not.
            let keep_until_ms = model
                .keys(c, attempt.intent)
                .at_least
                .map(|at_least| began_ms + at_least.as_millis() as i64);
            for r in resources {
                let i = model.index_of(r);
                if let Some((owner, until)) = self.kept[i]
                    && usize::from(owner) != c
                    && now >= until
                {
                    cx.out.reached.push(Event::GrantedAfterAtLeast);
                }
                if let Some((owner, until)) = self.kept[i]
                    && usize::from(owner) != c
                    && now < until
                {
                    cx.out.flaws.push(format!(
                        "{} was granted {r} at t={:.3}, while {}'s at_least lock keeps it until \
                         t={:.3}",
                        model.name(c),
                        (now - EPOCH_MS) as f64 / 1000.0,
                        model.name(usize::from(owner)),
                        (until - EPOCH_MS) as f64 / 1000.0
                    ));
                }
                if let Some(until) = keep_until_ms {
                    self.kept[i] = Some((c as u8, until));
                }
            }
            cx.out.reached.push(Event::Granted);
            if attempt.wait.is_some() {
                cx.out.reached.push(Event::WaiterGranted);
                cx.out.waiter_won = true;
                // A ring left over from the wait means nothing now.
                self.clients[c].rung_by = 0;
                self.clients[c].echo_spent = false;
            }
            let hold = Hold {
                intent: attempt.intent,
                value: attempt.value,
                // The round that set the keys (the first, with quorum-mode
                // fencing): its late refusals still mark the trail.
                round_seq: attempt.storing.map_or(attempt.round.seq, |s| s.first_seq),
                acquired_ms: began_ms,
                valid_until_ms,
                lost: false,
                token,
                trail: attempt.round.trail,
                waiter: attempt
                    .wait
                    .filter(|_| !plain_attempt(model, c, &attempt))
                    .map(|w| w.waiter),
                extending: None,
                keep_until_ms,
            };
            self.clients[c].holds.push(hold);
            if let Some(wait) = attempt.wait
                && !plain_attempt(model, c, &attempt)
                && (attempt.tries > 1 || wait.reached != 0 || attempt.round.in_line != 0)
            {
                // Won after waiting, or left in line by the winning
                // attempt: the holder leaves every queue now
                // (`Waiter::won`); the release dequeues again.
                let every: Vec<usize> = (0..self.nodes.len())
                    .filter(|&n| {
                        wait.reached & (1 << n) != 0 || attempt.round.trail[n].sent.is_some()
                    })
                    .collect();
                let quietly = Call::Release {
                    waiter: Some(wait.waiter),
                    quiet: true,
                };
                self.clean_up(cx, c, attempt.intent, None, quietly, every.into_iter());
            }
            return;
        }
        let contended = matches!(decision, Decision::Lost(Loss::Refused));
        cx.log(|| {
            format!(
                "{}'s attempt {} fails ({})",
                model.name(c),
                attempt.value.text(),
                match decision {
                    Decision::Won => "too slow",
                    Decision::Lost(Loss::Refused) => "held",
                    _ => "unavailable",
                }
            )
        });
        self.roll_back(cx, c, &attempt);
        match how {
            How::Retry(n) if attempt.tries < n => {
                self.clients[c].act = Act::Sleep(Sleep {
                    intent: attempt.intent,
                    wait: None,
                    wake_tick: self.tick(),
                    tries: attempt.tries,
                    news_from: 0,
                    any_ring: false,
                    renewal: false,
                });
            }
            How::Wait => {
                let mut wait = attempt.wait.expect("a waiting intent waits");
                for n in 0..self.nodes.len() {
                    if attempt.round.trail[n].sent.is_some() && !plain_attempt(model, c, &attempt) {
                        wait.reached |= 1 << n;
                    }
                }
                // The first refusal subscribes and tries again at once;
                // then the timer (or a ring) decides.
                let (wake, renewal) = if attempt.tries == 1 {
                    (self.tick(), false)
                } else if !model.scenario.timers {
                    (u8::MAX, false)
                } else {
                    let opens_in = if contended {
                        attempt.round.opens_in()
                    } else {
                        None
                    };
                    let (tick, expiry) = wake_tick(now, opens_in, ttl);
                    (tick, !expiry)
                };
                let news_from = match model.scenario.news {
                    News::FromRefusers => attempt.round.news_from(),
                    News::NothingAfterAnEcho if self.clients[c].echo_spent => 0,
                    News::NothingAfterAnEcho => attempt.round.news_from(),
                    News::AfterTheAnswer => {
                        self.clients[c].rung_by = 0;
                        attempt.round.news_from()
                    }
                };
                self.clients[c].act = Act::Sleep(Sleep {
                    intent: attempt.intent,
                    wait: Some(wait),
                    wake_tick: wake,
                    tries: attempt.tries,
                    news_from,
                    any_ring: !self.clients[c].echo_spent,
                    renewal,
                });
            }
            // One attempt, or the last one: the call fails.
            How::Once | How::Retry(_) => {}
        }
    }

    /// Rolls back what `attempt` may have set (`Attempt`'s drop): on every
    /// node it reached that did not refuse it.
    /// `counter_node_token` for a counter-node round, as the library feeds
    /// it (`clock_ceiling`, `clock_floor`), or as the scenario's mutant
    /// does: the other granting nodes' clocks are the model's (the counter
    /// node's runs ahead, in its scripts only, where a scenario says so),
    /// read exactly.
    fn counter_token(
        &self,
        model: &Model,
        round: &Round,
        access: Access,
        counter: u8,
    ) -> CounterToken {
        let now_us = self.now_ms() as u64 * 1000;
        let others: Vec<u64> = (0..self.nodes.len())
            .filter(|&n| n != usize::from(counter))
            .filter_map(|n| round.numbers[n])
            .collect();
        let clocks = || others.iter().map(|_| Some(now_us));
        let rule = model.scenario.token_rule;
        let grants = CounterGrants {
            writer: access == Access::Exclusive,
            counter_node: round.number_from(counter),
            others: match rule {
                TokenRule::CounterNodeTrusted => 0,
                _ => others.iter().copied().max().unwrap_or(0),
            },
            ceiling: Some(match rule {
                TokenRule::NoCeiling => u64::MAX,
                _ => clock_ceiling(clocks()),
            }),
            // The model's clocks agree: no counter node far behind.
            lowest: clock_lowest(clocks()),
        };
        counter_node_token(grants, || match rule {
            TokenRule::NoClockFloor => 0,
            _ => clock_floor(clocks()).unwrap_or(0),
        })
    }

    fn roll_back(&mut self, cx: &mut Cx<'_>, c: usize, attempt: &Attempt) {
        let nodes: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| cleanup_on(&attempt.round.trail, n, false))
            .collect();
        self.clean_up(
            cx,
            c,
            attempt.intent,
            Some(attempt.value),
            release(None),
            nodes.into_iter(),
        );
    }

    /// A wait ends without a lock (`Waiter`'s drop): its entries go from
    /// every node an attempt of it reached.
    fn dequeue(
        &mut self,
        cx: &mut Cx<'_>,
        c: usize,
        intent: u8,
        wait: Wait,
        current: &[NodeTrail],
    ) {
        let nodes: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| {
                wait.reached & (1 << n) != 0 || current.get(n).is_some_and(|t| t.sent.is_some())
            })
            .collect();
        self.clean_up(
            cx,
            c,
            intent,
            None,
            release(Some(wait.waiter)),
            nodes.into_iter(),
        );
    }

    fn extend(&mut self, cx: &mut Cx<'_>, c: usize, intent: u8) {
        self.left.extends -= 1;
        let model = cx.model;
        let now = self.now_ms();
        let ttl = model.ttl();
        let at = self.clients[c]
            .holds
            .iter()
            .position(|h| h.intent == intent)
            .expect("an extended hold");
        // Lower the validity first to what the new TTL guarantees.
        let drift = quorum::drift(ttl, crate::DEFAULT_DRIFT_FACTOR);
        let floor = now + quorum::validity(ttl, Duration::ZERO, drift).as_millis() as i64;
        let hold = &mut self.clients[c].holds[at];
        hold.valid_until_ms = hold.valid_until_ms.min(floor);
        let may_repair = now + NODE_TIMEOUT_MS <= hold.valid_until_ms;
        let value = hold.value;
        let seq = self.clients[c].new_round();
        let mut round = Round::new(seq, now, self.nodes.len(), None);
        cx.log(|| format!("{} extends {}", model.name(c), value.text()));
        for n in 0..self.nodes.len() {
            let epoch = self.verdict(c, n).epoch;
            let sent_epoch = self.clients[c].holds[at].trail[n].sent;
            let repair = may_repair && sent_epoch.is_none_or(|e| e != epoch);
            let request = Request {
                call: Call::Extend { repair },
                intent,
                value: Some(value),
                purpose: Purpose::Extend { intent, seq },
            };
            let mut trail = NodeTrail::default();
            let ballot = self.send(cx, c, n, request, Some(&mut trail));
            if repair && trail.sent.is_some() {
                // Recorded in the claim too (its first record stays): the
                // release must go where the key may now be.
                let claim = &mut self.clients[c].holds[at].trail[n];
                claim.sent = claim.sent.or(trail.sent);
                claim.refused = false;
            }
            round.trail[n] = trail;
            if let Some(ballot) = ballot {
                round.votes[n] = Some(ballot);
            }
        }
        self.clients[c].holds[at].extending = Some(round);
        self.settle_extend(cx, c, at);
    }

    /// Ends the extension of hold `at` of client `c` if it is decided.
    fn settle_extend(&mut self, cx: &mut Cx<'_>, c: usize, at: usize) {
        let now = self.now_ms();
        let model = cx.model;
        let ttl = model.ttl();
        let hold = &mut self.clients[c].holds[at];
        let Some(round) = &hold.extending else { return };
        let decision = round.decision();
        if decision == Decision::Pending {
            return;
        }
        let round = hold.extending.take().expect("an extension in flight");
        let tally = round.tally();
        let elapsed = Duration::from_millis((now - round.started_ms) as u64);
        let validity = quorum::validity(
            ttl,
            elapsed,
            quorum::drift(ttl, crate::DEFAULT_DRIFT_FACTOR),
        );
        let outcome = match decision {
            Decision::Lost(Loss::Refused) if tally.refusals_alone_lose() => {
                hold.lost = true;
                "lost".to_owned()
            }
            Decision::Won if quorum::is_usable(validity, Duration::ZERO) => {
                hold.valid_until_ms = now + validity.as_millis() as i64;
                cx.out.reached.push(Event::Extended);
                format!(
                    "valid until t={:.3}",
                    (hold.valid_until_ms - EPOCH_MS) as f64 / 1000.0
                )
            }
            _ => "failed; validity kept".to_owned(),
        };
        let value = hold.value;
        cx.log(|| {
            format!(
                "{}'s extension of {} decided: {outcome}",
                model.name(c),
                value.text()
            )
        });
    }

    /// Rounds of client `c` past their deadline: the nodes that have not
    /// answered failed.
    fn time_out_rounds(&mut self, cx: &mut Cx<'_>, c: usize) {
        let now = self.now_ms();
        if let Act::Attempt(attempt) = &mut self.clients[c].act
            && attempt.round.started_ms + NODE_TIMEOUT_MS < now
        {
            attempt.round.time_out();
            self.settle_attempt(cx, c);
        }
        for at in 0..self.clients[c].holds.len() {
            if let Some(round) = &mut self.clients[c].holds[at].extending
                && round.started_ms + NODE_TIMEOUT_MS < now
            {
                round.time_out();
                self.settle_extend(cx, c, at);
            }
        }
    }

    /// The waiting clients in the frozen search (see `properties.rs`):
    /// client `c` releases every lock it holds.
    pub(super) fn release_all(&mut self, model: &Model, c: usize) {
        let mut cx = Cx {
            model,
            out: Outcome::default(),
            trace: false,
        };
        for hold in std::mem::take(&mut self.clients[c].holds) {
            let nodes: Vec<usize> = (0..self.nodes.len())
                .filter(|&n| cleanup_on(&hold.trail, n, hold.waiter.is_some()))
                .collect();
            self.clean_up(
                &mut cx,
                c,
                hold.intent,
                Some(hold.value),
                release(hold.waiter),
                nodes.into_iter(),
            );
        }
    }

    /// Runs every request in flight, oldest link first, until none is
    /// left; whether a waiter was granted meanwhile.
    pub(super) fn deliver_all(&mut self, model: &Model) -> Outcome {
        let mut total = Outcome::default();
        while let Some(i) = self.links.iter().position(|l| !l.is_empty()) {
            let n = self.nodes.len();
            let outcome = self.apply(
                Step::Deliver {
                    client: (i / n) as u8,
                    node: (i % n) as u8,
                },
                model,
                false,
            );
            total.waiter_won |= outcome.waiter_won;
            total.flaws.extend(outcome.flaws);
        }
        total
    }
}

/// The waiters queued in `keys` (a node's data) for a resource of the
/// lock `lock` with a ticket before `ticket` and a live lease, that a
/// waiter with `ticket` must let go first: any of them when it wants to
/// write, the writers when it reads (readers share). Each as `w<id> on
/// <resource>`.
fn waiters_ahead(keys: &Keyspace, lock: &Keys, now_ms: i64, ticket: u64, id: u64) -> Vec<String> {
    let members = |key: &str| match keys.get(key).map(|e| &e.data) {
        Some(Data::ZSet(members)) => members.clone(),
        _ => Vec::new(),
    };
    let mut ahead = Vec::new();
    for r in &lock.resources {
        let leases = members(r.waiter_leases());
        let writers = members(r.waiting_writers());
        for (score, member) in members(r.waiters()) {
            let alive = leases
                .iter()
                .any(|(lease, m)| m == &member && lease.0 > now_ms as f64);
            let earlier = score.0 < ticket as f64;
            let conflicts =
                lock.access == Access::Exclusive || writers.iter().any(|(_, m)| m == &member);
            if alive && earlier && conflicts && *member != *id.to_string() {
                ahead.push(format!("w{member} on {}", r.name()));
            }
        }
    }
    ahead
}

/// Counts a node's vote, with what came with it.
fn record(round: &mut Round, n: usize, ballot: Ballot, answer: Option<Answer>) {
    round.votes[n] = Some(ballot);
    match answer {
        Some(Answer::YesWith(number)) => round.numbers[n] = Some(number),
        Some(Answer::YesInLine(number)) => {
            round.numbers[n] = number;
            round.in_line |= 1 << n;
        }
        Some(Answer::No) => round.trail[n].refused = true,
        Some(Answer::Waiting { opens_in_ms, .. }) => {
            round.trail[n].refused = true;
            round.waiting[n] = Some(opens_in_ms);
            round.in_line |= 1 << n;
        }
        _ => {}
    }
}

/// An operation in words.
fn describe_call(call: Call, keys: &Keys, value: &str) -> String {
    let what = keys.label();
    match call {
        Call::Acquire { counting, queued } => format!(
            "acquire {what} as {value}{}{}",
            match counting {
                1 => " (counter node: INCR)",
                2 => " (counter node: read)",
                _ => "",
            },
            queued.map_or(String::new(), |(_, waiter)| format!(
                ", queued as w{waiter}"
            ))
        ),
        Call::Extend { repair } => format!(
            "extend {what} as {value}{}",
            if repair { " (repair)" } else { "" }
        ),
        Call::Release {
            waiter: Some(w),
            quiet: true,
        } => {
            format!("quiet dequeue w{w} from {}", keys.label())
        }
        Call::Release {
            waiter: Some(w), ..
        } if value.is_empty() => {
            format!("dequeue w{w} from {what}")
        }
        Call::Release { waiter, .. } => format!(
            "release {what} as {value}{}",
            waiter.map_or(String::new(), |w| format!(" and dequeue w{w}"))
        ),
        Call::StoreToken { token } => format!("store token {token} for {what} as {value}"),
        Call::Keep { waiter, keep_ms } => format!(
            "release {what} as {value} keeping it {keep_ms} ms more{}",
            waiter.map_or(String::new(), |w| format!(" and dequeue w{w}"))
        ),
    }
}

/// A node's keys in a short form: lock keys and queues, with time left.
pub(super) fn describe_keys(keys: &Keyspace, now_ms: i64) -> String {
    let mut parts = Vec::new();
    for (key, entry) in keys.iter() {
        if key.starts_with("quorumlock:node") {
            continue;
        }
        let name = key.strip_prefix("quorumlock:").unwrap_or(key);
        let ttl = entry
            .expires_at
            .map_or(String::new(), |at| format!(" ({}ms)", at - now_ms));
        let value = match &entry.data {
            Data::Str(text) => text.to_string(),
            Data::ZSet(members) => {
                let timed = matches!(
                    crate::keys::parse_key(key),
                    Some((
                        crate::keys::KeyKind::Lock | crate::keys::KeyKind::WaiterLeases,
                        _
                    ))
                );
                let items: Vec<String> = members
                    .iter()
                    .map(|(score, member)| {
                        if timed {
                            format!("{member}@{:+}", score.0 as i64 - now_ms)
                        } else {
                            member.to_string()
                        }
                    })
                    .collect();
                format!("[{}]", items.join(" "))
            }
        };
        parts.push(format!("{name}={value}{ttl}"));
    }
    if parts.is_empty() {
        "(empty)".to_owned()
    } else {
        parts.join(", ")
    }
}

impl World {
    /// The same state with the nodes relabelled: node `i` of the result is
    /// node `from[i]` of this one. Every per-node part moves with its node.
    pub(super) fn relabelled(&self, from: &[usize]) -> World {
        let mut to = vec![0; from.len()];
        for (new, &old) in from.iter().enumerate() {
            to[old] = new;
        }
        let moved = |i: usize| from.get(i).copied().unwrap_or(i);
        let bits = |mask: u8| {
            (0..from.len())
                .filter(|&new| mask & (1 << from[new]) != 0)
                .fold(0u8, |acc, new| acc | (1 << new))
        };
        let round = |r: &Round| Round {
            votes: std::array::from_fn(|i| r.votes[moved(i)]),
            trail: std::array::from_fn(|i| r.trail[moved(i)]),
            numbers: std::array::from_fn(|i| r.numbers[moved(i)]),
            waiting: std::array::from_fn(|i| r.waiting[moved(i)]),
            in_line: bits(r.in_line),
            ..r.clone()
        };
        let wait = |w: Option<Wait>| {
            w.map(|w| Wait {
                reached: bits(w.reached),
                ..w
            })
        };
        let n = self.nodes.len();
        World {
            nodes: from.iter().map(|&old| self.nodes[old].clone()).collect(),
            links: (0..self.clients.len())
                .flat_map(|c| from.iter().map(move |&old| c * n + old))
                .map(|i| self.links[i].clone())
                .collect(),
            clients: self
                .clients
                .iter()
                .map(|client| Client {
                    holds: client
                        .holds
                        .iter()
                        .map(|h| Hold {
                            trail: std::array::from_fn(|i| h.trail[moved(i)]),
                            extending: h.extending.as_ref().map(round),
                            ..h.clone()
                        })
                        .collect(),
                    act: match &client.act {
                        Act::Idle => Act::Idle,
                        Act::Attempt(a) => Act::Attempt(Attempt {
                            round: round(&a.round),
                            wait: wait(a.wait),
                            ..a.clone()
                        }),
                        Act::Sleep(s) => Act::Sleep(Sleep {
                            wait: wait(s.wait),
                            news_from: bits(s.news_from),
                            ..s.clone()
                        }),
                    },
                    inbox: client
                        .inbox
                        .iter()
                        .map(|(node, request, reply)| {
                            (to[usize::from(*node)] as u8, request.clone(), reply.clone())
                        })
                        .collect(),
                    conns: std::array::from_fn(|i| client.conns[moved(i)]),
                    guards: Arc::new(from.iter().map(|&old| client.guards[old].clone()).collect()),
                    rung_by: bits(client.rung_by),
                    ..client.clone()
                })
                .collect(),
            ..self.clone()
        }
    }
}

/// The parts of a round that belong to node `n`.
fn round_at(round: &Round, n: usize, hasher: &mut Fold) {
    (
        round.votes[n],
        round.trail[n],
        round.numbers[n],
        round.waiting[n],
        round.in_line & (1 << n) != 0,
    )
        .hash(hasher);
}

/// The parts of a round that belong to no node.
fn round_skeleton(round: &Round, hasher: &mut Fold) {
    (round.seq, round.started_ms, round.preferred, round.nodes).hash(hasher);
}

impl World {
    /// The digest of everything that belongs to node `n`: the node, and
    /// each client's connection, guard, requests in flight and round
    /// entries for it.
    pub(super) fn column(&self, n: usize) -> u128 {
        let mut h = Fold::default();
        self.nodes[n].hash(&mut h);
        let nodes = self.nodes.len();
        for (c, client) in self.clients.iter().enumerate() {
            self.links[c * nodes + n].hash(&mut h);
            (client.conns[n], &client.guards[n]).hash(&mut h);
            for hold in &client.holds {
                hold.trail[n].hash(&mut h);
                if let Some(round) = &hold.extending {
                    round_at(round, n, &mut h);
                }
            }
            match &client.act {
                Act::Idle => {}
                Act::Attempt(a) => round_at(&a.round, n, &mut h),
                Act::Sleep(s) => (s.news_from & (1 << n) != 0).hash(&mut h),
            }
            (client.rung_by & (1 << n) != 0).hash(&mut h);
            client
                .wait()
                .map(|w| w.reached & (1 << n) != 0)
                .hash(&mut h);
            for (i, (node, _, _)) in client.inbox.iter().enumerate() {
                if usize::from(*node) == n {
                    i.hash(&mut h);
                }
            }
            0xfeu8.hash(&mut h);
        }
        h.digest()
    }

    /// The digest of everything that belongs to no node.
    pub(super) fn skeleton(&self) -> u128 {
        let mut h = Fold::default();
        (self.ms, &self.tokens, self.left, self.arrivals).hash(&mut h);
        (&self.storage, &self.accepted, &self.kept).hash(&mut h);
        for client in &self.clients {
            (
                client.pc,
                client.paused,
                client.crashed,
                client.values,
                client.waits,
            )
                .hash(&mut h);
            (client.rounds, client.attempts, client.echo_spent).hash(&mut h);
            for hold in &client.holds {
                (hold.intent, hold.value, hold.round_seq, hold.acquired_ms).hash(&mut h);
                (hold.valid_until_ms, hold.lost, hold.token, hold.waiter).hash(&mut h);
                hold.keep_until_ms.hash(&mut h);
                hold.extending.is_some().hash(&mut h);
                if let Some(round) = &hold.extending {
                    round_skeleton(round, &mut h);
                }
            }
            0xfdu8.hash(&mut h);
            let wait = |w: Option<Wait>, h: &mut Fold| w.map(|w| (w.ticket, w.waiter)).hash(h);
            match &client.act {
                Act::Idle => 0u8.hash(&mut h),
                Act::Attempt(a) => {
                    (1u8, a.intent, a.value, a.tries, a.storing).hash(&mut h);
                    wait(a.wait, &mut h);
                    round_skeleton(&a.round, &mut h);
                }
                Act::Sleep(s) => {
                    (2u8, s.intent, s.wake_tick, s.tries, s.any_ring, s.renewal).hash(&mut h);
                    wait(s.wait, &mut h);
                }
            }
            for (_, request, reply) in &client.inbox {
                (request, reply).hash(&mut h);
            }
            0xfcu8.hash(&mut h);
        }
        h.digest()
    }
}

/// Whether `attempt` is a wait's plain first attempt at a lone exclusive
/// resource, which queues nowhere (`wait_loop`).
fn plain_attempt(model: &Model, c: usize, attempt: &Attempt) -> bool {
    attempt.wait.is_some() && attempt.tries == 1 && model.keys(c, attempt.intent).simple().is_some()
}

/// The release (rollback, dequeue) that wakes the next waiter where the
/// lock is free afterwards.
fn release(waiter: Option<u64>) -> Call {
    Call::Release {
        waiter,
        quiet: false,
    }
}
