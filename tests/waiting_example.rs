//! The story of examples/waiting.rs, with assertions: workers are served in
//! arrival order once the holder releases, and the impatient one gets
//! `WaitTimedOut` saying when the lock should be free.

mod common;

#[path = "../examples/waiting.rs"]
#[allow(dead_code)] // the example's `main` is not used here
mod waiting;

use quorumlock::Error;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_served_in_arrival_order() {
    let nodes = common::cluster(5);
    // The example's 10 s TTL (the impatient worker is told about it), with
    // the tests' node timeout: nodes that fsync every write may stall
    // beyond the 50 ms default on a busy disk.
    let story = waiting::run_story(|| {
        common::builder(nodes.urls())
            .ttl(std::time::Duration::from_secs(10))
            .build()
    })
    .await
    .expect("the story runs");
    let text = story.timeline.join("\n");
    assert_eq!(
        story.served,
        [0, 1, 2, 3, 4, 5],
        "order of service:\n{text}"
    );
    match &story.impatient {
        Err(Error::WaitTimedOut {
            free_in: Some(free_in),
            ..
        }) => assert!(free_in.as_secs() >= 5, "free in {free_in:?}:\n{text}"),
        other => panic!("expected WaitTimedOut with a bound, got {other:?}:\n{text}"),
    }
}
