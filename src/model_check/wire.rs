//! What a client of the model sends for each operation, and how it reads
//! the reply: the keys and arguments `ops.rs` puts on the wire (the test
//! below checks them against `ops::prepare`), and `ops::interpret` itself.

use crate::guard::judge::{DATA_SET_KEY, DATA_SET_SEQ_KEY};
use crate::keys::{Access, Keys, ResourceKeys};
use crate::ops::{self, Answer, Counting, Op};
use crate::scripts::SENT;

use super::redis::{Invocation, Reply};

/// The scripts by their place in `scripts::SOURCES` and [`SENT`] (what
/// goes to the nodes: the sources without their comments).
const RELEASE: usize = 0;
const EXTEND: usize = 1;
const ACQUIRE_COUNTED: usize = 2;
const ACQUIRE_READ_COUNTER: usize = 3;
const STORE_TOKEN: usize = 4;
const OBSERVE: usize = 7;

/// The script an acquire that is not a plain `SET NX` runs: the library's
/// own (`acquire.lua` as sent), or the frozen copy of a negative control.
pub(super) fn acquire_now() -> &'static str {
    sent(6)
}

/// Script `i` as the library sends it.
fn sent(i: usize) -> &'static str {
    &SENT[i]
}

/// `acquire.lua` as it was before the multi-resource waiter fix (a waiter
/// queued on every one of its resources), with the helpers every holders
/// script starts with: the negative control of the deadlock check.
pub(super) const ACQUIRE_BEFORE_FIX: &str = concat!(
    include_str!("../scripts/counter.lua"),
    include_str!("../scripts/queue.lua"),
    include_str!("../scripts/holders.lua"),
    include_str!("acquire_before_fix.lua")
);

fn counting_mode(counting: Counting) -> &'static str {
    match counting {
        Counting::Off => "set",
        Counting::Increment => "incr",
        Counting::Read => "read",
    }
}

fn access_arg(keys: &Keys) -> &'static str {
    match keys.access {
        Access::Exclusive => "x",
        Access::Shared => "r",
    }
}

/// The five keys of each resource, in order (see `holders.lua`).
fn holders_keys(keys: &Keys) -> Vec<String> {
    keys.resources
        .iter()
        .flat_map(|r: &ResourceKeys| {
            [
                r.lock(),
                r.fence(),
                r.waiters(),
                r.waiter_leases(),
                r.waiting_writers(),
            ]
        })
        .map(str::to_owned)
        .collect()
}

fn script(source: &'static str, keys: Vec<String>, argv: Vec<String>) -> Invocation {
    Invocation::Script { source, keys, argv }
}

/// What `op` on the lock `keys` held under `value` sends, with `acquire`
/// as the source of `acquire.lua`.
pub(super) fn invocation(op: Op, keys: &Keys, value: &str, acquire: &'static str) -> Invocation {
    if let Some(one) = keys.simple() {
        let lock_and_fence = vec![one.lock().to_owned(), one.fence().to_owned()];
        match op {
            Op::Acquire { ttl_ms } => {
                return Invocation::Command(
                    ["SET", one.lock(), value, "NX", "PX", &ttl_ms.to_string()]
                        .map(str::to_owned)
                        .to_vec(),
                );
            }
            Op::AcquireCounted { ttl_ms } => {
                return script(
                    sent(ACQUIRE_COUNTED),
                    lock_and_fence,
                    vec![value.to_owned(), ttl_ms.to_string()],
                );
            }
            Op::AcquireReadCounter { ttl_ms } => {
                return script(
                    sent(ACQUIRE_READ_COUNTER),
                    lock_and_fence,
                    vec![value.to_owned(), ttl_ms.to_string()],
                );
            }
            _ => {}
        }
    }
    let access = access_arg(keys).to_owned();
    let mut argv = vec![value.to_owned()];
    let channels = || keys.resources.iter().map(|r| r.channel().to_owned());
    let acquire_args = |argv: &mut Vec<String>, ttl_ms: u64, counting: Counting| {
        argv.extend([
            ttl_ms.to_string(),
            access.clone(),
            counting_mode(counting).to_owned(),
        ]);
    };
    let source = match op {
        Op::Acquire { ttl_ms }
        | Op::AcquireCounted { ttl_ms }
        | Op::AcquireReadCounter { ttl_ms } => {
            let counting = match op {
                Op::Acquire { .. } => Counting::Off,
                Op::AcquireCounted { .. } => Counting::Increment,
                _ => Counting::Read,
            };
            acquire_args(&mut argv, ttl_ms, counting);
            argv.push(String::new());
            acquire
        }
        Op::AcquireQueued {
            ttl_ms,
            counting,
            ticket,
            waiter,
            lease_ms,
        } => {
            acquire_args(&mut argv, ttl_ms, counting);
            argv.extend([ticket.to_string(), waiter.to_string(), lease_ms.to_string()]);
            if keys.resources.len() > 1 {
                argv.extend(channels());
            }
            acquire
        }
        Op::StoreToken { token } => {
            argv.push(token.to_string());
            sent(STORE_TOKEN)
        }
        Op::Extend { ttl_ms, repair } => {
            argv.extend([
                ttl_ms.to_string(),
                u64::from(repair).to_string(),
                access.clone(),
            ]);
            sent(EXTEND)
        }
        Op::Release { waiter, .. } => {
            argv.push(access.clone());
            argv.push(waiter.map_or(String::new(), |w| w.to_string()));
            argv.extend(channels());
            sent(RELEASE)
        }
    };
    script(source, holders_keys(keys), argv)
}

/// The node guard's observation (`observe.lua`), writing `mark_id` into a
/// mark it finds missing.
pub(super) fn observation(mark_id: &str) -> Invocation {
    script(
        sent(OBSERVE),
        vec![DATA_SET_KEY.to_owned(), DATA_SET_SEQ_KEY.to_owned()],
        vec![mark_id.to_owned()],
    )
}

/// How the library reads `reply` to `op` (`ops::interpret`); an error
/// reply is an error too.
pub(super) fn answer(op: Op, reply: &Reply) -> Result<Answer, String> {
    let value = reply.to_value()?;
    ops::interpret(op, value).map_err(|kind| format!("{kind:?}"))
}

#[cfg(test)]
mod tests {
    use redis::{Arg, Script};

    use super::*;
    use crate::ops::{Prepared, prepare};

    /// What `ops::prepare` puts on the wire, as text.
    fn wire(op: Op, keys: &Keys, value: &str) -> Vec<String> {
        let cmd = match prepare(op, keys, value, false, None) {
            Prepared::One(cmd) | Prepared::Release(cmd) => cmd,
            Prepared::Guarded { .. } => panic!("neither timed nor observed"),
        };
        cmd.args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    /// What the model sends, as the same text.
    fn ours(op: Op, keys: &Keys, value: &str) -> Vec<String> {
        match invocation(op, keys, value, acquire_now()) {
            Invocation::Command(args) => args,
            Invocation::Script { source, keys, argv } => {
                let mut out = vec![
                    "EVALSHA".to_owned(),
                    Script::new(source).get_hash().to_owned(),
                    keys.len().to_string(),
                ];
                out.extend(keys);
                out.extend(argv);
                out
            }
        }
    }

    #[test]
    fn the_model_sends_what_the_library_sends() {
        let locks = [
            Keys::exclusive("a").expect("valid"),
            Keys::shared("a").expect("valid"),
            Keys::exclusive_many(&["b", "a"]).expect("valid"),
        ];
        let ops = [
            Op::Acquire { ttl_ms: 3000 },
            Op::AcquireCounted { ttl_ms: 3000 },
            Op::AcquireReadCounter { ttl_ms: 3000 },
            Op::AcquireQueued {
                ttl_ms: 3000,
                counting: Counting::Increment,
                ticket: 1_700_000_000_000_001,
                waiter: 101,
                lease_ms: 3000,
            },
            Op::AcquireQueued {
                ttl_ms: 3000,
                counting: Counting::Off,
                ticket: 17,
                waiter: 9,
                lease_ms: 2000,
            },
            Op::StoreToken { token: 12 },
            Op::Extend {
                ttl_ms: 3000,
                repair: true,
            },
            Op::Extend {
                ttl_ms: 2000,
                repair: false,
            },
            Op::Release {
                waiter: None,
                keep_ms: None,
            },
            Op::Release {
                waiter: Some(101),
                keep_ms: None,
            },
        ];
        for keys in &locks {
            for op in ops {
                assert_eq!(
                    ours(op, keys, "v1"),
                    wire(op, keys, "v1"),
                    "{op:?} on {}",
                    keys.label()
                );
            }
        }
    }
}
