//! Quorum latency and throughput, beside the floor and the peer, in one run.
//!
//!     cargo bench --bench quorum
//!
//! Scenarios (local testkit clusters, AOF `appendfsync always` unless
//! `QUORUMLOCK_BENCH_FSYNC=everysec`):
//! - uncontended lock + release latency on N = 1, 3, 5, 7 nodes;
//! - five nodes behind fault proxies: healthy, one slowed +20 ms, one
//!   unresponsive, node 0 (the default's counter node) unresponsive, then
//!   down, then nodes 0 and 4 down, with fencing off and the default;
//! - fencing modes on five nodes (off / counter node / quorum);
//! - the node guard on and off on five nodes (its cost: a `TIME` pipelined
//!   with every request that sets a key);
//! - throughput of lock + release over distinct resources at 1, 8, 32, 128
//!   concurrent tasks, and hand-offs per second on one shared resource;
//! - one hot resource: 64 waiters over 4 clients, waiting beside polling
//!   and rslock, and a crashed holder (`benches/hot/mod.rs`);
//! - lock kinds: `lock_many` on 1, 2, 4, 8 resources beside `lock()`, and
//!   readers beside writers on one resource (`benches/kinds/mod.rs`).
//!
//! Baselines, measured in the same run: the floor (`SET NX PX` + `DEL`
//! through redis-rs, on one node and on all nodes in parallel) and the peer
//! (`rslock` on the same nodes). Latency scenarios interleave the clients
//! one operation at a time so noise hits them alike.
//!
//! Output: Markdown tables on stdout and in `$QUORUMLOCK_BENCH_OUT/results.md`
//! (default `target/quorumlock-bench`), a plot in `bench.svg` beside it.
//! `QUORUMLOCK_BENCH_ITERS` (default 2000) and `QUORUMLOCK_BENCH_SECS`
//! (default 3, per throughput point) size the run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[path = "counting/mod.rs"]
mod counting;
#[path = "hot/mod.rs"]
mod hot;
#[path = "kinds/mod.rs"]
mod kinds;

use plotters::prelude::*;
use quorumlock::bench::{self, BoxedOp, Floor, LockClient, QuorumFloor, Quorumlock, Row, Stats};
use quorumlock::testkit::{Delay, TestCluster};
use quorumlock::{ClockCheck, Fencing, LockManager, NodeGuard};

/// An rslock manager on `urls`, with the socket options every client of
/// the run uses.
fn rslock_manager(urls: &[String]) -> rslock::LockManager {
    let clients = urls
        .iter()
        .map(|url| bench::node_client(url).expect("a node URL"))
        .collect();
    rslock::LockManager::from_clients(clients)
}

/// rslock on the same nodes: `lock` then `unlock`.
struct Rslock {
    manager: rslock::LockManager,
}

impl Rslock {
    fn new(urls: &[String], retries: u32, delay: Duration) -> Self {
        let mut manager = rslock_manager(urls);
        manager.set_retry(retries, delay);
        Self { manager }
    }
}

impl LockClient for Rslock {
    fn name(&self) -> String {
        "rslock".to_owned()
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a> {
        Box::pin(async move {
            let lock = self
                .manager
                .lock(resource.as_bytes(), Duration::from_secs(10))
                .await
                .map_err(|e| format!("{e:?}"))?;
            self.manager.unlock(&lock).await;
            Ok(())
        })
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ours(label: &str, urls: &[String], fencing: Fencing) -> Quorumlock {
    ours_guarded(label, urls, fencing, NodeGuard::default())
}

fn ours_guarded(label: &str, urls: &[String], fencing: Fencing, guard: NodeGuard) -> Quorumlock {
    // Nodes run with `appendfsync everysec` (QUORUMLOCK_BENCH_FSYNC) would
    // rightly be quarantined for a TTL after they start; the benchmark
    // restarts nothing, so it trusts them at once.
    let guard = if fsync_always() {
        guard
    } else {
        guard.trust_restarts()
    };
    Quorumlock {
        label: label.to_owned(),
        manager: LockManager::builder()
            .tcp_nodelay(quorumlock::bench::nodelay())
            .nodes(urls.to_vec())
            .fencing(fencing)
            .node_guard(guard)
            .build()
            .expect("valid settings"),
    }
}

fn fsync_always() -> bool {
    env_or("QUORUMLOCK_BENCH_FSYNC", "always".to_owned()) == "always"
}

/// One scenario: its name, the stats of every client, and the indexes of
/// the floor and the peer among them.
type Measured = (String, Vec<Stats>, Option<usize>, Option<usize>);

/// Measured rows of one section, owned.
struct Section {
    title: &'static str,
    throughput: bool,
    rows: Vec<Measured>,
}

/// A fault scenario: its name and how to put the cluster into it.
type FaultStep = (&'static str, Box<dyn Fn(&TestCluster)>);

impl Section {
    fn render(&self) -> String {
        let mut rows = Vec::new();
        for (scenario, stats, floor, peer) in &self.rows {
            for s in stats {
                rows.push(Row {
                    scenario: scenario.clone(),
                    stats: s,
                    floor: floor.map(|i| &stats[i]),
                    peer: peer.map(|i| &stats[i]),
                });
            }
        }
        format!(
            "### {}\n\n{}",
            self.title,
            bench::table(&rows, self.throughput)
        )
    }
}

const BOUND: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() {
    let iterations: usize = env_or("QUORUMLOCK_BENCH_ITERS", 2000);
    let seconds: u64 = env_or("QUORUMLOCK_BENCH_SECS", 3);
    let fsync: String = env_or("QUORUMLOCK_BENCH_FSYNC", "always".to_owned());
    let out = PathBuf::from(env_or(
        "QUORUMLOCK_BENCH_OUT",
        "target/quorumlock-bench".to_owned(),
    ));
    // `off`: no append-only file at all, so the disk is out of the picture.
    let args: Vec<&str> = if fsync == "off" {
        vec!["--appendonly", "no"]
    } else {
        vec!["--appendfsync", fsync.as_str()]
    };
    let warmup = 100;
    let mut sections = Vec::new();
    // `cargo bench --bench quorum -- throughput faults` runs only those.
    let chosen: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| chosen.is_empty() || chosen.iter().any(|c| c == name);

    // 1. Node count.
    let seven = TestCluster::start_with_args(7, &args).expect("start 7 nodes");
    let mut nodes = Section {
        title: "Uncontended lock + release latency by node count",
        throughput: false,
        rows: Vec::new(),
    };
    for n in [1, 3, 5, 7].into_iter().filter(|_| wanted("nodes")) {
        let urls = &seven.urls()[..n];
        let floor_one = Floor::connect("floor: 1 node", &urls[..1])
            .await
            .expect("floor");
        let floor_all = Floor::connect(format!("floor: {n} nodes in parallel"), urls)
            .await
            .expect("floor");
        let quorum_floor = QuorumFloor::connect("quorum floor", urls)
            .await
            .expect("quorum floor");
        let quorumlock = ours("quorumlock", urls, Fencing::Off);
        let rslock = Rslock::new(urls, 3, Duration::from_millis(200));
        let clients: [&dyn LockClient; 5] =
            [&floor_one, &floor_all, &quorum_floor, &quorumlock, &rslock];
        let stats = bench::latency(&clients, warmup, iterations, BOUND, || {}).await;
        nodes
            .rows
            .push((format!("{n} nodes"), stats, Some(2), Some(4)));
        eprintln!("measured {n} nodes");
    }
    if !nodes.rows.is_empty() {
        sections.push(nodes);
    }

    // 2. Fencing modes, five nodes.
    let five = &seven.urls()[..5];
    if wanted("fencing") {
        let floor_one = Floor::connect("floor: 1 node", &five[..1])
            .await
            .expect("floor");
        let off = ours("fencing off", five, Fencing::Off);
        let counter = ours("counter node", five, Fencing::CounterNode { node: 0 });
        let quorum = ours("quorum fencing", five, Fencing::Quorum);
        let clients: [&dyn LockClient; 4] = [&floor_one, &off, &counter, &quorum];
        let stats = bench::latency(&clients, warmup, iterations, BOUND, || {}).await;
        sections.push(Section {
            title: "Fencing modes, five nodes",
            throughput: false,
            rows: vec![("5 nodes".to_owned(), stats, Some(0), None)],
        });
        eprintln!("measured fencing modes");
    }

    // 2b. The node guard's cost: a TIME in every key-setting request.
    if wanted("guard") {
        let floor_one = Floor::connect("floor: 1 node", &five[..1])
            .await
            .expect("floor");
        let off = ours_guarded("guard off", five, Fencing::Off, NodeGuard::disabled());
        let on = ours_guarded("guard on", five, Fencing::Off, NodeGuard::default());
        let clients: [&dyn LockClient; 3] = [&floor_one, &off, &on];
        let stats = bench::latency(&clients, warmup, iterations, BOUND, || {}).await;
        sections.push(Section {
            title: "Node guard, five nodes (fencing off)",
            throughput: false,
            rows: vec![("5 nodes".to_owned(), stats, Some(0), None)],
        });
        eprintln!("measured the node guard");
    }

    // 3. Heap allocations per lock + release (one task, five nodes).
    let floor_five = Floor::connect("floor: 5 nodes in parallel", five)
        .await
        .expect("floor");
    let quorum_floor = QuorumFloor::connect("quorum floor", five)
        .await
        .expect("quorum floor");
    let ours_off = ours("quorumlock", five, Fencing::Off);
    let ours_counter = ours(
        "quorumlock (counter node)",
        five,
        Fencing::CounterNode { node: 0 },
    );
    let ours_sampled = ours_guarded(
        "quorumlock (sampled clock)",
        five,
        Fencing::Off,
        NodeGuard::default().clock_check(ClockCheck::Sampled),
    );
    let ours_unguarded = ours_guarded(
        "quorumlock (guard off)",
        five,
        Fencing::Off,
        NodeGuard::disabled(),
    );
    let peer = Rslock::new(five, 3, Duration::from_millis(200));
    let mut allocations = Vec::new();
    for client in [
        &floor_five as &dyn LockClient,
        &quorum_floor,
        &ours_off,
        &ours_counter,
        &ours_sampled,
        &ours_unguarded,
        &peer,
    ] {
        allocations.push((client.name(), allocations_per_op(client).await));
    }
    drop(seven);

    // 4. Faults, five nodes behind proxies.
    if wanted("faults") {
        sections.push(fault_section(&args, iterations.min(500)).await);
    }

    // 5. Throughput, distinct resources and one shared resource.
    if wanted("throughput") {
        let rounds: usize = env_or("QUORUMLOCK_BENCH_ROUNDS", 3);
        sections.push(throughput_section(&args, Duration::from_secs(seconds), rounds).await);
    }

    // 6. One hot resource: waiting, polling, the peer.
    let hot_section = if wanted("hot") {
        let secs: u64 = env_or("QUORUMLOCK_BENCH_HOT_SECS", 10);
        Some(hot::section(&args, Duration::from_secs(secs), &out).await)
    } else {
        None
    };

    // 7. Lock kinds: several resources, readers and writers.
    let kinds_section = if wanted("kinds") {
        Some(kinds::section(&args, iterations, Duration::from_secs(seconds)).await)
    } else {
        None
    };

    let mut report = format!(
        "quorumlock benchmark: {} cores, appendfsync {fsync}, {iterations} latency samples per \
         client and scenario, {seconds} s per throughput point\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    report.push_str("Heap allocations per lock + release (5 nodes, one task):");
    for (name, count) in &allocations {
        report.push_str(&format!(" {name} {count:.0};"));
    }
    report.push_str("\n\n");
    for section in &sections {
        report.push_str(&section.render());
        report.push('\n');
    }
    for extra in [&hot_section, &kinds_section].into_iter().flatten() {
        report.push_str(extra);
        report.push('\n');
    }
    println!("{report}");
    if let Err(e) =
        std::fs::create_dir_all(&out).and_then(|()| std::fs::write(out.join("results.md"), &report))
    {
        eprintln!("cannot write results: {e}");
    }
    match plot(&sections, &out.join("bench.svg")) {
        Ok(()) => eprintln!("wrote {}", out.join("bench.svg").display()),
        Err(e) => eprintln!("cannot draw the plot: {e}"),
    }
}

async fn throughput_section(args: &[&str], run_for: Duration, rounds: usize) -> Section {
    let cluster = TestCluster::start_with_args(5, args).expect("start 5 nodes");
    let urls = cluster.urls();
    let floor: Arc<dyn LockClient> = Arc::new(
        Floor::connect("floor: 5 nodes in parallel", &urls)
            .await
            .expect("floor"),
    );
    let quorum_floor: Arc<dyn LockClient> = Arc::new(
        QuorumFloor::connect("quorum floor", &urls)
            .await
            .expect("quorum floor"),
    );
    let quorumlock: Arc<dyn LockClient> = Arc::new(ours("quorumlock", &urls, Fencing::Off));
    let counter: Arc<dyn LockClient> = Arc::new(ours(
        "quorumlock (counter node)",
        &urls,
        Fencing::CounterNode { node: 0 },
    ));
    // What the node guard's `TIME` costs under load: read once per
    // clock interval, and not at all.
    let sampled: Arc<dyn LockClient> = Arc::new(ours_guarded(
        "quorumlock (sampled clock)",
        &urls,
        Fencing::Off,
        NodeGuard::default().clock_check(ClockCheck::Sampled),
    ));
    let unguarded: Arc<dyn LockClient> = Arc::new(ours_guarded(
        "quorumlock (guard off)",
        &urls,
        Fencing::Off,
        NodeGuard::disabled(),
    ));
    let rslock: Arc<dyn LockClient> = Arc::new(Rslock::new(&urls, 3, Duration::from_millis(200)));
    let clients = [
        &floor,
        &quorum_floor,
        &quorumlock,
        &counter,
        &sampled,
        &unguarded,
        &rslock,
    ];
    let mut throughput = Section {
        title: "Throughput of lock + release over distinct resources (median of interleaved rounds)",
        throughput: true,
        rows: Vec::new(),
    };
    for tasks in [1, 8, 32, 128] {
        // Rounds interleave the clients, so a slow spell of the machine
        // hits each alike; each client's median round is reported.
        let mut runs: Vec<Vec<(Stats, f64)>> = vec![Vec::new(); clients.len()];
        for _ in 0..rounds {
            for (c, client) in clients.iter().enumerate() {
                let cpu = bench::process_cpu();
                let run = bench::throughput(Arc::clone(client), tasks, run_for, false, BOUND).await;
                let per_op =
                    (bench::process_cpu() - cpu).as_secs_f64() * 1e6 / run.ops().max(1) as f64;
                runs[c].push((run, per_op));
            }
        }
        let mut stats = Vec::new();
        for mut client_runs in runs {
            client_runs.sort_by(|a, b| a.0.ops_per_sec().total_cmp(&b.0.ops_per_sec()));
            let all: Vec<String> = client_runs
                .iter()
                .map(|(run, _)| format!("{:.0}", run.ops_per_sec()))
                .collect();
            let failed: Vec<String> = client_runs
                .iter()
                .filter(|(run, _)| run.failures > 0)
                .map(|(run, _)| run.failures_by_kind())
                .collect();
            let (median, per_op) = client_runs.swap_remove(client_runs.len() / 2);
            eprintln!(
                "  {tasks} tasks, {}: {:.0}/s median of [{}], {per_op:.1} µs client CPU per op{}",
                median.name,
                median.ops_per_sec(),
                all.join(", "),
                if failed.is_empty() {
                    String::new()
                } else {
                    format!("; failures: {}", failed.join(" / "))
                }
            );
            stats.push(median);
        }
        throughput
            .rows
            .push((format!("{tasks} tasks"), stats, Some(1), Some(6)));
        eprintln!("measured throughput at {tasks} tasks");
    }
    let contended_ours: Arc<dyn LockClient> = Arc::new(Quorumlock {
        label: "quorumlock".to_owned(),
        manager: LockManager::builder()
            .tcp_nodelay(quorumlock::bench::nodelay())
            .nodes(urls.clone())
            .fencing(Fencing::Off)
            .build()
            .expect("valid"),
    });
    let contended_peer: Arc<dyn LockClient> =
        Arc::new(Rslock::new(&urls, 1_000, Duration::from_millis(2)));
    let mut stats = Vec::new();
    for client in [&contended_ours, &contended_peer] {
        stats.push(bench::throughput(Arc::clone(client), 8, run_for, true, BOUND).await);
    }
    throughput.rows.push((
        "one shared resource, 8 tasks (hand-offs)".to_owned(),
        stats,
        None,
        Some(1),
    ));
    throughput
}

async fn fault_section(args: &[&str], iterations: usize) -> Section {
    let cluster = TestCluster::start_proxied_with_args(5, args).expect("start proxied nodes");
    let urls = cluster.urls();
    // On node 1: node 0 is among the nodes the faults hit.
    let floor = Floor::connect("floor: 1 node", &urls[1..2])
        .await
        .expect("floor");
    let quorumlock = ours("quorumlock", &urls, Fencing::Off);
    // The default, whose tokens come from node 0 while it answers.
    let default = ours(
        "quorumlock (default: counter node 0)",
        &urls,
        Fencing::default(),
    );
    let rslock = Rslock::new(&urls, 3, Duration::from_millis(200));
    let clients: [&dyn LockClient; 4] = [&floor, &quorumlock, &default, &rslock];
    let mut section = Section {
        title: "Five nodes under faults (floor on a healthy node)",
        throughput: false,
        rows: Vec::new(),
    };
    let slow = Delay::fixed(Duration::from_millis(20));
    let steps: [FaultStep; 6] = [
        ("healthy", Box::new(|_| {})),
        (
            "one node slowed +20 ms",
            Box::new(move |c| c.proxy(4).expect("proxy").set_latency_to_node(slow)),
        ),
        (
            "one node unresponsive",
            Box::new(|c| {
                c.proxy(4).expect("proxy").heal();
                c.proxy(4).expect("proxy").set_unresponsive(true);
            }),
        ),
        (
            "node 0 unresponsive",
            Box::new(|c| {
                c.proxy(4).expect("proxy").heal();
                c.proxy(0).expect("proxy").set_unresponsive(true);
            }),
        ),
        (
            "node 0 down",
            Box::new(|c| {
                c.proxy(0).expect("proxy").heal();
                c.kill(0).expect("kill");
            }),
        ),
        (
            "two nodes down (0 and 4)",
            Box::new(|c| c.kill(4).expect("kill")),
        ),
    ];
    for (name, apply) in steps {
        apply(&cluster);
        // A short warm-up: a client that waits a second per operation on a
        // dead node would spend its whole time budget warming up.
        let stats = bench::latency(&clients, 3, iterations, BOUND, || {}).await;
        section
            .rows
            .push((name.to_owned(), stats, Some(0), Some(3)));
        eprintln!("measured faults: {name}");
    }
    section
}

/// Two panels: p50 latency by scenario (bars), throughput by tasks (lines).
fn plot(sections: &[Section], path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(820);

    // Latency bars: every latency row, one bar per client.
    let mut bars: Vec<(String, String, f64)> = Vec::new();
    for section in sections.iter().filter(|s| !s.throughput) {
        for (scenario, stats, _, _) in &section.rows {
            for s in stats.iter().filter(|s| s.ops() > 0) {
                bars.push((
                    scenario.clone(),
                    s.name.clone(),
                    s.quantile_us(0.5) as f64 / 1000.0,
                ));
            }
        }
    }
    // A log scale: a client stuck on a dead node is a thousand times slower.
    let highest = bars.iter().map(|b| b.2).fold(1.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "p50 lock + release (ms, log scale), by scenario and client",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(260)
        .build_cartesian_2d((0.1..highest).log_scale(), (0..bars.len()).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&|segment| match segment {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => bars
                .get(*i)
                .map(|(scenario, client, _)| format!("{scenario}: {client}"))
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()?;
    chart.draw_series(bars.iter().enumerate().map(|(i, (_, client, ms))| {
        let color = client_color(client);
        Rectangle::new(
            [
                (0.1, SegmentValue::Exact(i)),
                (*ms, SegmentValue::Exact(i + 1)),
            ],
            color.filled(),
        )
    }))?;

    // Throughput lines.
    let tasks = [1, 8, 32, 128];
    let Some(section) = sections.iter().find(|s| s.throughput) else {
        return Ok(());
    };
    let mut lines: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for (point, (_, stats, _, _)) in section.rows.iter().take(tasks.len()).enumerate() {
        for s in stats {
            match lines.iter_mut().find(|(name, _)| *name == s.name) {
                Some((_, points)) => points.push((point, s.ops_per_sec())),
                None => lines.push((s.name.clone(), vec![(point, s.ops_per_sec())])),
            }
        }
    }
    let top = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, v)| v))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&right)
        .caption(
            "lock + release per second, by concurrent tasks",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0usize..tasks.len() - 1, 0.0..top)?;
    chart
        .configure_mesh()
        .x_labels(tasks.len())
        .x_label_formatter(&|i| tasks.get(*i).map(|t| t.to_string()).unwrap_or_default())
        .draw()?;
    for (name, points) in lines {
        let color = client_color(&name);
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Heap allocations per lock + release, one at a time, after a warm-up.
async fn allocations_per_op(client: &dyn LockClient) -> f64 {
    for i in 0..100 {
        let _ = client.lock_release(&format!("bench:alloc:warm:{i}")).await;
    }
    let ops = 1000;
    let before = counting::allocations();
    for i in 0..ops {
        let _ = client.lock_release(&format!("bench:alloc:{i}")).await;
    }
    (counting::allocations() - before) as f64 / ops as f64
}

fn client_color(name: &str) -> RGBColor {
    if name.starts_with("floor") {
        RGBColor(150, 150, 150)
    } else if name == "quorum floor" {
        RGBColor(60, 60, 60)
    } else if name == "rslock" {
        RGBColor(214, 96, 77)
    } else if name.contains("guard off") {
        RGBColor(90, 174, 97)
    } else if name.contains("sampled") {
        RGBColor(118, 42, 131)
    } else if name.contains("counter") {
        RGBColor(146, 197, 222)
    } else {
        RGBColor(33, 102, 172)
    }
}
