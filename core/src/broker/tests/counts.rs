//! Delivery counts: kept across clean and unclean restarts, journaled between snapshots,
//! never lowered by an old journal, bounded and counted past their bound.

use super::*;

/// A broker whose maintenance never runs on its own (the tests call `persist_queues`).
async fn open_without_maintenance(dir: &Path) -> Arc<Broker> {
    let mut cfg = BrokerConfig::new(dir);
    cfg.ack_flush_interval_ms = 3_600_000;
    Broker::open(cfg, Arc::new(SystemClock), Arc::new(CoreMetrics::default()))
        .await
        .unwrap()
}

/// Consumes the one message of `t` and nacks it; returns its delivery count.
async fn deliver_and_nack(b: &Broker) -> u32 {
    let got = b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 1);
    b.settle("t", &got[0].receipt_handle, AckAction::Nack)
        .await
        .unwrap();
    got[0].delivery_count
}

fn partition_files(b: &Broker) -> Vec<String> {
    let dir = b.topic("t").unwrap().partition(0).unwrap().dir.clone();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".log") && !n.ends_with(".idx"))
        .collect();
    names.sort();
    names
}

/// Issue 12: delivery counts survive a restart; a clean stop leaves them in the snapshot
/// alone (no journal left behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_counts_survive_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    b.produce("t", vec![msg("poison")]).await.unwrap();
    assert_eq!(deliver_and_nack(&b).await, 1);
    assert_eq!(deliver_and_nack(&b).await, 2);
    b.shutdown().await;
    assert_eq!(partition_files(&b), vec!["queue.state"]);
    drop(b);
    let b = open(dir.path()).await;
    assert_eq!(deliver_and_nack(&b).await, 3);
    b.shutdown().await;
}

/// Issue 12: a stop without shutdown and without any snapshot since the deliveries (a
/// process crash): the deliveries journal alone brings the counts back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_counts_survive_an_unclean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let b = open_without_maintenance(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    b.produce("t", vec![msg("poison")]).await.unwrap();
    assert_eq!(deliver_and_nack(&b).await, 1);
    assert_eq!(deliver_and_nack(&b).await, 2);
    assert_eq!(
        partition_files(&b),
        vec!["deliveries.00000000000000000000.journal"],
        "no snapshot: only the journal has the counts"
    );
    b.crash().await;
    drop(b);
    let b = open_without_maintenance(dir.path()).await;
    assert_eq!(deliver_and_nack(&b).await, 3);
    // and again, over a journal from the first life and one from the second
    b.crash().await;
    drop(b);
    let b = open_without_maintenance(dir.path()).await;
    assert_eq!(deliver_and_nack(&b).await, 4);
    // the first snapshot takes the journals in and deletes them
    b.persist_queues().await;
    assert_eq!(partition_files(&b), vec!["queue.state"]);
    b.crash().await;
    drop(b);
    let b = open_without_maintenance(dir.path()).await;
    assert_eq!(deliver_and_nack(&b).await, 5);
    b.shutdown().await;
}

/// Issue 12: a crash after a snapshot is durable but before the journals it covers are
/// deleted replays them over it; older (lower) counts never lower a newer one, and an acked
/// message stays acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_journal_never_lowers_a_snapshot_count() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    b.produce("t", vec![msg("a"), msg("b"), msg("c")])
        .await
        .unwrap();
    for _ in 0..4 {
        let got = b.consume("t", Some(0), 1, Duration::ZERO).await.unwrap();
        assert_eq!(got[0].record.offset, 0);
        b.settle("t", &got[0].receipt_handle, AckAction::Nack)
            .await
            .unwrap();
    }
    let got = b.consume("t", Some(0), 3, Duration::ZERO).await.unwrap();
    let counts: Vec<(u64, u32)> = got
        .iter()
        .map(|d| (d.record.offset, d.delivery_count))
        .collect();
    assert_eq!(counts, vec![(0, 5), (1, 1), (2, 1)]);
    b.settle("t", &got[2].receipt_handle, AckAction::Ack)
        .await
        .unwrap();
    let pdir = b.topic("t").unwrap().partition(0).unwrap().dir.clone();
    b.shutdown().await;
    drop(b);
    // a journal left from before the snapshot: 0 and 2 at lower or settled counts, 1 higher
    let mut old = journal::DeliveryJournal::open(&pdir, |_, _| {}).unwrap();
    old.append(&[(0, 2), (1, 3), (2, 9)]).unwrap();
    drop(old);
    let b = open(dir.path()).await;
    let got = b.consume("t", Some(0), 3, Duration::ZERO).await.unwrap();
    let counts: Vec<(u64, u32)> = got
        .iter()
        .map(|d| (d.record.offset, d.delivery_count))
        .collect();
    assert_eq!(
        counts,
        vec![(0, 6), (1, 4)],
        "max of both, the acked one gone"
    );
    b.shutdown().await;
}

/// Issue 12: between snapshots the journal is only synced; past its size bound it asks for
/// a snapshot (which lets it go), and an idle close asks for one too (no descriptor kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_is_synced_and_bounded_by_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let b = open_without_maintenance(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    b.produce("t", vec![msg("m")]).await.unwrap();
    let part = b.topic("t").unwrap().partition(0).unwrap();
    b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    assert!(part.persist_due(), "journal bytes to sync");
    b.persist_queues().await;
    assert!(!part.persist_due());
    assert_eq!(
        partition_files(&b),
        vec!["deliveries.00000000000000000000.journal"],
        "a consume alone writes no snapshot"
    );
    // a journal past its bound: counts of offsets the log does not have, ignored at open
    let entries: Vec<(u64, u32)> = (1000..1000 + (journal::JOURNAL_SNAPSHOT_BYTES / 16))
        .map(|o| (o, 1))
        .collect();
    part.journal_deliveries(&entries);
    b.persist_queues().await;
    assert_eq!(partition_files(&b), vec!["queue.state"]);
    // an idle close: the next pass writes a snapshot, closing the journal's file
    b.produce("t", vec![msg("n")]).await.unwrap();
    b.consume("t", None, 1, Duration::ZERO).await.unwrap();
    assert!(part.close_if_unused().await);
    b.persist_queues().await;
    assert_eq!(partition_files(&b), vec!["queue.state"]);
    b.shutdown().await;
    drop(b);
    let b = open_without_maintenance(dir.path()).await;
    let got = b.consume("t", None, 2, Duration::ZERO).await.unwrap();
    let counts: Vec<u32> = got.iter().map(|d| d.delivery_count).collect();
    assert_eq!(counts, vec![2, 2]);
    b.shutdown().await;
}

/// Issue 12: past the bound on persisted counts, snapshots keep the lowest offsets' counts
/// and say so in a metric; the others count from 1 again after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_past_the_snapshot_bound_are_counted_in_a_metric() {
    let dir = tempfile::tempdir().unwrap();
    let b = open_without_maintenance(dir.path()).await;
    b.create_topic(create("t", 1)).await.unwrap();
    b.produce("t", vec![msg("a"), msg("b"), msg("c")])
        .await
        .unwrap();
    let part = b.topic("t").unwrap().partition(0).unwrap();
    part.queue.lock().set_max_counts(2);
    let got = b.consume("t", None, 3, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 3);
    b.settle("t", &got[2].receipt_handle, AckAction::Nack)
        .await
        .unwrap();
    let truncated = || {
        b.metrics
            .delivery_counts_truncated
            .get_or_create(&TopicLabel { topic: "t".into() })
            .get()
    };
    b.shutdown().await;
    assert_eq!(truncated(), 1);
    drop(b);
    let b = open_without_maintenance(dir.path()).await;
    let got = b.consume("t", None, 3, Duration::ZERO).await.unwrap();
    let counts: Vec<u32> = got.iter().map(|d| d.delivery_count).collect();
    assert_eq!(counts, vec![2, 2, 1]);
    b.shutdown().await;
}
