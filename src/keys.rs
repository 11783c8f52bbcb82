//! What a lock holds on a node: the names of its keys and channels, for
//! one resource or several, exclusively or as one of many readers.
//!
//! Every lock on a resource uses the same lock key, so exclusive locks,
//! write locks, read locks and multi-resource locks on the same name all
//! exclude each other through it: an exclusive holder stores its value
//! there (a string), readers store one entry each (a sorted set), and a
//! plain `SET NX` fails on either.

use crate::error::{Error, Result};
use crate::fencing::FenceCounters;

/// What each of a resource's keys (and its channel) is for, with the word
/// that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// The lock: the exclusive holder's value, or the readers.
    Lock,
    /// The fencing counter (the counter node's expires an hour after its
    /// last token: see `fencing::COUNTER_LIFE`).
    Fence,
    /// The waiter queue (a sorted set of waiter ids by ticket).
    Waiters,
    /// The waiters' leases (a sorted set of waiter ids by the node time
    /// at which each entry dies unless renewed).
    WaiterLeases,
    /// The exclusive waiters, by ticket: while one is live, new readers are
    /// refused.
    WaitingWriters,
    /// The pub/sub channel on which a release wakes the first waiter.
    Wake,
}

impl KeyKind {
    /// Every kind, in the order of a resource's names.
    pub const ALL: [KeyKind; 6] = [
        KeyKind::Lock,
        KeyKind::Fence,
        KeyKind::Waiters,
        KeyKind::WaiterLeases,
        KeyKind::WaitingWriters,
        KeyKind::Wake,
    ];

    /// The word in the key's name.
    pub fn word(self) -> &'static str {
        match self {
            KeyKind::Lock => "lock",
            KeyKind::Fence => "fence",
            KeyKind::Waiters => "waiters",
            KeyKind::WaiterLeases => "waiter-leases",
            KeyKind::WaitingWriters => "waiting-writers",
            KeyKind::Wake => "wake",
        }
    }
}

/// What every key and channel name of this crate starts with.
pub const NAMESPACE: &str = "quorumlock:";

/// The hash tag Redis Cluster hashes `name` by: the text between its first
/// `{` and the first `}` after it, when that is not empty.
pub fn hash_tag(name: &str) -> Option<&str> {
    let open = name.find('{')?;
    let rest = &name[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// The name of `resource`'s key (or channel) of `kind`. Every name of a
/// resource carries one hash tag, so that they all live in one Redis
/// Cluster slot and one script can use them together: the resource's own
/// `{…}` tag when it has one (`quorumlock:lock:user:{42}:cart`), otherwise
/// the whole name in braces (`quorumlock:{invoice:7}:lock`). Different
/// resources (and kinds) never share a name.
pub fn key_of(kind: KeyKind, resource: &str) -> String {
    let mut name = String::with_capacity(NAMESPACE.len() + resource.len() + 20);
    push_key(&mut name, kind, resource, hash_tag(resource).is_some());
    name
}

/// Appends `resource`'s name of `kind`; `tagged`: the resource has its own
/// hash tag.
fn push_key(out: &mut String, kind: KeyKind, resource: &str, tagged: bool) {
    out.push_str(NAMESPACE);
    if tagged {
        out.push_str(kind.word());
        out.push(':');
        out.push_str(resource);
    } else {
        out.push('{');
        out.push_str(resource);
        out.push_str("}:");
        out.push_str(kind.word());
    }
}

#[cfg(any(test, feature = "testkit"))]
/// The kind of a key (or channel) name of this crate, and its resource;
/// `None` for other names (the node guard's mark, data keys).
pub fn parse_key(name: &str) -> Option<(KeyKind, &str)> {
    let rest = name.strip_prefix(NAMESPACE)?;
    if let Some(tagged) = rest.strip_prefix('{') {
        for kind in KeyKind::ALL {
            if let Some(resource) = tagged
                .strip_suffix(kind.word())
                .and_then(|r| r.strip_suffix("}:"))
                && hash_tag(resource).is_none()
                && !resource.is_empty()
            {
                return Some((kind, resource));
            }
        }
        return None;
    }
    for kind in KeyKind::ALL {
        if let Some(resource) = rest
            .strip_prefix(kind.word())
            .and_then(|r| r.strip_prefix(':'))
            && hash_tag(resource).is_some()
        {
            return Some((kind, resource));
        }
    }
    None
}

#[cfg(any(test, feature = "testkit"))]
/// Whether `key` is a lock or waiter key of the layout before hash tags
/// (`quorumlock:lock:<name>`, `quorumlock:waiters:<name>`, … for a name
/// without a `{…}` tag): an older quorumlock's client holds or waits for
/// that lock, and it and this version do not exclude each other on such
/// names (an upgrade waits until none is left). Old fencing counters do
/// not count: they outlive every client.
pub fn is_old_layout_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix(NAMESPACE) else {
        return false;
    };
    [
        KeyKind::Lock,
        KeyKind::Waiters,
        KeyKind::WaiterLeases,
        KeyKind::WaitingWriters,
    ]
    .iter()
    .filter_map(|kind| rest.strip_prefix(kind.word())?.strip_prefix(':'))
    .any(|name| !name.is_empty() && hash_tag(name).is_none())
}

/// The Redis Cluster slot of a key (or channel) name: CRC16 (XMODEM) of its
/// hash tag, or of the whole name, modulo 16384.
pub fn slot(name: &str) -> u16 {
    let hashed = hash_tag(name).unwrap_or(name);
    crc16(hashed.as_bytes()) % 16384
}

/// CRC16-CCITT (XMODEM), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Most resources one lock may take at once: each costs five keys in every
/// request, and a node runs one request at a time.
pub const MAX_RESOURCES: usize = 128;

#[cfg(any(test, feature = "testkit"))]
/// The Redis key that holds the lock on `resource`, on every node: the
/// exclusive holder's value (a string), or the read lock's readers (a
/// sorted set of their values, scored by when each expires, in node
/// milliseconds). See [`key_of`] for the layout.
///
/// ```
/// use quorumlock::internals::lock_key;
///
/// assert_eq!(lock_key("invoice:7"), "quorumlock:{invoice:7}:lock");
/// // A name with its own hash tag keeps it: its keys share that slot.
/// assert_eq!(lock_key("user:{42}:cart"), "quorumlock:lock:user:{42}:cart");
/// ```
pub fn lock_key(resource: &str) -> String {
    key_of(KeyKind::Lock, resource)
}

#[cfg(any(test, feature = "testkit"))]
/// The Redis key that holds `resource`'s fencing counter on the nodes. The
/// counter node's expires an hour after its last token (later tokens come
/// from its clock, above it; see `COUNTER_LIFE`); a stored token's is kept.
///
/// ```
/// assert_eq!(quorumlock::internals::fence_key("invoice:7"), "quorumlock:{invoice:7}:fence");
/// ```
pub fn fence_key(resource: &str) -> String {
    key_of(KeyKind::Fence, resource)
}

#[cfg(any(test, feature = "testkit"))]
/// The pub/sub channel on which releases of `resource` wake its waiters.
///
/// ```
/// assert_eq!(quorumlock::internals::wake_channel("invoice:7"), "quorumlock:{invoice:7}:wake");
/// ```
pub fn wake_channel(resource: &str) -> String {
    key_of(KeyKind::Wake, resource)
}

/// How a lock holds its resources on the nodes (the public face of this
/// is the lock's [kind](crate::kind)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// One holder at a time: [`lock`](crate::LockManager::lock), the write
    /// side of a read-write lock, and multi-resource locks.
    Exclusive,
    /// Any number of readers, and no exclusive holder:
    /// [`read`](crate::LockManager::read).
    Shared,
}

/// The keys of one resource on a node, its wake-up channel and its name,
/// all in one string (one allocation per resource rather than seven, for
/// every lock taken).
#[derive(Debug)]
pub(crate) struct ResourceKeys {
    /// The six names in the order of [`KeyKind::ALL`], then the resource.
    names: String,
    /// Where each part ends in `names`.
    ends: [usize; 7],
}

impl ResourceKeys {
    pub(crate) fn of(resource: &str) -> Self {
        Self::counted_by(resource, FenceCounters::PerResource)
    }

    /// For a name with a hash tag, the fencing counter the other
    /// [`FenceCounters`] setting uses: what an operator's read also
    /// looks at, in case clients disagree on the setting.
    pub(crate) fn other_counter(&self, counters: FenceCounters) -> Option<String> {
        hash_tag(self.name())?;
        let other = match counters {
            FenceCounters::PerHashTag => FenceCounters::PerResource,
            _ => FenceCounters::PerHashTag,
        };
        Some(
            ResourceKeys::counted_by(self.name(), other)
                .fence()
                .to_owned(),
        )
    }

    /// The keys of `resource`, its fencing counter chosen by `counters`.
    pub(crate) fn counted_by(resource: &str, counters: FenceCounters) -> Self {
        let length = KeyKind::ALL.len() * (NAMESPACE.len() + resource.len() + 18) + resource.len();
        let mut names = String::with_capacity(length);
        let mut ends = [0; 7];
        let tag = hash_tag(resource);
        for (end, kind) in ends.iter_mut().zip(KeyKind::ALL) {
            match (kind, tag, counters) {
                // The tag's counter: the name a resource `{tag}` has.
                (KeyKind::Fence, Some(tag), FenceCounters::PerHashTag) => {
                    names.push_str(NAMESPACE);
                    names.push_str("fence:{");
                    names.push_str(tag);
                    names.push('}');
                }
                _ => push_key(&mut names, kind, resource, tag.is_some()),
            }
            *end = names.len();
        }
        names.push_str(resource);
        ends[6] = names.len();
        Self { names, ends }
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.names[start..self.ends[i]]
    }

    /// The resource's name.
    pub(crate) fn name(&self) -> &str {
        self.part(6)
    }

    /// The lock key: the holder's value, or the readers.
    pub(crate) fn lock(&self) -> &str {
        self.part(0)
    }

    /// The fencing counter.
    pub(crate) fn fence(&self) -> &str {
        self.part(1)
    }

    /// The waiter queue (see `queue.lua`).
    pub(crate) fn waiters(&self) -> &str {
        self.part(2)
    }

    /// The waiters' leases.
    pub(crate) fn waiter_leases(&self) -> &str {
        self.part(3)
    }

    /// The exclusive waiters.
    pub(crate) fn waiting_writers(&self) -> &str {
        self.part(4)
    }

    /// The wake-up channel.
    pub(crate) fn channel(&self) -> &str {
        self.part(5)
    }
}

/// Everything one lock takes: its resources (sorted by name, so that the
/// order a caller gives them in never matters) and how it holds them.
#[derive(Debug)]
pub(crate) struct Keys {
    pub(crate) access: Access,
    pub(crate) resources: Box<[ResourceKeys]>,
    /// For a lock taken `at_least` (see `Request::at_least`): its keys live
    /// at least this long from the acquisition, whatever happens to the
    /// holder, and a release before then leaves them.
    pub(crate) at_least: Option<std::time::Duration>,
    /// The holder's description (see `Request::holder`), stored in the
    /// lock's value after its random part.
    pub(crate) holder: Option<Box<str>>,
    /// `[a, b]` for a lock on several resources (see [`Keys::label`]).
    many_label: Option<String>,
}

impl Keys {
    /// The same keys, with fencing counters chosen by `counters`.
    pub(crate) fn counted_by(mut self, counters: FenceCounters) -> Self {
        if counters != FenceCounters::PerResource {
            for resource in self.resources.iter_mut() {
                *resource = ResourceKeys::counted_by(resource.name(), counters);
            }
        }
        self
    }

    /// An exclusive lock on `resource`.
    pub(crate) fn exclusive(resource: &str) -> Result<Self> {
        check_resource(resource)?;
        Ok(Self::single(resource, Access::Exclusive))
    }

    /// A read lock on `resource`.
    pub(crate) fn shared(resource: &str) -> Result<Self> {
        check_resource(resource)?;
        Ok(Self::single(resource, Access::Shared))
    }

    fn single(resource: &str, access: Access) -> Self {
        Self {
            access,
            resources: Box::new([ResourceKeys::of(resource)]),
            many_label: None,
            at_least: None,
            holder: None,
        }
    }

    /// An exclusive lock on every one of `resources`: at least one, none
    /// empty, no name twice, at most [`MAX_RESOURCES`].
    pub(crate) fn exclusive_many<S: AsRef<str>>(resources: &[S]) -> Result<Self> {
        let mut names: Vec<&str> = resources.iter().map(AsRef::as_ref).collect();
        if names.is_empty() {
            return Err(invalid_resources(
                "the list of resources is empty; name at least one".into(),
            ));
        }
        if names.len() > MAX_RESOURCES {
            return Err(invalid_resources(format!(
                "{} resources in one lock; at most {MAX_RESOURCES} are allowed \
                 (split the work, or lock a coarser resource)",
                names.len()
            )));
        }
        for name in &names {
            check_resource(name)?;
        }
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(invalid_resources(format!(
                "{:?} is named twice; name each resource once",
                pair[0]
            )));
        }
        if let [one] = names.as_slice() {
            return Ok(Self::single(one, Access::Exclusive));
        }
        Ok(Self {
            access: Access::Exclusive,
            many_label: Some(format!("[{}]", names.join(", "))),
            resources: names.into_iter().map(ResourceKeys::of).collect(),
            at_least: None,
            holder: None,
        })
    }

    /// How errors, logs and [`Lock::resource`](crate::Lock::resource) name
    /// the lock: the resource, or `[a, b]` for several.
    pub(crate) fn label(&self) -> &str {
        match &self.many_label {
            Some(label) => label,
            None => self.resources[0].name(),
        }
    }

    /// The Redis Cluster slot all of the lock's keys live in, or `None`
    /// when its resources' hash tags put them in several slots (a lock on
    /// several resources that no member that is a cluster can take).
    pub(crate) fn slot(&self) -> Option<u16> {
        let first = slot(self.resources[0].lock());
        self.resources[1..]
            .iter()
            .all(|resource| slot(resource.lock()) == first)
            .then_some(first)
    }

    /// The one resource of an exclusive single-resource lock: such locks
    /// take the plain `SET NX` fast path.
    pub(crate) fn simple(&self) -> Option<&ResourceKeys> {
        match (&*self.resources, self.access) {
            ([one], Access::Exclusive) => Some(one),
            _ => None,
        }
    }

    /// The fencing counter key a script's counter error is about, and the
    /// problem without the key (a lock on several resources names it as
    /// `… (in <key>)`, see `holders.lua`).
    pub(crate) fn bad_counter(&self, problem: &str) -> (String, String) {
        for resource in &self.resources {
            let named = format!(" (in {})", resource.fence());
            if let Some(problem) = problem.strip_suffix(&named) {
                return (resource.fence().to_owned(), problem.to_owned());
            }
        }
        (self.resources[0].fence().to_owned(), problem.to_owned())
    }
}

fn invalid_resources(reason: String) -> Error {
    Error::InvalidArgument {
        argument: "resources",
        reason,
    }
}

/// The longest resource name, in bytes: a name is part of every key and
/// every line `status` and `list` print.
pub const MAX_RESOURCE_LEN: usize = 1024;

/// Whether `resource` may be a resource's name: not empty, at most
/// [`MAX_RESOURCE_LEN`] bytes, no control character (NUL, a newline, an
/// escape: they would break the lines operators read), and not starting
/// with `}` (see [`key_of`]).
pub fn check_resource(resource: &str) -> Result<()> {
    if resource.is_empty() {
        return Err(Error::InvalidArgument {
            argument: "resource",
            reason: "the resource name is empty; name what the lock protects, e.g. \"order:123\""
                .into(),
        });
    }
    if resource.len() > MAX_RESOURCE_LEN {
        return Err(Error::InvalidArgument {
            argument: "resource",
            reason: format!(
                "the resource name is {} bytes; at most {MAX_RESOURCE_LEN} are allowed: name \
                 what the lock protects, not its contents (a hash of a long name will do)",
                resource.len()
            ),
        });
    }
    if let Some(control) = resource.chars().find(|c| c.is_control()) {
        return Err(Error::InvalidArgument {
            argument: "resource",
            reason: format!(
                "the resource name contains the control character {control:?}, which would \
                 break the lines `status` and `list` print; use printable text"
            ),
        });
    }
    if resource.starts_with('}') {
        // Its keys are `quorumlock:{<name>}:…`: `{}` would be an empty hash
        // tag, and Redis Cluster would spread them over several slots.
        return Err(Error::InvalidArgument {
            argument: "resource",
            reason: format!(
                "{resource:?} starts with `}}`, which would break the hash tag that keeps a \
                 resource's keys in one Redis Cluster slot; put any other character first"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_break_an_operators_lines_are_refused() {
        for bad in ["a\nb", "nul\0", "esc\u{1b}[2J", "c1\u{85}"] {
            let error = check_resource(bad).expect_err(bad);
            assert!(
                error.to_string().contains("control character"),
                "{bad:?}: {error}"
            );
        }
        assert!(check_resource(&"x".repeat(MAX_RESOURCE_LEN)).is_ok());
        let long = check_resource(&"x".repeat(MAX_RESOURCE_LEN + 1)).expect_err("too long");
        assert!(long.to_string().contains("1025 bytes"), "{long}");
        // Any printable text, in any script, stays allowed.
        assert!(check_resource("заказ:42 — 注文").is_ok());
    }

    #[test]
    fn tagged_resources_may_share_their_tags_counter() {
        let shared = ResourceKeys::counted_by("order:{tenant7}:42", FenceCounters::PerHashTag);
        assert_eq!(shared.fence(), "quorumlock:fence:{tenant7}");
        assert_eq!(shared.lock(), "quorumlock:lock:order:{tenant7}:42");
        assert_eq!(shared.name(), "order:{tenant7}:42");
        assert_eq!(slot(shared.fence()), slot(shared.lock()), "one slot");
        assert_eq!(
            parse_key(shared.fence()),
            Some((KeyKind::Fence, "{tenant7}"))
        );
        // No tag: its own counter.
        let own = ResourceKeys::counted_by("invoice:7", FenceCounters::PerHashTag);
        assert_eq!(own.fence(), "quorumlock:{invoice:7}:fence");
        let keys = Keys::exclusive_many(&["{t}:a", "{t}:b"])
            .expect("valid")
            .counted_by(FenceCounters::PerHashTag);
        assert!(
            keys.resources
                .iter()
                .all(|r| r.fence() == "quorumlock:fence:{t}")
        );
    }

    #[test]
    fn a_resources_keys_carry_one_hash_tag() {
        let keys = ResourceKeys::of("invoice:7");
        assert_eq!(keys.name(), "invoice:7");
        assert_eq!(keys.lock(), "quorumlock:{invoice:7}:lock");
        assert_eq!(keys.fence(), "quorumlock:{invoice:7}:fence");
        assert_eq!(keys.waiters(), "quorumlock:{invoice:7}:waiters");
        assert_eq!(keys.waiter_leases(), "quorumlock:{invoice:7}:waiter-leases");
        assert_eq!(
            keys.waiting_writers(),
            "quorumlock:{invoice:7}:waiting-writers"
        );
        assert_eq!(keys.channel(), "quorumlock:{invoice:7}:wake");
        let tagged = ResourceKeys::of("user:{42}:cart");
        assert_eq!(tagged.name(), "user:{42}:cart");
        assert_eq!(tagged.lock(), "quorumlock:lock:user:{42}:cart");
        assert_eq!(tagged.channel(), "quorumlock:wake:user:{42}:cart");
        // The layout before hash tags: `quorumlock:lock:<name>` for every
        // name. Tagged names kept their keys.
        assert!(is_old_layout_key("quorumlock:lock:invoice:7"));
        assert!(is_old_layout_key("quorumlock:waiter-leases:invoice:7"));
        assert!(is_old_layout_key("quorumlock:waiters:invoice:7"));
        for new in [
            keys.lock(),
            keys.waiters(),
            tagged.lock(),
            tagged.waiter_leases(),
        ] {
            assert!(!is_old_layout_key(new), "{new}");
        }
        assert!(!is_old_layout_key("quorumlock:fence:invoice:7"));
        assert!(!is_old_layout_key("quorumlock:node"));
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Values from Redis Cluster's `CLUSTER KEYSLOT`.
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(hash_tag("foo{}{bar}"), None);
        assert_eq!(hash_tag("foo{{bar}}zap"), Some("{bar"));
        assert_eq!(hash_tag("foo{bar}{zap}"), Some("bar"));
    }

    proptest::proptest! {
        /// Every name of a resource lands in one slot (the resource's own
        /// tag's when it has one), names never collide, and each parses
        /// back to its kind and resource.
        #[test]
        fn a_resources_names_share_one_slot_and_parse_back(
            resource in "[a-z{:][a-z{}:]{0,11}",
            other in "[a-z{:][a-z{}:]{0,11}",
        ) {
            let keys = ResourceKeys::of(&resource);
            let names: Vec<&str> = (0..6).map(|i| keys.part(i)).collect();
            let first = slot(names[0]);
            for (name, kind) in names.iter().zip(KeyKind::ALL) {
                proptest::prop_assert_eq!(slot(name), first, "{}", name);
                proptest::prop_assert_eq!(parse_key(name), Some((kind, resource.as_str())));
                proptest::prop_assert_eq!(*name, key_of(kind, &resource));
            }
            if let Some(tag) = hash_tag(&resource) {
                proptest::prop_assert_eq!(first, slot(tag));
            }
            if other != resource {
                for kind in KeyKind::ALL {
                    for again in KeyKind::ALL {
                        proptest::prop_assert_ne!(key_of(kind, &resource), key_of(again, &other));
                    }
                }
            }
        }
    }

    #[test]
    fn many_resources_are_sorted_and_checked() {
        let keys = Keys::exclusive_many(&["b", "a", "c"]).expect("valid");
        let names: Vec<&str> = keys.resources.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(keys.label(), "[a, b, c]");
        assert!(keys.simple().is_none());
        // One resource is an ordinary lock.
        let one = Keys::exclusive_many(&["a"]).expect("valid");
        assert_eq!(one.label(), "a");
        assert!(one.simple().is_some());
        for bad in [vec![], vec!["a", "b", "a"], vec!["a", ""], vec!["}a"]] {
            let error = Keys::exclusive_many(&bad).expect_err("invalid");
            assert!(
                matches!(error, Error::InvalidArgument { .. }),
                "{bad:?}: {error}"
            );
        }
        let too_many: Vec<String> = (0..=MAX_RESOURCES).map(|i| i.to_string()).collect();
        assert!(Keys::exclusive_many(&too_many).is_err());
        assert!(Keys::shared("r").expect("valid").simple().is_none());
        let named =
            keys.bad_counter("holds \"x\", not a decimal integer (in quorumlock:{b}:fence)");
        assert_eq!(
            named,
            (
                "quorumlock:{b}:fence".to_owned(),
                "holds \"x\", not a decimal integer".to_owned()
            )
        );
    }
}
