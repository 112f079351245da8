//! Cluster members as real processes on loopback: forming, readiness, a leader killed with
//! SIGKILL, a restart, a node joining, and a node with the wrong secret kept out.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use narad_bench::lifecycle::{FaultKind, MsgId, Recorder};
use narad_bench::narad::Http;
use serde_json::Value;

use crate::lifecycle::consume_and_ack;
use crate::support::{BIN, StatusCode, expect_error, poll_pause};

const SECRET: &str = "cluster secret for the cluster tests, 32+ bytes";
const WRONG: &str = "another secret entirely, also more than 32 bytes";
const ROOT_PW: &str = "the root password of the test cluster";
const ALICE_PW: &str = "alice's password, long enough";

struct Node {
    id: u64,
    child: Option<Child>,
    dir: PathBuf,
    rpc: String,
    members: String,
    secret: &'static str,
    /// Security on (no `--dev`), the root password from NARAD_ADMIN_PASSWORD.
    secure: bool,
    base: String,
    http: reqwest::Client,
    /// Run inside this network namespace (name, the address its HTTP listener binds).
    netns: Option<(String, String)>,
    /// `--archive-url` (default `off`) and more environment for the process.
    archive: Option<String>,
    env: Vec<(String, String)>,
}

/// A free UDP port on loopback (bound, then released for the node to take), never one handed
/// out in the last two minutes by this or another test process: the kernel may offer a
/// released port again at once, and nextest runs tests as parallel processes, so two members
/// (of one test or of two) once listed the same address and one could not bind it. The ports
/// handed out are kept in a file in the temporary directory, under an exclusive lock.
fn udp_port() -> u16 {
    use std::io::{Read, Seek, Write};
    const KEEP_SECS: u64 = 120;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(std::env::temp_dir().join("narad-it-udp-ports"))
        .unwrap();
    file.lock().unwrap();
    let now = u64::try_from(crate::support::wall_clock_ms() / 1000).unwrap();
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    // "<port> <unix seconds>" per line; the stale ones are dropped
    let mut given: Vec<(u16, u64)> = text
        .lines()
        .filter_map(|l| {
            let (p, t) = l.split_once(' ')?;
            Some((p.parse().ok()?, t.parse().ok()?))
        })
        .filter(|&(_, t)| now.saturating_sub(t) < KEEP_SECS)
        .collect();
    let port = loop {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.iter().any(|&(p, _)| p == port) {
            break port;
        }
    };
    given.push((port, now));
    let text: String = given.iter().map(|(p, t)| format!("{p} {t}\n")).collect();
    file.set_len(0).unwrap();
    file.rewind().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    port
}

thread_local! {
    /// Where and why the test panicked first on this thread (see [`remember_failures`]).
    static FAILURE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Keeps the message of the panic that fails a test, so that it can be said again after the
/// members' logs: those follow the panic's own report in a failed test's output, and CI shows
/// only the tail of that output (a failure there once showed logs and no reason).
fn remember_failures() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            FAILURE.with(|f| {
                f.borrow_mut().get_or_insert_with(|| info.to_string());
            });
            report(info);
        }));
    });
}

impl Node {
    fn new(id: u64, root: &Path, members: &str, secret: &'static str) -> Self {
        remember_failures();
        Self {
            id,
            child: None,
            dir: root.join(format!("n{id}")),
            rpc: format!("127.0.0.1:{}", udp_port()),
            members: members.to_owned(),
            secret,
            secure: false,
            base: String::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            netns: None,
            archive: None,
            env: Vec::new(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }

    /// Starts the process and waits for its HTTP address (not for readiness: a member is
    /// ready only once a quorum is up).
    async fn start(&mut self) {
        let addr_file = self.dir.with_extension("addr");
        let _ = std::fs::remove_file(&addr_file);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .unwrap();
        let mut cmd = match &self.netns {
            // inside the namespace, listening where the test reaches it, security off
            Some((ns, ip)) => {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", ns, BIN, "serve", "--listen"])
                    .arg(format!("{ip}:0"))
                    .env("NARAD_SECURITY_ENABLED", "false");
                cmd
            }
            None => {
                let mut cmd = Command::new(BIN);
                cmd.args(["server", "start"]);
                if self.secure {
                    cmd.env("NARAD_ADMIN_PASSWORD", ROOT_PW);
                } else {
                    cmd.arg("--dev");
                }
                cmd.args(["--port", "0"]);
                cmd
            }
        };
        let archive = self.archive.as_deref().unwrap_or("off");
        let child = cmd
            .args(["--archive-url", archive, "--data-dir"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg(&self.dir)
            .arg("--addr-file")
            .arg(&addr_file)
            .env("RUST_LOG", "info")
            .env("NARAD_NODE_ID", self.id.to_string())
            .env("NARAD_CLUSTER_ADDR", &self.rpc)
            .env("NARAD_CLUSTER_MEMBERS", &self.members)
            .env("NARAD_CLUSTER_SECRET", self.secret)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                break a;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("node {} exited ({st}); log:\n{}", self.id, self.log());
            }
            assert!(Instant::now() < deadline, "node {} did not bind", self.id);
            poll_pause().await;
        };
        self.base = format!("http://{addr}");
    }

    /// The UDP port of its cluster endpoint.
    fn rpc_port(&self) -> u16 {
        self.rpc.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Sends the member's process `signal` (`STOP`, `CONT`).
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        assert!(
            run(&["kill", &format!("-{signal}"), &pid]),
            "kill -{signal}"
        );
    }

    async fn ready(&self) -> bool {
        matches!(self.http.get(format!("{}/readyz", self.base)).send().await, Ok(r) if r.status() == StatusCode::OK)
    }

    async fn status(&self) -> Option<Value> {
        let mut r = self.http.get(format!("{}/v1/cluster", self.base));
        if self.secure {
            r = r.basic_auth("admin", Some(ROOT_PW));
        }
        r.send().await.ok()?.json().await.ok()
    }

    /// A request as `user` (HTTP Basic), with an optional JSON body: (status, body).
    async fn call(
        &self,
        user: (&str, &str),
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .basic_auth(user.0, Some(user.1));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path} through node {}: {e}", self.id));
        let st = r.status();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    /// How the member answers `user` (with `pw`) reading its own record: 200 while the
    /// credentials log in, 401 once they do not.
    async fn login(&self, user: &str, pw: &str) -> StatusCode {
        let path = format!("/v1/users/{user}");
        self.call((user, pw), reqwest::Method::GET, &path, None)
            .await
            .0
    }

    /// Settles `handle` on `topic` through this member (`extra`: more query, `&extend=0`).
    async fn ack(&self, topic: &str, handle: &str, extra: &str) -> (StatusCode, Value) {
        let path = format!("/v1/topics/{topic}/ack?receipt_handle={handle}{extra}");
        self.call(("x", "y"), reqwest::Method::POST, &path, None)
            .await
    }

    async fn metrics(&self) -> String {
        let mut r = self.http.get(format!("{}/metrics", self.base));
        if self.secure {
            r = r.basic_auth("admin", Some(ROOT_PW));
        }
        r.send().await.unwrap().text().await.unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let log = self.log();
            // (NARAD_TEST_KEEP_LOGS=<dir>: every log whole, for a failure to study)
            if let Some(dir) = std::env::var_os("NARAD_TEST_KEEP_LOGS") {
                let _ = std::fs::write(
                    std::path::Path::new(&dir).join(format!("node-{}.log", self.id)),
                    &log,
                );
            }
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("── node {} log, last lines ──", self.id);
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
            FAILURE.with(|f| {
                if let Some(why) = f.borrow().as_deref() {
                    // (a message may carry a whole log; its head says what failed)
                    let head: String = why.chars().take(2000).collect();
                    eprintln!("── the test failed (node {} stopped): {head}", self.id);
                }
            });
        }
    }
}

async fn until<F: AsyncFnMut() -> bool>(what: &str, secs: u64, mut f: F) -> Duration {
    let t = Instant::now();
    while !f().await {
        assert!(t.elapsed() < Duration::from_secs(secs), "timed out: {what}");
        poll_pause().await;
    }
    t.elapsed()
}

fn leader_of(s: &Value) -> Option<u64> {
    s["leader"].as_u64()
}

fn voters(s: &Value) -> usize {
    s["members"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["voter"] == true).count())
}

/// Waits until `fourth` (started, not among the initial members) is ready and every member
/// counts four voters (`secs` each).
async fn joined(nodes: &[Node], fourth: &Node, secs: u64) {
    until(
        &format!("the joiner ready; log:\n{}", fourth.log()),
        secs,
        async || fourth.ready().await,
    )
    .await;
    until("four voters everywhere", secs, async || {
        let mut ok = true;
        for n in nodes.iter().chain([fourth]) {
            ok &= n.status().await.is_some_and(|s| voters(&s) == 4);
        }
        ok
    })
    .await;
}

/// Removes member `id` through `nodes[via]` (`DELETE /v1/cluster/members/{id}`, 204) and
/// waits until the members in `nodes` list three members, all voters.
async fn removed(nodes: &[Node], via: usize, id: u64) {
    let n = &nodes[via];
    let r = n
        .http
        .delete(format!("{}/v1/cluster/members/{id}", n.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NO_CONTENT,
        "{}",
        r.text().await.unwrap()
    );
    until("three voters everywhere", 30, async || {
        let mut ok = true;
        for n in nodes {
            ok &= n.status().await.is_some_and(|s| {
                voters(&s) == 3 && s["members"].as_array().is_some_and(|m| m.len() == 3)
            });
        }
        ok
    })
    .await;
}

/// Three members started (not yet ready), and their `cluster_members` list.
async fn three(root: &Path, secure: bool) -> (Vec<Node>, String) {
    let nodes = three_with(root, |n| n.secure = secure).await;
    let members = nodes[0].members.clone();
    (nodes, members)
}

/// Three members listing each other, each set up by `configure`, started (not yet ready).
async fn three_with(root: &Path, configure: impl Fn(&mut Node)) -> Vec<Node> {
    let mut nodes: Vec<Node> = (1..=3).map(|id| Node::new(id, root, "", SECRET)).collect();
    let members = nodes
        .iter()
        .map(|n| format!("{}@{}", n.id, n.rpc))
        .collect::<Vec<_>>()
        .join(",");
    for n in &mut nodes {
        n.members = members.clone();
        configure(n);
        n.start().await;
    }
    nodes
}

/// Waits (60 s at most each) until every member is ready; a timeout shows its log.
async fn all_ready(nodes: &[Node]) {
    for n in nodes {
        until(
            &format!("node {} ready; log:\n{}", n.id, n.log()),
            60,
            async || n.ready().await,
        )
        .await;
    }
}

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

/// Every file below `dir`.
pub(crate) fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Whether `needle` occurs in `hay`.
pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
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

/// Any member takes produce, consume, replay and ack for partitions any member owns: every
/// acknowledged message is consumed through another member and acked through a third; a
/// reader waiting on one member is woken by a message produced into another member's
/// partition; an owner killed with SIGKILL costs keyless producers nothing (they are placed
/// on the live owners, and so are keyed ones under the default `prefer` key policy) while a
/// producer pinned to its partition, or keyed under `strict`, is told to retry; back, it
/// serves its partitions with nothing acknowledged lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_flow_through_any_member_and_survive_an_owner_kill() {
    use reqwest::Method;
    use std::collections::{BTreeMap, BTreeSet};
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    let (st, made) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "q", "partitions": 6})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{made}");
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    for n in &nodes {
        until(&format!("q on node {}", n.id), 10, async || {
            n.call(anyone, Method::GET, "/v1/topics/q", None).await.0 == StatusCode::OK
        })
        .await;
    }
    let produce = async |n: &Node, body: &str, query: &str| {
        let r = n
            .http
            .post(format!("{}/v1/topics/q/produce{query}", n.base))
            .body(body.to_owned())
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e} (through node {})", n.id));
        let st = r.status();
        (st, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    // keyless singles through every member, and a keyed batch through one
    let mut acked: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in 0..30 {
        let body = format!("m{i}");
        let (st, r) = produce(&nodes[i % 3], &body, "").await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
        acked.insert(
            body,
            (
                r["partition"].as_u64().unwrap(),
                r["offset"].as_u64().unwrap(),
            ),
        );
    }
    let batch: Vec<Value> = (0..30)
        .map(|i| serde_json::json!({"payload": format!("k{i}"), "payload_encoding": "utf8", "key": format!("key{}", i % 7)}))
        .collect();
    let (st, r) = nodes[1]
        .call(
            anyone,
            Method::POST,
            "/v1/topics/q/produce/batch",
            Some(serde_json::json!({ "messages": batch })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    assert_eq!(r["accepted"], 30, "{r}");
    for (i, res) in r["results"].as_array().unwrap().iter().enumerate() {
        acked.insert(
            format!("k{i}"),
            (
                res["partition"].as_u64().unwrap(),
                res["offset"].as_u64().unwrap(),
            ),
        );
    }
    let places: BTreeSet<(u64, u64)> = acked.values().copied().collect();
    assert_eq!(places.len(), 60, "every message has its own place");
    // any member shows every partition's figures, gathered from the owners
    for n in &nodes {
        let (_, body) = n.call(anyone, Method::GET, "/v1/topics/q", None).await;
        let total: u64 = body["partition_stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["next_offset"].as_u64().unwrap())
            .sum();
        assert_eq!(total, 60, "node {}: {body}", n.id);
    }
    let used: BTreeSet<u64> = acked.values().map(|(p, _)| *p).collect();
    assert!(
        used.len() > 3,
        "messages spread over the partitions: {used:?}"
    );
    // a replay read of a partition through a member that does not own it
    let (p0, foreign) = (0..6u64)
        .map(|p| {
            (
                p,
                nodes
                    .iter()
                    .position(|n| n.id != owners[p as usize])
                    .unwrap(),
            )
        })
        .find(|(p, _)| used.contains(p))
        .unwrap();
    let (st, body) = nodes[foreign]
        .call(
            anyone,
            Method::GET,
            &format!("/v1/topics/q/consume?partition={p0}&offset=0&max=100"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let replayed = body["messages"].as_array().unwrap().len();
    assert_eq!(
        replayed,
        acked.values().filter(|(p, _)| *p == p0).count(),
        "{body}"
    );
    // consumed through node 3, acked through node 1: every message exactly once
    let mut seen = BTreeSet::new();
    until("every message consumed", 30, async || {
        let (st, body) = nodes[2]
            .call(anyone, Method::GET, "/v1/topics/q/consume?max=7", None)
            .await;
        if st == StatusCode::OK {
            let handles: Vec<String> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    let payload = m["payload"].as_str().unwrap().to_owned();
                    assert!(seen.insert(payload.clone()), "{payload} delivered twice");
                    m["receipt_handle"].as_str().unwrap().to_owned()
                })
                .collect();
            let (st, res) = nodes[0]
                .call(
                    anyone,
                    Method::POST,
                    "/v1/topics/q/ack",
                    Some(serde_json::json!({"receipt_handles": handles})),
                )
                .await;
            assert_eq!(st, StatusCode::OK, "{res}");
            assert!(
                res["results"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["status"] == 204),
                "{res}"
            );
        }
        seen.len() == 60
    })
    .await;
    assert_eq!(seen, acked.keys().cloned().collect::<BTreeSet<_>>());
    // a nack through another member makes the message deliverable again at once
    let (st, _) = produce(&nodes[0], "again", "").await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let (st, m) = nodes[1]
        .call(anyone, Method::GET, "/v1/topics/q/consume", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{m}");
    let h = m["receipt_handle"].as_str().unwrap().to_owned();
    let (st, _) = nodes[2].ack("q", &h, "&extend=0").await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, m) = nodes[0]
        .call(anyone, Method::GET, "/v1/topics/q/consume", None)
        .await;
    assert_eq!(
        (st, m["payload"].as_str(), m["delivery_count"].as_u64()),
        (StatusCode::OK, Some("again"), Some(2)),
        "{m}"
    );
    let h = m["receipt_handle"].as_str().unwrap().to_owned();
    let (st, _) = nodes[1].ack("q", &h, "").await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    // acked once, a second ack is 410 wherever it is sent
    let (st, body) = nodes[2].ack("q", &h, "").await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::GONE, Some("lease_gone")),
        "{body}"
    );
    // a reader waiting on node 1 is woken by a message produced through node 2 into a
    // partition node 3 owns
    let p3 = owners.iter().position(|o| *o == 3).unwrap();
    let waiting = {
        let n = &nodes[0];
        let url = format!("{}/v1/topics/q/consume?wait=20s", n.base);
        let http = n.http.clone();
        tokio::spawn(async move {
            let r = http.get(url).send().await.unwrap();
            (
                r.status(),
                r.json::<Value>().await.unwrap_or(Value::Null),
                Instant::now(),
            )
        })
    };
    until("the reader waits", 10, async || {
        let (_, body) = nodes[0]
            .call(anyone, Method::GET, "/v1/topics/q", None)
            .await;
        body["waiters"] == 1
    })
    .await;
    let sent = Instant::now();
    let (st, r) = produce(&nodes[1], "wake", &format!("?partition={p3}")).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    let (st, m, at) = waiting.await.unwrap();
    assert_eq!(
        (st, m["payload"].as_str()),
        (StatusCode::OK, Some("wake")),
        "{m}"
    );
    assert!(
        at.duration_since(sent) < Duration::from_secs(15),
        "woken by the produce, not the wait's end"
    );
    let h = m["receipt_handle"].as_str().unwrap().to_owned();
    let (st, _) = nodes[0].ack("q", &h, "").await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    // node 3 killed: keyless produces keep getting 202s; one pinned to its partition is told
    // to retry
    nodes[2].kill9();
    let mut after = BTreeSet::new();
    for i in 0..20 {
        let body = format!("d{i}");
        let (st, r) = produce(&nodes[i % 2], &body, "").await;
        assert_eq!(st, StatusCode::ACCEPTED, "{body}: {r}");
        assert_ne!(owners[r["partition"].as_u64().unwrap() as usize], 3, "{r}");
        after.insert(body);
    }
    let (_, body) = nodes[0]
        .call(anyone, Method::GET, "/v1/topics/q", None)
        .await;
    let unavailable: Vec<u64> =
        serde_json::from_value(body["partitions_unavailable"].clone()).unwrap_or_default();
    let of3: Vec<u64> = (0..6u64).filter(|p| owners[*p as usize] == 3).collect();
    assert_eq!(unavailable, of3, "{body}");
    // the CLI's table says so too, and names each partition's owner
    let info = std::process::Command::new(BIN)
        .args(["topic", "info", "q"])
        .env("NARAD_ADDR", &nodes[0].base)
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    let list: Vec<String> = of3.iter().map(u64::to_string).collect();
    assert!(
        info.contains(&format!("not shown: partition {}", list.join(", "))),
        "{info}"
    );
    assert!(info.contains("OWNER"), "{info}");
    let (st, r) = produce(&nodes[0], "pinned", &format!("?partition={p3}")).await;
    assert_eq!(
        (st, r["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("cluster_unavailable")),
        "{r}"
    );
    // keys: under `prefer` (the default) a key whose partition node 3 owns moves to a live
    // partition; under `strict` it is told to retry, and a key elsewhere keeps its partition
    let key_on = |on_3: bool| {
        (0..)
            .map(|i| format!("key-{i}"))
            .find(|k| {
                let p = narad_core::topic::partition_for_key(k.as_bytes(), 6);
                (owners[p as usize] == 3) == on_3
            })
            .unwrap()
    };
    let (k3, k1) = (key_on(true), key_on(false));
    let (st, r) = produce(&nodes[1], "moved", &format!("?key={k3}")).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    assert_ne!(owners[r["partition"].as_u64().unwrap() as usize], 3, "{r}");
    after.insert("moved".into());
    let (st, t) = nodes[0]
        .call(
            anyone,
            Method::PATCH,
            "/v1/topics/q",
            Some(serde_json::json!({"key_policy": "strict"})),
        )
        .await;
    assert_eq!(
        (st, t["key_policy"].as_str()),
        (StatusCode::OK, Some("strict")),
        "{t}"
    );
    let r = nodes[0]
        .http
        .post(format!("{}/v1/topics/q/produce?key={k3}", nodes[0].base))
        .body("sticky")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
    let r: Value = r.json().await.unwrap();
    assert_eq!(r["code"], "cluster_unavailable", "{r}");
    let (st, r) = produce(&nodes[0], "kept", &format!("?key={k1}")).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    assert_eq!(
        r["partition"].as_u64(),
        Some(u64::from(narad_core::topic::partition_for_key(
            k1.as_bytes(),
            6
        ))),
        "{r}"
    );
    after.insert("kept".into());
    // back: everything acknowledged is there, consumed through the restarted member
    nodes[2].start().await;
    until("node 3 ready again", 60, async || nodes[2].ready().await).await;
    // (as a client does with a 503: retried; the first call may still meet the dead
    // process's connection)
    until("the pinned produce taken", 10, async || {
        let (st, r) = produce(&nodes[0], "pinned", &format!("?partition={p3}")).await;
        assert!(
            st == StatusCode::ACCEPTED || st == StatusCode::SERVICE_UNAVAILABLE,
            "{st} {r}"
        );
        st == StatusCode::ACCEPTED
    })
    .await;
    after.insert("pinned".into());
    let mut got = BTreeSet::new();
    until("every message after the kill consumed", 30, async || {
        let (st, body) = nodes[2]
            .call(anyone, Method::GET, "/v1/topics/q/consume?max=10", None)
            .await;
        if st == StatusCode::OK {
            let handles: Vec<String> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    got.insert(m["payload"].as_str().unwrap().to_owned());
                    m["receipt_handle"].as_str().unwrap().to_owned()
                })
                .collect();
            let (st, _) = nodes[1]
                .call(
                    anyone,
                    Method::POST,
                    "/v1/topics/q/ack",
                    Some(serde_json::json!({"receipt_handles": handles})),
                )
                .await;
            assert_eq!(st, StatusCode::OK);
        }
        after.is_subset(&got)
    })
    .await;
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

// ── found by an adversarial review of the data plane (each failed on c501b66) ──

/// Creates a topic through the first member (security off) and waits until every member has
/// it; returns the create's answer.
async fn topic_everywhere(nodes: &[Node], body: Value) -> Value {
    let name = body["name"].as_str().unwrap().to_owned();
    let (st, made) = nodes[0]
        .call(("x", "y"), reqwest::Method::POST, "/v1/topics", Some(body))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{made}");
    for n in nodes {
        until(&format!("{name} on node {}", n.id), 10, async || {
            n.call(
                ("x", "y"),
                reqwest::Method::GET,
                &format!("/v1/topics/{name}"),
                None,
            )
            .await
            .0 == StatusCode::OK
        })
        .await;
    }
    made
}

/// Partition `p` of `topic`'s manifest in a `file://` archive at `archive`, if written.
fn archived_manifest(archive: &Path, topic: &str, p: u32) -> Option<Value> {
    let path = archive
        .join(format!("topic={topic}"))
        .join(format!("partition={p}"))
        .join("_manifest.json");
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Three ready members (dev mode) for the review tests.
async fn three_ready(root: &Path) -> Vec<Node> {
    let (nodes, _) = three(root, false).await;
    all_ready(&nodes).await;
    nodes
}

/// A reader long-polling through node 1 waits in every owner's line; a batch produced over
/// all three owners then serves at least one of those waits. The reader gets one owner's
/// messages; the others' must be deliverable again at once (given back), not leased to
/// nobody until the visibility timeout (60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_served_by_one_owner_leaves_no_message_leased_to_nobody() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    for round in 0..4 {
        let t = format!("lp{round}");
        topic_everywhere(
            &nodes,
            serde_json::json!({"name": t, "partitions": 3, "visibility_timeout_ms": 60000}),
        )
        .await;
        let (http, url) = (
            nodes[0].http.clone(),
            format!("{}/v1/topics/{t}/consume?max=10&wait=8s", nodes[0].base),
        );
        let poll = tokio::spawn(async move {
            let r = http.get(url).send().await.unwrap();
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        });
        // the reader waits in every owner's line
        for n in &nodes {
            until(&format!("a waiter on node {}", n.id), 10, async || {
                let (_, b) = n
                    .call(anyone, Method::GET, &format!("/v1/topics/{t}"), None)
                    .await;
                b["waiters"].as_u64().unwrap_or(0) > 0
            })
            .await;
        }
        let batch: Vec<Value> = ["a", "b", "c"]
            .iter()
            .map(|p| serde_json::json!({"payload": p, "payload_encoding": "utf8"}))
            .collect();
        let (st, r) = nodes[0]
            .call(
                anyone,
                Method::POST,
                &format!("/v1/topics/{t}/produce/batch"),
                Some(serde_json::json!({ "messages": batch })),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
        let (st, got) = poll.await.unwrap();
        assert_eq!(st, StatusCode::OK, "{got}");
        let mut seen = got["messages"].as_array().unwrap().len();
        // whatever the long-poll did not return is deliverable again within moments (given
        // back), far before the 60 s visibility timeout
        until(
            &format!("round {round}: all three delivered"),
            10,
            async || {
                let (st, rest) = nodes[0]
                    .call(
                        anyone,
                        Method::GET,
                        &format!("/v1/topics/{t}/consume?max=10"),
                        None,
                    )
                    .await;
                if st == StatusCode::OK {
                    seen += rest["messages"].as_array().unwrap().len();
                }
                seen == 3
            },
        )
        .await;
    }
}

/// A member answers a create (or a partition grow) once *it* has followed it; a produce or
/// consume through that same member right after must not be told the topic does not
/// exist, or that a keyless message's partition is out of range, because the owner it
/// forwards to has not applied the change yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_made_through_a_member_takes_messages_there_at_once() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    // through the leader: it applies a commit before the followers hear of it
    let st = nodes[0].status().await.unwrap();
    let leader = leader_of(&st).unwrap();
    let n = nodes.iter().find(|n| n.id == leader).unwrap();
    let batch = |k: usize| -> Value {
        let m: Vec<Value> = (0..k)
            .map(|i| serde_json::json!({"payload": format!("m{i}"), "payload_encoding": "utf8"}))
            .collect();
        serde_json::json!({ "messages": m })
    };
    let mut bad = Vec::new();
    for i in 0..30 {
        let t = format!("fresh{i}");
        let (st, made) = n
            .call(
                anyone,
                Method::POST,
                "/v1/topics",
                Some(serde_json::json!({"name": t, "partitions": 3})),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{made}");
        let (st, r) = n
            .call(
                anyone,
                Method::POST,
                &format!("/v1/topics/{t}/produce/batch"),
                Some(batch(3)),
            )
            .await;
        if st != StatusCode::ACCEPTED {
            bad.push(format!("produce after create: {st} {r}"));
        }
        let t2 = format!("fresh{i}b");
        n.call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": t2, "partitions": 3})),
        )
        .await;
        let (st, r) = n
            .call(
                anyone,
                Method::GET,
                &format!("/v1/topics/{t2}/consume?max=10"),
                None,
            )
            .await;
        if st != StatusCode::NO_CONTENT {
            bad.push(format!("consume after create: {st} {r}"));
        }
        let (st, r) = n
            .call(
                anyone,
                Method::PATCH,
                &format!("/v1/topics/{t}"),
                Some(serde_json::json!({"partitions": 9})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{r}");
        let (st, r) = n
            .call(
                anyone,
                Method::POST,
                &format!("/v1/topics/{t}/produce/batch"),
                Some(batch(9)),
            )
            .await;
        if st != StatusCode::ACCEPTED {
            bad.push(format!("produce after grow: {st} {r}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} failures:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// Keyless messages are spread round-robin over the partitions; a consume between two
/// produces must not move the producers' cursor (here, with two partitions, every message
/// would land on one of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumes_do_not_skew_keyless_placement() {
    use reqwest::Method;
    use std::collections::BTreeSet;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    topic_everywhere(&nodes, serde_json::json!({"name": "skew", "partitions": 2})).await;
    let mut used = BTreeSet::new();
    for i in 0..10 {
        let r = nodes[0]
            .http
            .post(format!("{}/v1/topics/skew/produce", nodes[0].base))
            .body(format!("m{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        let v: Value = r.json().await.unwrap();
        used.insert(v["partition"].as_u64().unwrap());
        // a reader polls between produces (it leases what it finds: it is not acked)
        nodes[0]
            .call(anyone, Method::GET, "/v1/topics/skew/consume", None)
            .await;
    }
    assert_eq!(used.len(), 2, "ten keyless produces all went to {used:?}");
}

/// A batch of small messages (1-byte payloads, no key, no headers: 12 bytes each in the
/// produce call's encoding) pinned to partitions other members own is forwarded and
/// written like any other: the owner's decoder must not take it for a lie about its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_small_messages_is_forwarded_to_their_owners() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    topic_everywhere(&nodes, serde_json::json!({"name": "tiny", "partitions": 3})).await;
    let msgs: Vec<Value> = (0..3)
        .flat_map(|p| (0..10).map(move |_| serde_json::json!({"payload": 1, "partition": p})))
        .collect();
    let (st, r) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics/tiny/produce/batch",
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    assert_eq!(r["accepted"], 30, "{r}");
}

/// A keyless batch taken by one member is placed as on a single node: on one partition, the
/// next of the member's cursor. Spread over all 60 partitions, each owner would be handed
/// about 20 and refuse the batch (`400 invalid_batch`: more partitions than its 16 open
/// logs), a spread the client did not ask for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wide_keyless_batch_through_a_member_stays_within_max_open_logs() {
    use reqwest::Method;
    use std::collections::BTreeSet;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(root.path(), &[("NARAD_MAX_OPEN_LOGS", "16")]).await;
    let anyone = ("x", "y");
    topic_everywhere(
        &nodes,
        serde_json::json!({"name": "wide", "partitions": 60}),
    )
    .await;
    let mut used = BTreeSet::new();
    for round in 0..8 {
        let msgs: Vec<Value> = (0..200)
            .map(|i| serde_json::json!({ "payload": format!("r{round}m{i}") }))
            .collect();
        let (st, r) = nodes[0]
            .call(
                anyone,
                Method::POST,
                "/v1/topics/wide/produce/batch",
                Some(serde_json::json!({ "messages": msgs })),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "round {round}: {r}");
        let this: BTreeSet<u64> = r["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["partition"].as_u64().unwrap())
            .collect();
        assert_eq!(this.len(), 1, "round {round} spanned {this:?}");
        used.extend(this);
    }
    // batch after batch, the cursor moves on (owned by all three members: 60 partitions
    // created round-robin over them)
    assert_eq!(used.len(), 8, "used only {used:?}");
}

/// Consumers long-polling through one member leave a delivery token at every other owner;
/// the members' single connection carries at most 256 calls at once, Raft's included, so a
/// token must hold none open. Three hundred readers (far below `max_connections`) all wait
/// in every owner's line, the member stays ready, its produces and metadata calls to the
/// others are not timed out, and every reader is served by the messages that come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_long_polls_through_a_member_do_not_cut_it_off() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    for t in ["idle", "busy"] {
        let (st, made) = nodes[0]
            .call(
                anyone,
                Method::POST,
                "/v1/topics",
                Some(serde_json::json!({"name": t, "partitions": 3})),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{made}");
    }
    for n in &nodes {
        until(&format!("busy on node {}", n.id), 10, async || {
            n.call(anyone, Method::GET, "/v1/topics/busy", None).await.0 == StatusCode::OK
        })
        .await;
    }
    let (_, meta) = nodes[0]
        .call(anyone, Method::GET, "/v1/topics/busy", None)
        .await;
    let owners: Vec<u64> = serde_json::from_value(meta["partition_owners"].clone()).unwrap();
    let remote = owners.iter().position(|&o| o != nodes[0].id).unwrap();
    let readers = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut polls = tokio::task::JoinSet::new();
    for _ in 0..300 {
        let (c, url) = (
            readers.clone(),
            format!("{}/v1/topics/idle/consume?wait=20s", nodes[0].base),
        );
        polls.spawn(async move { c.get(url).send().await.map(|r| r.status()) });
    }
    // every reader waits on node 1 and leaves a delivery token in the line of each other
    // owner: 300 at node 2, more than the 256 streams of node 1's one connection to it (a
    // token holds no call open)
    until("readers waiting everywhere", 30, async || {
        let mut all = true;
        for n in &nodes {
            let (_, t) = n.call(anyone, Method::GET, "/v1/topics/idle", None).await;
            all &= t["waiters"].as_u64().unwrap_or(0) >= 300;
        }
        all
    })
    .await;
    let mut bad = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let (st, r) = nodes[0]
            .call(
                anyone,
                Method::POST,
                "/v1/topics/busy/produce/batch",
                Some(serde_json::json!({"messages": [{"payload": 1, "partition": remote}]})),
            )
            .await;
        if st != StatusCode::ACCEPTED {
            bad.push(format!("pinned produce: {st} after {:?}: {r}", t.elapsed()));
        }
        // (readiness is re-checked every second, and an election at start can flap it: the
        // starvation this guards against kept the member unready for over ten seconds)
        let deadline = Instant::now() + Duration::from_secs(5);
        while !nodes[0].ready().await {
            if Instant::now() > deadline {
                bad.push("node 1 not ready for 5 s".to_owned());
                break;
            }
            poll_pause().await;
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // every reader is served once messages come, those beyond the 64 that wait at node 2
    // included (they queue for a slot there and wait with what is left of their wait)
    let (_, meta) = nodes[0]
        .call(anyone, Method::GET, "/v1/topics/idle", None)
        .await;
    let owners: Vec<u64> = serde_json::from_value(meta["partition_owners"].clone()).unwrap();
    let remote = owners.iter().position(|&o| o != nodes[0].id).unwrap();
    let sent = Instant::now();
    for chunk in 0..3 {
        let msgs: Vec<Value> = (0..100)
            .map(|i| serde_json::json!({"payload": chunk * 100 + i, "partition": remote}))
            .collect();
        let (st, r) = nodes[1]
            .call(
                anyone,
                Method::POST,
                "/v1/topics/idle/produce/batch",
                Some(serde_json::json!({ "messages": msgs })),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    }
    let mut served = 0;
    while let Some(r) = polls.join_next().await {
        if matches!(r, Ok(Ok(StatusCode::OK))) {
            served += 1;
        }
    }
    assert_eq!(
        served, 300,
        "readers left waiting for messages that were there"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(12),
        "served by the messages, not by the end of their wait: {:?}",
        sent.elapsed()
    );
}

// ── the lifecycle checker over a cluster under faults ──

/// A connection to one member that follows it across restarts (each start binds a new
/// HTTP port); `None` while the member cannot be reached.
struct Through {
    addrs: Arc<std::sync::Mutex<Vec<String>>>,
    member: usize,
    cur: Option<(String, Http)>,
}

impl Through {
    async fn http(&mut self) -> Option<&mut Http> {
        let a = self.addrs.lock().unwrap()[self.member].clone();
        if self.cur.as_ref().is_none_or(|(c, _)| *c != a) {
            self.cur = Http::connect(&a).await.ok().map(|h| (a, h));
        }
        self.cur.as_mut().map(|(_, h)| h)
    }
}

/// Produces `ids` through a member in one request (a keyed single, or a keyless batch) and
/// records each message's outcome: a `207` says which were written, a `503` (an owner that
/// could not be reached) is a refusal, a transport error leaves the outcome unknown. Anything
/// else fails the test. Returns whether the member answered 2xx.
async fn produce_through(http: &mut Http, rec: &Recorder, ids: &[MsgId]) -> bool {
    let now = rec.now();
    for &id in ids {
        rec.sent(id, now, Duration::ZERO);
    }
    let res = if let [id] = ids {
        let path = format!("/v1/topics/c/produce?key=k{}", id % 7);
        http.request(
            hyper::Method::POST,
            &path,
            Bytes::from(format!("soak:{id}:")),
        )
        .await
    } else {
        let msgs: Vec<Value> = ids
            .iter()
            .map(|id| serde_json::json!({"payload": format!("soak:{id}:"), "payload_encoding": "utf8"}))
            .collect();
        let body = Bytes::from(serde_json::json!({ "messages": msgs }).to_string());
        http.request(hyper::Method::POST, "/v1/topics/c/produce/batch", body)
            .await
    };
    let Ok((st, body)) = res else {
        return false;
    };
    match st.as_u16() {
        207 => {
            let r: Value = serde_json::from_slice(&body).unwrap();
            let at = rec.now();
            for (&id, item) in ids.iter().zip(r["results"].as_array().unwrap()) {
                if item.get("offset").is_some() {
                    rec.accepted(id, at);
                } else {
                    rec.rejected(id, 503);
                }
            }
            true
        }
        s @ (200..=299 | 503) => {
            rec.produce_outcome(ids, Some(s));
            s != 503
        }
        s => panic!("produce answered {s}: {}", String::from_utf8_lossy(&body)),
    }
}

/// Producers and consumers through every member of a cluster (topic `c`), recorded for the
/// lifecycle checker: per member a producer of keyed singles, one of keyless batches of 10,
/// and a consumer that acks what it gets.
struct Traffic {
    rec: Arc<Recorder>,
    addrs: Arc<std::sync::Mutex<Vec<String>>>,
    producing: Arc<AtomicBool>,
    consuming: Arc<AtomicBool>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    consumers: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    /// Topic `c` (6 partitions, 3 s visibility) on every member, and traffic on it through
    /// all of them, flowing (300 messages accepted).
    async fn flowing(nodes: &[Node]) -> Self {
        topic_everywhere(
            nodes,
            serde_json::json!({"name": "c", "partitions": 6, "visibility_timeout_ms": 3000}),
        )
        .await;
        let traffic = Self::start(nodes, Duration::from_secs(3));
        traffic.more("traffic flowing", 300).await;
        traffic
    }

    /// `visibility`: topic `c`'s visibility timeout.
    fn start(nodes: &[Node], visibility: Duration) -> Self {
        let rec = Arc::new(Recorder::new(visibility, Duration::from_secs(1)));
        let addrs = Arc::new(std::sync::Mutex::new(
            nodes.iter().map(Self::host).collect::<Vec<_>>(),
        ));
        let next = Arc::new(AtomicU64::new(0));
        let producing = Arc::new(AtomicBool::new(true));
        let consuming = Arc::new(AtomicBool::new(true));
        let mut producers = Vec::new();
        let mut consumers = Vec::new();
        for member in 0..nodes.len() {
            for batch in [1, 10] {
                let (rec, next, producing) = (rec.clone(), next.clone(), producing.clone());
                let mut to = Through {
                    addrs: addrs.clone(),
                    member,
                    cur: None,
                };
                producers.push(tokio::spawn(async move {
                    while producing.load(Ordering::Relaxed) {
                        let answered = match to.http().await {
                            Some(http) => {
                                let first = next.fetch_add(batch, Ordering::Relaxed);
                                let ids: Vec<MsgId> = (first..first + batch).collect();
                                produce_through(http, &rec, &ids).await
                            }
                            None => false,
                        };
                        if !answered {
                            poll_pause().await;
                        }
                    }
                }));
            }
            let (rec, consuming) = (rec.clone(), consuming.clone());
            let mut from = Through {
                addrs: addrs.clone(),
                member,
                cur: None,
            };
            consumers.push(tokio::spawn(async move {
                while consuming.load(Ordering::Relaxed) {
                    let got = match from.http().await {
                        Some(http) => {
                            let wait = Duration::from_millis(300);
                            consume_and_ack(http, "c", &rec, member as u32, wait).await
                        }
                        None => 0,
                    };
                    if got == 0 {
                        poll_pause().await;
                    }
                }
            }));
        }
        Self {
            rec,
            addrs,
            producing,
            consuming,
            producers,
            consumers,
        }
    }

    fn host(n: &Node) -> String {
        n.base.trim_start_matches("http://").to_owned()
    }

    /// The member restarted (on a new port): its producer and consumer follow it.
    fn moved(&self, i: usize, n: &Node) {
        self.addrs.lock().unwrap()[i] = Self::host(n);
    }

    /// Waits (60 s at most) until `n` more messages were accepted.
    async fn more(&self, what: &str, n: u64) {
        let from = self.rec.tally().accepted;
        until(what, 60, async || self.rec.tally().accepted >= from + n).await;
    }

    /// Stops producing, drains (every accepted message consumed and acked, 60 s at most;
    /// a settle answered 504 may have been applied on its owner, so such a message is waited
    /// for only until its lease would have ended and it come back), and checks the history.
    async fn finish(self, nodes: &[Node]) -> narad_bench::lifecycle::Report {
        self.producing.store(false, Ordering::Relaxed);
        for p in self.producers {
            p.await.unwrap();
        }
        let grace = Duration::from_secs(5);
        let t = Instant::now();
        while self.rec.unsettled(grace) > 0 {
            if t.elapsed() > Duration::from_secs(60) {
                let mut seen = String::new();
                for n in nodes {
                    let (_, topic) = n
                        .call(("x", "y"), reqwest::Method::GET, "/v1/topics/c", None)
                        .await;
                    seen += &format!("node {}: {topic}\n", n.id);
                }
                let lost: Vec<String> = self
                    .rec
                    .unacked()
                    .iter()
                    .map(|v| format!("{} {}", v.id, v.detail))
                    .collect();
                panic!(
                    "{seen}not drained in 60 s: {:?}\n{}",
                    self.rec.tally(),
                    lost.join("\n")
                );
            }
            poll_pause().await;
        }
        self.consuming.store(false, Ordering::Relaxed);
        for c in self.consumers {
            c.await.unwrap();
        }
        let report = self.rec.check();
        println!("{report}");
        report
    }
}

/// The lifecycle checker over a cluster under faults: producers and consumers through all
/// three members while a partition owner, then the Raft leader, is killed with SIGKILL and
/// restarted. Nothing acknowledged is lost, no message is leased to two readers at once
/// outside a fault's window, no ack is forgotten outside one, and every accepted message is
/// consumed and acked in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_under_traffic_lose_nothing_and_never_lease_twice() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    // node 3 (a partition owner) killed, then the Raft leader of the time; traffic goes on
    // without each, and each comes back
    for round in 0..2 {
        let i = if round == 0 {
            2
        } else {
            // (a member just restarted: an election may be under way)
            let mut leader = None;
            until("a leader", 30, async || {
                leader = nodes[0].status().await.as_ref().and_then(leader_of);
                leader.is_some()
            })
            .await;
            nodes.iter().position(|n| Some(n.id) == leader).unwrap()
        };
        let start = traffic.rec.now();
        nodes[i].kill9();
        traffic
            .more(&format!("traffic without node {}", nodes[i].id), 200)
            .await;
        nodes[i].start().await;
        traffic.moved(i, &nodes[i]);
        let n = &nodes[i];
        until(&format!("node {} ready again", n.id), 60, async || {
            n.ready().await
        })
        .await;
        traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
        traffic
            .more(&format!("traffic with node {} back", n.id), 200)
            .await;
    }
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert!(report.tally.accepted >= 1100, "{:?}", report.tally);
}

/// Quorum lost (two of three members killed): the survivor keeps serving its own partitions
/// (keyless produces land there, consume and ack work), while metadata writes answer a
/// retryable 503 and `/readyz` says why; with the others back, metadata writes work again
/// and nothing produced meanwhile is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_the_live_owner_serves_and_metadata_writes_wait() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "qa", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    nodes[1].kill9();
    nodes[2].kill9();
    let one = &nodes[0];
    // keyless produces find node 1's partition (the first calls to the dead owners may wait
    // for the call deadline, then they are passed over)
    let mut kept = Vec::new();
    for i in 0..6 {
        let r = one
            .http
            .post(format!("{}/v1/topics/qa/produce", one.base))
            .body(format!("alone-{i}"))
            .send()
            .await
            .unwrap();
        let (st, r) = (r.status(), r.json::<Value>().await.unwrap());
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
        assert_eq!(owners[r["partition"].as_u64().unwrap() as usize], 1, "{r}");
        kept.push(format!("alone-{i}"));
    }
    // consumed and acked on the survivor; the last one is left unacked
    for _ in 0..5 {
        let (st, m) = one
            .call(("x", "y"), Method::GET, "/v1/topics/qa/consume", None)
            .await;
        assert_eq!(st, StatusCode::OK, "{m}");
        let (st, _) = one
            .ack("qa", m["receipt_handle"].as_str().unwrap(), "")
            .await;
        assert_eq!(st, StatusCode::NO_CONTENT);
    }
    // metadata writes wait for a quorum, then answer a retryable 503
    let r = one
        .http
        .post(format!("{}/v1/topics", one.base))
        .json(&serde_json::json!({"name": "later"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let (st, first) = (r.status(), r.text().await.unwrap());
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{first}");
    assert!(first.contains("\"cluster_unavailable\""), "{first}");
    // A create the leader appended but could not commit may still commit once the quorum is
    // back (the answer says so): then a retry finds the topic made.
    // (the answer for a change sent but not confirmed: "it may or may not have taken effect")
    let unknown = |body: &str| body.contains("may or may not have taken effect");
    let mut may_take_effect = unknown(&first);
    let r = one
        .http
        .get(format!("{}/readyz", one.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    // the quorum back: metadata writes work, and the unacked message is still there
    nodes[1].start().await;
    nodes[2].start().await;
    for n in &nodes {
        until(&format!("node {} ready", n.id), 60, async || {
            n.ready().await
        })
        .await;
    }
    until("the create taken", 30, async || {
        let (st, body) = nodes[1]
            .call(
                ("x", "y"),
                Method::POST,
                "/v1/topics",
                Some(serde_json::json!({"name": "later"})),
            )
            .await;
        if st == StatusCode::SERVICE_UNAVAILABLE {
            may_take_effect |= unknown(&body.to_string());
            return false;
        }
        // an earlier attempt answered "may or may not have taken effect" did
        let earlier = st == StatusCode::CONFLICT && body["code"] == "topic_exists";
        assert!(
            st == StatusCode::CREATED || (earlier && may_take_effect),
            "{st} {body}"
        );
        true
    })
    .await;
    let (st, body) = nodes[1]
        .call(("x", "y"), Method::GET, "/v1/topics/later", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let (st, m) = nodes[2]
        .call(
            ("x", "y"),
            Method::GET,
            "/v1/topics/qa/consume?wait=5s",
            None,
        )
        .await;
    assert_eq!(
        (st, m["payload"].as_str()),
        (StatusCode::OK, Some("alone-5")),
        "{m}"
    );
}

// ── network partitions: members in a namespace of the test's own, cut apart by nftables ──

/// A network namespace made for one test and linked to the test's by a veth pair: cluster
/// members run inside it (their cluster traffic on its loopback, where nftables rules cut
/// one off), and the test reaches their HTTP listeners at `ip`. Removed on drop.
struct Netns {
    name: String,
    veth: String,
    ip: String,
}

impl Netns {
    /// `None` (the test says it was skipped) where namespaces cannot be made: not root, or no
    /// `ip` or `nft`. `.ci/run` sets `NARAD_REQUIRE_NETNS=1`, so in CI that fails instead.
    fn new() -> Option<Self> {
        let pid = std::process::id();
        let idx = pid % 16_384;
        let (a, b) = (idx / 64, (idx % 64) * 4);
        let ns = Self {
            name: format!("narad-it-{pid}"),
            veth: format!("nri{pid}"),
            ip: format!("10.201.{a}.{}", b + 2),
        };
        let peer = format!("nrp{pid}");
        let host = format!("10.201.{a}.{}/30", b + 1);
        let inner = format!("{}/30", ns.ip);
        let n = ns.name.as_str();
        let steps: [&[&str]; 9] = [
            &["ip", "netns", "add", n],
            &[
                "ip", "link", "add", &ns.veth, "type", "veth", "peer", "name", &peer,
            ],
            &["ip", "link", "set", &peer, "netns", n],
            &["ip", "addr", "add", &host, "dev", &ns.veth],
            &["ip", "link", "set", &ns.veth, "up"],
            &["ip", "-n", n, "addr", "add", &inner, "dev", &peer],
            &["ip", "-n", n, "link", "set", &peer, "up"],
            &["ip", "-n", n, "link", "set", "lo", "up"],
            &[
                "ip", "netns", "exec", n, "nft", "add", "table", "inet", "narad",
            ],
        ];
        let chain = "add chain inet narad out { type filter hook output priority 0 ; }";
        let made = steps.iter().all(|s| run(s)) && ns.nft(chain);
        if made {
            return Some(ns);
        }
        drop(ns);
        let why = "network namespaces and nftables need root, iproute2 and nftables";
        if std::env::var("NARAD_REQUIRE_NETNS").is_ok_and(|v| v == "1") {
            panic!("{why} (NARAD_REQUIRE_NETNS=1)");
        }
        eprintln!("skipped: {why}");
        None
    }

    fn nft(&self, rule: &str) -> bool {
        let mut args = vec!["ip", "netns", "exec", &self.name, "nft"];
        args.extend(rule.split(' '));
        run(&args)
    }

    /// Cuts the member whose cluster endpoint is on `port` off from the others (both ways);
    /// HTTP to it still works.
    fn isolate(&self, port: u16) {
        for dir in ["sport", "dport"] {
            let rule = format!("add rule inet narad out udp {dir} {port} drop");
            assert!(self.nft(&rule), "nft: {rule}");
        }
    }

    /// Cuts the members whose cluster endpoints are on `a` and `b` off from each other only
    /// (both ways); each still reaches the third.
    fn cut(&self, a: u16, b: u16) {
        for (from, to) in [(a, b), (b, a)] {
            let rule = format!("add rule inet narad out udp sport {from} udp dport {to} drop");
            assert!(self.nft(&rule), "nft: {rule}");
        }
    }

    /// Drops what the member whose cluster endpoint is on `port` sends to the others: it
    /// still hears them, they no longer hear it (an asymmetric partition).
    fn mute(&self, port: u16) {
        let rule = format!("add rule inet narad out udp sport {port} drop");
        assert!(self.nft(&rule), "nft: {rule}");
    }

    /// Drops `percent` % of every cluster datagram at random, between all members.
    fn lossy(&self, percent: u8) {
        let rule = format!(
            "add rule inet narad out meta l4proto udp numgen random mod 100 < {percent} counter drop"
        );
        assert!(self.nft(&rule), "nft: {rule}");
    }

    /// Datagrams the `counter` rules dropped so far.
    fn dropped(&self) -> u64 {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.name, "nft", "list", "chain", "inet", "narad", "out",
            ])
            .output()
            .expect("nft list");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split("packets ")
            .skip(1)
            .filter_map(|t| t.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    fn heal(&self) {
        assert!(self.nft("flush chain inet narad out"), "nft flush");
    }

    /// Three members (security off) inside the namespace, ready.
    async fn three(&self, root: &Path) -> Vec<Node> {
        let nodes = three_with(root, |n| {
            n.netns = Some((self.name.clone(), self.ip.clone()))
        })
        .await;
        all_ready(&nodes).await;
        nodes
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // deleting the namespace takes the veth pair with it; the link goes too if it got
        // made but never moved
        run(&["ip", "netns", "del", &self.name]);
        run(&["ip", "link", "del", &self.veth]);
    }
}

/// Runs a command quietly: whether it succeeded.
fn run(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The Raft leader cut off from the other two by nftables while producers and consumers go
/// through every member: the majority elects a new leader and takes metadata writes (one
/// topic per write, retried or not), the isolated one refuses them with a retryable 503 and
/// is not ready, and it keeps serving its own partitions meanwhile. Healed, it follows what
/// it missed, and the lifecycle checker finds nothing lost and no message leased twice,
/// with no fault to excuse anything: nothing crashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_gives_way_and_traffic_loses_nothing() {
    use reqwest::Method;
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let l = nodes.iter().position(|n| n.id == leader).unwrap();
    ns.isolate(nodes[l].rpc_port());
    let cut = &nodes[l];
    let other = &nodes[(l + 1) % 3];
    // the majority takes a metadata write once it has a new leader
    create_when_writable(other, "during", "a create through the majority").await;
    // the cut-off one refuses writes (retryable, after its 10 s deadline) and says it is
    // not ready
    let r = cut
        .http
        .post(format!("{}/v1/topics", cut.base))
        .json(&serde_json::json!({"name": "nope"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    expect_error(r, StatusCode::SERVICE_UNAVAILABLE, "cluster_unavailable").await;
    until("the cut-off member not ready", 30, async || {
        !cut.ready().await
    })
    .await;
    traffic.more("traffic while cut", 200).await;
    ns.heal();
    until("the healed member ready", 60, async || cut.ready().await).await;
    until(
        "the healed member has the topic made without it",
        30,
        async || {
            cut.call(("x", "y"), Method::GET, "/v1/topics/during", None)
                .await
                .0
                == StatusCode::OK
        },
    )
    .await;
    traffic.more("traffic healed", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    // one topic per write; the refused one was never made
    for n in &nodes {
        let (st, list) = n.call(("x", "y"), Method::GET, "/v1/topics", None).await;
        assert_eq!(st, StatusCode::OK);
        let names: Vec<&str> = list["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["c", "during"], "node {}", n.id);
    }
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

/// A member that is not the leader cut off by nftables while producers and consumers go
/// through every member: its partitions' producers through the others are placed on live
/// partitions (a message its owner wrote after all, arriving late, is a second copy, never a
/// gap), it keeps serving its own clients on its own partitions, and it is not ready; healed,
/// it is ready again, and the lifecycle checker finds the history clean with no fault to
/// excuse anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_keeps_serving_its_clients_and_loses_nothing() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let i = nodes.iter().position(|n| n.id != leader).unwrap();
    ns.isolate(nodes[i].rpc_port());
    let cut = &nodes[i];
    until("the cut-off member not ready", 30, async || {
        !cut.ready().await
    })
    .await;
    traffic.more("traffic while an owner is cut off", 300).await;
    ns.heal();
    until("the healed member ready", 60, async || cut.ready().await).await;
    traffic.more("traffic healed", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// The Raft leader made mute (the others stop hearing it; it still hears them) while
/// producers and consumers go through every member: the others elect a new leader, the
/// mute one cannot take metadata writes and goes not ready, and healed it rejoins without
/// unseating anyone for good. Nothing acknowledged is lost and nothing is leased twice,
/// with no fault to excuse anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_be_heard_gives_way_and_traffic_loses_nothing() {
    use reqwest::Method;
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let l = nodes.iter().position(|n| n.id == leader).unwrap();
    ns.mute(nodes[l].rpc_port());
    let mute = &nodes[l];
    let other = &nodes[(l + 1) % 3];
    create_when_writable(other, "during", "a create through the others").await;
    until("the mute member not ready", 30, async || {
        !mute.ready().await
    })
    .await;
    traffic.more("traffic while the leader is mute", 200).await;
    ns.heal();
    until("the healed member ready", 60, async || mute.ready().await).await;
    until(
        "every member has the topic made meanwhile",
        30,
        async || {
            for n in &nodes {
                let (st, _) = n
                    .call(("x", "y"), Method::GET, "/v1/topics/during", None)
                    .await;
                if st != StatusCode::OK {
                    return false;
                }
            }
            true
        },
    )
    .await;
    // a metadata write goes through (one leader, whoever it is)
    let (st, body) = mute
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "after"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    traffic.more("traffic healed", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A follower cut off from the leader only (it still reaches the third member) while
/// producers and consumers go through every member: the cluster keeps taking metadata
/// writes through the member that hears both (the cut follower's elections must not take
/// the cluster down for good), and the lifecycle checker finds nothing lost and nothing
/// leased twice, with no fault window. Healed, every member is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_the_leader_only_loses_nothing() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let l = nodes.iter().position(|n| n.id == leader).unwrap();
    let (f, bridge) = ((l + 1) % 3, (l + 2) % 3);
    ns.cut(nodes[l].rpc_port(), nodes[f].rpc_port());
    traffic
        .more("traffic while a follower is cut from the leader", 200)
        .await;
    for (i, name) in ["partial-1", "partial-2"].into_iter().enumerate() {
        let through = &nodes[if i == 0 { bridge } else { l }];
        let what = format!("a create through node {}", through.id);
        create_when_writable(through, name, &what).await;
    }
    traffic.more("more traffic while cut", 100).await;
    ns.heal();
    for n in &nodes {
        until(
            &format!("node {} ready after the heal", n.id),
            60,
            async || n.ready().await,
        )
        .await;
    }
    traffic.more("traffic healed", 100).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A fourth member joins while a fifth of every cluster datagram is lost and traffic goes
/// through the three: it becomes a voter and ready (the join's calls and the snapshot it
/// installs are retried through the loss), and the lifecycle checker finds nothing lost or
/// leased twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_through_random_loss() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    ns.lossy(20);
    let mut fourth = Node::new(4, root.path(), &nodes[0].members, SECRET);
    fourth.netns = Some((ns.name.clone(), ns.ip.clone()));
    fourth.start().await;
    traffic.more("traffic while a member joins", 200).await;
    joined(&nodes, &fourth, 90).await;
    assert!(ns.dropped() > 20, "the loss rule dropped little");
    ns.heal();
    traffic.more("traffic healed", 100).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A fifth of every cluster datagram lost at random, between all members, the whole time
/// producers and consumers go through every member: retransmission hides it. Nothing
/// acknowledged is lost, nothing is leased twice, and metadata writes still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_loss_between_members_loses_nothing() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = ns.three(root.path()).await;
    let traffic = Traffic::flowing(&nodes).await;
    ns.lossy(20);
    traffic.more("traffic with 20% loss", 300).await;
    create_when_writable(&nodes[1], "lossy", "a create with 20% loss").await;
    let dropped = ns.dropped();
    assert!(
        dropped > 20,
        "the loss rule dropped only {dropped} datagrams"
    );
    ns.heal();
    traffic.more("traffic healed", 100).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// Delivery tokens: readers parked on node 1 leave a token in the line of node 2, which
/// owns partition `p`. A reader pinned to `p` is woken by a message produced there through
/// node 3. Then four unpinned readers: one message wakes exactly one of them (the others
/// keep waiting, their tokens still in node 2's line), and three more serve the rest, each
/// message to one reader only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_on_another_member_wakes_one_parked_reader() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "w", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let p = owners.iter().position(|&o| o == nodes[1].id).unwrap();
    let waiters = async |n: &Node| waiting(n, "w").await;
    let produce_one = async |i: u32| {
        let (st, r) = nodes[2]
            .call(
                ("x", "y"),
                Method::POST,
                "/v1/topics/w/produce/batch",
                Some(serde_json::json!({"messages": [{"payload": i, "partition": p}]})),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    };
    let park = |query: String| park(&nodes[0], "w", &format!("&max=10{query}"));
    // pinned to another member's partition
    let pinned = park(format!("&partition={p}"));
    until("the pinned reader's token at node 2", 10, async || {
        waiters(&nodes[1]).await == 1
    })
    .await;
    let sent = Instant::now();
    produce_one(0).await;
    let (st, body) = pinned.await.unwrap();
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["messages"][0]["payload"], 0, "{body}");
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "woken by the message"
    );
    // four unpinned readers: one message, one reader
    let mut readers: Vec<_> = (0..4).map(|_| park(String::new())).collect();
    until("four tokens at node 2", 10, async || {
        waiters(&nodes[1]).await == 4
    })
    .await;
    produce_one(1).await;
    until("one reader served, three still parked", 10, async || {
        readers.iter().filter(|r| r.is_finished()).count() == 1
            && waiters(&nodes[0]).await == 3
            && waiters(&nodes[1]).await == 3
    })
    .await;
    let mut got = Vec::new();
    let i = readers.iter().position(|r| r.is_finished()).unwrap();
    let (st, body) = readers.remove(i).await.unwrap();
    assert_eq!(st, StatusCode::OK, "{body}");
    got.extend(
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["payload"].clone()),
    );
    for i in 2..5 {
        produce_one(i).await;
    }
    for r in readers {
        let (st, body) = r.await.unwrap();
        assert_eq!(st, StatusCode::OK, "{body}");
        got.extend(
            body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["payload"].clone()),
        );
    }
    got.sort_by_key(|v| v.as_u64());
    assert_eq!(got, [1, 2, 3, 4], "each message to one reader");
}

/// A child partition's owner down while a cursor copies keyed records: the cursor retries
/// its slab, and each retry sends only to the child partitions that have not taken their
/// share yet. With the owner back, the child holds every record exactly once (before, each
/// retry appended the slab again to the live partitions: 13 copies after a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_partition_owner_down_costs_the_others_no_duplicates() {
    use reqwest::Method;
    use std::collections::BTreeMap;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "p", "partitions": 1})).await;
    let x = nodes
        .iter()
        .position(|n| Some(n.id) == made["partition_owners"][0].as_u64())
        .unwrap();
    let child = topic_everywhere(&nodes, serde_json::json!({"name": "c", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(child["partition_owners"].clone()).unwrap();
    let d = nodes
        .iter()
        .position(|n| n.id != nodes[x].id && owners.contains(&n.id))
        .unwrap();
    let (st, r) = nodes[x]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics/p/children",
            Some(serde_json::json!({"child": "c"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    nodes[d].kill9();
    let msgs: Vec<Value> = (0..30)
        .map(|i| serde_json::json!({"payload": format!("m{i}"), "payload_encoding": "utf8", "key": format!("key-{i}")}))
        .collect();
    let (st, r) = nodes[x]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics/p/produce/batch",
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    // the cursor has failed and retried a few times
    let errors = async || -> u64 {
        nodes[x]
            .metrics()
            .await
            .lines()
            .filter(|l| l.starts_with("narad_fanout_cursor_errors_total{") && l.contains("\"c\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    until("three failed copies", 60, async || errors().await >= 3).await;
    nodes[d].start().await;
    until("the member back ready", 60, async || nodes[d].ready().await).await;
    let mut got = BTreeMap::new();
    until("every record in the child", 30, async || {
        drain_into(&nodes[x], "c", &mut got).await;
        got.len() == 30
    })
    .await;
    assert!(got.values().all(|&n| n == 1), "copies per record: {got:?}");
}

/// A reader parked through `n` on `topic` (`query` added to `wait=20s`): its answer.
fn park(n: &Node, topic: &str, query: &str) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    park_with(&n.http, n, topic, &format!("wait=20s{query}"))
}

/// A reader parked through `n` on `topic` with `client` (`query`: the consume's).
fn park_with(
    client: &reqwest::Client,
    n: &Node,
    topic: &str,
    query: &str,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let (c, url) = (
        client.clone(),
        format!("{}/v1/topics/{topic}/consume?{query}", n.base),
    );
    tokio::spawn(async move {
        // (a member killed under the reader ends its request without an answer)
        let Ok(r) = c.get(url).send().await else {
            return (StatusCode::BAD_GATEWAY, Value::Null);
        };
        let st = r.status();
        (st, r.json::<Value>().await.unwrap_or(Value::Null))
    })
}

/// How many readers wait in `topic`'s line on `n` (its own and other members' tokens).
async fn waiting(n: &Node, topic: &str) -> u64 {
    let path = format!("/v1/topics/{topic}");
    let (_, t) = n.call(("x", "y"), reqwest::Method::GET, &path, None).await;
    t["waiters"].as_u64().unwrap_or(0)
}

/// Two owners push to the same parked reader; it takes one message and the other is given
/// back to its owner, which must offer it at once to the next reader in its line (before,
/// nothing dispatched a give-back: that reader waited out its 20 s with the message there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_given_back_goes_to_the_next_parked_reader() {
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "g", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let on = |i: usize| owners.iter().position(|&o| o == nodes[i].id).unwrap();
    let (pb, pc) = (on(1), on(2));
    let x = park(&nodes[0], "g", "&max=1");
    until("X's tokens at nodes 2 and 3", 10, async || {
        waiting(&nodes[1], "g").await >= 1 && waiting(&nodes[2], "g").await >= 1
    })
    .await;
    let y = park(&nodes[1], "g", "&max=1");
    until("Y behind X at node 3", 10, async || {
        waiting(&nodes[2], "g").await >= 2 && waiting(&nodes[0], "g").await >= 2
    })
    .await;
    let sent = Instant::now();
    let (st, r) = nodes[0]
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            "/v1/topics/g/produce/batch",
            Some(serde_json::json!({"messages": [
                {"payload": 1, "partition": pb}, {"payload": 2, "partition": pc}
            ]})),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    let mut got = Vec::new();
    for reader in [x, y] {
        let (st, body) = reader.await.unwrap();
        assert_eq!(st, StatusCode::OK, "{body}");
        got.extend(
            body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["payload"].clone()),
        );
    }
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "the second reader was served by the message given back, not by the end of its wait: {:?}",
        sent.elapsed()
    );
    got.sort_by_key(|v| v.as_u64());
    assert_eq!(got, [1, 2]);
}

/// An owner SIGKILLed and restarted while a reader waits through another member: it lost
/// the reader's token, which the reader leaves again within seconds, so a message produced
/// there after the restart still reaches the reader within its 25 s wait (before, the
/// reader waited it out and the message stayed for the next poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_an_owner_lost_in_a_restart_is_left_again() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "r", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let pb = owners.iter().position(|&o| o == nodes[1].id).unwrap();
    let patient = reqwest::Client::builder()
        .timeout(Duration::from_secs(40))
        .build()
        .unwrap();
    let reader = park_with(&patient, &nodes[0], "r", "wait=25s&max=1");
    until("the reader's token at node 2", 10, async || {
        waiting(&nodes[1], "r").await >= 1
    })
    .await;
    nodes[1].kill9();
    nodes[1].start().await;
    until("node 2 ready again", 60, async || nodes[1].ready().await).await;
    until("a produce into node 2's partition", 20, async || {
        let (st, r) = nodes[2]
            .call(
                ("x", "y"),
                reqwest::Method::POST,
                "/v1/topics/r/produce/batch",
                Some(serde_json::json!({"messages": [{"payload": 7, "partition": pb}]})),
            )
            .await;
        assert!(
            [
                StatusCode::ACCEPTED,
                StatusCode::SERVICE_UNAVAILABLE,
                StatusCode::GATEWAY_TIMEOUT
            ]
            .contains(&st),
            "{st} {r}"
        );
        st == StatusCode::ACCEPTED
    })
    .await;
    let (st, body) = reader.await.unwrap();
    assert_eq!(st, StatusCode::OK, "the reader waited out its wait: {body}");
    assert_eq!(body["messages"][0]["payload"], 7, "{body}");
}

/// A member frozen (SIGSTOP) while readers wait through it: an owner's push to it fails,
/// and the owner drops its tokens. Resumed, its readers leave their tokens again within
/// 5 s, so a message produced at that owner after the resume still reaches one of them
/// within their wait (before, they were starved for the rest of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_a_member_that_froze_are_served_again() {
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let made = topic_everywhere(
        &nodes,
        serde_json::json!({"name": "z", "partitions": 3, "visibility_timeout_ms": 60_000}),
    )
    .await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let pb = owners.iter().position(|&o| o == nodes[1].id).unwrap();
    let patient = reqwest::Client::builder()
        .timeout(Duration::from_secs(40))
        .build()
        .unwrap();
    let readers: Vec<_> = (0..3)
        .map(|_| park_with(&patient, &nodes[0], "z", "wait=25s&max=1"))
        .collect();
    until("the readers' tokens at node 2", 10, async || {
        waiting(&nodes[1], "z").await >= 3
    })
    .await;
    let produce = async |payload: u32| {
        let (st, r) = nodes[2]
            .call(
                ("x", "y"),
                reqwest::Method::POST,
                "/v1/topics/z/produce/batch",
                Some(serde_json::json!({"messages": [{"payload": payload, "partition": pb}]})),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    };
    nodes[0].signal("STOP");
    produce(1).await;
    // the push to the frozen member fails (after its 3 s deadline): its tokens are dropped
    until(
        "node 2 dropped the frozen member's tokens",
        15,
        async || waiting(&nodes[1], "z").await == 0,
    )
    .await;
    nodes[0].signal("CONT");
    until("the readers' tokens left again", 15, async || {
        waiting(&nodes[1], "z").await >= 1
    })
    .await;
    produce(2).await;
    let mut got = Vec::new();
    for r in readers {
        let (st, body) = r.await.unwrap();
        if st == StatusCode::OK {
            got.extend(
                body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["payload"].clone()),
            );
        }
    }
    assert!(
        got.contains(&Value::from(2)),
        "the message produced after the resume: {got:?}"
    );
}

/// A hundred readers that give up within milliseconds of parking: each one's cancel may
/// overtake its token on the way to an owner. The owner remembers such cancels, so no token
/// outlives its reader there (before, a third of them stayed in the owners' lines for
/// their whole 20 s wait, taking messages for nobody).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_readers_that_gave_up_at_once_do_not_linger() {
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "q", "partitions": 3})).await;
    let url = format!("{}/v1/topics/q/consume?wait=20s", nodes[0].base);
    let mut gone = tokio::task::JoinSet::new();
    for i in 0..100u64 {
        // each gives up after 1 to 20 ms: some before their tokens are left, some while
        let c = reqwest::Client::builder()
            .timeout(Duration::from_millis(1 + i % 20))
            .build()
            .unwrap();
        let url = url.clone();
        gone.spawn(async move { c.get(url).send().await.is_err() });
    }
    while gone.join_next().await.is_some() {}
    until("no token left in any line", 10, async || {
        let mut all = 0;
        for n in &nodes {
            all += waiting(n, "q").await;
        }
        all == 0
    })
    .await;
}

/// The member a hundred parked readers left tokens through is SIGKILLed: the owners' pushes
/// to it fail, and the owners drop its tokens and give back what waited to be pushed, so
/// readers parked on the live members get the messages within seconds, not after the
/// visibility timeout (60 s here). Only what was in flight to the dead member when it died
/// (at most 8 pushes per owner) waits for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_members_tokens_stop_taking_messages() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let made = topic_everywhere(
        &nodes,
        serde_json::json!({"name": "d", "partitions": 3, "visibility_timeout_ms": 60_000}),
    )
    .await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let on = |i: usize| owners.iter().position(|&o| o == nodes[i].id).unwrap();
    let (pb, pc) = (on(1), on(2));
    let doomed: Vec<_> = (0..100).map(|_| park(&nodes[0], "d", "&max=1")).collect();
    until("the doomed readers' tokens", 20, async || {
        waiting(&nodes[1], "d").await >= 100 && waiting(&nodes[2], "d").await >= 100
    })
    .await;
    let live: Vec<_> = (0..40)
        .map(|i| park(&nodes[1 + i % 2], "d", "&max=1"))
        .collect();
    until("the live readers parked", 20, async || {
        waiting(&nodes[1], "d").await >= 120 && waiting(&nodes[2], "d").await >= 120
    })
    .await;
    nodes[0].kill9();
    drop(doomed);
    let msgs: Vec<Value> = (0..40)
        .map(|i| serde_json::json!({"payload": i, "partition": if i % 2 == 0 { pb } else { pc }}))
        .collect();
    let (st, r) = nodes[1]
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            "/v1/topics/d/produce/batch",
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    let sent = Instant::now();
    let mut served = 0;
    for reader in live {
        let (st, _) = reader.await.unwrap();
        if st == StatusCode::OK && sent.elapsed() < Duration::from_secs(15) {
            served += 1;
        }
    }
    // 40 messages, at most 2 × 8 in flight to the dead member when it died (24 served
    // here; none before the owners dropped a dead member's tokens)
    assert!(
        served >= 20,
        "{served} of 40 live readers served within 15 s"
    );
}

/// Creates topic `name` through `n`, retrying while metadata writes answer a retryable
/// `503` (no leader yet); a `409` means an earlier try was applied after all.
async fn create_when_writable(n: &Node, name: &str, what: &str) {
    until(what, 60, async || {
        let (st, body) = n
            .call(
                ("x", "y"),
                reqwest::Method::POST,
                "/v1/topics",
                Some(serde_json::json!({ "name": name })),
            )
            .await;
        assert!(
            [
                StatusCode::CREATED,
                StatusCode::CONFLICT,
                StatusCode::SERVICE_UNAVAILABLE
            ]
            .contains(&st),
            "{st} {body}"
        );
        st != StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
}

/// Produces `range` as one batch through `n` (payloads `m<i>`, keyed `k<i % 5>`), all 202.
async fn produce_range(n: &Node, topic: &str, range: std::ops::Range<u32>) {
    let msgs: Vec<Value> = range
        .map(|i| serde_json::json!({"payload": format!("m{i}"), "payload_encoding": "utf8", "key": format!("k{}", i % 5)}))
        .collect();
    let (st, r) = n
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            &format!("/v1/topics/{topic}/produce/batch"),
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "through node {}: {r}", n.id);
}

/// Consumes and acks through `n` what `topic` has now, counting each payload's copies.
async fn drain_into(n: &Node, topic: &str, got: &mut std::collections::BTreeMap<u32, u32>) {
    use reqwest::Method;
    loop {
        let (st, body) = n
            .call(
                ("x", "y"),
                Method::GET,
                &format!("/v1/topics/{topic}/consume?max=100"),
                None,
            )
            .await;
        if st != StatusCode::OK {
            return;
        }
        let msgs = body["messages"].as_array().unwrap();
        let mut handles = Vec::new();
        for m in msgs {
            let i: u32 = m["payload"]
                .as_str()
                .and_then(|p| p.strip_prefix('m')?.parse().ok())
                .unwrap_or_else(|| panic!("not a test record: {m}"));
            *got.entry(i).or_default() += 1;
            handles.push(m["receipt_handle"].as_str().unwrap().to_owned());
        }
        let (st, res) = n
            .call(
                ("x", "y"),
                Method::POST,
                &format!("/v1/topics/{topic}/ack"),
                Some(serde_json::json!({"receipt_handles": handles})),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{res}");
    }
}

/// The cursor files of `child` under every member's data directory.
fn cursor_files(nodes: &[Node], child: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, prefix, out);
            } else if e.file_name().to_string_lossy().starts_with(prefix) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    for n in nodes {
        walk(&n.dir.join("topics"), &format!("fanout-{child}."), &mut out);
    }
    out
}

/// Fan-out in a cluster: the cursors run on the parent partitions' owners and copy to child
/// partitions whichever member owns them. A standalone topic attached from the earliest
/// record (through one member), a child made in one step from the tail (through another),
/// and a delay child each get exactly their records; an owner killed and restarted loses
/// none of them (copies to its partitions wait for it); the children's lag is summed over
/// the owners from any member; a detach stops the copies everywhere and removes the cursor
/// files on every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_children_in_a_cluster_get_every_record_whichever_members_own_them() {
    use reqwest::Method;
    use std::collections::BTreeMap;
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready(root.path()).await;
    let anyone = ("x", "y");
    topic_everywhere(&nodes, serde_json::json!({"name": "p", "partitions": 6})).await;
    produce_range(&nodes[0], "p", 0..40).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "all", "partitions": 4})).await;
    let (st, r) = nodes[2]
        .call(
            anyone,
            Method::POST,
            "/v1/topics/p/children",
            Some(serde_json::json!({"child": "all", "from": "earliest"})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    let (st, r) = nodes[1]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "new", "parent": "p"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    assert_eq!(
        (r["role"].as_str(), r["partitions"].as_u64()),
        (Some("child"), Some(6)),
        "{r}"
    );
    let (st, r) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "later", "parent": "p", "fanout_delay_ms": 1500})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    for (i, n) in nodes.iter().enumerate() {
        produce_range(n, "p", 40 + 20 * i as u32..60 + 20 * i as u32).await;
    }
    let want = |r: std::ops::Range<u32>| -> Vec<u32> { r.collect() };
    let (mut all, mut new, mut later) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    until("every record in 'all' and 'new'", 30, async || {
        drain_into(&nodes[0], "all", &mut all).await;
        drain_into(&nodes[2], "new", &mut new).await;
        all.keys().copied().collect::<Vec<_>>() == want(0..100)
            && new.keys().copied().collect::<Vec<_>>() == want(40..100)
    })
    .await;
    until("every due record in 'later'", 30, async || {
        drain_into(&nodes[1], "later", &mut later).await;
        later.keys().copied().collect::<Vec<_>>() == want(40..100)
    })
    .await;
    // no failure: each record at most twice (a copy whose answer took longer than the
    // 3 s call deadline, on a machine this busy, is sent again: a duplicate is allowed)
    for (name, got) in [("all", &all), ("new", &new), ("later", &later)] {
        assert!(got.values().all(|&c| c <= 2), "{name}: {got:?}");
    }
    // the lag, from any member, is every owner's cursors' summed
    until("no lag seen from node 2", 10, async || {
        let (st, r) = nodes[1]
            .call(anyone, Method::GET, "/v1/topics/p/children", None)
            .await;
        st == StatusCode::OK
            && r["children"].as_array().unwrap().len() == 3
            && r["children"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| c["lag_messages"] == 0)
            && r.get("partitions_unavailable").is_none()
    })
    .await;
    // a child attached from the tail just before node 2 is killed: node 2's cursors for it
    // have copied nothing, so no cursor file; restarted, they start where the link in the
    // catalog says (not at the oldest record, not past what comes next)
    let (st, r) = nodes[0]
        .call(
            anyone,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "fresh", "parent": "p"})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    until("the link followed on node 2", 10, async || {
        let (st, r) = nodes[1]
            .call(anyone, Method::GET, "/v1/topics/fresh", None)
            .await;
        st == StatusCode::OK && r["role"] == "child"
    })
    .await;
    // an owner killed: the parent keeps taking keyless records on the others; copies to
    // the dead member's child partitions wait for it, and nothing is lost
    nodes[1].kill9();
    for i in 100..130 {
        let (st, r) = nodes[i % 2 * 2]
            .call(
                anyone,
                Method::POST,
                "/v1/topics/p/produce/batch",
                Some(serde_json::json!({"messages": [
                    {"payload": format!("m{i}"), "payload_encoding": "utf8"}
                ]})),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{r}");
    }
    let (st, r) = nodes[0]
        .call(anyone, Method::GET, "/v1/topics/p/children", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert!(r["partitions_unavailable"].is_array(), "{r}");
    nodes[1].start().await;
    until("node 2 ready again", 60, async || nodes[1].ready().await).await;
    until(
        "the records produced meanwhile in 'all' and 'new'",
        30,
        async || {
            drain_into(&nodes[2], "all", &mut all).await;
            drain_into(&nodes[0], "new", &mut new).await;
            all.keys().copied().collect::<Vec<_>>() == want(0..130)
                && new.keys().copied().collect::<Vec<_>>() == want(40..130)
        },
    )
    .await;
    // the parent grown through node 3: the new partitions' owners start cursors for them
    // (from their first record: all of it came after the attach)
    let (st, r) = nodes[2]
        .call(
            anyone,
            Method::PATCH,
            "/v1/topics/p",
            Some(serde_json::json!({"partitions": 9})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    // (read-your-writes holds on the member that answered; node 1 follows shortly)
    until("node 1 has the new partitions", 10, async || {
        let (_, r) = nodes[0]
            .call(anyone, Method::GET, "/v1/topics/p", None)
            .await;
        r["partitions"] == 9
    })
    .await;
    for i in 130..148u32 {
        // (pinned: a 503 while the member restarted above is still taken for down is
        // retried, as a client would)
        until("a pinned produce to a new partition", 30, async || {
            let (st, r) = nodes[0]
                .call(
                    anyone,
                    Method::POST,
                    "/v1/topics/p/produce/batch",
                    Some(serde_json::json!({"messages": [
                        {"payload": format!("m{i}"), "payload_encoding": "utf8", "partition": 6 + i % 3}
                    ]})),
                )
                .await;
            assert!(
                [StatusCode::ACCEPTED, StatusCode::SERVICE_UNAVAILABLE].contains(&st),
                "{st} {r}"
            );
            st == StatusCode::ACCEPTED
        })
        .await;
    }
    until(
        "the new partitions' records in 'all' and 'new'",
        30,
        async || {
            drain_into(&nodes[0], "all", &mut all).await;
            drain_into(&nodes[1], "new", &mut new).await;
            all.keys().copied().collect::<Vec<_>>() == want(0..148)
                && new.keys().copied().collect::<Vec<_>>() == want(40..148)
        },
    )
    .await;
    // detached through node 1: every member stops its cursors and removes their files
    assert!(!cursor_files(&nodes, "all").is_empty());
    let (st, r) = nodes[0]
        .call(anyone, Method::DELETE, "/v1/topics/p/children/all", None)
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{r}");
    until("no cursor file of 'all' on any member", 10, async || {
        cursor_files(&nodes, "all").is_empty()
    })
    .await;
    produce_range(&nodes[1], "p", 148..170).await;
    until("the new records in 'new'", 30, async || {
        drain_into(&nodes[1], "new", &mut new).await;
        new.keys().copied().collect::<Vec<_>>() == want(40..170)
    })
    .await;
    drain_into(&nodes[2], "all", &mut all).await;
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        want(0..148),
        "a detached child got records"
    );
    let mut fresh = BTreeMap::new();
    until("every record since its attach in 'fresh'", 30, async || {
        drain_into(&nodes[2], "fresh", &mut fresh).await;
        fresh.keys().copied().collect::<Vec<_>>() == want(100..170)
    })
    .await;
    let (st, r) = nodes[2]
        .call(anyone, Method::GET, "/v1/topics/all", None)
        .await;
    assert_eq!(
        (st, r["role"].as_str()),
        (StatusCode::OK, Some("standalone")),
        "{r}"
    );
}

/// A remote child on a three-member source: each parent partition's owner ships its own
/// partition to the target; every record arrives (per-key order kept) and a SIGKILLed owner,
/// restarted, ships what it had not (duplicates allowed, no gap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_member_source_mirrors_every_partition_from_its_owner() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let (b, ca) = crate::remotes::target(root.path()).await;
    let b_port = crate::remotes::port_of(&b);
    let mut nodes = three_with(root.path(), |n| {
        n.secure = true;
        n.env
            .push(("NARAD_REMOTES_ALLOWED_PORTS".into(), b_port.to_string()));
        n.env
            .push(("NARAD_REMOTES_ALLOW_ADDRESSES".into(), "127.0.0.0/8".into()));
    })
    .await;
    all_ready(&nodes).await;
    let admin = ("admin", ROOT_PW);
    let (st, body) = nodes[0]
        .call(
            admin,
            Method::POST,
            "/v1/remotes",
            Some(serde_json::json!({"name": "b", "url": format!("https://127.0.0.1:{b_port}"), "username": "mirror", "password": crate::remotes::MIRROR_PW, "ca_pem": ca})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let (st, body) = nodes[0]
        .call(
            admin,
            Method::POST,
            "/v1/topics",
            Some(serde_json::json!({"name": "src", "partitions": 6})),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let owners: std::collections::BTreeSet<u64> = body["partition_owners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(owners.len(), 3, "partitions on every member: {body}");
    let (st, body) = nodes[1]
        .call(
            admin,
            Method::POST,
            "/v1/topics/src/children",
            Some(serde_json::json!({"child": "to-b", "remote": "b", "remote_topic": "orders", "lanes": 2})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let produce = async |n: &Node, seqs: std::ops::Range<u64>| {
        let msgs: Vec<Value> = seqs
            .map(|s| serde_json::json!({"key": format!("k{}", s % 30), "payload": {"seq": s}}))
            .collect();
        n.call(
            admin,
            Method::POST,
            "/v1/topics/src/produce/batch",
            Some(serde_json::json!({ "messages": msgs })),
        )
        .await
        .0
    };
    for (i, start) in (0..600).step_by(100).enumerate() {
        let st = produce(&nodes[i % 3], start..start + 100).await;
        assert_eq!(st, StatusCode::ACCEPTED);
    }
    let have = async || -> std::collections::HashSet<u64> {
        crate::remotes::replay_all(&b, "orders", 2)
            .await
            .iter()
            .map(|r| r.2)
            .collect()
    };
    until("600 records on the target", 60, async || {
        have().await.len() >= 600
    })
    .await;
    crate::remotes::check_key_order(&crate::remotes::replay_all(&b, "orders", 2).await);
    // the lag, summed over the owners, reaches 0 and every owner's cursors run
    until("lag 0 everywhere", 30, async || {
        let (st, c) = nodes[2]
            .call(admin, Method::GET, "/v1/topics/src/children", None)
            .await;
        st == StatusCode::OK
            && c["children"][0]["lag_messages"] == 0
            && c["children"][0]["remote"]["state"] == "running"
            && c.get("partitions_unavailable").is_none()
    })
    .await;
    // an owner killed while records it owns wait to be shipped: after its restart they are
    // on the target
    nodes[2].kill9();
    let mut acked = Vec::new();
    for start in (600..900).step_by(100) {
        if produce(&nodes[0], start..start + 100).await == StatusCode::ACCEPTED {
            acked.extend(start..start + 100);
        }
    }
    nodes[2].start().await;
    all_ready(&nodes).await;
    until("every acked record on the target", 60, async || {
        let h = have().await;
        acked.iter().all(|s| h.contains(s))
    })
    .await;
    assert!(!acked.is_empty());
    // a pause answered by one member holds on every owner: nothing more ships until the
    // resume, answered once every owner applied it too
    // (a 503 says an owner has not confirmed yet, e.g. a member restarted just now: the
    // change is recorded, and a retry waits again)
    until("the pause confirmed by every owner", 30, async || {
        let (st, _) = nodes[1]
            .call(
                admin,
                Method::POST,
                "/v1/topics/src/children/to-b/pause",
                None,
            )
            .await;
        st == StatusCode::NO_CONTENT
    })
    .await;
    let before = have().await.len();
    for (i, start) in (1000..1300).step_by(100).enumerate() {
        assert_eq!(
            produce(&nodes[i % 3], start..start + 100).await,
            StatusCode::ACCEPTED
        );
    }
    until("300 waiting, paused", 30, async || {
        let (_, c) = nodes[0]
            .call(admin, Method::GET, "/v1/topics/src/children", None)
            .await;
        c["children"][0]["lag_messages"] == 300 && c["children"][0]["remote"]["state"] == "paused"
    })
    .await;
    assert_eq!(have().await.len(), before, "nothing shipped while paused");
    // (a 503 says an owner has not confirmed yet, e.g. a member restarted just now: the
    // change is recorded, and a retry waits again)
    until("the resume confirmed by every owner", 30, async || {
        let (st, _) = nodes[2]
            .call(
                admin,
                Method::POST,
                "/v1/topics/src/children/to-b/resume",
                None,
            )
            .await;
        st == StatusCode::NO_CONTENT
    })
    .await;
    until("the paused records shipped", 60, async || {
        let h = have().await;
        (1000..1300).all(|s| h.contains(&s))
    })
    .await;
}

// ── partition moves ──

/// The partition owners of topic `c` as member `n` sees them, and the moves in flight.
async fn owners_and_moves(n: &Node) -> (Vec<u64>, usize) {
    let (_, t) = n
        .call(("x", "y"), reqwest::Method::GET, "/v1/topics/c", None)
        .await;
    let owners = t["partition_owners"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let (_, m) = n
        .call(("x", "y"), reqwest::Method::GET, "/v1/cluster/moves", None)
        .await;
    let moves = m["moves"].as_array().map_or(usize::MAX, Vec::len);
    (owners, moves)
}

/// Partitions move between members while producers and consumers go through all three:
/// each move copies the partition while it serves, freezes it for the tail, and flips its
/// owner; one moves back to the member it left (whose handles from before are stale). No
/// produce is refused, nothing acknowledged is lost, no message is leased to two readers at
/// once (leases the old owner handed out are held by the new one until they would end), and
/// the lifecycle checker finds the history clean with no fault window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_move_between_members_under_traffic_and_lose_nothing() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(root.path(), &[]).await;
    let traffic = Traffic::flowing(&nodes).await;
    let (before, _) = owners_and_moves(&nodes[0]).await;
    assert_eq!(before.len(), 6, "{before:?}");
    let next = |id: u64| id % 3 + 1;
    let plan = [
        (0u32, next(before[0])),
        (1, next(before[1])),
        (0, before[0]),
    ];
    for (i, &(p, to)) in plan.iter().enumerate() {
        let via = &nodes[i % 3];
        let (st, body) = via
            .call(
                ("x", "y"),
                Method::POST,
                "/v1/cluster/moves",
                Some(serde_json::json!({"topic": "c", "partition": p, "to": to})),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["to"], to, "{body}");
        let took = until(&format!("partition {p} on node {to}"), 90, async || {
            for n in &nodes {
                let (owners, moves) = owners_and_moves(n).await;
                if owners.get(p as usize) != Some(&to) || moves != 0 {
                    return false;
                }
            }
            true
        })
        .await;
        println!("partition {p} moved to node {to} in {took:?}");
        traffic
            .more(&format!("traffic after moving partition {p}"), 200)
            .await;
    }
    // a partition an admin moved stays where it went: pinned, left alone by a planning pass
    // (which balances with the others), until unpinned
    let pinned = async || -> Vec<u64> {
        let (_, m) = nodes[2]
            .call(("x", "y"), Method::GET, "/v1/cluster/moves", None)
            .await;
        let mut p: Vec<u64> = m["pinned"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["topic"] == "c")
            .filter_map(|p| p["partition"].as_u64())
            .collect();
        p.sort_unstable();
        p
    };
    assert_eq!(pinned().await, vec![0, 1]);
    let (st, plan) = nodes[1]
        .call(("x", "y"), Method::POST, "/v1/cluster/rebalance", None)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{plan}");
    assert!(
        plan["moves"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["topic"] != "c" || m["partition"].as_u64().unwrap() > 1),
        "{plan}"
    );
    until("the planner's moves done", 90, async || {
        owners_and_moves(&nodes[0]).await.1 == 0
    })
    .await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    assert_eq!((owners[0], owners[1]), (before[0], next(before[1])));
    let unpin = async || {
        nodes[0]
            .call(
                ("x", "y"),
                Method::DELETE,
                "/v1/cluster/moves/c/0/pin",
                None,
            )
            .await
            .0
    };
    assert_eq!(unpin().await, StatusCode::NO_CONTENT);
    assert_eq!(unpin().await, StatusCode::NOT_FOUND);
    until("unpinned everywhere", 30, async || {
        pinned().await == vec![1]
    })
    .await;
    // a move to where the partition is, or to a stranger, is refused
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/moves",
            Some(serde_json::json!({"topic": "c", "partition": 0, "to": before[0]})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/moves",
            Some(serde_json::json!({"topic": "c", "partition": 0, "to": 9})),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tally.rejected, 0, "{:?}", report.tally);
    // every member, SIGKILLed, starts again: the WAL names nothing in a partition directory
    // whose content a move replaced (its replay would write old frames into the new copy)
    let mut nodes = nodes;
    for n in nodes.iter_mut() {
        n.kill9();
        n.start().await;
        let n = &*n;
        until(
            &format!("node {} back; log:\n{}", n.id, n.log()),
            60,
            async || n.ready().await,
        )
        .await;
    }
    // the member partition 1 left holds none of its data any more
    let left = before[1];
    let n = nodes.iter().find(|n| n.id == left).unwrap();
    let topic_dir = std::fs::read_dir(n.dir.join("topics"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("c."))
        .unwrap()
        .path();
    let logs: u64 = std::fs::read_dir(topic_dir.join("p00001"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(logs, 0, "node {left} still holds partition 1's records");
}

/// Every member's partition count, as `GET /v1/cluster` through `n` reports it.
async fn partition_counts(n: &Node) -> Vec<(u64, u64)> {
    let Some(s) = n.status().await else {
        return Vec::new();
    };
    s["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["node_id"].as_u64().unwrap_or(0),
                m["partitions"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Rebalance 3 → 4 and decommission under traffic: producers and consumers go through the
/// three first members; a fourth joins and gets its share of the partitions (counts within
/// ±1), then it is decommissioned: its partitions move back, it leaves the cluster, and the
/// three keep the lot. No produce is refused, nothing acknowledged is lost, no message is
/// leased twice, and the lifecycle checker finds the history clean with no fault window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_gets_its_share_and_a_decommissioned_member_drains_under_traffic() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "d", "partitions": 6})).await;
    let traffic = Traffic::flowing(&nodes).await;
    let mut fourth = Node::new(4, root.path(), &nodes[0].members, SECRET);
    fourth.start().await;
    until(
        &format!("the joiner ready; log:\n{}", fourth.log()),
        90,
        async || fourth.ready().await,
    )
    .await;
    let balanced = async |want: usize| {
        let counts = partition_counts(&nodes[0]).await;
        let voters: Vec<u64> = counts.iter().map(|c| c.1).collect();
        let (_, m) = nodes[0]
            .call(("x", "y"), Method::GET, "/v1/cluster/moves", None)
            .await;
        counts.len() == want
            && counts.iter().map(|c| c.1).sum::<u64>() == 12
            && voters.iter().max().unwrap() - voters.iter().min().unwrap() <= 1
            && m["moves"].as_array().is_some_and(Vec::is_empty)
    };
    let took = until("12 partitions spread over 4 members", 120, async || {
        balanced(4).await
    })
    .await;
    println!(
        "rebalanced onto the joiner in {took:?}: {:?}",
        partition_counts(&nodes[0]).await
    );
    assert!(
        partition_counts(&nodes[0])
            .await
            .iter()
            .any(|&(id, n)| id == 4 && n == 3),
        "{:?}",
        partition_counts(&nodes[0]).await
    );
    traffic.more("traffic after the rebalance", 200).await;
    // three voters are kept: a member of three cannot be decommissioned once node 4 left
    let (st, body) = nodes[1]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/members/4/decommission",
            None,
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["partitions_to_move"], 3, "{body}");
    let took = until("node 4 drained and removed", 120, async || {
        let counts = partition_counts(&nodes[0]).await;
        counts.len() == 3 && !counts.iter().any(|c| c.0 == 4) && balanced(3).await
    })
    .await;
    println!("node 4 decommissioned in {took:?}");
    traffic.more("traffic after the decommission", 200).await;
    let (st, body) = nodes[1]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/members/3/decommission",
            None,
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tally.rejected, 0, "{:?}", report.tally);
    drop(fourth);
}

/// Three ready members (dev mode) configured with `env` (`NARAD_MOVE_*` knobs), and the
/// leader's planner off (it would balance the partition counts that the moves a test asks
/// for skew).
async fn three_ready_with(root: &Path, env: &[(&str, &str)]) -> Vec<Node> {
    let nodes = three_with(root, |n| {
        n.env = env
            .iter()
            .chain(&[("NARAD_CLUSTER_AUTO_REBALANCE", "false")])
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
    })
    .await;
    all_ready(&nodes).await;
    nodes
}

/// The source cluster and topic the mirror tests' records name (`narad-origin`).
const SRC: &str = "00000000000000c1/00000000000000a1";

/// Makes `topic` (through `n`) the mirror of [`SRC`] at epoch 0.
async fn mirror_of_src(n: &Node, topic: &str) {
    let (st, v) = n
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            &format!("/v1/topics/{topic}/mirror"),
            Some(serde_json::json!({"source_cluster": "00000000000000c1", "source_topic": "00000000000000a1", "epoch": 0})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
}

/// A request as [`SRC`]'s link at epoch 0 makes it (dev mode: no user needed).
fn link_post(
    n: &Node,
    path: &str,
    body: Value,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    n.http
        .post(format!("{}{path}", n.base))
        .header("narad-link", format!("{SRC}/0"))
        .json(&body)
        .send()
}

/// `count` records of [`SRC`]'s partition 0 (origin offsets and `seq` 0..count, keyed apart
/// so they spread over the mirror's partitions), taken by `topic` through `n` as its link
/// sends them.
async fn take_from_src(n: &Node, topic: &str, count: u64) {
    let messages: Vec<Value> = (0..count)
        .map(|i| serde_json::json!({"key": format!("k{i}"), "payload": {"seq": i}, "headers": {"narad-origin": format!("{SRC}/0/{i}")}}))
        .collect();
    let r = link_post(
        n,
        &format!("/v1/topics/{topic}/produce/batch"),
        serde_json::json!({ "messages": messages }),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED, "{:?}", r.text().await);
}

/// Consumes and acks everything `topic` delivers through `n` (until three empty answers):
/// the `seq` of each record, none delivered twice.
async fn take_all(n: &Node, topic: &str) -> std::collections::BTreeSet<u64> {
    let mut got = std::collections::BTreeSet::new();
    let mut empty = 0;
    while empty < 3 {
        let (st, v) = n
            .call(
                ("x", "y"),
                reqwest::Method::GET,
                &format!("/v1/topics/{topic}/consume?max=100"),
                None,
            )
            .await;
        if st == StatusCode::NO_CONTENT {
            empty += 1;
            continue;
        }
        assert_eq!(st, StatusCode::OK, "{v}");
        let msgs = v["messages"].as_array().unwrap();
        let handles: Vec<Value> = msgs.iter().map(|m| m["receipt_handle"].clone()).collect();
        for m in msgs {
            assert!(
                got.insert(m["payload"]["seq"].as_u64().unwrap()),
                "delivered twice: {m}"
            );
        }
        let (st, a) = n
            .call(
                ("x", "y"),
                reqwest::Method::POST,
                &format!("/v1/topics/{topic}/ack"),
                Some(serde_json::json!({ "receipt_handles": handles })),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{a}");
    }
    got
}

/// Failover meets a partition move (item 9 of the failover design): a mirror's partition
/// holding records the source's consumers had not acked moves to another member between two
/// progress messages. What the first progress settled moves with the partition's queue, the
/// second settles on the new owner (which indexes the partition afresh), and after the
/// promote the new primary's consumers get exactly what the source's had not acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_partition_moved_mid_failover_keeps_its_progress() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(root.path(), &[]).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "m", "partitions": 3})).await;
    mirror_of_src(&nodes[0], "m").await;
    take_from_src(&nodes[0], "m", 90).await;
    let progress = |frontier: u64| serde_json::json!({"partition": 0, "frontier": frontier, "end": 90, "shipped": 90, "leased": 0, "partitions": 1});
    let r = link_post(&nodes[1], "/v1/topics/m/progress", progress(40))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    // partition 0 of the mirror moves to a member that does not own it
    let owners_of = async |n: &Node| -> (Vec<u64>, usize) {
        let (_, t) = n.call(("x", "y"), Method::GET, "/v1/topics/m", None).await;
        let owners = t["partition_owners"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let (_, m) = n
            .call(("x", "y"), Method::GET, "/v1/cluster/moves", None)
            .await;
        (owners, m["moves"].as_array().map_or(usize::MAX, Vec::len))
    };
    let from = owners_of(&nodes[0]).await.0[0];
    let to = nodes.iter().map(|n| n.id).find(|&id| id != from).unwrap();
    let (st, body) = nodes[2]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/moves",
            Some(serde_json::json!({"topic": "m", "partition": 0, "to": to})),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    until("partition 0 moved", 60, async || {
        for n in &nodes {
            let (owners, moves) = owners_of(n).await;
            if owners.first() != Some(&to) || moves != 0 {
                return false;
            }
        }
        true
    })
    .await;
    // the source's consumers acked up to 70 since: the progress reaches another member
    let r = link_post(&nodes[2], "/v1/topics/m/progress", progress(70))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    let (st, v) = nodes[1]
        .call(("x", "y"), Method::POST, "/v1/topics/m/promote", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["report"]["partitions"][0]["received_to"], 90, "{v}");
    assert_eq!(v["report"]["partitions"][0]["acked_frontier"], 70, "{v}");
    let got = take_all(&nodes[0], "m").await;
    assert_eq!(got, (70..90).collect());
}

/// The phase and bytes copied of the move of partition `p` of `c`, as `n` reports it.
async fn move_phase(n: &Node, p: u32) -> Option<(String, u64)> {
    let (_, m) = n
        .call(("x", "y"), reqwest::Method::GET, "/v1/cluster/moves", None)
        .await;
    m["moves"].as_array()?.iter().find_map(|m| {
        (m["topic"] == "c" && m["partition"] == p).then(|| {
            (
                m["phase"].as_str().unwrap_or("waiting").to_owned(),
                m["bytes_copied"].as_u64().unwrap_or(0),
            )
        })
    })
}

/// Asks `via` to move partition `p` of `c` to `to`.
async fn start_move(via: &Node, p: u32, to: u64) {
    let (st, body) = via
        .call(
            ("x", "y"),
            reqwest::Method::POST,
            "/v1/cluster/moves",
            Some(serde_json::json!({"topic": "c", "partition": p, "to": to})),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
}

/// Waits until every live member in `nodes` names `to` the owner of partition `p` of `c`
/// with no move in flight.
async fn moved(nodes: &[&Node], p: u32, to: u64, secs: u64) -> Duration {
    until(&format!("partition {p} on node {to}"), secs, async || {
        for n in nodes {
            let (owners, moves) = owners_and_moves(n).await;
            if owners.get(p as usize) != Some(&to) || moves != 0 {
                return false;
            }
        }
        true
    })
    .await
}

/// A move whose source, and then whose target, is killed (SIGKILL) in the middle of the
/// copy: the copy starts again once each is back, and the move completes. The copy is paced
/// slow (`move_max_bytes_per_sec`) so that it is caught in the act. The lifecycle checker
/// finds the history clean (the kills are fault windows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_survives_its_source_and_its_target_killed_mid_copy() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes =
        three_ready_with(root.path(), &[("NARAD_MOVE_MAX_BYTES_PER_SEC", "8192")]).await;
    let traffic = Traffic::flowing(&nodes).await;
    // (enough that the paced copy of one partition takes several seconds)
    traffic.more("data to copy", 6000).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 0u32;
    let (source, target) = (owners[0], owners[0] % 3 + 1);
    // (members 1, 2, 3 at indices 0, 1, 2)
    let idx = |id: u64| (id - 1) as usize;
    let other = nodes
        .iter()
        .find(|n| n.id != source && n.id != target)
        .unwrap()
        .id;
    start_move(&nodes[idx(other)], p, target).await;
    for victim in [source, target] {
        let watcher = idx(other);
        until(
            &format!("the move copying before node {victim} is killed"),
            60,
            async || {
                move_phase(&nodes[watcher], p)
                    .await
                    .is_some_and(|(phase, bytes)| phase == "catch_up" && bytes > 0)
            },
        )
        .await;
        let i = idx(victim);
        let start = traffic.rec.now();
        nodes[i].kill9();
        traffic
            .more(&format!("traffic without node {victim}"), 100)
            .await;
        let (_, m) = nodes[watcher]
            .call(("x", "y"), reqwest::Method::GET, "/v1/cluster/moves", None)
            .await;
        assert_eq!(
            m["moves"].as_array().map(Vec::len),
            Some(1),
            "the move is still in flight: {m}"
        );
        nodes[i].start().await;
        traffic.moved(i, &nodes[i]);
        let n = &nodes[i];
        until(&format!("node {victim} ready again"), 60, async || {
            n.ready().await
        })
        .await;
        traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let took = moved(&all, p, target, 120).await;
    println!("the move completed {took:?} after the second restart");
    traffic.more("traffic after the move", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A destination too slow for the freeze (it stalls once the source froze, longer than the
/// freeze's term): the source's freeze lapses, the source records the thaw through the
/// cluster and serves again (a flip naming that freeze can no longer commit), and the
/// destination's next attempt freezes anew and completes. No produce is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_that_lapses_thaws_through_the_cluster_and_the_move_tries_again() {
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(
        root.path(),
        &[
            ("NARAD_MOVE_FREEZE_TTL_MS", "1000"),
            ("NARAD_MOVE_TEST_STALL_FROZEN_MS", "4000"),
        ],
    )
    .await;
    let traffic = Traffic::flowing(&nodes).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 1u32;
    let (source, target) = (owners[1], owners[1] % 3 + 1);
    let src = nodes.iter().find(|n| n.id == source).unwrap();
    start_move(&nodes[0], p, target).await;
    until("the source thawed a lapsed freeze", 60, async || {
        src.metrics()
            .await
            .lines()
            .any(|l| l.starts_with("narad_move_thaws_total ") && !l.ends_with(" 0"))
    })
    .await;
    let all: Vec<&Node> = nodes.iter().collect();
    moved(&all, p, target, 60).await;
    traffic.more("traffic after the move", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.tally.rejected, 0, "{:?}", report.tally);
}

/// A move cancelled just as it asks its source to freeze, and at once replaced by a move of
/// the same partition to another member: the late freeze is refused (its move is not in
/// flight), and a freeze taken for a move no longer in flight is thawed through the cluster
/// at once, so the new move completes instead of waiting out the freeze's whole term (found
/// by a move/cancel storm: 30 s with every lease and produce of the partition held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_replacing_a_cancelled_one_is_not_held_by_its_freeze() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(
        root.path(),
        &[
            ("NARAD_MOVE_FREEZE_TTL_MS", "60000"),
            ("NARAD_MOVE_TEST_STALL_BEFORE_FREEZE_MS", "1500"),
        ],
    )
    .await;
    topic_everywhere(&nodes, serde_json::json!({"name": "c", "partitions": 3})).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 2u32;
    let source = owners[p as usize];
    let (first, second) = (source % 3 + 1, (source + 1) % 3 + 1);
    let target = nodes.iter().find(|n| n.id == first).unwrap();
    start_move(&nodes[0], p, first).await;
    until(
        "the first move about to freeze its source",
        60,
        async || {
            move_phase(target, p)
                .await
                .is_some_and(|(phase, _)| phase == "freeze")
        },
    )
    .await;
    // cancelled, then replaced, while its freeze request waits to go out
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::DELETE,
            &format!("/v1/cluster/moves/c/{p}"),
            None,
        )
        .await;
    assert!(st.is_success(), "{st} {body}");
    start_move(&nodes[0], p, second).await;
    let all: Vec<&Node> = nodes.iter().collect();
    // well inside the 60 s freeze term (the new move's own first attempt stalls 1.5 s)
    let took = moved(&all, p, second, 30).await;
    println!("the replacing move completed {took:?} after the cancel");
}

/// A move cancelled in the middle of its (paced) copy stops copying at once: the
/// destination reads no more of the partition for it, and a later move of the same
/// partition to the same member copies the partition once (its progress is its own, not
/// the cancelled move's bytes added to it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_move_stops_copying() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready_with(root.path(), &[("NARAD_MOVE_MAX_BYTES_PER_SEC", "16384")]).await;
    topic_everywhere(&nodes, serde_json::json!({"name": "c", "partitions": 3})).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 1u32;
    let source = owners[p as usize];
    let to = source % 3 + 1;
    let target = nodes.iter().find(|n| n.id == to).unwrap();
    // ~240 KB in the partition: ~15 s of paced copy
    let big = "x".repeat(16 << 10);
    for _ in 0..15 {
        let (st, body) = nodes[0]
            .call(
                ("x", "y"),
                Method::POST,
                &format!("/v1/topics/c/produce?partition={p}"),
                Some(serde_json::json!(big)),
            )
            .await;
        assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    }
    let copied = async || {
        let m = target.metrics().await;
        let v = m
            .lines()
            .find_map(|l| l.strip_prefix("narad_move_bytes_copied_total "))
            .map(|v| v.trim().parse::<f64>().unwrap() as u64);
        v.expect("the destination counts bytes copied")
    };
    let in_flight = async || {
        let m = target.metrics().await;
        m.lines()
            .find_map(|l| l.strip_prefix("narad_moves_in_flight "))
            .map(|v| v.trim().parse::<f64>().unwrap() as u64)
            .unwrap_or(0)
    };
    start_move(&nodes[0], p, to).await;
    until("the copy under way", 60, async || {
        move_phase(target, p)
            .await
            .is_some_and(|(phase, bytes)| phase == "catch_up" && bytes > 0)
    })
    .await;
    let (st, body) = nodes[0]
        .call(
            ("x", "y"),
            Method::DELETE,
            &format!("/v1/cluster/moves/c/{p}"),
            None,
        )
        .await;
    assert!(st.is_success(), "{st} {body}");
    let at_cancel = copied().await;
    until("the cancelled move wound down", 60, async || {
        in_flight().await == 0
    })
    .await;
    let after = copied().await - at_cancel;
    // (a chunk being read as the cancel landed may still arrive: one 16 KiB chunk, paced)
    assert!(
        after <= 2 * (16 << 10),
        "the cancelled move copied {after} bytes after its cancel"
    );
    let before = copied().await;
    start_move(&nodes[0], p, to).await;
    let all: Vec<&Node> = nodes.iter().collect();
    moved(&all, p, to, 120).await;
    let second = copied().await - before;
    assert!(
        second <= 15 * (16 << 10) + (64 << 10),
        "the second move copied {second} bytes of a ~240 KB partition"
    );
}

/// Ambiguous flips and stale owners: a move stalls right before its flip while the Raft
/// leader is killed, and the flip's answer is lost (fault injection): the destination
/// settles the outcome by asking the next leader (read index, then the catalog); and
/// another while its source is killed; that move completes without it, and the old owner,
/// back with its frozen copy, gives the partition up: it serves it no more and its copy is
/// gone. The lifecycle checker finds the history clean (the kills are fault windows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flip_outlives_its_leader_and_a_stale_source_gives_its_copy_up() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = three_ready_with(
        root.path(),
        &[
            ("NARAD_MOVE_TEST_STALL_FLIP_MS", "3000"),
            ("NARAD_MOVE_TEST_LOSE_FLIP_REPLY", "true"),
        ],
    )
    .await;
    let traffic = Traffic::flowing(&nodes).await;
    let idx = |nodes: &[Node], id: u64| nodes.iter().position(|n| n.id == id).unwrap();
    // 1. the leader killed while a move it does not take part in waits to flip
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = (0..6u32).find(|&p| owners[p as usize] != leader).unwrap();
    let source = owners[p as usize];
    let target = [1, 2, 3]
        .into_iter()
        .find(|&t| t != leader && t != source)
        .unwrap();
    start_move(&nodes[idx(&nodes, target)], p, target).await;
    let watcher = idx(&nodes, target);
    until("the first move stalled before its flip", 60, async || {
        move_phase(&nodes[watcher], p)
            .await
            .is_some_and(|(phase, _)| phase == "stalled")
    })
    .await;
    let li = idx(&nodes, leader);
    let start = traffic.rec.now();
    nodes[li].kill9();
    let live: Vec<&Node> = nodes.iter().filter(|n| n.id != leader).collect();
    let took = moved(&live, p, target, 60).await;
    println!("flipped {took:?} after the leader's kill");
    // the flip's answer was lost: the target settled it by asking the cluster
    let t = &nodes[(target - 1) as usize];
    until("the target resolved the flip", 10, async || {
        t.log().contains("the flip's answer is treated as lost")
            && t.log().contains("partition moved here")
    })
    .await;
    nodes[li].start().await;
    traffic.moved(li, &nodes[li]);
    let n = &nodes[li];
    until("the old leader ready again", 60, async || n.ready().await).await;
    traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
    traffic.more("traffic after the first move", 200).await;
    // 2. the source killed while its move waits to flip: the flip commits without it
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let q = (0..6u32).find(|&q| q != p).unwrap();
    let source = owners[q as usize];
    let target = source % 3 + 1;
    let watcher = idx(&nodes, target);
    start_move(&nodes[watcher], q, target).await;
    until("the second move stalled before its flip", 60, async || {
        move_phase(&nodes[watcher], q)
            .await
            .is_some_and(|(phase, _)| phase == "stalled")
    })
    .await;
    let si = idx(&nodes, source);
    let start = traffic.rec.now();
    nodes[si].kill9();
    let live: Vec<&Node> = nodes.iter().filter(|n| n.id != source).collect();
    moved(&live, q, target, 60).await;
    traffic
        .more("traffic while the old owner is down", 100)
        .await;
    nodes[si].start().await;
    traffic.moved(si, &nodes[si]);
    let n = &nodes[si];
    until("the old owner ready again", 60, async || n.ready().await).await;
    traffic.rec.fault(FaultKind::Kill, start, traffic.rec.now());
    // its copy goes once it follows the flip
    let topic_dir = std::fs::read_dir(n.dir.join("topics"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("c."))
        .unwrap()
        .path();
    let pdir = topic_dir.join(format!("p{q:05}"));
    until("the old owner gave its copy up", 30, async || {
        let logs: u64 = std::fs::read_dir(&pdir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                    .map(|e| e.metadata().map_or(0, |m| m.len()))
                    .sum()
            })
            .unwrap_or(0);
        logs == 0 && !pdir.join("move.frozen").exists()
    })
    .await;
    traffic
        .more("traffic after the old owner came back", 200)
        .await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A network partition between a move's source and its target (nftables, in a namespace the
/// test makes) while the target copies: its calls fail, the attempt starts again with
/// backoff, and once the link heals the move completes. Both members keep serving their
/// clients meanwhile; the lifecycle checker finds the history clean with no fault window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_across_a_cut_link_waits_and_completes_once_healed() {
    let Some(ns) = Netns::new() else { return };
    let root = tempfile::tempdir().unwrap();
    let nodes = three_with(root.path(), |n| {
        n.netns = Some((ns.name.clone(), ns.ip.clone()));
        n.env = vec![
            ("NARAD_CLUSTER_AUTO_REBALANCE".into(), "false".into()),
            ("NARAD_MOVE_MAX_BYTES_PER_SEC".into(), "8192".into()),
        ];
    })
    .await;
    all_ready(&nodes).await;
    let traffic = Traffic::flowing(&nodes).await;
    traffic.more("data to copy", 6000).await;
    let (owners, _) = owners_and_moves(&nodes[0]).await;
    let p = 2u32;
    let (source, target) = (owners[2], owners[2] % 3 + 1);
    let (s, t) = (&nodes[(source - 1) as usize], &nodes[(target - 1) as usize]);
    start_move(t, p, target).await;
    until("the move copying", 60, async || {
        move_phase(t, p)
            .await
            .is_some_and(|(phase, bytes)| phase == "catch_up" && bytes > 0)
    })
    .await;
    ns.cut(s.rpc_port(), t.rpc_port());
    until("the move failing across the cut", 60, async || {
        move_phase(t, p)
            .await
            .is_some_and(|(phase, _)| phase == "retrying")
    })
    .await;
    traffic.more("traffic across the cut", 300).await;
    assert_eq!(owners_and_moves(t).await.0[p as usize], source);
    ns.heal();
    let all: Vec<&Node> = nodes.iter().collect();
    let took = moved(&all, p, target, 90).await;
    println!("moved {took:?} after the heal");
    traffic.more("traffic after the move", 200).await;
    let report = traffic.finish(&nodes).await;
    assert!(report.is_clean(), "{report}");
}

/// A member lost for good (SIGKILL, then its data directory deleted): `forget` hands its
/// partition to a live member, rebuilt from the archive. Every archived record is read
/// again through any member, the records the archive did not hold are reported lost with
/// their offset range, new records get offsets after every one a client was told, and the
/// refusals hold (a member that answers, a stranger).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_member_is_forgotten_and_its_partition_rebuilt_from_the_archive() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    // the real S3-compatible server when the test command started one, else local files
    let url = match std::env::var("NARAD_TEST_S3_URL") {
        Ok(base) => format!("{base}/forget-{}", std::process::id()),
        Err(_) => format!("file://{}", root.path().join("archive").display()),
    };
    let archive = narad_tiering::archive::Archive::open(&narad_tiering::archive::ArchiveSettings {
        url: url.clone(),
        ..Default::default()
    })
    .unwrap();
    let mut nodes = three_with(root.path(), |n| {
        n.archive = Some(url.clone());
        n.env = vec![
            ("NARAD_SEGMENT_MAX_AGE_MS".into(), "1000".into()),
            ("NARAD_TIERING_INTERVAL_MS".into(), "100".into()),
            ("NARAD_CLUSTER_AUTO_REBALANCE".into(), "false".into()),
        ];
    })
    .await;
    all_ready(&nodes).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "arch", "partitions": 3})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let leader = leader_of(&nodes[0].status().await.unwrap()).unwrap();
    // a partition whose owner does not lead (its loss keeps the quorum's leader)
    let p = (0..3u32).find(|&p| owners[p as usize] != leader).unwrap();
    let lost = owners[p as usize];
    let via = nodes.iter().position(|n| n.id != lost).unwrap();
    let produce = async |i: usize| {
        let n = &nodes[via];
        let r = n
            .http
            .post(format!("{}/v1/topics/arch/produce?partition={p}", n.base))
            .body(format!("p{p}-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
    };
    // three produced, consumed and acked, then seven more nobody consumes
    for i in 0..3 {
        produce(i).await;
    }
    let (st, got) = nodes[via]
        .call(
            ("x", "y"),
            Method::GET,
            &format!("/v1/topics/arch/consume?partition={p}&max=3&wait=2s"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{got}");
    let handles: Vec<String> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["receipt_handle"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(handles.len(), 3, "{got}");
    let (st, res) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/topics/arch/ack",
            Some(serde_json::json!({"receipt_handles": handles})),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{res}");
    for i in 3..10 {
        produce(i).await;
    }
    let archived = async || {
        archive
            .load_manifest("arch", p)
            .await
            .ok()
            .flatten()
            .map(|m| m.next_offset)
    };
    until("the first ten archived", 60, async || {
        archived().await == Some(10)
    })
    .await;
    // the archive heard of the acks with the segment (they came first)
    let manifest = archive.load_manifest("arch", p).await.unwrap().unwrap();
    assert_eq!(manifest.queue_frontier, Some(3), "{manifest:?}");
    // five more, then the owner is gone before it seals them (a segment seals after 1 s)
    for i in 10..15 {
        produce(i).await;
    }
    let li = (lost - 1) as usize;
    nodes[li].kill9();
    assert_eq!(
        archived().await,
        Some(10),
        "the last five must not be archived"
    );
    std::fs::remove_dir_all(&nodes[li].dir).unwrap();
    // refused: a member that answers, and a node that is no member
    let other = nodes
        .iter()
        .find(|n| n.id != lost && n.id != nodes[via].id)
        .unwrap();
    let (st, body) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            &format!("/v1/cluster/members/{}/forget", other.id),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    let (st, body) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            "/v1/cluster/members/9/forget",
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{body}");
    let (st, body) = nodes[via]
        .call(
            ("x", "y"),
            Method::POST,
            &format!("/v1/cluster/members/{lost}/forget"),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let parts = body["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1, "{body}");
    let f = &parts[0];
    assert_eq!(
        (
            f["partition"].as_u64(),
            f["archived_below"].as_u64(),
            f["lost_from"].as_u64(),
            f["lost_to"].as_u64(),
            f["lost_at_least"].as_u64()
        ),
        (Some(u64::from(p)), Some(10), Some(10), Some(15), Some(5)),
        "{body}"
    );
    assert_eq!(f["redeliver_from"], 3, "{body}");
    let to = f["to"].as_u64().unwrap();
    assert_ne!(to, lost);
    let live: Vec<&Node> = nodes.iter().filter(|n| n.id != lost).collect();
    until(
        "the partition owned by a live member everywhere",
        30,
        async || {
            for n in &live {
                let (_, t) = n
                    .call(("x", "y"), Method::GET, "/v1/topics/arch", None)
                    .await;
                if t["partition_owners"][p as usize] != to {
                    return false;
                }
            }
            true
        },
    )
    .await;
    // every archived record, through every live member (once the rebuild is in: until
    // then the partition answers 503 partition_moving, never an empty history)
    let want: Vec<String> = (0..10).map(|i| format!("p{p}-{i}")).collect();
    for n in &live {
        let replayed = async || {
            let (st, got) = n
                .call(
                    ("x", "y"),
                    Method::GET,
                    &format!("/v1/topics/arch/consume?partition={p}&offset=0&max=100"),
                    None,
                )
                .await;
            if st == StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(got["code"], "partition_moving", "{got}");
                return None;
            }
            assert_eq!(st, StatusCode::OK, "{got}");
            Some(
                got["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["payload"].as_str().unwrap().to_owned())
                    .collect::<Vec<String>>(),
            )
        };
        until("the archived records replayed", 60, async || {
            replayed().await.is_some()
        })
        .await;
        assert_eq!(replayed().await.unwrap(), want, "node {}", n.id);
    }
    // new records go after every offset a client was told of, and are consumed
    let r = live[0]
        .http
        .post(format!(
            "{}/v1/topics/arch/produce?partition={p}",
            live[0].base
        ))
        .body("after")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let made: Value = r.json().await.unwrap();
    assert_eq!(made["offset"], 15, "{made}");
    // queue consumers get every archived record the lost owner's consumers had not acked,
    // then the new one: nothing acknowledged and archived is skipped
    let mut consumed: Vec<String> = Vec::new();
    until(
        "the unacked archived records and the new one consumed",
        30,
        async || {
            let (st, got) = live[1]
                .call(
                    ("x", "y"),
                    Method::GET,
                    &format!("/v1/topics/arch/consume?partition={p}&max=10&wait=1s"),
                    None,
                )
                .await;
            assert_eq!(st, StatusCode::OK, "{got}");
            let msgs = got["messages"].as_array().cloned().unwrap_or_default();
            let handles: Vec<String> = msgs
                .iter()
                .map(|m| m["receipt_handle"].as_str().unwrap().to_owned())
                .collect();
            consumed.extend(
                msgs.iter()
                    .map(|m| m["payload"].as_str().unwrap().to_owned()),
            );
            if !handles.is_empty() {
                let (st, res) = live[1]
                    .call(
                        ("x", "y"),
                        Method::POST,
                        "/v1/topics/arch/ack",
                        Some(serde_json::json!({"receipt_handles": handles})),
                    )
                    .await;
                assert_eq!(st, StatusCode::OK, "{res}");
            }
            consumed.len() >= 8
        },
    )
    .await;
    let mut expected: Vec<String> = (3..10).map(|i| format!("p{p}-{i}")).collect();
    expected.push("after".into());
    assert_eq!(consumed, expected);
    let metrics: String = live[0].metrics().await + &live[1].metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("narad_partition_records_lost_total 5")),
        "the loss is counted"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("narad_partition_records_rebuilt_total 10")),
        "the records put back are counted"
    );
    // once the new record is archived the archive records the lost tail as a gap, so a
    // replay from inside it goes on past it even when only the archive holds the range
    until(
        "the lost tail recorded as a gap in the archive",
        30,
        async || {
            archive
                .load_manifest("arch", p)
                .await
                .ok()
                .flatten()
                .is_some_and(|m| m.gaps == [(10, 15)] && m.next_offset == 16)
        },
    )
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
mod faults;

/// A mirror whose partitions three members own: the source's progress reaches one member,
/// and every member settles the records of its own partitions that the source's consumers
/// acked; a promote through a third member reports and settles them all (before, only the
/// partitions of the member the progress reached were settled: the rest were delivered
/// again after the promote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirrors_progress_settles_the_partitions_of_every_member() {
    use reqwest::Method;
    let root = tempfile::tempdir().unwrap();
    let nodes = three_ready(root.path()).await;
    let made = topic_everywhere(&nodes, serde_json::json!({"name": "m", "partitions": 6})).await;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone()).unwrap();
    let distinct: std::collections::BTreeSet<u64> = owners.iter().copied().collect();
    assert!(distinct.len() >= 2, "{owners:?}");
    mirror_of_src(&nodes[0], "m").await;
    // 60 records of the source's partition 0, spread over the mirror's partitions by key
    take_from_src(&nodes[0], "m", 60).await;
    // the source's consumers acked the first 40; the progress reaches one member
    let r = link_post(
        &nodes[1],
        "/v1/topics/m/progress",
        serde_json::json!({"partition": 0, "frontier": 40, "end": 60, "shipped": 60, "leased": 0, "partitions": 1}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "{:?}", r.text().await);
    // the promote, through another member, reports and settles what every member holds
    let (st, v) = nodes[2]
        .call(("x", "y"), Method::POST, "/v1/topics/m/promote", None)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["report"]["partitions"][0]["received_to"], 60, "{v}");
    assert_eq!(v["report"]["partitions"][0]["acked_frontier"], 40, "{v}");
    assert_eq!(v["report"]["partitions"][0]["unreceived"], 0, "{v}");
    // the new primary's consumers get exactly what the source's had not acked
    let got = take_all(&nodes[0], "m").await;
    assert_eq!(got, (40..60).collect());
}
