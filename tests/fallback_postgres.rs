//! The shop of examples/inventory_fallback.rs under load: clients that
//! reach the lock nodes sell under the lock while clients cut off from
//! every node sell through the PostgreSQL fallback at the same time, and
//! a holder paused past its lock's expiry tries to sell with its old
//! token. The books must balance, and no stale write may be accepted.

mod common;

#[path = "../examples/inventory_fallback.rs"]
#[allow(dead_code)] // the example's `main` is not used here
mod shop;

use std::sync::Arc;
use std::time::Duration;

use quorumlock::testkit::{FaultProxy, PostgresServer};
use shop::{Sale, Tally};
use tokio::sync::{Barrier, Mutex};

const CONNECTED: usize = 3;
const CUT_OFF: usize = 2;
const ATTEMPTS: u32 = 15;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_paths_serialize_on_the_row_and_a_stale_holder_is_fenced_out() {
    let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let config = server.connection_string();
    let connect = || async {
        shop::connect(&config)
            .await
            .expect("connect to the database")
    };
    let mut db = connect().await;
    shop::set_up(&db).await.expect("tables");
    let lock_nodes = common::cluster(5);
    let urls = lock_nodes.urls();
    let proxies = shop::partition(&urls).expect("proxies");
    let cut_off_urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let connected = shop::connected_manager(&urls).expect("valid settings");
    let cut_off = shop::cut_off_manager(&cut_off_urls).expect("valid settings");

    // The zombie: holds the lock for 400 ms, then is paused past that
    // while the others sell.
    let zombie = connected
        .lock(&format!("shop:{}", shop::SKU))
        .ttl(Duration::from_millis(400))
        .await
        .expect("free");
    let stale = zombie.token().expect("fencing is on by default");
    // Everyone starts once its lock has expired, so that both paths sell
    // at the same time.
    tokio::time::sleep(zombie.remaining()).await;

    // The clients sell in rounds, each client once per round, so that both
    // paths sell in every round however fast either path runs (on a busy
    // disk the fallback's sales could otherwise all finish first).
    let rounds = Arc::new(Barrier::new(CONNECTED + CUT_OFF));
    let mut clients = Vec::new();
    for i in 0..CONNECTED + CUT_OFF {
        let manager = if i < CONNECTED { &connected } else { &cut_off };
        let (manager, db, rounds) = (
            manager.clone(),
            Mutex::new(connect().await),
            Arc::clone(&rounds),
        );
        clients.push((
            i < CONNECTED,
            tokio::spawn(async move {
                let mut tally = Tally::default();
                for _ in 0..ATTEMPTS {
                    rounds.wait().await;
                    tally.count(&shop::sell(&manager, &db).await?);
                }
                Ok::<_, shop::BoxError>(tally)
            }),
        ));
    }
    let mut tallies: Vec<(bool, Tally)> = Vec::new();
    for (reaches_nodes, client) in clients {
        let tally = client
            .await
            .expect("no panic")
            .expect("the client's sales run");
        tallies.push((reaches_nodes, tally));
    }

    // The zombie wakes and sells with its old token.
    assert!(!zombie.is_valid(), "the zombie's lock should have expired");
    let late = shop::sell_fenced(&mut db, stale)
        .await
        .expect("the query runs");
    eprintln!("clients: {tallies:?}; zombie (token {stale}): {late:?}");

    for (reaches_nodes, tally) in &tallies {
        if *reaches_nodes {
            assert_eq!(tally.fallback, 0, "a connected client fell back: {tally:?}");
            assert_eq!(
                tally.fenced_out, 0,
                "a current holder was fenced out: {tally:?}"
            );
        } else {
            assert_eq!(tally.locked, 0, "a cut-off client got the lock: {tally:?}");
        }
    }
    let sum = |f: fn(&Tally) -> u32| tallies.iter().map(|(_, t)| f(t)).sum::<u32>();
    let (locked_sold, fallback_sold) = (sum(|t| t.locked_sold), sum(|t| t.fallback_sold));
    assert!(
        locked_sold > 0 && fallback_sold > 0,
        "both paths sold: {tallies:?}"
    );
    let (stock, locked_rows, fallback_rows) = shop::books(&db).await.expect("books");
    assert_eq!(
        (locked_rows, fallback_rows),
        (i64::from(locked_sold), i64::from(fallback_sold)),
        "sales logged by path vs sales the clients were told succeeded"
    );
    assert_eq!(
        stock,
        shop::INITIAL_STOCK - (locked_sold + fallback_sold) as i32,
        "stock left after {locked_sold} locked and {fallback_sold} fallback sales"
    );

    // No stale write: the locked sales' tokens rise in commit order, and
    // the zombie's token, older than the row's, was refused.
    let tokens: Vec<i64> = db
        .query(
            "SELECT token FROM shop_sales WHERE path = 'lock' ORDER BY id",
            &[],
        )
        .await
        .expect("query")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "locked sales' tokens in commit order: {tokens:?}"
    );
    // The two paths sold in the same rounds: their sales interleave.
    let paths: Vec<String> = db
        .query("SELECT path FROM shop_sales ORDER BY id", &[])
        .await
        .expect("query")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let switches = paths.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(switches >= 2, "sales by path in commit order: {paths:?}");
    let stale = stale.get() as i64;
    match late {
        Sale::FencedOut { offered, highest } => {
            assert_eq!(offered, stale);
            assert!(highest > stale, "highest {highest} vs stale {stale}");
        }
        other => panic!("the zombie's sale with token {stale} was not fenced out: {other:?}"),
    }
    assert!(
        !tokens.contains(&stale),
        "a sale carries the zombie's token"
    );
    assert!(connected.settle().await);
}
