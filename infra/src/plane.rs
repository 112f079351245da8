//! The data plane as the HTTP handlers see it: one set of operations (produce, consume,
//! replay, settle, and the figures and positions that span a topic's partitions), answered
//! by this member's broker alone on a single node, or across the members owning the
//! partitions in a cluster ([`crate::forward::Ingress`]).
//!
//! Which of the two is chosen once, when the server starts (a cluster member's ingress is set
//! before it serves requests); the handlers make no single-node or cluster branch of their
//! own. [`Plane`] is an enum, not a trait object: a handler's call costs no allocation and no
//! indirect call on the hot path.

use std::sync::Arc;
use std::time::Duration;

use narad_core::broker::{AckAction, Broker, ChildInfo, Delivery, LinkStart, ReplayFrom};
use narad_core::catalog::TopicMeta;
use narad_replay::ArchiveReader;
use narad_wire::ErrorCode;

use crate::forward::{Ingress, Outcome, Taken};
use crate::http::error::ApiError;
use crate::http::render;
use crate::reads::{PartitionStatsJson, history};

/// This member's data plane: its broker alone, or the cluster through its ingress.
#[derive(Clone, Copy)]
pub enum Plane<'a> {
    Local(&'a Arc<Broker>),
    Cluster(&'a Arc<Ingress>),
}

/// The other members' mirror reports, what they settled, and the members not asked.
pub type OthersReports = (Vec<narad_core::broker::MirrorReport>, u64, Vec<u64>);

/// What a produce wrote.
pub enum Written {
    /// Every message, in order.
    All(Vec<narad_core::broker::Produced>),
    /// Some of the messages (a cluster: each owner's messages all or none); one outcome per
    /// message, in order.
    Each(Vec<Outcome>),
}

/// What a consume took, leased and not yet handed out: given back unless
/// [`Consumed::reply`] sends it.
pub enum Consumed<'a> {
    Local {
        broker: &'a Broker,
        topic: &'a str,
        got: Vec<Delivery>,
    },
    Cluster(Taken),
}

/// One leased message, as [`Consumed::leased`] tells it.
pub struct Leased {
    pub partition: u32,
    pub offset: u64,
    /// When it was written (commit time, Unix milliseconds).
    pub timestamp_ms: i64,
    pub delivery_count: u32,
    /// The handle its settle takes (a cluster's names its owner).
    pub receipt_handle: String,
    /// (in a cluster, values as text: bytes that are not UTF-8 arrive replaced)
    pub headers: Vec<(String, bytes::Bytes)>,
    pub payload: bytes::Bytes,
}

impl Consumed<'_> {
    pub fn is_empty(&self) -> bool {
        match self {
            Consumed::Local { got, .. } => got.is_empty(),
            Consumed::Cluster(taken) => taken.is_empty(),
        }
    }

    /// Not handed out: the messages are deliverable again at once.
    pub fn give_back(self) {
        match self {
            Consumed::Local { broker, topic, got } => broker.give_back(topic, &got),
            // (dropping a `Taken` gives it back)
            Consumed::Cluster(taken) => drop(taken),
        }
    }

    /// The reply's body: one message alone, or `{"messages": [...]}` when `batch`.
    fn text(&self, batch: bool) -> String {
        match self {
            Consumed::Local { topic, got, .. } => {
                let msgs: Vec<_> = got.iter().map(|d| render::delivery(topic, d)).collect();
                render::reply_text(&msgs, batch)
            }
            Consumed::Cluster(taken) => taken.body(batch),
        }
    }

    /// The `200` reply, its bytes held against the node's budget until written; what was
    /// taken is handed out only if the reply fits (`503 server_busy`, and given back, if not).
    pub async fn reply(
        self,
        budget: &crate::http::budget::BodyBudget,
        held: &crate::http::budget::Held,
        batch: bool,
    ) -> Result<axum::response::Response, ApiError> {
        let text = self.text(batch);
        self.reply_with(budget, held, text).await
    }

    /// What was taken, each message as it was leased, for a reply in another form than the
    /// native API's ([`Consumed::reply_with`] then sends it). A message the owner sent that
    /// cannot be read is an error (everything is then given back when this is dropped).
    pub fn leased(&self) -> Result<Vec<Leased>, ApiError> {
        match self {
            Consumed::Local { got, .. } => Ok(got
                .iter()
                .map(|d| Leased {
                    partition: d.partition,
                    offset: d.record.offset,
                    timestamp_ms: d.record.timestamp_ms,
                    delivery_count: d.delivery_count,
                    receipt_handle: d.receipt_handle.clone(),
                    headers: d.record.headers.clone(),
                    payload: d.record.payload.clone(),
                })
                .collect()),
            Consumed::Cluster(taken) => taken
                .messages
                .iter()
                .map(|m| {
                    let unreadable = |e: String| {
                        ApiError::new(
                            ErrorCode::InternalError,
                            format!("a member sent a message that cannot be read: {e}"),
                        )
                    };
                    let m: narad_wire::Message =
                        serde_json::from_str(m.get()).map_err(|e| unreadable(e.to_string()))?;
                    let payload = m
                        .payload_bytes()
                        .map_err(|e| unreadable(e.to_string()))?
                        .into_owned();
                    Ok(Leased {
                        partition: m.partition,
                        offset: m.offset,
                        timestamp_ms: m.timestamp_ms,
                        delivery_count: m.delivery_count.unwrap_or(1),
                        receipt_handle: m.receipt_handle.unwrap_or_default(),
                        headers: m
                            .headers
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, bytes::Bytes::from(v.into_bytes())))
                            .collect(),
                        payload: bytes::Bytes::from(payload),
                    })
                })
                .collect(),
        }
    }

    /// [`Consumed::reply`] with the reply's body given (`text`, JSON).
    pub async fn reply_with(
        self,
        budget: &crate::http::budget::BodyBudget,
        held: &crate::http::budget::Held,
        text: String,
    ) -> Result<axum::response::Response, ApiError> {
        match crate::http::budget::reply(budget, held, axum::http::StatusCode::OK, text).await {
            Ok(resp) => {
                if let Consumed::Cluster(taken) = self {
                    taken.sent();
                }
                Ok(resp)
            }
            Err(e) => {
                self.give_back();
                Err(e)
            }
        }
    }
}

impl<'a> Plane<'a> {
    /// Produces `msgs` to `topic`. `Err` when nothing was written.
    pub async fn produce(
        self,
        topic: &str,
        msgs: Vec<narad_core::broker::ProduceMessage>,
    ) -> Result<Written, ApiError> {
        match self {
            Plane::Local(broker) => Ok(Written::All(broker.produce(topic, msgs).await?)),
            Plane::Cluster(ingress) => {
                let outcomes = ingress.produce(topic, msgs).await?;
                if outcomes.iter().all(Result::is_ok) {
                    return Ok(Written::All(
                        outcomes.into_iter().filter_map(Result::ok).collect(),
                    ));
                }
                if let Some(Err(e)) = outcomes.first()
                    && outcomes.iter().all(Result::is_err)
                {
                    return Err(e.clone());
                }
                Ok(Written::Each(outcomes))
            }
        }
    }

    /// Leases up to `max` messages of `topic` (of `partition` only, if given), waiting up to
    /// `wait` for some; `user` (security on): whose share of a cluster's wait slots it takes.
    pub async fn consume(
        self,
        topic: &'a str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
        user: Option<&str>,
    ) -> Result<Consumed<'a>, ApiError> {
        self.consume_for(topic, partition, max, wait, user, None)
            .await
    }

    /// [`Plane::consume`] with leases of `visibility_ms` (`None`: the topic's visibility
    /// timeout).
    pub async fn consume_for(
        self,
        topic: &'a str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
        user: Option<&str>,
        visibility_ms: Option<i64>,
    ) -> Result<Consumed<'a>, ApiError> {
        Ok(match self {
            Plane::Local(broker) => Consumed::Local {
                broker,
                topic,
                got: broker
                    .consume_for(topic, partition, max, wait, visibility_ms)
                    .await?,
            },
            Plane::Cluster(ingress) => Consumed::Cluster(
                ingress
                    .consume(topic, partition, max, visibility_ms, wait, user)
                    .await?,
            ),
        })
    }

    /// Empties the queue of every partition of `topic` (the log keeps its records): how
    /// many messages went, and the partitions not purged (frozen for a move, or, in a
    /// cluster, whose owner did not answer and may or may not have purged them).
    pub async fn purge(self, topic: &str) -> Result<(u64, Vec<u32>), ApiError> {
        match self {
            Plane::Local(broker) => Ok(broker.purge(topic).await?),
            Plane::Cluster(ingress) => {
                let meta = ingress.broker.topic_meta(topic)?;
                let (mine, mut left) = ingress.broker.purge(topic).await?;
                let (theirs, more) = ingress.purge_others(&meta).await;
                left.extend(more);
                left.sort_unstable();
                Ok((mine + theirs, left))
            }
        }
    }

    /// Up to `max` records of partition `p` from `from` on, changing nothing, as the reply's
    /// body (`batch`: `{"messages": [...]}`); `None` when there are none.
    pub async fn replay(
        self,
        archive: Option<&ArchiveReader>,
        topic: &str,
        p: u32,
        from: ReplayFrom,
        max: usize,
        batch: bool,
    ) -> Result<Option<String>, ApiError> {
        match self {
            Plane::Local(broker) => {
                let recs = history(broker, archive, topic, p, from, max).await?;
                if recs.is_empty() {
                    return Ok(None);
                }
                let msgs: Vec<_> = recs.iter().map(|r| render::record(topic, p, r)).collect();
                Ok(Some(render::reply_text(&msgs, batch)))
            }
            Plane::Cluster(ingress) => {
                let msgs = ingress.replay(topic, p, from, max).await?;
                if msgs.is_empty() {
                    return Ok(None);
                }
                Ok(Some(Taken::read(msgs).body(batch)))
            }
        }
    }

    /// Settles one delivery of `topic` by its receipt handle.
    pub async fn settle(self, topic: &str, handle: &str, act: AckAction) -> Result<(), ApiError> {
        match self {
            Plane::Local(broker) => Ok(broker.settle(topic, handle, act).await?),
            Plane::Cluster(ingress) => {
                ingress.broker.check_topic(topic)?;
                ingress
                    .settle(topic, &[handle.to_owned()], act)
                    .await
                    .remove(0)
            }
        }
    }

    /// Settles each of `handles` (the topic was checked): one outcome per handle.
    pub async fn settle_many(
        self,
        topic: &str,
        handles: &[String],
        act: AckAction,
    ) -> Vec<Result<(), ApiError>> {
        match self {
            Plane::Local(broker) => broker
                .settle_many(topic, handles, act)
                .await
                .into_iter()
                .map(|r| r.map_err(ApiError::from))
                .collect(),
            Plane::Cluster(ingress) => ingress.settle(topic, handles, act).await,
        }
    }

    /// The children of `parent` with their lag (summed over every owner of its partitions in
    /// a cluster), and the partitions whose owners could not be asked.
    pub async fn children(self, parent: &str) -> Result<(Vec<ChildInfo>, Vec<u32>), ApiError> {
        match self {
            Plane::Local(broker) => Ok((broker.children(parent)?, Vec::new())),
            Plane::Cluster(ingress) => ingress.children(&ingress.broker.topic_meta(parent)?).await,
        }
    }

    /// Where a new fan-out link from `parent` starts when it starts at the latest record:
    /// on a single node, where the broker finds the end when it applies the link; in a
    /// cluster, at the ends the partitions' owners give (no member reads the others').
    pub async fn link_from_latest(self, parent: &str) -> Result<LinkStart, ApiError> {
        match self {
            Plane::Local(_) => Ok(LinkStart::Latest),
            Plane::Cluster(ingress) => {
                let meta = ingress.broker.topic_meta(parent)?;
                let starts = ingress.tails(&meta).await?;
                Ok(LinkStart::At {
                    parent_id: meta.id,
                    starts,
                })
            }
        }
    }

    /// Every partition's next offset (`frontier` false) or ack frontier (true) of `meta`;
    /// `503` in a cluster if an owner cannot be asked.
    pub async fn positions(self, meta: &TopicMeta, frontier: bool) -> Result<Vec<u64>, ApiError> {
        match self {
            Plane::Local(broker) => {
                let info = broker.topic_info(&meta.name)?;
                Ok(info
                    .partitions
                    .iter()
                    .map(|p| {
                        if frontier {
                            p.queue.frontier
                        } else {
                            p.log.next_offset.max(p.queue.frontier)
                        }
                    })
                    .collect())
            }
            Plane::Cluster(ingress) => ingress.positions(meta, frontier).await,
        }
    }

    /// Every partition's next offset, as the partitions' owners have it.
    pub async fn tails(self, meta: &TopicMeta) -> Result<Vec<u64>, ApiError> {
        match self {
            Plane::Local(broker) => Ok(broker.partition_tails(&meta.name)?),
            Plane::Cluster(ingress) => ingress.tails(meta).await,
        }
    }

    /// The figures of `meta`'s partitions held by other members (of `only`, if given), and
    /// the partitions whose owners could not be asked (none on a single node: it holds them
    /// all, and its own figures are read apart).
    pub async fn others_stats(
        self,
        meta: &TopicMeta,
        only: Option<u32>,
    ) -> (Vec<PartitionStatsJson>, Vec<u32>) {
        match self {
            Plane::Local(_) => (Vec::new(), Vec::new()),
            Plane::Cluster(ingress) => ingress.partition_stats(meta, only).await,
        }
    }

    /// Passes a mirror's source progress (the request `req` makes from the mirror's
    /// metadata) on to the other members owning partitions of mirror `topic`; the members
    /// that did not take it (none on a single node, which holds every partition).
    pub async fn share_mirror_progress(
        self,
        topic: &str,
        req: impl FnOnce(&TopicMeta) -> crate::forward::codec::MirrorProgressRequest,
    ) -> Result<Vec<u64>, ApiError> {
        match self {
            Plane::Local(_) => Ok(Vec::new()),
            Plane::Cluster(ingress) => {
                let meta = ingress.broker.topic_meta(topic)?;
                Ok(ingress.mirror_progress(&meta, req(&meta)).await)
            }
        }
    }

    /// The other members' shares of mirror `topic`'s report (`last`: settle and drop):
    /// their reports, what they settled, and the members that could not be asked; `None` on
    /// a single node (no other members).
    pub async fn others_mirror_reports(
        self,
        topic: &str,
        last: bool,
    ) -> Result<Option<OthersReports>, ApiError> {
        match self {
            Plane::Local(_) => Ok(None),
            Plane::Cluster(ingress) => {
                let meta = ingress.broker.topic_meta(topic)?;
                Ok(Some(ingress.mirror_reports(&meta, last).await))
            }
        }
    }

    /// `Ok` once every owner of `parent`'s partitions has applied the catalog this member
    /// follows (a change just recorded takes effect there): an owner answers the children
    /// question only once it followed this far. `503` naming the partitions whose owners
    /// did not confirm it (the change stands). A single node: at once.
    pub async fn owners_applied(self, parent: &str) -> Result<(), ApiError> {
        let Plane::Cluster(ingress) = self else {
            return Ok(());
        };
        let (_, missing) = ingress
            .children(&ingress.broker.topic_meta(parent)?)
            .await?;
        if missing.is_empty() {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!(
                "the change is recorded, but the owners of partitions {missing:?} of '{parent}' have not confirmed it yet (it takes effect there when they catch up); retry to wait for them"
            ),
        ))
    }
}
