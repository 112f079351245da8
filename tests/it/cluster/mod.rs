//! Cluster members as real processes on loopback, and the harness the cluster tests share:
//! [`Node`] (one member: its config, process, kill, freeze and restart), clusters of three,
//! readiness and leader polls, lifecycle traffic, and network namespaces cut with nftables.
//!
//! The tests: `membership` (forming, joiners, strangers, users, topics, the dev cluster),
//! `data` (forwarding and parked readers), `traffic` (kills, quorum loss and network faults
//! under traffic), `children` (fan-out and mirrors across members), `moves` (partition moves
//! and forget), `faults` (frozen, slow and misbehaving members).

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

mod children;
mod data;
mod faults;
mod membership;
mod moves;
mod traffic;

const SECRET: &str = "cluster secret for the cluster tests, 32+ bytes";

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

/// Three ready members (dev mode) for the review tests.
async fn three_ready(root: &Path) -> Vec<Node> {
    let (nodes, _) = three(root, false).await;
    all_ready(&nodes).await;
    nodes
}

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
                } else if item["code"] != "outcome_unknown" {
                    // (unknown: it may have been written; the checker takes either)
                    rec.rejected(id, 503);
                }
            }
            true
        }
        s @ (200..=299 | 503) => {
            rec.produce_outcome(ids, Some(s));
            s != 503
        }
        // an owner that never answered: the message may or may not have been written
        504 if serde_json::from_slice::<Value>(&body)
            .is_ok_and(|v| v["code"] == "outcome_unknown") =>
        {
            rec.produce_outcome(ids, None);
            false
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
