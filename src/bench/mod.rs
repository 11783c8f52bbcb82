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
pub use run::{
    GIVE_UP_AFTER, Stats, TIME_BUDGET, latency, process_cpu, process_cpu_of, throughput,
};
