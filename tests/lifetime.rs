//! Keeping locks alive on a real cluster: work longer than the TTL keeps its
//! lock, a lost lock cancels the work before its validity ends, `max_hold`
//! ends a lease, and panics or dropped futures release the lock.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{builder, cluster, eventually_async, resource};
use quorumlock::testkit::TestCluster;
use quorumlock::{Error, LockManager, LossReason};
use tokio::time::Instant;

/// Extended every 333 ms; a 250 ms node timeout rides out a slow disk.
const TTL: Duration = Duration::from_millis(1_000);
const NODE_TIMEOUT: Duration = Duration::from_millis(250);

fn manager(urls: Vec<String>) -> LockManager {
    builder(urls)
        .ttl(TTL)
        // timing: a 1 s TTL extended every 333 ms needs rounds well inside it
        .node_timeout(NODE_TIMEOUT)
        .build()
        .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_longer_than_five_ttls_keeps_the_lock_throughout() {
    let cluster = cluster(5);
    let holder = manager(cluster.urls());
    let other = manager(cluster.urls());
    let name = resource("long-work");

    let (checks, extensions) = holder
        .lock(&name)
        .run(|lease| {
            let (other, name) = (other.clone(), name.clone());
            async move {
                let end = Instant::now() + 5 * TTL + Duration::from_millis(300);
                let (mut checks, mut refused) = (0, 0);
                while Instant::now() < end {
                    match other.lock(&name).no_wait().await {
                        Ok(lock) => panic!("another client got in: {lock:?}"),
                        Err(Error::Contended { .. }) => refused += 1,
                        // A slow node is no entry: only a grant would be.
                        Err(error) => eprintln!("the other client failed otherwise: {error}"),
                    }
                    assert!(
                        lease.is_valid(),
                        "the lease ran out: {:?}",
                        lease.remaining()
                    );
                    assert!(lease.token().is_some());
                    checks += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                assert!(
                    refused * 2 > checks,
                    "the other client was refused in only {refused} of {checks} tries"
                );
                (checks, lease.extensions())
            }
        })
        .await
        .expect("the lock is kept");
    assert!(checks >= 20, "checks {checks}");
    // 5.3 TTLs at one extension per third of a TTL: 15; a slow machine
    // may retry some, so ask for two thirds of that.
    assert!(extensions >= 10, "extensions {extensions}");

    let next = other.lock(&name).no_wait().await.expect("free right after");
    next.release().await.expect("release");
}

/// Runs endless work under `with_lock`, applies `fault` after a second, and
/// checks the work was cancelled before the validity in force ended.
async fn work_is_cancelled_in_time(fault: impl FnOnce(&TestCluster) + Send + 'static) {
    let cluster = Arc::new(cluster(5));
    let manager = manager(cluster.urls());
    let name = resource("loss");
    // Each step of the work records when it ran and the deadline it ran under.
    let steps: Arc<Mutex<Vec<(Instant, Instant, Instant)>>> = Arc::default();

    let injector = {
        let cluster = Arc::clone(&cluster);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            fault(&cluster);
        })
    };
    let result = manager
        .lock(&name)
        .run(|lease| {
            let steps = Arc::clone(&steps);
            async move {
                loop {
                    let step = (Instant::now(), lease.valid_until(), lease.last_extended());
                    steps.lock().expect("steps").push(step);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
        .await;
    let returned = Instant::now();
    injector.await.expect("fault injected");

    match result {
        Err(Error::Lost { ref reason, .. }) => {
            assert!(
                matches!(reason, LossReason::ExtendFailed(_) | LossReason::Expired),
                "{reason}"
            );
        }
        other => panic!("expected Lost, got {other:?}"),
    }
    let steps = steps.lock().expect("steps");
    let &(last_step, deadline, last_extended) = steps.last().expect("the work ran");
    for &(at, valid_until, _) in steps.iter() {
        assert!(
            at < valid_until,
            "a step ran {:?} past its validity",
            at - valid_until
        );
    }
    assert!(
        last_step < deadline,
        "strict: the work stopped before the validity ended"
    );
    let slack = Duration::from_millis(500);
    assert!(
        returned < deadline + slack,
        "Lost returned {:?} after the deadline",
        returned.saturating_duration_since(deadline)
    );
    eprintln!(
        "loss reported {:?} after the last successful extension started \
         ({:?} before the deadline)",
        returned - last_extended,
        deadline.saturating_duration_since(returned)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_three_of_five_nodes_cancels_the_work_in_time() {
    work_is_cancelled_in_time(|cluster| {
        for i in [1, 2, 3] {
            cluster.kill(i).expect("kill");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_three_of_five_nodes_cancels_the_work_in_time() {
    work_is_cancelled_in_time(|cluster| {
        for i in [0, 2, 4] {
            cluster.pause(i).expect("pause");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_stall_is_ridden_out_by_retries() {
    let cluster = Arc::new(cluster(5));
    let manager = manager(cluster.urls());
    let name = resource("stall");
    let staller = {
        let cluster = Arc::clone(&cluster);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for i in [1, 2, 3] {
                cluster.pause(i).expect("pause");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            for i in [1, 2, 3] {
                cluster.resume(i).expect("resume");
            }
        })
    };
    let extensions = manager
        .lock(&name)
        .run(|lease| async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            lease.extensions()
        })
        .await
        .expect("a 200 ms stall does not lose a 1 s lock");
    staller.await.expect("stall injected");
    assert!(extensions >= 3, "extensions {extensions}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_ends_the_lease_and_releases_the_lock() {
    let cluster = cluster(5);
    let max_hold = Duration::from_millis(1_500);
    // A 3 s TTL: the other client gets in at once only if the lock was
    // released, not merely left to expire.
    let holder = builder(cluster.urls())
        .ttl(Duration::from_secs(3))
        .max_hold(max_hold)
        .build()
        .expect("valid");
    let other = manager(cluster.urls());
    let name = resource("max-hold");

    let started = Instant::now();
    let result = holder
        .lock(&name)
        .run(|_| std::future::pending::<()>())
        .await;
    let held = started.elapsed();
    match result {
        Err(Error::Lost {
            reason: LossReason::MaxHoldReached(limit),
            ..
        }) => assert_eq!(limit, max_hold),
        other => panic!("expected MaxHoldReached, got {other:?}"),
    }
    assert!(held >= max_hold, "held {held:?}");
    assert!(held < max_hold + Duration::from_secs(1), "held {held:?}");
    assert!(
        eventually_async(Duration::from_millis(500), || async {
            match other.lock(&name).no_wait().await {
                Ok(lock) => lock.release().await.is_ok(),
                Err(_) => false,
            }
        })
        .await,
        "released at max_hold, well before the 3 s TTL"
    );

    // The guard API is told the same way.
    let keep = holder
        .lock(&name)
        .await
        .expect("free")
        .keep_alive()
        .expect("runtime");
    match keep.lost().await {
        Error::Lost {
            reason: LossReason::MaxHoldReached(_),
            ..
        } => {}
        other => panic!("expected MaxHoldReached, got {other:?}"),
    }
}

/// When (since `started`) `client` was first granted `name`, trying every
/// 20 ms; the lock goes back at once.
async fn first_grant(client: &LockManager, name: &str, started: Instant) -> Duration {
    loop {
        if let Ok(lock) = client.lock(name).no_wait().await {
            let at = started.elapsed();
            let _ = lock.release().await;
            return at;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The review's case for the library: `max_hold` is reached while the
/// work is mid-poll on another worker thread (it blocks that thread for a
/// while). The keys used to be deleted at once, letting another client in
/// while the work still ran; they must stay until the work has stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_loss_leaves_the_keys_until_the_work_has_stopped() {
    let cluster = cluster(5);
    let max_hold = Duration::from_millis(800);
    let holder = builder(cluster.urls())
        .ttl(Duration::from_secs(3))
        .max_hold(max_hold)
        .build()
        .expect("valid");
    let other = manager(cluster.urls());
    let name = resource("loss-order");
    let started = Instant::now();
    // The other client tries every 20 ms from 300 ms on, on its own thread.
    let contender = {
        let (other, name) = (other.clone(), name.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            first_grant(&other, &name, started).await
        })
    };
    let work_ended = Arc::new(Mutex::new(None));
    let result = holder
        .lock(&name)
        .run(|_| {
            let work_ended = Arc::clone(&work_ended);
            async move {
                // Blocks its worker thread across `max_hold`.
                std::thread::sleep(Duration::from_millis(1_500));
                *work_ended.lock().expect("not poisoned") = Some(started.elapsed());
            }
        })
        .await;
    let work_ended = work_ended
        .lock()
        .expect("not poisoned")
        .expect("the work ran to its end");
    let granted = tokio::time::timeout(Duration::from_secs(5), contender)
        .await
        .expect("the other client got the lock once the work stopped")
        .expect("no panic");
    assert!(
        granted >= work_ended,
        "the other client was granted the lock at {granted:?}, while the work (told to stop at \
         max_hold {max_hold:?}) still ran until {work_ended:?}"
    );
    assert!(
        matches!(
            result,
            Err(Error::Lost {
                reason: LossReason::MaxHoldReached(_),
                ..
            })
        ),
        "the work outlived max_hold: {result:?}"
    );
}

/// Work on a blocking thread, by hand: it checks the lease between steps,
/// and the holder waits for it before letting go of the `KeepAlive`. The
/// loss (`max_hold`) stops it at its next check, and the keys stay until
/// it has stopped: the other client never gets in while a step runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_work_that_checks_its_lease_ends_before_anyone_else_starts() {
    let cluster = cluster(5);
    let holder = builder(cluster.urls())
        .ttl(Duration::from_secs(3))
        .max_hold(Duration::from_millis(700))
        .build()
        .expect("valid");
    let other = manager(cluster.urls());
    let name = resource("blocking-steps");
    let started = Instant::now();
    let keep = holder
        .lock(&name)
        .await
        .expect("free")
        .keep_alive()
        .expect("runtime");
    let lease = keep.lease();
    let worker = tokio::task::spawn_blocking(move || {
        let mut last_step_end = Duration::ZERO;
        while lease.is_valid() {
            std::thread::sleep(Duration::from_millis(150));
            last_step_end = started.elapsed();
        }
        last_step_end
    });
    let contender = tokio::spawn(async move { first_grant(&other, &name, started).await });
    let last_step_end = worker.await.expect("no panic");
    drop(keep);
    let granted = tokio::time::timeout(Duration::from_secs(5), contender)
        .await
        .expect("the other client got the lock")
        .expect("no panic");
    assert!(
        last_step_end >= Duration::from_millis(700),
        "setup: the work ran until max_hold, not {last_step_end:?}"
    );
    assert!(
        granted >= last_step_end,
        "the other client got the lock at {granted:?}, while the work's last step ran until \
         {last_step_end:?}"
    );
}

/// Work that blocks a `current_thread` runtime past the lock's validity
/// (the watchdog cannot extend meanwhile) finished after its lock ended:
/// `with_lock` says so rather than returning `Ok`.
#[tokio::test(flavor = "current_thread")]
async fn work_that_blocks_past_the_validity_is_reported_lost() {
    let cluster = cluster(3);
    let holder = manager(cluster.urls());
    let name = resource("blocked-past");
    let result = holder
        .lock(&name)
        .run(|_| async {
            std::thread::sleep(TTL + Duration::from_millis(300));
            42
        })
        .await;
    assert!(
        matches!(result, Err(Error::Lost { .. })),
        "work that ran {:?} past a {TTL:?} lock without yielding returned {result:?}",
        Duration::from_millis(300)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_api_keeps_the_lock_until_stopped() {
    let cluster = cluster(5);
    let holder = manager(cluster.urls());
    let other = manager(cluster.urls());
    let name = resource("guard");

    let keep = holder
        .lock(&name)
        .await
        .expect("free")
        .keep_alive()
        .expect("runtime");
    let token = keep.lease().token();
    tokio::select! {
        lost = keep.lost() => panic!("lost while healthy: {lost}"),
        _ = tokio::time::sleep(3 * TTL) => {}
    }
    assert!(matches!(
        other.lock(&name).no_wait().await,
        Err(Error::Contended { .. })
    ));
    // Stopping hands back a still valid lock with the same token.
    let lock = keep.stop().await.expect("still held");
    assert!(lock.is_valid());
    assert_eq!(lock.token(), token);
    let keep = lock.keep_alive().expect("runtime");
    keep.release().await.expect("release");
    let next = other
        .lock(&name)
        .no_wait()
        .await
        .expect("free after release");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_closure_or_a_dropped_future_releases_the_lock() {
    let cluster = cluster(5);
    // A 10 s TTL: freed within a second means released, not expired.
    let holder = builder(cluster.urls())
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid");
    let other = manager(cluster.urls());

    let name = resource("panic");
    let panicking = {
        let (holder, name) = (holder.clone(), name.clone());
        tokio::spawn(async move {
            holder
                .lock(&name)
                .run(|_| async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    panic!("the work failed");
                })
                .await
        })
    };
    assert!(panicking.await.expect_err("panicked").is_panic());
    assert!(free_soon(&other, &name).await, "released after the panic");

    let name = resource("dropped");
    let dropped = {
        let (holder, name) = (holder.clone(), name.clone());
        tokio::spawn(async move {
            holder
                .lock(&name)
                .run(|_| std::future::pending::<()>())
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        other.lock(&name).no_wait().await,
        Err(Error::Contended { .. })
    ));
    dropped.abort();
    assert!(free_soon(&other, &name).await, "released after the drop");
}

async fn free_soon(client: &LockManager, name: &str) -> bool {
    eventually_async(Duration::from_secs(1), || async {
        match client.lock(name).no_wait().await {
            Ok(lock) => lock.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await
}

/// A lease handed to work vouches for the lock only while the keep-alive
/// runs: stopping, releasing or dropping the keep-alive ends every clone
/// at once, long before the validity it last had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_when_its_keep_alive_is_stopped_released_or_dropped() {
    let cluster = cluster(3);
    let holder = manager(cluster.urls());
    let long = Duration::from_secs(30);
    for how in ["stop", "release", "drop"] {
        let name = resource(&format!("lease-ends-{how}"));
        let keep = holder
            .lock(&name)
            .ttl(long)
            .await
            .expect("free")
            .keep_alive()
            .expect("runtime");
        let lease = keep.lease();
        let work = tokio::spawn({
            let lease = lease.clone();
            async move { lease.lost().await }
        });
        assert!(lease.is_valid(), "{how}: valid while kept alive");
        let stopped = Instant::now();
        match how {
            "stop" => keep
                .stop()
                .await
                .expect("held")
                .release()
                .await
                .expect("release"),
            "release" => keep.release().await.expect("release"),
            _ => drop(keep),
        }
        let lost = tokio::time::timeout(Duration::from_secs(5), work)
            .await
            .unwrap_or_else(|_| panic!("{how}: the work's lease still vouched 5 s later"))
            .expect("task");
        assert!(
            matches!(
                lost,
                Error::Lost {
                    reason: LossReason::Stopped,
                    ..
                }
            ),
            "{how}: the lease ended with {lost:?}"
        );
        assert!(!lease.is_valid(), "{how}: a stopped lease is not valid");
        assert_eq!(lease.remaining(), Duration::ZERO, "{how}");
        eprintln!("{how}: the lease ended {:?} after", stopped.elapsed());
        holder.settle().await;
    }
}
