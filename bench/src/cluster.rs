//! `narad-bench cluster`: what a cluster's control plane costs, measured on real processes.
//!
//! Starts N members on loopback (security on: the root password is `NARAD_PASSWORD`, and the
//! requests go as `NARAD_USER`), then measures
//! - metadata write latency: a user's grants replaced (`PUT /v1/users/{u}/grants`: a Raft
//!   commit and nothing else, no password hashing), through the leader and through a follower
//!   (which forwards it to the leader and answers once it applied it itself);
//! - time to a new leader after the leader is killed with SIGKILL: until every survivor names
//!   the same new leader, and until a metadata write through a survivor succeeds again;
//! - the data plane: single produces into one partition through its owner and through a
//!   member that forwards them (latency, and CPU of all members per message); the wake-up of
//!   a reader parked on one member by a message produced into a partition another member
//!   owns (from the produce's start to the reader's answer); batch-100 produce through every
//!   member at once (messages per second over the cluster).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde::Serialize;

use crate::narad::Http;
pub use crate::stats::Latency;
use crate::stats::Stats;

pub struct ClusterBenchConfig {
    /// The `narad` binary.
    pub binary: PathBuf,
    pub nodes: usize,
    /// Metadata writes per path (leader, follower).
    pub writes: usize,
    /// Single produces per path (owner, forwarded), and wake-ups (at most 500).
    pub produces: usize,
    /// Seconds of batch produce through every member.
    pub batch_secs: u64,
    /// Leader kills.
    pub kills: usize,
    /// Where the members keep their data (a temporary directory by default).
    pub dir: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct ClusterBenchResult {
    pub nodes: usize,
    pub write_through_leader: Latency,
    pub write_through_follower: Latency,
    /// Writes that failed (not a 200), through the leader and through the follower.
    pub failed_writes: [u64; 2],
    /// SIGKILL of the leader → every survivor names one new leader.
    pub new_leader_ms: Vec<f64>,
    /// SIGKILL of the leader → a metadata write through a survivor answers 200.
    pub writes_again_ms: Vec<f64>,
    pub data: DataPlane,
}

#[derive(Debug, Serialize)]
pub struct DataPlane {
    /// Single produces into one partition through its owner, and through another member.
    pub produce_through_owner: Latency,
    pub produce_forwarded: Latency,
    /// CPU of all members per produced message, µs (owner path, forwarded path).
    pub cpu_us_per_message: [f64; 2],
    pub failed_produces: [u64; 2],
    /// Produce into a partition member A owns → answer to a reader waiting on member B.
    pub cross_member_wake: Latency,
    /// Keyless batches of 100 through every member at once: messages per second, all told.
    pub batch_msgs_per_s: f64,
    pub failed_batches: u64,
}

pub(crate) struct Member {
    pub(crate) id: u64,
    pub(crate) rpc: String,
    pub(crate) dir: PathBuf,
    pub(crate) child: Option<Child>,
    pub(crate) addr: String,
    /// More environment for its process (`NARAD_*` settings).
    pub(crate) env: Vec<(String, String)>,
}

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

pub(crate) fn err(s: impl Into<String>) -> Error {
    s.into().into()
}

impl Member {
    pub(crate) async fn start(
        &mut self,
        binary: &Path,
        members: &str,
        secret: &str,
        root_pw: &str,
    ) -> Result<(), Error> {
        let addr_file = self.dir.with_extension("addr");
        let _ = std::fs::remove_file(&addr_file);
        let log = std::fs::File::create(self.dir.with_extension("log"))?;
        self.child = Some(
            Command::new(binary)
                .args([
                    "server",
                    "start",
                    "--port",
                    "0",
                    "--archive-url",
                    "off",
                    "--data-dir",
                ])
                .arg(&self.dir)
                .arg("--addr-file")
                .arg(&addr_file)
                .env("NARAD_NODE_ID", self.id.to_string())
                .env("NARAD_CLUSTER_ADDR", &self.rpc)
                .env("NARAD_CLUSTER_MEMBERS", members)
                .env("NARAD_CLUSTER_SECRET", secret)
                .env("NARAD_ADMIN_PASSWORD", root_pw)
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                self.addr = a;
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(err(format!("member {} did not bind", self.id)));
            }
            pause().await;
        }
    }

    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Starts `nodes` members on loopback (data under `dir`, root password `root_pw`, a fresh
/// cluster secret, `env` added to each one's environment) and waits until every one is
/// ready. Returns them, the members list and
/// the secret (what a member restarted later is started with).
pub(crate) async fn start_cluster(
    binary: &Path,
    nodes: usize,
    dir: &Path,
    root_pw: &str,
    env: &[(&str, &str)],
) -> Result<(Vec<Member>, String, String), Error> {
    let secret = format!(
        "bench secret {:x}{:x}",
        Instant::now().elapsed().as_nanos(),
        std::process::id()
    );
    let secret = format!("{secret:0<40}");
    let mut members: Vec<Member> = (1..=nodes as u64)
        .map(|id| {
            let port = std::net::UdpSocket::bind("127.0.0.1:0")
                .and_then(|s| s.local_addr())
                .map(|a| a.port())
                .unwrap_or(0);
            Member {
                id,
                rpc: format!("127.0.0.1:{port}"),
                dir: dir.join(format!("m{id}")),
                child: None,
                addr: String::new(),
                env: env
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            }
        })
        .collect();
    let list = members
        .iter()
        .map(|m| format!("{}@{}", m.id, m.rpc))
        .collect::<Vec<_>>()
        .join(",");
    for m in &mut members {
        m.start(binary, &list, &secret, root_pw).await?;
    }
    for m in &members {
        until("members ready", 60, async || ready(&m.addr).await).await?;
    }
    Ok((members, list, secret))
}

/// Real time passing while a measured load runs (the bench's own pacing).
pub(crate) async fn sleep_real(d: Duration) {
    #[allow(clippy::disallowed_methods)]
    tokio::time::sleep(d).await;
}

/// The pause between two looks at real processes (real time: nothing else to wait on).
async fn pause() {
    #[allow(clippy::disallowed_methods)]
    tokio::time::sleep(Duration::from_millis(5)).await;
}

pub(crate) async fn get_json(addr: &str, path: &str) -> Option<serde_json::Value> {
    let mut h = Http::connect(addr).await.ok()?;
    let (st, body) = h.request(Method::GET, path, Bytes::new()).await.ok()?;
    (st == StatusCode::OK)
        .then(|| serde_json::from_slice(&body).ok())
        .flatten()
}

pub(crate) async fn ready(addr: &str) -> bool {
    match Http::connect(addr).await {
        Ok(mut h) => matches!(
            h.request(Method::GET, "/readyz", Bytes::new()).await,
            Ok((StatusCode::OK, _))
        ),
        Err(_) => false,
    }
}

pub(crate) async fn until(
    what: &str,
    secs: u64,
    mut f: impl AsyncFnMut() -> bool,
) -> Result<Duration, Error> {
    let t = Instant::now();
    while !f().await {
        if t.elapsed() > Duration::from_secs(secs) {
            return Err(err(format!("timed out: {what}")));
        }
        pause().await;
    }
    Ok(t.elapsed())
}

/// One grants write through `h`: its latency, if it succeeded.
async fn write(h: &mut Http, i: usize) -> Option<Duration> {
    let grants = if i.is_multiple_of(2) {
        r#"{"grants": []}"#
    } else {
        r#"{"grants": [{"action": "produce", "patterns": ["bench-*"]}]}"#
    };
    let t = Instant::now();
    let (st, _) = h
        .request(
            Method::PUT,
            "/v1/users/bench-user/grants",
            Bytes::from_static(grants.as_bytes()),
        )
        .await
        .ok()?;
    (st == StatusCode::OK).then(|| t.elapsed())
}

pub async fn run(cfg: ClusterBenchConfig) -> Result<ClusterBenchResult, Error> {
    let root_pw = std::env::var("NARAD_PASSWORD")
        .map_err(|_| err("set NARAD_USER=admin and NARAD_PASSWORD (the members' root password)"))?;
    if std::env::var("NARAD_USER").as_deref() != Ok("admin") {
        return Err(err("set NARAD_USER=admin (the members' root user)"));
    }
    let (mut members, list, secret) =
        start_cluster(&cfg.binary, cfg.nodes, &cfg.dir, &root_pw, &[]).await?;
    let leader_of = async |m: &Member| {
        get_json(&m.addr, "/v1/cluster")
            .await
            .and_then(|s| s["leader"].as_u64())
    };
    let leader = leader_of(&members[0])
        .await
        .ok_or_else(|| err("no leader"))?;
    let li = leader as usize - 1;
    let fi = (li + 1) % members.len();
    // the user whose grants the writes replace
    let mut h = Http::connect(&members[li].addr)
        .await
        .map_err(|e| err(e.to_string()))?;
    let body = r#"{"username": "bench-user", "password": "bench-user-password", "grants": []}"#;
    let (st, b) = h
        .request(
            Method::POST,
            "/v1/users",
            Bytes::from_static(body.as_bytes()),
        )
        .await
        .map_err(|e| err(e.to_string()))?;
    if st != StatusCode::CREATED && st != StatusCode::CONFLICT {
        return Err(err(format!(
            "creating the bench user: {st} {}",
            String::from_utf8_lossy(&b)
        )));
    }
    // a write that fails is counted, never left out of the figures silently
    let mut stats = [Stats::default(), Stats::default()];
    for (k, idx) in [li, fi].into_iter().enumerate() {
        let mut h = Http::connect(&members[idx].addr)
            .await
            .map_err(|e| err(e.to_string()))?;
        for i in 0..cfg.writes {
            match write(&mut h, i).await {
                Some(took) => stats[k].ok(took, 1, 0),
                None => stats[k].error("write failed"),
            }
        }
    }
    let failed = |s: &Stats| s.errors.values().sum::<u64>();
    let failed_writes = [failed(&stats[0]), failed(&stats[1])];
    let [through_leader, through_follower] =
        stats.map(|s| s.summary(Duration::from_secs(1)).latency_ms);
    let data = data_plane(&members, &cfg).await?;
    let mut new_leader_ms = Vec::new();
    let mut writes_again_ms = Vec::new();
    for _ in 0..cfg.kills {
        let Some(old) = leader_of(&members[0])
            .await
            .or(leader_of(&members[1]).await)
        else {
            return Err(err("no leader before a kill"));
        };
        let oi = old as usize - 1;
        let t = Instant::now();
        members[oi].kill9();
        let survivors: Vec<usize> = (0..members.len()).filter(|i| *i != oi).collect();
        until("a new leader", 60, async || {
            let mut seen = None;
            for &i in &survivors {
                match leader_of(&members[i]).await {
                    Some(l) if l != old && seen.is_none_or(|s| s == l) => seen = Some(l),
                    _ => return false,
                }
            }
            true
        })
        .await?;
        new_leader_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let addr = members[survivors[0]].addr.clone();
        until(
            "a write through a survivor",
            60,
            async || match Http::connect(&addr).await {
                Ok(mut h) => write(&mut h, 0).await.is_some(),
                Err(_) => false,
            },
        )
        .await?;
        writes_again_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        members[oi]
            .start(&cfg.binary, &list, &secret, &root_pw)
            .await?;
        until("the killed member ready again", 60, async || {
            ready(&members[oi].addr).await
        })
        .await?;
    }
    Ok(ClusterBenchResult {
        nodes: cfg.nodes,
        write_through_leader: through_leader,
        write_through_follower: through_follower,
        failed_writes,
        new_leader_ms,
        writes_again_ms,
        data,
    })
}
/// CPU seconds of every member process so far.
pub(crate) fn cpu(members: &[Member]) -> f64 {
    members
        .iter()
        .filter_map(|m| m.child.as_ref())
        .filter_map(|c| crate::procstat::cpu_seconds(c.id()))
        .sum()
}

pub(crate) async fn connect(addr: &str) -> Result<Http, Error> {
    Http::connect(addr).await.map_err(|e| err(e.to_string()))
}

/// Creates `name` with `partitions` through the first member, waits until every member has
/// it, and returns its partitions' owners.
pub(crate) async fn topic(
    members: &[Member],
    name: &str,
    partitions: usize,
) -> Result<Vec<u64>, Error> {
    let mut h = connect(&members[0].addr).await?;
    let body = format!(r#"{{"name": "{name}", "partitions": {partitions}}}"#);
    let (st, made) = h
        .request(Method::POST, "/v1/topics", Bytes::from(body))
        .await
        .map_err(|e| err(e.to_string()))?;
    if st != StatusCode::CREATED {
        return Err(err(format!(
            "creating topic {name}: {st} {}",
            String::from_utf8_lossy(&made)
        )));
    }
    let made: serde_json::Value = serde_json::from_slice(&made)?;
    let owners: Vec<u64> = serde_json::from_value(made["partition_owners"].clone())?;
    let path = format!("/v1/topics/{name}");
    for m in members {
        until("the topic on every member", 30, async || {
            get_json(&m.addr, &path).await.is_some()
        })
        .await?;
    }
    Ok(owners)
}

/// The data-plane figures (see the module's doc).
async fn data_plane(members: &[Member], cfg: &ClusterBenchConfig) -> Result<DataPlane, Error> {
    let owners = topic(members, "bench-data", members.len() * 2).await?;
    // partition 0, through its owner, then through another member
    let owner = owners[0] as usize - 1;
    let other = (owner + 1) % members.len();
    let payload = Bytes::from(vec![b'x'; 256]);
    let mut lat = [Stats::default(), Stats::default()];
    let mut cpu_us = [0.0; 2];
    for (k, idx) in [owner, other].into_iter().enumerate() {
        let mut h = connect(&members[idx].addr).await?;
        let before = cpu(members);
        for _ in 0..cfg.produces {
            let t = Instant::now();
            match h
                .request(
                    Method::POST,
                    "/v1/topics/bench-data/produce?partition=0",
                    payload.clone(),
                )
                .await
            {
                Ok((StatusCode::ACCEPTED, _)) => lat[k].ok(t.elapsed(), 1, 256),
                Ok((st, _)) => lat[k].error(format!("http {}", st.as_u16())),
                Err(e) => lat[k].error(e.to_string()),
            }
        }
        cpu_us[k] = (cpu(members) - before) * 1e6 / cfg.produces.max(1) as f64;
    }
    let failed = |s: &Stats| s.errors.values().sum::<u64>();
    let failed_produces = [failed(&lat[0]), failed(&lat[1])];
    let [produce_through_owner, produce_forwarded] =
        lat.map(|s| s.summary(Duration::from_secs(1)).latency_ms);
    let cross_member_wake = wake(members, cfg.produces.min(500)).await?;
    let (batch_msgs_per_s, failed_batches) = batches(members, cfg.batch_secs).await?;
    Ok(DataPlane {
        produce_through_owner,
        produce_forwarded,
        cpu_us_per_message: cpu_us,
        failed_produces,
        cross_member_wake,
        batch_msgs_per_s,
        failed_batches,
    })
}

/// A reader long-polls through one member; each message goes into a partition a second
/// member owns, produced through a third once the reader waits; measured from the produce's
/// start to the reader's answer.
async fn wake(members: &[Member], n: usize) -> Result<Latency, Error> {
    let owners = topic(members, "bench-wake", members.len()).await?;
    let owner = owners[0] as usize - 1;
    let reader_at = members[(owner + 1) % members.len()].addr.clone();
    let producer_at = members[(owner + 2) % members.len()].addr.clone();
    let mut stats = Stats::default();
    let mut reader = connect(&reader_at).await?;
    let mut producer = connect(&producer_at).await?;
    let mut watcher = connect(&reader_at).await?;
    for i in 0..n {
        let read = async {
            let r = reader
                .request(
                    Method::GET,
                    "/v1/topics/bench-wake/consume?wait=10s",
                    Bytes::new(),
                )
                .await;
            (r, Instant::now())
        };
        let send = async {
            // once the reader waits in line
            let parked = until("the reader waits", 10, async || {
                match watcher
                    .request(Method::GET, "/v1/topics/bench-wake", Bytes::new())
                    .await
                {
                    Ok((StatusCode::OK, b)) => serde_json::from_slice::<serde_json::Value>(&b)
                        .is_ok_and(|v| v["waiters"].as_u64() >= Some(1)),
                    _ => false,
                }
            })
            .await;
            let t = Instant::now();
            let sent = producer
                .request(
                    Method::POST,
                    "/v1/topics/bench-wake/produce?partition=0",
                    Bytes::from(format!("wake {i}")),
                )
                .await;
            (parked, sent, t)
        };
        let ((got, at), (parked, sent, t)) = tokio::join!(read, send);
        parked?;
        match (got, sent) {
            (Ok((StatusCode::OK, body)), Ok((StatusCode::ACCEPTED, _))) => {
                stats.record(at.duration_since(t));
                let m: serde_json::Value = serde_json::from_slice(&body)?;
                let h = m["receipt_handle"].as_str().unwrap_or_default().to_owned();
                let _ = reader
                    .request(
                        Method::POST,
                        &format!("/v1/topics/bench-wake/ack?receipt_handle={h}"),
                        Bytes::new(),
                    )
                    .await;
            }
            (got, sent) => {
                let what = |r: &Result<(StatusCode, Bytes), _>| match r {
                    Ok((st, _)) => format!("http {}", st.as_u16()),
                    Err(e) => format!("{e}"),
                };
                stats.error(format!("read {}, produce {}", what(&got), what(&sent)));
            }
        }
    }
    let s = stats.summary(Duration::from_secs(1));
    if !s.errors.is_empty() {
        return Err(err(format!("wake-ups failed: {:?}", s.errors)));
    }
    Ok(s.latency_ms)
}

/// Keyless batches of 100 (256-byte payloads) through every member at once for `secs`:
/// messages per second over the cluster, and failed batches.
async fn batches(members: &[Member], secs: u64) -> Result<(f64, u64), Error> {
    let one = format!(
        r#"{{"payload": "{}", "payload_encoding": "utf8"}}"#,
        "x".repeat(256)
    );
    let body = Bytes::from(format!(r#"{{"messages": [{}]}}"#, vec![one; 100].join(",")));
    let end = Instant::now() + Duration::from_secs(secs);
    let runs = members.iter().map(|m| {
        let (addr, body) = (m.addr.clone(), body.clone());
        async move {
            let mut h = connect(&addr).await?;
            let (mut sent, mut failed) = (0u64, 0u64);
            while Instant::now() < end {
                match h
                    .request(
                        Method::POST,
                        "/v1/topics/bench-data/produce/batch",
                        body.clone(),
                    )
                    .await
                {
                    Ok((StatusCode::ACCEPTED, _)) => sent += 100,
                    _ => failed += 1,
                }
            }
            Ok::<_, Error>((sent, failed))
        }
    });
    let t = Instant::now();
    let done = futures_util::future::join_all(runs).await;
    let elapsed = t.elapsed().as_secs_f64();
    let (mut sent, mut failed) = (0, 0);
    for d in done {
        let (s, f) = d?;
        sent += s;
        failed += f;
    }
    Ok((sent as f64 / elapsed, failed))
}
