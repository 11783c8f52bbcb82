//! Node guards: the client enforces the rules Redlock's safety rests on.
//!
//! Redlock is safe only while (a) a node that lost writes it acknowledged
//! stays out of the quorum for longer than the longest TTL, (b) node
//! clocks run at rates within `drift_factor` and never jump, (c) nodes
//! never evict lock keys, and (d) nodes are independent masters. Each
//! [`LockManager`] watches every node it uses and *quarantines* one that
//! breaks a rule: its answers count as failures (never as grants or
//! refusals), no key is set or extended on it, while rollbacks and
//! releases are still sent to it.
//!
//! - **Observed** on connect, and again once per
//!   [`clock_interval`](NodeGuard::clock_interval) while the manager uses
//!   the node (in the same write as a key-setting request, so without a
//!   round trip of its own; in the background for a quarantined node; at
//!   once after a `READONLY` answer): one script reads `INFO` (`run_id`,
//!   uptime, persistence, memory policy, role, replication id) and the
//!   node's *data-set mark* (`quorumlock:node`, written by the first
//!   manager that meets the node: a random id and the `run_id` of the
//!   process that wrote it), and (once a second per manager: it is a
//!   write) raises a number kept beside it;
//!   `CONFIG GET appendfsync` goes with it. An observation that fails
//!   (`INFO` or `EVALSHA` refused by an ACL, `-BUSY`, a timeout) or ends
//!   without a verdict (dropped with its request) leaves the node
//!   quarantined until one succeeds, with another due at once: a restart
//!   or a lost data set would go unseen. Where `CONFIG` is refused the
//!   node is taken not to fsync every write.
//! - **Verdict before count**: an answer to a key-setting request counts
//!   only once the verdict of every observation claimed before it was sent
//!   is in, and the latest covers it (it was sent within a clock interval
//!   of that observation's start); until then it waits, bounded by its
//!   round.
//! - **Units against the holder**: what a server reports in coarse units
//!   is a [`Reported`](judge::Reported) span that offers only its bounds;
//!   uptime (whole seconds, up to a second more than the process ran) and
//!   the mark's age (whole ms) are taken as short as they can be.
//! - **Facts bound to identity**: a cluster node signs its mark with its
//!   node id and config epoch, which replication does not copy and a
//!   failback moves on; one process (`run_id`) behind two names of a
//!   manager counts behind one only.
//! - **The window covers every key**: it is never shorter than the
//!   longest TTL or `at_least` the manager has used.
//! - **Lost writes** ([`judge::first_sight`] and its companion for a node
//!   already known): a
//!   restart (new `run_id`) is trusted at once only if the old process
//!   persisted every write when last observed (`appendonly yes`,
//!   `appendfsync always`, no AOF rewrite pending, its last AOF write
//!   fine), the new one does, and it came back with the same data set, no
//!   older (the same mark, a number no lower); otherwise the node is
//!   quarantined for the quarantine window from its start. A running
//!   process whose replication id changed (`REPLICAOF`, a failover) or
//!   whose data set changed (`FLUSHALL`, an older copy loaded) is
//!   quarantined for the window from when that was seen. A node met for
//!   the first time is trusted only if its data set is older than the
//!   window and its process is too, or persists every write and loaded
//!   that data set at its start. An age that reaches back before the old
//!   process's last answer (uptime follows the node's wall clock) is
//!   taken as now.
//! - **Clock guard**: every request that sets or extends a key carries a
//!   `TIME` in the same write (with [`ClockCheck::Sampled`], one such
//!   request per clock interval, which leaves a gap after a fault: see
//!   there). Each sample is judged against earlier ones, kept across
//!   restarts, with bounds from the round trips ([`judge::clock_fault`]),
//!   before the answer it came with is counted, so (with the default
//!   [`ClockCheck::EveryRequest`]) a forward jump cannot grant a lock. A
//!   node met for the first time counts only once two readings of its
//!   clock lie far enough apart, for their round trips, to show a rate
//!   1.5 times too fast or too slow ([`judge::rate_measured`]): on connect
//!   it is read 10 ms after the first reading, then, while that is not
//!   enough (a loaded machine), further out (up to 400 ms, at most half
//!   the `connect_timeout`), then in the background for up to 3 s. A node
//!   that refuses `TIME` for good counts without (the guard is blind to
//!   its clock, and says so). A node whose clock runs outside
//!   `drift_factor` or jumped (steps up to 1 ms are waited out) is
//!   quarantined until a window after it last looked wrong.
//! - **Eviction and role**: a replica, or a node with a memory limit and a
//!   `maxmemory-policy` other than `noeviction`, is quarantined until an
//!   observation shows it reconfigured: an evicted lock key is a lock
//!   granted twice, silently, and the fix is one line of configuration. A
//!   policy without a memory limit (`maxmemory 0`) cannot evict and is
//!   only warned about by the doctor.
//!
//! What it cannot see: a change and its consequence within one clock
//! interval of an observation (settings switched and the node crashed, a
//! `FLUSHALL` or `REPLICAOF` round trip just after an observation), a
//! previous process met by no observation of this manager (first sight
//! trusts a young node that loaded its data set), a node clock stepped
//! before a first meeting, a step undone before the next sample, a disk
//! that lies about fsync, and an AOF cut short by hand.
//!
//! The judge (`guard/judge.rs`) is the pure part, shared with
//! `quorumlock doctor`. The rules as one table of facts (with their
//! units) and verdicts, each with the real-node test that shows it, are in
//! docs/operations.md ("Node guards").
//!
//! [`LockManager`]: crate::LockManager

#[cfg(any(test, feature = "testkit"))]
pub(crate) mod findings;
pub(crate) mod health;
pub(crate) mod judge;
pub(crate) mod observe;
pub(crate) mod policy;
pub(crate) mod watch;

pub use judge::{ClockFault, Quarantine, QuarantineReason};
pub use policy::{ClockCheck, NodeGuard};
