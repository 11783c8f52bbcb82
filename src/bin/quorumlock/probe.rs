//! Direct, bounded reads from one node, for `status` and `doctor`.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue};
use tokio::time::Instant;

use quorumlock::internals::judge::{DataSet, DataSetKeys};

use crate::NodeArgs;

/// Bound on connecting to a node and on each read from it.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to one node for inspection.
pub struct Probe {
    /// `host:port`.
    pub name: String,
    conn: MultiplexedConnection,
    /// Where the node guard keeps its mark on this node.
    data_set: DataSetKeys,
}

impl Probe {
    /// Connects within [`PROBE_TIMEOUT`], with the TLS flags of `nodes`.
    pub async fn connect(url: &str, nodes: &NodeArgs) -> Result<Self, String> {
        let client = nodes.client(url)?;
        let name = client.get_connection_info().addr().to_string();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(PROBE_TIMEOUT))
            .set_response_timeout(Some(PROBE_TIMEOUT));
        let conn = tokio::time::timeout(
            PROBE_TIMEOUT,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| format!("{name}: no connection within {PROBE_TIMEOUT:?}"))?
        .map_err(|e| format!("{name}: {e}"))?;
        Ok(Self {
            name,
            conn,
            data_set: DataSetKeys::standalone(),
        })
    }

    /// The same probe of a shard master of a Redis Cluster, whose mark is
    /// at `data_set` (see `members`).
    pub fn with_data_set(mut self, data_set: DataSetKeys) -> Self {
        self.data_set = data_set;
        self
    }

    /// Runs `cmd` within [`PROBE_TIMEOUT`].
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, String> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(PROBE_TIMEOUT, cmd.query_async(&mut conn))
            .await
            .map_err(|_| format!("no reply within {PROBE_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())
    }

    /// Runs a script within [`PROBE_TIMEOUT`].
    pub async fn invoke<T: FromRedisValue>(
        &self,
        script: &redis::ScriptInvocation<'_>,
    ) -> Result<T, String> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(PROBE_TIMEOUT, script.invoke_async(&mut conn))
            .await
            .map_err(|_| format!("no reply within {PROBE_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())
    }

    /// The round-trip time of one PING.
    pub async fn ping(&self) -> Result<Duration, String> {
        let started = Instant::now();
        let _: String = self.query(&redis::cmd("PING")).await?;
        Ok(started.elapsed())
    }

    /// A configuration value, or `None` where CONFIG is disabled or unknown.
    pub async fn config(&self, name: &str) -> Option<String> {
        let pair: Vec<String> = self
            .query(redis::cmd("CONFIG").arg("GET").arg(name))
            .await
            .ok()?;
        pair.into_iter().nth(1)
    }

    /// The node's data set as the node guard's mark tells (read only: a
    /// node never observed by a client has no mark, and gets none here).
    pub async fn data_set(&self) -> Option<DataSet> {
        let mut read = redis::pipe();
        read.cmd("GET")
            .arg(&self.data_set.mark)
            .cmd("GET")
            .arg(&self.data_set.seq)
            .cmd("TIME");
        let (mark, seq, (secs, micros)): (Option<String>, Option<u64>, (u64, u64)) =
            self.query_pipe(&read).await.ok()?;
        DataSet::from_mark(&mark?, secs * 1000 + micros / 1000, seq.unwrap_or(0))
    }

    async fn query_pipe<T: FromRedisValue>(&self, pipe: &redis::Pipeline) -> Result<T, String> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(PROBE_TIMEOUT, pipe.query_async(&mut conn))
            .await
            .map_err(|_| format!("no reply within {PROBE_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())
    }
}
