//! Reads a node answers from what it holds: a partition's history (the archive below local
//! data, then the log) and its partitions' figures. Its own API serves them, and so does
//! its data service for the members that forward reads to it.

use std::sync::Arc;

use narad_core::broker::{Broker, ReplayFrom, TopicInfo};
use narad_core::record::Record;
use narad_replay::ArchiveReader;
use narad_wire::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::http::error::ApiError;

fn archive_error(e: narad_replay::ReplayError) -> ApiError {
    tracing::warn!(error = %e, "archive read failed");
    ApiError::new(
        ErrorCode::ArchiveUnavailable,
        format!("the archive could not serve this read: {e}"),
    )
}

/// A replay read of a partition this node holds: from the archive when it starts below local
/// data, else local. (A cluster member's reads of its own partitions come here too.)
pub async fn history(
    broker: &Broker,
    archive: Option<&ArchiveReader>,
    topic: &str,
    partition: u32,
    from: ReplayFrom,
    max: usize,
) -> Result<Vec<Arc<Record>>, ApiError> {
    if let Some(reader) = archive {
        let archived = narad_replay::read_archived(broker, reader, topic, partition, from, max)
            .await
            .map_err(|e| match e {
                narad_replay::HistoryError::Broker(e) => ApiError::from(e),
                narad_replay::HistoryError::Archive(e) => archive_error(e),
            })?;
        if let Some(recs) = archived {
            return Ok(recs.into_iter().map(Arc::new).collect());
        }
    }
    Ok(broker.replay(topic, partition, from, max).await?)
}

/// One partition's figures (on a cluster member, gathered from its owner).
#[derive(Serialize, Deserialize)]
pub struct PartitionStatsJson {
    pub partition: u32,
    oldest_offset: u64,
    pub next_offset: u64,
    /// Every offset below this is acked.
    pub frontier: u64,
    pub unacked: u64,
    pub in_flight: usize,
    pub delayed: usize,
    acked_ahead: u64,
    bytes: u64,
    segments: usize,
    open: bool,
}

/// The figures of the partitions of `info` this node serves (all of them on a single node,
/// the ones it owns in a cluster), or only of `only`.
pub fn local_stats(
    broker: &Broker,
    info: &TopicInfo,
    only: Option<u32>,
) -> Vec<PartitionStatsJson> {
    info.partitions
        .iter()
        .filter(|p| only.is_none_or(|o| o == p.partition))
        .filter(|p| broker.is_local(&info.meta, p.partition))
        .map(|p| PartitionStatsJson {
            partition: p.partition,
            oldest_offset: p.log.oldest_offset,
            next_offset: p.log.next_offset.max(p.queue.frontier),
            frontier: p.queue.frontier,
            unacked: p.queue.unacked,
            in_flight: p.queue.in_flight,
            delayed: p.queue.delayed,
            acked_ahead: p.queue.acked_ahead,
            bytes: p.log.bytes,
            segments: p.log.segments,
            open: p.open,
        })
        .collect()
}
