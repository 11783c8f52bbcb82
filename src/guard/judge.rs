//! The pure judge of a node: from what was observed of it (settings,
//! identity, clock samples) to findings for `quorumlock doctor` and to the
//! reason, if any, that the run-time guard stops counting it.
//!
//! Nothing here does I/O or reads a clock; the same functions decide for
//! the doctor and for every [`LockManager`](crate::LockManager), so the two
//! cannot disagree: a `Fail` finding is exactly a reason to quarantine.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

/// A span of time a server reported in coarse units: the reading, and how
/// far the real span may lie from it either way. It has no exact value on
/// purpose: a reader takes the bound that goes against the lock holder
/// (the shortest possible age of a restart, say), so a reading in whole
/// seconds cannot be used as if it were exact.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::Reported;
///
/// // `uptime_in_seconds:5` is floor(now) − floor(start): anything above
/// // 4 s and below 6 s.
/// let uptime = Reported::whole_seconds(5);
/// assert_eq!(uptime.at_least(), Duration::from_secs(4));
/// assert_eq!(uptime.to_string(), "5s (±1s)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    reading: Duration,
    error: Duration,
}

impl Reported {
    /// A difference of two clock readings each truncated to whole seconds,
    /// as `INFO`'s `uptime_in_seconds` (floor(now) − floor(start)): the real
    /// span is within one second of it, either way.
    pub fn whole_seconds(seconds: u64) -> Self {
        Self {
            reading: Duration::from_secs(seconds),
            error: Duration::from_secs(1),
        }
    }

    /// A difference of two clock readings each truncated to whole
    /// milliseconds (the data-set mark's age, `PTTL`): the real span is
    /// within a millisecond of it, either way.
    pub fn whole_millis(millis: u64) -> Self {
        Self {
            reading: Duration::from_millis(millis),
            error: Duration::from_millis(1),
        }
    }

    /// The shortest the real span can be.
    pub fn at_least(self) -> Duration {
        self.reading.saturating_sub(self.error)
    }

    /// Whether the real span is surely longer than `span` (the reading
    /// exceeds it by at least the error).
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::internals::judge::Reported;
    ///
    /// assert!(Reported::whole_seconds(3).surely_longer_than(Duration::from_secs(2)));
    /// assert!(!Reported::whole_seconds(3).surely_longer_than(Duration::from_millis(2_001)));
    /// assert!(!Reported::whole_seconds(0).surely_longer_than(Duration::ZERO));
    /// ```
    pub fn surely_longer_than(self, span: Duration) -> bool {
        self.reading >= span.saturating_add(self.error)
    }
}

impl fmt::Display for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} (±{:?})", self.reading, self.error)
    }
}

/// What was observed of one node; `None` where it could not be read
/// (`CONFIG` renamed or forbidden, `INFO` section missing).
///
/// ```
/// use quorumlock::internals::judge::NodeFacts;
///
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.appendonly = Some(true);
/// facts.appendfsync = Some("always".into());
/// assert!(facts.persists_every_write());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct NodeFacts {
    /// `host:port`.
    pub name: String,
    /// Why the node could not be reached, if it could not.
    pub unreachable: Option<String>,
    /// Round-trip time of a PING.
    pub latency: Option<Duration>,
    /// `redis_version`.
    pub version: Option<String>,
    /// `run_id`: changes on every start of the server process.
    pub run_id: Option<String>,
    /// `uptime_in_seconds`, in whole seconds as reported.
    pub uptime: Option<Reported>,
    /// Whether the append-only file is on (`aof_enabled`, or `CONFIG GET
    /// appendonly`).
    pub appendonly: Option<bool>,
    /// `CONFIG GET appendfsync` (not in `INFO`).
    pub appendfsync: Option<String>,
    /// `maxmemory_policy`.
    pub maxmemory_policy: Option<String>,
    /// `maxmemory` in bytes; 0 is no limit.
    pub maxmemory: Option<u64>,
    /// `role`: `master` or `slave`.
    pub role: Option<String>,
    /// `connected_slaves`.
    pub replicas: Option<u64>,
    /// `master_replid`: changes when the node is promoted or starts to
    /// replicate from another master (then its data set is replaced).
    pub replid: Option<String>,
    /// This process was a replica once and was promoted (`second_repl_offset`
    /// is set): its data set came by asynchronous replication.
    pub promoted: Option<bool>,
    /// An AOF rewrite is running or scheduled (`aof_rewrite_in_progress`,
    /// `aof_rewrite_scheduled`): after `appendonly` is switched on at run
    /// time, nothing is on disk until the first one ends.
    pub aof_rewriting: Option<bool>,
    /// `aof_last_write_status` is `ok`.
    pub aof_write_ok: Option<bool>,
    /// `loading`: the node is still loading its data set.
    pub loading: Option<bool>,
    /// The node's data set, as its marker tells (see [`DataSet`]); `None`
    /// where the marker could not be read or written.
    pub dataset: Option<DataSet>,
    /// The node's address, when known.
    pub ip: Option<IpAddr>,
    /// The node's clock rate against ours (1.0 = same speed), measured by
    /// the doctor from two `TIME` samples.
    pub clock_rate: Option<f64>,
    /// What the two clock samples above say, judged as the guard does.
    pub clock_fault: Option<ClockFault>,
    /// What the doctor's bounded scan for keys of the layout before hash
    /// tags saw (see `keys::is_old_layout_key`): locks held or waited for
    /// by clients of an older quorumlock. `Err`: the scan failed.
    pub old_layout: Option<Result<LayoutScan, String>>,
}

/// A bounded scan of a node's keys for ones of the older layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutScan {
    /// Old-layout lock and waiter keys seen.
    pub found: u64,
    /// Whether the scan went through every key (else it stopped at its
    /// bound).
    pub complete: bool,
}

impl NodeFacts {
    /// Facts about the node named `name`, nothing observed yet.
    ///
    /// ```
    /// use quorumlock::internals::judge::NodeFacts;
    ///
    /// let facts = NodeFacts::named("127.0.0.1:7001");
    /// assert_eq!((facts.name.as_str(), facts.run_id.as_deref()), ("127.0.0.1:7001", None));
    /// ```
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Whether every write reaches the disk before it is acknowledged
    /// (`appendonly yes` and `appendfsync always`), so a restarted node
    /// remembers every lock it granted. Unknown settings count as no.
    ///
    /// ```
    /// use quorumlock::internals::judge::NodeFacts;
    ///
    /// let mut facts = NodeFacts::named("127.0.0.1:7001");
    /// facts.appendonly = Some(true);
    /// facts.appendfsync = Some("everysec".into());
    /// assert!(!facts.persists_every_write(), "up to a second of writes lost on a crash");
    /// facts.appendfsync = Some("always".into());
    /// assert!(facts.persists_every_write());
    /// ```
    pub fn persists_every_write(&self) -> bool {
        self.appendonly == Some(true)
            && self.appendfsync.as_deref() == Some("always")
            && self.aof_rewriting != Some(true)
            && self.aof_write_ok != Some(false)
            && self.loading != Some(true)
    }

    /// The persistence settings, as words for a message.
    ///
    /// ```
    /// use quorumlock::internals::judge::NodeFacts;
    ///
    /// let mut facts = NodeFacts::named("127.0.0.1:7001");
    /// facts.appendonly = Some(false);
    /// assert_eq!(facts.persistence(), "appendonly no");
    /// ```
    pub fn persistence(&self) -> String {
        match (self.appendonly, self.appendfsync.as_deref()) {
            (Some(false), _) => "appendonly no".into(),
            _ if self.loading == Some(true) => "still loading its data".into(),
            _ if self.aof_write_ok == Some(false) => "its last AOF write failed".into(),
            (Some(true), Some("always")) if self.aof_rewriting == Some(true) => {
                "appendfsync always, AOF rewrite pending (after appendonly was switched on, \
                 nothing is on disk until it ends)"
                    .into()
            }
            (Some(true), Some(fsync)) => format!("appendfsync {fsync}"),
            (_, Some(fsync)) => format!("appendfsync {fsync}"),
            (_, None) => "appendfsync unknown (CONFIG GET unavailable)".into(),
        }
    }
}

/// Where the node guard keeps its mark of a node's data set (a string, no
/// TTL): `<id> <run_id> <ms>`, a random id given when the mark was first
/// written, the `run_id` of the process that wrote it, and that process's
/// clock then. Written by the first manager that observes the node.
pub const DATA_SET_KEY: &str = "quorumlock:node";

/// A number observations of a node raise (no TTL; each manager at most
/// once a second): a data set that comes back with a lower one is an
/// older copy.
pub const DATA_SET_SEQ_KEY: &str = "quorumlock:node:seq";

/// A node's data set, as the guard's mark on it ([`DATA_SET_KEY`]) tells:
/// a data set that comes back without its mark, with another one, or with
/// a lower [`seq`](Self::seq) has lost writes it acknowledged, whatever
/// the node's settings say.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::DataSet;
///
/// let data = DataSet::from_mark("9f3c a1b2 1000", 61_000, 7).expect("a mark");
/// assert_eq!((data.id.as_str(), data.born_in.as_str()), ("9f3c", "a1b2"));
/// assert_eq!((data.age.at_least(), data.seq), (Duration::from_millis(59_999), 7));
/// assert!(data.loaded_by("c3d4"), "another process wrote the mark: it was loaded");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DataSet {
    /// Random, given when the mark was first written.
    pub id: String,
    /// The `run_id` of the process that wrote the mark.
    pub born_in: String,
    /// How long ago that was, by the node's clock (in whole ms).
    pub age: Reported,
    /// The observations' sequence number ([`DATA_SET_SEQ_KEY`]) as found.
    pub seq: u64,
    /// The same after this observation raised it (or `seq`): what later
    /// observations must find at least.
    pub raised: u64,
}

impl DataSet {
    /// This data set, its number raised to `raised` by the observation
    /// that found it (kept if that is lower).
    pub fn raised_to(mut self, raised: u64) -> Self {
        self.raised = raised.max(self.seq);
        self
    }

    /// From the mark's text, the node's time now (ms since the epoch, as
    /// its `TIME` says) and the sequence number; `None` for text that is
    /// not a mark.
    ///
    /// ```
    /// use quorumlock::internals::judge::DataSet;
    ///
    /// assert!(DataSet::from_mark("not a mark", 0, 0).is_none());
    /// ```
    pub fn from_mark(mark: &str, now_ms: u64, seq: u64) -> Option<Self> {
        let mut parts = mark.split(' ');
        let (id, born_in, at) = (parts.next()?, parts.next()?, parts.next()?);
        let at: u64 = at.parse().ok()?;
        if id.is_empty() || born_in.is_empty() || parts.next().is_some() {
            return None;
        }
        Some(Self {
            id: id.to_owned(),
            born_in: born_in.to_owned(),
            age: Reported::whole_millis(now_ms.saturating_sub(at)),
            seq,
            raised: seq,
        })
    }

    /// Whether process `run_id` loaded it (an earlier process wrote the
    /// mark) rather than began it.
    pub fn loaded_by(&self, run_id: &str) -> bool {
        // A cluster node signs its marks `<run_id>@<node id>/<epoch>`.
        self.born_in.split('@').next() != Some(run_id)
    }
}

/// Why a node does not count toward a quorum for now.
///
/// ```
/// use quorumlock::guard::QuarantineReason;
///
/// let reason = QuarantineReason::ClockRate { rate_milli: 2000 };
/// assert_eq!(reason.label(), "clock_rate");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuarantineReason {
    /// The node restarted, or was met for the first time soon after its
    /// start, and may have lost writes it acknowledged: a process did not
    /// persist every write, or it came back without its data set.
    Restarted {
        /// What was seen, e.g. "restarted; the previous process ran with
        /// appendfsync everysec".
        cause: String,
    },
    /// The node's data set changed under a running process (flushed,
    /// replaced by replication, or an older copy loaded), or, met for the
    /// first time, it is younger than the quarantine window: locks granted
    /// before may be forgotten.
    DataSet {
        /// What was seen.
        cause: String,
    },
    /// The node could not be observed (`INFO` refused, failing or timed
    /// out): a restart or a lost data set would go unseen, so it is not
    /// counted until an observation succeeds.
    Unobserved {
        /// Why.
        why: String,
    },
    /// Its clock runs faster or slower than ours by more than the drift
    /// factor, so it expires keys at the wrong time.
    ClockRate {
        /// Its rate against ours, in thousandths (2000 = twice as fast).
        rate_milli: u64,
    },
    /// Its clock jumped (a step, not a rate).
    ClockStep {
        /// How far, in milliseconds; positive is forward (keys expire early).
        by_ms: i64,
    },
    /// It may evict keys with a TTL under memory pressure (every lock key
    /// has one): an evicted lock key is a lock granted twice.
    Evicts {
        /// Its `maxmemory-policy`.
        policy: String,
    },
    /// It is a replica, not an independent master.
    Replica {
        /// Its role.
        role: String,
    },
    /// It is the same server process (the same `run_id`) as another node
    /// of this manager, reached under another name (`localhost` and
    /// `127.0.0.1`, a DNS alias, a proxy): its answers would count twice.
    SameProcess {
        /// The other node's name.
        as_node: String,
    },
}

impl QuarantineReason {
    /// A short label for logs and metrics: `restart`, `data_set`,
    /// `unobserved`, `clock_rate`, `clock_step`, `eviction`, `replica`,
    /// `same_process`.
    ///
    /// ```
    /// use quorumlock::guard::QuarantineReason;
    ///
    /// let reason = QuarantineReason::Restarted { cause: "started with appendfsync everysec".into() };
    /// assert_eq!(reason.label(), "restart");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Self::Restarted { .. } => "restart",
            Self::DataSet { .. } => "data_set",
            Self::Unobserved { .. } => "unobserved",
            Self::ClockRate { .. } => "clock_rate",
            Self::ClockStep { .. } => "clock_step",
            Self::Evicts { .. } => "eviction",
            Self::Replica { .. } => "replica",
            Self::SameProcess { .. } => "same_process",
        }
    }
}

impl fmt::Display for QuarantineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Restarted { cause } | Self::DataSet { cause } => {
                write!(f, "{cause}, so it may have forgotten locks it granted")
            }
            Self::Unobserved { why } => write!(
                f,
                "cannot be observed ({why}), so a restart or a lost data set would go unseen"
            ),
            Self::ClockRate { rate_milli } => write!(
                f,
                "its clock runs at {:.3}× ours, outside the drift factor",
                *rate_milli as f64 / 1000.0
            ),
            Self::ClockStep { by_ms } => write!(f, "its clock jumped by {by_ms:+} ms"),
            Self::Evicts { policy } => write!(
                f,
                "maxmemory-policy {policy} with a memory limit can evict lock keys; set noeviction"
            ),
            Self::Replica { role } => {
                write!(f, "role {role}: lock nodes must be independent masters")
            }
            Self::SameProcess { as_node } => write!(
                f,
                "the same Redis process as node {as_node} (same run_id), reached under another \
                 name: one server would count twice; name each server once"
            ),
        }
    }
}

/// A node the guard does not count: why, and for how long at least.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// for (node, quarantine) in manager.quarantined_nodes() {
///     eprintln!("{node}: {quarantine}"); // e.g. quarantined: restarted with appendfsync everysec
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    /// Why.
    pub reason: QuarantineReason,
    /// Time left: `Some` for restarts, data sets and clock faults (a
    /// clock fault that persists keeps extending it); `None` for settings,
    /// which last until the node is reconfigured, and for a node that
    /// cannot be observed, until it can.
    pub remaining: Option<Duration>,
}

impl fmt::Display for Quarantine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "quarantined: {}", self.reason)?;
        match (self.remaining, &self.reason) {
            (Some(left), _) => write!(f, "; counted again in {left:.1?} at the earliest"),
            (None, QuarantineReason::Unobserved { .. }) => {
                f.write_str("; counted again once observed")
            }
            (None, _) => f.write_str("; counted again once reconfigured"),
        }
    }
}

/// When a node lost writes it had acknowledged, at the latest, as far as
/// one observation tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostAt {
    /// This long ago: when its process started (its uptime), or when its
    /// data set began.
    Ago(Duration),
    /// Since the observation before this one.
    Now,
}

/// A node that may have lost writes it acknowledged: why, and when at the
/// latest. The guard quarantines it until a window after that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// Why.
    pub reason: QuarantineReason,
    /// When, at the latest.
    pub at: LostAt,
}

/// What a node met for the first time may have lost. Nothing is known of
/// its earlier processes, so it is trusted at once only where what it shows
/// leaves no room for a loss within the quarantine `window`: its data set
/// is older than the window, and its process either is older than the
/// window too, or persists every write and *loaded* that data set at its
/// start (the mark was written by an earlier process). A process younger
/// than the window that came up empty, or that does not persist every
/// write, may have forgotten locks its predecessor granted; so may a data
/// set younger than the window. A promoted replica (a failover, e.g. a
/// Redis Cluster shard's) may lack what its old master granted, and when
/// that master stopped granting cannot be read: it is quarantined from now
/// on for the window. What first sight cannot tell: whether the
/// previous process persisted every write (a manager that met it knows),
/// and a node clock stepped forward since the start (ages come from it).
/// `None` for facts without a `run_id` (an observation that failed).
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::{DataSet, LostAt, NodeFacts, Reported, first_sight};
///
/// let window = Duration::from_secs(10);
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.run_id = Some("b".into());
/// facts.uptime = Some(Reported::whole_seconds(4));
/// facts.appendonly = Some(true);
/// facts.appendfsync = Some("always".into());
/// // Up "4 s" (3 to 5) with a data set it loaded (marked by process "a" an hour ago).
/// facts.dataset = DataSet::from_mark("x a 0", 3_600_000, 9);
/// assert_eq!(first_sight(&facts, window), None);
/// // Up "4 s" with nothing loaded: it may have forgotten locks, and its
/// // start is taken as recent as the reading allows.
/// facts.dataset = DataSet::from_mark("y b 3596000", 3_600_000, 1);
/// let loss = first_sight(&facts, window).expect("quarantined");
/// assert_eq!(loss.at, LostAt::Ago(Duration::from_secs(3)));
/// ```
pub fn first_sight(facts: &NodeFacts, window: Duration) -> Option<Loss> {
    let run_id = facts.run_id.as_deref()?;
    if facts.promoted == Some(true) && facts.role.as_deref() == Some("master") {
        // Its data set came by asynchronous replication: its old master may
        // have granted locks it never received. When it stopped cannot be
        // read: not from the promotion, nor from this node's own mark,
        // since an old master paused past its replacement (SIGSTOP, a
        // frozen VM) serves the writes queued for it before it hears of it
        // (found in review: a fresh client dated from the mark was granted
        // while the old master's late lock had 0.4 s left). From now on.
        return Some(Loss {
            reason: QuarantineReason::Restarted {
                cause: "a promoted replica (a failover): its copy came by asynchronous \
                        replication and may lack locks its old master granted"
                    .to_owned(),
            },
            at: LostAt::Now,
        });
    }
    // Ages come in coarse units: what counts is the shortest each can be
    // (a restart as recent as the reading allows).
    let reported = facts.uptime.unwrap_or(Reported::whole_seconds(0));
    let uptime = reported.at_least();
    let young = |age: Duration| age < window;
    if let Some(data) = &facts.dataset
        && young(data.age.at_least())
        && (data.loaded_by(run_id) || !young(uptime))
    {
        return Some(Loss {
            reason: QuarantineReason::DataSet {
                cause: format!("its data set began {} ago", data.age),
            },
            at: LostAt::Ago(data.age.at_least()),
        });
    }
    if !young(uptime) {
        return None;
    }
    let cause = if !facts.persists_every_write() {
        format!("started {reported} ago with {}", facts.persistence())
    } else {
        match &facts.dataset {
            Some(data) if data.loaded_by(run_id) => return None,
            Some(_) => format!(
                "started {reported} ago with an empty data set (the nodes of a new cluster, \
                 which never served a lock, can be marked new: docs/operations.md, \
                 \"A new cluster's first start\")"
            ),
            None => format!("started {reported} ago; whether it loaded its data cannot be read"),
        }
    };
    Some(Loss {
        reason: QuarantineReason::Restarted { cause },
        at: LostAt::Ago(uptime),
    })
}

/// What a manager remembers of a node between observations: its process,
/// its data set, and whether it persisted every write when last observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Known {
    run_id: String,
    replid: Option<String>,
    /// The data set's id and sequence number.
    dataset: Option<(String, u64)>,
    durable: bool,
    persistence: String,
}

impl Known {
    /// The process it was.
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    /// What `facts` say, for next time; `None` without a `run_id`.
    pub(crate) fn of(facts: &NodeFacts) -> Option<Self> {
        Some(Self {
            run_id: facts.run_id.clone()?,
            replid: facts.replid.clone(),
            dataset: facts.dataset.as_ref().map(|d| (d.id.clone(), d.raised)),
            durable: facts.persists_every_write(),
            persistence: facts.persistence(),
        })
    }
}

/// What a node may have lost since it was last observed as `known`. A
/// restart (new `run_id`) is safe only if the old process persisted every
/// write when last observed, the new one does, and it came back with the
/// same data set, no older; a running process must keep its replication
/// id (`REPLICAOF` or a failover replaces the data set) and its data set
/// (`FLUSHALL`, an older copy loaded). A new process that was running
/// already when the old one last answered (`heard_ago`) is another server
/// behind the same address (a failover to a replica, a virtual IP moved):
/// its copy may lack writes the old one acknowledged, whatever both
/// persist. A setting changed and a crash between two observations are
/// not seen. `None` for facts without a `run_id` (an observation that
/// failed).
pub(crate) fn since_known(
    known: &Known,
    facts: &NodeFacts,
    heard_ago: Option<Duration>,
) -> Option<Loss> {
    let run_id = facts.run_id.as_deref()?;
    let now = facts.dataset.as_ref().map(|d| (d.id.as_str(), d.seq));
    let before = known.dataset.as_ref().map(|(id, seq)| (id.as_str(), *seq));
    let data_lost = match (before, now) {
        (Some((id, _)), Some((new_id, _))) if id != new_id => Some("another data set"),
        (Some((_, seq)), Some((_, new_seq))) if new_seq < seq => {
            Some("an older copy of its data set")
        }
        (Some(_), None) => Some("its data set's mark gone"),
        _ => None,
    };
    if run_id != known.run_id {
        // The shortest the new process can have run: a loss as recent as
        // the reading allows, and "running before" only when it surely was.
        let reported = facts.uptime.unwrap_or(Reported::whole_seconds(0));
        let uptime = reported.at_least();
        let running_before = heard_ago.is_some_and(|ago| reported.surely_longer_than(ago));
        if running_before || facts.promoted == Some(true) {
            let how = if running_before {
                format!("up {reported}, since before the previous one last answered")
            } else {
                "a promoted replica".to_owned()
            };
            return Some(Loss {
                reason: QuarantineReason::Restarted {
                    cause: format!(
                        "another server answers at its address ({how}): a failover or a \
                         replacement, whose copy may lack writes the previous one acknowledged"
                    ),
                },
                at: LostAt::Now,
            });
        }
        let cause = if !known.durable {
            format!(
                "restarted; the previous process ran with {}",
                known.persistence
            )
        } else if !facts.persists_every_write() {
            format!("restarted with {}", facts.persistence())
        } else if let Some(what) = data_lost {
            format!("restarted with {what}")
        } else {
            return None;
        };
        return Some(Loss {
            reason: QuarantineReason::Restarted { cause },
            at: LostAt::Ago(uptime),
        });
    }
    let cause = match (&known.replid, &facts.replid) {
        (Some(before), Some(now)) if before != now => {
            "its replication id changed (REPLICAOF, or a failover): its data set may have been \
             replaced"
                .to_owned()
        }
        _ => format!("the same process shows {}", data_lost?),
    };
    Some(Loss {
        reason: QuarantineReason::DataSet { cause },
        at: LostAt::Now,
    })
}

/// A settings reason to quarantine: a replica, or an eviction policy
/// that can remove lock keys. A policy other than `noeviction` with no
/// memory limit (`maxmemory 0`) never evicts, so it is no reason (the
/// doctor warns). Unknown settings are assumed fine.
///
/// ```
/// use quorumlock::internals::judge::{NodeFacts, settings_fault};
///
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.role = Some("master".into());
/// assert!(settings_fault(&facts).is_none());
/// facts.role = Some("slave".into());
/// assert!(settings_fault(&facts).is_some(), "a replica is never counted");
/// ```
pub fn settings_fault(facts: &NodeFacts) -> Option<QuarantineReason> {
    if let Some(role) = facts.role.as_deref()
        && role != "master"
    {
        return Some(QuarantineReason::Replica { role: role.into() });
    }
    match (facts.maxmemory_policy.as_deref(), facts.maxmemory) {
        (Some(policy), Some(limit)) if policy != "noeviction" && limit > 0 => {
            Some(QuarantineReason::Evicts {
                policy: policy.into(),
            })
        }
        _ => None,
    }
}

/// One reading of a node's clock (`TIME`), and when we asked and heard
/// back on our monotonic clock: the server read its clock in between.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::ClockSample;
///
/// let sent = tokio::time::Instant::now();
/// let sample = ClockSample { server_us: 1_700_000_000_000_000, sent, received: sent + Duration::from_micros(80) };
/// assert!(sample.received > sample.sent);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// The server's time, microseconds since the Unix epoch.
    pub server_us: u64,
    /// Just before the request was sent.
    pub sent: Instant,
    /// Just after the reply arrived.
    pub received: Instant,
}

/// A clock that does not keep time with ours.
///
/// ```
/// use quorumlock::internals::judge::{ClockFault, QuarantineReason};
///
/// let fault = ClockFault::Step { by_ms: 5_000 };
/// assert_eq!(QuarantineReason::from(fault), QuarantineReason::ClockStep { by_ms: 5_000 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockFault {
    /// It runs at this rate against ours, in thousandths.
    Rate {
        /// 2000 = twice as fast.
        rate_milli: u64,
    },
    /// It jumped by this much, in milliseconds (positive: forward).
    Step {
        /// The jump.
        by_ms: i64,
    },
}

impl From<ClockFault> for QuarantineReason {
    fn from(fault: ClockFault) -> Self {
        match fault {
            ClockFault::Rate { rate_milli } => Self::ClockRate { rate_milli },
            ClockFault::Step { by_ms } => Self::ClockStep { by_ms },
        }
    }
}

/// Steps of a node's clock up to this size are tolerated (waited out):
/// they shorten a key by less than the drift allowance's fixed 2 ms.
pub const CLOCK_STEP_TOLERANCE: Duration = Duration::from_millis(1);

/// Gains above this that are also more than twice the time elapsed are
/// reported as a jump rather than a rate.
const STEP_REPORT_THRESHOLD_US: f64 = 1_000_000.0;

/// Judges two samples of one node's clock (`older` first). The server
/// read its clock somewhere inside each request, so ours advanced by at
/// least `newer.sent − older.received` and at most `newer.received −
/// older.sent` in between; a clock within `drift_factor` of ours (plus
/// [`CLOCK_STEP_TOLERANCE`]) must fall inside those bounds. Being bounds,
/// not estimates, a slow or loaded network widens them and never raises a
/// false alarm; a fault is seen once it exceeds the round trips' spread.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::{ClockFault, ClockSample, clock_fault};
///
/// let t0 = tokio::time::Instant::now();
/// let ms = Duration::from_millis;
/// let older = ClockSample { server_us: 1_000_000, sent: t0, received: t0 + ms(1) };
/// // One second later by our clock, the server's moved on by one second: fine.
/// let newer = ClockSample { server_us: 2_000_000, sent: t0 + ms(1000), received: t0 + ms(1001) };
/// assert_eq!(clock_fault(&older, &newer, 0.01), None);
/// // Two seconds by its clock in one of ours: twice as fast.
/// let fast = ClockSample { server_us: 3_000_000, ..newer };
/// assert!(matches!(clock_fault(&older, &fast, 0.01), Some(ClockFault::Rate { .. })));
/// ```
pub fn clock_fault(
    older: &ClockSample,
    newer: &ClockSample,
    drift_factor: f64,
) -> Option<ClockFault> {
    // Signed microseconds from `a` to `b`: samples may be judged in another
    // order than they were taken (replies on two connections, late tasks),
    // and overlapping requests give a negative shortest time.
    let between = |a: Instant, b: Instant| {
        if b >= a {
            (b - a).as_secs_f64() * 1e6
        } else {
            -((a - b).as_secs_f64() * 1e6)
        }
    };
    let server = newer.server_us as f64 - older.server_us as f64;
    let shortest = between(older.received, newer.sent);
    let longest = between(older.sent, newer.received);
    let tolerance = CLOCK_STEP_TOLERANCE.as_secs_f64() * 1e6;
    // The widest rate allowance in each direction, for either sign.
    let (slow, fast) = (1.0 - drift_factor, 1.0 + drift_factor);
    let low = shortest * if shortest >= 0.0 { slow } else { fast } - tolerance;
    let high = longest * if longest >= 0.0 { fast } else { slow } + tolerance;
    if (low..=high).contains(&server) {
        return None;
    }
    let local = (shortest + longest) / 2.0;
    let gained = server - local;
    if gained.abs() >= STEP_REPORT_THRESHOLD_US && gained.abs() > 2.0 * local.abs() {
        return Some(ClockFault::Step {
            by_ms: (gained / 1000.0).round() as i64,
        });
    }
    let rate = if local > 0.0 { server / local } else { 0.0 };
    Some(ClockFault::Rate {
        rate_milli: (rate.max(0.0) * 1000.0).round() as u64,
    })
}

/// The rate (either way, beyond the drift allowance) a node's clock must
/// be shown to stay within before a node met for the first time counts:
/// see [`rate_measured`].
pub const FIRST_SIGHT_RATE: f64 = 1.5;

/// Whether `older` and `newer` bound a clock's rate tightly enough that
/// [`clock_fault`] would have seen it run at [`FIRST_SIGHT_RATE`] × the
/// drift allowance or more, or as much slower: the time between them must
/// be long against the round trips they took. Two readings 10 ms apart
/// are on a quiet machine; on a loaded one, where each round trip may
/// take tens of milliseconds, a 2× clock fits their bounds, and more
/// readings, further apart, are needed.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::{ClockSample, rate_measured};
///
/// let t0 = tokio::time::Instant::now();
/// let ms = Duration::from_millis;
/// let at = |sent: u64, took: u64| ClockSample { server_us: 0, sent: t0 + ms(sent), received: t0 + ms(sent + took) };
/// assert!(rate_measured(&at(0, 0), &at(10, 0), 0.01), "10 ms apart, quick round trips");
/// assert!(!rate_measured(&at(0, 15), &at(25, 15), 0.01), "10 ms apart, 15 ms round trips");
/// assert!(rate_measured(&at(0, 15), &at(150, 15), 0.01), "further apart");
/// ```
pub fn rate_measured(older: &ClockSample, newer: &ClockSample, drift_factor: f64) -> bool {
    if newer.sent <= older.received {
        return false;
    }
    let shortest = (newer.sent - older.received).as_secs_f64() * 1e6;
    let longest = (newer.received - older.sent).as_secs_f64() * 1e6;
    let tolerance = CLOCK_STEP_TOLERANCE.as_secs_f64() * 1e6;
    let (slow, fast) = (1.0 - drift_factor, 1.0 + drift_factor);
    // What clock_fault lets pass, against what such a clock would show.
    let fast_shows = shortest * FIRST_SIGHT_RATE * fast > longest * fast + tolerance;
    let slow_shows = longest * slow / FIRST_SIGHT_RATE < shortest * slow - tolerance;
    fast_shows && slow_shows
}

/// What a node's clock reads at `now` at the least and at the most, by
/// `sample` (µs since 1970): it read `server_us` between `sent` and
/// `received`, and has run since at a rate within `drift_factor` of ours,
/// give or take [`CLOCK_STEP_TOLERANCE`] (the guard quarantines a clock
/// that does not).
///
/// ```
/// use std::time::Duration;
/// use quorumlock::internals::judge::{ClockSample, clock_bounds};
///
/// let t0 = tokio::time::Instant::now();
/// let sample = ClockSample { server_us: 1_000_000, sent: t0, received: t0 + Duration::from_millis(1) };
/// let (least, most) = clock_bounds(&sample, t0 + Duration::from_millis(101), 0.01);
/// assert!(least >= 1_000_000 + 99_000 - 1_000 && least < 1_100_000);
/// assert!(most > 1_101_000 && most <= 1_000_000 + 102_010 + 1_000);
/// ```
pub fn clock_bounds(sample: &ClockSample, now: Instant, drift_factor: f64) -> (u64, u64) {
    let micros = |since: Instant| now.saturating_duration_since(since).as_secs_f64() * 1e6;
    let tolerance = CLOCK_STEP_TOLERANCE.as_micros() as u64;
    let least = (micros(sample.received) * (1.0 - drift_factor).max(0.0)) as u64;
    let most = (micros(sample.sent) * (1.0 + drift_factor)).ceil() as u64;
    (
        sample
            .server_us
            .saturating_add(least)
            .saturating_sub(tolerance),
        sample
            .server_us
            .saturating_add(most)
            .saturating_add(tolerance),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn healthy(name: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            latency: Some(Duration::from_micros(200)),
            version: Some("7.0.15".into()),
            run_id: Some(format!("run-{name}")),
            uptime: Some(Reported::whole_seconds(3600)),
            appendonly: Some(true),
            appendfsync: Some("always".into()),
            maxmemory_policy: Some("noeviction".into()),
            maxmemory: Some(0),
            role: Some("master".into()),
            replicas: Some(0),
            ip: Some("10.0.0.1".parse().expect("ip")),
            clock_rate: Some(1.0001),
            ..NodeFacts::default()
        }
    }

    #[test]
    fn failures_are_the_guards_reasons() {
        let evicting = NodeFacts {
            maxmemory_policy: Some("allkeys-lru".into()),
            maxmemory: Some(1 << 20),
            ..healthy("a")
        };
        let replica = NodeFacts {
            role: Some("slave".into()),
            ..healthy("a")
        };
        let relaxed = NodeFacts {
            maxmemory_policy: Some("allkeys-lru".into()),
            maxmemory: Some(0),
            replicas: Some(2),
            ..healthy("a")
        };
        assert!(matches!(
            settings_fault(&evicting),
            Some(QuarantineReason::Evicts { .. })
        ));
        assert!(matches!(
            settings_fault(&replica),
            Some(QuarantineReason::Replica { .. })
        ));
        assert_eq!(settings_fault(&relaxed), None);
        assert_eq!(settings_fault(&healthy("a")), None);
        assert_eq!(settings_fault(&NodeFacts::named("unknown")), None);
    }

    /// A node `run_id` up for `uptime` s, persisting every write, with a
    /// data set marked `id` by process `born_in` `age` s ago, at `seq`.
    fn node(run_id: &str, uptime: u64, data: (&str, &str, u64, u64)) -> NodeFacts {
        let (id, born_in, age, seq) = data;
        let now_ms = 1_700_000_000_000;
        NodeFacts {
            run_id: Some(run_id.into()),
            uptime: Some(Reported::whole_seconds(uptime)),
            replid: Some(format!("repl-{run_id}")),
            dataset: DataSet::from_mark(
                &format!("{id} {born_in} {}", now_ms - age * 1000),
                now_ms,
                seq,
            ),
            ..healthy("a")
        }
    }

    /// A case: its name, what was observed, the loss expected (label, when).
    type Case = (&'static str, NodeFacts, Option<(&'static str, LostAt)>);

    fn label(loss: Option<Loss>) -> Option<(&'static str, LostAt)> {
        loss.map(|loss| (loss.reason.label(), loss.at))
    }

    #[test]
    fn a_promoted_master_met_first_is_quarantined_from_now() {
        let window = Duration::from_secs(10);
        let mut facts = healthy("r");
        // An old data set, loaded long ago: trusted, until it shows a
        // promotion.
        facts.dataset = DataSet::from_mark("x a 0", 3_600_000, 9);
        facts.promoted = Some(false);
        assert_eq!(first_sight(&facts, window), None);
        facts.promoted = Some(true);
        let loss = first_sight(&facts, window).expect("quarantined");
        assert_eq!(loss.at, LostAt::Now);
        assert!(
            loss.reason.to_string().contains("promoted replica"),
            "{}",
            loss.reason
        );
    }

    /// A cluster node's own mark, written after its promotion, does not
    /// date the loss either: a paused old master grants after it.
    #[test]
    fn a_promoted_cluster_master_is_quarantined_from_now_whatever_its_mark() {
        let window = Duration::from_secs(10);
        let mut facts = healthy("r");
        facts.promoted = Some(true);
        for mark in ["x r@n1/7 3596000", "x r@n1/7 3580000", "x q 0"] {
            facts.dataset = DataSet::from_mark(mark, 3_600_000, 2);
            let loss = first_sight(&facts, window).expect("quarantined");
            assert_eq!(loss.at, LostAt::Now, "marked {mark}");
        }
    }

    #[test]
    fn first_sight_trusts_only_what_leaves_no_room_for_a_loss() {
        let window = Duration::from_secs(10);
        // Uptime in whole seconds and the mark's age in whole ms are taken
        // as short as they can be: one unit less.
        let ago = |s| LostAt::Ago(Duration::from_secs(s));
        let ago_ms = |ms| LostAt::Ago(Duration::from_millis(ms));
        let everysec = |facts: NodeFacts| NodeFacts {
            appendfsync: Some("everysec".into()),
            ..facts
        };
        let table: Vec<Case> = vec![
            (
                "old process, old data",
                node("p", 400, ("d", "p", 400, 9)),
                None,
            ),
            (
                "young, loaded an old data set, persists every write",
                node("p", 4, ("d", "o", 400, 9)),
                None,
            ),
            (
                "young, came up empty",
                node("p", 4, ("d", "p", 3, 1)),
                Some(("restart", ago(3))),
            ),
            (
                "young, loaded, but does not persist every write",
                everysec(node("p", 4, ("d", "o", 400, 9))),
                Some(("restart", ago(3))),
            ),
            (
                "young, data set unreadable",
                NodeFacts {
                    dataset: None,
                    ..node("p", 4, ("d", "o", 400, 9))
                },
                Some(("restart", ago(3))),
            ),
            (
                "old process, young data set (flushed)",
                node("p", 400, ("d", "p", 2, 1)),
                Some(("data_set", ago_ms(1_999))),
            ),
            (
                "young, loaded a young data set",
                node("p", 4, ("d", "o", 6, 3)),
                Some(("data_set", ago_ms(5_999))),
            ),
            (
                "up \"10 s\" of a 10 s window: perhaps 9.x s, so still young",
                everysec(node("p", 10, ("d", "p", 400, 9))),
                Some(("restart", ago(9))),
            ),
            (
                "a data set 10.000 s old by whole-ms readings: perhaps 9.999 s, so young",
                node("p", 400, ("d", "p", 10, 1)),
                Some(("data_set", ago_ms(9_999))),
            ),
            (
                "old process without persistence: counted (nothing to lose since the window)",
                everysec(node("p", 400, ("d", "p", 400, 9))),
                None,
            ),
            (
                "an AOF switched on, its first rewrite running",
                NodeFacts {
                    aof_rewriting: Some(true),
                    ..node("p", 4, ("d", "o", 400, 9))
                },
                Some(("restart", ago(3))),
            ),
            (
                "no run_id: not judged here (the observation failed)",
                NodeFacts {
                    run_id: None,
                    ..node("p", 4, ("d", "p", 3, 1))
                },
                None,
            ),
        ];
        for (case, facts, expected) in table {
            assert_eq!(label(first_sight(&facts, window)), expected, "{case}");
        }
    }

    #[test]
    fn a_change_is_safe_only_if_both_processes_persisted_and_the_data_set_came_back() {
        let before = node("p", 400, ("d", "o", 400, 9));
        let known = Known::of(&before).expect("run_id");
        // Up "1 s": anything below 2 s, so the loss may be as recent as now.
        let restart = Some(("restart", LostAt::Ago(Duration::ZERO)));
        let live = Some(("data_set", LostAt::Now));
        let table: Vec<Case> = vec![
            (
                "same process, same data",
                node("p", 410, ("d", "o", 410, 10)),
                None,
            ),
            (
                "restart with its data set, both persist every write",
                node("q", 1, ("d", "o", 401, 10)),
                None,
            ),
            (
                "restart into always after running without it",
                node("q", 1, ("d", "o", 401, 10)),
                restart,
            ),
            (
                "restart with another data set",
                node("q", 1, ("e", "q", 1, 1)),
                restart,
            ),
            (
                "restart with an older copy",
                node("q", 1, ("d", "o", 401, 4)),
                restart,
            ),
            (
                "restart without persistence",
                NodeFacts {
                    appendonly: Some(false),
                    ..node("q", 1, ("d", "o", 401, 10))
                },
                restart,
            ),
            (
                "restart of a server that ran before the previous one last answered",
                node("q", 5, ("d", "o", 401, 10)),
                Some(("restart", LostAt::Now)),
            ),
            (
                "restart of a promoted replica",
                NodeFacts {
                    promoted: Some(true),
                    ..node("q", 1, ("d", "o", 401, 10))
                },
                Some(("restart", LostAt::Now)),
            ),
            (
                "same process, flushed",
                node("p", 410, ("e", "p", 1, 1)),
                live,
            ),
            (
                "same process, an older copy loaded",
                node("p", 410, ("d", "o", 410, 3)),
                live,
            ),
            (
                "same process, new replication id",
                NodeFacts {
                    replid: Some("another".into()),
                    ..node("p", 410, ("d", "o", 410, 10))
                },
                live,
            ),
            (
                "same process, mark gone",
                NodeFacts {
                    dataset: None,
                    ..node("p", 410, ("d", "o", 410, 10))
                },
                live,
            ),
        ];
        for (case, facts, expected) in table {
            let known = if case.starts_with("restart into always") {
                Known::of(&NodeFacts {
                    appendfsync: Some("everysec".into()),
                    ..before.clone()
                })
                .expect("run_id")
            } else {
                known.clone()
            };
            // The previous process last answered 2 s ago.
            let heard_ago = Some(Duration::from_secs(2));
            assert_eq!(
                label(since_known(&known, &facts, heard_ago)),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn a_data_set_is_judged_on_what_it_had_before_this_observation_raised_it() {
        let raised = |facts: NodeFacts, to: u64| NodeFacts {
            dataset: facts.dataset.map(|data| data.raised_to(to)),
            ..facts
        };
        // Found at 5, raised to 6.
        let known = Known::of(&raised(node("p", 400, ("d", "o", 400, 5)), 6)).expect("run_id");
        // Back at 5 (a snapshot from before the raise), and raised to 6
        // again by the observation that finds it: a loss all the same.
        let again = raised(node("p", 410, ("d", "o", 410, 5)), 6);
        assert_eq!(
            label(since_known(&known, &again, None)),
            Some(("data_set", LostAt::Now))
        );
        // Found at 6: nothing lost.
        let kept = raised(node("p", 410, ("d", "o", 410, 6)), 7);
        assert_eq!(label(since_known(&known, &kept, None)), None);
    }

    fn sample(server_ms: u64, sent: Instant, rtt: Duration) -> ClockSample {
        ClockSample {
            server_us: server_ms * 1000,
            sent,
            received: sent + rtt,
        }
    }

    #[test]
    fn clocks_are_judged_within_bounds() {
        let t0 = Instant::now();
        let rtt = ms(1);
        let base = 1_700_000_000_000;
        // (case, local elapsed, server elapsed, expected)
        let table: Vec<(&str, u64, i64, Option<ClockFault>)> = vec![
            ("same rate", 1000, 1000, None),
            ("0.5 % fast", 1000, 1005, None),
            ("round trip spread is not a fault", 10, 12, None),
            (
                "twice as fast",
                1000,
                2000,
                Some(ClockFault::Rate { rate_milli: 2000 }),
            ),
            (
                "twice as fast, seen in 20 ms",
                20,
                40,
                Some(ClockFault::Rate { rate_milli: 2000 }),
            ),
            (
                "3 % slow",
                1000,
                970,
                Some(ClockFault::Rate { rate_milli: 970 }),
            ),
            (
                "step of 10 s",
                100,
                10_100,
                Some(ClockFault::Step { by_ms: 10_000 }),
            ),
            (
                "step back 5 s",
                100,
                -4_900,
                Some(ClockFault::Step { by_ms: -5_000 }),
            ),
            ("tiny step is waited out", 1000, 1001, None),
        ];
        for (case, local, server, expected) in table {
            let older = sample(base, t0, rtt);
            let newer = sample(
                base.checked_add_signed(server).expect("positive"),
                t0 + ms(local),
                rtt,
            );
            assert_eq!(clock_fault(&older, &newer, 0.01), expected, "{case}");
        }
    }

    #[test]
    fn samples_judged_out_of_order_or_overlapping_raise_no_alarm() {
        let t0 = Instant::now();
        let base = 1_700_000_000_000;
        // Two requests in flight at once: each read the clock somewhere
        // in its own window, so the second's reading may be the earlier.
        let first = ClockSample {
            server_us: base * 1000 + 3_000,
            sent: t0,
            received: t0 + ms(4),
        };
        let second = ClockSample {
            server_us: base * 1000 + 1_000,
            sent: t0 + ms(1),
            received: t0 + ms(5),
        };
        assert_eq!(clock_fault(&first, &second, 0.01), None);
        // Judged the wrong way round: a healthy clock, 50 ms apart.
        let later = sample(base + 50, t0 + ms(50), ms(1));
        let earlier = sample(base, t0, ms(1));
        assert_eq!(clock_fault(&later, &earlier, 0.01), None);
        // But a fast clock is still seen whatever the order.
        let fast = sample(base + 100, t0 + ms(50), ms(1));
        assert!(clock_fault(&fast, &earlier, 0.01).is_some());
    }
}
