//! `quorumlock run -- CMD`: hold a lock while a command runs, like
//! `flock` across machines. The lock is kept alive for as long as the
//! command runs; if it is lost, the command is terminated.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::Signal;
use quorumlock::kind::{Exclusive, Kind, Many, Unshared};
use quorumlock::{Error, FencingToken, KeepAlive, Lock, LockManager, Request};
use tokio::time::Instant;

use crate::guardian::Spawn;
use crate::process_tree::{Group, GroupEvent, end_moments, ignore_terminal_stops};
use crate::signals::{self, Signals};
use crate::{Failure, FencingMode, NodeArgs, duration, exit};

/// How long before the lock's validity ends a command that outlives its
/// grace is killed: the kill lands before anyone else can get the lock.
const KILL_MARGIN: Duration = Duration::from_millis(100);

#[derive(Args)]
pub struct RunArgs {
    /// The resources to lock: one, or several at once (all or none, in
    /// any order).
    #[arg(required = true, num_args = 1.., value_name = "NAME")]
    resource: Vec<String>,
    /// Take a read lock (shared, as flock -s): shared with other readers,
    /// excluding writers (one resource only). The token is then the latest
    /// writer's, for comparing, not for writes.
    #[arg(short = 's', long, alias = "shared")]
    read: bool,
    /// Lock TTL; the lock is extended every TTL/3 while the command runs.
    #[arg(long, default_value = crate::DEFAULT_TTL.as_str(), value_parser = duration)]
    ttl: Duration,
    /// How long to wait for the lock before giving up (exit 124, or
    /// --conflict-exit-code). Waiters queue in arrival order and are woken
    /// when the holder releases.
    #[arg(short, long, default_value = crate::DEFAULT_WAIT.as_str(), value_parser = duration)]
    wait: Duration,
    /// Do not wait: one attempt, then give up if the lock is held.
    #[arg(short, long, conflicts_with = "wait")]
    no_wait: bool,
    /// The exit code when the lock is not acquired (as flock -E).
    #[arg(short = 'E', long, default_value_t = exit::NOT_ACQUIRED, value_name = "CODE")]
    conflict_exit_code: u8,
    /// How fencing tokens are issued; all clients of a resource must agree.
    #[arg(long, value_enum, default_value_t = FencingMode::Counter)]
    fencing: FencingMode,
    /// After the lock is lost: time between SIGTERM and SIGKILL to the
    /// command's processes (default: half the TTL). Shorter than `--ttl`,
    /// and cut short so that the SIGKILL lands before the lock's validity
    /// ends.
    #[arg(long, value_parser = duration)]
    grace: Option<Duration>,
    /// Bound on each node's reply [default: 500ms, or a tenth of --ttl
    /// when that is shorter, at least 50ms].
    #[arg(long, value_parser = duration)]
    node_timeout: Option<Duration>,
    /// Longest time the lock is kept, then the command is terminated
    /// (default: no limit).
    #[arg(long, value_parser = duration)]
    max_hold: Option<Duration>,
    /// Keep the lock from others until this long after it was taken, even
    /// when the command ends sooner: a cron job on many hosts then runs at
    /// most once per interval (give a little less than the interval, with
    /// -n; every host the same). Nodes that may have lost the lock
    /// (restarted, flushed, clock jumped) are not counted for that long;
    /// a clock stepped and set back unseen, or a lying disk, still frees
    /// it early (docs/recipes.md). Not with --read.
    #[arg(long, value_parser = duration, conflicts_with = "read")]
    at_least: Option<Duration>,
    /// Who holds the lock, stored with it for `status` and `list` (at
    /// most 256 bytes; default: host, pid and the command's program).
    #[arg(long, value_name = "TEXT")]
    holder: Option<String>,
    /// Which counter issues the resource's fencing tokens; all clients of
    /// a resource must agree.
    #[arg(long, value_enum, default_value_t = crate::CounterMode::PerResource)]
    fence_counters: crate::CounterMode,
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
        .node_timeout(
            args.node_timeout.unwrap_or(
                crate::CLI_NODE_TIMEOUT
                    .min(args.ttl / 10)
                    .max(quorumlock::DEFAULT_NODE_TIMEOUT),
            ),
        )
        .max_hold(args.max_hold.unwrap_or(Duration::MAX))
        .fencing(args.fencing.into())
        .fence_counters(args.fence_counters.into())
        .build()?;
    // Settings that cannot keep the lock alive fail before it is taken.
    manager.check_keep_alive(args.ttl)?;
    if args.read && args.resource.len() > 1 {
        return Err(Failure::new(
            exit::USAGE,
            "--read takes one NAME; a read lock covers one resource",
        ));
    }
    let grace = grace(&args)?;
    ignore_terminal_stops();
    // From here on, a signal is ours to handle: while waiting it ends the
    // wait (the queue entry is cleaned up), later it goes to the command.
    let signals = Signals::install()?;
    let resources = args.resource.as_slice();
    let holder = holder(&args);
    match (args.read, resources) {
        (true, [one]) => {
            let request = manager.read(one).holder(holder);
            hold(&args, &manager, request, Lock::writer_token, grace, signals).await
        }
        (false, [one]) => {
            let request = kept_at_least(manager.lock(one).holder(holder), args.at_least);
            hold(
                &args,
                &manager,
                request,
                Lock::<Exclusive>::token,
                grace,
                signals,
            )
            .await
        }
        (_, several) => {
            let request = kept_at_least(manager.lock_many(several).holder(holder), args.at_least);
            hold(
                &args,
                &manager,
                request,
                Lock::<Many>::token,
                grace,
                signals,
            )
            .await
        }
    }
}

/// The description stored with the lock: `--holder`, or this host, pid
/// and the command's program (not its arguments: they may hold secrets,
/// and anyone who can read the nodes reads the description), cut to what
/// a lock may carry.
fn holder(args: &RunArgs) -> String {
    if let Some(given) = &args.holder {
        return given.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "unknown host".to_owned());
    let program = args.command.first().map_or("", String::as_str);
    quorumlock::holder_description(&format!("{host} pid {}: {program}", std::process::id()))
}

/// `request`, kept from others until `--at-least` after it is taken, if
/// given.
fn kept_at_least<K: Unshared>(
    request: Request<'_, K>,
    at_least: Option<Duration>,
) -> Request<'_, K> {
    match at_least {
        Some(at_least) => request.at_least(at_least),
        None => request,
    }
}

/// Takes the lock `request` asks for, waiting as the flags say (a signal
/// meanwhile ends the wait: the queue entry is cleaned up), then runs the
/// command under it. `token` is what the command is told of its token.
async fn hold<K: Kind>(
    args: &RunArgs,
    manager: &LockManager,
    request: Request<'_, K>,
    token: fn(&Lock<K>) -> Option<FencingToken>,
    grace: Duration,
    mut signals: Signals,
) -> Result<u8, Failure> {
    let request = if args.no_wait {
        request.no_wait()
    } else {
        request.wait(args.wait)
    };
    let acquired = {
        // Boxed, so that a signal can drop it (leave the queue) at once.
        let mut acquiring = Box::pin(acquire(request, args.wait, args.conflict_exit_code));
        loop {
            tokio::select! {
                acquired = &mut acquiring => match acquired {
                    Ok(lock) => break lock,
                    Err(failure) => {
                        // A failed attempt's rollback runs in the
                        // background: it must reach the nodes before this
                        // process ends, or a key left on a node that
                        // answered keeps the lock from others until it
                        // expires (`--at-least`: that long).
                        settle(manager).await;
                        return Err(failure);
                    }
                },
                arrival = signals.next() => match arrival.signal {
                    Signal::SIGTSTP => stop_self(),
                    Signal::SIGCONT => {}
                    sig => {
                        drop(acquiring);
                        settle(manager).await;
                        signals::die_by(sig);
                        return Ok(signals::killed_by(sig));
                    }
                },
            }
        }
    };
    let token = token(&acquired);
    let keep = acquired.keep_alive()?;
    // The guardian ends the tree by the lock's validity from the start.
    let end_at = end_moments(
        keep.lease().valid_until(),
        KILL_MARGIN,
        guardian_grace(grace, args.ttl),
    )
    .unwrap_or((0, 0));
    let command = Spawn {
        program: &args.command[0],
        args: &args.command[1..],
        env: lock_env(token, args),
        group: None,
        end_at,
    };
    let mut group = match Group::spawn(command).await {
        Ok(group) => group,
        Err(e) => {
            // Nothing ran: the lock goes back at once, also one taken
            // --at-least (another host may run the job this interval).
            let lost = !keep.lease().is_valid();
            if let Ok(lock) = keep.stop().await {
                let _ = lock.release_at_once().await;
            }
            settle(manager).await;
            if lost {
                return Err(Failure::new(
                    exit::LOST,
                    format!(
                        "the lock on {} ran out before the command could start (was quorumlock \
                         stopped?); it was not started",
                        printable_names(&args.resource)
                    ),
                ));
            }
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            return Err(Failure::new(
                code,
                format!("cannot run `{}`: {e}", args.command[0]),
            ));
        }
    };
    let mut received = None;
    let outcome = supervise(
        &mut group,
        &keep,
        &mut signals,
        args.ttl,
        grace,
        &mut received,
    )
    .await;
    let mut died_by = None;
    let code = match outcome {
        // The guardian killed the command (the lock was about to end while
        // quorumlock was stopped or starved), or the lock ended before the
        // command did: it did not finish under the lock.
        Outcome::Gone(_) if group.guardian_acted().await || !keep.lease().is_valid() => {
            group.dismiss_guardian();
            let why = why_the_lock_ran_out(&keep).await;
            say(&format!(
                "the lock on {} ran out while the command ran ({why}); the command was ended \
                 before its validity did",
                printable_names(&args.resource)
            ));
            drop(keep);
            exit::LOST
        }
        Outcome::Gone(status) => {
            group.dismiss_guardian();
            // Killed by the signal we got (Ctrl-C): end the same way.
            died_by = status
                .signal()
                .and_then(|sig| Signal::try_from(sig).ok())
                .filter(|&sig| received == Some(sig));
            match keep.release().await {
                Ok(()) => exit_code(status),
                // Taken over, broken, or expired meanwhile, seen only now:
                // the command may not have run alone, whatever it returned.
                Err(e @ (Error::NotHeld { .. } | Error::Lost { .. })) => {
                    say(&format!(
                        "the command finished, but the lock was no longer held at its release \
                         ({e}): another holder may have run meanwhile"
                    ));
                    died_by = None;
                    exit::LOST
                }
                Err(e) => {
                    say(&format!(
                        "the command finished, but the release failed: {e}"
                    ));
                    exit_code(status)
                }
            }
        }
        Outcome::Failed(e) => {
            say(&format!("{e}; terminating the command"));
            end_group(&mut group, keep, grace).await;
            exit::ERROR
        }
        Outcome::Lost(lost) => {
            say(&format!("{lost}; terminating the command"));
            end_group(&mut group, keep, grace).await;
            exit::LOST
        }
    };
    // Let the release reach the slower nodes too before exiting.
    settle(manager).await;
    if let Some(sig) = died_by {
        signals::die_by(sig);
    }
    Ok(code)
}

/// How long before its SIGKILL the guardian sends the tree SIGTERM when
/// `quorumlock` stops telling it the lock is valid: `grace`, but at most a
/// sixth of the TTL, and never so early that a `quorumlock` extending on
/// time (every third of the TTL, telling every twelfth) could still be
/// about to tell it a later moment: the SIGTERM comes with at most half
/// the TTL (less `KILL_MARGIN`, halved) of validity left.
fn guardian_grace(grace: Duration, ttl: Duration) -> Duration {
    grace
        .min(ttl / 6)
        .min((ttl / 2).saturating_sub(KILL_MARGIN) / 2)
}

/// Why a lock ran out while its command ran (the guardian ended the
/// command, or the command ended just as the lock did): the loss the lease
/// reports before the validity ends (extensions that failed, a takeover),
/// else `quorumlock` itself did not keep the lock alive in time.
async fn why_the_lock_ran_out<K: Kind>(keep: &KeepAlive<K>) -> String {
    let lease = keep.lease();
    let left = lease
        .valid_until()
        .saturating_duration_since(Instant::now())
        .min(Duration::from_secs(2));
    match tokio::time::timeout(left + KILL_MARGIN, keep.lost()).await {
        Ok(lost) => lost.to_string(),
        Err(_) => "quorumlock was stopped or starved of CPU past the lock's validity, so \
                   nothing extended it"
            .to_owned(),
    }
}

/// Resource names as they may be printed to a terminal: control
/// characters (an escape sequence) shown escaped, not acted on.
pub fn printable_names(names: &[String]) -> String {
    names
        .iter()
        .map(|name| crate::printable(name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Stops `quorumlock` until it is continued (SIGCONT), as Ctrl-Z would
/// have without the handler.
fn stop_self() {
    let _ = nix::sys::signal::raise(Signal::SIGSTOP);
}

/// `--grace`, checked against the TTL: after a loss at most one TTL of
/// validity is left, and the command is killed before it ends.
fn grace(args: &RunArgs) -> Result<Duration, Failure> {
    match args.grace {
        None => Ok(args.ttl / 2),
        Some(grace) if grace < args.ttl => Ok(grace),
        Some(grace) => Err(Failure::new(
            exit::USAGE,
            format!(
                "--grace {grace:?} must be shorter than --ttl {:?}: after the lock is lost, the \
                 command is killed before the lock's validity ends, at most one TTL later",
                args.ttl
            ),
        )),
    }
}

/// Terminates the group before the lock's validity ends (SIGTERM, up to
/// `grace`, then SIGKILL) and only then lets go of the lock: released
/// once the group is gone, or left to expire if it is not.
async fn end_group<K: Kind>(group: &mut Group, keep: KeepAlive<K>, grace: Duration) {
    let deadline = keep
        .lease()
        .valid_until()
        .checked_sub(KILL_MARGIN)
        .unwrap_or_else(Instant::now);
    if group.terminate(grace, deadline).await {
        group.dismiss_guardian();
        drop(keep);
    } else {
        say("the command's processes did not end after SIGKILL; the lock is left to expire");
        // Not released: the keys expire on their own. The guardian kills
        // the group again when quorumlock exits.
        std::mem::forget(keep);
    }
}

/// What the child learns of its lock, as environment variables. A read
/// lock's token is the latest writer's, to compare, never to write with:
/// it has a name of its own.
fn lock_env(token: Option<FencingToken>, args: &RunArgs) -> Vec<(String, String)> {
    let access = if args.read { "read" } else { "exclusive" };
    let mut env = vec![
        ("QUORUMLOCK_ACCESS".to_owned(), access.to_owned()),
        (
            "QUORUMLOCK_RESOURCE_COUNT".to_owned(),
            args.resource.len().to_string(),
        ),
    ];
    if let [one] = args.resource.as_slice() {
        env.push(("QUORUMLOCK_RESOURCE".to_owned(), one.clone()));
    }
    for (i, name) in args.resource.iter().enumerate() {
        env.push((format!("QUORUMLOCK_RESOURCE_{}", i + 1), name.clone()));
    }
    if let Some(token) = token {
        let name = if args.read {
            "QUORUMLOCK_WRITER_TOKEN"
        } else {
            "QUORUMLOCK_TOKEN"
        };
        env.push((name.to_owned(), token.to_string()));
    }
    env
}

/// Waits for background releases, and says so when some did not finish.
async fn settle(manager: &LockManager) {
    if !manager.settle().await {
        say("some nodes did not confirm the release in time; their keys expire after the TTL");
    }
}

/// Takes the lock (queued, woken by the release); a resource that stays
/// held ends as `conflict_exit_code`, every other error (unreachable nodes
/// after the backoff, bad settings) as quorumlock's own failure.
async fn acquire<K: Kind>(
    request: Request<'_, K>,
    wait: Duration,
    conflict_exit_code: u8,
) -> Result<Lock<K>, Failure> {
    match request.await {
        Ok(lock) => Ok(lock),
        Err(error @ Error::WaitTimedOut { .. }) => Err(Failure::new(
            conflict_exit_code,
            format!("not acquired within {wait:?}: {error}"),
        )),
        Err(error @ Error::Contended { .. }) => Err(Failure::new(
            conflict_exit_code,
            format!("not acquired: {error}"),
        )),
        Err(other) => Err(other.into()),
    }
}

enum Outcome {
    /// The command exited and its group is gone.
    Gone(ExitStatus),
    Lost(Error),
    Failed(std::io::Error),
}

/// Waits for the command and every process it started, or the loss of
/// the lock; meanwhile passes the signals `quorumlock` gets on to them
/// (not those the terminal sent to a job they share: they got it; the last
/// one that ends a process is kept in `received`), and tells the guardian
/// how long the lock is valid, every twelfth of the TTL: a `quorumlock`
/// that stops doing so, stopped or starved, has its command's whole tree
/// sent SIGTERM, then SIGKILL before the validity it last told ends. The
/// SIGTERM comes at most a sixth of the TTL before the SIGKILL (`grace`
/// cut so), well after the moment a `quorumlock` that extends every third
/// of the TTL has told a later validity.
async fn supervise<K: Kind>(
    group: &mut Group,
    keep: &KeepAlive<K>,
    signals: &mut Signals,
    ttl: Duration,
    grace: Duration,
    received: &mut Option<Signal>,
) -> Outcome {
    let lease = keep.lease();
    let mut tell = tokio::time::interval((ttl / 12).max(Duration::from_millis(10)));
    let guardian_grace = guardian_grace(grace, ttl);
    tell.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // The loss first: a group the guardian killed for it is gone too.
            biased;
            lost = keep.lost() => return Outcome::Lost(lost),
            event = group.next_event() => match event {
                GroupEvent::Gone(status) => return Outcome::Gone(status),
                // The command died with it (its parent): what it started
                // is ended before the lock goes.
                GroupEvent::GuardianDied => return Outcome::Failed(std::io::Error::other(
                    "the guardian, the command's parent, was killed, and the command with it",
                )),
            },
            arrival = signals.next() => {
                let they_got_it = group.shared() && arrival.from_terminal;
                match arrival.signal {
                    Signal::SIGTSTP => {
                        if !they_got_it {
                            group.signal(Signal::SIGTSTP);
                        }
                        stop_self();
                    }
                    Signal::SIGCONT => group.signal(Signal::SIGCONT),
                    sig => {
                        if !they_got_it {
                            group.signal(sig);
                        }
                        *received = Some(sig);
                    }
                }
            }
            _ = tell.tick() => {
                group.valid_until(lease.valid_until(), KILL_MARGIN, guardian_grace).await;
            }
        }
    }
}

/// A diagnostic on standard error. Never fails: the command may own the
/// terminal (a write from the background may fail), and a diagnostic must
/// not stop the work of ending the command before the lock.
fn say(message: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "quorumlock: {}",
        crate::printable_lines(message)
    );
}

/// The command's exit code, or 128 + the signal that killed it.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(exit::ERROR),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::ERROR),
        (None, None) => exit::ERROR,
    }
}
