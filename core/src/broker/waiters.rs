//! The line of readers waiting on a topic (long-poll), first come first served.

use std::collections::VecDeque;

use tokio::sync::oneshot;

use super::Delivery;

pub(crate) struct Waiter {
    pub id: u64,
    /// Only messages of this partition, if set.
    pub partition: Option<u32>,
    pub max: usize,
    pub tx: oneshot::Sender<Vec<Delivery>>,
}

#[derive(Default)]
pub(crate) struct Waiters {
    next_id: u64,
    line: VecDeque<Waiter>,
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

    /// Takes the first waiter in line whose pinned partition is not in `skip` (unpinned
    /// waiters are never skipped). Readers that left are dropped on the way.
    pub fn pop_first_except(&mut self, skip: &[u32]) -> Option<Waiter> {
        if skip.is_empty() {
            while let Some(w) = self.line.pop_front() {
                if !w.tx.is_closed() {
                    return Some(w);
                }
            }
            return None;
        }
        let i = self
            .line
            .iter()
            .position(|w| w.partition.is_none_or(|p| !skip.contains(&p)))?;
        self.line.remove(i)
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
