//! Topic metadata changes (create, alter, schema versions, ownership, delete) and the reads
//! of it. Every change is made durable before it goes live (see `Broker::commit`).

use super::*;
use crate::catalog::Catalog;

impl Broker {
    /// Refuses a change that would add `topics` topics (owned by `owner`, when they count
    /// against it) and `partitions` partitions beyond the node's [`Limits`]. Called under
    /// `meta_lock`, before anything is opened.
    pub(super) fn check_limits(
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

    /// Makes a catalog change durable, then live: the store applies `cmd` to the published
    /// catalog, writes the result, and only once that succeeded publishes it and runs
    /// `publish`, which makes this node's in-memory state follow (partitions, links). A
    /// command that is refused or fails to persist publishes nothing, so no client ever acts
    /// on (and gets a 2xx for) state that a crash would undo.
    ///
    /// The store finishes a command even if the caller's future is dropped (a client that
    /// disconnects, releasing `meta_lock`), and the next command starts from what this one
    /// published, so disk and memory never disagree. The command is checked again when it
    /// is applied (the caller checked under `meta_lock`, but a caller that gave up released
    /// that lock early).
    pub(super) async fn commit(
        &self,
        cmd: CatalogCommand,
        publish: impl FnOnce(&Applied) + Send + 'static,
    ) -> Result<Applied, BrokerError> {
        Ok(self
            .store
            .propose(cmd, Box::new(move |_, applied| publish(applied)))
            .await?)
    }

    pub async fn create_topic(
        self: &Arc<Self>,
        req: CreateTopic,
    ) -> Result<TopicMeta, BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let meta = self.new_topic_meta(&req)?;
        if self.store.replicated() {
            let meta = TopicMeta {
                owners: self.store.place(meta.id, 0, meta.config.partitions),
                ..meta
            };
            let name = meta.name.clone();
            self.propose_replicated(CatalogCommand::CreateTopic { topic: meta })
                .await?;
            tracing::info!(topic = %name, "topic created");
            return self.topic_meta(&name);
        }
        self.install_topic(&meta).await?;
        tracing::info!(topic = %meta.name, id = meta.id, partitions = meta.config.partitions, "topic created");
        Ok(meta)
    }

    /// The metadata of a topic `req` asks for: its settings resolved against the defaults, a
    /// new incarnation id, version 1 of its schema; refused if the name is taken or a limit
    /// would be passed. The caller holds `meta_lock`.
    pub(super) fn new_topic_meta(&self, req: &CreateTopic) -> Result<TopicMeta, BrokerError> {
        let config = req.resolve(&self.cfg.topic_defaults)?;
        if self.topics.read().contains_key(&req.name) {
            return Err(BrokerError::TopicExists(req.name.clone()));
        }
        self.check_limits(
            1,
            u64::from(config.partitions),
            req.owner.as_ref().filter(|_| req.count_against_owner),
        )?;
        let (id, created_at_ms) = (random_u64() | 1, self.clock.now_ms());
        Ok(TopicMeta {
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
            ..TopicMeta::new(id, &req.name, created_at_ms, config)
        })
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
        if self.store.replicated() {
            return Err(BrokerError::ClusterUnsupported(
                "a cluster member does not restore topics from the archive".into(),
            ));
        }
        // the name becomes a directory name before the catalog sees it (the start segments)
        crate::topic::validate_name(&meta.name)?;
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
    pub(super) async fn install_topic(
        self: &Arc<Self>,
        meta: &TopicMeta,
    ) -> Result<(), BrokerError> {
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
        let (topics, live, name) = (self.topics.clone(), topic.clone(), meta.name.clone());
        let committed = self
            .commit(
                CatalogCommand::CreateTopic {
                    topic: meta.clone(),
                },
                move |_| {
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
                if delay > 0
                    && config.retention_ms < delay + crate::catalog::DELAY_RETENTION_MARGIN_MS
                {
                    return Err(BrokerError::FanoutInvalid(format!(
                        "retention_ms {} is shorter than delay child '{child}' needs ({} ms: its delay + 1 h)",
                        config.retention_ms,
                        delay + crate::catalog::DELAY_RETENTION_MARGIN_MS
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
        if self.store.replicated() {
            let owners = if config.partitions > old.config.partitions {
                let mut owners = old.owners.clone();
                owners.extend(
                    self.store
                        .place(old.id, old.config.partitions, config.partitions),
                );
                owners
            } else {
                Vec::new()
            };
            self.propose_replicated(CatalogCommand::AlterTopic {
                topic_id: old.id,
                config,
                owners,
            })
            .await?;
            return self.topic_meta(name);
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
        let (cmd, live) = (
            CatalogCommand::AlterTopic {
                topic_id: old.id,
                config: config.clone(),
                owners: Vec::new(),
            },
            topic.clone(),
        );
        let committed = self
            .commit(cmd, move |_| {
                *live.partitions.write() = Arc::new(all);
                live.meta.write().config = config;
            })
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
            // and its remote children ship them (from their first record: all of it came
            // after the attach)
            self.start_remote_cursors();
        }
        // New capacity or partitions may make messages deliverable to waiting readers.
        self.dispatch(&topic).await;
        topic.timer.notify_one();
        Ok(topic.meta.read().clone())
    }

    /// Gives topic `name` role `role` if its role is still `expect` (a compare-and-set: a
    /// request that decided from an older role is refused), durably (replicated in a
    /// cluster) before it is live. Waiting readers of a topic that stops being the primary
    /// are woken and answered that it serves no queue.
    pub async fn set_role(
        self: &Arc<Self>,
        name: &str,
        expect: crate::catalog::TopicRole,
        role: crate::catalog::TopicRole,
    ) -> Result<TopicMeta, BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let topic = self.topic(name)?;
        if topic.meta.read().role == role {
            return Ok(topic.meta.read().clone());
        }
        let cmd = CatalogCommand::SetRole {
            topic_id: topic.id(),
            expect,
            role,
        };
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
        } else {
            let live = topic.clone();
            self.commit(cmd, move |_| live.meta.write().role = role)
                .await?;
        }
        tracing::info!(topic = %name, role = role.name(), epoch = role.epoch(), "topic role changed");
        // readers parked on it (and on its fan-out children) ask again and get the refusal
        self.dispatch(&topic).await;
        for (_, child, _) in self.child_topics(name) {
            self.dispatch(&child).await;
        }
        Ok(topic.meta.read().clone())
    }

    /// Records mirror `name`'s source's fan-out children (a promote attaches them here),
    /// durably (replicated in a cluster); nothing when they are the ones it holds.
    pub async fn set_carried_children(
        self: &Arc<Self>,
        name: &str,
        children: Vec<crate::catalog::CarriedChild>,
    ) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let topic = self.topic(name)?;
        if topic.meta.read().carried_children == children {
            return Ok(());
        }
        let cmd = CatalogCommand::SetCarriedChildren {
            topic_id: topic.id(),
            children: children.clone(),
        };
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
        } else {
            let live = topic.clone();
            self.commit(cmd, move |_| live.meta.write().carried_children = children)
                .await?;
        }
        Ok(())
    }

    /// Appends a JSON Schema version to a topic. `check` sees the versions so far and refuses
    /// an incompatible one; it runs under the metadata lock, so two concurrent changes cannot
    /// both pass against the same latest version.
    pub async fn add_schema_version(
        self: &Arc<Self>,
        name: &str,
        schema: serde_json::Value,
        check: impl FnOnce(&[SchemaVersion]) -> Result<(), String>,
    ) -> Result<TopicMeta, BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let topic = self.topic(name)?;
        if topic.meta.read().parent.is_some() {
            return Err(BrokerError::FanoutConflict(format!(
                "'{name}' is a fan-out child: its schema follows its parent's (change the parent's)"
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
        let (cmd, live) = (
            CatalogCommand::AddSchemaVersion {
                topic_id: topic.id(),
                schema: added.clone(),
            },
            topic.clone(),
        );
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
        } else {
            // the children follow (as the catalog did)
            let children = self.child_topics(name);
            self.commit(cmd, move |_| {
                for (_, c, _) in &children {
                    c.meta.write().schemas.push(added.clone());
                }
                live.meta.write().schemas.push(added);
            })
            .await?;
        }
        tracing::info!(topic = %name, version, "topic schema changed");
        Ok(topic.meta.read().clone())
    }

    /// Clears the owner of every topic the user `owner` (of id `owner_id`) owns, after the
    /// user was deleted. Returns how many there were.
    pub async fn disown(
        self: &Arc<Self>,
        owner: &str,
        owner_id: u64,
    ) -> Result<usize, BrokerError> {
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
        let count = owned.len();
        let cmd = CatalogCommand::Disown {
            owner: owner.to_owned(),
            owner_id,
        };
        if self.store.replicated() {
            self.propose_replicated(cmd).await?;
            return Ok(count);
        }
        self.commit(cmd, move |_| {
            for t in owned {
                let mut m = t.meta.write();
                (m.owner, m.owner_id) = (None, None);
            }
        })
        .await?;
        Ok(count)
    }

    pub async fn delete_topic(self: &Arc<Self>, name: &str) -> Result<(), BrokerError> {
        self.check_running()?;
        let _guard = self.meta_lock.lock().await;
        let topic = self.topic(name)?;
        if self.store.replicated() {
            self.propose_replicated(CatalogCommand::DeleteTopic {
                topic_id: topic.id(),
            })
            .await?;
            tracing::info!(topic = name, "topic deleted");
            return Ok(());
        }
        // its children survive, standalone with their data
        let children: Vec<Arc<Topic>> = self
            .child_topics(name)
            .into_iter()
            .map(|(_, t, _)| t)
            .collect();
        let (topics, gone) = (self.topics.clone(), name.to_owned());
        let cmd = CatalogCommand::DeleteTopic {
            topic_id: topic.id(),
        };
        self.commit(cmd, move |applied| {
            let mut topics = topics.write();
            if let Some(t) = topics.remove(&gone) {
                // its timer stops even if the caller is gone before the cleanup below
                t.deleted.store(true, Ordering::Release);
                t.timer.notify_one();
            }
            if let Applied::Deleted { unlinked, .. } = applied {
                for c in topics.values().filter(|c| unlinked.contains(&c.id())) {
                    c.meta.write().parent = None;
                }
            }
        })
        .await?;
        let gone: Vec<String> = children
            .iter()
            .map(|c| c.meta.read().name.clone())
            .collect();
        self.retire_topic(&topic, &gone).await;
        tracing::info!(topic = name, "topic deleted");
        Ok(())
    }

    /// Stops and removes what is left of deleted topic `topic` on this node (it is out of
    /// the catalog and of `topics` already): its fan-out cursors (and those of `children`,
    /// now standalone), its waiters (answered empty), its logs, then its directory.
    async fn retire_topic(&self, topic: &Arc<Topic>, children: &[String]) {
        let name = topic.meta.read().name.clone();
        let name = name.as_str();
        self.fanout
            .lock()
            .retain(|(child, _), _| child != name && !children.iter().any(|c| c == child));
        if let Some(l) = topic.meta.read().parent.clone()
            && let Ok(p) = self.topic(&l.parent)
        {
            for part in p.partitions().iter() {
                cursor_file::remove_cursor_files(&part.dir, name);
            }
        }
        topic.deleted.store(true, Ordering::Release);
        topic.timer.notify_one();
        self.metrics.forget_topic(name);
        // (a mirror's index and what waits beside it go with it)
        self.mirror_indexes.lock().remove(&topic.id());
        self.mirror_deferred.lock().remove(&topic.id());
        for w in topic.waiters.lock().drain() {
            let _ = w.tx.send(Vec::new());
        }
        // (all at once: each close waits for its segments' sync on the checkpoint thread)
        let parts = topic.partitions();
        futures_util::future::join_all(parts.iter().map(|p| p.retire())).await;
        let (dir, leftovers) = (topic.dir.clone(), self.leftovers.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove deleted topic's data yet; retried by the next maintenance pass");
                leftovers.lock().push(dir);
            }
        });
    }

    /// Proposes `cmd` to the replicated store and, once this node has applied it, makes its
    /// state follow the catalog it made: the change is live here before the caller answers
    /// (no 404 on this node right after a 201).
    pub(super) async fn propose_replicated(
        self: &Arc<Self>,
        cmd: CatalogCommand,
    ) -> Result<(), BrokerError> {
        self.store.replicate(cmd).await?;
        self.follow_catalog(&self.store.catalog()).await
    }

    /// Makes this node's topics follow `catalog` (a replicated store's, as this node has
    /// applied it): opens the topics it names that are not open here, grows partitions,
    /// takes new settings, schemas and owners, and retires the topics it no longer names
    /// (or names with another incarnation). Idempotent; a catalog older than the one
    /// followed already is ignored. On an error (a disk failure opening a partition) what
    /// was done stays done, and the next call takes up the rest.
    pub async fn follow_catalog(self: &Arc<Self>, catalog: &Catalog) -> Result<(), BrokerError> {
        let _one = self.follow_lock.lock().await;
        if catalog.applied() <= *self.followed.borrow() {
            return Ok(());
        }
        let gone: Vec<Arc<Topic>> = {
            let mut topics = self.topics.write();
            let names: Vec<String> = topics
                .iter()
                .filter(|(name, t)| catalog.get(name).is_none_or(|m| m.id != t.id()))
                .map(|(name, _)| name.clone())
                .collect();
            names.iter().filter_map(|n| topics.remove(n)).collect()
        };
        for t in &gone {
            self.retire_topic(t, &[]).await;
            tracing::info!(topic = %t.meta.read().name, "topic deleted (followed the cluster)");
        }
        for meta in catalog.topics() {
            let live = self.topics.read().get(&meta.name).cloned();
            match live {
                Some(t) => {
                    let old = t.meta.read().clone();
                    if old == **meta {
                        continue;
                    }
                    // a partition rebuilt here from the archive starts where the archive
                    // ends, before anyone is sent to it
                    self.ensure_rebuilt(&t, meta).await?;
                    // new partitions exist before the settings that name them
                    if meta.config.partitions > old.config.partitions {
                        let new = self
                            .open_partitions(&t.dir, old.config.partitions, meta.config.partitions)
                            .await?;
                        let all: Vec<Arc<Partition>> =
                            t.partitions().iter().chain(&new).cloned().collect();
                        *t.partitions.write() = Arc::new(all);
                    }
                    *t.meta.write() = (**meta).clone();
                    // partitions that moved away from this node: their copy here goes; those
                    // that moved here: the topic's timer wakes for their first lease or
                    // delay to end (the old owner's leases they hold, say)
                    if let Some(me) = self.store.node_id() {
                        for p in 0..old.config.partitions.min(meta.config.partitions) {
                            if old.owner_of(p) == Some(me) && meta.owner_of(p) != Some(me) {
                                self.give_away_partition(&t, p).await?;
                            } else if old.owner_of(p) != Some(me)
                                && meta.owner_of(p) == Some(me)
                                && let Ok(part) = t.partition(p)
                                && let Some(at) = part.queue.lock().next_wakeup()
                            {
                                self.arm_timer(&t, at);
                            }
                        }
                    }
                    if let Some(l) = &old.parent
                        && meta.parent.as_ref() != Some(l)
                    {
                        self.end_link(&meta.name, l);
                    }
                    self.dispatch(&t).await;
                    t.timer.notify_one();
                }
                None => {
                    let t = match self.open_topic_rebuilt((**meta).clone()).await {
                        Ok(t) => t,
                        Err(e) => {
                            let dir = self.cfg.data_dir.join("topics").join(meta.dir_name());
                            let _ =
                                tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir))
                                    .await;
                            return Err(e);
                        }
                    };
                    self.topics.write().insert(meta.name.clone(), t.clone());
                    self.spawn_topic_timer(t);
                    tracing::info!(topic = %meta.name, id = meta.id, "topic created (followed the cluster)");
                }
            }
        }
        // the cursors of new links, and of new parent partitions, on their owners
        self.start_cursors();
        self.followed.send_replace(catalog.applied());
        Ok(())
    }

    /// In a cluster, once this member's catalog is known to be current (the cluster confirmed
    /// it with a read index, and this node followed that far): removes every topic directory
    /// no live topic names. Those are topics deleted while the member was stopped between
    /// applying the delete and removing the directory (its state machine has the delete, so
    /// no later pass of [`Broker::follow_catalog`] will see the topic go). Before the catalog
    /// is known current, a directory it does not name could be a topic made since, so the
    /// caller must not ask earlier. Holds the follow lock: no pass creates a directory
    /// meanwhile. Returns how many directories it removed.
    pub async fn sweep_deleted_topics(self: &Arc<Self>) -> Result<usize, BrokerError> {
        let _one = self.follow_lock.lock().await;
        let known: std::collections::HashSet<String> = self
            .topics
            .read()
            .values()
            .map(|t| t.meta.read().dir_name())
            .collect();
        let dir = self.cfg.data_dir.clone();
        Ok(
            tokio::task::spawn_blocking(move || layout::sweep_orphans(&dir, known))
                .await
                .expect("sweep task"),
        )
    }

    /// How many catalog commands this node's state has followed.
    pub fn followed(&self) -> u64 {
        *self.followed.borrow()
    }

    /// Changes as this node follows catalog commands (a topic's owners moved, say).
    pub fn catalog_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.followed.subscribe()
    }

    /// Waits (at most `within`) until this node has followed at least `applied` catalog
    /// commands: a call from another cluster member names the catalog it acted on (a topic
    /// it just created, say), which this member may not have applied yet. `false` if it did
    /// not catch up in time.
    pub async fn catch_up(&self, applied: u64, within: Duration) -> bool {
        let mut rx = self.followed.subscribe();
        matches!(
            tokio::time::timeout(within, rx.wait_for(|v| *v >= applied)).await,
            Ok(Ok(_))
        )
    }

    /// Whether partition `partition` of the topic `meta` describes is served by this node
    /// (always on a single node; in a cluster, by its owner only).
    pub fn is_local(&self, meta: &TopicMeta, partition: u32) -> bool {
        match (self.store.node_id(), meta.owners.get(partition as usize)) {
            (Some(me), Some(owner)) => me == *owner,
            _ => true,
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
}
