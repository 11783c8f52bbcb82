//! The storage side of fencing for data kept in Redis: a write (set, delete
//! or append) goes through only if its token is at least the highest token the storage
//! has accepted for the resource, checked and applied in one atomic script.
//!
//! This is the check that makes a paused, expired lock holder harmless. It
//! runs on the storage Redis (not on the lock nodes) and needs no lock
//! handle, only the token, so any process that got a token can use it.

use std::sync::Arc;
use std::time::Duration;

use crate::config::parse_node_url;
use crate::error::{Error, NodeErrorKind, Result};
use crate::fencing::FencingToken;
use crate::guard::NodeWatch;
use crate::health::Reporter;
use crate::node::Node;
use crate::scripts;

/// Prefix of the key, on the storage Redis, holding the highest token
/// accepted for a resource.
pub const FENCED_TOKEN_PREFIX: &str = "quorumlock:fenced:";

/// Default bound on one storage request, connection included.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Fenced writes to one Redis server holding the protected data.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> quorumlock::Result<()> {
/// # let nodes = quorumlock::testkit::TestCluster::start(3)?;
/// # let manager = quorumlock::LockManager::builder().nodes(nodes.urls()).build()?;
/// # let data = quorumlock::testkit::TestCluster::start(1)?;
/// # let storage_url = data.url(0)?;
/// use quorumlock::{Error, FencedRedis};
///
/// let storage = FencedRedis::new(&storage_url)?;
/// let old = manager.lock("order:123").await?;
/// let stale = old.token().expect("fencing is on by default");
/// old.release().await?;
///
/// let lock = manager.lock("order:123").await?;
/// let token = lock.token().expect("fencing is on by default");
/// storage.set("order:123", "order:123:state", "paid", token).await?;
/// // A holder with an older token is refused, and writes nothing.
/// match storage.set("order:123", "order:123:state", "cancelled", stale).await {
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
    pub fn new(url: &str) -> Result<Self> {
        let spec = parse_node_url(url).map_err(|reason| Error::InvalidArgument {
            argument: "url",
            reason,
        })?;
        Ok(Self {
            node: Arc::new(Node::new(
                spec.name.clone(),
                spec.client,
                DEFAULT_TIMEOUT,
                NodeWatch::off(spec.name),
                Reporter::none(),
            )),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Bound on each request, connection included (default 1 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets `key` to `value` if `token` is at least the highest token
    /// accepted for `resource`, and records `token` as the highest.
    /// Otherwise returns [`Error::FencedOut`] with the highest token, and
    /// writes nothing. Equal tokens pass: a holder may write many times.
    ///
    /// # Cancel safety
    ///
    /// The check and the write are one script, run whole or not at all: if
    /// the future is dropped, the write either happened completely (data
    /// and highest token) or not at all, and a script already sent still
    /// runs. Nothing else is left behind.
    pub async fn set(
        &self,
        resource: &str,
        key: &str,
        value: impl AsRef<[u8]>,
        token: FencingToken,
    ) -> Result<()> {
        self.write(resource, key, Write::Set(value.as_ref()), token)
            .await
    }

    /// Deletes `key` under the same rule as [`set`](Self::set).
    ///
    /// # Cancel safety
    ///
    /// The check and the write are one script, run whole or not at all: if
    /// the future is dropped, the write either happened completely (data
    /// and highest token) or not at all, and a script already sent still
    /// runs. Nothing else is left behind.
    pub async fn delete(&self, resource: &str, key: &str, token: FencingToken) -> Result<()> {
        self.write(resource, key, Write::Delete, token).await
    }

    /// Appends `value` to the list at `key` (RPUSH) under the same rule as
    /// [`set`](Self::set): an append-only log in which no stale holder can
    /// append after a newer one.
    ///
    /// # Cancel safety
    ///
    /// The check and the write are one script, run whole or not at all: if
    /// the future is dropped, the write either happened completely (data
    /// and highest token) or not at all, and a script already sent still
    /// runs. Nothing else is left behind.
    pub async fn push(
        &self,
        resource: &str,
        key: &str,
        value: impl AsRef<[u8]>,
        token: FencingToken,
    ) -> Result<()> {
        self.write(resource, key, Write::Push(value.as_ref()), token)
            .await
    }

    /// The list at `key` (unfenced read).
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    pub async fn list(&self, key: &str) -> Result<Vec<String>> {
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

    /// Reads `key` (unfenced: reads cannot harm the data).
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it changes nothing.
    pub async fn get(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_owned();
        Ok(self
            .node
            .request(self.timeout, move |mut conn| async move {
                redis::cmd("GET").arg(&key).query_async(&mut conn).await
            })
            .await?)
    }

    async fn write(
        &self,
        resource: &str,
        key: &str,
        write: Write<'_>,
        token: FencingToken,
    ) -> Result<()> {
        if resource.is_empty() {
            return Err(Error::InvalidArgument {
                argument: "resource",
                reason: "the resource name is empty; use the name the lock was taken on".into(),
            });
        }
        let token_key = fenced_token_key(resource);
        let reply: Result<(i64, String)> = self
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
            .await
            .map_err(|error| match error.kind {
                NodeErrorKind::InvalidCounter(problem) => Error::InvalidCounter {
                    resource: resource.to_owned(),
                    node: error.node,
                    key: fenced_token_key(resource),
                    problem,
                },
                _ => Error::Node(error),
            });
        let (written, highest) = reply?;
        match (written, highest.parse::<u64>()) {
            (1, _) => Ok(()),
            (0, Ok(highest)) => Err(Error::FencedOut {
                resource: resource.to_owned(),
                offered: token,
                highest: FencingToken::new(highest),
            }),
            _ => Err(Error::Node(crate::error::NodeError {
                node: self.node.name().to_owned(),
                kind: NodeErrorKind::UnexpectedReply(format!(
                    "fenced write answered [{written}, {highest:?}]"
                )),
            })),
        }
    }
}

/// What a fenced write does once the token passes.
#[derive(Clone, Copy)]
enum Write<'a> {
    Set(&'a [u8]),
    Push(&'a [u8]),
    Delete,
}

/// The storage key holding the highest token accepted for `resource`.
fn fenced_token_key(resource: &str) -> String {
    format!("{FENCED_TOKEN_PREFIX}{resource}")
}
