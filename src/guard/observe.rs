//! Reading what the guard needs from a node: `INFO` and the fsync policy
//! on connect, `TIME` samples on the way.

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::judge::{ClockSample, DATA_SET_KEY, DATA_SET_SEQ_KEY, DataSet, NodeFacts, Reported};
use crate::reply_error::{authentication_failure, is_connection_failure, redis_error_kind};
use crate::scripts;

/// Facts from the text of an `INFO` reply (the default sections):
/// identity, uptime, AOF on or off, memory limit and policy, role.
///
/// ```
/// use quorumlock::internals::facts_from_info;
///
/// let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n# Replication\r\nrole:master\r\n";
/// let facts = facts_from_info("127.0.0.1:7001", info);
/// assert_eq!(facts.version.as_deref(), Some("7.0.15"));
/// assert_eq!(facts.role.as_deref(), Some("master"));
/// ```
pub fn facts_from_info(name: &str, info: &str) -> NodeFacts {
    let mut facts = NodeFacts::named(name);
    for (key, value) in info
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.trim().split_once(':'))
    {
        match key {
            "redis_version" => facts.version = Some(value.to_owned()),
            "run_id" => facts.run_id = Some(value.to_owned()),
            "uptime_in_seconds" => {
                facts.uptime = value.parse().ok().map(Reported::whole_seconds);
            }
            "aof_enabled" => facts.appendonly = Some(value == "1"),
            "maxmemory" => facts.maxmemory = value.parse().ok(),
            "maxmemory_policy" => facts.maxmemory_policy = Some(value.to_owned()),
            "role" => facts.role = Some(value.to_owned()),
            "connected_slaves" => facts.replicas = value.parse().ok(),
            "master_replid" => facts.replid = Some(value.to_owned()),
            "second_repl_offset" => facts.promoted = value.parse::<i64>().ok().map(|o| o >= 0),
            "loading" => facts.loading = Some(value == "1"),
            "aof_last_write_status" => facts.aof_write_ok = Some(value == "ok"),
            "aof_rewrite_in_progress" | "aof_rewrite_scheduled" => {
                facts.aof_rewriting = Some(facts.aof_rewriting == Some(true) || value == "1");
            }
            _ => {}
        }
    }
    facts
}

/// Facts from the reply of the observation script (`observe.lua`) and of
/// `CONFIG GET appendfsync`: the `INFO` fields, and the data set's mark.
/// A failed script (INFO or EVALSHA refused, `-BUSY`) is an observation
/// that failed, and why.
pub(crate) fn facts_from_observation(
    name: &str,
    observed: Result<Value, String>,
    fsync: Option<String>,
) -> Result<NodeFacts, String> {
    let observed = observed?;
    let parts = match &observed {
        Value::Array(parts) => parts.as_slice(),
        _ => &[],
    };
    let malformed = || format!("the observation script answered {observed:?}");
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
        _ => None,
    };
    let number = |value: &Value| match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    let [info, mark, now_ms, seq, raised] = parts else {
        return Err(malformed());
    };
    let Some(info) = text(info) else {
        return Err(malformed());
    };
    let mut facts = facts_from_info(name, &info);
    if facts.run_id.is_none() {
        return Err("INFO shows no run_id".to_owned());
    }
    facts.appendfsync = fsync;
    facts.dataset = match (text(mark), number(now_ms), number(seq), number(raised)) {
        (Some(mark), Some(now_ms), Some(seq), Some(raised)) => {
            DataSet::from_mark(&mark, now_ms, seq).map(|data| data.raised_to(raised))
        }
        _ => None,
    };
    Ok(facts)
}

/// Why an observation failed, as words (an ACL refusal named as such).
pub(crate) fn failure(error: &redis::RedisError) -> String {
    format!("the observation failed: {}", redis_error_kind(error))
}

/// A fresh random id for a data set's mark.
pub(crate) fn fresh_mark_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// The fsync policy a `CONFIG GET appendfsync no-appendfsync-on-rewrite`
/// reply gives, as [`NodeFacts::appendfsync`](super::judge::NodeFacts)
/// keeps it: the `appendfsync` setting, unless it is `always` and
/// `no-appendfsync-on-rewrite` is on, which skips the fsync of every write
/// while a rewrite runs: then words that say so (not "always": such a node
/// does not persist every write).
///
/// ```
/// use redis::Value;
/// use quorumlock::internals::judge::fsync_policy;
///
/// let reply = |on_rewrite: &str| Value::Array(
///     ["appendfsync", "always", "no-appendfsync-on-rewrite", on_rewrite]
///         .map(|s| Value::BulkString(s.into()))
///         .to_vec(),
/// );
/// assert_eq!(fsync_policy(Some(&reply("no"))).as_deref(), Some("always"));
/// assert!(fsync_policy(Some(&reply("yes"))).is_some_and(|p| p != "always"));
/// ```
pub fn fsync_policy(reply: Option<&Value>) -> Option<String> {
    let pairs: Vec<(String, String)> = match reply? {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| Some((bulk_text(pair.first()?)?, bulk_text(pair.get(1)?)?)))
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(key, value)| Some((bulk_text(key)?, bulk_text(value)?)))
            .collect(),
        _ => return None,
    };
    let setting = |name: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let fsync = setting("appendfsync")?;
    Some(match setting("no-appendfsync-on-rewrite") {
        Some("yes") if fsync == "always" => {
            "always, but not while a rewrite runs (no-appendfsync-on-rewrite yes)".to_owned()
        }
        _ => fsync.to_owned(),
    })
}

fn bulk_text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// The value of a `CONFIG GET <name>` reply.
pub(crate) fn config_value(reply: Option<&Value>) -> Option<String> {
    match reply? {
        Value::Array(pair) => match pair.get(1)? {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            _ => None,
        },
        Value::Map(pairs) => match &pairs.first()?.1 {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            _ => None,
        },
        _ => None,
    }
}

/// The names of a server's mark and number: [`DATA_SET_KEY`](super::judge::DATA_SET_KEY) and
/// [`DATA_SET_SEQ_KEY`](super::judge::DATA_SET_SEQ_KEY) on a standalone server; on a shard master of a
/// Redis Cluster, the same names with a hash tag of a slot the shard
/// serves (`quorumlock:node:{1234}`), since a script there may only touch
/// its own slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSetKeys {
    /// The mark's key.
    pub mark: String,
    /// The number's key.
    pub seq: String,
}

impl DataSetKeys {
    /// A standalone server's.
    pub fn standalone() -> Self {
        Self {
            mark: DATA_SET_KEY.to_owned(),
            seq: DATA_SET_SEQ_KEY.to_owned(),
        }
    }

    /// A shard master's that serves `slot`.
    pub fn in_slot(slot: u16) -> Self {
        let tag = crate::slots::tag_for_slot(slot);
        Self {
            mark: format!("{DATA_SET_KEY}:{{{tag}}}"),
            seq: format!("{DATA_SET_KEY}:{{{tag}}}:seq"),
        }
    }

    /// The slot both live in (`None` on a standalone server: no tag).
    pub(crate) fn slot(&self) -> Option<u16> {
        crate::keys::hash_tag(&self.mark).map(|_| crate::keys::slot(&self.mark))
    }
}

/// What a connection learns of its node, in one round trip: the
/// observation script (INFO and the data set's mark, whose number it
/// raises if `raise`), `CONFIG GET appendfsync no-appendfsync-on-rewrite`
/// and `TIME`, pipelined. A
/// forbidden `CONFIG` leaves the fsync policy unknown; a script that fails
/// leaves the node unobserved; a connection that fails is an error (the
/// node is not reachable, which says nothing of what it keeps).
pub(crate) async fn observe(
    name: &str,
    conn: &MultiplexedConnection,
    data_set: &DataSetKeys,
    raise: bool,
) -> redis::RedisResult<(Result<NodeFacts, String>, Option<ClockSample>)> {
    let (mut script_conn, mut config_conn) = (conn.clone(), conn.clone());
    let observed = async move {
        scripts::OBSERVE
            .key(&data_set.mark)
            .key(&data_set.seq)
            .arg(fresh_mark_id())
            .arg(u8::from(raise))
            .invoke_async::<Value>(&mut script_conn)
            .await
    };
    let fsync = async move {
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .arg("no-appendfsync-on-rewrite")
            .query_async::<Value>(&mut config_conn)
            .await
            .ok()
    };
    let (observed, fsync, sample) = futures::join!(observed, fsync, read_clock(conn));
    let sample = sample.ok().flatten();
    let observed = match observed {
        // Refused for our credentials: no connection, not a node to
        // quarantine.
        Err(broke) if is_connection_failure(&broke) || authentication_failure(&broke).is_some() => {
            return Err(broke);
        }
        observed => observed.map_err(|error| failure(&error)),
    };
    let facts = facts_from_observation(name, observed, fsync_policy(fsync.as_ref()));
    Ok((facts, sample))
}

/// `TIME` on `conn`: the sample, `None` if the reply or the connection
/// failed (a busy node, a broken link), `Err(())` if the node refuses the
/// command for good (see [`time_refused`]).
pub(crate) async fn read_clock(conn: &MultiplexedConnection) -> Result<Option<ClockSample>, ()> {
    let mut conn = conn.clone();
    let sent = Instant::now();
    let reply: Value = match redis::cmd("TIME").query_async(&mut conn).await {
        Ok(reply) => reply,
        Err(error) if time_refused(error.code(), &error.to_string()) => return Err(()),
        Err(_) => return Ok(None),
    };
    let received = Instant::now();
    Ok(micros_of(&reply).map(|server_us| ClockSample {
        server_us,
        sent,
        received,
    }))
}

/// Whether an error answering `TIME` (its code, its text) refuses the
/// command for good: an ACL without `+time` (`NOPERM`), or a command
/// renamed or disabled (`ERR unknown command`). Anything else (`BUSY`, a
/// node loading, a broken link) is a reading that failed this time.
pub(crate) fn time_refused(code: Option<&str>, text: &str) -> bool {
    match code {
        Some("NOPERM") => true,
        Some("ERR") => text.contains("unknown command"),
        _ => false,
    }
}

/// Microseconds since the epoch from a `TIME` reply (seconds and
/// microseconds, as two bulk strings).
pub(crate) fn micros_of(reply: &Value) -> Option<u64> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let number = |value: &Value| match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse::<u64>().ok(),
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    match parts.as_slice() {
        [secs, micros] => number(secs)?
            .checked_mul(1_000_000)?
            .checked_add(number(micros)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_fields_become_facts() {
        let text = "# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\nuptime_in_seconds:42\r\n\
                    \r\n# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n\
                    # Persistence\r\naof_enabled:1\r\n# Replication\r\nrole:master\r\n\
                    connected_slaves:0\r\n";
        let facts = facts_from_info("n:1", text);
        assert_eq!(facts.name, "n:1");
        assert_eq!(facts.version.as_deref(), Some("7.0.15"));
        assert_eq!(facts.run_id.as_deref(), Some("abc"));
        assert_eq!(facts.uptime, Some(Reported::whole_seconds(42)));
        assert_eq!(facts.appendonly, Some(true));
        assert_eq!(facts.maxmemory, Some(0));
        assert_eq!(facts.maxmemory_policy.as_deref(), Some("noeviction"));
        assert_eq!(facts.role.as_deref(), Some("master"));
        assert_eq!(facts.replicas, Some(0));
        assert_eq!(facts.appendfsync, None, "not in INFO");
    }

    #[test]
    fn time_replies_read_as_micros() {
        let reply = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        assert_eq!(micros_of(&reply), Some(1_700_000_000_123_456));
        assert_eq!(micros_of(&Value::Nil), None);
        assert_eq!(
            micros_of(&Value::Array(vec![Value::BulkString(b"x".to_vec())])),
            None
        );
    }
}
