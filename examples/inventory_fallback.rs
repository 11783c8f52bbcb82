//! A shop that keeps selling while Redis is down: each sale runs under the
//! lock with `with_lock_within_or_fallback`, and when the lock service is
//! unavailable, the fallback sells under a PostgreSQL row lock instead.
//!
//! Both paths do their read-modify-write in one transaction that locks the
//! row (`SELECT … FOR UPDATE`), so they serialize on it; the locked path
//! also checks and stores its fencing token there, so a holder whose lock
//! expired is still refused once a newer holder has written.
//!
//!     cargo run --example inventory_fallback
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.
//! Clients "cut off" from them reach the same nodes through fault proxies
//! that refuse every connection. Database: DATABASE_URL, or a throw-away
//! local PostgreSQL server. tests/fallback_postgres.rs runs the same shop
//! and checks the books.

use std::net::SocketAddr;
use std::time::Duration;

use quorumlock::fallback::Ran;
use quorumlock::testkit::{FaultProxy, PostgresServer, local_or_env};
use quorumlock::{Backoff, CircuitBreaker, FencingToken, LockManager};
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const SKU: &str = "sku-fallback";
pub const INITIAL_STOCK: i32 = 60;
const TTL: Duration = Duration::from_secs(2);

/// What one attempt to sell did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sale {
    Sold,
    SoldOut,
    /// The token was older than one the row already accepted.
    FencedOut {
        offered: i64,
        highest: i64,
    },
}

/// Creates (or resets) the row and the sales log.
pub async fn set_up(db: &Client) -> Result<(), BoxError> {
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS shop_stock (
             sku text PRIMARY KEY,
             stock integer NOT NULL,
             fence_token bigint NOT NULL DEFAULT 0
         );
         CREATE TABLE IF NOT EXISTS shop_sales (
             id bigserial PRIMARY KEY,
             sku text NOT NULL,
             path text NOT NULL,
             token bigint
         );
         TRUNCATE shop_sales;",
    )
    .await?;
    db.execute(
        "INSERT INTO shop_stock (sku, stock, fence_token) VALUES ($1, $2, 0)
         ON CONFLICT (sku) DO UPDATE SET stock = $2, fence_token = 0",
        &[&SKU, &INITIAL_STOCK],
    )
    .await?;
    Ok(())
}

/// The locked path: in one transaction that locks the row, refuse a
/// token older than the row's, else sell one and store the token. (A
/// `Transaction` rolls back when dropped: if the lock is lost and the work
/// is cancelled at an await, nothing half-done is left, and the row lock
/// is let go.)
pub async fn sell_fenced(db: &mut Client, token: FencingToken) -> Result<Sale, BoxError> {
    let token = i64::try_from(token.get())?;
    let tx = db.transaction().await?;
    let row = tx
        .query_one(
            "SELECT stock, fence_token FROM shop_stock WHERE sku = $1 FOR UPDATE",
            &[&SKU],
        )
        .await?;
    let (stock, highest): (i32, i64) = (row.get(0), row.get(1));
    if token < highest {
        return Ok(Sale::FencedOut {
            offered: token,
            highest,
        });
    }
    if stock == 0 {
        return Ok(Sale::SoldOut);
    }
    tx.execute(
        "UPDATE shop_stock SET stock = stock - 1, fence_token = $2 WHERE sku = $1",
        &[&SKU, &token],
    )
    .await?;
    tx.execute(
        "INSERT INTO shop_sales (sku, path, token) VALUES ($1, 'lock', $2)",
        &[&SKU, &token],
    )
    .await?;
    tx.commit().await?;
    Ok(Sale::Sold)
}

/// The fallback: the same transaction shape without a token. The row lock
/// is its only exclusion, and it covers only what happens in this database.
pub async fn sell_unlocked(db: &mut Client) -> Result<Sale, BoxError> {
    let tx = db.transaction().await?;
    let row = tx
        .query_one(
            "SELECT stock FROM shop_stock WHERE sku = $1 FOR UPDATE",
            &[&SKU],
        )
        .await?;
    let stock: i32 = row.get(0);
    if stock == 0 {
        return Ok(Sale::SoldOut);
    }
    tx.execute(
        "UPDATE shop_stock SET stock = stock - 1 WHERE sku = $1",
        &[&SKU],
    )
    .await?;
    tx.execute(
        "INSERT INTO shop_sales (sku, path, token) VALUES ($1, 'fallback', NULL)",
        &[&SKU],
    )
    .await?;
    tx.commit().await?;
    Ok(Sale::Sold)
}

/// One sale: under the lock, or through the fallback when the lock
/// service is unavailable.
/// (Only one of the two runs; the mutex lets both borrow the connection.)
pub async fn sell(manager: &LockManager, db: &Mutex<Client>) -> Result<Ran<Sale>, BoxError> {
    let resource = format!("shop:{SKU}");
    let ran = manager
        .lock(&resource)
        .wait(Duration::from_secs(20))
        .run_or_fallback(
            |lease| async move {
                let token = lease.token().ok_or("fencing is on by default")?;
                sell_fenced(&mut *db.lock().await, token).await
            },
            || async { sell_unlocked(&mut *db.lock().await).await },
        )
        .await?;
    Ok(match ran {
        Ran::Locked(sale) => Ran::Locked(sale?),
        Ran::Fallback { value, cause } => Ran::Fallback {
            value: value?,
            cause,
        },
    })
}

/// A manager for the clients that reach the nodes.
pub fn connected_manager(urls: &[String]) -> Result<LockManager, BoxError> {
    Ok(LockManager::builder()
        .nodes(urls.to_vec())
        .ttl(TTL)
        .build()?)
}

/// A manager for the clients cut off from the nodes: a short backoff and
/// a breaker, so that after a few failures they go straight to the
/// fallback without waiting on the network.
pub fn cut_off_manager(urls: &[String]) -> Result<LockManager, BoxError> {
    Ok(LockManager::builder()
        .nodes(urls.to_vec())
        .ttl(TTL)
        .unavailable_retry(Backoff::steps([Duration::from_millis(20)]))
        .circuit_breaker(CircuitBreaker::default().failures(3))
        .build()?)
}

/// Proxies in front of `urls` that refuse every connection: a network
/// partition between some clients and all the nodes.
pub fn partition(urls: &[String]) -> Result<Vec<FaultProxy>, BoxError> {
    urls.iter()
        .map(|url| {
            let upstream: SocketAddr = url.trim_start_matches("redis://").parse()?;
            let proxy = FaultProxy::start(upstream)?;
            proxy.set_refuse_new(true);
            Ok(proxy)
        })
        .collect()
}

/// Tally of one client's attempts.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Attempts that ran under the lock, and through the fallback.
    pub locked: u32,
    pub fallback: u32,
    pub locked_sold: u32,
    pub fallback_sold: u32,
    pub sold_out: u32,
    pub fenced_out: u32,
}

impl Tally {
    /// Counts one attempt's outcome.
    pub fn count(&mut self, ran: &Ran<Sale>) {
        if ran.is_fallback() {
            self.fallback += 1;
        } else {
            self.locked += 1;
        }
        match ran {
            Ran::Locked(Sale::Sold) => self.locked_sold += 1,
            Ran::Fallback {
                value: Sale::Sold, ..
            } => self.fallback_sold += 1,
            Ran::Locked(Sale::SoldOut)
            | Ran::Fallback {
                value: Sale::SoldOut,
                ..
            } => self.sold_out += 1,
            Ran::Locked(Sale::FencedOut { .. })
            | Ran::Fallback {
                value: Sale::FencedOut { .. },
                ..
            } => self.fenced_out += 1,
        }
    }
}

/// `attempts` sales in a row by one client, on its own connection.
pub async fn shop(manager: LockManager, db: Client, attempts: u32) -> Result<Tally, BoxError> {
    let db = Mutex::new(db);
    let mut tally = Tally::default();
    for _ in 0..attempts {
        tally.count(&sell(&manager, &db).await?);
    }
    Ok(tally)
}

/// Stock left, and the sales by path.
pub async fn books(db: &Client) -> Result<(i32, i64, i64), BoxError> {
    let stock: i32 = db
        .query_one("SELECT stock FROM shop_stock WHERE sku = $1", &[&SKU])
        .await?
        .get(0);
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE path = 'lock'),
                    count(*) FILTER (WHERE path = 'fallback')
               FROM shop_sales WHERE sku = $1",
            &[&SKU],
        )
        .await?;
    Ok((stock, row.get(0), row.get(1)))
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
        eprintln!("inventory_fallback example failed: {error}");
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
    set_up(&connect(&config).await?).await?;
    let proxies = partition(&nodes.urls)?;
    let cut_off_urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let connected = connected_manager(&nodes.urls)?;
    let cut_off = cut_off_manager(&cut_off_urls)?;
    let mut clients = Vec::new();
    for manager in [&connected, &connected, &cut_off, &cut_off] {
        let (manager, db) = (manager.clone(), connect(&config).await?);
        clients.push(tokio::spawn(shop(manager, db, 20)));
    }
    let mut total = Tally::default();
    for client in clients {
        let tally = client.await??;
        total.locked_sold += tally.locked_sold;
        total.fallback_sold += tally.fallback_sold;
        total.sold_out += tally.sold_out;
    }
    let (stock, locked, fallback) = books(&connect(&config).await?).await?;
    println!(
        "sold {} under the lock and {} through the fallback, {} sold out; \
         the books: {locked} + {fallback} sales, stock {stock} of {INITIAL_STOCK}",
        total.locked_sold, total.fallback_sold, total.sold_out
    );
    connected.settle().await;
    Ok(())
}
