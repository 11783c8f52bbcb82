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
            at >= INTERVAL - Duration::from_millis(2) && at < INTERVAL + Duration::from_secs(2),
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
        // (When the run's lock was taken, when its work started.)
        let runs = Arc::new(Mutex::new(Vec::<(Instant, Instant)>::new()));
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
                            .run(|lease| {
                                let runs = Arc::clone(&runs);
                                async move {
                                    let run = (lease.last_extended(), Instant::now());
                                    runs.lock().expect("runs").push(run);
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
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
        // From one run's acquisition to the next run's work: the key is kept
        // from the acquisition's start, on the same host's clock.
        let gaps: Vec<Duration> = runs.windows(2).map(|w| w[1].1 - w[0].0).collect();
        if at_least.is_some() {
            assert!(
                (3..=5).contains(&runs.len()),
                "{} runs in {run_for:?} at most once per {INTERVAL:?}: gaps {gaps:?}",
                runs.len()
            );
            assert!(
                gaps.iter()
                    .all(|gap| *gap >= INTERVAL - Duration::from_millis(2)),
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

/// A holder that crashes (no release, no cleanup, ever) keeps the lock
/// from others until its `at_least` all the same, though its TTL is
/// shorter: the keys were set to live that long (found in review: they
/// lived one TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_keeps_the_lock_until_its_time_as_the_guide_says() {
    let cluster = cluster(3);
    let r = resource("at-least-crash");
    let crashed = builder(cluster.urls()).build().expect("valid");
    let lock = crashed
        .lock(&r)
        .no_wait()
        .ttl(Duration::from_secs(1))
        .at_least(Duration::from_secs(4))
        .await
        .expect("free");
    let taken = lock.acquired_at();
    // A crash: no release, no cleanup, ever.
    std::mem::forget(lock);
    std::mem::forget(crashed);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let other = builder(cluster.urls()).build().expect("valid");
    match other.lock(&r).no_wait().await {
        Err(Error::Contended { .. }) => {}
        Ok(_got) => panic!(
            "taken by another host {:?} after the acquisition of an at_least(4s) lock whose \
             holder crashed",
            taken.elapsed()
        ),
        Err(other) => panic!("{other}"),
    }
}

/// The release of a lock taken over (its value gone from a majority) never
/// lengthens the stale key it left on the minority (found in review: the
/// keep stretched it to the `at_least` time, blocking that node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_lock_does_not_stretch_its_stale_minority_key() {
    let cluster = cluster(3);
    let urls = common::direct_urls(&cluster);
    let r = resource("at-least-taken-over");
    let manager = builder(cluster.urls()).build().expect("valid");
    let lock = manager
        .lock(&r)
        .no_wait()
        .at_least(Duration::from_secs(30))
        .await
        .expect("free");
    // Our key expired on nodes 1 and 2 (their clocks ran fast, or they
    // lost it) and another client took them: a takeover.
    let key = quorumlock::internals::lock_key(&r);
    for url in &urls[1..] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("another-holder")
            .arg("PX")
            .arg(5000)
            .query(&mut common::connect(url))
            .expect("set");
    }
    let before = common::lock_entry(&urls[0], &r)
        .expect("our key on node 0")
        .1;
    let released = lock.release().await;
    assert!(
        matches!(released, Err(Error::NotHeld { .. })),
        "{released:?}"
    );
    assert!(manager.settle().await);
    let left = common::lock_entry(&urls[0], &r);
    assert!(
        left.as_ref().is_none_or(|(_, pttl)| *pttl <= before + 50),
        "the release of a lost lock lengthened its stale key on node 0 from {before} ms to \
         {left:?}"
    );
}

/// Cron fires on every host at the same moment: the recipe (`no_wait`,
/// `at_least`) must run the job on exactly one host per interval. The
/// hosts' single attempts split the votes between them and every one was
/// rolled back, so nobody ran it in 7–29 % of the rounds; and a host that
/// does not run it must be told someone else holds it (`Contended`), not
/// that nobody does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_firing_together_run_the_job_exactly_once() {
    let cluster = cluster(3);
    let hosts: Vec<LockManager> = (0..5).map(|_| manager(cluster.urls())).collect();
    // Every host has met every node.
    for host in &hosts {
        common::reach_every_node(host, &cluster.urls()).await;
    }
    let rounds = 40;
    let mut nobody = 0;
    let mut twice = 0;
    let mut other_errors = Vec::new();
    for round in 0..rounds {
        let job = resource(&format!("at-least-together-{round}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(hosts.len()));
        let tries = hosts.iter().map(|host| {
            let (job, barrier) = (job.clone(), Arc::clone(&barrier));
            async move {
                barrier.wait().await;
                host.lock(&job)
                    .no_wait()
                    .at_least(Duration::from_secs(60))
                    .await
            }
        });
        let outcomes = futures::future::join_all(tries).await;
        let ran = outcomes.iter().filter(|o| o.is_ok()).count();
        match ran {
            0 => nobody += 1,
            1 => {}
            _ => twice += 1,
        }
        for outcome in outcomes {
            match outcome {
                Ok(lock) => drop(lock),
                Err(Error::Contended { .. }) => {}
                Err(other) => other_errors.push(other.to_string()),
            }
        }
    }
    assert_eq!(twice, 0, "the job ran twice in {twice} of {rounds} rounds");
    assert_eq!(
        nobody, 0,
        "nobody ran the job in {nobody} of {rounds} rounds (errors besides Contended: \
         {other_errors:?})"
    );
    assert!(other_errors.is_empty(), "{other_errors:?}");
}
