//! Who holds a lock, as a quorum of nodes sees it ([`Holding`]), and the
//! holder descriptions a lock may carry ([`Request::holder`](crate::Request::holder)).
//! Pure: what each node said goes in, the quorum's view comes out; the
//! queries that ask the nodes are [`crate::inspect`]'s.
//!
//! A description rides in the lock's value on the nodes, after the random
//! part (`<32 hex digits>:<description>`), so it costs nothing when absent
//! and is gone with the lock.

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::quorum::{drift, quorum};

/// The longest holder description, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;

/// Length of the random part of a lock's value (a simple uuid).
const RANDOM_LEN: usize = 32;

/// Checks a holder description: at most [`MAX_HOLDER_LEN`] bytes, no
/// control characters (it is printed on operators' terminals).
pub(crate) fn check_description(description: &str) -> Result<()> {
    let invalid = |reason: String| Error::InvalidArgument {
        argument: "holder",
        reason,
    };
    if description.len() > MAX_HOLDER_LEN {
        return Err(invalid(format!(
            "the description is {} bytes; at most {MAX_HOLDER_LEN} are stored with a lock: \
             shorten it (host, pid and a short label)",
            description.len()
        )));
    }
    if let Some(control) = description.chars().find(|&c| !describable(c)) {
        return Err(invalid(format!(
            "the description contains the control character {control:?}; use printable text"
        )));
    }
    Ok(())
}

/// Whether a description may hold `c`: no control character, and none of
/// the characters that are invisible or reorder text on a terminal (an
/// operator's table must read as it was written).
fn describable(c: char) -> bool {
    !c.is_control() && !hides_or_reorders(c)
}

/// Whether `c` prints as nothing, or changes how the text around it reads
/// on a terminal without a mark of its own: the zero-width characters,
/// the bidirectional controls (`U+202E` shows `abc` as `cba`), joiners,
/// invisible operators, variation selectors, the byte-order mark, the
/// Hangul fillers and the tag characters. Two names that differ only by
/// such a character read alike: an operator's table shows it escaped.
pub fn hides_or_reorders(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFFB}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// `text` made into a description a lock accepts (see
/// [`Request::holder`](crate::Request::holder)): each character a
/// description may not hold becomes a space, and it is cut to
/// [`MAX_HOLDER_LEN`] bytes at a character's end. For descriptions made
/// from what the caller does not control (a program's path, a host name).
///
/// ```
/// use quorumlock::holder_description;
///
/// assert_eq!(holder_description("host-a pid 7: ./job\u{202E}gpj.exe"), "host-a pid 7: ./job gpj.exe");
/// assert_eq!(holder_description(&"x".repeat(300)).len(), quorumlock::MAX_HOLDER_LEN);
/// ```
pub fn holder_description(text: &str) -> String {
    let mut description = String::with_capacity(text.len().min(MAX_HOLDER_LEN));
    for c in text.chars().map(|c| if describable(c) { c } else { ' ' }) {
        if description.len() + c.len_utf8() > MAX_HOLDER_LEN {
            break;
        }
        description.push(c);
    }
    description
}

/// A lock value that carries `description` after the random part `random`.
pub(crate) fn described(random: &str, description: &str) -> String {
    let mut value = String::with_capacity(random.len() + 1 + description.len());
    value.push_str(random);
    value.push(':');
    value.push_str(description);
    value
}

/// The holder description in a lock's value, if it carries one.
pub fn description_of(value: &str) -> Option<&str> {
    let (random, rest) = value.split_at_checked(RANDOM_LEN)?;
    let description = rest.strip_prefix(':')?;
    random
        .bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then_some(description)
}

/// How a [`Holder`] holds the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HolderKind {
    /// Alone: an exclusive (or write) lock, or one of a multi-resource lock.
    Exclusive,
    /// As one of the readers of a read lock.
    Reader,
}

/// One holder of a resource that a quorum of nodes agrees on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// Exclusive, or one of the readers.
    pub kind: HolderKind,
    /// Its description ([`Request::holder`](crate::Request::holder)), if
    /// it gave one.
    pub description: Option<String>,
    /// How long a quorum still keeps it, less the drift allowance, as a
    /// client would compute it; `None` when the key has no expiry (a key
    /// written by hand).
    pub valid_for: Option<Duration>,
    /// How many of the nodes that answered store it.
    pub nodes: usize,
    /// Its value on the nodes ([`Lock::value`](crate::Lock::value)).
    pub value: String,
}

/// Who holds a resource: [`LockManager::holders`](crate::LockManager::holders).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holding {
    /// The resource asked about.
    pub resource: String,
    /// Every holder a quorum of nodes stores: none when free, one
    /// exclusive holder, or the readers.
    pub holders: Vec<Holder>,
    /// Whether a quorum of the answering nodes hold nothing (no holder,
    /// and no key of a foreign type) there. Neither this nor a holder
    /// means contention in progress, or too few answers to tell.
    pub free: bool,
    /// The highest fencing counter any answering node stores for the
    /// resource: no token issued so far is higher, and the next holder's
    /// is above the last one issued (if [`counter_known`](Self::counter_known)).
    pub counter: Option<u64>,
    /// Whether the nodes that answered include what keeps the counter:
    /// with counter-node fencing, the counter node (no other keeps it).
    /// When not, `counter` (or its absence) says nothing of the tokens
    /// issued.
    pub counter_known: bool,
    /// Waiters queued for it, live, on the node with the most.
    pub waiters: u64,
    /// Every holder's value that any answering node stores, also where no
    /// quorum agrees on it: besides the holders, a client's key met
    /// mid-acquire (it may be granted a moment later), or what a failed
    /// attempt left (it expires, or is rolled back).
    /// [`LockManager::force_unlock`] breaks only [`holders`](Self::holders).
    ///
    /// [`LockManager::force_unlock`]: crate::LockManager::force_unlock
    pub seen: Vec<String>,
    /// Nodes that answered.
    pub answered: usize,
    /// Nodes (quorum members) asked.
    pub nodes: usize,
}

impl Holding {
    /// The exclusive holder, if a quorum agrees on one.
    pub fn exclusive(&self) -> Option<&Holder> {
        self.holders
            .iter()
            .find(|holder| holder.kind == HolderKind::Exclusive)
    }
}

/// What [`LockManager::force_unlock`](crate::LockManager::force_unlock) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedUnlock {
    /// The resource unlocked.
    pub resource: String,
    /// Nodes on which a holder's entry was deleted.
    pub deleted: usize,
    /// Nodes that answered (every one of them holds no lock now).
    pub answered: usize,
    /// Nodes (quorum members) asked.
    pub nodes: usize,
    /// The highest fencing counter the answering nodes store: the broken
    /// holder's token is at most this, and the next holder's is higher
    /// (if [`counter_known`](Self::counter_known)).
    pub counter: Option<u64>,
    /// As [`Holding::counter_known`].
    pub counter_known: bool,
}

/// What the lock key of a resource held on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Nothing: the lock is free there.
    None,
    /// An exclusive holder.
    Exclusive,
    /// Readers.
    Readers,
    /// A key of a type no lock writes: it keeps everyone out.
    Other,
}

/// What one node says of a resource (`inspect.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHolding {
    /// What the lock key holds.
    pub kind: NodeKind,
    /// Each holder's value and its time left (`None`: no expiry).
    pub entries: Vec<(String, Option<u64>)>,
    /// The fencing counter.
    pub counter: Option<u64>,
    /// Live waiters.
    pub waiters: u64,
}

impl NodeHolding {
    /// Reads `inspect.lua`'s reply; `None` when it is not one.
    pub fn from_reply(reply: &Value) -> Option<Self> {
        let Value::Array(parts) = reply else {
            return None;
        };
        let [kind, entries, counter, waiters] = parts.as_slice() else {
            return None;
        };
        let kind = match text(kind)?.as_str() {
            "none" => NodeKind::None,
            "x" => NodeKind::Exclusive,
            "r" => NodeKind::Readers,
            _ => NodeKind::Other,
        };
        let Value::Array(flat) = entries else {
            return None;
        };
        let mut read = Vec::with_capacity(flat.len() / 2);
        for pair in flat.chunks(2) {
            let [value, left] = pair else { return None };
            let left = number(left)?;
            read.push((text(value)?, u64::try_from(left).ok()));
        }
        Some(Self {
            kind,
            entries: read,
            counter: text(counter)?.parse().ok(),
            waiters: u64::try_from(number(waiters)?).unwrap_or(0),
        })
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        // Lossy: a value no client of ours wrote must not hide the others.
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

fn number(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// The quorum's view of `resource` from each member's answer (`None`: it
/// did not answer).
pub fn combine(resource: &str, answers: &[Option<NodeHolding>], drift_factor: f64) -> Holding {
    let needed = quorum(answers.len());
    let answered: Vec<&NodeHolding> = answers.iter().flatten().collect();
    let mut values: Vec<(&str, HolderKind)> = answered
        .iter()
        .flat_map(|node| {
            let kind = match node.kind {
                NodeKind::Readers => HolderKind::Reader,
                _ => HolderKind::Exclusive,
            };
            node.entries
                .iter()
                .map(move |(value, _)| (value.as_str(), kind))
        })
        .collect();
    values.sort_unstable_by(|a, b| a.0.cmp(b.0));
    values.dedup();
    let seen = values
        .iter()
        .map(|(value, _)| (*value).to_owned())
        .collect();
    let mut holders = Vec::new();
    for (value, kind) in values {
        // Each node's time left for this value (`u64::MAX`: no expiry).
        let mut lefts: Vec<u64> = answered
            .iter()
            .filter_map(|node| {
                let (_, left) = node.entries.iter().find(|(v, _)| v == value)?;
                Some(left.unwrap_or(u64::MAX))
            })
            .collect();
        if lefts.len() < needed {
            continue;
        }
        // It stands while `needed` nodes keep it: until the needed-th
        // longest time left runs out.
        lefts.sort_unstable_by(|a, b| b.cmp(a));
        let standing = lefts[needed - 1];
        let valid_for = (standing != u64::MAX).then(|| {
            let standing = Duration::from_millis(standing);
            standing.saturating_sub(drift(standing, drift_factor))
        });
        holders.push(Holder {
            kind,
            description: description_of(value).map(str::to_owned),
            valid_for,
            nodes: lefts.len(),
            value: value.to_owned(),
        });
    }
    let free = answered
        .iter()
        .filter(|node| node.kind == NodeKind::None)
        .count()
        >= needed;
    Holding {
        resource: resource.to_owned(),
        holders,
        free,
        counter: answered.iter().filter_map(|node| node.counter).max(),
        counter_known: true,
        waiters: answered.iter().map(|node| node.waiters).max().unwrap_or(0),
        seen,
        answered: answered.len(),
        nodes: answers.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANDOM: &str = "0123456789abcdef0123456789abcdef";

    fn exclusive(value: &str, left: u64) -> Option<NodeHolding> {
        Some(NodeHolding {
            kind: NodeKind::Exclusive,
            entries: vec![(value.to_owned(), Some(left))],
            counter: Some(7),
            waiters: 1,
        })
    }

    fn free() -> Option<NodeHolding> {
        Some(NodeHolding {
            kind: NodeKind::None,
            entries: vec![],
            counter: None,
            waiters: 0,
        })
    }

    #[test]
    fn a_description_rides_after_the_random_part() {
        let value = described(RANDOM, "host-a pid 42: nightly");
        assert_eq!(description_of(&value), Some("host-a pid 42: nightly"));
        assert_eq!(description_of(RANDOM), None);
        assert_eq!(description_of("short:thing"), None);
        // Not ours: the first 32 characters are not hex digits.
        assert_eq!(description_of("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz:x"), None);
        // A multi-byte character across the cut is no description.
        assert_eq!(description_of(&format!("{}é:x", &RANDOM[..31])), None);
        assert_eq!(description_of(&described(RANDOM, "")), Some(""));
    }

    #[test]
    fn descriptions_are_bounded_and_printable() {
        assert!(check_description("host-a pid 42").is_ok());
        assert!(check_description(&"x".repeat(MAX_HOLDER_LEN)).is_ok());
        let long = check_description(&"x".repeat(MAX_HOLDER_LEN + 1)).unwrap_err();
        assert!(long.to_string().contains("257 bytes"), "{long}");
        let control = check_description("a\nb").unwrap_err();
        assert!(
            control.to_string().contains("control character"),
            "{control}"
        );
    }

    #[test]
    fn a_holder_counts_where_a_quorum_stores_it() {
        let a = described(RANDOM, "a");
        let holding = combine(
            "r",
            &[
                exclusive(&a, 9000),
                exclusive(&a, 8000),
                exclusive(&a, 7000),
                free(),
                None,
            ],
            0.01,
        );
        assert_eq!(holding.holders.len(), 1, "{holding:?}");
        let holder = &holding.holders[0];
        assert_eq!(holder.description.as_deref(), Some("a"));
        assert_eq!(holder.nodes, 3);
        // The 3rd longest time left (7000) minus drift (70 + 2).
        assert_eq!(holder.valid_for, Some(Duration::from_millis(6928)));
        assert!(!holding.free);
        assert_eq!(holding.counter, Some(7));
        assert_eq!(holding.waiters, 1);
        assert_eq!((holding.answered, holding.nodes), (4, 5));
        assert_eq!(holding.exclusive(), Some(holder));
    }

    #[test]
    fn a_minority_holds_nothing_and_split_is_neither() {
        let minority = combine("r", &[exclusive("a", 5000), free(), free()], 0.01);
        assert!(minority.holders.is_empty() && minority.free, "{minority:?}");
        let split = combine(
            "r",
            &[
                exclusive("a", 5000),
                exclusive("b", 5000),
                free(),
                None,
                None,
            ],
            0.01,
        );
        assert!(split.holders.is_empty() && !split.free, "{split:?}");
    }

    #[test]
    fn every_reader_a_quorum_stores_is_reported() {
        let readers = |names: &[&str]| {
            Some(NodeHolding {
                kind: NodeKind::Readers,
                entries: names
                    .iter()
                    .map(|n| ((*n).to_owned(), Some(4000)))
                    .collect(),
                counter: None,
                waiters: 0,
            })
        };
        let holding = combine(
            "r",
            &[readers(&["p", "q"]), readers(&["p", "q"]), readers(&["p"])],
            0.01,
        );
        let mut values: Vec<&str> = holding.holders.iter().map(|h| h.value.as_str()).collect();
        values.sort_unstable();
        assert_eq!(values, ["p", "q"]);
        assert!(holding.holders.iter().all(|h| h.kind == HolderKind::Reader));
        assert_eq!(holding.exclusive(), None);
    }

    #[test]
    fn a_key_without_expiry_has_no_validity() {
        let forever = Some(NodeHolding {
            kind: NodeKind::Exclusive,
            entries: vec![("a".into(), None)],
            counter: None,
            waiters: 0,
        });
        let holding = combine("r", &[forever.clone(), forever, free()], 0.01);
        assert_eq!(holding.holders[0].valid_for, None);
    }

    #[test]
    fn replies_are_read_and_odd_ones_refused() {
        let reply = Value::Array(vec![
            Value::BulkString(b"r".to_vec()),
            Value::Array(vec![
                Value::BulkString(b"p".to_vec()),
                Value::Int(1500),
                Value::BulkString(b"q".to_vec()),
                Value::Int(-1),
            ]),
            Value::BulkString(b"42".to_vec()),
            Value::Int(3),
        ]);
        assert_eq!(
            NodeHolding::from_reply(&reply),
            Some(NodeHolding {
                kind: NodeKind::Readers,
                entries: vec![("p".into(), Some(1500)), ("q".into(), None)],
                counter: Some(42),
                waiters: 3,
            })
        );
        assert_eq!(NodeHolding::from_reply(&Value::Int(1)), None);
        assert_eq!(NodeHolding::from_reply(&Value::Array(vec![])), None);
    }
}
