//! One client at one concurrency for a while, on five local nodes without
//! an append-only file: a steady load to profile (`perf record`, `perf
//! stat`), with the rate, client CPU and allocations per operation.
//!
//!     cargo bench --bench profile -- <client> <tasks> <seconds>
//!
//! `client`: `quorumlock` (fencing off), `sampled` (fencing off, the node
//! guard's clock read once per interval), `unguarded` (fencing and the
//! node guard off), `counter` (counter-node fencing), `quorum-floor`,
//! `raw-floor` (the quorum floor on a minimal RESP wire, to measure what
//! the redis-rs client costs), `floor`. Built with
//! `RUSTFLAGS="--cfg quorumlock_dhat"` and run with `QUORUMLOCK_DHAT=1`, the measured run's allocation sites
//! are written to `dhat-heap.json`. Defaults: quorumlock, 32 tasks, 10 s. The
//! process's own id is printed first, for `perf record -p`.
//! `QUORUMLOCK_BENCH_NODELAY=0|1` sets every client's `TCP_NODELAY`;
//! `QUORUMLOCK_BENCH_PROXY_LATENCY_US=n` puts every node behind a fault
//! proxy that delays each direction by `n` µs.

use std::sync::Arc;
use std::time::Duration;

#[path = "counting/mod.rs"]
mod counting;

use quorumlock::bench::{self, Floor, LockClient, QuorumFloor, Quorumlock, RawQuorumFloor};
use quorumlock::testkit::{Delay, TestCluster};
use quorumlock::{ClockCheck, Fencing, LockManager, NodeGuard};

fn ours(urls: &[String], fencing: Fencing, guard: NodeGuard, label: &str) -> Quorumlock {
    // Nodes without an append-only file are trusted at once here: nothing
    // restarts during the run.
    let guard = guard.trust_restarts();
    Quorumlock {
        label: format!("quorumlock ({fencing:?}, {label})"),
        manager: LockManager::builder()
            .tcp_nodelay(quorumlock::bench::nodelay())
            .nodes(urls.to_vec())
            .fencing(fencing)
            .node_guard(guard)
            .build()
            .expect("valid settings"),
    }
}

/// One attempt, not queued, then release: the same engine path in every
/// version of the API (to measure what the API itself costs).
struct Once(Quorumlock);

impl LockClient for Once {
    fn name(&self) -> String {
        format!("{}, one attempt", self.0.name())
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> bench::BoxedOp<'a> {
        Box::pin(async move {
            let lock = self
                .0
                .manager
                .lock(resource)
                .no_wait()
                .await
                .map_err(|e| e.kind().to_owned())?;
            lock.release().await.map_err(|e| e.kind().to_owned())
        })
    }
}

/// `QUORUMLOCK_BENCH_PROXY_LATENCY_US`: the latency each way of a proxy
/// in front of every node (tokio's timer rounds it up to the millisecond).
fn proxy_latency() -> Option<Delay> {
    let micros = std::env::var("QUORUMLOCK_BENCH_PROXY_LATENCY_US").ok()?;
    let micros: u64 = micros
        .parse()
        .expect("QUORUMLOCK_BENCH_PROXY_LATENCY_US: microseconds");
    Some(Delay::fixed(Duration::from_micros(micros)))
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let client = args.first().map_or("quorumlock", String::as_str).to_owned();
    let tasks: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(32);
    let seconds: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10);
    let no_aof = ["--appendonly", "no"];
    let cluster = match proxy_latency() {
        // Every node behind a fault proxy that delays each direction: a LAN
        // rather than loopback.
        Some(delay) => {
            let cluster = TestCluster::start_proxied_with_args(5, &no_aof).expect("start 5 nodes");
            for i in 0..5 {
                cluster.proxy(i).expect("proxied").set_latency(delay);
            }
            eprintln!("every node behind a proxy adding {delay:?} each way");
            cluster
        }
        None => TestCluster::start_with_args(5, &no_aof).expect("start 5 nodes"),
    };
    let urls = cluster.urls();
    let client: Arc<dyn LockClient> = match client.as_str() {
        "quorumlock" => Arc::new(ours(&urls, Fencing::Off, NodeGuard::default(), "guard on")),
        "sampled" => Arc::new(ours(
            &urls,
            Fencing::Off,
            NodeGuard::default().clock_check(ClockCheck::Sampled),
            "sampled clock",
        )),
        "unguarded" => Arc::new(ours(
            &urls,
            Fencing::Off,
            NodeGuard::disabled(),
            "guard off",
        )),
        "counter" => Arc::new(ours(
            &urls,
            Fencing::CounterNode { node: 0 },
            NodeGuard::default(),
            "guard on",
        )),
        "once" => Arc::new(Once(ours(
            &urls,
            Fencing::Off,
            NodeGuard::default(),
            "guard on",
        ))),
        "quorum-floor" => Arc::new(
            QuorumFloor::connect("quorum floor", &urls)
                .await
                .expect("connect"),
        ),
        "floor" => Arc::new(Floor::connect("floor", &urls).await.expect("connect")),
        "raw-floor" => Arc::new(
            RawQuorumFloor::connect("raw quorum floor", &urls)
                .await
                .expect("connect"),
        ),
        other => panic!(
            "unknown client {other}; use quorumlock, sampled, unguarded, counter, quorum-floor, raw-floor or floor"
        ),
    };
    // Warm the connections (and the scripts) before the measured run.
    let _ = bench::throughput(
        Arc::clone(&client),
        tasks,
        Duration::from_secs(1),
        false,
        Duration::from_secs(2),
    )
    .await;
    eprintln!(
        "pid {} measuring {} at {tasks} tasks for {seconds} s",
        std::process::id(),
        client.name()
    );
    let mut stats_conns = Vec::new();
    for url in &urls {
        let node = redis::Client::open(url.as_str()).expect("url");
        let mut conn = node
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .expect("CONFIG RESETSTAT");
        stats_conns.push(conn);
    }
    #[cfg(quorumlock_dhat)]
    let profiler = std::env::var_os("QUORUMLOCK_DHAT").map(|_| dhat::Profiler::new_heap());
    #[cfg(not(quorumlock_dhat))]
    let profiler = None::<String>;
    let servers = server_pids(&urls).await;
    let servers_cpu = || {
        servers
            .iter()
            .map(|&pid| bench::process_cpu_of(pid))
            .sum::<Duration>()
    };
    let (cpu, node_cpu, allocations) =
        (bench::process_cpu(), servers_cpu(), counting::allocations());
    let run = bench::throughput(
        Arc::clone(&client),
        tasks,
        Duration::from_secs(seconds),
        false,
        Duration::from_secs(2),
    )
    .await;
    drop(profiler);
    let ops = run.ops().max(1) as f64;
    let per_op = |spent: Duration| spent.as_secs_f64() * 1e6 / ops;
    println!(
        "{}: {:.0}/s, p50 {} µs, {:.1} µs client CPU, {:.1} µs CPU of the {} servers and {:.1} allocations per op, {} failures {}",
        run.name,
        run.ops_per_sec(),
        run.quantile_us(0.5),
        per_op(bench::process_cpu() - cpu),
        per_op(servers_cpu() - node_cpu),
        servers.len(),
        (counting::allocations() - allocations) as f64 / ops,
        run.failures,
        run.failures_by_kind()
    );
    print_commands(&mut stats_conns, ops).await;
}

/// What the nodes were asked per lock + release, and what it cost them:
/// every command by name, summed over the nodes and on node 0 (the counter
/// node) alone, and node 0's socket reads and writes (fewer: better
/// batched). Commands a script runs count one each, beside its `EVALSHA`.
async fn print_commands(nodes: &mut [redis::aio::MultiplexedConnection], ops: f64) {
    // name → (calls on every node, µs on every node, calls on node 0, µs on node 0)
    let mut commands = std::collections::BTreeMap::<String, [f64; 4]>::new();
    for (i, conn) in nodes.iter_mut().enumerate() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .expect("INFO commandstats");
        for line in info.lines().filter_map(|l| l.strip_prefix("cmdstat_")) {
            let Some((name, fields)) = line.split_once(':') else {
                continue;
            };
            let field = |wanted: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(wanted)?.strip_prefix('='))
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            if matches!(name, "info" | "config|resetstat") {
                continue;
            }
            let entry = commands.entry(name.to_owned()).or_default();
            let (calls, usec) = (field("calls"), field("usec"));
            entry[0] += calls;
            entry[1] += usec;
            if i == 0 {
                entry[2] += calls;
                entry[3] += usec;
            }
        }
    }
    let total = commands.values().fold([0.0; 4], |mut sum, c| {
        sum.iter_mut().zip(c).for_each(|(s, c)| *s += c);
        sum
    });
    println!(
        "  commands per op: {:.2} on the {} nodes ({:.1} µs), {:.2} on node 0 ({:.1} µs)",
        total[0] / ops,
        nodes.len(),
        total[1] / ops,
        total[2] / ops,
        total[3] / ops
    );
    for (name, [calls, usec, calls_0, usec_0]) in &commands {
        println!(
            "    {name}: {:.2} calls, {:.1} µs ({:.2} calls, {:.1} µs on node 0)",
            calls / ops,
            usec / ops,
            calls_0 / ops,
            usec_0 / ops
        );
    }
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut nodes[0])
        .await
        .expect("INFO stats");
    let stat = |name: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    println!(
        "  node 0: {:.2} socket reads and {:.2} writes per op",
        stat("total_reads_processed") / ops,
        stat("total_writes_processed") / ops
    );
}

/// The `redis-server` process behind each node, from its `INFO`.
async fn server_pids(urls: &[String]) -> Vec<u32> {
    let mut pids = Vec::new();
    for url in urls {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .expect("INFO server");
        pids.extend(
            info.lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|pid| pid.trim().parse::<u32>().ok()),
        );
    }
    pids
}
