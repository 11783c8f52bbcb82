//! What a lock holds on a node: the names of its keys and channels, for
//! one resource or several, exclusively or as one of many readers.
//!
//! Every lock on a resource uses the same lock key, so exclusive locks,
//! write locks, read locks and multi-resource locks on the same name all
//! exclude each other through it: an exclusive holder stores its value
//! there (a string), readers store one entry each (a sorted set), and a
//! plain `SET NX` fails on either.

use crate::error::{Error, Result};

/// Prefix of every lock key on the nodes.
pub const KEY_PREFIX: &str = "quorumlock:lock:";
/// Prefix of every fencing counter key on the nodes.
pub const FENCE_KEY_PREFIX: &str = "quorumlock:fence:";
/// Prefix of every waiter queue key (a sorted set of waiter ids by ticket).
pub const WAITERS_KEY_PREFIX: &str = "quorumlock:waiters:";
/// Prefix of every waiter lease key (a sorted set of waiter ids by the node
/// time at which each entry dies unless renewed).
pub const WAITER_LEASES_KEY_PREFIX: &str = "quorumlock:waiter-leases:";
/// Prefix of every key listing a resource's waiting writers (exclusive
/// waiters, by ticket): while one is live, new readers are refused.
pub const WAITING_WRITERS_KEY_PREFIX: &str = "quorumlock:waiting-writers:";
/// Prefix of every wake-up channel: a release that frees the lock on a
/// node publishes the id of the first waiter queued there on
/// `quorumlock:wake:<resource>` (and, when that one waits to read, of the
/// readers right behind it).
pub const WAKE_CHANNEL_PREFIX: &str = "quorumlock:wake:";

/// Most resources one lock may take at once: each costs five keys in every
/// request, and a node runs one request at a time.
pub const MAX_RESOURCES: usize = 128;

/// The Redis key that holds the lock on `resource`, on every node: the
/// exclusive holder's value (a string), or the read lock's readers (a
/// sorted set of their values, scored by when each expires, in node
/// milliseconds).
///
/// ```
/// assert_eq!(quorumlock::internals::lock_key("invoice:7"), "quorumlock:lock:invoice:7");
/// ```
pub fn lock_key(resource: &str) -> String {
    [KEY_PREFIX, resource].concat()
}

/// The Redis key that holds `resource`'s fencing counter on the nodes. It has
/// no TTL: the counter must outlive every lock on the resource.
///
/// ```
/// assert_eq!(quorumlock::internals::fence_key("invoice:7"), "quorumlock:fence:invoice:7");
/// ```
pub fn fence_key(resource: &str) -> String {
    [FENCE_KEY_PREFIX, resource].concat()
}

/// The pub/sub channel on which releases of `resource` wake its waiters.
///
/// ```
/// assert_eq!(quorumlock::internals::wake_channel("invoice:7"), "quorumlock:wake:invoice:7");
/// ```
pub fn wake_channel(resource: &str) -> String {
    [WAKE_CHANNEL_PREFIX, resource].concat()
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

/// The keys of one resource on a node, and its wake-up channel: the
/// resource's name behind each prefix, all in one string (one allocation
/// per resource rather than six, for every lock taken).
#[derive(Debug)]
pub(crate) struct ResourceKeys {
    /// The six names, one after another, in the order of [`PREFIXES`].
    names: String,
    /// Where each name ends in `names`.
    ends: [usize; 6],
}

/// The prefixes of a resource's keys and channel, in the order
/// [`ResourceKeys`] keeps them.
const PREFIXES: [&str; 6] = [
    KEY_PREFIX,
    FENCE_KEY_PREFIX,
    WAITERS_KEY_PREFIX,
    WAITER_LEASES_KEY_PREFIX,
    WAITING_WRITERS_KEY_PREFIX,
    WAKE_CHANNEL_PREFIX,
];

impl ResourceKeys {
    fn of(resource: &str) -> Self {
        let length = PREFIXES.iter().map(|p| p.len() + resource.len()).sum();
        let mut names = String::with_capacity(length);
        let mut ends = [0; 6];
        for (end, prefix) in ends.iter_mut().zip(PREFIXES) {
            names.push_str(prefix);
            names.push_str(resource);
            *end = names.len();
        }
        Self { names, ends }
    }

    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.names[start..self.ends[i]]
    }

    /// The resource's name (its lock key without the prefix).
    pub(crate) fn name(&self) -> &str {
        &self.lock()[KEY_PREFIX.len()..]
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
    /// `[a, b]` for a lock on several resources (see [`Keys::label`]).
    many_label: Option<String>,
}

impl Keys {
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

pub(crate) fn check_resource(resource: &str) -> Result<()> {
    if resource.is_empty() {
        return Err(Error::InvalidArgument {
            argument: "resource",
            reason: "the resource name is empty; name what the lock protects, e.g. \"order:123\""
                .into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resources_keys_are_its_name_behind_each_prefix() {
        let keys = ResourceKeys::of("invoice:7");
        assert_eq!(keys.name(), "invoice:7");
        assert_eq!(keys.lock(), lock_key("invoice:7"));
        assert_eq!(keys.fence(), fence_key("invoice:7"));
        assert_eq!(keys.waiters(), "quorumlock:waiters:invoice:7");
        assert_eq!(keys.waiter_leases(), "quorumlock:waiter-leases:invoice:7");
        assert_eq!(
            keys.waiting_writers(),
            "quorumlock:waiting-writers:invoice:7"
        );
        assert_eq!(keys.channel(), wake_channel("invoice:7"));
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
        for bad in [vec![], vec!["a", "b", "a"], vec!["a", ""]] {
            let error = Keys::exclusive_many(&bad).expect_err("invalid");
            assert!(
                matches!(error, Error::InvalidArgument { .. }),
                "{bad:?}: {error}"
            );
        }
        let too_many: Vec<String> = (0..=MAX_RESOURCES).map(|i| i.to_string()).collect();
        assert!(Keys::exclusive_many(&too_many).is_err());
        assert!(Keys::shared("r").expect("valid").simple().is_none());
        let named = keys.bad_counter("holds \"x\", not a decimal integer (in quorumlock:fence:b)");
        assert_eq!(
            named,
            (
                "quorumlock:fence:b".to_owned(),
                "holds \"x\", not a decimal integer".to_owned()
            )
        );
    }
}
