//! The operations a lock sends to one node, and how each reply reads.
//!
//! Every operation answers yes or no, some with a number (a fencing
//! counter). Reading replies is kept pure and separate from sending, so
//! the mapping is tested without a server.

use std::future::Future;
use std::time::{Duration, SystemTime};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisResult, Script, Value};

use crate::error::NodeErrorKind;
use crate::guard::observe::DataSetKeys;
use crate::guard::observe::fresh_mark_id;
use crate::hot_wire::HotWire;
use crate::keys::{Access, Keys, ResourceKeys};
use crate::scripts;

/// A lock operation on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// `SET key value NX PX ttl`: yes when set, no when the key exists.
    Acquire { ttl_ms: u64 },
    /// Counter-node acquire: yes with the new token, or no.
    AcquireCounted { ttl_ms: u64 },
    /// Counter-node fencing's acquire on the other nodes: `SET key value
    /// NX PX ttl` and, behind it, `GET` of the resource's counter; yes with
    /// that counter (0 for none), or no.
    AcquirePeek { ttl_ms: u64 },
    /// Quorum-mode acquire: yes with this node's counter, or no.
    AcquireReadCounter { ttl_ms: u64 },
    /// A token's second round (quorum mode, or counter-node fencing without
    /// the counter node's token): yes when the token is stored, no when the
    /// key is no longer ours.
    StoreToken { token: u64 },
    /// Compare-and-PEXPIRE: yes when our value was there and now lives at
    /// least `ttl_ms` (a longer expiry is kept). With `repair`, a missing
    /// key is set again (answer [`Answer::Restored`]).
    Extend { ttl_ms: u64, repair: bool },
    /// A waiter's acquire behind the resource's queue: as `Acquire`,
    /// `AcquireCounted` or `AcquireReadCounter` (by `counting`), but only
    /// when no live waiter is queued ahead of `ticket`; otherwise the
    /// waiter is queued (its entry lives `lease_ms`) and the answer is
    /// [`Answer::Waiting`].
    AcquireQueued {
        ttl_ms: u64,
        counting: Counting,
        ticket: u64,
        waiter: u64,
        lease_ms: u64,
    },
    /// Compare-and-delete: yes when our value was there and is now gone.
    /// Also dequeues `waiter`, and wakes the first waiter if the lock is
    /// free on the node afterwards, or a reader at the head when only
    /// readers hold it. That may be the waiter whose failed attempt this
    /// rolls back: it won here, and may win everywhere on a retry, when it
    /// raced a release that had not reached every node yet.
    ///
    /// With `keep_ms` (an exclusive lock taken `at_least`, released before
    /// that time is up): where our value holds, the key stays that long
    /// instead of going, and no one is woken (`keep.lua`).
    Release {
        waiter: Option<u64>,
        keep_ms: Option<u64>,
    },
}

/// Which fencing number an acquire issues with its grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counting {
    /// None (fencing off, or a node other than the counter node).
    Off,
    /// The counter node's INCR: the token.
    Increment,
    /// Quorum mode's first round, or a reader's token: this node's
    /// counter (the highest of the lock's resources).
    Read,
    /// Counter-node fencing on the other nodes: this node's counter as it
    /// stands, unchanged and not raised to the node's clock.
    Peek,
}

/// A waiter's place in the queues: what every attempt of one wait sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queued {
    /// Wall-clock microseconds when the wait began: the order of service.
    ticket: u64,
    /// Random, unique to the wait: the queue entry and the notices name it.
    pub(crate) waiter: u64,
    /// How long a queue entry lives unless the next attempt renews it.
    lease_ms: u64,
}

impl Queued {
    pub(crate) fn new(lease: Duration) -> Self {
        let ticket = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
        Self {
            ticket,
            // Never 0, so it is never mistaken for "no waiter".
            waiter: fastrand::u64(1..),
            lease_ms: (lease.as_millis() as u64).max(1),
        }
    }

    /// The queued acquire for one node.
    pub(crate) fn op(self, ttl_ms: u64, counting: Counting) -> Op {
        Op::AcquireQueued {
            ttl_ms,
            counting,
            ticket: self.ticket,
            waiter: self.waiter,
            lease_ms: self.lease_ms,
        }
    }
}

impl Counting {
    /// How `acquire.lua` names it.
    fn mode(self) -> &'static str {
        match self {
            Counting::Off => "set",
            Counting::Increment => "incr",
            Counting::Read => "read",
            Counting::Peek => "peek",
        }
    }
}

/// A node's answer to an [`Op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    Yes,
    /// Yes, with a fencing number (token or counter).
    YesWith(u64),
    /// Yes, to a queued acquire, which left the waiter in the node's queue
    /// (others wait there); with the fencing number, if any.
    YesInLine(Option<u64>),
    /// Yes: an extension found our key missing and set it again.
    Restored,
    No,
    /// No, to a queued acquire: the lock may be free on this node in
    /// `opens_in_ms` (`None`: unknown, the key has no expiry); `behind`
    /// when other waiters are queued ahead of this one there.
    Waiting {
        opens_in_ms: Option<u64>,
        behind: bool,
    },
}

impl Op {
    /// Whether it may set a key or move its expiry (the operations the
    /// node guard keeps away from a quarantined node); cleanup does not.
    pub(crate) fn sets_keys(self) -> bool {
        !matches!(self, Op::Release { .. })
    }

    /// Whether it is an acquire: a refusal then means it set nothing.
    pub(crate) fn sets_fresh_key(self) -> bool {
        matches!(
            self,
            Op::Acquire { .. }
                | Op::AcquireCounted { .. }
                | Op::AcquirePeek { .. }
                | Op::AcquireReadCounter { .. }
                | Op::AcquireQueued { .. }
        )
    }

    /// Whether a yes comes with a fencing number.
    fn counted(self) -> bool {
        match self {
            Op::AcquireCounted { .. } | Op::AcquireReadCounter { .. } | Op::AcquirePeek { .. } => {
                true
            }
            Op::AcquireQueued { counting, .. } => counting != Counting::Off,
            _ => false,
        }
    }
}

/// The command for `op` on the lock `keys` held under `value`; `None` for
/// a release (see [`release_call`]).
fn command(op: Op, keys: &Keys, value: &str) -> Option<Cmd> {
    // A lone exclusive resource takes the shortest commands.
    if let Some(one) = keys.simple() {
        let lock_and_fence = [one.lock(), one.fence()];
        match op {
            Op::Acquire { ttl_ms } => {
                let mut set = sized("SET", 5, one.lock().len() + value.len() + 24);
                set.arg(one.lock())
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
                return Some(set);
            }
            // The `GET` of the counter goes behind it: see `follow_up`.
            Op::AcquirePeek { ttl_ms } => {
                return command(Op::Acquire { ttl_ms }, keys, value);
            }
            Op::AcquireCounted { ttl_ms } => {
                return Some(evalsha(
                    &scripts::ACQUIRE_COUNTED,
                    &lock_and_fence,
                    value,
                    &[ttl_ms],
                ));
            }
            Op::AcquireReadCounter { ttl_ms } => {
                return Some(evalsha(
                    &scripts::ACQUIRE_READ_COUNTER,
                    &lock_and_fence,
                    value,
                    &[ttl_ms],
                ));
            }
            _ => {}
        }
    }
    let access = access_arg(keys);
    // `acquire.lua`; `queue` is a waiter's (ticket, id, lease in ms).
    let acquire = |ttl_ms: u64, counting: Counting, queue: Option<(u64, u64, u64)>| {
        let mut call = holders_call(&scripts::ACQUIRE, keys, value);
        call.arg(ttl_ms).arg(access).arg(counting.mode());
        match queue {
            Some((ticket, waiter, lease_ms)) => {
                call.arg(ticket).arg(waiter).arg(lease_ms);
                // A waiter for several resources may leave some queues,
                // and wake whoever it held back there.
                if keys.resources.len() > 1 {
                    for resource in &keys.resources {
                        call.arg(resource.channel());
                    }
                }
            }
            None => {
                call.arg("");
            }
        }
        call
    };
    Some(match op {
        Op::Acquire { ttl_ms } => acquire(ttl_ms, Counting::Off, None),
        Op::AcquireCounted { ttl_ms } => acquire(ttl_ms, Counting::Increment, None),
        Op::AcquirePeek { ttl_ms } => acquire(ttl_ms, Counting::Peek, None),
        Op::AcquireReadCounter { ttl_ms } => acquire(ttl_ms, Counting::Read, None),
        Op::AcquireQueued {
            ttl_ms,
            counting,
            ticket,
            waiter,
            lease_ms,
        } => acquire(ttl_ms, counting, Some((ticket, waiter, lease_ms))),
        Op::StoreToken { token } => {
            let mut call = holders_call(&scripts::STORE_TOKEN, keys, value);
            call.arg(token).arg(access);
            call
        }
        Op::Extend { ttl_ms, repair } => {
            let mut call = holders_call(&scripts::EXTEND, keys, value);
            call.arg(ttl_ms).arg(u64::from(repair)).arg(access);
            call
        }
        Op::Release { .. } => return None,
    })
}

/// The command sent right behind `op`'s on the same connection, whose
/// reply is part of the answer: for a lone exclusive resource's
/// [`Op::AcquirePeek`], the `GET` of its counter (a plain `SET` cannot
/// return it). It runs after the `SET`, so it reads the counter as it was
/// at least then.
fn follow_up(op: Op, keys: &Keys) -> Option<Cmd> {
    let one = keys.simple()?;
    matches!(op, Op::AcquirePeek { .. }).then(|| {
        let mut get = sized("GET", 1, one.fence().len());
        get.arg(one.fence());
        get
    })
}

/// How the scripts name `keys`' access.
fn access_arg(keys: &Keys) -> &'static str {
    match keys.access {
        Access::Exclusive => "x",
        Access::Shared => "r",
    }
}

/// The keys a script that reads or changes a lock's holders takes for
/// each resource, in order (see `holders.lua`).
fn resource_keys(resource: &ResourceKeys) -> [&str; 5] {
    [
        resource.lock(),
        resource.fence(),
        resource.waiters(),
        resource.waiter_leases(),
        resource.waiting_writers(),
    ]
}

/// An EVALSHA of a script that takes the keys of every resource of the
/// lock, then the holder's value. Sent once, as [`evalsha`] says why.
fn holders_call(script: &Script, keys: &Keys, value: &str) -> Cmd {
    let key_bytes: usize = keys
        .resources
        .iter()
        .flat_map(resource_keys)
        .map(str::len)
        .sum();
    let args = 3 + 5 * keys.resources.len() + 8;
    let mut call = sized("EVALSHA", args, 48 + key_bytes + value.len() + 64);
    call.arg(script.get_hash()).arg(5 * keys.resources.len());
    for resource in &keys.resources {
        for key in resource_keys(resource) {
            call.arg(key);
        }
    }
    call.arg(value);
    call
}

/// An operation built and ready to go. Everything is encoded before the
/// first await, so a request in flight holds only this and the reply it
/// waits for (every lock has several in flight, one per node).
pub(crate) enum Prepared {
    /// One command, one reply.
    One(Cmd),
    /// The command with what the node guard reads in the same write: `TIME`
    /// in front (`timed`: the node's clock is read in the same round trip
    /// as the answer it qualifies) and, once per clock interval, the
    /// observation behind it (`observed`: the observation script and
    /// `CONFIG GET appendfsync`), so a node that counts is observed again
    /// without a round trip of its own. A command with a follow-up (see
    /// `follow_up`) goes this way too, the follow-up right behind it; and
    /// on a Redis Cluster's shard master with replicas, `WAIT 1` behind
    /// everything (`replicated`): the write counts once a replica holds it.
    Guarded {
        cmd: Cmd,
        then: Option<Cmd>,
        timed: bool,
        /// Rare (once per clock interval): boxed, to keep every request
        /// small.
        observation: Option<Box<[Cmd; 2]>>,
        /// `WAIT 1 <ms>`, last.
        replicated: Option<Box<Cmd>>,
    },
    /// A compare-and-delete (its cleanup goes behind what it undoes).
    Release(Cmd),
}

/// A node's reply to a [`Prepared`] operation: its `TIME` reply (when
/// timed), its answer, which may be an error reply, the replies of the
/// observation (the script's and `CONFIG GET`'s) when observed, and how
/// many replicas acknowledged the writes (`WAIT`'s reply) when asked.
pub(crate) struct Reply {
    pub(crate) time: Option<Value>,
    pub(crate) answer: RedisResult<Value>,
    pub(crate) observation: Option<(Option<Value>, Option<Value>)>,
    pub(crate) replicated: Option<Value>,
}

/// Which commands a [`Prepared::Guarded`] pipeline holds around its
/// command, in the order they go.
#[derive(Clone, Copy)]
struct Layout {
    timed: bool,
    followed: bool,
    observed: bool,
    replicated: bool,
}

impl Reply {
    /// The answer alone (a single command's).
    fn alone(answer: RedisResult<Value>) -> Self {
        Reply {
            time: None,
            answer,
            observation: None,
            replicated: None,
        }
    }

    /// The replies to a [`Prepared::Guarded`] pipeline, in the order it
    /// sent them: `TIME` (when `timed`), the command, its follow-up (when
    /// `followed`; the answer is then both replies, as an array), the
    /// observation's two (when `observed`), then `WAIT`'s (when
    /// `replicated`).
    fn guarded(replies: Vec<Value>, layout: Layout) -> Self {
        let mut replies = replies.into_iter();
        let time = if layout.timed { replies.next() } else { None };
        let mut answer = replies.next().unwrap_or(Value::Nil).extract_error();
        if layout.followed {
            let then = replies.next().unwrap_or(Value::Nil);
            answer = answer.map(|first| Value::Array(vec![first, then]));
        }
        let observation = layout.observed.then(|| (replies.next(), replies.next()));
        let replicated = if layout.replicated {
            replies.next()
        } else {
            None
        };
        Reply {
            time,
            answer,
            observation,
            replicated,
        }
    }
}

/// `op` for the lock `keys` held under `value`, with the node's `TIME` in
/// front when `timed`, the guard's observation (of the data set whose
/// mark is at `data_set`) behind it when `observed` is `Some(raise)`
/// (neither for releases: a delete needs no trust), and `WAIT 1` for up to
/// `replicated` ms last when that is set (a shard master with replicas).
pub(crate) fn prepare(
    op: Op,
    keys: &Keys,
    value: &str,
    timed: bool,
    observed: Option<(bool, &DataSetKeys)>,
    replicated: Option<u64>,
) -> Prepared {
    let then = follow_up(op, keys);
    let replicated = replicated.filter(|_| op.sets_keys());
    match command(op, keys, value) {
        Some(cmd) if timed || observed.is_some() || then.is_some() || replicated.is_some() => {
            Prepared::Guarded {
                cmd,
                then,
                timed,
                replicated: replicated.map(|ms| {
                    let mut wait = sized("WAIT", 2, 24);
                    // 0 would wait for good.
                    wait.arg(1).arg(ms.max(1));
                    Box::new(wait)
                }),
                observation: observed.map(|(raise, data_set)| {
                    let mut script = sized("EVALSHA", 6, 128);
                    script
                        .arg(scripts::OBSERVE.get_hash())
                        .arg(2)
                        .arg(&data_set.mark)
                        .arg(&data_set.seq)
                        .arg(fresh_mark_id())
                        .arg(u8::from(raise));
                    let mut fsync = sized("CONFIG", 3, 48);
                    fsync
                        .arg("GET")
                        .arg("appendfsync")
                        .arg("no-appendfsync-on-rewrite");
                    Box::new([script, fsync])
                }),
            }
        }
        Some(cmd) => Prepared::One(cmd),
        None => Prepared::Release(release_call(op, keys, value)),
    }
}

impl Prepared {
    /// Sends it on `conn`. Fails as a whole only when the connection does
    /// (or, for a single command, with its error reply). redis-rs boxes
    /// the exchange itself, which keeps this future small.
    // Not an `async fn`: that would keep its arguments twice in the future.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn send(
        self,
        mut conn: MultiplexedConnection,
    ) -> impl Future<Output = RedisResult<Reply>> + Send {
        async move {
            // Matched by reference: the future then holds the command once.
            let mut this = self;
            match &mut this {
                Prepared::One(cmd) => {
                    let answer = conn.req_packed_command(cmd).await?.extract_error();
                    Ok(Reply::alone(Ok(answer?)))
                }
                Prepared::Guarded {
                    cmd,
                    then,
                    timed,
                    observation,
                    replicated,
                } => {
                    let layout = Layout {
                        timed: *timed,
                        followed: then.is_some(),
                        observed: observation.is_some(),
                        replicated: replicated.is_some(),
                    };
                    let mut pipe = Pipeline::with_capacity(6);
                    if *timed {
                        pipe.add_command(TIME.clone());
                    }
                    // Moved, not copied: nothing else reads them.
                    pipe.add_command(std::mem::replace(cmd, Cmd::new()));
                    if let Some(then) = then.take() {
                        pipe.add_command(then);
                    }
                    for command in observation.take().into_iter().flat_map(|both| *both) {
                        pipe.add_command(command);
                    }
                    if let Some(wait) = replicated.take() {
                        pipe.add_command(*wait);
                    }
                    let count = pipe.len();
                    let replies = conn.req_packed_commands(&pipe, 0, count).await?;
                    Ok(Reply::guarded(replies, layout))
                }
                Prepared::Release(call) => {
                    let answer = conn.req_packed_command(call).await?.extract_error()?;
                    Ok(Reply::alone(Ok(answer)))
                }
            }
        }
    }
}

impl Prepared {
    /// As [`send`](Self::send), on the hot-path wire `hot`. The request
    /// joins `hot` when the returned future is first polled, as on
    /// redis-rs.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn send_hot(
        self,
        hot: &HotWire,
    ) -> impl Future<Output = RedisResult<Reply>> + Send + '_ {
        async move {
            match &self {
                Prepared::One(cmd) => {
                    let answer = first(hot.send([cmd]).await?).extract_error();
                    Ok(Reply::alone(Ok(answer?)))
                }
                Prepared::Guarded {
                    cmd,
                    then,
                    timed,
                    observation,
                    replicated,
                } => {
                    let layout = Layout {
                        timed: *timed,
                        followed: then.is_some(),
                        observed: observation.is_some(),
                        replicated: replicated.is_some(),
                    };
                    let replies = hot
                        .send(guarded_commands(cmd, then, *timed, observation, replicated))
                        .await?;
                    Ok(Reply::guarded(replies, layout))
                }
                Prepared::Release(call) => {
                    let answer = first(hot.send_cleanup([call]).await?).extract_error()?;
                    Ok(Reply::alone(Ok(answer)))
                }
            }
        }
    }
}

/// `TIME`, sent in front of every guarded request: built once.
static TIME: std::sync::LazyLock<Cmd> = std::sync::LazyLock::new(|| redis::cmd("TIME"));

/// The commands of a [`Prepared::Guarded`] request, in the order
/// [`Reply::guarded`] reads their replies.
fn guarded_commands<'c>(
    cmd: &'c Cmd,
    then: &'c Option<Cmd>,
    timed: bool,
    observation: &'c Option<Box<[Cmd; 2]>>,
    replicated: &'c Option<Box<Cmd>>,
) -> impl Iterator<Item = &'c Cmd> {
    timed
        .then_some(&*TIME)
        .into_iter()
        .chain(std::iter::once(cmd))
        .chain(then)
        .chain(observation.iter().flat_map(|both| both.iter()))
        .chain(replicated.iter().map(|wait| &**wait))
}

/// Whether `WAIT 1`'s reply says a replica acknowledged the writes before
/// it: a count of at least one. `UNBLOCKED` (a master demoted while it
/// waited) says no; any other error (`NOPERM`: the ACL user lacks
/// `+wait`) is the server refusing to tell, given as its code and text.
pub(crate) fn replica_acknowledged(reply: &Value) -> Result<bool, String> {
    match reply {
        Value::Int(acks) => Ok(*acks >= 1),
        Value::ServerError(error) if error.code() == "UNBLOCKED" => Ok(false),
        Value::ServerError(error) => Err(format!(
            "WAIT refused ({} {}): a shard master with replicas counts a write once a \
             replica acknowledged it; the ACL user needs +wait",
            error.code(),
            error.details().unwrap_or_default()
        )),
        other => Err(format!("WAIT answered {other:?}, not a count of replicas")),
    }
}

/// The one reply of a single command.
fn first(replies: Vec<Value>) -> Value {
    replies.into_iter().next().unwrap_or(Value::Nil)
}

/// The compare-and-delete of a release or a rollback: `keep.lua` for an
/// `at_least` lock released early, else `release.lua`.
fn release_call(op: Op, keys: &Keys, value: &str) -> Cmd {
    let (waiter, keep_ms) = match op {
        Op::Release { waiter, keep_ms } => (waiter, keep_ms),
        _ => (None, None),
    };
    if let Some(keep_ms) = keep_ms {
        let mut call = holders_call(&scripts::KEEP, keys, value);
        match waiter {
            Some(waiter) => call.arg(waiter),
            None => call.arg(""),
        };
        call.arg(keep_ms);
        return call;
    }
    let mut call = holders_call(&scripts::RELEASE, keys, value);
    call.arg(access_arg(keys));
    match waiter {
        Some(waiter) => call.arg(waiter),
        None => call.arg(""),
    };
    for resource in &keys.resources {
        call.arg(resource.channel());
    }
    call
}

/// A command `name` with room reserved for `args` more arguments of about
/// `bytes` bytes in all, so building it allocates twice rather than once
/// per growth step: every lock sends several per node.
fn sized(name: &str, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(args + 1, name.len() + bytes);
    cmd.arg(name);
    cmd
}

/// The single-resource scripts take the lock key and the counter key, then
/// the holder's value and a TTL. On NOSCRIPT (nothing ran) the request is
/// sent once more after the scripts are loaded, within its round only: a
/// request of a round that has been decided or dropped must not go out
/// later (it could set a key after our own rollback).
fn evalsha(script: &Script, keys: &[&str], value: &str, numbers: &[u64]) -> Cmd {
    let bytes = keys.iter().map(|k| k.len()).sum::<usize>() + value.len() + 20 * numbers.len();
    let mut call = sized("EVALSHA", 3 + keys.len() + numbers.len(), 48 + bytes);
    call.arg(script.get_hash()).arg(keys.len());
    for key in keys {
        call.arg(*key);
    }
    call.arg(value);
    for number in numbers {
        call.arg(*number);
    }
    call
}

/// Reads a node's reply to `op`. An error is a reply that is not an
/// answer: for the second quorum round, "not ours" (our key vanished
/// between the rounds, which is no refusal by another holder), otherwise a
/// reply no Redis server running our scripts would give.
pub(crate) fn interpret(op: Op, reply: Value) -> Result<Answer, NodeErrorKind> {
    let counted = op.counted();
    let foreign =
        |reply: &Value| NodeErrorKind::UnexpectedReply(format!("{op:?} answered {reply:?}"));
    match (counted, reply) {
        // `SET NX PX` and the `GET` of the counter behind it.
        (_, Value::Array(items)) if matches!(op, Op::AcquirePeek { .. }) => {
            match <[Value; 2]>::try_from(items) {
                Ok([Value::Nil, _]) => Ok(Answer::No),
                Ok([Value::Okay, Value::Nil]) => Ok(Answer::YesWith(0)),
                Ok([Value::Okay, counter]) => peeked_counter(counter),
                Ok(other) => Err(foreign(&Value::Array(other.into()))),
                Err(items) => Err(foreign(&Value::Array(items))),
            }
        }
        (_, Value::Nil) => Ok(Answer::No),
        (_, Value::Array(items)) if matches!(op, Op::AcquireQueued { .. }) => {
            match <[Value; 2]>::try_from(items) {
                Ok([Value::Int(opens_in), Value::Int(behind @ (0 | 1))]) => Ok(Answer::Waiting {
                    opens_in_ms: u64::try_from(opens_in).ok(),
                    behind: behind == 1,
                }),
                Ok([granted, Value::BulkString(tag)]) if tag == b"queued" => {
                    match interpret(op, granted)? {
                        Answer::Yes => Ok(Answer::YesInLine(None)),
                        Answer::YesWith(number) => Ok(Answer::YesInLine(Some(number))),
                        other => Err(foreign(&Value::Array(vec![
                            Value::SimpleString(format!("{other:?}")),
                            Value::BulkString(tag),
                        ]))),
                    }
                }
                Ok(other) => Err(foreign(&Value::Array(other.into()))),
                Err(items) => Err(foreign(&Value::Array(items))),
            }
        }
        // Counters come as decimal strings: exact over all of u64.
        (true, Value::BulkString(bytes)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| text.parse().ok())
            .map(Answer::YesWith)
            .ok_or_else(|| foreign(&Value::BulkString(bytes))),
        (true, Value::Int(n)) => u64::try_from(n)
            .map(Answer::YesWith)
            .map_err(|_| foreign(&Value::Int(n))),
        (false, Value::Int(0)) if matches!(op, Op::StoreToken { .. }) => {
            Err(NodeErrorKind::KeyGone)
        }
        (false, Value::Okay | Value::Int(1)) => Ok(Answer::Yes),
        (false, Value::Int(2)) if matches!(op, Op::Extend { .. }) => Ok(Answer::Restored),
        (false, Value::SimpleString(s)) if s == "OK" => Ok(Answer::Yes),
        (false, Value::Int(0)) => Ok(Answer::No),
        (_, other) => Err(foreign(&other)),
    }
}

/// The largest counter counter-node fencing can use: Redis' `INCR` stops
/// at 2^63 − 1, so the counter node's script refuses counters above this,
/// and the other nodes' counters are held to the same limit (a token taken
/// without the counter node is one above them).
const LARGEST_COUNTER_NODE_COUNTER: u64 = (1 << 63) - 2;

/// The counter a `GET` read behind a granted `SET` (counter-node fencing's
/// other nodes): a decimal count up to [`LARGEST_COUNTER_NODE_COUNTER`], as
/// the scripts store it. Anything else is a counter that cannot be used,
/// as the scripts say of it.
fn peeked_counter(counter: Value) -> Result<Answer, NodeErrorKind> {
    let problem = match &counter {
        Value::BulkString(bytes) => match std::str::from_utf8(bytes).ok() {
            Some(text) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                match text.parse::<u64>() {
                    Ok(number) if number <= LARGEST_COUNTER_NODE_COUNTER => {
                        return Ok(Answer::YesWith(number));
                    }
                    _ => format!(
                        "holds {text}, above the largest usable counter \
                         {LARGEST_COUNTER_NODE_COUNTER}"
                    ),
                }
            }
            _ => format!(
                "holds {:?}, not a decimal integer",
                String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
            ),
        },
        // As the scripts say it: the error's code and its text.
        Value::ServerError(error) => format!(
            "is not a string key ({} {})",
            error.code(),
            error.details().unwrap_or_default()
        ),
        other => format!("read as {other:?}"),
    };
    Err(NodeErrorKind::InvalidCounter(problem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_as_answers() {
        let acquire = Op::Acquire { ttl_ms: 10 };
        let counted = Op::AcquireCounted { ttl_ms: 10 };
        let release = Op::Release {
            waiter: None,
            keep_ms: None,
        };
        let queued = Op::AcquireQueued {
            ttl_ms: 10,
            counting: Counting::Off,
            ticket: 1,
            waiter: 2,
            lease_ms: 10,
        };
        let queued_counted = Op::AcquireQueued {
            ttl_ms: 10,
            counting: Counting::Increment,
            ticket: 1,
            waiter: 2,
            lease_ms: 10,
        };
        let table = [
            (acquire, Value::Okay, Ok(Answer::Yes)),
            (acquire, Value::SimpleString("OK".into()), Ok(Answer::Yes)),
            (acquire, Value::Nil, Ok(Answer::No)),
            (release, Value::Int(1), Ok(Answer::Yes)),
            (release, Value::Int(0), Ok(Answer::No)),
            (queued, Value::Okay, Ok(Answer::Yes)),
            (
                queued,
                Value::Array(vec![Value::Int(1500), Value::Int(1)]),
                Ok(Answer::Waiting {
                    opens_in_ms: Some(1500),
                    behind: true,
                }),
            ),
            // A key without expiry: when it frees is unknown.
            (
                queued,
                Value::Array(vec![Value::Int(-1), Value::Int(0)]),
                Ok(Answer::Waiting {
                    opens_in_ms: None,
                    behind: false,
                }),
            ),
            (
                queued_counted,
                Value::BulkString(b"42".to_vec()),
                Ok(Answer::YesWith(42)),
            ),
            // Granted, and left in line where others wait.
            (
                queued,
                Value::Array(vec![Value::Okay, Value::BulkString(b"queued".to_vec())]),
                Ok(Answer::YesInLine(None)),
            ),
            (
                queued_counted,
                Value::Array(vec![
                    Value::BulkString(b"42".to_vec()),
                    Value::BulkString(b"queued".to_vec()),
                ]),
                Ok(Answer::YesInLine(Some(42))),
            ),
            (
                Op::Extend {
                    ttl_ms: 5,
                    repair: false,
                },
                Value::Int(0),
                Ok(Answer::No),
            ),
            (
                Op::Extend {
                    ttl_ms: 5,
                    repair: true,
                },
                Value::Int(2),
                Ok(Answer::Restored),
            ),
            (Op::StoreToken { token: 3 }, Value::Int(1), Ok(Answer::Yes)),
            (
                Op::StoreToken { token: 3 },
                Value::Int(0),
                Err(NodeErrorKind::KeyGone),
            ),
            // Counters are numbers, including 0 and 1, not yes/no, and
            // exact beyond 2^53 when sent as strings.
            (counted, Value::Int(1), Ok(Answer::YesWith(1))),
            (
                counted,
                Value::BulkString(b"18446744073709551615".to_vec()),
                Ok(Answer::YesWith(u64::MAX)),
            ),
            (
                counted,
                Value::BulkString(b"9007199254740993".to_vec()),
                Ok(Answer::YesWith((1 << 53) + 1)),
            ),
            (
                Op::AcquireReadCounter { ttl_ms: 10 },
                Value::Int(0),
                Ok(Answer::YesWith(0)),
            ),
            (counted, Value::Nil, Ok(Answer::No)),
        ];
        for (op, reply, expected) in table {
            assert_eq!(interpret(op, reply.clone()), expected, "{op:?} {reply:?}");
        }
    }

    #[test]
    fn a_set_and_the_counter_behind_it_read_as_one_answer() {
        let peek = Op::AcquirePeek { ttl_ms: 10 };
        let both = |set: Value, get: Value| Value::Array(vec![set, get]);
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let table = [
            (both(Value::Okay, Value::Nil), Ok(Answer::YesWith(0))),
            (both(Value::Okay, bulk("42")), Ok(Answer::YesWith(42))),
            (
                both(Value::Okay, bulk("9223372036854775806")),
                Ok(Answer::YesWith((1 << 63) - 2)),
            ),
            (both(Value::Nil, Value::Nil), Ok(Answer::No)),
            (both(Value::Nil, bulk("42")), Ok(Answer::No)),
        ];
        for (reply, expected) in table {
            assert_eq!(interpret(peek, reply.clone()), expected, "{reply:?}");
        }
        let wrong_type = crate::resp::parse(
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
        )
        .expect("an error reply")
        .expect("complete")
        .0;
        for (counter, said) in [
            (bulk("abc"), "not a decimal integer"),
            (bulk(""), "not a decimal integer"),
            (
                bulk("9223372036854775807"),
                "above the largest usable counter",
            ),
            (
                bulk("18446744073709551616"),
                "above the largest usable counter",
            ),
            (wrong_type, "WRONGTYPE"),
        ] {
            match interpret(peek, both(Value::Okay, counter.clone())) {
                Err(NodeErrorKind::InvalidCounter(problem)) => {
                    assert!(problem.contains(said), "{counter:?}: {problem}");
                }
                other => panic!("{counter:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_replicas_acknowledgement_is_read_from_waits_reply() {
        assert_eq!(replica_acknowledged(&Value::Int(1)), Ok(true));
        assert_eq!(replica_acknowledged(&Value::Int(2)), Ok(true));
        assert_eq!(replica_acknowledged(&Value::Int(0)), Ok(false));
        let error = |text: &[u8]| {
            crate::resp::parse(text)
                .expect("an error reply")
                .expect("complete")
                .0
        };
        let unblocked = error(
            b"-UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)\r\n",
        );
        assert_eq!(replica_acknowledged(&unblocked), Ok(false));
        let refused = replica_acknowledged(&error(
            b"-NOPERM User quorumlock has no permissions to run the 'wait' command\r\n",
        ))
        .expect_err("a refusal is no answer");
        assert!(
            refused.contains("NOPERM") && refused.contains("+wait"),
            "{refused}"
        );
        // The pipeline's replies in order: TIME, SET, GET, WAIT.
        let reply = Reply::guarded(
            vec![Value::Array(vec![]), Value::Okay, Value::Nil, Value::Int(1)],
            Layout {
                timed: true,
                followed: true,
                observed: false,
                replicated: true,
            },
        );
        assert_eq!(reply.replicated, Some(Value::Int(1)));
        assert_eq!(
            reply.answer.ok(),
            Some(Value::Array(vec![Value::Okay, Value::Nil]))
        );
    }

    #[test]
    fn a_write_to_a_replicated_master_waits_for_a_replica_and_a_release_does_not() {
        let keys = Keys::exclusive("a").expect("valid");
        for (op, waits) in [
            (Op::Acquire { ttl_ms: 10 }, true),
            (Op::AcquirePeek { ttl_ms: 10 }, true),
            (
                Op::Extend {
                    ttl_ms: 10,
                    repair: false,
                },
                true,
            ),
            (Op::StoreToken { token: 3 }, true),
            (
                Op::Release {
                    waiter: None,
                    keep_ms: None,
                },
                false,
            ),
        ] {
            let waited = match prepare(op, &keys, "v", false, None, Some(50)) {
                Prepared::Guarded { replicated, .. } => replicated.is_some(),
                Prepared::One(_) | Prepared::Release(_) => false,
            };
            assert_eq!(waited, waits, "{op:?}");
        }
    }

    #[test]
    fn foreign_replies_are_errors() {
        let table = [
            (Op::Acquire { ttl_ms: 10 }, Value::Int(7)),
            (
                Op::Release {
                    waiter: None,
                    keep_ms: None,
                },
                Value::SimpleString("QUEUED".into()),
            ),
            (
                Op::Release {
                    waiter: Some(3),
                    keep_ms: None,
                },
                Value::Int(2),
            ),
            (
                Op::AcquireQueued {
                    ttl_ms: 10,
                    counting: Counting::Off,
                    ticket: 1,
                    waiter: 2,
                    lease_ms: 10,
                },
                Value::Array(vec![Value::Int(5)]),
            ),
            (Op::AcquireCounted { ttl_ms: 10 }, Value::Int(-1)),
            (Op::AcquireCounted { ttl_ms: 10 }, Value::Okay),
            (
                Op::AcquireCounted { ttl_ms: 10 },
                Value::BulkString(b"12abc".to_vec()),
            ),
            (
                Op::AcquireReadCounter { ttl_ms: 10 },
                Value::BulkString(b"18446744073709551616".to_vec()),
            ),
        ];
        for (op, reply) in table {
            assert!(interpret(op, reply.clone()).is_err(), "{op:?} {reply:?}");
        }
    }
}
