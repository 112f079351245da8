//! Tiering and archive replay against each object-store backend: the same suite runs on
//! memory, local files, and an S3-compatible endpoint when `NARAD_TEST_S3_URL` names one
//! (`.ci/run` starts moto on loopback and sets it).

use std::sync::Arc;

use bytes::Bytes;
use narad_core::broker::{Broker, BrokerConfig, ProduceMessage};
use narad_core::clock::SystemClock;
use narad_core::log::LogConfig;
use narad_core::metrics::CoreMetrics;
use narad_core::topic::{CreateTopic, TopicPatch};
use narad_tiering::archive::{Archive, ArchiveSettings};
use narad_tiering::tierer::{Tierer, TieringConfig, TieringMetrics};
use object_store::ObjectStoreExt;

use super::*;

async fn broker(dir: &std::path::Path) -> Arc<Broker> {
    let mut cfg = BrokerConfig::new(dir);
    cfg.log = LogConfig {
        segment_max_bytes: 8192,
        ..LogConfig::default()
    };
    cfg.archive_gate = true;
    cfg.retention_interval_ms = 3_600_000; // retention runs only when the test asks
    Broker::open(cfg, Arc::new(SystemClock), Arc::new(CoreMetrics::default()))
        .await
        .unwrap()
}

fn tierer(b: &Arc<Broker>, archive: Archive) -> Arc<Tierer> {
    Tierer::new(
        b.clone(),
        archive,
        TieringConfig::default(),
        Arc::new(SystemClock),
        Arc::new(TieringMetrics::default()),
    )
}

/// Produces `n` JSON messages to topic `t` (2 partitions, tiny retention so every archived
/// segment may go) and returns `(partition, offset, payload)` for each.
async fn fill(b: &Arc<Broker>, n: usize) -> Vec<(u32, u64, Bytes)> {
    b.create_topic(CreateTopic {
        name: "t".into(),
        settings: TopicPatch {
            partitions: Some(2),
            retention_bytes: Some(1),
            ..TopicPatch::default()
        },
        ..CreateTopic::default()
    })
    .await
    .unwrap();
    let mut out = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let msgs: Vec<ProduceMessage> = chunk
            .iter()
            .map(|i| ProduceMessage {
                key: Some(Bytes::from(format!("k{}", i % 10))),
                partition: None,
                delay_ms: None,
                headers: if i % 7 == 0 {
                    vec![("h".into(), Bytes::from_static(b"v"))]
                } else {
                    Vec::new()
                },
                payload: Bytes::from(format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(40))),
            })
            .collect();
        let payloads: Vec<Bytes> = msgs.iter().map(|m| m.payload.clone()).collect();
        let res = b.produce("t", msgs).await.unwrap();
        for (r, p) in res.iter().zip(payloads) {
            out.push((r.partition, r.offset, p));
        }
    }
    out
}

async fn conformance(archive: Archive) {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let produced = fill(&b, 1200).await;
    let id = b.topic_meta("t").unwrap().id;
    // (the broker's own retention may run any time once segments are archived)
    let mut sealed_before = Vec::new();
    for p in 0..2u32 {
        sealed_before.push(b.sealed_segments("t", p).await.unwrap());
    }
    let t = tierer(&b, archive.clone());
    t.clone().pass().await.unwrap();
    // a second pass finds nothing new and changes nothing
    t.clone().pass().await.unwrap();
    assert!(archive.load_topic("t").await.unwrap().is_some());
    assert_eq!(archive.list_topics().await.unwrap(), vec!["t".to_string()]);
    let reader = ArchiveReader::new(archive.clone());
    for p in 0..2u32 {
        let m = archive.load_manifest("t", p).await.unwrap().unwrap();
        let sealed = &sealed_before[p as usize];
        assert!(sealed.len() >= 2, "small segments roll");
        assert_eq!(m.topic_id, id);
        assert_eq!(m.next_offset, sealed.last().unwrap().end);
        assert_eq!(m.segments.len(), sealed.len());
        let mut next = 0;
        for s in &m.segments {
            assert_eq!(s.first_offset, next, "contiguous");
            next = s.last_offset + 1;
            let path = archive.partition_dir("t", p).join(s.object.as_str());
            let head = archive.store.head(&path).await.unwrap();
            assert_eq!(head.size, s.object_bytes);
        }
    }
    // a mark for another incarnation of the name is refused
    assert!(b.set_archived("t", id + 1, 0, 1_000_000).is_err());
    // _topic.json follows the topic's settings
    b.alter_topic(
        "t",
        TopicPatch {
            visibility_timeout_ms: Some(12_345),
            ..TopicPatch::default()
        },
    )
    .await
    .unwrap();
    t.clone().pass().await.unwrap();
    let saved = archive.load_topic("t").await.unwrap().unwrap();
    assert_eq!(saved.config.visibility_timeout_ms, 12_345);
    // retention may now delete every archived segment (retention_bytes = 1)
    b.run_retention().await;
    for p in 0..2u32 {
        let (oldest, _) = b.local_range("t", p).unwrap();
        let m = reader.manifest("t", id, p).await.unwrap().unwrap();
        assert_eq!(
            oldest, m.next_offset,
            "local data starts where the archive ends"
        );
        // every archived record reads back exactly, in order, from the archive
        let want: Vec<&(u32, u64, Bytes)> = produced
            .iter()
            .filter(|(pp, o, _)| *pp == p && *o < oldest)
            .collect();
        let mut got = Vec::new();
        let mut from = 0;
        while from < oldest {
            match reader.read("t", id, p, from, 100).await.unwrap() {
                ArchiveRead::Records(r) => {
                    assert!(!r.is_empty());
                    from = r.last().unwrap().offset + 1;
                    got.extend(r);
                }
                other => panic!("offset {from}: {other:?}"),
            }
        }
        assert_eq!(got.len(), want.len());
        for (g, (_, o, payload)) in got.iter().zip(want) {
            assert_eq!((g.offset, &g.payload), (*o, payload));
        }
        assert!(got.iter().any(|r| !r.headers.is_empty()));
        // time lookups
        let first_ts = got[0].timestamp_ms;
        assert_eq!(
            reader.offset_for_time("t", id, p, first_ts).await.unwrap(),
            Some(0)
        );
        let mid = &got[got.len() / 2];
        let at = reader
            .offset_for_time("t", id, p, mid.timestamp_ms)
            .await
            .unwrap()
            .unwrap();
        assert!(at <= mid.offset);
        assert!(got[at as usize].timestamp_ms >= mid.timestamp_ms);
        assert_eq!(
            reader.offset_for_time("t", id, p, i64::MAX).await.unwrap(),
            None
        );
        // another incarnation's id sees nothing
        assert!(matches!(
            reader.read("t", id + 1, p, 0, 10).await.unwrap(),
            ArchiveRead::Absent
        ));
    }
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_memory() {
    let a = Archive::open(&ArchiveSettings {
        url: "memory://narad".into(),
        ..Default::default()
    })
    .unwrap();
    conformance(a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_local_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = Archive::open(&ArchiveSettings {
        url: format!("file://{}", dir.path().join("archive").display()),
        ..Default::default()
    })
    .unwrap();
    conformance(a).await;
}

/// Runs against a real S3-compatible server when `NARAD_TEST_S3_URL` (e.g.
/// `s3://narad-test/run-1` with `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP=true` and credentials in
/// the environment) is set; `.ci/run` does that with moto on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_s3() {
    let Ok(url) = std::env::var("NARAD_TEST_S3_URL") else {
        eprintln!("NARAD_TEST_S3_URL not set: S3 conformance skipped");
        return;
    };
    let url = format!("{url}/{}", std::process::id());
    let a = Archive::open(&ArchiveSettings {
        url,
        ..Default::default()
    })
    .unwrap();
    conformance(a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_archive_keeps_every_local_segment() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(&dir.path().join("data")).await;
    fill(&b, 600).await;
    // the archive "directory" is a regular file: every write fails
    let bad = dir.path().join("not-a-dir");
    std::fs::write(&bad, b"x").unwrap();
    let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&bad).unwrap());
    let t = tierer(&b, Archive::new(store, "", "file://broken"));
    assert!(t.clone().pass().await.is_err());
    b.run_retention().await;
    for p in 0..2 {
        assert_eq!(
            b.local_range("t", p).unwrap().0,
            0,
            "nothing deleted unarchived"
        );
    }
    // produce keeps working
    b.produce(
        "t",
        vec![ProduceMessage {
            key: None,
            partition: Some(0),
            delay_ms: None,
            headers: Vec::new(),
            payload: Bytes::from_static(b"still"),
        }],
    )
    .await
    .unwrap();
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_retention_deletes_old_objects_and_reads_answer_expired() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    fill(&b, 600).await;
    let id = b.topic_meta("t").unwrap().id;
    let archive = Archive::open(&ArchiveSettings {
        url: "memory://".into(),
        ..Default::default()
    })
    .unwrap();
    let t = Tierer::new(
        b.clone(),
        archive.clone(),
        TieringConfig {
            archive_retention_ms: 1,
            ..TieringConfig::default()
        },
        Arc::new(SystemClock),
        Arc::new(TieringMetrics::default()),
    );
    // the first pass archives, later ones expire what is older than 1 ms
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let m = loop {
        t.clone().pass().await.unwrap();
        let m = archive.load_manifest("t", 0).await.unwrap().unwrap();
        if m.segments.is_empty() && m.start_offset > 0 {
            break m;
        }
        assert!(std::time::Instant::now() < deadline, "{m:?}");
        tokio::task::yield_now().await;
    };
    assert_eq!(m.start_offset, m.next_offset);
    let listed = archive
        .store
        .list_with_delimiter(Some(&archive.partition_dir("t", 0)))
        .await
        .unwrap();
    assert!(
        listed
            .objects
            .iter()
            .all(|o| !o.location.as_ref().ends_with(".parquet")),
        "expired objects deleted: {listed:?}"
    );
    let reader = ArchiveReader::new(archive);
    assert!(matches!(
        reader.read("t", id, 0, 0, 10).await.unwrap(),
        ArchiveRead::Expired { oldest } if oldest == m.start_offset
    ));
    b.shutdown().await;
}

#[tokio::test]
async fn large_objects_go_up_in_parts() {
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let path = object_store::path::Path::from("big.bin");
    let data: Vec<u8> = (0..20 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    narad_tiering::tierer::upload(store.as_ref(), &path, Bytes::from(data.clone()))
        .await
        .unwrap();
    let back = store.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data);
}

/// A reader that cached a partition's manifest, asked for an offset archived (and deleted
/// locally) since, reads it from the archive at once: it does not answer that the offset is
/// gone until its cached manifest expires (a reviewer saw 410 for about a second, and a
/// client told an offset is gone skips ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_archived_after_the_manifest_was_cached_is_read_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    fill(&b, 600).await;
    let archive = Archive::open(&ArchiveSettings {
        url: "memory://narad".into(),
        ..Default::default()
    })
    .unwrap();
    let t = tierer(&b, archive.clone());
    t.clone().pass().await.unwrap();
    b.run_retention().await;
    let reader = ArchiveReader::new(archive.clone());
    let read = async |from: u64| {
        read_archived(&b, &reader, "t", 0, ReplayFrom::Offset(from), 10)
            .await
            .unwrap()
    };
    assert!(
        read(0).await.is_some_and(|r| r[0].offset == 0),
        "cached now"
    );
    let cached_end = archive
        .load_manifest("t", 0)
        .await
        .unwrap()
        .unwrap()
        .next_offset;
    // more records, archived, then deleted locally: all within the cache's lifetime
    for i in 0..400 {
        b.produce(
            "t",
            vec![ProduceMessage {
                key: None,
                partition: Some(0),
                delay_ms: None,
                headers: Vec::new(),
                payload: Bytes::from(format!("{{\"more\":{i},\"pad\":\"{}\"}}", "y".repeat(60))),
            }],
        )
        .await
        .unwrap();
    }
    t.clone().pass().await.unwrap();
    b.run_retention().await;
    let (oldest_local, _) = b.local_range("t", 0).unwrap();
    assert!(oldest_local > cached_end, "the new records left the disk");
    let got = read(cached_end).await;
    assert!(
        got.as_ref().is_some_and(|r| r[0].offset == cached_end),
        "{got:?}"
    );
    b.shutdown().await;
}

/// A gap the manifest records (a partition's lost tail) is stepped over: a read from inside
/// it goes on at the next archived record. A gap it does not record is never skipped.
#[tokio::test]
async fn a_recorded_gap_is_stepped_over_and_an_unrecorded_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    fill(&b, 600).await;
    let archive = Archive::open(&ArchiveSettings {
        url: "memory://narad".into(),
        ..Default::default()
    })
    .unwrap();
    tierer(&b, archive.clone()).pass().await.unwrap();
    let id = b.topic_meta("t").unwrap().id;
    let mut m = archive.load_manifest("t", 0).await.unwrap().unwrap();
    assert!(m.segments.len() >= 3, "{m:?}");
    // the second segment's offsets become a hole in the archive
    let hole = m.segments.remove(1);
    let (from, to) = (hole.first_offset, hole.last_offset + 1);
    archive.save_manifest(&m).await.unwrap();
    let absent = ArchiveReader::new(archive.clone())
        .read("t", id, 0, from + 1, 10)
        .await
        .unwrap();
    assert!(matches!(absent, ArchiveRead::Absent), "{absent:?}");
    m.gaps.push((from, to));
    archive.save_manifest(&m).await.unwrap();
    for at in [from, from + 1, to - 1] {
        let got = ArchiveReader::new(archive.clone())
            .read("t", id, 0, at, 10)
            .await
            .unwrap();
        let ArchiveRead::Records(r) = got else {
            panic!("{got:?}")
        };
        assert_eq!(r[0].offset, to, "a read from {at}");
    }
    b.shutdown().await;
}
