//! # quorumlock
//!
//! Distributed locks that survive the failure of Redis nodes: the Redlock
//! algorithm over N independent Redis masters.
//!
//! ## What it guarantees
//!
//! - **Mutual exclusion while valid.** A lock is granted only when a strict
//!   majority (`N / 2 + 1`) of nodes stored its unique value, and only for
//!   its validity: `ttl − elapsed − drift`, measured on the local monotonic
//!   clock from before the first request. Two clients cannot both hold a
//!   valid lock on one resource while a majority of nodes keeps its data
//!   (persistence with `appendfsync always`, or a crashed node kept down
//!   longer than the TTL) and clocks run at rates within `drift_factor`.
//! - **Fault tolerance.** Up to `N − (N / 2 + 1)` nodes may be down, slow or
//!   unreachable; every request is bounded by `node_timeout`, and an attempt
//!   is decided as soon as its outcome is fixed, never waiting for stragglers.
//! - **No collateral damage.** Release and extend compare the stored value
//!   first, so a holder never deletes or prolongs another holder's key.
//!
//! What no lock can promise: a holder that pauses (GC, swap, a network
//! stall) can wake up after its lock expired and carry on as if it held it.
//! Only a check on the storage side makes that harmless: every lock carries
//! a [`FencingToken`] that grows from each holder of a resource to the next
//! (see [`Fencing`] for how it is issued), and the storage refuses writes
//! whose token is lower than the highest it has accepted, and records a
//! holder's token when it reads what it will write back ([`FencedRedis`]
//! for Redis; in SQL, a per-resource fence row raised at the start of the
//! transaction: see docs/guide.md).
//!
//! Work that may outlive the TTL runs under [`Request::run`] (or
//! [`Lock::keep_alive`]): a watchdog extends the lock, and the work is
//! cancelled no later than the end of the validity if the lock is lost.
//!
//! Three kinds of lock ([`kind`]), each asked for with a [`Request`]:
//! [`LockManager::lock`] (one resource, one holder),
//! [`LockManager::read`] (readers share; waiting writers are not starved:
//! [`read_write`]) and [`LockManager::lock_many`] (several resources, all
//! or none, with no lock-order deadlock: [`many`]). A request waits while
//! the resource is held, queued and woken by the release, served in
//! arrival order ([`wait`]).
//!
//! ## Cancel safety
//!
//! Every future of this crate may be dropped at any await (under
//! `tokio::time::timeout`, in `select!`, by a runtime shutting down). A
//! dropped acquisition leaves no key once its background rollback (bounded
//! by `node_timeout`) is done; a dropped extension leaves the [`Lock`]
//! claiming no more validity than every node keeps; a dropped release or
//! keep-alive still releases. [`LockManager::settle`] waits for all such
//! background work, within a bound. Each async method's docs have a
//! `# Cancel safety` section with the details.
//!
//! ## Example
//!
//! ```
//! # use std::time::Duration;
//! # use quorumlock::{LockManager, Error};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! # let cluster = quorumlock::testkit::TestCluster::start(3)?;
//! # let urls = cluster.urls();
//! let manager = LockManager::builder()
//!     .nodes(urls) // e.g. ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", ...]
//!     .ttl(Duration::from_secs(10))
//!     .build()?;
//!
//! let lock = manager.lock("order:123").await?;
//! assert!(lock.is_valid());
//! let token = lock.token().expect("fencing is on by default");
//! // ... write the shared resource, passing `token` to the storage's check ...
//!
//! // A second client that will not wait is refused while the lock is held.
//! assert!(matches!(
//!     manager.lock("order:123").no_wait().await,
//!     Err(Error::Contended { .. })
//! ));
//! lock.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Three ways to hold a lock
//!
//! - **By hand**: awaiting a [`Request`] (waiting, or one attempt with
//!   [`Request::no_wait`]) returns a [`Lock`]; [`Lock::extend`] it before
//!   it expires, [`Lock::release`] it when done. Dropping it releases it
//!   in the background.
//! - **Kept alive**: [`Request::run`] runs a closure under the lock while
//!   a watchdog extends it, and cancels the closure if the lock is lost;
//!   [`Lock::keep_alive`] gives the same watchdog as a handle.
//! - **With a fallback**: [`Request::run_or_fallback`] runs the work under
//!   the lock, or a fallback of yours when the lock service is unavailable
//!   ([`fallback`]).
//!
//! ## Fencing
//!
//! [`Lock::fence`] pairs the lock's resource with its [`FencingToken`];
//! [`FencedRedis`] refuses a write whose token is older than one it already
//! accepted for that resource ([`Error::FencedOut`]), and its fenced read
//! ([`FencedRedis::read`]) records the reader's token before reading, so
//! that no older holder can write between a read and the write based on
//! it. Tokens are issued by a counter node or by a quorum ([`Fencing`]).
//!
//! ## Errors
//!
//! Every call returns the one [`Error`]; [`Error::kind`] names the variant
//! for logs and metrics, and [`Error::is_unavailable`] tells an unhealthy
//! lock service ([`Error::QuorumUnavailable`] and kin, retried on a
//! [`Backoff`]) from a busy resource ([`Error::Contended`]).
//! [`LockManager::health`] says how the nodes look, and a
//! [`CircuitBreaker`] can stop calls while they are down ([`health`]).
//!
//! ## Features
//!
//! - `tls`: `rediss://` nodes and storage through rustls ([`tls`]).
//! - `metrics`: counters, gauges and histograms through the `metrics`
//!   facade ([`metric_names`]).
//! - `testkit`: local `redis-server` clusters, fault proxies and a
//!   PostgreSQL server for tests (the examples on this page run on it).
//! - `bench`: the benchmark engine; `cli`: the `quorumlock` command line.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The files form layers (public types, orchestration, settings, wire, state,
// telemetry, core); each uses only its own layer or lower ones. The table and
// its check are in tests/layout.rs; docs/architecture.md says what each file is.
/// The Rust examples of the README and of `docs/` compile (`cargo test --doc`).
#[cfg(doctest)]
mod markdown_examples {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/guide.md")]
    struct Guide;
    #[doc = include_str!("../docs/operations.md")]
    struct Operations;
    #[doc = include_str!("../docs/guarantees.md")]
    struct Guarantees;
    #[doc = include_str!("../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../docs/reliability.md")]
    struct Reliability;
    #[doc = include_str!("../docs/architecture.md")]
    struct Architecture;
    #[doc = include_str!("../docs/scaling-out.md")]
    struct ScalingOut;
    #[doc = include_str!("../docs/recipes.md")]
    struct Recipes;
}

mod address;
mod background;
/// The benchmark engine of `cargo bench` and `quorumlock bench`; not part
/// of the API.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
mod clock;
mod config;
mod connect;
pub mod election;
mod engine;
mod error;
pub mod fallback;
mod fencing;
pub mod guard;
pub mod health;
mod held;
mod holding;
mod hot_wire;
mod inspect;
mod keys;
pub mod kind;
mod limits;
mod lock;
mod manager;
pub mod many;
mod member;
#[cfg(test)]
mod model_check;
mod node;
mod ops;
mod pending;
mod quorum;
pub mod read_write;
mod reply_error;
mod request;
mod resp;
pub mod retry;
mod round;
mod scripts;
mod slots;
mod storage;
mod telemetry;
#[cfg(all(feature = "testkit", unix))]
#[cfg_attr(docsrs, doc(cfg(all(feature = "testkit", unix))))]
pub mod testkit;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub mod tls;
pub mod wait;
mod watchdog;

pub use config::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, DEFAULT_MAX_HOLD, DEFAULT_NODE_TIMEOUT,
    DEFAULT_TTL, DEFAULT_WAIT, LockManagerBuilder,
};
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{Error, LossReason, NodeError, NodeErrorKind, NotHeldReason, Result};
pub use fallback::Ran;
pub use fencing::{FenceCounters, Fencing, FencingToken};
pub use guard::{ClockCheck, NodeGuard};
pub use health::{CircuitBreaker, Health, HealthState};
pub use holding::{ForcedUnlock, Holder, HolderKind, Holding, MAX_HOLDER_LEN, holder_description};
pub use hot_wire::Wire;
pub use inspect::Break;
pub use keys::{MAX_RESOURCE_LEN, MAX_RESOURCES};
pub use limits::MAX_TTL;
pub use lock::Lock;
pub use manager::LockManager;
pub use request::Request;
pub use retry::Backoff;
pub use storage::{Fence, FencedRedis};
pub use telemetry::metric_names;
#[cfg(feature = "tls")]
pub use tls::Tls;
pub use watchdog::{KeepAlive, Lease};

/// What the command line, the benchmarks and the tests need of the
/// internals: key names, the node guard's rules, the quorum arithmetic.
/// Not part of the API (no compatibility promise); present only with the
/// `testkit` feature.
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub mod internals {
    /// The node guard's pure rules.
    pub mod judge {
        pub use crate::guard::findings::*;
        pub use crate::guard::judge::*;
        pub use crate::guard::observe::{DataSetKeys, fsync_policy};
    }
    pub use crate::connect::ClusterUrl;
    pub use crate::fencing::{
        COUNTER_FAILOVER_MARGIN, COUNTER_LIFE, CounterGrants, CounterToken, FencingToken,
        clock_ceiling, clock_floor, clock_lowest, counter_node_token, quorum_token,
    };
    pub use crate::guard::observe::facts_from_info;
    /// Who holds a lock, node by node and as a quorum.
    pub mod holding {
        pub use crate::holding::{
            NodeHolding, NodeKind, combine, description_of, hides_or_reorders,
        };
        pub use crate::inspect::inspect_invocation;
    }
    pub use crate::keys::{
        Access, KeyKind, NAMESPACE, check_resource, fence_key, hash_tag, is_old_layout_key, key_of,
        lock_key, parse_key, slot, wake_channel,
    };
    pub use crate::slots::cluster_masters;
    /// The quorum arithmetic: tally and validity.
    pub mod quorum {
        pub use crate::quorum::*;
    }
    pub use crate::quorum::{drift, quorum};
    pub use crate::storage::FENCED_TOKEN_PREFIX;
    /// The hot-path wire's RESP2 parser.
    pub mod resp {
        pub use crate::resp::{ProtocolError, parse};
    }
}
