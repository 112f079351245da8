//! The catalog snapshot through a real broker and user store: what a restore brings back with
//! the secret, without it, with a wrong one and from a tampered object; and when it is uploaded.

use std::time::Instant;

use narad_auth::store::{ROOT_USER, UserRecord};
use narad_auth::{Action, Grant};
use narad_core::broker::{BrokerConfig, LinkStart, ProduceMessage};
use narad_core::clock::{Clock as _, ManualClock, SystemClock};
use narad_core::log::LogConfig;
use narad_core::metrics::CoreMetrics;
use narad_core::topic::{CreateTopic, TopicPatch};

use super::*;
use crate::archive::ArchiveSettings;

const SECRET: &[u8] = b"the cluster secret: at least 32 bytes long";
const OTHER: &[u8] = b"another cluster secret, also 32+ bytes long";

async fn broker(dir: &std::path::Path) -> Arc<Broker> {
    let mut cfg = BrokerConfig::new(dir);
    cfg.log = LogConfig {
        segment_max_bytes: 4096,
        ..LogConfig::default()
    };
    cfg.archive_gate = true;
    cfg.retention_interval_ms = 3_600_000;
    Broker::open(cfg, Arc::new(SystemClock), Arc::new(CoreMetrics::default()))
        .await
        .unwrap()
}

fn memory_archive() -> Archive {
    Archive::open(&ArchiveSettings {
        url: "memory://".into(),
        ..Default::default()
    })
    .unwrap()
}

fn user(name: &str, grants: Vec<Grant>) -> UserRecord {
    UserRecord {
        username: name.into(),
        id: 11,
        password_hash: format!("$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$hash-of-{name}"),
        root: name == ROOT_USER,
        grants,
        created_at_ms: 1,
        updated_at_ms: 2,
        carried_from: None,
        origin: None,
        access_keys: Vec::new(),
    }
}

async fn create(b: &Arc<Broker>, name: &str, partitions: u32) {
    b.create_topic(CreateTopic {
        name: name.into(),
        settings: TopicPatch {
            partitions: Some(partitions),
            ..TopicPatch::default()
        },
        ..CreateTopic::default()
    })
    .await
    .unwrap();
}

async fn produce(b: &Arc<Broker>, topic: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let msgs = chunk
            .iter()
            .map(|i| ProduceMessage {
                key: Some(Bytes::from(format!("k{i}"))),
                payload: Bytes::from(format!("{{\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(40))),
                ..ProduceMessage::default()
            })
            .collect();
        b.produce(topic, msgs).await.unwrap();
    }
}

fn next_offsets(b: &Broker, topic: &str) -> u64 {
    let info = b.topic_info(topic).unwrap();
    info.partitions.iter().map(|p| p.log.next_offset).sum()
}

async fn wait_for(b: &Broker, topic: &str, n: u64) {
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    while next_offsets(b, topic) < n {
        assert!(Instant::now() < deadline, "{topic} never reached {n}");
        // a poll with a deadline: the fan-out cursors copy on real time here
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A node with users, a parent `p` (2 partitions), a child `c` that copies at once and a
/// delay child `d` (1 h) that has copied nothing, archived with its catalog snapshot.
struct Source {
    _dir: tempfile::TempDir,
    broker: Arc<Broker>,
    users: Arc<UserStore>,
    archive: Archive,
}

async fn source() -> Source {
    source_with(Some(SECRET)).await
}

async fn source_with(secret: Option<&[u8]>) -> Source {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(&dir.path().join("a")).await;
    let users = Arc::new(UserStore::open(&dir.path().join("a")).unwrap());
    users
        .apply(UserCommand::Create {
            user: user(ROOT_USER, vec![]),
        })
        .unwrap();
    users
        .apply(UserCommand::Create {
            user: user(
                "alice",
                vec![Grant {
                    action: Action::Produce,
                    patterns: vec!["p".into()],
                }],
            ),
        })
        .unwrap();
    create(&b, "p", 2).await;
    create(&b, "c", 1).await;
    create(&b, "d", 1).await;
    b.attach_child("p", "c", 0, LinkStart::Latest)
        .await
        .unwrap();
    b.attach_child("p", "d", 3_600_000, LinkStart::Latest)
        .await
        .unwrap();
    produce(&b, "p", 300).await;
    wait_for(&b, "c", 300).await;
    let archive = memory_archive();
    let tierer = Tierer::with_catalog(
        b.clone(),
        archive.clone(),
        TieringConfig::default(),
        Arc::new(SystemClock),
        Arc::new(TieringMetrics::default()),
        CatalogSource {
            users: Some(users.clone()),
            keys: secret.map(|s| Arc::new(CatalogKeys::derive(s, None))),
            writer: None,
        },
    );
    tierer.clone().pass().await.unwrap();
    assert!(tierer.sync_catalog().await.unwrap());
    Source {
        _dir: dir,
        broker: b,
        users,
        archive,
    }
}

/// A fresh node (empty data directory and user store) restored from `archive`.
async fn restored(
    dir: &std::path::Path,
    archive: &Archive,
    keys: Option<&[u8]>,
) -> (Arc<Broker>, Arc<UserStore>, RestoreReport) {
    let b = broker(dir).await;
    let users = Arc::new(UserStore::open(dir).unwrap());
    let target = RestoreTarget {
        keys: keys.map(|k| Arc::new(CatalogKeys::derive(k, None))),
        users: Some(users.clone()),
    };
    let report = restore(&b, archive, &target).await.unwrap();
    (b, users, report)
}

fn archived_starts(report: &RestoreReport, topic: &str) -> Vec<u64> {
    report
        .restored
        .iter()
        .find(|(n, _)| n == topic)
        .map(|(_, s)| s.clone())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_secret_users_topics_and_links_come_back_and_children_keep_copying() {
    let src = source().await;
    let dir = tempfile::tempdir().unwrap();
    let (b, users, report) = restored(dir.path(), &src.archive, Some(SECRET)).await;
    assert!(matches!(
        report.catalog,
        CatalogOutcome::Opened {
            key: KeyUsed::Current,
            ..
        }
    ));
    // users, with their hashes and grants
    assert_eq!(report.users_restored, Some(2));
    assert_eq!(report.users_missing, None);
    let alice = users.get("alice").unwrap();
    assert_eq!(*alice, *src.users.get("alice").unwrap());
    assert!(users.get(ROOT_USER).unwrap().root);
    // topics with their incarnations, links with their epochs
    for t in ["p", "c", "d"] {
        let (old, new) = (src.broker.topic_meta(t).unwrap(), b.topic_meta(t).unwrap());
        assert_eq!(old, new, "{t}");
    }
    let mut linked = report.links_restored.clone();
    linked.sort();
    assert_eq!(linked, vec!["c", "d"]);
    assert!(report.links_missing.is_empty(), "{report:?}");
    // the parent was archived past the delay child's cursor (0): those records are missed
    let starts = archived_starts(&report, "p");
    let archived: u64 = starts.iter().sum();
    assert!(archived > 0, "segments of p were archived: {starts:?}");
    assert_eq!(report.missed, vec![("d".to_string(), archived)]);
    let notice = report.notice().unwrap();
    assert!(
        notice.contains("child 'd' may have missed up to"),
        "{notice}"
    );
    assert!(!notice.contains("users"), "{notice}");
    // records produced to the parent after the restore reach the child
    let c_before = next_offsets(&b, "c");
    produce(&b, "p", 10).await;
    wait_for(&b, "c", c_before + 10).await;
    b.shutdown().await;
    src.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_usable_secret_topics_come_back_and_the_report_says_what_did_not() {
    let src = source().await;
    let path = src.archive.catalog_path();
    for (case, keys, reason) in [
        ("none", None, "no cluster_secret is configured"),
        ("wrong", Some(OTHER), "another cluster secret"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (b, users, report) = restored(dir.path(), &src.archive, keys).await;
        let CatalogOutcome::Unopened {
            reason: got,
            kept_at,
        } = &report.catalog
        else {
            panic!("{case}: {:?}", report.catalog);
        };
        assert!(got.contains(reason), "{case}: {got}");
        // the snapshot was kept aside, byte for byte
        let kept = src
            .archive
            .store
            .get(&Path::from(kept_at.as_str()))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let current = src.archive.store.get(&path).await.unwrap().bytes().await;
        assert_eq!(kept, current.unwrap(), "{case}");
        // topics are back, standalone; no users
        assert_eq!(b.topic_names(), vec!["c", "d", "p"], "{case}");
        assert_eq!(b.topic_meta("c").unwrap().parent, None, "{case}");
        assert!(users.is_empty(), "{case}");
        assert!(report.users_missing.is_some(), "{case}");
        let notice = report.notice().unwrap();
        assert!(
            notice.contains("users were not restored"),
            "{case}: {notice}"
        );
        assert!(
            notice.contains("fan-out links and remotes were not restored"),
            "{case}: {notice}"
        );
        b.shutdown().await;
    }
    // a tampered snapshot fails authentication with the right secret
    let mut bytes = src
        .archive
        .store
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let last = bytes.len() - 20;
    bytes[last] ^= 0x40;
    src.archive
        .store
        .put(&path, PutPayload::from(bytes))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (b, users, report) = restored(dir.path(), &src.archive, Some(SECRET)).await;
    let CatalogOutcome::Unopened { reason, .. } = &report.catalog else {
        panic!("{:?}", report.catalog);
    };
    assert!(reason.contains("failed authentication"), "{reason}");
    assert!(users.is_empty());
    assert_eq!(b.topic_names(), vec!["c", "d", "p"]);
    b.shutdown().await;
    src.broker.shutdown().await;
}

/// A node that never had a secret uploads topics and links unsealed, never its users: a
/// restore (with or without a secret) brings the links back and says the users did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsealed_snapshot_restores_links_but_never_users() {
    let src = source_with(None).await;
    let bytes = src.archive.load_catalog().await.unwrap().unwrap();
    assert!(!String::from_utf8_lossy(&bytes).contains("argon2"));
    for keys in [None, Some(SECRET)] {
        let dir = tempfile::tempdir().unwrap();
        let (b, users, report) = restored(dir.path(), &src.archive, keys).await;
        assert!(matches!(
            report.catalog,
            CatalogOutcome::Opened {
                key: KeyUsed::None,
                ..
            }
        ));
        assert_eq!(
            b.topic_meta("c").unwrap(),
            src.broker.topic_meta("c").unwrap()
        );
        assert!(users.is_empty());
        let notice = report.notice().unwrap();
        assert!(notice.contains("users were not restored"), "{notice}");
        assert!(!notice.contains("links were not restored"), "{notice}");
        b.shutdown().await;
    }
    src.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_into_a_store_with_users_keeps_them() {
    let src = source().await;
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let users = Arc::new(UserStore::open(dir.path()).unwrap());
    users
        .apply(UserCommand::Create {
            user: user("bob", vec![]),
        })
        .unwrap();
    let target = RestoreTarget {
        keys: Some(Arc::new(CatalogKeys::derive(SECRET, None))),
        users: Some(users.clone()),
    };
    let report = restore(&b, &src.archive, &target).await.unwrap();
    assert_eq!(report.users_restored, None);
    assert!(users.get("alice").is_none() && users.get("bob").is_some());
    // the node's next upload replaces the snapshot: the one with alice is kept first
    let kept = src.archive.catalog_objects().await.unwrap();
    assert!(kept.iter().any(|n| n.starts_with("unopened-")), "{kept:?}");
    b.shutdown().await;
    src.broker.shutdown().await;
}

/// Review of issue 12: a node restoring with security off takes no users, and its first
/// upload would have replaced the only archived copy of them; it is kept aside first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_without_security_keeps_the_snapshot_with_the_users() {
    let src = source().await;
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    let target = RestoreTarget {
        keys: Some(Arc::new(CatalogKeys::derive(SECRET, None))),
        users: None,
    };
    let report = restore(&b, &src.archive, &target).await.unwrap();
    let why = report.users_missing.clone().unwrap();
    assert!(
        why.contains("security is off") && why.contains("unopened-"),
        "{why}"
    );
    let kept = src.archive.catalog_objects().await.unwrap();
    assert!(kept.iter().any(|n| n.starts_with("unopened-")), "{kept:?}");
    // the topics and links came back all the same
    assert!(b.topic_meta("c").unwrap().parent.is_some());
    b.shutdown().await;
    src.broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_goes_up_on_changes_and_cursor_moves_at_most_once_per_interval() {
    let src = source().await;
    let clock = ManualClock::new(1_000_000);
    let dir = tempfile::tempdir().unwrap();
    // a file archive whose snapshot path can be made unwritable
    let archive = Archive::open(&ArchiveSettings {
        url: format!("file://{}", dir.path().display()),
        ..Default::default()
    })
    .unwrap();
    let metrics = Arc::new(TieringMetrics::default());
    let writes = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let t = Tierer::with_catalog(
        src.broker.clone(),
        archive.clone(),
        TieringConfig {
            catalog_cursor_interval: Duration::from_secs(30),
            backoff: Duration::from_secs(1),
            ..TieringConfig::default()
        },
        clock.clone(),
        metrics.clone(),
        CatalogSource {
            users: Some(src.users.clone()),
            keys: Some(Arc::new(CatalogKeys::derive(SECRET, None))),
            writer: Some(Arc::new({
                let w = writes.clone();
                move || w.load(std::sync::atomic::Ordering::Relaxed)
            })),
        },
    );
    // a cluster member that does not lead writes nothing; once it leads, it writes at once
    writes.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(!t.sync_catalog().await.unwrap(), "not the writer");
    writes.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(t.sync_catalog().await.unwrap());
    assert!(!t.sync_catalog().await.unwrap(), "nothing changed");
    writes.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(!t.sync_catalog().await.unwrap());
    writes.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(
        t.sync_catalog().await.unwrap(),
        "leading again: another may have written meanwhile"
    );
    assert!(!t.sync_catalog().await.unwrap(), "nothing changed");
    // cursors alone: not before the interval
    produce(&src.broker, "p", 5).await;
    wait_for(&src.broker, "c", 305).await;
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while t
        .catalog_snapshot()
        .cursors
        .iter()
        .map(|c| c.next_offset)
        .sum::<u64>()
        < 305
    {
        assert!(Instant::now() < deadline);
        tokio::task::yield_now().await;
    }
    clock.advance(29_000);
    assert!(!t.sync_catalog().await.unwrap(), "cursor moves wait");
    clock.advance(1_000);
    assert!(t.sync_catalog().await.unwrap());
    // a user or a topic change goes up at once
    src.users
        .apply(UserCommand::SetPassword {
            username: "alice".into(),
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$new".into(),
            at_ms: 5,
        })
        .unwrap();
    assert!(t.sync_catalog().await.unwrap());
    create(&src.broker, "q", 1).await;
    // a failing upload is counted and retried after the backoff, not before
    let target = dir.path().join("_catalog/catalog.bin");
    std::fs::remove_file(&target).unwrap();
    std::fs::create_dir_all(target.join("in-the-way")).unwrap();
    assert!(t.sync_catalog().await.is_err());
    assert_eq!(metrics.catalog_failures.get(), 1);
    assert!(!t.sync_catalog().await.unwrap(), "backing off");
    std::fs::remove_dir_all(&target).unwrap();
    clock.advance(1_000);
    assert!(t.sync_catalog().await.unwrap());
    assert_eq!(
        metrics.catalog_uploads.get(),
        5,
        "with the one on leading again"
    );
    assert_eq!(metrics.catalog_last_upload.get(), clock.now_ms() / 1000);
    // what went up opens and lists the new topic and password
    let bytes = std::fs::read(&target).unwrap();
    let keys = CatalogKeys::derive(SECRET, None);
    let snap = catalog::open(&bytes, Some(&keys)).unwrap().snapshot;
    assert!(snap.topics.iter().any(|m| m.name == "q"));
    let users = snap.users.unwrap();
    assert!(users.iter().any(|u| u.password_hash.ends_with("$new")));
    src.broker.shutdown().await;
}
