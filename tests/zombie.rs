//! The zombie-client story of examples/zombie.rs, with assertions: the
//! holder that stalled past its TTL is fenced out, the newer holder's write
//! stands.

mod common;

#[path = "../examples/zombie.rs"]
#[allow(dead_code)] // the example's `main` is not used here
mod zombie;

use quorumlock::Error;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_is_fenced_out() {
    let lock_nodes = common::cluster(5);
    let storage_node = common::cluster(1);
    let outcome = zombie::run_story(&lock_nodes.urls(), &storage_node.urls()[0])
        .await
        .expect("the story runs");

    assert!(
        outcome.current_token > outcome.stale_token,
        "{} then {}",
        outcome.stale_token,
        outcome.current_token
    );
    match outcome.stale_write {
        Err(Error::FencedOut {
            offered, highest, ..
        }) => {
            assert_eq!(offered, outcome.stale_token);
            assert_eq!(highest, outcome.current_token);
        }
        other => panic!("the stale write must be fenced out, got {other:?}"),
    }
    assert_eq!(
        outcome.final_stock.as_deref(),
        Some("99"),
        "B's sale stands"
    );
    let text = outcome.timeline.join("\n");
    assert!(text.contains("REJECTED"), "{text}");
    assert!(text.contains("lock still valid? false"), "{text}");
}
