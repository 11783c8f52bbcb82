//! Fencing with PostgreSQL as the protected storage: every update carries
//! the lock's token and only applies while no newer token has been stored.
//!
//!     UPDATE inventory SET stock = $1, fence_token = $2
//!      WHERE sku = $3 AND fence_token <= $2
//!
//! Zero rows updated means "fenced out": a newer holder got there first.
//!
//!     cargo run --example inventory_postgres
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.
//! Database: DATABASE_URL (e.g. `host=127.0.0.1 user=postgres`), or a
//! throw-away local PostgreSQL server (Debian: `apt-get install postgresql`).
//! tests/inventory_postgres.rs runs the same story and checks its outcome.

use std::time::Duration;

use quorumlock::testkit::{PostgresServer, local_or_env};
use quorumlock::{FencingToken, LockManager};
use tokio_postgres::{Client, NoTls};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const SKU: &str = "sku-1";
const TTL: Duration = Duration::from_secs(1);

/// What happened, for printing and for the test's assertions.
pub struct Outcome {
    pub stale_token: FencingToken,
    pub current_token: FencingToken,
    /// Rows the newer holder's update changed (1: accepted).
    pub current_rows: u64,
    /// Rows the stale holder's update changed (0: fenced out).
    pub stale_rows: u64,
    pub final_stock: i32,
    pub final_token: i64,
}

/// The fenced update: applies only if no newer token was stored.
pub async fn fenced_update(
    db: &Client,
    sku: &str,
    stock: i32,
    token: FencingToken,
) -> Result<u64, BoxError> {
    let token = i64::try_from(token.get())?;
    Ok(db
        .execute(
            "UPDATE inventory SET stock = $1, fence_token = $2 \
             WHERE sku = $3 AND fence_token <= $2",
            &[&stock, &token, &sku],
        )
        .await?)
}

pub async fn read_stock(db: &Client, sku: &str) -> Result<(i32, i64), BoxError> {
    let row = db
        .query_one(
            "SELECT stock, fence_token FROM inventory WHERE sku = $1",
            &[&sku],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// A reads, stalls past its TTL; B takes the lock and sells one; A wakes
/// and writes its stale stock with its old token.
pub async fn run_story(db: &Client, lock_urls: &[String]) -> Result<Outcome, BoxError> {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS inventory (
             sku text PRIMARY KEY,
             stock integer NOT NULL,
             fence_token bigint NOT NULL DEFAULT 0
         )",
    )
    .await?;
    db.execute(
        "INSERT INTO inventory (sku, stock, fence_token) VALUES ($1, 100, 0)
         ON CONFLICT (sku) DO UPDATE SET stock = 100",
        &[&SKU],
    )
    .await?;
    let manager = LockManager::builder()
        .nodes(lock_urls.to_vec())
        .ttl(TTL)
        .retry(40, Duration::from_millis(100), Duration::from_millis(20))
        .build()?;
    let resource = format!("inventory:{SKU}");

    let lock_a = manager.lock(&resource).await?;
    let stale_token = lock_a.token().ok_or("fencing is on by default")?;
    let (stock_a, _) = read_stock(db, SKU).await?;
    println!("A: token {stale_token}, read stock {stock_a}, then stalls past its TTL");

    // A is paused; its lock expires and B gets the next one.
    let lock_b = manager.lock(&resource).await?;
    let current_token = lock_b.token().ok_or("fencing is on by default")?;
    let (stock_b, _) = read_stock(db, SKU).await?;
    let current_rows = fenced_update(db, SKU, stock_b - 1, current_token).await?;
    println!("B: token {current_token}, read stock {stock_b}, sold 1: {current_rows} row updated");
    lock_b.release().await?;

    println!("A: wakes up (lock valid? {})", lock_a.is_valid());
    let stale_rows = fenced_update(db, SKU, stock_a - 3, stale_token).await?;
    println!(
        "A: sold 3, writes stock {} with token {stale_token}: {stale_rows} rows updated ({})",
        stock_a - 3,
        if stale_rows == 0 {
            "fenced out"
        } else {
            "ACCEPTED"
        }
    );
    drop(lock_a);

    let (final_stock, final_token) = read_stock(db, SKU).await?;
    Ok(Outcome {
        stale_token,
        current_token,
        current_rows,
        stale_rows,
        final_stock,
        final_token,
    })
}

/// Connects, and drives the connection in the background.
pub async fn connect(config: &str) -> Result<Client, BoxError> {
    let (client, connection) = tokio_postgres::connect(config, NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            eprintln!("postgres connection ended: {error}");
        }
    });
    Ok(client)
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("inventory_postgres example failed: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), BoxError> {
    let nodes = local_or_env(5)?;
    let (config, _server) = match std::env::var("DATABASE_URL") {
        Ok(config) => (config, None),
        Err(_) => {
            let server = PostgresServer::start()?;
            (server.connection_string(), Some(server))
        }
    };
    let db = connect(&config).await?;
    let outcome = run_story(&db, &nodes.urls).await?;
    println!(
        "final: stock {} with fence_token {} (B's sale stands; A's stale write was refused)",
        outcome.final_stock, outcome.final_token
    );
    Ok(())
}
