//! A Redis Cluster's slot map, as a member that is a cluster needs it:
//! which shard master serves a slot, as read from `CLUSTER SLOTS`. Pure:
//! no I/O.

use redis::Value;

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// Who serves which slots: `(first, last, owner)` ranges, sorted, not
/// overlapping.
#[derive(Debug, Clone)]
pub(crate) struct SlotMap<T> {
    ranges: Vec<(u16, u16, T)>,
}

impl<T> SlotMap<T> {
    /// A map of `ranges` (in any order).
    pub(crate) fn new(mut ranges: Vec<(u16, u16, T)>) -> Self {
        ranges.sort_by_key(|&(first, _, _)| first);
        Self { ranges }
    }

    /// The owner of `slot`, if any range holds it.
    pub(crate) fn owner(&self, slot: u16) -> Option<&T> {
        let after = self.ranges.partition_point(|&(first, _, _)| first <= slot);
        let (_, last, owner) = self.ranges.get(after.checked_sub(1)?)?;
        (slot <= *last).then_some(owner)
    }

    /// The ranges, lowest first.
    pub(crate) fn ranges(&self) -> impl Iterator<Item = &(u16, u16, T)> {
        self.ranges.iter()
    }

    /// How many slots have an owner.
    pub(crate) fn served(&self) -> usize {
        self.ranges
            .iter()
            .map(|&(first, last, _)| usize::from(last - first) + 1)
            .sum()
    }
}

impl<T: PartialEq> SlotMap<T> {
    /// The lowest slot `owner` serves.
    pub(crate) fn first_slot_of(&self, owner: &T) -> Option<u16> {
        self.ranges
            .iter()
            .find(|(_, _, o)| o == owner)
            .map(|&(first, _, _)| first)
    }
}

/// The master ranges of a `CLUSTER SLOTS` reply, each with its master's
/// `host:port`. A master announced without an address (an empty or `?`
/// host) is reached at `asked_host`, the host the question went to (what
/// Redis means by it).
pub(crate) fn parse_cluster_slots(
    reply: &Value,
    asked_host: &str,
) -> Result<SlotMap<String>, String> {
    let Value::Array(entries) = reply else {
        return Err(format!("CLUSTER SLOTS answered {reply:?}, not an array"));
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let (first, last, address, _) = shard_entry(entry, asked_host)?;
        ranges.push((first, last, address));
    }
    let map = SlotMap::new(ranges);
    let overlapping = map.ranges.windows(2).any(|pair| pair[1].0 <= pair[0].1);
    if overlapping {
        return Err("CLUSTER SLOTS names overlapping ranges".into());
    }
    Ok(map)
}

/// One entry of a `CLUSTER SLOTS` reply: its range, its master's
/// `host:port`, and how many replicas it lists (Redis leaves out those it
/// holds failed).
fn shard_entry(entry: &Value, asked_host: &str) -> Result<(u16, u16, String, usize), String> {
    let Value::Array(fields) = entry else {
        return Err(format!("a CLUSTER SLOTS entry is {entry:?}, not an array"));
    };
    let (Some(first), Some(last), Some(Value::Array(master))) =
        (fields.first(), fields.get(1), fields.get(2))
    else {
        return Err(format!(
            "a CLUSTER SLOTS entry lacks its range or master: {fields:?}"
        ));
    };
    let (first, last) = (slot_number(first)?, slot_number(last)?);
    if first > last {
        return Err(format!("CLUSTER SLOTS names the range {first}-{last}"));
    }
    let host = match master.first() {
        Some(Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        Some(Value::SimpleString(text)) => text.clone(),
        other => return Err(format!("a master's host is {other:?}")),
    };
    let host = if host.is_empty() || host == "?" {
        asked_host.to_owned()
    } else {
        host
    };
    let port = match master.get(1) {
        Some(Value::Int(port)) => u16::try_from(*port).ok(),
        _ => None,
    }
    .ok_or_else(|| format!("a master's port is {:?}", master.get(1)))?;
    let address = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    Ok((first, last, address, fields.len().saturating_sub(3)))
}

/// How many replicas each master of a `CLUSTER SLOTS` reply has, by
/// `host:port` (as [`parse_cluster_slots`] names them), the fewest over
/// its ranges.
pub(crate) fn replicas_of_masters(
    reply: &Value,
    asked_host: &str,
) -> Result<std::collections::HashMap<String, usize>, String> {
    let Value::Array(entries) = reply else {
        return Err(format!("CLUSTER SLOTS answered {reply:?}, not an array"));
    };
    let mut replicas = std::collections::HashMap::new();
    for entry in entries {
        let (_, _, address, count) = shard_entry(entry, asked_host)?;
        replicas
            .entry(address)
            .and_modify(|known: &mut usize| *known = (*known).min(count))
            .or_insert(count);
    }
    Ok(replicas)
}

#[cfg(any(test, feature = "testkit"))]
/// The master ranges of a `CLUSTER SLOTS` reply as `(first, last,
/// host:port)`, lowest first (a master announced without an address is
/// reached at `asked_host`).
pub fn cluster_masters(reply: &Value, asked_host: &str) -> Result<Vec<(u16, u16, String)>, String> {
    Ok(parse_cluster_slots(reply, asked_host)?
        .ranges
        .into_iter()
        .collect())
}

fn slot_number(value: &Value) -> Result<u16, String> {
    match value {
        Value::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|&slot| slot < SLOTS)
            .ok_or_else(|| format!("{n} is no slot")),
        other => Err(format!("{other:?} is no slot")),
    }
}

/// A hash tag whose keys live in `slot`, for keys that must sit on a
/// given shard (the node guard's data-set mark). The smallest decimal
/// number that hashes there: every slot has one below a few hundred
/// thousand.
pub(crate) fn tag_for_slot(slot: u16) -> String {
    let slot = slot % SLOTS;
    (0u32..)
        .map(|n| n.to_string())
        .find(|tag| crate::keys::slot(tag) == slot)
        .expect("every slot has a decimal tag")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn entry(first: i64, last: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
            Value::Array(vec![bulk(host), Value::Int(port + 100), bulk("replica")]),
        ])
    }

    #[test]
    fn a_slot_map_finds_each_slots_master() {
        let reply = Value::Array(vec![
            entry(5461, 10922, "127.0.0.1", 7002),
            entry(0, 5460, "", 7001),
            entry(10923, 16383, "::1", 7003),
        ]);
        let map = parse_cluster_slots(&reply, "10.0.0.9").expect("parses");
        let owner = |slot| map.owner(slot).map(String::as_str);
        assert_eq!(owner(0), Some("10.0.0.9:7001"));
        assert_eq!(owner(5460), Some("10.0.0.9:7001"));
        assert_eq!(owner(5461), Some("127.0.0.1:7002"));
        assert_eq!(owner(16383), Some("[::1]:7003"));
        assert_eq!(map.served(), 16384);
        assert_eq!(map.first_slot_of(&"127.0.0.1:7002".to_owned()), Some(5461));
    }

    #[test]
    fn replicas_are_counted_per_master_the_fewest_over_its_ranges() {
        let bare = |first, last, port| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]),
            ])
        };
        let two = Value::Array(vec![
            Value::Int(100),
            Value::Int(200),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id")]),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7103), bulk("r1")]),
            Value::Array(vec![bulk("127.0.0.1"), Value::Int(7203), bulk("r2")]),
        ]);
        let reply = Value::Array(vec![
            entry(0, 99, "127.0.0.1", 7001),
            bare(201, 300, 7002),
            two,
            // A second range of 7003 that lists one replica only.
            entry(301, 400, "127.0.0.1", 7003),
        ]);
        let replicas = replicas_of_masters(&reply, "127.0.0.1").expect("parses");
        assert_eq!(replicas.get("127.0.0.1:7001"), Some(&1));
        assert_eq!(replicas.get("127.0.0.1:7002"), Some(&0));
        assert_eq!(replicas.get("127.0.0.1:7003"), Some(&1));
    }

    #[test]
    fn unserved_slots_have_no_owner() {
        let map = SlotMap::new(vec![(10, 20, 'a'), (30, 30, 'b')]);
        for (slot, expected) in [(0, None), (10, Some('a')), (20, Some('a')), (21, None)] {
            assert_eq!(map.owner(slot).copied(), expected, "slot {slot}");
        }
        assert_eq!(map.owner(30), Some(&'b'));
        assert_eq!(map.owner(31), None);
        assert_eq!(map.served(), 12);
    }

    #[test]
    fn malformed_replies_are_errors_that_say_what_came() {
        let bad = [
            Value::Nil,
            Value::Array(vec![Value::Nil]),
            Value::Array(vec![entry(10, 5, "h", 1)]),
            Value::Array(vec![entry(0, 16384, "h", 1)]),
            Value::Array(vec![entry(0, 10, "h", 70000)]),
            Value::Array(vec![entry(0, 10, "h", 1), entry(10, 20, "h", 2)]),
        ];
        for reply in bad {
            assert!(
                parse_cluster_slots(&reply, "h").is_err(),
                "accepted {reply:?}"
            );
        }
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_there() {
        for slot in [0, 1, 5460, 8000, 16383] {
            let tag = tag_for_slot(slot);
            assert_eq!(crate::keys::slot(&format!("x:{{{tag}}}:y")), slot);
        }
    }
}
