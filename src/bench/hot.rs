//! The hot-resource scenario: many waiters spread over several clients
//! (separate connections) take one resource in turn, hold it briefly,
//! release it and queue again. Measures hand-offs, the gap between one
//! holder's release and the next holder's acquisition, waiting times, who
//! gets the lock, and checks every hold against the others (no overlap,
//! tokens strictly increasing). Also: how soon a crashed holder's keys are
//! taken over after they expire.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use hdrhistogram::Histogram;

use crate::{Error, LockManager};

/// A future of the hot-resource engine.
pub type HotFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// A held lock: its fencing token, if the client has one, and the release
/// (run when awaited).
pub struct Held<'a> {
    /// The fencing token, checked to increase strictly from hold to hold.
    pub token: Option<u64>,
    /// Releases the lock.
    pub release: HotFuture<'a, ()>,
}

/// A client that waits for a busy lock in its own way.
pub trait Contender: Send + Sync {
    /// A name for the tables.
    fn name(&self) -> String;
    /// The Redis key the client locks `resource` under (to play a crashed
    /// holder).
    fn key(&self, resource: &str) -> String;
    /// Takes the lock on `resource`, waiting as long as it takes.
    fn acquire<'a>(&'a self, resource: &'a str) -> HotFuture<'a, Held<'a>>;
}

/// quorumlock waiting, as `manager.lock(r).await` does (woken by
/// releases, queued in arrival order).
pub struct Waiting(pub LockManager);

/// quorumlock as before waiting existed: one attempt
/// (`lock(r).no_wait()`) every 200 ± 100 ms until one succeeds.
pub struct Polling(pub LockManager);

fn held(lock: crate::Lock) -> Held<'static> {
    Held {
        token: lock.token().map(|token| token.get()),
        release: Box::pin(async move { lock.release().await.map_err(|e| e.to_string()) }),
    }
}

impl Contender for Waiting {
    fn name(&self) -> String {
        "quorumlock, waiting".to_owned()
    }

    fn key(&self, resource: &str) -> String {
        crate::internals::lock_key(resource)
    }

    fn acquire<'a>(&'a self, resource: &'a str) -> HotFuture<'a, Held<'a>> {
        Box::pin(async move {
            loop {
                match self.0.lock(resource).wait(Duration::from_secs(60)).await {
                    Ok(lock) => return Ok(held(lock)),
                    Err(Error::WaitTimedOut { .. }) => continue,
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
    }
}

impl Contender for Polling {
    fn name(&self) -> String {
        "quorumlock, polling lock()".to_owned()
    }

    fn key(&self, resource: &str) -> String {
        crate::internals::lock_key(resource)
    }

    fn acquire<'a>(&'a self, resource: &'a str) -> HotFuture<'a, Held<'a>> {
        Box::pin(async move {
            loop {
                match self.0.lock(resource).no_wait().await {
                    Ok(lock) => return Ok(held(lock)),
                    Err(Error::Contended { .. }) => {
                        let pause = Duration::from_millis(100 + fastrand::u64(0..=200));
                        tokio::time::sleep(pause).await;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
    }
}

/// The shape of one hot-resource run.
#[derive(Debug, Clone)]
pub struct HotOptions {
    /// Waiters, spread round-robin over the clients.
    pub waiters: usize,
    /// Work done while holding the lock.
    pub hold: Duration,
    /// Length of the run.
    pub run_for: Duration,
}

/// One hold, as the waiter that had it saw it.
#[derive(Debug, Clone, Copy)]
struct Hold {
    waiter: usize,
    asked: Instant,
    acquired: Instant,
    release_sent: Instant,
    released: Instant,
    token: Option<u64>,
}

/// What one hot-resource run measured.
#[derive(Debug, Clone)]
pub struct HotStats {
    /// The client's name.
    pub name: String,
    /// Waiters in the run.
    pub waiters: usize,
    /// Successful acquisitions.
    pub acquisitions: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Release returned → next acquisition returned, µs (0 when the next
    /// acquisition returned first).
    pub gap: Histogram<u64>,
    /// Asked → acquired, µs.
    pub wait: Histogram<u64>,
    /// Acquisitions by a different waiter than the one before.
    pub to_another: u64,
    /// Holds that began before the previous one's release was sent.
    pub overlaps: u64,
    /// Tokens not above the previous hold's (`None`: the client has none).
    pub token_regressions: Option<u64>,
    /// Acquisitions or releases that failed.
    pub failures: u64,
    /// Redis commands the nodes ran during the run (`INFO commandstats`).
    pub commands: Option<u64>,
}

impl HotStats {
    /// Acquisitions per second.
    pub fn per_sec(&self) -> f64 {
        self.acquisitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Mean time from one acquisition to the next.
    pub fn mean_cycle(&self) -> Duration {
        self.elapsed / (self.acquisitions.max(1) as u32)
    }

    /// Commands per acquisition.
    pub fn commands_per_acquisition(&self) -> Option<f64> {
        self.commands
            .map(|commands| commands as f64 / self.acquisitions.max(1) as f64)
    }

    /// Commands per acquisition for a table (`n/a` when unknown).
    pub fn commands_label(&self) -> String {
        self.commands_per_acquisition()
            .map_or("n/a".to_owned(), |c| format!("{c:.1}"))
    }

    /// The token check for a table: `increasing`, `N regressions`, or
    /// `none issued`.
    pub fn tokens_label(&self) -> String {
        match self.token_regressions {
            Some(0) => "increasing".to_owned(),
            Some(n) => format!("{n} regressions"),
            None => "none issued".to_owned(),
        }
    }

    /// Share of acquisitions that went to another waiter than the last.
    pub fn share_to_another(&self) -> f64 {
        self.to_another as f64 / self.acquisitions.max(1) as f64
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

fn micros(d: Duration) -> u64 {
    (d.as_micros() as u64).clamp(1, 3_600_000_000)
}

/// Runs the hot-resource scenario on `resource`: `options.waiters` tasks,
/// waiter `i` using `clients[i % clients.len()]`, each taking the lock,
/// holding it `options.hold`, releasing it and asking again, until
/// `options.run_for` has passed. `urls` are read for command counts.
pub async fn hot(
    clients: &[Arc<dyn Contender>],
    urls: &[String],
    resource: &str,
    options: &HotOptions,
) -> HotStats {
    let holds = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(Mutex::new(0u64));
    let before = commands_total(urls).await;
    let started = Instant::now();
    let stop = started + options.run_for;
    let tasks = (0..options.waiters).map(|waiter| {
        let client = Arc::clone(&clients[waiter % clients.len()]);
        let (holds, failures) = (Arc::clone(&holds), Arc::clone(&failures));
        let (resource, hold) = (resource.to_owned(), options.hold);
        tokio::spawn(async move {
            while Instant::now() < stop {
                let asked = Instant::now();
                let held = match client.acquire(&resource).await {
                    Ok(held) => held,
                    Err(_) => {
                        *failures.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                        continue;
                    }
                };
                let acquired = Instant::now();
                tokio::time::sleep(hold).await;
                let release_sent = Instant::now();
                if held.release.await.is_err() {
                    *failures.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                }
                holds.lock().unwrap_or_else(|e| e.into_inner()).push(Hold {
                    waiter,
                    asked,
                    acquired,
                    release_sent,
                    released: Instant::now(),
                    token: held.token,
                });
            }
        })
    });
    join_all(tasks).await;
    let elapsed = started.elapsed();
    let after = commands_total(urls).await;
    let mut holds = std::mem::take(&mut *holds.lock().unwrap_or_else(|e| e.into_inner()));
    holds.sort_by_key(|hold| hold.acquired);
    let mut stats = HotStats {
        name: clients.first().map(|c| c.name()).unwrap_or_default(),
        waiters: options.waiters,
        acquisitions: holds.len() as u64,
        elapsed,
        gap: histogram(),
        wait: histogram(),
        to_another: 0,
        overlaps: 0,
        token_regressions: holds.first().and_then(|h| h.token).map(|_| 0),
        failures: *failures.lock().unwrap_or_else(|e| e.into_inner()),
        commands: before.zip(after).map(|(b, a)| a.saturating_sub(b)),
    };
    for hold in &holds {
        let _ = stats.wait.record(micros(hold.acquired - hold.asked));
    }
    for pair in holds.windows(2) {
        let (previous, next) = (&pair[0], &pair[1]);
        let _ = stats.gap.record(micros(
            next.acquired.saturating_duration_since(previous.released),
        ));
        if next.waiter != previous.waiter {
            stats.to_another += 1;
        }
        if next.acquired < previous.release_sent {
            stats.overlaps += 1;
        }
        if let (Some(regressions), Some(a), Some(b)) =
            (stats.token_regressions.as_mut(), previous.token, next.token)
            && b <= a
        {
            *regressions += 1;
        }
    }
    stats
}

/// A crashed holder: `client`'s key for `resource` is set directly on every
/// node with a TTL of `expiry`, then `waiters` waiters (spread over
/// `clients`) ask for it. Returns how long after the keys expired the
/// first of them acquired it.
pub async fn after_crash(
    clients: &[Arc<dyn Contender>],
    urls: &[String],
    resource: &str,
    waiters: usize,
    expiry: Duration,
) -> Result<Duration, String> {
    let key = clients.first().ok_or("no client")?.key(resource);
    for url in urls {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("SET")
            .arg(&key)
            .arg("crashed")
            .arg("PX")
            .arg(expiry.as_millis() as u64)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    let expires = Instant::now() + expiry;
    let (first, mut rest) = tokio::sync::mpsc::unbounded_channel();
    let tasks: Vec<_> = (0..waiters)
        .map(|waiter| {
            let client = Arc::clone(&clients[waiter % clients.len()]);
            let (first, resource) = (first.clone(), resource.to_owned());
            tokio::spawn(async move {
                if let Ok(held) = client.acquire(&resource).await {
                    let _ = first.send(Instant::now());
                    let _ = held.release.await;
                }
            })
        })
        .collect();
    let acquired = tokio::time::timeout(expiry + Duration::from_secs(30), rest.recv())
        .await
        .map_err(|_| "no waiter acquired the lock within 30 s of the expiry".to_owned())?
        .ok_or("every waiter failed")?;
    for task in tasks {
        task.abort();
    }
    Ok(acquired.saturating_duration_since(expires))
}

/// Commands run so far, summed over the nodes (`INFO commandstats`);
/// `None` if a node cannot tell.
pub async fn commands_total(urls: &[String]) -> Option<u64> {
    let mut total = 0;
    for url in urls {
        let client = redis::Client::open(url.as_str()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .ok()?;
        total += calls_in(&info);
    }
    Some(total)
}

/// The `calls=` of every `cmdstat_` line except the `INFO` the count itself
/// sends.
fn calls_in(info: &str) -> u64 {
    info.lines()
        .filter(|line| line.starts_with("cmdstat_") && !line.starts_with("cmdstat_info:"))
        .filter_map(|line| {
            let calls = line.split("calls=").nth(1)?;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_counts_read_from_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_set:calls=10,usec=30,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha:calls=5,usec=50,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_info:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(calls_in(info), 15);
    }
}
