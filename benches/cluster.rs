//! Members that are Redis Clusters against standalone members, in one run:
//! uncontended lock + release latency (interleaved rounds), and where the
//! server CPU of a steady load goes (per shard master, from `INFO
//! commandstats`). Three members of each kind, default settings (node
//! guard on, counter-node fencing), every node with AOF `appendfsync
//! always` as the testkit starts it.
//!
//!     cargo bench --bench cluster -- [rounds] [ops per round] [load seconds]
//!
//! Defaults: 7 rounds of 300 operations, 3 s of load with 16 tasks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumlock::LockManager;
use quorumlock::testkit::{ClusterMember, TestCluster};

fn manager(urls: Vec<String>) -> LockManager {
    LockManager::builder()
        .tcp_nodelay(quorumlock::bench::nodelay())
        .nodes(urls)
        .node_timeout(Duration::from_millis(200))
        .build()
        .expect("valid settings")
}

/// `ops` uncontended lock + release on distinct resources; the median
/// latency in µs.
async fn median_latency(manager: &LockManager, round: usize, ops: usize) -> f64 {
    let mut samples = Vec::with_capacity(ops);
    for i in 0..ops {
        let resource = format!("bench:{round}:{i}");
        let started = Instant::now();
        let lock = manager.lock(&resource).no_wait().await.expect("lock");
        lock.release().await.expect("release");
        samples.push(started.elapsed().as_secs_f64() * 1e6);
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Microseconds of server CPU spent in each command so far on `url`.
fn command_usec(url: &str) -> BTreeMap<String, u64> {
    command_stats(url)
        .into_iter()
        .map(|(name, (_, usec))| (name, usec))
        .collect()
}

/// Calls of each command so far on `url`, and the microseconds they took.
fn command_stats(url: &str) -> BTreeMap<String, (u64, u64)> {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect");
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .expect("INFO");
    text.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| -> Option<u64> {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            Some((name.to_owned(), (field("calls")?, field("usec")?)))
        })
        .collect()
}

fn lock_usec(url: &str) -> u64 {
    let usec = command_usec(url);
    ["evalsha", "set", "time", "eval"]
        .iter()
        .filter_map(|c| usec.get(*c))
        .sum()
}

/// `tasks` tasks doing lock + release on their own resources for `length`;
/// the operations done.
async fn load(manager: &LockManager, tasks: usize, length: Duration) -> u64 {
    let end = Instant::now() + length;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let manager = manager.clone();
            tokio::spawn(async move {
                let mut done = 0u64;
                while Instant::now() < end {
                    let resource = format!("load:{task}:{done}");
                    if let Ok(lock) = manager.lock(&resource).no_wait().await {
                        let _ = lock.release().await;
                        done += 1;
                    }
                }
                done
            })
        })
        .collect();
    let mut total = 0;
    for handle in handles {
        total += handle.await.expect("task");
    }
    total
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let number =
        |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (rounds, ops, seconds) = (number(0, 7) as usize, number(1, 300) as usize, number(2, 3));

    let standalone = TestCluster::start(3).expect("standalone nodes");
    let members: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start(3, 0).expect("a cluster member"))
        .collect();
    let cluster_urls: Vec<String> = members.iter().map(|m| m.url().expect("url")).collect();
    let on_servers = Arc::new(manager(standalone.urls()));
    let on_clusters = Arc::new(manager(cluster_urls));
    // Connections, slot maps and first observations, before measuring.
    median_latency(&on_servers, usize::MAX, 50).await;
    median_latency(&on_clusters, usize::MAX - 1, 50).await;

    let (mut servers, mut clusters) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Interleaved, the order alternating, so drift hits both alike.
        if round % 2 == 0 {
            servers.push(median_latency(&on_servers, round, ops).await);
            clusters.push(median_latency(&on_clusters, round, ops).await);
        } else {
            clusters.push(median_latency(&on_clusters, round, ops).await);
            servers.push(median_latency(&on_servers, round, ops).await);
        }
    }
    let (servers_p50, clusters_p50) = (median(servers.clone()), median(clusters.clone()));
    println!("uncontended lock + release, p50 per round of {ops} (µs), {rounds} rounds:");
    println!("  standalone members: {servers:.0?}");
    println!("  cluster members:    {clusters:.0?}");
    println!(
        "  median p50: standalone {servers_p50:.0} µs, cluster {clusters_p50:.0} µs, ratio {:.3}",
        clusters_p50 / servers_p50
    );

    let shard_urls = members[0].nodes().urls();
    let before: Vec<u64> = shard_urls.iter().map(|u| lock_usec(u)).collect();
    let server_before = lock_usec(&standalone.urls()[0]);
    let length = Duration::from_secs(seconds);
    let on_cluster_ops = load(&on_clusters, 16, length).await;
    let on_server_ops = load(&on_servers, 16, length).await;
    let spent: Vec<u64> = shard_urls
        .iter()
        .zip(&before)
        .map(|(u, b)| lock_usec(u) - b)
        .collect();
    let server_spent = lock_usec(&standalone.urls()[0]) - server_before;
    let total: u64 = spent.iter().sum();
    println!("steady load, 16 tasks, {seconds} s each:");
    println!(
        "  standalone member 0: {on_server_ops} ops, {server_spent} µs of lock commands \
         ({:.1} µs per op)",
        server_spent as f64 / on_server_ops as f64
    );
    println!(
        "  cluster member 0: {on_cluster_ops} ops, {total} µs of lock commands \
         ({:.1} µs per op), per shard master:",
        total as f64 / on_cluster_ops as f64
    );
    for (url, usec) in shard_urls.iter().zip(&spent) {
        println!(
            "    {url}: {usec} µs ({:.0} %)",
            100.0 * *usec as f64 / total.max(1) as f64
        );
    }
    println!("  by command since start (calls, µs per call): standalone node 0 | cluster shard 0");
    let (a, b) = (
        command_stats(&standalone.urls()[0]),
        command_stats(&shard_urls[0]),
    );
    for name in ["evalsha", "set", "time"] {
        let show = |stats: &BTreeMap<String, (u64, u64)>| {
            let (calls, usec) = stats.get(name).copied().unwrap_or((0, 0));
            format!("{calls:>7} × {:>5.1}", usec as f64 / calls.max(1) as f64)
        };
        println!("    {name:<8} {} | {}", show(&a), show(&b));
    }
}
