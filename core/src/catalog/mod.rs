//! The topic catalog as data and commands: every topic's metadata (settings, incarnation id,
//! owner, schema versions, fan-out link), changed only by applying a [`CatalogCommand`].
//!
//! [`apply`] is pure: it reads the catalog and the command, and nothing else — no clock, no
//! random numbers, no disk. Whatever a change depends on (incarnation ids, attach epochs,
//! timestamps, schema version numbers) the proposer chose and put in the command, so every
//! node that applies the same commands in the same order holds the same catalog. That is
//! what lets a replicated log (the Raft metastore) carry these commands unchanged.
//!
//! The broker proposes commands through a [`MetaStore`](store::MetaStore), which makes each
//! one durable before it is applied and published (see [`store`]).

pub mod link;
pub mod move_machine;
pub mod moves;
pub mod plan;
pub mod remote;
pub mod role;
pub mod store;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::topic::TopicConfig;
use link::{MAX_CHILD_DELAY_MS, ParentLink};
pub use moves::PartitionMove;
pub use remote::{RemoteChild, RemoteMeta, SealedCredential};
pub use role::TopicRole;

/// Most children one parent may have.
pub const MAX_CHILDREN: usize = 64;
/// A delay child needs the parent to keep records at least this much longer than the delay.
pub const DELAY_RETENTION_MARGIN_MS: i64 = 3_600_000;
/// Most JSON Schema versions one topic keeps.
pub const MAX_SCHEMA_VERSIONS: usize = 100;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TopicMeta {
    /// Incarnation id: a topic deleted and re-created with the same name gets a new one, and
    /// its data directory and receipt handles are keyed by it.
    pub id: u64,
    pub name: String,
    pub created_at_ms: i64,
    pub config: TopicConfig,
    /// Set when this topic is a fan-out child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// The user who created the topic (with security on); it may alter and delete it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The owning user's id (users of one name over time have different ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<u64>,
    /// JSON Schema versions, oldest first; produce validates against the last one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<SchemaVersion>,
    /// In a cluster: the node that owns each partition (one per partition; only it writes
    /// and serves that partition). Empty on a single node: every partition is local.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<u64>,
    /// In a cluster: each partition's owner epoch, one more at every completed move (a
    /// partition past the end of the list, or every one when it is empty, is at 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_epochs: Vec<u64>,
    /// In a cluster: the partitions being moved to another node, by partition.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moves: BTreeMap<u32, PartitionMove>,
    /// In a cluster: partitions whose owner was lost for good and that a live node rebuilt
    /// from the archive, by partition (see [`CatalogCommand::ReassignLost`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rebuilt: BTreeMap<u32, moves::LostTail>,
    /// Primary, mirror of a topic on another cluster, or demoted, and the epoch (see
    /// [`role`]); a topic that never took part in a failover is a primary at epoch 0.
    #[serde(default, skip_serializing_if = "TopicRole::is_default")]
    pub role: TopicRole,
    /// A mirror: its source's fan-out children, as the source's link last said; a promote
    /// attaches them here (see [`CarriedChild`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carried_children: Vec<CarriedChild>,
    /// In a cluster: partitions an admin moved by hand, which the planner leaves where they
    /// are until unpinned (a decommission still moves them).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub pinned: std::collections::BTreeSet<u32>,
}

/// A fan-out child of a mirror's source, carried over the link: at the promote the new
/// primary attaches a child of that name (created if missing) with the same delay.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CarriedChild {
    pub name: String,
    #[serde(default)]
    pub delay_ms: i64,
    /// The child's partition count at the source (a child created here gets it).
    pub partitions: u32,
}

impl CarriedChild {
    /// Checks a list a link sent (not trusted to be well formed).
    pub fn validate_list(children: &[CarriedChild]) -> Result<(), String> {
        if children.len() > MAX_CHILDREN {
            return Err(format!("at most {MAX_CHILDREN} children"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in children {
            crate::topic::validate_name(&c.name)
                .map_err(|e| format!("child '{}': {}", c.name, e.reason))?;
            // (topic names are case-sensitive: `audit` and `AUDIT` are two topics)
            if !seen.insert(c.name.as_str()) {
                return Err(format!("child '{}' is named twice", c.name));
            }
            if !(0..=MAX_CHILD_DELAY_MS).contains(&c.delay_ms) {
                return Err(format!(
                    "child '{}': delay_ms must be between 0 and {}",
                    c.name, MAX_CHILD_DELAY_MS
                ));
            }
            if !(1..=crate::topic::MAX_PARTITIONS).contains(&c.partitions) {
                return Err(format!(
                    "child '{}': partitions must be between 1 and {}",
                    c.name,
                    crate::topic::MAX_PARTITIONS
                ));
            }
        }
        Ok(())
    }
}

/// One version of a topic's JSON Schema. Versions only grow; each is kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SchemaVersion {
    pub version: u32,
    pub created_at_ms: i64,
    pub schema: serde_json::Value,
}

impl TopicMeta {
    /// Topic incarnation `id` named `name`, made at `created_at_ms` with `config`, and
    /// nothing else yet: no owner, schema, link, partition owners, moves or role.
    pub fn new(id: u64, name: &str, created_at_ms: i64, config: crate::topic::TopicConfig) -> Self {
        Self {
            id,
            name: name.into(),
            created_at_ms,
            config,
            parent: None,
            owner: None,
            owner_id: None,
            schemas: Vec::new(),
            owners: Vec::new(),
            owner_epochs: Vec::new(),
            moves: Default::default(),
            rebuilt: Default::default(),
            role: Default::default(),
            carried_children: Vec::new(),
            pinned: Default::default(),
        }
    }
}

impl TopicMeta {
    /// The topic's directory under `<data_dir>/topics/`.
    pub fn dir_name(&self) -> String {
        format!("{}.{:016x}", self.name, self.id)
    }
}

/// One change to the catalog, carrying every value its effect depends on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum CatalogCommand {
    /// A new topic (or one restored from the archive, with its old incarnation id).
    CreateTopic { topic: TopicMeta },
    /// New settings for topic `topic_id` (partitions only grow). In a cluster `owners`
    /// lists every partition's owner after the change (the old ones unchanged); empty keeps
    /// them, which only a topic whose partitions do not grow (or a single node's) may do.
    AlterTopic {
        topic_id: u64,
        config: TopicConfig,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        owners: Vec<u64>,
    },
    /// Appends schema version `schema` (its number must follow the last one).
    AddSchemaVersion {
        topic_id: u64,
        schema: SchemaVersion,
    },
    /// Clears the owner of every topic owned by user `owner` of id `owner_id` (the user was
    /// deleted). Topics recorded before users had ids carry no id: they match id 0.
    Disown { owner: String, owner_id: u64 },
    /// Removes topic `topic_id`; its children become standalone.
    DeleteTopic { topic_id: u64 },
    /// Makes `child_id` a fan-out child as `link` says.
    Attach { child_id: u64, link: ParentLink },
    /// Makes `child_id` standalone again; it must be a child of `parent_id`.
    Detach { child_id: u64, parent_id: u64 },
    /// A new remote (`expect_version` absent), or a change of the remote of that name and
    /// id, refused unless it is still at `expect_version`.
    PutRemote {
        remote: RemoteMeta,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect_version: Option<u64>,
    },
    /// Removes the remote of id `remote_id` (refused while a remote child uses it).
    DeleteRemote { remote_id: u64 },
    /// A new remote child.
    AttachRemote { child: RemoteChild },
    /// Removes remote child `name` of attachment `epoch`.
    DetachRemote { name: String, epoch: u64 },
    /// Pauses or resumes remote child `name` of attachment `epoch`.
    PauseRemote {
        name: String,
        epoch: u64,
        paused: bool,
    },
    /// Skips record `offset` of parent partition `partition` for remote child `name` of
    /// attachment `epoch` (its target refused it).
    SkipRemote {
        name: String,
        epoch: u64,
        partition: u32,
        offset: u64,
    },
    /// Names the cluster (once: a later one changes nothing). Mirrored records carry it as
    /// their origin.
    InitCluster { cluster_id: u64 },
    /// Starts moving partition `partition` of topic `topic_id` to node `target` (`None`:
    /// cancels the move in flight), only while the partition is at `expect_owner` and
    /// `expect_epoch`.
    SetMoveTarget {
        topic_id: u64,
        partition: u32,
        expect_owner: u64,
        expect_epoch: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<MoveTarget>,
    },
    /// Marks member `node` as being decommissioned (its partitions move away, it takes no
    /// new ones) or not.
    SetDraining { node: u64, draining: bool },
    /// The other voters that hold every end `owner` acknowledged (its witnesses): `voters`,
    /// refused unless they are still `expect` (an empty list: none recorded).
    SetInSync {
        owner: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        expect: Vec<u64>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        voters: Vec<u64>,
    },
    /// Hands the partition to the move's target (owner epoch + 1), only if it is still at
    /// `source` and `expect_epoch`, move `move_id` still targets `target`, and `source` did
    /// not thaw freeze `token`.
    CompleteMove {
        topic_id: u64,
        partition: u32,
        move_id: u64,
        source: u64,
        target: u64,
        expect_epoch: u64,
        token: u64,
    },
    /// Partition `partition` of a member lost for good (`from`, still its owner at
    /// `expect_epoch`) goes to `to` (owner epoch + 1), which rebuilds it from the archive:
    /// its log starts at `tail.start`, the archive's end.
    ReassignLost {
        topic_id: u64,
        partition: u32,
        from: u64,
        to: u64,
        expect_epoch: u64,
        tail: Box<moves::LostTail>,
    },
    /// Topic `topic_id` takes role `role`, refused unless its role is still `expect`.
    SetRole {
        topic_id: u64,
        expect: TopicRole,
        role: TopicRole,
    },
    /// Partition `partition` of topic `topic_id` is the planner's to place again.
    Unpin { topic_id: u64, partition: u32 },
    /// Mirror `topic_id` records its source's fan-out children (a promote attaches them).
    SetCarriedChildren {
        topic_id: u64,
        children: Vec<CarriedChild>,
    },
    /// The owner `owner` gave up freeze `token` (it ran out): a flip naming it is refused
    /// from now on. Refused if the partition is no longer at `owner` and `expect_epoch`
    /// (the flip came first).
    ThawPartition {
        topic_id: u64,
        partition: u32,
        owner: u64,
        expect_epoch: u64,
        token: u64,
    },
}

/// Where [`CatalogCommand::SetMoveTarget`] sends a partition.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MoveTarget {
    /// A random id for this move.
    pub id: u64,
    pub node: u64,
    pub since_ms: i64,
    pub reason: String,
}

/// What applying a command did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The topic as created, altered, given a schema, attached or detached.
    Topic(Arc<TopicMeta>),
    /// The ids of the topics that lost their owner.
    Disowned(Vec<u64>),
    /// The deleted topic and the ids of its children, now standalone.
    Deleted {
        topic: Arc<TopicMeta>,
        unlinked: Vec<u64>,
    },
    /// The remote as created or changed.
    Remote(Arc<RemoteMeta>),
    /// The remote removed.
    RemoteDeleted(Arc<RemoteMeta>),
    /// The remote child as attached, paused or resumed.
    RemoteChild(Arc<RemoteChild>),
    /// The remote child detached.
    RemoteChildGone(Arc<RemoteChild>),
    /// The cluster's id (the one it had already, if it had one).
    ClusterId(u64),
    /// The members being decommissioned now.
    Draining(Vec<u64>),
    /// An owner's witnesses now.
    InSync(Vec<u64>),
}

/// Why a command does not apply. Each maps to the error a client sees for the same refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CatalogError {
    #[error("topic '{0}' already exists")]
    Exists(String),
    /// The named topic, or the incarnation a command names, is gone.
    #[error("topic '{0}' not found")]
    NotFound(String),
    /// Settings that do not validate.
    #[error("{0}")]
    InvalidConfig(String),
    /// A malformed fan-out link.
    #[error("{0}")]
    Invalid(String),
    /// A fan-out rule forbids the change.
    #[error("{0}")]
    FanoutConflict(String),
    #[error("{0}")]
    NotChild(String),
    #[error("{0}")]
    SchemaIncompatible(String),
    #[error("remote '{0}' already exists")]
    RemoteExists(String),
    #[error("remote '{0}' not found")]
    RemoteNotFound(String),
    /// A change named a version the remote is no longer at.
    #[error("{0}")]
    RemoteChanged(String),
    #[error("the cluster already has {0} remotes, the most it keeps; delete one first")]
    TooManyRemotes(usize),
    #[error("{0}")]
    RemoteInUse(String),
    /// A move's compare-and-set found the partition elsewhere, or the move gone.
    #[error("{0}")]
    MoveConflict(String),
    /// An owner's witnesses changed since the proposer looked.
    #[error("{0}")]
    InSyncChanged(String),
    /// A topic's role changed since the proposer looked.
    #[error("{0}")]
    RoleChanged(String),
    /// A topic would mirror the topic it ships to (a cycle of two links).
    #[error("{0}")]
    LoopDetected(String),
}

/// Every topic's metadata and every remote, by name, and how many commands made them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Catalog {
    applied: u64,
    topics: BTreeMap<String, Arc<TopicMeta>>,
    remotes: BTreeMap<String, Arc<RemoteMeta>>,
    remote_children: BTreeMap<String, Arc<RemoteChild>>,
    cluster_id: Option<u64>,
    /// Members being decommissioned (a cluster's).
    draining: std::collections::BTreeSet<u64>,
    /// Per owner: the other voters that hold every end it acknowledged (a cluster's; see
    /// [`CatalogCommand::SetInSync`]).
    in_sync: BTreeMap<u64, std::collections::BTreeSet<u64>>,
}

impl Catalog {
    /// A catalog holding `topics`, as loaded from disk after `applied` commands.
    pub fn from_topics(applied: u64, topics: impl IntoIterator<Item = TopicMeta>) -> Self {
        Self {
            applied,
            topics: topics
                .into_iter()
                .map(|t| (t.name.clone(), Arc::new(t)))
                .collect(),
            remotes: BTreeMap::new(),
            remote_children: BTreeMap::new(),
            cluster_id: None,
            draining: std::collections::BTreeSet::new(),
            in_sync: BTreeMap::new(),
        }
    }

    /// This catalog with `draining` members (as loaded from a snapshot).
    pub fn with_draining(mut self, draining: impl IntoIterator<Item = u64>) -> Self {
        self.draining = draining.into_iter().collect();
        self
    }

    /// The members being decommissioned.
    pub fn draining(&self) -> &std::collections::BTreeSet<u64> {
        &self.draining
    }

    /// This catalog with each owner's witnesses (as loaded from a snapshot).
    pub fn with_in_sync(mut self, in_sync: impl IntoIterator<Item = (u64, Vec<u64>)>) -> Self {
        self.in_sync = in_sync
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(o, v)| (o, v.into_iter().collect()))
            .collect();
        self
    }

    /// The other voters that hold every end `owner` acknowledged (none recorded: empty).
    pub fn in_sync(&self, owner: u64) -> Vec<u64> {
        self.in_sync
            .get(&owner)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Every owner's witnesses.
    pub fn in_sync_all(&self) -> impl Iterator<Item = (u64, Vec<u64>)> + '_ {
        self.in_sync
            .iter()
            .map(|(o, s)| (*o, s.iter().copied().collect()))
    }

    /// This catalog with `children` and `cluster_id` (as loaded from disk); `None` if a name
    /// appears twice.
    pub fn with_remote_children(
        mut self,
        children: impl IntoIterator<Item = RemoteChild>,
        cluster_id: Option<u64>,
    ) -> Option<Self> {
        for c in children {
            if self
                .remote_children
                .insert(c.name.clone(), Arc::new(c))
                .is_some()
            {
                return None;
            }
        }
        self.cluster_id = cluster_id;
        Some(self)
    }

    /// Every remote child, by name.
    pub fn remote_children(&self) -> impl Iterator<Item = &Arc<RemoteChild>> {
        self.remote_children.values()
    }

    /// The remote children of the topic of incarnation `parent_id`.
    pub fn remote_children_of(&self, parent_id: u64) -> impl Iterator<Item = &Arc<RemoteChild>> {
        self.remote_children
            .values()
            .filter(move |c| c.parent_id == parent_id)
    }

    /// The cluster's id, once named ([`CatalogCommand::InitCluster`]).
    pub fn cluster_id(&self) -> Option<u64> {
        self.cluster_id
    }

    /// This catalog with `remotes` (as loaded from disk); `None` if a name appears twice.
    pub fn with_remotes(mut self, remotes: impl IntoIterator<Item = RemoteMeta>) -> Option<Self> {
        for r in remotes {
            if self.remotes.insert(r.name.clone(), Arc::new(r)).is_some() {
                return None;
            }
        }
        Some(self)
    }

    /// Every remote, by name.
    pub fn remotes(&self) -> impl Iterator<Item = &Arc<RemoteMeta>> {
        self.remotes.values()
    }

    pub fn remote(&self, name: &str) -> Option<&Arc<RemoteMeta>> {
        self.remotes.get(name)
    }

    /// How many commands have been applied to make this catalog.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    pub fn get(&self, name: &str) -> Option<&Arc<TopicMeta>> {
        self.topics.get(name)
    }

    pub fn len(&self) -> usize {
        self.topics.len()
    }

    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    /// Every topic, by name.
    pub fn topics(&self) -> impl Iterator<Item = &Arc<TopicMeta>> {
        self.topics.values()
    }

    /// The children of the topic of incarnation `parent_id`.
    pub fn children_of(&self, parent_id: u64) -> impl Iterator<Item = &Arc<TopicMeta>> {
        self.topics
            .values()
            .filter(move |t| t.parent.as_ref().is_some_and(|l| l.parent_id == parent_id))
    }

    pub(crate) fn by_id(&self, id: u64) -> Result<&Arc<TopicMeta>, CatalogError> {
        self.topics
            .values()
            .find(|t| t.id == id)
            .ok_or_else(|| CatalogError::NotFound(format!("#{id:016x}")))
    }
}

impl Catalog {
    /// What every applied command leaves true (checked in debug builds: tests run them):
    /// a topic's owners are none or one per partition, its epochs and moves name only its
    /// partitions, and no two topics share an incarnation id.
    fn debug_check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let mut ids = std::collections::HashSet::new();
        for t in self.topics.values() {
            let n = t.config.partitions as usize;
            debug_assert!(
                t.owners.is_empty() || t.owners.len() == n,
                "{}: {} owners for {n} partitions",
                t.name,
                t.owners.len()
            );
            debug_assert!(
                t.owner_epochs.len() <= n,
                "{}: epochs past its partitions",
                t.name
            );
            debug_assert!(
                t.moves.keys().all(|&p| (p as usize) < n),
                "{}: a move of a partition it does not have",
                t.name
            );
            debug_assert!(
                ids.insert(t.id),
                "{}: incarnation id {:016x} twice",
                t.name,
                t.id
            );
        }
    }
}

/// Applies `cmd` to `catalog`: the catalog it makes and what changed, or why it does not
/// apply (then nothing changed). Pure: the same catalog and command always give the same
/// result.
pub fn apply(catalog: &Catalog, cmd: &CatalogCommand) -> Result<(Catalog, Applied), CatalogError> {
    let mut next = catalog.clone();
    next.applied += 1;
    let applied = match cmd {
        CatalogCommand::CreateTopic { topic } => {
            // (the name becomes a directory name: checked here too, whoever proposed it)
            crate::topic::validate_name(&topic.name)
                .map_err(|e| CatalogError::InvalidConfig(e.to_string()))?;
            if next.topics.contains_key(&topic.name) {
                return Err(CatalogError::Exists(topic.name.clone()));
            }
            if next.topics.values().any(|t| t.id == topic.id) {
                return Err(CatalogError::Invalid(format!(
                    "incarnation id {:016x} is taken",
                    topic.id
                )));
            }
            topic
                .config
                .validate()
                .map_err(|e| CatalogError::InvalidConfig(e.to_string()))?;
            if !topic.owners.is_empty() && topic.owners.len() != topic.config.partitions as usize {
                return Err(CatalogError::Invalid(format!(
                    "{} owners for {} partitions",
                    topic.owners.len(),
                    topic.config.partitions
                )));
            }
            let mut t = topic.clone();
            if let Some(link) = &topic.parent {
                // created as a child: the rules of an attach, and the parent's schema
                check_attach(&next, topic, link)?;
                if let Some(p) = next.get(&link.parent) {
                    t.schemas = p.schemas.clone();
                }
            }
            let t = Arc::new(t);
            next.topics.insert(topic.name.clone(), t.clone());
            Applied::Topic(t)
        }
        CatalogCommand::AlterTopic {
            topic_id,
            config,
            owners,
        } => {
            let old = next.by_id(*topic_id)?.clone();
            config
                .validate()
                .map_err(|e| CatalogError::InvalidConfig(e.to_string()))?;
            if config.partitions < old.config.partitions {
                return Err(CatalogError::InvalidConfig(format!(
                    "partitions can only grow (from {})",
                    old.config.partitions
                )));
            }
            if config.retention_ms > 0 {
                for c in next.children_of(old.id) {
                    let delay = c.parent.as_ref().map_or(0, |l| l.delay_ms);
                    if delay > 0 && config.retention_ms < delay + DELAY_RETENTION_MARGIN_MS {
                        return Err(CatalogError::Invalid(format!(
                            "retention_ms {} is shorter than delay child '{}' needs ({} ms: its delay + 1 h)",
                            config.retention_ms,
                            c.name,
                            delay + DELAY_RETENTION_MARGIN_MS
                        )));
                    }
                }
            }
            let owners = if owners.is_empty() {
                if !old.owners.is_empty() && config.partitions != old.config.partitions {
                    return Err(CatalogError::Invalid(
                        "the owners of the new partitions are missing".into(),
                    ));
                }
                old.owners.clone()
            } else if old.owners.is_empty()
                || owners.len() != config.partitions as usize
                || !owners.starts_with(&old.owners)
            {
                return Err(CatalogError::Invalid(format!(
                    "{} owners do not extend the topic's {} to {} partitions",
                    owners.len(),
                    old.owners.len(),
                    config.partitions
                )));
            } else {
                owners.clone()
            };
            let t = Arc::new(TopicMeta {
                config: config.clone(),
                owners,
                ..(*old).clone()
            });
            next.topics.insert(t.name.clone(), t.clone());
            Applied::Topic(t)
        }
        CatalogCommand::AddSchemaVersion { topic_id, schema } => {
            let old = next.by_id(*topic_id)?.clone();
            if old.parent.is_some() {
                return Err(CatalogError::FanoutConflict(format!(
                    "'{}' is a fan-out child: its schema follows its parent's (change the parent's)",
                    old.name
                )));
            }
            if old.schemas.len() >= MAX_SCHEMA_VERSIONS {
                return Err(CatalogError::SchemaIncompatible(format!(
                    "topic '{}' already has {MAX_SCHEMA_VERSIONS} schema versions, the most it may keep",
                    old.name
                )));
            }
            let expected = old.schemas.last().map_or(1, |v| v.version + 1);
            if schema.version != expected {
                return Err(CatalogError::SchemaIncompatible(format!(
                    "topic '{}' is at schema version {}; version {} cannot follow it",
                    old.name,
                    expected - 1,
                    schema.version
                )));
            }
            let mut t = (*old).clone();
            t.schemas.push(schema.clone());
            let t = Arc::new(t);
            next.topics.insert(t.name.clone(), t.clone());
            // a parent's children follow its schema
            let children: Vec<String> = next.children_of(t.id).map(|c| c.name.clone()).collect();
            for c in children {
                if let Some(c) = next.topics.get_mut(&c) {
                    Arc::make_mut(c).schemas.push(schema.clone());
                }
            }
            Applied::Topic(t)
        }
        CatalogCommand::Disown { owner, owner_id } => {
            let mut ids = Vec::new();
            for t in next.topics.values_mut() {
                if t.owner.as_deref() == Some(owner) && t.owner_id.unwrap_or(0) == *owner_id {
                    let m = Arc::make_mut(t);
                    (m.owner, m.owner_id) = (None, None);
                    ids.push(m.id);
                }
            }
            Applied::Disowned(ids)
        }
        CatalogCommand::DeleteTopic { topic_id } => {
            let gone = next.by_id(*topic_id)?.clone();
            next.topics.remove(&gone.name);
            // its remote children go with it (the proposer refused while they had records
            // to ship, unless forced)
            next.remote_children.retain(|_, c| c.parent_id != gone.id);
            let mut unlinked = Vec::new();
            for t in next.topics.values_mut() {
                if t.parent.as_ref().is_some_and(|l| l.parent_id == gone.id) {
                    Arc::make_mut(t).parent = None;
                    unlinked.push(t.id);
                }
            }
            Applied::Deleted {
                topic: gone,
                unlinked,
            }
        }
        CatalogCommand::Attach { child_id, link } => {
            let child = next.by_id(*child_id)?.clone();
            check_attach(&next, &child, link)?;
            let mut t = (*child).clone();
            t.parent = Some(link.clone());
            // the child adopts its parent's schema history (check_attach made sure it has
            // none of its own, or that same history), and keeps it after a detach
            if let Some(p) = next.get(&link.parent) {
                t.schemas = p.schemas.clone();
            }
            let t = Arc::new(t);
            next.topics.insert(t.name.clone(), t.clone());
            Applied::Topic(t)
        }
        CatalogCommand::Detach {
            child_id,
            parent_id,
        } => {
            let child = next.by_id(*child_id)?.clone();
            if child
                .parent
                .as_ref()
                .is_none_or(|l| l.parent_id != *parent_id)
            {
                return Err(CatalogError::NotChild(format!(
                    "'{}' is not a child of that topic",
                    child.name
                )));
            }
            let mut t = (*child).clone();
            t.parent = None;
            let t = Arc::new(t);
            next.topics.insert(t.name.clone(), t.clone());
            Applied::Topic(t)
        }
        CatalogCommand::PutRemote {
            remote,
            expect_version,
        } => remote::apply_put(&mut next, remote, *expect_version)?,
        CatalogCommand::DeleteRemote { remote_id } => remote::apply_delete(&mut next, *remote_id)?,
        CatalogCommand::AttachRemote { child } => remote::apply_attach_remote(&mut next, child)?,
        CatalogCommand::DetachRemote { name, epoch } => {
            remote::apply_detach_remote(&mut next, name, *epoch)?
        }
        CatalogCommand::PauseRemote {
            name,
            epoch,
            paused,
        } => remote::apply_pause_remote(&mut next, name, *epoch, *paused)?,
        CatalogCommand::SkipRemote {
            name,
            epoch,
            partition,
            offset,
        } => remote::apply_skip_remote(&mut next, name, *epoch, (*partition, *offset))?,
        CatalogCommand::InitCluster { cluster_id } => {
            let id = *next.cluster_id.get_or_insert(*cluster_id);
            Applied::ClusterId(id)
        }
        CatalogCommand::SetDraining { node, draining } => {
            if *draining {
                next.draining.insert(*node);
            } else {
                next.draining.remove(node);
            }
            Applied::Draining(next.draining.iter().copied().collect())
        }
        CatalogCommand::SetRole {
            topic_id,
            expect,
            role,
        } => {
            let old = next.by_id(*topic_id)?.clone();
            if old.role != *expect {
                return Err(CatalogError::RoleChanged(format!(
                    "topic '{}' is {} at epoch {} now, not {} at epoch {}: look again",
                    old.name,
                    old.role.name(),
                    old.role.epoch(),
                    expect.name(),
                    expect.epoch()
                )));
            }
            if role.epoch() < old.role.epoch() || role.epoch() > role::MAX_EPOCH {
                return Err(CatalogError::RoleChanged(format!(
                    "topic '{}' is at epoch {}: its epoch never goes back, nor past the largest (to {})",
                    old.name,
                    old.role.epoch(),
                    role.epoch()
                )));
            }
            // a topic never mirrors a topic one of its own links ships to (two attaches
            // racing each other's checks would make each the other's mirror)
            if let role::TopicRole::Mirror { of, .. } = role
                && let Some(c) = next
                    .remote_children
                    .values()
                    .find(|c| c.parent_id == old.id && c.target_id == of.topic)
            {
                return Err(CatalogError::LoopDetected(format!(
                    "topic '{}' ships to the topic it would mirror (its remote child '{}'): links do not loop",
                    old.name, c.name
                )));
            }
            // a mirror's fan-out children would serve its records as a queue here
            if matches!(role, role::TopicRole::Mirror { .. })
                && next.children_of(old.id).next().is_some()
            {
                return Err(CatalogError::FanoutConflict(format!(
                    "topic '{}' has fan-out children: detach them before it becomes a mirror (its promote attaches its source's children)",
                    old.name
                )));
            }
            let t = Arc::new(TopicMeta {
                role: *role,
                ..(*old).clone()
            });
            next.topics.insert(t.name.clone(), t.clone());
            Applied::Topic(t)
        }
        CatalogCommand::Unpin {
            topic_id,
            partition,
        } => {
            let old = next.by_id(*topic_id)?.clone();
            let mut t = (*old).clone();
            t.pinned.remove(partition);
            let t = Arc::new(t);
            next.topics.insert(t.name.clone(), t.clone());
            Applied::Topic(t)
        }
        CatalogCommand::SetCarriedChildren { topic_id, children } => {
            CarriedChild::validate_list(children).map_err(CatalogError::InvalidConfig)?;
            let old = next.by_id(*topic_id)?.clone();
            let t = Arc::new(TopicMeta {
                carried_children: children.clone(),
                ..(*old).clone()
            });
            next.topics.insert(t.name.clone(), t.clone());
            Applied::Topic(t)
        }
        CatalogCommand::SetInSync {
            owner,
            expect,
            voters,
        } => {
            let now = next.in_sync(*owner);
            let mut expect = expect.clone();
            expect.sort_unstable();
            expect.dedup();
            if now != expect {
                return Err(CatalogError::InSyncChanged(format!(
                    "member {owner}'s witnesses are {now:?}, not {expect:?}"
                )));
            }
            let set: std::collections::BTreeSet<u64> =
                voters.iter().copied().filter(|v| v != owner).collect();
            if set.is_empty() {
                next.in_sync.remove(owner);
            } else {
                next.in_sync.insert(*owner, set);
            }
            Applied::InSync(next.in_sync(*owner))
        }
        CatalogCommand::SetMoveTarget {
            topic_id,
            partition,
            expect_owner,
            expect_epoch,
            target,
        } => moves::apply_set_target(
            &mut next,
            *topic_id,
            *partition,
            *expect_owner,
            *expect_epoch,
            target
                .as_ref()
                .map(|t| (t.id, t.node, t.since_ms, t.reason.as_str())),
        )?,
        CatalogCommand::CompleteMove {
            topic_id,
            partition,
            move_id,
            source,
            target,
            expect_epoch,
            token,
        } => moves::apply_complete(
            &mut next,
            *topic_id,
            *partition,
            (*move_id, *source, *target),
            *expect_epoch,
            *token,
        )?,
        CatalogCommand::ReassignLost {
            topic_id,
            partition,
            from,
            to,
            expect_epoch,
            tail,
        } => moves::apply_reassign_lost(
            &mut next,
            *topic_id,
            *partition,
            (*from, *to),
            *expect_epoch,
            tail,
        )?,
        CatalogCommand::ThawPartition {
            topic_id,
            partition,
            owner,
            expect_epoch,
            token,
        } => moves::apply_thaw(
            &mut next,
            *topic_id,
            *partition,
            (*owner, *expect_epoch),
            *token,
        )?,
    };
    next.debug_check();
    Ok((next, applied))
}

/// The fan-out rules a link must keep: the parent exists under the incarnation the link
/// names, one level only, one parent per child, a bounded number of children, no schema on
/// a child, and a parent that keeps records long enough for a delay child.
/// Whether two topics have the same schema versions (numbers and schemas; not when each
/// was added).
pub fn same_schema_history(a: &[SchemaVersion], b: &[SchemaVersion]) -> bool {
    a.len() == b.len() && schema_history_starts(b, a)
}

/// Whether `history` begins with `start`'s versions. A detached child whose parent added
/// versions since may come back: what it holds matched the versions it has, and the
/// parent's later ones are additive changes of them.
pub fn schema_history_starts(history: &[SchemaVersion], start: &[SchemaVersion]) -> bool {
    start.len() <= history.len()
        && start
            .iter()
            .zip(history)
            .all(|(x, y)| x.version == y.version && x.schema == y.schema)
}

fn check_attach(
    catalog: &Catalog,
    child: &TopicMeta,
    link: &ParentLink,
) -> Result<(), CatalogError> {
    let conflict = |m: String| Err(CatalogError::FanoutConflict(m));
    let parent = catalog
        .get(&link.parent)
        .filter(|p| p.id == link.parent_id)
        .ok_or_else(|| CatalogError::NotFound(link.parent.clone()))?;
    if parent.id == child.id {
        return Err(CatalogError::Invalid(
            "a topic cannot be its own child".into(),
        ));
    }
    if !child.schemas.is_empty() && !schema_history_starts(&parent.schemas, &child.schemas) {
        return conflict(format!(
            "'{}' has JSON Schema versions that are not the first of '{}''s: a child's schema is its parent's",
            child.name, parent.name
        ));
    }
    if parent.parent.is_some() {
        return conflict(format!(
            "'{}' is itself a fan-out child: no grandchildren",
            parent.name
        ));
    }
    if matches!(parent.role, role::TopicRole::Mirror { .. }) {
        return conflict(format!(
            "'{}' is a mirror: it takes no fan-out children (its promote attaches its source's)",
            parent.name
        ));
    }
    if matches!(child.role, role::TopicRole::Mirror { .. }) {
        return conflict(format!(
            "'{}' is a mirror: it takes records only from its link",
            child.name
        ));
    }
    if let Some(l) = catalog.get(&child.name).and_then(|c| c.parent.as_ref()) {
        return conflict(if l.parent_id == parent.id {
            format!("'{}' is already a child of '{}'", child.name, parent.name)
        } else {
            format!("'{}' already has a parent", child.name)
        });
    }
    if catalog.children_of(child.id).next().is_some() {
        return conflict(format!(
            "'{}' has children of its own: no grandchildren",
            child.name
        ));
    }
    if catalog.children_of(parent.id).count() >= MAX_CHILDREN {
        return conflict(format!(
            "'{}' already has {MAX_CHILDREN} children",
            parent.name
        ));
    }
    let retention = parent.config.retention_ms;
    if link.delay_ms > 0 && retention > 0 && retention < link.delay_ms + DELAY_RETENTION_MARGIN_MS {
        return Err(CatalogError::Invalid(format!(
            "the parent keeps records {retention} ms; a delay child needs at least delay + 1 h ({} ms)",
            link.delay_ms + DELAY_RETENTION_MARGIN_MS
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
