//! Read-write locks: any number of readers, or one writer.
//!
//! [`LockManager::read`](crate::LockManager::read) takes a read lock, a
//! [`Lock<Read>`](crate::Lock); a write lock is an ordinary exclusive
//! lock ([`LockManager::lock`](crate::LockManager::lock)). On each node:
//!
//! - A reader is granted only when no writer holds the resource (and no
//!   writer waits, see below). Each reader is its own entry, with its own
//!   expiry, in a sorted set at the resource's lock key; extension,
//!   release, keep-alive and loss work per reader, exactly as for a single
//!   lock, and entries that expired are removed by the next script that
//!   reads the set (the key itself expires with its last reader).
//! - A writer is granted only when the key is absent: no writer and no
//!   live reader. A plain `SET NX` fails on the readers' set, so
//!   exclusive locks, multi-resource locks and write locks all
//!   exclude readers without a word of change.
//!
//! **Why a quorum of readers and a quorum of writers exclude each other.**
//! A reader holds its lock only while a majority of nodes (`N / 2 + 1`)
//! keep its entry, and a writer only while a majority keep its key. Two
//! majorities of the same `N` nodes share at least one node (together
//! they count more than `N`), and on that node the reader's entry and the
//! writer's key cannot both be live: whichever came second was refused.
//! So no writer overlaps a valid reader, under the same conditions as
//! Redlock's exclusion (persistence, clocks within `drift_factor`). Two
//! readers need no such argument: they may share.
//!
//! **Writers do not starve.** A writer that waits
//! (any exclusive or multi-resource lock on the resource that waits, as
//! they do by default) is queued on the nodes, and while a live writer
//! is queued, every new reader is refused there, whether it waits or not
//! (a waiting reader is let in only if it is queued ahead of every waiting
//! writer). So the readers in place drain, and the writer goes next. A
//! writer that dies while waiting holds readers back for at most its queue
//! lease (its TTL, at most 2 s): its entry is then dropped by the next script that
//! reads the queue. A writer that does not wait
//! ([`no_wait`](crate::Request::no_wait))
//! is not queued and can be outpaced by a stream of readers: writers that
//! must not starve wait.
//!
//! **Tokens.** A writer's token, as any exclusive lock's, is strictly
//! larger than every earlier writer's. A reader's token is the fencing
//! counter as it stands: at least the token of every write lock granted
//! before it. In counter-node mode it is also below the token of every
//! write lock granted after it, so data that carries a token above the
//! read lock's was written after the read lock ended: a reader that
//! paused past its lock can tell (see `examples/read_write.rs`). Counters
//! also rise for write attempts that then failed, so data may carry a
//! smaller token than the read lock's without any write missing; compare
//! with "at most", not "equal". In quorum mode a failed writer may have
//! raised the counter on a minority of nodes only, and a later writer can
//! then get a token no larger than a reader's: there, a reader's token
//! orders it after earlier writers only. A reader's token is for
//! comparing, never for writing: a fenced store accepts tokens as high as
//! the last one it saw, so a write made under a read lock would pass.
//!
//! **Upgrading.** Clients from before read locks do not list their waiting
//! writers for readers to see, and their release and extension scripts
//! fail (with a Redis type error, never touching the readers) on a
//! read-locked key: upgrade every client of a resource before any of them
//! takes read locks on it.
//!
//! **No counting semaphores.** A semaphore with `k > 1` permits per node
//! does not carry over to a quorum: with 5 nodes and 3 permits each, five
//! clients can each be granted by a different majority (every node grants
//! three of them), so five hold a "3-permit" semaphore at once. Without a
//! design proven safe, none is offered; a read-write lock is the sharing
//! this crate can promise.
