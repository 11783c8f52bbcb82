//! Node guards: the client enforces the rules Redlock's safety rests on.
//!
//! Redlock is safe only while (a) a node that lost data stays out of the
//! quorum for longer than the longest TTL, (b) node clocks run at rates
//! within `drift_factor` and never jump, (c) nodes never evict lock keys,
//! and (d) nodes are independent masters. Each [`LockManager`] watches
//! every node it uses and *quarantines* one that breaks a rule: its answers
//! count as failures (never as grants or refusals), no key is set or
//! extended on it, while rollbacks and releases are still sent to it.
//!
//! - **Observed on connect** (in the round trip that already loads the
//!   scripts): `INFO` gives `run_id`, uptime, `aof_enabled`, `maxmemory`,
//!   `maxmemory_policy` and `role`; `CONFIG GET appendfsync` gives the fsync
//!   policy. Where `CONFIG` is renamed or forbidden the node is assumed
//!   *not* to fsync every write; where `INFO` fails, restarts cannot be
//!   seen and the last settings verdict stands (run `quorumlock doctor`);
//!   a known node that cannot be observed on a reconnect is quarantined
//!   for the window. Quarantined nodes are observed again once per clock
//!   interval while the manager is used.
//! - **Restart quarantine**: a node that does not persist every write
//!   (`appendonly yes` + `appendfsync always`) and restarted since we last
//!   saw it (new `run_id`), or that we meet for the first time, is not
//!   counted until it has been up for the quarantine window (never counted
//!   from before the old process last answered: uptime follows the node's
//!   wall clock).
//! - **Clock guard**: every request that sets or extends a key carries a
//!   `TIME` in the same write (with [`ClockCheck::Sampled`], one such
//!   request per clock interval, which leaves a gap after a fault: see
//!   there); quarantined nodes, which get no such
//!   requests, are observed again once per
//!   [`clock_interval`](NodeGuard::clock_interval). Each sample is judged
//!   against earlier ones with bounds from the round trips
//!   ([`judge::clock_fault`]), before the answer it came with is counted,
//!   so (with the default [`ClockCheck::EveryRequest`]) a forward jump
//!   cannot grant a lock. A node whose clock runs outside
//!   `drift_factor` or jumped (steps up to 1 ms are waited out) is
//!   quarantined until a window after it last looked wrong.
//! - **Eviction and role**: a replica, or a node with a memory limit and a
//!   `maxmemory-policy` other than `noeviction`, is quarantined until it is
//!   reconfigured and reconnected — by default, not only in a strict mode:
//!   an evicted lock key is a lock granted twice, silently, and the fix is
//!   one line of configuration. A policy without a memory limit
//!   (`maxmemory 0`) cannot evict and is only warned about by the doctor.
//!
//! What it cannot see: a fault in the moment before its first sample (a
//! node met for the first time is counted at once; a rate error shows once
//! the samples lie a few round trips apart), a step undone before the next
//! sample, settings changed with `CONFIG SET` on a live connection, and a
//! node whose disk lies about fsync.
//!
//! [`judge`] is the pure part, shared with `quorumlock doctor`.
//!
//! [`LockManager`]: crate::LockManager

mod health;
pub mod judge;
pub(crate) mod observe;
pub(crate) mod policy;
pub(crate) mod watch;

pub use judge::{ClockFault, ClockSample, NodeFacts, Quarantine, QuarantineReason};
pub use observe::facts_from_info;
pub use policy::{ClockCheck, NodeGuard};
