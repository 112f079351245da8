//! `narad server start --dev --nodes N`: a local cluster of N nodes for trying the cluster on
//! one machine. Each node is a process of its own (this binary, `server start --dev`), so
//! one can be killed and restarted as in production; this process starts them, prints where
//! they are, and stops them all on Ctrl-C (SIGTERM, then SIGKILL after a grace period).
//!
//! The cluster's secret and its members' cluster ports are chosen once and kept in the data
//! directory (`cluster.secret`, `cluster.members`, both 0600), so a restart brings back the
//! same cluster with its data.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::client::BoxError;

const SECRET_FILE: &str = "cluster.secret";
/// Set on a node the launcher starts: the launcher's pid. The node asks the kernel for a
/// SIGTERM when its parent dies ([`follow_launcher`]), so no node outlives a launcher that
/// was killed outright.
pub const PARENT_ENV: &str = "NARAD_DEV_CLUSTER_PARENT";
const MEMBERS_FILE: &str = "cluster.members";
/// How long a node may take to bind its HTTP port.
const BIND_DEADLINE: Duration = Duration::from_secs(30);
/// How long stopped nodes get to shut down cleanly before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// A line to stdout that cannot fail the launcher: whoever reads its output may stop
/// reading (`| head -3`, a test that has what it needed), and `println!` would panic on the
/// closed pipe, taking every node down with the launcher.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// As [`say!`], to stderr.
macro_rules! esay {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

struct Node {
    id: u8,
    child: Child,
    log: PathBuf,
}

/// What `server start --dev --nodes N` was given.
pub struct Launch<'a> {
    pub nodes: u8,
    pub port: u16,
    pub dir: &'a Path,
    pub config: Option<&'a Path>,
    /// Passed to every node (the archive, unless one is named, is `<dir>/archive`, shared by
    /// them all: a cluster's members share one archive).
    pub storage: &'a crate::StorageArgs,
    /// Gets node 1's address once every node listens (any node serves every request).
    pub addr_file: Option<&'a Path>,
}

pub async fn run(launch: Launch<'_>) -> Result<(), BoxError> {
    let Launch {
        nodes: n,
        port,
        dir,
        config,
        storage,
        addr_file: launcher_addr_file,
    } = launch;
    if port != 0 && u32::from(port) + u32::from(n) > 65_536 {
        return Err(format!("--port {port} leaves no room for {n} nodes").into());
    }
    narad_core::fsutil::create_dir_private(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let secret = secret(dir)?;
    // one archive for every member, as a cluster has (a bucket in production)
    let shared = {
        let archive = dir.join("archive");
        narad_core::fsutil::create_dir_private(&archive)
            .map_err(|e| format!("cannot create {}: {e}", archive.display()))?;
        let abs = std::fs::canonicalize(&archive)?;
        format!("file://{}", abs.display())
    };
    let members = members(dir, n)?;
    let exe = std::env::current_exe()?;
    let mut nodes = Vec::new();
    for id in 1..=n {
        let node_dir = dir.join(format!("n{id}"));
        let addr_file = dir.join(format!("n{id}.addr"));
        let log = dir.join(format!("n{id}.log"));
        let _ = std::fs::remove_file(&addr_file);
        let out = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(&log)?
        };
        let http_port = if port == 0 {
            0
        } else {
            port + u16::from(id) - 1
        };
        let mut cmd = Command::new(&exe);
        cmd.args(["server", "start", "--dev", "--archive-url"])
            .arg(
                storage
                    .archive_url
                    .clone()
                    .unwrap_or_else(|| shared.clone()),
            )
            .arg("--port")
            .arg(http_port.to_string())
            .arg("--data-dir")
            .arg(&node_dir)
            .arg("--addr-file")
            .arg(&addr_file);
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        for (flag, value) in [
            (
                "--segment-max-age-ms",
                storage.segment_max_age_ms.map(|v| v.to_string()),
            ),
            (
                "--segment-max-bytes",
                storage.segment_max_bytes.map(|v| v.to_string()),
            ),
            (
                "--local-retention-ms",
                storage.local_retention_ms.map(|v| v.to_string()),
            ),
        ] {
            if let Some(v) = value {
                cmd.arg(flag).arg(v);
            }
        }
        let (_, cluster_addr) = members
            .iter()
            .find(|(m, _)| *m == id)
            .ok_or("a member is missing from cluster.members")?;
        cmd.env(PARENT_ENV, std::process::id().to_string())
            .env("NARAD_NODE_ID", id.to_string())
            .env("NARAD_CLUSTER_ADDR", cluster_addr)
            .env("NARAD_CLUSTER_MEMBERS", member_list(&members))
            .env("NARAD_CLUSTER_SECRET", &secret)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true);
        let child = cmd.spawn()?;
        nodes.push(Node { id, child, log });
    }
    say!("narad dev cluster: {n} nodes, data under {}", dir.display());
    let mut first_addr = None;
    for node in &mut nodes {
        let addr_file = dir.join(format!("n{}.addr", node.id));
        let addr = match wait_for_addr(&addr_file, &mut node.child).await {
            Ok(a) => a,
            Err(e) => {
                stop(&mut nodes).await;
                return Err(e);
            }
        };
        say!(
            "  node {}: http://{addr}  (log: {})",
            node.id,
            node.log.display()
        );
        first_addr.get_or_insert(addr);
    }
    if let (Some(path), Some(first)) = (launcher_addr_file, first_addr)
        && let Err(e) = crate::process::write_addr_file(path, &first)
    {
        stop(&mut nodes).await;
        return Err(format!("cannot write {}: {e}", path.display()).into());
    }
    say!(
        "Ctrl-C stops every node. Any node serves every request; `narad cluster status` shows the cluster."
    );
    let stopped = crate::process::shutdown_signal();
    tokio::pin!(stopped);
    let mut running = nodes.len();
    while running > 0 {
        let exits = futures_exit(&mut nodes);
        tokio::select! {
            () = &mut stopped => break,
            (id, status) = exits => {
                running -= 1;
                esay!("node {id} exited ({status}); the others keep running (restart the dev cluster to bring it back)");
            }
        }
    }
    stop(&mut nodes).await;
    Ok(())
}

/// The next node to exit, and how.
async fn futures_exit(nodes: &mut [Node]) -> (u8, String) {
    let waits = nodes
        .iter_mut()
        .filter(|n| n.child.id().is_some())
        .map(|n| {
            let id = n.id;
            Box::pin(async move {
                let st = n.child.wait().await;
                (id, st.map_or_else(|e| e.to_string(), |s| s.to_string()))
            })
        });
    let waits: Vec<_> = waits.collect();
    if waits.is_empty() {
        return std::future::pending().await;
    }
    futures_util::future::select_all(waits).await.0
}

/// SIGTERM to every node still running, then SIGKILL to those not gone after the grace.
async fn stop(nodes: &mut [Node]) {
    for n in nodes.iter() {
        if let Some(pid) = n
            .child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    for n in nodes.iter_mut() {
        if tokio::time::timeout(STOP_GRACE, n.child.wait())
            .await
            .is_err()
        {
            esay!("node {} did not stop within {STOP_GRACE:?}: killed", n.id);
            let _ = n.child.kill().await;
        }
    }
}

/// Waits (bounded) for a node to write its bound address; fails if it exits first.
async fn wait_for_addr(path: &Path, child: &mut Child) -> Result<String, BoxError> {
    let deadline = Instant::now() + BIND_DEADLINE;
    loop {
        if let Ok(a) = std::fs::read_to_string(path) {
            return Ok(a.trim().to_owned());
        }
        if let Some(st) = child.try_wait()? {
            return Err(format!("a node exited before it listened ({st}); see its log").into());
        }
        if Instant::now() > deadline {
            return Err("a node did not listen within 30 s; see its log".into());
        }
        // polling a file another process writes, in real time
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cluster's secret: made once (48 random characters) and kept in the data directory.
fn secret(dir: &Path) -> Result<String, BoxError> {
    let path = dir.join(SECRET_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if s.trim().len() >= 32 => return Ok(s.trim().to_owned()),
        Ok(_) => return Err(format!("{} is shorter than 32 bytes", path.display()).into()),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        Err(_) => {}
    }
    // a secret: from the OS's random source (never the seedable one), 48 characters
    let s = format!(
        "{}{}",
        narad_auth::authn::random_password(),
        narad_auth::authn::random_password()
    );
    narad_core::fsutil::write_file_atomic(&path, s.as_bytes())?;
    Ok(s)
}

/// The members' cluster (UDP) addresses on loopback: chosen once among the free ports and
/// kept in the data directory, so a restart forms the same cluster.
fn members(dir: &Path, n: u8) -> Result<Vec<(u8, String)>, BoxError> {
    let path = dir.join(MEMBERS_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let kept: Vec<(u8, String)> = text
            .lines()
            .filter_map(|l| {
                let (id, addr) = l.trim().split_once('@')?;
                Some((id.parse().ok()?, addr.to_owned()))
            })
            .collect();
        if kept.len() != usize::from(n) {
            return Err(format!(
                "{} names a cluster of {} nodes, not {n}: start it with --nodes {}, or use another --data-dir",
                path.display(),
                kept.len(),
                kept.len()
            )
            .into());
        }
        return Ok(kept);
    }
    // bound all at once (so no two get the same port), released for the nodes to take
    let sockets = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    let chosen: Vec<(u8, String)> = sockets
        .iter()
        .zip(1..)
        .map(|(s, id)| Ok((id, s.local_addr()?.to_string())))
        .collect::<Result<_, std::io::Error>>()?;
    drop(sockets);
    let text: String = chosen.iter().map(|(id, a)| format!("{id}@{a}\n")).collect();
    narad_core::fsutil::write_file_atomic(&path, text.as_bytes())?;
    Ok(chosen)
}

fn member_list(members: &[(u8, String)]) -> String {
    members
        .iter()
        .map(|(id, a)| format!("{id}@{a}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// In a node the launcher started: SIGTERM when the launcher dies (Linux `PR_SET_PDEATHSIG`),
/// and stop at once if it is gone already (it died before this could be asked). Elsewhere a
/// no-op.
pub fn follow_launcher() -> Result<(), BoxError> {
    let Ok(parent) = std::env::var(PARENT_ENV) else {
        return Ok(());
    };
    #[cfg(target_os = "linux")]
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
    let now = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
    if parent.trim() != now.to_string() {
        return Err("the dev cluster's launcher is gone".into());
    }
    Ok(())
}
