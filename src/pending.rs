//! [`Pending`]: a round's requests, one slot per node, polled together in
//! one allocation.
//!
//! `FuturesUnordered` costs two allocations per set and one per future,
//! and gives each future its own waker. A round has a handful of requests
//! (one per node), every lock sends two rounds, and polling five futures
//! that are not ready is cheaper than those allocations: so every wake
//! polls every unfinished slot.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

/// Futures in fixed slots, each polled until it finishes; yields the slot
/// and output of each as it does.
pub(crate) struct Pending<F> {
    /// Pinned in place: a slot's future never moves, and is dropped in
    /// place (set to `None`) when it finishes or the set is cleared.
    slots: Pin<Box<[Option<F>]>>,
    /// Unfinished futures.
    left: usize,
    /// Where the next scan starts, so no slot is always polled first.
    next: usize,
}

impl<F: Future> Pending<F> {
    /// A set of `slots`, `None` where there is no future.
    pub(crate) fn new(slots: impl IntoIterator<Item = Option<F>>) -> Self {
        let slots: Box<[Option<F>]> = slots.into_iter().collect();
        let left = slots.iter().filter(|slot| slot.is_some()).count();
        Self {
            slots: Box::into_pin(slots),
            left,
            next: 0,
        }
    }

    /// Whether every future has finished (or was cleared).
    pub(crate) fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// Drops every unfinished future.
    pub(crate) fn clear(&mut self) {
        for i in 0..self.slots.len() {
            self.slot(i).set(None);
        }
        self.left = 0;
    }

    fn slot(&mut self, i: usize) -> Pin<&mut Option<F>> {
        // SAFETY: the slot is part of the pinned box and is never moved
        // out of it; it is only polled or dropped in place through this
        // pin.
        unsafe { self.slots.as_mut().map_unchecked_mut(|slots| &mut slots[i]) }
    }
}

impl<F: Future> Stream for Pending<F> {
    type Item = (usize, F::Output);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // `Pending` is `Unpin` (its futures are pinned in their own box).
        let this = self.get_mut();
        if this.left == 0 {
            return Poll::Ready(None);
        }
        let count = this.slots.len();
        for step in 0..count {
            let i = (this.next + step) % count;
            let mut slot = this.slot(i);
            let Some(future) = slot.as_mut().as_pin_mut() else {
                continue;
            };
            if let Poll::Ready(output) = future.poll(cx) {
                slot.set(None);
                this.left -= 1;
                this.next = (i + 1) % count;
                return Poll::Ready(Some((i, output)));
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use futures::future::{FutureExt, poll_fn};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A future that is ready on its `polls`-th poll, waking itself until then.
    fn ready_after(polls: usize, value: u32) -> impl Future<Output = u32> {
        let mut seen = 0;
        poll_fn(move |cx| {
            seen += 1;
            if seen >= polls {
                Poll::Ready(value)
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
    }

    #[tokio::test]
    async fn yields_every_output_with_its_slot() {
        let pending = Pending::new([
            Some(ready_after(3, 30).boxed()),
            None,
            Some(ready_after(1, 10).boxed()),
            Some(ready_after(2, 20).boxed()),
        ]);
        assert!(!pending.is_empty());
        let mut seen: Vec<(usize, u32)> = pending.collect().await;
        seen.sort();
        assert_eq!(seen, vec![(0, 30), (2, 10), (3, 20)]);
    }

    #[tokio::test]
    async fn an_empty_set_ends_at_once() {
        let mut pending = Pending::new([None::<std::future::Ready<u32>>, None]);
        assert!(pending.is_empty());
        assert_eq!(pending.next().await, None);
    }

    #[test]
    fn clearing_drops_unfinished_futures_in_place() {
        struct Counted(Arc<AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let never = |dropped: &Arc<AtomicUsize>| {
            let guard = Counted(Arc::clone(dropped));
            async move {
                let _guard = guard;
                std::future::pending::<u32>().await
            }
        };
        let mut pending = Pending::new([Some(never(&dropped)), Some(never(&dropped))]);
        assert_eq!(pending.next().now_or_never(), None, "nothing is ready");
        pending.clear();
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
        assert!(pending.is_empty());
        assert_eq!(pending.next().now_or_never(), Some(None));
    }
}
