//! Leader election on the quorum lock: [`LockManager::election`].
//!
//! A role is led by whoever holds its lock (the resource `election:<role>`).
//! Candidates [`campaign`](Election::campaign): they wait, queued and woken
//! in arrival order, and the one that gets the lock leads, kept alive,
//! until it [resigns](Leadership::resign), is dropped, or loses the lock
//! (a pause past its validity, nodes it cannot reach): its
//! [`Leadership::lost`] resolves the moment that is known, and
//! [`Leadership::is_leader`] turns `false`.
//!
//! The **term** is the lock's fencing token: strictly increasing per role,
//! so storage that checks tokens ([`FencedRedis`](crate::FencedRedis), or
//! a token column) refuses a deposed leader's writes once its successor
//! has written. Leading is a belief bounded by the validity, like holding
//! any lock: fence every write with [`Leadership::fence`].
//!
//! Anyone can read who leads ([`Election::leader`]) or
//! [observe](Election::observe) the changes without campaigning. A new
//! leader and a resignation announce themselves on the role's channel, and
//! the leader announces each extension with the validity it now has, so an
//! observer reads the nodes only when told of a change, or when the
//! announcements stop and the last validity it heard of ends (a leader
//! that died with no successor, or a lost notice).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> quorumlock::Result<()> {
//! # let cluster = quorumlock::testkit::TestCluster::start(3)?;
//! # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
//! let election = manager.election("billing-scheduler");
//! let leadership = election.campaign("host-a pid 4242").await?;
//! // Lead while it lasts, fencing every write with the term.
//! let term = leadership.term();
//! let leader = election.leader().await?.expect("someone leads");
//! assert_eq!(leader.candidate.as_deref(), Some("host-a pid 4242"));
//! tokio::select! {
//!     lost = leadership.lost() => eprintln!("deposed in term {term}: {lost}"),
//!     () = async { /* the leader's work, fenced with leadership.fence()? */ } => {}
//! }
//! leadership.resign().await?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::fencing::{Fencing, FencingToken};
use crate::keys::{KeyKind, Keys, key_of};
use crate::limits::MAX_TTL;
use crate::manager::LockManager;
use crate::storage::Fence;
use crate::wait::notify::{ALIVE, CHANGED, Registration, Watched};
use crate::watchdog::{KeepAlive, Lease};

/// The role's resource name.
fn resource_of(role: &str) -> String {
    format!("election:{role}")
}

/// The election for one role: see [`crate::election`].
#[derive(Debug, Clone)]
pub struct Election {
    manager: LockManager,
    role: String,
    resource: String,
}

/// Who leads a role now, as a quorum of nodes sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The candidate's description, as it campaigned.
    pub candidate: Option<String>,
    /// How long a quorum still keeps its lock (it extends it while it
    /// lives), less the drift allowance.
    pub valid_for: Option<Duration>,
    /// Its lock's value: unique to its term.
    pub value: String,
}

impl LockManager {
    /// The election for `role`: see [`crate::election`]. Building it does
    /// nothing; the role's lock is the resource `election:<role>`.
    pub fn election(&self, role: &str) -> Election {
        Election {
            manager: self.clone(),
            role: role.to_owned(),
            resource: resource_of(role),
        }
    }
}

impl Election {
    /// The role.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// Waits, queued and woken, until this candidate leads the role, then
    /// keeps its lock alive; `candidate` describes it to observers (as
    /// [`Request::holder`](crate::Request::holder), at most
    /// [`MAX_HOLDER_LEN`](crate::MAX_HOLDER_LEN) bytes). Waits however
    /// long that takes, whatever the manager's `wait` setting, keeping its
    /// place in the queue (wrap it in `tokio::time::timeout` to bound
    /// it); returns the errors that are not about waiting (the nodes
    /// unavailable past the manager's `unavailable_retry`, a bad
    /// argument). [`Error::InvalidConfig`] when the manager's fencing is
    /// off: the term is the fencing token.
    ///
    /// # Cancel safety
    ///
    /// Dropping it while waiting acquires nothing (as for a dropped
    /// [`Request`](crate::Request)); once it has led, the leadership is
    /// returned in the same poll, with nothing left to await.
    pub async fn campaign(&self, candidate: &str) -> Result<Leadership> {
        if self.manager.core.config.fencing == Fencing::Off {
            return Err(Error::InvalidConfig {
                setting: "fencing",
                reason: "an election's term is the lock's fencing token: build the manager \
                         with fencing on (the default, Fencing::CounterNode)"
                    .into(),
            });
        }
        loop {
            // As long as a wait may be: a new wait would lose its place.
            let request = self.manager.lock(&self.resource).holder(candidate);
            match request.wait(MAX_TTL).await {
                Ok(lock) => {
                    let value = lock.value().to_owned();
                    let keep = lock.keep_alive()?;
                    let lease = keep.lease();
                    let term = lease.token().ok_or_else(|| Error::InvalidConfig {
                        setting: "fencing",
                        reason: "the lock came without a token".into(),
                    })?;
                    self.announce();
                    let heartbeat = tokio::spawn(heartbeat(
                        self.manager.clone(),
                        self.resource.clone(),
                        lease.clone(),
                        value,
                    ));
                    return Ok(Leadership {
                        keep: Some(keep),
                        lease,
                        term,
                        election: self.clone(),
                        heartbeat,
                    });
                }
                Err(Error::WaitTimedOut { .. }) => continue,
                Err(other) => return Err(other),
            }
        }
    }

    /// Who leads now, if a quorum agrees on a leader; `None` only when a
    /// quorum says nobody does. [`Error::SplitView`] when the nodes that
    /// answered say neither (a handover in progress, or nodes this client
    /// cannot reach while the leader can), [`Error::QuorumUnavailable`]
    /// when too few answer.
    ///
    /// # Cancel safety
    ///
    /// It only reads: dropping it leaves nothing behind.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let holding = self.manager.holders(&self.resource).await?;
        match holding.exclusive() {
            Some(holder) => Ok(Some(Leader {
                candidate: holder.description.clone(),
                valid_for: holder.valid_for,
                value: holder.value.clone(),
            })),
            None if holding.free => Ok(None),
            None => Err(Error::SplitView {
                resource: self.resource.clone(),
                answered: holding.answered,
            }),
        }
    }

    /// Follows who leads, without campaigning: see [`Observer::changed`].
    pub fn observe(&self) -> Observer {
        Observer {
            election: self.clone(),
            registration: None,
            seen: None,
            due: false,
        }
    }

    /// Tells the role's observers that its leader changed, in the
    /// background (a lost notice costs an observer only the wait until
    /// the validity it last read ends).
    fn announce(&self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(publish(
                self.manager.clone(),
                self.resource.clone(),
                CHANGED.to_owned(),
            ));
        }
    }
}

/// Publishes `notice` on `resource`'s channel on every member, within
/// two `node_timeout`s.
async fn publish(manager: LockManager, resource: String, notice: String) {
    let Ok(keys) = Keys::exclusive(&resource) else {
        return;
    };
    let channel = key_of(KeyKind::Wake, &resource);
    let core = &manager.core;
    let limit = core.config.node_timeout;
    let sent = core.nodes.iter().map(|member| {
        let (keys, channel, notice) = (&keys, &channel, &notice);
        async move {
            let node = member.node_for(keys).await?;
            node.request(limit, |mut connection| async move {
                redis::cmd("PUBLISH")
                    .arg(channel)
                    .arg(notice)
                    .query_async::<i64>(&mut connection)
                    .await
            })
            .await
        }
    });
    let _ = tokio::time::timeout(limit * 2, futures::future::join_all(sent)).await;
}

/// While the lease lives, tells the observers after each extension how
/// long the leader whose lock value is `value` holds now
/// (`alive:<number>:<ms>:<value>`, numbered so an observer counts the
/// first copy of each), so that they need not read the nodes while
/// nothing changes.
async fn heartbeat(manager: LockManager, resource: String, mut lease: Lease, value: String) {
    let mut number: u64 = 0;
    while lease.changed().await && lease.is_valid() {
        number += 1;
        let left = lease.remaining().as_millis();
        let notice = format!("{ALIVE}{number}:{left}:{value}");
        publish(manager.clone(), resource.clone(), notice).await;
    }
}

/// Leading a role: the lock, kept alive, and its term. Dropping it
/// resigns in the background (the lock is released, counted by
/// [`LockManager::settle`]); observers learn of it when the next leader
/// announces itself, or when the validity last announced ends
/// ([`resign`](Self::resign) tells them at once).
///
/// A leader whose lock an operator broke
/// ([`LockManager::force_unlock`]) is not told at once: it believes it
/// leads until its next extension fails, while the candidate the break
/// woke already leads. Only the term, checked by the storage, keeps the
/// two apart then.
#[must_use = "the role is given up when the leadership is dropped: keep it while leading"]
#[derive(Debug)]
pub struct Leadership {
    /// `None` once resigned.
    keep: Option<KeepAlive>,
    lease: Lease,
    term: FencingToken,
    election: Election,
    /// Tells observers of each extension; stopped with the leadership.
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

impl Leadership {
    /// The term: the lock's fencing token, strictly increasing per role.
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The fence to pass with every write the leader makes: storage that
    /// checks it refuses a deposed leader's writes once its successor has
    /// written.
    pub fn fence(&self) -> Result<Fence> {
        self.lease.fence()
    }

    /// The lock's lease: validity, extensions, loss.
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// Whether this candidate still leads as far as it can know: the lock
    /// is valid and not lost. Check it between steps of the leader's work.
    pub fn is_leader(&self) -> bool {
        self.lease.is_valid()
    }

    /// Resolves when the leadership is lost (see [`Lease::lost`]): the
    /// lock could not be extended within its validity, or was taken over
    /// or broken.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only watches.
    pub async fn lost(&self) -> Error {
        self.lease.lost().await
    }

    /// Gives up the role: releases the lock, then tells the observers.
    ///
    /// # Cancel safety
    ///
    /// Dropped at its await, the release goes on in the background (as
    /// [`KeepAlive::release`]); the observers then learn of it when the
    /// next leader announces itself, or when the validity they read ends.
    pub async fn resign(mut self) -> Result<()> {
        self.heartbeat.abort();
        let released = match self.keep.take() {
            Some(keep) => keep.release().await,
            None => Ok(()),
        };
        self.election.announce();
        released
    }
}

/// Follows who leads a role: [`Election::observe`].
pub struct Observer {
    election: Election,
    registration: Option<(Registration, Arc<Watched>)>,
    /// The leader last returned (`Some(None)`: no leader), and until when
    /// that reading holds.
    seen: Option<(Option<Leader>, Option<Instant>)>,
    /// The nodes are to be read without waiting (a call was dropped
    /// after it was told of a change).
    due: bool,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("role", &self.election.role)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl Observer {
    /// The leader now (`None`: nobody leads) the first time; after that,
    /// waits until that changes (another leader, or none) and returns the
    /// new state. Reads the nodes when a new leader or a resignation is
    /// announced, and when the validity it last read or heard of ends;
    /// the leader's announcements of its extensions only move that end
    /// (the first copy of each: a node that relays them late does not
    /// prolong a dead leader). While a leader holds, it reads nothing.
    /// Only a quorum's view is returned: while the nodes it reaches cannot
    /// tell who leads ([`Error::SplitView`]), it reads again every 100 ms
    /// and returns nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads, and a change it was about to return is
    /// returned by the next call.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        let manager = &self.election.manager;
        if self.registration.is_none() {
            let channel = key_of(KeyKind::Wake, &self.election.resource);
            let (mut registration, watched) = manager.core.hub.watch(&channel);
            registration.subscribed().await;
            self.registration = Some((registration, watched));
        }
        loop {
            // After the first reading: wait to be told of a change, or for
            // the end of the validity last read or announced.
            if let (Some((seen_leader, until)), false, Some((registration, watched))) =
                (&mut self.seen, self.due, &self.registration)
            {
                let mut end = until.unwrap_or_else(|| Instant::now() + manager.core.config.ttl);
                loop {
                    tokio::select! {
                        () = registration.rung() => {}
                        () = tokio::time::sleep_until(end) => break,
                    }
                    if watched.take_changed() {
                        break;
                    }
                    // The leader seen extended its lock: nothing to read.
                    // Another one's notice: a change this observer missed.
                    let seen_value = seen_leader.as_ref().map(|l| l.value.as_str());
                    match watched.alive() {
                        Some((alive, holder)) if Some(holder.as_str()) == seen_value => {
                            end = end.max(alive + SETTLE);
                            *until = Some(end);
                        }
                        Some(_) => break,
                        None => {}
                    }
                }
            }
            // Kept if this call is dropped while reading: the next one
            // reads at once.
            self.due = true;
            let now = match self.election.leader().await {
                // Not "nobody": nothing to report yet; read again shortly.
                Err(Error::SplitView { .. }) => {
                    tokio::time::sleep(SPLIT_VIEW_PAUSE).await;
                    continue;
                }
                read => read?,
            };
            self.due = false;
            let until = now
                .as_ref()
                .and_then(|leader| leader.valid_for)
                .map(|left| Instant::now() + left + SETTLE);
            let value = |leader: &Option<Leader>| leader.as_ref().map(|l| l.value.clone());
            let same = matches!(&self.seen, Some((last, _)) if value(last) == value(&now));
            self.seen = Some((now.clone(), until));
            if !same {
                return Ok(now);
            }
        }
    }
}

/// Past the end of a validity read, the time an expiry takes to show
/// (nodes expire keys on access or in their background cycle).
const SETTLE: Duration = Duration::from_millis(10);

/// How soon an observer reads the nodes again after they could not tell
/// who leads.
const SPLIT_VIEW_PAUSE: Duration = Duration::from_millis(100);
