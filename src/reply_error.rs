//! What a Redis error reply says about a node: an ACL refusal, named by
//! what it denied; a fencing counter our scripts cannot use; or another
//! error, as Redis put it.

use redis::RedisError;

use crate::error::NodeErrorKind;

/// The error code our scripts use for a fencing counter they cannot use.
const BAD_COUNTER_CODE: &str = "QLCOUNTER";

/// Errors after which the connection cannot be trusted any more.
pub(crate) fn is_connection_failure(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error()
}

/// What an error says when the node refused us for our credentials, said
/// first: a missing password (`NOAUTH`) must not read as a quarantine or a
/// script failure.
pub(crate) fn authentication_failure(err: &RedisError) -> Option<String> {
    match err.code() {
        Some("NOAUTH") => Some(
            "authentication required: the node asks for a password (requirepass or an ACL \
             user) and the URL gives none; write it as redis://user:password@host:port"
                .to_owned(),
        ),
        Some("WRONGPASS") => Some(
            "authentication failed: the node refused the URL's user name or password \
             (WRONGPASS); check both"
                .to_owned(),
        ),
        _ if err.kind() == redis::ErrorKind::AuthenticationFailed => {
            Some(format!("authentication failed: {err}"))
        }
        _ => None,
    }
}

/// What a node's error reply `err` means for a request.
pub(crate) fn redis_error_kind(err: &RedisError) -> NodeErrorKind {
    if let Some(refused) = authentication_failure(err) {
        return NodeErrorKind::Connect(refused);
    }
    match (err.code(), err.detail()) {
        (Some(BAD_COUNTER_CODE), Some(detail)) => NodeErrorKind::InvalidCounter(detail.to_owned()),
        (Some("NOSCRIPT"), _) => NodeErrorKind::ScriptsMissing,
        (Some(code @ ("MOVED" | "ASK")), detail) => {
            NodeErrorKind::Redirected(format!("{code} {}", detail.unwrap_or_default()))
        }
        (code, detail) => match denied_by_acl(code, detail.unwrap_or_default()) {
            Some(denied) => NodeErrorKind::PermissionDenied(denied),
            None => NodeErrorKind::Redis(err.to_string()),
        },
    }
}

/// What an ACL refusal denied, from the server's error: `NOPERM` names the
/// command, or says keys or channels; a command inside a script comes back
/// as an `ERR` that names nothing.
fn denied_by_acl(code: Option<&str>, detail: &str) -> Option<String> {
    // Redis 7.0 says "the user executing the script can't …" for a script;
    // 7.2 and later, "ACL failure in script: User … has no permissions to
    // run the 'x' command".
    let in_script = detail.contains("ACL failure in script")
        || detail.contains("user executing the script can't");
    match code {
        Some("NOPERM") => Some(denied_thing(detail).unwrap_or_else(|| detail.to_owned())),
        Some("ERR") if in_script => Some(
            denied_thing(detail)
                .unwrap_or_else(|| "a command inside a quorumlock script".to_owned()),
        ),
        _ => None,
    }
}

/// The command, keys or channel an ACL message names.
fn denied_thing(detail: &str) -> Option<String> {
    if let Some((_, rest)) = detail.split_once("to run the '")
        && let Some((command, _)) = rest.split_once('\'')
    {
        return Some(format!("the `{command}` command"));
    }
    if detail.contains("key") {
        Some("these keys".to_owned())
    } else if detail.contains("channel") {
        Some("this channel".to_owned())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_refusals_name_what_was_denied() {
        let table = [
            (
                Some("NOPERM"),
                "this user has no permissions to run the 'evalsha' command",
                Some("the `evalsha` command"),
            ),
            (
                Some("NOPERM"),
                "this user has no permissions to access one of the keys used as arguments",
                Some("these keys"),
            ),
            (
                Some("NOPERM"),
                "this user has no permissions to access one of the channels used as arguments",
                Some("this channel"),
            ),
            (
                Some("ERR"),
                "The user executing the script can't run this command or subcommand script: x",
                Some("a command inside a quorumlock script"),
            ),
            (
                Some("ERR"),
                "ACL failure in script: User o'brien has no permissions to run the 'zadd' command",
                Some("the `zadd` command"),
            ),
            (
                Some("ERR"),
                "The user executing the script can't access at least one of the keys mentioned",
                Some("these keys"),
            ),
            (
                Some("ERR"),
                "The user executing the script can't publish to the channel mentioned",
                Some("this channel"),
            ),
            (Some("ERR"), "unknown command 'foo'", None),
            (None, "", None),
        ];
        for (code, detail, expected) in table {
            assert_eq!(
                denied_by_acl(code, detail).as_deref(),
                expected,
                "{code:?} {detail}"
            );
        }
    }
}
