//! `quorumlock bench`: the benchmark scenarios that need no fault
//! injection, against the given nodes, with progress bars.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use quorumlock::bench::hot::{self, Contender, HotOptions, Polling, Waiting};
use quorumlock::bench::{self, Floor, LockClient, QuorumFloor, Quorumlock, Row, Stats};
use quorumlock::{Fencing, LockManager};

use crate::{Failure, NodeArgs, duration, exit};

#[derive(Args)]
pub struct BenchArgs {
    /// Scenarios to run (default: all).
    #[arg(value_enum)]
    scenarios: Vec<Scenario>,
    #[command(flatten)]
    nodes: NodeArgs,
    /// Latency samples per client.
    #[arg(long, default_value_t = 1000)]
    iterations: usize,
    /// Length of each throughput point.
    #[arg(long, default_value = "3s", value_parser = duration)]
    duration: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Uncontended lock + release, beside the floor.
    Latency,
    /// Fencing modes compared.
    Fencing,
    /// Lock + release pairs at 1, 8, 32, 128 concurrent tasks, fencing off
    /// and the default (counter node), beside the floors.
    Throughput,
    /// Hand-offs per second on one resource, 8 tasks.
    Contended,
    /// One hot resource, 64 waiters over 4 clients holding it 1 ms each:
    /// waiting (`lock(r).await`) against polling (`lock(r).no_wait()` in a loop).
    Hot,
}

const BOUND: Duration = Duration::from_secs(2);

/// Interleaved rounds of each throughput point: single runs on a shared
/// machine swing by ±20 %.
const ROUNDS: usize = 3;

/// The run with the median rate.
fn median_run(mut runs: Vec<Stats>) -> Stats {
    runs.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
    let middle = runs.len() / 2;
    runs.swap_remove(middle)
}

fn manager(urls: &[String], fencing: Fencing) -> Result<LockManager, Failure> {
    Ok(LockManager::builder()
        .tcp_nodelay(quorumlock::bench::nodelay())
        .nodes(urls.to_vec())
        .fencing(fencing)
        .build()?)
}

fn ours(label: &str, urls: &[String], fencing: Fencing) -> Result<Quorumlock, Failure> {
    Ok(Quorumlock {
        label: label.to_owned(),
        manager: manager(urls, fencing)?,
    })
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg:>28} [{bar:40}] {pos}/{len}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

pub async fn bench(args: BenchArgs) -> Result<u8, Failure> {
    let urls = args.nodes.urls();
    let all = [
        Scenario::Latency,
        Scenario::Fencing,
        Scenario::Throughput,
        Scenario::Contended,
        Scenario::Hot,
    ];
    let chosen: Vec<Scenario> = if args.scenarios.is_empty() {
        all.to_vec()
    } else {
        args.scenarios.clone()
    };
    if args.iterations == 0 {
        return Err(Failure::new(exit::USAGE, "--iterations must be at least 1"));
    }
    let floor_one = Floor::connect("floor: 1 node", &urls[..1])
        .await
        .map_err(|e| Failure::new(exit::ERROR, e))?;
    let floor_all = Floor::connect(format!("floor: {} nodes in parallel", urls.len()), &urls)
        .await
        .map_err(|e| Failure::new(exit::ERROR, e))?;
    let quorum_floor = QuorumFloor::connect("quorum floor", &urls)
        .await
        .map_err(|e| Failure::new(exit::ERROR, e))?;
    for scenario in chosen {
        match scenario {
            Scenario::Latency => {
                let quorumlock = ours("quorumlock", &urls, Fencing::Off)?;
                let clients: [&dyn LockClient; 4] =
                    [&floor_one, &floor_all, &quorum_floor, &quorumlock];
                let stats = latency(&clients, args.iterations, "latency").await;
                print_latency("Uncontended lock + release", &stats);
            }
            Scenario::Fencing => {
                let off = ours("fencing off", &urls, Fencing::Off)?;
                let counter = ours("counter node", &urls, Fencing::CounterNode { node: 0 })?;
                let quorum = ours("quorum fencing", &urls, Fencing::Quorum)?;
                let clients: [&dyn LockClient; 4] = [&floor_one, &off, &counter, &quorum];
                let stats = latency(&clients, args.iterations, "fencing modes").await;
                print_latency("Fencing modes", &stats);
            }
            Scenario::Throughput => {
                let floor: Arc<dyn LockClient> = Arc::new(
                    Floor::connect(format!("floor: {} nodes in parallel", urls.len()), &urls)
                        .await
                        .map_err(|e| Failure::new(exit::ERROR, e))?,
                );
                let quorum_floor: Arc<dyn LockClient> = Arc::new(
                    QuorumFloor::connect("quorum floor", &urls)
                        .await
                        .map_err(|e| Failure::new(exit::ERROR, e))?,
                );
                let quorumlock: Arc<dyn LockClient> =
                    Arc::new(ours("quorumlock", &urls, Fencing::Off)?);
                // The default: fencing tokens from counter node 0.
                let default: Arc<dyn LockClient> = Arc::new(ours(
                    "quorumlock (default: counter node)",
                    &urls,
                    Fencing::default(),
                )?);
                let clients = [&floor, &quorum_floor, &quorumlock, &default];
                let points = [1, 8, 32, 128];
                let progress = bar(
                    (points.len() * clients.len() * ROUNDS) as u64,
                    "throughput points",
                );
                let mut rows = Vec::new();
                for tasks in points {
                    // Interleaved rounds; each client's median round counts.
                    let mut runs: Vec<Vec<Stats>> = vec![Vec::new(); clients.len()];
                    for _ in 0..ROUNDS {
                        for (c, client) in clients.iter().enumerate() {
                            runs[c].push(
                                bench::throughput(
                                    Arc::clone(client),
                                    tasks,
                                    args.duration,
                                    false,
                                    BOUND,
                                )
                                .await,
                            );
                            progress.inc(1);
                        }
                    }
                    let stats: Vec<Stats> = runs.into_iter().map(median_run).collect();
                    rows.push((format!("{tasks} tasks"), stats));
                }
                progress.finish_and_clear();
                let table_rows: Vec<Row<'_>> = rows
                    .iter()
                    .flat_map(|(scenario, stats)| {
                        stats.iter().map(move |s| Row {
                            scenario: scenario.clone(),
                            stats: s,
                            floor: Some(&stats[1]),
                            peer: None,
                        })
                    })
                    .collect();
                println!(
                    "### Throughput over distinct resources (median of {ROUNDS} interleaved rounds; ratios to the quorum floor)\n\n{}",
                    bench::table(&table_rows, true)
                );
            }
            Scenario::Contended => {
                let quorumlock: Arc<dyn LockClient> = Arc::new(Quorumlock {
                    label: "quorumlock".to_owned(),
                    manager: manager(&urls, Fencing::Off)?,
                });
                let progress = bar(1, "hand-offs");
                let stats = bench::throughput(quorumlock, 8, args.duration, true, BOUND).await;
                progress.finish_and_clear();
                let row = Row {
                    scenario: "one resource, 8 tasks".to_owned(),
                    stats: &stats,
                    floor: None,
                    peer: None,
                };
                println!("### Hand-offs\n\n{}", bench::table(&[row], true));
            }
            Scenario::Hot => hot_resource(&urls, args.duration).await?,
        }
    }
    Ok(0)
}

/// The hot-resource scenario (see `quorumlock::bench::hot`), waiting
/// beside polling, each with 64 waiters over 4 clients of their own.
async fn hot_resource(urls: &[String], run_for: Duration) -> Result<(), Failure> {
    const CLIENTS: usize = 4;
    const WAITERS: usize = 64;
    let options = HotOptions {
        waiters: WAITERS,
        hold: Duration::from_millis(1),
        run_for,
    };
    let progress = bar(2, "hot resource");
    let mut lines = Vec::new();
    for waiting in [true, false] {
        let mut clients: Vec<Arc<dyn Contender>> = Vec::new();
        for _ in 0..CLIENTS {
            // The library's defaults: polling is `lock()` as shipped.
            let manager = LockManager::builder()
                .tcp_nodelay(quorumlock::bench::nodelay())
                .nodes(urls.to_vec())
                .build()?;
            clients.push(if waiting {
                Arc::new(Waiting(manager))
            } else {
                Arc::new(Polling(manager))
            });
        }
        let resource = format!("bench:hot:{}", fastrand::u64(..));
        let stats = hot::hot(&clients, urls, &resource, &options).await;
        lines.push(format!(
            "| {} | {:.0} | {:.0} % | {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {} | {} | {} |",
            stats.name,
            stats.per_sec(),
            stats.share_to_another() * 100.0,
            ms(stats.gap.value_at_quantile(0.5)),
            ms(stats.gap.value_at_quantile(0.99)),
            ms(stats.wait.value_at_quantile(0.5)),
            ms(stats.wait.value_at_quantile(0.99)),
            ms(stats.wait.max()),
            stats.commands_label(),
            stats.overlaps,
            stats.tokens_label(),
        ));
        progress.inc(1);
    }
    progress.finish_and_clear();
    println!(
        "### One hot resource: {WAITERS} waiters over {CLIENTS} clients, 1 ms hold, {run_for:?} \
         (times in ms)\n\n\
         | client | hand-offs/s | to another waiter | gap p50 / p99 | wait p50 / p99 / max \
         | commands / acquisition | overlaps | tokens |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n{}\n",
        lines.join("\n")
    );
    Ok(())
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

async fn latency(clients: &[&dyn LockClient], iterations: usize, what: &str) -> Vec<Stats> {
    let progress = bar(iterations as u64, what);
    let stats = bench::latency(clients, 20, iterations, BOUND, || progress.inc(1)).await;
    progress.finish_and_clear();
    stats
}

fn print_latency(title: &str, stats: &[Stats]) {
    let rows: Vec<Row<'_>> = stats
        .iter()
        .map(|s| Row {
            scenario: title.to_owned(),
            stats: s,
            floor: Some(&stats[0]),
            peer: None,
        })
        .collect();
    println!("### {title}\n\n{}", bench::table(&rows, false));
}
