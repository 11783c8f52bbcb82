//! Waiting for a busy lock: woken by the release, served in arrival order.
//!
//! Awaiting a [`Request`](crate::Request) (`manager.lock("r").await`, and
//! the same for read and multi-resource locks) waits up to a deadline (the
//! request's [`wait`](crate::Request::wait)) for a held resource. How:
//!
//! - **A queue on every node.** A waiter takes a *ticket* when it starts
//!   waiting (its wall-clock time in microseconds, with a random 64-bit id
//!   to break ties) and sends it, unchanged, with every attempt. Each node
//!   keeps the resource's waiters in a sorted set by ticket, so all nodes
//!   order the waiters they know of the same way. A queued attempt sets the
//!   key (`SET NX PX`, with the fencing counter as usual) only if no *live*
//!   waiter is queued ahead of it on that node; otherwise it queues itself
//!   and the node answers with how soon the lock may be free there (the
//!   key's PTTL, or behind other waiters, no sooner than the first one's
//!   entry dies if it is not renewed). The first attempt of a wait for a
//!   lone exclusive resource (what `lock(r).await` is) is a plain attempt,
//!   as [`no_wait`](crate::Request::no_wait) sends: `SET NX PX` (the
//!   counter node's script with fencing, and a `GET` of the counter behind
//!   it on the other nodes), no script on the other nodes;
//!   refused, the waiter subscribes and queues with its next attempt, under
//!   the ticket it took when it began.
//! - **The queue keeps the lock key.** While a live waiter is queued for a
//!   resource on a node, its lock key exists there, so a plain `SET NX`
//!   (anyone's first attempt, or `no_wait()`) is refused and passes no
//!   waiter: a holder's key is kept past its own expiry, which its value
//!   then carries (`<value>\0<ms>`, the node time at which its key would
//!   have expired), and a lock left free is kept as `\0`, free for the
//!   first waiter alone. A holder whose key expires (it crashed) so leaves
//!   the lock to the first waiter, not to whoever comes next. Every script
//!   that changes who holds a lock first puts its keys back as they would
//!   be with no one waiting, and keeps them for the queue again last
//!   (`holders.lua`).
//! - **Woken by the release.** A release (or rollback, or a waiter leaving
//!   the queue) that leaves the key free on a node publishes the id of the
//!   first waiter queued there on `quorumlock:{<resource>}:wake` (where only
//!   readers are left, it wakes a reader at the head, with the readers
//!   right behind it; see [`crate::read_write`]). Each
//!   manager holds one pub/sub connection per node, shared by all its
//!   waiters, and rings only the waiter named: one release sends one
//!   waiter to the nodes, not all of them.
//! - **Never only woken.** Expiry publishes nothing, and notices can be
//!   lost. A refused waiter sleeps at most until the time a quorum of the
//!   nodes that answered gave (the `Q`-th smallest of their bounds, each
//!   counted from its answer's arrival) plus a millisecond, and renews its
//!   queue entry at least every half lease (the lease is the lock's TTL,
//!   at most 2 s: a waiter's place is held while it renews, not for the
//!   lock it asked for);
//!   with no bound known (a key without expiry) it polls every
//!   200 ± 100 ms; no pause is shorter than 10 ms.
//!   An attempt that found the service *unavailable* (no quorum reachable)
//!   is not waited out: it is retried on the `unavailable_retry` backoff
//!   within the deadline, and then the wait gives up (see
//!   [`crate::retry`]).
//! - **Woken by news, and once by any ring.** After a refused attempt, a
//!   waiter tries again at once on a ring from a node that refused it
//!   (also one that came while the attempt was out: it raced a release
//!   still on its way there), since that node rings it only once what
//!   kept it out there is gone; at least one of them must change before a
//!   quorum can grant (they were enough to keep one out). The first ring
//!   from any other node after such news (or the expiry timer) sets off an
//!   attempt at once too: most often it is another node's copy of the
//!   release the attempt raced, and an attempt sent then reaches the slower
//!   nodes behind that release. (Not after a renewal: the holder was not
//!   due to leave, and those rings are its echoes.) Rings from nodes that did not refuse after that
//!   are, as a rule, the echoes of its own rollbacks (each leaves the key
//!   kept for it), and it waits for news or its timer: so echoes cannot
//!   make it spin, and it is never asleep on a back-off when the release
//!   it waits for rings it. (It used to back off, 10 ms and doubling, when
//!   rung twice in a row: in the hot-key benchmark the first waiter then
//!   slept through the release while the queue kept the lock for it,
//!   stalls of up to 0.6 s in 1 run of 8.) When no node refused with a
//!   queued answer (quorum fencing's second round lost), any ring counts,
//!   no sooner than 10 ms after the attempt.
//!
//! Why it keeps Redlock's guarantees, and cannot deadlock:
//!
//! - The queue only adds a condition to `SET NX`: mutual exclusion, the
//!   quorum rule, validity and fencing are exactly those of `lock()`. A
//!   key kept for the queue holds no one past its holder's own expiry:
//!   read exactly (`PEXPIRETIME`) when the key is kept, compared with the
//!   node's time as Redis compares it (alive up to and including that
//!   millisecond), and put back with `SET … PXAT` before anything else
//!   reads it.
//! - The live waiter with the earliest ticket is ahead of no one on every
//!   node (all nodes order tickets alike; a dead entry at the head of a
//!   queue is dropped, with the other dead ones, by the first script that
//!   reads the queue after its lease ended, and a queue whose waiters all
//!   died expires with its last lease).
//!   So as soon as the holder's keys are gone, it is granted on every node
//!   it reaches, and a majority of nodes that are up is a quorum. Nodes
//!   that disagree (one missed a waiter's entry) can let a later waiter
//!   pass there, but never keep the first one out: no order of events
//!   blocks everyone.
//! - A waiter for several resources holds others back only where that
//!   helps it: in the resources' sorted order, it is queued up to the
//!   first one it is blocked on and on none after (see [`crate::many`]).
//!   So every wait points at a later resource, an earlier ticket on the
//!   same one, or a holder; a holder that waits (a nested lock) must take
//!   its resources in the same order, as with any mutex.
//! - A waiter that dies without leaving the queue holds up those behind it
//!   for at most its lease (its lock's TTL, at most 2 s), as a holder
//!   that dies does for its TTL; a waiter that is dropped or gives up
//!   leaves at once (in the background).
//! - With a minority of nodes down, the first waiter still reaches a
//!   quorum; notices from the nodes that are down are missed, and the
//!   others still come.
//!
//! How fair: waiters are served in ticket order, i.e. in arrival order up
//! to the clock offset between the waiting hosts (a client whose clock is
//! behind by `d` jumps ahead of waiters that arrived less than `d` before
//! it). A waiter is served after at most the waiters whose tickets are
//! earlier, each holding once, plus the unlucky cases above. A request
//! that does not wait ([`no_wait`](crate::Request::no_wait)) never passes
//! the queue either: it takes a lock only where no live waiter would be
//! served before it. One cost of that: after every waiter of a resource
//! died without leaving (crashed), the key kept for them refuses plain
//! attempts until the queue's keys expire (at most one lease, 2 s at the
//! most, plus a second after the last renewal); a waiting request gets the
//! lock at its next attempt, which reads the queue.

pub(crate) mod notify;
pub(crate) mod plan;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::engine::{AfterFailure, Attempt, Claim, Core, refused_by_breaker};
use crate::error::{Error, Result};
use crate::held::Held;
use crate::keys::Keys;
use crate::limits::check_wait;
use crate::manager::LockManager;
use crate::ops::Queued;
use crate::quorum;
use crate::retry::Retries;
use crate::round::Trail;
use crate::telemetry;

pub use plan::WakeCause;

/// How often a refused waiter tries again when the nodes gave no bound
/// (a key without expiry), with up to [`POLL_JITTER`] more at random.
const POLL: Duration = Duration::from_millis(200);
const POLL_JITTER: Duration = Duration::from_millis(100);

/// Floor of every pause between attempts: a bound of zero must not make a
/// waiter spin.
pub(crate) const SHORTEST_SLEEP: Duration = Duration::from_millis(10);

/// Added to the time the nodes gave: PTTL is in whole milliseconds, and
/// it was read before its reply came back, so waking at that reply plus
/// the PTTL (plus this) is at most the reply's way back after the key
/// expired. (Counted from the round's end instead, a waiter woke as late
/// as the round was long: 16 ms after a crashed holder's expiry when 64
/// waiters had queued at once.)
const PTTL_ROUNDING: Duration = Duration::from_millis(1);
use plan::{Step, Timers};

/// One wait in progress: if it ends without a lock (deadline, error,
/// dropped at any await), its queue entries are removed in the background
/// from every node an attempt of it may have reached, counted for
/// `settle()`.
struct Waiter {
    core: Arc<Core>,
    keys: Arc<Keys>,
    queued: Queued,
    /// Every node an attempt of this wait was sent to (the current
    /// attempt's trail is added when it ends or is dropped).
    reached: Arc<Trail>,
    current: Option<Arc<Trail>>,
    /// Set once a lock owns the entries (its release dequeues).
    won: bool,
}

impl Waiter {
    /// The next attempt goes out on `trail`.
    fn attempting(&mut self, trail: &Arc<Trail>) {
        if let Some(previous) = self.current.replace(Arc::clone(trail)) {
            self.reached.absorb(&previous);
        }
    }

    /// The attempt on `claim` won. Won at the first attempt (the
    /// uncontended case), the lock's release dequeues the nodes it reached.
    /// Won after waiting, the holder leaves every queue now, in the
    /// background: it no longer waits, so a break or a lost lock must wake
    /// the next waiter, not the holder, and `holders()` must not count it
    /// as a waiter. (A granted waiter stays queued on a node until then, so
    /// that an attempt that loses overall keeps its place.) The release
    /// dequeues again, behind any straggler of the winning attempt.
    /// Won at once where others wait (a read lock or several resources
    /// are queued attempts from the first), the winning attempt left it in
    /// those queues (`in_line`: some node said so), and it leaves them now
    /// too. (It stayed there while it held: a writer queued behind such a
    /// reader waited for the reader's lease after a break.)
    /// A `plain` attempt queued nowhere: the release has no one to dequeue.
    /// `after_waiting`: an earlier attempt of this wait failed.
    fn won(mut self, claim: &mut Claim, plain: bool, after_waiting: bool, in_line: bool) {
        claim.waiter = (!plain).then_some(self.queued.waiter);
        self.current = None;
        self.won = true;
        if !plain && (after_waiting || in_line || !self.reached.is_empty()) {
            self.reached.absorb(&claim.sent);
            let quietly = Claim {
                // A release that keeps (`keep.lua`), with no value: it only
                // dequeues, and wakes no one. Waking here would ring the
                // next waiter for a lock we hold: an attempt for nothing.
                keep_until: Some(Instant::now() + crate::limits::MAX_TTL),
                ..self.dequeue(Arc::clone(&self.reached))
            };
            self.core.clean_up(quietly);
        }
    }

    fn dequeue(&self, from: Arc<Trail>) -> Claim {
        Claim {
            keys: Arc::clone(&self.keys),
            // No lock value: the release script then only dequeues.
            value: Arc::from(""),
            sent: from,
            waiter: Some(self.queued.waiter),
            keep_until: None,
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.won {
            return;
        }
        if let Some(current) = self.current.take() {
            self.reached.absorb(&current);
        }
        self.core.clean_up(self.dequeue(Arc::clone(&self.reached)));
    }
}

impl LockManager {
    /// Waits up to `wait` for `keys` (with the error that made them
    /// invalid, if any), queued: what awaiting a [`Request`](crate::Request) does.
    pub(crate) async fn wait_for(
        &self,
        keys: Result<Keys>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Held> {
        let keys = Arc::new(keys?);
        check_wait(wait).map_err(|reason| Error::InvalidArgument {
            argument: "wait",
            reason,
        })?;
        let core = &self.core;
        let ttl = core.checked_ttl(ttl)?;
        core.run_deferred();
        let span = tracing::debug_span!(
            "wait",
            resource = %keys.label(),
            access = ?keys.access,
            ttl_ms = ttl.as_millis() as u64,
            wait_ms = wait.as_millis() as u64,
            attempt = tracing::field::Empty,
            successes = tracing::field::Empty,
            failures = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
            validity_ms = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
            woken_by = tracing::field::Empty,
        );
        self.wait_loop(keys, ttl, wait).instrument(span).await
    }

    async fn wait_loop(&self, keys: Arc<Keys>, ttl: Duration, wait: Duration) -> Result<Held> {
        let core = &self.core;
        let config = &core.config;
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .unwrap_or(started + crate::limits::MAX_TTL);
        let channels = || keys.resources.iter().map(|r| r.channel());
        let lease = plan::waiter_lease(ttl);
        let mut waiter = Waiter {
            core: Arc::clone(core),
            keys: Arc::clone(&keys),
            queued: Queued::new(lease),
            reached: Trail::new(core.nodes.len()),
            current: None,
            won: false,
        };
        // Subscribed before the first attempt when this manager already
        // follows the resource; otherwise only once an attempt is refused
        // (an uncontended wait costs what one attempt costs), and then an
        // attempt follows at once, so no release in between is missed.
        // An open breaker fails the call at once, before any await.
        core.board.refusal().inspect_err(|open| {
            telemetry::breaker_refused();
            telemetry::acquire_failed(open);
        })?;
        let mut registration = core
            .hub
            .is_subscribed_to_all(channels())
            .then(|| core.hub.register(channels(), waiter.queued.waiter));
        if let Some(registration) = &mut registration {
            registration.subscribed().await;
        }
        let mut attempt = 0;
        // Whether a ring from a node that had not refused (no news) set off
        // the last attempt.
        let mut echo_spent = false;
        let mut unavailable = Retries::new(&config.unavailable_retry);
        // The last attempt's failure, if it found the resource held.
        let mut last_held: Option<Error> = None;
        loop {
            attempt += 1;
            tracing::Span::current().record("attempt", attempt);
            let admission = match core.board.admit() {
                Ok(admission) => admission,
                Err(open) => {
                    // After the resource was found held, the wait ends as
                    // one that timed out (see `refused_by_breaker`).
                    let held = last_held.take().map(|held| {
                        gave_up(keys.label(), held, started.elapsed(), attempt - 1, None)
                    });
                    let error = refused_by_breaker(open, held, attempt - 1);
                    telemetry::acquire_failed(&error);
                    return Err(error);
                }
            };
            let claim = Claim::new(Arc::clone(&keys), core.nodes.len());
            // The first attempt at a lone exclusive resource is a plain
            // attempt (`SET NX PX`): most locks meet no one, and a queue
            // keeps the lock key held (see `holders.lua`), so it passes no
            // waiter. Refused, the waiter queues with its next attempt,
            // under the ticket it took now. A plain attempt queues nowhere:
            // its rollback is all the cleanup it needs.
            let plain = attempt == 1 && keys.simple().is_some();
            if !plain {
                waiter.attempting(&claim.sent);
            }
            let guard = Attempt::new(core, &claim);
            let attempt_started = Instant::now();
            let queued = (!plain).then_some(waiter.queued);
            // The attempt meets whatever the rings so far announced.
            if let Some(registration) = &registration {
                registration.forget_rings();
            }
            let (result, refusals) = core.acquire_once(&claim, ttl, queued).await;
            admission.finish(&result);
            let ended = Instant::now();
            telemetry::attempt_finished(ended - attempt_started, result.as_ref().err());
            let failure = match result {
                Ok(granted) => {
                    let mut claim = guard.won();
                    let in_line = refusals.in_line_on != 0;
                    waiter.won(&mut claim, plain, attempt > 1, in_line);
                    let waited = started.elapsed();
                    tracing::Span::current().record("waited_ms", waited.as_secs_f64() * 1e3);
                    tracing::debug!(attempt, token = ?granted.token, "acquired");
                    telemetry::acquired(waited);
                    return Ok(Held::new(Arc::clone(core), claim, ttl, granted));
                }
                Err(failure) => failure,
            };
            // Rolls back whatever the attempt set.
            drop(guard);
            tracing::debug!(attempt, error = %failure, "attempt failed");
            // Unavailability is retried on its backoff, within the deadline,
            // then given up; only a held resource is waited out.
            match core.after_failure(
                &mut unavailable,
                &failure,
                attempt_started,
                ended,
                Some(deadline),
            ) {
                AfterFailure::Contended => last_held = Some(failure.clone()),
                AfterFailure::RetryAfter(pause) => {
                    last_held = None;
                    // Notices cannot help here (our own rollbacks ring
                    // us): the pause is slept out, but no longer than the
                    // queue entry lives unrenewed.
                    tokio::time::sleep_until(ended + pause.min(lease / 2)).await;
                    continue;
                }
                AfterFailure::GiveUp => {
                    telemetry::acquire_failed(&failure);
                    return Err(failure);
                }
            }
            if registration.is_none() {
                let mut joined = core.hub.register(channels(), waiter.queued.waiter);
                // Bounded by the deadline too: a node whose subscription is
                // slow to connect only costs its notices.
                let _ = tokio::time::timeout_at(deadline, joined.subscribed()).await;
                registration = Some(joined);
                if Instant::now() < deadline {
                    continue;
                }
            }
            // A refused plain attempt queued nowhere, and no release rings
            // a waiter that is in no queue: queue at once.
            if plain && Instant::now() < deadline {
                continue;
            }
            let timers = Timers {
                margin: PTTL_ROUNDING,
                renew_every: lease / 2,
                poll: quorum::retry_delay(POLL, POLL_JITTER, fastrand::f64()),
                shortest: SHORTEST_SLEEP,
            };
            let (at, cause) = match plan::next_step(
                attempt_started,
                ended,
                deadline,
                refusals.opens_in,
                timers,
            ) {
                Step::Retry { at, cause } => (at, Some(cause)),
                Step::GiveUpAt(at) => (at, None),
            };
            // Woken at once by a ring from a node that refused the attempt:
            // what kept it out there is gone (see `Refusals::news_from`).
            // So is the first ring from any node after news or the expiry
            // timer: most often another node's copy of the release the
            // attempt raced, and an attempt sent then reaches the slower
            // nodes behind that release. Rings after it, from nodes that did
            // not refuse, are as a rule our own rollbacks' echoes: they wait
            // with the timer. So are those after a renewal or a poll (the
            // holder was not due to leave): every half lease, one attempt,
            // not two.
            let news_from = refusals.news_from();
            let listen = if echo_spent {
                news_from
            } else {
                plan::EVERY_NODE
            };
            let rung = async {
                match &registration {
                    Some(registration) => registration.rung_by(listen).await,
                    None => std::future::pending().await,
                }
            };
            let woken_by = tokio::select! {
                biased;
                rung = rung => {
                    echo_spent = rung & news_from == 0;
                    Some(WakeCause::Notification)
                }
                () = tokio::time::sleep_until(at) => {
                    echo_spent = cause != Some(WakeCause::Expiry);
                    cause
                }
            };
            let Some(woken_by) = woken_by else {
                let error = gave_up(
                    keys.label(),
                    failure,
                    started.elapsed(),
                    attempt,
                    refusals
                        .opens_in
                        .map(|bound| bound.saturating_sub(attempt_started.elapsed())),
                );
                tracing::Span::current().record("waited_ms", started.elapsed().as_secs_f64() * 1e3);
                telemetry::acquire_failed(&error);
                return Err(error);
            };
            tracing::Span::current().record("woken_by", woken_by.label());
            telemetry::woken(woken_by);
            // With no refusal to tell news from our own rollbacks' echoes,
            // any ring counts: then not at once, so that those echoes
            // cannot make the waiter spin.
            if woken_by == WakeCause::Notification && news_from == plan::EVERY_NODE {
                tokio::time::sleep_until((ended + SHORTEST_SLEEP).min(at)).await;
            }
        }
    }
}

/// The error of a wait that reached its deadline: still held, or the last
/// attempt's own failure (an unavailable cluster, a slow quorum).
fn gave_up(
    resource: &str,
    last: Error,
    waited: Duration,
    attempts: u32,
    free_in: Option<Duration>,
) -> Error {
    match last {
        Error::Contended { .. } => Error::WaitTimedOut {
            resource: resource.to_owned(),
            waited,
            attempts,
            free_in,
        },
        other => other,
    }
}
