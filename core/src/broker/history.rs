//! Reading history without touching queue state: replay, and the sealed segments and
//! ranges the tierer and the replay reader ask for.

use super::*;

impl Broker {
    /// Reads history without touching queue state.
    pub async fn replay(
        &self,
        topic_name: &str,
        partition: u32,
        from: ReplayFrom,
        max: usize,
    ) -> Result<Vec<Arc<Record>>, BrokerError> {
        self.check_running()?;
        let part = self.topic(topic_name)?.partition(partition)?;
        let log = self.log_of(&part).await?;
        part.touch(self.clock.now_ms());
        let recs = tokio::task::spawn_blocking(move || -> Result<_, LogError> {
            let offset = match from {
                ReplayFrom::Offset(o) => o,
                ReplayFrom::TimeMs(t) => log.offset_for_time(t)?,
            };
            log.read(offset, max, MAX_READ_BYTES)
        })
        .await
        .expect("replay task");
        Ok(recs?)
    }

    pub(super) fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<Partition>, BrokerError> {
        self.topic(topic)?.partition(partition)
    }

    /// The sealed segments of a partition, oldest first. An idle (closed) partition is not
    /// reopened: nothing is sealed while it is closed, so it answers with what it had when it
    /// closed. (The archive asks about every partition every pass; reopening each would
    /// keep idle logs open, or with `max_open_logs` evict and reopen them every pass.)
    pub async fn sealed_segments(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Vec<SealedSegment>, BrokerError> {
        Ok(self.partition(topic, partition)?.sealed_segments())
    }

    /// Every record of one sealed segment, for the archive.
    pub async fn read_segment(
        &self,
        topic: &str,
        partition: u32,
        base: u64,
    ) -> Result<Vec<Record>, BrokerError> {
        let part = self.partition(topic, partition)?;
        let log = self.log_of(&part).await?;
        tokio::task::spawn_blocking(move || log.read_segment(base))
            .await
            .map_err(|e| BrokerError::Storage(LogError::Poisoned(e.to_string())))?
            .map_err(Into::into)
    }

    /// Records that the archive holds (uploaded and verified) every offset below `below` of
    /// incarnation `topic_id`; retention may then delete local segments that end at or before
    /// it. Never moves back. A mark for another incarnation of the name (the topic was deleted
    /// and re-created while its segment was uploading) is refused with `TopicNotFound`.
    pub fn set_archived(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        below: u64,
    ) -> Result<(), BrokerError> {
        let t = self.topic(topic)?;
        if t.meta.read().id != topic_id {
            return Err(BrokerError::TopicNotFound(topic.to_owned()));
        }
        let part = t.partition(partition)?;
        part.archived_below.fetch_max(below, Ordering::AcqRel);
        Ok(())
    }

    /// The first local offset committed at or after `ts_ms` (the oldest local offset when all
    /// local data is newer; the next offset when none is).
    pub async fn local_offset_for_time(
        &self,
        topic: &str,
        partition: u32,
        ts_ms: i64,
    ) -> Result<u64, BrokerError> {
        let part = self.partition(topic, partition)?;
        let log = self.log_of(&part).await?;
        tokio::task::spawn_blocking(move || log.offset_for_time(ts_ms))
            .await
            .map_err(|e| BrokerError::Storage(LogError::Poisoned(e.to_string())))?
            .map_err(Into::into)
    }

    /// The oldest offset still on local disk and the next offset to be written.
    /// The data directory this broker keeps its files in.
    pub fn data_dir(&self) -> &std::path::Path {
        &self.cfg.data_dir
    }

    /// How long records stay on local disk here (0: no age limit): the topic's retention,
    /// or with an archive the shorter of it and `local_retention_ms` (archived records older
    /// than that are read from the archive).
    pub fn local_retention_ms(&self, cfg: &crate::topic::TopicConfig) -> i64 {
        let local = if self.cfg.archive_gate {
            self.cfg.local_retention_ms
        } else {
            0
        };
        match (cfg.retention_ms, local) {
            (0, l) => l,
            (r, 0) => r,
            (r, l) => r.min(l),
        }
    }

    /// The queue's frontier in partition `partition` here: every offset below it was acked
    /// (or went with retention). What the archive records for a rebuild after a node loss.
    pub fn queue_frontier(&self, topic: &str, partition: u32) -> Result<u64, BrokerError> {
        Ok(self.partition(topic, partition)?.queue.lock().frontier())
    }

    pub fn local_range(&self, topic: &str, partition: u32) -> Result<(u64, u64), BrokerError> {
        let s = self.partition(topic, partition)?.stats();
        Ok((s.oldest_offset, s.next_offset))
    }
}
