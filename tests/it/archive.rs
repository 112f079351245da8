//! Tiering through the real binary: `server start --dev` archives sealed segments into
//! `<data>/archive` as Parquet, retention then deletes them locally, and replay reads below
//! the oldest local offset come from the archive with the same message JSON, across restarts.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::*;

async fn oldest_local(s: &Server) -> u64 {
    let v: Value = s.get("/v1/topics/arch").await.json().await.unwrap();
    v["partition_stats"][0]["oldest_offset"].as_u64().unwrap()
}

async fn replay_all(s: &Server, end: u64) -> Vec<Value> {
    let mut out = Vec::new();
    let mut next = 0;
    while next < end {
        let m = s
            .consume("arch", &format!("?partition=0&offset={next}&max=100"))
            .await
            .unwrap_or_else(|| panic!("204 at offset {next}"));
        for m in m["messages"].as_array().unwrap() {
            assert_eq!(m["offset"].as_u64().unwrap(), next, "dense offsets");
            next += 1;
            out.push(m.clone());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_segments_are_archived_and_replayed_from_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_SEGMENT_MAX_BYTES", "4096"),
        ("NARAD_TIERING_INTERVAL_MS", "50"),
        ("NARAD_RETENTION_INTERVAL_MS", "50"),
    ];
    let mut s = Server::start_with(dir.path(), &env).await;
    // retention_bytes 1: every sealed segment may go, but only once archived
    s.create_topic(json!({"name": "arch", "partitions": 1, "retention_bytes": 1}))
        .await;
    for i in 0..400 {
        let r = s
            .produce(
                "arch",
                &format!("?key=k{}", i % 5),
                format!("{{\"i\":{i}}}"),
            )
            .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while oldest_local(&s).await == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing archived and deleted locally"
        );
        poll_pause().await;
    }
    let oldest = oldest_local(&s).await;
    // the archive holds Hive-style Parquet objects and a manifest
    let part_dir = s.data_dir.join("archive/topic=arch/partition=0");
    let names: Vec<String> = std::fs::read_dir(&part_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "_manifest.json"), "{names:?}");
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("00000000000000000000-") && n.ends_with(".parquet")),
        "{names:?}"
    );
    // every message, archived or local, replays in order with the same JSON
    let all = replay_all(&s, 400).await;
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m["payload"], json!({ "i": i }), "offset {i}");
        assert_eq!(m["key"], format!("k{}", i % 5));
        assert_eq!(m["payload_encoding"], "json");
    }
    assert!(oldest > 0 && oldest <= 400);
    // the CLI replays a time window as JSON lines, found through the archive
    let (t_from, t_to) = (
        all[10]["timestamp_ms"].as_i64().unwrap(),
        all[20]["timestamp_ms"].as_i64().unwrap(),
    );
    let lines = crate::cli::narad(
        &s,
        &[
            "replay",
            "arch",
            "--partition",
            "0",
            "--from-time",
            &t_from.to_string(),
            "--to-time",
            &t_to.to_string(),
        ],
    )
    .await;
    let got: Vec<u64> = lines
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["offset"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let want: Vec<u64> = all
        .iter()
        .filter(|m| (t_from..=t_to).contains(&m["timestamp_ms"].as_i64().unwrap()))
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(got, want);
    // a time lookup below local data is answered from the archive
    let t0 = all[0]["timestamp_ms"].as_i64().unwrap();
    let m = s
        .consume("arch", &format!("?partition=0&from_time={t0}"))
        .await
        .unwrap();
    assert_eq!(m["offset"], 0);
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("narad_archive_segments_total"),
        "tiering metrics exported"
    );
    // across a restart the archive still serves, and nothing was lost
    s.stop().await;
    s.restart().await;
    let again = replay_all(&s, 400).await;
    assert_eq!(again, all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_loss_restores_topics_from_the_archive() {
    let dir = tempfile::tempdir().unwrap();
    // the real S3-compatible server when the test command started one, else local files
    let archive_url = match std::env::var("NARAD_TEST_S3_URL") {
        Ok(base) => format!("{base}/restore-{}", std::process::id()),
        Err(_) => format!("file://{}", dir.path().join("bucket").display()),
    };
    let archive = narad_tiering::archive::Archive::open(&narad_tiering::archive::ArchiveSettings {
        url: archive_url.clone(),
        ..Default::default()
    })
    .unwrap();
    let env = [
        ("NARAD_SEGMENT_MAX_BYTES", "4096"),
        ("NARAD_TIERING_INTERVAL_MS", "50"),
        ("NARAD_ARCHIVE_URL", archive_url.as_str()),
    ];
    let mut s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "arch", "partitions": 1, "visibility_timeout_ms": 4321}))
        .await;
    for i in 0..300 {
        s.produce("arch", "", format!("{{\"i\":{i}}}")).await;
    }
    // wait until the archive's manifest covers most of the partition
    let deadline = Instant::now() + Duration::from_secs(30);
    let archived = loop {
        let m = archive.load_manifest("arch", 0).await;
        if let Ok(Some(m)) = &m
            && m.next_offset >= 200
        {
            break m.next_offset;
        }
        assert!(
            Instant::now() < deadline,
            "archive did not catch up ({m:?}); log:\n{}",
            s.log()
        );
        poll_pause().await;
    };
    // the disk is lost
    s.kill9();
    std::fs::remove_dir_all(&s.data_dir).unwrap();
    s.restart().await;
    let v: Value = s.get("/v1/topics/arch").await.json().await.unwrap();
    assert_eq!(v["visibility_timeout_ms"], 4321, "settings restored: {v}");
    let p = &v["partition_stats"][0];
    assert_eq!(p["next_offset"].as_u64().unwrap(), archived, "{v}");
    // every archived message replays from the archive
    let all = replay_all(&s, archived).await;
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m["payload"], json!({ "i": i }));
    }
    // new produces continue after the archived offsets, never reusing one
    let r = s.produce("arch", "", "after").await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["offset"].as_u64().unwrap(), archived);
    // the queue does not redeliver archived history as new work
    let m = s.consume("arch", "").await.unwrap();
    assert_eq!(m["offset"].as_u64().unwrap(), archived);
    // deleting the topic keeps a later restore from bringing it back
    assert!(archive.load_topic("arch").await.unwrap().is_some());
    let r = s
        .http
        .delete(s.url("/v1/topics/arch"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(archive.load_topic("arch").await.unwrap().is_none());
}

/// pyarrow and DuckDB read the archive straight from the S3-compatible server and agree with
/// the manifests, including a filter on a JSON field inside `payload`. Needs the S3 endpoint
/// `scripts/test` starts (moto) and the Python readers `.ci/run` installs; says why it skips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analytics_engines_read_the_archive_in_place() {
    let Ok(base) = std::env::var("NARAD_TEST_S3_URL") else {
        eprintln!("NARAD_TEST_S3_URL not set: analytics read skipped");
        return;
    };
    let readers = std::process::Command::new("python3")
        .args(["-c", "import pyarrow, duckdb, duckdb_extension_httpfs"])
        .status();
    if !readers.is_ok_and(|s| s.success()) {
        eprintln!("pyarrow/duckdb not installed: analytics read skipped");
        return;
    }
    let url = format!("{base}/analytics-{}", std::process::id());
    let (bucket, prefix) = url.strip_prefix("s3://").unwrap().split_once('/').unwrap();
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("NARAD_SEGMENT_MAX_BYTES", "4096"),
        ("NARAD_TIERING_INTERVAL_MS", "50"),
        ("NARAD_ARCHIVE_URL", url.as_str()),
    ];
    let s = Server::start_with(dir.path(), &env).await;
    s.create_topic(json!({"name": "events", "partitions": 2}))
        .await;
    let mut kinds = Vec::new();
    for i in 0..600 {
        let kind = if i % 3 == 0 { "a" } else { "b" };
        let r = s
            .produce(
                "events",
                &format!("?key=u{}", i % 11),
                format!("{{\"i\":{i},\"kind\":\"{kind}\"}}"),
            )
            .await;
        let v: Value = r.json().await.unwrap();
        kinds.push((
            v["partition"].as_u64().unwrap(),
            v["offset"].as_u64().unwrap(),
            kind,
        ));
    }
    // wait until both manifests cover at least half of each partition, then read them
    let archive = narad_tiering::archive::Archive::open(&narad_tiering::archive::ArchiveSettings {
        url: url.clone(),
        ..Default::default()
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let archived: Vec<u64> = loop {
        let mut got = Vec::new();
        for p in 0..2u32 {
            let m = archive.load_manifest("events", p).await.unwrap();
            got.push(m.map_or(0, |m| m.next_offset));
        }
        let produced: Vec<u64> = (0..2)
            .map(|p| kinds.iter().filter(|(pp, _, _)| *pp == p).count() as u64)
            .collect();
        if got
            .iter()
            .zip(&produced)
            .all(|(a, n)| *a > 0 && a * 2 >= *n)
        {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "archive did not catch up: {got:?}"
        );
        poll_pause().await;
    };
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/analytics/read_archive.py"
        ))
        .args([bucket, prefix, "events"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let total: u64 = archived.iter().sum();
    assert_eq!(seen["pyarrow"]["rows"], total, "{seen}");
    assert_eq!(seen["duckdb"]["rows"], total, "{seen}");
    for p in 0..2 {
        let part = &seen["pyarrow"]["partitions"][p.to_string()];
        assert_eq!(part["rows"], archived[p], "{seen}");
        assert_eq!(part["min"], 0);
        assert_eq!(part["dense"], true);
    }
    let kind_a = kinds
        .iter()
        .filter(|(p, o, k)| *o < archived[*p as usize] && *k == "a")
        .count();
    assert_eq!(seen["duckdb"]["kind_a"], kind_a as u64, "{seen}");
    // timestamps are real UTC instants: the oldest equals the broker's oldest commit time
    let mut first_ts = i64::MAX;
    for p in 0..2 {
        let m = s
            .consume("events", &format!("?partition={p}&offset=0"))
            .await
            .unwrap();
        first_ts = first_ts.min(m["timestamp_ms"].as_i64().unwrap());
    }
    assert_eq!(seen["duckdb"]["first_ts_ms"], first_ts, "{seen}");
}

const ROOT_PW: &str = "root-password-1";
const ROOT_PW_CHANGED: &str = "root-password-2";
const ALICE_PW: &str = "alice-password-1";
const CLUSTER_SECRET: &str = "a cluster secret for the restore tests, 32+ bytes";
const REMOTE_PW: &str = "the password of the mirror user on the remote";

/// An archive for one test: the S3-compatible server when the test command started one,
/// else a local directory.
fn test_archive(dir: &std::path::Path, name: &str) -> (String, narad_tiering::archive::Archive) {
    let url = match std::env::var("NARAD_TEST_S3_URL") {
        Ok(base) => format!("{base}/{name}-{}", std::process::id()),
        Err(_) => format!("file://{}", dir.join("bucket").display()),
    };
    let archive = narad_tiering::archive::Archive::open(&narad_tiering::archive::ArchiveSettings {
        url: url.clone(),
        ..Default::default()
    })
    .unwrap();
    (url, archive)
}

async fn ok_as(s: &Server, who: (&str, &str), method: reqwest::Method, path: &str, body: Value) {
    let r = call_as(s, who, method, path, Some(body)).await;
    let st = r.status();
    assert!(st.is_success(), "{path}: {st} {}", r.text().await.unwrap());
}

/// A secure node with the cluster secret: root's password changed, a user `alice` who may
/// produce to `par`, a parent `par` with a child `kid`, 300 records produced and archived,
/// and a catalog snapshot in the archive that lists alice and the link. Returns how far
/// `par` was archived.
async fn populate(s: &Server, archive: &narad_tiering::archive::Archive) -> u64 {
    let root = ("admin", ROOT_PW);
    ok_as(
        s,
        root,
        Method::PUT,
        "/v1/users/admin/password",
        json!({"new_password": ROOT_PW_CHANGED, "current_password": ROOT_PW}),
    )
    .await;
    let root = ("admin", ROOT_PW_CHANGED);
    ok_as(
        s,
        root,
        Method::POST,
        "/v1/users",
        json!({"username": "alice", "password": ALICE_PW,
               "grants": [{"action": "produce", "patterns": ["par"]}]}),
    )
    .await;
    ok_as(
        s,
        root,
        Method::POST,
        "/v1/remotes",
        json!({"name": "dr", "url": "https://b.example.com", "username": "mirror", "password": REMOTE_PW}),
    )
    .await;
    for t in ["par", "kid"] {
        ok_as(
            s,
            root,
            Method::POST,
            "/v1/topics",
            json!({"name": t, "partitions": 1}),
        )
        .await;
    }
    ok_as(
        s,
        root,
        Method::POST,
        "/v1/topics/par/children",
        json!({"child": "kid"}),
    )
    .await;
    for i in 0..300 {
        let r = call_as(
            s,
            ("alice", ALICE_PW),
            Method::POST,
            "/v1/topics/par/produce",
            Some(json!({ "i": i })),
        )
        .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let keys = narad_tiering::catalog::CatalogKeys::derive(CLUSTER_SECRET.as_bytes(), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = archive.load_manifest("par", 0).await.ok().flatten();
        let snap = archive.load_catalog().await.unwrap().map(|b| {
            narad_tiering::catalog::open(&b, Some(&keys))
                .unwrap()
                .snapshot
        });
        // the snapshot lists alice and the child's link, with a cursor at least as far as
        // the archived parent (else a restore rightly warns about records the child missed)
        let archived_to = m.as_ref().map_or(u64::MAX, |m| m.next_offset);
        let snap_ok = snap.is_some_and(|s| {
            let copied = s
                .cursors
                .iter()
                .any(|c| c.child == "kid" && c.next_offset >= archived_to);
            let linked = s
                .topics
                .iter()
                .any(|t| t.name == "kid" && t.parent.as_ref().is_some_and(|l| l.parent == "par"));
            let alice = s
                .users
                .is_some_and(|u| u.iter().any(|u| u.username == "alice"));
            let remote = s.remotes.iter().any(|r| r.name == "dr");
            linked && alice && copied && remote
        });
        if let Some(m) = &m
            && m.next_offset >= 200
            && snap_ok
        {
            return m.next_offset;
        }
        assert!(
            Instant::now() < deadline,
            "archive did not catch up ({m:?}, snapshot ok: {snap_ok}); log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
}

fn restore_env<'a>(url: &'a str, secret: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("NARAD_SEGMENT_MAX_BYTES", "4096"),
        ("NARAD_TIERING_INTERVAL_MS", "50"),
        ("NARAD_ARCHIVE_URL", url),
    ];
    if let Some(s) = secret {
        env.push(("NARAD_CLUSTER_SECRET", s));
    }
    env
}

async fn readyz(s: &Server) -> Value {
    let r = s.get("/readyz").await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// Disk loss with the cluster secret: users come back with their passwords (root's changed
/// one too, not a new root), the child is still a child and keeps copying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_loss_with_the_cluster_secret_restores_users_and_fanout_links() {
    let dir = tempfile::tempdir().unwrap();
    let (url, archive) = test_archive(dir.path(), "catalog");
    let mut env = restore_env(&url, Some(CLUSTER_SECRET));
    env.push(("NARAD_ADMIN_PASSWORD", ROOT_PW));
    let mut s = Server::start_opts(dir.path(), false, &env, None).await;
    let archived = populate(&s, &archive).await;
    assert!(
        !s.log().contains(CLUSTER_SECRET),
        "the secret is never logged"
    );
    s.kill9();
    std::fs::remove_dir_all(&s.data_dir).unwrap();
    s.restart().await;
    assert_eq!(readyz(&s).await, json!({"status": "ready"}), "{}", s.log());
    // root is the archived one: its changed password works, the env one does not
    let r = call_as(&s, ("admin", ROOT_PW), Method::GET, "/v1/topics", None).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let root = ("admin", ROOT_PW_CHANGED);
    let r = call_as(&s, root, Method::GET, "/v1/topics/kid", None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let kid: Value = r.json().await.unwrap();
    assert_eq!(kid["parent"], "par", "{kid}");
    let kid_next = kid["partition_stats"][0]["next_offset"].as_u64().unwrap();
    // the remote came back with its password, which opens under the same secret
    let r = call_as(&s, root, Method::GET, "/v1/remotes/dr", None).await;
    let dr: Value = r.json().await.unwrap();
    assert_eq!(
        (
            dr["username"].as_str(),
            dr["credential"]["sealed_with"].as_str()
        ),
        (Some("mirror"), Some("current")),
        "{dr}"
    );
    for f in crate::cluster::files_under(dir.path()) {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(
            !crate::cluster::contains(&bytes, REMOTE_PW.as_bytes()),
            "the remote's password in clear in {}",
            f.display()
        );
    }
    // alice logs in with her old password and produces where her grant says
    let r = call_as(
        &s,
        ("alice", ALICE_PW),
        Method::POST,
        "/v1/topics/par/produce",
        Some(json!({"after": "restore"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["offset"].as_u64().unwrap(),
        archived,
        "no offset reused"
    );
    let r = call_as(
        &s,
        ("alice", ALICE_PW),
        Method::POST,
        "/v1/topics/kid/produce",
        Some(json!({})),
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::FORBIDDEN,
        "her grants came back too"
    );
    // the record produced after the restore reaches the child
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call_as(
            &s,
            root,
            Method::GET,
            &format!("/v1/topics/kid/consume?partition=0&offset={kid_next}"),
            None,
        )
        .await;
        if r.status() == StatusCode::OK {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["payload"], json!({"after": "restore"}), "{v}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the child never got it; log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
}

/// Disk loss, restarted without the secret: topics and data come back, users and links do
/// not, `/readyz` says so, and the root is a new one with a generated password (never open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_loss_without_the_cluster_secret_restores_topics_only_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (url, archive) = test_archive(dir.path(), "catalog-nosecret");
    let mut env = restore_env(&url, Some(CLUSTER_SECRET));
    env.push(("NARAD_ADMIN_PASSWORD", ROOT_PW));
    let mut s = Server::start_opts(dir.path(), false, &env, None).await;
    let archived = populate(&s, &archive).await;
    s.kill9();
    std::fs::remove_dir_all(&s.data_dir).unwrap();
    let _ = std::fs::remove_file(s.data_dir.with_extension("log"));
    // the same node, no secret and no admin password given
    let mut s = Server::start_opts(dir.path(), false, &restore_env(&url, None), None).await;
    let ready = readyz(&s).await;
    let detail = ready["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("users were not restored")
            && detail.contains("fan-out links and remotes were not restored"),
        "{ready}"
    );
    let log = s.log();
    assert!(log.contains("users were not restored"), "{log}");
    // never an open root: no credentials, the old passwords, all refused
    let r = s.get("/v1/topics").await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    for who in [
        ("admin", ROOT_PW_CHANGED),
        ("admin", ROOT_PW),
        ("alice", ALICE_PW),
    ] {
        let r = call_as(&s, who, Method::GET, "/v1/topics", None).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{who:?}");
    }
    // the new root's password was printed once; with it, the topics are back, standalone
    let generated = log
        .lines()
        .find_map(|l| {
            l.split("created the root user 'admin' with password: ")
                .nth(1)
        })
        .expect("a generated root password")
        .trim()
        .to_owned();
    let root = ("admin", generated.as_str());
    let r = call_as(&s, root, Method::GET, "/v1/topics/kid", None).await;
    assert_eq!(r.status(), StatusCode::OK);
    let kid: Value = r.json().await.unwrap();
    assert!(kid["parent"].is_null(), "{kid}");
    let r = call_as(&s, root, Method::GET, "/v1/remotes", None).await;
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"remotes": []}));
    let r = call_as(&s, root, Method::GET, "/v1/topics/par", None).await;
    let par: Value = r.json().await.unwrap();
    assert_eq!(
        par["partition_stats"][0]["next_offset"].as_u64().unwrap(),
        archived
    );
    // the snapshot it could not open was kept beside its own new one
    let names = archive.catalog_objects().await.unwrap();
    assert!(
        names.iter().any(|n| n.starts_with("unopened-")),
        "{names:?}"
    );
    s.stop().await;
}

/// Disk loss of a node whose parent held only a few records, all archived (the segment
/// sealed by age), with the child's cursor at the parent's end: restored from the archive,
/// a record produced on the parent afterwards reaches the child, and the child's lag says
/// so until it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_loss_of_a_small_parent_keeps_its_child_copying() {
    let dir = tempfile::tempdir().unwrap();
    let (url, archive) = test_archive(dir.path(), "small");
    let mut env = restore_env(&url, Some(CLUSTER_SECRET));
    env.push(("NARAD_ADMIN_PASSWORD", ROOT_PW));
    env.push(("NARAD_SEGMENT_MAX_AGE_MS", "1000"));
    let mut s = Server::start_opts(dir.path(), false, &env, None).await;
    let root = ("admin", ROOT_PW);
    for t in ["par", "kid"] {
        ok_as(
            &s,
            root,
            Method::POST,
            "/v1/topics",
            json!({"name": t, "partitions": 1}),
        )
        .await;
    }
    ok_as(
        &s,
        root,
        Method::POST,
        "/v1/topics/par/children",
        json!({"child": "kid"}),
    )
    .await;
    for i in 0..20 {
        let r = call_as(
            &s,
            root,
            Method::POST,
            "/v1/topics/par/produce",
            Some(json!({ "i": i })),
        )
        .await;
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    }
    let keys = narad_tiering::catalog::CatalogKeys::derive(CLUSTER_SECRET.as_bytes(), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let par = archive
            .load_manifest("par", 0)
            .await
            .ok()
            .flatten()
            .map(|m| m.next_offset);
        let kid = archive
            .load_manifest("kid", 0)
            .await
            .ok()
            .flatten()
            .map(|m| m.next_offset);
        let cursor = archive.load_catalog().await.unwrap().and_then(|b| {
            let snap = narad_tiering::catalog::open(&b, Some(&keys))
                .unwrap()
                .snapshot;
            snap.cursors
                .iter()
                .find(|c| c.child == "kid")
                .map(|c| c.next_offset)
        });
        if par == Some(20) && kid == Some(20) && cursor == Some(20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "archive: par {par:?} kid {kid:?} cursor {cursor:?}; log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
    s.kill9();
    std::fs::remove_dir_all(&s.data_dir).unwrap();
    s.restart().await;
    assert_eq!(readyz(&s).await, json!({"status": "ready"}), "{}", s.log());
    let r = call_as(
        &s,
        root,
        Method::POST,
        "/v1/topics/par/produce",
        Some(json!({"after": "restore"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["offset"], 20, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = call_as(
            &s,
            root,
            Method::GET,
            "/v1/topics/kid/consume?partition=0&offset=20",
            None,
        )
        .await;
        if r.status() == StatusCode::OK {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["payload"], json!({"after": "restore"}), "{v}");
            break;
        }
        let c: Value = call_as(&s, root, Method::GET, "/v1/topics/par/children", None)
            .await
            .json()
            .await
            .unwrap();
        assert!(
            Instant::now() < deadline,
            "the child never got it; children: {c}; log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
    // and its readers get it: the child's queue goes on at its restored tail
    let r = call_as(
        &s,
        root,
        Method::GET,
        "/v1/topics/kid/consume?wait=5s",
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "{}", s.log());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["payload"], json!({"after": "restore"}), "{v}");
}
