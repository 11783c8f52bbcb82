//! `quorumlock`: run a command under a distributed lock, start a local
//! cluster, inspect a resource, check node settings, benchmark.

mod bench;
mod cluster;
mod doctor;
mod guardian;
mod list;
mod members;
mod probe;
mod process_tree;
mod processes;
mod run;
mod signals;
mod status;
mod unlock;

use std::borrow::Cow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::LazyLock;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use quorumlock::Fencing;
use quorumlock::internals::holding::hides_or_reorders;

/// Exit codes of `quorumlock` itself; `run` otherwise passes the command's on.
pub mod exit {
    /// A check failed (`doctor`), the resource is not held (`status
    /// --held`), or `break` was not confirmed.
    pub const FAILED: u8 = 1;
    /// Bad arguments (clap's usage errors use it too).
    pub const USAGE: u8 = 2;
    /// `run`: the lock was lost while the command ran (it was
    /// terminated), or found no longer held at its release.
    pub const LOST: u8 = 123;
    /// `run`: the lock was not acquired within `--wait`.
    pub const NOT_ACQUIRED: u8 = 124;
    /// quorumlock failed (invalid settings, nodes unreachable, I/O).
    pub const ERROR: u8 = 125;
    /// `run`: the command was found but could not be executed.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// `run`: the command was not found.
    pub const NOT_FOUND: u8 = 127;
}

const EXIT_CODES: &str = "\
Exit codes:
  0-122, 128+N  run: the command's own exit code (128+N: killed by signal N;
                a signal quorumlock got and passed on ends it the same way)
  1             doctor: a check failed; status --held: not held; break: not
                confirmed
  2             bad arguments
  123           run: the lock was lost while the command ran (it was terminated),
                or was no longer held at its release (broken or taken over)
  124           run: the lock was not acquired within --wait (or -E's code)
  125           quorumlock itself failed (settings, unreachable nodes, I/O)
  126           run: the command could not be executed
  127           run: the command was not found";

#[derive(Parser)]
#[command(
    name = "quorumlock",
    version,
    about = "Distributed locks over N independent Redis masters (Redlock), with fencing tokens",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start local redis-server nodes and keep them running until Ctrl-C.
    Cluster(cluster::ClusterArgs),
    /// Run a command while holding a lock; release it when the command exits.
    #[command(after_help = EXIT_CODES)]
    Run(run::RunArgs),
    /// Show who holds a resource, node by node and as a quorum.
    Status(status::StatusArgs),
    /// List the locks held now (by name prefix), with holders and waiters.
    List(list::ListArgs),
    /// Force-unlock a resource whose holder is stuck (asks first).
    Break(unlock::BreakArgs),
    /// Check that the nodes are configured so that locks are safe.
    Doctor(doctor::DoctorArgs),
    /// Measure lock latency and throughput against the nodes.
    Bench(bench::BenchArgs),
}

/// The library's defaults as `--help` shows them and the parser reads them
/// back, so that the command line cannot drift from the library.
pub static DEFAULT_TTL: LazyLock<String> = LazyLock::new(|| shown(quorumlock::DEFAULT_TTL));
pub static DEFAULT_WAIT: LazyLock<String> = LazyLock::new(|| shown(quorumlock::DEFAULT_WAIT));
pub static DEFAULT_NODE_TIMEOUT: LazyLock<String> = LazyLock::new(|| shown(CLI_NODE_TIMEOUT));

/// The command line's bound on each node's reply, above the library's
/// 50 ms: a command line runs where other work keeps the host busy (cron
/// on several hosts at once, each starting its job together), and there a
/// lock's latency matters little. Measured in review: three hosts each
/// running `run` every round, with 50 ms nobody ran the job in 3 of 15
/// rounds (every host's attempt timed out); with 500 ms exactly one ran
/// in 15 of 15.
pub const CLI_NODE_TIMEOUT: Duration = Duration::from_millis(500);

fn shown(default: Duration) -> String {
    humantime::format_duration(default).to_string()
}

/// The nodes to talk to, shared by the subcommands that need them.
#[derive(Args, Debug, Clone)]
pub struct NodeArgs {
    /// Redis URLs of the nodes, comma-separated. A member that is a Redis
    /// Cluster is one `redis+cluster://host:port,host:port` URL (the
    /// addresses after it, up to the next URL, are its nodes).
    #[arg(long, env = "QUORUMLOCK_NODES", value_delimiter = ',', required = true)]
    nodes: Vec<String>,
    /// A private CA (PEM file) to trust for `rediss://` nodes, instead of
    /// the system's root certificates.
    #[arg(long, env = "QUORUMLOCK_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM file) for nodes that require one (mutual
    /// TLS); with `--tls-key`.
    #[arg(long, env = "QUORUMLOCK_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM file).
    #[arg(long, env = "QUORUMLOCK_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl NodeArgs {
    /// The members' URLs: as given, with the addresses that follow a
    /// `redis+cluster://` URL (split off by the commas) put back into it.
    pub fn urls(&self) -> Vec<String> {
        regroup(&self.nodes)
    }

    /// The TLS settings the flags give.
    pub fn tls(&self) -> Result<quorumlock::Tls, Failure> {
        let mut tls = quorumlock::Tls::new();
        if let Some(ca) = &self.tls_ca {
            tls = tls.ca_file(ca)?;
        }
        if let Some(cert) = &self.tls_cert {
            tls = tls.client_cert_file(cert)?;
        }
        if let Some(key) = &self.tls_key {
            tls = tls.client_key_file(key)?;
        }
        Ok(tls)
    }

    /// A manager builder for these nodes, with the TLS flags. An even
    /// number of nodes is warned of on stderr, where a command line's user
    /// sees it (the library tells only `tracing`).
    pub fn builder(&self) -> Result<quorumlock::LockManagerBuilder, Failure> {
        let count = self.urls().len();
        if count.is_multiple_of(2) && count > 0 {
            eprintln!(
                "quorumlock: warning: {count} nodes tolerate no more failures than {}; use an \
                 odd number",
                count - 1
            );
        }
        Ok(quorumlock::LockManager::builder()
            .nodes(self.urls())
            .tls(self.tls()?))
    }

    /// A client for one node (`status`, `doctor`), with the TLS flags for
    /// a `rediss://` URL.
    pub fn client(&self, url: &str) -> Result<redis::Client, String> {
        if !url.starts_with("rediss://") {
            return redis::Client::open(url).map_err(|e| format!("bad URL `{url}`: {e}"));
        }
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let client_tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            _ => None,
        };
        let root_cert = self.tls_ca.as_ref().map(read).transpose()?;
        redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| format!("bad URL `{url}`: {e}"))
    }
}

/// `pieces` of a comma-separated list of URLs, with each piece that is no
/// URL (`host:port`) joined to the cluster URL before it.
fn regroup(pieces: &[String]) -> Vec<String> {
    let mut urls: Vec<String> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match urls.last_mut() {
            Some(last) if !piece.contains("://") && last.contains("+cluster://") => {
                last.push(',');
                last.push_str(piece);
            }
            _ => urls.push(piece.clone()),
        }
    }
    urls
}

/// How fencing tokens are issued (all clients of a resource must agree).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FencingMode {
    /// Node 0 increments the counter (one round trip).
    Counter,
    /// A majority stores the token (two round trips).
    Quorum,
    /// No token.
    Off,
}

impl From<FencingMode> for Fencing {
    fn from(mode: FencingMode) -> Self {
        match mode {
            FencingMode::Counter => Fencing::CounterNode { node: 0 },
            FencingMode::Quorum => Fencing::Quorum,
            FencingMode::Off => Fencing::Off,
        }
    }
}

/// Which counter issues a resource's tokens (all clients of a resource
/// must agree).
#[derive(Debug, Clone, Copy, ValueEnum, Default)]
pub enum CounterMode {
    /// One counter per resource.
    #[default]
    PerResource,
    /// Resources with a hash tag share their tag's counter.
    PerHashTag,
}

impl From<CounterMode> for quorumlock::FenceCounters {
    fn from(mode: CounterMode) -> Self {
        match mode {
            CounterMode::PerResource => Self::PerResource,
            CounterMode::PerHashTag => Self::PerHashTag,
        }
    }
}

/// Parses `10s`, `250ms`, `1m30s`.
pub fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}); use e.g. 10s, 250ms, 1m"))
}

/// A failure of quorumlock itself, with the exit code to leave with.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<quorumlock::Error> for Failure {
    fn from(error: quorumlock::Error) -> Self {
        let code = match error {
            quorumlock::Error::InvalidConfig { .. } | quorumlock::Error::InvalidArgument { .. } => {
                exit::USAGE
            }
            _ => exit::ERROR,
        };
        Self::new(code, error.to_string())
    }
}

/// SIGINT and SIGTERM watchers. Install them before the process can be
/// signalled (before printing where to reach it, before spawning a child):
/// until then the default action, exit, applies.
pub struct StopSignals {
    pub interrupt: tokio::signal::unix::Signal,
    pub terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn install() -> Result<Self, Failure> {
        use tokio::signal::unix::{SignalKind, signal};
        let watch = |kind, name| {
            signal(kind).map_err(|e| Failure::new(exit::ERROR, format!("cannot watch {name}: {e}")))
        };
        Ok(Self {
            interrupt: watch(SignalKind::interrupt(), "SIGINT")?,
            terminate: watch(SignalKind::terminate(), "SIGTERM")?,
        })
    }

    /// Until either signal arrives.
    pub async fn either(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == guardian::GUARD_ARG)
    {
        let args: Vec<String> = std::env::args().collect();
        return guardian::guard_main(args.get(2..).unwrap_or_default());
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("quorumlock: cannot start the async runtime: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Cluster(args) => cluster::cluster(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::List(args) => list::list(args).await,
            Command::Break(args) => unlock::break_lock(args).await,
            Command::Doctor(args) => doctor::doctor(args).await,
            Command::Bench(args) => bench::bench(args).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("quorumlock: {}", printable_lines(&failure.message));
            ExitCode::from(failure.code)
        }
    }
}

/// Text from outside (a resource name, a holder's description) as it may
/// be written to a terminal: control characters, which could move the
/// cursor or rewrite what the operator reads, and characters that print as
/// nothing or reorder the text (`U+200B`, `U+202E`: two names that read
/// alike), are shown escaped (`\u{1b}`, `\u{200b}`), not acted on.
pub fn printable(text: &str) -> Cow<'_, str> {
    escaped(text, false)
}

/// As [`printable`], for a message that quotes such text: line breaks of
/// its own are kept.
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    escaped(text, true)
}

fn escaped(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let unsafe_char =
        |c: char| (c.is_control() && !(keep_newlines && c == '\n')) || hides_or_reorders(c);
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if unsafe_char(c) {
                    c.escape_default().collect()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_acted_on() {
        assert_eq!(printable("orders:7"), "orders:7");
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("a\rb\nc"), "a\\rb\\nc");
        assert_eq!(printable_lines("line 1\nx\u{7}"), "line 1\nx\\u{7}");
        // Two names that would read alike, and one that reads backwards.
        assert_eq!(
            printable("nightly-report\u{200B}"),
            "nightly-report\\u{200b}"
        );
        assert_eq!(printable("a\u{202E}trop"), "a\\u{202e}trop");
        assert_eq!(printable("naïve 注文"), "naïve 注文");
    }

    #[test]
    fn cluster_urls_keep_their_nodes() {
        let pieces: Vec<String> = "redis://a:1,redis+cluster://b:1,b:2,b:3,redis://c:1,x:9"
            .split(',')
            .map(str::to_owned)
            .collect();
        assert_eq!(
            regroup(&pieces),
            [
                "redis://a:1",
                "redis+cluster://b:1,b:2,b:3",
                "redis://c:1",
                "x:9"
            ]
        );
    }
}
