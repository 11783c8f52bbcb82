//! The zombie client, in the dangerous order: a lock holder reads, then
//! stalls past its TTL; another client takes the lock and reads; the first
//! wakes up and writes its stale result *before* the newer holder writes.
//! Checking writes alone would accept that write (no higher token has
//! written yet) and the newer holder would then overwrite it: a lost sale.
//! The newer holder's fenced read (`FencedRedis::read`) raised the
//! storage's highest token to its own, so the stale write is refused.
//!
//!     cargo run --example zombie
//!
//! Lock nodes: QUORUMLOCK_NODES, or five local redis-server processes.
//! Storage: QUORUMLOCK_STORAGE (a redis:// URL), or one more local process.
//! tests/zombie.rs runs the same story and checks its outcome.

use std::sync::Arc;
use std::time::Duration;

use quorumlock::testkit::{TestCluster, local_or_env};
use quorumlock::{Error, Fence, FencedRedis, FencingToken, LockManager};
use tokio::sync::{Mutex, oneshot};
use tokio::time::Instant;

pub const RESOURCE: &str = "inventory:sku-1";
const STOCK_KEY: &str = "inventory:sku-1:stock";
const TTL: Duration = Duration::from_secs(1);
const STALL: Duration = Duration::from_millis(1_500);

/// What happened, for printing and for the test's assertions.
pub struct Outcome {
    pub timeline: Vec<String>,
    pub stale_token: FencingToken,
    pub current_token: FencingToken,
    pub stale_write: Result<(), Error>,
    pub final_stock: Option<String>,
}

/// Timestamped events from both clients, in the order they happened.
#[derive(Clone)]
struct Timeline {
    start: Instant,
    events: Arc<Mutex<Vec<String>>>,
}

impl Timeline {
    async fn say(&self, who: &str, what: String) {
        let at = self.start.elapsed().as_millis();
        self.events
            .lock()
            .await
            .push(format!("{at:>6} ms  {who}: {what}"));
    }
}

/// Runs the story on the given lock nodes and storage server.
pub async fn run_story(lock_urls: &[String], storage_url: &str) -> Result<Outcome, Error> {
    let storage = Arc::new(FencedRedis::new(storage_url)?);
    let client = || {
        LockManager::builder()
            .nodes(lock_urls.to_vec())
            .ttl(TTL)
            .build()
    };
    let (client_a, client_b) = (client()?, client()?);
    let timeline = Timeline {
        start: Instant::now(),
        events: Arc::default(),
    };
    // The stock starts at 100, written before any lock holder (token 0).
    let opening = Fence::new(RESOURCE, FencingToken::new(0))?;
    storage.set(&opening, STOCK_KEY, "100").await?;

    let lock_a = client_a.lock(RESOURCE).await?;
    let stale_token = lock_a.token().expect("fencing is on by default");
    let stale_fence = lock_a.fence()?;
    timeline
        .say("A", format!("acquired the lock, token {stale_token}"))
        .await;
    let stock = read_stock(&storage, &stale_fence).await?;
    timeline.say("A", format!("read stock = {stock}")).await;

    let (a_wrote, a_has_written) = oneshot::channel();
    let zombie = {
        let (storage, timeline) = (Arc::clone(&storage), timeline.clone());
        tokio::spawn(async move {
            timeline
                .say(
                    "A",
                    format!("stalls for {STALL:?} (a GC pause), past its {TTL:?} TTL"),
                )
                .await;
            tokio::time::sleep(STALL).await;
            timeline
                .say(
                    "A",
                    format!("wakes up; lock still valid? {}", lock_a.is_valid()),
                )
                .await;
            let sold = stock - 3;
            let write = storage.set(&stale_fence, STOCK_KEY, sold.to_string()).await;
            let verdict = match &write {
                Ok(()) => "ACCEPTED".to_owned(),
                Err(e) => format!("REJECTED ({e})"),
            };
            timeline
                .say(
                    "A",
                    format!("sold 3, writes stock = {sold} with token {stale_token}: {verdict}"),
                )
                .await;
            let _ = a_wrote.send(());
            write
        })
    };

    // B waits for A's lock to expire, then sells one unit.
    let lock_b = client_b.lock(RESOURCE).await?;
    let current_token = lock_b.token().expect("fencing is on by default");
    timeline
        .say(
            "B",
            format!("acquired the lock after A's expired, token {current_token}"),
        )
        .await;
    let stock = read_stock(&storage, &lock_b.fence()?).await?;
    timeline
        .say(
            "B",
            format!("read stock = {stock} (fenced read: token {current_token} is now the highest)"),
        )
        .await;
    // B's sale takes a while (a payment, say): A wakes up and writes first.
    let _ = a_has_written.await;
    storage
        .set(&lock_b.fence()?, STOCK_KEY, (stock - 1).to_string())
        .await?;
    timeline
        .say("B", format!("sold 1, wrote stock = {}", stock - 1))
        .await;
    lock_b.release().await?;

    let stale_write = zombie
        .await
        .map_err(|e| Error::Testkit(format!("client A's task failed: {e}")))?;
    let final_stock = storage.get(STOCK_KEY).await?;
    let timeline = timeline.events.lock().await.clone();
    Ok(Outcome {
        timeline,
        stale_token,
        current_token,
        stale_write,
        final_stock,
    })
}

/// A fenced read of the stock: from here on, no older token may write it.
async fn read_stock(storage: &FencedRedis, fence: &Fence) -> Result<i64, Error> {
    let raw = storage.read(fence, STOCK_KEY).await?.unwrap_or_default();
    raw.parse()
        .map_err(|_| Error::Testkit(format!("stock is not a number: {raw:?}")))
}

#[tokio::main]
async fn main() {
    if let Err(error) = run().await {
        eprintln!("zombie example failed: {error}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Error> {
    let nodes = local_or_env(5)?;
    let (storage_url, _storage_node) = match std::env::var("QUORUMLOCK_STORAGE") {
        Ok(url) => (url, None),
        Err(_) => {
            let node = TestCluster::start(1)?;
            (node.url(0)?, Some(node))
        }
    };
    let outcome = run_story(&nodes.urls, &storage_url).await?;
    println!("timeline:");
    for event in &outcome.timeline {
        println!("{event}");
    }
    println!(
        "final stock: {} (with a plain read, A's write would have been accepted and then \
         overwritten by B: A's sale lost although every write passed the fence)",
        outcome.final_stock.as_deref().unwrap_or("missing")
    );
    Ok(())
}
