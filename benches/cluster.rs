//! Members that are Redis Clusters against standalone members, in one run:
//! uncontended lock + release latency (interleaved rounds), and where the
//! server CPU of a steady load goes (per shard master, from `INFO
//! commandstats`). Three members of each kind, default settings (node
//! guard on, counter-node fencing), every node with AOF `appendfsync
//! always` as the testkit starts it.
//!
//! Then how long a client is without a lock after each kind of fault on
//! the shard that serves its resource (a manual failover, a master killed
//! and replaced by its replica, the resource's slot moved to another
//! master, the master stopped past its replica's takeover and resumed):
//! one member of three masters with a replica each and two standalone
//! nodes, one of them down (so every lock needs the member), TTL 2 s,
//! `cluster-node-timeout` 1 s (a window of 3 s). A
//! long-lived manager tries the lock every 20 ms from the fault on; a
//! fresh manager is made once the new owner serves.
//!
//!     cargo bench --bench cluster -- [rounds] [ops per round] [load seconds] [faults of each kind]
//!
//! Defaults: 7 rounds of 300 operations, 3 s of load with 16 tasks, 3
//! faults of each kind (0 skips them).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
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

/// The kinds of fault the unavailability table measures.
#[derive(Debug, Clone, Copy)]
enum Fault {
    ManualFailover,
    MasterKilled,
    /// The master stopped past its replica's takeover, then resumed.
    MasterStalled,
    SlotMoved,
}

/// Tries `resource` every 20 ms (up to 30 s) until granted; when.
async fn first_grant(manager: &LockManager, resource: &str) -> Option<Instant> {
    let limit = Instant::now() + Duration::from_secs(30);
    while Instant::now() < limit {
        if let Ok(lock) = manager.lock(resource).no_wait().await {
            let granted = Instant::now();
            let _ = lock.release().await;
            return Some(granted);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Tries `resource` every 20 ms from now until it is granted after the
/// new owner serves (`serving` set), or 30 s passed; the instants of the
/// grants.
async fn grants_until_served(
    manager: LockManager,
    resource: String,
    serving: Arc<OnceLock<Instant>>,
) -> Vec<Instant> {
    let limit = Instant::now() + Duration::from_secs(30);
    let mut grants = Vec::new();
    while Instant::now() < limit {
        let tried = Instant::now();
        if let Ok(lock) = manager.lock(&resource).no_wait().await {
            grants.push(Instant::now());
            let _ = lock.release().await;
            if serving.get().is_some_and(|&served| tried >= served) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    grants
}

/// Waits (up to 20 s) until `url` answers as a master (a killed master's
/// replica takes over by itself after the node timeout).
async fn master_again(url: &str) -> bool {
    let limit = Instant::now() + Duration::from_secs(20);
    while Instant::now() < limit {
        let role = redis::Client::open(url)
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut conn| redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut conn));
        if let Ok(role) = role
            && matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// One `fault` on the shard of `resource`, in seconds: the longest the
/// long-lived manager went without a grant from the fault until its first
/// attempt after the new owner served was granted; how long after the new
/// owner served that was; and how long a fresh manager made then waited.
async fn unavailability(
    member: &ClusterMember,
    urls: &[String],
    long_lived: &LockManager,
    resource: &str,
    fault: Fault,
) -> Result<(f64, f64, f64), String> {
    let key = quorumlock::internals::key_of(quorumlock::internals::KeyKind::Lock, resource);
    let master = member.master_of(&key).map_err(|e| e.to_string())?;
    let shards = member.shards();
    let replica = shards
        .iter()
        .find(|(m, _)| *m == master)
        .map(|(_, r)| r.clone())
        .ok_or("the resource's shard has no replica in sync")?;
    first_grant(long_lived, resource)
        .await
        .ok_or("no lock before the fault")?;
    let started = Instant::now();
    let served = Arc::new(OnceLock::new());
    let probe = tokio::spawn(grants_until_served(
        long_lived.clone(),
        resource.to_owned(),
        Arc::clone(&served),
    ));
    let killed = match inject(member, fault, &key, &master, &replica, &shards).await {
        Ok(killed) => killed,
        Err(why) => {
            probe.abort();
            return Err(why);
        }
    };
    let serving = Instant::now();
    served.set(serving).expect("set once");
    let fresh = fault_manager(urls.to_vec());
    let fresh_granted = first_grant(&fresh, resource).await;
    let grants = probe.await.map_err(|e| e.to_string())?;
    if let Some(index) = killed {
        // Back as the new master's replica, for the next fault.
        member.nodes().restart(index).map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (Some(&last), Some(fresh_granted)) = (grants.last(), fresh_granted) else {
        return Err("no lock within 30 s of the fault".into());
    };
    if last < serving {
        return Err("the long-lived manager was not granted after the new owner served".into());
    }
    let longest_gap = std::iter::once(started)
        .chain(grants.iter().copied())
        .zip(grants.iter().copied())
        .map(|(before, after)| after - before)
        .max()
        .unwrap_or_default();
    Ok((
        longest_gap.as_secs_f64(),
        (last - serving).as_secs_f64(),
        (fresh_granted - serving).as_secs_f64(),
    ))
}

/// Makes `fault` happen on the shard of `key` (its `master` and in-sync
/// `replica`), and returns once the new owner serves; the index of a
/// killed master, to restart once measured (restarted here if the
/// takeover failed).
async fn inject(
    member: &ClusterMember,
    fault: Fault,
    key: &str,
    master: &str,
    replica: &str,
    shards: &[(String, String)],
) -> Result<Option<usize>, String> {
    match fault {
        Fault::ManualFailover => {
            member
                .manual_failover(master, replica)
                .await
                .map_err(|e| e.to_string())?;
            Ok(None)
        }
        Fault::MasterKilled => {
            let index = member
                .nodes()
                .urls()
                .iter()
                .position(|u| u == master)
                .ok_or("the master is not a node of the member")?;
            member.nodes().kill(index).map_err(|e| e.to_string())?;
            if !master_again(replica).await || !member.settled(replica).await {
                let _ = member.nodes().restart(index);
                return Err(format!("{replica} did not take over"));
            }
            Ok(Some(index))
        }
        Fault::MasterStalled => {
            member
                .stalled_takeover(master, replica)
                .await
                .map_err(|e| e.to_string())?;
            Ok(None)
        }
        Fault::SlotMoved => {
            let to = shards
                .iter()
                .map(|(m, _)| m)
                .find(|m| *m != master)
                .ok_or("no other master")?;
            member
                .move_slot_of(key, to, Duration::ZERO)
                .await
                .map_err(|e| e.to_string())?;
            Ok(None)
        }
    }
}

/// A manager with the default guard and a 2 s TTL (one standalone node
/// is down, so every lock needs the member).
fn fault_manager(urls: Vec<String>) -> LockManager {
    LockManager::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(2))
        .fencing(quorumlock::Fencing::CounterNode { node: 0 })
        .build()
        .expect("valid settings")
}

/// The unavailability table: `each` faults of each kind.
async fn fault_table(each: usize) {
    let member = ClusterMember::start(3, 1).expect("a member with replicas");
    let standalone = TestCluster::start(2).expect("standalone nodes");
    let mut urls = vec![member.url().expect("url")];
    urls.extend(standalone.urls());
    // No lock without the member: the counter node's role fails over, so
    // only a majority that needs the member measures it.
    standalone.kill(1).expect("kill a standalone node");
    let long_lived = fault_manager(urls.clone());
    println!(
        "unavailability after a fault on the resource's shard (TTL 2 s + cluster-node-timeout \
         1 s = window 3 s), s:"
    );
    println!(
        "  fault            long-lived: longest without a lock | granted after the new owner \
         serves | fresh manager made then"
    );
    for fault in [
        Fault::ManualFailover,
        Fault::MasterKilled,
        Fault::MasterStalled,
        Fault::SlotMoved,
    ] {
        let mut rows = Vec::new();
        for i in 0..each {
            let resource = format!("fault:{fault:?}:{i}");
            match unavailability(&member, &urls, &long_lived, &resource, fault).await {
                Ok(row) => rows.push(row),
                Err(why) => println!("  {fault:?} #{i} not measured: {why}"),
            }
        }
        if rows.is_empty() {
            continue;
        }
        let column = |pick: fn(&(f64, f64, f64)) -> f64| median(rows.iter().map(pick).collect());
        println!(
            "  {:<16} median {:>6.2} | {:>6.2} | {:>6.2}   (runs: {})",
            format!("{fault:?}"),
            column(|r| r.0),
            column(|r| r.1),
            column(|r| r.2),
            rows.iter()
                .map(|r| format!("{:.2}/{:.2}/{:.2}", r.0, r.1, r.2))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
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
    let faults = number(3, 3) as usize;

    let standalone = TestCluster::start(3).expect("standalone nodes");
    let members: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start(3, 0).expect("a cluster member"))
        .collect();
    // The same with a replica per shard: every lock write waits for the
    // replica's acknowledgement (`WAIT 1`).
    let replicated: Vec<ClusterMember> = (0..3)
        .map(|_| ClusterMember::start(3, 1).expect("a cluster member with replicas"))
        .collect();
    let cluster_urls: Vec<String> = members.iter().map(|m| m.url().expect("url")).collect();
    let replicated_urls: Vec<String> = replicated.iter().map(|m| m.url().expect("url")).collect();
    let on_servers = Arc::new(manager(standalone.urls()));
    let on_clusters = Arc::new(manager(cluster_urls));
    let on_replicated = Arc::new(manager(replicated_urls));
    // Connections, slot maps and first observations, before measuring.
    median_latency(&on_servers, usize::MAX, 50).await;
    median_latency(&on_clusters, usize::MAX - 1, 50).await;
    median_latency(&on_replicated, usize::MAX - 2, 50).await;

    let kinds = [&on_servers, &on_clusters, &on_replicated];
    let mut p50s: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        // Interleaved, the order rotating, so drift hits them alike.
        for k in 0..kinds.len() {
            let which = (round + k) % kinds.len();
            p50s[which].push(median_latency(kinds[which], round * 3 + k, ops).await);
        }
    }
    let [servers, clusters, acked] = p50s;
    let (servers_p50, clusters_p50, acked_p50) = (
        median(servers.clone()),
        median(clusters.clone()),
        median(acked.clone()),
    );
    println!("uncontended lock + release, p50 per round of {ops} (µs), {rounds} rounds:");
    println!("  standalone members: {servers:.0?}");
    println!("  cluster members:    {clusters:.0?}");
    println!("  with a replica per shard (WAIT 1): {acked:.0?}");
    println!(
        "  median p50: standalone {servers_p50:.0} µs, cluster {clusters_p50:.0} µs ({:.3}), \
         with replicas {acked_p50:.0} µs ({:.3})",
        clusters_p50 / servers_p50,
        acked_p50 / servers_p50
    );
    drop((on_replicated, replicated));

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
    drop((members, standalone, on_servers, on_clusters));
    if faults > 0 {
        fault_table(faults).await;
    }
}
