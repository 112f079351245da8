//! `narad-bench tiering`: what the archive costs and how fast it reads, on this machine.
//!
//! 1. Parquet conversion throughput per core (MB of segment in per second) and the compression
//!    ratio, on JSON payloads shaped like application events.
//! 2. Replay throughput from the archive vs from local segments, same records, both through
//!    the library paths the broker uses (the HTTP layer is the same for both and left out).
//! 3. Time to find the first message at or after a timestamp in an archived partition of the
//!    given size (1 GiB by default), through the manifest and Parquet statistics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_core::clock::ManualClock;
use narad_core::log::{LogConfig, PartitionLog};
use narad_core::metrics::CoreMetrics;
use narad_core::record::{NewRecord, Record};
use narad_replay::{ArchiveRead, ArchiveReader};
use narad_tiering::archive::{Archive, ArchiveSettings, ArchivedSegment, PartitionManifest};
use narad_tiering::format;
use narad_tiering::tierer::upload;
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct TieringBenchConfig {
    /// Raw (segment) bytes of the archived partition.
    pub partition_bytes: u64,
    /// Raw bytes per segment (the broker's `segment_max_bytes`).
    pub segment_bytes: u64,
    /// Where the archive and the local log go (a directory; removed afterwards).
    pub dir: std::path::PathBuf,
    /// Records read by each replay measurement.
    pub replay_records: usize,
    pub lookups: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct TieringBenchResult {
    pub records: u64,
    pub segment_bytes_total: u64,
    pub parquet_bytes_total: u64,
    pub compression_ratio: f64,
    pub encode_mb_per_s_per_core: f64,
    pub replay_local_records_per_s: f64,
    pub replay_archive_records_per_s: f64,
    pub archive_vs_local: f64,
    pub time_lookup_ms_p50: f64,
    pub time_lookup_ms_max: f64,
    pub partition_gib: f64,
    /// S3 PUT requests per GB of segment data archived (one per object plus one manifest
    /// update; multipart objects count their parts).
    pub puts_per_gb: f64,
}

/// An application event of ~230 bytes of JSON: the kind of payload a queue carries.
fn event(i: u64) -> Bytes {
    const KINDS: [&str; 4] = ["order_created", "order_paid", "order_shipped", "refund"];
    Bytes::from(format!(
        "{{\"event_id\":\"evt-{i:012}\",\"kind\":\"{}\",\"user\":\"user-{}\",\"amount_cents\":{},\"currency\":\"EUR\",\"items\":[{{\"sku\":\"SKU-{}\",\"qty\":{}}}],\"region\":\"eu-west-{}\",\"ts\":{}}}",
        KINDS[(i % 4) as usize],
        i % 50_000,
        (i * 7919) % 100_000,
        i % 997,
        1 + i % 5,
        1 + i % 3,
        1_764_400_000_000u64 + i * 3
    ))
}

fn record(i: u64, ts: i64) -> Record {
    Record {
        offset: i,
        timestamp_ms: ts,
        delay_ms: 0,
        key: Some(Bytes::from(format!("user-{}", i % 50_000))),
        headers: Vec::new(),
        payload: event(i),
    }
}

pub async fn run(
    cfg: TieringBenchConfig,
) -> Result<TieringBenchResult, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(&cfg.dir)?;
    let archive = Archive::open(&ArchiveSettings {
        url: format!(
            "file://{}",
            std::path::absolute(cfg.dir.join("archive"))?.display()
        ),
        ..Default::default()
    })?;
    let base_ts = 1_764_400_000_000i64;
    // 1. build segments' worth of records, encode each (timed), upload, write the manifest
    let mut manifest = PartitionManifest::new("bench", 1, 0);
    let (mut offset, mut seg_total, mut pq_total, mut encode_time) =
        (0u64, 0u64, 0u64, Duration::ZERO);
    let mut puts = 0u64;
    while seg_total < cfg.partition_bytes {
        let first = offset;
        let mut recs = Vec::new();
        let mut bytes = 0u64;
        while bytes < cfg.segment_bytes {
            // ~300 records per millisecond of commit time
            let r = record(offset, base_ts + (offset / 300) as i64);
            bytes += r.frame_len() as u64;
            recs.push(r);
            offset += 1;
        }
        let started = Instant::now();
        let file =
            tokio::task::spawn_blocking(move || format::encode("bench", 1, 0, &recs)).await??;
        encode_time += started.elapsed();
        let last = offset - 1;
        let path = archive.segment_path("bench", 0, first, last);
        let size = file.len() as u64;
        puts += size.div_ceil(8 << 20).max(1) + 1;
        upload(archive.store.as_ref(), &path, file).await?;
        manifest.segments.push(ArchivedSegment {
            first_offset: first,
            last_offset: last,
            rows: last - first + 1,
            min_ts: base_ts + (first / 300) as i64,
            max_ts: base_ts + (last / 300) as i64,
            object_bytes: size,
            segment_bytes: bytes,
            object: narad_tiering::archive::segment_file_name(first, last),
            archived_at_ms: 0,
        });
        manifest.next_offset = offset;
        seg_total += bytes;
        pq_total += size;
    }
    archive.save_manifest(&manifest).await?;
    let records = offset;

    // 2. the same first records on a local log, then sequential replay from both
    let n = (cfg.replay_records as u64).min(records);
    let (log, _) = PartitionLog::open(
        &cfg.dir.join("local"),
        LogConfig {
            segment_max_bytes: cfg.segment_bytes,
            tail_cache: narad_core::log::TailBudget::new(0),
            wal: None,
            ..LogConfig::default()
        },
        ManualClock::new(base_ts),
        Arc::new(CoreMetrics::default()),
    )?;
    let mut i = 0;
    while i < n {
        let batch: Vec<NewRecord> = (i..(i + 1000).min(n))
            .map(|o| {
                let r = record(o, 0);
                NewRecord {
                    key: r.key,
                    headers: Vec::new(),
                    payload: r.payload,
                    delay_ms: 0,
                }
            })
            .collect();
        i += batch.len() as u64;
        log.append(batch).await?;
    }
    log.roll().await?;
    let log = Arc::new(log);
    let started = Instant::now();
    let mut next = 0;
    while next < n {
        let l = log.clone();
        let got = tokio::task::spawn_blocking(move || l.read(next, 100, 4 << 20)).await??;
        next = got.last().map_or(n, |r| r.offset + 1);
    }
    let local_rate = n as f64 / started.elapsed().as_secs_f64();
    log.close().await;

    let reader = ArchiveReader::new(archive.clone());
    let started = Instant::now();
    let mut next = 0;
    while next < n {
        match reader.read("bench", 1, 0, next, 100).await? {
            ArchiveRead::Records(r) if !r.is_empty() => {
                next = r.last().expect("non-empty").offset + 1
            }
            other => return Err(format!("archive read at {next}: {other:?}").into()),
        }
    }
    let archive_rate = n as f64 / started.elapsed().as_secs_f64();

    // 3. time lookups at spread-out timestamps, each with cold caches (a new reader)
    let span = (records / 300) as i64;
    let mut lat = Vec::new();
    for k in 0..cfg.lookups {
        let ts = base_ts + span * (k as i64 * 7 + 3) / (cfg.lookups as i64 * 7 + 7);
        let reader = ArchiveReader::new(archive.clone());
        let started = Instant::now();
        let off = reader.offset_for_time("bench", 1, 0, ts).await?;
        lat.push(started.elapsed().as_secs_f64() * 1000.0);
        let off = off.ok_or("lookup found nothing")?;
        if (base_ts + (off / 300) as i64) < ts
            || (off > 0 && base_ts + ((off - 1) / 300) as i64 >= ts)
        {
            return Err(
                format!("lookup of {ts} returned offset {off}: not the first at or after").into(),
            );
        }
    }
    lat.sort_by(f64::total_cmp);
    let _ = std::fs::remove_dir_all(&cfg.dir);
    Ok(TieringBenchResult {
        records,
        segment_bytes_total: seg_total,
        parquet_bytes_total: pq_total,
        compression_ratio: seg_total as f64 / pq_total as f64,
        encode_mb_per_s_per_core: seg_total as f64 / 1e6 / encode_time.as_secs_f64(),
        replay_local_records_per_s: local_rate,
        replay_archive_records_per_s: archive_rate,
        archive_vs_local: archive_rate / local_rate,
        time_lookup_ms_p50: lat[lat.len() / 2],
        time_lookup_ms_max: *lat.last().unwrap_or(&0.0),
        partition_gib: seg_total as f64 / (1u64 << 30) as f64,
        puts_per_gb: puts as f64 / (seg_total as f64 / 1e9),
    })
}
