//! The answering side of the move calls: what a target's mover asks of the member that owns
//! the partition (list its files, read a chunk, freeze it), the planner's and forget's calls
//! (rebalance, probes, witness reports), and what the calls carry.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_cluster::rpc::{Fault, Op};
use narad_core::broker::moves::{FrozenPartition, PartitionFile};
use narad_core::broker::{Broker, BrokerError};
use serde::{Deserialize, Serialize};

use narad_cluster::rpc::ops::{
    MEMBER_PROBE, MOVE_FREEZE, MOVE_LIST, MOVE_PROGRESS, MOVE_READ, MOVE_REBALANCE, SEEN_ENDS,
    WITNESS,
};

use crate::http::error::ApiError;

use super::forget::MAX_SEEN_ASK;
use super::{Mover, PROBE_WITHIN};

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListRequest {
    pub(super) topic: String,
    pub(super) topic_id: u64,
    pub(super) partition: u32,
    pub(super) catalog: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListReply {
    pub(super) incarnation: u64,
    pub(super) files: Vec<PartitionFile>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadRequest {
    pub(super) topic: String,
    pub(super) topic_id: u64,
    pub(super) partition: u32,
    pub(super) name: String,
    pub(super) pos: u64,
    pub(super) len: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FreezeRequest {
    pub(super) topic: String,
    pub(super) topic_id: u64,
    pub(super) partition: u32,
    pub(super) catalog: u64,
    pub(super) owner_epoch: u64,
    /// The move the freeze is for (the source refuses it unless the move is in flight).
    pub(super) move_id: u64,
    pub(super) token: u64,
    pub(super) ttl_ms: u64,
    /// Only renew a freeze held under `token` (refused if there is none: it lapsed).
    #[serde(default)]
    pub(super) renew: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FreezeReply {
    pub(super) incarnation: u64,
    #[serde(flatten)]
    pub(super) frozen: FrozenPartition,
}

/// One move in flight on its target, as `GET /v1/cluster/moves` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    pub topic: String,
    pub partition: u32,
    pub move_id: u64,
    pub phase: String,
    pub bytes_copied: u64,
    pub attempts: u32,
    pub started_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

fn malformed(what: &str) -> Fault {
    Fault::new(
        400,
        "malformed_request",
        format!("a malformed {what} request"),
    )
}

fn fault(e: BrokerError) -> Fault {
    let e: ApiError = e.into();
    Fault::new(e.code.http_status(), e.code.as_str(), e.message)
}

/// The source's side: answers the move ops (`None` for any other op).
pub async fn serve(
    broker: &Arc<Broker>,
    mover: Option<&Arc<Mover>>,
    op: Op,
    body: &Bytes,
) -> Option<Result<Bytes, Fault>> {
    let r = match op {
        MOVE_LIST => list(broker, body).await,
        MOVE_READ => read(broker, body).await,
        MOVE_FREEZE => freeze(broker, body).await,
        MOVE_PROGRESS => Ok(Bytes::from(
            serde_json::to_vec(&mover.map(|m| m.progress()).unwrap_or_default())
                .expect("progress serialises"),
        )),
        SEEN_ENDS => {
            let ask: Vec<(u64, u32)> = match serde_json::from_slice(body) {
                Ok(a) => a,
                Err(_) => return Some(Err(malformed("seen ends"))),
            };
            if ask.len() > MAX_SEEN_ASK {
                return Some(Err(malformed("seen ends")));
            }
            let ingress = mover.and_then(|m| m.ingress.upgrade());
            let ends: Vec<u64> = ask
                .iter()
                .map(|&(t, p)| ingress.as_ref().map_or(0, |i| i.seen_end(t, p)))
                .collect();
            Ok(Bytes::from(serde_json::to_vec(&ends).expect("serialises")))
        }
        MEMBER_PROBE => {
            let id: u64 = match serde_json::from_slice(body) {
                Ok(id) => id,
                Err(_) => return Some(Err(malformed("member probe"))),
            };
            let answers = match mover {
                Some(m) => m.answers_fresh(id, PROBE_WITHIN).await,
                None => false,
            };
            Ok(Bytes::from(
                serde_json::to_vec(&answers).expect("serialises"),
            ))
        }
        WITNESS => {
            let ends: Vec<(u64, u32, u64)> = match serde_json::from_slice(body) {
                Ok(a) => a,
                Err(_) => return Some(Err(malformed("witness"))),
            };
            if ends.len() > MAX_SEEN_ASK {
                return Some(Err(malformed("witness")));
            }
            if let Some(i) = mover.and_then(|m| m.ingress.upgrade()) {
                i.witness(&ends);
            }
            Ok(Bytes::new())
        }
        MOVE_REBALANCE => match mover {
            Some(m) => m
                .rebalance_here()
                .await
                .map(|planned| Bytes::from(serde_json::to_vec(&planned).expect("serialises")))
                .map_err(|e| Fault::new(e.code.http_status(), e.code.as_str(), e.message)),
            None => Err(Fault::new(
                503,
                "cluster_unavailable",
                "no mover on this member yet",
            )),
        },
        _ => return None,
    };
    Some(r)
}

async fn list(broker: &Arc<Broker>, body: &Bytes) -> Result<Bytes, Fault> {
    let req: ListRequest = serde_json::from_slice(body).map_err(|_| malformed("move list"))?;
    let _ = broker.catch_up(req.catalog, Duration::from_secs(2)).await;
    let files = broker
        .partition_files(&req.topic, req.topic_id, req.partition)
        .await
        .map_err(fault)?;
    let reply = ListReply {
        incarnation: broker.incarnation(),
        files,
    };
    Ok(Bytes::from(serde_json::to_vec(&reply).expect("serialises")))
}

async fn read(broker: &Arc<Broker>, body: &Bytes) -> Result<Bytes, Fault> {
    let req: ReadRequest = serde_json::from_slice(body).map_err(|_| malformed("move read"))?;
    broker
        .read_partition_file(
            &req.topic,
            req.topic_id,
            req.partition,
            &req.name,
            req.pos,
            req.len,
        )
        .await
        .map_err(fault)
}

async fn freeze(broker: &Arc<Broker>, body: &Bytes) -> Result<Bytes, Fault> {
    let req: FreezeRequest = serde_json::from_slice(body).map_err(|_| malformed("move freeze"))?;
    if req.token == 0 || req.ttl_ms == 0 || req.ttl_ms > 120_000 {
        return Err(malformed("move freeze"));
    }
    if !broker.catch_up(req.catalog, Duration::from_secs(2)).await {
        return Err(fault(BrokerError::ClusterUnavailable(
            "the source has not caught up with the cluster's catalog yet; retry".into(),
        )));
    }
    let frozen = broker
        .freeze_partition(
            &req.topic,
            req.topic_id,
            req.partition,
            narad_core::broker::moves::FreezeAsk {
                owner_epoch: req.owner_epoch,
                move_id: req.move_id,
                token: req.token,
                ttl: Duration::from_millis(req.ttl_ms),
                renew: req.renew,
            },
        )
        .await
        .map_err(fault)?;
    let reply = FreezeReply {
        incarnation: broker.incarnation(),
        frozen,
    };
    Ok(Bytes::from(serde_json::to_vec(&reply).expect("serialises")))
}
