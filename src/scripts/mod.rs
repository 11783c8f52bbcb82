//! The Lua scripts run on the Redis servers, one file each. Each is atomic on
//! its node, and each that touches a lock key compares the stored value with
//! the holder's first, so no client can touch a key it does not own.
//!
//! They are loaded on every new connection (one pipelined round trip) and
//! sent with EVALSHA; should a node still answer NOSCRIPT (nothing ran), the
//! request loads them all and is sent once more, an acquire or an extension
//! within its round only (it must not go out late). Scripts that read a fencing counter start with
//! `counter.lua`, which compares counters exactly, as decimal strings;
//! scripts that read or change who holds a lock also start with `queue.lua`
//! (the waiter queue) and `holders.lua` (exclusive holders and readers).

use std::sync::LazyLock;

use redis::Script;

/// A script that reads or changes a lock's holders, with what it shares:
/// counters, the waiter queue, and the holders' entries (`holders.lua`).
macro_rules! holders_script {
    ($file:literal) => {
        concat!(
            include_str!("counter.lua"),
            include_str!("queue.lua"),
            include_str!("holders.lua"),
            include_str!($file)
        )
    };
}

/// A holders script that first tries its common case, `$fast`, and defines
/// the shared rules only when that is not the whole story: the `$inside`
/// sources (the rules and the script itself) become `in_full()`, which
/// `$fast` calls then: most locks meet no waiter, and need neither the
/// rules (some thirty functions, defined on every call) nor the queue's
/// bookkeeping. The `$outside` sources are those `$fast` itself uses.
macro_rules! common_case_first {
    ([$($outside:literal),*], [$($inside:literal),*], $fast:literal) => {
        concat!(
            $(include_str!($outside),)*
            "local function in_full()\n",
            $(include_str!($inside),)*
            "\nend\n",
            include_str!($fast)
        )
    };
}

/// A fenced-storage script, with the token check and claim it shares
/// (`fence.lua`).
macro_rules! fence_script {
    ($file:literal) => {
        concat!(
            include_str!("counter.lua"),
            include_str!("fence.lua"),
            include_str!($file)
        )
    };
}

/// Every script's source, in the order of the statics below.
pub(crate) const SOURCES: [&str; 10] = [
    common_case_first!(
        [],
        ["counter.lua", "queue.lua", "holders.lua", "release.lua"],
        "release_fast.lua"
    ),
    holders_script!("extend.lua"),
    concat!(
        include_str!("counter.lua"),
        include_str!("lone.lua"),
        include_str!("acquire_counted.lua")
    ),
    concat!(
        include_str!("counter.lua"),
        include_str!("lone.lua"),
        include_str!("acquire_read_counter.lua")
    ),
    holders_script!("store_token.lua"),
    fence_script!("fenced_write.lua"),
    common_case_first!(
        ["counter.lua"],
        ["queue.lua", "holders.lua", "lone.lua", "acquire.lua"],
        "acquire_fast.lua"
    ),
    include_str!("observe.lua"),
    fence_script!("fenced_read.lua"),
    holders_script!("keep.lua"),
];

/// The sources as they go to the nodes: without comment lines, blank
/// lines and indentation, which are for readers here. Smaller to load on every connection,
/// and each under the 16 KB a server allows in one argument before a client
/// authenticates (a larger one makes it close the connection, hiding the
/// NOAUTH that says what is wrong).
pub(crate) static SENT: LazyLock<[String; 10]> = LazyLock::new(|| SOURCES.map(without_comments));

pub(crate) fn without_comments(source: &str) -> String {
    // Indentation goes too: Lua does not read it (no script holds a long
    // string, whose lines it would change).
    source
        .lines()
        .map(str::trim_start)
        .filter(|line| !line.is_empty() && !line.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Compare-and-delete every entry, dequeue, wake the next waiters
/// (`release.lua`): 1 when all were ours, else 0. One exclusive resource
/// with no waiter queue on the node costs a compare-and-delete alone
/// (`release_fast.lua`).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[0]));

/// Compare-and-extend every entry (`extend.lua`): 1 when extended, 2 when
/// repaired, 0 when not ours.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[1]));

/// Single resource: SET NX PX + INCR counter (`acquire_counted.lua`): the
/// token, or nil.
pub(crate) static ACQUIRE_COUNTED: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[2]));

/// Single resource: SET NX PX + read counter (`acquire_read_counter.lua`):
/// the counter, or nil.
pub(crate) static ACQUIRE_READ_COUNTER: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[3]));

/// Compare values, raise counters (`store_token.lua`): 1 when stored, 0 when not ours.
pub(crate) static STORE_TOKEN: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[4]));

/// Storage-side check-and-write (`fenced_write.lua`): {1, token} or {0, highest}.
pub(crate) static FENCED_WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[5]));

/// Storage-side check, claim and read (`fenced_read.lua`): {1, value} or
/// {0, highest}.
pub(crate) static FENCED_READ: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[8]));

/// Any other acquire: several resources, a read lock, or a waiter behind
/// the queue (`acquire.lua`): the fencing mode's grant, nil, or {ms until
/// the lock may be free, behind other waiters}. One free exclusive
/// resource with no waiter queue on the node costs what
/// `acquire_counted.lua` does (`acquire_fast.lua`).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[6]));

/// The release of an `at_least` lock before its time is up (`keep.lua`):
/// where our value holds, the key stays for the time left, and the waiter
/// leaves the queues; 1 when our value held every resource, else 0.
pub(crate) static KEEP: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[9]));

/// The node guard's observation (`observe.lua`): INFO, the node's time, and
/// its data set's mark and number.
pub(crate) static OBSERVE: LazyLock<Script> = LazyLock::new(|| Script::new(&SENT[7]));

/// Scripts an operator's query sends now and then, so not loaded on every
/// connection (EVALSHA falls back to EVAL when a node lacks one).
const OCCASIONAL: [&str; 2] = [
    concat!(
        include_str!("reported_counter.lua"),
        include_str!("inspect.lua")
    ),
    concat!(
        include_str!("counter.lua"),
        include_str!("queue.lua"),
        include_str!("holders.lua"),
        include_str!("reported_counter.lua"),
        include_str!("force_unlock.lua")
    ),
];

/// Who holds a lock on a node, its counter and live waiters
/// (`inspect.lua`); reads only.
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&without_comments(OCCASIONAL[0])));

/// Force-unlock (`force_unlock.lua`): deletes the lock key whoever holds
/// it, wakes the first waiter; {what was deleted, the counter}.
pub(crate) static FORCE_UNLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::new(&without_comments(OCCASIONAL[1])));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_goes_to_the_nodes_is_the_code_alone_and_small() {
        let occasional = OCCASIONAL.map(without_comments);
        for (source, sent) in SOURCES
            .iter()
            .zip(SENT.iter())
            .chain(OCCASIONAL.iter().zip(occasional.iter()))
        {
            assert!(sent.len() < 16 * 1024, "{} bytes", sent.len());
            assert!(!sent.lines().any(|line| line.trim_start().starts_with("--")));
            let code = |text: &str| {
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with("--"))
                    .count()
            };
            assert_eq!(code(source), code(sent));
        }
    }
}
