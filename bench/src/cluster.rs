//! `narad-bench cluster`: what a cluster's control plane costs, measured on real processes.
//!
//! Starts N members on loopback (security on: the root password is `NARAD_PASSWORD`, and the
//! requests go as `NARAD_USER`), then measures
//! - metadata write latency: a user's grants replaced (`PUT /v1/users/{u}/grants`: a Raft
//!   commit and nothing else, no password hashing), through the leader and through a follower
//!   (which forwards it to the leader and answers once it applied it itself);
//! - time to a new leader after the leader is killed with SIGKILL: until every survivor names
//!   the same new leader, and until a metadata write through a survivor succeeds again.

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
}

struct Member {
    id: u64,
    rpc: String,
    dir: PathBuf,
    child: Option<Child>,
    addr: String,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn err(s: impl Into<String>) -> Error {
    s.into().into()
}

impl Member {
    async fn start(
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

    fn kill9(&mut self) {
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

/// The pause between two looks at real processes (real time: nothing else to wait on).
async fn pause() {
    #[allow(clippy::disallowed_methods)]
    tokio::time::sleep(Duration::from_millis(5)).await;
}

async fn get_json(addr: &str, path: &str) -> Option<serde_json::Value> {
    let mut h = Http::connect(addr).await.ok()?;
    let (st, body) = h.request(Method::GET, path, Bytes::new()).await.ok()?;
    (st == StatusCode::OK)
        .then(|| serde_json::from_slice(&body).ok())
        .flatten()
}

async fn ready(addr: &str) -> bool {
    match Http::connect(addr).await {
        Ok(mut h) => matches!(
            h.request(Method::GET, "/readyz", Bytes::new()).await,
            Ok((StatusCode::OK, _))
        ),
        Err(_) => false,
    }
}

async fn until(what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) -> Result<Duration, Error> {
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
    let secret = format!(
        "bench secret {:x}{:x}",
        Instant::now().elapsed().as_nanos(),
        std::process::id()
    );
    let secret = format!("{secret:0<40}");
    let mut members: Vec<Member> = (1..=cfg.nodes as u64)
        .map(|id| {
            let port = std::net::UdpSocket::bind("127.0.0.1:0")
                .and_then(|s| s.local_addr())
                .map(|a| a.port())
                .unwrap_or(0);
            Member {
                id,
                rpc: format!("127.0.0.1:{port}"),
                dir: cfg.dir.join(format!("m{id}")),
                child: None,
                addr: String::new(),
            }
        })
        .collect();
    let list = members
        .iter()
        .map(|m| format!("{}@{}", m.id, m.rpc))
        .collect::<Vec<_>>()
        .join(",");
    for m in &mut members {
        m.start(&cfg.binary, &list, &secret, &root_pw).await?;
    }
    for m in &members {
        until("members ready", 60, async || ready(&m.addr).await).await?;
    }
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
    })
}
