//! A suspended client host (a laptop lid, a paused VM): its monotonic
//! clock stands still while the nodes' clocks, and their keys' TTLs, run
//! on. Simulated with the testkit's clock seam (the boot clock moves on,
//! the monotonic one does not); the nodes' keys are expired by hand, as
//! the nodes would have during the suspend. One test per binary: the
//! simulated suspend is process-wide.

mod common;

use std::time::Duration;

use common::{builder, resource};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_invalid_after_a_suspend_longer_than_its_validity() {
    let cluster = common::cluster(3);
    let urls = cluster.urls();
    let manager = builder(urls.clone())
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let other = builder(urls.clone()).build().expect("valid");
    let (plain, kept) = (resource("suspend-plain"), resource("suspend-kept"));
    let lock = manager.lock(&plain).await.expect("free");
    let keep = manager
        .lock(&kept)
        .await
        .expect("free")
        .keep_alive()
        .expect("runtime");
    let lease = keep.lease();
    let watching = tokio::spawn({
        let lease = lease.clone();
        async move { lease.lost().await }
    });

    // The host sleeps 5 s; meanwhile the nodes expire both locks' keys.
    quorumlock::testkit::simulate_suspend(Duration::from_secs(5));
    for url in &urls {
        for name in [&plain, &kept] {
            let _: i64 = redis::cmd("PEXPIRE")
                .arg(quorumlock::internals::lock_key(name))
                .arg(1)
                .query(&mut common::connect(url))
                .expect("PEXPIRE");
        }
    }
    let resumed = Instant::now();
    assert!(
        !lock.is_valid() && lock.remaining() == Duration::ZERO,
        "after a 5 s suspend, a 3 s lock still claims validity ({:?} left) though the nodes' keys \
         expired",
        lock.remaining()
    );
    assert!(
        !lease.is_valid(),
        "after a 5 s suspend, a kept-alive lease still claims validity ({:?} left)",
        lease.remaining()
    );
    let lost = tokio::time::timeout(Duration::from_secs(3), watching)
        .await
        .expect("lost() resolved after the resume")
        .expect("no panic");
    assert!(
        resumed.elapsed() < Duration::from_millis(1_500),
        "lost() resolved {:?} after the resume: {lost}",
        resumed.elapsed()
    );
    // Another client may take them now; the holder no longer claims them.
    let taken = other.lock(&plain).await.expect("the keys expired");
    assert!(!lock.is_valid(), "both claim the lock");
    taken.release().await.expect("release");
    drop(keep);
}
