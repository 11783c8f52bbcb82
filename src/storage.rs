//! The storage side of fencing for data kept in Redis: a write (set, delete
//! or append) goes through only if its token is at least the highest token the storage
//! has accepted for the resource, checked and applied in one atomic script.
//! A fenced read does the same check and raises the highest token to the
//! reader's before it reads, so that no older holder can write between a
//! read and the write based on it.
//!
//! This is the check that makes a paused, expired lock holder harmless. It
//! runs on the storage Redis (not on the lock nodes) and needs no lock
//! handle, only the token, so any process that got a token can use it.

use std::sync::Arc;
use std::time::Duration;

use crate::connect::{Connect, parse_node_url};
use crate::error::{Error, NodeErrorKind, Result};
use crate::fencing::FencingToken;
use crate::guard::watch::NodeWatch;
use crate::health::Reporter;
use crate::keys::{Access, Keys};
use crate::node::Node;
use crate::scripts;

/// Prefix of the key, on the storage Redis, holding the highest token
/// accepted for a resource. [`FencedRedis`] refuses data keys that start
/// with it ([`Error::InvalidArgument`]): writing or deleting one would
/// change a resource's highest token.
pub const FENCED_TOKEN_PREFIX: &str = "quorumlock:fenced:";

/// Default bound on one storage request, connection included.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// What a write to fenced storage carries: the resource whose data it
/// writes and the token of the lock on it, taken together from the lock
/// ([`Lock::fence`](crate::Lock::fence),
/// [`Lease::fence`](crate::Lease::fence)) so that they cannot be swapped
/// or paired wrongly. Only an exclusive lock has one: a read lock's token
/// cannot fence a write.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// # let data = quorumlock::testkit::TestCluster::start(1)?;
/// use quorumlock::FencedRedis;
///
/// let storage = FencedRedis::new(&data.url(0)?)?;
/// let lock = manager.lock("cart:5").await?;
/// let fence = lock.fence()?; // the lock's resource and token, together
/// storage.set(&fence, "cart:5:items", "3").await?;
/// # lock.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    resource: String,
    token: FencingToken,
}

impl Fence {
    /// The fence of a token kept apart from its lock (handed to another
    /// process, say), for `resource`: the name the lock was taken on.
    /// Prefer [`Lock::fence`](crate::Lock::fence). An empty name is
    /// [`Error::InvalidArgument`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// use quorumlock::{Fence, FencedRedis};
    ///
    /// let storage = FencedRedis::new(&data.url(0)?)?;
    /// let lock = manager.lock("export:3").await?;
    /// // The token travels on its own, e.g. to a worker process, as a number.
    /// let raw = lock.token().expect("fenced").get();
    /// let fence = Fence::new("export:3", quorumlock::FencingToken::new(raw))?;
    /// storage.set(&fence, "export:3:state", "done").await?;
    /// assert!(Fence::new("", fence.token()).is_err(), "an empty name is refused");
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn new(resource: impl Into<String>, token: FencingToken) -> Result<Self> {
        let resource = resource.into();
        if resource.is_empty() {
            return Err(Error::InvalidArgument {
                argument: "resource",
                reason: "the resource name is empty; use the name the lock was taken on".into(),
            });
        }
        Ok(Self { resource, token })
    }

    /// The fence of a lock on `keys` with `token`, for `resource` (which
    /// must be one of them; `None`: its only one).
    pub(crate) fn of(
        keys: &Keys,
        token: Option<FencingToken>,
        resource: Option<&str>,
    ) -> Result<Self> {
        let refuse = |argument, reason: String| Err(Error::InvalidArgument { argument, reason });
        let Some(token) = token else {
            return refuse(
                "lock",
                "the lock has no fencing token (Fencing::Off); turn fencing on to write to \
                 fenced storage"
                    .into(),
            );
        };
        if keys.access == Access::Shared {
            return refuse(
                "lock",
                "a read lock's token orders it after earlier writers but shuts out no other \
                 reader: it cannot fence a write; take a write lock (`lock` or `write`)"
                    .into(),
            );
        }
        let names = || keys.resources.iter().map(|r| r.name());
        let resource = match (resource, keys.resources.len()) {
            (Some(wanted), _) => match names().find(|name| *name == wanted) {
                Some(name) => name,
                None => {
                    return refuse(
                        "resource",
                        format!(
                            "`{wanted}` is not one of this lock's resources {}",
                            keys.label()
                        ),
                    );
                }
            },
            (None, 1) => keys.label(),
            (None, count) => {
                return refuse(
                    "lock",
                    format!(
                        "this lock holds {count} resources {}; name the one whose data you \
                         write with `fence_for(resource)`",
                        keys.label()
                    ),
                );
            }
        };
        Self::new(resource, token)
    }

    /// The resource whose data the write is for.
    ///
    /// ```
    /// use quorumlock::{Fence, FencingToken};
    ///
    /// let fence = Fence::new("cart:5", FencingToken::new(42))?;
    /// assert_eq!(fence.resource(), "cart:5");
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The lock's fencing token.
    ///
    /// ```
    /// use quorumlock::{Fence, FencingToken};
    ///
    /// let fence = Fence::new("cart:5", FencingToken::new(42))?;
    /// assert_eq!(fence.token().get(), 42);
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn token(&self) -> FencingToken {
        self.token
    }
}

/// Fenced writes and reads on one Redis server holding the protected data.
///
/// Every write ([`set`](Self::set), [`delete`](Self::delete),
/// [`push`](Self::push)) is refused if a higher token than its fence's was
/// already accepted for the resource. A read-modify-write should read with
/// [`read`](Self::read) (or [`read_list`](Self::read_list)): the fenced
/// read raises the resource's highest token to the reader's, so a stale
/// holder that wakes up between this holder's read and its write is
/// refused instead of writing a value this holder is about to overwrite
/// (its update would be lost). [`get`](Self::get) and [`list`](Self::list)
/// read without a fence. Data keys must not start with
/// [`FENCED_TOKEN_PREFIX`], where the highest tokens are kept.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let nodes = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(nodes.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
/// # let data = quorumlock::testkit::TestCluster::start(1)?;
/// # let storage_url = data.url(0)?;
/// use quorumlock::{Error, Fence, FencedRedis};
///
/// let storage = FencedRedis::new(&storage_url)?;
/// let old = manager.lock("order:123").await?;
/// let stale = old.token().expect("fencing is on by default");
/// old.release().await?;
///
/// let lock = manager.lock("order:123").await?;
/// let token = lock.token().expect("fencing is on by default");
/// storage.set(&lock.fence()?, "order:123:state", "paid").await?;
/// // A holder with an older token is refused, and writes nothing.
/// let stale = Fence::new("order:123", stale)?;
/// match storage.set(&stale, "order:123:state", "cancelled").await {
///     Err(Error::FencedOut { highest, .. }) => assert_eq!(highest, token),
///     other => panic!("a stale write went through: {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
pub struct FencedRedis {
    node: Arc<Node>,
    timeout: Duration,
}

impl std::fmt::Debug for FencedRedis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedRedis")
            .field("node", &self.node.name())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl FencedRedis {
    /// A client for the storage server at `url`. No I/O: it connects on
    /// first use, and reconnects after failures.
    ///
    /// ```
    /// use quorumlock::FencedRedis;
    ///
    /// // No I/O yet: it connects on first use.
    /// let storage = FencedRedis::new("redis://app:secret@127.0.0.1:6380/0")?;
    /// # let _ = storage;
    /// assert!(FencedRedis::new("not a url").is_err());
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn new(url: &str) -> Result<Self> {
        Self::connecting(url, &Connect::default())
    }

    /// As [`new`](Self::new), for a `rediss://` URL with these TLS settings
    /// (feature `tls`).
    ///
    /// ```
    /// use quorumlock::{FencedRedis, Tls};
    ///
    /// let certificates = quorumlock::testkit::TestCertificates::generate()?;
    /// let tls = Tls::new().ca_pem(certificates.ca_pem());
    /// let storage = FencedRedis::with_tls("rediss://127.0.0.1:6380", tls)?;
    /// # let _ = storage;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn with_tls(url: &str, tls: crate::tls::Tls) -> Result<Self> {
        tls.check().map_err(|reason| Error::InvalidArgument {
            argument: "tls",
            reason,
        })?;
        Self::connecting(
            url,
            &Connect {
                tls: Some(tls),
                ..Connect::default()
            },
        )
    }

    fn connecting(url: &str, connect: &Connect) -> Result<Self> {
        let spec = parse_node_url(url, connect).map_err(|reason| Error::InvalidArgument {
            argument: "url",
            reason,
        })?;
        Ok(Self {
            node: Arc::new(Node::new(
                spec.name.clone(),
                spec.client,
                // Storage requests are not the lock's hot path.
                None,
                DEFAULT_TIMEOUT,
                NodeWatch::off(spec.name),
                Reporter::none(),
            )),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Bound on each request, connection included (default 1 s).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let storage = quorumlock::FencedRedis::new("redis://127.0.0.1:6380")?
    ///     .with_timeout(Duration::from_millis(200));
    /// # let _ = storage;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets `key` to `value` if the fence's token is at least the highest
    /// token accepted for its resource, and records it as the highest.
    /// Otherwise returns [`Error::FencedOut`] with the highest token, and
    /// writes nothing. Equal tokens pass: a holder may write many times.
    /// A `key` starting with [`FENCED_TOKEN_PREFIX`] is
    /// [`Error::InvalidArgument`]: that is where the highest tokens are
    /// kept, and writing there could let an older token pass.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// use quorumlock::{Error, FencedRedis};
    ///
    /// let storage = FencedRedis::new(&data.url(0)?)?;
    /// let old = manager.lock("cart:5").await?;
    /// let stale = old.fence()?;
    /// old.release().await?;
    ///
    /// // A newer holder writes first ...
    /// let new = manager.lock("cart:5").await?;
    /// storage.set(&new.fence()?, "cart:5:items", "3").await?;
    /// // ... so the older token is refused, and nothing is written.
    /// let refused = storage.set(&stale, "cart:5:items", "2").await;
    /// assert!(matches!(refused, Err(Error::FencedOut { .. })));
    /// assert_eq!(storage.get("cart:5:items").await?.as_deref(), Some("3"));
    /// # new.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// The check and the write are one script, run whole or not at all: if
    /// the future is dropped, the write either happened completely (data
    /// and highest token) or not at all, and a script already sent still
    /// runs. Nothing else is left behind.
    pub async fn set(&self, fence: &Fence, key: &str, value: impl AsRef<[u8]>) -> Result<()> {
        self.write(fence, key, Write::Set(value.as_ref())).await
    }

    /// Deletes `key` under the same rule as [`set`](Self::set).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// let storage = quorumlock::FencedRedis::new(&data.url(0)?)?;
    /// let lock = manager.lock("cart:5").await?;
    /// let fence = lock.fence()?;
    /// storage.set(&fence, "cart:5:items", "3").await?;
    /// storage.delete(&fence, "cart:5:items").await?;
    /// assert_eq!(storage.get("cart:5:items").await?, None);
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// The check and the write are one script, run whole or not at all: if
    /// the future is dropped, the write either happened completely (data
    /// and highest token) or not at all, and a script already sent still
    /// runs. Nothing else is left behind.
    pub async fn delete(&self, fence: &Fence, key: &str) -> Result<()> {
        self.write(fence, key, Write::Delete).await
    }

    /// Appends `value` to the list at `key` (RPUSH) under the same rule as
    /// [`set`](Self::set): an append-only log in which no stale holder can
    /// append after a newer one.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// let storage = quorumlock::FencedRedis::new(&data.url(0)?)?;
    /// let lock = manager.lock("audit").await?;
    /// storage.push(&lock.fence()?, "audit:log", "entry 1").await?;
    /// assert_eq!(storage.list("audit:log").await?, ["entry 1"]);
    /// assert_eq!(storage.highest_token("audit").await?, lock.token());
    /// lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// The check and the write are one script, run whole or not at all: if
    /// the future is dropped, the write either happened completely (data
    /// and highest token) or not at all, and a script already sent still
    /// runs. Nothing else is left behind.
    pub async fn push(&self, fence: &Fence, key: &str, value: impl AsRef<[u8]>) -> Result<()> {
        self.write(fence, key, Write::Push(value.as_ref())).await
    }

    /// Reads `key` under the fence, for a read-modify-write: refused with
    /// [`Error::FencedOut`] (the same refusal as a write's) if a higher
    /// token than the fence's was already accepted for its resource;
    /// otherwise raises the resource's highest token to the fence's and
    /// returns the value (`None` when `key` is absent). Check, claim and
    /// read are one atomic script.
    ///
    /// The claim is what makes the read safe to write back from. Checking
    /// writes alone lets a stale holder (token 1, its lock expired while it
    /// was paused) write *after* a newer holder (token 2) has read but
    /// before it writes: the write passes, since 1 is still the highest
    /// accepted token, and the newer holder then overwrites it with a value
    /// computed without it, so the stale holder's update is lost although
    /// every write passed the fence. After a fenced read with token 2, the
    /// stale write is refused. Read with [`get`](Self::get) only what you
    /// will not write back.
    ///
    /// A `key` starting with [`FENCED_TOKEN_PREFIX`] is
    /// [`Error::InvalidArgument`], as for the writes. A key that holds no
    /// string is an error that claims nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// use quorumlock::{Error, FencedRedis};
    ///
    /// let storage = FencedRedis::new(&data.url(0)?)?;
    /// let old = manager.lock("stock:7").await?;
    /// let zombie = old.fence()?;
    /// storage.set(&zombie, "stock:7", "100").await?;
    /// // Its holder stalls; the lock ends (released here, expired in life).
    /// old.release().await?;
    ///
    /// // The newer holder reads under its fence ...
    /// let lock = manager.lock("stock:7").await?;
    /// let fence = lock.fence()?;
    /// let read = storage.read(&fence, "stock:7").await?;
    /// let stock: u32 = read.as_deref().unwrap_or("0").parse().expect("a number");
    /// // ... so the stalled holder, waking before that holder writes, is
    /// // refused: its sale of 3 cannot be overwritten unseen.
    /// let stale = storage.set(&zombie, "stock:7", "97").await;
    /// assert!(matches!(stale, Err(Error::FencedOut { .. })));
    /// storage.set(&fence, "stock:7", (stock - 1).to_string()).await?;
    /// assert_eq!(storage.get("stock:7").await?.as_deref(), Some("99"));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Check, claim and read are one script, run whole or not at all. If
    /// the future is dropped, the claim may or may not have been applied (a
    /// script already sent still runs) and the value is lost with the
    /// future. A claim only raises the resource's highest token to this
    /// fence's, as this holder's next write would: holders with older
    /// tokens are refused from then on, which is safe, and nothing else
    /// changes.
    pub async fn read(&self, fence: &Fence, key: &str) -> Result<Option<String>> {
        self.claim(fence, key, Read::String).await
    }

    /// The list at `key` under the fence (all its entries), with the
    /// check and claim of [`read`](Self::read): for a holder that reads a
    /// list it [`push`](Self::push)es to (or rewrites) based on what it
    /// read. A key that holds no list is an error that claims nothing; a
    /// `key` starting with [`FENCED_TOKEN_PREFIX`] is
    /// [`Error::InvalidArgument`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// use quorumlock::{Error, FencedRedis};
    ///
    /// let storage = FencedRedis::new(&data.url(0)?)?;
    /// let old = manager.lock("batch:2").await?;
    /// let stale = old.fence()?;
    /// old.release().await?;
    ///
    /// let lock = manager.lock("batch:2").await?;
    /// let fence = lock.fence()?;
    /// let done = storage.read_list(&fence, "batch:2:done").await?;
    /// assert!(done.is_empty());
    /// // From the read on, the older holder may not append ...
    /// let refused = storage.push(&stale, "batch:2:done", "item 1").await;
    /// assert!(matches!(refused, Err(Error::FencedOut { .. })));
    /// // ... nor read under its fence.
    /// assert!(storage.read_list(&stale, "batch:2:done").await.is_err());
    /// storage.push(&fence, "batch:2:done", "item 1").await?;
    /// assert_eq!(storage.list("batch:2:done").await?, ["item 1"]);
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// As for [`read`](Self::read): the claim may or may not have been
    /// applied, which only raises the resource's highest token to this
    /// fence's (safe), and nothing else changes.
    pub async fn read_list(&self, fence: &Fence, key: &str) -> Result<Vec<String>> {
        self.claim(fence, key, Read::List).await
    }

    /// The list at `key` (unfenced read; see [`read_list`](Self::read_list)
    /// to write back what was read). A `key` starting with
    /// [`FENCED_TOKEN_PREFIX`] is [`Error::InvalidArgument`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// let storage = quorumlock::FencedRedis::new(&data.url(0)?)?;
    /// let lock = manager.lock("audit").await?;
    /// storage.push(&lock.fence()?, "audit:log", "opened").await?;
    /// storage.push(&lock.fence()?, "audit:log", "closed").await?;
    /// assert_eq!(storage.list("audit:log").await?, ["opened", "closed"]);
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    pub async fn list(&self, key: &str) -> Result<Vec<String>> {
        data_key(key)?;
        let key = key.to_owned();
        Ok(self
            .node
            .request(self.timeout, move |mut conn| async move {
                redis::cmd("LRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await
            })
            .await?)
    }

    /// The highest token accepted so far for `resource`, if any.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// let storage = quorumlock::FencedRedis::new(&data.url(0)?)?;
    /// assert_eq!(storage.highest_token("cart:5").await?, None);
    /// let lock = manager.lock("cart:5").await?;
    /// let fence = lock.fence()?;
    /// storage.set(&fence, "cart:5:items", "3").await?;
    /// assert_eq!(storage.highest_token("cart:5").await?, Some(fence.token()));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    pub async fn highest_token(&self, resource: &str) -> Result<Option<FencingToken>> {
        let key = fenced_token_key(resource);
        let highest: Option<u64> = self
            .node
            .request(self.timeout, move |mut conn| async move {
                redis::cmd("GET").arg(&key).query_async(&mut conn).await
            })
            .await?;
        Ok(highest.map(FencingToken::new))
    }

    /// Reads `key` without a fence. Enough for a value that is not written
    /// back; a holder that writes based on what it read must read with
    /// [`read`](Self::read), or a stale holder's write in between is lost.
    /// A `key` starting with [`FENCED_TOKEN_PREFIX`] is
    /// [`Error::InvalidArgument`] (read the highest token with
    /// [`highest_token`](Self::highest_token)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> quorumlock::Result<()> {
    /// # let cluster = quorumlock::testkit::TestCluster::start(3)?;
    /// # let manager = quorumlock::LockManager::builder().nodes(cluster.urls()).node_timeout(std::time::Duration::from_millis(500)).build()?;
    /// # let data = quorumlock::testkit::TestCluster::start(1)?;
    /// let storage = quorumlock::FencedRedis::new(&data.url(0)?)?;
    /// assert_eq!(storage.get("cart:5:items").await?, None);
    /// let lock = manager.lock("cart:5").await?;
    /// storage.set(&lock.fence()?, "cart:5:items", "3").await?;
    /// assert_eq!(storage.get("cart:5:items").await?.as_deref(), Some("3"));
    /// # lock.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    pub async fn get(&self, key: &str) -> Result<Option<String>> {
        data_key(key)?;
        let key = key.to_owned();
        Ok(self
            .node
            .request(self.timeout, move |mut conn| async move {
                redis::cmd("GET").arg(&key).query_async(&mut conn).await
            })
            .await?)
    }

    async fn write(&self, fence: &Fence, key: &str, write: Write<'_>) -> Result<()> {
        data_key(key)?;
        let (resource, token) = (fence.resource(), fence.token());
        let token_key = fenced_token_key(resource);
        let reply = self
            .node
            .request(self.timeout, |mut conn| async move {
                let mut invocation = scripts::FENCED_WRITE.key(&token_key);
                invocation.key(key).arg(token.get());
                match write {
                    Write::Set(bytes) => invocation.arg("set").arg(bytes),
                    Write::Push(bytes) => invocation.arg("push").arg(bytes),
                    Write::Delete => invocation.arg("del").arg(""),
                };
                invocation.invoke_async(&mut conn).await
            })
            .await;
        let (written, highest): (i64, String) = reply.map_err(|e| script_error(resource, e))?;
        match (written, highest.parse::<u64>()) {
            (1, _) => Ok(()),
            (0, Ok(highest)) => Err(fenced_out(fence, highest)),
            _ => Err(self.unexpected(format!("fenced write answered [{written}, {highest:?}]"))),
        }
    }

    /// Runs the fenced read (`fenced_read.lua`): check, claim, read.
    async fn claim<T: redis::FromRedisValue>(
        &self,
        fence: &Fence,
        key: &str,
        read: Read,
    ) -> Result<T> {
        data_key(key)?;
        let (resource, token) = (fence.resource(), fence.token());
        let token_key = fenced_token_key(resource);
        let reply = self
            .node
            .request(self.timeout, |mut conn| async move {
                let what = match read {
                    Read::String => "get",
                    Read::List => "list",
                };
                scripts::FENCED_READ
                    .key(&token_key)
                    .key(key)
                    .arg(token.get())
                    .arg(what)
                    .invoke_async(&mut conn)
                    .await
            })
            .await;
        let (read, value): (i64, redis::Value) = reply.map_err(|e| script_error(resource, e))?;
        let answered = |value: &redis::Value| format!("fenced read answered [{read}, {value:?}]");
        match read {
            1 => redis::from_redis_value_ref(&value).map_err(|_| self.unexpected(answered(&value))),
            0 => match redis::from_redis_value_ref::<String>(&value).map(|h| h.parse::<u64>()) {
                Ok(Ok(highest)) => Err(fenced_out(fence, highest)),
                _ => Err(self.unexpected(answered(&value))),
            },
            _ => Err(self.unexpected(answered(&value))),
        }
    }

    /// A reply of the storage that makes no sense.
    fn unexpected(&self, what: String) -> Error {
        Error::Node(crate::error::NodeError {
            node: self.node.name().to_owned(),
            kind: NodeErrorKind::UnexpectedReply(what),
        })
    }
}

/// The refusal of `fence`'s write or read: `highest` was accepted before.
fn fenced_out(fence: &Fence, highest: u64) -> Error {
    Error::FencedOut {
        resource: fence.resource().to_owned(),
        offered: fence.token(),
        highest: FencingToken::new(highest),
    }
}

/// A failed fenced script: an unusable recorded token is named as such.
fn script_error(resource: &str, error: crate::error::NodeError) -> Error {
    match error.kind {
        NodeErrorKind::InvalidCounter(problem) => Error::InvalidCounter {
            resource: resource.to_owned(),
            node: error.node,
            key: fenced_token_key(resource),
            problem,
        },
        _ => Error::Node(error),
    }
}

/// Refuses a data key in the fence's bookkeeping namespace.
fn data_key(key: &str) -> Result<()> {
    if key.starts_with(FENCED_TOKEN_PREFIX) {
        return Err(Error::InvalidArgument {
            argument: "key",
            reason: format!(
                "`{key}` starts with `{FENCED_TOKEN_PREFIX}`, where the storage keeps the highest \
                 token accepted for each resource: writing or deleting it would let older \
                 tokens pass; keep the data under another prefix (the resource's name, say), \
                 and read a resource's highest token with `highest_token`"
            ),
        });
    }
    Ok(())
}

/// What a fenced write does once the token passes.
#[derive(Clone, Copy)]
enum Write<'a> {
    Set(&'a [u8]),
    Push(&'a [u8]),
    Delete,
}

/// What a fenced read reads once the token passes.
#[derive(Clone, Copy)]
enum Read {
    String,
    List,
}

/// The storage key holding the highest token accepted for `resource`.
pub(crate) fn fenced_token_key(resource: &str) -> String {
    format!("{FENCED_TOKEN_PREFIX}{resource}")
}
