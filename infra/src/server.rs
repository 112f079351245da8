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
use narad_tiering::tierer::{Tierer, TieringConfig, TieringMetrics};

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
}

/// Opens the user store and seeds the root user on first start: its password comes from
/// `NARAD_ADMIN_PASSWORD`, or is generated and printed once to stderr (never to the log).
async fn open_security(
    cfg: &ServerConfig,
) -> Result<Option<Arc<narad_auth::Authenticator>>, ServerError> {
    use narad_auth::store::{ROOT_USER, UserCommand, UserRecord, UserStore, validate_password};
    use narad_auth::{Authenticator, authn};
    if !cfg.security_enabled {
        tracing::warn!(
            "security is OFF: no authentication, every request is allowed (development mode)"
        );
        return Ok(None);
    }
    narad_core::fsutil::create_dir_private(&cfg.data_dir)?;
    let store =
        Arc::new(UserStore::open(&cfg.data_dir).map_err(|e| ServerError::Security(e.to_string()))?);
    if store.get(ROOT_USER).is_none() {
        let given = std::env::var("NARAD_ADMIN_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty());
        let generated = given.is_none();
        let password = given.unwrap_or_else(authn::random_password);
        validate_password(&password)
            .map_err(|e| ServerError::Security(format!("NARAD_ADMIN_PASSWORD: {e}")))?;
        let hash = tokio::task::spawn_blocking(move || (authn::hash_password(&password), password))
            .await
            .map_err(|e| ServerError::Security(e.to_string()))?;
        let now = SystemClock.now_ms();
        store
            .apply(UserCommand::Create {
                user: UserRecord {
                    username: ROOT_USER.into(),
                    id: authn::new_user_id(),
                    password_hash: hash.0,
                    root: true,
                    grants: Vec::new(),
                    created_at_ms: now,
                    updated_at_ms: now,
                },
            })
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
    }
    let free = cfg.login_failures_before_block;
    let auth = tokio::task::spawn_blocking(move || Authenticator::new(store, free))
        .await
        .map_err(|e| ServerError::Security(e.to_string()))?;
    tracing::info!("security is on: HTTP Basic authentication, per-topic grants");
    Ok(Some(Arc::new(auth)))
}

/// A node with an empty data directory rebuilds its topics from the archive before it reports
/// ready; while the archive cannot be read it stays not-ready and retries (with a log line
/// each time). Returns false if shutdown began first.
async fn restore_from_archive(
    broker: &Arc<Broker>,
    archive: &Archive,
    stopping: &tokio_util::sync::CancellationToken,
) -> bool {
    let mut backoff = Duration::from_millis(200);
    // a node stopped half way through still counts as fresh next time
    if let Err(e) = broker.set_restore_pending(true) {
        tracing::error!(error = %e, "cannot mark the restore in progress");
    }
    loop {
        match narad_tiering::tierer::restore(broker, archive).await {
            Ok(r) => {
                if let Err(e) = broker.set_restore_pending(false) {
                    tracing::error!(error = %e, "cannot clear the restore marker; the next start will look for archived topics again");
                }
                if !r.restored.is_empty() {
                    tracing::info!(archive = %archive.url, topics = r.restored.len(), "restored topics from the archive");
                }
                return true;
            }
            Err(e) => {
                tracing::error!(archive = %archive.url, error = %e, retry_in = ?backoff, "cannot restore from the archive; not ready until it can");
            }
        }
        tokio::select! {
            () = stopping.cancelled() => return false,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
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
    let auth = open_security(&config).await?;
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
                    if let Some(a) = &archive
                        && b.is_fresh()
                        && !restore_from_archive(&b, a, &stopping).await
                    {
                        return; // shutting down before the restore could finish
                    }
                    if let Some(a) = archive {
                        tracing::info!(archive = %a.url, "tiering sealed segments to the archive");
                        let cfg = TieringConfig {
                            interval: Duration::from_millis(config.tiering_interval_ms),
                            archive_retention_ms: config.archive_retention_ms,
                            concurrency: config.tiering_concurrency,
                            ..TieringConfig::default()
                        };
                        let t =
                            Tierer::new(b.clone(), a, cfg, Arc::new(SystemClock), tiering_metrics);
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
                    let _ = broker_tx.send(Err(e));
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
                e = open_failed => *failed.lock() = Some(e.into()),
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
