//! The broker's tests: produce, consume, ack and restart, long polls, delays, metadata
//! durability, and the supervisor; the node's limits, delivery counts and mirrors beside.

use super::*;
use crate::clock::{Clock, ManualClock, SystemClock};
use std::time::Instant;

mod counts;
mod limits;
mod mirrors;

async fn open(dir: &Path) -> Arc<Broker> {
    let mut cfg = BrokerConfig::new(dir);
    cfg.ack_flush_interval_ms = 10;
    Broker::open(cfg, Arc::new(SystemClock), Arc::new(CoreMetrics::default()))
        .await
        .unwrap()
}

/// A broker on a clock the test moves: its timers (lease expiry, delays, maintenance) and
/// long-poll waits fire when the test advances the clock, never on their own.
async fn open_manual(cfg: BrokerConfig) -> (Arc<Broker>, Arc<ManualClock>) {
    let clock = ManualClock::new(1_000_000);
    let b = Broker::open(cfg, clock.clone(), Arc::new(CoreMetrics::default()))
        .await
        .unwrap();
    (b, clock)
}

/// Polls `f` (yielding in between) until it holds, for at most 10 s of real time.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::task::yield_now().await;
    }
}

/// Awaits a spawned reader, failing (not hanging) if the clock never served it.
async fn served<T>(reader: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the reader was never served")
        .unwrap()
}

/// Waits until `n` readers are in line on topic `t`.
async fn waiters(b: &Broker, n: usize) {
    eventually("the readers never got in line", || {
        b.topic_info("t").unwrap().waiters == n
    })
    .await;
}

fn msg(s: &str) -> ProduceMessage {
    ProduceMessage {
        payload: Bytes::from(s.to_owned()),
        ..Default::default()
    }
}

fn create(name: &str, partitions: u32) -> CreateTopic {
    CreateTopic {
        name: name.into(),
        settings: TopicPatch {
            partitions: Some(partitions),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_consume_ack_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    for i in 0..5 {
        let r = b.produce("t", vec![msg(&format!("m{i}"))]).await.unwrap();
        assert_eq!(r[0].offset, i);
    }
    let got = b.consume("t", None, 5, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 5);
    // ack 0, 1, 3: 2 and 4 stay unacked
    for d in [&got[0], &got[1], &got[3]] {
        b.settle("t", &d.receipt_handle, AckAction::Ack)
            .await
            .unwrap();
    }
    assert!(matches!(
        b.settle("t", &got[0].receipt_handle, AckAction::Ack).await,
        Err(BrokerError::LeaseGone(_))
    ));
    b.shutdown().await;
    drop(b);
    let b = open(dir.path()).await;
    let got2 = b.consume("t", None, 10, Duration::ZERO).await.unwrap();
    let offsets: Vec<u64> = got2.iter().map(|d| d.record.offset).collect();
    assert_eq!(
        offsets,
        vec![2, 4],
        "only unacked messages come back after a restart"
    );
    // handles from before the restart are stale
    assert!(matches!(
        b.settle("t", &got[2].receipt_handle, AckAction::Ack).await,
        Err(BrokerError::LeaseGone(_))
    ));
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_serves_first_waiter_only() {
    let dir = tempfile::tempdir().unwrap();
    let (b, clock) = open_manual(BrokerConfig::new(dir.path())).await;
    b.create_topic(create("t", 3)).await.unwrap();
    let b1 = b.clone();
    let first = tokio::spawn(async move { b1.consume("t", None, 1, Duration::from_secs(5)).await });
    // make sure the first reader is in line before the second
    waiters(&b, 1).await;
    let b2 = b.clone();
    let second =
        tokio::spawn(async move { b2.consume("t", None, 1, Duration::from_millis(300)).await });
    waiters(&b, 2).await;
    b.produce("t", vec![msg("hello")]).await.unwrap();
    let got = served(first).await.unwrap();
    assert_eq!(got.len(), 1);
    // the second reader is still waiting (the clock has not moved) until its wait ends
    waiters(&b, 1).await;
    assert!(!second.is_finished());
    clock.advance(300);
    assert!(
        served(second).await.unwrap().is_empty(),
        "second reader got nothing"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_message_is_never_early() {
    let dir = tempfile::tempdir().unwrap();
    let (b, clock) = open_manual(BrokerConfig::new(dir.path())).await;
    b.create_topic(create("t", 1)).await.unwrap();
    let mut m = msg("later");
    m.delay_ms = Some(300);
    b.produce("t", vec![m, msg("now")]).await.unwrap();
    let got = b.consume("t", None, 10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record.payload, "now");
    let b1 = b.clone();
    let waiting = tokio::spawn(async move {
        b1.consume("t", None, 10, Duration::from_secs(5))
            .await
            .unwrap()
    });
    waiters(&b, 1).await;
    // 300 ms on: a delay ends a millisecond after delay_ms (timestamps are whole
    // milliseconds, so that is the first moment it has surely passed). A look at the queue
    // now would lease it (to the reader in line or to the look): nothing is leased but "now"
    clock.advance(300);
    let look = b.consume("t", None, 10, Duration::ZERO).await.unwrap();
    assert!(look.is_empty(), "delivered early");
    let queue = b.topic_info("t").unwrap().partitions[0].queue;
    assert_eq!((queue.in_flight, queue.delayed), (1, 1), "delivered early");
    // due: the topic's timer (asleep on the clock) wakes and serves the reader in line
    clock.advance(1);
    let got = served(waiting).await;
    assert_eq!(got[0].record.payload, "later");
    assert!(
        clock.now_ms() >= got[0].record.due_ms(),
        "delivered before its due time"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_validation_is_all_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 2)).await.unwrap();
    let mut bad = msg("x");
    bad.partition = Some(7);
    let err = b
        .produce("t", vec![msg("a"), msg("b"), bad])
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::PartitionOutOfRange { .. }));
    let info = b.topic_info("t").unwrap();
    assert!(info.partitions.iter().all(|p| p.log.next_offset == 0));
    let ok = b
        .produce("t", (0..10).map(|i| msg(&i.to_string())).collect())
        .await
        .unwrap();
    assert_eq!(ok.len(), 10);
    let info = b.topic_info("t").unwrap();
    assert_eq!(
        info.partitions
            .iter()
            .map(|p| p.log.next_offset)
            .sum::<u64>(),
        10
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_recreate_never_mixes() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    b.produce("t", vec![msg("old")]).await.unwrap();
    let old = b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    b.delete_topic("t").await.unwrap();
    assert!(matches!(
        b.topic_info("t"),
        Err(BrokerError::TopicNotFound(_))
    ));
    b.create_topic(create("t", 1)).await.unwrap();
    assert!(
        b.consume("t", None, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        b.settle("t", &old[0].receipt_handle, AckAction::Ack).await,
        Err(BrokerError::LeaseGone(_))
    ));
    b.shutdown().await;
    drop(b);
    let b = open(dir.path()).await;
    assert_eq!(b.topic_names(), vec!["t".to_string()]);
    assert!(
        b.consume("t", None, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_stick_to_a_partition_and_keyless_spread() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 3)).await.unwrap();
    let mut parts = std::collections::HashSet::new();
    for _ in 0..20 {
        let mut m = msg("k");
        m.key = Some(Bytes::from_static(b"user-1"));
        parts.insert(b.produce("t", vec![m]).await.unwrap()[0].partition);
    }
    assert_eq!(parts.len(), 1);
    let mut counts = [0; 3];
    for _ in 0..300 {
        counts[b.produce("t", vec![msg("x")]).await.unwrap()[0].partition as usize] += 1;
    }
    assert_eq!(counts, [100, 100, 100], "keyless produces spread evenly");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_reaches_idle_closed_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = BrokerConfig::new(dir.path());
    cfg.idle_close_ms = 50;
    cfg.retention_interval_ms = 20;
    cfg.ack_flush_interval_ms = 10;
    let (b, clock) = open_manual(cfg).await;
    let mut req = create("t", 1);
    req.settings.retention_ms = Some(1000);
    b.create_topic(req).await.unwrap();
    b.produce("t", vec![msg("old")]).await.unwrap();
    // looked at without taking the log (a look through `stats` holds it for a moment, and
    // a log in use is not closed)
    let part = b.topic("t").unwrap().partition(0).unwrap();
    // idle past idle_close_ms: the next maintenance pass closes the log
    clock.advance(60);
    eventually("the idle partition was never closed", || !part.is_open()).await;
    assert_eq!(part.stats().oldest_offset, 0, "deleted before it expired");
    // past the retention: the closed partition is reopened to delete what expired
    clock.advance(1000);
    eventually(
        "expired data of an idle partition was never deleted",
        || {
            let s = part.stats();
            s.oldest_offset == 1 && s.next_offset == 1
        },
    )
    .await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_restore_keeps_the_node_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    assert!(b.is_fresh(), "no topics.json yet");
    b.set_restore_pending(true).unwrap();
    b.create_topic(create("restored-first", 1)).await.unwrap();
    b.shutdown().await;
    // stopped half way: topics.json exists, but the restore must resume
    let b = open(dir.path()).await;
    assert!(b.is_fresh());
    b.set_restore_pending(false).unwrap();
    b.shutdown().await;
    let b = open(dir.path()).await;
    assert!(!b.is_fresh(), "a finished restore is not redone");
    b.shutdown().await;
}

fn to_partition(p: u32) -> ProduceMessage {
    ProduceMessage {
        partition: Some(p),
        ..msg("x")
    }
}

/// A [`MetaStore`] for tests: the node's own store, with a gate a test can hold to keep
/// commands from being committed, and a record of every command that applied.
#[derive(Debug)]
struct RecordingStore {
    inner: LocalMetaStore,
    gate: Arc<tokio::sync::Mutex<()>>,
    log: Arc<Mutex<Vec<CatalogCommand>>>,
}

impl MetaStore for RecordingStore {
    fn propose(
        &self,
        cmd: CatalogCommand,
        publish: crate::catalog::store::Publish,
    ) -> crate::catalog::store::Proposal {
        let (gate, log) = (self.gate.clone(), self.log.clone());
        let recorded = cmd.clone();
        let commit = move || {
            let _open = gate.blocking_lock();
            self_propose(cmd, recorded, publish, log)
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            let (cmd, publish) = tokio::task::spawn_blocking(commit).await.unwrap();
            inner.propose(cmd, publish).await
        })
    }

    fn catalog(&self) -> Arc<crate::catalog::Catalog> {
        self.inner.catalog()
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<crate::catalog::Catalog>> {
        self.inner.subscribe()
    }
}

/// The command and a publish hook that records it once it applied.
fn self_propose(
    cmd: CatalogCommand,
    recorded: CatalogCommand,
    publish: crate::catalog::store::Publish,
    log: Arc<Mutex<Vec<CatalogCommand>>>,
) -> (CatalogCommand, crate::catalog::store::Publish) {
    let hook: crate::catalog::store::Publish = Box::new(move |cat, applied| {
        log.lock().push(recorded);
        publish(cat, applied);
    });
    (cmd, hook)
}

async fn open_recording(dir: &Path) -> (Arc<Broker>, Arc<RecordingStore>) {
    let mut cfg = BrokerConfig::new(dir);
    cfg.ack_flush_interval_ms = 10;
    let store = Arc::new(RecordingStore {
        inner: LocalMetaStore::open(dir).unwrap(),
        gate: Arc::default(),
        log: Arc::default(),
    });
    let b = Broker::open_with_store(
        cfg,
        Arc::new(SystemClock),
        Arc::new(CoreMetrics::default()),
        store.clone(),
    )
    .await
    .unwrap();
    (b, store)
}

/// Issue 12: the catalog is what its commands make. Every metadata change the broker makes
/// goes through the store as a command; replaying the recorded commands on an empty catalog
/// gives the catalog the node published, and the one it reads back from disk after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_command_log_rebuilds_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let (b, store) = open_recording(dir.path()).await;
    let owned = |name: &str| CreateTopic {
        owner: Some(("alice".into(), 42)),
        ..create(name, 2)
    };
    b.create_topic(owned("p")).await.unwrap();
    b.create_topic(owned("c")).await.unwrap();
    b.create_topic(create("d", 1)).await.unwrap();
    b.alter_topic("p", grow(3)).await.unwrap();
    b.add_schema_version("d", serde_json::json!({"type": "object"}), |_| Ok(()))
        .await
        .unwrap();
    b.attach_child("p", "c", 0, LinkStart::Latest)
        .await
        .unwrap();
    b.detach_child("p", "c").await.unwrap();
    b.attach_child("p", "c", 0, LinkStart::Earliest)
        .await
        .unwrap();
    assert_eq!(b.disown("alice", 42).await.unwrap(), 2);
    b.create_topic(create("gone", 1)).await.unwrap();
    b.delete_topic("gone").await.unwrap();
    // refused changes are not in the log
    assert!(b.create_topic(create("p", 1)).await.is_err());
    assert!(
        b.attach_child("c", "d", 0, LinkStart::Latest)
            .await
            .is_err()
    );

    let log = store.log.lock().clone();
    assert_eq!(log.len(), 11, "{log:#?}");
    let mut replayed = crate::catalog::Catalog::default();
    for cmd in &log {
        replayed = crate::catalog::apply(&replayed, cmd).unwrap().0;
    }
    assert_eq!(&replayed, &*b.catalog());
    let c = replayed.get("c").unwrap();
    assert_eq!(c.parent.as_ref().unwrap().parent, "p");
    assert_eq!(c.owner, None);
    assert_eq!(replayed.get("p").unwrap().config.partitions, 3);
    // what the broker serves agrees with the catalog
    for t in replayed.topics() {
        assert_eq!(&b.topic_meta(&t.name).unwrap(), &**t);
    }
    b.shutdown().await;
    drop(b);
    assert_eq!(meta::load(dir.path()).unwrap(), replayed);
    let b = open(dir.path()).await;
    assert_eq!(&*b.catalog(), &replayed);
    b.shutdown().await;
}

fn grow(partitions: u32) -> TopicPatch {
    TopicPatch {
        partitions: Some(partitions),
        ..Default::default()
    }
}

/// Issue 11, bug 1: a new partition goes live only once the metadata naming it is durable.
/// Before, the partition took produces while `topics.json` was still being written, so a
/// crash then left a 202'd record in a partition that did not exist after restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_partitions_go_live_only_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (b, store) = open_recording(dir.path()).await;
    b.create_topic(create("t", 3)).await.unwrap();
    let topic_dir = b.topic("t").unwrap().dir.clone();
    // the metadata write of the change cannot finish while the test holds this
    let held = store.gate.lock().await;
    let b2 = b.clone();
    let alter = tokio::spawn(async move { b2.alter_topic("t", grow(4)).await });
    // the new partition is open on disk and the change waits for its durable write
    let deadline = Instant::now() + Duration::from_secs(10);
    while !topic_dir.join("p00003").exists() {
        assert!(
            Instant::now() < deadline,
            "the alter never opened partition 3"
        );
        tokio::task::yield_now().await;
    }
    for _ in 0..50 {
        assert!(matches!(
            b.produce("t", vec![to_partition(3)]).await,
            Err(BrokerError::PartitionOutOfRange { partitions: 3, .. })
        ));
        assert_eq!(b.topic_info("t").unwrap().partitions.len(), 3);
        tokio::task::yield_now().await;
    }
    drop(held);
    alter.await.unwrap().unwrap();
    b.produce("t", vec![to_partition(3)]).await.unwrap();
    b.shutdown().await;
    drop(b);
    let b = open(dir.path()).await;
    assert_eq!(b.topic_info("t").unwrap().partitions.len(), 4);
    b.shutdown().await;
}

/// A metadata write that fails publishes nothing: the topic keeps its partitions and config,
/// and a later change (once the disk is fine) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_metadata_write_publishes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 3)).await.unwrap();
    // fault injection: the temp file of the atomic replace cannot be created
    let blocker = dir.path().join(format!("{}.tmp", meta::META_FILE));
    std::fs::create_dir(&blocker).unwrap();
    assert!(matches!(
        b.alter_topic("t", grow(4)).await,
        Err(BrokerError::Meta(_))
    ));
    assert!(matches!(
        b.produce("t", vec![to_partition(3)]).await,
        Err(BrokerError::PartitionOutOfRange { partitions: 3, .. })
    ));
    assert!(b.create_topic(create("u", 1)).await.is_err());
    assert!(matches!(b.topic("u"), Err(BrokerError::TopicNotFound(_))));
    assert!(b.delete_topic("t").await.is_err());
    b.produce("t", vec![to_partition(0)]).await.unwrap();
    std::fs::remove_dir(&blocker).unwrap();
    b.alter_topic("t", grow(4)).await.unwrap();
    b.produce("t", vec![to_partition(3)]).await.unwrap();
    b.shutdown().await;
}

/// Issue 11, bug 3: a lease that expires inside the topic's timer window must wake the
/// waiters that are already in line, first come first served, and count the expiry when it
/// happens (not when somebody next polls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_wakes_the_waiter_in_line() {
    let dir = tempfile::tempdir().unwrap();
    let (b, clock) = open_manual(BrokerConfig::new(dir.path())).await;
    b.create_topic(CreateTopic {
        settings: TopicPatch {
            partitions: Some(1),
            visibility_timeout_ms: Some(300),
            ..Default::default()
        },
        ..create("t", 1)
    })
    .await
    .unwrap();
    b.produce("t", vec![msg("m")]).await.unwrap();
    // A leases and never acks
    let a = b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    assert_eq!(a.len(), 1);
    let wait_in_line = || {
        let b = b.clone();
        tokio::spawn(async move {
            b.consume("t", None, 1, Duration::from_secs(10))
                .await
                .unwrap()
        })
    };
    // B waits and gets it on expiry (the waits run on the same clock, 10 s of it, so only
    // the expiry can serve them); B never acks either. A lease ends a millisecond after the
    // visibility timeout, as a delay does.
    let reader_b = wait_in_line();
    waiters(&b, 1).await;
    // a millisecond short: a look at the queue would expire the lease (and count it)
    clock.advance(300);
    let look = b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    assert!(look.is_empty(), "expired early");
    let expiries = || {
        b.metrics
            .lease_expiries
            .get_or_create(&TopicLabel { topic: "t".into() })
            .get()
    };
    assert_eq!(expiries(), 0, "expired early");
    clock.advance(1);
    let got_b = served(reader_b).await;
    assert_eq!(got_b.len(), 1, "B was not served on A's lease expiry");
    // C waits: B's lease (created inside a dispatch) must re-arm the timer
    let reader_c = wait_in_line();
    waiters(&b, 1).await;
    clock.advance(301);
    let got_c = served(reader_c).await;
    assert_eq!(got_c.len(), 1, "C was not served on B's lease expiry");
    assert_eq!(got_c[0].delivery_count, 3);
    assert_eq!(expiries(), 2);
    b.shutdown().await;
}

/// Issue 11, bug 5: a queue consume stops at MAX_READ_BYTES of payload (as replay does), and
/// always returns at least one message; what it did not lease stays deliverable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_consume_is_capped_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(CreateTopic {
        settings: TopicPatch {
            partitions: Some(1),
            max_message_bytes: Some(2 << 20),
            ..Default::default()
        },
        ..create("t", 1)
    })
    .await
    .unwrap();
    let big = ProduceMessage {
        payload: Bytes::from(vec![b'x'; 1 << 20]),
        ..Default::default()
    };
    b.produce("t", vec![big; 10]).await.unwrap();
    let got = b.consume("t", None, 100, Duration::ZERO).await.unwrap();
    // the read stops once the reply weight reaches the cap (the last message may carry it
    // past): a 1 MiB payload weighs ~1.33 MiB (text may be escaped or base64 in the reply)
    let w = got[0].record.reply_weight();
    assert!(w > 1 << 20);
    let per_reply = MAX_READ_BYTES.div_ceil(w);
    assert_eq!(got.len(), per_reply);
    let rest = b.consume("t", None, 100, Duration::ZERO).await.unwrap();
    assert_eq!(rest.len(), per_reply);
    let mut seen = got.len() + rest.len();
    while seen < 10 {
        seen += b
            .consume("t", None, 100, Duration::ZERO)
            .await
            .unwrap()
            .len();
    }
    // headers count: one byte of payload with 1 MiB of headers is a ~1 MiB record
    let headed = ProduceMessage {
        payload: Bytes::from_static(b"1"),
        headers: (0..64)
            .map(|i| (format!("h{i}"), Bytes::from(vec![1u8; 16 * 1024])))
            .collect(),
        ..Default::default()
    };
    b.produce("t", vec![headed; 20]).await.unwrap();
    let mut seen = 0;
    while seen < 20 {
        let got = b.consume("t", None, 100, Duration::ZERO).await.unwrap();
        assert!(!got.is_empty());
        assert!(
            got.len() < 5,
            "headers were not counted: {} in one reply",
            got.len()
        );
        seen += got.len();
    }
    b.shutdown().await;
}

/// A record that cannot be read (a damaged frame in a sealed segment) stops its partition's
/// queue there and says so: the records before it are delivered, then a consume with nothing
/// else to give answers the storage error instead of passing for an empty queue, and the
/// other partitions are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_is_reported_not_taken_for_an_empty_queue() {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut cfg = BrokerConfig::new(dir.path());
        cfg.log.segment_max_bytes = 16 * 1024;
        cfg
    };
    let open = async || {
        Broker::open(
            config(),
            Arc::new(SystemClock),
            Arc::new(CoreMetrics::default()),
        )
        .await
        .unwrap()
    };
    let b = open().await;
    let mut topic = create("t", 2);
    topic.settings.max_in_flight_per_partition = Some(10);
    b.create_topic(topic).await.unwrap();
    let big = ProduceMessage {
        partition: Some(1),
        payload: Bytes::from(vec![b'x'; 1000]),
        ..Default::default()
    };
    for _ in 0..40 {
        b.produce("t", vec![big.clone()]).await.unwrap();
    }
    assert!(b.sealed_segments("t", 1).await.unwrap().len() >= 2);
    b.shutdown().await;
    drop(b);
    // a flipped bit in the payload of partition 1's record 10 (frames of 1034 bytes)
    let topic_dir = std::fs::read_dir(dir.path().join("topics"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    let seg = topic_dir.join("p00001").join(format!("{:020}.log", 0));
    let mut data = std::fs::read(&seg).unwrap();
    data[10 * 1034 + 500] ^= 8;
    std::fs::write(&seg, &data).unwrap();

    let b = open().await;
    // 10 in flight at most: the queue stops short of the damage until one is acked
    let got = b.consume("t", Some(1), 100, Duration::ZERO).await.unwrap();
    let offsets: Vec<u64> = got.iter().map(|d| d.record.offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<_>>());
    // a reader already waiting when an ack lets the queue reach the damage is told at once
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.consume("t", None, 1, Duration::from_secs(60)).await }
    });
    eventually("the reader never got in line", || {
        b.topic_info("t").unwrap().waiters == 1
    })
    .await;
    b.settle("t", &got[0].receipt_handle, AckAction::Ack)
        .await
        .unwrap();
    let e = served(waiting).await.unwrap_err();
    assert!(
        matches!(e, BrokerError::Storage(LogError::Corrupt { .. })),
        "{e}"
    );
    for pinned in [Some(1), None] {
        let e = b.consume("t", pinned, 1, Duration::ZERO).await.unwrap_err();
        assert!(
            matches!(e, BrokerError::Storage(LogError::Corrupt { .. })),
            "{e}"
        );
    }
    // a waiting reader is told at once too, not left waiting out its wait
    let e = b
        .consume("t", Some(1), 1, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(e, BrokerError::Storage(_)), "{e}");
    // the other partition is served, and the damage reported again once it is empty
    b.produce("t", vec![to_partition(0)]).await.unwrap();
    let got = b.consume("t", None, 10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].partition, 0);
    assert!(b.consume("t", None, 10, Duration::ZERO).await.is_err());
    b.shutdown().await;
}

/// A link restored from the archive keeps its epoch, starts each cursor at what the restored
/// parent partition holds (never above it: new records would be skipped; never below it:
/// unreadable), copies records produced afterwards, and survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_link_starts_at_the_parents_restored_tail_and_keeps_copying() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    let meta = |name: &str, id: u64, partitions: u32| {
        let config = TopicConfig {
            partitions,
            ..TopicConfig::default()
        };
        TopicMeta::new(id, name, 1, config)
    };
    b.restore_topic(meta("p", 0x11, 2), &[5, 7]).await.unwrap();
    b.restore_topic(meta("c", 0x21, 1), &[3]).await.unwrap();
    let link = ParentLink {
        parent: "p".into(),
        parent_id: 0x11,
        delay_ms: 0,
        epoch: 0xabc,
        starts: Vec::new(),
        floor: None,
    };
    let wrong = ParentLink {
        parent_id: 0x99,
        ..link.clone()
    };
    assert!(matches!(
        b.restore_link("c", wrong, &[]).await,
        Err(BrokerError::FanoutConflict(_))
    ));
    // 2 is below partition 0's restored start, 100 above partition 1's
    let used = b.restore_link("c", link.clone(), &[2, 100]).await.unwrap();
    assert_eq!(used, vec![5, 7]);
    assert_eq!(b.topic_meta("c").unwrap().parent, Some(link.clone()));
    assert!(matches!(
        b.restore_link("c", link.clone(), &[]).await,
        Err(BrokerError::FanoutConflict(_))
    ));
    let mut m = msg("after");
    m.partition = Some(1);
    let r = b.produce("p", vec![m]).await.unwrap();
    assert_eq!(
        r[0].offset, 7,
        "the parent continues after its archived offsets"
    );
    let got = b
        .consume("c", None, 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got[0].record.payload, "after");
    assert_eq!(got[0].record.offset, 3);
    b.settle("c", &got[0].receipt_handle, AckAction::Ack)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut pos = b.fanout_positions();
        pos.sort();
        if pos == vec![("c".to_string(), 0, 5), ("c".to_string(), 1, 8)] {
            break;
        }
        assert!(Instant::now() < deadline, "{pos:?}");
        tokio::task::yield_now().await;
    }
    b.shutdown().await;
    drop(b);
    // after a restart the link and its cursors resume
    let b = open(dir.path()).await;
    assert_eq!(b.topic_meta("c").unwrap().parent, Some(link));
    let mut m = msg("later");
    m.partition = Some(0);
    b.produce("p", vec![m]).await.unwrap();
    let got = b
        .consume("c", None, 10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record.payload, "later");
    b.shutdown().await;
}

/// Every background task of the broker (topic timers, maintenance, fan-out cursors) runs
/// under its supervisor, and shutdown awaits them all: none outlives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_background_task_running() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("parent", 2)).await.unwrap();
    b.create_topic(create("child", 1)).await.unwrap();
    b.attach_child("parent", "child", 0, LinkStart::Earliest)
        .await
        .unwrap();
    b.produce("parent", vec![msg("copied")]).await.unwrap();
    eventually("the cursor never copied", || {
        b.topic_info("child").unwrap().partitions[0].log.next_offset == 1
    })
    .await;
    assert_eq!(
        b.running_tasks(),
        vec![("fanout_cursor", 2), ("maintenance", 1), ("topic_timer", 2)]
    );
    b.shutdown().await;
    assert_eq!(b.running_tasks(), vec![]);
    assert!(b.metrics.tasks.failed().is_empty());
}

/// A broker task that panics is named, counted and reported (the server's /readyz answers
/// 503 on it), and the rest of the broker keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_broker_task_is_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (b, clock) = open_manual(BrokerConfig::new(dir.path())).await;
    b.create_topic(CreateTopic {
        settings: TopicPatch {
            visibility_timeout_ms: Some(100),
            ..Default::default()
        },
        ..create("t", 1)
    })
    .await
    .unwrap();
    // the test-only hook: a task of the broker's own supervisor that panics
    assert!(
        b.tasks
            .spawn("injected_fault", |_| async { panic!("injected") })
    );
    eventually("the panic was not recorded", || {
        !b.metrics.tasks.failed().is_empty()
    })
    .await;
    assert_eq!(b.metrics.tasks.failed(), vec!["injected_fault"]);
    assert_eq!(b.metrics.tasks.panics("injected_fault"), 1);
    // the topic's timer still runs: a lease expires and is served again
    b.produce("t", vec![msg("m")]).await.unwrap();
    assert_eq!(
        b.consume("t", None, 1, Duration::ZERO).await.unwrap().len(),
        1
    );
    let b1 = b.clone();
    let again = tokio::spawn(async move { b1.consume("t", None, 1, Duration::from_secs(5)).await });
    waiters(&b, 1).await;
    clock.advance(101);
    assert_eq!(served(again).await.unwrap()[0].delivery_count, 2);
    b.shutdown().await;
    assert_eq!(b.running_tasks(), vec![]);
}

/// Review of issue 12: a topic restored from the archive takes its name from the bucket, and
/// that name becomes a directory: one that is no valid topic name is refused before anything
/// is made on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_topic_with_an_invalid_name_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let b = open(&data).await;
    let meta = TopicMeta::new(0x11, "../escaped", 1, TopicConfig::default());
    let e = b.restore_topic(meta, &[5]).await.unwrap_err();
    assert!(matches!(e, BrokerError::InvalidField(_)), "{e:?}");
    assert!(!data.join("escaped.0000000000000011").exists());
    assert!(b.catalog().is_empty());
    b.shutdown().await;
}

/// A dispatch that finds the line empty because another pass holds the only waiter out of it
/// must not strand a message: the pass that gives the waiter back goes again. Before, the
/// waiter in this test got nothing until its 10 s wait ran out, with the message ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_a_waiter_held_by_another_pass_is_not_stranded() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    let topic = b.topic("t").unwrap();
    // the next pass that finds nothing for a waiter stops there until released
    let (paused_tx, paused) = oneshot::channel();
    let (resume, resume_rx) = oneshot::channel();
    *topic.test_pause.lock() = Some((paused_tx, resume_rx));
    let b2 = b.clone();
    let consumer = tokio::spawn(async move {
        let started = Instant::now();
        let got = b2
            .consume("t", None, 1, Duration::from_secs(10))
            .await
            .unwrap();
        (got, started.elapsed())
    });
    // the consumer joined the line and its own dispatch pass holds it, having found nothing
    paused.await.unwrap();
    assert!(topic.waiters.lock().is_empty(), "the waiter is held");
    // this produce's dispatch finds the line empty and leaves
    b.produce("t", vec![msg("m")]).await.unwrap();
    resume.send(()).unwrap();
    let (got, took) = consumer.await.unwrap();
    assert_eq!(got.len(), 1, "the waiter got nothing for {took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    b.shutdown().await;
}

/// A long-poll whose caller gives up after a dispatcher served it (a client gone, a cancelled
/// call from another cluster member) gives the messages back at once: they are not leased to
/// nobody until the visibility timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_dropped_after_it_was_served_gives_its_messages_back() {
    use std::future::Future as _;
    use std::task::Poll;
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    let reader = b.consume("t", None, 1, Duration::from_secs(600));
    let mut reader = Box::pin(reader);
    // polled until it waits in the line
    while b.topic_info("t").unwrap().waiters == 0 {
        std::future::poll_fn(|cx| {
            assert!(reader.as_mut().poll(cx).is_pending());
            Poll::Ready(())
        })
        .await;
        tokio::task::yield_now().await;
    }
    // served (the produce hands the message to the waiting reader), never polled again
    b.produce("t", vec![msg("m")]).await.unwrap();
    assert_eq!(b.topic_info("t").unwrap().partitions[0].queue.in_flight, 1);
    drop(reader);
    let got = b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1, "the message is deliverable again at once");
    assert_eq!(got[0].record.payload, Bytes::from("m"));
    b.shutdown().await;
}

/// A link made at offsets gathered for one incarnation of the parent is refused once the
/// parent is another incarnation (a re-created parent's records would be skipped up to the
/// old one's tails), and made with those offsets otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_at_another_incarnations_offsets_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    let old = b.create_topic(create("p", 2)).await.unwrap();
    b.create_topic(create("c", 1)).await.unwrap();
    b.delete_topic("p").await.unwrap();
    let new = b.create_topic(create("p", 2)).await.unwrap();
    let stale = LinkStart::At {
        parent_id: old.id,
        starts: vec![100, 100],
    };
    assert!(matches!(
        b.attach_child("p", "c", 0, stale).await,
        Err(BrokerError::ClusterUnavailable(_))
    ));
    assert!(b.topic_meta("c").unwrap().parent.is_none());
    let wrong_count = LinkStart::At {
        parent_id: new.id,
        starts: vec![0],
    };
    assert!(b.attach_child("p", "c", 0, wrong_count).await.is_err());
    for i in 0..3 {
        b.produce("p", vec![to_partition(i % 2)]).await.unwrap();
    }
    let at = LinkStart::At {
        parent_id: new.id,
        starts: vec![1, 0],
    };
    b.attach_child("p", "c", 0, at).await.unwrap();
    assert_eq!(
        b.topic_meta("c").unwrap().parent.unwrap().starts,
        vec![1, 0]
    );
    // partition 0 from offset 1 (one record), partition 1 from 0 (one record)
    eventually("two records copied", || {
        b.topic_info("c").unwrap().partitions[0].log.next_offset == 2
    })
    .await;
}

/// A batch settle answers each handle as settling it alone would, in the batch's order,
/// whatever partitions, duplicates, foreign or broken handles it mixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_many_answers_each_handle_as_settling_it_alone_would() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 3)).await.unwrap();
    b.create_topic(create("u", 1)).await.unwrap();
    for i in 0..9 {
        b.produce("t", vec![msg(&format!("m{i}"))]).await.unwrap();
    }
    b.produce("u", vec![msg("other")]).await.unwrap();
    let got = b.consume("t", None, 9, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 9);
    let partitions: std::collections::BTreeSet<u32> = got.iter().map(|d| d.partition).collect();
    assert_eq!(partitions.len(), 3, "the messages span every partition");
    let other = b.consume("u", None, 1, Duration::ZERO).await.unwrap();
    let h = |i: usize| got[i].receipt_handle.clone();
    let batch = vec![
        h(4),
        "not a handle".to_owned(),
        h(0),
        other[0].receipt_handle.clone(),
        h(4), // settled a moment ago, in this same batch
        h(8),
        h(2),
    ];
    let results = b.settle_many("t", &batch, AckAction::Ack).await;
    assert_eq!(results.len(), batch.len());
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(matches!(results[1], Err(BrokerError::HandleMalformed(_))));
    assert!(results[2].is_ok(), "{:?}", results[2]);
    assert!(matches!(results[3], Err(BrokerError::LeaseGone(_))));
    assert!(matches!(results[4], Err(BrokerError::LeaseGone(_))));
    assert!(results[5].is_ok() && results[6].is_ok(), "{results:?}");
    // extend then nack the rest in one batch each; only those come back
    let rest: Vec<String> = [1, 3, 5, 6, 7].iter().map(|&i| h(i)).collect();
    let extended = b.settle_many("t", &rest, AckAction::Extend).await;
    assert!(extended.iter().all(Result::is_ok), "{extended:?}");
    let nacked = b.settle_many("t", &rest, AckAction::Nack).await;
    assert!(nacked.iter().all(Result::is_ok), "{nacked:?}");
    let again = b.consume("t", None, 9, Duration::ZERO).await.unwrap();
    let mut offsets: Vec<(u32, u64)> = again
        .iter()
        .map(|d| (d.partition, d.record.offset))
        .collect();
    offsets.sort_unstable();
    let mut want: Vec<(u32, u64)> = [1, 3, 5, 6, 7]
        .iter()
        .map(|&i| (got[i].partition, got[i].record.offset))
        .collect();
    want.sort_unstable();
    assert_eq!(offsets, want);
    // a topic that is gone: each well-formed handle says so, a broken one is still broken
    let gone = b
        .settle_many("nope", &[h(1), "x".to_owned()], AckAction::Ack)
        .await;
    assert!(matches!(gone[0], Err(BrokerError::TopicNotFound(_))));
    assert!(matches!(gone[1], Err(BrokerError::HandleMalformed(_))));
    b.shutdown().await;
}

/// A reader may ask for leases of its own length, and a lease may be renewed for a length of
/// its own (SQS's per-receive VisibilityTimeout and ChangeMessageVisibility), waiting or not;
/// lengths beyond the topic limits are clamped to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_a_readers_own_length() {
    let dir = tempfile::tempdir().unwrap();
    let (b, clock) = open_manual(BrokerConfig::new(dir.path())).await;
    b.create_topic(create("t", 1)).await.unwrap();
    b.produce("t", vec![msg("a")]).await.unwrap();
    let now = clock.now_ms();
    let got = b
        .consume_for("t", None, 1, Duration::ZERO, Some(5_000))
        .await
        .unwrap();
    // (a lease ends one millisecond after its length: see the queue's lease_deadline)
    assert_eq!(got[0].lease_deadline_ms, now + 5_000 + 1);
    // renewed for 60 s from now, not the topic's 30 s
    clock.advance(1_000);
    b.settle("t", &got[0].receipt_handle, AckAction::ExtendFor(60_000))
        .await
        .unwrap();
    clock.advance(40_000);
    assert!(
        b.consume("t", None, 1, Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "still leased 41 s in"
    );
    clock.advance(20_002);
    let again = b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    assert_eq!(again.len(), 1, "back once the 60 s lease ended");
    b.settle("t", &again[0].receipt_handle, AckAction::Ack)
        .await
        .unwrap();
    // a waiting reader's lease has the length it asked for too; 0 is the shortest lease
    let b1 = b.clone();
    let reader = tokio::spawn(async move {
        b1.consume_for("t", None, 1, Duration::from_secs(5), Some(0))
            .await
    });
    waiters(&b, 1).await;
    b.produce("t", vec![msg("b")]).await.unwrap();
    let got = served(reader).await.unwrap();
    let at = clock.now_ms();
    assert_eq!(
        got[0].lease_deadline_ms,
        at + crate::topic::MIN_VISIBILITY_MS + 1
    );
    // a lease shortened wakes a waiting reader when it ends, not when the longer one would
    b.settle("t", &got[0].receipt_handle, AckAction::ExtendFor(60_000))
        .await
        .unwrap();
    b.settle("t", &got[0].receipt_handle, AckAction::ExtendFor(1_000))
        .await
        .unwrap();
    let b1 = b.clone();
    let reader =
        tokio::spawn(async move { b1.consume("t", None, 1, Duration::from_secs(30)).await });
    waiters(&b, 1).await;
    clock.advance(1_002);
    let back = served(reader).await.unwrap();
    assert_eq!(back.len(), 1, "served when the shortened lease ended");
    let long = b
        .consume_for("t", None, 1, Duration::ZERO, Some(i64::MAX))
        .await
        .unwrap();
    assert!(long.is_empty(), "leased again just now");
    b.shutdown().await;
}
