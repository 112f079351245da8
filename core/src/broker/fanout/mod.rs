//! Fan-out children: every record committed to a parent topic is copied, durably and in
//! order per parent partition, to each child topic, re-keyed into the child's partitions by the
//! same key hash (the key is preserved). A delay child receives a record only once
//! `parent commit time + delay` has passed.
//!
//! One cursor per (parent partition, child): read a slab of committed parent records, append
//! them to the child (one group commit per child partition), then persist the cursor
//! (`fanout-<child>.offset` in the parent partition's directory, temp file + rename + fsync).
//! The cursor moves only after the copy is durable: a crash duplicates, never skips. A cursor
//! file carries the attach epoch; a file from another epoch is never resumed.
//!
//! The copy target is a [`Sink`], so a remote sender can take the local child's place later.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod marks;

use marks::Marks;

use super::cursor_file::{
    cursor_path, persist, read_cursor, remove_cursor_files, remove_cursor_files_but, write_cursor,
};
use super::{Broker, BrokerError, Topic, random_u64};
use crate::catalog::link::{MAX_CHILD_DELAY_MS, OriginFloor, ParentLink};
use crate::catalog::{Applied, CatalogCommand, DELAY_RETENTION_MARGIN_MS, MAX_CHILDREN, TopicMeta};
use crate::log::LogError;
use crate::record::{NewRecord, Record};
use crate::topic::{CreateTopic, partition_for_key};

/// Records and bytes one cursor copies per slab.
const SLAB_RECORDS: usize = 4096;
pub(super) const SLAB_BYTES: usize = 4 << 20;
/// How long a cursor with nothing to copy sleeps unless an append wakes it. Thousands of
/// idle cursors (64 children of a parent with hundreds of partitions) must cost nothing.
pub(super) const IDLE_WAIT: Duration = Duration::from_secs(10);

/// Where a new link's cursors start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkStart {
    /// At the parent's tail: only records produced from now on.
    Latest,
    /// At the parent's oldest retained record.
    Earliest,
    /// At these offsets, one per partition of the parent's incarnation `parent_id` (the
    /// tails a cluster member gathered from the partitions' owners: a member cannot read the
    /// others' tails itself). Refused if the parent is another incarnation by the time the
    /// link is made: another incarnation's tails would skip records.
    At { parent_id: u64, starts: Vec<u64> },
    /// At the parent's oldest retained record, leaving out what the floor covers (a
    /// promoted topic's carried child: its source's consumers processed those).
    Carried(OriginFloor),
}

/// Appends fan-out copies to a child partition another cluster member owns (set on a
/// cluster member: the cursors run on the parent partitions' owners, the child's partitions
/// are spread over the members too).
pub trait CopyForwarder: Send + Sync {
    /// Appends `records` to partition `partition` of topic `topic` (incarnation `topic_id`)
    /// on member `owner`; resolves once they are fsynced there.
    fn append(
        &self,
        owner: u64,
        topic: String,
        topic_id: u64,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BrokerError>> + Send>>;
}

/// A child as `GET /v1/topics/{parent}/children` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChildInfo {
    pub name: String,
    pub delay_ms: i64,
    /// Parent records not yet copied, over all parent partitions.
    pub lag_messages: u64,
    /// Delay children: how far behind its due time the oldest uncopied due record is.
    pub due_lag_seconds: f64,
    /// Set for a remote child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<super::RemoteChildInfo>,
}

/// Where a cursor's records go.
pub trait Sink: Send + Sync {
    /// Appends `records` durably to partition `partition` of the target; returns once they
    /// are fsynced, with the first one's offset when it is known here.
    fn append(
        &self,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> impl std::future::Future<Output = Result<Option<u64>, BrokerError>> + Send;
    fn partitions(&self) -> u32;
    /// The child topic the copies go to.
    fn child(&self) -> &Topic;
}

/// The child topic as a sink: its partitions on this node are appended to here, those
/// another cluster member owns through [`CopyForwarder`].
struct ChildSink {
    broker: Arc<Broker>,
    topic: Arc<Topic>,
}

impl Sink for ChildSink {
    async fn append(
        &self,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> Result<Option<u64>, BrokerError> {
        let remote = {
            let meta = self.topic.meta.read();
            (!self.broker.is_local(&meta, partition))
                .then(|| (meta.owners[partition as usize], meta.name.clone(), meta.id))
        };
        let Some((owner, name, id)) = remote else {
            return self
                .broker
                .append_internal(&self.topic, partition, records)
                .await
                .map(Some);
        };
        let Some(fwd) = self.broker.copy_forwarder.get() else {
            return Err(BrokerError::ClusterUnavailable(format!(
                "partition {partition} of '{name}' is on node {owner}, and this member cannot call the others yet"
            )));
        };
        fwd.append(owner, name, id, partition, records)
            .await
            .map(|()| None)
    }

    fn partitions(&self) -> u32 {
        self.topic.config().partitions
    }

    fn child(&self) -> &Topic {
        &self.topic
    }
}

pub(crate) struct CursorState {
    /// The attachment this cursor copies for.
    epoch: u64,
    /// `u64::MAX` until the task has loaded its position.
    pub(crate) next: AtomicU64,
    due_lag_ms: AtomicI64,
    /// What the child's consumers processed, in this parent partition's offsets.
    marks: parking_lot::Mutex<Marks>,
}

impl CursorState {
    fn new(epoch: u64) -> Self {
        Self {
            epoch,
            next: AtomicU64::new(u64::MAX),
            due_lag_ms: AtomicI64::new(0),
            marks: Default::default(),
        }
    }
}

/// The checks of a link request that need no topic.
fn check_link_request(parent: &str, child: &str, delay_ms: i64) -> Result<(), BrokerError> {
    if parent == child {
        return Err(BrokerError::FanoutInvalid(
            "a topic cannot be its own child".into(),
        ));
    }
    if !(0..=MAX_CHILD_DELAY_MS).contains(&delay_ms) {
        return Err(BrokerError::FanoutInvalid(format!(
            "delay_ms must be between 0 and {MAX_CHILD_DELAY_MS}"
        )));
    }
    Ok(())
}

/// A new link to parent `p` (a fresh epoch), its cursors starting where `from` says. On a
/// cluster member `Latest` cannot be read here (other members own partitions): the caller
/// gathers the tails from their owners and passes `At`.
fn new_link(
    b: &Broker,
    p: &Topic,
    pmeta: &TopicMeta,
    delay_ms: i64,
    from: LinkStart,
) -> Result<ParentLink, BrokerError> {
    let floor = match &from {
        LinkStart::Carried(f) => Some(Box::new(f.clone())),
        _ => None,
    };
    let starts = match from {
        LinkStart::At { parent_id, starts } => {
            if parent_id != pmeta.id || starts.len() != p.partitions().len() {
                return Err(BrokerError::ClusterUnavailable(format!(
                    "'{}' was re-created or changed its partitions meanwhile; retry",
                    pmeta.name
                )));
            }
            starts
        }
        // (0 is clamped to the oldest retained offset where the cursor runs)
        LinkStart::Earliest | LinkStart::Carried(_) if b.store.replicated() => {
            vec![0; p.partitions().len()]
        }
        LinkStart::Latest if b.store.replicated() => {
            return Err(BrokerError::ClusterUnavailable(
                "a cluster member needs the parent's partition tails from their owners".into(),
            ));
        }
        ref from => p
            .partitions()
            .iter()
            .map(|part| {
                let stats = part.stats();
                if matches!(from, LinkStart::Earliest | LinkStart::Carried(_)) {
                    stats.oldest_offset
                } else {
                    stats.next_offset
                }
            })
            .collect(),
    };
    Ok(ParentLink {
        parent: pmeta.name.clone(),
        parent_id: pmeta.id,
        delay_ms,
        epoch: random_u64() | 1,
        starts,
        floor,
    })
}

/// Writes child `child`'s cursor file of attachment `epoch` in each partition directory of
/// parent `p`, at `starts[i]` (removing earlier attachments' files).
async fn write_cursors(
    p: &Topic,
    child: &str,
    epoch: u64,
    starts: Vec<u64>,
) -> Result<(), BrokerError> {
    for (part, start) in p.partitions().iter().zip(starts) {
        let path = cursor_path(&part.dir, child, epoch);
        let (dir, name) = (part.dir.clone(), child.to_owned());
        tokio::task::spawn_blocking(move || {
            crate::fsutil::create_dir_private(&dir)?;
            remove_cursor_files(&dir, &name); // earlier attachments' leftovers
            write_cursor(&path, epoch, start)
        })
        .await
        .expect("cursor write task")
        .map_err(|source| LogError::Io {
            path: part.dir.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Removes the cursor files [`write_cursors`] wrote, for a link that was not made.
fn remove_cursors(p: &Topic, child: &str, epoch: u64) {
    for part in p.partitions().iter() {
        let _ = std::fs::remove_file(cursor_path(&part.dir, child, epoch));
    }
}

impl Broker {
    /// Attaches `child` to `parent`. The child starts at the parent's tail (or its oldest
    /// retained record with `from_earliest`); a detached and re-attached child starts fresh.
    pub async fn attach_child(
        self: &Arc<Self>,
        parent: &str,
        child: &str,
        delay_ms: i64,
        from: LinkStart,
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        check_link_request(parent, child, delay_ms)?;
        let _guard = self.meta_lock.lock().await;
        let p = self.topic(parent)?;
        let c = self.topic(child)?;
        let pmeta = p.meta.read().clone();
        let cmeta = c.meta.read().clone();
        self.check_new_child(&pmeta, &cmeta.name, &cmeta.schemas, delay_ms)?;
        // (errors never name a parent the caller did not name: it may not see that topic)
        if let Some(l) = &cmeta.parent {
            return Err(BrokerError::FanoutConflict(if l.parent == parent {
                format!("'{child}' is already a child of '{parent}'")
            } else {
                format!("'{child}' already has a parent")
            }));
        }
        if !self.child_topics(child).is_empty() {
            return Err(BrokerError::FanoutConflict(format!(
                "'{child}' has children of its own: no grandchildren"
            )));
        }
        if matches!(cmeta.role, crate::catalog::TopicRole::Mirror { .. }) {
            return Err(BrokerError::FanoutConflict(format!(
                "'{child}' is a mirror: it takes records only from its link"
            )));
        }
        let link = new_link(self, &p, &pmeta, delay_ms, from)?;
        if self.store.replicated() {
            // the owners start their cursors when they follow the catalog (from the
            // link's starts); this member follows it before answering
            self.propose_replicated(CatalogCommand::Attach {
                child_id: c.id(),
                link,
            })
            .await?;
        } else {
            let starts = link.starts.clone();
            self.link_child(&p, &c, link, starts).await?;
        }
        tracing::info!(parent, child, delay_ms, "child attached");
        Ok(())
    }

    /// Creates `req` as a child of `parent` in one catalog command, so a crash leaves either
    /// no topic or the child with its link and its parent's schema, never a standalone topic
    /// (create, then attach, then delete on a failed attach could). The cursor files are
    /// written first, then the topic is created with its link, then the cursors start.
    pub async fn create_child(
        self: &Arc<Self>,
        req: CreateTopic,
        parent: &str,
        delay_ms: i64,
        from: LinkStart,
    ) -> Result<TopicMeta, BrokerError> {
        self.check_running()?;
        check_link_request(parent, &req.name, delay_ms)?;
        let _guard = self.meta_lock.lock().await;
        let p = self.topic(parent)?;
        let pmeta = p.meta.read().clone();
        let mut meta = self.new_topic_meta(&req)?;
        self.check_new_child(&pmeta, &meta.name, &meta.schemas, delay_ms)?;
        let link = new_link(self, &p, &pmeta, delay_ms, from)?;
        meta.parent = Some(link.clone());
        // the parent's schema history, adopted (as the catalog does)
        meta.schemas = pmeta.schemas.clone();
        if self.store.replicated() {
            // one command: the topic with its link (the owners start the cursors when they
            // follow it)
            meta.owners = self.store.place(meta.id, 0, meta.config.partitions);
            let name = meta.name.clone();
            self.propose_replicated(CatalogCommand::CreateTopic { topic: meta })
                .await?;
            tracing::info!(parent, child = %name, delay_ms, "child created");
            return self.topic_meta(&name);
        }
        write_cursors(&p, &meta.name, link.epoch, link.starts.clone()).await?;
        if let Err(e) = self.install_topic(&meta).await {
            // refused: the cursors written above belong to no link
            remove_cursors(&p, &meta.name, link.epoch);
            return Err(e);
        }
        let c = self.topic(&meta.name)?;
        for i in 0..p.partitions().len() as u32 {
            self.spawn_cursor(p.clone(), i, c.clone(), link.clone());
        }
        tracing::info!(parent, child = %meta.name, delay_ms, "child created");
        Ok(meta)
    }

    /// The rules a new link to parent `pmeta` must keep that do not depend on whether the
    /// child exists yet (the catalog checks them all again when it applies the command).
    fn check_new_child(
        &self,
        pmeta: &TopicMeta,
        child: &str,
        child_schemas: &[crate::catalog::SchemaVersion],
        delay_ms: i64,
    ) -> Result<(), BrokerError> {
        let parent = pmeta.name.as_str();
        let conflict = |m: String| Err(BrokerError::FanoutConflict(m));
        if !child_schemas.is_empty()
            && !crate::catalog::schema_history_starts(&pmeta.schemas, child_schemas)
        {
            return conflict(format!(
                "'{child}' has JSON Schema versions that are not the first of '{parent}''s: a child's schema is its parent's"
            ));
        }
        if pmeta.parent.is_some() {
            return conflict(format!(
                "'{parent}' is itself a fan-out child: no grandchildren"
            ));
        }
        if matches!(pmeta.role, crate::catalog::TopicRole::Mirror { .. }) {
            return conflict(format!(
                "'{parent}' is a mirror: it takes no fan-out children (its promote attaches its source's)"
            ));
        }
        if self.child_topics(parent).len() >= MAX_CHILDREN {
            return conflict(format!("'{parent}' already has {MAX_CHILDREN} children"));
        }
        let retention = pmeta.config.retention_ms;
        if delay_ms > 0 && retention > 0 && retention < delay_ms + DELAY_RETENTION_MARGIN_MS {
            return Err(BrokerError::FanoutInvalid(format!(
                "the parent keeps records {retention} ms; a delay child needs at least delay + 1 h ({} ms)",
                delay_ms + DELAY_RETENTION_MARGIN_MS
            )));
        }
        Ok(())
    }

    /// Restoring links from the archive is a single node's (a cluster member does not
    /// restore topics from the archive yet).
    fn no_restore_in_a_cluster(&self) -> Result<(), BrokerError> {
        if self.store.replicated() {
            return Err(BrokerError::ClusterUnsupported(
                "a cluster member does not restore fan-out links from the archive".into(),
            ));
        }
        Ok(())
    }

    /// Detaches `child` from `parent`; the child keeps its data and becomes standalone.
    pub async fn detach_child(
        self: &Arc<Self>,
        parent: &str,
        child: &str,
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let c = self.topic(child)?;
        let p = self.topic(parent)?;
        if c.meta
            .read()
            .parent
            .as_ref()
            .is_none_or(|l| l.parent != parent)
        {
            return Err(BrokerError::FanoutNotChild(format!(
                "'{child}' is not a child of '{parent}'"
            )));
        }
        let cmd = CatalogCommand::Detach {
            child_id: c.id(),
            parent_id: p.id(),
        };
        if self.store.replicated() {
            // the owners stop the cursors and remove their files when they follow it
            self.propose_replicated(cmd).await?;
            tracing::info!(parent, child, "child detached");
            return Ok(());
        }
        let live = c.clone();
        self.commit(cmd, move |_| live.meta.write().parent = None)
            .await?;
        self.forget_cursors(parent, child);
        tracing::info!(parent, child, "child detached");
        Ok(())
    }

    /// Re-creates a fan-out link from the archive's catalog snapshot after a disk loss: the
    /// link exactly as it was (same epoch, so the child stays the same attachment), with one
    /// cursor per parent partition at `positions[p]` clamped to what that partition holds
    /// now (`[oldest, next]`; a missing position means `next`). A restored parent holds no
    /// local records yet, so its cursors start at its next offset: a position above it would
    /// skip records produced after the restore, one below it cannot be read locally (those
    /// records are in the parent's archive only). Cursors are written before the link is
    /// published, as in [`Broker::attach_child`]. Returns the positions used, per partition.
    pub async fn restore_link(
        self: &Arc<Self>,
        child: &str,
        link: ParentLink,
        positions: &[u64],
    ) -> Result<Vec<u64>, BrokerError> {
        self.check_running()?;
        self.no_restore_in_a_cluster()?;
        if !(0..=MAX_CHILD_DELAY_MS).contains(&link.delay_ms) {
            return Err(BrokerError::FanoutInvalid(format!(
                "the link of '{child}' has a delay out of bounds"
            )));
        }
        let _guard = self.meta_lock.lock().await;
        let p = self.topic(&link.parent)?;
        let c = self.topic(child)?;
        if p.id() != link.parent_id {
            return Err(BrokerError::FanoutConflict(format!(
                "'{}' is another incarnation than the one '{child}' was attached to",
                link.parent
            )));
        }
        // the rest of the fan-out rules are the catalog's (`Attach`, in `link_child`)
        let mut used = Vec::new();
        for part in p.partitions().iter() {
            let stats = self.log_of(part).await?.stats();
            used.push(
                positions
                    .get(part.index as usize)
                    .copied()
                    .unwrap_or(u64::MAX)
                    .clamp(stats.oldest_offset, stats.next_offset),
            );
        }
        self.link_child(&p, &c, link.clone(), used.clone()).await?;
        tracing::info!(parent = %link.parent, child, positions = ?used, "fan-out link restored from the archive");
        Ok(used)
    }

    /// Makes `c` a child of `p` as `link` says, its cursor for parent partition `i` starting
    /// at `starts[i]`: the cursor files are written first (once the catalog names the link,
    /// its start positions exist), then the `Attach` command is committed (its pure apply
    /// checks the fan-out rules; refused, the files go again), then the cursors start.
    async fn link_child(
        self: &Arc<Self>,
        p: &Arc<Topic>,
        c: &Arc<Topic>,
        link: ParentLink,
        starts: Vec<u64>,
    ) -> Result<(), BrokerError> {
        let child = c.meta.read().name.clone();
        write_cursors(p, &child, link.epoch, starts).await?;
        let (cmd, linked, live) = (
            CatalogCommand::Attach {
                child_id: c.id(),
                link: link.clone(),
            },
            link.clone(),
            c.clone(),
        );
        let adopt = move |applied: &Applied| {
            let mut m = live.meta.write();
            m.parent = Some(linked);
            // the parent's schema history, adopted (as the catalog did)
            if let Applied::Topic(t) = applied {
                m.schemas = t.schemas.clone();
            }
        };
        if let Err(e) = self.commit(cmd, adopt).await {
            // refused: the cursors written above belong to no link
            remove_cursors(p, &child, link.epoch);
            return Err(e);
        }
        for i in 0..p.partitions().len() as u32 {
            self.spawn_cursor(p.clone(), i, c.clone(), link.clone());
        }
        Ok(())
    }

    /// Every running cursor's position: `(child, parent partition, next parent offset to
    /// copy)`, for the archive's catalog snapshot. Cheap (no IO); positions move on.
    pub fn fanout_positions(&self) -> Vec<(String, u32, u64)> {
        self.fanout
            .lock()
            .iter()
            .filter_map(|((child, p), s)| {
                let next = s.next.load(Ordering::Acquire);
                (next != u64::MAX).then(|| (child.clone(), *p, next))
            })
            .collect()
    }

    /// The names of `parent`'s children, sorted.
    pub fn child_names(&self, parent: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .child_topics(parent)
            .into_iter()
            .map(|(n, _, _)| n)
            .collect();
        names.sort_unstable();
        names
    }

    /// Every parent's children by name (sorted), in one pass over the topics (for a list).
    pub fn children_index(&self) -> std::collections::HashMap<String, Vec<String>> {
        let mut out: std::collections::HashMap<String, Vec<String>> = Default::default();
        for (name, t) in self.topics.read().iter() {
            if let Some(l) = &t.meta.read().parent {
                out.entry(l.parent.clone()).or_default().push(name.clone());
            }
        }
        for names in out.values_mut() {
            names.sort_unstable();
        }
        out
    }

    /// The children of `parent` with their lag.
    pub fn children(&self, parent: &str) -> Result<Vec<ChildInfo>, BrokerError> {
        let p = self.topic(parent)?;
        let parts = p.partitions();
        let mut out = Vec::new();
        for (name, _, link) in self.child_topics(parent) {
            let (mut lag, mut due_lag) = (0u64, 0i64);
            let cursors = self.fanout.lock();
            for part in parts.iter() {
                if let Some(s) = cursors.get(&(name.clone(), part.index))
                    && s.next.load(Ordering::Acquire) != u64::MAX
                {
                    lag += part
                        .stats()
                        .next_offset
                        .saturating_sub(s.next.load(Ordering::Acquire));
                    due_lag = due_lag.max(s.due_lag_ms.load(Ordering::Acquire));
                }
            }
            out.push(ChildInfo {
                name,
                delay_ms: link.delay_ms,
                lag_messages: lag,
                due_lag_seconds: due_lag as f64 / 1000.0,
                remote: None,
            });
        }
        out.extend(self.remote_child_infos(parent));
        Ok(out)
    }

    /// The topics attached to `parent` with their links, in name order.
    pub(crate) fn child_topics(&self, parent: &str) -> Vec<(String, Arc<Topic>, ParentLink)> {
        self.topics
            .read()
            .iter()
            .filter_map(|(name, t)| {
                let link = t.meta.read().parent.clone()?;
                (link.parent == parent).then(|| (name.clone(), t.clone(), link))
            })
            .collect()
    }

    fn forget_cursors(&self, parent: &str, child: &str) {
        self.fanout.lock().retain(|(c, _), _| c != child);
        if let Ok(p) = self.topic(parent) {
            for part in p.partitions().iter() {
                remove_cursor_files(&part.dir, child);
            }
        }
    }

    /// Starts every cursor this node should run and does not: one per attached child and
    /// parent partition this node serves (all of them on a single node, the ones it owns
    /// in a cluster). At open, and on a cluster member each time it follows the catalog.
    pub(crate) fn start_cursors(self: &Arc<Self>) {
        let topics: Vec<Arc<Topic>> = self.topics.read().values().cloned().collect();
        for c in topics {
            let Some(link) = c.meta.read().parent.clone() else {
                continue;
            };
            let Ok(p) = self.topic(&link.parent) else {
                continue;
            };
            if p.id() != link.parent_id {
                continue;
            }
            let name = c.meta.read().name.clone();
            let pmeta = p.meta.read().clone();
            for i in 0..p.partitions().len() as u32 {
                let running = self
                    .fanout
                    .lock()
                    .get(&(name.clone(), i))
                    .is_some_and(|s| s.epoch == link.epoch);
                if !running && self.is_local(&pmeta, i) {
                    // earlier attachments' files (a member that was down when they ended);
                    // here, not in the cursor task: a task of an earlier attachment that
                    // starts late must never remove the current one's file
                    if let Some(part) = p.partitions().get(i as usize) {
                        remove_cursor_files_but(&part.dir, &name, Some(link.epoch));
                    }
                    self.spawn_cursor(p.clone(), i, c.clone(), link.clone());
                }
            }
        }
        self.start_remote_cursors();
    }

    /// A cluster member following the catalog: the link `link` of child `child` is gone
    /// (detached, or either end deleted): its cursors stop (they see the link gone at their
    /// next step) and their files go from this member's parent partitions.
    pub(crate) fn end_link(&self, child: &str, link: &ParentLink) {
        self.fanout
            .lock()
            .retain(|(c, _), s| c != child || s.epoch != link.epoch);
        if let Ok(p) = self.topic(&link.parent)
            && p.id() == link.parent_id
        {
            for part in p.partitions().iter() {
                let _ = std::fs::remove_file(cursor_path(&part.dir, child, link.epoch));
            }
        }
    }

    /// Writes the start position of a cursor for a parent partition created after the attach,
    /// before that partition takes any record.
    pub(crate) fn write_start_cursor(
        part_dir: &Path,
        child: &str,
        epoch: u64,
        start: u64,
    ) -> std::io::Result<()> {
        crate::fsutil::create_dir_private(part_dir)?;
        write_cursor(&cursor_path(part_dir, child, epoch), epoch, start)
    }

    pub(crate) fn spawn_cursor(
        self: &Arc<Self>,
        parent: Arc<Topic>,
        pidx: u32,
        child: Arc<Topic>,
        link: ParentLink,
    ) {
        let state = Arc::new(CursorState::new(link.epoch));
        let name = child.meta.read().name.clone();
        self.fanout
            .lock()
            .insert((name.clone(), pidx), state.clone());
        let weak = Arc::downgrade(self);
        self.tasks
            .spawn(super::maintenance::FANOUT_TASK, move |stop| {
                run_cursor(weak, parent, pidx, child, name, link, state, stop)
            });
    }

    /// The next offset of each of `topic`'s partitions (a single node's: every partition is
    /// here).
    pub fn partition_tails(&self, topic: &str) -> Result<Vec<u64>, BrokerError> {
        Ok(self
            .topic(topic)?
            .partitions()
            .iter()
            .map(|p| p.stats().next_offset)
            .collect())
    }

    /// `parent`'s fan-out children as a mirror of it carries them, by name.
    pub(crate) fn carried_children_of(&self, parent: &str) -> Vec<crate::catalog::CarriedChild> {
        let mut out: Vec<_> = self
            .child_topics(parent)
            .into_iter()
            .map(|(name, t, link)| crate::catalog::CarriedChild {
                name,
                delay_ms: link.delay_ms,
                partitions: t.config().partitions,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The ends of `child`'s partitions, if this member holds all of them.
    fn child_ends(&self, child: &Topic) -> Option<Vec<u64>> {
        let local = self.local_partitions(child);
        child
            .partitions()
            .iter()
            .enumerate()
            .map(|(q, part)| (local.get(q) == Some(&true)).then(|| part.stats().next_offset))
            .collect()
    }

    /// Which of `t`'s partitions this member holds (by index, as many as it has).
    fn local_partitions(&self, t: &Topic) -> Vec<bool> {
        let n = t.partitions().len();
        let meta = t.meta.read();
        (0..n as u32).map(|q| self.is_local(&meta, q)).collect()
    }

    /// For each fan-out child of `parent` whose cursor on partition `pidx` runs here: every
    /// record of that partition below the offset given was processed by the child's
    /// consumers (a child not known that way is left out). A mirror of `parent` is told, so
    /// that its promote leaves those records out of the child there.
    pub(crate) fn children_consumed(&self, parent: &str, pidx: u32) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (name, child, link) in self.child_topics(parent) {
            let Some(state) = self.fanout.lock().get(&(name.clone(), pidx)).cloned() else {
                continue;
            };
            if state.epoch != link.epoch {
                continue;
            }
            let local = self.local_partitions(&child);
            let frontiers: Option<Vec<u64>> = child
                .partitions()
                .iter()
                .enumerate()
                .map(|(q, part)| {
                    (local.get(q) == Some(&true)).then(|| part.queue.lock().frontier())
                })
                .collect();
            let Some(frontiers) = frontiers else { continue };
            let mut marks = state.marks.lock();
            // marks begin where the cursor stands (the parent was mirrored nowhere before):
            // every record below it has its copies below the child's ends now
            let next = state.next.load(Ordering::Acquire);
            if next != u64::MAX {
                marks.start(next, self.child_ends(&child));
            }
            if let Some(c) = marks.consumed(&frontiers) {
                out.push((name, c));
            }
        }
        out
    }

    /// Records leased in `parent`'s fan-out children, in the child partitions this member
    /// holds that fall to parent partition `pidx` of `partitions` (child partition `q` falls
    /// to `q mod partitions`: each is counted once over the parent's partitions).
    pub(crate) fn children_leased(&self, parent: &str, pidx: u32, partitions: u32) -> u64 {
        let mut n = 0u64;
        for (_, child, _) in self.child_topics(parent) {
            let local = self.local_partitions(&child);
            for (q, part) in child.partitions().iter().enumerate() {
                if q as u32 % partitions.max(1) == pidx && local.get(q) == Some(&true) {
                    n += part.queue.lock().in_flight() as u64;
                }
            }
        }
        n
    }

    /// A failback's progress: for each of `parent`'s children in `consumed` (with the
    /// offset of partition `part` below which its consumers processed every record), the
    /// lowest position in topic `target` (per partition there) among the records of `part`
    /// from that offset on that passed through `target` and that the child's own floor does
    /// not leave out. A child whose records from that offset are more than `budget` allows
    /// is left out (not known); what is read is taken from `budget`.
    pub(crate) async fn children_returned(
        &self,
        parent: &str,
        part: &super::Partition,
        pidx: u32,
        consumed: &[(String, u64)],
        target: u64,
        budget: &mut u64,
    ) -> Vec<(String, Vec<(u32, u64)>)> {
        let links: std::collections::HashMap<String, ParentLink> = self
            .child_topics(parent)
            .into_iter()
            .map(|(name, _, link)| (name, link))
            .collect();
        let end = part.stats().next_offset;
        let mut out = Vec::new();
        for (name, from) in consumed {
            let Some(link) = links.get(name) else {
                continue;
            };
            let span = end.saturating_sub(*from);
            if span > *budget {
                continue;
            }
            *budget -= span;
            let mut lowest: BTreeMap<u32, u64> = BTreeMap::new();
            let mut next = *from;
            let mut known = true;
            while next < end {
                let max = ((end - next) as usize).min(SLAB_RECORDS);
                let records = match self.read_slab(part, next, max).await {
                    Ok(Ok(r)) => r,
                    // (gone to retention: the child could not have them either)
                    Ok(Err(oldest)) => {
                        next = oldest.max(next + 1);
                        continue;
                    }
                    Err(_) => {
                        known = false;
                        break;
                    }
                };
                let Some(last) = records.last().map(|r| r.offset) else {
                    break;
                };
                for r in records.iter().filter(|r| r.offset < end) {
                    if link.floor.as_ref().is_some_and(|f| f.skips(pidx, r)) {
                        continue;
                    }
                    if let Some((p, o)) = super::origin::position_in(r, target) {
                        let l = lowest.entry(p).or_insert(o);
                        *l = (*l).min(o);
                    }
                }
                next = last + 1;
            }
            if known {
                out.push((name.clone(), lowest.into_iter().collect()));
            }
        }
        out
    }

    /// On a cluster member: sets how fan-out copies reach child partitions other members own
    /// (once; until then such copies wait and are retried).
    pub fn set_copy_forwarder(&self, fwd: Arc<dyn CopyForwarder>) {
        let _ = self.copy_forwarder.set(fwd);
    }

    /// Appends fan-out copies another cluster member's cursor sends to partition `partition`
    /// of `topic` (incarnation `topic_id`), which this member must own: durable when this
    /// returns, as a local copy is.
    pub async fn append_copies(
        &self,
        topic: &str,
        topic_id: u64,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        let t = self.topic(topic)?;
        {
            let meta = t.meta.read();
            if meta.id != topic_id {
                return Err(BrokerError::TopicNotFound(topic.to_owned()));
            }
            if partition >= meta.config.partitions {
                return Err(BrokerError::PartitionOutOfRange {
                    index: None,
                    partition,
                    partitions: meta.config.partitions,
                });
            }
            if !self.is_local(&meta, partition) {
                return Err(BrokerError::NotOwner {
                    topic: topic.to_owned(),
                    partition,
                    owner: meta.owners[partition as usize],
                });
            }
        }
        self.append_internal(&t, partition, records)
            .await
            .map(|_| ())
    }

    /// Appends records to one partition of a topic outside the produce path (fan-out copies):
    /// same durability, same wake-up of waiting consumers. Returns the first one's offset.
    async fn append_internal(
        &self,
        topic: &Arc<Topic>,
        partition: u32,
        records: Vec<NewRecord>,
    ) -> Result<u64, BrokerError> {
        let part = topic.partition(partition)?;
        let n = records.len() as u64;
        let Some(busy) = part.enter() else {
            return Err(BrokerError::PartitionMoving {
                topic: topic.label.topic.clone(),
                partition,
            });
        };
        let appended = self.log_of(&part).await?.append(records).await?;
        drop(busy);
        part.touch(self.clock.now_ms());
        part.queue
            .lock()
            .on_append(appended.base_offset + u64::from(appended.count));
        topic.appended.notify_waiters();
        self.dispatch(topic).await;
        self.metrics
            .fanout_copied
            .get_or_create(&topic.label)
            .inc_by(n);
        Ok(appended.base_offset)
    }
}

/// One cursor: copies parent partition `pidx` to `child` until the link ends or `stop`
/// (checked between slabs, so a copy in progress ends with its cursor written).
#[allow(clippy::too_many_arguments)]
async fn run_cursor(
    weak: std::sync::Weak<Broker>,
    parent: Arc<Topic>,
    pidx: u32,
    child: Arc<Topic>,
    child_name: String,
    link: ParentLink,
    state: Arc<CursorState>,
    stop: crate::supervisor::CancellationToken,
) {
    let part = parent.partitions()[pidx as usize].clone();
    let path = cursor_path(&part.dir, &child_name, link.epoch);
    let mut next = match read_cursor(&path, link.epoch) {
        Some(n) => n,
        None => {
            // Not copied from yet (a cluster member learns of a link from the catalog), or
            // the file is damaged: from the link's start, which is durable with the link
            // and never past what the cursor copied (duplicates, never a gap). A partition
            // added after the attach has no start: all of it came after the attach.
            let stats = part.stats();
            match link.starts.get(pidx as usize) {
                Some(&s) => s.clamp(stats.oldest_offset, stats.next_offset),
                None => {
                    if !weak.upgrade().is_some_and(|b| b.store.replicated()) {
                        tracing::warn!(parent = %link.parent, child = %child_name, partition = pidx, oldest = stats.oldest_offset, "cursor file missing or unreadable; copying again from the parent's oldest record");
                    }
                    stats.oldest_offset
                }
            }
        }
    };
    state.next.store(next, Ordering::Release);
    if let Some(b) = weak.upgrade() {
        let ends = b.child_ends(&child);
        state.marks.lock().start(next, ends);
    }
    let mut backoff = Duration::from_millis(100);
    // the child partitions a failed slab reached already (not sent again on the retry)
    let mut partial = None;
    loop {
        let Some(b) = weak.upgrade() else { return };
        if stop.is_cancelled() || b.shutting_down.load(Ordering::Acquire) {
            return;
        }
        if !b.is_local(&parent.meta.read(), pidx) {
            // the partition moved away: its new owner runs this cursor from the file that
            // moved with it
            b.fanout.lock().retain(|_, s| !Arc::ptr_eq(s, &state));
            return;
        }
        let linked = !parent.deleted.load(Ordering::Acquire)
            && !child.deleted.load(Ordering::Acquire)
            && child.meta.read().parent.as_ref() == Some(&link);
        if !linked {
            // the link ended: its file goes (one this task wrote after whoever ended the
            // link removed the others would otherwise stay)
            let _ = std::fs::remove_file(&path);
            return;
        }
        // armed before reading, so an append right after the read still wakes us
        let appended = parent.appended.notified();
        tokio::pin!(appended);
        appended.as_mut().enable();
        let sink = ChildSink {
            broker: b.clone(),
            topic: child.clone(),
        };
        match copy_slab(
            &b,
            &part,
            pidx,
            &sink,
            &link,
            &child_name,
            &path,
            &state,
            next,
            &mut partial,
        )
        .await
        {
            Ok(Step::Copied(n)) => {
                next = n;
                backoff = Duration::from_millis(100);
                continue;
            }
            Ok(Step::Idle(wait)) => {
                let clock = b.clock.clone();
                drop(b);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = &mut appended => {}
                    () = clock.sleep(wait) => {}
                }
            }
            Err(e) => {
                tracing::warn!(parent = %link.parent, child = %child_name, partition = pidx, error = %e, retry_in = ?backoff, "fan-out copy failed; retrying from the same offset");
                b.metrics.fanout_errors.get_or_create(&child.label).inc();
                let clock = b.clock.clone();
                drop(b);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = clock.sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// A slab whose copy failed part way: the child partitions that took their share already.
/// The retry reads the same records (`next..end`, immutable once committed) and groups them
/// the same way (while the child keeps `partitions`), so it sends only the rest: a child
/// partition whose owner is down costs the others no duplicates however long it lasts.
struct Partial {
    end: u64,
    partitions: u32,
    done: Vec<bool>,
}

enum Step {
    /// Copied up to (excluding) this offset.
    Copied(u64),
    /// Nothing to copy now; look again after this long at most.
    Idle(Duration),
}

#[allow(clippy::too_many_arguments)]
async fn copy_slab<S: Sink>(
    b: &Arc<Broker>,
    part: &Arc<super::partition::Partition>,
    pidx: u32,
    sink: &S,
    link: &ParentLink,
    child_name: &str,
    path: &Path,
    state: &CursorState,
    next: u64,
    partial: &mut Option<Partial>,
) -> Result<Step, BrokerError> {
    let log = b.log_of(part).await?;
    // a retry reads exactly the failed slab's records
    let max_records = match partial {
        Some(p) if p.end > next => ((p.end - next) as usize).min(SLAB_RECORDS),
        _ => {
            *partial = None;
            SLAB_RECORDS
        }
    };
    let read = {
        let log = log.clone();
        tokio::task::spawn_blocking(move || log.read(next, max_records, SLAB_BYTES))
            .await
            .expect("fan-out read task")
    };
    let records = match read {
        Ok(r) => r,
        Err(LogError::Truncated { oldest, .. }) => {
            *partial = None;
            // retention deleted records this child never got: data loss, made visible
            let dropped = oldest - next;
            tracing::error!(parent = %link.parent, child = %child_name, partition = pidx, dropped, "fan-out fell behind the parent's retention; records were never copied");
            b.metrics
                .fanout_dropped
                .get_or_create(&crate::metrics::TopicLabel {
                    topic: child_name.to_owned(),
                })
                .inc_by(dropped);
            persist(path, link.epoch, oldest).await?;
            state.next.store(oldest, Ordering::Release);
            state.marks.lock().skipped(oldest);
            return Ok(Step::Copied(oldest));
        }
        Err(e) => return Err(e.into()),
    };
    // a delay child takes only what is due: the first undue record ends the slab
    let now = b.clock.now_ms();
    let due: Vec<&Arc<Record>> = if link.delay_ms > 0 {
        records
            .iter()
            .take_while(|r| r.timestamp_ms + link.delay_ms < now)
            .collect()
    } else {
        records.iter().collect()
    };
    if link.delay_ms > 0 {
        let lag = due
            .first()
            .map_or(0, |r| now - (r.timestamp_ms + link.delay_ms));
        state.due_lag_ms.store(lag.max(0), Ordering::Release);
    }
    if due.is_empty() {
        let wait = match records.first() {
            // sleep until the first record is due (plus the millisecond that keeps it from
            // being early), at most a second
            Some(r) => Duration::from_millis(
                (r.timestamp_ms + link.delay_ms + 1 - now).clamp(1, 1000) as u64,
            ),
            // nothing to copy: an append wakes the cursor (it is armed before the read);
            // this only bounds how long a cursor whose link ended lingers
            None => IDLE_WAIT,
        };
        return Ok(Step::Idle(wait));
    }
    let n = sink.partitions().max(1);
    let mut groups: Vec<Vec<NewRecord>> = (0..n).map(|_| Vec::new()).collect();
    // where each record went (for the marks: `None`, left out by the link's floor)
    let mut went: Vec<(u64, Option<u32>)> = Vec::with_capacity(due.len());
    for r in &due {
        if link.floor.as_ref().is_some_and(|f| f.skips(pidx, r)) {
            went.push((r.offset, None));
            continue;
        }
        let p = match &r.key {
            Some(k) => partition_for_key(k, n),
            None => pidx % n,
        };
        went.push((r.offset, Some(p)));
        groups[p as usize].push(NewRecord {
            key: r.key.clone(),
            headers: r.headers.clone(),
            payload: r.payload.clone(),
            // a record's own delay holds in the child too (counted from the copy's commit,
            // which is later: never early)
            delay_ms: r.delay_ms,
        });
    }
    let last = due.last().expect("non-empty").offset;
    let same = partial
        .as_ref()
        .is_some_and(|p| p.end == last + 1 && p.partitions == n);
    if !same {
        *partial = Some(Partial {
            end: last + 1,
            partitions: n,
            done: vec![false; n as usize],
        });
    }
    let progress = partial.as_mut().expect("set above");
    // one group commit per child partition
    let mut bases: Vec<Option<u64>> = vec![None; n as usize];
    let mut all_known = true;
    for (p, g) in groups.into_iter().enumerate() {
        if !g.is_empty() {
            if progress.done[p] {
                all_known = false;
                continue;
            }
            bases[p] = sink.append(p as u32, g).await?;
            all_known &= bases[p].is_some();
            progress.done[p] = true;
        }
    }
    *partial = None;
    // only now, with every copy durable, may the cursor move
    persist(path, link.epoch, last + 1).await?;
    state.next.store(last + 1, Ordering::Release);
    // where the copies went, for the marks (inside the slab too: a backlog copied in one
    // slab would otherwise be one mark, and a child's consumers part way through it would
    // count for nothing)
    if !all_known {
        bases.iter_mut().for_each(|b| *b = None);
    }
    state
        .marks
        .lock()
        .copied(&went, &bases, last + 1, || b.child_ends(sink.child()));
    Ok(Step::Copied(last + 1))
}
