use super::*;
use crate::clock::{ManualClock, SharedClock};
use bytes::Bytes;
use std::time::Instant;

fn rec(s: &str) -> NewRecord {
    NewRecord {
        payload: Bytes::from(s.to_owned()),
        ..Default::default()
    }
}

fn open_with(dir: &Path, cfg: LogConfig, clock: SharedClock) -> (PartitionLog, RecoveryReport) {
    PartitionLog::open(dir, cfg, clock, Arc::new(CoreMetrics::default())).unwrap()
}

fn small_segments() -> LogConfig {
    LogConfig {
        segment_max_bytes: 1024,
        segment_max_age_ms: 3_600_000,
        tail_cache: TailBudget::new(0),
        wal: None,
    }
}

#[tokio::test]
async fn append_read_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    {
        let (log, _) = open_with(dir.path(), small_segments(), clock.clone());
        for i in 0..100 {
            let a = log.append(vec![rec(&format!("m{i}"))]).await.unwrap();
            assert_eq!(a.base_offset, i);
            clock.advance(1);
        }
        assert!(log.stats().segments > 3, "size roll happened");
        log.close().await;
    }
    let (log, report) = open_with(dir.path(), small_segments(), clock.clone());
    assert!(report.torn_tail_bytes.is_none());
    assert_eq!(log.next_offset(), 100);
    let all = log.read(0, 1000, usize::MAX).unwrap();
    assert_eq!(all.len(), 100);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r.offset, i as u64);
        assert_eq!(r.payload, format!("m{i}"));
        assert_eq!(r.timestamp_ms, 1_000 + i as i64);
    }
    let mid = log.read(57, 5, usize::MAX).unwrap();
    assert_eq!(
        mid.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![57, 58, 59, 60, 61]
    );
    assert_eq!(log.offset_for_time(1_050).unwrap(), 50);
    assert_eq!(log.offset_for_time(0).unwrap(), 0);
    assert_eq!(log.offset_for_time(9_999).unwrap(), 100);
    // reopening scanned only the active segment: sealed ones have index files
    assert!(
        report.scanned_bytes < 1024 + 200,
        "scanned {}",
        report.scanned_bytes
    );
    log.close().await;
}

#[tokio::test]
async fn concurrent_appends_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(CoreMetrics::default());
    let (log, _) = PartitionLog::open(
        dir.path(),
        LogConfig::default(),
        ManualClock::new(5),
        metrics.clone(),
    )
    .unwrap();
    let log = Arc::new(log);
    let mut tasks = Vec::new();
    for t in 0..64 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                log.append(vec![rec(&format!("{t}-{i}"))]).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(log.next_offset(), 64 * 20);
    let fsyncs = metrics.fsyncs.get();
    assert!(
        fsyncs < 64 * 20,
        "group commit batched: {fsyncs} fsyncs for 1280 appends"
    );
    // offsets are dense and unique
    let all = log.read(0, 10_000, usize::MAX).unwrap();
    assert_eq!(all.len(), 1280);
    log.close().await;
}

#[tokio::test]
async fn batch_append_is_one_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(CoreMetrics::default());
    let (log, _) = PartitionLog::open(
        dir.path(),
        LogConfig::default(),
        ManualClock::new(5),
        metrics.clone(),
    )
    .unwrap();
    let a = log
        .append((0..500).map(|i| rec(&i.to_string())).collect())
        .await
        .unwrap();
    assert_eq!((a.base_offset, a.count), (0, 500));
    assert_eq!(metrics.fsyncs.get(), 1);
    log.close().await;
}

#[tokio::test]
async fn torn_tail_is_truncated_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1);
    {
        let (log, _) = open_with(dir.path(), LogConfig::default(), clock.clone());
        for i in 0..10 {
            log.append(vec![rec(&format!("m{i}"))]).await.unwrap();
        }
        log.close().await;
    }
    let path = segment::segment_path(dir.path(), 0);
    let len = std::fs::metadata(&path).unwrap().len();
    // a torn write: half a frame
    let mut half = Vec::new();
    rec("torn").encode(10, 2, &mut half);
    half.truncate(half.len() / 2);
    let f = OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut &f, &half).unwrap();
    drop(f);
    let metrics = Arc::new(CoreMetrics::default());
    let (log, report) =
        PartitionLog::open(dir.path(), LogConfig::default(), clock, metrics.clone()).unwrap();
    assert_eq!(report.torn_tail_bytes, Some(half.len() as u64));
    assert_eq!(metrics.torn_tails_truncated.get(), 1);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    assert_eq!(log.next_offset(), 10);
    // appends continue at the right offset
    assert_eq!(
        log.append(vec![rec("after")]).await.unwrap().base_offset,
        10
    );
    log.close().await;
}

/// Review of issue 12: a segment name that is a link to an endless device is refused with
/// its path, never read (the open would not end, and the node would never become ready).
#[tokio::test]
async fn a_segment_that_is_not_a_regular_file_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", segment::segment_path(dir.path(), 0)).unwrap();
    let err = PartitionLog::open(
        dir.path(),
        LogConfig::default(),
        ManualClock::new(1),
        Arc::new(CoreMetrics::default()),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("00000000000000000000.log"), "{msg}");
    assert!(msg.contains("not a regular file"), "{msg}");
}

#[tokio::test]
async fn corruption_in_the_middle_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1);
    {
        let (log, _) = open_with(dir.path(), LogConfig::default(), clock.clone());
        for i in 0..10 {
            log.append(vec![rec(&format!("message-{i}"))])
                .await
                .unwrap();
        }
        log.close().await;
    }
    let path = segment::segment_path(dir.path(), 0);
    let mut data = std::fs::read(&path).unwrap();
    data[40] ^= 0x55;
    std::fs::write(&path, &data).unwrap();
    let err = PartitionLog::open(
        dir.path(),
        LogConfig::default(),
        clock,
        Arc::new(CoreMetrics::default()),
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("00000000000000000000.log"), "{msg}");
    assert!(msg.contains("at byte 0"), "{msg}");
}

#[tokio::test]
async fn retention_deletes_only_whole_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let (log, _) = open_with(dir.path(), small_segments(), clock.clone());
    for i in 0..60 {
        log.append(vec![rec(&format!("payload-{i:04}"))])
            .await
            .unwrap();
    }
    let before = log.stats();
    assert!(before.segments >= 3);
    // nothing is old enough yet
    assert_eq!(log.apply_retention(10_000, 0, None), (0, false));
    clock.advance(20_000);
    let (deleted, active_expired) = log.apply_retention(10_000, 0, None);
    assert_eq!(deleted, before.segments - 1, "every sealed segment went");
    assert!(active_expired, "the quiet active segment is past retention");
    let oldest = log.oldest_offset();
    assert!(oldest > 0 && oldest < 60);
    assert!(matches!(
        log.read(0, 1, usize::MAX),
        Err(LogError::Truncated { .. })
    ));
    log.roll().await.unwrap();
    assert_eq!(log.apply_retention(10_000, 0, None).0, 1);
    assert_eq!(log.oldest_offset(), 60);
    assert_eq!(log.next_offset(), 60);
    assert_eq!(log.append(vec![rec("x")]).await.unwrap().base_offset, 60);
    log.close().await;
    // the truncated log reopens at the right place
    let (log, _) = open_with(dir.path(), small_segments(), clock);
    assert_eq!((log.oldest_offset(), log.next_offset()), (60, 61));
    log.close().await;
}

#[tokio::test]
async fn retention_never_deletes_what_the_archive_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let (log, _) = open_with(dir.path(), small_segments(), clock.clone());
    for i in 0..60 {
        log.append(vec![rec(&format!("payload-{i:04}"))])
            .await
            .unwrap();
    }
    let sealed = log.sealed_segments();
    assert!(sealed.len() >= 2);
    assert_eq!(sealed[0].base, 0);
    let first = log.read_segment(sealed[0].base).unwrap();
    assert_eq!(first.len() as u64, sealed[0].end);
    assert_eq!(first.last().unwrap().offset, sealed[0].end - 1);
    clock.advance(20_000);
    // nothing archived: everything stays, however old
    assert_eq!(log.apply_retention(10_000, 0, Some(0)).0, 0);
    // the first segment archived: only it goes
    assert_eq!(log.apply_retention(10_000, 0, Some(sealed[0].end)).0, 1);
    assert_eq!(log.oldest_offset(), sealed[1].base);
    // an archive mark inside a segment does not delete that segment
    assert_eq!(log.apply_retention(10_000, 0, Some(sealed[1].end - 1)).0, 0);
    log.close().await;
}

#[tokio::test]
async fn retention_by_size_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1);
    let (log, _) = open_with(dir.path(), small_segments(), clock);
    for i in 0..100 {
        log.append(vec![rec(&format!("payload-{i:04}"))])
            .await
            .unwrap();
    }
    let (deleted, _) = log.apply_retention(0, 2048, None);
    assert!(deleted > 0);
    assert!(log.stats().bytes <= 2048 + 1024);
    assert_eq!(log.next_offset(), 100);
    log.close().await;
}

#[tokio::test]
async fn age_roll_seals_a_quiet_segment() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let cfg = LogConfig {
        segment_max_age_ms: 50,
        ..LogConfig::default()
    };
    let (log, _) = open_with(dir.path(), cfg, clock.clone());
    log.append(vec![rec("a")]).await.unwrap();
    // the writer sleeps on the clock until the segment's age is reached
    clock.advance(49);
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(log.stats().segments, 1, "rolled before its age");
    clock.advance(1);
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while log.stats().segments < 2 {
        assert!(Instant::now() < deadline, "segment never rolled by age");
        tokio::task::yield_now().await;
    }
    log.close().await;
}

#[tokio::test]
async fn timestamps_never_go_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(10_000);
    let (log, _) = open_with(dir.path(), LogConfig::default(), clock.clone());
    log.append(vec![rec("a")]).await.unwrap();
    clock.set(5_000); // wall clock stepped back
    let a = log.append(vec![rec("b")]).await.unwrap();
    assert_eq!(a.timestamp_ms, 10_000);
    log.close().await;
}

#[tokio::test]
async fn missing_index_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1);
    {
        let (log, _) = open_with(dir.path(), small_segments(), clock.clone());
        for i in 0..50 {
            log.append(vec![rec(&format!("payload-{i:04}"))])
                .await
                .unwrap();
        }
        log.close().await;
    }
    std::fs::remove_file(segment::index_path(dir.path(), 0)).unwrap();
    let (log, report) = open_with(dir.path(), small_segments(), clock);
    assert!(report.scanned_bytes > 0);
    assert_eq!(log.read(0, 100, usize::MAX).unwrap().len(), 50);
    assert!(segment::index_path(dir.path(), 0).exists());
    log.close().await;
}

/// Issue 11, bug 5: a roll that cannot create the next segment must not leave the active
/// segment flagged sealed (the archive could then take, and retention delete, a segment that
/// is still growing). The segment stays active and unsealed, appends go on, and a later roll
/// works once the fault is gone; nothing is lost across a reopen.
#[tokio::test]
async fn a_failed_roll_leaves_the_segment_active_and_unsealed() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let (log, _) = open_with(dir.path(), small_segments(), clock.clone());
    log.append(vec![rec("a"), rec("b")]).await.unwrap();
    // fault injection: a directory where the next segment file must be created
    let next = segment::segment_path(dir.path(), 2);
    std::fs::create_dir(&next).unwrap();
    assert!(log.roll().await.is_err());
    assert!(
        log.sealed_segments().is_empty(),
        "a failed roll sealed the active segment"
    );
    assert_eq!(log.is_poisoned(), None);
    log.append(vec![rec("c")]).await.unwrap();
    assert!(log.sealed_segments().is_empty());
    std::fs::remove_dir(&next).unwrap();
    log.roll().await.unwrap();
    let sealed = log.sealed_segments();
    assert_eq!(sealed.len(), 1);
    assert_eq!((sealed[0].base, sealed[0].end), (0, 3));
    log.append(vec![rec("d")]).await.unwrap();
    log.close().await;
    drop(log);
    let (log, _) = open_with(dir.path(), small_segments(), clock);
    let all = log.read(0, 10, usize::MAX).unwrap();
    let payloads: Vec<_> = all.iter().map(|r| r.payload.clone()).collect();
    assert_eq!(payloads, ["a", "b", "c", "d"]);
}

/// Issue 11, bug 6: the tail cache is one budget for the node (many partitions do not
/// multiply it), a closed log gives its share back, and cached records never keep the
/// producer's (much larger) request buffer alive.
#[tokio::test]
async fn the_tail_cache_is_one_node_budget_of_copies() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let budget = TailBudget::new(64 * 1024);
    let cfg = LogConfig {
        tail_cache: budget.clone(),
        ..LogConfig::default()
    };
    let request = Bytes::from(vec![b'r'; 1 << 20]);
    let range = request.as_ptr() as usize..request.as_ptr() as usize + request.len();
    let mut logs = Vec::new();
    for p in 0..8 {
        let (log, _) = open_with(
            &dir.path().join(format!("p{p}")),
            cfg.clone(),
            clock.clone(),
        );
        for i in 0..200 {
            let at = (p * 200 + i) * 256;
            let r = NewRecord {
                key: Some(request.slice(at..at + 8)),
                payload: request.slice(at..at + 256),
                ..Default::default()
            };
            log.append(vec![r]).await.unwrap();
            assert!(budget.used() <= 64 * 1024, "over budget: {}", budget.used());
        }
        logs.push(log);
    }
    assert!(
        budget.used() > 32 * 1024,
        "the cache is used: {}",
        budget.used()
    );
    // the busiest partition caches despite the quiet ones that filled the budget first
    // (a cache hit hands out the same record twice; a disk read decodes a new one) ...
    let last = logs[7].read(199, 1, usize::MAX).unwrap();
    let again = logs[7].read(199, 1, usize::MAX).unwrap();
    assert!(
        Arc::ptr_eq(&last[0], &again[0]),
        "the newest record is not cached"
    );
    // ... as a copy, never a slice of the producer's request buffer
    assert_eq!(last[0].payload.len(), 256);
    let ptr = last[0].payload.as_ptr() as usize;
    assert!(
        !range.contains(&ptr),
        "a cached payload is a slice of the request"
    );
    assert!(!range.contains(&(last[0].key.as_ref().unwrap().as_ptr() as usize)));
    drop(request);
    for log in logs {
        log.close().await;
    }
    assert_eq!(budget.used(), 0, "closed logs keep budget");
}

/// A log writer that panics poisons its log: appends fail as after a failed fsync (not with
/// a bare `Closed`), and the node reports not ready, naming the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_writer_poisons_the_log_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(CoreMetrics::default());
    let (log, _) = PartitionLog::open(
        dir.path(),
        LogConfig::default(),
        ManualClock::new(1),
        metrics.clone(),
    )
    .unwrap();
    log.append(vec![rec("before")]).await.unwrap();
    log.shared.panic_next_group.store(true, Ordering::SeqCst);
    assert!(log.append(vec![rec("lost")]).await.is_err());
    assert!(matches!(
        log.append(vec![rec("after")]).await,
        Err(LogError::Poisoned(_))
    ));
    // (recorded once the panic has unwound, just after the replies were dropped)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while metrics.tasks.failed().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the panic was not reported"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(metrics.tasks.failed(), vec!["log_writer"]);
    assert_eq!(metrics.tasks.panics("log_writer"), 1);
    // what was durable before stays readable
    assert_eq!(log.read(0, 10, usize::MAX).unwrap().len(), 1);
    log.close().await;
}

fn committed(offset: u64, payload: &str) -> Record {
    Record {
        offset,
        timestamp_ms: 1_000 + offset as i64,
        delay_ms: 0,
        key: offset
            .is_multiple_of(2)
            .then(|| Bytes::from(format!("k{offset}"))),
        headers: vec![("h".into(), Bytes::from_static(b"v"))],
        payload: Bytes::from(payload.to_owned()),
    }
}

/// A log rebuilt from the archive: sealed segments written from records, then a gap (the
/// lost tail) before the new log's start. It opens only while the gap is recorded; reads
/// across the gap go on at its end; appends continue after it.
#[tokio::test]
async fn a_recorded_gap_is_accepted_and_an_unrecorded_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(5_000);
    let first: Vec<Record> = (10..15).map(|o| committed(o, &format!("m{o}"))).collect();
    let second: Vec<Record> = (15..20).map(|o| committed(o, &format!("m{o}"))).collect();
    assert_eq!(segment::write_sealed(dir.path(), 10, &first).unwrap(), 15);
    assert_eq!(segment::write_sealed(dir.path(), 15, &second).unwrap(), 20);
    // records out of line are refused
    let holes = vec![committed(30, "a"), committed(32, "b")];
    assert!(segment::write_sealed(dir.path(), 30, &holes).is_err());
    std::fs::remove_file(segment::segment_path(dir.path(), 30)).ok();
    // a record no frame can hold (from a damaged archive object) is refused, not truncated
    let mut huge = committed(40, "h");
    huge.headers = vec![(String::new(), Bytes::new()); usize::from(u16::MAX) + 1];
    assert!(segment::write_sealed(dir.path(), 40, &[huge]).is_err());
    std::fs::remove_file(segment::segment_path(dir.path(), 40)).ok();
    crate::fsutil::open_or_create_private(&segment::segment_path(dir.path(), 25)).unwrap();
    let refused = PartitionLog::open(
        dir.path(),
        small_segments(),
        clock.clone(),
        Arc::new(CoreMetrics::default()),
    );
    assert!(
        matches!(
            refused,
            Err(LogError::Recovery(RecoveryError::Discontinuity {
                end: 20,
                next_base: 25,
                ..
            }))
        ),
        "{:?}",
        refused.err()
    );
    segment::write_gaps(dir.path(), &[(20, 25)]).unwrap();
    {
        let (log, _) = open_with(dir.path(), small_segments(), clock.clone());
        assert_eq!((log.oldest_offset(), log.next_offset()), (10, 25));
        let got = log.read(12, 100, usize::MAX).unwrap();
        let back: Vec<Record> = got.iter().map(|r| (**r).clone()).collect();
        assert_eq!(
            back,
            first[2..]
                .iter()
                .chain(&second)
                .cloned()
                .collect::<Vec<_>>()
        );
        // a read from inside the gap goes on where records are again
        assert!(log.read(21, 10, usize::MAX).unwrap().is_empty());
        let a = log.append(vec![rec("after")]).await.unwrap();
        assert_eq!(a.base_offset, 25);
        let got = log.read(21, 10, usize::MAX).unwrap();
        assert_eq!(got.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![25]);
        log.close().await;
    }
    let (log, _) = open_with(dir.path(), small_segments(), clock.clone());
    assert_eq!(log.next_offset(), 26);
    assert_eq!(log.read(19, 10, usize::MAX).unwrap().len(), 2);
    log.close().await;
    // a damaged gaps file accepts no gap
    let path = dir.path().join(segment::GAPS_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[17] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    assert!(
        PartitionLog::open(
            dir.path(),
            small_segments(),
            clock,
            Arc::new(CoreMetrics::default())
        )
        .is_err()
    );
}

/// One-record reads in order (a queue consuming its backlog) go on from the last read's
/// cursor instead of reading the file again, and every read returns exactly what a fresh
/// read from the index would: across segment ends, after a jump, beside another reader,
/// with frames larger than a cursor keeps, and after retention took the cursor's segment.
#[tokio::test]
async fn one_record_reads_in_order_go_on_from_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let cfg = LogConfig {
        segment_max_bytes: 64 * 1024,
        ..small_segments()
    };
    let (log, _) = open_with(dir.path(), cfg, clock.clone());
    let payload = |i: u64| -> String {
        // mostly small; every 50th larger than a cursor's buffer
        let n = if i % 50 == 49 {
            70_000
        } else {
            20 + (i as usize * 7) % 300
        };
        format!("{i:06}-{}", "p".repeat(n))
    };
    let n = 600u64;
    for i in 0..n {
        log.append(vec![rec(&payload(i))]).await.unwrap();
    }
    assert!(log.stats().segments > 3, "several segments");
    let check = |r: &Arc<Record>, o: u64| {
        assert_eq!(r.offset, o);
        assert_eq!(r.payload, payload(o), "offset {o}");
    };
    let hits = || log.shared.cursor_hits.load(Ordering::Relaxed);
    // in order, one at a time, with a replay reader elsewhere every 40 reads
    for o in 0..n {
        let got = log.read(o, 1, usize::MAX).unwrap();
        assert_eq!(got.len(), 1);
        check(&got[0], o);
        if o % 40 == 39 {
            let other = (o * 13) % n;
            let got = log.read(other, 3, usize::MAX).unwrap();
            for (k, r) in got.iter().enumerate() {
                check(r, other + k as u64);
            }
        }
    }
    let in_order = hits();
    assert!(
        in_order > n / 2,
        "only {in_order} of {n} in-order reads went on from the cursor"
    );
    // a jump back and forth: each read is still the record asked for
    for o in [5, 4, 300, 301, 301, 299, 0, 599] {
        let got = log.read(o, 2, usize::MAX).unwrap();
        check(&got[0], o);
        if got.len() > 1 {
            check(&got[1], o + 1);
        }
    }
    // retention takes the segment the cursor points into: the next read says so
    log.read(10, 1, usize::MAX).unwrap();
    clock.advance(100_000);
    let (deleted, _) = log.apply_retention(10_000, 0, None);
    assert!(deleted > 0);
    let oldest = log.oldest_offset();
    assert!(oldest > 11);
    assert!(matches!(
        log.read(11, 1, usize::MAX),
        Err(LogError::Truncated { .. })
    ));
    let got = log.read(oldest, 1, usize::MAX).unwrap();
    check(&got[0], oldest);
    // the node-wide count of cursors is given back when the log goes
    assert!(log.shared.cfg.tail_cache.0.cursors.load(Ordering::Relaxed) <= 1);
    let budget = log.shared.cfg.tail_cache.clone();
    log.close().await;
    drop(log);
    assert_eq!(budget.0.cursors.load(Ordering::Relaxed), 0);
}

/// At most [`MAX_READ_CURSORS`] logs keep a cursor at once; the others read as before.
#[tokio::test]
async fn read_cursors_are_bounded_node_wide() {
    let budget = TailBudget::new(0);
    let mut slots: Vec<CursorSlot> = std::iter::from_fn(|| budget.cursor_slot()).collect();
    assert_eq!(slots.len() as u64, MAX_READ_CURSORS);
    // a log opened now keeps no cursor, and reads the same
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        tail_cache: budget.clone(),
        ..small_segments()
    };
    let (log, _) = open_with(dir.path(), cfg, ManualClock::new(1));
    for i in 0..50 {
        log.append(vec![rec(&format!("m{i}"))]).await.unwrap();
    }
    for o in 0..50 {
        assert_eq!(log.read(o, 1, usize::MAX).unwrap()[0].offset, o);
    }
    assert_eq!(log.shared.cursor_hits.load(Ordering::Relaxed), 0);
    // one slot given back: the log takes it
    slots.pop();
    for o in 0..50 {
        assert_eq!(log.read(o, 1, usize::MAX).unwrap()[0].offset, o);
    }
    assert!(log.shared.cursor_hits.load(Ordering::Relaxed) > 0);
    // (a read that leaves nothing buffered keeps no cursor: the first record has more after it)
    log.read(0, 1, usize::MAX).unwrap();
    assert_eq!(budget.0.cursors.load(Ordering::Relaxed), MAX_READ_CURSORS);
    drop(slots);
    assert_eq!(budget.0.cursors.load(Ordering::Relaxed), 1);
    log.close().await;
}
