//! What operators and failures do to a [`ClusterMember`]'s shards: a manual
//! failover, a takeover once the replica caught up, a master killed, a
//! master stalled past its failover and resumed, a slot moved to another
//! master with its keys. Shared by the cluster soak
//! (`tests/soak_cluster.rs`) and the cluster benchmark's unavailability
//! table (`benches/cluster.rs`).

use std::time::{Duration, Instant};

use super::ClusterMember;
use super::cluster_member::{port_of, query};
use crate::error::{Error, Result};

/// How long a shard may take to settle after a move.
const SETTLE_WITHIN: Duration = Duration::from_secs(10);

fn failed(what: String) -> Error {
    Error::Testkit(what)
}

fn replication(url: &str) -> Option<String> {
    query::<String>(url, redis::cmd("INFO").arg("replication")).ok()
}

impl ClusterMember {
    /// Every shard whose replica is in sync: `(master URL, replica URL)`.
    pub fn shards(&self) -> Vec<(String, String)> {
        let urls = self.nodes().urls();
        let mut out = Vec::new();
        for url in &urls {
            if !replication(url).is_some_and(|info| info.contains("role:master")) {
                continue;
            }
            let following = format!("master_port:{}\r", port_of(url));
            let replica = urls.iter().find(|other| {
                replication(other).is_some_and(|info| {
                    info.contains("role:slave")
                        && info.contains(&following)
                        && info.contains("master_link_status:up")
                })
            });
            if let Some(replica) = replica {
                out.push((url.clone(), replica.clone()));
            }
        }
        out
    }

    /// Waits (up to 10 s) until `url` says `role:master` and every running
    /// node of the member says `cluster_state:ok`; whether it did.
    pub async fn settled(&self, url: &str) -> bool {
        self.settled_without(url, None).await
    }

    /// [`settled`](Self::settled), not asking node `stalled` (which
    /// cannot answer).
    async fn settled_without(&self, url: &str, stalled: Option<usize>) -> bool {
        let deadline = Instant::now() + SETTLE_WITHIN;
        while Instant::now() < deadline {
            let promoted = replication(url).is_some_and(|info| info.contains("role:master"));
            let nodes = self.nodes();
            let agree = nodes
                .urls()
                .iter()
                .enumerate()
                .filter(|&(i, _)| Some(i) != stalled && nodes.is_running(i).unwrap_or(false))
                .all(|(_, node)| {
                    query::<String>(node, redis::cmd("CLUSTER").arg("INFO"))
                        .is_ok_and(|info| info.contains("cluster_state:ok"))
                });
            if promoted && agree {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// `CLUSTER FAILOVER` on `replica` (the master agrees and hands over
    /// once the replica has everything), then waits until it settled.
    pub async fn manual_failover(&self, master: &str, replica: &str) -> Result<String> {
        query::<()>(replica, redis::cmd("CLUSTER").arg("FAILOVER"))
            .map_err(|e| failed(format!("CLUSTER FAILOVER on {replica}: {e}")))?;
        self.took_over(master, replica, "manual failover").await
    }

    /// A takeover that loses nothing: `master`'s writers are paused until
    /// `replica` has everything, then the replica takes over without the
    /// master's agreement (`CLUSTER FAILOVER TAKEOVER`).
    pub async fn caught_up_takeover(&self, master: &str, replica: &str) -> Result<String> {
        pause_until_caught_up(master, replica).await?;
        let taken = query::<()>(
            replica,
            redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
        );
        // The old master's writers stay paused until the replica serves
        // (the promotion is not done when TAKEOVER answers): a write the
        // old master took in between would be lost.
        let done = match taken {
            Ok(()) => self.took_over(master, replica, "caught-up takeover").await,
            Err(e) => Err(failed(format!("TAKEOVER on {replica}: {e}"))),
        };
        let _ = query::<()>(master, redis::cmd("CLIENT").arg("UNPAUSE"));
        done
    }

    /// `master` dies (`SIGKILL`) once `replica` has everything (a lost
    /// write would repeat a fencing token), the replica takes over, and the
    /// dead master comes back as its replica (and does not fail over on
    /// its own either). Clients meet a dead master first: they must find
    /// the new one by themselves.
    pub async fn caught_up_kill(&self, master: &str, replica: &str) -> Result<String> {
        let index = self
            .nodes()
            .urls()
            .iter()
            .position(|url| url == master)
            .ok_or_else(|| failed(format!("{master} is not a node of the member")))?;
        pause_until_caught_up(master, replica).await?;
        self.nodes().kill(index)?;
        query::<()>(
            replica,
            redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"),
        )
        .map_err(|e| failed(format!("TAKEOVER on {replica} after {master} died: {e}")))?;
        let took_over = self.settled(replica).await;
        self.nodes().restart(index)?;
        // Set at run time only: the restarted node must not fail over on
        // its own either.
        let _ = query::<()>(
            master,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-replica-no-failover")
                .arg("yes"),
        );
        match took_over {
            true => Ok(format!("caught-up kill of {master}, {replica} took over")),
            false => Err(failed(format!(
                "{replica} did not take over from the dead {master}"
            ))),
        }
    }

    /// `master` stalls (`SIGSTOP`) while `replica`, allowed to fail over on
    /// its own for this, takes over once the cluster holds the master
    /// failed; then the master resumes (`SIGCONT`) and serves what was
    /// queued to it, before it learns it was replaced, and rejoins as a
    /// replica. Nothing waits for the replica to have caught up: a write
    /// the master did not get a replica to acknowledge may be lost.
    pub async fn stalled_takeover(&self, master: &str, replica: &str) -> Result<String> {
        let index = self
            .nodes()
            .urls()
            .iter()
            .position(|url| url == master)
            .ok_or_else(|| failed(format!("{master} is not a node of the member")))?;
        let no_failover = |url: &str, setting: &str| {
            query::<()>(
                url,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("cluster-replica-no-failover")
                    .arg(setting),
            )
        };
        no_failover(replica, "no").map_err(|e| failed(format!("CONFIG SET on {replica}: {e}")))?;
        self.nodes().pause(index)?;
        let took_over = self.settled_without(replica, Some(index)).await;
        self.nodes().resume(index)?;
        let _ = no_failover(replica, "yes");
        let _ = no_failover(master, "yes");
        match took_over {
            true => Ok(format!(
                "{master} stalled, {replica} took over, {master} resumed"
            )),
            false => Err(failed(format!(
                "{replica} did not take over from the stalled {master}"
            ))),
        }
    }

    /// Moves the slot of `key` from its master to the master `to`, keys
    /// and all ([`begin_slot_move`](Self::begin_slot_move), then
    /// [`end_slot_move`](Self::end_slot_move)). Clients see the slot
    /// migrating for `migrating` in between.
    pub async fn move_slot_of(&self, key: &str, to: &str, migrating: Duration) -> Result<String> {
        let slot = crate::keys::slot(key);
        let from = self.master_of(key)?;
        if from == to {
            return Err(failed(format!("slot {slot} is already on {to}")));
        }
        self.begin_slot_move(slot, &from, to)?;
        tokio::time::sleep(migrating).await;
        self.end_slot_move(slot, &from, to)?;
        Ok(format!("slot {slot} {from} -> {to}"))
    }

    /// Starts moving `slot` from the master at `from` to the one at `to`,
    /// as `redis-cli --cluster reshard` does: importing and migrating, then
    /// every key in it migrated. The slot stays migrating (the old master
    /// answers `ASK` for keys it no longer has) until
    /// [`end_slot_move`](Self::end_slot_move).
    pub fn begin_slot_move(&self, slot: u16, from: &str, to: &str) -> Result<()> {
        let fail = |e: Error| failed(format!("move of slot {slot}: {e}"));
        set_slot(to, slot, "IMPORTING", &node_id(from)?).map_err(fail)?;
        set_slot(from, slot, "MIGRATING", &node_id(to)?).map_err(fail)?;
        loop {
            let keys: Vec<String> = query(
                from,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(100),
            )
            .map_err(fail)?;
            if keys.is_empty() {
                return Ok(());
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(port_of(to))
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys);
            query::<redis::Value>(from, &migrate).map_err(fail)?;
        }
    }

    /// Ends the move of `slot` to the master at `to`: the two masters take
    /// the new owner (the importing one first: a refusal there leaves the
    /// slot half moved, an error), then every other node (replicas follow
    /// their masters' view, so a refusal there is fine).
    pub fn end_slot_move(&self, slot: u16, from: &str, to: &str) -> Result<()> {
        let fail = |e: Error| failed(format!("move of slot {slot}: {e}"));
        let to_id = node_id(to)?;
        set_slot(to, slot, "NODE", &to_id).map_err(fail)?;
        set_slot(from, slot, "NODE", &to_id).map_err(fail)?;
        for url in self.nodes().urls() {
            if url != to && url != from {
                let _ = set_slot(&url, slot, "NODE", &to_id);
            }
        }
        Ok(())
    }

    async fn took_over(&self, master: &str, replica: &str, what: &str) -> Result<String> {
        match self.settled(replica).await {
            true => Ok(format!("{what} {master} -> {replica}")),
            false => Err(failed(format!("{replica} did not take over from {master}"))),
        }
    }
}

fn node_id(url: &str) -> Result<String> {
    query(url, redis::cmd("CLUSTER").arg("MYID"))
}

/// `CLUSTER SETSLOT slot state node` on the node at `url`.
fn set_slot(url: &str, slot: u16, state: &str, node: &str) -> Result<()> {
    query(
        url,
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(node),
    )
}

/// Pauses the writers of `master` and waits (up to 3 s) until `replica`
/// has everything it wrote; the pause ends by itself after 5 s, or with
/// `CLIENT UNPAUSE`.
async fn pause_until_caught_up(master: &str, replica: &str) -> Result<()> {
    query::<()>(
        master,
        redis::cmd("CLIENT").arg("PAUSE").arg(5000).arg("WRITE"),
    )
    .map_err(|e| failed(format!("CLIENT PAUSE on {master}: {e}")))?;
    let offset = |url: &str, field: &str| -> Option<u64> {
        replication(url)?
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|v| v.trim().parse().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (sent, got) = (
            offset(master, "master_repl_offset:"),
            offset(replica, "slave_repl_offset:"),
        );
        if sent.is_some() && sent == got {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = query::<()>(master, redis::cmd("CLIENT").arg("UNPAUSE"));
            return Err(failed(format!(
                "{replica} did not catch up: {sent:?} against {got:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
