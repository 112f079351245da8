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
use crate::clock::ManualClock;

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

async fn run_case(seed: u64) {
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let disk = FaultDisk::new();
    let metrics = Arc::new(CoreMetrics::default());
    let clock = ManualClock::new(1_000);
    let wal_cfg = WalConfig {
        rotate_bytes: 1024 + rng.below(16 * 1024),
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
    let mut logs = Vec::new();
    for i in 0..nlogs {
        let (log, _) = PartitionLog::open(
            &root.join(format!("p{i}")),
            cfg.clone(),
            clock.clone(),
            metrics.clone(),
        )
        .unwrap();
        logs.push(Arc::new(log));
    }
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
        let (log, _) = PartitionLog::open(
            &root.join(format!("p{i}")),
            cfg.clone(),
            clock.clone(),
            metrics.clone(),
        )
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
        let (log, _) = PartitionLog::open(
            &root.join(format!("p{i}")),
            cfg,
            clock.clone(),
            metrics.clone(),
        )
        .unwrap();
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

/// An `fdatasync` error on the WAL: nothing of that round is acknowledged, every later
/// append fails (the log does not pretend the disk is fine), and after a restart every
/// acknowledged record is there.
#[tokio::test]
async fn a_failed_wal_fsync_acknowledges_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let disk = FaultDisk::new();
    let metrics = Arc::new(CoreMetrics::default());
    let (wal, _) = Wal::open_faulty(
        &root.join("wal"),
        root,
        WalConfig::default(),
        metrics.clone(),
        disk.clone(),
    )
    .unwrap();
    let cfg = LogConfig {
        wal: Some(wal.clone()),
        ..LogConfig::default()
    };
    let clock = ManualClock::new(1_000);
    let (log, _) =
        PartitionLog::open(&root.join("p0"), cfg, clock.clone(), metrics.clone()).unwrap();
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
    log.close().await;
    drop(log);
    let w = wal.clone();
    tokio::task::spawn_blocking(move || w.shutdown())
        .await
        .unwrap();
    drop(wal);
    disk.write_crash_images(&mut Rng::new(7));
    let (wal, _) = Wal::open(
        &root.join("wal"),
        root,
        WalConfig::default(),
        metrics.clone(),
    )
    .unwrap();
    let cfg = LogConfig {
        wal: Some(wal.clone()),
        ..LogConfig::default()
    };
    let (log, _) = PartitionLog::open(&root.join("p0"), cfg, clock, metrics).unwrap();
    let got = log.read(0, 10, usize::MAX).unwrap();
    assert_eq!(got[0].payload, "one");
    log.close().await;
    tokio::task::spawn_blocking(move || wal.shutdown())
        .await
        .unwrap();
}
