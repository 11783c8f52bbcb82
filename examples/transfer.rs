//! Moving money between accounts: each transfer locks both accounts at
//! once (`lock_many_within`), so transfers that cross (a → b while b → a)
//! cannot deadlock, and writes each balance with the lock's fencing token.
//! The total across accounts never changes.
//!
//!     cargo run --example transfer
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes; the
//! balances live on the first node, behind `FencedRedis`.

use std::time::Duration;

use quorumlock::testkit::local_or_env;
use quorumlock::{Error, Fence, FencedRedis, FencingToken, LockManager};

const ACCOUNTS: usize = 6;
const OPENING_BALANCE: i64 = 1_000;

#[tokio::main]
async fn main() {
    // Kept until the end: dropping the set stops local nodes.
    let nodes = local_or_env(5).expect("nodes");
    match run(&nodes.urls, quorumlock::DEFAULT_NODE_TIMEOUT, 8, 25).await {
        Ok(report) => println!(
            "{} transfers by 8 tasks; total before {}, after {}",
            report.transfers, report.total_before, report.total_after
        ),
        Err(error) => {
            eprintln!("transfer failed: {error}");
            std::process::exit(1);
        }
    }
}

/// What the run did.
pub struct Report {
    pub transfers: usize,
    pub total_before: i64,
    pub total_after: i64,
}

/// `node_timeout`: the default (50 ms) suits a dedicated cluster; the tests
/// pass more, for a machine whose disk another process keeps busy.
pub async fn run(
    urls: &[String],
    node_timeout: Duration,
    tasks: usize,
    per_task: usize,
) -> Result<Report, Error> {
    let bank = format!("example:bank:{}", std::process::id());
    let account = move |i: usize| format!("{bank}:account:{i}");
    let storage = FencedRedis::new(&urls[0])?;
    for i in 0..ACCOUNTS {
        // Token 0 opens the account: any holder's token is at least that.
        let opening = Fence::new(account(i), FencingToken::new(0))?;
        storage
            .set(&opening, &account(i), OPENING_BALANCE.to_string())
            .await?;
    }
    let total_before = total(&storage, &account).await?;

    let mut workers = Vec::new();
    for task in 0..tasks {
        // Each task is its own client, as separate processes would be.
        let manager = LockManager::builder()
            .nodes(urls.to_vec())
            .node_timeout(node_timeout)
            .build()?;
        let storage = FencedRedis::new(&urls[0])?;
        let account = account.clone();
        workers.push(tokio::spawn(async move {
            for n in 0..per_task {
                let from = (task + n) % ACCOUNTS;
                // Every other transfer goes the other way round.
                let to = (from + 1 + n % (ACCOUNTS - 1)) % ACCOUNTS;
                let (from, to) = (account(from), account(to));
                let lock = manager
                    .lock_many(&[&from, &to])
                    .wait(Duration::from_secs(30))
                    .await?;
                let balance = |key: &str| {
                    let storage = &storage;
                    let key = key.to_owned();
                    async move {
                        let text = storage.get(&key).await?.unwrap_or_default();
                        Ok::<i64, Error>(text.parse().unwrap_or(0))
                    }
                };
                let amount = 1 + (n as i64 % 50);
                let (debit, credit) =
                    (balance(&from).await? - amount, balance(&to).await? + amount);
                // One token, valid for both accounts.
                let (fence_from, fence_to) = (lock.fence_for(&from)?, lock.fence_for(&to)?);
                storage.set(&fence_from, &from, debit.to_string()).await?;
                storage.set(&fence_to, &to, credit.to_string()).await?;
                lock.release().await?;
            }
            Ok::<usize, Error>(per_task)
        }));
    }
    let mut transfers = 0;
    for worker in workers {
        transfers += worker.await.expect("no panic")?;
    }
    Ok(Report {
        transfers,
        total_before,
        total_after: total(&storage, &account).await?,
    })
}

async fn total(storage: &FencedRedis, account: &impl Fn(usize) -> String) -> Result<i64, Error> {
    let mut sum = 0;
    for i in 0..ACCOUNTS {
        let text = storage.get(&account(i)).await?.unwrap_or_default();
        sum += text.parse::<i64>().unwrap_or(0);
    }
    Ok(sum)
}
