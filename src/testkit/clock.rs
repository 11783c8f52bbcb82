//! Nodes with a bad clock: a small `LD_PRELOAD` shim (`clock_shim.c`,
//! built with `cc` on first use) makes a `redis-server`'s wall clock run
//! at another rate or jump, steered through a control file per node.
//! libfaketime cannot do this for Debian's jemalloc-linked server (it
//! recurses in `clock_gettime` while the allocator starts).

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, Result};

/// The shim's source, compiled into a shared object on first use.
const SHIM_SOURCE: &str = include_str!("clock_shim.c");

/// What to tell someone whose machine has no C compiler.
pub const MISSING_CC: &str = "a C compiler (`cc`) is needed to build the testkit's clock shim \
     for nodes with fake clocks (Debian/Ubuntu: `sudo apt-get install -y gcc`)";

/// The environment variable through which the shim finds its control file.
pub(crate) const CONTROL_ENV: &str = "QUORUMLOCK_CLOCK_FILE";

/// The shim's shared object, built once per process.
pub(crate) fn shim() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_shim().map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Testkit)
}

fn build_shim() -> Result<PathBuf> {
    // Keyed by the source, so a changed shim is rebuilt; shared by all
    // test processes of this user.
    let digest = SHIM_SOURCE
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    let dir = private_dir()?.join(format!("clock-shim-{digest:016x}"));
    let library = dir.join("libquorumlock_clock.so");
    if library.exists() {
        return Ok(library);
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::Testkit(format!("cannot create {}: {e}", dir.display())))?;
    let source = dir.join(format!("clock_shim.{}.c", std::process::id()));
    std::fs::write(&source, SHIM_SOURCE)
        .map_err(|e| Error::Testkit(format!("cannot write {}: {e}", source.display())))?;
    // Built under a name of our own, then renamed: concurrent test
    // processes never load a half-written library.
    let partial = dir.join(format!("libquorumlock_clock.{}.so", std::process::id()));
    let output = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&partial)
        .arg(&source)
        .arg("-lpthread")
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::Testkit(MISSING_CC.to_owned())
            } else {
                Error::Testkit(format!("cannot run cc: {e}"))
            }
        })?;
    let _ = std::fs::remove_file(&source);
    if !output.status.success() {
        return Err(Error::Testkit(format!(
            "cc could not build the clock shim: {}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    std::fs::rename(&partial, &library)
        .map_err(|e| Error::Testkit(format!("cannot place the clock shim: {e}")))?;
    Ok(library)
}

/// A directory only this user can write to (the library built there gets
/// preloaded into servers, so no one else may plant one).
fn private_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let uid = nix::unistd::getuid().as_raw();
    let dir = std::env::temp_dir().join(format!("quorumlock-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| Error::Testkit(format!("cannot create {}: {e}", dir.display())))?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(Error::Testkit(format!(
            "{} is not a directory private to this user; remove it",
            dir.display()
        )));
    }
    Ok(dir)
}

/// One node's clock control file: its rate against real time and the sum
/// of the steps it was given.
#[derive(Debug)]
pub(crate) struct ClockControl {
    path: PathBuf,
    seq: u64,
    rate: f64,
    step_ns: i64,
}

impl ClockControl {
    /// Creates the control file in `dir` (a normal clock).
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Testkit(format!("cannot create {}: {e}", dir.display())))?;
        let mut control = Self {
            path: dir.join("clock.ctl"),
            seq: 0,
            rate: 1.0,
            step_ns: 0,
        };
        control.write()?;
        Ok(control)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// From now on the node's clock runs at `rate` × real time.
    pub(crate) fn set_rate(&mut self, rate: f64) -> Result<()> {
        if !(0.0..=1000.0).contains(&rate) {
            return Err(Error::Testkit(format!(
                "clock rate {rate} must be in [0, 1000]"
            )));
        }
        self.rate = rate;
        self.write()
    }

    /// Moves the node's clock by `by` now (forward when `forward`).
    pub(crate) fn step(&mut self, by: Duration, forward: bool) -> Result<()> {
        let too_large = || Error::Testkit(format!("clock step {by:?} is too large"));
        let ns = i64::try_from(by.as_nanos()).map_err(|_| too_large())?;
        self.step_ns = if forward {
            self.step_ns.checked_add(ns)
        } else {
            self.step_ns.checked_sub(ns)
        }
        .ok_or_else(too_large)?;
        self.write()
    }

    /// Rewrites the file in place (never truncated: the server maps it):
    /// `seq_a`, the settings, then `seq_b`, each its own write, so a reader
    /// that sees the new `seq_b` sees the new settings.
    fn write(&mut self) -> Result<()> {
        self.seq += 1;
        let mut settings = [0u8; 16];
        settings[..8].copy_from_slice(&self.rate.to_le_bytes());
        settings[8..].copy_from_slice(&self.step_ns.to_le_bytes());
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
            .map_err(|e| Error::Testkit(format!("cannot open {}: {e}", self.path.display())))?;
        let seq = self.seq.to_le_bytes();
        [(&seq[..], 0), (&settings[..], 8), (&seq[..], 24)]
            .into_iter()
            .try_for_each(|(bytes, offset)| file.write_all_at(bytes, offset))
            .map_err(|e| Error::Testkit(format!("cannot write {}: {e}", self.path.display())))
    }
}
