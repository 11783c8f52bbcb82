//! Fencing with PostgreSQL as the protected storage, per resource as
//! `FencedRedis` does it: a `fence` table keeps the highest token accepted
//! for each lock resource, and every transaction that reads what it will
//! write back, or writes, first raises that token to its own:
//!
//!     INSERT INTO fence (resource, token) VALUES ($1, $2)
//!     ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//!      WHERE fence.token <= EXCLUDED.token
//!
//! Zero rows means "fenced out": a newer holder got there first, so roll
//! back. Then read, write and commit, in the same transaction. The token is
//! recorded *before the read*: checked only at the write, a stale holder
//! could still write between a newer holder's read and its write, and
//! that write would then be overwritten unseen (a lost update). The claim
//! also locks the resource's fence row until commit, so an older holder's
//! claim waits for the transaction and is then refused.
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
use tokio::time::Instant;
use tokio_postgres::{Client, NoTls, Transaction};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const SKU: &str = "sku-1";
const TTL: Duration = Duration::from_secs(1);

/// The lock resource that guards `sku`'s stock, and names its fence row.
pub fn resource(sku: &str) -> String {
    format!("inventory:{sku}")
}

/// What happened, for printing and for the test's assertions.
pub struct Outcome {
    pub stale_token: FencingToken,
    pub current_token: FencingToken,
    /// Whether the stale holder's write was applied (it must not be).
    pub stale_accepted: bool,
    /// Whether the stale holder's write waited for the newer holder's
    /// transaction: it was sent between that holder's read and its write.
    pub stale_waited: bool,
    pub final_stock: i32,
    /// The highest token the fence table holds for the resource.
    pub final_token: i64,
}

/// Creates the tables, and (a demo, never in production) sets the stock to
/// 100 and forgets the tokens of earlier runs, whose lock nodes may be gone.
pub async fn set_up(db: &Client, sku: &str, stock: i32) -> Result<(), BoxError> {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS fence (
             resource text PRIMARY KEY,
             token bigint NOT NULL
         );
         CREATE TABLE IF NOT EXISTS inventory (
             sku text PRIMARY KEY,
             stock integer NOT NULL
         )",
    )
    .await?;
    db.execute(
        "INSERT INTO inventory (sku, stock) VALUES ($1, $2)
         ON CONFLICT (sku) DO UPDATE SET stock = EXCLUDED.stock",
        &[&sku, &stock],
    )
    .await?;
    db.execute("DELETE FROM fence WHERE resource = $1", &[&resource(sku)])
        .await?;
    Ok(())
}

/// Raises `resource`'s highest token to `token`, or finds a higher one
/// (false: fenced out). The first statement of every transaction that
/// reads what it will write back, or writes; it locks the resource's fence
/// row until the transaction ends. A transaction on several resources
/// claims them in one order (sorted, as a lock on several takes them), so
/// that two such transactions cannot deadlock.
pub async fn claim(
    tx: &Transaction<'_>,
    resource: &str,
    token: FencingToken,
) -> Result<bool, BoxError> {
    let token = i64::try_from(token.get())?;
    let rows = tx
        .execute(
            "INSERT INTO fence (resource, token) VALUES ($1, $2)
             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
              WHERE fence.token <= EXCLUDED.token",
            &[&resource, &token],
        )
        .await?;
    Ok(rows == 1)
}

/// A read-modify-write under the lock's token, in one transaction: claim,
/// read, write. The stock after the sale, or `None` when fenced out
/// (nothing changed).
pub async fn sell(
    db: &mut Client,
    sku: &str,
    units: i32,
    token: FencingToken,
) -> Result<Option<i32>, BoxError> {
    let tx = db.transaction().await?;
    if !claim(&tx, &resource(sku), token).await? {
        tx.rollback().await?;
        return Ok(None);
    }
    let stock = read_stock(&tx, sku).await? - units;
    write_stock(&tx, sku, stock).await?;
    tx.commit().await?;
    Ok(Some(stock))
}

/// The stock of `sku`, within a transaction that has claimed it.
pub async fn read_stock(tx: &Transaction<'_>, sku: &str) -> Result<i32, BoxError> {
    let row = tx
        .query_one("SELECT stock FROM inventory WHERE sku = $1", &[&sku])
        .await?;
    Ok(row.get(0))
}

async fn write_stock(tx: &Transaction<'_>, sku: &str, stock: i32) -> Result<(), BoxError> {
    tx.execute(
        "UPDATE inventory SET stock = $1 WHERE sku = $2",
        &[&stock, &sku],
    )
    .await?;
    Ok(())
}

/// Sets the stock to a value computed earlier (a stale holder's write):
/// claim, write. False when fenced out.
pub async fn set_stock(
    db: &mut Client,
    sku: &str,
    stock: i32,
    token: FencingToken,
) -> Result<bool, BoxError> {
    let tx = db.transaction().await?;
    if !claim(&tx, &resource(sku), token).await? {
        tx.rollback().await?;
        return Ok(false);
    }
    write_stock(&tx, sku, stock).await?;
    tx.commit().await?;
    Ok(true)
}

/// The stock and the resource's highest token, as they stand (a report;
/// nothing here is written back).
pub async fn current(db: &Client, sku: &str) -> Result<(i32, i64), BoxError> {
    let row = db
        .query_one(
            "SELECT stock, coalesce(
                 (SELECT token FROM fence WHERE resource = $2), 0)
               FROM inventory WHERE sku = $1",
            &[&sku, &resource(sku)],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The dangerous order: A reads and stalls past its TTL; B takes the lock
/// and reads; A wakes and writes its sale *before* B writes; B writes. Each
/// client has its own connection.
pub async fn run_story(config: &str, lock_urls: &[String]) -> Result<Outcome, BoxError> {
    let (mut db_a, mut db_b, watch) = (
        connect(config).await?,
        connect(config).await?,
        connect(config).await?,
    );
    set_up(&watch, SKU, 100).await?;
    let manager = LockManager::builder()
        .nodes(lock_urls.to_vec())
        .ttl(TTL)
        // The story's servers share one machine, and often its disk, with
        // PostgreSQL (and in the tests with everything else): 50 ms, the
        // default for nodes on a quiet network, is too short there.
        .node_timeout(Duration::from_millis(500))
        .build()?;
    let resource = resource(SKU);

    let lock_a = manager.lock(&resource).await?;
    let stale_token = lock_a.token().ok_or("fencing is on by default")?;
    let stock_a = {
        let tx = db_a.transaction().await?;
        if !claim(&tx, &resource, stale_token).await? {
            return Err("A was fenced out before it stalled".into());
        }
        let stock = read_stock(&tx, SKU).await?;
        tx.commit().await?;
        stock
    };
    println!("A: token {stale_token}, read stock {stock_a}, then stalls past its TTL");

    // A is paused; its lock expires and B gets the next one.
    let lock_b = manager.lock(&resource).await?;
    let current_token = lock_b.token().ok_or("fencing is on by default")?;
    let tx = db_b.transaction().await?;
    if !claim(&tx, &resource, current_token).await? {
        return Err("B, the current holder, was fenced out".into());
    }
    let stock_b = read_stock(&tx, SKU).await?;
    println!("B: token {current_token}, claimed the fence and read stock {stock_b}");

    println!("A: wakes up (lock valid? {})", lock_a.is_valid());
    let a_pid: i32 = db_a.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let mut stale_write =
        tokio::spawn(async move { set_stock(&mut db_a, SKU, stock_a - 3, stale_token).await });
    // Until A's write is done, or waits for B's transaction.
    let (mut stale_waited, deadline) = (false, Instant::now() + Duration::from_secs(5));
    while !stale_write.is_finished() && !stale_waited && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        stale_waited = watch
            .query_one(
                "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false)
                   FROM pg_stat_activity WHERE pid = $1",
                &[&a_pid],
            )
            .await?
            .get(0);
    }
    if stale_waited {
        println!(
            "A: writes stock {} with token {stale_token}: waits for B's transaction",
            stock_a - 3
        );
    }

    write_stock(&tx, SKU, stock_b - 1).await?;
    tx.commit().await?;
    println!("B: sold 1, wrote stock {}, committed", stock_b - 1);
    lock_b.release().await?;

    let stale_accepted = tokio::time::timeout(Duration::from_secs(5), &mut stale_write)
        .await
        .map_err(|_| "A's write still waits after B committed")???;
    println!(
        "A: its write of stock {} (token {stale_token}): {}",
        stock_a - 3,
        if stale_accepted {
            "ACCEPTED"
        } else {
            "fenced out, rolled back"
        }
    );
    drop(lock_a);

    let (final_stock, final_token) = current(&watch, SKU).await?;
    Ok(Outcome {
        stale_token,
        current_token,
        stale_accepted,
        stale_waited,
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
    let outcome = run_story(&config, &nodes.urls).await?;
    println!(
        "final: stock {} with the fence at token {} (B's sale stands; A's stale write was \
         refused, and with the token checked only at the write it would have been accepted, \
         then overwritten by B: a lost sale)",
        outcome.final_stock, outcome.final_token
    );
    Ok(())
}
