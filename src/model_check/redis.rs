//! One Redis node in memory, and the Lua 5.1 host that runs the library's
//! scripts on it as Redis does: `KEYS` and `ARGV` as globals, `redis.call`
//! raising and `redis.pcall` returning error tables, Redis' conversions
//! between Lua values and replies, and the commands the scripts send.
//!
//! A node's data is plain, hashable state (the search keeps millions of
//! copies); the host is one Lua state for every node, handed the node a
//! script runs on for the length of the call. Runs are memoised: the
//! search meets the same script on the same data again and again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::Arc;

use mlua::{Function, Lua, MultiValue, Value as LuaValue};

use crate::guard::judge::{DATA_SET_KEY, DATA_SET_SEQ_KEY};
use crate::keys::{KeyKind, parse_key};

use super::hashing::{Digested, digest};

/// Shared, cheaply cloned text (keys, values, members).
pub(super) type Text = Arc<str>;

/// A sorted-set score: a double, compared and hashed by its bits so that
/// data can be hashed and compared exactly.
#[derive(Debug, Clone, Copy)]
pub(super) struct Score(pub(super) f64);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Score {}
impl Hash for Score {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A key's value: the two types the scripts use.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Data {
    Str(Text),
    /// Members ordered as Redis orders them: by score, then by member.
    ZSet(Vec<(Score, Text)>),
}

/// A key: its value and when it expires (node ms), if it does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Entry {
    pub(super) data: Data,
    pub(super) expires_at: Option<i64>,
}

/// A node's keys, sorted by name (a handful: a sorted vector clones and
/// hashes faster than a map).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(super) struct Keyspace {
    entries: Vec<(Text, Entry)>,
}

impl Keyspace {
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| (**k).cmp(key))
    }

    pub(super) fn get(&self, key: &str) -> Option<&Entry> {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        self.find(key).ok().map(|i| &mut self.entries[i].1)
    }

    fn insert(&mut self, key: &str, entry: Entry) {
        match self.find(key) {
            Ok(i) => self.entries[i].1 = entry,
            Err(i) => self.entries.insert(i, (Text::from(key), entry)),
        }
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.find(key) {
            Ok(i) => {
                self.entries.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// Drops the keys that expired by `now_ms` (Redis: a key lives while
    /// `now <= expires_at`).
    pub(super) fn purge_expired(&mut self, now_ms: i64) {
        self.entries
            .retain(|(_, entry)| entry.expires_at.is_none_or(|at| at >= now_ms));
    }

    /// Keeps the string keys `keep_string(key, value)` accepts and the
    /// sorted-set members `keep_member(key, member)` accepts (a set left
    /// empty goes, as in Redis).
    pub(super) fn retain(
        &mut self,
        keep_string: impl Fn(&str, &str) -> bool,
        keep_member: impl Fn(&str, &str) -> bool,
    ) {
        self.entries
            .retain_mut(|(key, entry)| match &mut entry.data {
                Data::Str(value) => keep_string(key, value),
                Data::ZSet(members) => {
                    members.retain(|(_, member)| keep_member(key, member));
                    !members.is_empty()
                }
            });
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(k, e)| (&**k, e))
    }
}

/// A node's data as the state keeps it: shared until a step changes it,
/// and hashed once per change (the state's hash uses the digest).
#[derive(Debug, Clone)]
pub(super) struct Store {
    keys: Arc<Keyspace>,
    digest: u128,
}

impl Store {
    pub(super) fn new(keys: Keyspace) -> Self {
        let digest = digest_of(&keys);
        Self {
            keys: Arc::new(keys),
            digest,
        }
    }

    pub(super) fn keys(&self) -> &Keyspace {
        &self.keys
    }

    /// Changes the data with `change` (and works out its digest again).
    pub(super) fn update(&mut self, change: impl FnOnce(&mut Keyspace)) {
        change(Arc::make_mut(&mut self.keys));
        self.digest = digest_of(&self.keys);
    }

    /// Drops the keys that expired by `now_ms`.
    pub(super) fn expire(&mut self, now_ms: i64) {
        if self
            .keys
            .iter()
            .any(|(_, e)| e.expires_at.is_some_and(|at| at < now_ms))
        {
            self.update(|keys| keys.purge_expired(now_ms));
        }
    }
}

fn digest_of(keys: &Keyspace) -> u128 {
    digest(keys)
}

impl PartialEq for Store {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}
impl Eq for Store {}
impl Hash for Store {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

/// The process a node runs: what `INFO` says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Process {
    /// Counts the node's starts: its `run_id`.
    pub(super) run: u32,
    pub(super) started_ms: i64,
    /// `appendonly yes` with `appendfsync always`: a crash loses nothing.
    pub(super) persists: bool,
}

impl Process {
    /// The fenced storage's server: up since before the model began, and
    /// persisting (it is not the lock nodes' faults the model is about).
    pub(super) const STORAGE: Process = Process {
        run: 0,
        started_ms: 0,
        persists: true,
    };

    /// `run_id` as Redis shows it (40 hex digits; observe.lua reads `%x+`).
    pub(super) fn run_id(&self) -> String {
        format!("{:040x}", 0xa000_0000u64 + u64::from(self.run))
    }
}

/// A reply, as Redis sends it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Reply {
    Nil,
    Int(i64),
    Bulk(Text),
    Array(Vec<Reply>),
    Status(Text),
    Error(Text),
}

impl Reply {
    /// As redis-rs reads it off the wire (`+OK` is `Value::Okay`); an
    /// error reply is `Err`.
    pub(super) fn to_value(&self) -> Result<redis::Value, String> {
        Ok(match self {
            Reply::Nil => redis::Value::Nil,
            Reply::Int(n) => redis::Value::Int(*n),
            Reply::Bulk(text) => redis::Value::BulkString(text.as_bytes().to_vec()),
            Reply::Array(items) => redis::Value::Array(
                items
                    .iter()
                    .map(Reply::to_value)
                    .collect::<Result<_, _>>()?,
            ),
            Reply::Status(text) if &**text == "OK" => redis::Value::Okay,
            Reply::Status(text) => redis::Value::SimpleString(text.to_string()),
            Reply::Error(text) => return Err(text.to_string()),
        })
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Nil => f.write_str("nil"),
            Reply::Int(n) => write!(f, "{n}"),
            Reply::Bulk(text) if text.len() > 60 => write!(f, "\"{}…\"", &text[..40]),
            Reply::Bulk(text) => write!(f, "{text:?}"),
            Reply::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Reply::Status(text) => write!(f, "+{text}"),
            Reply::Error(text) => write!(f, "-{text}"),
        }
    }
}

/// What one request sends: a script with its keys and arguments, or a
/// plain command.
#[derive(Debug, Clone)]
pub(super) enum Invocation {
    Script {
        source: &'static str,
        keys: Vec<String>,
        argv: Vec<String>,
    },
    Command(Vec<String>),
    /// Commands sent in one write (`SET` and the `GET` of a counter behind
    /// it): run one after the other, taken as one step; the reply is an
    /// array of theirs.
    Commands(Vec<Vec<String>>),
}

/// How long a write may make a key or an entry live (property 4), by the
/// key's kind, in ms from the write.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Lock keys and readers' entries: the longest TTL.
    pub(super) lock_ms: i64,
    /// A waiter's lease entry.
    pub(super) lease_ms: i64,
    /// The queue keys: the longest lease plus the second `queue.lua` adds
    /// for clock steps.
    pub(super) queue_ms: i64,
}

/// What a request did on a node besides its reply.
#[derive(Debug, Clone, Default)]
pub(super) struct Effects {
    /// `PUBLISH` channel and message, in order.
    pub(super) published: Vec<(Text, Text)>,
    /// Writes that let a key or entry live longer than its limit.
    pub(super) overlong: Vec<String>,
}

/// The node state a script runs on, handed to the Lua callbacks.
struct Exec {
    keys: Keyspace,
    now_ms: i64,
    process: Process,
    limits: Limits,
    effects: Effects,
}

/// A finished run, kept for the memo.
#[derive(Clone)]
struct Memo {
    store: Store,
    reply: Reply,
    effects: Effects,
}

/// The Lua host: one Lua 5.1 state with the `redis` library, the compiled
/// scripts, and the memo of runs.
pub(super) struct Host {
    lua: Lua,
    exec: Rc<RefCell<Option<Exec>>>,
    functions: HashMap<usize, Function>,
    memo: HashMap<u128, Memo, Digested>,
    limits: Limits,
    /// The scripts run (their sources, by address).
    ran: HashMap<usize, &'static str>,
    /// Scripts and commands run, and how many came from the memo.
    pub(super) runs: u64,
    pub(super) memo_hits: u64,
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

impl Host {
    pub(super) fn new(limits: Limits) -> Self {
        let lua = Lua::new();
        let exec: Rc<RefCell<Option<Exec>>> = Rc::default();
        install_redis_library(&lua, &exec).expect("the redis library installs");
        Self {
            lua,
            exec,
            functions: HashMap::new(),
            ran: HashMap::new(),
            memo: HashMap::default(),
            limits,
            runs: 0,
            memo_hits: 0,
        }
    }

    /// Runs the request `call` stands for (`build` makes it, when the memo
    /// does not know the answer) on the node whose data is `store` and
    /// process `process`, at node time `now_ms`: changes `store`, returns
    /// the reply and what else it did. `call` must tell every request that
    /// can differ apart (the memo trusts it).
    pub(super) fn run(
        &mut self,
        store: &mut Store,
        process: Process,
        now_ms: i64,
        call: u128,
        build: impl FnOnce() -> Invocation,
    ) -> (Reply, Effects) {
        store.expire(now_ms);
        let fingerprint = digest(&(store.digest, process, now_ms, call));
        self.runs += 1;
        if let Some(memo) = self.memo.get(&fingerprint) {
            self.memo_hits += 1;
            *store = memo.store.clone();
            return (memo.reply.clone(), memo.effects.clone());
        }
        let invocation = build();
        let mut exec = Exec {
            keys: Keyspace::clone(&store.keys),
            now_ms,
            process,
            limits: self.limits,
            effects: Effects::default(),
        };
        let reply = match &invocation {
            Invocation::Command(args) => command(&mut exec, args),
            Invocation::Commands(each) => {
                Reply::Array(each.iter().map(|args| command(&mut exec, args)).collect())
            }
            Invocation::Script { source, keys, argv } => {
                *self.exec.borrow_mut() = Some(exec);
                let reply = self.eval(source, keys, argv);
                exec = self
                    .exec
                    .borrow_mut()
                    .take()
                    .expect("the script's node is still handed out");
                reply
            }
        };
        *store = Store::new(exec.keys);
        self.memo.insert(
            fingerprint,
            Memo {
                store: store.clone(),
                reply: reply.clone(),
                effects: exec.effects.clone(),
            },
        );
        (reply, exec.effects)
    }

    /// The sources of the scripts run so far.
    pub(super) fn ran(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.ran.values().copied()
    }

    fn eval(&mut self, source: &'static str, keys: &[String], argv: &[String]) -> Reply {
        self.ran.insert(source.as_ptr() as usize, source);
        let function = match self.functions.get(&(source.as_ptr() as usize)) {
            Some(function) => function.clone(),
            None => {
                let function = self
                    .lua
                    .load(source)
                    .set_name("user_script")
                    .into_function()
                    .expect("the library's scripts compile");
                self.functions
                    .insert(source.as_ptr() as usize, function.clone());
                function
            }
        };
        let globals = self.lua.globals();
        let set = || -> mlua::Result<()> {
            globals.raw_set(
                "KEYS",
                self.lua
                    .create_sequence_from(keys.iter().map(String::as_str))?,
            )?;
            globals.raw_set(
                "ARGV",
                self.lua
                    .create_sequence_from(argv.iter().map(String::as_str))?,
            )?;
            Ok(())
        };
        set().expect("KEYS and ARGV are set");
        match function.call::<LuaValue>(()) {
            Ok(value) => reply_of_lua(&value),
            Err(error) => Reply::Error(Text::from(format!("ERR script failed: {error}"))),
        }
    }
}

/// Installs `redis.call`, `redis.pcall`, `redis.status_reply` and
/// `redis.error_reply`, working on the node in `exec`.
fn install_redis_library(lua: &Lua, exec: &Rc<RefCell<Option<Exec>>>) -> mlua::Result<()> {
    let redis = lua.create_table()?;
    for (name, raises) in [("call", true), ("pcall", false)] {
        let exec = Rc::clone(exec);
        let function = lua.create_function(move |lua, args: MultiValue| {
            let args = args
                .iter()
                .map(arg_of_lua)
                .collect::<Result<Vec<String>, String>>()
                .map_err(mlua::Error::RuntimeError)?;
            let reply = {
                let mut exec = exec.borrow_mut();
                let exec = exec
                    .as_mut()
                    .ok_or_else(|| mlua::Error::RuntimeError("no node".into()))?;
                command(exec, &args)
            };
            match reply {
                Reply::Error(message) if raises => {
                    Err(mlua::Error::RuntimeError(message.to_string()))
                }
                reply => lua_of_reply(lua, &reply),
            }
        })?;
        redis.set(name, function)?;
    }
    redis.set(
        "status_reply",
        lua.create_function(|lua, text: mlua::LuaString| {
            let table = lua.create_table()?;
            table.set("ok", text)?;
            Ok(table)
        })?,
    )?;
    redis.set(
        "error_reply",
        lua.create_function(|lua, text: mlua::LuaString| {
            let table = lua.create_table()?;
            table.set("err", text)?;
            Ok(table)
        })?,
    )?;
    let globals = lua.globals();
    globals.set("redis", redis)?;
    // As Redis 7 does, a script may neither create a global nor read one
    // that does not exist (a `local` forgotten is an error on the server).
    let guard = lua.create_table()?;
    guard.set(
        "__newindex",
        lua.create_function(|_, (_, name): (LuaValue, mlua::LuaString)| -> mlua::Result<()> {
            Err(mlua::Error::RuntimeError(format!(
                "Attempt to modify a readonly table: script attempted to create global variable '{}'",
                String::from_utf8_lossy(&name.as_bytes())
            )))
        })?,
    )?;
    guard.set(
        "__index",
        lua.create_function(|_, (_, name): (LuaValue, LuaValue)| -> mlua::Result<()> {
            Err(mlua::Error::RuntimeError(format!(
                "Script attempted to access nonexistent global variable '{}'",
                arg_of_lua(&name).unwrap_or_default()
            )))
        })?,
    )?;
    globals.set_metatable(Some(guard))?;
    Ok(())
}

/// A command argument from Lua: strings as they are, numbers as Redis
/// writes them (exactly: the scripts pass tickets of 16 digits).
fn arg_of_lua(value: &LuaValue) -> Result<String, String> {
    match value {
        LuaValue::String(text) => Ok(String::from_utf8_lossy(&text.as_bytes()).into_owned()),
        LuaValue::Integer(n) => Ok(n.to_string()),
        LuaValue::Number(x) => Ok(number_text(*x)),
        other => Err(format!(
            "Lua redis lib command arguments must be strings or integers, not {}",
            other.type_name()
        )),
    }
}

/// A double as Redis prints it (`%.17g`): integers without a fraction.
fn number_text(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e17 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// A script's return value as the reply Redis sends: false is nil,
/// numbers are truncated to integers, a table is an error or status reply
/// when it has `err` or `ok`, else an array up to its first nil.
fn reply_of_lua(value: &LuaValue) -> Reply {
    match value {
        LuaValue::Nil | LuaValue::Boolean(false) => Reply::Nil,
        LuaValue::Boolean(true) => Reply::Int(1),
        LuaValue::Integer(n) => Reply::Int(*n),
        LuaValue::Number(x) => Reply::Int(x.trunc() as i64),
        LuaValue::String(text) => {
            Reply::Bulk(Text::from(&*String::from_utf8_lossy(&text.as_bytes())))
        }
        LuaValue::Table(table) => {
            if let Ok(LuaValue::String(err)) = table.raw_get::<LuaValue>("err") {
                return Reply::Error(Text::from(&*String::from_utf8_lossy(&err.as_bytes())));
            }
            if let Ok(LuaValue::String(ok)) = table.raw_get::<LuaValue>("ok") {
                return Reply::Status(Text::from(&*String::from_utf8_lossy(&ok.as_bytes())));
            }
            let mut items = Vec::new();
            for i in 1.. {
                match table.raw_get::<LuaValue>(i) {
                    Ok(LuaValue::Nil) | Err(_) => break,
                    Ok(item) => items.push(reply_of_lua(&item)),
                }
            }
            Reply::Array(items)
        }
        other => Reply::Error(Text::from(format!(
            "unsupported return type {}",
            other.type_name()
        ))),
    }
}

/// A reply as a script sees it: nil is false, status and error replies
/// are tables with `ok` or `err`.
fn lua_of_reply(lua: &Lua, reply: &Reply) -> mlua::Result<LuaValue> {
    Ok(match reply {
        Reply::Nil => LuaValue::Boolean(false),
        Reply::Int(n) => LuaValue::Number(*n as f64),
        Reply::Bulk(text) => LuaValue::String(lua.create_string(text.as_bytes())?),
        Reply::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                table.raw_set(i + 1, lua_of_reply(lua, item)?)?;
            }
            LuaValue::Table(table)
        }
        Reply::Status(text) | Reply::Error(text) => {
            let table = lua.create_table()?;
            let field = if matches!(reply, Reply::Status(_)) {
                "ok"
            } else {
                "err"
            };
            table.set(field, lua.create_string(text.as_bytes())?)?;
            LuaValue::Table(table)
        }
    })
}

fn error(text: &str) -> Reply {
    Reply::Error(Text::from(text))
}

fn bulk(text: impl Into<Text>) -> Reply {
    Reply::Bulk(text.into())
}

/// How long a write may make `key` live, and its members (`None`: no
/// limit; fencing counters live an hour, far past any scenario, and the
/// guard's mark never expires).
fn limit_of(key: &str, limits: &Limits) -> (Option<i64>, Option<i64>) {
    if key == DATA_SET_KEY || key == DATA_SET_SEQ_KEY {
        return (None, None);
    }
    match parse_key(key).map(|(kind, _)| kind) {
        Some(KeyKind::Fence) => (None, None),
        Some(KeyKind::WaiterLeases) => (Some(limits.queue_ms), Some(limits.lease_ms)),
        // Queue members are scored by ticket, not by time.
        Some(KeyKind::Waiters | KeyKind::WaitingWriters) => (Some(limits.queue_ms), None),
        Some(KeyKind::Lock) => (Some(limits.lock_ms), Some(limits.lock_ms)),
        Some(KeyKind::Wake) | None => (Some(limits.lock_ms), None),
    }
}

impl Exec {
    fn expire_at(&mut self, key: &str, at: i64) {
        let mut limit = limit_of(key, &self.limits).0;
        if matches!(parse_key(key), Some((KeyKind::Lock, _))) {
            limit = self.lock_key_limit(key);
        }
        if let Some(limit) = limit
            && at - self.now_ms > limit
        {
            self.effects.overlong.push(format!(
                "{key} set to expire in {} ms, beyond its limit of {limit} ms",
                at - self.now_ms
            ));
        }
        if let Some(entry) = self.keys.get_mut(key) {
            entry.expires_at = Some(at);
        }
    }

    /// How long lock key `key` may live from now, by what it holds: a
    /// holder's value, its TTL; a key kept for the waiters (see
    /// `holders.lua`: a readers' key, or a value that carries its holder's
    /// expiry after "\0", which must itself be within the TTL), the queue's.
    fn lock_key_limit(&mut self, key: &str) -> Option<i64> {
        let Some(Entry {
            data: Data::Str(value),
            ..
        }) = self.keys.get(key)
        else {
            return Some(self.limits.queue_ms);
        };
        let Some((_, due)) = value.split_once('\0') else {
            return Some(self.limits.lock_ms);
        };
        let due: i64 = due.parse().unwrap_or(0);
        if due - self.now_ms > self.limits.lock_ms {
            self.effects.overlong.push(format!(
                "{key}'s holder kept for the queue until {} ms from now, beyond the TTL of {} ms",
                due - self.now_ms,
                self.limits.lock_ms
            ));
        }
        Some(self.limits.queue_ms)
    }

    fn zset(&self, key: &str) -> Result<Option<&Vec<(Score, Text)>>, Reply> {
        match self.keys.get(key) {
            None => Ok(None),
            Some(Entry {
                data: Data::ZSet(members),
                ..
            }) => Ok(Some(members)),
            Some(_) => Err(error(WRONGTYPE)),
        }
    }

    fn info(&self) -> String {
        let p = &self.process;
        // As Redis counts it: whole seconds of the clock now, less those
        // at the start (so up to a second more than it ran).
        let uptime = (self.now_ms.div_euclid(1000) - p.started_ms.div_euclid(1000)).max(0);
        let mut text = String::new();
        let _ = write!(
            text,
            "# Server\r\nredis_version:7.2.4\r\nrun_id:{run_id}\r\nuptime_in_seconds:{uptime}\r\n\
             server_time_usec:{usec}\r\n\r\n# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n\r\n\
             # Persistence\r\nloading:0\r\naof_enabled:{aof}\r\naof_rewrite_in_progress:0\r\n\
             aof_rewrite_scheduled:0\r\naof_last_write_status:ok\r\n\r\n# Replication\r\n\
             role:master\r\nconnected_slaves:0\r\nmaster_replid:{replid:040x}\r\n",
            run_id = p.run_id(),
            usec = self.now_ms * 1000,
            aof = u8::from(p.persists),
            replid = 0xb000_0000u64 + u64::from(p.run),
        );
        text
    }
}

/// A score bound of ZRANGEBYSCORE: the value, and whether it is excluded.
fn bound(text: &str) -> Option<(f64, bool)> {
    let (text, open) = match text.strip_prefix('(') {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let value = match text {
        "-inf" => f64::NEG_INFINITY,
        "+inf" | "inf" => f64::INFINITY,
        _ => text.parse().ok()?,
    };
    Some((value, open))
}

fn within(score: f64, min: (f64, bool), max: (f64, bool)) -> bool {
    let above = if min.1 { score > min.0 } else { score >= min.0 };
    let below = if max.1 { score < max.0 } else { score <= max.0 };
    above && below
}

fn score_text(score: Score) -> Text {
    Text::from(number_text(score.0))
}

/// Runs one command on the node.
fn command(x: &mut Exec, args: &[String]) -> Reply {
    let Some(name) = args.first() else {
        return error("ERR wrong number of arguments");
    };
    let arg = |i: usize| args.get(i).map(String::as_str);
    let int = |i: usize| arg(i).and_then(|s| s.parse::<i64>().ok());
    let key = arg(1).unwrap_or("");
    match name.to_ascii_uppercase().as_str() {
        "GET" => match x.keys.get(key) {
            None => Reply::Nil,
            Some(Entry {
                data: Data::Str(text),
                ..
            }) => bulk(Text::clone(text)),
            Some(_) => error(WRONGTYPE),
        },
        "SET" => {
            let Some(value) = arg(2) else {
                return error("ERR wrong number of arguments for 'set' command");
            };
            let (mut nx, mut px, mut pxat) = (false, None, None);
            let mut i = 3;
            while let Some(option) = arg(i) {
                match option.to_ascii_uppercase().as_str() {
                    "NX" => nx = true,
                    "PXAT" => {
                        match int(i + 1) {
                            Some(n) if n > 0 => pxat = Some(n),
                            _ => return error("ERR invalid expire time in 'set' command"),
                        }
                        i += 1;
                    }
                    "PX" | "EX" => {
                        let scale = if option.eq_ignore_ascii_case("EX") {
                            1000
                        } else {
                            1
                        };
                        match int(i + 1) {
                            Some(n) if n > 0 => px = Some(n * scale),
                            _ => return error("ERR invalid expire time in 'set' command"),
                        }
                        i += 1;
                    }
                    _ => return error("ERR syntax error"),
                }
                i += 1;
            }
            if nx && x.keys.get(key).is_some() {
                return Reply::Nil;
            }
            x.keys.insert(
                key,
                Entry {
                    data: Data::Str(Text::from(value)),
                    expires_at: None,
                },
            );
            match (px, pxat) {
                (None, None) if matches!(parse_key(key), Some((KeyKind::Lock, _))) => {
                    x.effects
                        .overlong
                        .push(format!("{key} set to live for good"));
                }
                (Some(px), None) => x.expire_at(key, x.now_ms + px),
                // As Redis 7.0 does: a key whose time is past goes; one
                // set to expire this very millisecond lives through it
                // (checked on a real server).
                (None, Some(at)) if at < x.now_ms => {
                    x.keys.remove(key);
                }
                (None, Some(at)) => x.expire_at(key, at),
                (Some(_), Some(_)) => return error("ERR syntax error"),
                (None, None) => {}
            }
            Reply::Status(Text::from("OK"))
        }
        "DEL" => Reply::Int(args[1..].iter().filter(|k| x.keys.remove(k)).count() as i64),
        "EXISTS" => Reply::Int(args[1..].iter().filter(|k| x.keys.get(k).is_some()).count() as i64),
        "TYPE" => Reply::Status(Text::from(match x.keys.get(key) {
            None => "none",
            Some(Entry {
                data: Data::Str(_), ..
            }) => "string",
            Some(_) => "zset",
        })),
        // Time left (PTTL) or the absolute expiry (PEXPIRETIME), in ms.
        "PTTL" | "PEXPIRETIME" => match x.keys.get(key) {
            None => Reply::Int(-2),
            Some(Entry {
                expires_at: None, ..
            }) => Reply::Int(-1),
            Some(Entry {
                expires_at: Some(at),
                ..
            }) if name.eq_ignore_ascii_case("PTTL") => Reply::Int((at - x.now_ms).max(0)),
            Some(Entry {
                expires_at: Some(at),
                ..
            }) => Reply::Int(*at),
        },
        "PEXPIRE" | "PEXPIREAT" => {
            let Some(n) = int(2) else {
                return error("ERR value is not an integer or out of range");
            };
            if x.keys.get(key).is_none() {
                return Reply::Int(0);
            }
            let at = if name.eq_ignore_ascii_case("PEXPIRE") {
                x.now_ms + n
            } else {
                n
            };
            if at <= x.now_ms {
                x.keys.remove(key);
            } else {
                x.expire_at(key, at);
            }
            Reply::Int(1)
        }
        "PERSIST" => {
            if let (Some(limit), _) = limit_of(key, &x.limits) {
                x.effects.overlong.push(format!(
                    "{key} made to live for good, beyond its limit of {limit} ms"
                ));
            }
            match x.keys.get_mut(key) {
                Some(entry) if entry.expires_at.is_some() => {
                    entry.expires_at = None;
                    Reply::Int(1)
                }
                _ => Reply::Int(0),
            }
        }
        "INCR" => {
            let current = match x.keys.get(key) {
                None => 0,
                Some(Entry {
                    data: Data::Str(text),
                    ..
                }) => match text.parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => return error("ERR value is not an integer or out of range"),
                },
                Some(_) => return error(WRONGTYPE),
            };
            let expires_at = x.keys.get(key).and_then(|e| e.expires_at);
            x.keys.insert(
                key,
                Entry {
                    data: Data::Str(Text::from((current + 1).to_string())),
                    expires_at,
                },
            );
            Reply::Int(current + 1)
        }
        "ZADD" => {
            if args.len() < 4 || !args.len().is_multiple_of(2) {
                return error("ERR wrong number of arguments for 'zadd' command");
            }
            let mut members = match x.zset(key) {
                Ok(members) => members.cloned().unwrap_or_default(),
                Err(reply) => return reply,
            };
            let expires_at = x.keys.get(key).and_then(|e| e.expires_at);
            let member_limit = limit_of(key, &x.limits).1;
            let mut added = 0;
            for pair in args[2..].chunks(2) {
                let Ok(score) = pair[0].parse::<f64>() else {
                    return error("ERR value is not a valid float");
                };
                if let Some(limit) = member_limit
                    && score as i64 - x.now_ms > limit
                {
                    x.effects.overlong.push(format!(
                        "{key} entry {} set to live {} ms, beyond its limit of {limit} ms",
                        pair[1],
                        score as i64 - x.now_ms
                    ));
                }
                match members.iter().position(|(_, m)| **m == *pair[1]) {
                    Some(i) => {
                        members.remove(i);
                    }
                    None => added += 1,
                }
                let entry = (Score(score), Text::from(pair[1].as_str()));
                let at = members.partition_point(|e| *e < entry);
                members.insert(at, entry);
            }
            x.keys.insert(
                key,
                Entry {
                    data: Data::ZSet(members),
                    expires_at,
                },
            );
            Reply::Int(added)
        }
        "ZREM" | "ZREMRANGEBYSCORE" => {
            let Some(Entry {
                data: Data::ZSet(members),
                ..
            }) = x.keys.get_mut(key)
            else {
                return match x.keys.get(key) {
                    None => Reply::Int(0),
                    Some(_) => error(WRONGTYPE),
                };
            };
            let before = members.len();
            if name.eq_ignore_ascii_case("ZREM") {
                members.retain(|(_, m)| !args[2..].iter().any(|gone| **m == **gone));
            } else {
                let (Some(min), Some(max)) = (arg(2).and_then(bound), arg(3).and_then(bound))
                else {
                    return error("ERR min or max is not a float");
                };
                members.retain(|(s, _)| !within(s.0, min, max));
            }
            let removed = before - members.len();
            if members.is_empty() {
                x.keys.remove(key);
            }
            Reply::Int(removed as i64)
        }
        "ZSCORE" => match x.zset(key) {
            Err(reply) => reply,
            Ok(members) => members
                .and_then(|m| m.iter().find(|(_, member)| Some(&**member) == arg(2)))
                .map_or(Reply::Nil, |(score, _)| Reply::Bulk(score_text(*score))),
        },
        "ZRANGE" => {
            let members = match x.zset(key) {
                Err(reply) => return reply,
                Ok(members) => members.cloned().unwrap_or_default(),
            };
            let (Some(start), Some(stop)) = (int(2), int(3)) else {
                return error("ERR value is not an integer or out of range");
            };
            let scores = arg(4).is_some_and(|a| a.eq_ignore_ascii_case("WITHSCORES"));
            let n = members.len() as i64;
            let start = if start < 0 { (start + n).max(0) } else { start };
            let stop = if stop < 0 { stop + n } else { stop.min(n - 1) };
            let mut out = Vec::new();
            if start <= stop && start < n {
                for (score, member) in &members[start as usize..=stop as usize] {
                    out.push(Reply::Bulk(Text::clone(member)));
                    if scores {
                        out.push(Reply::Bulk(score_text(*score)));
                    }
                }
            }
            Reply::Array(out)
        }
        "ZRANGEBYSCORE" => {
            let members = match x.zset(key) {
                Err(reply) => return reply,
                Ok(members) => members.cloned().unwrap_or_default(),
            };
            let (Some(min), Some(max)) = (arg(2).and_then(bound), arg(3).and_then(bound)) else {
                return error("ERR min or max is not a float");
            };
            let (mut scores, mut offset, mut count) = (false, 0usize, usize::MAX);
            let mut i = 4;
            while let Some(option) = arg(i) {
                if option.eq_ignore_ascii_case("WITHSCORES") {
                    scores = true;
                } else if option.eq_ignore_ascii_case("LIMIT") {
                    offset = int(i + 1).unwrap_or(0).max(0) as usize;
                    count = int(i + 2)
                        .filter(|c| *c >= 0)
                        .map_or(usize::MAX, |c| c as usize);
                    i += 2;
                }
                i += 1;
            }
            let mut out = Vec::new();
            for (score, member) in members
                .iter()
                .filter(|(s, _)| within(s.0, min, max))
                .skip(offset)
                .take(count)
            {
                out.push(Reply::Bulk(Text::clone(member)));
                if scores {
                    out.push(Reply::Bulk(score_text(*score)));
                }
            }
            Reply::Array(out)
        }
        "TIME" => Reply::Array(vec![
            bulk((x.now_ms / 1000).to_string()),
            bulk(((x.now_ms % 1000) * 1000).to_string()),
        ]),
        "PUBLISH" => {
            let (Some(channel), Some(message)) = (arg(1), arg(2)) else {
                return error("ERR wrong number of arguments for 'publish' command");
            };
            x.effects
                .published
                .push((Text::from(channel), Text::from(message)));
            Reply::Int(0)
        }
        "INFO" => bulk(x.info()),
        other => Reply::Error(Text::from(format!(
            "ERR unknown command '{other}' in the model"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host::new(Limits {
            lock_ms: 3000,
            lease_ms: 3000,
            queue_ms: 4000,
        })
    }

    fn process() -> Process {
        Process {
            run: 1,
            started_ms: 0,
            persists: false,
        }
    }

    fn script(source: &'static str, keys: &[&str], argv: &[&str]) -> Invocation {
        Invocation::Script {
            source,
            keys: keys.iter().map(|s| s.to_string()).collect(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Runs `invocation` (no memo: each call is told apart by its text).
    fn run(host: &mut Host, store: &mut Store, now_ms: i64, invocation: Invocation) -> Reply {
        let key = digest(&format!("{invocation:?}"));
        host.run(store, process(), now_ms, key, || invocation).0
    }

    #[test]
    fn replies_convert_as_redis_converts_them() {
        let mut host = host();
        let mut keys = Store::new(Keyspace::default());
        let cases: [(&'static str, Reply); 7] = [
            ("return false", Reply::Nil),
            ("return 3.9", Reply::Int(3)),
            (
                "return {1, 'a', nil, 4}",
                Reply::Array(vec![Reply::Int(1), bulk("a")]),
            ),
            (
                "return redis.status_reply('OK')",
                Reply::Status(Text::from("OK")),
            ),
            (
                "return redis.error_reply('E x')",
                Reply::Error(Text::from("E x")),
            ),
            (
                "return redis.pcall('GET', 'z') == false and redis.call('TYPE', 'z').ok",
                bulk("none"),
            ),
            ("return true", Reply::Int(1)),
        ];
        // Globals are read-only, and unknown ones are errors, as in Redis.
        for source in ["x = 1 return 1", "return y"] {
            let reply = run(&mut host, &mut keys, 1000, script(source, &[], &[]));
            assert!(matches!(reply, Reply::Error(_)), "{source}: {reply}");
        }
        for (source, expected) in cases {
            let reply = run(&mut host, &mut keys, 1000, script(source, &[], &[]));
            assert_eq!(reply, expected, "{source}");
        }
    }

    #[test]
    fn commands_behave_as_in_redis() {
        let mut host = host();
        let mut keys = Store::new(Keyspace::default());
        let source = r#"
            local out = {}
            out[1] = redis.call("SET", KEYS[1], "v", "NX", "PX", 2000)
            out[2] = redis.call("SET", KEYS[1], "w", "NX", "PX", 2000)
            out[3] = redis.call("PTTL", KEYS[1])
            redis.call("ZADD", KEYS[2], 1700000000000123, "b")
            redis.call("ZADD", KEYS[2], 5, "a")
            out[4] = redis.call("ZRANGE", KEYS[2], 0, 0, "WITHSCORES")
            out[5] = redis.call("ZSCORE", KEYS[2], "b")
            out[6] = redis.pcall("GET", KEYS[2])
            out[7] = redis.call("ZREM", KEYS[2], "a", "b")
            out[8] = redis.call("EXISTS", KEYS[2])
            out[9] = redis.call("INCR", KEYS[3])
            out[10] = redis.call("PEXPIRETIME", KEYS[1])
            redis.call("SET", KEYS[4], "x", "PXAT", 2500)
            out[11] = redis.call("PEXPIRETIME", KEYS[4])
            redis.call("SET", KEYS[4], "y", "PXAT", 999)
            out[12] = redis.call("EXISTS", KEYS[4])
            return {out[1].ok, out[2], out[3], out[4][1], out[4][2], out[5], out[6].err ~= nil, out[7], out[8], out[9], out[10], out[11], out[12]}
        "#;
        let reply = run(
            &mut host,
            &mut keys,
            1000,
            script(source, &["k", "z", "n", "p"], &[]),
        );
        assert_eq!(
            reply,
            Reply::Array(vec![
                bulk("OK"),
                Reply::Nil,
                Reply::Int(2000),
                bulk("a"),
                bulk("5"),
                bulk("1700000000000123"),
                Reply::Int(1),
                Reply::Int(2),
                Reply::Int(0),
                Reply::Int(1),
                // PEXPIRETIME: the absolute expiry; SET … PXAT sets one,
                // and one already past deletes the key.
                Reply::Int(3000),
                Reply::Int(2500),
                Reply::Int(0),
            ])
        );
        // Expiry: alive at its expiry instant, gone after.
        keys.expire(3000);
        assert!(keys.keys().get("k").is_some());
        keys.expire(3001);
        assert!(keys.keys().get("k").is_none());
        // A failing call fails the script.
        let reply = run(
            &mut host,
            &mut keys,
            4000,
            script(
                "redis.call('SET', 'k', 'x') return redis.call('ZADD', 'k', 1, 'm')",
                &[],
                &[],
            ),
        );
        assert!(matches!(reply, Reply::Error(_)), "{reply}");
    }
}
