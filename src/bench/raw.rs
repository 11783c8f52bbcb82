//! The quorum floor without a general-purpose client: the same rounds as
//! [`QuorumFloor`](super::QuorumFloor), over a minimal pipelined RESP
//! connection per node (plain TCP; a writer task, a reader task, one
//! oneshot per request, replies read without allocating). It measures how
//! much of the floor's cost per lock is the Redis client library rather
//! than the algorithm or the servers: what a specialised wire could save.
//! Benchmark only: no TLS, no AUTH, no reconnects. The benchmark runner
//! bounds every operation; dropping the client stops its connections'
//! tasks, which ends any round still draining.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::stream::FuturesUnordered;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;

use super::clients::{BoxedOp, LockClient, UNLOCK, until_quorum};

/// A reply the floor's commands get: `+OK`, `:n`, `$-1` (nil), an error,
/// or anything else (unread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    Ok,
    Int(i64),
    Nil,
    Error,
    Other,
}

/// What the requesters hand the writer, in one lock so that the order of
/// the bytes and of the waiting replies is the same.
#[derive(Default)]
struct Outgoing {
    bytes: Vec<u8>,
    waiting: VecDeque<oneshot::Sender<Reply>>,
}

struct Wire {
    outgoing: Mutex<Outgoing>,
    write_soon: Notify,
}

impl Wire {
    /// Connects, and starts the writer and reader tasks (returned, to be
    /// stopped when the client is dropped).
    async fn connect(address: &str) -> Result<(Arc<Self>, [AbortHandle; 2]), String> {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|e| format!("{address}: {e}"))?;
        stream
            .set_nodelay(super::nodelay())
            .map_err(|e| e.to_string())?;
        let (mut reader, mut writer) = stream.into_split();
        let wire = Arc::new(Self {
            outgoing: Mutex::new(Outgoing::default()),
            write_soon: Notify::new(),
        });
        let writing = Arc::clone(&wire);
        let writer_task = tokio::spawn(async move {
            let mut spare = Vec::new();
            loop {
                writing.write_soon.notified().await;
                loop {
                    std::mem::swap(
                        &mut writing.outgoing.lock().expect("lock").bytes,
                        &mut spare,
                    );
                    if spare.is_empty() {
                        break;
                    }
                    if writer.write_all(&spare).await.is_err() {
                        return;
                    }
                    spare.clear();
                }
            }
        });
        let reading = Arc::clone(&wire);
        let reader_task = tokio::spawn(async move {
            let mut buffer = Vec::with_capacity(16 * 1024);
            let mut chunk = vec![0; 16 * 1024];
            loop {
                let Ok(read) = reader.read(&mut chunk).await else {
                    return;
                };
                if read == 0 {
                    return;
                }
                buffer.extend_from_slice(&chunk[..read]);
                let mut start = 0;
                while let Some((reply, used)) = parse(&buffer[start..]) {
                    start += used;
                    let waiter = reading.outgoing.lock().expect("lock").waiting.pop_front();
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(reply);
                    }
                }
                buffer.drain(..start);
            }
        });
        Ok((
            wire,
            [writer_task.abort_handle(), reader_task.abort_handle()],
        ))
    }

    /// Queues `packed` (one command, encoded) and waits for its reply.
    async fn call(&self, packed: &[u8]) -> Reply {
        let (sender, receiver) = oneshot::channel();
        {
            let mut outgoing = self.outgoing.lock().expect("lock");
            outgoing.bytes.extend_from_slice(packed);
            outgoing.waiting.push_back(sender);
        }
        self.write_soon.notify_one();
        receiver.await.unwrap_or(Reply::Error)
    }
}

/// `command` (its arguments) as RESP.
fn encode(command: &[&[u8]]) -> Arc<[u8]> {
    use std::io::Write;
    let mut out = Vec::with_capacity(64 + command.iter().map(|a| a.len() + 16).sum::<usize>());
    let _ = write!(out, "*{}\r\n", command.len());
    for arg in command {
        let _ = write!(out, "${}\r\n", arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out.into()
}

/// One whole reply at the start of `bytes` and its length, if it is all
/// there. Handles the reply kinds the floor's commands get.
fn parse(bytes: &[u8]) -> Option<(Reply, usize)> {
    let line_end = bytes.windows(2).position(|w| w == b"\r\n")?;
    let line = &bytes[1..line_end];
    let after_line = line_end + 2;
    let number = || std::str::from_utf8(line).ok()?.parse::<i64>().ok();
    match bytes.first()? {
        b'+' if line == b"OK" => Some((Reply::Ok, after_line)),
        b'+' => Some((Reply::Other, after_line)),
        b'-' => Some((Reply::Error, after_line)),
        b':' => Some((Reply::Int(number()?), after_line)),
        b'$' => match number()? {
            -1 => Some((Reply::Nil, after_line)),
            length => {
                let end = after_line + length as usize + 2;
                (bytes.len() >= end).then_some((Reply::Other, end))
            }
        },
        _ => Some((Reply::Other, after_line)),
    }
}

/// [`QuorumFloor`](super::QuorumFloor)'s rounds over a minimal pipelined
/// RESP connection per node instead of redis-rs: what a specialised wire
/// could save. Benchmark only (plain TCP, no AUTH, no reconnects).
pub struct RawQuorumFloor {
    /// Row label.
    pub label: String,
    wires: Vec<Arc<Wire>>,
    unlock_sha: String,
    tasks: Vec<AbortHandle>,
}

impl Drop for RawQuorumFloor {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl RawQuorumFloor {
    /// Connects to every `redis://host:port` URL and loads the unlock
    /// script.
    pub async fn connect(label: impl Into<String>, urls: &[String]) -> Result<Self, String> {
        // Built first, so that a failure below stops what was started.
        let mut floor = Self {
            label: label.into(),
            wires: Vec::new(),
            unlock_sha: redis::Script::new(UNLOCK).get_hash().to_owned(),
            tasks: Vec::new(),
        };
        for url in urls {
            let address = url.trim_start_matches("redis://").trim_end_matches('/');
            let (wire, tasks) = Wire::connect(address).await?;
            floor.wires.push(wire);
            floor.tasks.extend(tasks);
        }
        let load = encode(&[b"SCRIPT", b"LOAD", UNLOCK.as_bytes()]);
        for wire in &floor.wires {
            if wire.call(&load).await == Reply::Error {
                return Err("SCRIPT LOAD failed".into());
            }
        }
        Ok(floor)
    }

    /// Sends `command` to every node; see [`until_quorum`].
    async fn quorum_round(&self, command: Arc<[u8]>, yes: fn(Reply) -> bool) -> Result<(), String> {
        let replies: FuturesUnordered<_> = self
            .wires
            .iter()
            .map(|wire| {
                let (wire, command) = (Arc::clone(wire), Arc::clone(&command));
                async move { wire.call(&command).await }
            })
            .collect();
        until_quorum(replies, yes).await
    }
}

impl LockClient for RawQuorumFloor {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn lock_release<'a>(&'a self, resource: &'a str) -> BoxedOp<'a> {
        Box::pin(async move {
            let value = fastrand::u64(..).to_string();
            let (resource, value) = (resource.as_bytes(), value.as_bytes());
            let set = encode(&[b"SET", resource, value, b"NX", b"PX", b"10000"]);
            self.quorum_round(set, |reply| reply == Reply::Ok).await?;
            let unlock = encode(&[
                b"EVALSHA",
                self.unlock_sha.as_bytes(),
                b"1",
                resource,
                value,
            ]);
            self.quorum_round(unlock, |reply| reply == Reply::Int(1))
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_whole_or_not_at_all() {
        assert_eq!(parse(b"+OK\r\n"), Some((Reply::Ok, 5)));
        assert_eq!(parse(b":1\r\n:0\r\n"), Some((Reply::Int(1), 4)));
        assert_eq!(parse(b"$-1\r\n"), Some((Reply::Nil, 5)));
        assert_eq!(parse(b"$3\r\nabc\r\n"), Some((Reply::Other, 9)));
        assert_eq!(parse(b"$3\r\nab"), None);
        assert_eq!(parse(b"-ERR x\r\n"), Some((Reply::Error, 8)));
        assert_eq!(parse(b":1"), None);
    }
}
