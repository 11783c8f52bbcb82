//! `quorumlock run -- CMD`: hold a lock while a command runs, like
//! `flock` across machines. The lock is kept alive for as long as the
//! command runs; if it is lost, the command is terminated.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use quorumlock::{Error, KeepAlive, LockManager};
use tokio::process::{Child, Command};

use crate::{Failure, FencingMode, NodeArgs, StopSignals, duration, exit};

#[derive(Args)]
pub struct RunArgs {
    /// The resource to lock; repeat it to lock several at once (all or
    /// none, in any order).
    #[arg(long, required = true)]
    resource: Vec<String>,
    /// Take a read lock: shared with other readers, excluding writers (one
    /// resource only). The token is then the latest writer's, for
    /// comparing, not for writes.
    #[arg(long)]
    read: bool,
    /// Lock TTL; the lock is extended every TTL/3 while the command runs.
    #[arg(long, default_value = "10s", value_parser = duration)]
    ttl: Duration,
    /// How long to wait for the lock before giving up (exit 124). Waiters
    /// queue in arrival order and are woken when the holder releases.
    #[arg(long, default_value = "30s", value_parser = duration)]
    wait: Duration,
    /// How fencing tokens are issued; all clients of a resource must agree.
    #[arg(long, value_enum, default_value_t = FencingMode::Counter)]
    fencing: FencingMode,
    /// After the lock is lost: time between SIGTERM and SIGKILL to the command.
    #[arg(long, default_value = "10s", value_parser = duration)]
    grace: Duration,
    /// Bound on each node's reply.
    #[arg(long, default_value = "50ms", value_parser = duration)]
    node_timeout: Duration,
    /// Longest time the lock is kept (then the command is terminated).
    #[arg(long, default_value = "1h", value_parser = duration)]
    max_hold: Duration,
    #[command(flatten)]
    nodes: NodeArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

pub async fn run(args: RunArgs) -> Result<u8, Failure> {
    let manager = args
        .nodes
        .builder()?
        .ttl(args.ttl)
        .node_timeout(args.node_timeout)
        .max_hold(args.max_hold)
        .fencing(args.fencing.into())
        .build()?;
    // Settings that cannot keep the lock alive fail before it is taken.
    manager.check_keep_alive(args.ttl)?;
    if args.read && args.resource.len() > 1 {
        return Err(Failure::new(
            exit::USAGE,
            "--read takes one --resource; a read lock covers one resource",
        ));
    }
    let keep = acquire_within(&manager, &args.resource, args.read, args.wait)
        .await?
        .keep_alive()?;
    let lease = keep.lease();
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        // One name, or `[a, b]` for several.
        .env("QUORUMLOCK_RESOURCE", lease.resource())
        .env(
            "QUORUMLOCK_ACCESS",
            if args.read { "read" } else { "exclusive" },
        )
        .kill_on_drop(true);
    if let Some(token) = lease.token() {
        command.env("QUORUMLOCK_TOKEN", token.to_string());
    }
    let mut signals = StopSignals::install()?;
    let mut child = command.spawn().map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        };
        Failure::new(code, format!("cannot run `{}`: {e}", args.command[0]))
    })?;
    let outcome = supervise(&mut child, &keep, &mut signals).await?;
    match outcome {
        Outcome::Exited(status) => {
            if let Err(e) = keep.release().await {
                eprintln!("quorumlock: the command finished, but the release failed: {e}");
            }
            // Let the release reach the slower nodes too before exiting.
            settle(&manager).await;
            Ok(exit_code(status))
        }
        Outcome::Lost(lost) => {
            eprintln!("quorumlock: {lost}; terminating the command");
            terminate(&mut child, args.grace).await;
            drop(keep);
            settle(&manager).await;
            Ok(exit::LOST)
        }
    }
}

/// Waits for background releases, and says so when some did not finish.
async fn settle(manager: &LockManager) {
    if !manager.settle().await {
        eprintln!(
            "quorumlock: some nodes did not confirm the release in time; their keys expire \
             after the TTL"
        );
    }
}

/// Waits for the lock up to `wait` (queued, woken by the release; see
/// `LockManager::lock_within`); contention and an unavailable cluster are
/// waited out, other errors end the wait at once.
async fn acquire_within(
    manager: &LockManager,
    resources: &[String],
    read: bool,
    wait: Duration,
) -> Result<quorumlock::Lock, Failure> {
    let acquired = match (read, resources) {
        (true, [one]) => manager.read_within(one, wait).await,
        (false, [one]) => manager.lock_within(one, wait).await,
        (_, several) => manager.lock_many_within(several, wait).await,
    };
    match acquired {
        Ok(lock) => Ok(lock),
        Err(
            error @ (Error::WaitTimedOut { .. }
            | Error::QuorumUnavailable { .. }
            | Error::TooSlow { .. }
            | Error::CounterNodeUnavailable { .. }),
        ) => Err(Failure::new(
            exit::NOT_ACQUIRED,
            format!("not acquired within {wait:?}: {error}"),
        )),
        Err(other) => Err(other.into()),
    }
}

enum Outcome {
    Exited(ExitStatus),
    Lost(Error),
}

/// Waits for the command or the loss of the lock, passing SIGINT and
/// SIGTERM on to the command meanwhile.
async fn supervise(
    child: &mut Child,
    keep: &KeepAlive,
    signals: &mut StopSignals,
) -> Result<Outcome, Failure> {
    loop {
        tokio::select! {
            status = child.wait() => {
                return status
                    .map(Outcome::Exited)
                    .map_err(|e| Failure::new(exit::ERROR, format!("waiting for the command: {e}")));
            }
            lost = keep.lost() => return Ok(Outcome::Lost(lost)),
            _ = signals.interrupt.recv() => send(child, Signal::SIGINT),
            _ = signals.terminate.recv() => send(child, Signal::SIGTERM),
        }
    }
}

fn send(child: &Child, sig: Signal) {
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = signal::kill(Pid::from_raw(pid), sig);
    }
}

/// SIGTERM, then SIGKILL if the command is still running after `grace`.
async fn terminate(child: &mut Child, grace: Duration) {
    send(child, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// The command's exit code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::ERROR),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::ERROR),
        (None, None) => exit::ERROR,
    }
}
