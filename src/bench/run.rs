//! Measurement loops: interleaved latency, and throughput at a concurrency.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::clients::{BoxedOp, LockClient};

/// Consecutive failures after which [`latency`] stops asking a client.
pub const GIVE_UP_AFTER: usize = 10;

/// Time a client may spend in one [`latency`] run before it is sampled no
/// more (a client that waits a second per operation on a dead node would
/// otherwise hold the run for minutes).
pub const TIME_BUDGET: Duration = Duration::from_secs(20);

/// Latencies and counts of one client in one scenario.
#[derive(Debug, Clone)]
pub struct Stats {
    /// The client's name.
    pub name: String,
    /// Successful operations, in microseconds.
    pub histogram: Histogram<u64>,
    /// Operations that failed or hit the per-operation bound.
    pub failures: u64,
    /// The failures by what the client said (`bound`: no answer within the
    /// per-operation bound).
    pub failure_kinds: BTreeMap<String, u64>,
    /// Wall time of the run (throughput runs).
    pub elapsed: Duration,
}

impl Stats {
    fn new(name: String) -> Self {
        Self {
            name,
            // 1 µs .. 1 h, 3 significant digits.
            histogram: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("static histogram bounds are valid"),
            failures: 0,
            failure_kinds: BTreeMap::new(),
            elapsed: Duration::ZERO,
        }
    }

    fn fail(&mut self, kind: String) {
        self.failures += 1;
        *self.failure_kinds.entry(kind).or_default() += 1;
    }

    /// The failures by kind, e.g. `QuorumUnavailable 3, bound 1`; empty
    /// without failures.
    pub fn failures_by_kind(&self) -> String {
        let kinds: Vec<String> = self
            .failure_kinds
            .iter()
            .map(|(kind, count)| format!("{kind} {count}"))
            .collect();
        kinds.join(", ")
    }

    fn record(&mut self, took: Duration) {
        let micros = (took.as_micros() as u64).clamp(1, self.histogram.high());
        // Clamped into range, so recording cannot fail.
        let _ = self.histogram.record(micros);
    }

    /// The `q` quantile, in microseconds (0 with no samples).
    pub fn quantile_us(&self, q: f64) -> u64 {
        self.histogram.value_at_quantile(q)
    }

    /// Successful operations.
    pub fn ops(&self) -> u64 {
        self.histogram.len()
    }

    /// Successful operations per second of the run.
    pub fn ops_per_sec(&self) -> f64 {
        if self.elapsed.is_zero() {
            return 0.0;
        }
        self.ops() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Times `iterations` lock + release operations per client, uncontended
/// (a fresh resource each time), the clients taking turns one operation
/// each. Each operation is bounded by `bound`; a slower one counts as a
/// failure, and a client that fails [`GIVE_UP_AFTER`] times in a row, or has
/// used up [`TIME_BUDGET`], is not asked again (a client that hangs on a
/// dead node would otherwise stall the run). `tick` is called after every
/// round (for progress bars).
pub async fn latency(
    clients: &[&dyn LockClient],
    warmup: usize,
    iterations: usize,
    bound: Duration,
    mut tick: impl FnMut(),
) -> Vec<Stats> {
    let mut stats: Vec<Stats> = clients.iter().map(|c| Stats::new(c.name())).collect();
    let mut failing_in_a_row = vec![0usize; clients.len()];
    let mut spent = vec![Duration::ZERO; clients.len()];
    for i in 0..warmup + iterations {
        for (c, client) in clients.iter().enumerate() {
            if failing_in_a_row[c] >= GIVE_UP_AFTER || spent[c] >= TIME_BUDGET {
                continue;
            }
            let resource = format!("bench:latency:{c}:{i}");
            let started = Instant::now();
            let result = bounded(bound, client.lock_release(&resource)).await;
            spent[c] += started.elapsed();
            failing_in_a_row[c] = if result.is_ok() {
                0
            } else {
                failing_in_a_row[c] + 1
            };
            if i < warmup {
                continue;
            }
            match result {
                Ok(()) => stats[c].record(started.elapsed()),
                Err(kind) => stats[c].fail(kind),
            }
        }
        if i >= warmup {
            tick();
        }
    }
    stats
}

/// Runs `tasks` concurrent loops of lock + release for `duration`. With
/// `shared`, all tasks contend for one resource (successes are hand-offs);
/// otherwise each operation uses its own resource.
pub async fn throughput(
    client: Arc<dyn LockClient>,
    tasks: usize,
    duration: Duration,
    shared: bool,
    bound: Duration,
) -> Stats {
    let started = Instant::now();
    let end = started + duration;
    let mut workers = Vec::new();
    for task in 0..tasks {
        let client = Arc::clone(&client);
        workers.push(tokio::spawn(async move {
            let mut stats = Stats::new(client.name());
            let mut i = 0u64;
            while Instant::now() < end {
                i += 1;
                let resource = if shared {
                    "bench:shared".to_owned()
                } else {
                    format!("bench:tp:{task}:{i}")
                };
                let op_started = Instant::now();
                match bounded(bound, client.lock_release(&resource)).await {
                    Ok(()) => stats.record(op_started.elapsed()),
                    Err(kind) => stats.fail(kind),
                }
            }
            stats
        }));
    }
    let mut total = Stats::new(client.name());
    for worker in workers {
        if let Ok(stats) = worker.await {
            // Same bounds on both sides, so adding cannot fail.
            let _ = total.histogram.add(&stats.histogram);
            total.failures += stats.failures;
            for (kind, count) in stats.failure_kinds {
                *total.failure_kinds.entry(kind).or_default() += count;
            }
        }
    }
    total.elapsed = started.elapsed();
    total
}

/// One operation within `bound`; `Err` says what went wrong (`bound`: no
/// answer in time).
async fn bounded(bound: Duration, op: BoxedOp<'_>) -> Result<(), String> {
    tokio::time::timeout(bound, op)
        .await
        .unwrap_or_else(|_| Err("bound".to_owned()))
}

/// CPU time (user + system) this process has used, from /proc (Linux;
/// zero elsewhere), at the kernel's 10 ms tick: measure seconds, not
/// single operations.
pub fn process_cpu() -> Duration {
    cpu_of("self")
}

/// CPU time (user + system) process `pid` has used, as
/// [`process_cpu`] reads it: e.g. a node's `redis-server` (its `INFO`
/// `process_id`), to weigh what a client costs the servers.
pub fn process_cpu_of(pid: u32) -> Duration {
    cpu_of(&pid.to_string())
}

fn cpu_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // Clock ticks are 100 per second on Linux.
    Duration::from_millis(ticks * 10)
}
