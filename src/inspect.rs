//! Operators' requests over the quorum: who holds a resource
//! ([`LockManager::holders`]) and force-unlock
//! ([`LockManager::force_unlock`]). Each asks every member once, within
//! `node_timeout`; the quorum's view is [`crate::holding`]'s.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use redis::Value;

use crate::error::{Error, NodeError, NodeErrorKind, Result};
use crate::holding::{ForcedUnlock, Holding, NodeHolding, combine};
use crate::keys::{Keys, ResourceKeys};
use crate::manager::LockManager;
use crate::member::Member;
use crate::node::Node;
use crate::quorum::quorum;
use crate::scripts::{FORCE_UNLOCK, INSPECT};
use crate::wait::plan::opens_in;

impl LockManager {
    /// Who holds `resource`, as a quorum of nodes sees it: the exclusive
    /// holder or every reader (a lock on several resources shows on each
    /// of them), with the description each gave
    /// ([`Request::holder`](crate::Request::holder)) and how long a quorum
    /// still keeps it; the highest fencing counter; the live waiters.
    /// Nodes the [node guard](crate::guard) does not count are not asked.
    /// [`Error::QuorumUnavailable`] when fewer than a quorum answer.
    ///
    /// The answer is a snapshot: the lock may change hands right after it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// let lock = manager.lock("nightly-report").holder("host-a pid 4242").await?;
    /// let holding = manager.holders("nightly-report").await?;
    /// let holder = holding.exclusive().expect("held");
    /// assert_eq!(holder.description.as_deref(), Some("host-a pid 4242"));
    /// assert!(holder.valid_for.is_some_and(|left| left <= lock.ttl()));
    /// lock.release().await?;
    /// assert!(manager.holders("nightly-report").await?.free);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// It only reads: dropping it leaves nothing behind.
    pub async fn holders(&self, resource: &str) -> Result<Holding> {
        let counters = self.core.config.fence_counters;
        let keys = Keys::exclusive(resource)?.counted_by(counters);
        let one = &keys.resources[0];
        let other = one.other_counter(counters);
        let started = tokio::time::Instant::now();
        let answers = self
            .on_every_member(&keys, true, |node, limit| {
                inspect_on(node, one, other.as_deref(), limit)
            })
            .await;
        let (answers, errors) = split(answers);
        let mut holding = combine(resource, &answers, self.core.config.drift_factor);
        holding.counter_known = self.counter_read(&answers);
        self.enough(resource, holding.answered, errors)?;
        // Counted from before the read, as a client counts its validity.
        let read_took = started.elapsed();
        for holder in &mut holding.holders {
            holder.valid_for = holder.valid_for.map(|left| left.saturating_sub(read_took));
        }
        Ok(holding)
    }

    /// Force-unlock, for an operator: breaks what `what` names, on every
    /// node, and nothing else.
    ///
    /// - `force_unlock(&shown)` ([`Break::Shown`], from a [`Holding`] that
    ///   [`holders`](Self::holders) returned): the holders it showed held
    ///   by a quorum ([`Holding::holders`]). On each node, a holder's entry
    ///   is deleted only if it is one of those, so a holder that took the
    ///   lock since (the one shown released it, or its keys expired) keeps
    ///   it, and so does one the read met mid-acquire (its key on too few
    ///   nodes yet: [`Holding::seen`], not shown as a holder). With no
    ///   holder shown, nothing is deleted.
    /// - `force_unlock(Break::WhoeverHolds("name"))`: the lock whoever
    ///   holds it when this runs, including a holder that took it after
    ///   anyone looked. For a lock whose holders cannot be read first;
    ///   prefer the first form.
    ///
    /// The first waiter is woken where the lock is free afterwards.
    /// [`Error::QuorumUnavailable`] when fewer than a quorum of nodes
    /// answered: the lock may then still stand.
    ///
    /// The holder broken is not told: it finds out at its next extension
    /// (its keep-alive reports the loss, [`Lease::lost`](crate::Lease::lost)),
    /// or its release returns [`Error::NotHeld`]. Until then it may still
    /// be working, so this is safe only for storage that checks fencing
    /// tokens: the next holder's token is above
    /// [`ForcedUnlock::counter`], and once the next holder has written,
    /// the old holder's writes are refused. A lock taken
    /// [`at_least`](crate::Request::at_least) is freed too.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// use quorumlock::Break;
    ///
    /// let stuck = manager.lock("nightly-report").await?;
    /// let shown = manager.holders("nightly-report").await?;
    /// // … the operator looks at `shown`, and decides …
    /// let broken = manager.force_unlock(&shown).await?;
    /// assert!(broken.deleted >= 2, "a quorum held it");
    /// let next = manager.lock("nightly-report").no_wait().await?;
    /// assert!(next.fence()?.token().get() > broken.counter.unwrap_or(0));
    /// // Unseen: whoever holds it now.
    /// manager.force_unlock(Break::WhoeverHolds("nightly-report")).await?;
    /// assert!(manager.holders("nightly-report").await?.free);
    /// # drop(stuck);
    /// # drop(next);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropped before every node answered, the lock is deleted on the
    /// nodes the request reached and may stand on the others: run it
    /// again.
    pub async fn force_unlock<'a>(&self, what: impl Into<Break<'a>>) -> Result<ForcedUnlock> {
        match what.into() {
            Break::Shown(shown) => {
                let holders: Vec<String> = shown
                    .holders
                    .iter()
                    .map(|holder| holder.value.clone())
                    .collect();
                self.break_lock(&shown.resource, Breaking::Shown(&holders))
                    .await
            }
            Break::WhoeverHolds(resource) => self.break_lock(resource, Breaking::Anyone).await,
        }
    }

    async fn break_lock(&self, resource: &str, breaking: Breaking<'_>) -> Result<ForcedUnlock> {
        let counters = self.core.config.fence_counters;
        let keys = Keys::exclusive(resource)?.counted_by(counters);
        let one = &keys.resources[0];
        let other = one.other_counter(counters);
        let answers = self
            .on_every_member(&keys, false, |node, limit| {
                force_unlock_on(node, one, other.as_deref(), breaking, limit)
            })
            .await;
        let (answers, errors) = split(answers);
        let answered = answers.iter().flatten().count();
        self.enough(resource, answered, errors)?;
        let deleted = answers.iter().flatten().filter(|(held, _)| *held).count();
        Ok(ForcedUnlock {
            resource: resource.to_owned(),
            deleted,
            answered,
            nodes: answers.len(),
            counter: answers.iter().flatten().filter_map(|(_, c)| *c).max(),
            counter_known: self.counter_read(&answers),
        })
    }

    /// Whether `answers` (by member) include what keeps the counter: in
    /// counter-node fencing, the counter node (its tokens are its own) and
    /// enough of the others to meet any majority of them (a token issued
    /// without it is stored on one); any quorum otherwise (a quorum-mode
    /// token is stored on a majority).
    fn counter_read<T>(&self, answers: &[Option<T>]) -> bool {
        match self.core.config.fencing {
            crate::fencing::Fencing::CounterNode { node } => {
                let others = answers
                    .iter()
                    .enumerate()
                    .filter(|&(i, answer)| i != node && answer.is_some())
                    .count();
                let total = answers.len();
                answers.get(node).is_some_and(Option::is_some)
                    && others >= total - crate::quorum::quorum(total)
            }
            _ => true,
        }
    }

    /// A refused attempt's retry-after hint: how soon a quorum of members
    /// may be free of `keys`, by their keys' time left (`PTTL`, read on
    /// every member at once, each within `node_timeout`). `None` when the
    /// nodes cannot tell: keys without expiry, too few answers, or none
    /// held (then something else refused the attempt: queued waiters).
    pub(crate) async fn free_in(&self, keys: &Keys) -> Option<Duration> {
        let outcomes = self
            .on_every_member(keys, false, |node, limit| async move {
                let mut pttl = redis::pipe();
                for resource in &keys.resources {
                    pttl.cmd("PTTL").arg(resource.lock());
                }
                node.request(limit, |mut connection| async move {
                    pttl.query_async::<Vec<i64>>(&mut connection).await
                })
                .await
            })
            .await;
        let per_node: Vec<Option<Duration>> = outcomes
            .into_iter()
            .map(|outcome| longest_time_left(&outcome.ok()?))
            .collect();
        // Fewer than a quorum of answers give a guess, not a bound.
        if per_node.iter().flatten().count() < self.quorum() {
            return None;
        }
        opens_in(&per_node, self.quorum()).filter(|left| !left.is_zero())
    }

    /// `ask` on the server that serves `keys` in every member, at once,
    /// each within `node_timeout`; with `counted_only`, a server the guard
    /// does not count is not asked (its answer may predate a data loss).
    async fn on_every_member<'a, T, F, Fut>(
        &'a self,
        keys: &'a Keys,
        counted_only: bool,
        ask: F,
    ) -> Vec<std::result::Result<T, NodeError>>
    where
        F: Fn(Arc<Node>, Duration) -> Fut,
        Fut: Future<Output = std::result::Result<T, NodeError>>,
    {
        let timeout = self.core.config.node_timeout;
        join_all(self.core.nodes.iter().map(|member| async {
            let asked = async {
                let node = member.node_for(keys).await?;
                // Connected first: a node met for the first time is
                // observed on connect, and judged before it counts.
                node.connection().await?;
                if counted_only && let Some(quarantine) = node.quarantine() {
                    node.observe_soon();
                    return Err(node.quarantined(quarantine));
                }
                ask(node, timeout).await
            };
            let outcome = match tokio::time::timeout(timeout, asked).await {
                Ok(outcome) => outcome,
                Err(_) => Err(member.timed_out(None, timeout)),
            };
            note_failure(member, &outcome);
            outcome
        }))
        .await
    }

    /// `QuorumUnavailable` unless `answered` reach a quorum.
    fn enough(&self, resource: &str, answered: usize, errors: Vec<NodeError>) -> Result<()> {
        let total = self.core.nodes.len();
        let needed = quorum(total);
        if answered >= needed {
            return Ok(());
        }
        Err(Error::QuorumUnavailable {
            resource: resource.to_owned(),
            failed: errors.len(),
            answered,
            needed,
            total,
            errors,
        })
    }
}

/// How long a node keeps the last of a lock's keys, from their `PTTL`s
/// (-2: no key, free; -1: no expiry, unknown).
fn longest_time_left(pttls: &[i64]) -> Option<Duration> {
    pttls
        .iter()
        .try_fold(Duration::ZERO, |longest, &ms| match ms {
            -2 => Some(longest),
            0.. => Some(longest.max(Duration::from_millis(ms.unsigned_abs()))),
            _ => None,
        })
}

/// A cluster member reads its slot map again after a failure that can
/// mean it changed (see `Member::failed`).
fn note_failure<T>(member: &Member, outcome: &std::result::Result<T, NodeError>) {
    if let Err(error) = outcome {
        member.failed(&error.kind);
    }
}

/// The answers (`None` for a member that failed), and the failures.
fn split<T>(outcomes: Vec<std::result::Result<T, NodeError>>) -> (Vec<Option<T>>, Vec<NodeError>) {
    let mut errors = Vec::new();
    let answers = outcomes
        .into_iter()
        .map(|outcome| outcome.map_err(|error| errors.push(error)).ok())
        .collect();
    (answers, errors)
}

#[cfg(any(test, feature = "testkit"))]
/// `inspect.lua` for `resource`, for a caller with its own connection
/// (`quorumlock status` and `list`); read the reply with
/// [`NodeHolding::from_reply`].
pub fn inspect_invocation(resource: &str) -> redis::ScriptInvocation<'static> {
    let keys = ResourceKeys::of(resource);
    let other = keys.other_counter(crate::fencing::FenceCounters::PerResource);
    inspection(&keys, other.as_deref())
}

/// `inspect.lua` for `keys`, reading the `other` counter too if given.
fn inspection(keys: &ResourceKeys, other: Option<&str>) -> redis::ScriptInvocation<'static> {
    let mut invocation = INSPECT.key(keys.lock());
    invocation.key(keys.fence()).key(keys.waiter_leases());
    if let Some(other) = other {
        invocation.key(other);
    }
    invocation
}

/// `inspect.lua` on `node`.
async fn inspect_on(
    node: Arc<Node>,
    keys: &ResourceKeys,
    other: Option<&str>,
    limit: Duration,
) -> std::result::Result<NodeHolding, NodeError> {
    let invocation = inspection(keys, other);
    let reply: Value = node
        .request(limit, |mut connection| async move {
            invocation.invoke_async(&mut connection).await
        })
        .await?;
    NodeHolding::from_reply(&reply).ok_or_else(|| unexpected(&node, &reply))
}

/// What [`LockManager::force_unlock`] breaks.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Break<'a> {
    /// The holders this read ([`LockManager::holders`]) showed held by a
    /// quorum, and no one else; `&holding` converts to it.
    Shown(&'a Holding),
    /// Whoever holds this resource when the break runs, unseen.
    WhoeverHolds(&'a str),
}

impl<'a> From<&'a Holding> for Break<'a> {
    fn from(shown: &'a Holding) -> Self {
        Break::Shown(shown)
    }
}

/// Whose entries a break deletes, on the wire.
#[derive(Debug, Clone, Copy)]
enum Breaking<'a> {
    /// Those of these values (the holders the operator was shown).
    Shown(&'a [String]),
    /// Whoever's.
    Anyone,
}

/// `force_unlock.lua` on `node`: whether a holder's entry was deleted,
/// and the counter.
async fn force_unlock_on(
    node: Arc<Node>,
    keys: &ResourceKeys,
    other: Option<&str>,
    breaking: Breaking<'_>,
    limit: Duration,
) -> std::result::Result<(bool, Option<u64>), NodeError> {
    let reply: (String, String) = node
        .request(limit, |mut connection| async move {
            let mut invocation = FORCE_UNLOCK.key(keys.lock());
            invocation
                .key(keys.fence())
                .key(keys.waiters())
                .key(keys.waiter_leases())
                .key(keys.waiting_writers())
                .arg(keys.channel());
            match breaking {
                Breaking::Shown(values) => {
                    for value in values {
                        invocation.arg(value);
                    }
                }
                Breaking::Anyone => {
                    invocation.arg("*");
                }
            }
            if let Some(other) = other {
                invocation.key(other);
            }
            invocation.invoke_async(&mut connection).await
        })
        .await?;
    let (deleted, counter) = reply;
    Ok((deleted == "x" || deleted == "r", counter.parse().ok()))
}

fn unexpected(node: &Node, reply: &Value) -> NodeError {
    NodeError {
        node: node.name().to_owned(),
        kind: NodeErrorKind::UnexpectedReply(format!("{reply:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_a_lock_for_its_longest_key_and_an_unexpiring_one_is_unknown() {
        let ms = Duration::from_millis;
        let table: [(&[i64], Option<Duration>); 6] = [
            (&[-2], Some(Duration::ZERO)),
            (&[1500], Some(ms(1500))),
            (&[0], Some(Duration::ZERO)),
            (&[300, -2, 900], Some(ms(900))),
            (&[300, -1], None),
            (&[-7], None),
        ];
        for (pttls, expected) in table {
            assert_eq!(longest_time_left(pttls), expected, "{pttls:?}");
        }
    }
}
