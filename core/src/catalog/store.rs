//! Where catalog commands become durable: the [`MetaStore`] seam and its single-node
//! implementation, [`LocalMetaStore`].
//!
//! A proposer hands the store a command and a `publish` hook. The store applies the command
//! to the catalog it has published, makes the result durable, then publishes it — the new
//! catalog to every watcher, and the proposer's hook, which makes the broker's in-memory
//! state (open partitions, cursors) follow — all before the next command is looked at. A
//! command that fails to apply or to persist publishes nothing.
//!
//! The single-node store keeps one snapshot per change: `<data_dir>/topics.json`, replaced
//! atomically (temp file, fsync, rename, fsync of the directory). A replicated store (the
//! Raft issue) puts the same commands in a replicated log and calls the same hooks when an
//! entry is applied.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    Applied, Catalog, CatalogCommand, CatalogError, RemoteChild, RemoteMeta, TopicMeta, apply,
};

pub const META_FILE: &str = "topics.json";
/// Version 1 held the topics only; version 2 adds how many commands made them; version 3
/// the remotes.
const META_VERSION: u32 = 3;

/// Runs once a command is durable and applied, before any later command is applied: the
/// proposer's way to make its in-memory state follow. It gets the new catalog and what the
/// command did.
pub type Publish = Box<dyn FnOnce(&Catalog, &Applied) + Send>;

/// A command's outcome, as a future.
pub type Proposal = Pin<Box<dyn Future<Output = Result<Applied, StoreError>> + Send>>;

/// A replicated command's outcome (`Ok`: committed and applied on this node), as a future.
pub type Replication = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// Why a proposal failed. Nothing was published.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Refused(#[from] CatalogError),
    #[error(transparent)]
    Meta(#[from] MetaError),
    /// A replicated store could not commit it now (no leader, no quorum), or cannot say
    /// whether it did: the caller may retry.
    #[error("{0}")]
    Unavailable(String),
}

/// The seam between the broker and where its metadata lives.
pub trait MetaStore: Send + Sync + std::fmt::Debug {
    /// Makes `cmd` durable, applies it, publishes the new catalog, then runs `publish`. The
    /// work finishes even if the returned future is dropped, so a caller that gives up never
    /// leaves durable state unpublished.
    fn propose(&self, cmd: CatalogCommand, publish: Publish) -> Proposal;
    /// The catalog as last published.
    fn catalog(&self) -> Arc<Catalog>;
    /// Follows the published catalog.
    fn subscribe(&self) -> watch::Receiver<Arc<Catalog>>;
    /// Whether commands go through a replicated log (a cluster): then every node's broker
    /// changes its state only by following the catalog the commands make
    /// (`Broker::follow_catalog`), never in a proposer's hook, and proposes with
    /// [`MetaStore::replicate`].
    fn replicated(&self) -> bool {
        false
    }
    /// A replicated store: commits `cmd` through its log; resolves once this node has
    /// applied it (to the catalog it publishes). Runs to the end even if dropped.
    fn replicate(&self, _cmd: CatalogCommand) -> Replication {
        Box::pin(async {
            Err(StoreError::Unavailable(
                "this node's metadata is not replicated".into(),
            ))
        })
    }
    /// This node's id in its cluster; `None` on a single node (every partition is here).
    fn node_id(&self) -> Option<u64> {
        None
    }
    /// Owners for partitions `from..to` of topic `topic_id`: a replicated store spreads
    /// them over its members; the single-node store names none.
    fn place(&self, _topic_id: u64, _from: u32, _to: u32) -> Vec<u64> {
        Vec::new()
    }
}

/// The single-node store: one snapshot file per change. Clones share the store.
#[derive(Debug, Clone)]
pub struct LocalMetaStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// Held while a command is applied, written and published.
    commit: Mutex<()>,
    published: watch::Sender<Arc<Catalog>>,
}

impl LocalMetaStore {
    /// Loads the catalog from `data_dir` (empty if there is no metadata file yet).
    pub fn open(data_dir: &Path) -> Result<Self, MetaError> {
        let catalog = load(data_dir)?;
        Ok(Self {
            inner: Arc::new(Inner {
                dir: data_dir.to_owned(),
                commit: Mutex::new(()),
                published: watch::Sender::new(Arc::new(catalog)),
            }),
        })
    }
}

impl Inner {
    fn commit(&self, cmd: &CatalogCommand, publish: Publish) -> Result<Applied, StoreError> {
        let _one_change = self.commit.lock();
        let current = self.published.borrow().clone();
        let (next, applied) = apply(&current, cmd)?;
        store(&self.dir, &next)?;
        let next = Arc::new(next);
        self.published.send_replace(next.clone());
        publish(&next, &applied);
        Ok(applied)
    }
}

impl MetaStore for LocalMetaStore {
    fn propose(&self, cmd: CatalogCommand, publish: Publish) -> Proposal {
        let inner = self.inner.clone();
        let task = tokio::task::spawn_blocking(move || inner.commit(&cmd, publish));
        Box::pin(async move { task.await.expect("metadata commit task") })
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.inner.published.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<Catalog>> {
        self.inner.published.subscribe()
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetaFile {
    version: u32,
    /// Commands applied to make these topics (absent in version 1).
    #[serde(default)]
    applied: u64,
    topics: Vec<TopicMeta>,
    /// Remotes, their passwords sealed (absent before version 3).
    #[serde(default)]
    remotes: Vec<RemoteMeta>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    remote_children: Vec<RemoteChild>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cluster_id: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("topic metadata {path} is unreadable: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

impl MetaError {
    /// Whether this failed for want of a file descriptor.
    pub fn is_out_of_descriptors(&self) -> bool {
        match self {
            Self::Io { source, .. } => crate::log::is_out_of_descriptors(source),
            Self::Invalid { .. } => false,
        }
    }
}

/// Reads `<data_dir>/topics.json` (versions 1 to 3); no file is an empty catalog.
pub fn load(data_dir: &Path) -> Result<Catalog, MetaError> {
    let path = data_dir.join(META_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Catalog::default()),
        Err(source) => return Err(MetaError::Io { path, source }),
    };
    let invalid = |reason: String| MetaError::Invalid {
        path: path.clone(),
        reason,
    };
    let file: MetaFile = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if !(1..=META_VERSION).contains(&file.version) {
        return Err(invalid(format!("unsupported version {}", file.version)));
    }
    let n = file.topics.len();
    let catalog = Catalog::from_topics(file.applied, file.topics);
    if catalog.len() != n {
        return Err(invalid("a topic name appears twice".into()));
    }
    catalog
        .with_remotes(file.remotes)
        .and_then(|c| c.with_remote_children(file.remote_children, file.cluster_id))
        .ok_or_else(|| invalid("a remote or remote child name appears twice".into()))
}

/// Replaces `<data_dir>/topics.json` with `catalog`, durably.
pub fn store(data_dir: &Path, catalog: &Catalog) -> Result<(), MetaError> {
    let path = data_dir.join(META_FILE);
    let body = serde_json::to_vec_pretty(&MetaFile {
        version: META_VERSION,
        applied: catalog.applied(),
        topics: catalog.topics().map(|t| (**t).clone()).collect(),
        remotes: catalog.remotes().map(|r| (**r).clone()).collect(),
        remote_children: catalog.remote_children().map(|c| (**c).clone()).collect(),
        cluster_id: catalog.cluster_id(),
    })
    .expect("metadata serialises");
    crate::fsutil::write_file_atomic(&path, &body).map_err(|source| MetaError::Io { path, source })
}
