//! The hot-resource section of `cargo bench --bench quorum -- hot`: 64
//! waiters over 4 clients (separate connections) take one resource in turn,
//! each holding it 1 ms; quorumlock's waiting (`lock_within`) beside its
//! old polling (`lock()` in a loop) and rslock (`acquire`, which loops over
//! `lock`), on the same five nodes; then a holder that crashes.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use plotters::prelude::*;
use quorumlock::bench::hot::{
    self, Contender, Held, HotFuture, HotOptions, HotStats, Polling, Waiting,
};
use quorumlock::bench::{self, LockClient, Quorumlock};
use quorumlock::testkit::TestCluster;
use quorumlock::{Fencing, LockManager};

/// rslock's waiting: `acquire_no_guard` (its retry schedule in a loop).
struct RslockWaiting(rslock::LockManager);

impl Contender for RslockWaiting {
    fn name(&self) -> String {
        "rslock, acquire".to_owned()
    }

    fn key(&self, resource: &str) -> String {
        resource.to_owned()
    }

    fn acquire<'a>(&'a self, resource: &'a str) -> HotFuture<'a, Held<'a>> {
        Box::pin(async move {
            let lock = self
                .0
                .acquire_no_guard(resource.as_bytes(), Duration::from_secs(10))
                .await
                .map_err(|e| format!("{e:?}"))?;
            Ok(Held {
                token: None,
                release: Box::pin(async move {
                    self.0.unlock(&lock).await;
                    Ok(())
                }),
            })
        })
    }
}

const CLIENTS: usize = 4;

fn manager(urls: &[String]) -> LockManager {
    LockManager::builder()
        .tcp_nodelay(quorumlock::bench::nodelay())
        .nodes(urls.to_vec())
        .fencing(Fencing::CounterNode { node: 0 })
        .build()
        .expect("valid settings")
}

fn clients(kind: &str, urls: &[String]) -> Vec<Arc<dyn Contender>> {
    (0..CLIENTS)
        .map(|_| -> Arc<dyn Contender> {
            match kind {
                "waiting" => Arc::new(Waiting(manager(urls))),
                "polling" => Arc::new(Polling(manager(urls))),
                _ => Arc::new(RslockWaiting(crate::rslock_manager(urls))),
            }
        })
        .collect()
}

/// Runs the section; returns its Markdown and draws `hot.svg` in `out`.
pub async fn section(args: &[&str], run_for: Duration, out: &Path) -> String {
    let cluster = TestCluster::start_with_args(5, args).expect("start 5 nodes");
    let urls = cluster.urls();
    // The yardstick: one uncontended lock + release round trip, same run.
    let single = Quorumlock {
        label: "quorumlock".to_owned(),
        manager: manager(&urls),
    };
    let clients_: [&dyn LockClient; 1] = [&single];
    let baseline = bench::latency(&clients_, 50, 500, Duration::from_secs(2), || {}).await;
    let round_trip = Duration::from_micros(baseline[0].quantile_us(0.5));
    eprintln!("hot: uncontended lock + release p50 {round_trip:?}");

    let options = |waiters| HotOptions {
        waiters,
        hold: Duration::from_millis(1),
        run_for,
    };
    let mut runs: Vec<(HotStats, Option<Duration>)> = Vec::new();
    for (kind, waiters) in [
        ("waiting", 64),
        ("waiting", 8),
        ("polling", 64),
        ("rslock", 64),
    ] {
        let contenders = clients(kind, &urls);
        let resource = format!("bench:hot:{kind}:{waiters}");
        let stats = hot::hot(&contenders, &urls, &resource, &options(waiters)).await;
        eprintln!(
            "hot: {} x{waiters}: {:.0}/s, gap p99 {} us, wait max {} us",
            stats.name,
            stats.per_sec(),
            stats.gap.value_at_quantile(0.99),
            stats.wait.max()
        );
        // A holder that crashes: its keys expire, no release comes.
        let crash = if waiters == 64 {
            let crashed = format!("bench:hot:crash:{kind}");
            match hot::after_crash(&contenders, &urls, &crashed, 64, Duration::from_secs(1)).await {
                Ok(late) => Some(late),
                Err(e) => {
                    eprintln!("hot: crash run of {kind}: {e}");
                    None
                }
            }
        } else {
            None
        };
        runs.push((stats, crash));
    }
    if let Err(e) = std::fs::create_dir_all(out)
        .map_err(Into::into)
        .and_then(|()| plot(&runs, &out.join("hot.svg")))
    {
        eprintln!("cannot draw the hot-resource plot: {e}");
    }
    render(&runs, round_trip, run_for)
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn render(
    runs: &[(HotStats, Option<Duration>)],
    round_trip: Duration,
    run_for: Duration,
) -> String {
    let mut text = format!(
        "### One hot resource: waiters over {CLIENTS} clients, 1 ms hold, {} s, five nodes\n\n\
         Uncontended lock + release p50 in the same run: {:.2} ms. Times in ms.\n\n\
         | client | waiters | hand-offs/s | to another waiter | gap p50 / p99 | wait p50 / p99 / max \
         | max wait / (waiters × cycle) | commands / acquisition | overlaps | tokens | after a crash |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |\n",
        run_for.as_secs(),
        round_trip.as_secs_f64() * 1e3
    );
    for (stats, crash) in runs {
        let starvation_bound = stats.mean_cycle().as_micros() as f64 * stats.waiters as f64;
        text.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} % | {} / {} | {} / {} / {} | {:.2} | {} | {} | {} | {} |\n",
            stats.name,
            stats.waiters,
            stats.per_sec(),
            stats.share_to_another() * 100.0,
            ms(stats.gap.value_at_quantile(0.5)),
            ms(stats.gap.value_at_quantile(0.99)),
            ms(stats.wait.value_at_quantile(0.5)),
            ms(stats.wait.value_at_quantile(0.99)),
            ms(stats.wait.max()),
            stats.wait.max() as f64 / starvation_bound.max(1.0),
            stats.commands_label(),
            stats.overlaps,
            stats.tokens_label(),
            crash.map_or("n/a".to_owned(), |late| format!(
                "{:.1} ms after expiry",
                late.as_secs_f64() * 1e3
            )),
        ));
        if stats.failures > 0 {
            text.push_str(&format!("|  (failed operations: {}) |\n", stats.failures));
        }
    }
    if let Some((waiting, _)) = runs.first() {
        text.push_str(&format!(
            "\nGap p99 / uncontended round trip (waiting, 64): {:.1}× (goal ≤ 5×).\n",
            waiting.gap.value_at_quantile(0.99) as f64 / round_trip.as_micros().max(1) as f64
        ));
    }
    text
}

/// Wait-time quantiles of every run, one line per client (log scale).
fn plot(
    runs: &[(HotStats, Option<Duration>)],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let highest = runs
        .iter()
        .map(|(s, _)| s.wait.max() as f64 / 1000.0)
        .fold(1.0, f64::max)
        * 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "One hot resource: time to acquire (ms, log scale) by percentile",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..100.0, (0.1..highest).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile of acquisitions")
        .y_desc("wait, ms")
        .draw()?;
    let colors = [
        RGBColor(33, 102, 172),
        RGBColor(103, 169, 207),
        RGBColor(150, 150, 150),
        RGBColor(214, 96, 77),
    ];
    for ((stats, _), color) in runs.iter().zip(colors) {
        let points: Vec<(f64, f64)> = (0..=1000)
            .map(|i| {
                let q = i as f64 / 1000.0;
                (
                    q * 100.0,
                    (stats.wait.value_at_quantile(q) as f64 / 1000.0).max(0.1),
                )
            })
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(format!("{} ({} waiters)", stats.name, stats.waiters))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
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
