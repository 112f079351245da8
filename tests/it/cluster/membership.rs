//! Membership and metadata: forming a cluster, leader kills, joiners and strangers, users and
//! topics followed by every member, the dev cluster, decommissioning, tiering by owners.

use super::*;

const WRONG: &str = "another secret entirely, also more than 32 bytes";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_form_a_cluster_survive_a_leader_kill_take_a_joiner_and_keep_a_stranger_out()
{
    let root = tempfile::tempdir().unwrap();
    let (mut nodes, members) = three(root.path(), false).await;
    for n in &nodes {
        until(
            &format!("node {} ready; log:\n{}", n.id, n.log()),
            60,
            async || n.ready().await,
        )
        .await;
    }
    let s = nodes[0].status().await.unwrap();
    let leader = leader_of(&s).expect("a leader");
    assert_eq!(voters(&s), 3, "{s}");
    for n in &nodes {
        let st = n.status().await.unwrap();
        assert_eq!(leader_of(&st), Some(leader), "one leader for all: {st}");
        assert_eq!(st["node_id"], n.id);
    }
    // the CLI shows the same
    let cli = |args: &'static [&'static str]| {
        let base = nodes[2].base.clone();
        async move {
            let out = tokio::process::Command::new(BIN)
                .args(args)
                .env("NARAD_ADDR", base)
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let status = cli(&["cluster", "status"]).await;
    assert!(
        status.contains(&format!("leader      {leader}")),
        "{status}"
    );
    assert!(status.contains("ready       true"), "{status}");
    let listed = cli(&["cluster", "members"]).await;
    assert_eq!(
        listed.lines().filter(|l| l.contains("true")).count(),
        3,
        "{listed}"
    );
    assert!(nodes[0].metrics().await.contains("narad_raft_term"));

    // the leader is killed: the two others elect one and are ready again
    let old = leader as usize - 1;
    nodes[old].kill9();
    let took = until("a new leader", 30, async || {
        let mut ok = true;
        for (i, n) in nodes.iter().enumerate() {
            if i == old {
                continue;
            }
            let st = n.status().await;
            ok &= st.as_ref().and_then(leader_of).is_some_and(|l| l != leader) && n.ready().await;
        }
        ok
    })
    .await;
    eprintln!("new leader and ready after the leader's SIGKILL: {took:?}");
    // it comes back, follows, and is ready
    nodes[old].start().await;
    until("the old leader ready again", 30, async || {
        nodes[old].ready().await
    })
    .await;
    let st = nodes[old].status().await.unwrap();
    assert_ne!(leader_of(&st), None);

    // a fourth node, not among the initial members, joins
    let mut fourth = Node::new(4, root.path(), &members, SECRET);
    fourth.start().await;
    joined(&nodes, &fourth, 60).await;

    // a node with the wrong secret is never admitted, and the members count why
    let mut stranger = Node::new(5, root.path(), &members, WRONG);
    stranger.start().await;
    until("refusals counted", 30, async || {
        let mut refused = 0;
        for n in &nodes {
            refused += n
                .metrics()
                .await
                .lines()
                .filter(|l| {
                    l.starts_with("narad_rpc_handshakes_total{")
                        && l.contains("outcome=\"unknown_key\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64;
        }
        refused > 0
    })
    .await;
    assert!(!stranger.ready().await);
    let st = stranger.status().await.unwrap();
    assert_eq!(voters(&st), 0, "{st}");
    assert!(nodes[0].status().await.is_some_and(|s| voters(&s) == 4));

    // the fourth is lost for good: an operator removes it through any member
    fourth.kill9();
    let delete = async |n: &Node, id: u64| {
        n.http
            .delete(format!("{}/v1/cluster/members/{id}", n.base))
            .send()
            .await
            .unwrap()
    };
    removed(&nodes, 1, 4).await;
    expect_error(
        delete(&nodes[1], 4).await,
        StatusCode::NOT_FOUND,
        "member_not_found",
    )
    .await;
    // three voters is the floor, and the leader is never removed from under itself
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let other = (1..=3).find(|id| *id != leader).unwrap();
    expect_error(
        delete(&nodes[0], other).await,
        StatusCode::CONFLICT,
        "member_not_removable",
    )
    .await;
    expect_error(
        delete(&nodes[0], leader).await,
        StatusCode::CONFLICT,
        "member_not_removable",
    )
    .await;
    let cli_out = tokio::process::Command::new(BIN)
        .args(["cluster", "remove", "9"])
        .env("NARAD_ADDR", &nodes[0].base)
        .output()
        .await
        .unwrap();
    assert!(!cli_out.status.success());
    assert!(
        String::from_utf8_lossy(&cli_out.stderr).contains("member_not_found")
            || String::from_utf8_lossy(&cli_out.stderr).contains("not a member"),
        "{}",
        String::from_utf8_lossy(&cli_out.stderr)
    );
}

/// Users live in the metastore: made through one member, they log in on every member, a
/// password change or a delete through another takes effect everywhere, and the root user is
/// created once for the whole cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_made_through_any_member_log_in_on_every_member() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let (mut nodes, _) = three(root.path(), true).await;
    for n in &nodes {
        until(
            &format!("node {} ready; log:\n{}", n.id, n.log()),
            60,
            async || n.ready().await,
        )
        .await;
    }
    let admin = ("admin", ROOT_PW);
    // one root for the whole cluster, usable on every member
    for n in &nodes {
        let (st, body) = n.call(admin, Method::GET, "/v1/users", None).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert_eq!(body["users"].as_array().map(Vec::len), Some(1), "{body}");
    }
    // made through node 1: there at once (read-your-writes), then everywhere
    let alice = serde_json::json!({"username": "alice", "password": ALICE_PW, "grants": []});
    let (st, body) = nodes[0]
        .call(admin, Method::POST, "/v1/users", Some(alice.clone()))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let (st, _) = nodes[0]
        .call(admin, Method::GET, "/v1/users/alice", None)
        .await;
    assert_eq!(st, StatusCode::OK);
    for n in &nodes {
        until("alice logs in on every member", 10, async || {
            n.login("alice", ALICE_PW).await == StatusCode::OK
        })
        .await;
    }
    // the same name again, through another member: refused as on one node
    let (st, body) = nodes[2]
        .call(admin, Method::POST, "/v1/users", Some(alice))
        .await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("user_exists")),
        "{body}"
    );
    // a new password set through node 2: the old one stops working on node 1
    let new_pw = "a brand new password";
    let (st, body) = nodes[1]
        .call(
            admin,
            Method::PUT,
            "/v1/users/alice/password",
            Some(serde_json::json!({"new_password": new_pw})),
        )
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{body}");
    until("the old password refused on node 1", 10, async || {
        nodes[0].login("alice", ALICE_PW).await == StatusCode::UNAUTHORIZED
    })
    .await;
    let (st, _) = nodes[0]
        .call(("alice", new_pw), Method::GET, "/v1/users/alice", None)
        .await;
    assert_eq!(st, StatusCode::OK);
    // deleted through node 3: gone everywhere
    let (st, _) = nodes[2]
        .call(admin, Method::DELETE, "/v1/users/alice", None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    for n in &nodes {
        until("alice refused everywhere", 10, async || {
            n.login("alice", new_pw).await == StatusCode::UNAUTHORIZED
        })
        .await;
    }
    // a remote added through node 1 is on every member, its password sealed in the
    // replicated log and snapshots
    let remote_pw = "the password of the mirror user on the other cluster";
    let r = serde_json::json!({"name": "dr", "url": "https://mirror.example.com/", "username": "mirror", "password": remote_pw});
    let (st, body) = nodes[0]
        .call(admin, Method::POST, "/v1/remotes", Some(r.clone()))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(body["credential"]["sealed_with"], "current", "{body}");
    for n in &nodes {
        until("the remote on every member", 10, async || {
            let (st, b) = n.call(admin, Method::GET, "/v1/remotes/dr", None).await;
            st == StatusCode::OK && b["credential"]["sealed_with"] == "current"
        })
        .await;
    }
    let (st, body) = nodes[1]
        .call(admin, Method::POST, "/v1/remotes", Some(r))
        .await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("remote_exists")),
        "{body}"
    );
    // changed through node 3 (a new user takes the password again)
    let (st, body) = nodes[2]
        .call(
            admin,
            Method::PATCH,
            "/v1/remotes/dr",
            Some(serde_json::json!({"username": "mirror2", "password": remote_pw, "version": 1})),
        )
        .await;
    assert_eq!(
        (st, body["version"].as_u64()),
        (StatusCode::OK, Some(2)),
        "{body}"
    );
    let (st, body) = nodes[0]
        .call(
            admin,
            Method::PATCH,
            "/v1/remotes/dr",
            Some(serde_json::json!({"password": remote_pw, "version": 1})),
        )
        .await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("remote_changed")),
        "{body}"
    );
    // users acknowledged by the leader just before it is killed with SIGKILL: each 201 means
    // committed on a quorum, so every one must be on the survivors and, restarted, on it
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap() as usize - 1;
    let made = futures_util::future::join_all((0..8).map(|i| {
        let user = serde_json::json!({"username": format!("k{i}"), "password": ALICE_PW});
        nodes[leader].call(admin, Method::POST, "/v1/users", Some(user))
    }))
    .await;
    assert!(
        made.iter().all(|(st, _)| *st == StatusCode::CREATED),
        "{made:?}"
    );
    nodes[leader].kill9();
    let other = (leader + 1) % 3;
    let bob = serde_json::json!({"username": "bob", "password": ALICE_PW});
    let (st, body) = nodes[other]
        .call(admin, Method::POST, "/v1/users", Some(bob))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    // restarted, the old leader has bob too, and still exactly one root
    nodes[leader].start().await;
    until("the old leader ready", 60, async || {
        nodes[leader].ready().await
    })
    .await;
    until("bob on the old leader", 10, async || {
        nodes[leader].login("bob", ALICE_PW).await == StatusCode::OK
    })
    .await;
    let (_, body) = nodes[leader]
        .call(admin, Method::GET, "/v1/users", None)
        .await;
    let names: Vec<&str> = body["users"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["username"].as_str())
        .collect();
    let mut want = vec!["admin".to_owned(), "bob".to_owned()];
    want.extend((0..8).map(|i| format!("k{i}")));
    assert_eq!(names, want, "{body}");
    // and the survivors hold them too, and the remote
    for n in &nodes {
        let (_, body) = n.call(admin, Method::GET, "/v1/users", None).await;
        assert_eq!(
            body["users"].as_array().map(Vec::len),
            Some(want.len()),
            "{body}"
        );
        let (st, body) = n.call(admin, Method::GET, "/v1/remotes/dr", None).await;
        assert_eq!(
            (st, body["username"].as_str()),
            (StatusCode::OK, Some("mirror2")),
            "{body}"
        );
    }
    // the password is in no file of any member (log, snapshots, catalog) nor in any log
    for n in &nodes {
        for f in files_under(&n.dir) {
            let bytes = std::fs::read(&f).unwrap_or_default();
            assert!(
                !contains(&bytes, remote_pw.as_bytes()),
                "the remote's password is in clear in {}",
                f.display()
            );
        }
        assert!(
            !n.log().contains(remote_pw),
            "the password is in node {}'s log",
            n.id
        );
    }
    // deleted through one member: gone on every one
    let (st, _) = nodes[other]
        .call(admin, Method::DELETE, "/v1/remotes/dr", None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    for n in &nodes {
        until("the remote gone everywhere", 10, async || {
            n.call(admin, Method::GET, "/v1/remotes/dr", None).await.0 == StatusCode::NOT_FOUND
        })
        .await;
    }
}

/// Topics made, changed and deleted through any member are there on every member (at once
/// on the one that answered), with their partitions spread over the members; a member that
/// was down while topics changed catches up when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_changed_through_any_member_are_followed_by_every_member() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    let get = async |n: &Node, name: &str| {
        n.call(anyone, Method::GET, &format!("/v1/topics/{name}"), None)
            .await
    };
    let (st, made) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "orders", "partitions": 6})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{made}");
    // read-your-writes on the member that answered
    let (st, body) = get(&nodes[0], "orders").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    assert_eq!(owners.len(), 6, "{made}");
    for id in 1..=3u64 {
        assert_eq!(owners.iter().filter(|o| **o == id).count(), 2, "{made}");
    }
    for n in &nodes {
        until(&format!("orders on node {}", n.id), 10, async || {
            get(n, "orders").await.1["id"] == made["id"]
        })
        .await;
        // every member shows every partition's figures (the others' from their owners)
        let (_, body) = get(n, "orders").await;
        let shown: Vec<u64> = body["partition_stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["partition"].as_u64().unwrap())
            .collect();
        assert_eq!(
            shown,
            (0..6u64).collect::<Vec<_>>(),
            "node {}: {body}",
            n.id
        );
    }
    // the same name through another member: refused as on one node
    let (st, body) = nodes[1]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "orders"})),
        )
        .await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("topic_exists")),
        "{body}"
    );
    // grown through node 3: the old owners stay, the new partitions get owners
    let (st, body) = nodes[2]
        .call(
            anyone,
            Method::PATCH,
            "/v1/topics/orders",
            Some(serde_json::json!({"partitions": 8})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let grown: Vec<u64> = serde_json::from_value(body["partition_owners"].clone()).unwrap();
    assert_eq!(grown.len(), 8, "{body}");
    assert_eq!(grown[..6], owners[..], "{body}");
    until("8 partitions on node 1", 10, async || {
        get(&nodes[0], "orders").await.1["partitions"] == 8
    })
    .await;
    // a member down while topics change catches up when it is back
    nodes[2].kill9();
    let (st, body) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "late", "partitions": 2})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    // deleted through node 2: gone there at once, then everywhere
    let (st, _) = nodes[1]
        .call(anyone, Method::DELETE, "/v1/topics/orders", None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    assert_eq!(get(&nodes[1], "orders").await.0, StatusCode::NOT_FOUND);
    let orders_dir = format!("orders.{}", made["id"].as_str().unwrap());
    nodes[2].start().await;
    until("node 3 ready again", 60, async || nodes[2].ready().await).await;
    for n in &nodes {
        until(
            &format!("the catalog followed on node {}", n.id),
            10,
            async || {
                get(n, "orders").await.0 == StatusCode::NOT_FOUND
                    && get(n, "late").await.0 == StatusCode::OK
            },
        )
        .await;
    }
    // every member removed its data (node 3 once it had followed the delete)
    for n in &nodes {
        let dir = n.dir.join("topics").join(&orders_dir);
        until(&format!("{} removed", dir.display()), 10, async || {
            !dir.exists()
        })
        .await;
    }
}

/// Waits (60 s at most) until every node of a dev cluster answers `/readyz` 200; on a
/// timeout, fails with what `/readyz` said and the nodes' logs.
async fn wait_ready(http: &reqwest::Client, bases: &[String], dir: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for b in bases {
        loop {
            let r = http.get(format!("{b}/readyz")).send().await;
            if matches!(&r, Ok(r) if r.status() == StatusCode::OK) {
                break;
            }
            if Instant::now() > deadline {
                let said = match r {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(e) => e.to_string(),
                };
                panic!("{}\n{b} not {what}: {said}", dev_logs(dir, bases.len()));
            }
            poll_pause().await;
        }
    }
}

/// The tails of a dev cluster's node logs (for a failure's message: CI shows the end of a
/// failed test's output, so what failed goes after them).
fn dev_logs(dir: &Path, n: usize) -> String {
    let logs: Vec<String> = (1..=n)
        .map(|i| {
            let log = std::fs::read_to_string(dir.join(format!("n{i}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("── n{i}.log ──\n{}", tail.join("\n"))
        })
        .collect();
    logs.join("\n")
}

/// `narad server start --dev --nodes 3`: three processes forming a cluster on loopback,
/// their addresses printed; any node serves; SIGTERM to the launcher stops all three; a
/// restart on the same directory is the same cluster with its data, and a launcher nobody
/// reads (its stdout closed) keeps it running: `println!` on the closed pipe used to panic
/// the launcher, and its nodes went down with it (a CI flake, whenever the test dropped its
/// reader before the launcher's last line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_nodes_3_is_a_cluster_that_stops_as_one_and_restarts_with_its_data() {
    use reqwest::Method;
    use tokio::io::AsyncBufReadExt;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("dev");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // `deaf`: the launcher's stdout is closed before it writes a line (a reader that went
    // away, as `| head -1` does); the nodes' addresses come from their address files
    let launch = async |deaf: bool| {
        for i in 1..=3 {
            let _ = std::fs::remove_file(dir.join(format!("n{i}.addr")));
        }
        let mut child = tokio::process::Command::new(BIN)
            .args([
                "server",
                "start",
                "--dev",
                "--nodes",
                "3",
                "--port",
                "0",
                "--segment-max-bytes",
                "4096",
                "--addr-file",
            ])
            .arg(root.path().join("launcher.addr"))
            .arg("--data-dir")
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut bases = Vec::new();
        if deaf {
            drop(out);
            for i in 1..=3 {
                let file = dir.join(format!("n{i}.addr"));
                until(&format!("{} written", file.display()), 60, async || {
                    std::fs::read_to_string(&file).is_ok()
                })
                .await;
                let addr = std::fs::read_to_string(&file).unwrap();
                bases.push(format!("http://{}", addr.trim()));
            }
            return (child, bases);
        }
        let mut lines = tokio::io::BufReader::new(out).lines();
        let read = async {
            while bases.len() < 3 {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the launcher printed its nodes");
                if let Some(rest) = line
                    .trim()
                    .strip_prefix(&format!("node {}: ", bases.len() + 1))
                {
                    bases.push(rest.split_whitespace().next().unwrap().to_owned());
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("three nodes listed");
        (child, bases)
    };
    let (mut child, bases) = launch(false).await;
    wait_ready(&http, &bases, &dir, "ready").await;
    // the launcher's --addr-file names node 1
    let launcher = root.path().join("launcher.addr");
    until("the launcher's address file", 30, async || {
        launcher.exists()
    })
    .await;
    let named = std::fs::read_to_string(&launcher).unwrap();
    assert_eq!(format!("http://{}", named.trim()), bases[0]);
    let call = async |base: &str, method: Method, path: &str, body: Option<&str>| {
        let mut r = http.request(method, format!("{base}{path}"));
        if let Some(b) = body {
            r = r.body(b.to_owned());
        }
        let r = r.send().await.unwrap();
        let st = r.status();
        (st, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    let (st, _) = call(
        &bases[0],
        Method::POST,
        "/v1/topics",
        Some(r#"{"name":"t","partitions":3}"#),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    for b in &bases {
        until("t everywhere", 10, async || {
            call(b, Method::GET, "/v1/topics/t", None).await.0 == StatusCode::OK
        })
        .await;
    }
    let (st, _) = call(
        &bases[1],
        Method::POST,
        "/v1/topics/t/produce",
        Some("hello"),
    )
    .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (st, m) = call(&bases[2], Method::GET, "/v1/topics/t/consume", None).await;
    assert_eq!(
        (st, m["payload"].as_str()),
        (StatusCode::OK, Some("hello")),
        "{m}"
    );
    // the nodes took the launcher's storage flags: 4 KiB segments roll after a few messages
    let big = "x".repeat(3000);
    for _ in 0..4 {
        let (st, _) = call(
            &bases[0],
            Method::POST,
            "/v1/topics/t/produce?partition=0",
            Some(&big),
        )
        .await;
        assert_eq!(st, StatusCode::ACCEPTED);
    }
    let segments = |d: &std::path::Path| {
        std::fs::read_dir(d).map_or(0, |r| {
            r.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "log"))
            })
            .count()
        })
    };
    let most = (1..=3)
        .flat_map(|i| {
            std::fs::read_dir(dir.join(format!("n{i}")).join("topics"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|t| segments(&t.path().join("p00000")))
        })
        .max()
        .unwrap_or(0);
    assert!(most >= 2, "partition 0 never rolled a 4 KiB segment");
    // and the sealed ones went to the archive the members share (`<data-dir>/archive`)
    let archived = |d: &std::path::Path| -> usize {
        let mut n = 0;
        let mut stack = vec![d.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "parquet") {
                    n += 1;
                }
            }
        }
        n
    };
    until("a sealed segment in the shared archive", 60, async || {
        archived(&dir.join("archive")) > 0
    })
    .await;
    // SIGTERM to the launcher: every node stops
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let st = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the launcher stopped")
        .unwrap();
    assert!(st.success(), "{st}");
    for b in &bases {
        assert!(
            http.get(format!("{b}/healthz")).send().await.is_err(),
            "{b} still answers"
        );
    }
    // the same cluster again, with its topic and its five unacked messages (the leased
    // "hello" among them; which comes first is the partitions' business)
    let (mut child, bases) = launch(true).await;
    wait_ready(&http, &bases, &dir, "ready again").await;
    let mut got: Vec<String> = Vec::new();
    until(
        "the five unacked messages after the restart",
        30,
        async || {
            let (st, m) = call(
                &bases[0],
                Method::GET,
                "/v1/topics/t/consume?max=10&wait=1s",
                None,
            )
            .await;
            assert!(
                st == StatusCode::OK || st == StatusCode::NO_CONTENT,
                "{st} {m}"
            );
            for msg in m["messages"].as_array().into_iter().flatten() {
                got.push(msg["payload"].as_str().unwrap().to_owned());
            }
            got.len() >= 5
        },
    )
    .await;
    got.sort();
    let mut want = vec![big.clone(); 4];
    want.insert(0, "hello".to_owned());
    assert!(got == want, "after the restart: {got:?}");
    // the launcher killed outright: its nodes go with it (none is left holding ports)
    child.kill().await.unwrap();
    let t = Instant::now();
    for b in &bases {
        while http.get(format!("{b}/healthz")).send().await.is_ok() {
            if t.elapsed() > Duration::from_secs(30) {
                panic!(
                    "{}\n{b} still up 30 s after its launcher was killed",
                    dev_logs(&dir, 3)
                );
            }
            poll_pause().await;
        }
    }
}

/// Partition `p` of `topic`'s manifest in a `file://` archive at `archive`, if written.
fn archived_manifest(archive: &Path, topic: &str, p: u32) -> Option<Value> {
    let path = archive
        .join(format!("topic={topic}"))
        .join(format!("partition={p}"))
        .join("_manifest.json");
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// A member restarted with the directory of a topic that is no longer in the catalog (the
/// delete was applied by its state machine, and it stopped before it removed the data):
/// once the member is ready (its catalog confirmed current), the directory is removed; the
/// topics of the catalog keep theirs. A topic deleted while the member was down goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_back_removes_the_data_of_topics_deleted_meanwhile() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let keep = topic_everywhere(&nodes, serde_json::json!({"name": "keep", "partitions": 3})).await;
    let gone = topic_everywhere(&nodes, serde_json::json!({"name": "gone", "partitions": 3})).await;
    let dir_of = |t: &Value| {
        nodes[2].dir.join("topics").join(format!(
            "{}.{}",
            t["name"].as_str().unwrap(),
            t["id"].as_str().unwrap()
        ))
    };
    let (keep_dir, gone_dir) = (dir_of(&keep), dir_of(&gone));
    assert!(keep_dir.is_dir() && gone_dir.is_dir());
    nodes[2].kill9();
    let (st, _) = nodes[0]
        .call(("x", "y"), Method::DELETE, "/v1/topics/gone", None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    // what an interrupted delete leaves: a directory no topic names
    let orphan = nodes[2]
        .dir
        .join("topics")
        .join("was-here.00000000000000ab");
    std::fs::create_dir_all(orphan.join("0")).unwrap();
    std::fs::write(
        orphan.join("0").join("00000000000000000000.log"),
        b"old bytes",
    )
    .unwrap();
    nodes[2].start().await;
    let n = &nodes[2];
    until("node 3 ready again", 60, async || n.ready().await).await;
    until("the deleted topics' data removed", 30, async || {
        !orphan.exists() && !gone_dir.exists()
    })
    .await;
    assert!(keep_dir.is_dir(), "a live topic keeps its data");
    let (st, _) = n
        .call(("x", "y"), Method::GET, "/v1/topics/keep", None)
        .await;
    assert_eq!(st, StatusCode::OK);
}

/// Tiering in a cluster: each partition's owner uploads its sealed segments to the shared
/// archive (every record once, in its partition's objects); once they are gone from the
/// owners' disks, a replay read through any member gets them from the archive; the catalog
/// snapshot is written by the Raft leader, and with that leader killed, by the next one
/// when the catalog changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_tier_their_partitions_and_the_leader_writes_the_catalog() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let archive = root.path().join("archive");
    let mut nodes = three_with(root.path(), |n| {
        n.archive = Some(format!("file://{}", archive.display()));
        n.env = vec![
            ("NARAD_SEGMENT_MAX_AGE_MS".into(), "1000".into()),
            ("NARAD_TIERING_INTERVAL_MS".into(), "100".into()),
            // archived segments leave the disk at once: old history is the archive's
            ("NARAD_LOCAL_RETENTION_MS".into(), "1".into()),
            ("NARAD_RETENTION_INTERVAL_MS".into(), "100".into()),
        ];
    })
    .await;
    all_ready(&nodes).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "arch", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    assert_eq!(
        owners
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3,
        "one partition per member: {owners:?}"
    );
    for p in 0..3 {
        for i in 0..10 {
            let r = nodes[i % 3]
                .http
                .post(format!(
                    "{}/v1/topics/arch/produce?partition={p}",
                    nodes[i % 3].base
                ))
                .body(format!("p{p}-{i}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::ACCEPTED);
        }
    }
    let manifest = |p: u32| archived_manifest(&archive, "arch", p);
    until("every partition archived by its owner", 60, async || {
        (0..3).all(|p| manifest(p).is_some_and(|m| m["next_offset"] == 10))
    })
    .await;
    for p in 0..3 {
        let m = manifest(p).unwrap();
        let rows: u64 = m["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["rows"].as_u64().unwrap())
            .sum();
        assert_eq!(rows, 10, "partition {p}: every record once: {m}");
    }
    // once the owners' disks no longer hold the first records, a replay read through any
    // member still gets them: from the archive, on the partition's owner
    until(
        "archived segments gone from the owners' disks",
        60,
        async || {
            let (_, t) = nodes[0]
                .call(("x", "y"), Method::GET, "/v1/topics/arch", None)
                .await;
            t["partition_stats"]
                .as_array()
                .is_some_and(|ps| ps.len() == 3 && ps.iter().all(|p| p["oldest_offset"] == 10))
        },
    )
    .await;
    // (a read from the archive ends with the object it read: page on from the last offset)
    for n in &nodes {
        for p in 0..3 {
            let mut payloads: Vec<String> = Vec::new();
            while payloads.len() < 10 {
                let at = payloads.len();
                let (st, got) = n
                    .call(
                        ("x", "y"),
                        Method::GET,
                        &format!("/v1/topics/arch/consume?partition={p}&offset={at}&max=100"),
                        None,
                    )
                    .await;
                assert_eq!(st, StatusCode::OK, "node {} p{p} at {at}: {got}", n.id);
                let msgs = got["messages"].as_array().unwrap();
                assert!(!msgs.is_empty(), "node {} p{p} at {at}: {got}", n.id);
                for m in msgs {
                    assert_eq!(m["offset"].as_u64(), Some(payloads.len() as u64), "{got}");
                    payloads.push(m["payload"].as_str().unwrap().to_owned());
                }
            }
            let want: Vec<String> = (0..10).map(|i| format!("p{p}-{i}")).collect();
            assert_eq!(payloads, want, "node {} p{p}", n.id);
        }
    }
    let snapshot = archive.join("_catalog").join("catalog.bin");
    until("the catalog snapshot written", 30, async || {
        snapshot.is_file()
    })
    .await;
    // the leader killed: the next one writes the snapshot when the catalog changes
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let l = nodes.iter().position(|n| n.id == leader).unwrap();
    let before = std::fs::read(&snapshot).unwrap();
    nodes[l].kill9();
    let other = &nodes[(l + 1) % 3];
    until("a topic made after the leader died", 60, async || {
        let (st, _) = other
            .call(
                ("x", "y"),
                Method::POST,
                "/v1/topics",
                Some(serde_json::json!({"name": "later"})),
            )
            .await;
        st == StatusCode::CREATED || st == StatusCode::CONFLICT
    })
    .await;
    until("the new leader rewrote the snapshot", 30, async || {
        std::fs::read(&snapshot).is_ok_and(|b| b != before)
    })
    .await;
}

/// Decommissioning the member that leads: its partitions move away first, then it hands its
/// leadership on (it stops heartbeating and standing for election), a new leader is elected
/// among the others and removes it; the three left hold every partition and take writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decommissioned_leader_hands_its_leadership_on_and_leaves_last() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "c", "partitions": 8})).await;
    let mut fourth = Node::new(4, root.path(), &nodes[0].members, SECRET);
    fourth.start().await;
    until("the joiner ready", 90, async || fourth.ready().await).await;
    let all: Vec<&Node> = nodes.iter().chain([&fourth]).collect();
    until("8 partitions spread over 4 members", 90, async || {
        let c = partition_counts(&nodes[0]).await;
        c.len() == 4 && c.iter().all(|&(_, n)| n == 2)
    })
    .await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let via = all.iter().find(|n| n.id != leader).unwrap();
    let (st, body) = via
        .call(
            ("x", "y"),
            Method::POST,
            &format!("/v1/cluster/members/{leader}/decommission"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    let rest: Vec<&Node> = all.iter().copied().filter(|n| n.id != leader).collect();
    let took = until(
        "the leader drained, handed on and removed",
        90,
        async || {
            let Some(s) = rest[0].status().await else {
                return false;
            };
            let members: Vec<u64> = s["members"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["node_id"].as_u64())
                .collect();
            members.len() == 3
                && !members.contains(&leader)
                && leader_of(&s).is_some_and(|l| l != leader)
        },
    )
    .await;
    println!("leader {leader} decommissioned in {took:?}");
    let counts = partition_counts(rest[0]).await;
    assert_eq!(counts.iter().map(|c| c.1).sum::<u64>(), 8, "{counts:?}");
    assert!(counts.iter().all(|c| c.0 != leader), "{counts:?}");
    for n in &rest {
        until(&format!("node {} ready", n.id), 30, async || {
            n.ready().await
        })
        .await;
    }
    // the three take metadata writes and messages on every partition
    create_when_writable(rest[1], "after", "a create after the hand-off").await;
    for p in 0..8 {
        let r = rest[p % 3]
            .http
            .post(format!(
                "{}/v1/topics/c/produce?partition={p}",
                rest[p % 3].base
            ))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED, "partition {p}");
    }
}
