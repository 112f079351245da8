//! The server: binds nothing itself (tests and the binary pass a listener), recovers the broker
//! in the background while `/healthz` already answers, serves HTTP, and shuts down in order.
//!
//! Every long-lived task (the API and metrics listeners, the broker open and archive
//! restore, the tierer, the TLS reloader) runs under the node's [`Supervisor`]: a panic is
//! logged, counted (`narad_task_panics_total`) and makes `/readyz` answer 503 naming the task;
//! shutdown stops the groups one by one in a fixed order and awaits each (see [`shut_down`]).

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use narad_core::broker::Broker;
use narad_core::clock::{SharedClock, SystemClock};
use narad_core::supervisor::{CancellationToken, Supervisor};
use tokio::net::TcpListener;

use narad_tiering::archive::Archive;
use narad_tiering::catalog::CatalogKeys;
use narad_tiering::tierer::{CatalogSource, RestoreTarget, Tierer, TieringConfig, TieringMetrics};

use crate::config::ServerConfig;
use crate::http::{self, AppState};
use crate::metrics::Metrics;

/// Connections the separate metrics listener (`metrics_addr`) serves at once.
const METRICS_MAX_CONNECTIONS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("broker failed to start: {0}")]
    Broker(#[from] narad_core::broker::BrokerError),
    #[error("http server failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("archive: {0}")]
    Archive(#[from] narad_tiering::archive::ArchiveError),
    #[error("security: {0}")]
    Security(String),
    #[error("tls: {0}")]
    Tls(String),
    #[error("file descriptors: {0}")]
    FdLimit(String),
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error(
        "data directory {dir} is in use by another narad process{holder}: two brokers on one data directory would hand out the same offsets and delete each other's write-ahead log"
    )]
    DataDirInUse { dir: String, holder: String },
    #[error("cluster: {0}")]
    Cluster(String),
    /// What the caller of [`run`] could not do once the node served (write
    /// `--addr-file`).
    #[error("{0}")]
    Announce(String),
}

/// The file whose exclusive lock says a process serves the data directory.
const LOCK_FILE: &str = "narad.lock";

/// Takes the data directory for this process: an exclusive lock on `<data_dir>/narad.lock`,
/// held until the returned file is dropped (the kernel releases it if the process dies), so
/// a second broker on the same directory refuses to start instead of replaying and deleting
/// the first one's write-ahead log. The file holds the holder's pid, for the message.
fn lock_data_dir(dir: &Path) -> Result<std::fs::File, ServerError> {
    use std::io::{Read as _, Seek as _, Write as _};
    narad_core::fsutil::create_dir_private(dir)?;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = dir.join(LOCK_FILE);
    // never a link or a device planted under the name (it is truncated below)
    if let Ok(m) = std::fs::symlink_metadata(&path)
        && !m.is_file()
    {
        return Err(
            std::io::Error::other(format!("{} is not a regular file", path.display())).into(),
        );
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            // (a pid is a few bytes: a planted large file is not read whole)
            let mut pid = String::new();
            let _ = (&mut file).take(32).read_to_string(&mut pid);
            let pid = pid.trim();
            let holder = if pid.is_empty() || pid.len() > 20 {
                String::new()
            } else {
                format!(" (pid {pid})")
            };
            return Err(ServerError::DataDirInUse {
                dir: dir.display().to_string(),
                holder,
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
    }
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
}

/// The user store and its authenticator (security on), and the root password to seed with
/// if, once a restore from the archive had its chance, there is still no root user.
struct Security {
    auth: Arc<narad_auth::Authenticator>,
    store: Arc<narad_auth::UserStore>,
    /// `NARAD_ADMIN_PASSWORD`, checked; `None`: generate one.
    admin_password: Option<String>,
}

/// Opens the user store. The root user is not seeded here but by [`seed_root`] after the
/// broker opened: a node restored from the archive gets its root (with its old password)
/// from the catalog snapshot instead. Until then no user exists, so nobody gets in.
async fn open_security(cfg: &ServerConfig) -> Result<Option<Security>, ServerError> {
    use narad_auth::Authenticator;
    use narad_auth::store::{ROOT_USER, UserStore, validate_password};
    if !cfg.security_enabled {
        tracing::warn!(
            "security is OFF: no authentication, every request is allowed (development mode)"
        );
        return Ok(None);
    }
    narad_core::fsutil::create_dir_private(&cfg.data_dir)?;
    // a cluster member mirrors the cluster's users (its metastore holds them)
    let store = if cfg.cluster_members.trim().is_empty() {
        Arc::new(UserStore::open(&cfg.data_dir).map_err(|e| ServerError::Security(e.to_string()))?)
    } else {
        Arc::new(UserStore::replica())
    };
    let mut admin_password = None;
    if store.get(ROOT_USER).is_none() {
        let from_env = std::env::var("NARAD_ADMIN_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty());
        let file = cfg.admin_password_file.trim();
        admin_password = match (from_env, file.is_empty()) {
            (Some(_), false) => {
                return Err(ServerError::Security(
                    "set NARAD_ADMIN_PASSWORD or admin_password_file, not both".into(),
                ));
            }
            (from_env, true) => from_env,
            (None, false) => {
                let cannot = |e: String| {
                    ServerError::Security(format!("admin_password_file: cannot read {file}: {e}"))
                };
                let p = crate::config::read_secret_file(file).map_err(|e| cannot(e.to_string()))?;
                Some(String::from_utf8(p).map_err(|_| cannot("not UTF-8".into()))?)
            }
        };
        if let Some(p) = &admin_password {
            validate_password(p).map_err(|e| {
                ServerError::Security(format!("the root user's first password: {e}"))
            })?;
        }
    }
    let free = cfg.login_failures_before_block;
    let auth_store = store.clone();
    let auth = tokio::task::spawn_blocking(move || Authenticator::new(auth_store, free))
        .await
        .map_err(|e| ServerError::Security(e.to_string()))?;
    tracing::info!("security is on: HTTP Basic authentication, per-topic grants");
    Ok(Some(Security {
        auth: Arc::new(auth),
        store,
        admin_password,
    }))
}

/// Creates the root user if there is none (first start, or a restore that brought no users
/// back): its password comes from `NARAD_ADMIN_PASSWORD`, or is generated and printed once to
/// stderr (never to the log). Never an empty or default password.
async fn seed_root(sec: &Security) -> Result<(), ServerError> {
    use narad_auth::store::{ROOT_USER, UserCommand};
    if sec.store.get(ROOT_USER).is_some() {
        if sec.admin_password.is_some() {
            tracing::info!(
                user = ROOT_USER,
                "root user restored from the archive; NARAD_ADMIN_PASSWORD was not used"
            );
        }
        return Ok(());
    }
    let (root, generated) = narad_auth::root::new_root(sec.admin_password.clone())
        .await
        .map_err(ServerError::Security)?;
    let store = sec.store.clone();
    tokio::task::spawn_blocking(move || store.apply(UserCommand::Create { user: root }))
        .await
        .map_err(|e| ServerError::Security(e.to_string()))?
        .map_err(|e| ServerError::Security(e.to_string()))?;
    narad_auth::root::announce_root(generated.as_deref());
    Ok(())
}

/// A node with an empty data directory rebuilds its users, topics and fan-out links from the
/// archive before it reports ready; while the archive cannot be read it stays not-ready and
/// retries (with a log line each time). Returns `None` if shutdown began first, else what did
/// not come back (for `/readyz`), if anything.
async fn restore_from_archive(
    broker: &Arc<Broker>,
    archive: &Archive,
    target: &RestoreTarget,
    clock: &SharedClock,
    stopping: &CancellationToken,
) -> Option<Option<String>> {
    let mut backoff = Duration::from_millis(200);
    // a node stopped half way through still counts as fresh next time
    if let Err(e) = broker.set_restore_pending(true) {
        tracing::error!(error = %e, "cannot mark the restore in progress");
    }
    loop {
        match narad_tiering::tierer::restore(broker, archive, target).await {
            Ok(r) => {
                if let Err(e) = broker.set_restore_pending(false) {
                    tracing::error!(error = %e, "cannot clear the restore marker; the next start will look for archived topics again");
                }
                if !r.restored.is_empty() || r.users_restored.is_some() {
                    tracing::info!(
                        archive = %archive.url,
                        topics = r.restored.len(),
                        users = r.users_restored,
                        links = r.links_restored.len(),
                        "restored from the archive"
                    );
                }
                let notice = r.notice();
                if let Some(n) = &notice {
                    tracing::warn!(archive = %archive.url, "{n}");
                }
                return Some(notice);
            }
            Err(e) => {
                tracing::error!(archive = %archive.url, error = %e, retry_in = ?backoff, "cannot restore from the archive; not ready until it can");
            }
        }
        tokio::select! {
            biased;
            () = stopping.cancelled() => return None,
            () = clock.sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// What happens between the broker opening and the node turning ready: a fresh node restores
/// from the archive (users, topics, links; what did not come back goes to `/readyz`), then
/// the root user is created if there still is none. `Ok(false)`: shutdown began first.
async fn prepare(
    b: &Arc<Broker>,
    archive: Option<&Archive>,
    security: Option<&Security>,
    keys: &Option<Arc<CatalogKeys>>,
    state: &AppState,
    clock: &SharedClock,
    stopping: &CancellationToken,
) -> Result<bool, ServerError> {
    // a cluster member's users come from its cluster (seeded there), and a restore from the
    // archive is not done on a member yet (its topics are not served through the cluster)
    if state.cluster.is_some() {
        return Ok(true);
    }
    if let Some(a) = archive
        && b.is_fresh()
    {
        let target = RestoreTarget {
            keys: keys.clone(),
            users: security.map(|s| s.store.clone()),
        };
        match restore_from_archive(b, a, &target, clock, stopping).await {
            None => return Ok(false),
            Some(Some(notice)) => {
                let _ = state.restore_notice.set(notice);
            }
            Some(None) => {}
        }
    }
    if let Some(sec) = security {
        seed_root(sec).await?;
    }
    Ok(true)
}

/// The server's task groups (static names: the `task` label of `narad_task_panics_total`).
const API_TASK: &str = "api_listener";
const METRICS_TASK: &str = "metrics_listener";
const OPEN_TASK: &str = "broker_open";
const TIERER_TASK: &str = "tierer";
const CATALOG_TASK: &str = "cluster_catalog";
const MOVER_TASK: &str = "partition_mover";
const WITNESS_TASK: &str = "partition_witness";
const TLS_TASK: &str = "tls_reloader";
const CLUSTER_TASK: &str = "cluster_member";
const USERS_CARRY_TASK: &str = "users_carrier";

/// At shutdown, the tierer's upload in flight gets this long to finish before it is
/// abandoned. Abandoning loses nothing: an object is listed in the manifest only once it is
/// verified, and local segments stay until then, so the next start uploads it again.
const TIERER_STOP_GRACE: Duration = Duration::from_secs(10);
/// At shutdown, for the metrics listener's scrapes in flight, the TLS reloader and a broker
/// open or archive restore still under way (abandoned: recovery is redone at the next start).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What [`run`] opens in the background and its shutdown needs.
struct Opening {
    state: Arc<AppState>,
    tasks: Arc<Supervisor>,
    config: ServerConfig,
    /// `max_open_logs` as sized for the open-files limit.
    max_open_logs: usize,
    archive: Option<Archive>,
    tiering_metrics: Arc<TieringMetrics>,
    /// The user store (security on): restored from the archive, seeded with the root user,
    /// and written to the archive's catalog snapshot.
    security: Option<Security>,
    /// The keys of the catalog snapshot (`cluster_secret`).
    keys: Option<Arc<CatalogKeys>>,
    clock: SharedClock,
    /// The broker once open, before it serves (a restore may still be under way): shutdown
    /// closes it even if it never became ready.
    opened: Arc<std::sync::OnceLock<Arc<Broker>>>,
}

impl Opening {
    /// Opens the broker, restores a fresh node from the archive, starts the tierer, and only
    /// then serves and reports ready. Stopped, it abandons whatever is under way.
    async fn run(
        self,
        stop: CancellationToken,
        result: tokio::sync::oneshot::Sender<Result<(), ServerError>>,
    ) {
        let started = std::time::Instant::now();
        // a cluster member's catalog is the cluster's (its metastore)
        let replicated = self
            .state
            .cluster
            .clone()
            .map(crate::cluster::ReplicatedCatalog::new);
        let (cfg, clock, metrics) = (
            self.config.broker_config(self.max_open_logs),
            self.clock.clone(),
            self.state.metrics.core.clone(),
        );
        let open = async {
            match &replicated {
                Some(store) => Broker::open_with_store(cfg, clock, metrics, store.clone()).await,
                None => Broker::open(cfg, clock, metrics).await,
            }
        };
        let b = tokio::select! {
            biased;
            () = stop.cancelled() => {
                tracing::warn!("shutdown began before the data was recovered; recovery is abandoned and redone at the next start");
                return;
            }
            r = open => match r {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(error = %e, "broker failed to open");
                    let _ = result.send(Err(e.into()));
                    return;
                }
            },
        };
        let _ = self.opened.set(b.clone());
        match prepare(
            &b,
            self.archive.as_ref(),
            self.security.as_ref(),
            &self.keys,
            &self.state,
            &self.clock,
            &stop,
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => return, // shutting down before the restore could finish
            Err(e) => {
                tracing::error!(error = %e, "cannot create the root user");
                let _ = result.send(Err(e));
                return;
            }
        }
        // remote children's cursors here ship through the sender
        let sender = narad_xregion::sender::Sender::new(
            Arc::downgrade(&b),
            self.state.remotes.keys.clone(),
            self.state.remotes.guard.clone(),
            self.state.remotes.metrics.clone(),
        );
        b.set_remote_shipper(Arc::new(narad_xregion::sender::Shipper(sender.clone())));
        if let Some(security) = &self.security {
            // this cluster's users, to the remotes with carry_users (its leader sends them)
            let carrier = crate::users_carry::UsersCarrier {
                broker: b.clone(),
                store: security.store.clone(),
                sender,
                sends: self.state.cluster.clone().map(|node| {
                    Arc::new(move || node.meta.is_leader()) as Arc<dyn Fn() -> bool + Send + Sync>
                }),
                board: self.state.remotes.carries.clone(),
                metrics: self.state.remotes.metrics.clone(),
                clock: self.clock.clone(),
            };
            self.tasks
                .spawn(USERS_CARRY_TASK, move |stop| carrier.run(stop));
        }
        if let (Some(node), Some(store)) = (self.state.cluster.clone(), replicated) {
            // the other members' calls for this member's partitions, and ours for theirs
            let ingress = crate::forward::Ingress::new(
                b.clone(),
                node.clone(),
                self.state.archive.clone(),
                Some(crate::acked_ends::path_in(&self.config.data_dir)),
            );
            // partitions moving here are copied by the mover; it also thaws lapsed freezes
            let mover = crate::moves::Mover::new(
                node.clone(),
                b.clone(),
                store.clone(),
                self.state.move_metrics.clone(),
                self.config.move_settings(),
                Arc::downgrade(&ingress),
                self.state.archive.clone(),
                self.tasks.clone(),
            );
            node.meta
                .serve_data(Arc::new(crate::forward::service::DataService::new(
                    &ingress,
                    Some(mover.clone()),
                )));
            let _ = self.state.mover.set(mover.clone());
            let witness = mover.clone();
            self.tasks.spawn(MOVER_TASK, move |stop| mover.run(stop));
            self.tasks
                .spawn(WITNESS_TASK, move |stop| witness.witness(stop));
            // fan-out cursors here copy to child partitions the others own through it
            b.set_copy_forwarder(Arc::new(crate::forward::Copies(Arc::downgrade(&ingress))));
            let _ = self.state.ingress.set(ingress);
            let broker = b.clone();
            self.tasks.spawn(CATALOG_TASK, move |stop| {
                crate::cluster::follow_catalog(node, store, broker, stop)
            });
        }
        if let Some(a) = self.archive {
            tracing::info!(archive = %a.url, "tiering sealed segments to the archive");
            let cfg = TieringConfig {
                interval: Duration::from_millis(self.config.tiering_interval_ms),
                archive_retention_ms: self.config.archive_retention_ms,
                concurrency: self.config.tiering_concurrency,
                catalog_cursor_interval: Duration::from_millis(self.config.tiering_interval_ms),
                ..TieringConfig::default()
            };
            // a cluster's one catalog snapshot is its leader's to write
            let writer = self.state.cluster.clone().map(|node| {
                Arc::new(move || node.meta.is_leader()) as Arc<dyn Fn() -> bool + Send + Sync>
            });
            let catalog = CatalogSource {
                users: self.security.as_ref().map(|s| s.store.clone()),
                keys: self.keys,
                writer,
            };
            let t = Tierer::with_catalog(
                b.clone(),
                a,
                cfg,
                self.clock.clone(),
                self.tiering_metrics,
                catalog,
            );
            self.tasks.spawn(TIERER_TASK, move |stop| t.run(stop));
        }
        let _ = self.state.broker.set(b);
        self.state.ready.store(true, Ordering::Release);
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "narad ready"
        );
        let _ = result.send(Ok(()));
    }
}

/// Serves the API on `listener` until `shutdown` resolves (or the broker fails to open),
/// then shuts down in order (see [`shut_down`]). `announce` is called once the node holds its
/// data directory and serves the listener: where `--addr-file` is written, so that a second
/// broker refused by the directory's lock never leaves an address behind for a script to
/// find. An error from it shuts the node down and is returned.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    announce: impl FnOnce() -> Result<(), String>,
) -> Result<(), ServerError> {
    run_observed(listener, config, shutdown, |_, _| announce()).await
}

/// [`run`], handing the node's state and its task supervisor to `observe` once every task is
/// started (an error from it shuts the node down and is returned). The test hook: tests inject
/// a failing task through it and check that shutdown leaves nothing running.
#[doc(hidden)]
pub async fn run_observed(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
    observe: impl FnOnce(&Arc<AppState>, &Arc<Supervisor>) -> Result<(), String>,
) -> Result<(), ServerError> {
    // before anything reads or writes the data directory; held until this returns
    let _data_dir_lock = lock_data_dir(&config.data_dir)?;
    crate::http::set_data_dir_for_errors(&config.data_dir);
    for var in &config.ignored_env {
        tracing::warn!(
            var = %var,
            "not a setting of this broker: ignored (the original Narad's names are mapped in docs/migrating.md)"
        );
    }
    let nofile = crate::fdlimit::raise_nofile();
    let plan = crate::fdlimit::plan(nofile.soft, config.max_connections, config.max_open_logs)
        .map_err(ServerError::FdLimit)?;
    if nofile.soft != nofile.before {
        tracing::info!(
            from = nofile.before,
            to = nofile.soft,
            "raised the open-files limit to its hard value"
        );
    }
    for w in &plan.warnings {
        tracing::warn!(open_files_limit = nofile.soft, "{w}");
    }
    tracing::info!(
        open_files_limit = nofile.soft,
        max_open_logs = plan.max_open_logs,
        max_connections = plan.max_connections,
        max_topics = config.max_topics,
        max_partitions = config.max_partitions,
        "resource limits"
    );
    let metrics = Arc::new(Metrics::new());
    let tasks = Arc::new(Supervisor::new(metrics.core.tasks.clone()));
    let clock: SharedClock = Arc::new(SystemClock);
    let archive = config
        .archive_settings()
        .map(|s| Archive::open(&s))
        .transpose()?;
    let tiering_metrics = Arc::new(TieringMetrics::default());
    if archive.is_some() {
        metrics.register_with(|r| tiering_metrics.register(r));
    }
    let keys = config.cluster_secrets()?.map(|s| {
        let k = CatalogKeys::derive(&s.current, s.previous.as_deref());
        tracing::info!(
            key_id = %k.current_id(),
            previous = s.previous.is_some(),
            "cluster secret configured: the archive's catalog snapshot is sealed and holds the users"
        );
        Arc::new(k)
    });
    if keys.is_none() && archive.is_some() && config.security_enabled {
        tracing::warn!(
            "no cluster_secret: the archive's catalog snapshot is unsealed and holds no users, so a restore after a disk loss brings back topics and links but not users"
        );
    }
    let security = open_security(&config).await?;
    let auth = security.as_ref().map(|s| s.auth.clone());
    let tls = match (config.tls_cert_file.trim(), config.tls_key_file.trim()) {
        ("", _) | (_, "") => None,
        (cert, key) => {
            let t =
                crate::tls::Tls::open(Path::new(cert), Path::new(key)).map_err(ServerError::Tls)?;
            tracing::info!(cert, "TLS on: the API listener speaks HTTPS only");
            Some(t)
        }
    };
    let metrics_listener = match config.metrics_addr.trim() {
        "" => None,
        a => Some(TcpListener::bind(a).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot listen on metrics_addr {a}: {e}"))
        })?),
    };
    let move_metrics = Arc::new(crate::moves::MoveMetrics::default());
    // a cluster member binds its cluster endpoint and opens its metastore before it serves
    let cluster = match config.cluster()? {
        Some(c) => {
            let node = crate::cluster::ClusterNode::start(
                &c,
                &config.data_dir,
                security.as_ref().map(|s| s.store.clone()),
                security.as_ref().and_then(|s| s.admin_password.clone()),
            )
            .await
            .map_err(ServerError::Cluster)?;
            metrics.register_with(|r| {
                node.rpc_metrics.register(r);
                node.gauges.register(r);
                move_metrics.register(r);
            });
            tracing::info!(
                node_id = c.node_id,
                cluster_addr = %c.bind,
                advertise = %c.advertise,
                initial_member = c.is_initial_member(),
                members = c.members.len(),
                "cluster member: metastore open, cluster endpoint bound"
            );
            Some(node)
        }
        None => None,
    };
    // (the API's connections: a reply that finds no room may close those whose readers stopped)
    let api_limiter = crate::limits::ConnectionLimiter::new(plan.max_connections);
    let state = Arc::new(AppState {
        cfg: config.clone(),
        broker: std::sync::OnceLock::new(),
        ready: AtomicBool::new(false),
        shutting_down: AtomicBool::new(false),
        metrics: metrics.clone(),
        archive: archive
            .clone()
            .map(|a| Arc::new(narad_replay::ArchiveReader::new(a))),
        auth,
        users_loaded: AtomicBool::new(false),
        body_budget: http::budget::BodyBudget::new(
            config.max_request_bytes_in_flight,
            config.max_request_bytes_per_user(),
        )
        .with_reply_share(config.max_reply_bytes_in_flight())
        .with_stalled_replies(api_limiter.clone(), config.reply_stall()),
        schemas: narad_schema::SchemaCache::default(),
        restore_notice: std::sync::OnceLock::new(),
        cluster: cluster.clone(),
        ingress: std::sync::OnceLock::new(),
        remotes: http::remotes::RemotesKit::new(
            config.security_enabled,
            config.cluster_secrets()?.as_ref(),
            config.remote_guard()?,
        ),
        mover: std::sync::OnceLock::new(),
        move_metrics,
        sqs_keys: Default::default(),
    });
    metrics.register_with(|r| state.remotes.metrics.register(r));
    if let Some(node) = cluster.clone() {
        let clock = clock.clone();
        let follower = node.clone();
        tasks.spawn(CLUSTER_TASK, move |stop| node.run(clock, stop));
        tasks.spawn(CLUSTER_TASK, move |stop| follower.follow(stop));
    }
    if let Some(l) = metrics_listener {
        tracing::info!(addr = %l.local_addr()?, "metrics listener (no authentication)");
        // the same connection handling as the API (header, idle and write timeouts), with a
        // small cap of its own: a scraper needs a few connections, an attacker gets no more
        let serving = Arc::new(crate::conn::Serving {
            router: http::metrics_router(state.clone()),
            hot: None,
            limiter: crate::limits::ConnectionLimiter::new(METRICS_MAX_CONNECTIONS),
            tls: None,
            timeouts: config.connection_timeouts(),
            refused: metrics.connections_refused.clone(),
            closed: metrics.connections_closed.clone(),
        });
        tasks.spawn(METRICS_TASK, move |stop| async move {
            if let Err(e) = crate::conn::serve(l, serving, stop).await {
                tracing::error!(error = %e, "metrics listener failed");
            }
        });
    }
    let addr = listener.local_addr()?;
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "narad listening; recovering data");

    let opened = Arc::default();
    let (open_tx, open_rx) = tokio::sync::oneshot::channel();
    let opening = Opening {
        state: state.clone(),
        tasks: tasks.clone(),
        config: config.clone(),
        max_open_logs: plan.max_open_logs,
        archive,
        tiering_metrics,
        security,
        keys,
        clock,
        opened: Arc::clone(&opened),
    };
    tasks.spawn(OPEN_TASK, move |stop| opening.run(stop, open_tx));
    if let Some(tls) = &tls {
        let tls = tls.clone();
        tasks.spawn(TLS_TASK, move |stop| tls.watch(stop));
    }
    let serving = Arc::new(crate::conn::Serving {
        router: http::router(state.clone()),
        hot: Some(state.clone()),
        limiter: api_limiter,
        tls,
        timeouts: config.connection_timeouts(),
        refused: metrics.connections_refused.clone(),
        closed: metrics.connections_closed.clone(),
    });
    let (served_tx, served_rx) = tokio::sync::oneshot::channel();
    tasks.spawn(API_TASK, move |stop| async move {
        let _ = served_tx.send(crate::conn::serve(listener, serving, stop).await);
    });
    let announced = observe(&state, &tasks);

    // Only a failed open ends the wait early; a successful one keeps waiting for the signal.
    let open_failed = async {
        match open_rx.await {
            Ok(Err(e)) => e,
            _ => std::future::pending().await,
        }
    };
    let failed: Option<ServerError> = match announced {
        Err(e) => Some(ServerError::Announce(e)),
        Ok(()) => tokio::select! {
            () = shutdown => None,
            e = open_failed => Some(e),
            // only shutdown stops it: ended (or panicked) before that, the node cannot serve
            r = served_rx => Some(match r {
                Ok(Err(e)) => e.into(),
                Ok(Ok(())) | Err(_) => {
                    std::io::Error::other("the API listener stopped by itself").into()
                }
            }),
        },
    };
    shut_down(
        &state,
        &tasks,
        &opened,
        Duration::from_millis(config.shutdown_grace_ms),
    )
    .await;
    failed.map_or(Ok(()), Err)
}

/// Shuts the node down in order, every step awaited and bounded (a step that runs out of
/// time says so in the log and its tasks are aborted, never a silent hang):
/// 1. report not ready, answer waiting long polls with nothing (so they do not hold up 2);
/// 2. stop accepting; requests in flight get `grace` to finish; every connection task ends;
/// 3. stop the TLS reloader, and a broker open or archive restore still under way;
/// 4. stop the fan-out cursors (a slab being copied finishes and its cursor is written);
/// 5. stop the tierer (an upload in flight gets [`TIERER_STOP_GRACE`], then is abandoned);
/// 6. stop the metrics listener (scrapes watch the shutdown until here), and the partition
///    mover with the moves and rebuilds copying here (a staged copy is dropped; the move
///    starts again at the next start);
/// 7. the broker stops its timers and maintenance, persists queue state and closes its logs;
/// 8. a cluster member stops its membership task and its metastore (Raft, cluster endpoint).
async fn shut_down(
    state: &AppState,
    tasks: &Supervisor,
    opened: &std::sync::OnceLock<Arc<Broker>>,
    grace: Duration,
) {
    tracing::info!("shutting down");
    state.ready.store(false, Ordering::Release);
    state.shutting_down.store(true, Ordering::Release);
    if let Some(b) = opened.get() {
        b.drain_waiters();
    }
    tasks.stop(API_TASK, grace).await;
    tasks.stop(TLS_TASK, STOP_GRACE).await;
    tasks.stop(OPEN_TASK, STOP_GRACE).await;
    // nothing opens it any more: from here on the broker is there or not
    let broker = opened.get();
    if let Some(b) = broker {
        b.stop_fanout().await;
    }
    tasks.stop(TIERER_TASK, TIERER_STOP_GRACE).await;
    tasks.stop(METRICS_TASK, STOP_GRACE).await;
    tasks.stop(MOVER_TASK, STOP_GRACE).await;
    for group in crate::moves::COPY_TASKS {
        tasks.stop(group, STOP_GRACE).await;
    }
    if let Some(b) = broker {
        b.shutdown().await;
    }
    // last: the node leaves its cluster's conversation only once it serves nothing
    tasks.stop(CLUSTER_TASK, STOP_GRACE).await;
    if let Some(c) = &state.cluster {
        c.shutdown().await;
    }
    // every group was stopped above; this only catches one added without a step here
    tasks.shutdown(STOP_GRACE).await;
    tracing::info!("narad stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    /// Polls `f` until it holds, for at most 30 s of real time (each look is an HTTP request,
    /// so the loop does not spin).
    async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !f().await {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::task::yield_now().await;
        }
    }

    /// A panicked task makes `/readyz` answer 503 naming it and counts it; shutdown stops
    /// every supervised task (the listeners, the tierer) and the broker's, leaving none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicked_task_is_reported_and_shutdown_leaves_no_task_running() {
        let dir = tempfile::tempdir().unwrap();
        let config = ServerConfig {
            security_enabled: false,
            data_dir: dir.path().join("data"),
            metrics_addr: "127.0.0.1:0".into(),
            archive_url: "memory://".into(),
            ..ServerConfig::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let node: Arc<OnceLock<(Arc<AppState>, Arc<Supervisor>)>> = Arc::default();
        let server = tokio::spawn({
            let node = node.clone();
            run_observed(
                listener,
                config,
                async {
                    let _ = stopped.await;
                },
                move |state, tasks| {
                    let _ = node.set((state.clone(), tasks.clone()));
                    Ok(())
                },
            )
        });
        let http = reqwest::Client::new();
        let readyz = async || {
            let r = http.get(format!("{base}/readyz")).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        };
        eventually("never ready", async || readyz().await.0 == 200).await;
        let (state, tasks) = node.get().unwrap().clone();
        let running: Vec<&str> = tasks.running().into_iter().map(|(n, _)| n).collect();
        for task in [API_TASK, METRICS_TASK, TIERER_TASK] {
            assert!(
                running.contains(&task),
                "{task} is not supervised: {running:?}"
            );
        }

        // the test hook: a task of the node's supervisor that panics
        tasks.spawn("injected_fault", |_| async { panic!("injected") });
        eventually("/readyz never reported the panic", async || {
            readyz().await.0 == 503
        })
        .await;
        let (_, body) = readyz().await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["code"], "task_failed", "{v}");
        assert_eq!(
            v["failed_tasks"],
            serde_json::json!(["injected_fault"]),
            "{v}"
        );
        assert!(
            v["error"].as_str().unwrap().contains("injected_fault"),
            "{v}"
        );
        let metrics = http
            .get(format!("{base}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("narad_task_panics_total{task=\"injected_fault\"} 1"),
            "{metrics}"
        );
        // the rest of the node still serves
        let r = http
            .post(format!("{base}/v1/topics"))
            .json(&serde_json::json!({"name": "t"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert_eq!(tasks.running(), vec![], "a server task outlived shutdown");
        let broker = state.broker.get().unwrap();
        assert_eq!(
            broker.running_tasks(),
            vec![],
            "a broker task outlived shutdown"
        );
        assert!(broker.is_shutting_down());
    }
}
