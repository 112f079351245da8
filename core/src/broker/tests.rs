use super::*;
use crate::clock::{Clock, SystemClock};
use std::time::Instant;

async fn open(dir: &Path) -> Arc<Broker> {
    let mut cfg = BrokerConfig::new(dir);
    cfg.ack_flush_interval_ms = 10;
    Broker::open(cfg, Arc::new(SystemClock), Arc::new(CoreMetrics::default()))
        .await
        .unwrap()
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
    let b = open(dir.path()).await;
    b.create_topic(create("t", 3)).await.unwrap();
    let b1 = b.clone();
    let first = tokio::spawn(async move { b1.consume("t", None, 1, Duration::from_secs(5)).await });
    // make sure the first reader is in line before the second
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.topic_info("t").unwrap().waiters < 1 {
        assert!(Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    let b2 = b.clone();
    let second =
        tokio::spawn(async move { b2.consume("t", None, 1, Duration::from_millis(300)).await });
    while b.topic_info("t").unwrap().waiters < 2 {
        assert!(Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    let t0 = Instant::now();
    b.produce("t", vec![msg("hello")]).await.unwrap();
    let got = first.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(
        second.await.unwrap().unwrap().is_empty(),
        "second reader got nothing"
    );
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_message_is_never_early() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    let mut m = msg("later");
    m.delay_ms = Some(300);
    b.produce("t", vec![m, msg("now")]).await.unwrap();
    let got = b.consume("t", None, 10, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].record.payload, "now");
    let got = b
        .consume("t", None, 10, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(got[0].record.payload, "later");
    let now = SystemClock.now_ms();
    assert!(
        now >= got[0].record.due_ms(),
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
    let b = Broker::open(cfg, Arc::new(SystemClock), Arc::new(CoreMetrics::default()))
        .await
        .unwrap();
    let mut req = create("t", 1);
    req.settings.retention_ms = Some(1000);
    b.create_topic(req).await.unwrap();
    b.produce("t", vec![msg("old")]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut was_closed = false;
    loop {
        let p = &b.topic_info("t").unwrap().partitions[0];
        was_closed |= !p.open;
        if p.log.oldest_offset == 1 && p.log.next_offset == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expired data of an idle partition was never deleted: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        was_closed,
        "the partition was closed for idleness before retention ran"
    );
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
