//! The benchmark engine (feature `bench`), shared by `cargo bench` and the
//! CLI's `bench` command: lock clients behind one trait, latency runs that
//! interleave clients so noise hits them alike, throughput runs at a given
//! concurrency, and a table of percentiles with ratios to a baseline.
//!
//! Percentiles come from HDR histograms (microsecond resolution, 3
//! significant digits): a lock benchmark is about tails and concurrency on
//! a live cluster, which a statistics-of-the-mean harness does not report.

mod clients;
pub mod hot;
mod raw;
mod report;
mod run;

pub use clients::{BoxedOp, Floor, LockClient, QuorumFloor, Quorumlock};
pub use raw::RawQuorumFloor;
pub use report::{Row, table};
/// The `TCP_NODELAY` every client of a benchmark runs with: the library's
/// default, unless `QUORUMLOCK_BENCH_NODELAY` is `0` or `1` (to measure
/// the setting itself).
pub fn nodelay() -> bool {
    match std::env::var("QUORUMLOCK_BENCH_NODELAY").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => crate::connect::DEFAULT_NODELAY,
    }
}

/// A client for the node at `url` with the socket options of
/// [`nodelay`]: every floor and peer in a benchmark runs with the options
/// the library uses (see
/// [`LockManagerBuilder::tcp_nodelay`](crate::LockManagerBuilder::tcp_nodelay)).
pub fn node_client(url: &str) -> Result<redis::Client, String> {
    let client = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
    Ok(crate::connect::with_nodelay(client, nodelay()))
}

pub use run::{
    GIVE_UP_AFTER, Stats, TIME_BUDGET, latency, process_cpu, process_cpu_of, throughput,
};
