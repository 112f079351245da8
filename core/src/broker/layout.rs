//! The on-disk layout: `<data_dir>/topics/<name>.<id>/p<NNNNN>/`, opening partitions within
//! the `max_open_logs` budget, the restore marker, and the sweep of orphaned directories.

use super::*;

impl Broker {
    pub(super) async fn open_topic(&self, meta: TopicMeta) -> Result<Arc<Topic>, BrokerError> {
        let dir = self.cfg.data_dir.join("topics").join(meta.dir_name());
        let parts = self
            .open_partitions(&dir, 0, meta.config.partitions)
            .await?;
        let label = TopicLabel {
            topic: meta.name.clone(),
        };
        // the series an alert watches for its first increase exist from the start, at 0 (a
        // series born at its first drop shows no increase to Prometheus)
        let _ = self.metrics.retention_dropped_unacked.get_or_create(&label);
        Ok(Arc::new(Topic {
            label,
            meta: RwLock::new(meta),
            dir,
            partitions: RwLock::new(Arc::new(parts)),
            waiters: Mutex::new(Waiters::default()),
            produce_rr: AtomicU64::new(random_u64()),
            consume_rr: AtomicU64::new(0),
            timer: Notify::new(),
            appended: Notify::new(),
            timer_at: AtomicI64::new(i64::MAX),
            given_back: std::sync::atomic::AtomicBool::new(false),
            deleted: AtomicBool::new(false),
            series: Default::default(),
            #[cfg(test)]
            test_pause: Mutex::new(None),
        }))
    }

    /// [`Broker::open_topic`], with its partitions rebuilt from the archive made to start
    /// where they must (see [`Broker::ensure_rebuilt`]).
    pub(super) async fn open_topic_rebuilt(
        &self,
        meta: TopicMeta,
    ) -> Result<Arc<Topic>, BrokerError> {
        let t = self.open_topic(meta.clone()).await?;
        self.ensure_rebuilt(&t, &meta).await?;
        Ok(t)
    }

    pub(super) async fn open_partitions(
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
            // (a partition frozen for a move keeps its log closed until it thaws)
            if self.verifying.load(std::sync::atomic::Ordering::SeqCst) {
                part.hold_unverified();
            }
            match self.open_logs.try_acquire().filter(|_| !part.is_frozen()) {
                Some(slot) => part.adopt_slot(slot),
                None => part.close().await,
            }
            parts.push(part);
        }
        Ok(parts)
    }

    /// A `max_open_logs` slot: a free one, else one freed by closing the least recently used
    /// idle logs (a batch at a time, so a run of misses does not scan every partition each).
    pub(super) async fn reserve_log_slot(&self) -> Option<partition::LogSlot> {
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
    pub(super) async fn log_of(
        &self,
        part: &Partition,
    ) -> Result<Arc<crate::log::PartitionLog>, BrokerError> {
        if part.is_frozen() || part.is_awaiting_rebuild() || part.is_unverified() {
            // frozen for a move: its files stay as the copy saw them; a placeholder for a
            // rebuild holds none of the partition's records
            return Err(BrokerError::PartitionMoving {
                topic: part
                    .dir
                    .parent()
                    .and_then(|d| d.file_name())
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                partition: part.index,
            });
        }
        if let Some(log) = part.open_log() {
            return Ok(log);
        }
        let Some(slot) = self.reserve_log_slot().await else {
            self.metrics.log_opens_refused.inc();
            // (clients that retry at once can cause thousands a second: counted in
            // narad_storage_log_opens_refused_total, a few lines per window)
            if let Some(suppressed) = OPEN_REFUSALS_LOGGED.admit() {
                tracing::warn!(
                    dir = %part.dir.display(),
                    max_open_logs = self.open_logs.max(),
                    suppressed,
                    "partition log not opened: max_open_logs logs are open and none is idle"
                );
            }
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

    /// Whether the data directory had no topic metadata at open (see `fresh`).
    pub fn is_fresh(&self) -> bool {
        self.fresh.load(Ordering::Acquire)
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
}

/// Lines about uses refused at `max_open_logs`: at most 10 per 10 s.
static OPEN_REFUSALS_LOGGED: crate::loggate::LogGate =
    crate::loggate::LogGate::new(10, std::time::Duration::from_secs(10));

/// Removes topic directories that no metadata entry names (left by a delete interrupted by a
/// crash, or a create that failed half-way).
pub(super) fn sweep_orphans(data_dir: &Path, known: std::collections::HashSet<String>) -> usize {
    let Ok(entries) = std::fs::read_dir(data_dir.join("topics")) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !known.contains(&name) {
            tracing::info!(dir = %e.path().display(), "removing data of a deleted topic");
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => removed += 1,
                Err(err) => {
                    tracing::warn!(dir = %e.path().display(), error = %err, "could not remove orphan topic directory");
                }
            }
        }
    }
    removed
}
