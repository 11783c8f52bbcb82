//! [`Held`]: what every kind of lock is underneath (the public
//! [`Lock`](crate::Lock) wraps it with its kind): its claim on the nodes,
//! its validity on the local clocks, its extension and release. Dropping
//! one that was not released releases it in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::background::Background;
use crate::clock::Deadline;
use crate::config::Config;
use crate::engine::{Claim, Core, Granted, unavailable};
use crate::error::{Error, NotHeldReason, Result};
use crate::fencing::FencingToken;
use crate::keys::Keys;
use crate::quorum::{self, Decision, Loss};
use crate::storage::Fence;
use crate::telemetry;

pub(crate) struct Held {
    core: Arc<Core>,
    claim: Claim,
    token: Option<FencingToken>,
    ttl: Duration,
    acquired_at: Instant,
    extended_at: Instant,
    valid_until: Deadline,
    lost: bool,
    released: bool,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("resource", &self.resource())
            .field("value", &self.claim.value)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish_non_exhaustive()
    }
}

impl Held {
    pub(crate) fn new(core: Arc<Core>, claim: Claim, ttl: Duration, granted: Granted) -> Self {
        let mut claim = claim;
        // Releases before `at_least` is up leave the keys (see `keep.lua`).
        claim.keep_until = claim
            .keys
            .at_least
            .and_then(|at_least| granted.started.checked_add(at_least));
        Self {
            core,
            claim,
            token: granted.token,
            ttl,
            acquired_at: granted.started,
            extended_at: granted.started,
            valid_until: Deadline::new(granted.valid_until),
            lost: false,
            released: false,
        }
    }

    /// Releases at once, also a lock taken `at_least`: the work it was
    /// taken for never started.
    pub(crate) async fn release_at_once(mut self) -> Result<()> {
        self.claim.keep_until = None;
        self.release().await
    }

    pub(crate) fn resource(&self) -> &str {
        self.claim.keys.label()
    }

    pub(crate) fn keys(&self) -> Arc<Keys> {
        Arc::clone(&self.claim.keys)
    }

    pub(crate) fn resources(&self) -> impl ExactSizeIterator<Item = &str> {
        self.claim.keys.resources.iter().map(|r| r.name())
    }

    pub(crate) fn value(&self) -> &str {
        &self.claim.value
    }

    pub(crate) fn token(&self) -> Option<FencingToken> {
        self.token
    }

    pub(crate) fn fence(&self) -> Result<Fence> {
        Fence::of(&self.claim.keys, self.token, None)
    }

    pub(crate) fn fence_for(&self, resource: &str) -> Result<Fence> {
        Fence::of(&self.claim.keys, self.token, Some(resource))
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    pub(crate) fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    pub(crate) fn last_extended(&self) -> Instant {
        self.extended_at
    }

    pub(crate) fn valid_until(&self) -> Instant {
        if self.lost {
            self.acquired_at
        } else {
            self.valid_until.instant()
        }
    }

    pub(crate) fn deadline(&self) -> Deadline {
        if self.lost {
            Deadline::new(self.acquired_at)
        } else {
            self.valid_until
        }
    }

    pub(crate) fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    pub(crate) fn is_valid(&self) -> bool {
        !self.remaining().is_zero()
    }

    pub(crate) async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let ttl = self.core.checked_ttl(ttl)?;
        if !self.is_valid() {
            return Err(self.not_held());
        }
        // A node that applies the new TTL keeps our key at least this long;
        // with a shorter TTL that can be sooner than the current validity.
        let drift = quorum::drift(ttl, self.core.config.drift_factor);
        let floor = Instant::now() + quorum::validity(ttl, Duration::ZERO, drift);
        self.valid_until = self.valid_until.min(Deadline::new(floor));
        let span = tracing::debug_span!(
            "extend",
            resource = %self.resource(),
            ttl_ms = ttl.as_millis() as u64,
            successes = tracing::field::Empty,
            failures = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
        );
        let result = self
            .core
            .extend(&self.claim, ttl, self.valid_until.instant())
            .instrument(span)
            .await;
        match &result {
            Ok(_) => telemetry::extended(),
            Err(_) => telemetry::extend_failed(),
        }
        match result {
            Ok(granted) => {
                self.valid_until = Deadline::new(granted.valid_until);
                self.extended_at = granted.started;
                self.ttl = ttl;
                Ok(())
            }
            Err(error) => {
                if matches!(error, Error::NotHeld { .. }) {
                    self.lost = true;
                }
                Err(error)
            }
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.core.config
    }

    pub(crate) fn background(&self) -> Arc<Background<Claim>> {
        Arc::clone(&self.core.background)
    }

    pub(crate) async fn release(mut self) -> Result<()> {
        let expired = !self.is_valid();
        let started = Instant::now();
        let span = tracing::debug_span!("release", resource = %self.resource());
        let (tally, errors) = self
            .core
            .release(&self.claim)
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
        if tally.failed() > 0 {
            // Nodes that failed to answer may still hold our key: keep
            // deleting there in the background.
            self.core.clean_up(self.claim.clone());
        }
        match tally.decision() {
            Decision::Won if !expired => Ok(()),
            Decision::Won => Err(self.not_held_after(expired)),
            // Our value is gone from too many nodes.
            Decision::Lost(Loss::Refused) if tally.refusals_alone_lose() => {
                Err(self.not_held_after(expired))
            }
            // A few refusals (nodes our SET never reached) plus failures.
            Decision::Lost(Loss::Refused) => Err(unavailable(self.resource(), &tally, errors)),
            // Like `Pending`, it would mean the cluster did not answer.
            Decision::Lost(Loss::Unavailable) | Decision::Pending => {
                Err(unavailable(self.resource(), &tally, errors))
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
            resource: self.resource().to_owned(),
            reason,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.released {
            tracing::debug!(resource = %self.resource(), "lock dropped unreleased; releasing in the background");
            self.core.clean_up(self.claim.clone());
        }
    }
}
