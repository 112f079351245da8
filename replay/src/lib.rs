//! Reading history from the archive: by offset and by time, through the partition manifests
//! and the Parquet row-group statistics, with small caches so a sequential replay fetches each
//! object once and decodes each row group once.
//!
//! Local segments are read by the broker; the HTTP replay and the CLI come here for offsets
//! below the oldest local one (see `narad-infra`'s consume handler).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_core::broker::{Broker, BrokerError, ReplayFrom};
use narad_core::record::Record;
use narad_tiering::archive::{Archive, ArchiveError, ArchivedSegment, PartitionManifest};
use narad_tiering::format::{self, FormatError};
use object_store::ObjectStoreExt;
use parking_lot::Mutex;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{FileReader, SerializedFileReader};

/// Manifests are re-read after this long (the tiering loop keeps appending to them).
const MANIFEST_TTL: Duration = Duration::from_secs(1);
const OBJECT_CACHE: usize = 2;
const GROUP_CACHE: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("archive object {path}: {source}")]
    Format {
        path: String,
        #[source]
        source: FormatError,
    },
}

/// Why a history read failed: the broker (topic, partition, local log) or the archive.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Archive(#[from] ReplayError),
}

/// The one place that decides where history comes from: a replay read that starts below the
/// oldest local offset is served from the archive; `None` means local data serves it (or
/// answers 410 when neither holds the offset). An offset older than archive retention is
/// `OffsetTruncated`.
pub async fn read_archived(
    broker: &Broker,
    reader: &ArchiveReader,
    topic: &str,
    partition: u32,
    from: ReplayFrom,
    max: usize,
) -> Result<Option<Vec<Record>>, HistoryError> {
    let (oldest_local, _) = broker.local_range(topic, partition)?;
    if let ReplayFrom::Offset(o) = from
        && o >= oldest_local
    {
        return Ok(None); // the common case: no metadata clone, no archive
    }
    let id = broker.topic_meta(topic)?.id;
    let offset = match from {
        ReplayFrom::Offset(o) => o,
        ReplayFrom::TimeMs(t) => {
            // when local data already has a record before `t`, everything archived (older) is
            // before it too: no need to ask the archive (and no need for it to be reachable)
            if broker.local_offset_for_time(topic, partition, t).await? > oldest_local {
                return Ok(None);
            }
            match reader.offset_for_time(topic, id, partition, t).await? {
                Some(o) if o < oldest_local => o,
                _ => return Ok(None),
            }
        }
    };
    match reader.read(topic, id, partition, offset, max).await? {
        ArchiveRead::Records(r) => Ok(Some(r)),
        ArchiveRead::Expired { oldest } => Err(BrokerError::OffsetTruncated {
            requested: offset,
            oldest,
        }
        .into()),
        ArchiveRead::Absent => Ok(None),
    }
}

/// What the archive holds at a position.
#[derive(Debug)]
pub enum ArchiveRead {
    /// Records from the requested offset on (possibly fewer than asked: the caller continues
    /// from the last offset + 1).
    Records(Vec<Record>),
    /// The offset is older than archive retention kept; `oldest` is the first archived one.
    Expired { oldest: u64 },
    /// The archive does not hold this offset (not archived yet, or no archive for the topic).
    Absent,
}

type Decoded = Arc<Vec<Record>>;
/// A manifest as fetched, per (topic, partition), with when it was fetched.
type CachedManifest = (String, u32, Instant, Arc<PartitionManifest>);

pub struct ArchiveReader {
    archive: Archive,
    manifests: Mutex<Vec<CachedManifest>>,
    objects: Mutex<VecDeque<(String, Bytes, Arc<ParquetMetaData>)>>,
    groups: Mutex<VecDeque<(String, usize, Decoded)>>,
}

impl ArchiveReader {
    pub fn new(archive: Archive) -> Self {
        Self {
            archive,
            manifests: Mutex::default(),
            objects: Mutex::default(),
            groups: Mutex::default(),
        }
    }

    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    /// The partition's manifest for this topic incarnation (`None` if none, or another one).
    pub async fn manifest(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
    ) -> Result<Option<Arc<PartitionManifest>>, ReplayError> {
        {
            let cache = self.manifests.lock();
            if let Some((_, _, at, m)) = cache
                .iter()
                .find(|(t, p, _, _)| t == topic && *p == partition)
                && at.elapsed() < MANIFEST_TTL
            {
                return Ok((m.topic_id == topic_id).then(|| m.clone()));
            }
        }
        self.fetch_manifest(topic, topic_id, partition).await
    }

    /// The partition's manifest as the archive has it now (the cache refreshed).
    async fn fetch_manifest(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
    ) -> Result<Option<Arc<PartitionManifest>>, ReplayError> {
        let Some(m) = self.archive.load_manifest(topic, partition).await? else {
            return Ok(None);
        };
        let m = Arc::new(m);
        let mut cache = self.manifests.lock();
        cache.retain(|(t, p, _, _)| !(t == topic && *p == partition));
        cache.push((topic.to_owned(), partition, Instant::now(), m.clone()));
        if cache.len() > 1024 {
            cache.remove(0);
        }
        Ok((m.topic_id == topic_id).then_some(m))
    }

    /// Up to `max` records from `from` on, from the archive.
    pub async fn read(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        from: u64,
        max: usize,
    ) -> Result<ArchiveRead, ReplayError> {
        let m = match self.manifest(topic, topic_id, partition).await? {
            Some(m) if from < m.next_offset => Some(m),
            // not in the manifest as cached: the tierer may have archived it since (and
            // local retention deleted it), so the archive is asked again before anyone is
            // told the offset is gone
            _ => self.fetch_manifest(topic, topic_id, partition).await?,
        };
        let Some(m) = m else {
            return Ok(ArchiveRead::Absent);
        };
        if from < m.start_offset {
            return Ok(ArchiveRead::Expired {
                oldest: m.start_offset,
            });
        }
        let Some(seg) = m.segment_at_or_after(from) else {
            return Ok(ArchiveRead::Absent);
        };
        // a recorded gap (a lost tail) holds no record: the read goes on at its end
        let from = match m.gap_end(from) {
            Some(end) if end == seg.first_offset => end,
            _ => from,
        };
        if seg.first_offset > from {
            // a gap the archive did not record: never skip offsets silently
            return Ok(ArchiveRead::Absent);
        }
        let seg = seg.clone();
        let (path, meta) = self.object(topic, topic_id, partition, &seg).await?;
        let mut out = Vec::new();
        // the same reply cap as local reads: by reply weight, at least one record
        let mut weight = 0usize;
        for (g, rg) in meta.row_groups().iter().enumerate() {
            let Some((_, hi)) = format::int64_range(rg.column(0).statistics()) else {
                continue;
            };
            if (hi as u64) < from {
                continue;
            }
            let recs = self.group(&path, g).await?;
            for r in recs.iter().filter(|r| r.offset >= from) {
                if out.len() >= max || weight >= narad_core::broker::MAX_READ_BYTES {
                    break;
                }
                weight += r.reply_weight();
                out.push(r.clone());
            }
            if out.len() >= max || weight >= narad_core::broker::MAX_READ_BYTES {
                break;
            }
        }
        Ok(ArchiveRead::Records(out))
    }

    /// The first archived offset committed at or after `ts_ms`, if the archive has one.
    pub async fn offset_for_time(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        ts_ms: i64,
    ) -> Result<Option<u64>, ReplayError> {
        let Some(m) = self.manifest(topic, topic_id, partition).await? else {
            return Ok(None);
        };
        let Some(seg) = m.segment_for_time(ts_ms).cloned() else {
            return Ok(None);
        };
        if seg.min_ts >= ts_ms {
            return Ok(Some(seg.first_offset));
        }
        let (path, meta) = self.object(topic, topic_id, partition, &seg).await?;
        for (g, rg) in meta.row_groups().iter().enumerate() {
            match format::int64_range(rg.column(1).statistics()) {
                Some((_, hi)) if hi < ts_ms => continue,
                _ => {}
            }
            let recs = self.group(&path, g).await?;
            if let Some(r) = recs.iter().find(|r| r.timestamp_ms >= ts_ms) {
                return Ok(Some(r.offset));
            }
        }
        Ok(None)
    }

    /// Every record of one archived segment, fetched and decoded whole (not cached): what a
    /// rebuild from the archive writes back to local disk. The records must be exactly the
    /// segment's offsets, `first_offset..=last_offset`, each once and in order.
    pub async fn segment_records(
        &self,
        topic: &str,
        partition: u32,
        seg: &ArchivedSegment,
    ) -> Result<Vec<Record>, ReplayError> {
        let path = self
            .archive
            .partition_dir(topic, partition)
            .join(seg.object.as_str());
        let bytes = self.fetch(&path).await?;
        let key = path.to_string();
        let records = tokio::task::spawn_blocking(move || format::decode(bytes, None))
            .await
            .map_err(|e| ReplayError::Format {
                path: key.clone(),
                source: FormatError::Foreign(e.to_string()),
            })?
            .map_err(|source| ReplayError::Format {
                path: key.clone(),
                source,
            })?;
        let contiguous = records
            .iter()
            .enumerate()
            .all(|(i, r)| Some(r.offset) == seg.first_offset.checked_add(i as u64));
        if !contiguous || records.last().map(|r| r.offset) != Some(seg.last_offset) {
            return Err(ReplayError::Format {
                path: key,
                source: FormatError::Foreign(format!(
                    "the object does not hold exactly offsets {}..={} in order",
                    seg.first_offset, seg.last_offset
                )),
            });
        }
        Ok(records)
    }

    /// Fetches (or finds cached) an archived object and its footer. Cache keys carry the
    /// incarnation and the object size: a re-created topic's object at the same path is a
    /// different entry.
    async fn object(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        seg: &ArchivedSegment,
    ) -> Result<(String, Arc<ParquetMetaData>), ReplayError> {
        let path = self
            .archive
            .partition_dir(topic, partition)
            .join(seg.object.as_str());
        let key = format!("{topic_id}:{}:{path}", seg.object_bytes);
        if let Some((_, _, meta)) = self.objects.lock().iter().find(|(k, _, _)| *k == key) {
            return Ok((key, meta.clone()));
        }
        let bytes = self.fetch(&path).await?;
        let reader = SerializedFileReader::new(bytes.clone()).map_err(|e| ReplayError::Format {
            path: key.clone(),
            source: e.into(),
        })?;
        let meta = Arc::new(reader.metadata().clone());
        let mut cache = self.objects.lock();
        cache.push_back((key.clone(), bytes, meta.clone()));
        while cache.len() > OBJECT_CACHE {
            cache.pop_front();
        }
        Ok((key, meta))
    }

    async fn fetch(&self, path: &object_store::path::Path) -> Result<Bytes, ReplayError> {
        let got = self
            .archive
            .store
            .get(path)
            .await
            .map_err(ArchiveError::from)?;
        Ok(got.bytes().await.map_err(ArchiveError::from)?)
    }

    /// Decodes one row group of a cached object (the object is refetched if evicted).
    async fn group(&self, key: &str, g: usize) -> Result<Decoded, ReplayError> {
        if let Some((_, _, d)) = self
            .groups
            .lock()
            .iter()
            .find(|(k, i, _)| k == key && *i == g)
        {
            return Ok(d.clone());
        }
        let cached = self
            .objects
            .lock()
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, b, _)| b.clone());
        let bytes = match cached {
            Some(b) => b,
            None => {
                // the key is "<topic id>:<size>:<path>"
                let path = object_store::path::Path::from(key.splitn(3, ':').nth(2).unwrap_or(key));
                self.fetch(&path).await?
            }
        };
        let k = key.to_owned();
        let decoded = tokio::task::spawn_blocking(move || format::decode(bytes, Some(vec![g])))
            .await
            .map_err(|e| ReplayError::Format {
                path: k.clone(),
                source: FormatError::Foreign(e.to_string()),
            })?
            .map_err(|source| ReplayError::Format { path: k, source })?;
        let d = Arc::new(decoded);
        let mut cache = self.groups.lock();
        cache.push_back((key.to_owned(), g, d.clone()));
        while cache.len() > GROUP_CACHE {
            cache.pop_front();
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests;
