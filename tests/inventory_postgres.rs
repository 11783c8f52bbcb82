//! The inventory story of examples/inventory_postgres.rs against a real
//! PostgreSQL server started for the test, in the dangerous order: the
//! newer holder claims the resource's fence and reads, the holder whose
//! lock expired writes, the newer holder writes. The stale write waits for
//! the newer holder's transaction and is refused; with the token checked
//! only at the write (the earlier pattern) it was accepted and then lost.

mod common;

#[path = "../examples/inventory_postgres.rs"]
#[allow(dead_code)] // the example's `main` is not used here
mod inventory;

use quorumlock::FencingToken;
use quorumlock::testkit::PostgresServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_stale_write_between_a_newer_holders_read_and_write() {
    let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let config = server.connection_string();
    let lock_nodes = common::cluster(5);

    let outcome = inventory::run_story(&config, &lock_nodes.urls())
        .await
        .expect("the story runs");
    assert!(outcome.current_token > outcome.stale_token);
    assert!(
        !outcome.stale_accepted,
        "the stale holder's write (token {}) was applied after the newer holder (token {}) \
         had read: the final stock {} lost it",
        outcome.stale_token, outcome.current_token, outcome.final_stock
    );
    assert!(
        outcome.stale_waited,
        "the stale write finished without waiting for the newer holder's open transaction: \
         the story did not run it between that holder's read and its write"
    );
    assert_eq!(
        outcome.final_stock, 99,
        "100 - the newer holder's sale of 1"
    );
    assert_eq!(outcome.final_token as u64, outcome.current_token.get());

    // The same holder may sell again with its token; older ones may not.
    let mut db = inventory::connect(&config).await.expect("connect");
    let current = outcome.current_token;
    let sold = inventory::sell(&mut db, inventory::SKU, 1, current)
        .await
        .expect("sell");
    assert_eq!(sold, Some(98), "an equal token is accepted");
    let older = FencingToken::new(current.get() - 1);
    let sold = inventory::sell(&mut db, inventory::SKU, 50, older)
        .await
        .expect("sell");
    assert_eq!(sold, None, "a lower token is refused");
    assert!(
        !inventory::set_stock(&mut db, inventory::SKU, 0, older)
            .await
            .expect("write"),
        "a lower token is refused"
    );
    let (stock, token) = inventory::current(&db, inventory::SKU).await.expect("read");
    assert_eq!((stock, token as u64), (98, current.get()));
}

/// A lock on two SKUs carries one token, valid for both resources: both
/// sales apply, each claiming its own resource's fence row, and a stale
/// holder of either SKU is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_fences_both_resources_of_a_two_sku_lock() {
    let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let mut db = inventory::connect(&server.connection_string())
        .await
        .expect("connect to the test database");
    let lock_nodes = common::cluster(3);
    let other = "sku-2";
    inventory::set_up(&db, inventory::SKU, 100)
        .await
        .expect("set up");
    inventory::set_up(&db, other, 10).await.expect("set up");
    let manager = common::manager(lock_nodes.urls());
    let (first, second) = (
        inventory::resource(inventory::SKU),
        inventory::resource(other),
    );
    let stale = manager.lock(&second).await.expect("free");
    let stale_token = stale.token().expect("fencing on");
    stale.release().await.expect("held");

    let both = manager.lock_many(&[&first, &second]).await.expect("free");
    let token = both.token().expect("fencing on");
    for (sku, after) in [(inventory::SKU, 90), (other, 9)] {
        let units = if sku == other { 1 } else { 10 };
        let sold = inventory::sell(&mut db, sku, units, token)
            .await
            .expect("sell");
        assert_eq!(sold, Some(after), "{sku}: the two-SKU lock's token applies");
    }
    both.release().await.expect("held");
    let sold = inventory::sell(&mut db, other, 1, stale_token)
        .await
        .expect("sell");
    assert_eq!(sold, None, "the earlier holder of {other} is fenced out");
    let (stock, fence) = inventory::current(&db, other).await.expect("read");
    assert_eq!((stock, fence as u64), (9, token.get()));
}
