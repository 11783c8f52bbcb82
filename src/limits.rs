//! The bounds every duration setting and argument must keep, as pure
//! checks that return why a value is refused (the callers wrap it in the
//! typed error that names the setting or argument).

use std::time::Duration;

use crate::quorum;

/// Longest TTL accepted: one year. Longer locks are almost certainly a
/// unit mistake, and the bound keeps every deadline computable.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// A TTL is usable when an acquisition whose round trips (one, or two for
/// quorum fencing) each end at the last moment of `node_timeout` still
/// leaves more than `min_validity` after drift. `acquire_time` is those
/// round trips' total bound.
pub(crate) fn check_ttl(
    ttl: Duration,
    acquire_time: Duration,
    drift_factor: f64,
    min_validity: Duration,
) -> Result<(), String> {
    if ttl.is_zero() {
        return Err("must be greater than zero; the default is 10 s".into());
    }
    if ttl > MAX_TTL {
        return Err(format!(
            "{ttl:?} is longer than the maximum of {MAX_TTL:?}; use a shorter TTL and extend it"
        ));
    }
    if ttl < Duration::from_millis(1) {
        return Err(format!("{ttl:?} is below Redis' 1 ms expiry resolution"));
    }
    if acquire_time >= ttl {
        return Err(format!(
            "{ttl:?} is not longer than the acquisition's round trips ({acquire_time:?} of \
             node_timeout); the TTL must be much longer than the nodes' reply time"
        ));
    }
    let drift = quorum::drift(ttl, drift_factor);
    let floor = acquire_time + drift + min_validity;
    if ttl <= floor {
        return Err(format!(
            "{ttl:?} leaves no validity after the acquisition's round trips ({acquire_time:?} \
             of node_timeout; quorum fencing takes 2 round trips), drift ({drift:?}) and \
             min_validity ({min_validity:?}); use a TTL above {floor:?}"
        ));
    }
    Ok(())
}

/// Checks a wait (a setting or an argument): at most [`MAX_TTL`], so that
/// every deadline is computable; zero means a single attempt.
pub(crate) fn check_wait(wait: Duration) -> Result<(), String> {
    if wait > MAX_TTL {
        return Err(format!(
            "{wait:?} is longer than a year; waits that long are almost certainly a unit mistake"
        ));
    }
    Ok(())
}

/// An interval is usable when an extension started at its end, taking the
/// full `node_timeout`, still lands before the lock's validity ends.
pub(crate) fn check_interval(
    every: Duration,
    ttl: Duration,
    node_timeout: Duration,
    drift_factor: f64,
) -> Result<(), String> {
    if every.is_zero() {
        return Err("must be greater than zero; the default is TTL/3".into());
    }
    let validity = quorum::validity(ttl, node_timeout, quorum::drift(ttl, drift_factor));
    if every + node_timeout >= validity {
        return Err(format!(
            "{every:?} is too long for a {ttl:?} TTL: an extension due then could not finish \
             within the lock's validity ({validity:?} after node_timeout and drift); use at most \
             a third of the TTL"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn intervals_must_leave_room_for_an_extension() {
        assert!(check_interval(ms(3_333), ms(10_000), ms(50), 0.01).is_ok());
        assert!(check_interval(ms(0), ms(10_000), ms(50), 0.01).is_err());
        // 10 s TTL: validity after 50 ms timeout and 102 ms drift is 9 848 ms.
        assert!(check_interval(ms(9_797), ms(10_000), ms(50), 0.01).is_ok());
        assert!(check_interval(ms(9_798), ms(10_000), ms(50), 0.01).is_err());
    }
}
