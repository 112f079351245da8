//! Narad core: the partition log (storage engine) and the queue semantics on top of it.
//!
//! ```text
//!            produce                        consume / ack / extend / nack
//!               │                                        │
//!               ▼                                        ▼
//!   broker::Broker ── topics ── Partition { log: log::PartitionLog, queue: queue::PartitionQueue }
//!               │                 │                       │
//!               │                 │  durable records      │  sans-IO lease / ack / frontier
//!               │                 ▼                       ▼  state (no disk, no clock)
//!               │        segments on disk         queue.state snapshots (frontier + acked set
//!               │                                 + delivery counts) and deliveries journals
//!               └── waiters: FIFO of long-polling readers per topic, served by a dispatcher
//! ```
//!
//! - [`record`]: the record and its CRC32C frame (the storage format).
//! - [`log`]: one partition's append-only segments, group commit, recovery, retention.
//! - [`queue`]: the lease/ack/frontier state machine of one partition, pure data.
//! - [`handle`]: receipt handles (opaque, MAC'd, bound to a process epoch).
//! - [`ids`]: typed ids (member, topic incarnation, partition) for the keys of tables.
//! - [`topic`]: topic configuration and validation.
//! - [`catalog`]: every topic's metadata, changed only by commands with a pure apply, made
//!   durable by a [`catalog::store::MetaStore`] before it is published.
//! - [`broker`]: wires topics, logs and queues together; no HTTP here.
//! - [`clock`]: the injected wall clock and its sleeps (a manual one for tests).
//! - [`supervisor`]: named background task groups: panics counted and reported, ordered stop.
//! - [`loggate`]: a bound on the log lines requests can cause.

pub mod broker;
pub mod catalog;
pub mod clock;
pub mod failpoint;
pub mod fsutil;
pub mod handle;
pub mod ids;
pub mod log;
pub mod loggate;
pub mod metrics;
pub mod placement;
pub mod queue;
pub mod random;
pub mod record;
pub mod supervisor;
pub mod topic;

/// 64 random bits for ids, epochs and nonce seeds ([`random::next_u64`]; never a secret).
pub fn random_u64() -> u64 {
    random::next_u64()
}
