//! The Lua scripts run on the lock nodes, one file each. Each is atomic on its
//! node, and each compares the stored value with the holder's before acting,
//! so no client can touch a key it does not own.
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
