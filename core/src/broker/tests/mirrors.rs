//! A mirror's progress index: records indexed as they come, a backlog read a bounded share
//! at a time, and a child's progress told in its parent's offsets.

use super::*;

/// A broker whose topic `m` (`partitions`) mirrors a source topic, and that source.
async fn mirror_broker(dir: &Path, partitions: u32) -> (Arc<Broker>, crate::catalog::role::Source) {
    use crate::catalog::TopicRole;
    let b = open(dir).await;
    b.create_topic(create("m", partitions)).await.unwrap();
    let src = crate::catalog::role::Source {
        cluster: 0xa1,
        topic: 0xb2,
    };
    b.set_role(
        "m",
        TopicRole::default(),
        TopicRole::Mirror { epoch: 1, of: src },
    )
    .await
    .unwrap();
    (b, src)
}

/// A record for partition 0 as a link sends it: from partition 0 of `src`, at offset `o`.
fn from_origin(src: crate::catalog::role::Source, o: u64) -> ProduceMessage {
    ProduceMessage {
        partition: Some(0),
        headers: vec![(
            "narad-origin".into(),
            Bytes::from(format!("{:016x}/{:016x}/0/{o}", src.cluster, src.topic)),
        )],
        payload: Bytes::from_static(b"x"),
        ..Default::default()
    }
}

/// A mirror indexes by origin what its link brings as it takes it, so the source's progress
/// settles records without reading them back; one that comes after progress already
/// covering it (lanes ship concurrently) is settled as it comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_indexes_records_as_it_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (b, src) = mirror_broker(dir.path(), 2).await;
    let take = |offsets: std::ops::Range<u64>| {
        let b = b.clone();
        async move {
            let msgs = offsets.map(|o| from_origin(src, o)).collect();
            b.produce("m", msgs).await.unwrap();
        }
    };
    let progress = |frontier| PartitionProgress {
        frontier,
        acked: vec![],
        children: vec![],
        children_returned: vec![],
    };
    let settled = || {
        b.metrics()
            .mirror_settled
            .get_or_create(&TopicLabel { topic: "m".into() })
            .get()
    };
    // before any progress there is no index: the first progress reads them back
    take(0..10).await;
    let n = b
        .take_mirror_progress("m", src, 0, progress(0), None)
        .await
        .unwrap();
    assert_eq!((n, b.mirror_read_back("m").await), (0, 10));
    // from then on records are indexed as they come, and settled without a read
    take(10..20).await;
    let n = b
        .take_mirror_progress("m", src, 0, progress(15), None)
        .await
        .unwrap();
    assert_eq!((n, b.mirror_read_back("m").await), (15, 10));
    // 25 comes before 20..25 (another lane): progress to 25 settles what is held
    take(25..26).await;
    let n = b
        .take_mirror_progress("m", src, 0, progress(25), None)
        .await
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(settled(), 20);
    // and the late ones are settled as they come, read back never
    take(20..25).await;
    assert_eq!(settled(), 25);
    assert_eq!(b.mirror_read_back("m").await, 10);
    // records naming another source are not this mirror's to settle
    let other = from_origin(
        crate::catalog::role::Source {
            cluster: 0xcc,
            topic: 0xdd,
        },
        3,
    );
    b.produce("m", vec![other]).await.unwrap();
    let n = b
        .take_mirror_progress("m", src, 0, progress(26), None)
        .await
        .unwrap();
    assert_eq!((n, b.mirror_read_back("m").await), (1, 10));
    assert_eq!(b.topic_info("m").unwrap().partitions[0].queue.unacked, 1);
    // a batch that came while the index was busy (a progress message held it) waits beside
    // it and is indexed by its next holder, so nothing is read back
    let index = b
        .mirror_indexes
        .lock()
        .get(&b.topic("m").unwrap().id())
        .cloned();
    let busy = index.as_ref().unwrap().lock().await;
    take(26..31).await;
    drop(busy);
    take(31..36).await;
    let n = b
        .take_mirror_progress("m", src, 0, progress(36), None)
        .await
        .unwrap();
    assert_eq!((n, b.mirror_read_back("m").await), (10, 10));
    assert_eq!(b.topic_info("m").unwrap().partitions[0].queue.unacked, 1);
    // a record the link shipped twice (a chunk sent again) is settled in both copies
    take(36..38).await;
    take(36..38).await;
    let n = b
        .take_mirror_progress("m", src, 0, progress(38), None)
        .await
        .unwrap();
    assert_eq!(n, 4);
    assert_eq!(b.topic_info("m").unwrap().partitions[0].queue.unacked, 1);
}

/// A mirror's backlog not indexed as it came (say after a restart) is read back a bounded
/// share per progress message, so a link's request costs bounded time; the next ones read
/// the rest, and a promote settles all that is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirrors_backlog_is_read_a_bounded_share_per_progress() {
    let dir = tempfile::tempdir().unwrap();
    let (b, src) = mirror_broker(dir.path(), 1).await;
    let total = progress::READ_PER_PROGRESS + 1000;
    for start in (0..total).step_by(1000) {
        let msgs = (start..total.min(start + 1000))
            .map(|o| from_origin(src, o))
            .collect();
        b.produce("m", msgs).await.unwrap();
    }
    let progress = |frontier| PartitionProgress {
        frontier,
        acked: vec![],
        children: vec![],
        children_returned: vec![],
    };
    let n = b
        .take_mirror_progress("m", src, 0, progress(total), None)
        .await
        .unwrap();
    assert_eq!(n, progress::READ_PER_PROGRESS);
    assert_eq!(b.mirror_read_back("m").await, progress::READ_PER_PROGRESS);
    // the promote's last settle reads what is left
    assert_eq!(b.settle_mirror_progress("m").await.unwrap(), 1000);
    let info = b.topic_info("m").unwrap();
    assert_eq!(
        info.partitions[0].queue.unacked, 0,
        "{:?}",
        info.partitions[0]
    );
}

/// What a fan-out child's consumers processed, told in the parent's offsets (a mirror of the
/// parent carries it): as they process the child, every parent partition's figure follows,
/// whatever the other parent partitions' copies in the same child partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_progress_is_told_in_its_parents_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let b = open(dir.path()).await;
    b.create_topic(create("p", 3)).await.unwrap();
    b.create_topic(create("c", 2)).await.unwrap();
    b.attach_child("p", "c", 0, LinkStart::Latest)
        .await
        .unwrap();
    let keyed = |i: u32| ProduceMessage {
        key: Some(Bytes::from(format!("k{}", i % 20))),
        ..msg(&format!("m{i}"))
    };
    for round in 0..20u32 {
        b.produce("p", (round * 30..(round + 1) * 30).map(keyed).collect())
            .await
            .unwrap();
    }
    eventually("the child has every copy", || {
        b.children("p").unwrap()[0].lag_messages == 0
    })
    .await;
    let told = |b: &Broker| -> Vec<u64> {
        (0..3)
            .map(|p| {
                let c = b.children_consumed("p", p);
                assert_eq!(c.len(), 1, "{c:?}");
                c[0].1
            })
            .collect()
    };
    assert_eq!(told(&b), vec![0, 0, 0]);
    // the child's consumers process half of it
    let mut done = 0;
    while done < 300 {
        let got = b.consume("c", None, 10, Duration::ZERO).await.unwrap();
        for d in &got {
            b.settle("c", &d.receipt_handle, AckAction::Ack)
                .await
                .unwrap();
        }
        done += got.len();
    }
    let half = told(&b);
    let ends: Vec<u64> = (0..3)
        .map(|p| b.topic_info("p").unwrap().partitions[p].log.next_offset)
        .collect();
    // (part way into every parent partition: how far depends on which child partition the
    // consumes drained first, so no tighter bound holds; each parent partition's first
    // copies were consumed, and its last were not)
    for (h, e) in half.iter().zip(&ends) {
        assert!(*h > 0 && *h < *e, "told {half:?} of {ends:?}");
    }
    // all of it
    loop {
        let got = b.consume("c", None, 100, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            break;
        }
        for d in &got {
            b.settle("c", &d.receipt_handle, AckAction::Ack)
                .await
                .unwrap();
        }
    }
    assert_eq!(told(&b), ends);
    b.shutdown().await;
}

/// A shipper that holds every ship to remote 5 until released, counting how many run at
/// once; ships to any other remote go at once.
struct HeldShipper {
    running: AtomicU64,
    most: AtomicU64,
    shipped: AtomicU64,
    release: tokio::sync::Semaphore,
}

impl HeldShipper {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            running: AtomicU64::new(0),
            most: AtomicU64::new(0),
            shipped: AtomicU64::new(0),
            release: tokio::sync::Semaphore::new(0),
        })
    }
}

struct Held(Arc<HeldShipper>);

impl RemoteShipper for Held {
    fn ship(
        &self,
        batch: ShipBatch,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ShipFailure>> + Send>> {
        let s = self.0.clone();
        Box::pin(async move {
            if batch.child.remote_id != 5 {
                s.shipped
                    .fetch_add(batch.records.len() as u64, Ordering::SeqCst);
                return Ok(());
            }
            let now = s.running.fetch_add(1, Ordering::SeqCst) + 1;
            s.most.fetch_max(now, Ordering::SeqCst);
            s.release.acquire().await.unwrap().forget();
            s.shipped
                .fetch_add(batch.records.len() as u64, Ordering::SeqCst);
            s.running.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

/// Remote `name` (id `id`) in `b`'s catalog.
async fn add_remote(b: &Arc<Broker>, id: u64, name: &str) {
    let remote = crate::catalog::RemoteMeta {
        id,
        name: name.into(),
        url: format!("https://{name}.example.com/"),
        username: "mirror".into(),
        ca_pem: None,
        credential: crate::catalog::SealedCredential {
            key_id: "00112233".into(),
            nonce: "bm9uY2U=".into(),
            ciphertext: "c2VhbGVk".into(),
        },
        carry_users: false,
        version: 1,
        created_at_ms: 0,
        updated_at_ms: 0,
    };
    b.put_remote(remote, None).await.unwrap();
}

/// Remote child `name` of topic `t` (two partitions) through remote `remote`.
async fn attach(b: &Arc<Broker>, remote: &str, remote_id: u64, name: &str, target: u64) {
    let parent_id = b.topic_meta("t").unwrap().id;
    b.attach_remote(crate::catalog::RemoteChild {
        name: name.into(),
        parent: "t".into(),
        parent_id,
        remote: remote.into(),
        remote_id,
        remote_topic: name.into(),
        target_id: target,
        lanes: 1,
        epoch: 1,
        starts: vec![0, 0],
        paused: false,
        created_at_ms: 0,
        skips: Vec::new(),
    })
    .await
    .unwrap();
}

/// A broker whose topic `t` holds 10 records in each of its two partitions, its remote
/// children shipping through `shipper`, with room for `slabs` slabs of remote records.
async fn shipping_broker(
    dir: &Path,
    slabs: usize,
    shipper: &Arc<HeldShipper>,
) -> (Arc<Broker>, Arc<CoreMetrics>) {
    let mut cfg = BrokerConfig::new(dir);
    cfg.ack_flush_interval_ms = 10;
    cfg.mirror_progress_interval_ms = 0;
    cfg.remote_memory_bytes = slabs * (4 << 20);
    let metrics = Arc::new(CoreMetrics::default());
    let b = Broker::open(cfg, Arc::new(SystemClock), metrics.clone())
        .await
        .unwrap();
    b.set_remote_shipper(Arc::new(Held(shipper.clone())));
    b.create_topic(create("t", 2)).await.unwrap();
    for p in 0..2u32 {
        let batch = (0..10)
            .map(|i| ProduceMessage {
                partition: Some(p),
                ..msg(&format!("m{p}-{i}"))
            })
            .collect();
        b.produce("t", batch).await.unwrap();
    }
    (b, metrics)
}

/// A remote that hangs holds only its share of the budget: the other remote's children
/// ship all their records meanwhile.
#[tokio::test]
async fn a_hung_remote_holds_only_its_share_of_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let shipper = HeldShipper::new();
    let (b, _metrics) = shipping_broker(dir.path(), 2, &shipper).await;
    add_remote(&b, 5, "hung").await;
    add_remote(&b, 6, "fine").await;
    attach(&b, "hung", 5, "stuck", 0xa1).await;
    attach(&b, "fine", 6, "goes", 0xa2).await;
    attach(&b, "fine", 6, "goes-too", 0xa3).await;
    eventually("the hung remote holds its slab", || {
        shipper.running.load(Ordering::SeqCst) == 1
    })
    .await;
    eventually("the other remote's children shipped everything", || {
        shipper.shipped.load(Ordering::SeqCst) == 40
    })
    .await;
    assert_eq!(shipper.running.load(Ordering::SeqCst), 1, "still hung");
    shipper.release.add_permits(1_000);
    eventually("the hung one's records too", || {
        shipper.shipped.load(Ordering::SeqCst) == 60
    })
    .await;
    b.shutdown().await;
}

/// Remote children's cursors hold their records within the node's budget: with room for
/// one slab, four cursors (two children of a two-partition topic) ship one at a time, each
/// in turn, and every record goes.
#[tokio::test]
async fn remote_cursors_hold_records_within_the_nodes_budget() {
    let dir = tempfile::tempdir().unwrap();
    let shipper = HeldShipper::new();
    let (b, metrics) = shipping_broker(dir.path(), 1, &shipper).await;
    add_remote(&b, 5, "q").await;
    for (name, target) in [("one", 0xa1), ("two", 0xa2)] {
        attach(&b, "q", 5, name, target).await;
    }
    // one ship holds the only slab; the other three cursors wait for it
    eventually("a ship began", || {
        shipper.running.load(Ordering::SeqCst) == 1
    })
    .await;
    eventually("the others waited for the budget", || {
        metrics.remote_slab_waits.get() >= 3
    })
    .await;
    assert_eq!(metrics.remote_slabs_held.get(), 1);
    // let them go one by one: never two at once, and all 40 copies arrive
    shipper.release.add_permits(1_000);
    eventually("every record shipped to both children", || {
        shipper.shipped.load(Ordering::SeqCst) == 40
    })
    .await;
    assert_eq!(
        shipper.most.load(Ordering::SeqCst),
        1,
        "one slab: one ship at a time"
    );
    eventually("the slabs given back", || {
        metrics.remote_slabs_held.get() == 0
    })
    .await;
    b.shutdown().await;
}
