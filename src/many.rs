//! Locks on several resources at once: all of them or none.
//!
//! [`LockManager::lock_many`](crate::LockManager::lock_many) takes every resource in a list as one
//! lock, a [`Lock<Many>`](crate::Lock). On each node one
//! script checks that no resource is held (and, for a waiter, that no one
//! is queued ahead of it on any of them) and then sets every key, or sets
//! none: a node never grants part of the list. The quorum rule, validity,
//! rollback of failed attempts on every node, extension, release,
//! keep-alive and the loss signal are those of a single lock, since a
//! node's answer is still one yes or no.
//!
//! - **No lock-order deadlock.** The list is sorted and taken in one step,
//!   so two clients asking for `[a, b]` and `[b, a]` ask for the same thing;
//!   one wins, or both lose and try again (waiters in ticket order), as
//!   two clients of one resource do. A waiter (every request that waits, as by default)
//!   takes its turn resource by resource in the sorted order, with one
//!   ticket: it is queued up to the first resource it is blocked on (held,
//!   or another waiter ahead), reserving the free ones before it, and on
//!   none after it. So a holder of `a` that waits for a free `b` is never
//!   held back by a waiter for `[a, b]` (which cannot use `b` before `a`
//!   is released), and the waiter keeps its place on the resource it
//!   waits for, so a stream of lockers of one of its resources cannot
//!   starve it. Every wait points at a later resource in the order, an
//!   earlier ticket on the same resource, or a holder: waiters cannot
//!   block each other in a cycle, as long as holders that wait for more
//!   take them in the same order (as with any mutex): a holder of `b`
//!   that waits for `a` stays behind a waiter for `[a, b]` queued on `a`
//!   until one of the two waits times out.
//! - **Same keys as single locks.** A multi-resource lock on `[a, b]` and a
//!   [`lock`](crate::LockManager::lock) (or read lock) on `a` exclude each other:
//!   both use `a`'s lock key.
//! - **One fencing token, valid for each resource.** The token is above
//!   every earlier token of every resource in the list (in counter-node
//!   mode the counter node raises each counter to one above the highest;
//!   in quorum mode the client takes one above the highest counter any
//!   resource has on a quorum, and stores it for each), so each resource's
//!   tokens still strictly increase from holder to holder, and storage
//!   checks it per resource as usual. Counters may jump (a resource's
//!   tokens follow the busiest resource it was locked with); only the
//!   order matters.
//!
//! At most [`MAX_RESOURCES`](crate::MAX_RESOURCES) resources per lock; a
//! name given twice, an empty name or an empty list is
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument).
