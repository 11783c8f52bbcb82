//! The Lua scripts run on the Redis servers, one file each. Each is atomic on
//! its node, and each that touches a lock key compares the stored value with
//! the holder's first, so no client can touch a key it does not own.
//!
//! They are loaded on every new connection (one pipelined round trip) and
//! sent with EVALSHA; should a node still answer NOSCRIPT, redis-rs loads
//! the script and retries. Scripts that read a fencing counter start with
//! `counter.lua`, which compares counters exactly, as decimal strings;
//! scripts that touch a waiter queue start with `queue.lua`.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::MultiplexedConnection;

/// Every script's source, in the order of the statics below.
const SOURCES: [&str; 7] = [
    concat!(include_str!("queue.lua"), include_str!("release.lua")),
    include_str!("extend.lua"),
    concat!(
        include_str!("counter.lua"),
        include_str!("acquire_counted.lua")
    ),
    concat!(
        include_str!("counter.lua"),
        include_str!("acquire_read_counter.lua")
    ),
    concat!(include_str!("counter.lua"), include_str!("store_token.lua")),
    concat!(
        include_str!("counter.lua"),
        include_str!("fenced_write.lua")
    ),
    concat!(
        include_str!("counter.lua"),
        include_str!("queue.lua"),
        include_str!("acquire_queued.lua")
    ),
];

/// Compare-and-delete, dequeue, wake the next waiter (`release.lua`): 1
/// when deleted, 0 when not ours.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[0]));

/// Compare-and-PEXPIRE (`extend.lua`): 1 when extended, 0 when not ours.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[1]));

/// SET NX PX + INCR counter (`acquire_counted.lua`): the token, or nil.
pub(crate) static ACQUIRE_COUNTED: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[2]));

/// SET NX PX + read counter (`acquire_read_counter.lua`): the counter, or nil.
pub(crate) static ACQUIRE_READ_COUNTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(SOURCES[3]));

/// Compare value, raise counter (`store_token.lua`): 1 when stored, 0 when not ours.
pub(crate) static STORE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[4]));

/// Storage-side check-and-write (`fenced_write.lua`): {1, token} or {0, highest}.
pub(crate) static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[5]));

/// A waiter's acquire behind the queue (`acquire_queued.lua`): the mode's
/// grant, or {ms until the lock may be free, place in the queue}.
pub(crate) static ACQUIRE_QUEUED: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[6]));

/// Loads every script on a fresh connection's node in one pipelined round
/// trip, so the first lock after a (re)connect does not pay NOSCRIPT round
/// trips. Best effort: EVALSHA falls back to loading anyway.
pub(crate) async fn preload(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for source in SOURCES {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    pipe.query_async(conn).await
}
