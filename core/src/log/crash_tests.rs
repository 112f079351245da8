//! Simulated crashes under the write-ahead log: seeded cases that run appends on several
//! partitions through a model of the disk (`disk::faults`), crash or fail an `fdatasync` at
//! a random point, rewrite every file as the disk could have left it (unsynced writes kept,
//! dropped, torn at sectors, or zeros), recover, and check that every append answered `Ok`
//! is there with its bytes, at its offset, with no gap. A kill -9 test cannot look here:
//! after a process crash the page cache still holds every write.
//!
//! `NARAD_CRASH_CASES=N` runs more seeds (default 120); a failure prints its seed, and
//! `NARAD_CRASH_SEED=S` replays just that one.

use std::collections::HashMap;

use super::disk::faults::{FaultDisk, Rng};
use super::*;
use crate::clock::{ManualClock, SharedClock};

struct Acked {
    log: usize,
    offset: u64,
    payload: Bytes,
}

fn payload(rng: &mut Rng, tag: &str) -> Bytes {
    let pad = rng.below(700) as usize;
    let mut s = tag.to_owned();
    // bytes that look like a frame's magic inside a payload must not confuse recovery
    if rng.below(4) == 0 {
        s.push_str("NRDF");
    }
    s.extend(std::iter::repeat_n('x', pad));
    Bytes::from(s)
}

/// Partition `i` of a case: the log in `root/p<i>`.
fn open_log(
    root: &Path,
    i: usize,
    cfg: &LogConfig,
    clock: &Arc<ManualClock>,
    metrics: &Arc<CoreMetrics>,
) -> Result<PartitionLog, LogError> {
    let clock: SharedClock = clock.clone();
    PartitionLog::open(
        &root.join(format!("p{i}")),
        cfg.clone(),
        clock,
        metrics.clone(),
    )
    .map(|(log, _)| log)
}

async fn run_case(seed: u64) {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let disk = FaultDisk::new();
    let metrics = Arc::new(CoreMetrics::default());
    let clock = ManualClock::new(1_000);
    let wal_cfg = WalConfig {
        rotate_bytes: 1024 + rng.below(16 * 1024),
        writeback_bytes: 256 + rng.below(8 * 1024),
    };
    let (wal, _) = Wal::open_faulty(
        &root.join("wal"),
        root,
        wal_cfg.clone(),
        metrics.clone(),
        disk.clone(),
    )
    .unwrap();
    let cfg = LogConfig {
        segment_max_bytes: 512 + rng.below(8 * 1024),
        segment_max_age_ms: 3_600_000,
        tail_cache: TailBudget::new(if rng.below(2) == 0 { 0 } else { 1 << 20 }),
        wal: Some(wal.clone()),
    };
    let nlogs = 1 + rng.below(4) as usize;
    let logs: Vec<Arc<PartitionLog>> = (0..nlogs)
        .map(|i| Arc::new(open_log(root, i, &cfg, &clock, &metrics).unwrap()))
        .collect();
    // where it fails: a crash at some sync, an fsync error (the process goes on) then a
    // crash, or a crash after the workload (whatever is unsynced then is at risk)
    match rng.below(3) {
        0 => disk.crash_at_sync(1 + rng.below(80)),
        1 => disk.fail_sync(1 + rng.below(60)),
        _ => {}
    }
    let acked = Arc::new(Mutex::new(Vec::<Acked>::new()));
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let mut rng = Rng::new(seed ^ (w + 1).wrapping_mul(0xA5A5_5A5A));
        let logs = logs.clone();
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..40 {
                let li = rng.below(logs.len() as u64) as usize;
                let n = 1 + rng.below(3) as usize;
                let payloads: Vec<Bytes> = (0..n)
                    .map(|j| payload(&mut rng, &format!("w{w}-k{k}-{j}-")))
                    .collect();
                let records = payloads
                    .iter()
                    .map(|p| NewRecord {
                        payload: p.clone(),
                        ..NewRecord::default()
                    })
                    .collect();
                if let Ok(a) = logs[li].append(records).await {
                    let mut acked = acked.lock();
                    for (j, p) in payloads.into_iter().enumerate() {
                        acked.push(Acked {
                            log: li,
                            offset: a.base_offset + j as u64,
                            payload: p,
                        });
                    }
                }
                if rng.below(8) == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    disk.crash_now();
    // (a writer that panicked fails every append after it: nothing acknowledged to lose, and
    // the case would prove nothing)
    assert_eq!(
        metrics.tasks.failed(),
        Vec::<&str>::new(),
        "seed {seed}: the WAL writer panicked"
    );
    for log in &logs {
        log.close().await;
    }
    drop(logs);
    drop(cfg);
    let w = wal.clone();
    tokio::task::spawn_blocking(move || w.shutdown())
        .await
        .unwrap();
    drop(wal);
    disk.write_crash_images(&mut rng);

    // recovery, on the real disk
    let (wal, replayed) = Wal::open(&root.join("wal"), root, wal_cfg, metrics.clone())
        .unwrap_or_else(|e| {
            panic!("seed {seed}: WAL replay failed: {e}");
        });
    let cfg = LogConfig {
        segment_max_bytes: 64 * 1024,
        segment_max_age_ms: 3_600_000,
        tail_cache: TailBudget::new(0),
        wal: Some(wal.clone()),
    };
    let acked = std::mem::take(&mut *acked.lock());
    let mut counts = Vec::new();
    for i in 0..nlogs {
        let log = open_log(root, i, &cfg, &clock, &metrics)
            .unwrap_or_else(|e| panic!("seed {seed}: log {i} does not open: {e} ({replayed:?})"));
        let mut found: HashMap<u64, Bytes> = HashMap::new();
        let mut at = log.oldest_offset();
        while at < log.next_offset() {
            let got = log.read(at, 1000, usize::MAX).unwrap();
            assert!(!got.is_empty(), "seed {seed}: log {i} has a gap at {at}");
            for r in got {
                assert_eq!(r.offset, at, "seed {seed}: log {i} out of order");
                found.insert(r.offset, r.payload.clone());
                at += 1;
            }
        }
        for a in acked.iter().filter(|a| a.log == i) {
            assert_eq!(
                found.get(&a.offset),
                Some(&a.payload),
                "seed {seed}: log {i} lost acknowledged offset {} ({replayed:?})",
                a.offset
            );
        }
        // recovered logs take appends again, and a second recovery changes nothing
        log.append(vec![NewRecord {
            payload: Bytes::from_static(b"after"),
            ..NewRecord::default()
        }])
        .await
        .unwrap();
        counts.push(log.next_offset());
        log.close().await;
    }
    let w = wal.clone();
    tokio::task::spawn_blocking(move || w.shutdown())
        .await
        .unwrap();
    drop((wal, cfg));
    let (wal, again) = Wal::open(
        &root.join("wal"),
        root,
        WalConfig::default(),
        metrics.clone(),
    )
    .expect("second open");
    assert_eq!(
        again.entries, 0,
        "seed {seed}: a clean shutdown leaves no WAL"
    );
    for (i, count) in counts.into_iter().enumerate() {
        let cfg = LogConfig {
            wal: Some(wal.clone()),
            ..LogConfig::default()
        };
        let log = open_log(root, i, &cfg, &clock, &metrics).unwrap();
        assert_eq!(log.next_offset(), count, "seed {seed}: log {i} changed");
        log.close().await;
    }
    tokio::task::spawn_blocking(move || wal.shutdown())
        .await
        .unwrap();
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_appends_survive_simulated_crashes() {
    if let Some(seed) = env_u64("NARAD_CRASH_SEED") {
        run_case(seed).await;
        return;
    }
    let cases = env_u64("NARAD_CRASH_CASES").unwrap_or(120);
    for seed in 0..cases {
        run_case(seed).await;
    }
}

/// A WAL over `disk`'s model, and the log in `root/p0` appending through it.
fn open_faulty_p0(
    root: &Path,
    wal_cfg: &WalConfig,
    disk: &Arc<FaultDisk>,
    metrics: &Arc<CoreMetrics>,
) -> (Wal, PartitionLog) {
    let (wal, _) = Wal::open_faulty(
        &root.join("wal"),
        root,
        wal_cfg.clone(),
        metrics.clone(),
        disk.clone(),
    )
    .unwrap();
    let log = open_p0_with(root, &wal, metrics);
    (wal, log)
}

fn open_p0_with(root: &Path, wal: &Wal, metrics: &Arc<CoreMetrics>) -> PartitionLog {
    let cfg = LogConfig {
        wal: Some(wal.clone()),
        ..LogConfig::default()
    };
    let clock = ManualClock::new(1_000);
    PartitionLog::open(&root.join("p0"), cfg, clock, metrics.clone())
        .unwrap()
        .0
}

/// Stops `log` and `wal`, rewrites every file as the disk could have left it at a crash
/// (`seed` picks how), and opens both again on the real disk.
async fn crash_and_reopen_p0(
    root: &Path,
    (wal, log): (Wal, PartitionLog),
    wal_cfg: &WalConfig,
    disk: &FaultDisk,
    seed: u64,
    metrics: &Arc<CoreMetrics>,
) -> (Wal, PartitionLog) {
    log.close().await;
    drop(log);
    stop(wal, false).await;
    disk.write_crash_images(&mut Rng::new(seed));
    let (wal, _) = Wal::open(&root.join("wal"), root, wal_cfg.clone(), metrics.clone()).unwrap();
    let log = open_p0_with(root, &wal, metrics);
    (wal, log)
}

/// A log's close returns only once its segment files are synced and let go (the WAL writer
/// hands them to the checkpointer), so closes cannot run ahead of the syncs and pile up open
/// files beyond what `max_open_logs` bounds (a black-box review found 8,000 descriptors on a
/// node allowed 16 logs, each produce evicting a log and reopening another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logs_close_waits_for_its_segments_to_be_synced() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let disk = FaultDisk::new();
    let metrics = Arc::new(CoreMetrics::default());
    let (wal, log) = open_faulty_p0(root, &WalConfig::default(), &disk, &metrics);
    log.append(vec![NewRecord {
        payload: Bytes::from_static(b"one"),
        ..NewRecord::default()
    }])
    .await
    .unwrap();
    let segments = root.join("p0").to_string_lossy().into_owned();
    assert!(
        disk.pending_writes_of(&segments) > 0,
        "the segment is written through the WAL and not synced yet"
    );
    disk.hold_syncs_of(&segments);
    let log = Arc::new(log);
    let closing = tokio::spawn({
        let log = log.clone();
        async move { log.close().await }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while disk.held() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the closed log's segment was never synced"
        );
        tokio::task::yield_now().await;
    }
    // the writer answered the close before handing the files over, once: give such an
    // answer every chance to arrive
    for _ in 0..1000 {
        tokio::task::yield_now().await;
    }
    assert!(
        !closing.is_finished(),
        "the close returned while its segment's sync was still waiting"
    );
    disk.release_held();
    closing.await.unwrap();
    assert_eq!(disk.pending_writes_of(&segments), 0);
    drop(log);
    stop(wal, false).await;
}

/// An `fdatasync` error on the WAL: nothing of that round is acknowledged, every later
/// append fails (the log does not pretend the disk is fine), and after a restart every
/// acknowledged record is there.
#[tokio::test]
async fn a_failed_wal_fsync_acknowledges_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let disk = FaultDisk::new();
    let metrics = Arc::new(CoreMetrics::default());
    let wal_cfg = WalConfig::default();
    let (wal, log) = open_faulty_p0(root, &wal_cfg, &disk, &metrics);
    let rec = |s: &'static str| {
        vec![NewRecord {
            payload: Bytes::from_static(s.as_bytes()),
            ..NewRecord::default()
        }]
    };
    log.append(rec("one")).await.unwrap();
    disk.fail_sync(1);
    let err = log.append(rec("two")).await.unwrap_err();
    assert!(matches!(err, LogError::Poisoned(_)), "{err}");
    let err = log.append(rec("three")).await.unwrap_err();
    assert!(matches!(err, LogError::Poisoned(_)), "{err}");
    assert!(log.is_poisoned().is_some());
    assert_eq!(metrics.log_poisoned.get(), 1);
    let (wal, log) = crash_and_reopen_p0(root, (wal, log), &wal_cfg, &disk, 7, &metrics).await;
    let got = log.read(0, 10, usize::MAX).unwrap();
    assert_eq!(got[0].payload, "one");
    log.close().await;
    stop(wal, false).await;
}

/// Segment files are synced every `writeback_bytes` ahead of their checkpoint. A failed
/// writeback sync poisons the log as a failed checkpoint does (after an `fdatasync` error a
/// later sync of the same file may succeed without the pages it lost), and after a restart
/// every acknowledged record is there: the WAL files that cover them were kept.
#[tokio::test]
async fn a_failed_writeback_sync_poisons_the_log_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let disk = FaultDisk::new();
    let metrics = Arc::new(CoreMetrics::default());
    let wal_cfg = WalConfig {
        writeback_bytes: 1000,
        ..WalConfig::default()
    };
    let (wal, log) = open_faulty_p0(root, &wal_cfg, &disk, &metrics);
    let rec = |i: u64| {
        vec![NewRecord {
            payload: Bytes::from(format!("{i:04}").repeat(100)),
            ..NewRecord::default()
        }]
    };
    let mut acked = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // 400-byte records: a writeback every few appends
    while metrics.wal_writebacks.get() == 0 {
        assert!(std::time::Instant::now() < deadline, "no writeback ran");
        let i = acked.len() as u64;
        assert_eq!(log.append(rec(i)).await.unwrap().base_offset, i);
        acked.push(i);
        tokio::task::yield_now().await;
    }
    disk.fail_next_sync_of("/p0/");
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the failed writeback poisoned nothing"
        );
        let i = acked.len() as u64;
        match log.append(rec(i)).await {
            Ok(a) => {
                assert_eq!(a.base_offset, i);
                acked.push(i);
            }
            Err(LogError::Poisoned(reason)) => {
                assert!(reason.contains("writeback"), "{reason}");
                break;
            }
            Err(e) => panic!("{e}"),
        }
        tokio::task::yield_now().await;
    }
    // the segment's writes since its last good sync may all be lost
    let (wal, log) = crash_and_reopen_p0(root, (wal, log), &wal_cfg, &disk, 11, &metrics).await;
    let got = log.read(0, acked.len() + 10, usize::MAX).unwrap();
    assert!(
        got.len() >= acked.len(),
        "{} of {} acknowledged",
        got.len(),
        acked.len()
    );
    for i in &acked {
        assert_eq!(got[*i as usize].payload, rec(*i)[0].payload, "record {i}");
    }
    log.close().await;
    stop(wal, false).await;
}

fn small(wal: &Wal) -> LogConfig {
    LogConfig {
        segment_max_bytes: 1 << 30,
        wal: Some(wal.clone()),
        ..LogConfig::default()
    }
}

fn open_wal(root: &Path, rotate_bytes: u64) -> Result<(Wal, WalReplay), LogError> {
    Wal::open(
        &root.join("wal"),
        root,
        WalConfig {
            rotate_bytes,
            ..WalConfig::default()
        },
        Arc::new(CoreMetrics::default()),
    )
}

async fn stop(wal: Wal, abandon: bool) {
    tokio::task::spawn_blocking(move || {
        if abandon {
            wal.abandon();
        } else {
            wal.shutdown();
        }
    })
    .await
    .unwrap();
}

/// The log in `root/p0`, appending through `wal`.
fn open_p0(root: &Path, wal: &Wal) -> PartitionLog {
    let clock = ManualClock::new(1_000);
    let metrics = Arc::new(CoreMetrics::default());
    PartitionLog::open(&root.join("p0"), small(wal), clock, metrics)
        .unwrap()
        .0
}

/// Appends `n` records of `size` bytes to the log in `root/p0`, returns their payloads.
async fn fill(root: &Path, wal: &Wal, tag: &str, n: usize, size: usize) -> Vec<Bytes> {
    let log = open_p0(root, wal);
    let mut out = Vec::new();
    for i in 0..n {
        let mut p = format!("{tag}-{i}-").into_bytes();
        p.resize(size, b'.');
        let p = Bytes::from(p);
        log.append(vec![NewRecord {
            payload: p.clone(),
            ..NewRecord::default()
        }])
        .await
        .unwrap();
        out.push(p);
    }
    log.close().await;
    out
}

async fn read_all(root: &Path, wal: &Wal) -> Vec<Bytes> {
    let log = open_p0(root, wal);
    let mut out = Vec::new();
    while (out.len() as u64) < log.next_offset() {
        let got = log.read(out.len() as u64, 1000, usize::MAX).unwrap();
        out.extend(got.into_iter().map(|r| r.payload.clone()));
    }
    log.close().await;
    out
}

/// A WAL file started again after a clean shutdown (a recycled spare, holding entries of its
/// earlier uses) must never replay those old entries after a crash: here they would write a
/// deleted partition's records over the new one's. (The review of the first WAL lost
/// acknowledged records through old entries of a recycled file.)
#[tokio::test]
async fn old_entries_of_a_recycled_file_never_replay() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let rotate = 64 * 1024;
    // run 1: enough for a spare; clean stop
    let (wal, _) = open_wal(root, rotate).unwrap();
    fill(root, &wal, "one", 40, 1024).await;
    stop(wal, false).await;
    // run 2: past a rotation (files recycled with entries in them); clean stop
    let (wal, _) = open_wal(root, rotate).unwrap();
    fill(root, &wal, "two", 150, 1024).await;
    stop(wal, false).await;
    // the partition is deleted; a new one in its place gets other records, then "kill -9"
    std::fs::remove_dir_all(root.join("p0")).unwrap();
    let (wal, _) = open_wal(root, rotate).unwrap();
    let acked = fill(root, &wal, "new", 150, 1024).await;
    stop(wal, true).await;
    // replay: only the new records
    let (wal, replayed) = open_wal(root, rotate).unwrap();
    let got = read_all(root, &wal).await;
    assert_eq!(got.len(), acked.len(), "{replayed:?}");
    assert!(
        got == acked,
        "old records replayed over new ones ({replayed:?})"
    );
    stop(wal, false).await;
}

/// The newest WAL file, after a crash, and its path.
fn wal_file(root: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    files.pop().expect("a WAL file")
}

/// Damage inside the WAL (a valid entry after a bad one) refuses the start with the file and
/// position; a WAL cut short loses nothing the segments still hold.
#[tokio::test]
async fn a_damaged_wal_is_refused_and_a_short_one_cuts_nothing() {
    for damage in ["flip", "truncate"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let (wal, _) = open_wal(root, 64 << 20).unwrap();
        let acked = fill(root, &wal, "x", 50, 200).await;
        stop(wal, true).await;
        let path = wal_file(root);
        let mut data = std::fs::read(&path).unwrap();
        let used = data.iter().rposition(|&b| b != 0).unwrap() + 1;
        match damage {
            "flip" => data[used / 2] ^= 0x40,
            _ => data.truncate(used / 2),
        }
        std::fs::write(&path, &data).unwrap();
        match (damage, open_wal(root, 64 << 20)) {
            ("flip", Err(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("write-ahead log entry"), "{msg}");
            }
            ("flip", Ok(_)) => panic!("a damaged WAL was replayed"),
            (_, Ok((wal, _))) => {
                assert!(read_all(root, &wal).await == acked, "records lost");
                stop(wal, false).await;
            }
            (_, Err(e)) => panic!("a WAL cut short refused the start: {e}"),
        }
    }
}

/// Replay never writes through a symbolic link, and never uses a file number that would
/// overflow.
#[tokio::test]
async fn replay_refuses_a_symlinked_partition_and_ignores_huge_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    let (wal, _) = open_wal(&root, 64 << 20).unwrap();
    fill(&root, &wal, "x", 3, 100).await;
    stop(wal, true).await;
    // the partition directory becomes a link to somewhere else
    std::fs::rename(root.join("p0"), &outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("p0")).unwrap();
    let before = std::fs::read(outside.join("00000000000000000000.log")).unwrap();
    let err = open_wal(&root, 64 << 20).unwrap_err().to_string();
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(
        std::fs::read(outside.join("00000000000000000000.log")).unwrap(),
        before
    );
    // a file named with the largest numbers is not ours: ignored, and no overflow
    std::fs::remove_file(root.join("p0")).unwrap();
    for seq in [u64::MAX - 1, u64::MAX] {
        std::fs::write(root.join("wal").join(format!("{seq:020}.wal")), b"x").unwrap();
    }
    let (wal, replayed) = open_wal(&root, 64 << 20).unwrap();
    assert!(
        replayed.skipped > 0 && replayed.repaired == 0,
        "{replayed:?}"
    );
    let ours: Vec<String> = std::fs::read_dir(root.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".wal") && n < &format!("{:020}.wal", 1000))
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "the new file continues the small numbers: {ours:?}"
    );
    stop(wal, false).await;
}
