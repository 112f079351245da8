//! This member's side of the data plane: the calls the other members make on the
//! partitions it owns (produce, consume and delivery tokens, settle, replay, stats, fan-out
//! copies, mirror progress, and the move calls it hands to the mover).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_cluster::rpc::ops::CONSUME;
use narad_cluster::rpc::{BoxFuture, Fault, Op, RpcError, Service};
use narad_core::broker::Broker;
use narad_core::ids::{NodeId, RemoteId};
use narad_replay::ArchiveReader;
use narad_wire::ErrorCode;
use narad_wire::limits::MAX_CONSUME_BATCH;
use parking_lot::Mutex;
use serde_json::value::RawValue;
use tokio::sync::Semaphore;

use crate::http::error::ApiError;
use crate::http::render;
use crate::reads::{history, local_stats};

use super::codec::*;
use super::consume::{Taken, raw};
use super::request::{DataRequest, Delivered};
use super::{CALL_DEADLINE, CATCH_UP, Ingress, MAX_CANCELLABLE_WAITS, split_handle};

/// Longest wait a member's forwarded consume may ask of an owner (its reader's wait is
/// bounded far lower by `max_wait_ms`; this bounds what a peer's bytes can hold).
const MAX_FORWARDED_WAIT_MS: u64 = 3_600_000;

/// Waits and tokens other members may cancel: (member, id) → (the registration's own
/// number, its cancel). A token left again under the same id is a new registration: the
/// old one's end must not remove it.
pub type CancellableWaits = Arc<Mutex<HashMap<RemoteId, (u64, tokio::sync::oneshot::Sender<()>)>>>;

/// Serves the other members' produce, consume, replay and ack calls on this member's
/// broker.
pub struct DataService {
    pub broker: Arc<Broker>,
    pub me: u64,
    /// History older than local data, for replay reads of this member's partitions.
    pub archive: Option<Arc<ArchiveReader>>,
    /// Waits (and delivery tokens) other members may cancel, by (member, id).
    pub waits: CancellableWaits,
    /// Cancels that found nothing to cancel, for a few seconds: a reader that gave up at
    /// once sends its cancel right behind its token, and the cancel may arrive first; the
    /// token it overtook is then not kept (it would take messages for nobody).
    cancelled: Arc<Mutex<HashMap<RemoteId, Instant>>>,
    pushes: Arc<Pushes>,
    /// This member's ingress: its readers' tokens take what other owners push, and it
    /// pushes what its line hands the others' tokens.
    ingress: std::sync::Weak<Ingress>,
    /// This member's partition mover (its progress, for `GET /v1/cluster/moves`).
    mover: Option<Arc<crate::moves::Mover>>,
}

/// How long a cancel that overtook its token is remembered, and how many are.
const CANCEL_MEMORY: Duration = Duration::from_secs(10);
const MAX_CANCEL_MEMORY: usize = 4096;

/// Remembers a cancel that found no wait (bounded: the oldest are forgotten first, and a
/// full table forgets the new one, which only lets an orphan token live its wait).
fn remember_cancel(cancelled: &Mutex<HashMap<RemoteId, Instant>>, key: RemoteId) {
    let mut c = cancelled.lock();
    if c.len() >= MAX_CANCEL_MEMORY {
        c.retain(|_, at| at.elapsed() < CANCEL_MEMORY);
    }
    if c.len() < MAX_CANCEL_MEMORY {
        c.insert(key, Instant::now());
    }
}

/// Ends every wait and token member `from` has here: a push to it failed, so its readers'
/// tokens would go on taking messages that cannot reach them (each held until its lease
/// ends). Its readers, if alive, are served by the other owners or leave new tokens.
fn drop_tokens_of(waits: &CancellableWaits, from: u64) {
    let gone: Vec<_> = {
        let mut w = waits.lock();
        let keys: Vec<RemoteId> = w
            .keys()
            .filter(|k| k.member == NodeId(from))
            .copied()
            .collect();
        keys.into_iter().filter_map(|k| w.remove(&k)).collect()
    };
    for (_, tx) in gone {
        let _ = tx.send(());
    }
}

impl DataService {
    pub fn new(ingress: &Arc<Ingress>, mover: Option<Arc<crate::moves::Mover>>) -> Self {
        Self {
            broker: ingress.broker.clone(),
            me: ingress.me(),
            archive: ingress.archive.clone(),
            waits: Arc::default(),
            cancelled: Arc::default(),
            pushes: Arc::default(),
            ingress: Arc::downgrade(ingress),
            mover,
        }
    }
}

/// Pushes this owner sends to one member at once. A member that died (or froze) is found
/// out by the first push to it failing, up to [`CALL_DEADLINE`] later; the pushes already
/// under way then stay leased until their lease ends (their fate is unknown), so this
/// bounds what a dead member can hold: this many pushes of at most [`MAX_CONSUME_BATCH`]
/// messages each. The pushes that wait for a slot meanwhile give their messages back
/// instead.
const PUSHES_PER_MEMBER: usize = 8;

/// The pushes to each member: their slots, and how many times a push to it failed (a
/// token left before the latest failure is not pushed to).
#[derive(Default)]
pub struct Pushes {
    slots: Mutex<HashMap<u64, Arc<Semaphore>>>,
    failures: Mutex<HashMap<u64, u64>>,
}

impl Pushes {
    fn failures(&self, member: u64) -> u64 {
        self.failures.lock().get(&member).copied().unwrap_or(0)
    }

    fn failed(&self, member: u64) {
        *self.failures.lock().entry(member).or_default() += 1;
    }

    fn slots(&self, member: u64) -> Arc<Semaphore> {
        self.slots
            .lock()
            .entry(member)
            .or_insert_with(|| Arc::new(Semaphore::new(PUSHES_PER_MEMBER)))
            .clone()
    }
}

/// Keeps token `req.wait_id` of member `from` in this owner's line for `req.wait_ms`, then
/// pushes what the line handed it to `from` ([`DELIVER`]). Once the push reached `from`,
/// the messages are its to hand on or give back; a push that surely never left gives them
/// back here; one whose fate is unknown leaves them leased (redelivered after their lease,
/// never to two readers at once).
async fn keep_token(
    broker: Arc<Broker>,
    ingress: std::sync::Weak<Ingress>,
    (waits, pushes): (CancellableWaits, Arc<Pushes>),
    from: u64,
    req: ConsumeRequest,
    cancelled: tokio::sync::oneshot::Receiver<()>,
) {
    let failures = pushes.failures(from);
    let wait = Duration::from_millis(req.wait_ms.min(MAX_FORWARDED_WAIT_MS));
    let max = req.max.clamp(1, MAX_CONSUME_BATCH as usize);
    let got = tokio::select! {
        got = broker.consume_for(&req.topic, req.partition, max, wait, req.visibility_ms) => got,
        _ = cancelled => return,
    };
    let Ok(got) = got else { return };
    if got.is_empty() {
        return;
    }
    let Some(ingress) = ingress.upgrade() else {
        broker.give_back(&req.topic, &got);
        return;
    };
    // one of the member's push slots; a push to it that failed meanwhile means the reader
    // this token was left for is unreachable: the messages go back, never sent
    let slots = pushes.slots(from);
    let _slot = slots.acquire().await;
    if pushes.failures(from) != failures {
        broker.give_back(&req.topic, &got);
        return;
    }
    let me = ingress.me();
    let mut taken = Taken::local(&req.topic, me, got);
    let (op, body) = DataRequest::Deliver(Delivered {
        topic: req.topic.clone(),
        token: req.wait_id,
        messages: std::mem::take(&mut taken.messages),
    })
    .frame();
    let pushed = match ingress.node.meta.addr_of(from) {
        Some(addr) => {
            ingress
                .node
                .meta
                .rpc()
                .call(from, &addr, op, body, CALL_DEADLINE)
                .await
        }
        None => Err(RpcError::Unreachable {
            peer: from,
            reason: "not a member".into(),
        }),
    };
    let Err(e) = pushed else { return };
    pushes.failed(from);
    if e.not_sent() {
        broker.give_back(&req.topic, &taken.local);
    } else {
        tracing::warn!(node_id = from, topic = %req.topic, error = %e, "a delivery token's push may not have arrived; its messages are redelivered after their lease");
    }
    drop_tokens_of(&waits, from);
}

/// A cancellable wait's entry, removed when the wait ends however it ends (if it is still
/// this registration's).
struct WaitEntry {
    waits: CancellableWaits,
    key: RemoteId,
    registration: u64,
}

impl WaitEntry {
    /// Registers `tx` as the cancel of `key` (the caller checked the table's bound).
    fn register(
        waits: CancellableWaits,
        key: RemoteId,
        tx: tokio::sync::oneshot::Sender<()>,
    ) -> Self {
        let registration = narad_core::random_u64();
        waits.lock().insert(key, (registration, tx));
        Self {
            waits,
            key,
            registration,
        }
    }
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        let mut w = self.waits.lock();
        if w.get(&self.key)
            .is_some_and(|(r, _)| *r == self.registration)
        {
            w.remove(&self.key);
        }
    }
}

/// Waits (briefly) until this member has followed the catalog a call names.
/// `topic` here is incarnation `id` (one re-created since is another topic).
fn same_topic(broker: &Broker, topic: &str, id: u64) -> Result<(), Fault> {
    let here = broker
        .topic_meta(topic)
        .map_err(|e| to_fault(&e.into()))?
        .id;
    if here != id {
        return Err(to_fault(&ApiError::new(
            ErrorCode::TopicNotFound,
            format!("topic '{topic}' not found (it was re-created)"),
        )));
    }
    Ok(())
}

async fn caught_up(broker: &Broker, catalog: u64) -> Result<(), Fault> {
    if broker.catch_up(catalog, CATCH_UP).await {
        Ok(())
    } else {
        Err(to_fault(&ApiError::new(
            ErrorCode::ClusterUnavailable,
            "the partition's owner has not caught up with the cluster's topics yet; retry",
        )))
    }
}

impl Service for DataService {
    fn call(&self, from: u64, op: Op, body: Bytes) -> BoxFuture<Result<Bytes, Fault>> {
        let (broker, me, waits) = (self.broker.clone(), self.me, self.waits.clone());
        let (archive, ingress) = (self.archive.clone(), self.ingress.clone());
        let (cancelled, pushes) = (self.cancelled.clone(), self.pushes.clone());
        let mover = self.mover.clone();
        Box::pin(async move {
            if let Some(r) = crate::moves::serve(&broker, mover.as_ref(), op, &body).await {
                return r;
            }
            let Some(req) = DataRequest::decode(op, body) else {
                return Err(Fault::unknown_op(op));
            };
            match req? {
                DataRequest::Produce(req) => {
                    caught_up(&broker, req.catalog).await?;
                    // the incarnation the sender placed for: a topic re-created since is
                    // another topic
                    let id = broker
                        .topic_meta(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?
                        .id;
                    if id != req.topic_id {
                        return Err(to_fault(&ApiError::new(
                            ErrorCode::TopicNotFound,
                            format!("topic '{}' not found (it was re-created)", req.topic),
                        )));
                    }
                    let produced = broker
                        .produce(&req.topic, req.msgs)
                        .await
                        .map_err(|e| to_fault(&e.into()))?;
                    if let Some(i) = ingress.upgrade() {
                        // (the member that forwarded it keeps what it is answered)
                        i.witnesses
                            .confirm(req.topic_id, &produced, Some(from))
                            .await;
                    }
                    Ok(encode_produced(&produced))
                }
                DataRequest::Consume(req) => {
                    caught_up(&broker, req.catalog).await?;
                    let wait = Duration::from_millis(req.wait_ms.min(MAX_FORWARDED_WAIT_MS));
                    let max = req.max.clamp(1, MAX_CONSUME_BATCH as usize);
                    let consume =
                        broker.consume_for(&req.topic, req.partition, max, wait, req.visibility_ms);
                    let got = if req.wait_id == 0 || wait.is_zero() {
                        consume.await
                    } else {
                        // cancellable: a cancel ends the wait (leaving the line gives back
                        // whatever was handed over meanwhile) and answers empty
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let key = RemoteId::new(from, req.wait_id);
                        if waits.lock().len() >= MAX_CANCELLABLE_WAITS {
                            return Err(Fault::new(
                                503,
                                "server_busy",
                                "too many waits from other members",
                            ));
                        }
                        let _entry = WaitEntry::register(waits, key, tx);
                        tokio::select! {
                            got = consume => got,
                            _ = rx => Ok(Vec::new()),
                        }
                    }
                    .map_err(|e| to_fault(&e.into()))?;
                    // (their handles name this member: the caller passes them on as they
                    // are; an answer that never reaches it is given back by `undelivered`)
                    let taken = Taken::local(&req.topic, me, got);
                    Ok(Bytes::from(
                        serde_json::to_vec(&taken.messages).expect("messages serialise"),
                    ))
                }
                DataRequest::Replay { req, from } => {
                    caught_up(&broker, req.catalog).await?;
                    let max = req.max.clamp(1, MAX_CONSUME_BATCH as usize);
                    let recs = history(
                        &broker,
                        archive.as_deref(),
                        &req.topic,
                        req.partition,
                        from,
                        max,
                    )
                    .await
                    .map_err(|e| to_fault(&e))?;
                    let msgs: Vec<Box<RawValue>> = recs
                        .iter()
                        .map(|r| raw(&render::record(&req.topic, req.partition, r)))
                        .collect();
                    Ok(Bytes::from(
                        serde_json::to_vec(&msgs).expect("messages serialise"),
                    ))
                }
                DataRequest::GiveBack(req)
                | DataRequest::Settle {
                    req, action: None, ..
                } => {
                    broker.give_back_handles(&req.topic, &req.handles);
                    Ok(Bytes::new())
                }
                DataRequest::Settle {
                    req,
                    action: Some(action),
                } => {
                    caught_up(&broker, req.catalog).await?;
                    if let Some(d) = req.deadline_ms
                        && broker.now_ms() > d
                    {
                        // the caller has given up and answered "unknown": applying it now
                        // would surprise a client that retries or lets the lease run out
                        let late = SettleOutcome::of(Err(ApiError::new(
                            ErrorCode::ClusterUnavailable,
                            "the settle reached the member that leased the message after its caller's deadline; not applied, retry",
                        )));
                        tracing::warn!(topic = %req.topic, handles = req.handles.len(), late_ms = broker.now_ms() - d, "settle refused: it arrived after its caller's deadline");
                        let out: Vec<&SettleOutcome> = req.handles.iter().map(|_| &late).collect();
                        return Ok(Bytes::from(
                            serde_json::to_vec(&out).expect("outcomes serialise"),
                        ));
                    }
                    let out: Vec<SettleOutcome> = broker
                        .settle_many(&req.topic, &req.handles, action)
                        .await
                        .into_iter()
                        .map(|r| SettleOutcome::of(r.map_err(ApiError::from)))
                        .collect();
                    Ok(Bytes::from(
                        serde_json::to_vec(&out).expect("outcomes serialise"),
                    ))
                }
                DataRequest::FanoutAppend(req) => {
                    caught_up(&broker, req.catalog).await?;
                    broker
                        .append_copies(&req.topic, req.topic_id, req.partition, req.records)
                        .await
                        .map_err(|e| to_fault(&e.into()))?;
                    Ok(Bytes::new())
                }
                DataRequest::Children(req) => {
                    caught_up(&broker, req.catalog).await?;
                    let id = broker
                        .topic_meta(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?
                        .id;
                    if req.topic_id.is_some_and(|want| want != id) {
                        return Err(to_fault(&ApiError::new(
                            ErrorCode::TopicNotFound,
                            format!("topic '{}' not found (it was re-created)", req.topic),
                        )));
                    }
                    let list = broker
                        .children(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?;
                    Ok(Bytes::from(
                        serde_json::to_vec(&list).expect("children serialise"),
                    ))
                }
                DataRequest::MirrorProgress(req) => {
                    caught_up(&broker, req.catalog).await?;
                    same_topic(&broker, &req.topic, req.topic_id)?;
                    if !req.returned.is_empty() {
                        broker
                            .settle_returned(&req.topic, req.source, &req.returned)
                            .await
                            .map_err(|e| to_fault(&e.into()))?;
                    }
                    broker
                        .take_mirror_progress(
                            &req.topic,
                            req.source,
                            req.partition,
                            req.progress,
                            req.end,
                        )
                        .await
                        .map_err(|e| to_fault(&e.into()))?;
                    Ok(Bytes::new())
                }
                DataRequest::MirrorReport(req) => {
                    caught_up(&broker, req.catalog).await?;
                    same_topic(&broker, &req.topic, req.topic_id)?;
                    let reply = if req.last {
                        MirrorReportReply {
                            report: None,
                            settled: broker
                                .settle_mirror_progress(&req.topic)
                                .await
                                .map_err(|e| to_fault(&e.into()))?,
                        }
                    } else {
                        MirrorReportReply {
                            report: broker
                                .mirror_report(&req.topic)
                                .await
                                .map_err(|e| to_fault(&e.into()))?,
                            settled: 0,
                        }
                    };
                    Ok(Bytes::from(
                        serde_json::to_vec(&reply).expect("reports serialise"),
                    ))
                }
                DataRequest::Stats(req) => {
                    caught_up(&broker, req.catalog).await?;
                    let info = broker
                        .topic_info(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?;
                    if req.topic_id.is_some_and(|id| id != info.meta.id) {
                        return Err(to_fault(&ApiError::new(
                            ErrorCode::TopicNotFound,
                            format!("topic '{}' not found (it was re-created)", req.topic),
                        )));
                    }
                    let stats = local_stats(&broker, &info, None);
                    Ok(Bytes::from(
                        serde_json::to_vec(&stats).expect("stats serialise"),
                    ))
                }
                DataRequest::Purge(req) => {
                    caught_up(&broker, req.catalog).await?;
                    let id = broker
                        .with_topic_meta(&req.topic, |m| m.id)
                        .map_err(|e| to_fault(&e.into()))?;
                    if req.topic_id.is_some_and(|want| want != id) {
                        return Err(to_fault(&ApiError::new(
                            ErrorCode::TopicNotFound,
                            format!("topic '{}' not found (it was re-created)", req.topic),
                        )));
                    }
                    let (purged, frozen) = broker
                        .purge(&req.topic)
                        .await
                        .map_err(|e| to_fault(&e.into()))?;
                    Ok(Bytes::from(
                        serde_json::to_vec(&super::Purged { purged, frozen })
                            .expect("a purge serialises"),
                    ))
                }
                DataRequest::WaitToken(req) => {
                    caught_up(&broker, req.catalog).await?;
                    broker
                        .topic_meta(&req.topic)
                        .map_err(|e| to_fault(&e.into()))?;
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let key = RemoteId::new(from, req.wait_id);
                    if cancelled.lock().remove(&key).is_some() {
                        // its reader gave up before the token got here
                        return Ok(Bytes::new());
                    }
                    {
                        let w = waits.lock();
                        if w.contains_key(&key) {
                            // left again while the last one is still here (it was pushing)
                            return Ok(Bytes::new());
                        }
                        if w.len() >= MAX_CANCELLABLE_WAITS {
                            return Err(Fault::new(
                                503,
                                "server_busy",
                                "too many delivery tokens from other members",
                            ));
                        }
                    }
                    let entry = WaitEntry::register(waits, key, tx);
                    let ingress = ingress.clone();
                    tokio::spawn(async move {
                        let all = entry.waits.clone();
                        keep_token(broker, ingress, (all, pushes), from, req, rx).await;
                        drop(entry);
                    });
                    Ok(Bytes::new())
                }
                DataRequest::Deliver(req) => {
                    if let Some(ingress) = ingress.upgrade() {
                        ingress.delivered(from, req.topic, req.token, req.messages);
                    }
                    Ok(Bytes::new())
                }
                DataRequest::CancelWait(req) => {
                    let found = waits.lock().remove(&RemoteId::new(from, req.wait_id));
                    match found {
                        Some((_, tx)) => {
                            let _ = tx.send(());
                        }
                        None => remember_cancel(&cancelled, RemoteId::new(from, req.wait_id)),
                    }
                    Ok(Bytes::new())
                }
            }
        })
    }

    fn wants_receipt(&self, op: Op) -> bool {
        op == CONSUME
    }

    /// A consume's answer that never reached its caller: its messages are given back.
    fn undelivered(&self, op: Op, reply: Bytes) {
        if op != CONSUME {
            return;
        }
        let Ok(msgs) = serde_json::from_slice::<Vec<TopicAndHandle>>(&reply) else {
            return;
        };
        let mut by_topic: HashMap<String, Vec<String>> = HashMap::new();
        for m in msgs {
            if let Some((_, inner)) = split_handle(&m.receipt_handle) {
                by_topic.entry(m.topic).or_default().push(inner.to_owned());
            }
        }
        for (topic, handles) in by_topic {
            self.broker.give_back_handles(&topic, &handles);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_that_overtook_its_wait_is_remembered_within_bounds() {
        let c = Mutex::new(HashMap::new());
        remember_cancel(&c, RemoteId::new(1, 1));
        assert!(c.lock().contains_key(&RemoteId::new(1, 1)));
        for i in 0..(MAX_CANCEL_MEMORY as u64 + 100) {
            remember_cancel(&c, RemoteId::new(2, i));
        }
        // full of recent ones: the newest are forgotten, never the table grown
        assert_eq!(c.lock().len(), MAX_CANCEL_MEMORY);
        // old ones make room
        let long_ago = Instant::now()
            .checked_sub(CANCEL_MEMORY * 2)
            .expect("the clock is past its start");
        c.lock().values_mut().for_each(|at| *at = long_ago);
        remember_cancel(&c, RemoteId::new(3, 3));
        assert!(c.lock().contains_key(&RemoteId::new(3, 3)));
        assert_eq!(c.lock().len(), 1, "the expired ones went");
    }

    #[test]
    fn a_failed_push_ends_the_waits_of_that_member_only() {
        let waits: CancellableWaits = Arc::default();
        let mut told = Vec::new();
        for key in [
            RemoteId::new(1, 10),
            RemoteId::new(1, 11),
            RemoteId::new(2, 10),
        ] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            waits.lock().insert(key, (0, tx));
            told.push((key, rx));
        }
        drop_tokens_of(&waits, 1);
        let left: Vec<RemoteId> = waits.lock().keys().copied().collect();
        assert_eq!(left, [RemoteId::new(2, 10)]);
        for (key, mut rx) in told {
            assert_eq!(rx.try_recv().is_ok(), key.member == NodeId(1), "{key:?}");
        }
    }
}
