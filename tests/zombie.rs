//! The zombie-client story of examples/zombie.rs, with assertions, in the
//! dangerous order: the newer holder reads, the holder that stalled past
//! its TTL writes, the newer holder writes. The newer holder's fenced read
//! shut the stale holder out before it wrote; the newer holder's write
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
    let text = outcome.timeline.join("\n");
    // The dangerous order: B read before A wrote, and wrote after it.
    let at = |event: &str| {
        outcome
            .timeline
            .iter()
            .position(|line| line.contains(event))
            .unwrap_or_else(|| panic!("no `{event}` in the timeline:\n{text}"))
    };
    assert!(
        at("B: read stock") < at("A: sold 3") && at("A: sold 3") < at("B: sold 1"),
        "not the order read (B), write (A), write (B):\n{text}"
    );
    match outcome.stale_write {
        Err(Error::FencedOut {
            offered, highest, ..
        }) => {
            assert_eq!(offered, outcome.stale_token);
            assert_eq!(highest, outcome.current_token, "raised by B's read alone");
        }
        other => panic!("the stale write must be fenced out, got {other:?}:\n{text}"),
    }
    assert_eq!(
        outcome.final_stock.as_deref(),
        Some("99"),
        "B's sale stands, and it is the only one that was acknowledged"
    );
    assert!(text.contains("REJECTED"), "{text}");
    assert!(text.contains("lock still valid? false"), "{text}");
}
