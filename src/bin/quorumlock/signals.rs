//! The signals `run` handles, and where each came from: the terminal
//! (Ctrl-C, Ctrl-\, Ctrl-Z) sends to the whole foreground process group,
//! so a command in `quorumlock`'s own job got it already; `kill` sends to
//! `quorumlock` alone.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::Signal;
use tokio::signal::unix::{Signal as Stream, SignalKind, signal as watch};

use crate::{Failure, exit};

/// The signals handled, in the order of `LAST_CODE`.
const HANDLED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
    Signal::SIGCONT,
];

/// The `si_code` each handled signal last arrived with.
static LAST_CODE: [AtomicI32; 6] = [const { AtomicI32::new(0) }; 6];

/// A signal received.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub signal: Signal,
    /// Sent by the terminal to its whole foreground group.
    pub from_terminal: bool,
}

/// The handled signals' streams, in the order of `HANDLED`; installed
/// once, they stay ours (the default actions no longer apply).
pub struct Signals {
    streams: Vec<Stream>,
}

impl Signals {
    pub fn install() -> Result<Self, Failure> {
        let mut streams = Vec::with_capacity(HANDLED.len());
        for (i, sig) in HANDLED.into_iter().enumerate() {
            let cannot =
                |e: std::io::Error| Failure::new(exit::ERROR, format!("cannot watch {sig}: {e}"));
            // SAFETY: the action only stores a number (async-signal-safe).
            unsafe {
                signal_hook_registry::register_sigaction(sig as i32, move |info| {
                    LAST_CODE[i].store(info.si_code, Ordering::Relaxed);
                })
            }
            .map_err(cannot)?;
            streams.push(watch(SignalKind::from_raw(sig as i32)).map_err(cannot)?);
        }
        Ok(Self { streams })
    }

    /// The next signal received. Cancel-safe (one that arrives meanwhile
    /// is kept for the next call).
    pub async fn next(&mut self) -> Arrival {
        let i = std::future::poll_fn(|cx| {
            self.streams
                .iter_mut()
                .position(|stream| stream.poll_recv(cx).is_ready())
                .map_or(std::task::Poll::Pending, std::task::Poll::Ready)
        })
        .await;
        Arrival {
            signal: HANDLED[i],
            from_terminal: LAST_CODE[i].load(Ordering::Relaxed) == libc::SI_KERNEL,
        }
    }
}

/// The exit code of a process ended by `sig`, as a shell reports it.
pub fn killed_by(sig: Signal) -> u8 {
    u8::try_from(128 + sig as i32).unwrap_or(exit::ERROR)
}

/// Ends this process by `sig` (its default action), so that a calling
/// shell sees the command's death by a signal rather than an exit code:
/// a script stops on Ctrl-C as it does under `flock`.
pub fn die_by(sig: Signal) {
    // SAFETY: restoring the default action installs no handler.
    let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
    let _ = nix::sys::signal::raise(sig);
}
