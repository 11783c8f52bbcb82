//! The inventory story of examples/inventory_postgres.rs against a real
//! PostgreSQL server started for the test: the fenced UPDATE of a holder
//! whose lock expired changes no row, the newer holder's stands.

mod common;

#[path = "../examples/inventory_postgres.rs"]
#[allow(dead_code)] // the example's `main` is not used here
mod inventory;

use quorumlock::FencingToken;
use quorumlock::testkit::PostgresServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rejects_the_stale_holders_update() {
    let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let db = inventory::connect(&server.connection_string())
        .await
        .expect("connect to the test database");
    let lock_nodes = common::cluster(5);

    let outcome = inventory::run_story(&db, &lock_nodes.urls())
        .await
        .expect("the story runs");
    assert!(outcome.current_token > outcome.stale_token);
    assert_eq!(
        outcome.current_rows, 1,
        "the current holder's update applies"
    );
    assert_eq!(outcome.stale_rows, 0, "the stale holder is fenced out");
    assert_eq!(outcome.final_stock, 99);
    assert_eq!(outcome.final_token as u64, outcome.current_token.get());

    // The same holder may write again with its token; older ones may not.
    let current = outcome.current_token;
    let rows = inventory::fenced_update(&db, inventory::SKU, 98, current)
        .await
        .expect("update");
    assert_eq!(rows, 1, "an equal token is accepted");
    let older = FencingToken::new(current.get() - 1);
    let rows = inventory::fenced_update(&db, inventory::SKU, 50, older)
        .await
        .expect("update");
    assert_eq!(rows, 0, "a lower token is refused");
    let (stock, token) = inventory::read_stock(&db, inventory::SKU)
        .await
        .expect("read");
    assert_eq!((stock, token as u64), (98, current.get()));
}

/// A lock on two SKUs carries one token, valid for both rows: both
/// fenced UPDATEs apply, and a stale holder of either SKU is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_fences_both_rows_of_a_two_sku_lock() {
    let server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let db = inventory::connect(&server.connection_string())
        .await
        .expect("connect to the test database");
    let lock_nodes = common::cluster(3);
    // Creates the table and the story's SKU; a second SKU beside it.
    inventory::run_story(&db, &lock_nodes.urls())
        .await
        .expect("the story runs");
    let other = "sku-2";
    db.execute(
        "INSERT INTO inventory (sku, stock, fence_token) VALUES ($1, 10, 0)",
        &[&other],
    )
    .await
    .expect("insert");
    let manager = common::manager(lock_nodes.urls());
    let (first, second) = (
        format!("inventory:{}", inventory::SKU),
        format!("inventory:{other}"),
    );
    let stale = manager.lock(&second).await.expect("free");
    let stale_token = stale.token().expect("fencing on");
    stale.release().await.expect("held");

    let both = manager.lock_many(&[&first, &second]).await.expect("free");
    let token = both.token().expect("fencing on");
    for (sku, stock) in [(inventory::SKU, 90), (other, 11)] {
        let rows = inventory::fenced_update(&db, sku, stock, token)
            .await
            .expect("update");
        assert_eq!(rows, 1, "{sku}: the two-SKU lock's token applies");
    }
    both.release().await.expect("held");
    let rows = inventory::fenced_update(&db, other, 0, stale_token)
        .await
        .expect("update");
    assert_eq!(rows, 0, "the earlier holder of {other} is fenced out");
    let (stock, fence) = inventory::read_stock(&db, other).await.expect("read");
    assert_eq!((stock, fence as u64), (11, token.get()));
}
