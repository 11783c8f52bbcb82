//! Reading what the guard needs from a node: `INFO` and the fsync policy
//! on connect, `TIME` samples on the way.

use std::time::Duration;

use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use super::judge::{ClockSample, NodeFacts};

/// Facts from the text of an `INFO` reply (the default sections):
/// identity, uptime, AOF on or off, memory limit and policy, role.
///
/// ```
/// use quorumlock::guard::facts_from_info;
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
                facts.uptime = value.parse().ok().map(Duration::from_secs);
            }
            "aof_enabled" => facts.appendonly = Some(value == "1"),
            "maxmemory" => facts.maxmemory = value.parse().ok(),
            "maxmemory_policy" => facts.maxmemory_policy = Some(value.to_owned()),
            "role" => facts.role = Some(value.to_owned()),
            "connected_slaves" => facts.replicas = value.parse().ok(),
            _ => {}
        }
    }
    facts
}

/// What a fresh connection learns of its node, in one round trip: `INFO`,
/// `CONFIG GET appendfsync` and `TIME`, pipelined (with the scripts'
/// preload). Each may fail on its own (a forbidden `CONFIG` leaves the
/// fsync policy unknown).
pub(crate) async fn observe(
    name: &str,
    conn: &MultiplexedConnection,
) -> (NodeFacts, Option<ClockSample>) {
    let (mut info_conn, mut config_conn) = (conn.clone(), conn.clone());
    let info = async move {
        // Only the sections we read (cheaper for the server than all of
        // them); servers before 7.0 take one section, and then get asked
        // for the default set.
        let mut sections = redis::cmd("INFO");
        sections.arg(&["server", "persistence", "memory", "replication"]);
        match sections.query_async::<String>(&mut info_conn).await {
            Ok(text) => Some(text),
            Err(_) => redis::cmd("INFO")
                .query_async::<String>(&mut info_conn)
                .await
                .ok(),
        }
    };
    let fsync = async move {
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query_async::<Vec<String>>(&mut config_conn)
            .await
            .ok()
            .and_then(|pair| pair.into_iter().nth(1))
    };
    let (info, fsync, sample) = futures::join!(info, fsync, clock_sample(conn));
    let mut facts = match info {
        Some(text) => facts_from_info(name, &text),
        None => NodeFacts::named(name),
    };
    facts.appendfsync = fsync;
    (facts, sample)
}

/// One `TIME` sample of the node's clock.
async fn clock_sample(conn: &MultiplexedConnection) -> Option<ClockSample> {
    let mut conn = conn.clone();
    let sent = Instant::now();
    let reply: Value = redis::cmd("TIME").query_async(&mut conn).await.ok()?;
    let received = Instant::now();
    Some(ClockSample {
        server_us: micros_of(&reply)?,
        sent,
        received,
    })
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
        assert_eq!(facts.uptime, Some(Duration::from_secs(42)));
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
