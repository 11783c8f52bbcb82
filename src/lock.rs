//! [`Lock`]: a held lock, its validity on the local monotonic clock, and
//! its extension and release.
//!
//! A lock is only as good as its validity: after [`Lock::valid_until`] the
//! holder must assume someone else may hold the resource. Dropping a lock
//! that was not released releases it in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::config::Config;
use crate::error::{Error, NotHeldReason, Result};
use crate::fencing::FencingToken;
use crate::manager::{Core, Granted, unavailable};
use crate::quorum::{self, Decision, Loss};
use crate::telemetry;
use crate::watchdog::KeepAlive;

/// Prefix of every lock key on the nodes.
pub const KEY_PREFIX: &str = "quorumlock:lock:";
/// Prefix of every fencing counter key on the nodes.
pub const FENCE_KEY_PREFIX: &str = "quorumlock:fence:";

/// The Redis key that holds the lock on `resource`, on every node.
pub fn lock_key(resource: &str) -> String {
    [KEY_PREFIX, resource].concat()
}

/// The Redis key that holds `resource`'s fencing counter on the nodes. It has
/// no TTL: the counter must outlive every lock on the resource.
pub fn fence_key(resource: &str) -> String {
    [FENCE_KEY_PREFIX, resource].concat()
}

/// The keys of one resource on a node.
#[derive(Debug)]
pub(crate) struct Keys {
    pub(crate) lock: String,
    pub(crate) fence: String,
}

impl Keys {
    pub(crate) fn of(resource: &str) -> Self {
        Self {
            lock: lock_key(resource),
            fence: fence_key(resource),
        }
    }
}

/// A lock held on a quorum of nodes.
///
/// Release it with [`release`](Self::release) to learn whether it was
/// still held. If it is dropped unreleased inside a tokio runtime, its keys
/// are deleted in the background (compare-and-delete, so never another
/// holder's); outside a runtime they simply expire after the TTL.
pub struct Lock {
    core: Arc<Core>,
    resource: String,
    keys: Arc<Keys>,
    value: Arc<str>,
    token: Option<FencingToken>,
    ttl: Duration,
    acquired_at: Instant,
    /// Start of the last successful acquisition or extension.
    extended_at: Instant,
    valid_until: Instant,
    /// Set when the nodes told us the lock is gone.
    lost: bool,
    /// Set once a release has been sent, so `Drop` does not send another.
    released: bool,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &self.resource)
            .field("value", &self.value)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

impl Lock {
    pub(crate) fn new(
        core: Arc<Core>,
        resource: String,
        keys: Arc<Keys>,
        value: Arc<str>,
        ttl: Duration,
        granted: Granted,
    ) -> Self {
        Self {
            core,
            resource,
            keys,
            value,
            token: granted.token,
            ttl,
            acquired_at: granted.started,
            extended_at: granted.started,
            valid_until: granted.valid_until,
            lost: false,
            released: false,
        }
    }

    /// The resource this lock protects.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The random value that marks this holder's keys on the nodes.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The fencing token of this acquisition, `None` when fencing is off.
    /// Pass it with every write to the protected storage, which must reject
    /// tokens lower than the highest it has seen. Extending keeps it.
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// The TTL of the last successful acquisition or extension.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the first request of the winning attempt was sent.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Start of the last successful acquisition or extension.
    pub fn last_extended(&self) -> Instant {
        self.extended_at
    }

    /// The end of the validity (monotonic clock): the holder may rely on
    /// the lock strictly before this instant, and not after.
    pub fn valid_until(&self) -> Instant {
        if self.lost {
            self.acquired_at
        } else {
            self.valid_until
        }
    }

    /// Validity left now; zero once expired or lost.
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Whether the lock may still be relied on now.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until()
    }

    /// Resets the lock to live `ttl` from now, on a quorum of nodes, with
    /// validity computed from this call's start as for an acquisition.
    ///
    /// Refused with [`Error::NotHeld`] once the validity has run out (the
    /// resource may already be someone else's) or when the nodes no longer
    /// hold our value. On other errors the lock keeps its current validity
    /// (or less, if a shorter TTL reached some nodes).
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let ttl = self.core.checked_ttl(ttl)?;
        if !self.is_valid() {
            return Err(self.not_held());
        }
        // Nodes that apply the new TTL keep our key at least this long, even
        // if the extension as a whole fails; with a shorter TTL that can be
        // sooner than the current validity.
        let drift = quorum::drift(ttl, self.core.config.drift_factor);
        let floor = Instant::now() + quorum::validity(ttl, Duration::ZERO, drift);
        let span = tracing::debug_span!(
            "extend",
            resource = %self.resource,
            ttl_ms = ttl.as_millis() as u64,
            successes = tracing::field::Empty,
            failures = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
        );
        let result = self
            .core
            .extend(&self.resource, &self.keys, &self.value, ttl)
            .instrument(span)
            .await;
        match &result {
            Ok(_) => telemetry::extended(),
            Err(_) => telemetry::extend_failed(),
        }
        match result {
            Ok(granted) => {
                self.valid_until = granted.valid_until;
                self.extended_at = granted.started;
                self.ttl = ttl;
                Ok(())
            }
            Err(error) => {
                if matches!(error, Error::NotHeld { .. }) {
                    self.lost = true;
                } else {
                    self.valid_until = self.valid_until.min(floor);
                }
                Err(error)
            }
        }
    }

    /// Keeps the lock alive in the background: extends it every
    /// `extend_every` (default TTL/3), retries failed extensions while
    /// validity remains, stops at `max_hold`, and signals loss through the
    /// returned handle. Needs a tokio runtime ([`Error::NoRuntime`]).
    pub fn keep_alive(self) -> Result<KeepAlive> {
        KeepAlive::start(self)
    }

    pub(crate) fn config(&self) -> &Config {
        &self.core.config
    }

    /// Deletes this lock's keys (compare-and-delete) on every node. Returns
    /// once a quorum has answered; the other nodes finish in the background.
    ///
    /// `Ok` means a quorum deleted our keys while the lock was still valid.
    /// [`Error::NotHeld`] means it had expired or been lost before: the work
    /// done under it may not have been exclusive. Another holder's keys are
    /// never deleted.
    ///
    /// Release consumes the lock, so a released lock cannot be used,
    /// extended or released again:
    ///
    /// ```compile_fail
    /// # async fn demo(mut lock: quorumlock::Lock) {
    /// lock.release().await.ok();
    /// lock.extend(std::time::Duration::from_secs(1)).await; // `lock` was moved
    /// # }
    /// ```
    pub async fn release(mut self) -> Result<()> {
        let expired = !self.is_valid();
        let started = Instant::now();
        let span = tracing::debug_span!("release", resource = %self.resource);
        let (tally, errors) = self
            .core
            .release(Arc::clone(&self.keys), Arc::clone(&self.value))
            .instrument(span.clone())
            .await;
        span.in_scope(|| {
            tracing::debug!(
                successes = tally.granted(),
                failures = tally.refused() + tally.failed(),
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                "release decided"
            )
        });
        self.released = true;
        match tally.decision() {
            Decision::Won if !expired => Ok(()),
            Decision::Won => Err(self.not_held_after(expired)),
            // Our value is gone from too many nodes.
            Decision::Lost(Loss::Refused) if tally.refusals_alone_lose() => {
                Err(self.not_held_after(expired))
            }
            // A few refusals (nodes our SET never reached) plus failures.
            Decision::Lost(Loss::Refused) => Err(unavailable(&self.resource, &tally, errors)),
            // Release asks no node in particular, so `RequiredFailed` cannot
            // occur; like `Pending`, it would mean the cluster did not answer.
            Decision::Lost(Loss::Unavailable | Loss::RequiredFailed) | Decision::Pending => {
                Err(unavailable(&self.resource, &tally, errors))
            }
        }
    }

    fn not_held(&self) -> Error {
        self.not_held_after(true)
    }

    fn not_held_after(&self, expired: bool) -> Error {
        let reason = if expired && !self.lost {
            NotHeldReason::Expired
        } else {
            NotHeldReason::Lost
        };
        Error::NotHeld {
            resource: self.resource.clone(),
            reason,
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.released {
            tracing::debug!(resource = %self.resource, "lock dropped unreleased; releasing in the background");
            self.core
                .rollback(Arc::clone(&self.keys), Arc::clone(&self.value));
        }
    }
}
