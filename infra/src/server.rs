//! The server: binds nothing itself (tests and the binary pass a listener), recovers the broker
//! in the background while `/healthz` already answers, serves HTTP, and shuts down in order.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use narad_core::broker::Broker;
use narad_core::clock::{Clock as _, SystemClock};
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
    let store =
        Arc::new(UserStore::open(&cfg.data_dir).map_err(|e| ServerError::Security(e.to_string()))?);
    let mut admin_password = None;
    if store.get(ROOT_USER).is_none() {
        admin_password = std::env::var("NARAD_ADMIN_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty());
        if let Some(p) = &admin_password {
            validate_password(p)
                .map_err(|e| ServerError::Security(format!("NARAD_ADMIN_PASSWORD: {e}")))?;
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
    use narad_auth::authn;
    use narad_auth::store::{ROOT_USER, UserCommand, UserRecord};
    if sec.store.get(ROOT_USER).is_some() {
        if sec.admin_password.is_some() {
            tracing::info!(
                user = ROOT_USER,
                "root user restored from the archive; NARAD_ADMIN_PASSWORD was not used"
            );
        }
        return Ok(());
    }
    let generated = sec.admin_password.is_none();
    let password = sec
        .admin_password
        .clone()
        .unwrap_or_else(authn::random_password);
    let hash = tokio::task::spawn_blocking(move || (authn::hash_password(&password), password))
        .await
        .map_err(|e| ServerError::Security(e.to_string()))?;
    let now = SystemClock.now_ms();
    let store = sec.store.clone();
    let root = UserRecord {
        username: ROOT_USER.into(),
        id: authn::new_user_id(),
        password_hash: hash.0,
        root: true,
        grants: Vec::new(),
        created_at_ms: now,
        updated_at_ms: now,
    };
    tokio::task::spawn_blocking(move || store.apply(UserCommand::Create { user: root }))
        .await
        .map_err(|e| ServerError::Security(e.to_string()))?
        .map_err(|e| ServerError::Security(e.to_string()))?;
    if generated {
        eprintln!(
            "narad: created the root user '{ROOT_USER}' with password: {}\nnarad: it is shown only this once; change it with `narad user passwd {ROOT_USER}`",
            hash.1
        );
        tracing::warn!(
            user = ROOT_USER,
            "root user created with a generated password (printed once on stderr)"
        );
    } else {
        tracing::info!(
            user = ROOT_USER,
            "root user created with the password from NARAD_ADMIN_PASSWORD"
        );
    }
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
    stopping: &tokio_util::sync::CancellationToken,
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
            () = stopping.cancelled() => return None,
            () = tokio::time::sleep(backoff) => {}
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
    stopping: &tokio_util::sync::CancellationToken,
) -> Result<bool, ServerError> {
    if let Some(a) = archive
        && b.is_fresh()
    {
        let target = RestoreTarget {
            keys: keys.clone(),
            users: security.map(|s| s.store.clone()),
        };
        match restore_from_archive(b, a, &target, stopping).await {
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

/// Serves the API on `listener` until `shutdown` resolves, then:
/// 1. reports not ready and answers waiting long-polls with 204,
/// 2. stops accepting and lets in-flight requests finish (up to `shutdown_grace_ms`),
/// 3. persists queue state and closes every partition log after its queued appends.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
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
        max_topics = config.max_topics,
        max_partitions = config.max_partitions,
        "resource limits"
    );
    let metrics = Arc::new(Metrics::new());
    let stopping_signal = tokio_util::sync::CancellationToken::new();
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
        body_budget: http::budget::BodyBudget::new(
            config.max_request_bytes_in_flight,
            config.max_request_bytes_per_user(),
        ),
        schemas: crate::schema::SchemaCache::default(),
        restore_notice: std::sync::OnceLock::new(),
    });
    if let Some(l) = metrics_listener {
        tracing::info!(addr = %l.local_addr()?, "metrics listener (no authentication)");
        // the same connection handling as the API (header, idle and write timeouts), with a
        // small cap of its own: a scraper needs a few connections, an attacker gets no more
        let serving = Arc::new(crate::conn::Serving {
            router: http::metrics_router(state.clone()),
            limiter: crate::limits::ConnectionLimiter::new(METRICS_MAX_CONNECTIONS),
            tls: None,
            timeouts: config.connection_timeouts(),
            refused: metrics.connections_refused.clone(),
            closed: metrics.connections_closed.clone(),
        });
        let stopping = stopping_signal.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::conn::serve(l, serving, stopping).await {
                tracing::error!(error = %e, "metrics listener failed");
            }
        });
    }
    let addr = listener.local_addr()?;
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "narad listening; recovering data");

    let started = std::time::Instant::now();
    let broker = Broker::open(
        config.broker_config(plan.max_open_logs),
        Arc::new(SystemClock),
        metrics.core.clone(),
    );
    let (broker_tx, broker_rx) = tokio::sync::oneshot::channel();
    let stopping = stopping_signal;
    let opener = {
        let (state, stopping, config) = (state.clone(), stopping.clone(), config.clone());
        tokio::spawn(async move {
            match broker.await {
                Ok(b) => {
                    match prepare(
                        &b,
                        archive.as_ref(),
                        security.as_ref(),
                        &keys,
                        &state,
                        &stopping,
                    )
                    .await
                    {
                        Ok(true) => {}
                        Ok(false) => return, // shutting down before the restore could finish
                        Err(e) => {
                            tracing::error!(error = %e, "cannot create the root user");
                            let _ = state.broker.set(b); // closed in order at exit
                            let _ = broker_tx.send(Err(e));
                            return;
                        }
                    }
                    let users = security.as_ref().map(|s| s.store.clone());
                    if let Some(a) = archive {
                        tracing::info!(archive = %a.url, "tiering sealed segments to the archive");
                        let cfg = TieringConfig {
                            interval: Duration::from_millis(config.tiering_interval_ms),
                            archive_retention_ms: config.archive_retention_ms,
                            concurrency: config.tiering_concurrency,
                            catalog_cursor_interval: Duration::from_millis(
                                config.tiering_interval_ms,
                            ),
                            ..TieringConfig::default()
                        };
                        let t = Tierer::with_catalog(
                            b.clone(),
                            a,
                            cfg,
                            Arc::new(SystemClock),
                            tiering_metrics,
                            CatalogSource { users, keys },
                        );
                        tokio::spawn(t.run(stopping));
                    }
                    let _ = state.broker.set(b);
                    state.ready.store(true, Ordering::Release);
                    tracing::info!(
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "narad ready"
                    );
                    let _ = broker_tx.send(Ok(()));
                }
                Err(e) => {
                    tracing::error!(error = %e, "broker failed to open");
                    let _ = broker_tx.send(Err(ServerError::from(e)));
                }
            }
        })
    };

    let failed: Arc<parking_lot::Mutex<Option<ServerError>>> = Arc::default();
    {
        let (state, failed, stopping) = (state.clone(), failed.clone(), stopping.clone());
        tokio::spawn(async move {
            // Only a failed open ends the wait early; a successful one keeps waiting for
            // the shutdown signal.
            let open_failed = async {
                match broker_rx.await {
                    Ok(Err(e)) => e,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown => {}
                e = open_failed => *failed.lock() = Some(e),
            }
            tracing::info!("shutting down");
            state.ready.store(false, Ordering::Release);
            state.shutting_down.store(true, Ordering::Release);
            if let Some(b) = state.broker.get() {
                b.drain_waiters();
            }
            stopping.cancel();
        });
    }
    let app = http::router(state.clone());
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    if let Some(tls) = &tls {
        tls.spawn_reloader(stopping.clone());
    }
    let serving = Arc::new(crate::conn::Serving {
        router: app,
        limiter: crate::limits::ConnectionLimiter::new(config.max_connections),
        tls,
        timeouts: config.connection_timeouts(),
        refused: metrics.connections_refused.clone(),
        closed: metrics.connections_closed.clone(),
    });
    let mut serve = tokio::spawn(crate::conn::serve(listener, serving, stopping.clone()));
    let joined = tokio::select! {
        r = &mut serve => Some(r),
        // Once shutdown starts, in-flight requests get `grace` to finish.
        () = stopping.cancelled() => tokio::time::timeout(grace, &mut serve).await.ok(),
    };
    let result = match joined {
        Some(r) => r.map_err(std::io::Error::other).and_then(|r| r),
        None => {
            tracing::warn!("in-flight requests did not finish within the shutdown grace period");
            serve.abort();
            Ok(())
        }
    };
    let _ = opener.await;
    if let Some(b) = state.broker.get() {
        b.shutdown().await;
    }
    tracing::info!("narad stopped");
    if let Some(e) = failed.lock().take() {
        return Err(e);
    }
    result?;
    Ok(())
}
