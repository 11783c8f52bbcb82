//! The stories of examples/transfer.rs and examples/read_write.rs, with
//! assertions: money is neither made nor lost by crossing transfers, and
//! readers share the catalog, never see a version newer than their lock,
//! and writers get their turn.

mod common;

#[path = "../examples/transfer.rs"]
#[allow(dead_code)] // the example's `main` is not used here
mod transfer;

#[path = "../examples/read_write.rs"]
#[allow(dead_code)]
mod read_write;

use std::time::Duration;

/// As the other tests: a disk kept busy by another process's fsyncs can
/// hold one AOF write for over 100 ms.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crossing_transfers_keep_the_total() {
    let nodes = common::cluster(5);
    let report = transfer::run(&nodes.urls(), NODE_TIMEOUT, 8, 10)
        .await
        .expect("the transfers run");
    assert_eq!(report.transfers, 80);
    assert_eq!(
        report.total_after, report.total_before,
        "money was made or lost by {} transfers",
        report.transfers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_no_writer_gets_in_while_they_read() {
    let nodes = common::cluster(5);
    let report = read_write::run(&nodes.urls(), NODE_TIMEOUT, Duration::from_secs(2))
        .await
        .expect("the catalog runs");
    assert_eq!(
        report.newer_than_lock, 0,
        "{} of {} reads saw a version written after their read lock was granted",
        report.newer_than_lock, report.reads
    );
    assert!(
        report.writes > 0 && report.reads > 0,
        "{} writes, {} reads",
        report.writes,
        report.reads
    );
    assert!(
        report.most_readers > 1,
        "readers never shared the lock ({} reads)",
        report.reads
    );
}
