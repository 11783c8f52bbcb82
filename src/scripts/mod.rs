//! The Lua scripts run on the Redis servers, one file each. Each is atomic on
//! its node, and each that touches a lock key compares the stored value with
//! the holder's first, so no client can touch a key it does not own.
//!
//! They are sent with EVALSHA; redis-rs loads a script with SCRIPT LOAD
//! when a node answers NOSCRIPT (first use, or after a restart).

use std::sync::LazyLock;

use redis::Script;

/// Compare-and-delete (`release.lua`): 1 when deleted, 0 when not ours.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("release.lua")));

/// Compare-and-PEXPIRE (`extend.lua`): 1 when extended, 0 when not ours.
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("extend.lua")));

/// SET NX PX + INCR counter (`acquire_counted.lua`): the token, or nil.
pub(crate) static ACQUIRE_COUNTED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("acquire_counted.lua")));

/// SET NX PX + read counter (`acquire_read_counter.lua`): the counter, or nil.
pub(crate) static ACQUIRE_READ_COUNTER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("acquire_read_counter.lua")));

/// Compare value, raise counter (`store_token.lua`): 1 when stored, 0 when not ours.
pub(crate) static STORE_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("store_token.lua")));

/// Storage-side check-and-write (`fenced_write.lua`): {1, token} or {0, highest}.
pub(crate) static FENCED_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("fenced_write.lua")));
