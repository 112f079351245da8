//! Background upkeep (queue snapshots, retention, idle log close) and shutdown.

use super::*;

/// The broker's task groups (see [`crate::supervisor`]): static names, the labels of
/// `narad_task_panics_total`.
pub(super) const TIMER_TASK: &str = "topic_timer";
pub(super) const MAINTENANCE_TASK: &str = "maintenance";
pub(super) const FANOUT_TASK: &str = "fanout_cursor";
/// How long each group gets to stop at shutdown before what is left is aborted. Every one of
/// them stops at its next wait; only a pass of work in progress (a slab copy, a retention
/// pass) can hold it up.
const TASK_STOP_GRACE: Duration = Duration::from_secs(5);

impl Broker {
    pub(super) fn spawn_maintenance(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let clock = self.clock.clone();
        let flush_every = self.cfg.ack_flush_interval_ms.max(1) as i64;
        let retention_every = self.cfg.retention_interval_ms.max(1) as i64;
        // Passes start flush_every apart (start to start, the first counted from now): a pass
        // that ran long is followed at once by the next, never by a burst of missed ones. The
        // wait is what is left of the interval, at most one interval: a wall clock stepped
        // back does not stall the snapshots, and a (manual) clock moved during a pass is seen
        // at once.
        let mut next_pass = clock.now_ms().saturating_add(flush_every);
        self.tasks.spawn(MAINTENANCE_TASK, move |stop| async move {
            let mut last_retention = i64::MIN;
            loop {
                let left = next_pass
                    .saturating_sub(clock.now_ms())
                    .clamp(0, flush_every);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = clock.sleep(Duration::from_millis(left as u64)) => {}
                }
                let Some(broker) = weak.upgrade() else { return };
                if broker.shutting_down.load(Ordering::Acquire) {
                    return;
                }
                let now = broker.clock.now_ms();
                next_pass = now.saturating_add(flush_every);
                broker.persist_queues().await;
                if now.saturating_sub(last_retention) >= retention_every {
                    last_retention = now;
                    broker.run_retention().await;
                    broker.close_idle().await;
                    broker.remove_leftovers().await;
                }
            }
        });
    }

    pub(super) fn all_partitions(&self) -> Vec<(Arc<Topic>, Arc<Partition>)> {
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

    /// Writes every changed queue snapshot, and makes the deliveries journals of the others
    /// durable.
    pub async fn persist_queues(&self) {
        self.persist_partitions(false).await;
    }

    /// [`Self::persist_queues`]; with `compact` (at shutdown) also a snapshot of every
    /// partition with deliveries journals on disk, so that a clean stop leaves none.
    async fn persist_partitions(&self, compact: bool) {
        let parts: Vec<(Arc<Topic>, Arc<Partition>)> = self
            .all_partitions()
            .into_iter()
            .filter(|(_, p)| compact || p.persist_due())
            .collect();
        if parts.is_empty() {
            return;
        }
        let metrics = self.metrics.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for (topic, p) in parts {
                match p.persist_queue(compact) {
                    Ok(done) if done.written => {
                        if done.counts_left_out > 0 {
                            metrics
                                .delivery_counts_truncated
                                .get_or_create(&topic.label)
                                .inc();
                        }
                    }
                    Ok(_) => {
                        if let Err(e) = p.sync_journal() {
                            tracing::error!(dir = %p.dir.display(), error = %e, "could not sync the deliveries journal; the next pass writes a snapshot");
                        }
                    }
                    // (a topic deleted meanwhile: its directory is going, nothing to keep)
                    Err(_) if topic.deleted.load(Ordering::Acquire) => {}
                    Err(e) => {
                        tracing::error!(dir = %p.dir.display(), error = %e, "could not persist queue state");
                    }
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
            let retention_ms = self.local_retention_ms(&cfg);
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

    pub(super) async fn close_idle(&self) {
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

    /// Stops the fan-out cursors (each at its next wait: a slab being copied is finished and
    /// its cursor written). The server calls it before it stops the tierer; [`Broker::shutdown`]
    /// calls it too.
    pub async fn stop_fanout(&self) {
        self.tasks.stop(FANOUT_TASK, TASK_STOP_GRACE).await;
    }

    /// Shuts down in order: answers waiting readers with nothing, stops the fan-out cursors,
    /// then the topic timers and maintenance (every task awaited, within [`TASK_STOP_GRACE`]
    /// for each step), persists queue state and closes every log (after its queued appends
    /// are durable).
    pub async fn shutdown(&self) {
        if self.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        self.drain_waiters();
        self.stop_fanout().await;
        self.tasks.shutdown(TASK_STOP_GRACE).await;
        self.persist_partitions(true).await;
        // (all at once: each close waits for its segments' sync on the checkpoint thread)
        let all = self.all_partitions();
        futures_util::future::join_all(all.iter().map(|(_, p)| p.close())).await;
        // Acks that raced the close.
        self.persist_partitions(true).await;
        // Every segment synced, the WAL files removed: the next start replays nothing.
        if let Some(wal) = self.cfg.log.wal.clone() {
            let _ = tokio::task::spawn_blocking(move || wal.shutdown()).await;
        }
    }

    /// Tests: stops as a `kill -9` would leave the files: the background tasks end, nothing
    /// is persisted or closed, and the WAL threads stop without a checkpoint (its files stay
    /// for the next open to replay). Unlike a plain drop, nothing of this broker still runs
    /// (a WAL checkpoint removing files, say) when the next one opens the directory.
    #[cfg(test)]
    pub(crate) async fn crash(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.stop_fanout().await;
        self.tasks.shutdown(TASK_STOP_GRACE).await;
        if let Some(wal) = self.cfg.log.wal.clone() {
            let _ = tokio::task::spawn_blocking(move || wal.abandon()).await;
        }
    }

    /// Removes the directories of deleted topics whose removal failed (something wrote into
    /// one as it went: a log reopened by a request that raced the delete), so they do not
    /// wait for the next start (a cluster member sweeps none at start).
    pub(super) async fn remove_leftovers(&self) {
        let dirs = std::mem::take(&mut *self.leftovers.lock());
        if dirs.is_empty() {
            return;
        }
        let left = tokio::task::spawn_blocking(move || {
            dirs.into_iter()
                .filter(|d| match std::fs::remove_dir_all(d) {
                    Ok(()) => false,
                    Err(e) => e.kind() != std::io::ErrorKind::NotFound,
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        self.leftovers.lock().extend(left);
    }

    /// Background tasks still running, per group (empty after [`Broker::shutdown`]).
    pub fn running_tasks(&self) -> Vec<(&'static str, usize)> {
        self.tasks.running()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}
