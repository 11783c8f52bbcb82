//! The operator's commands: `run` stores who holds the lock, `status`
//! shows it, `list` finds held locks with SCAN, `break` force-unlocks.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use quorumlock::testkit::TestCluster;

fn quorumlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quorumlock"));
    command.env_remove("QUORUMLOCK_NODES");
    command
}

fn nodes(cluster: &TestCluster) -> String {
    cluster.urls().join(",")
}

fn text(output: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `quorumlock <args> --nodes … --node-timeout 500ms`, stdin closed.
fn operator(cluster: &TestCluster, args: &[&str]) -> Output {
    quorumlock()
        .args(args)
        .args(["--nodes", &nodes(cluster), "--node-timeout", "500ms"])
        .stdin(Stdio::null())
        .output()
        .expect("runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_tells_status_who_holds_the_lock() {
    let cluster = common::cluster(3);
    let name = common::resource("cli-holder");
    let mut child = quorumlock()
        .args([
            "run",
            "--nodes",
            &nodes(&cluster),
            "--node-timeout",
            "500ms",
        ])
        .arg(&name)
        .args(["--", "sleep", "30"])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn");
    let manager = common::manager(cluster.urls());
    let mut described = None;
    for _ in 0..100 {
        if let Some(holder) = manager.holders(&name).await.expect("read").exclusive() {
            described = holder.description.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let described = described.expect("run took the lock within 5 s");
    assert!(
        described.ends_with(&format!("pid {}: sleep", child.id())),
        "{described}"
    );
    child.kill().expect("kill");
    child.wait().expect("wait");

    // --holder replaces it.
    let output = quorumlock()
        .args([
            "run",
            "--nodes",
            &nodes(&cluster),
            "--node-timeout",
            "500ms",
        ])
        .args(["--holder", "nightly report", &name, "--"])
        .args(["sh", "-c", "exit 0"])
        .output()
        .expect("runs");
    // The first run was killed: its lock stays until its TTL, so this one
    // waits for it.
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let too_long = "x".repeat(quorumlock::MAX_HOLDER_LEN + 1);
    let output = quorumlock()
        .args(["run", "--nodes", &nodes(&cluster), "--holder", &too_long])
        .args([&name, "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(text(&output).contains("at most 256"), "{}", text(&output));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_held_locks_by_prefix() {
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let prefix = common::resource("list");
    let job = format!("{prefix}:job");
    let catalog = format!("{prefix}:catalog");
    let pair = [format!("{prefix}:a"), format!("{prefix}:b")];
    let held = manager.lock(&job).holder("job runner").await.expect("free");
    let readers = [
        manager
            .read(&catalog)
            .holder("reader 1")
            .await
            .expect("free"),
        manager
            .read(&catalog)
            .holder("reader 2")
            .await
            .expect("free"),
    ];
    let both = manager.lock_many(&pair).await.expect("free");
    // Taken and released: its fencing counter stays, it is not listed.
    manager
        .lock(format!("{prefix}:done").as_str())
        .await
        .expect("free")
        .release()
        .await
        .expect("release");
    // Another prefix's lock is not listed.
    let other = manager
        .lock(&common::resource("elsewhere"))
        .await
        .expect("free");

    // A key no client of ours wrote, whose name is not UTF-8: skipped
    // and counted, not a failure that hides every lock (it made `list`
    // exit 125, "no node could be scanned").
    let _: () = redis::cmd("SET")
        .arg(b"quorumlock:{\xff}:lock".as_slice())
        .arg("x")
        .query(&mut common::connect(&cluster.urls()[0]))
        .expect("SET");
    let output = operator(&cluster, &["list", &prefix, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let listing: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let locks = listing["locks"].as_array().expect("locks");
    let names: Vec<&str> = locks
        .iter()
        .map(|row| row["resource"].as_str().expect("name"))
        .collect();
    let mut expected = vec![
        pair[0].as_str(),
        pair[1].as_str(),
        catalog.as_str(),
        job.as_str(),
    ];
    expected.sort_unstable();
    assert_eq!(names, expected, "{listing}");
    let row = |name: &str| {
        locks
            .iter()
            .find(|row| row["resource"] == name)
            .expect("row")
    };
    assert_eq!(row(&job)["holders"][0]["description"], "job runner");
    assert_eq!(row(&catalog)["holders"].as_array().map(Vec::len), Some(2));
    assert_eq!(listing["incomplete"], false, "{listing}");

    // --limit cuts the list and says so.
    let output = operator(&cluster, &["list", &prefix, "--json", "--limit", "1"]);
    let cut: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(cut["locks"].as_array().map(Vec::len), Some(1), "{cut}");
    assert_eq!(cut["incomplete"], true, "{cut}");

    assert_eq!(listing["not_utf8"], 1, "{listing}");
    let table = operator(&cluster, &["list", &prefix]);
    assert!(text(&table).contains("job runner"), "{}", text(&table));
    assert!(text(&table).contains("not UTF-8"), "{}", text(&table));
    held.release().await.expect("release");
    for reader in readers {
        reader.release().await.expect("release");
    }
    both.release().await.expect("release");
    other.release().await.expect("release");
}

/// `list` over 100 000 keys per node: SCAN calls stay near keys / COUNT,
/// and each call's time on the node is printed (measured, not asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_scans_many_keys_in_bounded_calls() {
    const KEYS: usize = 100_000;
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let prefix = common::resource("many");
    for url in cluster.urls() {
        let mut connection = common::connect(&url);
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(10_000) {
            let mut fill = redis::pipe();
            for i in chunk {
                // Fencing counters of resources no longer held: what
                // piles up on a node.
                fill.cmd("SET")
                    .arg(format!("quorumlock:{{{prefix}:old:{i}}}:fence"))
                    .arg(1)
                    .ignore();
            }
            let () = fill.query(&mut connection).expect("fill");
        }
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .query(&mut connection)
            .expect("slowlog");
        let () = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query(&mut connection)
            .expect("reset");
    }
    let held = manager
        .lock(format!("{prefix}:held").as_str())
        .await
        .expect("free");
    let output = operator(&cluster, &["list", &prefix, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let listing: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(
        listing["locks"].as_array().map(Vec::len),
        Some(1),
        "{listing}"
    );
    let scans = listing["scans"].as_u64().expect("scans");
    // COUNT 1000 over 100 000 keys: about 100 calls per node.
    assert!(
        scans <= 3 * 2 * (KEYS as u64 / 1000),
        "{scans} SCAN calls over 3 nodes of {KEYS} keys"
    );
    let mut longest = 0;
    for url in cluster.urls() {
        let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(10_000)
            .query(&mut common::connect(&url))
            .expect("slowlog");
        for entry in entries {
            let redis::Value::Array(fields) = entry else {
                continue;
            };
            let (Some(redis::Value::Int(micros)), Some(redis::Value::Array(command))) =
                (fields.get(2), fields.get(3))
            else {
                continue;
            };
            if matches!(command.first(), Some(redis::Value::BulkString(name)) if name.eq_ignore_ascii_case(b"scan"))
            {
                longest = longest.max(*micros);
            }
        }
    }
    println!("list over {KEYS} keys per node: {scans} SCAN calls, longest {longest} µs on a node");
    held.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_asks_then_frees_the_lock() {
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let name = common::resource("cli-break");
    let stuck = manager
        .lock(&name)
        .holder("stuck job")
        .ttl(Duration::from_secs(60))
        .await
        .expect("free");

    // No terminal to confirm on, and no --yes: refused, nothing broken.
    let refused = operator(&cluster, &["break", &name]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(text(&refused).contains("--yes"), "{}", text(&refused));
    assert!(
        manager
            .holders(&name)
            .await
            .expect("read")
            .exclusive()
            .is_some()
    );

    let broken = operator(&cluster, &["break", &name, "--yes"]);
    assert_eq!(broken.status.code(), Some(0), "{}", text(&broken));
    let said = text(&broken);
    assert!(said.contains("held by stuck job"), "{said}");
    let token = stuck.token().expect("token").get();
    assert!(
        said.contains(&format!("token is at most {token}")),
        "{said}"
    );
    assert!(manager.holders(&name).await.expect("read").free);
    let next = manager.lock(&name).no_wait().await.expect("free again");
    assert!(next.token().expect("token").get() > token);
    next.release().await.expect("release");
    assert!(matches!(
        stuck.release().await,
        Err(quorumlock::Error::NotHeld { .. })
    ));

    // A key on one node only (a failed attempt's, long-lived): no holder
    // is shown, so a plain break breaks nothing; --any-holder does.
    let _: () = redis::cmd("SET")
        .arg(quorumlock::internals::lock_key(&name))
        .arg("0123456789abcdef0123456789abcdef")
        .arg("PX")
        .arg(600_000)
        .query(&mut common::connect(&cluster.urls()[0]))
        .expect("SET");
    let nothing = operator(&cluster, &["break", &name, "--yes"]);
    assert_eq!(nothing.status.code(), Some(1), "{}", text(&nothing));
    assert!(
        text(&nothing).contains("nothing to break"),
        "{}",
        text(&nothing)
    );
    assert!(common::stored_value(&cluster.urls()[0], &name).is_some());
    let any = operator(&cluster, &["break", &name, "--yes", "--any-holder"]);
    assert_eq!(any.status.code(), Some(0), "{}", text(&any));
    assert_eq!(common::stored_value(&cluster.urls()[0], &name), None);
}
