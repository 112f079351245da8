//! The line of readers waiting on a topic (long-poll), first come first served.

use std::collections::VecDeque;

use tokio::sync::oneshot;

use super::Delivery;

pub(crate) struct Waiter {
    pub id: u64,
    /// Only messages of this partition, if set.
    pub partition: Option<u32>,
    pub max: usize,
    /// The lease its messages get (`None`: the topic's visibility timeout).
    pub visibility_ms: Option<i64>,
    pub tx: oneshot::Sender<Vec<Delivery>>,
}

#[derive(Default)]
pub(crate) struct Waiters {
    next_id: u64,
    line: VecDeque<Waiter>,
    /// Waiters that dispatch passes in progress took out of the line.
    held: usize,
    /// How many times a pass looked for a waiter and found none while other passes held
    /// some: the waiter it needed may have been one of them (see `Broker::dispatch`).
    missed: u64,
}

impl Waiters {
    pub fn len(&self) -> usize {
        self.line.len()
    }

    pub fn is_empty(&self) -> bool {
        self.line.is_empty()
    }

    /// Joins the end of the line; returns the waiter's id.
    pub fn push(&mut self, mut w: Waiter) -> u64 {
        self.next_id += 1;
        w.id = self.next_id;
        self.line.push_back(w);
        self.next_id
    }

    /// Leaves the line (on timeout). O(line length), paid only by a reader that gave up.
    pub fn remove(&mut self, id: u64) -> Option<Waiter> {
        let i = self.line.iter().position(|w| w.id == id)?;
        self.line.remove(i)
    }

    /// First releases `done` waiters the calling pass held and is finished with (served or
    /// gone). Then takes the first waiter in line whose pinned partition is not in `skip`
    /// (unpinned waiters are never skipped) and counts it as held. Readers that left are
    /// dropped on the way. Finding none while passes other than the caller (which holds
    /// `own`) hold some counts a miss, and says so.
    pub fn pop_first_except(
        &mut self,
        skip: &[u32],
        own: usize,
        done: usize,
    ) -> (Option<Waiter>, bool) {
        self.release_held(done);
        let found = if skip.is_empty() {
            std::iter::from_fn(|| self.line.pop_front()).find(|w| !w.tx.is_closed())
        } else {
            self.line
                .iter()
                .position(|w| w.partition.is_none_or(|p| !skip.contains(&p)))
                .and_then(|i| self.line.remove(i))
        };
        let missed = match found {
            Some(_) => {
                self.held += 1;
                false
            }
            None => self.held > own,
        };
        self.missed += u64::from(missed);
        (found, missed)
    }

    /// A pass is done with `n` waiters it held (served, given back or gone).
    pub fn release_held(&mut self, n: usize) {
        self.held = self.held.saturating_sub(n);
    }

    /// The count of misses so far.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Puts waiters that got nothing back at the front, in their original order.
    pub fn restore_front(&mut self, mut ws: Vec<Waiter>) {
        ws.sort_by_key(|w| w.id);
        for w in ws.into_iter().rev() {
            if !w.tx.is_closed() {
                self.line.push_front(w);
            }
        }
    }

    pub fn drain(&mut self) -> impl Iterator<Item = Waiter> + '_ {
        self.line.drain(..)
    }
}
