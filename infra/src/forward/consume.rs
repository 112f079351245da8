//! The consume side of forwarding: a reader's long poll waits in every owner's line at once
//! (a delivery token each, from the user's share of the member's slots), the first owner
//! with messages serves it, and whatever the reader does not take is given back.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use narad_core::broker::{BrokerError, Delivery};
use narad_core::ids::{NodeId, RemoteId};
use narad_wire::ErrorCode;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::Semaphore;

use crate::http::error::ApiError;
use crate::http::render;

use super::codec::{CancelWait, ConsumeRequest, HandleOnly, SettleRequest};
use super::request::DataRequest;
use super::{
    CALL_DEADLINE, CallError, Ingress, MAX_WAITS_PER_MEMBER, MAX_WAITS_PER_USER, TOKEN_MARGIN,
    TOKEN_TTL, WAIT_SLACK, split_handle,
};
use narad_core::placement::{asked_in_turn, owner_of};

impl Ingress {
    /// Leases up to `max` messages from the topic's owners, this member included, waiting up
    /// to `wait` in every owner's line when there are none: the messages as JSON objects
    /// (handles naming their owner). Dropped before [`Taken::sent`], they are given back.
    ///
    /// `user` (security on): whose share of the delivery-token slots a wait takes.
    pub async fn consume(
        self: &Arc<Self>,
        topic: &str,
        partition: Option<u32>,
        max: usize,
        vis: Option<i64>,
        wait: Duration,
        user: Option<&str>,
    ) -> Result<Taken, ApiError> {
        let meta = self.broker.topic_meta(topic)?;
        if let Some(p) = partition {
            if p >= meta.config.partitions {
                return Err(BrokerError::PartitionOutOfRange {
                    index: None,
                    partition: p,
                    partitions: meta.config.partitions,
                }
                .into());
            }
            let owner = owner_of(&meta.owners, p, self.me());
            if wait.is_zero() {
                return self
                    .consume_on(owner, topic, Ask::new(partition, max, vis), wait, 0)
                    .await
                    .map_err(CallError::api);
            }
            if owner == self.me() {
                // (in a line that follows the partition if it moves away meanwhile)
                return self
                    .wait_in_lines(
                        vec![owner],
                        topic,
                        Ask::new(partition, max, vis),
                        wait,
                        user,
                    )
                    .await;
            }
            // another member's partition: a look, then a token in its owner's line
            let taken = self
                .consume_on(
                    owner,
                    topic,
                    Ask::new(partition, max, vis),
                    Duration::ZERO,
                    0,
                )
                .await
                .map_err(CallError::api)?;
            if !taken.is_empty() {
                return Ok(taken);
            }
            return self
                .wait_in_lines(
                    vec![owner],
                    topic,
                    Ask::new(partition, max, vis),
                    wait,
                    user,
                )
                .await;
        }
        let owners = asked_in_turn(&meta.owners, self.me(), self.broker.consume_cursor(topic)?);
        let mut taken = Taken::default();
        // an owner's error answer (a partition it cannot read, say) is the reply only if no
        // other owner had a message to give, as on a single node
        let mut failed = None;
        for &o in &owners {
            // one reply's worth, as on a single node (each owner stops at its own 4 MiB, so
            // a reply holds at most one owner's more)
            if taken.len() >= max || taken.bytes() >= narad_core::broker::MAX_READ_BYTES {
                break;
            }
            if self.is_down(o) {
                continue;
            }
            match self
                .consume_on(
                    o,
                    topic,
                    Ask::new(None, max - taken.len(), vis),
                    Duration::ZERO,
                    0,
                )
                .await
            {
                Ok(t) => taken.extend(t),
                Err(CallError::Unreachable(..)) => {}
                Err(CallError::Answered(e)) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if taken.is_empty()
            && let Some(e) = failed
        {
            return Err(e);
        }
        if !taken.is_empty() || wait.is_zero() {
            return Ok(taken);
        }
        self.wait_in_lines(owners, topic, Ask::new(None, max, vis), wait, user)
            .await
    }

    /// Nothing anywhere: waits up to `wait` in the line of every one of `owners` at once
    /// (this member's directly, the others' through a delivery token each); the first to
    /// serve wins, and what the others hand over later is given back. A partition that
    /// moves meanwhile to a member not waited on yet (the topic's, or `partition` alone)
    /// brings that member's line in too, so a reader parked across a move is woken by it.
    async fn wait_in_lines(
        self: &Arc<Self>,
        owners: Vec<u64>,
        topic: &str,
        ask: Ask,
        wait: Duration,
        user: Option<&str>,
    ) -> Result<Taken, ApiError> {
        let partition = ask.partition;
        let mut waits = Waits {
            set: tokio::task::JoinSet::new(),
            local: None,
            remote: Vec::new(),
            ingress: self.clone(),
            stop: tokio_util::sync::CancellationToken::new(),
        };
        let until = tokio::time::Instant::now() + wait;
        let mut changes = self.broker.catalog_changes();
        changes.mark_unchanged();
        let mut following = true;
        let mut waited: Vec<u64> = Vec::with_capacity(owners.len());
        for o in owners {
            self.wait_in_line(&mut waits, &mut waited, o, topic, ask, until, user);
        }
        let mut first_err = None;
        loop {
            let r = tokio::select! {
                r = waits.set.join_next() => match r {
                    Some(r) => r,
                    None => break,
                },
                c = changes.changed(), if following => {
                    if c.is_err() {
                        // (the broker is going away: the waits end with it)
                        following = false;
                        continue;
                    }
                    if let Ok(meta) = self.broker.topic_meta(topic) {
                        let now: Vec<u64> = match partition {
                            Some(p) => meta.owners.get(p as usize).copied().into_iter().collect(),
                            None => meta.owners.clone(),
                        };
                        for o in now {
                            if !waited.contains(&o) {
                                self.wait_in_line(&mut waits, &mut waited, o, topic, ask, until, user);
                            }
                        }
                    }
                    continue;
                }
            };
            match r {
                Ok(Ok(t)) if !t.is_empty() => return Ok(t),
                Ok(Ok(_)) | Err(_) | Ok(Err(CallError::Unreachable(..))) => {}
                Ok(Err(CallError::Answered(e))) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if e.code != ErrorCode::ClusterUnavailable => Err(e),
            _ => Ok(Taken::default()),
        }
    }

    /// Starts the reader's wait in member `o`'s line until `until` (see
    /// [`Self::wait_in_lines`]), and notes `o` in `waited`.
    #[allow(clippy::too_many_arguments)]
    fn wait_in_line(
        self: &Arc<Self>,
        waits: &mut Waits,
        waited: &mut Vec<u64>,
        o: u64,
        topic: &str,
        ask: Ask,
        until: tokio::time::Instant,
        user: Option<&str>,
    ) {
        let Ask {
            partition,
            max,
            visibility_ms: vis,
        } = ask;
        waited.push(o);
        let (me, topic) = (self.clone(), topic.to_owned());
        if o == self.me() {
            let wait = until.saturating_duration_since(tokio::time::Instant::now());
            let h = waits.set.spawn(async move {
                me.consume_on(o, &topic, Ask::new(partition, max, vis), wait, 0)
                    .await
            });
            waits.local = Some(h);
            return;
        }
        if self.is_down(o) {
            return;
        }
        // a reader beyond the member's tokens there queues for a slot (it is woken when
        // one frees, with what is left of its wait)
        let slots = self.wait_slots(o);
        let share = user.map(|u| UserSlots::of(&self.user_waits, o, u));
        let id = narad_core::random_u64() | 1;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let key = RemoteId::new(o, id);
        self.tokens.lock().insert(key, tx);
        waits.remote.push(key);
        let stop = waits.stop.clone();
        waits.set.spawn(async move {
            // the user's share first, then the member's slot: a user's readers beyond
            // its share wait behind one another, never ahead of other users'
            let _share = match &share {
                None => None,
                Some(share) => {
                    let s = tokio::select! {
                        s = tokio::time::timeout_at(until, share.sem.clone().acquire_owned()) => s,
                        () = stop.cancelled() => return Ok(Taken::default()),
                    };
                    let Ok(Ok(s)) = s else {
                        return Ok(Taken::default());
                    };
                    Some(s)
                }
            };
            let slot = tokio::select! {
                s = tokio::time::timeout_at(until, slots.acquire_owned()) => s,
                () = stop.cancelled() => return Ok(Taken::default()),
            };
            let Ok(Ok(_slot)) = slot else {
                return Ok(Taken::default());
            };
            let mut rx = rx;
            loop {
                let now = tokio::time::Instant::now();
                let left = until.saturating_duration_since(now);
                if left <= TOKEN_MARGIN || stop.is_cancelled() {
                    return Ok(Taken::default());
                }
                // a token in the owner's line for at most TOKEN_TTL: what the line hands
                // it is pushed here; one that ended (or that the owner dropped, or lost
                // in a restart) is left again, so a reader is never forgotten for long
                let ttl = left.min(TOKEN_TTL);
                match me
                    .leave_token(
                        o,
                        &topic,
                        Ask::new(partition, max, vis),
                        ttl - TOKEN_MARGIN,
                        id,
                    )
                    .await
                {
                    Ok(()) | Err(CallError::Unreachable(..)) => {}
                    Err(e) => return Err(e),
                }
                match tokio::time::timeout_at(now + ttl, &mut rx).await {
                    Ok(Ok(taken)) => return Ok(taken),
                    Ok(Err(_)) => return Ok(Taken::default()),
                    Err(_) => {}
                }
            }
        });
    }

    /// Leaves delivery token `id` in member `node`'s line for a reader here: the owner
    /// answers at once, keeps the token for `wait`, and pushes what its line hands the
    /// token ([`DELIVER`](narad_cluster::rpc::ops::DELIVER)).
    async fn leave_token(
        self: &Arc<Self>,
        node: u64,
        topic: &str,
        ask: Ask,
        wait: Duration,
        id: u64,
    ) -> Result<(), CallError> {
        let Ask {
            partition,
            max,
            visibility_ms: vis,
        } = ask;
        let req = ConsumeRequest {
            topic: topic.to_owned(),
            partition,
            max,
            wait_ms: wait.as_millis() as u64,
            catalog: self.broker.followed(),
            wait_id: id,
            visibility_ms: vis,
        };
        let (op, body) = DataRequest::WaitToken(req).frame();
        self.call(node, op, body, CALL_DEADLINE).await.map(|_| ())
    }

    /// What owner `from` pushed for token `id` (its handles name the owner): handed to the
    /// reader that left the token, or given back at once if that reader is gone.
    pub(super) fn delivered(
        self: &Arc<Self>,
        from: u64,
        topic: String,
        id: u64,
        messages: Vec<Box<RawValue>>,
    ) {
        let mut taken = Taken::from_remote(from, messages);
        taken.owner = Some((self.clone(), topic));
        if let Some(tx) = self.tokens.lock().remove(&RemoteId::new(from, id)) {
            // (a reader gone meanwhile drops it: given back then)
            let _ = tx.send(taken);
        }
    }

    /// The slots for long-polls waiting at member `id`.
    fn wait_slots(&self, id: u64) -> Arc<Semaphore> {
        self.waits
            .lock()
            .entry(id)
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_WAITS_PER_MEMBER)))
            .clone()
    }

    /// Consumes on `node`; a remote wait names itself with `wait_id` (non-zero), so it can
    /// be cancelled ([`CANCEL_WAIT`]).
    async fn consume_on(
        self: &Arc<Self>,
        node: u64,
        topic: &str,
        ask: Ask,
        wait: Duration,
        wait_id: u64,
    ) -> Result<Taken, CallError> {
        let Ask {
            partition,
            max,
            visibility_ms: vis,
        } = ask;
        if node == self.me() {
            let got = self
                .broker
                .consume_for(topic, partition, max, wait, vis)
                .await
                .map_err(|e| CallError::Answered(e.into()))?;
            let mut t = Taken::local(topic, self.me(), got);
            t.owner = Some((self.clone(), topic.to_owned()));
            return Ok(t);
        }
        let req = ConsumeRequest {
            topic: topic.to_owned(),
            partition,
            max,
            wait_ms: wait.as_millis() as u64,
            catalog: self.broker.followed(),
            wait_id,
            visibility_ms: vis,
        };
        let (op, body) = DataRequest::Consume(req).frame();
        let deadline = if wait.is_zero() {
            CALL_DEADLINE
        } else {
            wait + WAIT_SLACK
        };
        let reply = self.call(node, op, body, deadline).await?;
        let messages: Vec<Box<RawValue>> = serde_json::from_slice(&reply).map_err(|e| {
            CallError::Answered(ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!("node {node} answered a consume with a malformed reply: {e}"),
            ))
        })?;
        let mut t = Taken::from_remote(node, messages);
        t.owner = Some((self.clone(), topic.to_owned()));
        Ok(t)
    }

    /// Gives back messages taken for a reader that was not answered.
    fn give_back(&self, topic: &str, local: &[Delivery], remote: Vec<(u64, String)>) {
        if !local.is_empty() {
            self.broker.give_back(topic, local);
        }
        let mut by_node: HashMap<u64, Vec<String>> = HashMap::new();
        for (node, h) in remote {
            by_node.entry(node).or_default().push(h);
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for (node, handles) in by_node {
            let req = SettleRequest {
                topic: topic.to_owned(),
                handles,
                action: None,
                catalog: 0,
                deadline_ms: None,
            };
            let (op, body) = DataRequest::GiveBack(req).frame();
            let Some(addr) = self.node.meta.addr_of(node) else {
                continue;
            };
            let rpc = self.node.meta.rpc().clone();
            // best effort: a message not given back is redelivered after its lease
            rt.spawn(async move {
                let _ = rpc.call(node, &addr, op, body, CALL_DEADLINE).await;
            });
        }
    }
}

/// What a reader asks an owner for: messages of one partition or any, how many at most,
/// and the length of their leases (`None`: the topic's visibility timeout).
#[derive(Clone, Copy)]
struct Ask {
    partition: Option<u32>,
    max: usize,
    visibility_ms: Option<i64>,
}

impl Ask {
    fn new(partition: Option<u32>, max: usize, visibility_ms: Option<i64>) -> Self {
        Self {
            partition,
            max,
            visibility_ms,
        }
    }
}

/// Per (member, user): the user's share of the delivery-token slots at that member.
pub(super) type UserSlotTable = Mutex<HashMap<(NodeId, String), Arc<Semaphore>>>;

/// A reader's hold on its user's share of the delivery-token slots at one member (see
/// [`MAX_WAITS_PER_USER`]): its semaphore, and on drop, the table entry removed once no
/// reader of the user holds or waits for it.
struct UserSlots {
    sem: Arc<Semaphore>,
    key: (NodeId, String),
    table: Arc<UserSlotTable>,
}

impl UserSlots {
    fn of(table: &Arc<UserSlotTable>, member: u64, user: &str) -> Self {
        let key = (NodeId(member), user.to_owned());
        let sem = table
            .lock()
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_WAITS_PER_USER)))
            .clone();
        Self {
            sem,
            key,
            table: table.clone(),
        }
    }
}

impl Drop for UserSlots {
    fn drop(&mut self) {
        let mut table = self.table.lock();
        // the table's and this one's: nobody else holds or waits for the share
        if Arc::strong_count(&self.sem) == 2 {
            table.remove(&self.key);
        }
    }
}

/// A reader's waits at every owner. When it ends (one owner served it, or the reader went
/// away) the wait here is abandoned (the local line is cancel-safe) and the remote ones are
/// cancelled at their owners and left to finish on their own: an owner that served one
/// meanwhile answers with the messages, which are given back when that answer drops. (An
/// abandoned call could lose an answer already on its way; a cancelled one cannot.)
struct Waits {
    set: tokio::task::JoinSet<Result<Taken, CallError>>,
    local: Option<tokio::task::AbortHandle>,
    remote: Vec<RemoteId>,
    ingress: Arc<Ingress>,
    /// Ends the waits still queueing for a slot (they never start).
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Waits {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(h) = self.local.take() {
            h.abort();
        }
        // (a token's task holds its reader's end: what an owner pushes later is given back)
        self.set.abort_all();
        {
            let mut tokens = self.ingress.tokens.lock();
            for token in &self.remote {
                tokens.remove(token);
            }
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for RemoteId {
            member: NodeId(node),
            id: wait_id,
        } in self.remote.drain(..)
        {
            let Some(addr) = self.ingress.node.meta.addr_of(node) else {
                continue;
            };
            let rpc = self.ingress.node.meta.rpc().clone();
            let (op, body) = DataRequest::CancelWait(CancelWait { wait_id }).frame();
            rt.spawn(async move {
                let _ = rpc.call(node, &addr, op, body, CALL_DEADLINE).await;
            });
        }
    }
}

/// Messages a consume took for a reader, rendered, and how to give them back: dropped
/// before [`Taken::sent`] (the reader went away, the reply did not fit the budget, another
/// owner served the reader first), they are given back at once.
#[derive(Default)]
pub struct Taken {
    pub messages: Vec<Box<RawValue>>,
    /// Leased on this member.
    pub(super) local: Vec<Delivery>,
    /// Leased on other members: (member, its own handle).
    remote: Vec<(u64, String)>,
    /// Who gives them back, for which topic (`None`: nothing to give back).
    owner: Option<(Arc<Ingress>, String)>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some((ingress, topic)) = self.owner.take()
            && !(self.local.is_empty() && self.remote.is_empty())
        {
            ingress.give_back(&topic, &self.local, std::mem::take(&mut self.remote));
        }
    }
}

impl Taken {
    pub(super) fn local(topic: &str, me: u64, got: Vec<Delivery>) -> Self {
        let messages = got
            .iter()
            .map(|d| {
                let handle = format!("{me}.{}", d.receipt_handle);
                raw(&render::delivery_as(topic, d, &handle))
            })
            .collect();
        Self {
            messages,
            local: got,
            remote: Vec::new(),
            owner: None,
        }
    }

    /// Messages an owner answered (their handles already name it).
    fn from_remote(node: u64, messages: Vec<Box<RawValue>>) -> Self {
        let remote = messages
            .iter()
            .filter_map(|m| serde_json::from_str::<HandleOnly>(m.get()).ok())
            .filter_map(|h| {
                split_handle(&h.receipt_handle).map(|(_, inner)| (node, inner.to_owned()))
            })
            .collect();
        Self {
            messages,
            local: Vec::new(),
            remote,
            owner: None,
        }
    }

    /// Messages of a replay read (nothing leased).
    pub fn read(messages: Vec<Box<RawValue>>) -> Self {
        Self {
            messages,
            local: Vec::new(),
            remote: Vec::new(),
            owner: None,
        }
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// The messages' size as JSON.
    fn bytes(&self) -> usize {
        self.messages.iter().map(|m| m.get().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn extend(&mut self, mut other: Taken) {
        self.messages.append(&mut other.messages);
        self.local.append(&mut other.local);
        self.remote.append(&mut other.remote);
        if self.owner.is_none() {
            self.owner = other.owner.take();
        }
    }

    /// The reply body: one message alone, or `{"messages": [...]}`.
    pub fn body(&self, batch: bool) -> String {
        if !batch {
            return self
                .messages
                .first()
                .map(|m| m.get().to_owned())
                .unwrap_or_default();
        }
        let mut out = String::from("{\"messages\":[");
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(m.get());
        }
        out.push_str("]}");
        out
    }

    /// The messages went out in a reply: nothing to give back any more.
    pub fn sent(mut self) {
        self.owner = None;
    }
}

pub(super) fn raw<T: Serialize>(v: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).expect("messages serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(handles: &[&str]) -> Vec<Box<RawValue>> {
        handles
            .iter()
            .map(|h| raw(&serde_json::json!({"receipt_handle": h, "payload": "x"})))
            .collect()
    }

    #[test]
    fn an_owners_messages_are_given_back_by_its_own_handles() {
        let t = Taken::from_remote(4, messages(&["4.abc", "4.def", "junk", "x.y"]));
        assert_eq!(t.len(), 4, "every message goes to the reader");
        assert_eq!(
            t.remote,
            [(4, "abc".to_owned()), (4, "def".to_owned())],
            "only handles that name a member are given back"
        );
        t.sent();
    }

    #[test]
    fn a_reply_is_one_message_or_a_batch() {
        let none = Taken::read(Vec::new());
        assert_eq!(none.body(false), "");
        assert_eq!(none.body(true), r#"{"messages":[]}"#);
        let mut t = Taken::read(messages(&["1.a"]));
        t.extend(Taken::read(messages(&["2.b"])));
        assert_eq!(t.len(), 2);
        let one: serde_json::Value = serde_json::from_str(&t.body(false)).unwrap();
        assert_eq!(one["receipt_handle"], "1.a");
        let all: serde_json::Value = serde_json::from_str(&t.body(true)).unwrap();
        assert_eq!(all["messages"][1]["receipt_handle"], "2.b");
        assert_eq!(
            t.bytes(),
            t.messages.iter().map(|m| m.get().len()).sum::<usize>()
        );
    }
}
