//! Attacks on members that are Redis Clusters (`redis+cluster://`), on
//! real redis-server processes, from an adversarial review. Each states
//! the property it attacks; the first and the third worked before their
//! fixes (a delete that met `MOVED` now follows the slot; a mark another
//! cluster node signed counts as a data set begun now). Run one after
//! another (one test), as clusters on two cores should be.

mod common;

use std::time::{Duration, Instant};

use quorumlock::internals::{KeyKind, key_of, slot};
use quorumlock::testkit::{ClusterMember, TestCluster};
use quorumlock::{Fencing, NodeGuard};

use common::cluster::{
    cut_and_unlist_replica, finish_slot_move, held_briefly_by_someone_else, names_master, port_of,
    query, replica_of, replication, start_slot_move,
};

/// Keeps the server at `url` busy (one Lua script spinning on `TIME`) for
/// `busy`: a shard slowed by a long command, e.g. a `MIGRATE` of a big
/// slot during a reshard.
fn keep_busy(url: String, busy: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let _: redis::Value = redis::cmd("EVAL")
            .arg(
                "local t0 = redis.call('TIME') \
                 local start = t0[1] * 1000000 + t0[2] \
                 while true do \
                   local t = redis.call('TIME') \
                   if t[1] * 1000000 + t[2] - start > tonumber(ARGV[1]) then break end \
                 end return 1",
            )
            .arg(0)
            .arg(busy.as_micros() as u64)
            .query(&mut common::connect(&url))
            .unwrap_or_else(|e| panic!("busy script on {url}: {e}"));
    })
}

fn cluster_and_two(replicas: usize) -> (ClusterMember, TestCluster, Vec<String>) {
    let member = ClusterMember::start(3, replicas).expect("a 3-shard cluster");
    let standalone = common::cluster(2);
    let mut urls = vec![member.url().expect("a URL")];
    urls.extend(standalone.urls());
    (member, standalone, urls)
}

/// Attack 1: a slot moves between an acquire and its release. The
/// release must delete the key where the slot went (or keep deleting in
/// the background), whatever order the members answer in; and the counter
/// node's tokens keep increasing across the reshard.
async fn a_release_after_a_reshard_leaves_no_key() {
    let (member, _standalone, urls) = cluster_and_two(0);
    let manager = common::builder(urls.clone())
        .ttl(Duration::from_secs(60))
        .build()
        .expect("valid settings");
    manager
        .lock("warm-up")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");

    // Two batches of resources in one slot (hash tag `mv`), both held
    // across the move; the counter resource for the token check too.
    let quick: Vec<String> = (0..12).map(|i| format!("{{mv}}:quick:{i}")).collect();
    let slow: Vec<String> = (0..12).map(|i| format!("{{mv}}:slow:{i}")).collect();
    let fenced = "{mv}:tokens";
    let before = {
        let lock = manager.lock(fenced).no_wait().await.expect("lock");
        let token = lock.token().expect("a token");
        lock.release().await.expect("release");
        token
    };
    let mut quick_locks = Vec::new();
    for name in &quick {
        quick_locks.push(manager.lock(name).no_wait().await.expect("lock"));
    }
    let mut slow_locks = Vec::new();
    for name in &slow {
        slow_locks.push(manager.lock(name).no_wait().await.expect("lock"));
    }
    let key = key_of(KeyKind::Lock, &quick[0]);
    let from = member.master_of(&key).expect("an owner");
    let to = member
        .nodes()
        .urls()
        .into_iter()
        .find(|url| *url != from)
        .expect("another master");
    start_slot_move(&member, slot(&key), &from, &to);
    finish_slot_move(&member, slot(&key), &from, &to);
    assert!(
        quick
            .iter()
            .chain(&slow)
            .all(|name| common::lock_entry(&to, name).is_some()),
        "the keys moved with their slot"
    );

    // a) Released at once, all together, with the shard answering as fast
    //    as it can (MOVED needs no fsync).
    let quick_released =
        futures::future::join_all(quick_locks.into_iter().map(|lock| lock.release())).await;
    // b) The old owner is busy for 300 ms (a big MIGRATE, a slow command)
    //    when the releases go out: its MOVED comes after the two
    //    standalone members decided the release.
    let busy = keep_busy(from.clone(), Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let slow_released =
        futures::future::join_all(slow_locks.into_iter().map(|lock| lock.release())).await;
    busy.join().expect("busy script ran");
    let settled = tokio::time::timeout(Duration::from_secs(20), manager.settle()).await;
    // Uncounted retries of failed deletes get time too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left = |names: &[String]| -> Vec<(String, i64)> {
        names
            .iter()
            .filter_map(|name| common::lock_entry(&to, name).map(|(_, pttl)| (name.clone(), pttl)))
            .collect()
    };
    let (left_quick, left_slow) = (left(&quick), left(&slow));
    let errors = |outcomes: &[quorumlock::Result<()>]| {
        outcomes
            .iter()
            .filter_map(|o| o.as_ref().err().map(ToString::to_string))
            .collect::<Vec<_>>()
    };
    eprintln!(
        "settled: {settled:?}\nreleases (quick) failed: {:?}\nreleases (slow) failed: {:?}\n\
         keys left on the new owner {to}: quick {left_quick:?}, slow {left_slow:?}",
        errors(&quick_released),
        errors(&slow_released)
    );

    // Tokens across the reshard: the counter moved with the slot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A released resource whose key stayed: the counter node (member 0)
    // refuses everyone until the TTL.
    let again = manager.lock(&slow[0]).no_wait().await;
    eprintln!(
        "{} again, after its release: {:?}",
        slow[0],
        again.as_ref().map(|l| l.token())
    );
    drop(again);
    // Taking the slot moved the new owner's config epoch on, so its
    // data-set mark no longer vouches for it: the guard counts it again
    // one window later (a failback looks the same; see cluster_failover).
    let new_owner = to.replace("redis://", "");
    let quarantined = manager.quarantined_nodes();
    assert!(
        quarantined
            .iter()
            .any(|(node, _)| node.ends_with(&new_owner)),
        "the master that took the slot should be quarantined for a window: {quarantined:?}"
    );
    // The tokens across the reshard, from a manager that trusts it at once.
    let trusting = common::trust_unpersisted(common::builder(urls.clone()))
        .ttl(Duration::from_secs(60))
        .build()
        .expect("valid settings");
    let after = trusting
        .lock(fenced)
        .no_wait()
        .await
        .expect("lock after the reshard");
    let token = after.token().expect("a token");
    after.release().await.expect("release");
    eprintln!("token before the reshard {before:?}, after {token:?}");
    assert!(
        token > before,
        "the token went back: {before:?} then {token:?}"
    );

    assert!(
        left_quick.is_empty() && left_slow.is_empty(),
        "released locks left their keys on the slot's new master until their TTL: \
         quick {left_quick:?}, slow {left_slow:?}"
    );
}

/// Attack 2: a lock future dropped at every point of a fresh manager's
/// first round (the slot map not known yet), free or held by another
/// client (then the attempt waits, queued); then with every node of the
/// cluster member paused (its seeds all down). Nothing may hang and
/// nothing may be left once `settle()` returned.
async fn dropped_rounds_with_an_unknown_slot_map_leave_nothing() {
    // The standalone members answer 25 ms late (behind proxies), so that
    // the cluster member's request goes out (map read, connection opened)
    // before the round is decided.
    let member = ClusterMember::start(3, 0).expect("a 3-shard cluster");
    let standalone = TestCluster::start_proxied(2).expect("two proxied nodes");
    for i in 0..2 {
        standalone
            .proxy(i)
            .expect("a proxy")
            .set_latency_to_client(quorumlock::testkit::Delay::fixed(Duration::from_millis(25)));
    }
    let mut urls = vec![member.url().expect("a URL")];
    urls.extend(standalone.urls());
    let build = || {
        common::builder(urls.clone())
            .ttl(Duration::from_secs(30))
            .fencing(Fencing::Quorum)
            .build()
            .expect("valid settings")
    };
    // Key-setting commands the cluster's masters ran (the acquire script
    // or SET), to count the dropped attempts that reached the member.
    let sets_on_cluster = || -> i64 {
        member
            .nodes()
            .urls()
            .iter()
            .map(|url| {
                let stats: String = query(url, redis::cmd("INFO").arg("commandstats"));
                stats
                    .lines()
                    .filter_map(|l| {
                        let calls = l.split("calls=").nth(1)?.split(',').next()?;
                        let calls = calls.parse::<i64>().ok()?;
                        // An observation is one EVALSHA and one CONFIG GET.
                        if l.starts_with("cmdstat_config:") {
                            Some(-calls)
                        } else if l.starts_with("cmdstat_evalsha:")
                            || l.starts_with("cmdstat_set:")
                            || l.starts_with("cmdstat_eval:")
                        {
                            Some(calls)
                        } else {
                            None
                        }
                    })
                    .sum::<i64>()
            })
            .sum::<i64>()
    };
    let holder = build();
    holder
        .lock("warm-up")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    // How long a fresh manager's first lock takes here and now (connects,
    // slot map, observations, the round): the drops below are spread over
    // it too, so that some fall after the member's request went out on a
    // loaded machine as on an idle one.
    let calibration = build();
    let started = Instant::now();
    calibration
        .lock("calibrate")
        .wait(Duration::from_secs(5))
        .await
        .expect("a fresh manager's first lock")
        .release()
        .await
        .expect("release");
    let first_lock_us = started.elapsed().as_micros() as u64;
    drop(calibration);
    let mut delays: Vec<u64> = vec![
        0, 2_000, 5_000, 10_000, 20_000, 24_000, 25_000, 25_500, 26_000, 26_500, 27_000, 27_500,
        28_000, 28_500, 29_000, 30_000, 35_000, 45_000, 60_000, 80_000,
    ];
    delays.extend((4..=12).map(|tenths| first_lock_us * tenths / 10));
    eprintln!("a fresh manager's first lock took {first_lock_us} µs");
    let mut checked = Vec::new();
    let mut reached = 0;
    for round in 0..2 {
        for &delay_us in &delays {
            let name = format!("cancel:{round}:{delay_us}");
            // Every other one: another client holds it, so the attempt queues.
            let held = if (delay_us / 500) % 2 == 1 {
                Some(holder.lock(&name).no_wait().await.expect("lock"))
            } else {
                None
            };
            let fresh = build();
            let sets_before = sets_on_cluster();
            let outcome = tokio::time::timeout(
                Duration::from_micros(delay_us),
                fresh.lock(&name).wait(Duration::from_secs(5)),
            )
            .await;
            let label = match &outcome {
                Ok(Ok(_)) => "granted".to_owned(),
                Ok(Err(e)) => format!("{e}"),
                Err(_) => "dropped".to_owned(),
            };
            let dropped = outcome.is_err();
            // Granted in time: dropped unreleased, cleaned up too.
            drop(outcome);
            let settled = tokio::time::timeout(Duration::from_secs(15), fresh.settle()).await;
            assert!(settled.is_ok(), "{name}: settle() hung");
            let sets = sets_on_cluster() - sets_before;
            eprintln!("{name}: {label}; commands on the cluster member: {sets}");
            if dropped && sets > 1 {
                reached += 1;
            }
            if let Some(lock) = held {
                lock.release().await.expect("release");
            }
            checked.push(name);
        }
    }
    eprintln!("dropped attempts that reached the cluster member: {reached}");
    assert!(
        reached > 0,
        "no dropped attempt reached the cluster member (a fresh manager's first lock took \
         {first_lock_us} µs; drops tried at {delays:?} µs): tests nothing"
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(15), holder.settle())
            .await
            .is_ok(),
        "the holder's settle() hung"
    );

    // Every seed of the cluster member down (paused: connections hang).
    for i in 0..member.nodes().len() {
        member.nodes().pause(i).expect("pause");
    }
    let fresh = build();
    let started = Instant::now();
    let lock =
        tokio::time::timeout(Duration::from_secs(10), fresh.lock("seeds-down").no_wait()).await;
    eprintln!(
        "seeds down: lock after {:?}: {:?}",
        started.elapsed(),
        lock.as_ref().map(|l| l.as_ref().map(|l| l.token()))
    );
    let lock = lock
        .expect("a lock with the cluster member's seeds down hung")
        .expect("two standalone members make a quorum");
    let dropped = tokio::time::timeout(
        Duration::from_millis(3),
        fresh.lock("seeds-down:dropped").no_wait(),
    )
    .await;
    drop(dropped);
    lock.release().await.expect("release");
    let started = Instant::now();
    let settled = tokio::time::timeout(Duration::from_secs(15), fresh.settle()).await;
    eprintln!("seeds down: settle after {:?}", started.elapsed());
    assert!(settled.is_ok(), "settle() hung with the seeds down");
    for i in 0..member.nodes().len() {
        member.nodes().resume(i).expect("resume");
    }
    checked.push("seeds-down".into());
    checked.push("seeds-down:dropped".into());
    // Once back, the same manager uses the member again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // (A round is decided by the two fast standalone members, and a
    // request still reading the map or connecting is not sent: try a few.)
    let owner = member
        .master_of(&key_of(KeyKind::Lock, "seeds-back"))
        .expect("an owner");
    let mut used = false;
    for _ in 0..20 {
        let back = fresh.lock("seeds-back").no_wait().await.expect("lock");
        used = common::lock_entry(&owner, "seeds-back").is_some();
        back.release().await.expect("release");
        if used {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(used, "the member is not used again once its nodes are back");
    fresh.settle().await;
    checked.push("seeds-back".into());

    let mut leftovers = Vec::new();
    for name in &checked {
        let key = key_of(KeyKind::Lock, name);
        let owner = member.master_of(&key).expect("an owner");
        let nodes: Vec<String> = std::iter::once(owner)
            .chain(common::direct_urls(&standalone))
            .collect();
        for url in &nodes {
            if let Some(entry) = common::lock_entry(url, name) {
                leftovers.push(format!("{name} on {url}: lock {entry:?}"));
            }
            let queued = common::queued_on(url, name);
            if queued > 0 {
                leftovers.push(format!("{name} on {url}: {queued} waiter(s)"));
            }
        }
    }
    eprintln!("checked {} resources; left: {leftovers:#?}", checked.len());
    assert!(leftovers.is_empty(), "left behind: {leftovers:#?}");
}

fn cluster_ok(url: &str) -> bool {
    query::<String>(url, redis::cmd("CLUSTER").arg("INFO")).contains("cluster_state:ok")
}

/// Attack 3: the lost grant of a failover (the recipe of
/// tests/cluster_failover.rs), then the promoted replica restarts (a
/// crash, its AOF replayed) before the quarantine window is over. A client
/// that meets it now sees a young process that loaded an old data set, no
/// promotion (`second_repl_offset` does not survive a restart): it must
/// still not count it while the first lock is valid, quarantined for the
/// restart. The control: a client without the guard, at the same moment,
/// is granted the lock (else the refusal shows nothing).
async fn a_promoted_replica_that_restarts_is_still_not_counted() {
    let (member, standalone, urls) = cluster_and_two(1);
    // Only our TAKEOVER promotes a replica (not the restart below).
    for url in member.nodes().urls() {
        let _: () = query(
            &url,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-replica-no-failover")
                .arg("yes"),
        );
    }
    let manager = |guard: NodeGuard| {
        common::builder(urls.clone())
            // Long enough for a loaded machine's failover and restart
            // below to happen while the first lock is valid.
            .ttl(Duration::from_secs(40))
            .fencing(Fencing::Off)
            .node_guard(guard)
            .build()
            .expect("valid settings")
    };
    let resource = "failover:restart";
    let key = key_of(KeyKind::Lock, resource);
    let master = member.master_of(&key).expect("a master");
    let replica = replica_of(&member, &master);
    let paused = cut_and_unlist_replica(&member, &master, &replica).await;
    let first = manager(NodeGuard::default());
    first
        .lock("warm-up")
        .await
        .expect("lock")
        .release()
        .await
        .expect("release");
    first.connect().await.expect("connect");
    let last = standalone.urls()[1].clone();
    // Held long enough for a loaded machine's attempt to meet it.
    held_briefly_by_someone_else(&last, &key, 3_000);
    let held = first
        .lock(resource)
        .no_wait()
        .await
        .expect("granted by the cluster member and one standalone node");
    member.nodes().resume(paused).expect("resume the replica");
    let _: () = query(
        &replica,
        redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
    );
    // A wait, not the check: a failover and a restart beside a load.
    let deadline = Instant::now() + common::scaled(Duration::from_secs(30));
    while !replication(&replica).contains("role:master") {
        assert!(Instant::now() < deadline, "no takeover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let slot = slot(&key);
    let port = port_of(&replica);
    for url in member.nodes().urls() {
        while !names_master(&url, slot, port) {
            assert!(Instant::now() < deadline, "{url} never learned of it");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let lost: Option<String> = query(&replica, redis::cmd("GET").arg(&key));
    assert_eq!(lost, None, "the recipe did not lose the key");
    eprintln!(
        "promoted, before restart: {}",
        replication(&replica)
            .lines()
            .filter(|l| l.starts_with("second_repl_offset") || l.starts_with("role"))
            .collect::<Vec<_>>()
            .join(" ")
    );

    // The promoted replica crashes and comes back at once with its AOF.
    let index = member
        .nodes()
        .urls()
        .iter()
        .position(|url| *url == replica)
        .expect("its index");
    member.nodes().restart(index).expect("restart");
    for url in member.nodes().urls() {
        while !(cluster_ok(&url) && names_master(&url, slot, port)) {
            assert!(
                Instant::now() < deadline,
                "{url}: the cluster did not recover"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    eprintln!(
        "promoted, after restart: {}",
        replication(&replica)
            .lines()
            .filter(|l| l.starts_with("second_repl_offset") || l.starts_with("role"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    while query::<Option<String>>(&last, redis::cmd("GET").arg(&key)).is_some() {
        assert!(Instant::now() < deadline, "the other key did not expire");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A client that starts now (a service deployed, a CLI run).
    let second = manager(NodeGuard::default());
    let outcome = second.lock(resource).no_wait().await;
    let quarantined = second.quarantined_nodes();
    // The control: a client without the guard, at the same moment,
    // counts the restarted replica, which lost the first lock's key.
    let unguarded = manager(NodeGuard::disabled());
    let control = unguarded.lock(resource).no_wait().await;
    assert!(held.is_valid(), "the first lock ran out during the test");
    eprintln!(
        "the second client: {outcome:?}; quarantined: {quarantined:?}; without the guard: {:?}",
        control.as_ref().map(|_| "granted")
    );
    let overlapped = outcome.is_ok();
    let control_got_in = control.is_ok();
    let control_seen = format!("{:?}", control.as_ref().map(|_| "granted"));
    if let Ok(lock) = outcome {
        lock.release().await.ok();
    }
    if let Ok(lock) = control {
        lock.release().await.ok();
    }
    held.release().await.ok();
    assert!(
        !overlapped,
        "a second client was granted a held lock: the promoted replica that lost the first \
         lock's key was counted after it restarted"
    );
    assert!(
        control_got_in,
        "without the node guard a client was refused too ({control_seen}), so the restarted \
         replica did not cost the first lock its majority and the guard's refusal shows nothing"
    );
    // Refused because the member is quarantined for what the restart did,
    // not for another reason (a node down, a key still held elsewhere).
    let member_name = member.url().expect("a URL");
    let restarted_port = port.to_string();
    let why: Vec<String> = quarantined
        .iter()
        .filter(|(name, _)| name.ends_with(&format!(":{restarted_port}")))
        .map(|(_, q)| q.reason.label().to_owned())
        .collect();
    assert!(
        why.iter().any(|label| label == "restart"),
        "the second client was refused, but the restarted replica (port {restarted_port}, of \
         {member_name}) is not quarantined for its restart: {why:?}; all quarantined: \
         {quarantined:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_on_cluster_members_fail() {
    a_release_after_a_reshard_leaves_no_key().await;
    dropped_rounds_with_an_unknown_slot_map_leave_nothing().await;
    a_promoted_replica_that_restarts_is_still_not_counted().await;
}
