//! The tiering loop: every sealed segment of every partition goes to the archive once, as
//! Parquet, is verified from the stored footer, and only then may local retention delete it.
//! An unreachable archive only delays that: local segments stay (a metric and a log say so)
//! and produce keeps working.
//!
//! Each pass also keeps the archive's catalog snapshot current (`catalog.rs`): uploaded when
//! topics, links, schemas or users changed, and when only fan-out cursors moved at most once per
//! `catalog_cursor_interval`. [`restore`] rebuilds a fresh node from it.

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

use narad_auth::store::{UserCommand, UserStore};
use narad_core::broker::TopicMeta;

use crate::archive::{Archive, ArchiveError, ArchivedSegment, PartitionManifest, TopicManifest};
use crate::catalog::{self, CatalogKeys, CatalogSnapshot, CursorPosition, KeyUsed};
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
    /// When only fan-out cursor positions changed, the catalog snapshot is uploaded at most
    /// this often (they move with every copied slab; a stale position costs nothing but a
    /// larger "may have missed" count in a restore's warning). Topic, link, schema and user
    /// changes go up on the next pass. The server uses `tiering_interval_ms`.
    pub catalog_cursor_interval: Duration,
}

impl Default for TieringConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            archive_retention_ms: 0,
            concurrency: 2,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            catalog_cursor_interval: Duration::from_secs(1),
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
    pub catalog_uploads: Counter,
    pub catalog_failures: Counter,
    pub catalog_last_upload: Gauge,
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
        r.register(
            "narad_archive_catalog_uploads",
            "catalog snapshots (topics, links, users) uploaded to the archive",
            self.catalog_uploads.clone(),
        );
        r.register(
            "narad_archive_catalog_failures",
            "failed catalog snapshot uploads; retried with backoff",
            self.catalog_failures.clone(),
        );
        r.register(
            "narad_archive_catalog_last_upload_timestamp_seconds",
            "when the catalog snapshot was last uploaded (Unix time; 0: not yet by this process)",
            self.catalog_last_upload.clone(),
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
    /// The owner epoch each cached manifest was loaded under: a partition that moved away
    /// and came back was archived by another owner meanwhile, so its manifest is read again.
    manifest_epochs: tokio::sync::Mutex<HashMap<(String, u32), u64>>,
    /// `_topic.json` as last written, per topic.
    topics_saved: tokio::sync::Mutex<HashMap<String, TopicManifest>>,
    catalog: CatalogSource,
    catalog_state: tokio::sync::Mutex<CatalogState>,
}

/// What the catalog snapshot is made of beyond the broker.
#[derive(Clone, Default)]
pub struct CatalogSource {
    /// The user store (security on); its users go into sealed snapshots only.
    pub users: Option<Arc<UserStore>>,
    /// From the cluster secret. `None`: snapshots are unsealed and hold no users.
    pub keys: Option<Arc<CatalogKeys>>,
    /// Whether this node writes the snapshot now. A cluster has one catalog and one snapshot
    /// object: its Raft leader writes it (members behind it would put an older catalog over
    /// a newer one). `None`: always (a single node).
    pub writer: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

/// What was last uploaded, and the retry schedule after a failure.
#[derive(Default)]
struct CatalogState {
    /// What the last upload held: the catalog's applied-command count (topics, links,
    /// schemas change only by commands), and digests of the users and of the cursors.
    applied: Option<u64>,
    users: Option<[u8; 32]>,
    cursors: Option<[u8; 32]>,
    uploaded_at_ms: i64,
    retry_at_ms: i64,
    backoff: Option<Duration>,
}

impl Tierer {
    /// A tierer whose catalog snapshots are unsealed and hold no users.
    pub fn new(
        broker: Arc<Broker>,
        archive: Archive,
        cfg: TieringConfig,
        clock: SharedClock,
        metrics: Arc<TieringMetrics>,
    ) -> Arc<Self> {
        Self::with_catalog(
            broker,
            archive,
            cfg,
            clock,
            metrics,
            CatalogSource::default(),
        )
    }

    pub fn with_catalog(
        broker: Arc<Broker>,
        archive: Archive,
        cfg: TieringConfig,
        clock: SharedClock,
        metrics: Arc<TieringMetrics>,
        catalog: CatalogSource,
    ) -> Arc<Self> {
        Arc::new(Self {
            broker,
            archive,
            cfg,
            clock,
            metrics,
            manifests: tokio::sync::Mutex::new(HashMap::new()),
            manifest_epochs: tokio::sync::Mutex::new(HashMap::new()),
            topics_saved: tokio::sync::Mutex::new(HashMap::new()),
            catalog,
            catalog_state: tokio::sync::Mutex::new(CatalogState::default()),
        })
    }

    /// Runs passes until `shutdown` (looked at between passes: a pass in flight finishes, or
    /// is abandoned by the server's stop deadline); a failed pass is retried with exponential
    /// backoff. Waits on the tierer's clock.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut backoff = self.cfg.backoff;
        loop {
            // (it logs, counts and backs off its failures itself: a failing catalog upload
            // never holds segments back, nor the other way round)
            let _ = self.sync_catalog().await;
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

    /// One pass over every partition of every topic this node owns (all of them on a single
    /// node; in a cluster, the partitions it is the owner of: only an owner uploads a
    /// partition's segments, and only it deletes that partition's objects, by retention or
    /// for an earlier incarnation). The first error is returned after every partition was
    /// tried (one unreachable object does not stall the others).
    pub async fn pass(self: Arc<Self>) -> Result<(), ArchiveError> {
        let mut work = Vec::new();
        for name in self.broker.topic_names() {
            let Ok(meta) = self.broker.topic_meta(&name) else {
                continue; // deleted meanwhile
            };
            for p in 0..meta.config.partitions {
                if self.broker.is_local(&meta, p) {
                    work.push((name.clone(), p));
                }
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

    /// The catalog as it is now: every topic (sorted by name), every running cursor of a
    /// linked child, and the users when snapshots are sealed.
    pub fn catalog_snapshot(&self) -> CatalogSnapshot {
        let catalog = self.broker.catalog();
        CatalogSnapshot {
            topics: catalog.topics().map(|t| (**t).clone()).collect(),
            cursors: self.catalog_cursors(&catalog),
            users: self.catalog_users(),
            remotes: catalog.remotes().map(|r| (**r).clone()).collect(),
            remote_children: catalog.remote_children().map(|c| (**c).clone()).collect(),
        }
    }

    /// The position of every running cursor of a child `catalog` links.
    fn catalog_cursors(&self, catalog: &narad_core::catalog::Catalog) -> Vec<CursorPosition> {
        let epochs: HashMap<&str, u64> = catalog
            .topics()
            .filter_map(|t| Some((t.name.as_str(), t.parent.as_ref()?.epoch)))
            .collect();
        let mut cursors: Vec<CursorPosition> = self
            .broker
            .fanout_positions()
            .into_iter()
            .filter_map(|(child, p, next)| {
                Some(CursorPosition {
                    epoch: *epochs.get(child.as_str())?,
                    child,
                    parent_partition: p,
                    next_offset: next,
                })
            })
            .collect();
        cursors.sort_by(|a, b| (&a.child, a.parent_partition).cmp(&(&b.child, b.parent_partition)));
        cursors
    }

    /// The users, when snapshots are sealed (never otherwise).
    fn catalog_users(&self) -> Option<Vec<narad_auth::UserRecord>> {
        match (&self.catalog.keys, &self.catalog.users) {
            (Some(_), Some(store)) => Some(
                store
                    .list()
                    .iter()
                    .map(|u| narad_auth::UserRecord::clone(u))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// Uploads the catalog snapshot if it changed since the last upload (cursor positions
    /// alone: at most once per `catalog_cursor_interval`). A failure is logged and counted,
    /// and the next attempt waits (doubling from `backoff` up to `max_backoff`). Returns
    /// whether it uploaded.
    pub async fn sync_catalog(&self) -> Result<bool, ArchiveError> {
        let mut st = self.catalog_state.lock().await;
        if self.catalog.writer.as_ref().is_some_and(|w| !w()) {
            // not this member's to write; should it lead later, it writes at once
            *st = CatalogState::default();
            return Ok(false);
        }
        let now = self.clock.now_ms();
        if now < st.retry_at_ms {
            return Ok(false);
        }
        // The topics (the big part: schemas) are copied and serialised only when a command
        // changed them since the last upload; users and cursors are compared by digest.
        let catalog = self.broker.catalog();
        let users = self.catalog_users();
        let cursors = self.catalog_cursors(&catalog);
        let users_digest =
            catalog::digest(&serde_json::to_vec(&users).expect("the users serialise"));
        let cursors_digest =
            catalog::digest(&serde_json::to_vec(&cursors).expect("cursors serialise"));
        let cursor_ms = self.cfg.catalog_cursor_interval.as_millis() as i64;
        let due = st.applied != Some(catalog.applied())
            || st.users != Some(users_digest)
            || (st.cursors != Some(cursors_digest) && now - st.uploaded_at_ms >= cursor_ms);
        if !due {
            return Ok(false);
        }
        let snap = CatalogSnapshot {
            topics: catalog.topics().map(|t| (**t).clone()).collect(),
            cursors,
            users,
            remotes: catalog.remotes().map(|r| (**r).clone()).collect(),
            remote_children: catalog.remote_children().map(|c| (**c).clone()).collect(),
        };
        match self.upload_catalog(&snap, now).await {
            Ok(bytes) => {
                st.applied = Some(catalog.applied());
                (st.users, st.cursors) = (Some(users_digest), Some(cursors_digest));
                (st.uploaded_at_ms, st.backoff) = (now, None);
                self.metrics.catalog_uploads.inc();
                self.metrics.catalog_last_upload.set(now / 1000);
                tracing::debug!(
                    bytes,
                    topics = snap.topics.len(),
                    users = snap.users.as_ref().map(Vec::len),
                    sealed = self.catalog.keys.is_some(),
                    "catalog snapshot uploaded"
                );
                Ok(true)
            }
            Err(e) => {
                let wait = st
                    .backoff
                    .map_or(self.cfg.backoff, |b| (b * 2).min(self.cfg.max_backoff));
                st.backoff = Some(wait);
                st.retry_at_ms = now + wait.as_millis() as i64;
                self.metrics.catalog_failures.inc();
                tracing::warn!(archive = %self.archive.url, error = %e, retry_in = ?wait, "catalog snapshot upload failed; the archive's snapshot is older than the catalog until it succeeds");
                Err(e)
            }
        }
    }

    async fn upload_catalog(
        &self,
        snap: &CatalogSnapshot,
        now: i64,
    ) -> Result<usize, ArchiveError> {
        let obj = catalog::seal(snap, self.catalog.keys.as_deref(), now);
        if obj.len() as u64 > catalog::MAX_CATALOG_BYTES {
            return Err(ArchiveError::CatalogTooLarge(obj.len()));
        }
        let n = obj.len();
        upload(
            self.archive.store.as_ref(),
            &self.archive.catalog_path(),
            Bytes::from(obj),
        )
        .await?;
        Ok(n)
    }

    async fn manifest(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        owner_epoch: u64,
    ) -> Result<PartitionManifest, ArchiveError> {
        let key = (topic.to_owned(), partition);
        let same_owner = self.manifest_epochs.lock().await.get(&key) == Some(&owner_epoch);
        if same_owner
            && let Some(m) = self.manifests.lock().await.get(&key)
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
        self.manifests.lock().await.insert(key.clone(), m.clone());
        self.manifest_epochs.lock().await.insert(key, owner_epoch);
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
        let mut manifest = self
            .manifest(topic, meta.id, partition, meta.owner_epoch(partition))
            .await?;
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
            } else if first > manifest.next_offset {
                // the local log has a gap here (a partition rebuilt after its owner was
                // lost): recorded, so replays go on past it rather than stop
                tracing::warn!(
                    topic,
                    partition,
                    from = manifest.next_offset,
                    to = first,
                    "the archive records a gap: no record will ever be at these offsets"
                );
                manifest.gaps.push((manifest.next_offset, first));
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
            manifest.queue_frontier = self.broker.queue_frontier(topic, partition).ok();
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
        let start = manifest.start_offset;
        manifest.gaps.retain(|&(_, to)| to > start);
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

/// What a restore has to work with beyond the broker and the archive.
#[derive(Clone, Default)]
pub struct RestoreTarget {
    /// From the cluster secret; `None`: a sealed snapshot cannot be opened.
    pub keys: Option<Arc<CatalogKeys>>,
    /// The user store (security on); filled from the snapshot only while empty.
    pub users: Option<Arc<UserStore>>,
}

/// What became of the catalog snapshot in a restore.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CatalogOutcome {
    /// The archive holds none (nothing uploaded one yet, or an archive from before it).
    #[default]
    Missing,
    Opened {
        written_at_ms: i64,
        key: KeyUsed,
    },
    /// It exists but could not be opened (`reason`); it was copied to `kept_at` first, so
    /// this node's own uploads do not replace the only copy.
    Unopened {
        reason: String,
        kept_at: String,
    },
}

/// What a restore found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// `(topic, next offset per partition)` for each topic re-created.
    pub restored: Vec<(String, Vec<u64>)>,
    pub catalog: CatalogOutcome,
    /// Users restored from the snapshot, if they were.
    pub users_restored: Option<usize>,
    /// Why users were not restored, when that matters (security on and no users came back).
    pub users_missing: Option<String>,
    /// Remotes restored from the snapshot (their passwords still sealed: they open only
    /// under the cluster secret that sealed them).
    pub remotes_restored: usize,
    /// Children linked to their parent again.
    pub links_restored: Vec<String>,
    /// Children that came back standalone, with the reason.
    pub links_missing: Vec<(String, String)>,
    /// `(child, records)`: at most this many parent records archived before the disk loss
    /// had not been copied to the child (as far as the snapshot's cursor positions know: a
    /// stale position overstates it); they are in the parent's archive, the child never gets
    /// them.
    pub missed: Vec<(String, u64)>,
}

impl RestoreReport {
    /// One sentence for operators (`/readyz` detail and the log) when something did not come
    /// back: users, fan-out links, or records a child missed. `None` when all did, or when
    /// there was nothing to restore.
    pub fn notice(&self) -> Option<String> {
        if self.catalog == CatalogOutcome::Missing && self.restored.is_empty() {
            return None; // a new node on an empty archive: nothing was lost
        }
        let mut parts = Vec::new();
        match &self.catalog {
            CatalogOutcome::Missing if !self.restored.is_empty() => parts.push(
                "the archive holds no catalog snapshot: fan-out links and remotes were not restored"
                    .to_owned(),
            ),
            CatalogOutcome::Unopened { reason, kept_at } => parts.push(format!(
                "the catalog snapshot could not be opened ({reason}; kept at {kept_at}): fan-out links and remotes were not restored"
            )),
            _ => {}
        }
        if let Some(why) = &self.users_missing {
            parts.push(format!(
                "users were not restored ({why}); the root user was created anew"
            ));
        }
        if !self.links_missing.is_empty() {
            let names: Vec<String> = self
                .links_missing
                .iter()
                .map(|(c, why)| format!("{c} ({why})"))
                .collect();
            parts.push(format!(
                "these children came back standalone: {}",
                names.join(", ")
            ));
        }
        for (child, n) in &self.missed {
            parts.push(format!(
                "child '{child}' may have missed up to {n} parent records archived before the disk loss (they are in the parent's archive)"
            ));
        }
        (!parts.is_empty()).then(|| format!("restored from the archive; {}", parts.join("; ")))
    }
}

/// Rebuilds a fresh node (empty data directory after a disk loss) from the bucket alone:
/// 1. the catalog snapshot, if there is one and it opens;
/// 2. users from it into an empty user store (the snapshot's root replaces a new one);
/// 3. every archived topic the broker does not have, with its incarnation and settings
///    (from the snapshot when it knows that incarnation, else `_topic.json`), each partition
///    starting after its last archived offset: every archived message stays readable by
///    replay, no offset is reused;
/// 4. fan-out links from the snapshot, cursors at what each restored parent partition holds.
///
/// Nothing already present locally is touched, so a restore interrupted half way can run
/// again. Errors are the archive's or the disk's (retry); a snapshot that cannot be opened is
/// not an error (topics come back without it, and the report says what did not).
pub async fn restore(
    broker: &Arc<Broker>,
    archive: &Archive,
    target: &RestoreTarget,
) -> Result<RestoreReport, ArchiveError> {
    let mut report = RestoreReport::default();
    let snapshot = load_catalog(archive, target.keys.as_deref(), &mut report).await?;
    if let Some(store) = &target.users {
        restore_users(store, snapshot.as_ref(), target.keys.is_some(), &mut report).await?;
    }
    // Users the snapshot holds but this node did not take (refused, security off, a store
    // of its own): the node's first upload replaces the snapshot, so a copy is kept first.
    if let (Some(users), None, CatalogOutcome::Opened { written_at_ms, .. }) = (
        snapshot.as_ref().and_then(|s| s.users.as_ref()),
        report.users_restored,
        &report.catalog,
    ) && !users.is_empty()
    {
        let kept = archive.unopened_catalog_path(*written_at_ms);
        archive.store.copy(&archive.catalog_path(), &kept).await?;
        tracing::warn!(archive = %archive.url, kept_at = %kept, users = users.len(), "the catalog snapshot's users were not restored; the snapshot is kept");
        // (a node with users of its own keeps them: nothing is missing there)
        let why = match (&target.users, report.users_missing.take()) {
            (None, _) => Some("security is off on this node".to_owned()),
            (Some(_), why) => why,
        };
        report.users_missing =
            why.map(|w| format!("{w}; the snapshot with them is kept at {kept}"));
    }
    let by_name: HashMap<&str, &TopicMeta> = snapshot
        .iter()
        .flat_map(|s| &s.topics)
        .map(|t| (t.name.as_str(), t))
        .collect();
    let mut names: std::collections::BTreeSet<String> =
        archive.list_topics().await?.into_iter().collect();
    names.extend(by_name.keys().map(|n| (*n).to_owned()));
    for name in names {
        if broker.topic_meta(&name).is_ok() {
            continue;
        }
        if let Err(e) = narad_core::topic::validate_name(&name) {
            tracing::warn!(topic = %name, error = %e, "archive names a topic that is not valid; not restored");
            continue;
        }
        let archived = archive.load_topic(&name).await?;
        let Some(meta) = restored_meta(&name, archived, by_name.get(name.as_str()).copied()) else {
            continue;
        };
        // (the bucket's word, checked before its partition count drives the loop below)
        if let Err(e) = narad_core::topic::validate_name(&meta.name)
            .and_then(|()| meta.config.validate())
            .and_then(|()| {
                (meta.name == name)
                    .then_some(())
                    .ok_or_else(|| narad_core::topic::InvalidField {
                        field: "name",
                        reason: "differs from the name the archive lists it under".into(),
                    })
            })
        {
            tracing::warn!(topic = %name, error = %e, "archived topic settings are not valid; not restored");
            continue;
        }
        let mut starts = Vec::new();
        for p in 0..meta.config.partitions {
            let next = match archive.load_manifest(&name, p).await? {
                Some(m) if m.topic_id == meta.id => m.next_offset,
                _ => 0,
            };
            starts.push(next);
        }
        let id = meta.id;
        match broker.restore_topic(meta, &starts).await {
            Ok(()) => {}
            Err(BrokerError::TopicExists(_)) => continue,
            Err(source) => {
                return Err(ArchiveError::Restore {
                    what: format!("topic '{name}'"),
                    source,
                });
            }
        }
        for (p, &next) in starts.iter().enumerate() {
            let _ = broker.set_archived(&name, id, p as u32, next);
        }
        report.restored.push((name, starts));
    }
    if let Some(snap) = &snapshot {
        restore_remotes(broker, snap, &mut report).await?;
        restore_links(broker, snap, &mut report).await?;
        restore_remote_children(broker, snap, &mut report).await?;
    }
    Ok(report)
}

/// The snapshot's remotes the broker does not have (by name), with their ids and sealed
/// passwords as they were; one the catalog refuses is skipped with a warning.
async fn restore_remotes(
    broker: &Arc<Broker>,
    snap: &CatalogSnapshot,
    report: &mut RestoreReport,
) -> Result<(), ArchiveError> {
    for r in &snap.remotes {
        if broker.remote(&r.name).is_ok() {
            continue;
        }
        match broker.put_remote(r.clone(), None).await {
            Ok(_) => report.remotes_restored += 1,
            Err(e @ (BrokerError::Meta(_) | BrokerError::ShuttingDown)) => {
                return Err(ArchiveError::Restore {
                    what: format!("remote '{}'", r.name),
                    source: e,
                });
            }
            Err(e) => {
                tracing::warn!(remote = %r.name, error = %e, "the catalog snapshot's remote was not restored");
            }
        }
    }
    Ok(())
}

/// The snapshot's remote children whose parent came back as the same incarnation and whose
/// remote did too, each cursor at what the restored parent partition holds (records before
/// are in the archive only, which a cursor does not read: they are counted as missed).
async fn restore_remote_children(
    broker: &Arc<Broker>,
    snap: &CatalogSnapshot,
    report: &mut RestoreReport,
) -> Result<(), ArchiveError> {
    for c in &snap.remote_children {
        if broker
            .remote_children(&c.parent)
            .iter()
            .any(|x| x.name == c.name)
        {
            continue;
        }
        let Some((_, starts)) = report.restored.iter().find(|(n, _)| *n == c.parent) else {
            continue;
        };
        let same_parent = broker
            .topic_meta(&c.parent)
            .is_ok_and(|m| m.id == c.parent_id);
        let same_remote = broker.remote(&c.remote).is_ok_and(|r| r.id == c.remote_id);
        if !(same_parent && same_remote) {
            report.links_missing.push((
                c.name.clone(),
                "a remote child whose parent or remote did not come back".into(),
            ));
            continue;
        }
        let child = narad_core::catalog::RemoteChild {
            starts: starts.clone(),
            ..c.clone()
        };
        match broker.attach_remote(child).await {
            Ok(()) => report.links_restored.push(c.name.clone()),
            Err(e @ (BrokerError::Meta(_) | BrokerError::ShuttingDown)) => {
                return Err(ArchiveError::Restore {
                    what: format!("remote child '{}'", c.name),
                    source: e,
                });
            }
            Err(e) => report.links_missing.push((c.name.clone(), e.to_string())),
        }
    }
    Ok(())
}

/// The topic's metadata as restored, without its link (links come back last, once every
/// parent exists). The snapshot's entry when it is the incarnation the archived data belongs
/// to (it knows the link); `_topic.json` otherwise, which always matches the data.
fn restored_meta(
    name: &str,
    archived: Option<TopicManifest>,
    snap: Option<&TopicMeta>,
) -> Option<TopicMeta> {
    // (a single node restores: a cluster's partition owners mean nothing here)
    let from_snapshot = |m: &TopicMeta| TopicMeta {
        parent: None,
        owners: Vec::new(),
        owner_epochs: Vec::new(),
        moves: Default::default(),
        rebuilt: Default::default(),
        ..m.clone()
    };
    match (archived, snap) {
        (Some(t), Some(m)) if m.id == t.topic_id => Some(from_snapshot(m)),
        (Some(t), s) => {
            if s.is_some() {
                tracing::warn!(topic = %name, "the catalog snapshot knows another incarnation of this topic than the archived data; restored from _topic.json, without a fan-out link");
            }
            Some(TopicMeta {
                owner: t.owner,
                owner_id: t.owner_id,
                schemas: t.schemas,
                ..TopicMeta::new(t.topic_id, &t.name, t.created_at_ms, t.config)
            })
        }
        (None, Some(m)) => Some(from_snapshot(m)),
        (None, None) => {
            tracing::warn!(topic = %name, "archive holds partitions of a topic without _topic.json; not restored");
            None
        }
    }
}

/// Reads and opens the catalog snapshot. One that cannot be opened is copied aside first (and
/// reported); only the store failing is an error.
async fn load_catalog(
    archive: &Archive,
    keys: Option<&CatalogKeys>,
    report: &mut RestoreReport,
) -> Result<Option<CatalogSnapshot>, ArchiveError> {
    let path = archive.catalog_path();
    let head = match archive.store.head(&path).await {
        Ok(h) => h,
        Err(object_store::Error::NotFound { .. }) => {
            tracing::info!(archive = %archive.url, "the archive holds no catalog snapshot");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let opened = if head.size > catalog::MAX_CATALOG_BYTES {
        Err(format!(
            "{} bytes exceeds the {} byte limit",
            head.size,
            catalog::MAX_CATALOG_BYTES
        ))
    } else {
        let bytes = archive.store.get(&path).await?.bytes().await?;
        catalog::open(&bytes, keys).map_err(|e| e.to_string())
    };
    match opened {
        Ok(o) => {
            tracing::info!(
                written_at_ms = o.written_at_ms,
                key = ?o.key,
                topics = o.snapshot.topics.len(),
                users = o.snapshot.users.as_ref().map(Vec::len),
                "catalog snapshot opened"
            );
            report.catalog = CatalogOutcome::Opened {
                written_at_ms: o.written_at_ms,
                key: o.key,
            };
            Ok(Some(o.snapshot))
        }
        Err(reason) => {
            let kept = archive.unopened_catalog_path(head.last_modified.timestamp_millis());
            archive.store.copy(&path, &kept).await?;
            tracing::error!(archive = %archive.url, reason = %reason, kept_at = %kept, "the catalog snapshot cannot be opened: users and fan-out links are not restored; the snapshot is kept so a restore with the right cluster_secret stays possible");
            report.catalog = CatalogOutcome::Unopened {
                reason,
                kept_at: kept.to_string(),
            };
            Ok(None)
        }
    }
}

/// Users from the snapshot into the user store, durably, if the store is empty.
async fn restore_users(
    store: &Arc<UserStore>,
    snapshot: Option<&CatalogSnapshot>,
    have_secret: bool,
    report: &mut RestoreReport,
) -> Result<(), ArchiveError> {
    if !store.is_empty() {
        tracing::info!(
            "the user store is not empty; its users are kept and none are restored from the archive"
        );
        return Ok(());
    }
    let why = match snapshot.map(|s| &s.users) {
        Some(Some(users)) => {
            let (store, users) = (store.clone(), users.clone());
            let n = users.len();
            let applied =
                tokio::task::spawn_blocking(move || store.apply(UserCommand::Restore { users }))
                    .await
                    .expect("user restore task");
            match applied {
                Ok(()) => {
                    tracing::info!(users = n, "users restored from the catalog snapshot");
                    report.users_restored = Some(n);
                    return Ok(());
                }
                Err(e @ narad_auth::store::StoreError::Io { .. }) => {
                    return Err(ArchiveError::RestoreUsers(e));
                }
                Err(e) => format!("the snapshot's users were refused: {e}"),
            }
        }
        Some(None) if !have_secret => {
            "no cluster_secret is configured, so snapshots hold no users".to_owned()
        }
        Some(None) => {
            "the catalog snapshot holds no users (it was unsealed, or security was off)".to_owned()
        }
        None if !have_secret => "no cluster_secret is configured".to_owned(),
        None => "no catalog snapshot could be read".to_owned(),
    };
    // No snapshot at all is also what a new node on an empty archive sees: the warning, if
    // anything was lost, is the restore's notice (which knows whether topics came back).
    if snapshot.is_some() {
        tracing::warn!(reason = %why, "users were not restored from the archive");
    } else {
        tracing::info!(reason = %why, "no users to restore from the archive");
    }
    report.users_missing = Some(why);
    Ok(())
}

/// Links every child of the snapshot to its parent again, once both exist as the incarnations
/// the snapshot names.
async fn restore_links(
    broker: &Arc<Broker>,
    snap: &CatalogSnapshot,
    report: &mut RestoreReport,
) -> Result<(), ArchiveError> {
    // one map, not a scan per partition: the snapshot's cursor list can be long
    let cursors: std::collections::HashMap<(&str, u64, u32), u64> = snap
        .cursors
        .iter()
        .map(|c| {
            (
                (c.child.as_str(), c.epoch, c.parent_partition),
                c.next_offset,
            )
        })
        .collect();
    for t in &snap.topics {
        let Some(link) = &t.parent else { continue };
        let Ok(child) = broker.topic_meta(&t.name) else {
            continue;
        };
        if child.id != t.id {
            report
                .links_missing
                .push((t.name.clone(), "another incarnation".into()));
            continue;
        }
        match &child.parent {
            Some(l) if l == link => continue, // an earlier, interrupted restore did it
            Some(_) => continue,              // linked otherwise: not ours to change
            None => {}
        }
        let parent = match broker.topic_meta(&link.parent) {
            Ok(p) if p.id == link.parent_id => p,
            _ => {
                tracing::warn!(child = %t.name, parent = %link.parent, "the parent of a restored child is not in the archive; the child stays standalone");
                report
                    .links_missing
                    .push((t.name.clone(), format!("parent '{}' missing", link.parent)));
                continue;
            }
        };
        let wanted: Vec<Option<u64>> = (0..parent.config.partitions)
            .map(|p| cursors.get(&(t.name.as_str(), link.epoch, p)).copied())
            .collect();
        let positions: Vec<u64> = wanted.iter().map(|w| w.unwrap_or(u64::MAX)).collect();
        let used = match broker.restore_link(&t.name, link.clone(), &positions).await {
            Ok(u) => u,
            Err(
                e @ (BrokerError::FanoutConflict(_)
                | BrokerError::FanoutInvalid(_)
                | BrokerError::TopicNotFound(_)),
            ) => {
                tracing::warn!(child = %t.name, error = %e, "fan-out link not restored");
                report.links_missing.push((t.name.clone(), e.to_string()));
                continue;
            }
            Err(source) => {
                return Err(ArchiveError::Restore {
                    what: format!("the fan-out link of '{}'", t.name),
                    source,
                });
            }
        };
        let missed: u64 = wanted
            .iter()
            .zip(&used)
            .map(|(w, u)| w.map_or(0, |w| u.saturating_sub(w)))
            .sum();
        if missed > 0 {
            tracing::warn!(child = %t.name, parent = %link.parent, missed, "by the snapshot's cursor positions the child had not copied up to this many archived parent records before the disk loss; they are in the parent's archive, the child will not get them");
            report.missed.push((t.name.clone(), missed));
        }
        report.links_restored.push(t.name.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
