//! The testkit itself: real processes that start, crash, pause, resume and
//! restart with their data, and a clear message when redis-server is missing.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use quorumlock::Error;
use quorumlock::testkit::{MISSING_REDIS_SERVER, TestCluster};

fn connection(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
    conn.set_read_timeout(Some(Duration::from_millis(300)))?;
    Ok(conn)
}

#[test]
fn nodes_are_independent_persistent_and_controllable() {
    let cluster = common::cluster(3);
    let urls = cluster.urls();
    assert_eq!(cluster.len(), 3);
    let distinct: std::collections::HashSet<_> = urls.iter().collect();
    assert_eq!(distinct.len(), 3, "{urls:?}");
    assert!(urls.iter().all(|url| url.starts_with("redis://127.0.0.1:")));

    // Each node is its own server with AOF always.
    for url in &urls {
        let mut conn = connection(url).expect("running node");
        let fsync: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query(&mut conn)
            .expect("CONFIG GET");
        assert_eq!(fsync, ["appendfsync", "always"]);
    }
    let mut first = connection(&urls[0]).expect("node 0");
    let _: () = redis::cmd("SET")
        .arg("survives")
        .arg("yes")
        .query(&mut first)
        .expect("SET");
    let other: Option<String> = redis::cmd("GET")
        .arg("survives")
        .query(&mut connection(&urls[1]).expect("node 1"))
        .expect("GET");
    assert_eq!(other, None, "nodes share no data");

    // A crash (SIGKILL) and a restart keep acknowledged writes.
    cluster.kill(0).expect("kill");
    assert!(!cluster.is_running(0).expect("index"));
    assert!(connection(&urls[0]).is_err(), "a killed node refuses");
    cluster.restart(0).expect("restart");
    let kept: Option<String> = redis::cmd("GET")
        .arg("survives")
        .query(&mut connection(&urls[0]).expect("restarted node"))
        .expect("GET");
    assert_eq!(kept.as_deref(), Some("yes"));

    // A paused node accepts TCP but answers nothing until resumed.
    cluster.pause(1).expect("pause");
    assert!(cluster.is_paused(1).expect("index"));
    let mut raw = TcpStream::connect(urls[1].trim_start_matches("redis://")).expect("accepts");
    raw.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    raw.write_all(b"PING\r\n").expect("write");
    let mut reply = [0u8; 7];
    assert!(raw.read_exact(&mut reply).is_err(), "no reply while paused");
    cluster.resume(1).expect("resume");
    raw.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    raw.read_exact(&mut reply).expect("reply after resume");
    assert_eq!(&reply, b"+PONG\r\n");
}

#[test]
fn bad_indexes_and_sizes_are_typed_errors() {
    let cluster = common::cluster(1);
    for result in [cluster.kill(5), cluster.pause(1), cluster.restart(9)] {
        match result {
            Err(Error::Testkit(why)) => assert!(why.contains("out of range"), "{why}"),
            other => panic!("expected a testkit error, got {other:?}"),
        }
    }
    assert!(matches!(TestCluster::start(0), Err(Error::Testkit(_))));
    cluster.kill(0).expect("kill");
    assert!(matches!(cluster.pause(0), Err(Error::Testkit(_))));
}

#[test]
fn processes_die_with_the_cluster() {
    let cluster = common::cluster(2);
    let urls = cluster.urls();
    drop(cluster);
    for url in &urls {
        assert!(connection(url).is_err(), "{url} still answers after drop");
    }
}

#[test]
fn processes_die_when_a_test_panics() {
    let mut urls = Vec::new();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let cluster = common::cluster(2);
        urls = cluster.urls();
        panic!("a failing test");
    }));
    assert!(outcome.is_err());
    assert_eq!(urls.len(), 2);
    for url in &urls {
        assert!(
            connection(url).is_err(),
            "{url} outlived the panicking test"
        );
    }
}

/// Runs this same test binary with an empty PATH, so `redis-server` cannot
/// be found, and checks the one clear message that names the install command.
#[test]
fn missing_redis_server_says_how_to_install_it() {
    if std::env::var_os("QUORUMLOCK_TEST_NO_PATH").is_some() {
        match TestCluster::start(1) {
            Err(Error::Testkit(why)) => {
                assert_eq!(why, MISSING_REDIS_SERVER);
                assert!(why.contains("apt-get install -y redis-server"));
                return;
            }
            other => panic!("expected the missing-server error, got {other:?}"),
        }
    }
    let exe = std::env::current_exe().expect("test binary path");
    let output = std::process::Command::new(exe)
        .args(["--exact", "missing_redis_server_says_how_to_install_it"])
        .env("QUORUMLOCK_TEST_NO_PATH", "1")
        .env("PATH", "/nonexistent")
        .output()
        .expect("re-run the test binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child failed: {stdout}");
    assert!(stdout.contains("1 passed"), "child ran the test: {stdout}");
}
