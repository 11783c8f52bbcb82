//! The kinds of lock, as types: a [`Lock<K>`](crate::Lock) and the
//! [`Request<K>`](crate::Request) that takes it say which kind they hold,
//! so a read lock or a multi-resource lock cannot be passed where one
//! writer's fence is needed (the methods are not there to call).
//!
//! | Kind | Taken by | Holds | Fence |
//! |---|---|---|---|
//! | [`Exclusive`] | [`LockManager::lock`](crate::LockManager::lock) | one resource, alone | [`Lock::fence`](crate::Lock::fence) |
//! | [`Read`] | [`LockManager::read`](crate::LockManager::read) | one resource, shared with other readers | none: readers compare [`writer_token`](crate::Lock::writer_token) |
//! | [`Many`] | [`LockManager::lock_many`](crate::LockManager::lock_many) | several resources, alone, all or none | [`Lock::fence_for`](crate::Lock::fence_for) each resource |
//!
//! ```compile_fail
//! # async fn demo(manager: quorumlock::LockManager) -> quorumlock::Result<()> {
//! let reader = manager.read("invoice:7").await?;
//! let fence = reader.fence()?; // a read lock has no fence to write with
//! # Ok(())
//! # }
//! ```

mod sealed {
    pub trait Sealed {}
}

/// A kind of lock: [`Exclusive`], [`Read`] or [`Many`]. Sealed: the
/// three are all there is.
pub trait Kind: sealed::Sealed + Send + Sync + 'static {}

/// One resource, held by one client: [`LockManager::lock`](crate::LockManager::lock).
/// Also the write side of a read-write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusive {}

/// One resource, shared by any number of readers while no writer holds
/// it: [`LockManager::read`](crate::LockManager::read). See [`crate::read_write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {}

/// Several resources, held by one client, all or none:
/// [`LockManager::lock_many`](crate::LockManager::lock_many). See [`crate::many`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Many {}

/// A kind held by one client alone: [`Exclusive`] or [`Many`] (what
/// [`Request::at_least`](crate::Request::at_least) takes). Sealed.
pub trait Unshared: Kind {}

impl sealed::Sealed for Exclusive {}
impl sealed::Sealed for Read {}
impl sealed::Sealed for Many {}
impl Kind for Exclusive {}
impl Kind for Read {}
impl Kind for Many {}
impl Unshared for Exclusive {}
impl Unshared for Many {}
