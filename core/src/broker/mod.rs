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
//!
//! The code follows those seams: `catalog` (topic metadata changes), `produce`, `delivery`
//! (consume, settle, timers), `history` (replay and the tierer's reads), `maintenance`
//! (snapshots, retention, shutdown), `layout` (directories and open logs), `fanout` (children
//! and their cursors), `partition` (one partition's log and queue), `journal` (its delivery
//! counts between queue snapshots), `meta` (the metadata file).

mod catalog;
mod cursor_file;
mod delivery;
mod fanout;
mod history;
mod journal;
mod layout;
mod maintenance;
pub mod moves;
mod origin;
mod partition;
mod produce;
mod progress;
mod remotes;
mod waiters;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, oneshot};

pub use crate::catalog::link::{MAX_CHILD_DELAY_MS, OriginFloor, ParentLink};
use crate::catalog::store::{self as meta, LocalMetaStore, MetaStore};
use crate::catalog::{Applied, CatalogCommand, CatalogError, store::StoreError};
pub use crate::catalog::{MAX_CHILDREN, MAX_SCHEMA_VERSIONS, SchemaVersion, TopicMeta};
use crate::clock::SharedClock;
use crate::handle::{HandleCodec, HandleError, ReceiptHandle};
use crate::log::{LogConfig, LogError, LogStats, SealedSegment};
use crate::metrics::{CoreMetrics, TopicLabel};
use crate::queue::{LeaseError, QueueStats};
use crate::record::{NewRecord, Record};
use crate::supervisor::Supervisor;
use crate::topic::{
    CreateTopic, InvalidField, MAX_DELAY_MS, TopicConfig, TopicPatch, partition_for_key,
};
pub use fanout::{ChildInfo, CopyForwarder, LinkStart};
pub use origin::{MAX_HOPS, ORIGIN_HEADER, ORIGIN_TIME_HEADER, VIA_HEADER};
use partition::{LogEnv, OpenLogs, Partition};
pub use produce::KeylessSpread;
pub use progress::{
    MirrorReport, OriginReport, PROGRESS_INTERVAL, PROGRESS_RESEND, PartitionProgress, SourceEnd,
    progress_max_origin_partitions,
};
pub use remotes::{
    BlockedRecord, CatalogSync, LinkStatus, ProgressRefused, ProgressUpdate, RemoteChildInfo,
    RemoteShipper, ShipBatch, ShipFailure, SyncRefused, state_rank,
};
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
    /// How often a remote child sends its parent's consumer progress at most; 0: never.
    pub mirror_progress_interval_ms: u64,
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
    /// Most bytes of records remote children's cursors hold at once on the node, in slabs
    /// of [`fanout::SLAB_BYTES`] (at least one): each cursor holds one slab at most, from its
    /// read to the end of its ship, and waits its turn for one.
    pub remote_memory_bytes: usize,
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
            mirror_progress_interval_ms: 1000,
            retention_interval_ms: 30_000,
            max_ack_ranges: 65_536,
            archive_gate: false,
            local_retention_ms: 0,
            limits: Limits::default(),
            remote_memory_bytes: 256 << 20,
        }
    }
}

/// A consume or replay read stops adding messages once their reply weight (payload, key and
/// headers as the JSON reply writes them at worst, see [`Record::reply_weight`]) reaches this
/// (so a reply holds at most this plus one message, and always at least one message):
/// `max` × the largest message would otherwise be hundreds of MiB in one reply.
pub const MAX_READ_BYTES: usize = 4 << 20;

/// `message <i>: ` when an error is about one message of a produce, as every per-message error
/// of a batch names it.
fn message_at(index: Option<usize>) -> String {
    index.map(|i| format!("message {i}: ")).unwrap_or_default()
}

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
    /// `index`: the message of a produce that names the partition.
    #[error("{}partition {partition} is out of range: the topic has {partitions} partitions", message_at(*.index))]
    PartitionOutOfRange {
        index: Option<usize>,
        partition: u32,
        partitions: u32,
    },
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
    /// A batch spans more partitions than the node may keep open at once (`max_open_logs`):
    /// it can never be written whole, so it is refused (not retryable) and nothing is written.
    #[error(
        "the batch spans {partitions} partitions, but this node keeps at most {max} partition logs open (max_open_logs); split it into batches of at most {max} partitions"
    )]
    BatchSpansTooManyLogs { partitions: usize, max: usize },
    /// `max_open_logs` logs are open and every one is in use: retry shortly.
    #[error(
        "{max} partition logs are open, the most the node allows (max_open_logs), and none is idle; retry shortly"
    )]
    TooManyOpenLogs { max: usize },
    #[error("storage failure: {0}")]
    Storage(LogError),
    #[error("metadata failure: {0}")]
    Meta(#[from] meta::MetaError),
    /// The cluster could not change its metadata now (no leader, no quorum), or cannot say
    /// whether it did: retry.
    #[error("{0}")]
    ClusterUnavailable(String),
    /// Not available on a cluster member (yet).
    #[error("{0}")]
    ClusterUnsupported(String),
    #[error("remote '{0}' already exists")]
    RemoteExists(String),
    #[error("remote '{0}' not found")]
    RemoteNotFound(String),
    /// A change named a version the remote is no longer at: read it again.
    #[error("{0}")]
    RemoteChanged(String),
    #[error("the cluster already has {max} remotes, the most it keeps; delete one first")]
    TooManyRemotes { max: usize },
    /// A remote child uses the remote.
    #[error("{0}")]
    RemoteInUse(String),
    /// A parent or remote child with records not shipped yet, deleted without `force`.
    #[error("{0}")]
    Unshipped(String),
    /// A move's compare-and-set found the partition elsewhere (or the move gone).
    #[error("{0}")]
    MoveConflict(String),
    /// The topic is a mirror of another cluster's (or a demoted primary): it takes records
    /// only from its link and leases nothing.
    #[error("{0}")]
    MirrorReadOnly(String),
    /// A link's epoch is older than the topic's: its sender was superseded by a promotion.
    #[error("{0}")]
    Fenced(String),
    /// A role change the topic's role forbids, or one that raced another.
    #[error("{0}")]
    RoleConflict(String),
    /// A link would make a cycle.
    #[error("{0}")]
    LoopDetected(String),
    /// The partition is frozen for a move to another node: retry shortly (the forwarding
    /// member does, once the catalog names the new owner).
    #[error("partition {partition} of '{topic}' is moving to another node; retry")]
    PartitionMoving { topic: String, partition: u32 },
    /// A partition another node owns: the caller routes the request to that owner.
    #[error("partition {partition} of '{topic}' is owned by node {owner}, not this one; retry")]
    NotOwner {
        topic: String,
        partition: u32,
        owner: u64,
    },
}

impl From<CatalogError> for BrokerError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::Exists(name) => Self::TopicExists(name),
            CatalogError::NotFound(name) => Self::TopicNotFound(name),
            CatalogError::InvalidConfig(reason) => Self::InvalidField(InvalidField {
                field: "config",
                reason,
            }),
            CatalogError::Invalid(m) => Self::FanoutInvalid(m),
            CatalogError::FanoutConflict(m) => Self::FanoutConflict(m),
            CatalogError::NotChild(m) => Self::FanoutNotChild(m),
            CatalogError::SchemaIncompatible(m) => Self::SchemaIncompatible(m),
            CatalogError::RemoteExists(name) => Self::RemoteExists(name),
            CatalogError::RemoteNotFound(name) => Self::RemoteNotFound(name),
            CatalogError::RemoteChanged(m) => Self::RemoteChanged(m),
            CatalogError::TooManyRemotes(max) => Self::TooManyRemotes { max },
            CatalogError::RemoteInUse(m) => Self::RemoteInUse(m),
            CatalogError::MoveConflict(m) | CatalogError::InSyncChanged(m) => Self::MoveConflict(m),
            CatalogError::RoleChanged(m) => Self::RoleConflict(m),
            CatalogError::LoopDetected(m) => Self::LoopDetected(m),
        }
    }
}

impl From<StoreError> for BrokerError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Refused(e) => e.into(),
            StoreError::Meta(e) => e.into(),
            StoreError::Unavailable(m) => Self::ClusterUnavailable(m),
        }
    }
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
    /// The lease renewed for the topic's `visibility_timeout_ms` from now.
    Extend,
    /// The lease renewed for this many ms from now (at least `MIN_VISIBILITY_MS`, at most
    /// `MAX_VISIBILITY_MS`: the broker clamps it).
    ExtendFor(i64),
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
    /// Set when messages were given back (a reader that could not be answered): the timer
    /// task then offers them to the waiting readers at once.
    given_back: AtomicBool,
    deleted: AtomicBool,
    label: TopicLabel,
    /// The series counted on every produce, consume and ack, looked up once.
    series: crate::metrics::TopicSeries,
    /// Tests: the next dispatch pass that finds nothing for a waiter says so on the first
    /// channel and waits for the second before it gives the waiter back.
    #[cfg(test)]
    test_pause: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

impl Topic {
    #[cfg(test)]
    async fn pause_for_test(&self) {
        let hook = self.test_pause.lock().take();
        if let Some((paused, resume)) = hook {
            let _ = paused.send(());
            let _ = resume.await;
        }
    }

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
                index: None,
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
    /// Serialises metadata changes (create, alter, delete) on this node, from their checks
    /// to their publication.
    meta_lock: tokio::sync::Mutex<()>,
    /// Directories of deleted topics still to remove (a first removal failed).
    leftovers: Arc<Mutex<Vec<PathBuf>>>,
    /// Serialises [`Broker::follow_catalog`] passes (a replicated store).
    follow_lock: tokio::sync::Mutex<()>,
    /// How many commands made the catalog this node's state follows now (watched: a cluster
    /// member's calls from another member wait for it to reach theirs).
    followed: tokio::sync::watch::Sender<u64>,
    /// Where catalog commands become durable (see [`Broker::commit`]).
    store: Arc<dyn MetaStore>,
    shutting_down: AtomicBool,
    /// Set when shutdown begins: consumes stop waiting.
    draining: AtomicBool,
    shutdown: Notify,
    /// Topic timers, maintenance and fan-out cursors (see [`crate::supervisor`]).
    tasks: Supervisor,
    /// The data directory held no topic metadata when the broker opened (a new node, or one
    /// that lost its disk): the server may restore topics from the archive.
    fresh: AtomicBool,
    /// Fan-out cursor positions, per (child, parent partition), for lag reporting.
    fanout: Mutex<HashMap<(String, u32), Arc<fanout::CursorState>>>,
    /// On a cluster member: how fan-out copies reach child partitions other members own.
    copy_forwarder: std::sync::OnceLock<Arc<dyn CopyForwarder>>,
    /// Remote children's cursors, per (child, parent partition).
    remote_cursors: Mutex<HashMap<(String, u32), Arc<remotes::RemoteCursor>>>,
    /// Mirror topics' indexes of records not settled yet, by topic id (see `progress`).
    mirror_indexes: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<progress::MirrorIndex>>>>,
    /// Per mirror topic: batches taken while its index was busy, to index next, and how
    /// many records they hold.
    mirror_deferred: Mutex<HashMap<u64, (Vec<progress::Deferred>, usize)>>,
    /// Signalled whenever a mirror takes progress (a promote waiting for a drain).
    mirror_progress_taken: Notify,
    /// How remote children's records reach their remotes.
    shipper: std::sync::OnceLock<Arc<dyn RemoteShipper>>,
    /// The node's budget for records remote children's cursors hold, in slabs, split
    /// evenly between the remotes (at least one each: a remote that hangs holds only its
    /// share); per remote, FIFO: a waiting cursor is served in turn, one slab at a time.
    remote_slab_budget: usize,
    /// Each remote's share now: (slabs, its semaphore), by remote id.
    remote_slabs: Mutex<HashMap<u64, (usize, Arc<tokio::sync::Semaphore>)>>,
    /// Serialises freezes, thaws, installs and give-aways of partitions (moves).
    moves_lock: tokio::sync::Mutex<()>,
    /// Partitions not owned here whose earlier frames no WAL file names any more (a
    /// checkpoint ran while they were at this owner epoch): their install needs no
    /// checkpoint inside the source's freeze. By (topic id, partition) → owner epoch.
    wal_clean: Mutex<HashMap<crate::ids::PartitionId, u64>>,
    /// A cluster member's start: partitions opened now are held until checked against what
    /// the cluster saw acknowledged (see [`Broker::unverified`]).
    verifying: AtomicBool,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("data_dir", &self.cfg.data_dir)
            .finish()
    }
}

use crate::random_u64;

impl Broker {
    /// Opens the broker: loads topic metadata, recovers every partition, starts background
    /// tasks. Must run inside a multi-threaded tokio runtime.
    pub async fn open(
        cfg: BrokerConfig,
        clock: SharedClock,
        metrics: Arc<CoreMetrics>,
    ) -> Result<Arc<Self>, BrokerError> {
        let data_dir = cfg.data_dir.clone();
        let store = tokio::task::spawn_blocking(move || -> Result<_, BrokerError> {
            crate::fsutil::create_dir_private(&data_dir).map_err(|source| LogError::Io {
                path: data_dir.clone(),
                source,
            })?;
            Ok(LocalMetaStore::open(&data_dir)?)
        })
        .await
        .expect("metadata load task")?;
        Self::open_with_store(cfg, clock, metrics, Arc::new(store)).await
    }

    /// Opens the broker on the catalog `store` holds: recovers the partitions of every topic
    /// in it and starts background tasks.
    pub async fn open_with_store(
        mut cfg: BrokerConfig,
        clock: SharedClock,
        metrics: Arc<CoreMetrics>,
        store: Arc<dyn MetaStore>,
    ) -> Result<Arc<Self>, BrokerError> {
        // The write-ahead log first: its replay completes what the partitions' segments
        // hold before any of them is opened.
        let (wal_dir, root, wal_metrics) = (
            cfg.data_dir.join("wal"),
            cfg.data_dir.clone(),
            metrics.clone(),
        );
        let (wal, replayed) = tokio::task::spawn_blocking(move || {
            crate::fsutil::create_dir_private(&root).map_err(|source| LogError::Io {
                path: root.clone(),
                source,
            })?;
            // copies staged for moves (or set aside by one) are never needed after a
            // restart: a move in flight starts its copy again
            let _ = std::fs::remove_dir_all(root.join(moves::MOVES_DIR));
            crate::log::Wal::open(
                &wal_dir,
                &root,
                crate::log::WalConfig::default(),
                wal_metrics,
            )
        })
        .await
        .expect("write-ahead log open task")?;
        if replayed.files > 0 {
            tracing::info!(?replayed, "replayed the write-ahead log");
        }
        cfg.log.wal = Some(wal);
        let env = LogEnv {
            cfg: cfg.log.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
            max_ack_ranges: cfg.max_ack_ranges,
        };
        let open_logs = OpenLogs::new(cfg.limits.max_open_logs.max(1));
        let tasks = Supervisor::new(metrics.tasks.clone());
        let remote_slab_budget = remotes::slabs_for(cfg.remote_memory_bytes);
        let broker = Arc::new(Self {
            open_logs,
            cfg,
            env,
            clock,
            metrics,
            handles: HandleCodec::random(),
            topics: Arc::default(),
            meta_lock: tokio::sync::Mutex::new(()),
            follow_lock: tokio::sync::Mutex::new(()),
            leftovers: Arc::default(),
            followed: tokio::sync::watch::Sender::new(0),
            store,
            shutting_down: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            shutdown: Notify::new(),
            tasks,
            fresh: AtomicBool::new(false),
            fanout: Mutex::new(HashMap::new()),
            copy_forwarder: std::sync::OnceLock::new(),
            remote_cursors: Mutex::new(HashMap::new()),
            mirror_indexes: Mutex::new(HashMap::new()),
            mirror_deferred: Mutex::new(HashMap::new()),
            mirror_progress_taken: Notify::new(),
            shipper: std::sync::OnceLock::new(),
            remote_slab_budget,
            remote_slabs: Mutex::new(HashMap::new()),
            moves_lock: tokio::sync::Mutex::new(()),
            wal_clean: Mutex::new(HashMap::new()),
            verifying: AtomicBool::new(false),
        });
        let data_dir = broker.cfg.data_dir.clone();
        {
            let topics = data_dir.join("topics");
            tokio::task::spawn_blocking(move || {
                crate::fsutil::create_dir_private(&topics).map_err(|source| LogError::Io {
                    path: topics.clone(),
                    source,
                })
            })
            .await
            .expect("data directory task")?;
        }
        let catalog = broker.store.catalog();
        // no metadata yet, or a restore from the archive that did not finish
        let fresh =
            !data_dir.join(meta::META_FILE).exists() || data_dir.join(RESTORE_MARKER).exists();
        broker.fresh.store(fresh, Ordering::Release);
        // (a cluster member may start on a catalog older than the cluster's, which does not
        // name topics made since: their directories are not orphans)
        if !broker.store.replicated() {
            layout::sweep_orphans(&data_dir, catalog.topics().map(|m| m.dir_name()).collect());
        }
        broker.followed.send_replace(catalog.applied());
        // (its data directory may be an older copy than the one that acknowledged: nothing
        // opened now is served until the cluster's mover checked it)
        broker
            .verifying
            .store(broker.store.replicated(), Ordering::SeqCst);
        for m in catalog.topics() {
            let topic = broker.open_topic_rebuilt((**m).clone()).await?;
            if !broker.store.replicated() {
                // a freeze for a move left in a data directory now used by a single node
                // (no cluster will ever decide it): thawed
                for part in topic.partitions().iter().filter(|p| p.is_frozen()) {
                    tracing::warn!(dir = %part.dir.display(), "a partition frozen for a cluster move is thawed: this node is a single node");
                    part.thaw().await.map_err(|source| LogError::Io {
                        path: part.dir.clone(),
                        source,
                    })?;
                }
            }
            broker.topics.write().insert(m.name.clone(), topic.clone());
            broker.spawn_topic_timer(topic);
        }
        broker.spawn_maintenance();
        broker.start_cursors();
        Ok(broker)
    }

    /// The topic catalog as last published.
    pub fn catalog(&self) -> Arc<crate::catalog::Catalog> {
        self.store.catalog()
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
}

#[cfg(test)]
mod tests;
mod verify;
