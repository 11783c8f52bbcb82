//! Latency of one uncontended lock + release on a five-node cluster, beside
//! the floors it is built from, measured in the same run:
//!
//! - `floor: 1 node`: `SET NX PX` + `DEL` on one node through redis-rs;
//! - `floor: 5 nodes`: the same sent to all five nodes at once, waiting for
//!   every reply;
//! - `quorumlock, fencing …`: `lock` + `release` through this crate, in each
//!   fencing mode (off; counter node, the default; quorum, two round trips).
//!
//! The scenarios take turns, one operation each, so drifting noise on a
//! shared machine hits them alike and their ratios hold.
//!
//!     cargo bench --bench latency
//!
//! Env: `QUORUMLOCK_NODES` (use running nodes instead of a local cluster),
//! `QUORUMLOCK_BENCH_ITERS` (operations per scenario, default 3000).

use std::time::{Duration, Instant};

use futures::future::join_all;
use quorumlock::testkit::local_or_env;
use quorumlock::{Fencing, LockManager};
use redis::aio::MultiplexedConnection;

const WARMUP: usize = 200;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("bench failed: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let iterations: usize = std::env::var("QUORUMLOCK_BENCH_ITERS")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or(3000);
    let nodes = local_or_env(5)?;
    let mut connections = Vec::new();
    for url in &nodes.urls {
        connections.push(
            redis::Client::open(url.as_str())?
                .get_multiplexed_async_connection()
                .await?,
        );
    }
    let mut managers = Vec::new();
    for fencing in [Fencing::Off, Fencing::default(), Fencing::Quorum] {
        managers.push(
            LockManager::builder()
                .nodes(nodes.urls.clone())
                .fencing(fencing)
                .build()?,
        );
    }

    let names = [
        "floor: 1 node",
        "floor: 5 nodes",
        "quorumlock, fencing off",
        "quorumlock, counter node",
        "quorumlock, quorum fencing",
    ];
    let mut samples = vec![Vec::new(); names.len()];
    for i in 0..WARMUP + iterations {
        let key = format!("bench:floor:{i}");
        let mut round = vec![
            time(floor(&connections[..1], &key)).await?,
            time(floor(&connections, &key)).await?,
        ];
        for manager in &managers {
            round.push(time(lock_release(manager, &format!("bench:lock:{i}"))).await?);
        }
        if i >= WARMUP {
            for (scenario, sample) in samples.iter_mut().zip(round) {
                scenario.push(sample);
            }
        }
    }

    let base = percentile(&mut samples[0], 0.5);
    println!(
        "lock+release latency, {iterations} ops per scenario, {} nodes",
        nodes.urls.len()
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>16}",
        "scenario", "p50 µs", "p99 µs", "p99.9 µs", "p50 / 1-node"
    );
    for (name, data) in names.iter().zip(samples.iter_mut()) {
        let p50 = percentile(data, 0.5);
        println!(
            "{:<28} {:>10.1} {:>10.1} {:>10.1} {:>15.2}x",
            name,
            micros(p50),
            micros(percentile(data, 0.99)),
            micros(percentile(data, 0.999)),
            p50.as_secs_f64() / base.as_secs_f64()
        );
    }
    Ok(())
}

/// `SET key v NX PX 10000` then `DEL key` on every connection at once.
async fn floor(connections: &[MultiplexedConnection], key: &str) -> redis::RedisResult<()> {
    let sets = connections.iter().map(|conn| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("SET")
                .arg(key)
                .arg("v")
                .arg("NX")
                .arg("PX")
                .arg(10_000)
                .query_async::<Option<String>>(&mut conn)
                .await
        }
    });
    join_all(sets)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let dels = connections.iter().map(|conn| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("DEL")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await
        }
    });
    join_all(dels)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

async fn lock_release(manager: &LockManager, resource: &str) -> quorumlock::Result<()> {
    manager.lock(resource).await?.release().await
}

async fn time<E>(op: impl Future<Output = Result<(), E>>) -> Result<Duration, E> {
    let started = Instant::now();
    op.await?;
    Ok(started.elapsed())
}

fn percentile(data: &mut [Duration], q: f64) -> Duration {
    data.sort_unstable();
    let rank = ((data.len() as f64 - 1.0) * q).round() as usize;
    data[rank.min(data.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
