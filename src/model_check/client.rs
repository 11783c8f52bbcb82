//! A client of the model: what it holds, the acquisition it is making, and
//! the decisions it takes from the answers, with the library's own rules
//! (`quorum`'s tally and validity, `wait::plan`'s timers, `Round::opens_in`'s
//! bound). The steps that move requests between clients and nodes are in
//! `world.rs`; this file keeps a client's side of them.

use std::sync::Arc;
use std::time::Duration;

use crate::quorum::{self, Decision, Tally, Vote};
use crate::wait::WakeCause;
use crate::wait::plan::{self, Step as PlanStep, Timers};

use super::guard::GuardView;
use super::redis::Reply;
use super::world::{EPOCH_MS, Request, TICK_MS, instant};

/// The most nodes a scenario may have: per-node parts of the state are
/// arrays of this size (no allocation when a state is copied).
pub(super) const MAX_NODES: usize = 5;

/// One entry per node (those past the scenario's nodes stay unused).
pub(super) type PerNode<T> = [T; MAX_NODES];

/// A lock value: unique per acquisition attempt (`c<client>v<n>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ValueId {
    pub(super) client: u8,
    pub(super) n: u8,
}

impl ValueId {
    pub(super) fn text(self) -> String {
        format!("c{}v{}", self.client, self.n)
    }
}

/// Why a request was sent: the round whose answer it is, or cleanup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Purpose {
    /// An acquisition round (`seq` numbers the client's rounds).
    Attempt { seq: u8 },
    /// An extension round of the lock taken by intent `intent`.
    Extend { intent: u8, seq: u8 },
    /// Rollback, release or dequeue: in the background, answers unread.
    Cleanup,
}

/// One node's answer as the tally counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Ballot {
    Granted,
    Refused,
    Failed,
}

impl Ballot {
    fn vote(self) -> Vote {
        match self {
            Ballot::Granted => Vote::Granted,
            Ballot::Refused => Vote::Refused,
            Ballot::Failed => Vote::Failed,
        }
    }
}

/// Where a round's request to one node went (`round.rs`'s `Trail`): the
/// node's guard epoch when it was sent, and whether the node refused an
/// acquire (then it holds nothing of it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(super) struct NodeTrail {
    pub(super) sent: Option<u64>,
    pub(super) refused: bool,
}

/// One fan-out to every node, tallied until decided.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Round {
    pub(super) seq: u8,
    pub(super) started_ms: i64,
    /// The node whose vote a win waits for (the counter node).
    pub(super) preferred: Option<u8>,
    pub(super) nodes: u8,
    pub(super) votes: PerNode<Option<Ballot>>,
    pub(super) trail: PerNode<NodeTrail>,
    /// Fencing numbers sent with grants, by node.
    pub(super) numbers: PerNode<Option<u64>>,
    /// For a queued acquire: each refusing node's bound (ms) on when the
    /// lock may be free there (`None`: unknown).
    pub(super) waiting: PerNode<Option<Option<u64>>>,
    /// Nodes whose answer said they left the waiter in their queue (a
    /// queued refusal, or a grant while others waited there), one bit each.
    pub(super) in_line: u8,
}

impl Round {
    /// The nodes whose ring is news after this round was lost, one bit
    /// each (`Refusals::news_from` in `wait/plan.rs`): those that refused
    /// it with a queued answer, or every node when none did.
    pub(super) fn news_from(&self) -> u8 {
        let refused = (0..usize::from(self.nodes))
            .filter(|&n| self.waiting[n].is_some())
            .fold(0u8, |acc, n| acc | (1 << n));
        if refused == 0 {
            ((1u16 << self.nodes) - 1) as u8
        } else {
            refused
        }
    }

    pub(super) fn new(seq: u8, started_ms: i64, nodes: usize, preferred: Option<u8>) -> Self {
        Self {
            seq,
            started_ms,
            preferred,
            nodes: nodes as u8,
            votes: [None; MAX_NODES],
            trail: [NodeTrail::default(); MAX_NODES],
            numbers: [None; MAX_NODES],
            waiting: [None; MAX_NODES],
            in_line: 0,
        }
    }

    /// The library's tally of the votes so far.
    pub(super) fn tally(&self) -> Tally {
        let total = usize::from(self.nodes);
        let mut tally = match self.preferred {
            Some(node) => Tally::preferring(total, usize::from(node)),
            None => Tally::new(total),
        };
        for (node, vote) in self.votes[..total].iter().enumerate() {
            if let Some(ballot) = vote {
                tally.record(node, ballot.vote());
            }
        }
        tally
    }

    pub(super) fn decision(&self) -> Decision {
        self.tally().decision()
    }

    /// Nodes that have not answered: when the deadline passes, they failed.
    pub(super) fn time_out(&mut self) {
        for vote in &mut self.votes[..usize::from(self.nodes)] {
            vote.get_or_insert(Ballot::Failed);
        }
    }

    /// `Round::opens_in`: when the lock may be free on a quorum of the
    /// nodes that answered.
    pub(super) fn opens_in(&self) -> Option<Duration> {
        let tally = self.tally();
        let quorum = quorum::quorum(usize::from(self.nodes));
        let granted = std::iter::repeat_n(Some(Duration::ZERO), tally.granted());
        let values: Vec<Option<Duration>> = granted
            .chain(
                self.waiting
                    .iter()
                    .flatten()
                    .map(|v| v.map(Duration::from_millis)),
            )
            .collect();
        plan::opens_in(&values, quorum)
    }

    pub(super) fn number_from(&self, node: u8) -> Option<u64> {
        self.numbers[usize::from(node)]
    }
}

/// A waiter's place in the queues: its ticket and id, and every node an
/// attempt of its wait reached (a bit each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Wait {
    pub(super) ticket: u64,
    pub(super) waiter: u64,
    pub(super) reached: u8,
}

/// An acquisition in flight.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Attempt {
    pub(super) intent: u8,
    pub(super) value: ValueId,
    pub(super) round: Round,
    pub(super) wait: Option<Wait>,
    /// Attempts of this acquisition so far, this one included.
    pub(super) tries: u8,
    /// In quorum-mode fencing, once the first round won: the token the
    /// second round stores.
    pub(super) storing: Option<Storing>,
}

/// Quorum-mode fencing's second round: the token stored, and when the
/// first round began (validity counts from there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Storing {
    pub(super) token: u64,
    pub(super) began_ms: i64,
    /// The first round (its late refusals still mark the trail).
    pub(super) first_seq: u8,
}

/// Between two attempts of one acquisition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Sleep {
    pub(super) intent: u8,
    pub(super) wait: Option<Wait>,
    /// The tick from which its timer lets it try again.
    pub(super) wake_tick: u8,
    pub(super) tries: u8,
    /// The nodes whose ring lets it try again before its timer, one bit
    /// each: those that refused its last attempt (every node when none
    /// did), as `wait/mod.rs` decides.
    pub(super) news_from: u8,
    /// Whether a ring from any node lets it try again (the first ring
    /// after news or the expiry timer does).
    pub(super) any_ring: bool,
    /// Whether its timer is a renewal or a poll (not the expiry the nodes
    /// gave, nor the retry at once after a first refusal): after it, rings
    /// from nodes that did not refuse are echoes.
    pub(super) renewal: bool,
}

/// What a client is doing besides holding locks.
// Unboxed: states are copied for every step, and a box would cost an
// allocation per copy of a client that is attempting.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Act {
    Idle,
    Attempt(Attempt),
    Sleep(Sleep),
}

/// A lock the client holds (`lock.rs`'s `Lock`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Hold {
    pub(super) intent: u8,
    pub(super) value: ValueId,
    /// The round that won it: late answers to it still mark refusals.
    pub(super) round_seq: u8,
    pub(super) acquired_ms: i64,
    pub(super) valid_until_ms: i64,
    /// The nodes told us it is gone.
    pub(super) lost: bool,
    pub(super) token: Option<u64>,
    pub(super) trail: PerNode<NodeTrail>,
    /// The waiter that won it: its release dequeues it.
    pub(super) waiter: Option<u64>,
    pub(super) extending: Option<Round>,
    /// An `at_least` lock: a release before this time keeps the keys.
    pub(super) keep_until_ms: Option<i64>,
}

impl Hold {
    /// `Lock::valid_until`: the acquisition's start once lost.
    pub(super) fn valid_until(&self) -> i64 {
        if self.lost {
            self.acquired_ms
        } else {
            self.valid_until_ms
        }
    }

    pub(super) fn is_valid(&self, now_ms: i64) -> bool {
        now_ms < self.valid_until()
    }
}

/// `Claim::cleanup_on`: whether node `i` must be cleaned up after a claim
/// with `trail`: its request went out there, and the node did not refuse
/// it (or a waiter must be dequeued there).
pub(super) fn cleanup_on(trail: &[NodeTrail], i: usize, waiter: bool) -> bool {
    let node = trail[i];
    node.sent.is_some() && (waiter || !node.refused)
}

/// One client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Client {
    /// The next intent of its program.
    pub(super) pc: u8,
    pub(super) holds: Vec<Hold>,
    pub(super) act: Act,
    pub(super) paused: bool,
    pub(super) crashed: bool,
    /// Answers that came while it was paused, read when it resumes.
    pub(super) inbox: Vec<(u8, Request, Reply)>,
    /// Per node, the process its connection is to (`None`: never
    /// connected); a restart breaks it, and the next request reconnects.
    pub(super) conns: PerNode<Option<u32>>,
    /// Per node, its guard (shared between states until it observes).
    pub(super) guards: Arc<Vec<GuardView>>,
    /// Lock values, waits and rounds made so far (for fresh ids).
    pub(super) values: u8,
    pub(super) waits: u8,
    pub(super) rounds: u8,
    /// Attempts made so far, bounded by the scenario.
    pub(super) attempts: u8,
    /// The nodes on which a release named its waiter since its attempt
    /// went out, one bit each (`Registration::rung_by`).
    pub(super) rung_by: u8,
    /// A ring that was no news (from a node that had not refused) set off
    /// its last attempt (`echo_spent` in `wait_loop`).
    pub(super) echo_spent: bool,
}

impl Client {
    pub(super) fn new(nodes: usize) -> Self {
        Self {
            pc: 0,
            holds: Vec::new(),
            act: Act::Idle,
            paused: false,
            crashed: false,
            inbox: Vec::new(),
            conns: [None; MAX_NODES],
            guards: Arc::new(vec![GuardView::default(); nodes]),
            values: 0,
            waits: 0,
            rounds: 0,
            attempts: 0,
            rung_by: 0,
            echo_spent: false,
        }
    }

    /// Its current wait, if it is waiting (in an attempt or between two).
    pub(super) fn wait(&self) -> Option<Wait> {
        match &self.act {
            Act::Attempt(attempt) => attempt.wait,
            Act::Sleep(sleep) => sleep.wait,
            Act::Idle => None,
        }
    }

    pub(super) fn is_waiting(&self) -> bool {
        !self.crashed && self.wait().is_some()
    }

    pub(super) fn new_value(&mut self, client: u8) -> ValueId {
        self.values += 1;
        ValueId {
            client,
            n: self.values,
        }
    }

    pub(super) fn new_round(&mut self) -> u8 {
        self.rounds += 1;
        self.rounds
    }
}

/// When a waiter whose attempt ended at `now_ms`, finding the lock free in
/// `opens_in`, tries again by its timer (`wait::plan::next_step`, no
/// deadline: giving up is a step of its own): the first whole tick at or
/// after the timer (waking later than the timer says is always possible),
/// and whether the timer is the expiry the nodes gave (not a renewal or a
/// poll).
pub(super) fn wake_tick(now_ms: i64, opens_in: Option<Duration>, ttl: Duration) -> (u8, bool) {
    let now = instant(now_ms);
    let timers = Timers {
        margin: Duration::from_millis(1),
        renew_every: plan::waiter_lease(ttl) / 2,
        poll: quorum::retry_delay(
            std::time::Duration::from_millis(200),
            std::time::Duration::from_millis(100),
            0.5,
        ),
        shortest: crate::wait::SHORTEST_SLEEP,
    };
    let far = now + Duration::from_secs(3600);
    // Answers land at once here: the attempt's bounds count from its end.
    let (at, expiry) = match plan::next_step(now, now, far, opens_in, timers) {
        PlanStep::Retry { at, cause } => (at, cause == WakeCause::Expiry),
        PlanStep::GiveUpAt(at) => (at, false),
    };
    let wake_ms = now_ms - EPOCH_MS + (at - now).as_millis() as i64;
    let ticks = (wake_ms + TICK_MS - 1) / TICK_MS;
    (ticks.clamp(0, 255) as u8, expiry)
}
