//! The hot-path wire's RESP2 parser (`src/resp.rs`) against a reference
//! implementation, `redis-protocol`: on every reply it accepts, it must
//! read the same value and take the same number of bytes; on a reply cut
//! short it must wait for more; on bytes the reference refuses it must
//! not produce a reply.

use proptest::prelude::*;
use quorumlock::internals::resp;
use redis::Value;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

/// A reply as a server may send it.
#[derive(Debug, Clone)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    NilArray,
    Array(Vec<Reply>),
}

fn encode(reply: &Reply, out: &mut Vec<u8>) {
    match reply {
        Reply::Status(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
        Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        Reply::Bulk(bytes) => {
            out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
            out.extend_from_slice(bytes);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
        Reply::NilArray => out.extend_from_slice(b"*-1\r\n"),
        Reply::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for item in items {
                encode(item, out);
            }
        }
    }
}

/// A line without CR or LF.
fn line() -> impl Strategy<Value = String> {
    "[ -~]{0,24}"
}

fn reply() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        line().prop_map(Reply::Status),
        Just(Reply::Status("OK".into())),
        "[A-Z]{1,10}( [ -~]{0,20})?".prop_map(Reply::Error),
        any::<i64>().prop_map(Reply::Int),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Reply::Bulk),
        Just(Reply::Nil),
        Just(Reply::NilArray),
    ];
    // At most 4 levels: the parser refuses nesting deeper than 8.
    leaf.prop_recursive(4, 48, 6, |inner| {
        proptest::collection::vec(inner, 0..6).prop_map(Reply::Array)
    })
}

/// Whether our value and the reference's frame say the same.
fn same(ours: &Value, reference: &OwnedFrame) -> bool {
    match (ours, reference) {
        (Value::Okay, OwnedFrame::SimpleString(s)) => s == b"OK",
        (Value::SimpleString(a), OwnedFrame::SimpleString(b)) => a.as_bytes() == b.as_slice(),
        (Value::ServerError(error), OwnedFrame::Error(line)) => {
            let rebuilt = match error.details() {
                Some(details) => format!("{} {details}", error.code()),
                None => error.code().to_owned(),
            };
            rebuilt == *line
        }
        (Value::Int(a), OwnedFrame::Integer(b)) => a == b,
        (Value::BulkString(a), OwnedFrame::BulkString(b)) => a == b,
        (Value::Nil, OwnedFrame::Null) => true,
        (Value::Array(a), OwnedFrame::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// A whole reply reads as the reference reads it, using every byte;
    /// every prefix of it waits for more.
    #[test]
    fn whole_replies_read_as_the_reference_reads_them(reply in reply()) {
        let mut bytes = Vec::new();
        encode(&reply, &mut bytes);
        let (reference, reference_used) = decode(&bytes)
            .expect("the reference reads it")
            .expect("whole");
        let (ours, used) = resp::parse(&bytes).expect("valid").expect("whole");
        prop_assert_eq!(used, reference_used);
        prop_assert_eq!(used, bytes.len());
        prop_assert!(same(&ours, &reference), "ours {:?}, reference {:?}", ours, reference);
        for cut in 0..bytes.len() {
            prop_assert_eq!(resp::parse(&bytes[..cut]), Ok(None), "cut at {}", cut);
        }
    }

    /// Replies back to back read one at a time, each as long as it is.
    #[test]
    fn pipelined_replies_read_one_at_a_time(replies in proptest::collection::vec(reply(), 1..6)) {
        let mut bytes = Vec::new();
        for reply in &replies {
            encode(reply, &mut bytes);
        }
        let mut at = 0;
        for _ in &replies {
            let (ours, used) = resp::parse(&bytes[at..]).expect("valid").expect("whole");
            let (reference, reference_used) =
                decode(&bytes[at..]).expect("valid").expect("whole");
            prop_assert_eq!(used, reference_used);
            prop_assert!(same(&ours, &reference), "ours {:?}, reference {:?}", ours, reference);
            at += used;
        }
        prop_assert_eq!(at, bytes.len());
    }

    /// Bytes from anywhere: what we read as a reply, the reference reads
    /// alike; what the reference refuses, we never read as a reply.
    #[test]
    fn arbitrary_bytes_never_make_a_reply_the_reference_refuses(
        prefix in prop_oneof![Just(b'+'), Just(b'-'), Just(b':'), Just(b'$'), Just(b'*'), any::<u8>()],
        rest in proptest::collection::vec(
            prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'1'), Just(b'-'), Just(b'$'), Just(b'*'), Just(b':'), any::<u8>()],
            0..40,
        ),
    ) {
        let mut bytes = vec![prefix];
        bytes.extend(rest);
        let reference = decode(&bytes);
        // Waiting for more, or refusing, is always allowed.
        if let Ok(Some((ours, used))) = resp::parse(&bytes) {
            let (frame, reference_used) = reference
                .map_err(|e| TestCaseError::fail(format!("we read {ours:?}, the reference refused: {e:?}")))?
                .ok_or_else(|| TestCaseError::fail(format!("we read {ours:?}, the reference wants more")))?;
            prop_assert_eq!(used, reference_used);
            prop_assert!(same(&ours, &frame), "ours {:?}, reference {:?}", ours, frame);
        }
    }
}
