//! The metadata state machine: the catalog and the users (and, as the cluster grows, members
//! and partition owners) as the committed Raft entries made it, published to the node as an
//! immutable [`MetaView`] after every applied batch.
//!
//! Nothing but snapshots is written here: on a restart openraft re-applies the committed
//! entries after the last snapshot (the log store keeps the committed index). A snapshot is
//! one file, replaced atomically:
//!
//! ```text
//! raft/snapshot  "NRDSNAP1" | u32 CRC32C(body) | u64 len | body (JSON: meta + state)
//! ```
//!
//! A snapshot received from the leader is checked (header, checksum, parse) before it
//! replaces anything: openraft treats a failed install as fatal, so a damaged one must fail
//! before that point.

use std::collections::{HashMap, VecDeque};
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use narad_auth::store::{Deleted, UserRecord, Users};
use narad_core::catalog::{self, Applied, Catalog, RemoteChild, RemoteMeta, TopicMeta};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{
    CatalogDone, Entry, MetaCmd, MetaRequest, MetaResponse, NodeId, NodeInfo, Outcome, TypeConfig,
};

const MAGIC: &[u8; 8] = b"NRDSNAP1";
const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_VERSION: u32 = 1;
/// Responses remembered by request id, so a write retried across a leader change (same id)
/// takes effect once.
pub const DEDUPE_ENTRIES: usize = 10_000;

type SError = StorageError<NodeId>;

/// The metadata as of one applied log index. Cheap to clone (shared parts).
#[derive(Debug, Clone, Default)]
pub struct MetaView {
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, NodeInfo>,
    pub catalog: Arc<Catalog>,
    /// Users, with their password hashes and grants.
    pub users: Arc<Users>,
    /// The ids of the users deleted (see `narad_auth::record::Deleted`).
    pub deleted_users: Arc<Deleted>,
}

#[derive(Debug, Clone, Default)]
struct Data {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, NodeInfo>,
    catalog: Arc<Catalog>,
    users: Arc<Users>,
    deleted_users: Arc<Deleted>,
    dedupe: HashMap<u128, MetaResponse>,
    dedupe_order: VecDeque<u128>,
    /// The history's shape: the last log id of each run of entries one leader wrote, in
    /// order (at most [`MAX_LEADER_RUNS`], the oldest dropped): the log id at any index they
    /// cover follows from it. A member checks a snapshot against what it committed with it.
    leaders: VecDeque<LogId<NodeId>>,
    /// Older runs were dropped (the first run's start is not known).
    leaders_cut: bool,
}

/// Most leader runs a state machine remembers (see `Data::leaders`).
pub const MAX_LEADER_RUNS: usize = 4096;

impl Data {
    fn apply(&mut self, req: MetaRequest, index: u64) -> MetaResponse {
        if let Some(r) = self.dedupe.get(&req.id) {
            return r.clone();
        }
        let outcome = match req.cmd {
            MetaCmd::Catalog(cmd) => Outcome::Catalog(match catalog::apply(&self.catalog, &cmd) {
                Ok((next, applied)) => {
                    self.catalog = Arc::new(next);
                    Ok(match applied {
                        Applied::Topic(t) => CatalogDone::Topic {
                            id: t.id,
                            name: t.name.clone(),
                        },
                        Applied::Disowned(ids) => CatalogDone::Disowned(ids),
                        Applied::Deleted { topic, unlinked } => CatalogDone::Deleted {
                            id: topic.id,
                            name: topic.name.clone(),
                            unlinked,
                        },
                        Applied::Remote(r) => CatalogDone::Remote {
                            id: r.id,
                            version: r.version,
                        },
                        Applied::RemoteDeleted(r) => CatalogDone::RemoteDeleted { id: r.id },
                        Applied::RemoteChild(c) | Applied::RemoteChildGone(c) => {
                            CatalogDone::RemoteChild { epoch: c.epoch }
                        }
                        Applied::ClusterId(id) => CatalogDone::ClusterId(id),
                        Applied::Draining(d) => CatalogDone::Draining(d),
                        Applied::InSync(v) => CatalogDone::InSync(v),
                    })
                }
                Err(e) => Err(e),
            }),
            MetaCmd::Users(cmd) => {
                let mut next = Users::clone(&self.users);
                let mut deleted = Deleted::clone(&self.deleted_users);
                Outcome::Users(
                    match narad_auth::store::apply_command(&mut next, &mut deleted, cmd) {
                        Ok(()) => {
                            self.users = Arc::new(next);
                            self.deleted_users = Arc::new(deleted);
                            Ok(())
                        }
                        Err(e) => Err(e),
                    },
                )
            }
        };
        let resp = MetaResponse { index, outcome };
        if self.dedupe_order.len() == DEDUPE_ENTRIES
            && let Some(old) = self.dedupe_order.pop_front()
        {
            self.dedupe.remove(&old);
        }
        self.dedupe_order.push_back(req.id);
        self.dedupe.insert(req.id, resp.clone());
        resp
    }

    /// Notes that entry `id` was applied (see `leaders`).
    fn ran(&mut self, id: LogId<NodeId>) {
        match self.leaders.back_mut() {
            Some(last) if last.leader_id == id.leader_id => *last = id,
            _ => {
                if self.leaders.len() == MAX_LEADER_RUNS {
                    self.leaders.pop_front();
                    self.leaders_cut = true;
                }
                self.leaders.push_back(id);
            }
        }
    }

    /// The log id this history holds at `index`, if it knows (the runs cover it).
    pub(super) fn log_id_at(&self, index: u64) -> Option<LogId<NodeId>> {
        let i = self.leaders.partition_point(|l| l.index < index);
        let run = self.leaders.get(i)?;
        // the first run's start is known only if nothing was dropped before it
        if i == 0 && self.leaders_cut {
            return None;
        }
        Some(LogId::new(run.leader_id, index))
    }

    fn view(&self) -> MetaView {
        MetaView {
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            catalog: self.catalog.clone(),
            users: self.users.clone(),
            deleted_users: self.deleted_users.clone(),
        }
    }

    fn to_file(&self) -> StateFile {
        StateFile {
            version: SNAPSHOT_VERSION,
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            catalog_applied: self.catalog.applied(),
            topics: self.catalog.topics().map(|t| (**t).clone()).collect(),
            remotes: self.catalog.remotes().map(|r| (**r).clone()).collect(),
            remote_children: self
                .catalog
                .remote_children()
                .map(|c| (**c).clone())
                .collect(),
            cluster_id: self.catalog.cluster_id(),
            draining: self.catalog.draining().iter().copied().collect(),
            in_sync: self.catalog.in_sync_all().collect(),
            users: self.users.values().map(|u| UserRecord::clone(u)).collect(),
            deleted_users: self.deleted_users.ids().collect(),
            dedupe: self
                .dedupe_order
                .iter()
                .filter_map(|id| self.dedupe.get(id).map(|r| (*id, r.clone())))
                .collect(),
            leaders: self.leaders.iter().copied().collect(),
            leaders_cut: self.leaders_cut,
        }
    }

    fn from_file(f: StateFile) -> Result<Self, String> {
        if f.version != SNAPSHOT_VERSION {
            return Err(format!("unsupported snapshot version {}", f.version));
        }
        let n = f.topics.len();
        let catalog = Catalog::from_topics(f.catalog_applied, f.topics);
        if catalog.len() != n {
            return Err("a topic name appears twice".into());
        }
        let catalog = catalog
            .with_remotes(f.remotes)
            .and_then(|c| c.with_remote_children(f.remote_children, f.cluster_id))
            .ok_or("a remote or remote child name appears twice")?
            .with_draining(f.draining)
            .with_in_sync(f.in_sync);
        if f.dedupe.len() > DEDUPE_ENTRIES {
            return Err("too many remembered requests".into());
        }
        let dedupe_order = f.dedupe.iter().map(|(id, _)| *id).collect();
        if f.leaders.len() > MAX_LEADER_RUNS
            || f.leaders.windows(2).any(|w| w[0].index >= w[1].index)
        {
            return Err("the leader runs are not in order".into());
        }
        let mut users = Users::new();
        for u in f.users {
            if users.insert(u.username.clone(), Arc::new(u)).is_some() {
                return Err("a user name appears twice".into());
            }
        }
        Ok(Self {
            last_applied: f.last_applied,
            membership: f.membership,
            catalog: Arc::new(catalog),
            users: Arc::new(users),
            deleted_users: Arc::new(Deleted::from_ids(f.deleted_users)),
            dedupe: f.dedupe.into_iter().collect(),
            dedupe_order,
            // (a snapshot written before they were kept knows no history)
            leaders_cut: f.leaders_cut || f.leaders.is_empty(),
            leaders: f.leaders.into_iter().collect(),
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, NodeInfo>,
    catalog_applied: u64,
    topics: Vec<TopicMeta>,
    /// Remotes, their passwords sealed.
    #[serde(default)]
    remotes: Vec<RemoteMeta>,
    #[serde(default)]
    remote_children: Vec<RemoteChild>,
    #[serde(default)]
    cluster_id: Option<u64>,
    /// Members being decommissioned.
    #[serde(default)]
    draining: Vec<u64>,
    /// Per owner, its witnesses.
    #[serde(default)]
    in_sync: Vec<(u64, Vec<u64>)>,
    #[serde(default)]
    users: Vec<UserRecord>,
    /// Ids of deleted users, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    deleted_users: Vec<u64>,
    dedupe: Vec<(u128, MetaResponse)>,
    #[serde(default)]
    leaders: Vec<LogId<NodeId>>,
    #[serde(default)]
    leaders_cut: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotBody {
    meta: SnapshotMeta<NodeId, NodeInfo>,
    state: StateFile,
}

fn encode(body: &SnapshotBody) -> Vec<u8> {
    let json = serde_json::to_vec(body).expect("snapshots serialise");
    let mut b = Vec::with_capacity(20 + json.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&crc32c::crc32c(&json).to_le_bytes());
    b.extend_from_slice(&(json.len() as u64).to_le_bytes());
    b.extend_from_slice(&json);
    b
}

/// Why a whole snapshot a leader sent (`bytes`) conflicts with what `log` committed, if it
/// does (see `LogStore::snapshot_conflict`). A snapshot that does not parse says nothing
/// here (openraft refuses it).
pub(super) fn snapshot_conflict(bytes: &[u8], log: &super::LogStore) -> Option<String> {
    let body = decode(bytes).ok()?;
    let data = Data::from_file(body.state).ok()?;
    log.snapshot_conflict(|index| data.log_id_at(index))
}

/// Checks and parses a snapshot's bytes (from disk or from the leader).
fn decode(b: &[u8]) -> Result<SnapshotBody, String> {
    if b.len() < 20 || &b[..8] != MAGIC {
        return Err("not a narad metadata snapshot".into());
    }
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(b[12..20].try_into().expect("8 bytes"));
    let json = &b[20..];
    if json.len() as u64 != len {
        return Err(format!("{} bytes where the header says {len}", json.len()));
    }
    if crc32c::crc32c(json) != crc {
        return Err("checksum mismatch".into());
    }
    serde_json::from_slice(json).map_err(|e| e.to_string())
}

fn read_snapshot_file(dir: &Path) -> Result<Option<(SnapshotBody, Vec<u8>)>, String> {
    let path = dir.join(SNAPSHOT_FILE);
    match std::fs::read(&path) {
        Ok(b) => decode(&b)
            .map(|body| Some((body, b)))
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

pub struct StateMachine {
    dir: PathBuf,
    /// A snapshot was on disk at open.
    had_snapshot: bool,
    data: Data,
    published: watch::Sender<Arc<MetaView>>,
    /// The member's log, to check a snapshot against what it committed (see
    /// `install_snapshot`).
    log: Option<super::LogStore>,
}

impl StateMachine {
    /// The state as of the last snapshot in `dir` (empty without one).
    pub fn open(dir: &Path) -> Result<Self, String> {
        let (data, had_snapshot) = match read_snapshot_file(dir)? {
            Some((body, _)) => (Data::from_file(body.state)?, true),
            None => (Data::default(), false),
        };
        let published = watch::Sender::new(Arc::new(data.view()));
        Ok(Self {
            dir: dir.to_owned(),
            had_snapshot,
            data,
            published,
            log: None,
        })
    }

    /// Checks every snapshot a leader sends against what `log` committed.
    pub fn guard(&mut self, log: super::LogStore) {
        self.log = Some(log);
    }

    /// Whether a snapshot was on disk when the state machine opened.
    pub fn had_snapshot(&self) -> bool {
        self.had_snapshot
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<MetaView>> {
        self.published.subscribe()
    }

    fn publish(&self) {
        self.published.send_replace(Arc::new(self.data.view()));
    }
}

pub struct Builder {
    dir: PathBuf,
    data: Data,
    id: String,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SError> {
        let meta = SnapshotMeta {
            last_log_id: self.data.last_applied,
            last_membership: self.data.membership.clone(),
            snapshot_id: self.id.clone(),
        };
        let bytes = encode(&SnapshotBody {
            meta: meta.clone(),
            state: self.data.to_file(),
        });
        let (dir, copy) = (self.dir.clone(), bytes.clone());
        tokio::task::spawn_blocking(move || {
            narad_core::fsutil::write_file_atomic(&dir.join(SNAPSHOT_FILE), &copy)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r)
        .map_err(|e| SError::from(StorageIOError::write_snapshot(Some(meta.signature()), &e)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, NodeInfo>), SError> {
        Ok((self.data.last_applied, self.data.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<MetaResponse>, SError>
    where
        I: IntoIterator<Item = Entry> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut out = Vec::new();
        for e in entries {
            let index = e.log_id.index;
            self.data.last_applied = Some(e.log_id);
            self.data.ran(e.log_id);
            out.push(match e.payload {
                EntryPayload::Blank => MetaResponse::done(index),
                EntryPayload::Normal(req) => self.data.apply(req, index),
                EntryPayload::Membership(m) => {
                    self.data.membership = StoredMembership::new(Some(e.log_id), m);
                    MetaResponse::done(index)
                }
            });
        }
        self.publish();
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let at = self.data.last_applied;
        Builder {
            dir: self.dir.clone(),
            data: self.data.clone(),
            id: format!(
                "{}-{}-{:x}",
                at.map_or(0, |l| l.leader_id.term),
                at.map_or(0, |l| l.index),
                u64::from_le_bytes(super::random_bytes())
            ),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, NodeInfo>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SError> {
        let bytes = snapshot.into_inner();
        let bad = |e: String| {
            SError::from(StorageIOError::read_snapshot(
                Some(meta.signature()),
                &std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            ))
        };
        let body = decode(&bytes).map_err(bad)?;
        if body.meta.last_log_id != meta.last_log_id {
            return Err(bad("the snapshot's content is not the one announced".into()));
        }
        let data = Data::from_file(body.state).map_err(bad)?;
        // a snapshot never replaces metadata this member committed with another history
        // (openraft installs one past the commit point without looking; see
        // `LogStore::committed_conflict` for the entries' side)
        if let Some(log) = &self.log
            && let Some(why) = log.snapshot_conflict(|index| data.log_id_at(index))
        {
            log.halt(why.clone());
            return Err(bad(why));
        }
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || {
            narad_core::fsutil::write_file_atomic(&dir.join(SNAPSHOT_FILE), &bytes)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r)
        .map_err(|e| SError::from(StorageIOError::write_snapshot(Some(meta.signature()), &e)))?;
        self.data = data;
        self.publish();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SError> {
        let dir = self.dir.clone();
        let read = tokio::task::spawn_blocking(move || read_snapshot_file(&dir))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|e| {
                SError::from(StorageIOError::read_snapshot(
                    None,
                    &std::io::Error::other(e),
                ))
            })?;
        Ok(read.map(|(body, bytes)| Snapshot {
            meta: body.meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}
