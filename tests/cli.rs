//! The `quorumlock` command line against real local clusters.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use quorumlock::testkit::TestCluster;

fn quorumlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_quorumlock"));
    command.env_remove("QUORUMLOCK_NODES");
    command
}

/// `quorumlock run` with a node timeout that a loaded CI machine meets
/// (the 50 ms default is for production networks).
fn run_command(cluster: &TestCluster, resource: &str, node_timeout: &str) -> Command {
    let mut command = quorumlock();
    command.args([
        "run",
        "--nodes",
        &nodes(cluster),
        resource,
        "--node-timeout",
        node_timeout,
    ]);
    command
}

/// `child`'s exit status, polled; fails with `still` if it still runs 10 s
/// after `since`.
fn exit_within_10s(child: &mut Child, since: Instant, still: &str) -> ExitStatus {
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(since.elapsed() < Duration::from_secs(10), "{still}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn nodes(cluster: &TestCluster) -> String {
    cluster.urls().join(",")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn run_passes_the_token_and_the_exit_code_through() {
    let cluster = common::cluster(3);
    let output = run_command(&cluster, "cli:run", "500ms")
        .arg("--")
        .args([
            "sh",
            "-c",
            "echo \"token=$QUORUMLOCK_TOKEN resource=$QUORUMLOCK_RESOURCE\"; exit 7",
        ])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(7), "{stderr}");
    let first: u64 = stdout
        .trim()
        .strip_prefix("token=")
        .and_then(|rest| rest.strip_suffix(" resource=cli:run"))
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("a token and the resource: {stdout}"));

    // The lock was released: the next holder gets a higher token at once.
    let output = run_command(&cluster, "cli:run", "500ms")
        .args(["--wait", "1s"])
        .args(["--", "sh", "-c", "echo $QUORUMLOCK_TOKEN"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output).1);
    let next: u64 = text(&output).0.trim().parse().expect("a token");
    assert!(next > first, "token {next} after {first}");
}

/// `run -n` with the counter node (node 0) killed: the lock is granted by
/// the other nodes and the command runs, with a token above the last one.
/// (It exited 125, "the fencing counter node is unavailable".)
#[test]
fn run_works_without_the_counter_node() {
    let cluster = common::cluster(5);
    let token_of = |output: &Output| -> u64 {
        let (stdout, stderr) = text(output);
        assert_eq!(output.status.code(), Some(0), "{stdout} {stderr}");
        stdout
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("a token: {stdout} {stderr}"))
    };
    let run = || {
        run_command(&cluster, "cli:no-counter-node", "500ms")
            .args(["-n", "--", "sh", "-c", "echo $QUORUMLOCK_TOKEN"])
            .output()
            .expect("runs")
    };
    let before = token_of(&run());
    cluster.kill(0).expect("kill node 0");
    let after = token_of(&run());
    assert!(after > before, "token {after} after {before}");
}

/// An even number of nodes is said on stderr (the library tells only
/// `tracing`, which a command line's user does not see); an odd one is not.
#[test]
fn run_warns_of_an_even_number_of_nodes_on_stderr() {
    let cluster = common::cluster(4);
    let output = run_command(&cluster, "cli:even", "500ms")
        .args(["--", "true"])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout} {stderr}");
    assert!(
        stderr.contains("warning: 4 nodes tolerate no more failures than 3"),
        "stderr: {stderr}"
    );
    let three: Vec<String> = cluster.urls().into_iter().take(3).collect();
    let output = quorumlock()
        .args(["run", "--nodes", &three.join(","), "cli:odd"])
        .args(["--node-timeout", "500ms", "--", "true"])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout} {stderr}");
    assert!(!stderr.contains("warning"), "stderr: {stderr}");
}

/// `run --at-least`: cron on several hosts. The first run holds the lock
/// past the command's end until its time; a second host's `run -n -E 0`
/// in between skips quietly (the command does not run); after it, it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_at_least_keeps_the_job_from_other_hosts_until_its_time() {
    let cluster = common::cluster(3);
    let scratch = tempfile::tempdir().expect("temp dir");
    let marker = |n: usize| scratch.path().join(format!("ran-{n}"));
    let cron = |n: usize| {
        run_command(&cluster, "cli:cron", "500ms")
            .args(["-n", "-E", "0", "--at-least", "2s", "--"])
            .args(["touch", marker(n).to_str().expect("utf-8 path")])
            .output()
            .expect("runs")
    };
    let started = Instant::now();
    let first = cron(1);
    // The first lock was taken after `started` and before this.
    let first_done = Instant::now();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first).1);
    assert!(marker(1).exists(), "the first host ran the job");
    let second = cron(2);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second).1);
    assert!(
        started.elapsed() < Duration::from_millis(1800) && !marker(2).exists(),
        "a second host ran the job {:?} after the first: {}",
        started.elapsed(),
        text(&second).1
    );
    // Past the first lock's time, whenever it was taken.
    tokio::time::sleep((Duration::from_millis(2300)).saturating_sub(first_done.elapsed())).await;
    let third = cron(3);
    assert_eq!(third.status.code(), Some(0), "{}", text(&third).1);
    assert!(marker(3).exists(), "after the interval the job runs again");
    // Not with a read lock: a usage error.
    let read = run_command(&cluster, "cli:cron", "500ms")
        .args(["-s", "--at-least", "1s", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(read.status.code(), Some(2), "{}", text(&read).1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_gives_up_after_wait_on_a_held_resource() {
    let cluster = common::cluster(3);
    let holder = common::manager(cluster.urls());
    let lock = holder.lock("cli:held").await.expect("free");
    let started = Instant::now();
    let output = run_command(&cluster, "cli:held", "500ms")
        .args(["--wait", "300ms", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(124), "{}", text(&output).1);
    assert!(text(&output).1.contains("not acquired within"));
    assert!(started.elapsed() < Duration::from_secs(5));
    // -n: one attempt; -E: the exit code for a held lock, as flock's.
    for (flags, code) in [(vec!["-n"], 124), (vec!["-n", "-E", "7"], 7)] {
        let started = Instant::now();
        let output = run_command(&cluster, "cli:held", "500ms")
            .args(&flags)
            .args(["--", "true"])
            .output()
            .expect("runs");
        assert_eq!(
            output.status.code(),
            Some(code),
            "{flags:?}: {}",
            text(&output).1
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{flags:?} waited {:?}",
            started.elapsed()
        );
    }
    // -n and --wait contradict each other: a usage error.
    let output = run_command(&cluster, "cli:held", "500ms")
        .args(["-n", "-w", "1s", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{}", text(&output).1);
    lock.release().await.expect("release");
}

/// `--help` states every default `run` applies; no hidden limit on how
/// long the command may hold the lock.
#[test]
fn run_help_states_its_defaults_and_no_hold_limit() {
    let output = quorumlock().args(["run", "--help"]).output().expect("runs");
    let help = text(&output).0;
    for stated in [
        "[default: 10s]",
        "[default: 30s]",
        "[default: 124]",
        "default: half the TTL",
        "default: no limit",
    ] {
        assert!(
            help.contains(stated),
            "`run --help` does not say {stated:?}: {help}"
        );
    }
    for flag in [
        "-w, --wait",
        "-n, --no-wait",
        "-s, --read",
        "-E, --conflict-exit-code",
    ] {
        assert!(help.contains(flag), "`run --help` has no {flag:?}: {help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_in_line_and_starts_when_the_holder_releases() {
    let cluster = common::cluster(3);
    let holder = common::manager(cluster.urls());
    // A 10 s TTL: only the release can let the command start soon.
    let lock = holder
        .lock("cli:queued")
        .ttl(Duration::from_secs(10))
        .await
        .expect("free");
    let started = Instant::now();
    let child = run_command(&cluster, "cli:queued", "500ms")
        .args(["--wait", "30s", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let released = Instant::now();
    lock.release().await.expect("release");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("no panic")
        .expect("exits");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output).1);
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the command finished {:?} after the release ({:?} after it was started); the \
         holder's keys had ~9 s left",
        released.elapsed(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_takes_read_locks_and_several_resources() {
    let cluster = common::cluster(3);
    // A reader holds "cli:rw" for a while...
    let reader = run_command(&cluster, "cli:rw", "500ms")
        .args(["--read", "--", "sleep", "5"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let holder = common::manager(cluster.urls());
    assert!(
        common::eventually_async(Duration::from_secs(10), || async {
            matches!(
                holder.lock("cli:rw").no_wait().await,
                Err(quorumlock::Error::Contended { .. })
            )
        })
        .await,
        "the reading command never held the resource"
    );
    // ... another reader shares it at once ...
    let shared = run_command(&cluster, "cli:rw", "500ms")
        .args([
            "-s",
            "--wait",
            "0s",
            "--",
            "sh",
            "-c",
            "echo $QUORUMLOCK_ACCESS ${QUORUMLOCK_TOKEN-no-write-token} \
             ${QUORUMLOCK_WRITER_TOKEN:+writer-token}",
        ])
        .output()
        .expect("runs");
    assert_eq!(shared.status.code(), Some(0), "{}", text(&shared).1);
    // A read lock's token is the latest writer's, under its own name.
    assert_eq!(text(&shared).0.trim(), "read no-write-token writer-token");
    // ... and a writer, not waiting, is refused.
    let writer = run_command(&cluster, "cli:rw", "500ms")
        .args(["--wait", "0s", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(writer.status.code(), Some(124), "{}", text(&writer).1);
    let reader = tokio::task::spawn_blocking(move || reader.wait_with_output())
        .await
        .expect("no panic")
        .expect("exits");
    assert_eq!(reader.status.code(), Some(0), "{}", text(&reader).1);

    let both = run_command(&cluster, "cli:b", "500ms")
        .args([
            "cli:a",
            "--",
            "sh",
            "-c",
            "echo ${QUORUMLOCK_RESOURCE-unset} $QUORUMLOCK_RESOURCE_COUNT $QUORUMLOCK_RESOURCE_1 \
             $QUORUMLOCK_RESOURCE_2 ${QUORUMLOCK_TOKEN:+token}",
        ])
        .output()
        .expect("runs");
    assert_eq!(both.status.code(), Some(0), "{}", text(&both).1);
    // One variable per resource, none that names them all: a child that
    // fences with QUORUMLOCK_RESOURCE must pick one.
    assert_eq!(text(&both).0.trim(), "unset 2 cli:b cli:a token");
    let misuse = run_command(&cluster, "cli:b", "500ms")
        .args(["cli:a", "--read", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(misuse.status.code(), Some(2), "{}", text(&misuse).1);
}

#[test]
fn bench_hot_resource_reports_every_hand_off_checked() {
    let cluster = common::cluster(3);
    let output = quorumlock()
        .args([
            "bench",
            "hot",
            "--nodes",
            &nodes(&cluster),
            "--duration",
            "1s",
        ])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("| quorumlock"))
        .collect();
    assert_eq!(
        rows.len(),
        2,
        "a waiting and a polling row expected:\n{stdout}"
    );
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | client | hand-offs/s | share | gap | wait | commands | overlaps | tokens |
        assert_eq!(cells[7], "0", "overlapping holds: {row}");
        assert_eq!(cells[8], "increasing", "tokens: {row}");
        assert!(
            cells[2].parse::<f64>().is_ok_and(|rate| rate > 0.0),
            "no hand-off: {row}"
        );
    }
}

#[test]
fn bench_throughput_sets_quorumlock_beside_the_quorum_floor() {
    let cluster = common::cluster(3);
    let output = quorumlock()
        .args([
            "bench",
            "throughput",
            "--nodes",
            &nodes(&cluster),
            "--duration",
            "100ms",
        ])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    for client in ["floor: 3 nodes in parallel", "quorum floor", "quorumlock"] {
        let rows: Vec<&str> = stdout
            .lines()
            .filter(|line| line.split('|').nth(2).map(str::trim) == Some(client))
            .collect();
        assert_eq!(
            rows.len(),
            4,
            "one row per task count for {client}:\n{stdout}"
        );
        for row in rows {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let rate: f64 = cells[6].parse().unwrap_or(0.0);
            assert!(rate > 0.0, "no operation in: {row}");
        }
    }
    assert!(stdout.contains("ratios to the quorum floor"), "{stdout}");
}

#[test]
fn losing_the_lock_terminates_the_command() {
    let cluster = common::cluster(5);
    // A 1 s TTL is extended every 333 ms; a 200 ms node timeout fits that.
    let mut child = run_command(&cluster, "cli:lost", "200ms")
        .args(["--ttl", "1s", "--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    std::thread::sleep(Duration::from_millis(1_500));
    for i in [1, 2, 3] {
        cluster.kill(i).expect("kill");
    }
    let killed_at = Instant::now();
    let status = exit_within_10s(&mut child, killed_at, "still running");
    let mut stderr = String::new();
    for line in BufReader::new(child.stderr.take().expect("stderr")).lines() {
        stderr.push_str(&line.expect("utf-8"));
    }
    assert_eq!(status.code(), Some(123), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_held_and_a_free_resource() {
    let cluster = common::cluster(3);
    let holder = common::manager(cluster.urls());
    let lock = holder
        .lock("cli:status")
        .holder("cli test")
        .await
        .expect("free");
    let status = || -> serde_json::Value {
        let output = quorumlock()
            .args([
                "status",
                "cli:status",
                "--json",
                "--nodes",
                &nodes(&cluster),
            ])
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(0), "{}", text(&output).1);
        serde_json::from_slice(&output.stdout).expect("JSON")
    };
    let held = status();
    assert_eq!(held["view"]["state"], "held");
    let shown = &held["view"]["holders"][0];
    assert_eq!(shown["value"], lock.value(), "{held}");
    assert_eq!(shown["description"], "cli test", "{held}");
    // At least a quorum; a straggling node may have missed the SET.
    assert!(shown["nodes"].as_u64().expect("count") >= 2, "{held}");
    assert!(
        shown["valid_for_ms"].as_u64().expect("number") > 3_000,
        "{held}"
    );
    assert_eq!(
        held["nodes"][0]["counter"].as_u64(),
        lock.token().map(|token| token.get()),
        "node 0 shows the token it issued"
    );

    let table = quorumlock()
        .args(["status", "cli:status", "--nodes", &nodes(&cluster)])
        .output()
        .expect("runs");
    assert!(
        text(&table)
            .0
            .contains("quorum: HELD (exclusive) by cli test"),
        "{}",
        text(&table).0
    );
    // --held: 0 while a quorum holds it, 1 once it is free.
    let held_code = || {
        quorumlock()
            .args([
                "status",
                "--held",
                "cli:status",
                "--nodes",
                &nodes(&cluster),
            ])
            .output()
            .expect("runs")
            .status
            .code()
    };
    assert_eq!(held_code(), Some(0), "status --held of a held resource");

    lock.release().await.expect("release");
    let free = status();
    assert_eq!(free["view"]["state"], "free");
    assert_eq!(held_code(), Some(1), "status --held of a free resource");

    // Two readers: every node that has them says so.
    let readers = [
        holder.read("cli:status").await.expect("free"),
        holder.read("cli:status").await.expect("readers share"),
    ];
    let read = status();
    assert_eq!(read["view"]["state"], "held", "{read}");
    let readers_seen = read["view"]["holders"].as_array().expect("holders");
    assert_eq!(readers_seen.len(), 2, "every reader is reported: {read}");
    assert!(readers_seen.iter().all(|r| r["kind"] == "reader"), "{read}");
    for reader in readers {
        reader.release().await.expect("release");
    }
}

/// A lock key of the layout before hash tags (written by clients of an
/// older quorumlock, which this version does not exclude on names without
/// a tag) fails the doctor on its node until it is gone: the upgrade waits
/// for the old clients' locks to end.
#[test]
fn doctor_fails_while_old_layout_locks_are_held() {
    let cluster = TestCluster::start(3).expect("cluster");
    let doctor = || doctor_layout(&cluster.urls());
    let (_, layout) = doctor();
    assert_eq!(layout.len(), 3, "one layout finding per node: {layout:?}");
    assert!(
        layout.iter().all(|(level, _)| level == "pass"),
        "{layout:?}"
    );

    let old = "quorumlock:lock:nightly-report";
    let _: () = redis::cmd("SET")
        .arg(old)
        .arg("an-old-client")
        .arg("PX")
        .arg(60_000)
        .query(&mut common::connect(&cluster.urls()[0]))
        .expect("SET");
    // A key whose name is not UTF-8 beside it: it must not turn the scan
    // into a failure to read (a warning, exit 0).
    let _: () = redis::cmd("SET")
        .arg(b"quorumlock:{\xff}:lock".as_slice())
        .arg("x")
        .query(&mut common::connect(&cluster.urls()[0]))
        .expect("SET");
    let (code, layout) = doctor();
    assert_eq!(code, Some(1), "{layout:?}");
    let failed: Vec<_> = layout.iter().filter(|(level, _)| level == "fail").collect();
    assert_eq!(failed.len(), 1, "only node 0 holds one: {layout:?}");
    assert!(
        failed[0].1.contains("1 lock or waiter key(s)"),
        "{layout:?}"
    );
}

#[test]
fn doctor_warns_on_everysec_and_fails_on_what_clients_quarantine() {
    let relaxed = TestCluster::start_with_args(3, &["--appendfsync", "everysec"]).expect("cluster");
    let doctor = |window: &str| {
        quorumlock()
            .args([
                "doctor",
                "--clock-interval",
                "200ms",
                "--quarantine-window",
                window,
                "--nodes",
                &nodes(&relaxed),
            ])
            .output()
            .expect("runs")
    };
    // Older than the clients' window: everysec is a warning.
    let output = doctor("0s");
    let (stdout, _) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("persistence   WARN  appendfsync everysec"),
        "{stdout}"
    );
    assert!(stdout.contains("overall: WARN"), "{stdout}");
    // Just started without fsync always: clients do not count it yet.
    let output = doctor("1h");
    let (stdout, _) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("restart       FAIL"), "{stdout}");
    // `status` says the same of each node.
    let output = quorumlock()
        .args(["status", "r", "--json", "--nodes", &nodes(&relaxed)])
        .output()
        .expect("runs");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let quarantined = report["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| {
            n["quarantined"]
                .as_str()
                .is_some_and(|q| q.starts_with("restart"))
        })
        .count();
    assert_eq!(quarantined, 3, "{report}");

    // An evicting policy with a memory limit fails (and is quarantined).
    let evicting = TestCluster::start_with_args(
        3,
        &["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"],
    )
    .expect("cluster");
    let output = quorumlock()
        .args([
            "doctor",
            "--json",
            "--clock-interval",
            "200ms",
            "--nodes",
            &nodes(&evicting),
        ])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(1), "{}", text(&output).0);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["overall"], "fail");
    let evictions = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == "eviction" && f["level"] == "fail")
        .count();
    assert_eq!(evictions, 3, "{report}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    // Each `run` case names an unreachable node: the arguments must be
    // rejected before any node is asked.
    let run = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut args = vec!["run", "--nodes", "redis://127.0.0.1:1", "r"];
        args.extend_from_slice(extra);
        args
    };
    let cases: Vec<Vec<&str>> = vec![
        run(&[]),
        run(&["--ttl", "banana", "--", "true"]),
        run(&["--ttl", "0s", "--", "true"]),
        // A 1 s lock cannot be kept alive with 500 ms node timeouts.
        run(&["--ttl", "1s", "--node-timeout", "500ms", "--", "true"]),
        // A grace as long as the TTL would let the command outlive the lock.
        run(&["--ttl", "3s", "--grace", "3s", "--", "true"]),
        vec!["status", "r"],
        vec!["frobnicate"],
    ];
    for args in cases {
        let output = quorumlock().args(&args).output().expect("runs");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&output).1
        );
        assert!(!text(&output).1.is_empty(), "{args:?}: says why");
    }
}

/// `quorumlock cluster --count n` on free consecutive ports (searched from
/// a random start so that parallel runs do not race for the same ones),
/// once it printed its nodes: the process and the nodes' URLs.
fn start_cluster(n: u16, stderr: Stdio) -> (std::process::Child, Vec<String>) {
    let start = fastrand::u16(20_000..30_000);
    let port = (start..50_000)
        .step_by(7)
        .find(|&p| (p..p + n).all(|q| TcpListener::bind(("127.0.0.1", q)).is_ok()))
        .expect("free ports");
    let mut child = quorumlock()
        .args([
            "cluster",
            "--count",
            &n.to_string(),
            "--port",
            &port.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("first line");
    let expected: Vec<String> = (port..port + n)
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    assert_eq!(
        line.trim(),
        format!("export QUORUMLOCK_NODES={}", expected.join(","))
    );
    (child, expected)
}

/// A node of `cluster` that ends on its own (here shut down from outside)
/// is reported, the others are stopped, and `cluster` exits 125: it never
/// runs on one node short.
#[test]
fn cluster_ends_when_a_node_ends() {
    let (mut child, urls) = start_cluster(3, Stdio::piped());
    let started = Instant::now();
    let _ = redis::cmd("SHUTDOWN")
        .arg("NOSAVE")
        .query::<()>(&mut common::connect(&urls[1]));
    let status = exit_within_10s(
        &mut child,
        started,
        "`cluster` still runs 10 s after node 1 ended",
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("node 1"), "names the node: {stderr}");
    for url in [&urls[0], &urls[2]] {
        let client = redis::Client::open(url.as_str()).expect("url");
        assert!(
            client
                .get_connection_with_timeout(Duration::from_millis(300))
                .is_err(),
            "{url} still up after `cluster` ended"
        );
    }
}

#[test]
fn cluster_starts_nodes_and_stops_them_on_sigterm() {
    let (mut child, expected) = start_cluster(3, Stdio::null());
    for url in &expected {
        let mut conn = common::connect(url);
        let pong: String = redis::cmd("PING").query(&mut conn).expect("PING");
        assert_eq!(pong, "PONG");
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal");
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(0));
    for url in &expected {
        let client = redis::Client::open(url.as_str()).expect("url");
        assert!(
            client
                .get_connection_with_timeout(Duration::from_millis(300))
                .is_err(),
            "{url} still up"
        );
    }
}

/// `run` and `status` over `rediss://` with `--tls-ca` (and the client
/// certificate flags for mutual TLS); without the CA the nodes are not
/// trusted.
#[test]
fn run_and_status_work_over_tls_with_the_ca_flags() {
    use quorumlock::testkit::{ClusterOptions, TestCertificates, TlsNodes};
    let certificates = std::sync::Arc::new(TestCertificates::generate().expect("certificates"));
    let options = ClusterOptions {
        tls: Some(TlsNodes {
            certificates: std::sync::Arc::clone(&certificates),
            require_client_cert: true,
        }),
        ..ClusterOptions::default()
    };
    let cluster = TestCluster::start_with(3, &options).expect("a TLS cluster");
    let nodes = cluster.tls_urls().expect("TLS ports").join(",");
    let dir = certificates.dir();
    let (cert, key) = (dir.join("client.pem"), dir.join("client.key"));
    std::fs::write(&cert, certificates.client_cert_pem()).expect("write");
    std::fs::write(&key, certificates.client_key_pem()).expect("write");
    let ca = dir.join("ca.pem");
    let tls = [
        "--tls-ca",
        ca.to_str().expect("utf-8"),
        "--tls-cert",
        cert.to_str().expect("utf-8"),
        "--tls-key",
        key.to_str().expect("utf-8"),
    ];
    let output = quorumlock()
        .args(["run", "--nodes", &nodes, "cli:tls"])
        .args(["--node-timeout", "500ms"])
        .args(tls)
        .args(["--", "sh", "-c", "echo token=$QUORUMLOCK_TOKEN"])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("token="), "{stdout}");

    let output = quorumlock()
        .args(["status", "cli:tls", "--json"])
        .args(tls)
        .args(["--nodes", &nodes])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(status["view"]["state"], "free", "{stdout}");

    // Without the CA, the nodes' certificates are not trusted.
    let output = quorumlock()
        .args(["run", "--nodes", &nodes, "cli:tls"])
        .args(["--node-timeout", "500ms", "--wait", "0s"])
        .args(["--", "true"])
        .output()
        .expect("runs");
    let (_, stderr) = text(&output);
    assert_ne!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
}

/// The exit-code table in `--help` lists every code `quorumlock` uses, and
/// the one no other test reaches here: 125, quorumlock itself failed (no
/// node reachable). 0–122 and 128+N (the command's), 123 (lost), 124 (not
/// acquired), 126 and 127 (cannot run) are tested with `run`, 1 with
/// `doctor`, 2 with bad arguments.
#[test]
fn exit_codes_are_listed_and_125_is_quorumlocks_own_failure() {
    let help = text(&quorumlock().arg("--help").output().expect("runs")).0;
    for code in [
        "0-122, 128+N",
        "1 ",
        "2 ",
        "123",
        "124",
        "125",
        "126",
        "127",
    ] {
        assert!(
            help.contains(&format!("\n  {code}")),
            "`--help` lists no exit code {code:?}: {help}"
        );
    }
    let output = quorumlock()
        .args(["status", "x", "--nodes", "redis://127.0.0.1:1"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(125), "{}", text(&output).1);
    // `run` too: nodes that cannot be reached are not a held resource (124)
    // however long it may wait; it gives up after the unavailability
    // backoff, and the command never runs.
    let scratch = tempfile::tempdir().expect("temp dir");
    let ran = scratch.path().join("ran");
    let output = quorumlock()
        .args([
            "run",
            "-w",
            "1m",
            "--nodes",
            "redis://127.0.0.1:1",
            "x",
            "--",
        ])
        .args(["touch", ran.to_str().expect("utf-8 path")])
        .output()
        .expect("runs");
    let stderr = text(&output).1;
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("unavailable"), "says why: {stderr}");
    assert!(!ran.exists(), "the command ran without the lock");
}

/// The doctor's `layout` findings, as (level, detail), for `urls`.
fn layout_findings(urls: &[String]) -> Vec<(String, String)> {
    doctor_layout(urls).1
}

/// The doctor's exit code and `layout` findings, as (level, detail), for
/// `urls`.
fn doctor_layout(urls: &[String]) -> (Option<i32>, Vec<(String, String)>) {
    let output = quorumlock()
        .args(["doctor", "--json", "--clock-interval", "50ms", "--nodes"])
        .arg(urls.join(","))
        .output()
        .expect("runs");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not a JSON report ({e}): {output:?}"));
    let layout = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == "layout")
        .map(|f| {
            (
                f["level"].as_str().unwrap_or("").to_owned(),
                f["detail"].to_string(),
            )
        })
        .collect();
    (output.status.code(), layout)
}

/// The doctor's scan is bounded (100 × SCAN COUNT 1000): on a node with a
/// million keys it sees about a tenth of them, and must not pass a node it
/// did not finish (found in review: it passed, and missed an old client's
/// lock about 9 times in 10; four rounds make a miss near certain).
#[test]
fn an_incomplete_layout_scan_does_not_pass() {
    let cluster = TestCluster::start_with_args(1, &["--appendonly", "no"]).expect("cluster");
    let url = cluster.url(0).expect("url");
    let mut conn = common::connect(&url);
    let _: () = redis::cmd("EVAL")
        .arg("for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'data:' .. i, 'x') end")
        .arg(0)
        .arg(1_000_000)
        .query(&mut conn)
        .expect("filler keys");
    for round in 0..4 {
        let old = format!("quorumlock:lock:nightly-report-{round}");
        let _: () = redis::cmd("SET")
            .arg(&old)
            .arg("an-old-client")
            .arg("PX")
            .arg(600_000)
            .query(&mut conn)
            .expect("SET");
        let layout = layout_findings(&cluster.urls());
        assert_eq!(layout.len(), 1, "{layout:?}");
        assert_ne!(
            layout[0].0, "pass",
            "round {round}: the node holds {old} (and a million other keys), yet: {layout:?}"
        );
        let _: () = redis::cmd("DEL").arg(&old).query(&mut conn).expect("DEL");
    }
}

/// The lock nodes' ACL line as docs/operations.md gives it.
fn documented_lock_acl() -> String {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    docs.lines()
        .find(|l| l.starts_with("ACL SETUSER quorumlock "))
        .expect("the lock user's ACL line")
        .replace("CHANGE-ME", "pw-for-review")
}

/// The documented lock user's ACL has no `+scan` (clients need none): the
/// doctor's refused scan shows as a warning, never as a missing check
/// (found in review: the finding vanished while an old client's lock was on
/// the node).
#[test]
fn the_layout_check_does_not_vanish_for_the_documented_acl_user() {
    let cluster = TestCluster::start(1).expect("cluster");
    let url = cluster.url(0).expect("url");
    let mut conn = common::connect(&url);
    let line = documented_lock_acl();
    let mut words = line.split_whitespace();
    let _: () = redis::cmd(words.next().expect("ACL"))
        .arg(words.collect::<Vec<_>>())
        .query(&mut conn)
        .unwrap_or_else(|e| panic!("{line}: {e}"));
    let _: () = redis::cmd("SET")
        .arg("quorumlock:lock:nightly-report")
        .arg("an-old-client")
        .arg("PX")
        .arg(600_000)
        .query(&mut conn)
        .expect("SET");
    let as_user = url.replace("redis://", "redis://quorumlock:pw-for-review@");
    let layout = layout_findings(&[as_user]);
    assert_eq!(
        layout.len(),
        1,
        "the node holds an old-layout lock, yet the doctor has no layout finding: {layout:?}"
    );
    assert_ne!(layout[0].0, "pass", "{layout:?}");
}

/// `status` applies the library's name rules: `}x` is a usage error, as
/// for `run` (found in review: it looked at `quorumlock:{}x}:lock`, no
/// resource's key, and said FREE).
#[test]
fn status_refuses_a_name_starting_with_a_closing_brace() {
    let cluster = TestCluster::start(1).expect("cluster");
    let output = quorumlock()
        .args(["status", "}x", "--nodes"])
        .arg(cluster.urls().join(","))
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

/// A command that cannot be started gives the lock back at once, also with
/// `--at-least`: a host whose job is missing must not keep every other
/// host from running it this interval (found in review: it kept it).
#[test]
fn run_at_least_gives_the_lock_back_when_the_command_cannot_start() {
    let cluster = common::cluster(3);
    let r = common::resource("review:cron-missing");
    let scratch = tempfile::tempdir().expect("temp dir");
    let marker = scratch.path().join("ran");
    let missing = run_command(&cluster, &r, "500ms")
        .args(["-n", "-E", "0", "--at-least", "10s", "--"])
        .arg(scratch.path().join("no-such-job"))
        .output()
        .expect("runs");
    assert_eq!(
        missing.status.code(),
        Some(127),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    let other_host = run_command(&cluster, &r, "500ms")
        .args(["-n", "-E", "0", "--at-least", "10s", "--", "touch"])
        .arg(&marker)
        .output()
        .expect("runs");
    assert_eq!(other_host.status.code(), Some(0));
    assert!(
        marker.exists(),
        "the job never ran, yet the lock is kept from every other host for the interval"
    );
}

/// `quorumlock run --at-least` killed (SIGKILL, an OOM kill, a host
/// reboot) while its job runs keeps the job from other hosts until its
/// time all the same: the keys were set to live that long (found in
/// review: they lived one TTL).
#[test]
fn run_at_least_killed_mid_job_keeps_the_job_from_other_hosts() {
    let cluster = common::cluster(3);
    let r = common::resource("review:cron-killed");
    let scratch = tempfile::tempdir().expect("temp dir");
    let started_marker = scratch.path().join("started");
    let marker = scratch.path().join("ran-again");
    let mut first = run_command(&cluster, &r, "500ms")
        .args(["--ttl", "3s", "-n", "--at-least", "20s", "--", "sh", "-c"])
        .arg(format!(
            "touch '{}'; sleep 30",
            started_marker.to_str().expect("utf-8")
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawns");
    let launched = Instant::now();
    while !started_marker.exists() {
        assert!(
            launched.elapsed() < Duration::from_secs(20),
            "job never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    std::thread::sleep(Duration::from_millis(4500));
    let other_host = run_command(&cluster, &r, "500ms")
        .args(["-n", "-E", "0", "--at-least", "20s", "--", "touch"])
        .arg(&marker)
        .output()
        .expect("runs");
    assert_eq!(other_host.status.code(), Some(0));
    assert!(
        !marker.exists(),
        "another host ran the job {:?} after the first started it, within --at-least 20s",
        launched.elapsed()
    );
}

/// A resource name carrying a terminal escape sequence (it clears the
/// screen) is refused by the library; a key of that name left on the nodes
/// (by an older version, or by hand) is shown escaped, not acted on, by
/// `list`, and `status`, `run` and `break` refuse the name, escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_with_control_characters_are_printed_escaped() {
    let cluster = common::cluster(3);
    let name = "cli:\u{1b}[2J\u{1b}[Hevil";
    let holder = common::manager(cluster.urls());
    assert!(
        matches!(
            holder.lock(name).await,
            Err(quorumlock::Error::InvalidArgument {
                argument: "resource",
                ..
            })
        ),
        "a name with control characters is refused"
    );
    for url in cluster.urls() {
        let _: () = redis::cmd("SET")
            .arg(quorumlock::internals::lock_key(name))
            .arg("0123456789abcdef0123456789abcdef")
            .arg("PX")
            .arg(30_000)
            .query(&mut common::connect(&url))
            .expect("SET");
    }
    let outputs = [
        quorumlock()
            .args(["status", name, "--nodes", &nodes(&cluster)])
            .output(),
        quorumlock()
            .args(["list", "--nodes", &nodes(&cluster)])
            .output(),
        run_command(&cluster, name, "200ms")
            .args(["--no-wait", "--", "true"])
            .output(),
        quorumlock()
            .args(["break", name, "--yes", "--nodes", &nodes(&cluster)])
            .output(),
    ];
    for (what, output) in ["status", "list", "run", "break"].iter().zip(outputs) {
        let output = output.expect("runs");
        let (stdout, stderr) = text(&output);
        assert!(
            !stdout.contains('\u{1b}') && !stderr.contains('\u{1b}'),
            "{what} printed the escape sequence raw: {stdout:?} {stderr:?}"
        );
        assert!(
            stdout.contains("\\u{1b}") || stderr.contains("\\u{1b}"),
            "{what} did not show the name: {stdout:?} {stderr:?}"
        );
    }
}

/// The automatic holder description names the command's program: a path
/// with a character a description may not hold (a bidi control, which
/// reorders what an operator's terminal shows) is made into spaces, not
/// refused as a bad `--holder` (it used to exit 125).
#[test]
fn a_program_path_with_a_bidi_control_still_runs() {
    let cluster = common::cluster(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("job\u{202e}gpj.sh");
    std::fs::write(&program, "#!/bin/sh\nexit 7\n").expect("script");
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let output = run_command(&cluster, &common::resource("cli:bidi"), "500ms")
        .arg("--")
        .arg(&program)
        .output()
        .expect("runs");
    assert_eq!(
        output.status.code(),
        Some(7),
        "the command's own code: {}",
        text(&output).1
    );
}

/// `break` with the counter node down: the counter the other nodes hold
/// (none) says nothing of the tokens issued, and `break` says it does not
/// know, not that the holders had no tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_without_the_counter_node_says_the_token_is_unknown() {
    let cluster = common::cluster(3);
    let holder = common::manager(cluster.urls());
    let name = common::resource("cli:break-unknown");
    // A lock on every node, so that nodes 1 and 2 hold it once node 0 is
    // gone: the first grants of a fresh manager may leave out a node that
    // is still being observed (and the third SET may land a moment later).
    let urls = cluster.urls();
    let mut lock = None;
    for _ in 0..20 {
        let candidate = holder.lock(&name).await.expect("free");
        let everywhere = common::eventually(common::scaled(Duration::from_millis(500)), || {
            urls.iter()
                .all(|url| common::stored_value(url, &name).as_deref() == Some(candidate.value()))
        })
        .await;
        if everywhere {
            lock = Some(candidate);
            break;
        }
        candidate.release().await.expect("release");
    }
    let lock = lock.expect("a lock on all three nodes within 20 tries");
    assert!(lock.token().is_some(), "fencing is on");
    cluster.kill(0).expect("kill the counter node");
    let output = quorumlock()
        .args(["break", &name, "--yes", "--nodes", &nodes(&cluster)])
        .args(["--node-timeout", "500ms"])
        .output()
        .expect("runs");
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(0), "{stdout} {stderr}");
    assert!(
        stdout.contains("token is unknown") && !stdout.contains("had no tokens"),
        "{stdout}"
    );
    drop(lock);
}

/// A `run` whose attempt fails (two of three nodes do not answer) removes
/// the key it set on the node that answered before it exits: it used to
/// return without waiting for the rollback, which died with the process,
/// and with `--at-least 10m` the key kept every other host from the job
/// for ten minutes (another host, with every node up, skipped it: nobody
/// ran it).
#[test]
fn a_failed_run_leaves_no_key_behind() {
    use quorumlock::testkit::ClusterOptions;

    let cluster = TestCluster::start_with(
        3,
        &ClusterOptions {
            proxied: true,
            ..ClusterOptions::default()
        },
    )
    .expect("three nodes behind proxies");
    for i in [1, 2] {
        cluster.proxy(i).expect("proxy").set_unresponsive(true);
    }
    // The rollback's delete takes 150 ms to reach node 0, as on a busy
    // host: a process that does not wait for it exits first. (A 2 s node
    // timeout lets node 0's slow connect and SET answer; the silent
    // nodes' connects time out.)
    cluster
        .proxy(0)
        .expect("proxy")
        .set_latency_to_node(quorumlock::testkit::Delay::fixed(Duration::from_millis(
            150,
        )));
    let direct = common::direct_urls(&cluster);
    let r = common::resource("review:failed-run");
    let failed = run_command(&cluster, &r, "2s")
        .args(["-n", "--at-least", "10m", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(
        failed.status.code(),
        Some(125),
        "two of three nodes do not answer: {}",
        String::from_utf8_lossy(&failed.stderr)
    );
    let left = common::stored_value(&direct[0], &r);
    assert!(
        left.is_none(),
        "the failed attempt's key stayed on the node that answered: {left:?}"
    );
    let scratch = tempfile::tempdir().expect("temp dir");
    let marker = scratch.path().join("ran");
    let other_host = quorumlock()
        .args(["run", "--nodes", &direct.join(","), &r])
        .args(["-n", "-E", "0", "--at-least", "10m", "--", "touch"])
        .arg(&marker)
        .output()
        .expect("runs");
    assert_eq!(other_host.status.code(), Some(0), "{other_host:?}");
    assert!(
        marker.exists(),
        "the other host skipped the job: nobody ran it"
    );
}

/// Names that differ only by an invisible or reordering character are
/// shown escaped, not alike: `list` showed two rows both reading
/// "nightly-report", and `break nightly-report --yes` broke the healthy
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_invisible_characters_escaped() {
    let cluster = common::cluster(3);
    let manager = common::manager(cluster.urls());
    let plain = common::resource("nightly-report");
    let lookalike = format!("{plain}\u{200B}");
    let held = manager.lock(&lookalike).await.expect("free");
    let output = quorumlock()
        .args(["status", &lookalike, "--nodes", &nodes(&cluster)])
        .output()
        .expect("runs");
    let (stdout, _) = text(&output);
    assert!(
        stdout.contains(&format!("{plain}\\u{{200b}}")),
        "the zero-width space is not shown: {stdout}"
    );
    held.release().await.expect("release");
}
