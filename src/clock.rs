//! Deadlines that count the time the host spent suspended.
//!
//! tokio's `Instant` is `CLOCK_MONOTONIC`, which stops while the host or
//! VM is suspended; the nodes' clocks do not, so a lock's keys can expire
//! during a suspend that its holder never saw. A [`Deadline`] remembers its
//! moment on `CLOCK_BOOTTIME` too (Linux: it counts suspend), and ends at
//! whichever clock reaches it first. Elsewhere, and if the boot clock
//! cannot be read, it is a monotonic deadline only.

use std::time::Duration;

use tokio::time::Instant;

/// A moment a lock's validity ends, on both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    at: Instant,
    /// The same moment on the boot clock.
    boot_at: Option<Duration>,
}

impl Deadline {
    /// `at` (monotonic), placed on the boot clock as read now.
    pub(crate) fn new(at: Instant) -> Self {
        let now = Instant::now();
        let boot_at = boot_now().and_then(|boot| {
            if at >= now {
                boot.checked_add(at - now)
            } else {
                boot.checked_sub(now - at)
            }
        });
        Self { at, boot_at }
    }

    /// The deadline as a monotonic instant: earlier than the one it was
    /// made from by however long the host was suspended since.
    pub(crate) fn instant(&self) -> Instant {
        match (self.boot_at, boot_now()) {
            (Some(boot_at), Some(boot)) => {
                let left = boot_at.saturating_sub(boot);
                self.at.min(Instant::now() + left)
            }
            _ => self.at,
        }
    }

    /// The earlier of the two.
    pub(crate) fn min(self, other: Self) -> Self {
        if other.instant() < self.instant() {
            other
        } else {
            self
        }
    }
}

/// The boot clock now (`CLOCK_BOOTTIME`), plus a simulated suspend in
/// tests ([`testkit::simulate_suspend`](crate::testkit::simulate_suspend)).
#[cfg(target_os = "linux")]
fn boot_now() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0 {
        return None;
    }
    let boot = Duration::new(
        u64::try_from(now.tv_sec).ok()?,
        u32::try_from(now.tv_nsec).ok()?,
    );
    Some(boot + simulated::suspended())
}

#[cfg(not(target_os = "linux"))]
fn boot_now() -> Option<Duration> {
    None
}

/// A suspend the tests pretend happened: the boot clock moves on, the
/// monotonic one does not. Zero outside the testkit.
pub(crate) mod simulated {
    use std::time::Duration;

    #[cfg(feature = "testkit")]
    static SUSPENDED_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    pub(crate) fn suspended() -> Duration {
        #[cfg(feature = "testkit")]
        {
            Duration::from_nanos(SUSPENDED_NS.load(std::sync::atomic::Ordering::Relaxed))
        }
        #[cfg(not(feature = "testkit"))]
        {
            Duration::ZERO
        }
    }

    #[cfg(feature = "testkit")]
    pub(crate) fn suspend(period: Duration) {
        let ns = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
        SUSPENDED_NS.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_its_instant_while_the_host_runs() {
        let at = Instant::now() + Duration::from_secs(5);
        let deadline = Deadline::new(at);
        // Both clocks moved alike: no earlier than the original, but for
        // the moments between reading one clock and the other.
        let seen = deadline.instant();
        assert!(
            seen <= at && at - seen < Duration::from_millis(100),
            "{:?} earlier",
            at - seen
        );
        let past = Deadline::new(Instant::now() - Duration::from_secs(1));
        assert!(past.instant() <= Instant::now());
    }

    #[test]
    fn the_earlier_deadline_wins() {
        let now = Instant::now();
        let soon = Deadline::new(now + Duration::from_secs(1));
        let later = Deadline::new(now + Duration::from_secs(2));
        assert_eq!(soon.min(later), soon);
        assert_eq!(later.min(soon), soon);
    }
}
