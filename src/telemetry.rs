//! Metrics, through the `metrics` facade (feature `metrics`), so any
//! exporter (Prometheus, StatsD, …) can collect them. Without the feature
//! every function here is empty and compiles away.
//!
//! Names, units and labels are listed in [`metric_names`] and docs/operations.md.

use std::time::Duration;

use crate::error::{Error, LossReason, NodeError};

/// The metric names this crate records (feature `metrics`).
pub mod metric_names {
    /// Histogram, seconds: from the first attempt of `lock()` to acquired.
    pub const LOCK_WAIT_SECONDS: &str = "quorumlock_lock_wait_seconds";
    /// Histogram, seconds: one acquisition attempt; label `outcome`
    /// (`acquired`, `contended`, `unavailable`, `too_slow`,
    /// `invalid_counter`).
    pub const ACQUIRE_ATTEMPT_SECONDS: &str = "quorumlock_acquire_attempt_seconds";
    /// Counter: locks acquired.
    pub const ACQUIRED_TOTAL: &str = "quorumlock_acquired_total";
    /// Counter: acquisitions given up after the last attempt; label
    /// `reason` (`contended`, `wait_timed_out`, `unavailable`, `too_slow`,
    /// `invalid_counter`, `circuit_open`).
    pub const ACQUIRE_FAILED_TOTAL: &str = "quorumlock_acquire_failed_total";
    /// Counter: kept-alive locks that ended without the holder asking;
    /// label `reason` (`extend_failed`, `taken_over`, `expired`, `max_hold`).
    pub const LOST_TOTAL: &str = "quorumlock_lost_total";
    /// Counter: successful extensions.
    pub const EXTENDED_TOTAL: &str = "quorumlock_extended_total";
    /// Counter: failed extensions (each failed try).
    pub const EXTEND_FAILED_TOTAL: &str = "quorumlock_extend_failed_total";
    /// Counter: failed requests to a node; labels `node` (`host:port`) and
    /// `kind` (`timeout`, `connect`, `redis`, `reply`, `key_gone`,
    /// `quarantined`, `permission`, `redirected`, `scripts_missing`,
    /// `unreplicated`).
    pub const NODE_ERRORS_TOTAL: &str = "quorumlock_node_errors_total";
    /// Gauge: 1 while the node guard does not count a node, else 0; labels
    /// `node` and `reason` (`restart`, `data_set`, `unobserved`,
    /// `clock_rate`, `clock_step`, `eviction`, `replica`, `same_process`).
    pub const NODE_QUARANTINED: &str = "quorumlock_node_quarantined";
    /// Counter: moves into and out of quarantine; labels `node`, `reason`
    /// and `to` (`entered`, `left`).
    pub const QUARANTINE_TRANSITIONS_TOTAL: &str = "quorumlock_quarantine_transitions_total";
    /// Counter: a waiter tried again, labelled `cause` = `notification`
    /// (a release named it), `expiry` (the time the nodes gave passed) or
    /// `poll` (no bound known, or its queue entry was due for renewal).
    pub const WAIT_WAKEUPS_TOTAL: &str = "quorumlock_wait_wakeups_total";
    /// Gauge: the manager's [`HealthState`](crate::HealthState): 0
    /// healthy, 1 degraded, 2 unavailable. Set when it changes.
    pub const HEALTH_STATE: &str = "quorumlock_health_state";
    /// Gauge: nodes up (neither failing nor quarantined).
    pub const NODES_UP: &str = "quorumlock_nodes_up";
    /// Gauge: acquisition attempts in a row that found the lock service
    /// unavailable.
    pub const CONSECUTIVE_UNAVAILABLE: &str = "quorumlock_consecutive_unavailable";
    /// Gauge: 1 while the circuit breaker holds calls back (open or
    /// probing), else 0.
    pub const BREAKER_OPEN: &str = "quorumlock_breaker_open";
    /// Counter: calls the open circuit breaker failed without I/O.
    pub const BREAKER_REJECTED_TOTAL: &str = "quorumlock_breaker_rejected_total";
    /// Counter: retries of attempts that found the service unavailable,
    /// made on the [`Backoff`](crate::Backoff) schedule.
    pub const UNAVAILABLE_RETRIES_TOTAL: &str = "quorumlock_unavailable_retries_total";
    /// Counter: locks whose fencing token took a second round trip because
    /// the counter node's alone could not count ([`Fencing::CounterNode`]);
    /// label `reason`: `counter_node_missing` (it did not grant: down,
    /// unreachable, quarantined, slow or holding another key) or
    /// `counter_node_behind` (it granted, but another node showed a higher
    /// counter, or its clock runs ahead of the others').
    ///
    /// [`Fencing::CounterNode`]: crate::Fencing::CounterNode
    pub const TOKEN_SECOND_ROUND_TOTAL: &str = "quorumlock_token_second_round_total";
    /// Counter: fallbacks run by `run_or_fallback` because the lock
    /// service was unavailable; label `reason` (the error's
    /// [`kind`](crate::Error::kind)).
    pub const FALLBACK_TOTAL: &str = "quorumlock_fallback_total";

    /// Every name above.
    pub const ALL: &[&str] = &[
        LOCK_WAIT_SECONDS,
        ACQUIRE_ATTEMPT_SECONDS,
        ACQUIRED_TOTAL,
        ACQUIRE_FAILED_TOTAL,
        LOST_TOTAL,
        EXTENDED_TOTAL,
        EXTEND_FAILED_TOTAL,
        NODE_ERRORS_TOTAL,
        NODE_QUARANTINED,
        QUARANTINE_TRANSITIONS_TOTAL,
        WAIT_WAKEUPS_TOTAL,
        HEALTH_STATE,
        NODES_UP,
        CONSECUTIVE_UNAVAILABLE,
        BREAKER_OPEN,
        BREAKER_REJECTED_TOTAL,
        UNAVAILABLE_RETRIES_TOTAL,
        TOKEN_SECOND_ROUND_TOTAL,
        FALLBACK_TOTAL,
    ];
}

/// The label value for why an attempt or acquisition failed.
#[cfg_attr(not(any(feature = "metrics", test)), allow(dead_code))]
fn failure_label(error: &Error) -> &'static str {
    match error {
        Error::Contended { .. }
        | Error::SplitVote { .. }
        | Error::WaitTimedOut { .. }
        | Error::TooSlow { .. }
        | Error::InvalidCounter { .. }
        | Error::CircuitOpen { .. } => error.kind(),
        // The metric's documented label for every other failure.
        _ => "unavailable",
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn attempt_finished(elapsed: Duration, failure: Option<&Error>) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(
        metric_names::ACQUIRE_ATTEMPT_SECONDS,
        "outcome" => failure.map_or("acquired", failure_label)
    )
    .record(elapsed.as_secs_f64());
}

/// A lock's token took a second round trip: the counter node did not
/// grant (`missing`), or its token could not count alone.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn token_second_round(missing: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        metric_names::TOKEN_SECOND_ROUND_TOTAL,
        "reason" => if missing { "counter_node_missing" } else { "counter_node_behind" }
    )
    .increment(1);
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquired(wait: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::histogram!(metric_names::LOCK_WAIT_SECONDS).record(wait.as_secs_f64());
        metrics::counter!(metric_names::ACQUIRED_TOTAL).increment(1);
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquire_failed(error: &Error) {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric_names::ACQUIRE_FAILED_TOTAL, "reason" => failure_label(error))
        .increment(1);
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn woken(cause: crate::wait::plan::WakeCause) {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric_names::WAIT_WAKEUPS_TOTAL, "cause" => cause.label()).increment(1);
}

pub(crate) fn extended() {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric_names::EXTENDED_TOTAL).increment(1);
}

pub(crate) fn extend_failed() {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric_names::EXTEND_FAILED_TOTAL).increment(1);
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lost(reason: &LossReason) {
    #[cfg(feature = "metrics")]
    {
        let label = match reason {
            LossReason::ExtendFailed(_) => "extend_failed",
            LossReason::TakenOver => "taken_over",
            LossReason::Expired => "expired",
            LossReason::MaxHoldReached(_) => "max_hold",
            LossReason::Stopped => "stopped",
        };
        metrics::counter!(metric_names::LOST_TOTAL, "reason" => label).increment(1);
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn node_error(error: &NodeError) {
    #[cfg(feature = "metrics")]
    {
        use crate::error::NodeErrorKind;
        let kind = match error.kind {
            NodeErrorKind::Timeout(_) => "timeout",
            NodeErrorKind::Connect(_) => "connect",
            NodeErrorKind::Redis(_) => "redis",
            NodeErrorKind::UnexpectedReply(_) | NodeErrorKind::InvalidCounter(_) => "reply",
            NodeErrorKind::KeyGone => "key_gone",
            NodeErrorKind::Quarantined(_) => "quarantined",
            NodeErrorKind::PermissionDenied(_) => "permission",
            NodeErrorKind::Redirected(_) => "redirected",
            NodeErrorKind::ScriptsMissing => "scripts_missing",
            NodeErrorKind::Unreplicated(_) => "unreplicated",
        };
        metrics::counter!(
            metric_names::NODE_ERRORS_TOTAL,
            "node" => error.node.clone(),
            "kind" => kind
        )
        .increment(1);
    }
}

/// The manager's health picture, as its gauges show it.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct HealthGauges {
    /// The state's gauge value (see [`metric_names::HEALTH_STATE`]).
    pub(crate) state: f64,
    pub(crate) nodes_up: usize,
    pub(crate) consecutive_unavailable: u32,
    /// Whether the breaker holds calls back now.
    pub(crate) breaker_open: bool,
}

/// The manager's health picture changed.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn health_changed(health: HealthGauges) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!(metric_names::HEALTH_STATE).set(health.state);
        metrics::gauge!(metric_names::NODES_UP).set(health.nodes_up as f64);
        metrics::gauge!(metric_names::CONSECUTIVE_UNAVAILABLE)
            .set(f64::from(health.consecutive_unavailable));
        metrics::gauge!(metric_names::BREAKER_OPEN).set(if health.breaker_open {
            1.0
        } else {
            0.0
        });
    }
}

pub(crate) fn breaker_refused() {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric_names::BREAKER_REJECTED_TOTAL).increment(1);
}

pub(crate) fn unavailable_retry() {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric_names::UNAVAILABLE_RETRIES_TOTAL).increment(1);
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn fallback_ran(cause: &Error) {
    #[cfg(feature = "metrics")]
    metrics::counter!(metric_names::FALLBACK_TOTAL, "reason" => cause.kind()).increment(1);
}

/// A node's quarantine changed from `from` to `to` (reason labels).
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn quarantine_changed(node: &str, from: Option<&'static str>, to: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    {
        let moves = [(from, 0.0, "left"), (to, 1.0, "entered")];
        for (reason, gauge, direction) in moves {
            let Some(reason) = reason else { continue };
            let labels = [("node", node.to_owned()), ("reason", reason.to_owned())];
            metrics::gauge!(metric_names::NODE_QUARANTINED, &labels).set(gauge);
            metrics::counter!(
                metric_names::QUARANTINE_TRANSITIONS_TOTAL,
                "node" => node.to_owned(),
                "reason" => reason,
                "to" => direction
            )
            .increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_map_to_documented_labels() {
        let contended = Error::Contended {
            resource: "r".into(),
            attempts: 1,
            refused: 3,
            total: 5,
            free_in: None,
        };
        let slow = Error::TooSlow {
            resource: "r".into(),
            elapsed: Duration::from_secs(1),
            ttl: Duration::from_secs(1),
        };
        assert_eq!(failure_label(&contended), "contended");
        assert_eq!(failure_label(&slow), "too_slow");
        assert_eq!(failure_label(&Error::NoRuntime), "unavailable");
    }
}
