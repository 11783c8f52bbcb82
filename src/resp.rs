//! RESP2 replies, read from a byte buffer: the parser of the hot-path wire
//! (`hot_wire.rs`). Pure, so it is checked against a reference RESP
//! implementation without a server (`tests/resp_parser.rs`).
//!
//! The replies lock requests get (`+OK`, `:n`, `$-1`, a short bulk string,
//! a two-element array) are read in one pass, and the common ones without
//! allocating: `+OK`, integers and nil are values without a heap part.

use redis::Value;

/// Deepest nesting of arrays accepted: the scripts answer at most two
/// levels; a reply nested deeper is no reply of ours, and a bound keeps a
/// hostile stream from exhausting the stack.
const MAX_DEPTH: usize = 8;

/// Longest bulk string accepted (Redis' own `proto-max-bulk-len` default).
const MAX_BULK: usize = 512 * 1024 * 1024;

/// Bytes that are no RESP2 reply: the connection cannot be read further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a RESP2 reply: {}", self.0)
    }
}

/// The first whole reply in `bytes` and how many bytes it took; `None`
/// when `bytes` holds only its beginning (read more, then call again).
pub fn parse(bytes: &[u8]) -> Result<Option<(Value, usize)>, ProtocolError> {
    parse_at(bytes, 0, 0)
}

fn parse_at(
    bytes: &[u8],
    start: usize,
    depth: usize,
) -> Result<Option<(Value, usize)>, ProtocolError> {
    let Some(&kind) = bytes.get(start) else {
        return Ok(None);
    };
    let Some(line_end) = line_end(bytes, start + 1)? else {
        return Ok(None);
    };
    let line = &bytes[start + 1..line_end];
    let next = line_end + 2;
    match kind {
        b'+' if line == b"OK" => Ok(Some((Value::Okay, next))),
        b'+' => Ok(Some((Value::SimpleString(text(line)?.to_owned()), next))),
        b'-' => Ok(Some((error_value(&bytes[start..next])?, next))),
        b':' => Ok(Some((Value::Int(integer(line)?), next))),
        b'$' => match integer(line)? {
            -1 => Ok(Some((Value::Nil, next))),
            length => {
                let length = usize::try_from(length)
                    .ok()
                    .filter(|&l| l <= MAX_BULK)
                    .ok_or_else(|| ProtocolError(format!("bulk length {length}")))?;
                let end = next + length;
                if bytes.len() < end + 2 {
                    return Ok(None);
                }
                if &bytes[end..end + 2] != b"\r\n" {
                    return Err(ProtocolError("a bulk string not ended by CRLF".into()));
                }
                Ok(Some((
                    Value::BulkString(bytes[next..end].to_vec()),
                    end + 2,
                )))
            }
        },
        b'*' => match integer(line)? {
            -1 => Ok(Some((Value::Nil, next))),
            count => {
                let count = usize::try_from(count)
                    .map_err(|_| ProtocolError(format!("array length {count}")))?;
                if depth >= MAX_DEPTH {
                    return Err(ProtocolError(format!(
                        "arrays nested over {MAX_DEPTH} deep"
                    )));
                }
                // Each element takes at least 3 bytes: never reserve for
                // more than the buffer could hold.
                let mut items = Vec::with_capacity(count.min((bytes.len() - next) / 3));
                let mut at = next;
                for _ in 0..count {
                    let Some((item, after)) = parse_at(bytes, at, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    at = after;
                }
                Ok(Some((Value::Array(items), at)))
            }
        },
        other => Err(ProtocolError(format!(
            "unknown reply type byte {:?}",
            char::from(other)
        ))),
    }
}

/// Longest line accepted (a status, an error, a length): the replies to
/// lock requests have short ones; a stream without line ends is refused
/// rather than buffered and scanned again on every read.
const MAX_LINE: usize = 64 * 1024;

/// Where the line that starts at `from` ends (its `\r`), if it has ended.
fn line_end(bytes: &[u8], from: usize) -> Result<Option<usize>, ProtocolError> {
    let rest = bytes.get(from..).unwrap_or_default();
    match rest.iter().position(|&b| b == b'\r' || b == b'\n') {
        Some(at) if rest[at] == b'\n' => Err(ProtocolError("a LF without its CR".into())),
        Some(at) => match rest.get(at + 1) {
            Some(b'\n') => Ok(Some(from + at)),
            Some(_) => Err(ProtocolError("a CR not followed by LF".into())),
            None => Ok(None),
        },
        None if rest.len() > MAX_LINE => Err(ProtocolError(format!(
            "a line longer than {MAX_LINE} bytes"
        ))),
        None => Ok(None),
    }
}

fn text(line: &[u8]) -> Result<&str, ProtocolError> {
    std::str::from_utf8(line).map_err(|_| ProtocolError("a status line that is not UTF-8".into()))
}

/// A decimal integer: an optional `-`, then digits only (Rust's own
/// parser would also take a `+`, which no server sends).
fn integer(line: &[u8]) -> Result<i64, ProtocolError> {
    let digits = line.strip_prefix(b"-").unwrap_or(line);
    let not_integer = || {
        ProtocolError(format!(
            "{:?} is not an integer",
            String::from_utf8_lossy(line)
        ))
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(not_integer());
    }
    text(line)?.parse().map_err(|_| not_integer())
}

/// An error reply, as redis-rs represents it (its code and detail are read
/// the same way as on its own connections). Rare, so built by redis-rs'
/// own parser.
fn error_value(line: &[u8]) -> Result<Value, ProtocolError> {
    text(&line[1..line.len() - 2])?;
    redis::parse_redis_value(line).map_err(|e| ProtocolError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_whole_or_not_at_all() {
        assert_eq!(parse(b"+OK\r\n"), Ok(Some((Value::Okay, 5))));
        assert_eq!(parse(b":1\r\n:0\r\n"), Ok(Some((Value::Int(1), 4))));
        assert_eq!(parse(b"$-1\r\n"), Ok(Some((Value::Nil, 5))));
        assert_eq!(
            parse(b"$3\r\nabc\r\n"),
            Ok(Some((Value::BulkString(b"abc".to_vec()), 9)))
        );
        assert_eq!(
            parse(b"*2\r\n:5\r\n:1\r\n"),
            Ok(Some((Value::Array(vec![Value::Int(5), Value::Int(1)]), 12)))
        );
        for partial in [
            &b"$3\r\nab"[..],
            b":1",
            b":1\r",
            b"*2\r\n:5\r\n",
            b"",
            b"+O",
        ] {
            assert_eq!(parse(partial), Ok(None), "{partial:?}");
        }
    }

    #[test]
    fn error_replies_keep_their_code() {
        let (value, used) = parse(b"-NOSCRIPT No matching script\r\n")
            .expect("valid")
            .expect("whole");
        assert_eq!(used, 30);
        let error = value.extract_error().expect_err("an error reply");
        assert_eq!(error.code(), Some("NOSCRIPT"));
    }

    #[test]
    fn what_is_not_resp2_is_an_error() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b":+5\r\n",
            b"+a\nb\r\n",
            b"$\r\n",
            b"$3\r\nabcd\r\n",
            b"$-7\r\n",
            b"*-3\r\n",
            b":1\rx",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
