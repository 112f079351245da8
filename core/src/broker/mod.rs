//! The broker: topics, their partitions, and the queue operations clients call.
//!
//! ```text
//!  produce ─► validate all ─► group by partition ─► PartitionLog::append (fsync) ─► queue.on_append
//!                                                                                   └► dispatch(topic)
//!  consume ─► try_take (round-robin over partitions) ─► none? ─► join the topic's FIFO of waiters
//!  dispatch(topic): hand newly deliverable messages to the FIRST waiter in line, nobody else
//!  timer (per topic): sleeps until the next lease expiry or delay end, then dispatches
//!  maintenance: queue snapshots (every ack_flush_interval), retention, idle log close
//! ```

mod fanout;
mod meta;
mod partition;
mod waiters;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, oneshot};

use crate::clock::SharedClock;
use crate::handle::{HandleCodec, HandleError, ReceiptHandle};
use crate::log::{LogConfig, LogError, LogStats, SealedSegment};
use crate::metrics::{CoreMetrics, OutcomeLabel, TopicLabel};
use crate::queue::{LeaseError, QueueStats};
use crate::record::{NewRecord, Record};
use crate::topic::{
    CreateTopic, InvalidField, MAX_DELAY_MS, TopicConfig, TopicPatch, partition_for_key,
};
pub use fanout::{ChildInfo, MAX_CHILDREN, ParentLink};
pub use meta::{SchemaVersion, TopicMeta};
use partition::{LogEnv, OpenLogs, Partition};
use waiters::{Waiter, Waiters};

/// Present in the data directory while a restore from the archive is unfinished.
pub const RESTORE_MARKER: &str = "restore.pending";

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub data_dir: PathBuf,
    pub log: LogConfig,
    pub topic_defaults: TopicConfig,
    /// Close a partition's files after this long without use (reopened on demand).
    pub idle_close_ms: i64,
    /// How often acked state is written to disk. A crash redelivers acks younger than this.
    pub ack_flush_interval_ms: u64,
    /// How often retention runs.
    pub retention_interval_ms: u64,
    /// Bound on out-of-order acked ranges per partition (beyond it acks answer "retry").
    pub max_ack_ranges: usize,
    /// An archive takes sealed segments: retention then deletes only what it has verified
    /// (see [`Broker::set_archived`]).
    pub archive_gate: bool,
    /// With an archive: local segments older than this go once archived (0 = only the
    /// topic's retention applies).
    pub local_retention_ms: i64,
    /// Bounds on what clients may make the node hold (see [`Limits`]).
    pub limits: Limits,
}

/// Bounds on topics, partitions and open logs. Every partition is a directory, queue state
/// and (while open) a log holding file descriptors, so without them a client allowed to
/// create topics could grow the node until it runs out of descriptors, and then even the
/// root's own requests fail. Creates and partition growth beyond a bound are refused before
/// anything is opened; topics loaded at start or restored from the archive are not refused
/// (they were admitted once), so lowering a bound never loses data.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most topics on the node.
    pub max_topics: usize,
    /// Most partitions, summed over every topic.
    pub max_partitions: u64,
    /// Most topics one user may own (creates counted against their owner, see
    /// [`CreateTopic::count_against_owner`]); 0: no per-user bound.
    pub max_topics_per_user: usize,
    /// Most partition logs open at once (each holds 1 + its segments' file descriptors).
    pub max_open_logs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_topics: 10_000,
            max_partitions: 100_000,
            max_topics_per_user: 1_000,
            max_open_logs: 4_096,
        }
    }
}

impl BrokerConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            log: LogConfig::default(),
            topic_defaults: TopicConfig::default(),
            idle_close_ms: 10 * 60 * 1000,
            ack_flush_interval_ms: 100,
            retention_interval_ms: 30_000,
            max_ack_ranges: 65_536,
            archive_gate: false,
            local_retention_ms: 0,
            limits: Limits::default(),
        }
    }
}

/// A consume or replay read stops adding messages once their reply weight (payload, key and
/// headers as the JSON reply writes them at worst, see [`Record::reply_weight`]) reaches this
/// (so a reply holds at most this plus one message, and always at least one message):
/// `max` × the largest message would otherwise be hundreds of MiB in one reply.
pub const MAX_READ_BYTES: usize = 4 << 20;

/// Most JSON Schema versions one topic keeps.
pub const MAX_SCHEMA_VERSIONS: usize = 100;

/// Errors of broker operations, classified by what the caller should do.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("topic '{0}' not found")]
    TopicNotFound(String),
    #[error("topic '{0}' already exists")]
    TopicExists(String),
    #[error("{0}")]
    InvalidField(#[from] InvalidField),
    #[error("message {index}: {reason}")]
    InvalidMessage { index: usize, reason: String },
    #[error("message {index} is {size} bytes; this topic's max_message_bytes is {max}")]
    MessageTooLarge { index: usize, size: usize, max: u64 },
    #[error("partition {partition} is out of range: the topic has {partitions} partitions")]
    PartitionOutOfRange { partition: u32, partitions: u32 },
    #[error("{0}")]
    HandleMalformed(HandleError),
    #[error("{0}")]
    LeaseGone(String),
    #[error("offset {requested} is no longer retained: the oldest retained offset is {oldest}")]
    OffsetTruncated { requested: u64, oldest: u64 },
    #[error("{0}")]
    AckSetFull(LeaseError),
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// A fan-out rule forbids this (second parent, grandchild, duplicate, too many children,
    /// produce to a delay child).
    #[error("{0}")]
    FanoutConflict(String),
    /// A fan-out request is malformed (self-attach, delay out of range or too close to the
    /// parent's retention).
    #[error("{0}")]
    FanoutInvalid(String),
    #[error("{0}")]
    FanoutNotChild(String),
    /// A new schema version breaks the additive-only evolution rule.
    #[error("{0}")]
    SchemaIncompatible(String),
    /// `max_topics`: the node holds as many topics as it may.
    #[error(
        "the node already has {max} topics, the most it allows (max_topics); delete a topic first"
    )]
    TooManyTopics { max: usize },
    /// `max_partitions`: the change would take the node past its partition bound.
    #[error(
        "{requested} more partitions would take the node to {total}, beyond its limit of {max} (max_partitions); delete topics or use fewer partitions"
    )]
    TooManyPartitions {
        requested: u64,
        total: u64,
        max: u64,
    },
    /// `max_topics_per_user`: the creating user owns as many topics as one user may.
    #[error(
        "user '{owner}' already owns {max} topics, the most one user may (max_topics_per_user); delete one first"
    )]
    TooManyOwnedTopics { owner: String, max: usize },
    /// `max_open_logs` logs are open and every one is in use: retry shortly.
    #[error(
        "{max} partition logs are open, the most the node allows (max_open_logs), and none is idle; retry shortly"
    )]
    TooManyOpenLogs { max: usize },
    #[error("storage failure: {0}")]
    Storage(LogError),
    #[error("metadata failure: {0}")]
    Meta(#[from] meta::MetaError),
}

impl BrokerError {
    /// Whether this failed for want of a file descriptor (`EMFILE`/`ENFILE`): a shortage that
    /// passes once descriptors are given back, not a fault of the disk or the data.
    pub fn is_out_of_descriptors(&self) -> bool {
        match self {
            Self::Storage(e) => e.is_out_of_descriptors(),
            Self::Meta(e) => e.is_out_of_descriptors(),
            _ => false,
        }
    }
}

impl From<LogError> for BrokerError {
    fn from(e: LogError) -> Self {
        match e {
            // Reading below the retained range is the caller's business, not a storage fault.
            LogError::Truncated { requested, oldest } => {
                Self::OffsetTruncated { requested, oldest }
            }
            other => Self::Storage(other),
        }
    }
}

/// One message to produce.
#[derive(Debug, Clone, Default)]
pub struct ProduceMessage {
    pub key: Option<Bytes>,
    pub partition: Option<u32>,
    pub delay_ms: Option<i64>,
    pub headers: Vec<(String, Bytes)>,
    pub payload: Bytes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Produced {
    pub partition: u32,
    pub offset: u64,
}

/// A message handed to a consumer under a lease.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub partition: u32,
    pub record: Arc<Record>,
    pub receipt_handle: String,
    pub delivery_count: u32,
    pub lease_deadline_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckAction {
    Ack,
    Extend,
    Nack,
}

#[derive(Debug, Clone, Copy)]
pub enum ReplayFrom {
    Offset(u64),
    TimeMs(i64),
}

#[derive(Debug, Clone)]
pub struct PartitionInfo {
    pub partition: u32,
    pub log: LogStats,
    pub queue: QueueStats,
    pub open: bool,
}

#[derive(Debug, Clone)]
pub struct TopicInfo {
    pub meta: TopicMeta,
    pub partitions: Vec<PartitionInfo>,
    pub waiters: usize,
}

pub(crate) struct Topic {
    meta: RwLock<TopicMeta>,
    dir: PathBuf,
    partitions: RwLock<Arc<Vec<Arc<Partition>>>>,
    waiters: Mutex<Waiters>,
    produce_rr: AtomicU64,
    consume_rr: AtomicU64,
    timer: Notify,
    /// Signalled after every append (fan-out cursors wait on it).
    appended: Notify,
    /// Earliest time the timer task is currently sleeping until.
    timer_at: AtomicI64,
    deleted: AtomicBool,
    label: TopicLabel,
}

impl Topic {
    fn id(&self) -> u64 {
        self.meta.read().id
    }
    fn config(&self) -> TopicConfig {
        self.meta.read().config.clone()
    }
    fn partitions(&self) -> Arc<Vec<Arc<Partition>>> {
        self.partitions.read().clone()
    }
    /// Partition `p`, or `PartitionOutOfRange`.
    fn partition(&self, p: u32) -> Result<Arc<Partition>, BrokerError> {
        let parts = self.partitions.read();
        parts
            .get(p as usize)
            .cloned()
            .ok_or(BrokerError::PartitionOutOfRange {
                partition: p,
                partitions: parts.len() as u32,
            })
    }
}

pub struct Broker {
    cfg: BrokerConfig,
    env: LogEnv,
    clock: SharedClock,
    metrics: Arc<CoreMetrics>,
    handles: HandleCodec,
    /// The `max_open_logs` budget every open partition log holds a slot of.
    open_logs: Arc<OpenLogs>,
    topics: Arc<RwLock<BTreeMap<String, Arc<Topic>>>>,
    /// Serialises metadata changes (create, alter, delete).
    meta_lock: tokio::sync::Mutex<()>,
    /// Held while a metadata change is written and published (see [`Broker::commit_meta`]).
    meta_commit: Arc<Mutex<()>>,
    shutting_down: AtomicBool,
    /// Set when shutdown begins: consumes stop waiting.
    draining: AtomicBool,
    shutdown: Notify,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The data directory held no topic metadata when the broker opened (a new node, or one
    /// that lost its disk): the server may restore topics from the archive.
    fresh: AtomicBool,
    /// Fan-out cursor positions, per (child, parent partition), for lag reporting.
    fanout: Mutex<HashMap<(String, u32), Arc<fanout::CursorState>>>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("data_dir", &self.cfg.data_dir)
            .finish()
    }
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("operating system random source");
    u64::from_le_bytes(b)
}

impl Broker {
    /// Opens the broker: loads topic metadata, recovers every partition, starts background
    /// tasks. Must run inside a multi-threaded tokio runtime.
    pub async fn open(
        cfg: BrokerConfig,
        clock: SharedClock,
        metrics: Arc<CoreMetrics>,
    ) -> Result<Arc<Self>, BrokerError> {
        let env = LogEnv {
            cfg: cfg.log.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
            max_ack_ranges: cfg.max_ack_ranges,
        };
        let open_logs = OpenLogs::new(cfg.limits.max_open_logs.max(1));
        let broker = Arc::new(Self {
            open_logs,
            cfg,
            env,
            clock,
            metrics,
            handles: HandleCodec::random(),
            topics: Arc::default(),
            meta_lock: tokio::sync::Mutex::new(()),
            meta_commit: Arc::default(),
            shutting_down: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            shutdown: Notify::new(),
            tasks: Mutex::new(Vec::new()),
            fresh: AtomicBool::new(false),
            fanout: Mutex::new(HashMap::new()),
        });
        let data_dir = broker.cfg.data_dir.clone();
        let metas = {
            let data_dir = data_dir.clone();
            tokio::task::spawn_blocking(move || -> Result<_, BrokerError> {
                crate::fsutil::create_dir_private(&data_dir.join("topics")).map_err(|source| {
                    LogError::Io {
                        path: data_dir.join("topics"),
                        source,
                    }
                })?;
                Ok(meta::load(&data_dir)?)
            })
            .await
            .expect("metadata load task")?
        };
        // no metadata yet, or a restore from the archive that did not finish
        let fresh =
            !data_dir.join(meta::META_FILE).exists() || data_dir.join(RESTORE_MARKER).exists();
        broker.fresh.store(fresh, Ordering::Release);
        sweep_orphans(&data_dir, &metas);
        for m in metas {
            let topic = broker.open_topic(m).await?;
            let name = topic.meta.read().name.clone();
            broker.topics.write().insert(name, topic.clone());
            broker.spawn_topic_timer(topic);
        }
        broker.spawn_maintenance();
        broker.spawn_all_cursors();
        Ok(broker)
    }

    pub fn metrics(&self) -> &Arc<CoreMetrics> {
        &self.metrics
    }

    /// Bytes the tail caches of all open partitions hold now (node-wide budget).
    pub fn tail_cache_used(&self) -> u64 {
        self.cfg.log.tail_cache.used()
    }

    pub fn topic_defaults(&self) -> &TopicConfig {
        &self.cfg.topic_defaults
    }

    async fn open_topic(&self, meta: TopicMeta) -> Result<Arc<Topic>, BrokerError> {
        let dir = self.cfg.data_dir.join("topics").join(meta.dir_name());
        let parts = self
            .open_partitions(&dir, 0, meta.config.partitions)
            .await?;
        Ok(Arc::new(Topic {
            label: TopicLabel {
                topic: meta.name.clone(),
            },
            meta: RwLock::new(meta),
            dir,
            partitions: RwLock::new(Arc::new(parts)),
            waiters: Mutex::new(Waiters::default()),
            produce_rr: AtomicU64::new(random_u64()),
            consume_rr: AtomicU64::new(0),
            timer: Notify::new(),
            appended: Notify::new(),
            timer_at: AtomicI64::new(i64::MAX),
            deleted: AtomicBool::new(false),
        }))
    }

    async fn open_partitions(
        &self,
        dir: &Path,
        from: u32,
        to: u32,
    ) -> Result<Vec<Arc<Partition>>, BrokerError> {
        let mut parts: Vec<Arc<Partition>> = Vec::new();
        for p in from..to {
            let pdir = dir.join(format!("p{p:05}"));
            let env = LogEnv {
                cfg: self.env.cfg.clone(),
                clock: self.env.clock.clone(),
                metrics: self.env.metrics.clone(),
                max_ack_ranges: self.env.max_ack_ranges,
            };
            let part = tokio::task::spawn_blocking(move || Partition::open(p, pdir, &env))
                .await
                .expect("partition open task");
            let part = match part {
                Ok(part) => Arc::new(part),
                Err(e) => {
                    // the logs opened so far are given back before the error is
                    for p in &parts {
                        p.close().await;
                    }
                    return Err(e.into());
                }
            };
            // Opening recovered the log; it stays open only if the budget has a free slot,
            // else it reopens on first use. (No eviction here: at start, with more partitions
            // than slots, that would scan every partition for each one opened.)
            match self.open_logs.try_acquire() {
                Some(slot) => part.adopt_slot(slot),
                None => part.close().await,
            }
            parts.push(part);
        }
        Ok(parts)
    }

    /// A `max_open_logs` slot: a free one, else one freed by closing the least recently used
    /// idle logs (a batch at a time, so a run of misses does not scan every partition each).
    async fn reserve_log_slot(&self) -> Option<partition::LogSlot> {
        if let Some(slot) = self.open_logs.try_acquire() {
            return Some(slot);
        }
        let batch = (self.open_logs.max() / 32).max(1);
        let mut open: Vec<(i64, Arc<Partition>)> = self
            .all_partitions()
            .into_iter()
            .filter(|(_, p)| p.is_open())
            .map(|(_, p)| (p.last_used_ms.load(Ordering::Relaxed), p))
            .collect();
        open.sort_unstable_by_key(|(used, _)| *used);
        let mut closed = 0;
        for (_, p) in open {
            if closed == batch {
                break;
            }
            if p.close_if_unused().await {
                closed += 1;
                self.metrics.logs_evicted.inc();
            }
        }
        if closed > 0 {
            tracing::debug!(
                closed,
                max_open_logs = self.open_logs.max(),
                "closed idle logs to stay within max_open_logs"
            );
        }
        self.open_logs.try_acquire()
    }

    /// The partition's log, reopening it (within `max_open_logs`) if it was closed.
    async fn log_of(&self, part: &Partition) -> Result<Arc<crate::log::PartitionLog>, BrokerError> {
        if let Some(log) = part.open_log() {
            return Ok(log);
        }
        let Some(slot) = self.reserve_log_slot().await else {
            self.metrics.log_opens_refused.inc();
            tracing::warn!(
                dir = %part.dir.display(),
                max_open_logs = self.open_logs.max(),
                "partition log not opened: max_open_logs logs are open and none is idle"
            );
            return Err(BrokerError::TooManyOpenLogs {
                max: self.open_logs.max(),
            });
        };
        // (not touched: only a produce or consume counts as use, so retention reopening an
        // idle partition leaves it first in line to close again)
        Ok(part.log(&self.env, slot).await?)
    }

    /// How many partition logs are open now (each holds a `max_open_logs` slot).
    pub fn open_log_count(&self) -> usize {
        self.open_logs.open()
    }

    /// Refuses a change that would add `topics` topics (owned by `owner`, when they count
    /// against it) and `partitions` partitions beyond the node's [`Limits`]. Called under
    /// `meta_lock`, before anything is opened.
    fn check_limits(
        &self,
        topics: usize,
        partitions: u64,
        owner: Option<&(String, u64)>,
    ) -> Result<(), BrokerError> {
        let limits = &self.cfg.limits;
        let all = self.topics.read();
        if topics > 0 && all.len() + topics > limits.max_topics {
            return Err(BrokerError::TooManyTopics {
                max: limits.max_topics,
            });
        }
        if let Some((name, id)) = owner
            && topics > 0
            && limits.max_topics_per_user > 0
        {
            let owned = all
                .values()
                .filter(|t| t.meta.read().owner_id == Some(*id))
                .count();
            if owned + topics > limits.max_topics_per_user {
                return Err(BrokerError::TooManyOwnedTopics {
                    owner: name.clone(),
                    max: limits.max_topics_per_user,
                });
            }
        }
        if partitions > 0 {
            let in_use: u64 = all
                .values()
                .map(|t| u64::from(t.meta.read().config.partitions))
                .sum();
            if in_use + partitions > limits.max_partitions {
                return Err(BrokerError::TooManyPartitions {
                    requested: partitions,
                    total: in_use + partitions,
                    max: limits.max_partitions,
                });
            }
        }
        Ok(())
    }

    fn check_running(&self) -> Result<(), BrokerError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(BrokerError::ShuttingDown);
        }
        Ok(())
    }

    fn topic(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        self.topics
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::TopicNotFound(name.to_owned()))
    }

    /// Makes a metadata change durable, then live: `edit` turns the published metadata of
    /// every topic into the new set, which is written (temp file, fsync, rename, fsync); only
    /// once that succeeded does `publish` apply the change in memory. A failed write publishes
    /// nothing, so no client ever acts on (and gets a 2xx for) state that a crash would undo.
    ///
    /// Read, write and publish run as one step on a blocking thread under `meta_commit`: it
    /// finishes even if the caller's future is dropped (a client that disconnects, releasing
    /// `meta_lock`), and the next change then starts from what this one published, so disk
    /// and memory never disagree.
    ///
    /// `edit` sees the metadata as published at that moment and may refuse (the caller checked
    /// under `meta_lock`, but a caller that gave up released that lock early).
    async fn commit_meta(
        &self,
        edit: impl FnOnce(&mut Vec<TopicMeta>) -> Result<(), BrokerError> + Send + 'static,
        publish: impl FnOnce() + Send + 'static,
    ) -> Result<(), BrokerError> {
        let topics = self.topics.clone();
        let commit = self.meta_commit.clone();
        let dir = self.cfg.data_dir.clone();
        tokio::task::spawn_blocking(move || {
            let _one_change = commit.lock();
            let mut metas: Vec<TopicMeta> = topics
                .read()
                .values()
                .map(|t| t.meta.read().clone())
                .collect();
            edit(&mut metas)?;
            meta::store(&dir, metas)?;
            publish();
            Ok::<_, BrokerError>(())
        })
        .await
        .expect("metadata commit task")
    }

    // ---- topics ----------------------------------------------------------------------------

    pub async fn create_topic(
        self: &Arc<Self>,
        req: CreateTopic,
    ) -> Result<TopicMeta, BrokerError> {
        self.check_running()?;
        let config = req.resolve(&self.cfg.topic_defaults)?;
        let _guard = self.meta_lock.lock().await;
        if self.topics.read().contains_key(&req.name) {
            return Err(BrokerError::TopicExists(req.name));
        }
        self.check_limits(
            1,
            u64::from(config.partitions),
            req.owner.as_ref().filter(|_| req.count_against_owner),
        )?;
        let meta = TopicMeta {
            id: random_u64() | 1,
            name: req.name.clone(),
            created_at_ms: self.clock.now_ms(),
            config,
            parent: None,
            owner: req.owner.as_ref().map(|(name, _)| name.clone()),
            owner_id: req.owner.as_ref().map(|(_, id)| *id),
            schemas: req
                .schema
                .clone()
                .map(|schema| SchemaVersion {
                    version: 1,
                    created_at_ms: self.clock.now_ms(),
                    schema,
                })
                .into_iter()
                .collect(),
        };
        self.install_topic(&meta).await?;
        tracing::info!(topic = %meta.name, id = meta.id, partitions = meta.config.partitions, "topic created");
        Ok(meta)
    }

    /// Whether the data directory had no topic metadata at open (see `fresh`).
    pub fn is_fresh(&self) -> bool {
        self.fresh.load(Ordering::Acquire)
    }

    /// Re-creates a topic from the archive after a disk loss: same incarnation id and settings,
    /// each partition's log starting at `starts[p]` (the first offset the archive does not
    /// hold), so new produces never reuse an archived offset.
    pub async fn restore_topic(
        self: &Arc<Self>,
        meta: TopicMeta,
        starts: &[u64],
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        meta.config.validate()?;
        let _guard = self.meta_lock.lock().await;
        if self.topics.read().contains_key(&meta.name) {
            return Err(BrokerError::TopicExists(meta.name));
        }
        let dir = self.cfg.data_dir.join("topics").join(meta.dir_name());
        for p in 0..meta.config.partitions {
            let start = starts.get(p as usize).copied().unwrap_or(0);
            if start == 0 {
                continue;
            }
            let pdir = dir.join(format!("p{p:05}"));
            let made = crate::fsutil::create_dir_private(&pdir)
                .and_then(|()| {
                    crate::fsutil::open_or_create_private(&crate::log::segment::segment_path(
                        &pdir, start,
                    ))
                    .and_then(|f| f.sync_all())
                })
                .and_then(|()| crate::log::segment::sync_dir(&pdir));
            made.map_err(|source| LogError::Io {
                path: pdir.clone(),
                source,
            })?;
        }
        self.install_topic(&meta).await?;
        tracing::info!(topic = %meta.name, id = meta.id, ?starts, "topic restored from the archive");
        Ok(())
    }

    /// Opens a new topic's partitions, persists the metadata (undoing the open if that fails)
    /// and registers the topic. The caller holds `meta_lock`.
    async fn install_topic(self: &Arc<Self>, meta: &TopicMeta) -> Result<(), BrokerError> {
        let topic = match self.open_topic(meta.clone()).await {
            Ok(topic) => topic,
            Err(e) => {
                // (e.g. out of descriptors half way): the directories made so far go too,
                // rather than waiting for the sweep at the next start
                let dir = self.cfg.data_dir.join("topics").join(meta.dir_name());
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
                return Err(e);
            }
        };
        let adding = meta.clone();
        let (topics, live, name) = (self.topics.clone(), topic.clone(), meta.name.clone());
        let committed = self
            .commit_meta(
                move |metas| {
                    if metas.iter().any(|m| m.name == adding.name) {
                        return Err(BrokerError::TopicExists(adding.name));
                    }
                    metas.push(adding);
                    Ok(())
                },
                move || {
                    topics.write().insert(name, live);
                },
            )
            .await;
        if let Err(e) = committed {
            for p in topic.partitions().iter() {
                p.close().await;
            }
            let _ = std::fs::remove_dir_all(&topic.dir);
            return Err(e);
        }
        self.spawn_topic_timer(topic);
        Ok(())
    }

    pub fn list_topics(&self, after: Option<&str>, limit: usize) -> (Vec<TopicMeta>, bool) {
        let topics = self.topics.read();
        let mut out = Vec::new();
        let range: Box<dyn Iterator<Item = (&String, &Arc<Topic>)>> = match after {
            Some(a) => Box::new(
                topics.range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            ),
            None => Box::new(topics.iter()),
        };
        let mut more = false;
        for (_, t) in range {
            if out.len() == limit {
                more = true;
                break;
            }
            out.push(t.meta.read().clone());
        }
        (out, more)
    }

    pub fn topic_info(&self, name: &str) -> Result<TopicInfo, BrokerError> {
        let topic = self.topic(name)?;
        let now = self.clock.now_ms();
        let partitions = topic
            .partitions()
            .iter()
            .map(|p| {
                let queue = {
                    let mut q = p.queue.lock();
                    q.promote_due(now);
                    q.stats()
                };
                PartitionInfo {
                    partition: p.index,
                    log: p.stats(),
                    queue,
                    open: p.is_open(),
                }
            })
            .collect();
        let waiters = topic.waiters.lock().len();
        Ok(TopicInfo {
            meta: topic.meta.read().clone(),
            partitions,
            waiters,
        })
    }

    /// `Ok` if the topic exists (cheap: no statistics are gathered).
    pub fn check_topic(&self, name: &str) -> Result<(), BrokerError> {
        self.topic(name).map(|_| ())
    }

    pub fn topic_names(&self) -> Vec<String> {
        self.topics.read().keys().cloned().collect()
    }

    pub async fn alter_topic(
        self: &Arc<Self>,
        name: &str,
        patch: TopicPatch,
    ) -> Result<TopicMeta, BrokerError> {
        self.check_running()?;
        if patch.is_empty() {
            return Err(InvalidField {
                field: "body",
                reason: "at least one field must be given".into(),
            }
            .into());
        }
        let _guard = self.meta_lock.lock().await;
        let topic = self.topic(name)?;
        let old = topic.meta.read().clone();
        let old_parts = topic.partitions();
        let config = old.config.patched(&patch)?;
        let children = self.child_topics(name);
        // a parent must keep outliving its delay children's delays
        if config.retention_ms > 0 {
            for (child, _, link) in &children {
                let delay = link.delay_ms;
                if delay > 0 && config.retention_ms < delay + fanout::DELAY_RETENTION_MARGIN_MS {
                    return Err(BrokerError::FanoutInvalid(format!(
                        "retention_ms {} is shorter than delay child '{child}' needs ({} ms: its delay + 1 h)",
                        config.retention_ms,
                        delay + fanout::DELAY_RETENTION_MARGIN_MS
                    )));
                }
            }
        }
        if config.partitions > old.config.partitions {
            self.check_limits(
                0,
                u64::from(config.partitions - old.config.partitions),
                None,
            )?;
        }
        if config.partitions > old.config.partitions {
            // children's cursors for the new partitions exist before any record can land there
            for (child, _, link) in &children {
                for p in old.config.partitions..config.partitions {
                    let dir = topic.dir.join(format!("p{p:05}"));
                    Self::write_start_cursor(&dir, child, link.epoch, 0).map_err(|source| {
                        LogError::Io {
                            path: dir.clone(),
                            source,
                        }
                    })?;
                }
            }
        }
        // New partitions are opened now but go live (take produces, count in the topic) only
        // once the metadata that names them is durable.
        let new = if config.partitions > old.config.partitions {
            self.open_partitions(&topic.dir, old.config.partitions, config.partitions)
                .await?
        } else {
            Vec::new()
        };
        let all: Vec<Arc<Partition>> = old_parts.iter().chain(&new).cloned().collect();
        let (id, edited, live) = (old.id, config.clone(), topic.clone());
        let committed = self
            .commit_meta(
                move |metas| edit_topic(metas, id, |m| m.config = edited),
                move || {
                    *live.partitions.write() = Arc::new(all);
                    live.meta.write().config = config;
                },
            )
            .await;
        if let Err(e) = committed {
            for p in &new {
                p.close().await;
            }
            return Err(e);
        }
        // a grown parent: its children copy the new partitions too (cursors written above)
        let (before, after) = (old.config.partitions, topic.config().partitions);
        if after > before {
            for (_, c, link) in &children {
                for p in before..after {
                    self.spawn_cursor(topic.clone(), p, c.clone(), link.clone());
                }
            }
        }
        // New capacity or partitions may make messages deliverable to waiting readers.
        self.dispatch(&topic).await;
        topic.timer.notify_one();
        Ok(topic.meta.read().clone())
    }

    /// Appends a JSON Schema version to a topic. `check` sees the versions so far and refuses
    /// an incompatible one; it runs under the metadata lock, so two concurrent changes cannot
    /// both pass against the same latest version.
    pub async fn add_schema_version(
        &self,
        name: &str,
        schema: serde_json::Value,
        check: impl FnOnce(&[SchemaVersion]) -> Result<(), String>,
    ) -> Result<TopicMeta, BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let topic = self.topic(name)?;
        if topic.meta.read().parent.is_some() {
            return Err(BrokerError::FanoutConflict(format!(
                "'{name}' is a fan-out child: it receives its parent's records as they are, so it cannot have its own schema"
            )));
        }
        let old = topic.meta.read().schemas.clone();
        if old.len() >= MAX_SCHEMA_VERSIONS {
            return Err(BrokerError::SchemaIncompatible(format!(
                "topic '{name}' already has {MAX_SCHEMA_VERSIONS} schema versions, the most it may keep"
            )));
        }
        check(&old).map_err(BrokerError::SchemaIncompatible)?;
        let version = old.last().map_or(1, |v| v.version + 1);
        let added = SchemaVersion {
            version,
            created_at_ms: self.clock.now_ms(),
            schema,
        };
        let (id, edited, live) = (topic.id(), added.clone(), topic.clone());
        self.commit_meta(
            move |metas| edit_topic(metas, id, |m| m.schemas.push(edited)),
            move || live.meta.write().schemas.push(added),
        )
        .await?;
        tracing::info!(topic = %name, version, "topic schema changed");
        Ok(topic.meta.read().clone())
    }

    /// Clears the owner of every topic the user `owner` (of id `owner_id`) owns, after the
    /// user was deleted. Returns how many there were.
    pub async fn disown(&self, owner: &str, owner_id: u64) -> Result<usize, BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let owned: Vec<Arc<Topic>> = self
            .topics
            .read()
            .values()
            .filter(|t| {
                let m = t.meta.read();
                m.owner.as_deref() == Some(owner) && m.owner_id.unwrap_or(0) == owner_id
            })
            .cloned()
            .collect();
        if owned.is_empty() {
            return Ok(0);
        }
        let ids: Vec<u64> = owned.iter().map(|t| t.id()).collect();
        let count = owned.len();
        self.commit_meta(
            move |metas| {
                for m in metas.iter_mut().filter(|m| ids.contains(&m.id)) {
                    (m.owner, m.owner_id) = (None, None);
                }
                Ok(())
            },
            move || {
                for t in owned {
                    let mut m = t.meta.write();
                    (m.owner, m.owner_id) = (None, None);
                }
            },
        )
        .await?;
        Ok(count)
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let topic = self.topic(name)?;
        // its children survive, standalone with their data
        let children: Vec<Arc<Topic>> = self
            .child_topics(name)
            .into_iter()
            .map(|(_, t, _)| t)
            .collect();
        let (id, child_ids): (u64, Vec<u64>) =
            (topic.id(), children.iter().map(|c| c.id()).collect());
        let (topics, gone, unlink) = (self.topics.clone(), name.to_owned(), children.clone());
        let gone_name = name.to_owned();
        self.commit_meta(
            move |metas| {
                let before = metas.len();
                metas.retain(|m| m.id != id);
                if metas.len() == before {
                    return Err(BrokerError::TopicNotFound(gone_name));
                }
                for m in metas.iter_mut().filter(|m| child_ids.contains(&m.id)) {
                    m.parent = None;
                }
                Ok(())
            },
            move || {
                if let Some(t) = topics.write().remove(&gone) {
                    // its timer stops even if the caller is gone before the cleanup below
                    t.deleted.store(true, Ordering::Release);
                    t.timer.notify_one();
                }
                for c in unlink {
                    c.meta.write().parent = None;
                }
            },
        )
        .await?;
        {
            let gone: Vec<String> = children
                .iter()
                .map(|c| c.meta.read().name.clone())
                .collect();
            self.fanout
                .lock()
                .retain(|(child, _), _| child != name && !gone.contains(child));
        }
        if let Some(l) = topic.meta.read().parent.clone()
            && let Ok(p) = self.topic(&l.parent)
        {
            for part in p.partitions().iter() {
                fanout::remove_cursor_files(&part.dir, name);
            }
        }
        topic.deleted.store(true, Ordering::Release);
        topic.timer.notify_one();
        self.metrics.forget_topic(name);
        for w in topic.waiters.lock().drain() {
            let _ = w.tx.send(Vec::new());
        }
        for p in topic.partitions().iter() {
            p.close().await;
        }
        let dir = topic.dir.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove deleted topic's data; it will be swept at next start");
            }
        });
        tracing::info!(topic = name, "topic deleted");
        Ok(())
    }

    // ---- produce ---------------------------------------------------------------------------

    /// Produces `messages` all-or-none with respect to validation: every message is checked
    /// before anything is written. Returns once every message is durable.
    pub async fn produce(
        &self,
        topic_name: &str,
        messages: Vec<ProduceMessage>,
    ) -> Result<Vec<Produced>, BrokerError> {
        self.check_running()?;
        let topic = self.topic(topic_name)?;
        let cfg = {
            let meta = topic.meta.read();
            if meta.parent.as_ref().is_some_and(|l| l.delay_ms > 0) {
                // (the parent is not named: the producer may not be allowed to see it)
                return Err(BrokerError::FanoutConflict(format!(
                    "'{topic_name}' is a delay child: it only receives copies from its parent"
                )));
            }
            meta.config.clone()
        };
        let n = cfg.partitions;
        let mut groups: HashMap<u32, Vec<(usize, NewRecord)>> = HashMap::new();
        let mut bytes = 0u64;
        for (index, m) in messages.into_iter().enumerate() {
            bytes += m.payload.len() as u64;
            // a malformed field (400) is reported before a size that is merely over this
            // topic's limit (413)
            let delay = m.delay_ms.unwrap_or(cfg.delay_ms);
            if !(0..=MAX_DELAY_MS).contains(&delay) {
                return Err(BrokerError::InvalidMessage {
                    index,
                    reason: format!("delay_ms must be between 0 and {MAX_DELAY_MS}"),
                });
            }
            if m.payload.len() as u64 > cfg.max_message_bytes {
                return Err(BrokerError::MessageTooLarge {
                    index,
                    size: m.payload.len(),
                    max: cfg.max_message_bytes,
                });
            }
            let partition = match (m.partition, &m.key) {
                (Some(p), _) if p >= n => {
                    return Err(BrokerError::PartitionOutOfRange {
                        partition: p,
                        partitions: n,
                    });
                }
                (Some(p), _) => p,
                (None, Some(k)) => partition_for_key(k, n),
                (None, None) => {
                    (topic.produce_rr.fetch_add(1, Ordering::Relaxed) % u64::from(n)) as u32
                }
            };
            groups.entry(partition).or_default().push((
                index,
                NewRecord {
                    key: m.key,
                    headers: m.headers,
                    payload: m.payload,
                    delay_ms: delay as u32,
                },
            ));
        }
        let total: usize = groups.values().map(Vec::len).sum();
        let parts = topic.partitions();
        let mut results = vec![
            Produced {
                partition: 0,
                offset: 0
            };
            total
        ];
        // Open every log first, so no append starts unless all can be attempted.
        let mut batches = Vec::with_capacity(groups.len());
        for (p, items) in groups {
            let (indices, records): (Vec<usize>, Vec<NewRecord>) = items.into_iter().unzip();
            batches.push((p, indices, records, self.log_of(&parts[p as usize]).await?));
        }
        let outcomes = if batches.len() == 1 {
            let (p, indices, records, log) = batches.pop().expect("one batch");
            vec![(p, indices, log.append(records).await)]
        } else {
            // Partitions have their own writers and fsyncs: append to them in parallel.
            let mut set = tokio::task::JoinSet::new();
            for (p, indices, records, log) in batches {
                set.spawn(async move { (p, indices, log.append(records).await) });
            }
            set.join_all().await
        };
        let mut touched = Vec::new();
        let mut first_err = None;
        for (p, indices, result) in outcomes {
            match result {
                Ok(appended) => {
                    for (i, idx) in indices.into_iter().enumerate() {
                        results[idx] = Produced {
                            partition: p,
                            offset: appended.base_offset + i as u64,
                        };
                    }
                    touched.push((p, appended.base_offset + u64::from(appended.count)));
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let now = self.clock.now_ms();
        for &(p, end) in &touched {
            let part = &parts[p as usize];
            part.touch(now);
            part.queue.lock().on_append(end);
        }
        if !touched.is_empty() {
            topic.appended.notify_waiters();
            self.dispatch(&topic).await;
        }
        if let Some(e) = first_err {
            return Err(e.into());
        }
        self.metrics
            .produced_messages
            .get_or_create(&topic.label)
            .inc_by(total as u64);
        self.metrics
            .produced_bytes
            .get_or_create(&topic.label)
            .inc_by(bytes);
        Ok(results)
    }

    // ---- consume ---------------------------------------------------------------------------

    /// Leases up to `max` messages, waiting up to `wait` for the first one.
    pub async fn consume(
        &self,
        topic_name: &str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        self.check_running()?;
        let topic = self.topic(topic_name)?;
        if let Some(p) = partition {
            let n = topic.config().partitions;
            if p >= n {
                return Err(BrokerError::PartitionOutOfRange {
                    partition: p,
                    partitions: n,
                });
            }
        }
        // Readers already in line are served first: a newcomer (even one that does not wait)
        // never takes a message that became deliverable while they were waiting.
        if !topic.waiters.lock().is_empty() {
            self.dispatch(&topic).await;
        }
        let got = self.try_take(&topic, partition, max).await?;
        if !got.is_empty() || wait.is_zero() || self.draining.load(Ordering::Acquire) {
            self.count_consumed(&topic, got.len() as u64);
            return Ok(got);
        }
        let (tx, mut rx) = oneshot::channel();
        let id = topic.waiters.lock().push(Waiter {
            id: 0,
            partition,
            max,
            tx,
        });
        // A message may have arrived between the attempt above and joining the line.
        self.dispatch(&topic).await;
        let outcome = tokio::select! {
            got = &mut rx => Some(got.unwrap_or_default()),
            () = tokio::time::sleep(wait) => None,
            () = self.shutdown.notified() => None,
        };
        match outcome {
            Some(got) => Ok(got),
            None => {
                topic.waiters.lock().remove(id);
                // A dispatcher may have served us just before we left the line (it counted it).
                Ok(rx.try_recv().unwrap_or_default())
            }
        }
    }

    /// One pass over the topic's partitions (or the pinned one), round-robin.
    async fn try_take(
        &self,
        topic: &Arc<Topic>,
        only: Option<u32>,
        max: usize,
    ) -> Result<Vec<Delivery>, BrokerError> {
        if topic.deleted.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let cfg = topic.config();
        let parts = topic.partitions();
        let n = parts.len();
        let order: Vec<usize> = match only {
            Some(p) => vec![p as usize],
            None => {
                let start = topic.consume_rr.fetch_add(1, Ordering::Relaxed) as usize % n;
                (0..n).map(|i| (start + i) % n).collect()
            }
        };
        let mut out = Vec::new();
        let mut out_bytes = 0usize;
        let now = self.clock.now_ms();
        let max_in_flight = cfg.max_in_flight_per_partition as usize;
        for i in order {
            if out.len() >= max {
                break;
            }
            let part = &parts[i];
            {
                let mut q = part.queue.lock();
                // Appends whose producer went away before telling the queue are still
                // durable: the log's end is the truth.
                if let Some(log) = part.open_log() {
                    q.on_append(log.next_offset());
                }
                let expired = q.expire(now);
                if !expired.is_empty() {
                    self.metrics
                        .lease_expiries
                        .get_or_create(&topic.label)
                        .inc_by(expired.len() as u64);
                }
                q.promote_due(now);
                if !q.may_deliver(max_in_flight) {
                    continue;
                }
            }
            let log = self.log_of(part).await?;
            part.touch(now);
            let mut source = ReadAhead {
                log: &log,
                seen: HashMap::new(),
                topic: &topic.label.topic,
                partition: part.index,
            };
            let leased = {
                let mut q = part.queue.lock();
                // one lease at a time, so the reply stops at MAX_READ_BYTES of payload
                let mut leased = Vec::new();
                while out.len() + leased.len() < max && out_bytes < MAX_READ_BYTES {
                    let Some(l) = q
                        .take(
                            now,
                            1,
                            max_in_flight,
                            cfg.visibility_timeout_ms,
                            &mut source,
                        )
                        .pop()
                    else {
                        break;
                    };
                    out_bytes += source.reply_weight(l.offset);
                    leased.push(l);
                }
                if let Some(at) = q.next_wakeup() {
                    self.arm_timer(topic, at);
                }
                leased
            };
            let topic_id = topic.id();
            let mut seen = source.seen;
            for l in leased {
                let record = match seen.remove(&l.offset) {
                    Some(r) => Some(r),
                    None => log
                        .read(l.offset, 1, 0)
                        .ok()
                        .and_then(|mut v| v.pop())
                        .filter(|r| r.offset == l.offset),
                };
                let Some(record) = record else {
                    // Unreadable now (e.g. just deleted by retention): give the lease back.
                    let _ = part.queue.lock().unlease(l.offset, l.nonce, now);
                    continue;
                };
                out.push(Delivery {
                    partition: part.index,
                    record,
                    receipt_handle: self.handles.encode(&ReceiptHandle {
                        topic_id,
                        partition: part.index,
                        offset: l.offset,
                        nonce: l.nonce,
                    }),
                    delivery_count: l.delivery_count,
                    lease_deadline_ms: l.deadline_ms,
                });
            }
        }
        Ok(out)
    }

    /// Hands deliverable messages to waiting readers, first in line first. Each waiter that
    /// gets nothing stops the pass (an unpinned waiter that finds nothing means nobody can).
    async fn dispatch(&self, topic: &Arc<Topic>) {
        let mut skip_pins: Vec<u32> = Vec::new();
        let mut skipped: Vec<Waiter> = Vec::new();
        loop {
            let Some(w) = topic.waiters.lock().pop_first_except(&skip_pins) else {
                break;
            };
            if w.tx.is_closed() {
                continue;
            }
            let got = match self.try_take(topic, w.partition, w.max).await {
                Ok(got) => got,
                Err(e) => {
                    tracing::warn!(topic = %topic.label.topic, error = %e, "dispatch failed");
                    Vec::new()
                }
            };
            if got.is_empty() {
                match w.partition {
                    Some(p) => {
                        skip_pins.push(p);
                        skipped.push(w);
                        continue;
                    }
                    None => {
                        skipped.push(w);
                        break;
                    }
                }
            }
            let n = got.len() as u64;
            match w.tx.send(got) {
                Ok(()) => self.count_consumed(topic, n),
                // The reader left; give its messages back at once.
                Err(got) => self.release(topic, &got),
            }
        }
        if !skipped.is_empty() {
            topic.waiters.lock().restore_front(skipped);
        }
    }

    fn count_consumed(&self, topic: &Topic, n: u64) {
        if n > 0 {
            self.metrics
                .consumed_messages
                .get_or_create(&topic.label)
                .inc_by(n);
        }
    }

    /// Gives leases back that were never handed to the consumer (its reply could not be
    /// sent): the messages are deliverable again at once and the deliveries do not count.
    pub fn give_back(&self, topic_name: &str, deliveries: &[Delivery]) {
        if let Ok(topic) = self.topic(topic_name) {
            self.release(&topic, deliveries);
            topic.timer.notify_one();
        }
    }

    fn release(&self, topic: &Arc<Topic>, deliveries: &[Delivery]) {
        let parts = topic.partitions();
        let now = self.clock.now_ms();
        for d in deliveries {
            if let Ok(h) = self.handles.decode(&d.receipt_handle) {
                let _ = parts[d.partition as usize]
                    .queue
                    .lock()
                    .unlease(h.offset, h.nonce, now);
            }
        }
    }

    // ---- ack / extend / nack ---------------------------------------------------------------

    pub async fn settle(
        &self,
        topic_name: &str,
        handle: &str,
        action: AckAction,
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        let h = self.handles.decode(handle).map_err(|e| match e {
            HandleError::Malformed => BrokerError::HandleMalformed(e),
            HandleError::OtherEpoch => BrokerError::LeaseGone(e.to_string()),
        })?;
        let topic = self.topic(topic_name)?;
        if topic.id() != h.topic_id {
            return Err(BrokerError::LeaseGone(
                "receipt handle belongs to another topic (or an earlier topic of this name)".into(),
            ));
        }
        let parts = topic.partitions();
        let Some(part) = parts.get(h.partition as usize) else {
            return Err(BrokerError::LeaseGone(
                "receipt handle names no partition of this topic".into(),
            ));
        };
        let cfg = topic.config();
        let now = self.clock.now_ms();
        let result = {
            let mut q = part.queue.lock();
            match action {
                AckAction::Ack => q.ack(h.offset, h.nonce, now),
                AckAction::Extend => q
                    .extend(h.offset, h.nonce, now, cfg.visibility_timeout_ms)
                    .map(|_| ()),
                AckAction::Nack => q.nack(h.offset, h.nonce, now),
            }
        };
        let outcome = match (&result, action) {
            (Ok(()), AckAction::Ack) => "acked",
            (Ok(()), AckAction::Extend) => "extended",
            (Ok(()), AckAction::Nack) => "nacked",
            (Err(LeaseError::Stale), _) => "stale",
            (Err(LeaseError::AckSetFull), _) => "ack_set_full",
        };
        self.metrics
            .acks
            .get_or_create(&OutcomeLabel {
                topic: topic.label.topic.clone(),
                outcome,
            })
            .inc();
        match result {
            Ok(()) => {
                if action != AckAction::Extend {
                    // Freed capacity (ack) or a released message (nack): serve the line.
                    self.dispatch(&topic).await;
                }
                Ok(())
            }
            Err(LeaseError::Stale) => Err(BrokerError::LeaseGone(LeaseError::Stale.to_string())),
            Err(e @ LeaseError::AckSetFull) => Err(BrokerError::AckSetFull(e)),
        }
    }

    // ---- replay ----------------------------------------------------------------------------

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

    // ---- background ------------------------------------------------------------------------

    fn arm_timer(&self, topic: &Topic, at: i64) {
        if at < topic.timer_at.load(Ordering::Acquire) {
            topic.timer_at.store(at, Ordering::Release);
            topic.timer.notify_one();
        }
    }

    fn spawn_topic_timer(self: &Arc<Self>, topic: Arc<Topic>) {
        let weak = Arc::downgrade(self);
        let handle = tokio::spawn(async move {
            loop {
                let Some(broker) = weak.upgrade() else { return };
                if topic.deleted.load(Ordering::Acquire)
                    || broker.shutting_down.load(Ordering::Acquire)
                {
                    return;
                }
                // From here on every new deadline (a lease or delay made by the dispatch below,
                // or by any consume meanwhile) re-arms the timer: `arm_timer` compares against
                // this, and a notification that arrives before the sleep is kept as a permit.
                topic.timer_at.store(i64::MAX, Ordering::Release);
                let now = broker.clock.now_ms();
                let mut released = 0u64;
                let mut any_ready = false;
                for p in topic.partitions().iter() {
                    let mut q = p.queue.lock();
                    let expired = q.expire(now);
                    released += expired.len() as u64;
                    any_ready |= !expired.is_empty() | (q.promote_due(now) > 0);
                }
                if released > 0 {
                    broker
                        .metrics
                        .lease_expiries
                        .get_or_create(&topic.label)
                        .inc_by(released);
                }
                if any_ready {
                    broker.dispatch(&topic).await;
                }
                // the next deadline is taken after the dispatch, which may have made new ones
                let next = topic
                    .partitions()
                    .iter()
                    .filter_map(|p| p.queue.lock().next_wakeup())
                    .min()
                    .unwrap_or(i64::MAX);
                let next = topic.timer_at.fetch_min(next, Ordering::AcqRel).min(next);
                let sleep_ms = if next == i64::MAX {
                    60_000
                } else {
                    (next - broker.clock.now_ms()).clamp(0, 60_000)
                };
                drop(broker);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
                    () = topic.timer.notified() => {}
                }
            }
        });
        self.tasks.lock().push(handle);
    }

    fn spawn_maintenance(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let flush_every = Duration::from_millis(self.cfg.ack_flush_interval_ms.max(1));
        let retention_every = self.cfg.retention_interval_ms.max(1) as i64;
        let handle = tokio::spawn(async move {
            let mut last_retention = i64::MIN;
            loop {
                tokio::time::sleep(flush_every).await;
                let Some(broker) = weak.upgrade() else { return };
                if broker.shutting_down.load(Ordering::Acquire) {
                    return;
                }
                broker.persist_queues().await;
                let now = broker.clock.now_ms();
                if now.saturating_sub(last_retention) >= retention_every {
                    last_retention = now;
                    broker.run_retention().await;
                    broker.close_idle().await;
                }
            }
        });
        self.tasks.lock().push(handle);
    }

    fn all_partitions(&self) -> Vec<(Arc<Topic>, Arc<Partition>)> {
        self.topics
            .read()
            .values()
            .flat_map(|t| {
                t.partitions()
                    .iter()
                    .map(|p| (t.clone(), p.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Writes every changed queue snapshot.
    pub async fn persist_queues(&self) {
        let parts: Vec<Arc<Partition>> = self
            .all_partitions()
            .into_iter()
            .map(|(_, p)| p)
            .filter(|p| p.queue.lock().is_dirty())
            .collect();
        if parts.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for p in parts {
                if let Err(e) = p.persist_queue() {
                    tracing::error!(dir = %p.dir.display(), error = %e, "could not persist queue state");
                }
            }
        })
        .await;
    }

    /// Applies every topic's retention now.
    pub async fn run_retention(&self) {
        let now = self.clock.now_ms();
        for (topic, part) in self.all_partitions() {
            let cfg = topic.config();
            let local = if self.cfg.archive_gate {
                self.cfg.local_retention_ms
            } else {
                0
            };
            let retention_ms = match (cfg.retention_ms, local) {
                (0, l) => l,
                (r, 0) => r,
                (r, l) => r.min(l),
            };
            let log = match part.open_log() {
                Some(log) => log,
                None => {
                    // A closed (idle) partition was last written before it was last used, so
                    // once that is older than the retention all its data has expired: reopen
                    // it to delete the data, unless it is already empty.
                    let idle_for = now - part.last_used_ms.load(Ordering::Relaxed);
                    let stats = part.stats();
                    if retention_ms == 0
                        || idle_for <= retention_ms
                        || stats.oldest_offset >= stats.next_offset
                    {
                        continue;
                    }
                    match self.log_of(&part).await {
                        Ok(log) => log,
                        Err(e) => {
                            tracing::error!(topic = %topic.label.topic, partition = part.index, error = %e, "could not reopen partition for retention");
                            continue;
                        }
                    }
                }
            };
            let retention_bytes = cfg.retention_bytes;
            let gate = self.cfg.archive_gate;
            let apply = |log: Arc<crate::log::PartitionLog>| {
                let archived = gate.then(|| part.archived_below.load(Ordering::Acquire));
                tokio::task::spawn_blocking(move || {
                    log.apply_retention(retention_ms, retention_bytes, archived)
                })
            };
            let (mut deleted, active_expired) = apply(log.clone()).await.unwrap_or((0, false));
            if active_expired {
                match log.roll().await {
                    // The segment just sealed is expired too: delete it in this pass.
                    Ok(()) => deleted += apply(log.clone()).await.unwrap_or((0, false)).0,
                    Err(e) => {
                        tracing::error!(topic = %topic.label.topic, partition = part.index, error = %e, "could not roll expired segment");
                    }
                }
            }
            if deleted > 0 {
                let oldest = log.oldest_offset();
                let dropped = part.queue.lock().truncate_below(oldest);
                tracing::info!(topic = %topic.label.topic, partition = part.index, segments = deleted, oldest, "retention deleted segments");
                if dropped > 0 {
                    self.metrics
                        .retention_dropped_unacked
                        .get_or_create(&topic.label)
                        .inc_by(dropped);
                    tracing::warn!(topic = %topic.label.topic, partition = part.index, dropped, "retention deleted messages that were never acked");
                }
            }
        }
    }

    /// A topic's metadata (incarnation id, settings).
    pub fn topic_meta(&self, name: &str) -> Result<TopicMeta, BrokerError> {
        Ok(self.topic(name)?.meta.read().clone())
    }

    /// Reads a topic's metadata in place (no copy), for hot paths.
    pub fn with_topic_meta<R>(
        &self,
        name: &str,
        f: impl FnOnce(&TopicMeta) -> R,
    ) -> Result<R, BrokerError> {
        Ok(f(&self.topic(name)?.meta.read()))
    }

    fn partition(&self, topic: &str, partition: u32) -> Result<Arc<Partition>, BrokerError> {
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

    /// Marks (or clears) a restore from the archive in progress, so that a node stopped half
    /// way through restoring still counts as fresh on its next start.
    pub fn set_restore_pending(&self, pending: bool) -> std::io::Result<()> {
        let marker = self.cfg.data_dir.join(RESTORE_MARKER);
        if pending {
            crate::fsutil::write_file_atomic(&marker, b"restore from the archive in progress\n")?;
        } else {
            match std::fs::remove_file(&marker) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        crate::log::segment::sync_dir(&self.cfg.data_dir)
    }

    /// The oldest offset still on local disk and the next offset to be written.
    pub fn local_range(&self, topic: &str, partition: u32) -> Result<(u64, u64), BrokerError> {
        let s = self.partition(topic, partition)?.stats();
        Ok((s.oldest_offset, s.next_offset))
    }

    async fn close_idle(&self) {
        let now = self.clock.now_ms();
        for (_, part) in self.all_partitions() {
            if part.is_open()
                && now - part.last_used_ms.load(Ordering::Relaxed) > self.cfg.idle_close_ms
                && part.close_if_unused().await
            {
                self.metrics.idle_logs_closed.inc();
            }
        }
    }

    /// Answers every waiting reader with nothing and makes later consumes return at once;
    /// the first step of a graceful shutdown (requests in flight can still finish).
    pub fn drain_waiters(&self) {
        self.draining.store(true, Ordering::Release);
        self.shutdown.notify_waiters();
        let topics: Vec<Arc<Topic>> = self.topics.read().values().cloned().collect();
        for t in &topics {
            for w in t.waiters.lock().drain() {
                let _ = w.tx.send(Vec::new());
            }
        }
    }

    /// Stops background work, answers waiting readers with nothing, persists queue state and
    /// closes every log (after its queued appends are durable).
    pub async fn shutdown(&self) {
        if self.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        self.drain_waiters();
        for t in self.topics.read().values() {
            t.timer.notify_one();
        }
        for h in self.tasks.lock().drain(..) {
            h.abort();
        }
        self.persist_queues().await;
        for (_, p) in self.all_partitions() {
            p.close().await;
        }
        // Acks that raced the close.
        self.persist_queues().await;
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// Applies `f` to the metadata of topic incarnation `id` in a metadata edit.
fn edit_topic(
    metas: &mut [TopicMeta],
    id: u64,
    f: impl FnOnce(&mut TopicMeta),
) -> Result<(), BrokerError> {
    let m = metas
        .iter_mut()
        .find(|m| m.id == id)
        .ok_or_else(|| BrokerError::TopicNotFound(format!("{id:016x}")))?;
    f(m);
    Ok(())
}

/// The records a consume looks at, read ahead from the log: the next offsets are usually
/// scanned right after this one.
struct ReadAhead<'a> {
    log: &'a crate::log::PartitionLog,
    seen: HashMap<u64, Arc<Record>>,
    topic: &'a str,
    partition: u32,
}

impl ReadAhead<'_> {
    /// The reply weight of the record at `offset` (0 if it cannot be read now).
    fn reply_weight(&mut self, offset: u64) -> usize {
        use crate::queue::DueSource as _;
        self.due_ms(offset);
        self.seen.get(&offset).map_or(0, |r| r.reply_weight())
    }
}

impl crate::queue::DueSource for ReadAhead<'_> {
    fn due_ms(&mut self, o: u64) -> Option<i64> {
        if let Some(r) = self.seen.get(&o) {
            return Some(r.due_ms());
        }
        match self.log.read(o, 64, 1 << 20) {
            Ok(recs) => {
                let due = recs.first().filter(|r| r.offset == o).map(|r| r.due_ms());
                for r in recs {
                    self.seen.insert(r.offset, r);
                }
                due
            }
            Err(e) => {
                tracing::error!(topic = %self.topic, partition = self.partition, offset = o, error = %e, "cannot read record for delivery");
                None
            }
        }
    }
}

/// Removes topic directories that no metadata entry names (left by a delete interrupted by a
/// crash, or a create that failed half-way).
fn sweep_orphans(data_dir: &Path, metas: &[TopicMeta]) {
    let known: std::collections::HashSet<String> = metas.iter().map(TopicMeta::dir_name).collect();
    let Ok(entries) = std::fs::read_dir(data_dir.join("topics")) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !known.contains(&name) {
            tracing::info!(dir = %e.path().display(), "removing data of a deleted topic");
            if let Err(err) = std::fs::remove_dir_all(e.path()) {
                tracing::warn!(dir = %e.path().display(), error = %err, "could not remove orphan topic directory");
            }
        }
    }
}

#[cfg(test)]
mod tests;
