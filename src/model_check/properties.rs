//! The properties checked on every state the search reaches (those a step
//! breaks by itself, token order and overlong writes, are reported by the
//! step: see `world.rs` and `redis.rs`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

use crate::guard::judge::{DATA_SET_KEY, DATA_SET_SEQ_KEY};
use crate::keys::{Access, KeyKind, parse_key};

use super::client::{Act, ValueId};
use super::hashing::{Digested, Fold, digest};
use super::world::{Model, Step, World, describe_keys};

/// (1) No two clients hold conflicting locks that both still believe
/// valid: per resource, writer against writer or reader (a lock on two
/// resources conflicts on each).
pub(super) fn exclusion(world: &World, model: &Model) -> Option<String> {
    let now = world.now_ms();
    let mut held: Vec<(usize, &'static str, Access, ValueId)> = Vec::new();
    for (c, client) in world.clients.iter().enumerate() {
        if client.crashed {
            continue;
        }
        for hold in client.holds.iter().filter(|h| h.is_valid(now)) {
            let (resources, access, _) = model.lock_of(c, hold.intent);
            for &r in resources {
                held.push((c, r, access, hold.value));
            }
        }
    }
    for (i, a) in held.iter().enumerate() {
        for b in &held[i + 1..] {
            if a.0 != b.0 && a.1 == b.1 && (a.2 == Access::Exclusive || b.2 == Access::Exclusive) {
                return Some(format!(
                    "two valid holders of {}: {} as {} ({:?}) and {} as {} ({:?})",
                    a.1,
                    model.name(a.0),
                    a.3.text(),
                    a.2,
                    model.name(b.0),
                    b.3.text(),
                    b.2
                ));
            }
        }
    }
    None
}

/// (4), the state's part: every key a lock or a queue writes expires (the
/// writes themselves are checked against their limits as they run).
pub(super) fn keys_expire(world: &World) -> Option<String> {
    for (n, node) in world.nodes.iter().enumerate() {
        for (key, entry) in node.keys.keys().iter() {
            let lasting =
                is_kind(key, KeyKind::Fence) || key == DATA_SET_KEY || key == DATA_SET_SEQ_KEY;
            if !lasting && entry.expires_at.is_none() {
                return Some(format!("n{n} keeps {key} without an expiry"));
            }
        }
    }
    None
}

/// (5) No lost wake-up, in a scenario without timers: at a state where
/// nothing more can happen, no client still waits (a ring would have let
/// it try again). Unless a waiter ran out of the attempts the bounds allow:
/// the library's would try again, and those behind it wait for it.
pub(super) fn woken(world: &World, model: &Model) -> Option<String> {
    if model.scenario.timers {
        return None;
    }
    let waiting: Vec<usize> = (0..world.clients.len())
        .filter(|&c| world.clients[c].is_waiting())
        .collect();
    let bounded = waiting
        .iter()
        .any(|&c| world.clients[c].attempts >= model.scenario.max_attempts);
    if bounded {
        return None;
    }
    let stuck: Vec<String> = waiting
        .into_iter()
        .map(|c| {
            let wait = world.clients[c].wait().map_or(0, |w| w.waiter);
            format!("{} (w{wait})", model.name(c))
        })
        .collect();
    if stuck.is_empty() {
        return None;
    }
    let now = world.now_ms();
    let mut text = format!(
        "lost wake-up: nothing more can happen, and {} still wait{} unrung:",
        stuck.join(" and "),
        if stuck.len() == 1 { "s" } else { "" }
    );
    for (n, node) in world.nodes.iter().enumerate() {
        text.push_str(&format!(
            "\n    n{n}: {}",
            describe_keys(node.keys.keys(), now)
        ));
    }
    Some(text)
}

/// The answers of the deadlock check, by state.
#[derive(Default)]
pub(super) struct Progress {
    memo: HashMap<u128, Option<String>, Digested>,
    /// Frozen searches run, and the states they visited.
    pub(super) searches: usize,
    pub(super) visited: usize,
    /// Deadlock checks judged at the end of a quarantine.
    pub(super) after_quarantine: usize,
}

/// Macro steps the frozen search takes at most, and states it visits: a
/// state from which no waiter is granted within them counts as a deadlock
/// (two waiters need a few rounds each; the bound is well above that).
const FROZEN_DEPTH: usize = 8;
const FROZEN_STATES: usize = 5_000;

/// (3) No deadlock. Checked at quiescent states (no request in flight, no
/// round open, nobody paused, every node up) that have waiters, as they
/// stand once every quarantine has ended (time moves on to that end, keys
/// expire, nothing else happens): either every waiter is blocked by a
/// valid lock of a client that is not itself waiting, or some waiter can
/// be granted in a frozen world (see [`frozen_progress`]).
pub(super) fn deadlock(world: &World, model: &Model, progress: &mut Progress) -> Option<String> {
    let quiescent = !world.in_flight()
        && world.nodes.iter().all(|n| n.up)
        && world.clients.iter().all(|c| {
            !c.paused
                && !matches!(c.act, Act::Attempt(_))
                && c.holds.iter().all(|h| h.extending.is_none())
        });
    if !quiescent {
        return None;
    }
    let waiters: Vec<usize> = (0..world.clients.len())
        .filter(|&c| world.clients[c].is_waiting())
        .collect();
    if waiters.is_empty() {
        return None;
    }
    // A quarantined node counts again once its window ends: the world is
    // judged as it stands then (the locks valid now may have expired by
    // then, and their keys with them).
    let quarantine_ends = world
        .clients
        .iter()
        .filter(|c| !c.crashed)
        .flat_map(|c| c.guards.iter().map(|g| g.quarantined_until()))
        .max()
        .filter(|&end| end > world.now_ms());
    match quarantine_ends {
        // Until its settings change: unavailable, not deadlocked.
        Some(i64::MAX) => return None,
        Some(end) => {
            progress.after_quarantine += 1;
            return deadlock(&world.after_quarantines(end), model, progress);
        }
        None => {}
    }
    if waiters.iter().all(|&w| blocker(world, model, w).is_some()) {
        return None;
    }
    let key = digest(world);
    if let Some(answer) = progress.memo.get(&key) {
        return answer.clone();
    }
    progress.searches += 1;
    let answer = match frozen_progress(world, model, &mut progress.visited) {
        true => None,
        false => Some(describe_deadlock(world, model, &waiters)),
    };
    progress.memo.insert(key, answer.clone());
    answer
}

/// A client that is not waiting and holds a valid lock that conflicts
/// with waiter `w`'s request: it will release it, or let it expire.
fn blocker(world: &World, model: &Model, w: usize) -> Option<usize> {
    let now = world.now_ms();
    let intent = match &world.clients[w].act {
        Act::Sleep(sleep) => sleep.intent,
        _ => return None,
    };
    let (wanted, access, _) = model.lock_of(w, intent);
    (0..world.clients.len()).find(|&o| {
        let other = &world.clients[o];
        o != w
            && !other.crashed
            && !other.is_waiting()
            && other.holds.iter().any(|h| {
                let (resources, held_as, _) = model.lock_of(o, h.intent);
                h.is_valid(now)
                    && resources.iter().any(|r| wanted.contains(r))
                    && (access == Access::Exclusive || held_as == Access::Exclusive)
            })
    })
}

/// Whether some waiter can be granted from `world` in a frozen world: no
/// time passes, so no live lock expires and no one gives up, and only
/// these macro steps are taken, each run to quiescence:
/// - a waiter makes an attempt (at once, whatever its timer says), alone:
///   its requests and then its rollback run before anything else;
/// - a client that is not waiting releases its locks (it finishes its work);
/// - what belongs to no live party goes: the keys of locks no client holds
///   validly any more (a crashed client's, an expired one's) and the queue
///   entries of waits that ended (as their TTL and lease would).
fn frozen_progress(world: &World, model: &Model, visited: &mut usize) -> bool {
    let mut seen: HashSet<u128, Digested> = HashSet::default();
    let mut queue: VecDeque<(World, usize)> = VecDeque::from([(world.clone(), 0)]);
    seen.insert(frozen_fingerprint(world));
    while let Some((state, depth)) = queue.pop_front() {
        *visited += 1;
        if depth >= FROZEN_DEPTH || seen.len() > FROZEN_STATES {
            continue;
        }
        let mut next_states = Vec::new();
        for c in 0..state.clients.len() {
            let client = &state.clients[c];
            if client.crashed {
                continue;
            }
            if client.is_waiting() && matches!(client.act, Act::Sleep(_)) {
                let mut next = state.clone();
                let started = next.apply(Step::Retry { client: c as u8 }, model, false);
                if started.waiter_won || next.deliver_all(model).waiter_won {
                    return true;
                }
                next_states.push(next);
            } else if !client.is_waiting() && !client.holds.is_empty() {
                let mut next = state.clone();
                next.release_all(model, c);
                next.deliver_all(model);
                next_states.push(next);
            }
        }
        let mut purged = state.clone();
        purge_the_dead(&mut purged);
        next_states.push(purged);
        for next in next_states {
            if seen.insert(frozen_fingerprint(&next)) {
                queue.push_back((next, depth + 1));
            }
        }
    }
    false
}

/// A state as the frozen search tells states apart: the nodes' data, and
/// what each client holds and waits for (not its counters: a refused
/// attempt in a frozen world changes nothing else).
fn frozen_fingerprint(world: &World) -> u128 {
    let mut hasher = Fold::default();
    for node in &world.nodes {
        node.keys.hash(&mut hasher);
    }
    for client in &world.clients {
        for hold in &client.holds {
            (hold.intent, hold.value).hash(&mut hasher);
        }
        client.wait().map(|w| w.waiter).hash(&mut hasher);
        0xffu8.hash(&mut hasher);
    }
    hasher.digest()
}

/// Removes, on every node, the lock entries of no valid lock and the
/// queue entries of no current wait or waiter-won lock.
fn purge_the_dead(world: &mut World) {
    let now = world.now_ms();
    let mut values = HashSet::new();
    let mut waiters = HashSet::new();
    for client in world.clients.iter().filter(|c| !c.crashed) {
        for hold in client.holds.iter().filter(|h| h.is_valid(now)) {
            values.insert(hold.value.text());
            if let Some(w) = hold.waiter {
                waiters.insert(w.to_string());
            }
        }
        if let Some(wait) = client.wait() {
            waiters.insert(wait.waiter.to_string());
        }
    }
    for node in &mut world.nodes {
        node.keys.update(|keys| {
            keys.retain(
                // A key kept for the queue carries its holder's value
                // before "\0" (see holders.lua); "\0" alone holds no one,
                // and the scripts drop it once no live waiter needs it.
                |key, value| {
                    let owner = value.split('\0').next().unwrap_or_default();
                    !is_kind(key, KeyKind::Lock) || owner.is_empty() || values.contains(owner)
                },
                |key, member| {
                    if is_kind(key, KeyKind::Lock) {
                        values.contains(member)
                    } else if queue_key(key) {
                        waiters.contains(member)
                    } else {
                        true
                    }
                },
            )
        });
    }
}

/// A key of a waiter queue (the waiters, their leases, the writers).
fn queue_key(key: &str) -> bool {
    matches!(
        parse_key(key),
        Some((
            KeyKind::Waiters | KeyKind::WaiterLeases | KeyKind::WaitingWriters,
            _
        ))
    )
}

fn is_kind(key: &str, kind: KeyKind) -> bool {
    parse_key(key).is_some_and(|(found, _)| found == kind)
}

fn describe_deadlock(world: &World, model: &Model, waiters: &[usize]) -> String {
    let now = world.now_ms();
    let mut text = String::from(
        "deadlock: no waiter is granted in the frozen world (no time passes; waiters try alone, \
         holders that do not wait release), and not every waiter is blocked by a holder that is \
         not waiting:",
    );
    for &w in waiters {
        let client = &world.clients[w];
        let Act::Sleep(sleep) = &client.act else {
            continue;
        };
        let (resources, access, _) = model.lock_of(w, sleep.intent);
        let holds: Vec<String> = client
            .holds
            .iter()
            .map(|h| format!("{:?}", model.lock_of(w, h.intent).0))
            .collect();
        text.push_str(&format!(
            "\n    {} waits for {:?} ({:?}) as w{}{}",
            model.name(w),
            resources,
            access,
            client.wait().map_or(0, |x| x.waiter),
            if holds.is_empty() {
                String::new()
            } else {
                format!(", holding {}", holds.join(" and "))
            }
        ));
    }
    for (n, node) in world.nodes.iter().enumerate() {
        text.push_str(&format!(
            "\n    n{n}: {}",
            describe_keys(node.keys.keys(), now)
        ));
    }
    text
}
