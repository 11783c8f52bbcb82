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

/// What was observed of one node; `None` where it could not be read
/// (`CONFIG` renamed or forbidden, `INFO` section missing).
///
/// ```
/// use quorumlock::guard::NodeFacts;
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
    /// `uptime_in_seconds`.
    pub uptime: Option<Duration>,
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
    /// The node's address, when known.
    pub ip: Option<IpAddr>,
    /// The node's clock rate against ours (1.0 = same speed), measured by
    /// the doctor from two `TIME` samples.
    pub clock_rate: Option<f64>,
    /// What the two clock samples above say, judged as the guard does.
    pub clock_fault: Option<ClockFault>,
}

impl NodeFacts {
    /// Facts about the node named `name`, nothing observed yet.
    ///
    /// ```
    /// use quorumlock::guard::NodeFacts;
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
    /// use quorumlock::guard::NodeFacts;
    ///
    /// let mut facts = NodeFacts::named("127.0.0.1:7001");
    /// facts.appendonly = Some(true);
    /// facts.appendfsync = Some("everysec".into());
    /// assert!(!facts.persists_every_write(), "up to a second of writes lost on a crash");
    /// facts.appendfsync = Some("always".into());
    /// assert!(facts.persists_every_write());
    /// ```
    pub fn persists_every_write(&self) -> bool {
        self.appendonly == Some(true) && self.appendfsync.as_deref() == Some("always")
    }

    /// The persistence settings, as words for a message.
    ///
    /// ```
    /// use quorumlock::guard::NodeFacts;
    ///
    /// let mut facts = NodeFacts::named("127.0.0.1:7001");
    /// facts.appendonly = Some(false);
    /// assert_eq!(facts.persistence(), "appendonly no");
    /// ```
    pub fn persistence(&self) -> String {
        match (self.appendonly, self.appendfsync.as_deref()) {
            (Some(false), _) => "appendonly no".into(),
            (Some(true), Some(fsync)) => format!("appendfsync {fsync}"),
            (_, Some(fsync)) => format!("appendfsync {fsync}"),
            (_, None) => "appendfsync unknown (CONFIG GET unavailable)".into(),
        }
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
    /// The node (re)started without persisting every write, so it may
    /// have forgotten locks it granted that are still valid.
    Restarted {
        /// Its persistence setting, e.g. `appendfsync everysec`.
        persistence: String,
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
}

impl QuarantineReason {
    /// A short label for logs and metrics: `restart`, `clock_rate`,
    /// `clock_step`, `eviction`, `replica`.
    ///
    /// ```
    /// use quorumlock::guard::QuarantineReason;
    ///
    /// let reason = QuarantineReason::Restarted { persistence: "appendfsync everysec".into() };
    /// assert_eq!(reason.label(), "restart");
    /// ```
    pub fn label(&self) -> &'static str {
        match self {
            Self::Restarted { .. } => "restart",
            Self::ClockRate { .. } => "clock_rate",
            Self::ClockStep { .. } => "clock_step",
            Self::Evicts { .. } => "eviction",
            Self::Replica { .. } => "replica",
        }
    }
}

impl fmt::Display for QuarantineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Restarted { persistence } => write!(
                f,
                "(re)started recently without appendfsync always ({persistence}), so it may \
                 have forgotten locks it granted"
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
    /// Time left: `Some` for restarts and clock faults (a clock fault
    /// that persists keeps extending it); `None` for settings, which last
    /// until the node is reconfigured and reconnected.
    pub remaining: Option<Duration>,
}

impl fmt::Display for Quarantine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "quarantined: {}", self.reason)?;
        match self.remaining {
            Some(left) => write!(f, "; counted again in {left:.1?} at the earliest"),
            None => f.write_str("; counted again once reconfigured"),
        }
    }
}

/// Whether the node may lack locks it granted: it does not persist every
/// write, and it restarted since we last saw it (`previous_run_id`
/// differs) or we meet it for the first time. Returns how long ago it
/// started; the guard quarantines it until that reaches the quarantine
/// window. Unknown identity (no `run_id`) cannot show a restart.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::guard::{NodeFacts, judge::unsafe_start};
///
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.run_id = Some("b".into());
/// facts.uptime = Some(Duration::from_secs(4));
/// facts.appendonly = Some(false);
/// // It restarted (run id a → b) 4 s ago, keeping nothing: not counted yet.
/// assert_eq!(unsafe_start(Some("a"), &facts), Some(Duration::from_secs(4)));
/// assert_eq!(unsafe_start(Some("b"), &facts), None, "the same run as before");
/// ```
pub fn unsafe_start(previous_run_id: Option<&str>, facts: &NodeFacts) -> Option<Duration> {
    if facts.persists_every_write() {
        return None;
    }
    let run_id = facts.run_id.as_deref()?;
    match previous_run_id {
        Some(previous) if previous == run_id => None,
        // A restart we saw happen: it started at most its uptime ago.
        Some(_) => Some(facts.uptime.unwrap_or_default()),
        // First meeting: it may have restarted just before.
        None => facts.uptime.or(Some(Duration::ZERO)),
    }
}

/// A settings reason to quarantine: a replica, or an eviction policy
/// that can remove lock keys. A policy other than `noeviction` with no
/// memory limit (`maxmemory 0`) never evicts, so it is no reason (the
/// doctor warns). Unknown settings are assumed fine.
///
/// ```
/// use quorumlock::guard::{NodeFacts, judge::settings_fault};
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
/// use quorumlock::guard::ClockSample;
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
/// use quorumlock::guard::{ClockFault, QuarantineReason};
///
/// let fault = ClockFault::Step { by_ms: 5_000 };
/// assert_eq!(QuarantineReason::from(fault), QuarantineReason::ClockStep { by_ms: 5_000 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
/// use quorumlock::guard::{ClockFault, ClockSample, judge::clock_fault};
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

/// The grade of a doctor finding.
///
/// ```
/// use quorumlock::guard::judge::Level;
///
/// assert!(Level::Pass < Level::Warn && Level::Warn < Level::Fail);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Fine.
    Pass,
    /// Works, but weakens a guarantee or is unknown.
    Warn,
    /// Breaks a rule the lock's safety rests on: the guard quarantines
    /// the node for it.
    Fail,
}

/// One check's result, for one node or for the whole set.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::guard::{NodeFacts, judge::check_node};
///
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.unreachable = Some("connection refused".into());
/// for finding in check_node(&facts, 0.01, Duration::from_secs(10)) {
///     println!("{:?} {}: {}", finding.level, finding.check, finding.detail);
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The node, or `None` for checks of the whole set.
    pub node: Option<String>,
    /// The check's name, e.g. `persistence`.
    pub check: &'static str,
    /// Its grade.
    pub level: Level,
    /// What was seen, and what to do about it.
    pub detail: String,
}

fn finding(node: &NodeFacts, check: &'static str, level: Level, detail: String) -> Finding {
    Finding {
        node: Some(node.name.clone()),
        check,
        level,
        detail,
    }
}

/// The doctor's checks of one node. `window` is the quarantine window
/// clients use (their longest TTL): a node younger than that which does
/// not persist every write is one they do not count yet.
///
/// ```
/// use std::time::Duration;
/// use quorumlock::guard::{NodeFacts, judge::{Level, check_node}};
///
/// let mut facts = NodeFacts::named("127.0.0.1:7001");
/// facts.unreachable = Some("connection refused".into());
/// let findings = check_node(&facts, 0.01, Duration::from_secs(10));
/// assert_eq!((findings[0].check, findings[0].level), ("reachable", Level::Fail));
/// ```
pub fn check_node(node: &NodeFacts, drift_factor: f64, window: Duration) -> Vec<Finding> {
    use Level::{Fail, Pass, Warn};
    if let Some(why) = &node.unreachable {
        return vec![finding(node, "reachable", Fail, why.clone())];
    }
    let latency = node.latency.unwrap_or_default();
    let mut out = vec![finding(
        node,
        "reachable",
        Pass,
        format!("PING {:.2} ms", latency.as_secs_f64() * 1e3),
    )];
    out.push(check_version(node));
    out.push(if node.persists_every_write() {
        finding(
            node,
            "persistence",
            Pass,
            "appendonly yes, appendfsync always".into(),
        )
    } else if node.appendonly.is_none() && node.appendfsync.is_none() {
        finding(
            node,
            "persistence",
            Warn,
            "unknown (CONFIG GET unavailable): clients assume it does not persist every write \
             and quarantine it after each restart"
                .into(),
        )
    } else {
        finding(
            node,
            "persistence",
            Warn,
            format!(
                "{}: a restarted node may have forgotten locks it granted, so clients do not \
                 count it until it has run for their longest TTL; use appendfsync always \
                 (fencing counters need it)",
                node.persistence()
            ),
        )
    });
    if let Some(started) = unsafe_start(None, node)
        && started < window
    {
        out.push(finding(
            node,
            "restart",
            Fail,
            format!(
                "{}; clients quarantine it for {:.1?} more (window {window:?})",
                QuarantineReason::Restarted {
                    persistence: node.persistence()
                },
                window - started
            ),
        ));
    }
    out.push(match (settings_fault(node), node.maxmemory_policy.as_deref()) {
        (Some(reason @ QuarantineReason::Evicts { .. }), _) => {
            finding(node, "eviction", Fail, reason.to_string())
        }
        (_, Some("noeviction")) => {
            finding(node, "eviction", Pass, "maxmemory-policy noeviction".into())
        }
        (_, Some(policy)) => finding(
            node,
            "eviction",
            Warn,
            format!(
                "maxmemory-policy {policy} evicts nothing while maxmemory is 0, but would evict \
                 lock keys (every one has a TTL) once a limit is set; set noeviction"
            ),
        ),
        (_, None) => finding(
            node,
            "eviction",
            Warn,
            "unknown (maxmemory_policy unreadable)".into(),
        ),
    });
    if let Some(limit) = node.maxmemory {
        let detail = if limit == 0 {
            "maxmemory 0 (no limit)".to_owned()
        } else {
            format!("maxmemory {limit} bytes: when full, lock attempts fail (safely)")
        };
        out.push(finding(node, "memory", Pass, detail));
    }
    out.push(
        match (settings_fault(node), node.role.as_deref(), node.replicas) {
            (Some(reason @ QuarantineReason::Replica { .. }), _, _) => {
                finding(node, "replication", Fail, reason.to_string())
            }
            (_, Some(_), Some(n)) if n > 0 => finding(
                node,
                "replication",
                Warn,
                format!(
                    "{n} replica(s): a failover to a replica can lose a granted lock; the lock \
                     needs no replicas"
                ),
            ),
            (_, Some(_), _) => finding(node, "replication", Pass, "independent master".into()),
            (_, None, _) => finding(
                node,
                "replication",
                Warn,
                "unknown (INFO replication unreadable)".into(),
            ),
        },
    );
    out.push(check_clock(node, drift_factor));
    out
}

fn check_version(node: &NodeFacts) -> Finding {
    use Level::{Fail, Pass, Warn};
    match node.version.as_deref().map(parse_version) {
        Some(Some(v)) if v >= (6, 0, 0) => finding(
            node,
            "version",
            Pass,
            format!("Redis {}.{}.{}", v.0, v.1, v.2),
        ),
        Some(Some(v)) if v >= (2, 6, 12) => finding(
            node,
            "version",
            Warn,
            format!(
                "Redis {}.{}.{} is old; 6.0 or later is tested",
                v.0, v.1, v.2
            ),
        ),
        Some(Some(v)) => finding(
            node,
            "version",
            Fail,
            format!("Redis {}.{}.{} lacks SET NX PX (2.6.12+)", v.0, v.1, v.2),
        ),
        _ => finding(
            node,
            "version",
            Warn,
            "unknown (INFO server unreadable)".into(),
        ),
    }
}

fn check_clock(node: &NodeFacts, drift_factor: f64) -> Finding {
    use Level::{Fail, Pass, Warn};
    let Some(rate) = node.clock_rate else {
        return finding(node, "clock rate", Warn, "unknown (TIME unreadable)".into());
    };
    let detail = format!(
        "runs {:+.3} % against this machine (drift factor {} %)",
        (rate - 1.0) * 100.0,
        drift_factor * 100.0
    );
    if let Some(fault) = node.clock_fault {
        let reason = QuarantineReason::from(fault);
        return finding(node, "clock rate", Fail, format!("{detail}: {reason}"));
    }
    // Within the bounds the guard allows; the estimate may still be close
    // to the edge.
    let level = if (rate - 1.0).abs() <= drift_factor / 2.0 {
        Pass
    } else {
        Warn
    };
    finding(node, "clock rate", level, detail)
}

/// The doctor's checks of the set of nodes as a whole.
///
/// ```
/// use quorumlock::guard::{NodeFacts, judge::{Level, check_set}};
///
/// let nodes: Vec<NodeFacts> = (1..=2).map(|i| NodeFacts::named(format!("127.0.0.1:700{i}"))).collect();
/// let findings = check_set(&nodes);
/// // Two nodes tolerate no failure: the doctor says so.
/// assert!(findings.iter().any(|f| f.level != Level::Pass), "{findings:?}");
/// ```
pub fn check_set(nodes: &[NodeFacts]) -> Vec<Finding> {
    use Level::{Fail, Pass, Warn};
    let set = |check, level, detail: String| Finding {
        node: None,
        check,
        level,
        detail,
    };
    let mut out = Vec::new();
    let n = nodes.len();
    out.push(if n < 3 {
        set(
            "node count",
            Warn,
            format!("{n} node(s): no node may fail; use 5 (or at least 3)"),
        )
    } else if n.is_multiple_of(2) {
        set(
            "node count",
            Warn,
            format!(
                "{n} nodes tolerate no more failures than {}; use an odd number",
                n - 1
            ),
        )
    } else {
        set(
            "node count",
            Pass,
            format!(
                "{n} nodes tolerate {} failures",
                n - crate::quorum::quorum(n)
            ),
        )
    });
    let mut duplicate = false;
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            if a.run_id.is_some() && a.run_id == b.run_id {
                duplicate = true;
                out.push(set(
                    "independence",
                    Fail,
                    format!(
                        "{} and {} are the same Redis process (same run_id)",
                        a.name, b.name
                    ),
                ));
            } else if a.ip.is_some() && a.ip == b.ip && !a.ip.is_some_and(|ip| ip.is_loopback()) {
                duplicate = true;
                out.push(set(
                    "independence",
                    Warn,
                    format!(
                        "{} and {} are on the same host; they fail together",
                        a.name, b.name
                    ),
                ));
            }
        }
    }
    let on_loopback = nodes
        .iter()
        .filter(|n| n.ip.is_some_and(|ip| ip.is_loopback()))
        .count();
    if !duplicate {
        out.push(if on_loopback > 1 {
            set(
                "independence",
                Warn,
                format!("{on_loopback} nodes on this machine: fine for tests, not for production"),
            )
        } else {
            set(
                "independence",
                Pass,
                "separate processes on separate hosts".into(),
            )
        });
    }
    out
}

/// Semantic version numbers of `7.0.15`-like text.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
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
            uptime: Some(Duration::from_secs(3600)),
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

    fn level_of(findings: &[Finding], check: &str) -> Option<Level> {
        findings.iter().find(|f| f.check == check).map(|f| f.level)
    }

    #[test]
    fn node_checks_grade_each_setting() {
        use Level::{Fail, Pass, Warn};
        let young_everysec = NodeFacts {
            appendfsync: Some("everysec".into()),
            uptime: Some(Duration::from_secs(3)),
            ..healthy("a")
        };
        let table: Vec<(&str, NodeFacts, &str, Option<Level>)> = vec![
            ("persistent", healthy("a"), "persistence", Some(Pass)),
            (
                "persistent: no restart finding",
                healthy("a"),
                "restart",
                None,
            ),
            (
                "everysec",
                NodeFacts {
                    appendfsync: Some("everysec".into()),
                    ..healthy("a")
                },
                "persistence",
                Some(Warn),
            ),
            (
                "old everysec node is counted",
                NodeFacts {
                    appendfsync: Some("everysec".into()),
                    ..healthy("a")
                },
                "restart",
                None,
            ),
            ("young everysec", young_everysec, "restart", Some(Fail)),
            (
                "no aof",
                NodeFacts {
                    appendonly: Some(false),
                    ..healthy("a")
                },
                "persistence",
                Some(Warn),
            ),
            (
                "allkeys-lru with a limit",
                NodeFacts {
                    maxmemory_policy: Some("allkeys-lru".into()),
                    maxmemory: Some(1 << 20),
                    ..healthy("a")
                },
                "eviction",
                Some(Fail),
            ),
            (
                "volatile-ttl with a limit",
                NodeFacts {
                    maxmemory_policy: Some("volatile-ttl".into()),
                    maxmemory: Some(1 << 20),
                    ..healthy("a")
                },
                "eviction",
                Some(Fail),
            ),
            (
                "allkeys-lru without a limit",
                NodeFacts {
                    maxmemory_policy: Some("allkeys-lru".into()),
                    ..healthy("a")
                },
                "eviction",
                Some(Warn),
            ),
            (
                "replica",
                NodeFacts {
                    role: Some("slave".into()),
                    ..healthy("a")
                },
                "replication",
                Some(Fail),
            ),
            (
                "has replicas",
                NodeFacts {
                    replicas: Some(1),
                    ..healthy("a")
                },
                "replication",
                Some(Warn),
            ),
            (
                "clock within half",
                NodeFacts {
                    clock_rate: Some(1.004),
                    ..healthy("a")
                },
                "clock rate",
                Some(Pass),
            ),
            (
                "clock near the edge",
                NodeFacts {
                    clock_rate: Some(0.992),
                    ..healthy("a")
                },
                "clock rate",
                Some(Warn),
            ),
            (
                "clock judged faulty",
                NodeFacts {
                    clock_rate: Some(2.0),
                    clock_fault: Some(ClockFault::Rate { rate_milli: 2000 }),
                    ..healthy("a")
                },
                "clock rate",
                Some(Fail),
            ),
            (
                "old redis",
                NodeFacts {
                    version: Some("2.6.10".into()),
                    ..healthy("a")
                },
                "version",
                Some(Fail),
            ),
            (
                "unreachable",
                NodeFacts {
                    unreachable: Some("refused".into()),
                    ..healthy("a")
                },
                "reachable",
                Some(Fail),
            ),
        ];
        for (case, facts, check, expected) in table {
            assert_eq!(
                level_of(&check_node(&facts, 0.01, Duration::from_secs(10)), check),
                expected,
                "{case}"
            );
        }
    }

    /// A `Fail` is exactly a reason the guard quarantines for.
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

    #[test]
    fn only_unpersisted_starts_are_unsafe() {
        let everysec = |run_id: &str, uptime: u64| NodeFacts {
            run_id: Some(run_id.into()),
            uptime: Some(Duration::from_secs(uptime)),
            appendfsync: Some("everysec".into()),
            ..healthy("a")
        };
        let table: Vec<(&str, Option<&str>, NodeFacts, Option<Duration>)> = vec![
            ("same process", Some("x"), everysec("x", 2), None),
            (
                "restarted",
                Some("x"),
                everysec("y", 2),
                Some(Duration::from_secs(2)),
            ),
            (
                "first meeting, young",
                None,
                everysec("y", 4),
                Some(Duration::from_secs(4)),
            ),
            (
                "first meeting, old (the caller compares with the window)",
                None,
                everysec("y", 400),
                Some(Duration::from_secs(400)),
            ),
            (
                "restarted, but persists every write",
                Some("x"),
                NodeFacts {
                    run_id: Some("y".into()),
                    uptime: Some(Duration::ZERO),
                    ..healthy("a")
                },
                None,
            ),
            (
                "fsync unknown counts as not always",
                Some("x"),
                NodeFacts {
                    run_id: Some("y".into()),
                    uptime: Some(Duration::from_secs(1)),
                    appendfsync: None,
                    ..healthy("a")
                },
                Some(Duration::from_secs(1)),
            ),
            (
                "identity unknown",
                Some("x"),
                NodeFacts {
                    run_id: None,
                    ..everysec("y", 1)
                },
                None,
            ),
        ];
        for (case, previous, facts, expected) in table {
            assert_eq!(unsafe_start(previous, &facts), expected, "{case}");
        }
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

    #[test]
    fn set_checks_find_shared_processes_and_hosts() {
        let five: Vec<NodeFacts> = (0..5)
            .map(|i| NodeFacts {
                ip: Some(format!("10.0.0.{i}").parse().expect("ip")),
                ..healthy(&i.to_string())
            })
            .collect();
        assert!(check_set(&five).iter().all(|f| f.level == Level::Pass));

        let mut twice = five.clone();
        twice[1].run_id = twice[0].run_id.clone();
        assert_eq!(
            level_of(&check_set(&twice), "independence"),
            Some(Level::Fail)
        );

        let mut same_host = five.clone();
        same_host[2].ip = same_host[3].ip;
        assert_eq!(
            level_of(&check_set(&same_host), "independence"),
            Some(Level::Warn)
        );

        assert_eq!(
            level_of(&check_set(&five[..4]), "node count"),
            Some(Level::Warn)
        );
    }
}
