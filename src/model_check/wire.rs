//! What a client of the model sends for each operation, and how it reads
//! the reply: the keys and arguments `ops.rs` puts on the wire (the test
//! below checks them against `ops::prepare`), and `ops::interpret` itself.

use crate::guard::judge::{DATA_SET_KEY, DATA_SET_SEQ_KEY};
use crate::keys::{Access, Keys, ResourceKeys};
use crate::ops::{self, Answer, Counting, Op};
use crate::scripts::{SENT, SOURCES, without_comments};

use super::redis::{Invocation, Reply};

/// The scripts by their place in `scripts::SOURCES` and `scripts::SENT`
/// (what goes to the nodes: the sources without their comments).
const RELEASE: usize = 0;
const EXTEND: usize = 1;
const ACQUIRE_COUNTED: usize = 2;
const ACQUIRE_READ_COUNTER: usize = 3;
const STORE_TOKEN: usize = 4;
const FENCED_WRITE: usize = 5;
const FENCED_READ: usize = 8;
const ACQUIRE: usize = 6;
const OBSERVE: usize = 7;
const KEEP: usize = 9;

/// The scripts the model's nodes run: the library's as it sends them, or
/// copies with a defect planted (a mutant, see `mutants.rs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scripts {
    sent: [&'static str; 10],
}

/// One planted change: in every script whose source contains `find`,
/// every occurrence becomes `replace`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Patch {
    pub(super) find: &'static str,
    pub(super) replace: &'static str,
}

impl Scripts {
    /// The library's scripts, as sent.
    pub(super) fn library() -> Self {
        Self {
            sent: std::array::from_fn(|i| SENT[i].as_str()),
        }
    }

    /// The library's scripts with `patches` applied to their sources (then
    /// stripped of comments, as sent). Fails when a patch finds nothing: a
    /// mutant whose code moved must be written again, not pass unseen.
    pub(super) fn patched(patches: &[Patch]) -> Result<Self, String> {
        let mut sources: [String; 10] = SOURCES.map(str::to_owned);
        for patch in patches {
            let mut found = false;
            for source in &mut sources {
                if source.contains(patch.find) {
                    *source = source.replace(patch.find, patch.replace);
                    found = true;
                }
            }
            if !found {
                return Err(format!("no script contains {:?}", patch.find));
            }
        }
        // Leaked: a mutant's scripts live as long as the test process, as
        // the library's do (the Lua host caches functions by address).
        Ok(Self {
            sent: sources.map(|source| &*Box::leak(without_comments(&source).into_boxed_str())),
        })
    }

    /// These scripts with `acquire.lua` (and what it includes) replaced by
    /// `source`: a frozen copy of an earlier version.
    pub(super) fn with_acquire(self, source: &'static str) -> Self {
        let mut sent = self.sent;
        sent[ACQUIRE] = source;
        Self { sent }
    }

    /// These scripts on a node whose clock runs `seconds` ahead where it
    /// makes tokens (`now_us` in `counter.lua`): the counter node of
    /// a scenario with clocks apart. Its other clock reads (expiries,
    /// leases) keep the model's time: an offset moves them all alike.
    pub(super) fn with_clock_ahead(self, seconds: u8) -> Self {
        if seconds == 0 {
            return self;
        }
        // As sent: without indentation.
        const FIND: &str =
            "local function now_us()\nif clock_us == nil then\nlocal t = redis.call(\"TIME\")";
        let shifted = format!("{FIND}\nt[1] = tostring(tonumber(t[1]) + {seconds})");
        assert!(
            self.sent.iter().any(|source| source.contains(FIND)),
            "counter.lua no longer reads its clock as with_clock_ahead expects"
        );
        Self {
            sent: self.sent.map(|source| {
                if source.contains(FIND) {
                    &*Box::leak(source.replace(FIND, &shifted).into_boxed_str())
                } else {
                    source
                }
            }),
        }
    }

    fn get(&self, i: usize) -> &'static str {
        self.sent[i]
    }

    /// Where script `source` sits in `scripts::SENT` (for what ran).
    pub(super) fn index_of(&self, source: &str) -> Option<usize> {
        self.sent.iter().position(|s| std::ptr::eq(*s, source))
    }
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
        Counting::Peek => "peek",
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

/// What `op` on the lock `keys` held under `value` sends, running
/// `scripts`.
pub(super) fn invocation(op: Op, keys: &Keys, value: &str, scripts: &Scripts) -> Invocation {
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
            Op::AcquirePeek { ttl_ms } => {
                return Invocation::Commands(vec![
                    ["SET", one.lock(), value, "NX", "PX", &ttl_ms.to_string()]
                        .map(str::to_owned)
                        .to_vec(),
                    ["GET", one.fence()].map(str::to_owned).to_vec(),
                ]);
            }
            Op::AcquireCounted { ttl_ms } => {
                return script(
                    scripts.get(ACQUIRE_COUNTED),
                    lock_and_fence,
                    vec![value.to_owned(), ttl_ms.to_string()],
                );
            }
            Op::AcquireReadCounter { ttl_ms } => {
                return script(
                    scripts.get(ACQUIRE_READ_COUNTER),
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
        | Op::AcquirePeek { ttl_ms }
        | Op::AcquireReadCounter { ttl_ms } => {
            let counting = match op {
                Op::Acquire { .. } => Counting::Off,
                Op::AcquireCounted { .. } => Counting::Increment,
                Op::AcquirePeek { .. } => Counting::Peek,
                _ => Counting::Read,
            };
            acquire_args(&mut argv, ttl_ms, counting);
            argv.push(String::new());
            scripts.get(ACQUIRE)
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
            scripts.get(ACQUIRE)
        }
        Op::StoreToken { token } => {
            argv.extend([token.to_string(), access.clone()]);
            scripts.get(STORE_TOKEN)
        }
        Op::Extend { ttl_ms, repair } => {
            argv.extend([
                ttl_ms.to_string(),
                u64::from(repair).to_string(),
                access.clone(),
            ]);
            scripts.get(EXTEND)
        }
        // An `at_least` lock released early, or a winner leaving the
        // queues (no value): `keep.lua`.
        Op::Release {
            waiter,
            keep_ms: Some(keep_ms),
        } => {
            argv.push(waiter.map_or(String::new(), |w| w.to_string()));
            argv.push(keep_ms.to_string());
            scripts.get(KEEP)
        }
        Op::Release { waiter, .. } => {
            argv.push(access.clone());
            argv.push(waiter.map_or(String::new(), |w| w.to_string()));
            argv.extend(channels());
            scripts.get(RELEASE)
        }
    };
    script(source, holders_keys(keys), argv)
}

/// The node guard's observation (`observe.lua`), writing `mark_id` into a
/// mark it finds missing.
pub(super) fn observation(mark_id: &str, scripts: &Scripts) -> Invocation {
    script(
        scripts.get(OBSERVE),
        vec![DATA_SET_KEY.to_owned(), DATA_SET_SEQ_KEY.to_owned()],
        vec![mark_id.to_owned()],
    )
}

/// What `FencedRedis::set` sends to the storage: the write of `value` to
/// `data_key` under `token`, for `resource` (`fenced_write.lua`).
pub(super) fn fenced_write(
    resource: &str,
    data_key: &str,
    token: u64,
    value: &str,
    scripts: &Scripts,
) -> Invocation {
    script(
        scripts.get(FENCED_WRITE),
        vec![
            crate::storage::fenced_token_key(resource),
            data_key.to_owned(),
        ],
        vec![token.to_string(), "set".to_owned(), value.to_owned()],
    )
}

/// What `FencedRedis::get` sends to the storage: the read of the string
/// at `data_key` under `token`, for `resource` (`fenced_read.lua`).
pub(super) fn fenced_read(
    resource: &str,
    data_key: &str,
    token: u64,
    scripts: &Scripts,
) -> Invocation {
    script(
        scripts.get(FENCED_READ),
        vec![
            crate::storage::fenced_token_key(resource),
            data_key.to_owned(),
        ],
        vec![token.to_string(), "get".to_owned()],
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

    /// What `ops::prepare` puts on the wire, as text, one command a line.
    fn wire(op: Op, keys: &Keys, value: &str) -> Vec<Vec<String>> {
        let commands = match prepare(op, keys, value, false, None, None) {
            Prepared::One(cmd) | Prepared::Release(cmd) => vec![cmd],
            Prepared::Guarded {
                cmd,
                then,
                timed: false,
                observation: None,
                replicated: None,
            } => [cmd].into_iter().chain(then).collect(),
            Prepared::Guarded { .. } => panic!("neither timed nor observed"),
        };
        commands
            .iter()
            .map(|cmd| {
                cmd.args_iter()
                    .map(|arg| match arg {
                        Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                        _ => "<cursor>".to_owned(),
                    })
                    .collect()
            })
            .collect()
    }

    /// What the model sends, as the same text.
    fn ours(op: Op, keys: &Keys, value: &str) -> Vec<Vec<String>> {
        match invocation(op, keys, value, &Scripts::library()) {
            Invocation::Command(args) => vec![args],
            Invocation::Commands(each) => each,
            Invocation::Script { source, keys, argv } => {
                let mut out = vec![
                    "EVALSHA".to_owned(),
                    Script::new(source).get_hash().to_owned(),
                    keys.len().to_string(),
                ];
                out.extend(keys);
                out.extend(argv);
                vec![out]
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
            Op::AcquirePeek { ttl_ms: 3000 },
            Op::AcquireReadCounter { ttl_ms: 3000 },
            Op::AcquireQueued {
                ttl_ms: 3000,
                counting: Counting::Peek,
                ticket: 17,
                waiter: 9,
                lease_ms: 2000,
            },
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
            Op::Release {
                waiter: None,
                keep_ms: Some(1500),
            },
            Op::Release {
                waiter: Some(101),
                keep_ms: Some(1500),
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
