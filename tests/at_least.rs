//! At most once per interval (`Request::at_least`): a lock released early
//! keeps its key until the minimum time after its acquisition, so a job
//! that several hosts start on the same schedule runs once per interval.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{builder, cluster, resource};
use quorumlock::{Error, LockManager};
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_millis(1500);

fn manager(urls: Vec<String>) -> LockManager {
    builder(urls).build().expect("valid settings")
}

/// Released or dropped early, the lock stays taken until `at_least` after
/// its acquisition, then is free again; the release itself says the lock
/// was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_release_or_drop_keeps_the_lock_until_its_time() {
    let cluster = cluster(3);
    let manager = manager(cluster.urls());
    for drop_it in [false, true] {
        let r = resource("at-least");
        let lock = manager
            .lock(&r)
            .no_wait()
            .at_least(INTERVAL)
            .await
            .expect("free");
        let taken = lock.acquired_at();
        if drop_it {
            drop(lock);
            assert!(manager.settle().await);
        } else {
            lock.release().await.expect("held: the release worked");
        }
        // Refused until its time, from any client.
        let other = common::builder(cluster.urls()).build().expect("valid");
        let mut refusals = 0;
        while Instant::now() + Duration::from_millis(150) < taken + INTERVAL {
            match other.lock(&r).no_wait().await {
                Err(Error::Contended { .. }) => refusals += 1,
                got => panic!(
                    "drop: {drop_it}: taken {:?} after the acquisition, before its time: {got:?}",
                    taken.elapsed()
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(refusals >= 5, "drop: {drop_it}: {refusals} refusals");
        // Then free: a waiter gets it once the key expires.
        let next = other
            .lock(&r)
            .wait(Duration::from_secs(5))
            .await
            .expect("free after its time");
        let at = taken.elapsed();
        assert!(
            at >= INTERVAL - Duration::from_millis(50) && at < INTERVAL + Duration::from_secs(2),
            "drop: {drop_it}: free again {at:?} after the acquisition"
        );
        next.release().await.expect("held");
    }
}

/// A lock held past its `at_least` is released as usual, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_time_is_up_frees_at_once() {
    let cluster = cluster(3);
    let manager = manager(cluster.urls());
    let r = resource("at-least-past");
    let lock = manager
        .lock(&r)
        .at_least(Duration::from_millis(200))
        .await
        .expect("free");
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.release().await.expect("held");
    manager
        .lock(&r)
        .no_wait()
        .await
        .expect("free at once")
        .release()
        .await
        .expect("held");
}

/// Five hosts' managers run the same job on the same schedule (every
/// 250 ms each, out of phase), each with `no_wait` and `at_least` of the
/// interval: the job runs about once per interval, never twice within one.
/// Without `at_least` the same schedule runs it many times per interval
/// (the control: the test can tell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_hosts_on_one_schedule_run_the_job_once_per_interval() {
    let cluster = cluster(3);
    let run_for = Duration::from_millis(4 * INTERVAL.as_millis() as u64 + 500);
    for at_least in [Some(INTERVAL), None] {
        let r = resource("cron");
        let runs = Arc::new(Mutex::new(Vec::<Instant>::new()));
        let start = Instant::now();
        let hosts: Vec<_> = (0..5)
            .map(|host| {
                let (manager, r, runs) = (manager(cluster.urls()), r.clone(), Arc::clone(&runs));
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50 * host)).await;
                    while start.elapsed() < run_for {
                        let request = manager.lock(&r).no_wait();
                        let request = match at_least {
                            Some(at_least) => request.at_least(at_least),
                            None => request,
                        };
                        let ran = request
                            .run(|_lease| async {
                                runs.lock().expect("runs").push(Instant::now());
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            })
                            .await;
                        match ran {
                            Ok(()) | Err(Error::Contended { .. }) => {}
                            Err(other) => panic!("host {host}: {other}"),
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                })
            })
            .collect();
        for host in hosts {
            host.await.expect("no panic");
        }
        let runs = runs.lock().expect("runs").clone();
        let gaps: Vec<Duration> = runs.windows(2).map(|w| w[1] - w[0]).collect();
        if at_least.is_some() {
            assert!(
                (3..=5).contains(&runs.len()),
                "{} runs in {run_for:?} at most once per {INTERVAL:?}: gaps {gaps:?}",
                runs.len()
            );
            assert!(
                gaps.iter()
                    .all(|gap| *gap >= INTERVAL - Duration::from_millis(50)),
                "two runs within one interval: gaps {gaps:?}"
            );
        } else {
            assert!(
                runs.len() >= 10,
                "the control ran only {} times: gaps {gaps:?}",
                runs.len()
            );
        }
    }
}
