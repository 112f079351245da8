//! A cluster member's partitions, checked at its start against what the cluster saw
//! acknowledged.
//!
//! A member whose data directory was restored from an older copy (a VM snapshot, a backup)
//! holds logs that end below offsets it acknowledged before: served as they are, they would
//! hand those offsets out again for other records, and the acknowledged records would be
//! gone without a word. So a member opens every partition held ([`Partition::is_unverified`]:
//! nothing appended, leased, settled or read), and its cluster layer asks the other members
//! how far each partition was acknowledged, then either lets it go
//! ([`Broker::set_verified`]) or, for one whose log ends below that, goes on after the
//! acknowledged end with the range between recorded as a gap ([`Broker::reopen_after`]), as a
//! rebuild from the archive does: the loss is logged and counted, and no offset a client was
//! told of ever names another record.

use super::*;
use crate::broker::partition::{self, Partition};

impl Broker {
    /// Whether partitions opened now are held for the check (a cluster member's start, until
    /// [`Broker::end_verifying`]).
    pub fn verifying(&self) -> bool {
        self.verifying.load(Ordering::SeqCst)
    }

    /// The start's check is done: partitions opened from now on (topics made or grown since)
    /// are served at once.
    pub fn end_verifying(&self) {
        if self.verifying.swap(false, Ordering::SeqCst) {
            tracing::info!(
                "every partition opened at start was checked against what the cluster acknowledged"
            );
        }
    }

    /// The partitions held for the check: their topic's metadata, the partition, and one past
    /// the last offset of its log here.
    pub fn unverified(&self) -> Vec<(TopicMeta, u32, u64)> {
        let topics: Vec<Arc<Topic>> = self.topics.read().values().cloned().collect();
        let mut out = Vec::new();
        for t in topics {
            let meta = t.meta.read().clone();
            for part in t.partitions().iter().filter(|p| p.is_unverified()) {
                out.push((meta.clone(), part.index, part.stats().next_offset));
            }
        }
        out
    }

    /// The durable log ends of the partitions this node owns and serves: (topic incarnation
    /// id, partition, one past the last durable offset). What its peers keep as witnesses.
    /// Reads no closed log.
    pub fn owned_ends(&self) -> Vec<(u64, u32, u64)> {
        let topics: Vec<Arc<Topic>> = self.topics.read().values().cloned().collect();
        let mut out = Vec::new();
        for t in topics {
            let meta = t.meta.read().clone();
            for part in t.partitions().iter() {
                if self.is_local(&meta, part.index)
                    && !part.is_unverified()
                    && !part.is_awaiting_rebuild()
                {
                    out.push((meta.id, part.index, part.stats().next_offset));
                }
            }
        }
        out
    }

    /// Partition `p` of `topic` (incarnation `topic_id`) is checked: served from now on.
    pub fn set_verified(&self, topic: &str, topic_id: u64, p: u32) {
        if let Ok(t) = self.topic(topic)
            && t.id() == topic_id
            && let Ok(part) = t.partition(p)
        {
            part.set_verified();
        }
    }

    /// Partition `p` of `topic` (incarnation `topic_id`, held for the check) ends below
    /// `acked_end`, what the cluster saw acknowledged: its log goes on at `acked_end`, the
    /// range between recorded as a gap (no record will ever be there; acked in its queue, so
    /// no reader waits for it). Answers the lost range, `None` if the log reaches `acked_end`
    /// after all (it is then served as it is). The records below the log's end stay.
    pub async fn reopen_after(
        &self,
        topic: &str,
        topic_id: u64,
        p: u32,
        acked_end: u64,
    ) -> Result<Option<(u64, u64)>, BrokerError> {
        let _one = self.moves_lock.lock().await;
        let t = self.topic(topic)?;
        if t.id() != topic_id {
            return Err(BrokerError::TopicNotFound(topic.to_owned()));
        }
        let old = t.partition(p)?;
        if !old.is_unverified() {
            return Ok(None);
        }
        old.close().await;
        let local_end = old.stats().next_offset;
        if local_end >= acked_end {
            old.set_verified();
            return Ok(None);
        }
        old.retire().await;
        // no WAL file may name frames of the log as it was (a replay would write them again)
        self.checkpoint_wal().await?;
        let env = self.log_env();
        let dir = old.dir.clone();
        let part = tokio::task::spawn_blocking(move || -> Result<Partition, BrokerError> {
            continue_at(&dir, local_end, acked_end).map_err(|source| {
                BrokerError::Storage(LogError::Io {
                    path: dir.clone(),
                    source,
                })
            })?;
            Ok(Partition::open(p, dir, &env)?)
        })
        .await
        .expect("partition reopen task")?;
        let end = part.stats().next_offset;
        if end != acked_end {
            return Err(BrokerError::Storage(LogError::Io {
                path: part.dir.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("the log reopened after {acked_end} ends at {end}"),
                ),
            }));
        }
        let part = Arc::new(part);
        part.close().await;
        self.replace_partition(&t, p, part);
        Ok(Some((local_end, acked_end)))
    }
}

/// In partition directory `dir`, whose log ends at `local_end`: the log goes on at
/// `acked_end` (an empty segment there), `local_end..acked_end` recorded as a gap and acked
/// in the queue's state. Each step is durable before the next, and a directory a crash
/// leaves between two of them opens (the check then runs again at the next start): the gap
/// is recorded first, the empty segment that begins the new stretch is written before an
/// empty one it replaces is removed. Blocking.
fn continue_at(dir: &Path, local_end: u64, acked_end: u64) -> std::io::Result<()> {
    let mut gaps = crate::log::segment::read_gaps(dir)?;
    if !gaps.contains(&(local_end, acked_end)) {
        gaps.push((local_end, acked_end));
        gaps.sort_unstable();
        crate::log::segment::write_gaps(dir, &gaps)?;
    }
    let mut snap = partition::read_snapshot(dir)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?
        .unwrap_or_default();
    snap.acked.retain(|&(_, e)| e <= local_end);
    snap.counts.retain(|&(o, _)| o < local_end);
    if snap.frontier >= local_end {
        snap.frontier = acked_end;
    } else if let Some(last) = snap.acked.last_mut().filter(|r| r.1 == local_end) {
        last.1 = acked_end;
    } else {
        snap.acked.push((local_end, acked_end));
    }
    partition::write_snapshot(dir, &snap)?;
    crate::fsutil::open_or_create_private(&crate::log::segment::segment_path(dir, acked_end))?
        .sync_all()?;
    crate::fsutil::sync_dir(dir)?;
    // an empty active segment goes: nothing is below the gap there, and a log of nothing
    // must begin at its next offset (so replays below it go to the archive)
    let empty = crate::log::segment::segment_path(dir, local_end);
    if std::fs::metadata(&empty).is_ok_and(|m| m.len() == 0) {
        std::fs::remove_file(&empty)?;
        let _ = std::fs::remove_file(crate::log::segment::index_path(dir, local_end));
        crate::fsutil::sync_dir(dir)?;
    }
    Ok(())
}
