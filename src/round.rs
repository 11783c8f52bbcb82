//! One fan-out ("round"): a request to every node at once, tallied until
//! the outcome is decided, and what happens to the requests still in
//! flight then, or when the round is dropped halfway.
//!
//! Two rules keep rollbacks and releases correct whatever happens to the
//! connections in between:
//! - A round that sets or moves keys (acquire, extend, token) is *closed*
//!   once decided or dropped: a request of it still waiting for its
//!   connection is never sent. Every request that may have gone out is
//!   recorded in the round's [`Trail`], with the connection it used, in the
//!   same poll that puts it in that connection's queue (which always has
//!   room: see `node.rs`).
//! - A cleanup (rollback or release) of an acquisition goes out on the
//!   connection its SET used, so it is queued behind that SET on the same
//!   stream, even after the node has moved on to a new connection (then it
//!   goes on the new one as well, in case the old one is silently dead).
//!
//! Requests still in flight when a round is decided or dropped are waited
//! for in the background, until the round's deadline, so that a node that
//! never answers in time is counted as timed out and its connection is
//! eventually replaced, also under acquire- or extend-only traffic.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::future::{Either, FutureExt, select};
use futures::stream::StreamExt;
use tokio::time::Instant;

use crate::background::Background;
use crate::error::NodeError;
use crate::error::NodeErrorKind;
use crate::keys::Keys;
use crate::member::Member;
use crate::node::{Connection, Node};
use crate::ops::{Answer, Op};
use crate::pending::Pending;
use crate::quorum::{Decision, Tally, Vote};
use crate::wait::plan;

/// A request's connection, and the node's guard epoch when it went out.
type Sent = (Arc<Connection>, u64);

/// Where the requests of one round went, node by node.
pub(crate) struct Trail {
    /// Once set, no request of the round is sent any more.
    closed: AtomicBool,
    nodes: Box<[NodeTrail]>,
}

/// One node's part of a [`Trail`].
#[derive(Default)]
struct NodeTrail {
    /// The connection the node's first request was handed to, if it got
    /// one, and the node's guard epoch then.
    sent: OnceLock<Sent>,
    /// Other connections later requests recorded here went out on (a
    /// repairing extension after the node reconnected): rare, so behind a
    /// lock, and empty (unallocated) otherwise.
    also_sent: Mutex<Vec<Arc<Connection>>>,
    /// The node refused a fresh acquire: it set nothing there.
    refused: AtomicBool,
}

impl Trail {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            closed: AtomicBool::new(false),
            nodes: (0..nodes).map(|_| NodeTrail::default()).collect(),
        })
    }

    /// Records that node `index`'s request goes out on `connection` in
    /// guard epoch `epoch`. The first record of a node stays (with its
    /// epoch); a later one on another connection is kept beside it, so that
    /// cleanup goes behind every request that may set a key.
    fn record(&self, index: usize, connection: &Arc<Connection>, epoch: u64) {
        let Some(node) = self.nodes.get(index) else {
            return;
        };
        if let Err((connection, _)) = node.sent.set((Arc::clone(connection), epoch))
            && node
                .sent
                .get()
                .is_some_and(|(first, _)| !first.same_as(&connection))
        {
            let mut also = node.also_sent.lock().unwrap_or_else(|p| p.into_inner());
            if !also.iter().any(|other| other.same_as(&connection)) {
                also.push(connection);
            }
        }
    }

    /// Marks node `index` as holding nothing of the round (`true`: it
    /// refused the acquire) or as perhaps holding its key.
    fn set_refused(&self, index: usize, refused: bool) {
        if let Some(node) = self.nodes.get(index) {
            node.refused.store(refused, Ordering::SeqCst);
        }
    }

    /// No request of this round is sent from now on; the connections
    /// recorded so far are all the round may have reached.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Whether no request went out on any node.
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.iter().all(|node| node.sent.get().is_none())
    }

    /// The connection node `index`'s request may have gone out on.
    pub(crate) fn sent_on(&self, index: usize) -> Option<&Arc<Connection>> {
        self.nodes
            .get(index)
            .and_then(|node| node.sent.get())
            .map(|(connection, _)| connection)
    }

    /// The other connections requests to node `index` went out on (see
    /// `NodeTrail::also_sent`); empty, without allocating, in the common
    /// case.
    pub(crate) fn also_sent_on(&self, index: usize) -> Vec<Arc<Connection>> {
        self.nodes.get(index).map_or_else(Vec::new, |node| {
            node.also_sent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
    }

    /// The node's guard epoch when node `index`'s request went out.
    pub(crate) fn epoch_of(&self, index: usize) -> Option<u64> {
        self.nodes
            .get(index)
            .and_then(|node| node.sent.get())
            .map(|&(_, epoch)| epoch)
    }

    /// Adds the connections `other` reached and this trail has not.
    pub(crate) fn absorb(&self, other: &Trail) {
        for (index, node) in other.nodes.iter().enumerate() {
            if let Some((connection, epoch)) = node.sent.get() {
                self.record(index, connection, *epoch);
                for later in other.also_sent_on(index) {
                    self.record(index, &later, *epoch);
                }
            }
        }
    }

    /// Nodes in the trail.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether node `index` refused the round's acquire (so holds no key of
    /// it: the request was its one request there, and it set nothing).
    pub(crate) fn refused(&self, index: usize) -> bool {
        self.nodes
            .get(index)
            .is_some_and(|node| node.refused.load(Ordering::SeqCst))
    }
}

/// A request's outcome; `None` when it was never sent (its round closed
/// before its connection was ready).
pub(crate) type Outcome = Option<Result<Answer, NodeError>>;

/// One node's request in a round: `op` for the lock `keys` held under
/// `value`, recorded in `trail`.
pub(crate) struct Request {
    /// The member asked; the request goes to its server for `keys`.
    pub(crate) member: Member,
    pub(crate) index: usize,
    pub(crate) op: Op,
    pub(crate) keys: Arc<Keys>,
    pub(crate) value: Arc<str>,
    pub(crate) trail: Arc<Trail>,
    /// A second trail to record where it went: the claim's own, for an
    /// extension that may put the claim's key back, so that its release
    /// and cleanup go there too (also when the extension is dropped).
    pub(crate) also_record_in: Option<Arc<Trail>>,
}

impl Request {
    /// Sends it, unless the trail is closed by the time the connection is
    /// ready; records the connection before sending.
    // Not an `async fn`: that would keep the request twice in the future,
    // and a round keeps one per node in flight (small ones move and
    // allocate cheaply).
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn send(self) -> impl Future<Output = Outcome> + Send {
        async move {
            // A cluster reads its slot map again after a failure that can
            // mean it changed (see `Member::failed`).
            let cluster = self.member.is_cluster().then(|| self.member.clone());
            let outcome = self.send_once().await;
            if let (Some(member), Some(Err(error))) = (&cluster, &outcome) {
                member.failed(&error.kind);
            }
            outcome
        }
    }

    #[allow(clippy::manual_async_fn)]
    fn send_once(self) -> impl Future<Output = Outcome> + Send {
        async move {
            let routed;
            let node = match &self.member {
                Member::Server(node) => node,
                Member::Cluster(_) => {
                    routed = match self.member.ready_node_for(&self.keys) {
                        Some(node) => node,
                        // Rare (the slot map is not known yet): boxed, so
                        // that the common case stays small.
                        None => match Box::pin(self.member.node_for(&self.keys)).await {
                            Ok(node) => node,
                            Err(error) => return Some(Err(error)),
                        },
                    };
                    &routed
                }
            };
            // The guard keeps keys off a node it does not count (its vote
            // would be a failure anyway); it still observes the node now
            // and then, to see it recover. Cleanup goes out regardless: a
            // delete needs no trust, and its answer is taken as it is.
            if self.op.sets_keys()
                && let Some(quarantine) = node.quarantine()
            {
                node.observe_soon();
                return Some(Err(node.quarantined(quarantine)));
            }
            let connection = match node.ready_connection() {
                Some(connection) => connection,
                // Rare (no connection yet, or it is being replaced): boxed,
                // so that the common case stays small.
                None => match Box::pin(node.connection()).await {
                    Ok(connection) => {
                        // The connect observed the node: a verdict against
                        // it keeps the keys off it too.
                        if self.op.sets_keys()
                            && let Some(quarantine) = node.quarantine()
                        {
                            return Some(Err(node.quarantined(quarantine)));
                        }
                        connection
                    }
                    Err(error) => return Some(Err(error)),
                },
            };
            if self.trail.closed.load(Ordering::SeqCst) {
                return None;
            }
            let epoch = node.epoch();
            self.trail.record(self.index, &connection, epoch);
            if let Some(trail) = &self.also_record_in {
                trail.record(self.index, &connection, epoch);
                // An extension that may put the key back: the node may
                // hold it from now on, whatever it answered the acquire.
                trail.set_refused(self.index, false);
            }
            let outcome = self.apply_on(node, &connection).await;
            if self.op.sets_fresh_key()
                && matches!(outcome, Ok(Answer::No | Answer::Waiting { .. }))
            {
                self.trail.set_refused(self.index, true);
            }
            Some(outcome)
        }
    }

    /// Sends a cleanup (release) of a key whose SET may have gone out on
    /// `set_on`, and that later requests may have set again on `also_on`:
    /// on each of those connections that still works, so that it runs
    /// after what it undoes, and when that is not the node's current
    /// connection, on the current one too. The best answer counts.
    // Not an `async fn`: that would keep its arguments twice in the future.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn send_after(
        self,
        set_on: Option<Arc<Connection>>,
        also_on: Vec<Arc<Connection>>,
    ) -> impl Future<Output = Outcome> + Send {
        async move {
            // Never sent, or sent on a connection that broke: what went
            // out there can no longer land behind us.
            let usable = |connection: &Arc<Connection>| connection.usable();
            if also_on.is_empty() {
                // The common case, without allocating: one connection, the
                // current one of the server that serves the keys now.
                match set_on.filter(usable) {
                    None => return self.send().await,
                    Some(set_on) => match self.serving(&set_on) {
                        Some(node) => {
                            self.trail.record(self.index, &set_on, node.epoch());
                            return Some(self.apply_on(&node, &set_on).await);
                        }
                        None => return Box::pin(self.on_all(vec![set_on])).await,
                    },
                }
            }
            let behind: Vec<Arc<Connection>> =
                set_on.into_iter().chain(also_on).filter(usable).collect();
            if behind.is_empty() {
                return self.send().await;
            }
            // Rare (the node reconnected since our SET), and the requests
            // together make a large future: boxed, so that the common case
            // above stays small to move and to allocate for every release.
            Box::pin(self.on_all(behind)).await
        }
    }

    /// The server of `connection`, if it is that server's current
    /// connection and the server serves the keys now.
    fn serving(&self, connection: &Connection) -> Option<Arc<Node>> {
        let node = match &self.member {
            Member::Server(node) => Arc::clone(node),
            Member::Cluster(_) => {
                let owner = connection.owner()?;
                let now = self.member.ready_node_for(&self.keys)?;
                Arc::ptr_eq(&owner, &now).then_some(owner)?
            }
        };
        node.is_current(connection).then_some(node)
    }

    /// The cleanup behind each of `behind`, and on the current connection.
    async fn on_all(self, behind: Vec<Arc<Connection>>) -> Outcome {
        let behind: Vec<(Arc<Node>, Arc<Connection>)> = behind
            .into_iter()
            .filter_map(|connection| Some((connection.owner()?, connection)))
            .collect();
        for (node, connection) in &behind {
            self.trail.record(self.index, connection, node.epoch());
        }
        let behind_them = async {
            let answers =
                futures::future::join_all(behind.iter().map(|(node, connection)| async {
                    Some(self.apply_on(node, connection).await)
                }))
                .await;
            answers.into_iter().max_by_key(rank).flatten()
        };
        let on_the_current = Request {
            member: self.member.clone(),
            keys: Arc::clone(&self.keys),
            value: Arc::clone(&self.value),
            trail: Arc::clone(&self.trail),
            also_record_in: self.also_record_in.clone(),
            ..self
        }
        .send();
        better_of(behind_them, on_the_current).await
    }

    /// Sends the request on `connection`, a connection of `node`. A
    /// redirection (a cluster's slot moved) has the member read its slot
    /// map again; a delete that met `MOVED` follows it.
    async fn apply_on(
        &self,
        node: &Node,
        connection: &Arc<Connection>,
    ) -> Result<Answer, NodeError> {
        let mut outcome = node
            .apply_on(connection, self.op, &self.keys, &self.value)
            .await;
        if matches!(&outcome, Err(error) if error.kind == NodeErrorKind::ScriptsMissing) {
            // Rare: boxed, so that the common case stays small.
            outcome = Box::pin(self.again_with_scripts(node, connection, outcome)).await;
        }
        let Err(NodeError {
            kind: kind @ NodeErrorKind::Redirected(said),
            ..
        }) = &outcome
        else {
            return outcome;
        };
        self.member.failed(kind);
        if !self.op.sets_keys() && said.starts_with("MOVED") {
            // Rare: boxed, so that the common case stays small.
            if let Some(followed) = Box::pin(self.follow_moved(node)).await {
                return followed;
            }
        }
        outcome
    }

    /// The request once more, on the same connection, after loading the
    /// scripts its server had lost: it did not run there (`NOSCRIPT`), so
    /// it runs at most once; within the round's bound, and only while the
    /// round is open.
    async fn again_with_scripts(
        &self,
        node: &Node,
        connection: &Arc<Connection>,
        missing: Result<Answer, NodeError>,
    ) -> Result<Answer, NodeError> {
        // As for its first send: once the round is closed nothing more
        // goes out (its cleanup may be queued on the connection by now).
        if !node.load_scripts(connection).await || self.trail.closed.load(Ordering::SeqCst) {
            return missing;
        }
        node.apply_on(connection, self.op, &self.keys, &self.value)
            .await
    }

    /// A delete whose slot has moved (`MOVED`: it did not run): sent to
    /// the master that serves the keys once the member has read its slot
    /// map again, within the round's bound. A delete may go twice (it
    /// compares our value); a key-setting request never does.
    async fn follow_moved(&self, from: &Node) -> Option<Result<Answer, NodeError>> {
        let Member::Cluster(shards) = &self.member else {
            return None;
        };
        shards.read_map().await.ok()?;
        let node = self.member.ready_node_for(&self.keys)?;
        if std::ptr::eq(Arc::as_ptr(&node), from) {
            return None;
        }
        let connection = match node.ready_connection() {
            Some(connection) => connection,
            None => node.connection().await.ok()?,
        };
        self.trail.record(self.index, &connection, node.epoch());
        Some(
            node.apply_on(&connection, self.op, &self.keys, &self.value)
                .await,
        )
    }
}

/// The first "yes" of two requests, else the better of both outcomes.
async fn better_of(a: impl Future<Output = Outcome>, b: impl Future<Output = Outcome>) -> Outcome {
    let (a, b) = (pin!(a), pin!(b));
    let (first, rest) = match select(a, b).await {
        Either::Left((first, rest)) => (first, Either::Right(rest)),
        Either::Right((first, rest)) => (first, Either::Left(rest)),
    };
    if rank(&first) == 3 {
        return first;
    }
    let second = rest.await;
    if rank(&second) > rank(&first) {
        second
    } else {
        first
    }
}

fn rank(outcome: &Outcome) -> u8 {
    match outcome {
        Some(Ok(Answer::Yes | Answer::YesWith(_) | Answer::YesInLine(_) | Answer::Restored)) => 3,
        Some(Ok(Answer::No | Answer::Waiting { .. })) => 2,
        Some(Err(_)) => 1,
        None => 0,
    }
}

/// What a round that is decided does with its unsent requests.
pub(crate) enum Late<R> {
    /// Never send them (acquire, extend, token rounds): a late SET could
    /// otherwise land after our own release.
    Cancel,
    /// Still send them until the deadline (releases), and hand the nodes
    /// that failed or stayed silent after the decision to `retry` (a
    /// `FnOnce(Vec<usize>)`): the round's caller sees only the failures
    /// before it, and a node killed a moment ago may answer its error
    /// after the quorum did.
    Send { retry: R },
}

impl Late<fn(Vec<usize>)> {
    /// `Cancel`, with a retry type named (it has none to call).
    pub(crate) fn cancel() -> Self {
        Self::Cancel
    }
}

/// The nodes and settings a round runs with.
pub(crate) struct Fanout<'a, J> {
    pub(crate) nodes: &'a Arc<[Member]>,
    pub(crate) background: &'a Arc<Background<J>>,
    pub(crate) timeout: Duration,
}

/// The decided outcome of one round.
pub(crate) struct Round {
    pub(crate) tally: Tally,
    pub(crate) errors: Vec<NodeError>,
    /// Numbers (tokens or counters) that granting nodes sent, by node index.
    pub(crate) numbers: Vec<(usize, u64)>,
    /// For a queued acquire: how soon after the round began the lock may
    /// be free on each node that queued the waiter, by node index (`None`
    /// where the node cannot tell): the node's bound counts from when its
    /// answer came, not from when the round ended, which in a burst of
    /// attempts can be many milliseconds later. Recorded only for such
    /// answers, so other rounds pay nothing.
    pub(crate) waiting: Vec<(usize, Option<Duration>)>,
    /// For a queued acquire: the nodes that granted it and left the waiter
    /// in their queue (others wait there; see [`plan::node_bit`]).
    granted_in_line: u64,
    /// When the round began.
    started: Instant,
}

impl Round {
    /// When the lock may be free on a quorum of nodes; see
    /// [`crate::wait::plan::opens_in`].
    fn opens_in(&self, quorum: usize) -> Option<Duration> {
        // Nodes that granted are free (the lost attempt's grants are rolled back).
        let granted = std::iter::repeat_n(Some(Duration::ZERO), self.tally.granted());
        let values: Vec<Option<Duration>> = granted
            .chain(self.waiting.iter().map(|&(_, v)| v))
            .collect();
        plan::opens_in(&values, quorum)
    }

    /// What a lost queued attempt's refusals tell its waiter: how soon a
    /// quorum may be free, and which nodes refused.
    pub(crate) fn refusals(&self, quorum: usize) -> plan::Refusals {
        let refused_by = self
            .waiting
            .iter()
            .fold(0, |nodes, &(i, _)| nodes | plan::node_bit(i));
        plan::Refusals {
            opens_in: self.opens_in(quorum),
            refused_by,
            in_line_on: refused_by | self.granted_in_line,
        }
    }

    /// The number sent by node `index` with its grant, if it granted.
    pub(crate) fn number_from(&self, index: usize) -> Option<u64> {
        self.numbers
            .iter()
            .find(|&&(node, _)| node == index)
            .map(|&(_, number)| number)
    }
}

impl<J: Clone + Send + 'static> Fanout<'_, J> {
    /// Sends `request(index, node)` to every node at once (nodes for which
    /// it gives `None` count as refusals, unasked) and tallies the answers
    /// until `tally` is decided or the deadline passes; nodes silent by
    /// then count as failed (timed out).
    pub(crate) async fn run<F, R>(
        &self,
        mut tally: Tally,
        trail: &Arc<Trail>,
        late: Late<R>,
        request: impl Fn(usize, &Member) -> Option<F>,
    ) -> Round
    where
        F: Future<Output = Outcome> + Send + 'static,
        R: FnOnce(Vec<usize>) + Send + 'static,
    {
        // One deadline for the whole round: every request starts now with
        // the same bound, and one timer is cheaper than one per node.
        let started = Instant::now();
        let deadline = started + self.timeout;
        let mut silent = vec![false; self.nodes.len()];
        let requests = self.nodes.iter().enumerate().map(|(i, node)| {
            let future = request(i, node);
            match future {
                Some(_) => silent[i] = true,
                None => {
                    tally.record(i, Vote::Refused);
                }
            }
            future
        });
        let mut flight = InFlight {
            requests: Some(Pending::new(requests)),
            silent,
            failed_late: Vec::new(),
            deadline,
            timeout: self.timeout,
            trail: Arc::clone(trail),
            nodes: Arc::clone(self.nodes),
            background: Arc::clone(self.background),
            late,
        };
        let mut round = Round {
            tally,
            errors: Vec::new(),
            numbers: Vec::new(),
            waiting: Vec::new(),
            granted_in_line: 0,
            started,
        };
        let expired = tokio::time::sleep_until(deadline);
        tokio::pin!(expired);
        while round.tally.decision() == Decision::Pending {
            let Some(requests) = flight.requests.as_mut() else {
                break;
            };
            let next = tokio::select! {
                biased;
                next = requests.next() => next,
                () = &mut expired => {
                    flight.expire(&mut round);
                    break;
                }
            };
            let Some((node, outcome)) = next else {
                break;
            };
            flight.silent[node] = false;
            round.record(node, outcome);
        }
        if matches!(flight.late, Late::Cancel) {
            trail.close();
        }
        // Replies already here need no background task; a lost round's
        // error names the failures among them too.
        let lost = matches!(round.tally.decision(), Decision::Lost(_));
        while let Some(Some((node, outcome))) = flight
            .requests
            .as_mut()
            .and_then(|r| r.next().now_or_never())
        {
            flight.silent[node] = false;
            if let Some(Err(error)) = outcome {
                flight.failed_late.push(node);
                if lost {
                    round.errors.push(error);
                }
            }
        }
        tracing::debug!(
            granted = round.tally.granted(),
            refused = round.tally.refused(),
            failed = round.tally.failed(),
            "round decided"
        );
        round
        // `flight` drops here: closes the trail, drains what is left.
    }
}

impl Round {
    fn record(&mut self, node: usize, outcome: Outcome) {
        let vote = match outcome {
            Some(Ok(Answer::Yes)) => Vote::Granted,
            Some(Ok(Answer::Restored)) => {
                tracing::debug!(node, "extension put our key back");
                Vote::Granted
            }
            Some(Ok(Answer::YesWith(number))) => {
                self.numbers.push((node, number));
                Vote::Granted
            }
            Some(Ok(Answer::YesInLine(number))) => {
                if let Some(number) = number {
                    self.numbers.push((node, number));
                }
                self.granted_in_line |= plan::node_bit(node);
                Vote::Granted
            }
            Some(Ok(Answer::No)) => Vote::Refused,
            Some(Ok(Answer::Waiting {
                opens_in_ms,
                behind,
            })) => {
                tracing::trace!(node, behind, "queued");
                let answered = self.started.elapsed();
                self.waiting.push((
                    node,
                    opens_in_ms.map(|ms| answered + Duration::from_millis(ms)),
                ));
                Vote::Refused
            }
            Some(Err(error)) => {
                tracing::debug!(node = %error.node, %error, "node request failed");
                self.errors.push(error);
                Vote::Failed
            }
            // Only a closed round cancels its requests, and it is no
            // longer tallied by then.
            None => Vote::Failed,
        };
        self.tally.record(node, vote);
    }
}

/// The requests of a round that have not answered yet.
struct InFlight<F, J, R>
where
    F: Future<Output = Outcome> + Send + 'static,
    J: Clone + Send + 'static,
    R: FnOnce(Vec<usize>) + Send + 'static,
{
    /// `None` only once handed to the background when dropped.
    requests: Option<Pending<F>>,
    /// Nodes asked that have neither answered nor been counted as timed out.
    silent: Vec<bool>,
    /// Nodes that failed after the round was decided (for `Late::Send`).
    failed_late: Vec<usize>,
    deadline: Instant,
    timeout: Duration,
    trail: Arc<Trail>,
    nodes: Arc<[Member]>,
    background: Arc<Background<J>>,
    late: Late<R>,
}

impl<F, J, R> InFlight<F, J, R>
where
    F: Future<Output = Outcome> + Send + 'static,
    J: Clone + Send + 'static,
    R: FnOnce(Vec<usize>) + Send + 'static,
{
    /// The deadline passed: every silent node timed out.
    fn expire(&mut self, round: &mut Round) {
        for (i, silent) in self.silent.iter_mut().enumerate() {
            if std::mem::take(silent) {
                let error = self.nodes[i].timed_out(self.trail.sent_on(i), self.timeout);
                tracing::debug!(node = %error.node, %error, "node request failed");
                round.errors.push(error);
                round.tally.record(i, Vote::Failed);
            }
        }
        // Past the deadline nothing is waited for.
        if let Some(requests) = &mut self.requests {
            requests.clear();
        }
    }
}

impl<F, J, R> Drop for InFlight<F, J, R>
where
    F: Future<Output = Outcome> + Send + 'static,
    J: Clone + Send + 'static,
    R: FnOnce(Vec<usize>) + Send + 'static,
{
    fn drop(&mut self) {
        let retry = match std::mem::replace(&mut self.late, Late::Cancel) {
            Late::Cancel => {
                self.trail.close();
                None
            }
            Late::Send { retry } => Some(retry),
        };
        let mut failed = std::mem::take(&mut self.failed_late);
        let Some(mut requests) = self.requests.take().filter(|r| !r.is_empty()) else {
            if let Some(retry) = retry.filter(|_| !failed.is_empty()) {
                retry(failed);
            }
            return;
        };
        let mut silent = std::mem::take(&mut self.silent);
        let (deadline, timeout) = (self.deadline, self.timeout);
        let (trail, nodes) = (Arc::clone(&self.trail), Arc::clone(&self.nodes));
        self.background.spawn(async move {
            let drain = async {
                while let Some((node, outcome)) = requests.next().await {
                    silent[node] = false;
                    if let Some(Err(_)) = outcome {
                        failed.push(node);
                    }
                }
            };
            let _ = tokio::time::timeout_at(deadline, drain).await;
            for (i, _) in silent.iter().enumerate().filter(|&(_, &silent)| silent) {
                nodes[i].timed_out(trail.sent_on(i), timeout);
                failed.push(i);
            }
            if let Some(retry) = retry.filter(|_| !failed.is_empty()) {
                retry(failed);
            }
        });
    }
}
