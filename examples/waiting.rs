//! Waiting for a busy lock: six workers of two services (two managers,
//! separate connections) queue for one resource while a seventh holds it.
//! Each is woken by the release before it, in the order they arrived; one
//! gives up at its deadline with a typed error.
//!
//!     cargo run --example waiting
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quorumlock::testkit::local_or_env;
use quorumlock::{Error, LockManager};
use tokio::time::Instant;

#[tokio::main]
async fn main() {
    // Kept to the end: a local cluster lives as long as its `NodeSet`.
    let nodes = local_or_env(5).expect("nodes");
    let urls = nodes.urls.clone();
    match run_story(|| LockManager::builder().nodes(urls.clone()).build()).await {
        Ok(story) => {
            for line in &story.timeline {
                println!("{line}");
            }
        }
        Err(error) => {
            eprintln!("waiting failed: {error}");
            std::process::exit(1);
        }
    }
}

/// What happened: the order the workers were served in, and what the
/// impatient one was told.
pub struct Story {
    pub served: Vec<usize>,
    pub impatient: Result<(), Error>,
    pub timeline: Vec<String>,
}

/// Runs the story with two managers made by `manager` (the defaults here;
/// the test gives them room for a slow disk).
pub async fn run_story(manager: impl Fn() -> Result<LockManager, Error>) -> Result<Story, Error> {
    let services = [manager()?, manager()?];
    let resource = format!("example:nightly-report:{}", std::process::id());
    let started = Instant::now();
    let timeline = Arc::new(Mutex::new(Vec::new()));
    let log = {
        let timeline = Arc::clone(&timeline);
        move |line: String| {
            let at = started.elapsed().as_millis();
            timeline.lock().unwrap().push(format!("{at:>5} ms  {line}"));
        }
    };

    // The holder keeps the resource for a second (its TTL is 10 s: without
    // the release, waiters would sleep until the keys expire).
    let holder = services[0].lock(&resource).await?;
    log("holder: acquired; working for 1 s".into());

    let served = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for worker in 0..6 {
        let manager = services[worker % 2].clone();
        let (resource, served, log) = (resource.clone(), Arc::clone(&served), log.clone());
        workers.push(tokio::spawn(async move {
            log(format!("worker {worker}: waiting (up to 30 s)"));
            let lock = manager
                .lock(&resource)
                .wait(Duration::from_secs(30))
                .await?;
            served.lock().unwrap().push(worker);
            log(format!(
                "worker {worker}: acquired, token {}",
                lock.token().map_or(0, |t| t.get())
            ));
            tokio::time::sleep(Duration::from_millis(50)).await;
            lock.release().await
        }));
        // Arrival order is the order of service.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }

    // One more, who will not wait past 300 ms.
    let impatient = match services[1]
        .lock(&resource)
        .wait(Duration::from_millis(300))
        .await
    {
        Ok(lock) => lock.release().await,
        Err(error) => {
            log(format!("impatient: {error}"));
            Err(error)
        }
    };

    tokio::time::sleep(Duration::from_millis(500)).await;
    log("holder: releasing".into());
    holder.release().await?;
    for worker in workers {
        worker.await.expect("no panic")?;
    }
    for service in &services {
        service.settle().await;
    }
    let served = served.lock().unwrap().clone();
    let timeline = timeline.lock().unwrap().clone();
    Ok(Story {
        served,
        impatient,
        timeline,
    })
}
