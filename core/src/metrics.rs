//! Metrics the storage engine and queue keep. The server registers them with its Prometheus
//! registry; gauges that describe current state are filled in at scrape time by the server.

use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabel {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub topic: String,
    pub outcome: &'static str,
}

#[derive(Debug)]
pub struct CoreMetrics {
    pub fsyncs: Counter,
    pub fsync_seconds: Histogram,
    pub records_per_fsync: Histogram,
    pub appended_bytes: Counter,
    /// WAL checkpoints done (segments synced, covered WAL files removed) and their duration.
    pub wal_checkpoints: Counter,
    pub wal_checkpoint_seconds: Histogram,
    /// Writebacks: segment files synced ahead of their checkpoint, and their duration.
    pub wal_writebacks: Counter,
    pub wal_writeback_seconds: Histogram,
    pub torn_tails_truncated: Counter,
    pub segments_rolled: Counter,
    pub segments_deleted: Counter,
    pub retention_dropped_unacked: Family<TopicLabel, Counter>,
    pub produced_messages: Family<TopicLabel, Counter>,
    pub produced_bytes: Family<TopicLabel, Counter>,
    pub consumed_messages: Family<TopicLabel, Counter>,
    pub acks: Family<OutcomeLabel, Counter>,
    pub lease_expiries: Family<TopicLabel, Counter>,
    /// Queue snapshots that had no room for every delivery count (`MAX_PERSISTED_COUNTS`).
    pub delivery_counts_truncated: Family<TopicLabel, Counter>,
    pub logs_opened: Counter,
    pub idle_logs_closed: Counter,
    /// Idle logs closed early to make room under `max_open_logs`.
    pub logs_evicted: Counter,
    /// Partitions frozen (or a freeze renewed) for a move, on their source.
    pub partition_freezes: Counter,
    /// Uses refused because `max_open_logs` logs were open and none idle.
    pub log_opens_refused: Counter,
    pub log_poisoned: Counter,
    /// Records copied into a fan-out child (labelled by the child).
    pub fanout_copied: Family<TopicLabel, Counter>,
    /// Parent records deleted by retention before a child's cursor copied them.
    pub fanout_dropped: Family<TopicLabel, Counter>,
    pub fanout_errors: Family<TopicLabel, Counter>,
    /// Records a demoted primary shipped after this topic was promoted past it (its tail).
    pub mirror_late: Family<TopicLabel, Counter>,
    /// Records of a mirror settled because its source's consumers acked them.
    pub mirror_settled: Family<TopicLabel, Counter>,
    /// When a mirror last took its source's consumer progress (unix seconds).
    pub mirror_progress_at: Family<TopicLabel, prometheus_client::metrics::gauge::Gauge>,
    /// Slabs of records remote children's cursors hold on this node (read, being shipped).
    pub remote_slabs_held: prometheus_client::metrics::gauge::Gauge,
    /// Times a remote child's cursor waited for the node's remote memory budget.
    pub remote_slab_waits: Counter,
    /// Panics of supervised background tasks, and which tasks they were (readiness).
    pub tasks: std::sync::Arc<crate::supervisor::TaskHealth>,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        Self {
            fsyncs: Counter::default(),
            fsync_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            records_per_fsync: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            appended_bytes: Counter::default(),
            wal_checkpoints: Counter::default(),
            wal_checkpoint_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            wal_writebacks: Counter::default(),
            wal_writeback_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            torn_tails_truncated: Counter::default(),
            segments_rolled: Counter::default(),
            segments_deleted: Counter::default(),
            retention_dropped_unacked: Family::default(),
            produced_messages: Family::default(),
            produced_bytes: Family::default(),
            consumed_messages: Family::default(),
            acks: Family::default(),
            lease_expiries: Family::default(),
            delivery_counts_truncated: Family::default(),
            logs_opened: Counter::default(),
            idle_logs_closed: Counter::default(),
            logs_evicted: Counter::default(),
            partition_freezes: Counter::default(),
            log_opens_refused: Counter::default(),
            log_poisoned: Counter::default(),
            fanout_copied: Family::default(),
            fanout_dropped: Family::default(),
            fanout_errors: Family::default(),
            mirror_late: Family::default(),
            mirror_settled: Family::default(),
            mirror_progress_at: Family::default(),
            remote_slabs_held: Default::default(),
            remote_slab_waits: Counter::default(),
            tasks: std::sync::Arc::default(),
        }
    }
}

/// Every value the `outcome` label of the ack counter takes.
pub const ACK_OUTCOMES: [&str; 5] = ["acked", "extended", "nacked", "stale", "ack_set_full"];

/// One topic's series that are counted on every produce, consume and ack: each is looked up
/// in its family on first use and kept (a family lookup hashes the topic's name and takes a
/// lock). Kept by the topic, so it goes with it; [`CoreMetrics::forget_topic`] drops the
/// families' entries as before.
#[derive(Debug, Default)]
pub struct TopicSeries {
    produced: OnceLock<(Counter, Counter)>,
    consumed: OnceLock<Counter>,
    acks: [OnceLock<Counter>; ACK_OUTCOMES.len()],
}

impl TopicSeries {
    /// `produced_messages` and `produced_bytes`.
    pub fn produced(&self, m: &CoreMetrics, label: &TopicLabel) -> &(Counter, Counter) {
        self.produced.get_or_init(|| {
            let messages = m.produced_messages.get_or_create(label).clone();
            let bytes = m.produced_bytes.get_or_create(label).clone();
            (messages, bytes)
        })
    }

    /// `consumed_messages`.
    pub fn consumed(&self, m: &CoreMetrics, label: &TopicLabel) -> &Counter {
        self.consumed
            .get_or_init(|| m.consumed_messages.get_or_create(label).clone())
    }

    /// `acks` with `outcome`, one of [`ACK_OUTCOMES`].
    pub fn ack(&self, m: &CoreMetrics, label: &TopicLabel, outcome: &'static str) -> &Counter {
        let i = ACK_OUTCOMES
            .iter()
            .position(|&o| o == outcome)
            .expect("an outcome of ACK_OUTCOMES");
        self.acks[i].get_or_init(|| {
            m.acks
                .get_or_create(&OutcomeLabel {
                    topic: label.topic.clone(),
                    outcome,
                })
                .clone()
        })
    }
}

impl CoreMetrics {
    /// Drops every series labelled with a deleted topic's name, so that creating and deleting
    /// topics cannot grow the registry (and `/metrics`) without bound.
    pub fn forget_topic(&self, topic: &str) {
        let label = TopicLabel {
            topic: topic.to_owned(),
        };
        for family in [
            &self.retention_dropped_unacked,
            &self.produced_messages,
            &self.produced_bytes,
            &self.consumed_messages,
            &self.lease_expiries,
            &self.delivery_counts_truncated,
            &self.fanout_copied,
            &self.fanout_dropped,
            &self.fanout_errors,
            &self.mirror_late,
            &self.mirror_settled,
        ] {
            family.remove(&label);
        }
        self.mirror_progress_at.remove(&label);
        for outcome in ACK_OUTCOMES {
            self.acks.remove(&OutcomeLabel {
                topic: topic.to_owned(),
                outcome,
            });
        }
    }

    pub fn register(&self, r: &mut Registry) {
        self.tasks.register(r);
        r.register(
            "narad_remote_slabs_held",
            "slabs of records (up to 4 MiB each) remote children's cursors hold on this node, of remote_memory_mib / 4",
            self.remote_slabs_held.clone(),
        );
        r.register(
            "narad_remote_slab_waits",
            "times a remote child's cursor waited for the node's remote_memory_mib budget before reading",
            self.remote_slab_waits.clone(),
        );
        r.register(
            "narad_fanout_copied_messages",
            "records copied from a parent into this child",
            self.fanout_copied.clone(),
        );
        r.register(
            "narad_fanout_child_dropped_messages",
            "parent records deleted by retention before this child copied them (data loss)",
            self.fanout_dropped.clone(),
        );
        r.register(
            "narad_mirror_late_records",
            "records the old primary acknowledged but had not shipped when this topic was promoted, taken since (its tail)",
            self.mirror_late.clone(),
        );
        r.register(
            "narad_mirror_settled_records",
            "records of this mirror settled because the source's consumers acked them (not processed again after a promote)",
            self.mirror_settled.clone(),
        );
        r.register(
            "narad_mirror_progress_timestamp_seconds",
            "when this mirror last took its source's consumer progress (unix seconds; the link sends it every 2 s even when nothing changed)",
            self.mirror_progress_at.clone(),
        );
        r.register(
            "narad_fanout_cursor_errors",
            "failed fan-out copy attempts (retried from the same offset)",
            self.fanout_errors.clone(),
        );
        r.register(
            "narad_storage_fsyncs",
            "fdatasync calls on the write-ahead log (one per group commit round)",
            self.fsyncs.clone(),
        );
        r.register(
            "narad_storage_fsync_duration_seconds",
            "time spent in one write + fdatasync",
            self.fsync_seconds.clone(),
        );
        r.register(
            "narad_storage_records_per_fsync",
            "records made durable by one fdatasync (group commit)",
            self.records_per_fsync.clone(),
        );
        r.register(
            "narad_storage_appended_bytes",
            "bytes appended to partition logs",
            self.appended_bytes.clone(),
        );
        r.register(
            "narad_storage_wal_checkpoints",
            "write-ahead log checkpoints (segments synced, covered WAL files removed)",
            self.wal_checkpoints.clone(),
        );
        r.register(
            "narad_storage_wal_checkpoint_duration_seconds",
            "time to sync the segments a write-ahead log checkpoint covers",
            self.wal_checkpoint_seconds.clone(),
        );
        r.register(
            "narad_storage_wal_writebacks",
            "segment syncs ahead of a write-ahead log checkpoint (every few MiB of segment bytes)",
            self.wal_writebacks.clone(),
        );
        r.register(
            "narad_storage_wal_writeback_duration_seconds",
            "time to sync the segment files one writeback covers",
            self.wal_writeback_seconds.clone(),
        );
        r.register(
            "narad_storage_torn_tails_truncated",
            "torn tails truncated during recovery",
            self.torn_tails_truncated.clone(),
        );
        r.register(
            "narad_storage_segments_rolled",
            "segments sealed",
            self.segments_rolled.clone(),
        );
        r.register(
            "narad_storage_segments_deleted",
            "sealed segments deleted by retention",
            self.segments_deleted.clone(),
        );
        r.register(
            "narad_retention_dropped_unacked_messages",
            "messages deleted by retention before they were acked",
            self.retention_dropped_unacked.clone(),
        );
        r.register(
            "narad_messages_produced",
            "messages accepted (durable)",
            self.produced_messages.clone(),
        );
        r.register(
            "narad_bytes_produced",
            "payload bytes accepted",
            self.produced_bytes.clone(),
        );
        r.register(
            "narad_messages_consumed",
            "deliveries handed to consumers",
            self.consumed_messages.clone(),
        );
        r.register("narad_acks", "ack/extend/nack outcomes", self.acks.clone());
        r.register(
            "narad_lease_expiries",
            "leases that expired and made their message deliverable again",
            self.lease_expiries.clone(),
        );
        r.register(
            "narad_delivery_counts_truncated_snapshots",
            "queue snapshots with no room for every delivery count (more than 1,000,000 leased, unacked messages on a partition): the highest offsets' counts restart after a restart",
            self.delivery_counts_truncated.clone(),
        );
        r.register(
            "narad_storage_logs_opened",
            "partition logs opened (including lazy reopen)",
            self.logs_opened.clone(),
        );
        r.register(
            "narad_storage_idle_logs_closed",
            "idle partition logs closed",
            self.idle_logs_closed.clone(),
        );
        r.register(
            "narad_storage_logs_evicted",
            "idle partition logs closed early to stay within max_open_logs",
            self.logs_evicted.clone(),
        );
        r.register(
            "narad_move_freezes",
            "partition freezes for moves (and their renewals) on the moving partition's source",
            self.partition_freezes.clone(),
        );
        r.register(
            "narad_storage_log_opens_refused",
            "uses refused (503 too_many_open_logs) because max_open_logs logs were busy",
            self.log_opens_refused.clone(),
        );
        r.register(
            "narad_storage_logs_poisoned",
            "partition logs poisoned by a failed write or fsync",
            self.log_poisoned.clone(),
        );
    }
}
