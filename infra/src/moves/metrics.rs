//! What the mover counts and measures.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Debug)]
pub struct MoveMetrics {
    pub in_flight: Gauge,
    pub bytes_copied: Counter,
    pub completed: Counter,
    pub aborted: Counter,
    pub seconds: Histogram,
    pub freeze_seconds: Histogram,
    pub thaws: Counter,
    /// Records a forgotten member held that the archive did not (at least this many).
    pub lost_records: Counter,
    /// Archived records put back on local disk by rebuilds of a forgotten member's partitions.
    pub rebuilt_records: Counter,
    /// Rebuild attempts that failed (the archive unreadable, say) and were started again.
    pub rebuild_failures: Counter,
}

impl Default for MoveMetrics {
    fn default() -> Self {
        let buckets = || {
            Histogram::new([
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
            ])
        };
        Self {
            in_flight: Gauge::default(),
            bytes_copied: Counter::default(),
            completed: Counter::default(),
            aborted: Counter::default(),
            seconds: buckets(),
            freeze_seconds: buckets(),
            thaws: Counter::default(),
            lost_records: Counter::default(),
            rebuilt_records: Counter::default(),
            rebuild_failures: Counter::default(),
        }
    }
}

impl MoveMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "narad_moves_in_flight",
            "partition moves this node is copying in (as their target)",
            self.in_flight.clone(),
        );
        r.register(
            "narad_move_bytes_copied",
            "bytes of partition files copied in by moves",
            self.bytes_copied.clone(),
        );
        r.register(
            "narad_moves_completed",
            "partition moves this node completed (as their target)",
            self.completed.clone(),
        );
        r.register(
            "narad_move_attempts_aborted",
            "move attempts that failed and were started again (or given up: the move was cancelled)",
            self.aborted.clone(),
        );
        r.register(
            "narad_move_seconds",
            "how long a completed move took, from its first copy to its flip",
            self.seconds.clone(),
        );
        r.register(
            "narad_move_freeze_seconds",
            "how long the source was frozen for a completed move (freeze to flip, seen by the target)",
            self.freeze_seconds.clone(),
        );
        r.register(
            "narad_partition_records_lost",
            "acknowledged records lost: of partitions rebuilt from the archive after their owner was forgotten that the archive did not hold, and of partitions whose log here ended below what the cluster saw acknowledged (a data directory restored from an older copy); at least: what live members saw acknowledged",
            self.lost_records.clone(),
        );
        r.register(
            "narad_partition_records_rebuilt",
            "archived records a rebuild of a forgotten member's partition put back on this node's disk (those its consumers had not acked, to be delivered again)",
            self.rebuilt_records.clone(),
        );
        r.register(
            "narad_partition_rebuild_failures",
            "attempts to rebuild a forgotten member's partition from the archive that failed and are tried again (the partition serves nothing meanwhile)",
            self.rebuild_failures.clone(),
        );
        r.register(
            "narad_move_thaws",
            "freezes a source thawed because its mover did not flip in time",
            self.thaws.clone(),
        );
    }
}
