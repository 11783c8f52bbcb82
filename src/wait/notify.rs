//! Release notifications: one pub/sub connection per node per manager,
//! shared by every resource and every waiter of that manager.
//!
//! A release that leaves a lock free on a node publishes the id of the
//! first waiter in that node's queue on the resource's channel; the hub
//! wakes that waiter, and no other. A channel is subscribed while at least
//! one waiter of the manager waits on its resource. Notifications are a
//! speed-up, never a condition of progress: a waiter also wakes on the
//! bound its refusals gave, so a lost connection or message only makes it
//! wait as long as that bound. When a subscription connection is lost or
//! re-established, every waiter is woken, since a notice may have been
//! missed in between.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::{Notify, mpsc, watch};

use crate::wait::plan::{EVERY_NODE, node_bit};

/// Pause before connecting again after a failed or lost connection.
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_RECONNECT_PAUSE: Duration = Duration::from_secs(2);

/// The subscriptions of one manager.
pub(crate) struct Hub {
    shared: Arc<Shared>,
    /// One per node: the queue of its subscriber task, replaced when that
    /// task is gone (its runtime shut down).
    subscribers: Vec<Mutex<Option<mpsc::UnboundedSender<Command>>>>,
}

struct Shared {
    /// Per node, its name and the servers to subscribe on (a member that
    /// is a Redis Cluster forwards every `PUBLISH` to all its nodes, so any
    /// of the nodes its URL names will do: tried in turn).
    clients: Vec<(String, Vec<redis::Client>)>,
    node_timeout: Duration,
    connect_timeout: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    waiters: HashMap<u64, Arc<Wake>>,
    channels: HashMap<String, Channel>,
    /// Per channel, the registrations that watch it (see [`Hub::watch`]).
    watchers: HashMap<String, Vec<(u64, Arc<Watched>)>>,
}

/// The notice that rings every watcher of a channel, not one waiter: what
/// it watches changed.
pub(crate) const CHANGED: &str = "changed";

/// The notice that the holder named holds for at least the milliseconds
/// after it (`alive:<number>:<ms>:<its lock value>`): every node relays
/// it, and the copies of one notice (one number) arrive at different
/// times; only the first counts, or one slow node would push the end of a
/// leader's validity back by its delay.
pub(crate) const ALIVE: &str = "alive:";

/// What a watcher was told since it last looked.
#[derive(Debug, Default)]
pub(crate) struct Watched {
    /// A change was announced, or a notice may have been missed.
    changed: AtomicBool,
    /// The latest `alive` notice: until when, for which holder, and its
    /// number.
    alive: Mutex<Option<(tokio::time::Instant, String, u64)>>,
}

impl Watched {
    /// Whether a change was announced (or may have been missed) since the
    /// last call.
    pub(crate) fn take_changed(&self) -> bool {
        self.changed.swap(false, Ordering::SeqCst)
    }

    /// The latest `alive` notice: until when, and for which holder.
    pub(crate) fn alive(&self) -> Option<(tokio::time::Instant, String)> {
        self.alive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(until, holder, _)| (*until, holder.clone()))
    }

    /// Takes in the first copy of `alive` notice `number` of `holder`
    /// (holding until `until`): a later copy of it, or an older notice,
    /// says nothing new.
    fn heard_alive(&self, until: tokio::time::Instant, holder: &str, number: u64) {
        let mut latest = self.alive.lock().unwrap_or_else(|e| e.into_inner());
        let news = latest
            .as_ref()
            .is_none_or(|(_, known, seen)| known != holder || number > *seen);
        if news {
            *latest = Some((until, holder.to_owned(), number));
        }
    }
}

/// A subscribed channel: how many waiters use it, and whether every node
/// has confirmed (or failed) the subscription.
struct Channel {
    waiters: usize,
    confirmed: watch::Receiver<bool>,
}

/// A waiter's doorbell, and the nodes that rang it.
pub(crate) struct Wake {
    notify: Notify,
    /// The nodes whose notices rang it since the waiter last forgot them
    /// (see [`node_bit`]).
    rung_by: AtomicU64,
}

impl Wake {
    fn ring(&self, nodes: u64) {
        // The bit before the permit: `rung_by` checks the bits after it is
        // ready for the permit, so no ring is lost in between.
        self.rung_by.fetch_or(nodes, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

enum Command {
    Subscribe(String, Arc<Countdown>),
    Unsubscribe(String),
}

/// Counts down the nodes still to confirm a subscription; the last one
/// opens the channel's `confirmed` gate.
struct Countdown {
    left: AtomicUsize,
    done: watch::Sender<bool>,
}

impl Countdown {
    fn one_done(&self) {
        if self.left.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.done.send_replace(true);
        }
    }
}

impl Drop for Command {
    fn drop(&mut self) {
        // A subscription dropped unsent (the task is gone) counts as
        // failed, so no waiter waits for it.
        if let Command::Subscribe(_, countdown) = self {
            countdown.one_done();
        }
    }
}

/// A waiter's registration on the channels of its resources: rings its
/// doorbell on a notice naming it. Dropping it unregisters the waiter, and
/// unsubscribes each channel of which it was the manager's last waiter.
pub(crate) struct Registration {
    hub: Arc<Shared>,
    subscribers: Vec<Option<mpsc::UnboundedSender<Command>>>,
    channels: Vec<String>,
    waiter: u64,
    wake: Arc<Wake>,
    confirmed: Vec<watch::Receiver<bool>>,
}

impl Hub {
    pub(crate) fn new(
        clients: Vec<(String, Vec<redis::Client>)>,
        node_timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        let subscribers = clients.iter().map(|_| Mutex::new(None)).collect();
        Self {
            shared: Arc::new(Shared {
                clients,
                node_timeout,
                connect_timeout,
                state: Mutex::default(),
            }),
            subscribers,
        }
    }

    /// Whether this manager is subscribed to every one of `channels`.
    pub(crate) fn is_subscribed_to_all<'a>(
        &self,
        mut channels: impl Iterator<Item = &'a str>,
    ) -> bool {
        let state = self.shared.state();
        channels.all(|channel| state.channels.contains_key(channel))
    }

    /// Registers `waiter` on `channels`, subscribing each on every node if
    /// no other waiter of this manager has. Must run on a tokio runtime
    /// (the subscriber tasks are started on it when needed).
    pub(crate) fn register<'a>(
        &self,
        channels: impl Iterator<Item = &'a str>,
        waiter: u64,
    ) -> Registration {
        let wake = Arc::new(Wake {
            notify: Notify::new(),
            rung_by: AtomicU64::new(0),
        });
        let subscribers: Vec<_> = (0..self.subscribers.len())
            .map(|i| self.subscriber(i))
            .collect();
        let mut state = self.shared.state();
        state.waiters.insert(waiter, Arc::clone(&wake));
        let channels: Vec<String> = channels.map(str::to_owned).collect();
        let confirmed = channels
            .iter()
            .map(|channel| state.join(channel, &subscribers))
            .collect();
        drop(state);
        Registration {
            hub: Arc::clone(&self.shared),
            subscribers,
            channels,
            waiter,
            wake,
            confirmed,
        }
    }

    /// Registers a watcher of `channel` (an election's observer): rung by
    /// every [`CHANGED`] and [`ALIVE`] notice on it (which it finds in the
    /// [`Watched`]), not by waiters' notices.
    pub(crate) fn watch(&self, channel: &str) -> (Registration, Arc<Watched>) {
        let id = fastrand::u64(1..);
        let registration = self.register(std::iter::once(channel), id);
        let watched = Arc::new(Watched::default());
        self.shared
            .state()
            .watchers
            .entry(channel.to_owned())
            .or_default()
            .push((id, Arc::clone(&watched)));
        (registration, watched)
    }

    /// The queue of node `index`'s subscriber task, started on the current
    /// runtime if there is none or its runtime has shut down.
    fn subscriber(&self, index: usize) -> Option<mpsc::UnboundedSender<Command>> {
        let mut slot = self.subscribers[index]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = slot.as_ref().filter(|sender| !sender.is_closed()) {
            return Some(sender.clone());
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (sender, commands) = mpsc::unbounded_channel();
        runtime.spawn(subscribe_node(
            Arc::downgrade(&self.shared),
            index,
            commands,
        ));
        *slot = Some(sender.clone());
        Some(sender)
    }
}

fn send(subscriber: Option<&mpsc::UnboundedSender<Command>>, command: Command) {
    if let Some(subscriber) = subscriber {
        // On failure the command is dropped, which counts it as done.
        let _ = subscriber.send(command);
    }
}

impl Registration {
    /// Waits until every node has confirmed (or failed) the channel's
    /// subscription, at most `node_timeout`: after it, a release on a node
    /// that confirmed reaches this waiter. (A node still connecting its
    /// subscription is not waited for: it only costs that node's notices,
    /// and the waiter's timer covers those.)
    pub(crate) async fn subscribed(&mut self) {
        let bound = self.hub.node_timeout;
        let all = futures::future::join_all(self.confirmed.iter_mut().map(|confirmed| async {
            // The reply borrows the channel: dropped at once, not held.
            let _ = confirmed.wait_for(|&done| done).await.is_ok();
        }));
        let _ = tokio::time::timeout(bound, all).await;
    }

    /// Resolves when a notice names this waiter (or a subscription was
    /// re-established). A ring that came while the waiter was busy is kept
    /// for the next call.
    pub(crate) async fn rung(&self) {
        self.wake.notify.notified().await;
    }

    /// Forgets which nodes rang so far: an attempt is about to go out, and
    /// it meets whatever they announced.
    pub(crate) fn forget_rings(&self) {
        self.wake.rung_by.store(0, Ordering::SeqCst);
    }

    /// Resolves once one of `nodes` (see [`node_bit`]) rang this waiter
    /// since [`forget_rings`](Self::forget_rings), at once if one already
    /// did, with every node that rang by then. Rings from other nodes are
    /// kept, and do not end the wait.
    pub(crate) async fn rung_by(&self, nodes: u64) -> u64 {
        loop {
            let notified = self.wake.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Ready for a permit before the bits are read: a ring after
            // the read still ends the `await` below.
            notified.as_mut().enable();
            let rung = self.wake.rung_by.load(Ordering::SeqCst);
            if rung & nodes != 0 {
                return rung;
            }
            notified.await;
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.hub.state();
        state.waiters.remove(&self.waiter);
        for name in &self.channels {
            if let Some(watchers) = state.watchers.get_mut(name) {
                watchers.retain(|(id, _)| *id != self.waiter);
                if watchers.is_empty() {
                    state.watchers.remove(name);
                }
            }
            let last = match state.channels.get_mut(name) {
                Some(channel) => {
                    channel.waiters -= 1;
                    channel.waiters == 0
                }
                None => false,
            };
            if last {
                state.channels.remove(name);
                for subscriber in &self.subscribers {
                    send(subscriber.as_ref(), Command::Unsubscribe(name.clone()));
                }
            }
        }
    }
}

impl State {
    /// Counts one more waiter on `channel`, subscribing it on every node
    /// if it is the first; returns the gate that opens once every node
    /// confirmed (or failed) the subscription. Called under the state lock,
    /// so that subscriptions and unsubscriptions reach each node in the
    /// order they were decided.
    fn join(
        &mut self,
        channel: &str,
        subscribers: &[Option<mpsc::UnboundedSender<Command>>],
    ) -> watch::Receiver<bool> {
        if let Some(subscribed) = self.channels.get_mut(channel) {
            subscribed.waiters += 1;
            return subscribed.confirmed.clone();
        }
        let (done, confirmed) = watch::channel(false);
        let countdown = Arc::new(Countdown {
            left: AtomicUsize::new(subscribers.len()),
            done,
        });
        for subscriber in subscribers {
            send(
                subscriber.as_ref(),
                Command::Subscribe(channel.to_owned(), Arc::clone(&countdown)),
            );
        }
        self.channels.insert(
            channel.to_owned(),
            Channel {
                waiters: 1,
                confirmed: confirmed.clone(),
            },
        );
        confirmed
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rings the waiter a notice names, or every watcher of the channel.
    /// A notice from node `index`.
    fn deliver(&self, index: usize, channel: &str, payload: &[u8]) {
        let alive = payload
            .strip_prefix(ALIVE.as_bytes())
            .and_then(|rest| {
                let mut parts = std::str::from_utf8(rest).ok()?.splitn(3, ':');
                let number = parts.next()?.parse::<u64>().ok()?;
                let ms = parts.next()?.parse::<u64>().ok()?;
                Some((number, ms, parts.next()?))
            })
            .map(|(number, ms, holder)| {
                let until = tokio::time::Instant::now() + Duration::from_millis(ms);
                (until, holder.to_owned(), number)
            });
        if payload == CHANGED.as_bytes() || alive.is_some() {
            let state = self.state();
            for (id, watched) in state.watchers.get(channel).into_iter().flatten() {
                match &alive {
                    Some((until, holder, number)) => watched.heard_alive(*until, holder, *number),
                    None => watched.changed.store(true, Ordering::SeqCst),
                }
                if let Some(wake) = state.waiters.get(id) {
                    wake.ring(node_bit(index));
                }
            }
            return;
        }
        let Some(waiter) = std::str::from_utf8(payload)
            .ok()
            .and_then(|id| id.parse::<u64>().ok())
        else {
            return;
        };
        if let Some(wake) = self.state().waiters.get(&waiter) {
            wake.ring(node_bit(index));
        }
    }

    /// Rings every waiter: a notice may have been missed.
    fn wake_all(&self) {
        let state = self.state();
        for (_, watched) in state.watchers.values().flatten() {
            watched.changed.store(true, Ordering::SeqCst);
        }
        for wake in state.waiters.values() {
            wake.ring(EVERY_NODE);
        }
    }

    fn channels(&self) -> Vec<String> {
        self.state().channels.keys().cloned().collect()
    }
}

/// Node `index`'s subscriber: connects (bounded by `connect_timeout`),
/// subscribes what the manager waits on, follows the queue of
/// (un)subscriptions, and delivers notices; reconnects after a pause when
/// the connection is lost. Ends when the manager is dropped.
async fn subscribe_node(
    hub: Weak<Shared>,
    index: usize,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut pause = RECONNECT_PAUSE;
    let mut connected_before = false;
    // A try failed since the last connection: notices may have been missed
    // by those who registered meanwhile.
    let mut failed = false;
    let mut turn = 0usize;
    loop {
        let Some(shared) = hub.upgrade() else { return };
        let (name, clients) = &shared.clients[index];
        let Some(client) = clients.get(turn % clients.len().max(1)) else {
            return;
        };
        turn = turn.wrapping_add(1);
        let (node_timeout, connect_timeout) = (shared.node_timeout, shared.connect_timeout);
        let connect = tokio::time::timeout(connect_timeout, client.get_async_pubsub()).await;
        let Ok(Ok(pubsub)) = connect else {
            tracing::debug!(node = %name, "subscription connection failed");
            failed = true;
            drop(shared);
            if !idle_for(pause, &mut commands).await {
                return;
            }
            pause = (pause * 2).min(LONGEST_RECONNECT_PAUSE);
            continue;
        };
        let (mut sink, mut stream) = pubsub.split();
        let channels = shared.channels();
        if !channels.is_empty()
            && !matches!(
                tokio::time::timeout(node_timeout, sink.subscribe(&channels)).await,
                Ok(Ok(()))
            )
        {
            // E.g. an ACL without the channel: back off as after a failed
            // connect, not every 100 ms.
            failed = true;
            drop(shared);
            if !idle_for(pause, &mut commands).await {
                return;
            }
            pause = (pause * 2).min(LONGEST_RECONNECT_PAUSE);
            continue;
        }
        pause = RECONNECT_PAUSE;
        if connected_before || failed {
            shared.wake_all();
        }
        connected_before = true;
        failed = false;
        drop(shared);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    None => return,
                    Some(command) => {
                        if !apply(&mut sink, command, node_timeout).await {
                            break;
                        }
                    }
                },
                message = stream.next() => match message {
                    Some(message) => match hub.upgrade() {
                        Some(shared) => shared.deliver(index, message.get_channel_name(), message.get_payload_bytes()),
                        None => return,
                    },
                    None => break,
                },
            }
        }
        tracing::debug!(node = %shared_name(&hub, index), "subscription connection lost");
        match hub.upgrade() {
            Some(shared) => shared.wake_all(),
            None => return,
        }
    }
}

fn shared_name(hub: &Weak<Shared>, index: usize) -> String {
    hub.upgrade()
        .map(|shared| shared.clients[index].0.clone())
        .unwrap_or_default()
}

/// Sends one (un)subscription; false when the connection failed it.
async fn apply(sink: &mut PubSubSink, mut command: Command, timeout: Duration) -> bool {
    let sent = match &mut command {
        Command::Subscribe(channel, _) => {
            tokio::time::timeout(timeout, sink.subscribe(channel.as_str())).await
        }
        Command::Unsubscribe(channel) => {
            tokio::time::timeout(timeout, sink.unsubscribe(channel.as_str())).await
        }
    };
    // Dropping a subscription counts it as confirmed either way.
    drop(command);
    matches!(sent, Ok(Ok(())))
}

/// Waits `pause` while disconnected, dropping the commands that arrive
/// (a subscription is made on reconnect from the manager's list; dropped
/// ones count as failed). False when the manager is gone.
async fn idle_for(pause: Duration, commands: &mut mpsc::UnboundedReceiver<Command>) -> bool {
    let until = tokio::time::Instant::now() + pause;
    loop {
        tokio::select! {
            command = commands.recv() => {
                if command.is_none() {
                    return false;
                }
            }
            () = tokio::time::sleep_until(until) => return true,
        }
    }
}

#[cfg(test)]
mod alive_notices {
    use std::time::Duration;

    use crate::wait::notify::Watched;

    /// Only the first copy of each `alive` notice counts: a copy that a
    /// slow node relays late (or an older notice) must not move the end.
    #[test]
    fn only_the_first_copy_of_a_notice_moves_the_end() {
        let watched = Watched::default();
        let t0 = tokio::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        watched.heard_alive(at(2), "a", 5);
        watched.heard_alive(at(5), "a", 5);
        assert_eq!(
            watched.alive(),
            Some((at(2), "a".to_owned())),
            "a late copy"
        );
        watched.heard_alive(at(4), "a", 4);
        assert_eq!(
            watched.alive(),
            Some((at(2), "a".to_owned())),
            "an older notice"
        );
        watched.heard_alive(at(3), "a", 6);
        assert_eq!(
            watched.alive(),
            Some((at(3), "a".to_owned())),
            "the next notice"
        );
        watched.heard_alive(at(1), "b", 1);
        assert_eq!(
            watched.alive(),
            Some((at(1), "b".to_owned())),
            "another holder"
        );
    }
}

#[cfg(test)]
mod rings {
    use std::time::Duration;

    use crate::wait::notify::{Hub, Registration};
    use crate::wait::plan::node_bit;

    const CHANNEL: &str = "quorumlock:{r}:wake";

    /// Whether `rung_by(nodes)` ends within 50 ms.
    async fn ends(registration: &Registration, nodes: u64) -> bool {
        let bound = Duration::from_millis(50);
        tokio::time::timeout(bound, registration.rung_by(nodes))
            .await
            .is_ok()
    }

    /// A hub without nodes (notices are delivered by hand) and waiter 7's
    /// registration on `CHANNEL`.
    fn waiter() -> (Hub, Registration) {
        let hub = Hub::new(Vec::new(), Duration::from_secs(1), Duration::from_secs(1));
        let registration = hub.register(std::iter::once(CHANNEL), 7);
        (hub, registration)
    }

    /// `rung_by` ends on a ring from one of the nodes asked for, also one
    /// that came before the call (after `forget_rings`), and on nothing
    /// else; a ring before `forget_rings` is forgotten.
    #[tokio::test]
    async fn a_wait_for_news_ends_on_a_ring_from_the_nodes_named() {
        let (hub, registration) = waiter();
        let refused = node_bit(0) | node_bit(2);
        hub.shared.deliver(0, CHANNEL, b"7");
        registration.forget_rings();
        assert!(
            !ends(&registration, refused).await,
            "a ring from before the attempt went out ended the wait"
        );
        hub.shared.deliver(1, CHANNEL, b"7");
        hub.shared.deliver(0, CHANNEL, b"8");
        assert!(
            !ends(&registration, refused).await,
            "a ring from node 1, or one for another waiter, ended the wait"
        );
        hub.shared.deliver(2, CHANNEL, b"7");
        assert!(
            ends(&registration, refused).await,
            "a ring from node 2 that came before the wait was lost"
        );
        assert!(
            ends(&registration, refused).await,
            "node 2's ring was forgotten before the next attempt went out"
        );

        registration.forget_rings();
        let waiting = tokio::spawn(async move { registration.rung_by(refused).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        hub.shared.deliver(0, CHANNEL, b"7");
        let rung = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a ring from node 0 during the wait ended it")
            .expect("the wait did not panic");
        assert_eq!(rung, node_bit(0), "the nodes that rang since the attempt");
    }

    /// A lost subscription connection counts as a ring from every node.
    #[tokio::test]
    async fn a_lost_connection_rings_as_every_node() {
        let (hub, registration) = waiter();
        registration.forget_rings();
        hub.shared.wake_all();
        assert!(
            ends(&registration, node_bit(4)).await,
            "wake_all did not end a wait for node 4's ring"
        );
    }
}
