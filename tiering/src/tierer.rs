//! The tiering loop: every sealed segment of every partition goes to the archive once, as
//! Parquet, is verified from the stored footer, and only then may local retention delete it.
//! An unreachable archive only delays that: local segments stay (a metric and a log say so)
//! and produce keeps working.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use narad_core::broker::{Broker, BrokerError};
use narad_core::clock::SharedClock;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use parquet::file::metadata::ParquetMetaDataReader;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::archive::{Archive, ArchiveError, ArchivedSegment, PartitionManifest, TopicManifest};
use crate::format::{self, FORMAT_VERSION};

/// Uploads above this size go through multipart upload.
const MULTIPART_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct TieringConfig {
    /// How often the loop looks for new sealed segments.
    pub interval: Duration,
    /// Archive objects whose newest record is older than this are deleted; 0 keeps forever.
    pub archive_retention_ms: i64,
    /// Partitions tiered at the same time.
    pub concurrency: usize,
    /// First retry delay after a failure; doubles up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for TieringConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            archive_retention_ms: 0,
            concurrency: 2,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub topic: String,
    pub partition: u32,
}

/// The loop's metrics, registered by the server next to the broker's.
#[derive(Default)]
pub struct TieringMetrics {
    pub segments_archived: Counter,
    pub bytes_archived: Counter,
    pub segment_bytes_archived: Counter,
    pub failures: Counter,
    pub objects_deleted: Counter,
    pub lag_segments: Family<PartitionLabels, Gauge>,
    pub lag_seconds: Family<PartitionLabels, Gauge>,
}

impl TieringMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "narad_archive_segments",
            "sealed segments uploaded to the archive and verified",
            self.segments_archived.clone(),
        );
        r.register(
            "narad_archive_object_bytes",
            "bytes of Parquet uploaded to the archive",
            self.bytes_archived.clone(),
        );
        r.register(
            "narad_archive_segment_bytes",
            "bytes of local segments archived (before Parquet encoding)",
            self.segment_bytes_archived.clone(),
        );
        r.register(
            "narad_archive_failures",
            "failed archive attempts (upload, verification, manifest); retried with backoff",
            self.failures.clone(),
        );
        r.register(
            "narad_archive_objects_deleted",
            "archive objects deleted by archive retention",
            self.objects_deleted.clone(),
        );
        r.register(
            "narad_archive_lag_segments",
            "sealed local segments not yet archived",
            self.lag_segments.clone(),
        );
        r.register(
            "narad_archive_lag_seconds",
            "age of the oldest sealed segment not yet archived",
            self.lag_seconds.clone(),
        );
    }
}

pub struct Tierer {
    broker: Arc<Broker>,
    archive: Archive,
    cfg: TieringConfig,
    clock: SharedClock,
    pub metrics: Arc<TieringMetrics>,
    /// Manifests as last written, per (topic, partition).
    manifests: tokio::sync::Mutex<HashMap<(String, u32), PartitionManifest>>,
    /// `_topic.json` as last written, per topic.
    topics_saved: tokio::sync::Mutex<HashMap<String, TopicManifest>>,
}

impl Tierer {
    pub fn new(
        broker: Arc<Broker>,
        archive: Archive,
        cfg: TieringConfig,
        clock: SharedClock,
        metrics: Arc<TieringMetrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            broker,
            archive,
            cfg,
            clock,
            metrics,
            manifests: tokio::sync::Mutex::new(HashMap::new()),
            topics_saved: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Runs passes until `shutdown` (looked at between passes: a pass in flight finishes, or
    /// is abandoned by the server's stop deadline); a failed pass is retried with exponential
    /// backoff. Waits on the tierer's clock.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut backoff = self.cfg.backoff;
        loop {
            let delay = match self.clone().pass().await {
                Ok(()) => {
                    backoff = self.cfg.backoff;
                    self.cfg.interval
                }
                Err(e) => {
                    self.metrics.failures.inc();
                    tracing::warn!(archive = %self.archive.url, error = %e, retry_in = ?backoff, "archiving failed; local segments are kept until it succeeds");
                    let d = backoff;
                    backoff = (backoff * 2).min(self.cfg.max_backoff);
                    d
                }
            };
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = self.clock.sleep(delay) => {}
            }
        }
    }

    /// One pass over every partition of every topic. The first error is returned after every
    /// partition was tried (one unreachable object does not stall the others).
    pub async fn pass(self: Arc<Self>) -> Result<(), ArchiveError> {
        let mut work = Vec::new();
        for name in self.broker.topic_names() {
            let Ok(meta) = self.broker.topic_meta(&name) else {
                continue; // deleted meanwhile
            };
            for p in 0..meta.config.partitions {
                work.push((name.clone(), p));
            }
        }
        let sem = Arc::new(tokio::sync::Semaphore::new(self.cfg.concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        for (topic, p) in work {
            let (me, sem) = (self.clone(), sem.clone());
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.expect("semaphore never closed");
                me.tier_partition(&topic, p).await
            });
        }
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(e) => {
                    first_err.get_or_insert(ArchiveError::Verify {
                        path: "tiering task".into(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn manifest(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
    ) -> Result<PartitionManifest, ArchiveError> {
        let key = (topic.to_owned(), partition);
        if let Some(m) = self.manifests.lock().await.get(&key)
            && m.topic_id == topic_id
        {
            return Ok(m.clone());
        }
        let m = match self.archive.load_manifest(topic, partition).await? {
            Some(m) if m.topic_id == topic_id => m,
            Some(old) => {
                // An earlier incarnation of this topic name: its objects must never mix with
                // this one's, so they go before anything new is written, and the fresh
                // manifest is saved at once so later passes do not delete them again.
                self.delete_incarnation(&old).await?;
                let m = PartitionManifest::new(topic, topic_id, partition);
                self.archive.save_manifest(&m).await?;
                m
            }
            None => PartitionManifest::new(topic, topic_id, partition),
        };
        self.manifests.lock().await.insert(key, m.clone());
        Ok(m)
    }

    async fn delete_incarnation(&self, old: &PartitionManifest) -> Result<(), ArchiveError> {
        tracing::info!(topic = %old.topic, partition = old.partition, topic_id = old.topic_id, "deleting the archive of an earlier incarnation of this topic");
        let dir = self.archive.partition_dir(&old.topic, old.partition);
        for s in &old.segments {
            delete_if_exists(
                self.archive.store.as_ref(),
                &dir.clone().join(s.object.as_str()),
            )
            .await?;
        }
        Ok(())
    }

    async fn tier_partition(&self, topic: &str, partition: u32) -> Result<(), ArchiveError> {
        let meta = match self.broker.topic_meta(topic) {
            Ok(m) => m,
            Err(_) => return Ok(()),
        };
        let sealed = match self.broker.sealed_segments(topic, partition).await {
            Ok(s) => s,
            Err(BrokerError::TopicNotFound(_)) => return Ok(()),
            Err(e) => {
                return Err(ArchiveError::Verify {
                    path: format!("{topic}/{partition}"),
                    reason: e.to_string(),
                });
            }
        };
        let mut manifest = self.manifest(topic, meta.id, partition).await?;
        // `_topic.json` follows the topic's settings (a restore rebuilds from it: partition
        // count included), written whenever they differ from what was last saved
        let wanted = TopicManifest {
            format_version: FORMAT_VERSION,
            name: meta.name.clone(),
            topic_id: meta.id,
            created_at_ms: meta.created_at_ms,
            config: meta.config.clone(),
            owner: meta.owner.clone(),
            owner_id: meta.owner_id,
            schemas: meta.schemas.clone(),
        };
        let saved = self.topics_saved.lock().await.get(topic).cloned();
        if saved.as_ref() != Some(&wanted) {
            self.archive.save_topic(&wanted).await?;
            self.topics_saved
                .lock()
                .await
                .insert(topic.to_owned(), wanted);
        }
        let labels = PartitionLabels {
            topic: topic.to_owned(),
            partition,
        };
        let pending: Vec<_> = sealed
            .iter()
            .filter(|s| s.end > manifest.next_offset)
            .collect();
        self.update_lag(&labels, &pending);
        for (i, seg) in pending.iter().enumerate() {
            let records = match self.broker.read_segment(topic, partition, seg.base).await {
                Ok(r) => r,
                // deleted by retention meanwhile (only possible without a gate)
                Err(BrokerError::OffsetTruncated { .. }) => continue,
                Err(e) => {
                    return Err(ArchiveError::Verify {
                        path: format!("{topic}/{partition}@{}", seg.base),
                        reason: e.to_string(),
                    });
                }
            };
            let (first, last) = match (records.first(), records.last()) {
                (Some(f), Some(l)) => (f.offset, l.offset),
                _ => continue,
            };
            let (name, tid) = (topic.to_owned(), meta.id);
            let file = tokio::task::spawn_blocking(move || {
                format::encode(&name, tid, partition, &records)
            })
            .await
            .map_err(|e| ArchiveError::Verify {
                path: format!("{topic}/{partition}@{first}"),
                reason: e.to_string(),
            })??;
            let path = self.archive.segment_path(topic, partition, first, last);
            let object_bytes = file.len() as u64;
            upload(self.archive.store.as_ref(), &path, file).await?;
            let summary = verify(&self.archive.store, &path, object_bytes, meta.id).await?;
            let expected = (seg.end - seg.base, first, last);
            if (summary.rows, summary.first_offset, summary.last_offset) != expected {
                return Err(ArchiveError::Verify {
                    path: path.to_string(),
                    reason: format!(
                        "footer says {} rows, offsets {}..={}; segment has {:?}",
                        summary.rows, summary.first_offset, summary.last_offset, expected
                    ),
                });
            }
            if manifest.segments.is_empty() {
                manifest.start_offset = first;
            }
            manifest.segments.push(ArchivedSegment {
                first_offset: first,
                last_offset: last,
                rows: summary.rows,
                min_ts: summary.min_ts,
                max_ts: summary.max_ts,
                object_bytes,
                segment_bytes: seg.size,
                object: crate::archive::segment_file_name(first, last),
                archived_at_ms: self.clock.now_ms(),
            });
            manifest.next_offset = seg.end;
            self.archive.save_manifest(&manifest).await?;
            self.manifests
                .lock()
                .await
                .insert((topic.to_owned(), partition), manifest.clone());
            // only now may local retention delete the segment (refused if the topic was
            // deleted and re-created meanwhile)
            let _ = self.broker.set_archived(topic, meta.id, partition, seg.end);
            self.metrics.segments_archived.inc();
            self.metrics.bytes_archived.inc_by(object_bytes);
            self.metrics.segment_bytes_archived.inc_by(seg.size);
            self.update_lag(&labels, &pending[i + 1..]);
            tracing::debug!(
                topic,
                partition,
                first,
                last,
                object_bytes,
                "segment archived"
            );
        }
        // A restart forgets the in-memory mark: the manifest restores it.
        let _ = self
            .broker
            .set_archived(topic, meta.id, partition, manifest.next_offset);
        self.apply_archive_retention(&mut manifest).await
    }

    fn update_lag(&self, labels: &PartitionLabels, pending: &[&narad_core::log::SealedSegment]) {
        self.metrics
            .lag_segments
            .get_or_create(labels)
            .set(pending.len() as i64);
        let age = pending
            .first()
            .map(|s| (self.clock.now_ms() - s.max_ts).max(0) / 1000)
            .unwrap_or(0);
        self.metrics.lag_seconds.get_or_create(labels).set(age);
    }

    async fn apply_archive_retention(
        &self,
        manifest: &mut PartitionManifest,
    ) -> Result<(), ArchiveError> {
        if self.cfg.archive_retention_ms <= 0 {
            return Ok(());
        }
        let cutoff = self.clock.now_ms() - self.cfg.archive_retention_ms;
        let expired = manifest
            .segments
            .iter()
            .take_while(|s| s.max_ts < cutoff)
            .count();
        if expired == 0 {
            return Ok(());
        }
        let dir = self
            .archive
            .partition_dir(&manifest.topic, manifest.partition);
        let gone: Vec<ArchivedSegment> = manifest.segments.drain(..expired).collect();
        manifest.start_offset = gone
            .last()
            .map_or(manifest.start_offset, |s| s.last_offset + 1);
        // the manifest first: a reader never finds a listed object missing
        self.archive.save_manifest(manifest).await?;
        self.manifests.lock().await.insert(
            (manifest.topic.clone(), manifest.partition),
            manifest.clone(),
        );
        for s in gone {
            delete_if_exists(
                self.archive.store.as_ref(),
                &dir.clone().join(s.object.as_str()),
            )
            .await?;
            self.metrics.objects_deleted.inc();
        }
        Ok(())
    }
}

async fn delete_if_exists(store: &dyn ObjectStore, path: &Path) -> Result<(), ArchiveError> {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// One PUT for small files, multipart for large ones. The name is deterministic, so a retry
/// after a failure overwrites whatever half-state the store kept.
pub async fn upload(store: &dyn ObjectStore, path: &Path, file: Bytes) -> Result<(), ArchiveError> {
    if file.len() <= MULTIPART_BYTES {
        store.put(path, PutPayload::from(file)).await?;
        return Ok(());
    }
    let upload = store.put_multipart(path).await?;
    let mut w = WriteMultipart::new_with_chunk_size(upload, MULTIPART_BYTES);
    let mut rest = file;
    while !rest.is_empty() {
        if let Err(e) = w.wait_for_capacity(4).await {
            // a failed part: abort so the store does not keep the parts already uploaded
            let _ = w.abort().await;
            return Err(e.into());
        }
        let n = rest.len().min(MULTIPART_BYTES);
        w.put(rest.split_to(n));
    }
    // `finish` aborts the upload itself when completing fails
    w.finish().await?;
    Ok(())
}

/// Reads the stored object's footer back and summarizes it: the upload counts only if what
/// the store serves is a complete file of this incarnation.
pub async fn verify(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    size: u64,
    topic_id: u64,
) -> Result<format::FileSummary, ArchiveError> {
    let head = store.head(path).await?;
    if head.size != size {
        return Err(ArchiveError::Verify {
            path: path.to_string(),
            reason: format!("stored size {} differs from uploaded {size}", head.size),
        });
    }
    // the footer only: 8 bytes of trailer, then the metadata it points at
    let bad = |reason: String| ArchiveError::Verify {
        path: path.to_string(),
        reason,
    };
    if size < 12 {
        return Err(bad(format!("{size} bytes is too short for a Parquet file")));
    }
    let tail = store.get_range(path, size - 8..size).await?;
    if &tail[4..] != b"PAR1" {
        return Err(bad("no Parquet trailer".into()));
    }
    let len = u64::from(u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")));
    if len + 8 > size {
        return Err(bad(format!("footer length {len} exceeds the file")));
    }
    let footer = store.get_range(path, size - 8 - len..size - 8).await?;
    let meta = ParquetMetaDataReader::decode_metadata(&footer)
        .map_err(|e| ArchiveError::Format(e.into()))?;
    let (tid, summary) = format::summarize(&meta)?;
    if tid != topic_id {
        return Err(ArchiveError::Verify {
            path: path.to_string(),
            reason: format!("object belongs to topic incarnation {tid}, expected {topic_id}"),
        });
    }
    Ok(summary)
}

/// What a restore found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// `(topic, next offset per partition)` for each topic re-created.
    pub restored: Vec<(String, Vec<u64>)>,
}

/// Rebuilds every archived topic the broker does not have (a fresh data directory after a
/// disk loss) from the bucket alone: the topic's settings and incarnation from `_topic.json`,
/// and each partition starting after its last archived offset. Every archived message stays
/// readable by replay; nothing already present locally is touched.
pub async fn restore(
    broker: &Arc<Broker>,
    archive: &Archive,
) -> Result<RestoreReport, ArchiveError> {
    let mut report = RestoreReport::default();
    for name in archive.list_topics().await? {
        if broker.topic_meta(&name).is_ok() {
            continue;
        }
        let Some(t) = archive.load_topic(&name).await? else {
            tracing::warn!(topic = %name, "archive holds partitions of a topic without _topic.json; not restored");
            continue;
        };
        let mut starts = Vec::new();
        for p in 0..t.config.partitions {
            let next = match archive.load_manifest(&name, p).await? {
                Some(m) if m.topic_id == t.topic_id => m.next_offset,
                _ => 0,
            };
            starts.push(next);
        }
        let meta = narad_core::broker::TopicMeta {
            id: t.topic_id,
            name: t.name.clone(),
            created_at_ms: t.created_at_ms,
            config: t.config.clone(),
            parent: None,
            owner: t.owner.clone(),
            owner_id: t.owner_id,
            schemas: t.schemas.clone(),
        };
        match broker.restore_topic(meta, &starts).await {
            Ok(()) => {}
            Err(BrokerError::TopicExists(_)) => continue,
            Err(e) => {
                return Err(ArchiveError::Verify {
                    path: archive.topic_manifest_path(&name).to_string(),
                    reason: format!("could not restore the topic: {e}"),
                });
            }
        }
        for (p, &next) in starts.iter().enumerate() {
            let _ = broker.set_archived(&name, t.topic_id, p as u32, next);
        }
        report.restored.push((name, starts));
    }
    Ok(report)
}
