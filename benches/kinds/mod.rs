//! The lock-kinds section of `cargo bench --bench quorum -- kinds`, on five
//! nodes (fencing on, counter node):
//! - uncontended lock + release latency of a lock on 1, 2, 4 and 8
//!   resources (`lock_many`), beside `lock()` on one resource and the
//!   floor (`SET NX PX` + `DEL` on the five nodes in parallel);
//! - throughput on one shared resource: 8 readers (`read` + release, all
//!   sharing it) beside 8 writers (`write` + release, taking turns), and
//!   `lock()` over distinct resources at 8 tasks, in the same run.

use std::sync::Arc;
use std::time::Duration;

use quorumlock::bench::{self, BoxedOp, Floor, LockClient, Quorumlock, Row, Stats};
use quorumlock::testkit::TestCluster;
use quorumlock::{Error, Fencing, LockManager};

/// `lock_many` on `count` resources derived from the one given.
struct Many {
    manager: LockManager,
    count: usize,
}

impl LockClient for Many {
    fn name(&self) -> String {
        let plural = if self.count == 1 { "" } else { "s" };
        format!("lock_many, {} resource{plural}", self.count)
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a> {
        Box::pin(async move {
            let names: Vec<String> = (0..self.count).map(|i| format!("{resource}:{i}")).collect();
            let lock = self.manager.lock_many(&names).await.map_err(kind)?;
            lock.release().await.map_err(kind)
        })
    }
}

/// `read` (or `write`) then release, all tasks on one resource.
struct Side {
    manager: LockManager,
    read: bool,
}

impl LockClient for Side {
    fn name(&self) -> String {
        if self.read {
            "read + release"
        } else {
            "write + release"
        }
        .to_owned()
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a> {
        Box::pin(async move {
            if self.read {
                let lock = self.manager.read(resource).await.map_err(kind)?;
                lock.release().await.map_err(kind)
            } else {
                let lock = self.manager.lock(resource).await.map_err(kind)?;
                lock.release().await.map_err(kind)
            }
        })
    }
}

fn kind(error: Error) -> String {
    error.kind().to_owned()
}

fn manager(urls: &[String], trust_at_once: bool) -> LockManager {
    let mut builder = LockManager::builder()
        .tcp_nodelay(quorumlock::bench::nodelay())
        .nodes(urls.to_vec())
        .fencing(Fencing::CounterNode { node: 0 });
    if trust_at_once {
        builder = builder.node_guard(quorumlock::NodeGuard::default().trust_restarts());
    }
    builder.build().expect("valid settings")
}

/// Runs the section and renders its two tables.
pub async fn section(args: &[&str], iterations: usize, run_for: Duration) -> String {
    let trust_at_once = !args.contains(&"always");
    let cluster = TestCluster::start_with_args(5, args).expect("start 5 nodes");
    let urls = cluster.urls();
    let bound = Duration::from_secs(2);

    let floor = Floor::connect("floor: 5 nodes in parallel", &urls)
        .await
        .expect("floor");
    let single = Quorumlock {
        label: "lock, 1 resource".to_owned(),
        manager: manager(&urls, trust_at_once),
    };
    let many: Vec<Many> = [1, 2, 4, 8]
        .into_iter()
        .map(|count| Many {
            manager: manager(&urls, trust_at_once),
            count,
        })
        .collect();
    let mut clients: Vec<&dyn LockClient> = vec![&floor, &single];
    clients.extend(many.iter().map(|m| m as &dyn LockClient));
    let latency = bench::latency(&clients, 100, iterations, bound, || {}).await;
    eprintln!("measured multi-resource latency");
    let rows: Vec<Row<'_>> = latency
        .iter()
        .map(|stats| Row {
            scenario: "5 nodes, uncontended".to_owned(),
            stats,
            floor: Some(&latency[0]),
            peer: Some(&latency[1]),
        })
        .collect();
    let mut out = String::from(
        "### Lock kinds: a lock on several resources\n\n\
         Uncontended lock + release, five nodes, counter-node fencing; \"vs peer\" is the \
         ratio to `lock()` on one resource.\n\n",
    );
    out.push_str(&bench::table(&rows, false));

    let tasks = 8;
    let side = |read| -> Arc<dyn LockClient> {
        Arc::new(Side {
            manager: manager(&urls, trust_at_once),
            read,
        })
    };
    let (readers, writers) = (side(true), side(false));
    let distinct: Arc<dyn LockClient> = Arc::new(Quorumlock {
        label: "lock + release, distinct resources".to_owned(),
        manager: manager(&urls, trust_at_once),
    });
    let runs: Vec<(String, Stats)> = vec![
        (
            format!("{tasks} tasks, one resource"),
            bench::throughput(Arc::clone(&readers), tasks, run_for, true, bound).await,
        ),
        (
            format!("{tasks} tasks, one resource"),
            bench::throughput(Arc::clone(&writers), tasks, run_for, true, bound).await,
        ),
        (
            format!("{tasks} tasks, distinct resources"),
            bench::throughput(Arc::clone(&distinct), tasks, run_for, false, bound).await,
        ),
    ];
    eprintln!("measured reader and writer throughput");
    let rows: Vec<Row<'_>> = runs
        .iter()
        .map(|(scenario, stats)| Row {
            scenario: scenario.clone(),
            stats,
            floor: None,
            peer: Some(&runs[1].1),
        })
        .collect();
    out.push_str(
        "\n### Lock kinds: readers and writers on one resource\n\n\
         Throughput over the same five nodes; \"vs peer\" is the ratio to the writers.\n\n",
    );
    out.push_str(&bench::table(&rows, true));
    out
}
