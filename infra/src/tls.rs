//! HTTPS on the API listener: rustls with the aws-lc-rs provider, the certificate chain and
//! key read from PEM files and reloaded on SIGHUP or when either file changes (checked once a
//! second). A reload that fails keeps the old certificate and says why in the log.
//!
//! Handshakes run in each connection's own task (at most [`HANDSHAKE_TIMEOUT`]), so a slow or
//! silent client never holds up the accept loop; after it, the same header-read and keep-alive
//! idle timeouts apply as on a plaintext listener (`crate::conn`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// Longest a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

#[derive(Debug)]
struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

/// The certificate files, their current contents, and the acceptor that serves them.
pub struct Tls {
    cert_file: PathBuf,
    key_file: PathBuf,
    resolver: Arc<Resolver>,
    acceptor: tokio_rustls::TlsAcceptor,
    /// Modification times (and sizes) last loaded, to notice replaced files.
    seen: Mutex<Option<(FileStamp, FileStamp)>>,
}

type FileStamp = Option<(SystemTime, u64)>;

fn stamp(p: &Path) -> FileStamp {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn load(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("tls_cert_file {}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "tls_cert_file {}: no PEM certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("tls_key_file {}: {e}", key_file.display()))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        format!(
            "tls_key_file {} does not fit the certificate: {e}",
            key_file.display()
        )
    })
}

impl Tls {
    pub fn open(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, String> {
        let stamps = (stamp(cert_file), stamp(key_file));
        let key = load(cert_file, key_file)?;
        let resolver = Arc::new(Resolver {
            current: RwLock::new(Arc::new(key)),
        });
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            resolver,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(cfg)),
            seen: Mutex::new(Some(stamps)),
        }))
    }

    /// Re-reads both files; on success new handshakes use the new certificate (open
    /// connections keep theirs). On failure the old certificate stays.
    pub fn reload(&self) -> Result<(), String> {
        let stamps = (stamp(&self.cert_file), stamp(&self.key_file));
        *self.seen.lock() = Some(stamps);
        let key = load(&self.cert_file, &self.key_file)?;
        *self.resolver.current.write() = Arc::new(key);
        Ok(())
    }

    fn changed(&self) -> bool {
        let now = (stamp(&self.cert_file), stamp(&self.key_file));
        self.seen.lock().as_ref() != Some(&now)
    }

    fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(()) => {
                tracing::info!(cert = %self.cert_file.display(), why, "TLS certificate reloaded")
            }
            Err(e) => {
                tracing::error!(error = %e, why, "TLS certificate reload failed; still serving the previous one")
            }
        }
    }

    /// Reloads on SIGHUP and when the files change, until `stopping` (the server runs it as
    /// a supervised task).
    pub async fn watch(self: Arc<Self>, stopping: CancellationToken) {
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        // Polls the file system in real time: the files change outside the process, on no
        // clock of ours, and no test needs to move this by hand.
        #[allow(clippy::disallowed_methods)]
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let hup_recv = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = stopping.cancelled() => return,
                _ = hup_recv => self.reload_logged("SIGHUP"),
                _ = tick.tick() => {
                    if self.changed() {
                        self.reload_logged("files changed");
                    }
                }
            }
        }
    }
}

impl Tls {
    /// The server side of a TLS handshake, at most [`HANDSHAKE_TIMEOUT`]; `None` if it failed
    /// (logged at debug: scanners and plain-HTTP clients are common).
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
    ) -> Option<TlsStream<TcpStream>> {
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(peer = %peer, "TLS handshake timed out");
                None
            }
        }
    }
}
