//! The one error type of the crate.
//!
//! Every failure a caller can meet is a variant here, and each message says
//! what happened and what to do about it. "Someone else holds it"
//! ([`Error::Contended`]) is kept apart from "the cluster is unhealthy"
//! ([`Error::QuorumUnavailable`]), because callers react to them differently.

use std::fmt;
use std::time::Duration;

use crate::fencing::FencingToken;
use crate::guard::judge::Quarantine;

/// Result alias used throughout the crate.
///
/// ```
/// async fn transfer(manager: &quorumlock::LockManager) -> quorumlock::Result<()> {
///     let lock = manager.lock_many(&["account:1", "account:2"]).await?;
///     // ... move the money ...
///     lock.release().await
/// }
/// # let _ = transfer;
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when configuring, taking, extending or
/// releasing a lock.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::Error;
///
/// let held = manager.lock("invoice:7").await?;
/// match manager.lock("invoice:7").no_wait().await {
///     Err(Error::Contended { refused, total, .. }) => {
///         assert!(refused >= 1 && total == 3, "decided once refusals rule out a quorum");
///     }
///     Err(other) if other.is_unavailable() => { /* retry later, or fall back */ }
///     Err(other) => return Err(other),
///     Ok(_) => unreachable!("held"),
/// }
/// # held.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A builder setting is out of range; raised by `build()`, before any I/O.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidConfig {
        /// The builder method at fault, e.g. `ttl`.
        setting: &'static str,
        /// What is wrong and what would be accepted.
        reason: String,
    },

    /// An argument of a call is unusable (empty resource name, bad TTL).
    #[error("invalid argument `{argument}`: {reason}")]
    InvalidArgument {
        /// The parameter at fault.
        argument: &'static str,
        /// What is wrong and what would be accepted.
        reason: String,
    },

    /// Another client holds the resource: on the last attempt, enough
    /// nodes refused that a quorum was impossible. (Earlier attempts may
    /// have failed otherwise; the error of the last one is returned.) A
    /// read lock is also refused while a writer waits for the resource
    /// (see [`crate::read_write`]).
    #[error(
        "resource `{resource}` is held by another client: {refused} of {total} nodes refused it \
         on the last of {attempts} attempt(s), too many for the rest to grant it; retry later{}, \
         or let the request wait for the release (longer, if it waited)",
        match .free_in {
            Some(left) => format!(" (the nodes expect it to be free in {left:?} at the latest unless extended)"),
            None => String::new(),
        }
    )]
    Contended {
        /// The resource asked for.
        resource: String,
        /// Attempts made.
        attempts: u32,
        /// Nodes that refused on the last attempt.
        refused: usize,
        /// Nodes in the cluster.
        total: usize,
        /// A retry-after hint for a single attempt
        /// ([`Request::no_wait`](crate::Request::no_wait)): when a quorum
        /// of nodes expected the resource to be free, by its keys' time
        /// left, read once the attempt was refused (the holder may extend
        /// or release it). `None` when the nodes cannot tell (a key without
        /// expiry, too few answers, or refused for another reason, e.g.
        /// queued waiters), and on the attempts of a waiting request (whose
        /// end is [`WaitTimedOut`](Error::WaitTimedOut), with its own).
        free_in: Option<Duration>,
    },

    /// A single attempt ([`Request::no_wait`](crate::Request::no_wait))
    /// met clients trying at the same moment, and the nodes' votes split
    /// between them, again and again: none holds the lock (each rolled its
    /// grants back). Unlike [`Contended`](Error::Contended), nobody else has
    /// the resource: a job "taken by another host" was taken by none.
    #[error(
        "resource `{resource}` is held by nobody: the nodes' votes split between clients \
         that tried at the same moment, on each of {attempts} attempt(s); try again, or wait \
         for it: `.wait(…)` on the request queues the contenders in order"
    )]
    SplitVote {
        /// The resource asked for.
        resource: String,
        /// Attempts made.
        attempts: u32,
    },

    /// Who holds a resource (or leads a role) cannot be told: the nodes
    /// that answered neither agree on a holder nor, a quorum of them, on
    /// it being free (a handover in progress, or nodes that some clients
    /// reach and others do not). Not "nobody": ask again.
    #[error(
        "who holds `{resource}` cannot be told: the {answered} node(s) that answered neither \
         agree on a holder nor on it being free (a handover in progress, or nodes this client \
         cannot reach); ask again"
    )]
    SplitView {
        /// The resource asked about.
        resource: String,
        /// Nodes that answered.
        answered: usize,
    },

    /// A waiting [`Request`](crate::Request) (the default; see
    /// [`Request::wait`](crate::Request::wait)) reached its deadline while another client still held
    /// it (or waiters queued earlier were still ahead).
    #[error(
        "resource `{resource}` was still held after waiting {waited:?} ({attempts} attempt(s)){}; \
         wait longer, or find out why the holder keeps it (for a read lock: a writer may hold \
         it or be queued ahead)",
        match .free_in {
            Some(left) => format!("; the nodes expected it to be free in {left:?} at the latest unless extended"),
            None => String::new(),
        }
    )]
    WaitTimedOut {
        /// The resource asked for.
        resource: String,
        /// How long the call waited.
        waited: Duration,
        /// Attempts made.
        attempts: u32,
        /// When the nodes that refused last expected a quorum of them to be
        /// free (the holder's key expiring, or the waiter queued first being
        /// dropped if it died), measured from the deadline; `None` when
        /// unknown (a key without expiry, too few answers).
        free_in: Option<Duration>,
    },

    /// Too few nodes answered for any quorum: the cluster is unhealthy.
    #[error(
        "quorum unavailable for `{resource}`: {failed} of {total} nodes failed, so fewer than the \
         {needed} needed can agree ({answered} answered before that was clear); bring the \
         failing nodes back: {}",
        list_node_errors(.errors)
    )]
    QuorumUnavailable {
        /// The resource asked for; `(connect)` from
        /// [`LockManager::connect`](crate::LockManager::connect).
        resource: String,
        /// Nodes that failed (error or timeout) before the outcome was decided.
        failed: usize,
        /// Nodes that answered (yes or no) before the outcome was decided.
        answered: usize,
        /// Nodes needed for a quorum.
        needed: usize,
        /// Nodes in the cluster.
        total: usize,
        /// What went wrong on each failing node, in the order seen.
        errors: Vec<NodeError>,
    },

    /// A quorum said yes, but so slowly that no validity was left
    /// (`ttl − elapsed − drift` was at or below the minimum).
    #[error(
        "acquired `{resource}` too slowly: reaching a quorum took {elapsed:?} of a {ttl:?} TTL, \
         leaving too little validity; use a longer TTL or faster nodes"
    )]
    TooSlow {
        /// The resource asked for.
        resource: String,
        /// Time from the first request to the quorum.
        elapsed: Duration,
        /// The TTL asked for.
        ttl: Duration,
    },

    /// A fencing counter holds a value that cannot issue a token: not a
    /// decimal integer (the key was overwritten by something else), or so
    /// large that it cannot grow (counter-node counters stop at 2^63 − 1,
    /// Redis' INCR limit; quorum counters and storage tokens at 2^64 − 1).
    /// Nothing was locked or written.
    #[error(
        "fencing counter `{key}` on node {node} is unusable: it {problem}; no token can be issued \
         for `{resource}` until the key is repaired (set it to a decimal integer at least as \
         high as the last token issued) or removed"
    )]
    InvalidCounter {
        /// The resource asked for.
        resource: String,
        /// `host:port` of the node holding the counter.
        node: String,
        /// The counter key.
        key: String,
        /// What the counter holds, and why that is unusable.
        problem: String,
    },

    /// The circuit breaker is open (see [`crate::health`]): the last
    /// acquisition attempts found the lock service unavailable, so this
    /// call failed at once, without network I/O. Releases and extensions
    /// are never held back by the breaker.
    #[error(
        "circuit breaker open: {failures} acquisition attempts in a row found the lock service \
         unavailable, so calls fail without contacting Redis{}; check the health of the nodes, \
         or run a fallback",
        if *.probing {
            "; one call is probing the nodes now, and its outcome closes or reopens the breaker"
                .to_owned()
        } else {
            format!(" for another {retry_in:?}, then one call probes the nodes")
        }
    )]
    CircuitOpen {
        /// Consecutive unavailable attempts when the breaker opened.
        failures: u32,
        /// How long until the cool-down ends and a probe may go out (zero
        /// while a probe is out).
        retry_in: Duration,
        /// Whether a probe is deciding right now.
        probing: bool,
    },

    /// A fenced write or fenced read offered a token lower than one the
    /// storage already accepted for the resource (by a write or a fenced
    /// read): a newer holder exists, and nothing was written, read or
    /// claimed.
    #[error(
        "`{resource}` fenced out: token {offered} is older than token {highest} already \
         accepted (by a write or a fenced read); this holder's lock has expired, so stop and do \
         not retry"
    )]
    FencedOut {
        /// The resource whose data was written or read.
        resource: String,
        /// The token offered with the refused write or read.
        offered: FencingToken,
        /// The highest token the storage has accepted for the resource.
        highest: FencingToken,
    },

    /// A single Redis server failed (e.g. the storage behind a fenced write).
    #[error(transparent)]
    Node(#[from] NodeError),

    /// The lock is no longer ours, so it cannot be extended or released.
    #[error("lock on `{resource}` is no longer held: {reason}")]
    NotHeld {
        /// The lock's resource.
        resource: String,
        /// How we know.
        reason: NotHeldReason,
    },

    /// A kept-alive lock's lease ended: the lock was lost, expired before
    /// an extension succeeded, or was held for `max_hold`; or the holder
    /// stopped keeping it alive ([`LossReason::Stopped`], seen by the
    /// lease's clones).
    #[error("lease on `{resource}` ended: {reason}")]
    Lost {
        /// The lock's resource.
        resource: String,
        /// Why.
        reason: LossReason,
    },

    /// Keeping a lock alive needs a tokio runtime to run the watchdog in.
    #[error("no tokio runtime: call keep_alive / run from inside a tokio runtime")]
    NoRuntime,

    /// The test cluster could not be started or controlled (testkit only).
    #[cfg(feature = "testkit")]
    #[error("testkit: {0}")]
    Testkit(String),
}

impl Error {
    /// The variant's name in `snake_case` (`"contended"`,
    /// `"quorum_unavailable"`, …): stable, cheap, for logs and metric
    /// labels, without parsing the message.
    ///
    /// ```
    /// let error = quorumlock::Error::NoRuntime;
    /// assert_eq!(error.kind(), "no_runtime");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidConfig { .. } => "invalid_config",
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::Contended { .. } => "contended",
            Error::SplitVote { .. } => "split_vote",
            Error::SplitView { .. } => "split_view",
            Error::WaitTimedOut { .. } => "wait_timed_out",
            Error::QuorumUnavailable { .. } => "quorum_unavailable",
            Error::TooSlow { .. } => "too_slow",
            Error::InvalidCounter { .. } => "invalid_counter",
            Error::CircuitOpen { .. } => "circuit_open",
            Error::FencedOut { .. } => "fenced_out",
            Error::Node(_) => "node",
            Error::NotHeld { .. } => "not_held",
            Error::Lost { .. } => "lost",
            Error::NoRuntime => "no_runtime",
            #[cfg(feature = "testkit")]
            Error::Testkit(_) => "testkit",
        }
    }
}

impl Error {
    /// Whether the error says the lock service could not decide, rather
    /// than that the resource is busy or the request was wrong: no quorum
    /// was reachable ([`QuorumUnavailable`](Error::QuorumUnavailable)), a
    /// quorum answered too late ([`TooSlow`](Error::TooSlow)), or the
    /// circuit breaker is open ([`CircuitOpen`](Error::CircuitOpen)).
    /// These are what the [`Backoff`](crate::Backoff) retries, what opens
    /// the breaker, and what lets
    /// [`run_or_fallback`](crate::Request::run_or_fallback) run its
    /// fallback. [`Contended`](Error::Contended) is never one.
    ///
    /// ```
    /// let error = quorumlock::Error::CircuitOpen {
    ///     failures: 5,
    ///     retry_in: std::time::Duration::from_secs(3),
    ///     probing: false,
    /// };
    /// assert!(error.is_unavailable());
    /// ```
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Error::QuorumUnavailable { .. } | Error::TooSlow { .. } | Error::CircuitOpen { .. }
        )
    }

    /// Whether the error says the resource was busy: another client held
    /// it ([`Contended`](Error::Contended)), still held it at the end of a
    /// wait ([`WaitTimedOut`](Error::WaitTimedOut)), or clients trying at
    /// the same moment split the votes
    /// ([`SplitVote`](Error::SplitVote)). What an HTTP handler answers with
    /// 409 Conflict; never true when [`is_unavailable`](Self::is_unavailable) is.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let held = manager.lock("invoice:7").await?;
    /// let busy = manager.lock("invoice:7").no_wait().await.unwrap_err();
    /// assert!(busy.is_busy() && !busy.is_unavailable());
    /// # held.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            Error::Contended { .. } | Error::WaitTimedOut { .. } | Error::SplitVote { .. }
        )
    }
}

/// How a lock was found to be no longer held.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use std::time::Duration;
/// use quorumlock::{Error, NotHeldReason};
///
/// let lock = manager.lock("job").ttl(Duration::from_secs(1)).await?;
/// tokio::time::sleep(lock.remaining()).await;
/// match lock.release().await {
///     Err(Error::NotHeld { reason: NotHeldReason::Expired, .. }) => {}
///     other => panic!("expected NotHeld(Expired), got {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// Its validity ran out on the local monotonic clock. Work done after
    /// that point was not protected by the lock.
    Expired,
    /// Too many nodes no longer store this lock's value: it expired there,
    /// was released, or the key was removed.
    Lost,
}

impl fmt::Display for NotHeldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => {
                "its validity ran out; work done since then was unprotected, acquire it again"
            }
            Self::Lost => {
                "the nodes no longer store this lock's value (expired, released or removed); \
                 acquire it again"
            }
        })
    }
}

/// Why a kept-alive lock ended.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::{Error, LossReason};
///
/// let keep = manager.lock("import").await?.keep_alive()?;
/// let lease = keep.lease();
/// keep.release().await?;
/// match lease.lost().await {
///     Error::Lost { reason: LossReason::Stopped, .. } => {} // we let go of it
///     other => panic!("expected the lease to end as stopped, got {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LossReason {
    /// Extensions kept failing until too little validity was left to try
    /// again; the last failure.
    ExtendFailed(Box<Error>),
    /// The nodes no longer hold this lock's value (it was taken over,
    /// removed, or a node lost its data).
    TakenOver,
    /// The validity ran out before an extension succeeded (an extension
    /// stalled, or the process was paused).
    Expired,
    /// The lock was held for the configured `max_hold`, and was released.
    MaxHoldReached(Duration),
    /// The holder stopped keeping it alive ([`KeepAlive::stop`](crate::KeepAlive::stop),
    /// [`release`](crate::KeepAlive::release), or dropping the
    /// [`KeepAlive`](crate::KeepAlive)): the lease no longer vouches for
    /// the lock, whatever became of it.
    Stopped,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExtendFailed(last) => write!(
                f,
                "extensions failed until its validity ran out (last error: {last}); the work \
                 was stopped"
            ),
            Self::TakenOver => f.write_str(
                "the nodes no longer hold its value (taken over or removed); the work was stopped",
            ),
            Self::Expired => f.write_str(
                "its validity ran out before an extension succeeded; the work was stopped",
            ),
            Self::MaxHoldReached(limit) => write!(
                f,
                "it was held for max_hold ({limit:?}); it is released once the work stops (or expires); \
                 raise max_hold for longer work"
            ),
            Self::Stopped => f.write_str(
                "the holder stopped keeping it alive (stopped, released or dropped its \
                 KeepAlive); the lease no longer vouches for the lock",
            ),
        }
    }
}

/// A failure on one node, named by its address (never its password).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::Error;
///
/// for node in [1, 2] {
///     cluster.kill(node)?; // node 0 (the token counter) stays up
/// }
/// match manager.lock("job").no_wait().await {
///     Err(Error::QuorumUnavailable { errors, .. }) => {
///         for error in &errors {
///             eprintln!("{}: {}", error.node, error.kind); // host:port, never a password
///         }
///     }
///     other => panic!("expected QuorumUnavailable, got {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node}: {kind}")]
pub struct NodeError {
    /// `host:port` of the node.
    pub node: String,
    /// What went wrong.
    pub kind: NodeErrorKind,
}

/// What went wrong on a node.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// use quorumlock::{Error, NodeErrorKind};
///
/// for node in [1, 2] {
///     cluster.kill(node)?; // node 0 (the token counter) stays up
/// }
/// let Err(Error::QuorumUnavailable { errors, .. }) = manager.lock("job").no_wait().await else {
///     panic!("two of three nodes are down");
/// };
/// assert!(errors.iter().all(|e| matches!(e.kind, NodeErrorKind::Connect(_) | NodeErrorKind::Timeout(_))));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeErrorKind {
    /// No reply within the per-request bound (`node_timeout`).
    Timeout(Duration),
    /// No connection could be made (refused, unreachable, handshake failed).
    Connect(String),
    /// The node answered with an error, or the connection broke mid-request.
    Redis(String),
    /// The node answered something a Redis server would not.
    UnexpectedReply(String),
    /// Quorum fencing's second round found our lock key gone on this node
    /// (it expired or was removed between the two rounds).
    KeyGone,
    /// The resource's fencing counter on this node is unusable (what it
    /// holds, and why); see [`Error::InvalidCounter`].
    InvalidCounter(String),
    /// The node guard does not count this node for now: why, and for how
    /// long at least (see [`crate::guard`]).
    Quarantined(Quarantine),
    /// The node's ACL does not let the user we connect as do what was
    /// asked: the denied command (`evalsha`), or the keys or channels
    /// refused, or a command inside one of our scripts (Redis does not
    /// name those). docs/operations.md ("ACL users") has the minimal ACL.
    PermissionDenied(String),
    /// The node of a member that is a Redis Cluster no longer serves the
    /// resource's slot (`MOVED`), or is moving it (`ASK`): what it said.
    /// The member counts as failing this round (nothing was done there)
    /// and its slot map is read again.
    Redirected(String),
    /// The node had lost quorumlock's scripts (`SCRIPT FLUSH`, or a restart
    /// met while it was loading), so the request did not run there. The
    /// scripts are loaded again and a lock request is sent once more
    /// within its round: this shows only when that failed too.
    ScriptsMissing,
    /// A shard master of a member that is a Redis Cluster did the write,
    /// but no replica acknowledged it within this long (`WAIT`): a
    /// failover could lose it, and a paused old master could repeat it, so
    /// it does not count (see `docs/scaling-out.md`). Zero: the write went
    /// out without a `WAIT`, before the master was seen to have replicas.
    Unreplicated(Duration),
}

impl fmt::Display for NodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(limit) => write!(f, "no reply within {limit:?}"),
            Self::Connect(why) => write!(f, "cannot connect: {why}"),
            Self::Redis(why) => write!(f, "redis error: {why}"),
            Self::UnexpectedReply(what) => write!(f, "unexpected reply: {what}"),
            Self::KeyGone => f.write_str(
                "our lock key was gone before the fencing token could be stored (expired or \
                 removed between the two rounds)",
            ),
            Self::InvalidCounter(problem) => write!(f, "unusable fencing counter: {problem}"),
            Self::Quarantined(quarantine) => quarantine.fmt(f),
            Self::PermissionDenied(denied) => write!(
                f,
                "permission denied: the node's ACL user may not use {denied}; grant it (see the \
                 minimal ACL in docs/operations.md, \"ACL users\")"
            ),
            Self::Redirected(said) => write!(
                f,
                "the cluster member's slot is served elsewhere now ({said}); its slot map is \
                 read again"
            ),
            Self::Unreplicated(waited) if waited.is_zero() => f.write_str(
                "the write went out before the shard master was seen to have replicas, so no \
                 replica was asked to acknowledge it and it does not count (the next one waits \
                 for an acknowledgement)",
            ),
            Self::Unreplicated(waited) => write!(
                f,
                "no replica of the shard acknowledged the write within {waited:?} (WAIT), so \
                 it does not count: a failover could lose it; check the shard's replicas"
            ),
            Self::ScriptsMissing => f.write_str(
                "the node had lost quorumlock's scripts (SCRIPT FLUSH or a restart); they are \
                 loaded again",
            ),
        }
    }
}

fn list_node_errors(errors: &[NodeError]) -> String {
    if errors.is_empty() {
        return "no node reported an error".to_owned();
    }
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_names_every_failing_node() {
        let err = Error::QuorumUnavailable {
            resource: "r".into(),
            failed: 3,
            answered: 2,
            needed: 3,
            total: 5,
            errors: vec![
                NodeError {
                    node: "127.0.0.1:7001".into(),
                    kind: NodeErrorKind::Timeout(Duration::from_millis(50)),
                },
                NodeError {
                    node: "127.0.0.1:7002".into(),
                    kind: NodeErrorKind::Connect("connection refused".into()),
                },
            ],
        };
        let text = err.to_string();
        assert!(text.contains("3 of 5 nodes failed"), "{text}");
        assert!(text.contains("the 3 needed"), "{text}");
        assert!(
            text.contains("127.0.0.1:7001: no reply within 50ms"),
            "{text}"
        );
        assert!(text.contains("127.0.0.1:7002: cannot connect"), "{text}");
    }

    #[test]
    fn kinds_name_the_variant() {
        let table = [
            (
                Error::Contended {
                    resource: "r".into(),
                    attempts: 1,
                    refused: 3,
                    total: 5,
                    free_in: None,
                },
                "contended",
            ),
            (
                Error::NotHeld {
                    resource: "r".into(),
                    reason: NotHeldReason::Lost,
                },
                "not_held",
            ),
            (
                Error::InvalidArgument {
                    argument: "ttl",
                    reason: "zero".into(),
                },
                "invalid_argument",
            ),
            #[cfg(feature = "testkit")]
            (Error::Testkit("x".into()), "testkit"),
        ];
        for (error, kind) in table {
            assert_eq!(error.kind(), kind, "{error:?}");
        }
    }

    #[test]
    fn an_open_breaker_says_until_when_or_that_a_probe_is_out() {
        let open = Error::CircuitOpen {
            failures: 5,
            retry_in: Duration::from_millis(2500),
            probing: false,
        };
        let text = open.to_string();
        assert!(text.contains("5 acquisition attempts in a row"), "{text}");
        assert!(!text.contains("  "), "{text}");
        assert!(text.contains("for another 2.5s"), "{text}");
        let probing = Error::CircuitOpen {
            failures: 5,
            retry_in: Duration::ZERO,
            probing: true,
        };
        assert!(probing.to_string().contains("probing"), "{probing}");
        assert_eq!(open.kind(), "circuit_open");
    }

    #[test]
    fn contended_says_the_refusals_decided_it_and_nothing_of_read_locks() {
        let held = Error::Contended {
            resource: "r".into(),
            attempts: 1,
            refused: 2,
            total: 5,
            free_in: None,
        };
        let text = held.to_string();
        assert!(
            text.contains("2 of 5 nodes refused it") && text.contains("too many for the rest"),
            "{text}"
        );
        assert!(!text.contains("read lock"), "{text}");
        assert!(!text.contains("free in"), "{text}");
        assert!(held.is_busy() && !held.is_unavailable());
        let hinted = Error::Contended {
            resource: "r".into(),
            attempts: 1,
            refused: 2,
            total: 5,
            free_in: Some(Duration::from_millis(2500)),
        };
        let text = hinted.to_string();
        assert!(
            text.contains("retry later (the nodes expect it to be free in 2.5s at the latest"),
            "{text}"
        );
    }

    #[test]
    fn not_held_says_what_to_do() {
        let err = Error::NotHeld {
            resource: "order:1".into(),
            reason: NotHeldReason::Expired,
        };
        assert!(err.to_string().contains("acquire it again"));
    }
}
