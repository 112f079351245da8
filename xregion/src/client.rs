//! The HTTPS client a node uses to call a remote cluster: it connects only where the guard
//! allows, and a remote's answer costs bounded time and memory.
//!
//! - Every request resolves the remote's name itself and connects to a vetted address
//!   ([`guard::resolve`]), so a name cannot be made to point inside the cluster's network
//!   between a check and a connection. No proxy variable is read.
//! - TLS verifies the remote against its CA bundle when it has one (and only that CA), else
//!   the system's roots; the server name is the URL's host.
//! - A redirect is never followed: it is an answer ([`ClientError::Redirect`]), since
//!   following it would reach an address no one vetted.
//! - A reply is read up to [`MAX_REPLY_BYTES`]; the whole request, connection included,
//!   has a deadline.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};

use crate::guard::{self, GuardConfig, GuardError, RemoteUrl};

/// Largest reply read from a remote (its error bodies and check answers are small).
pub const MAX_REPLY_BYTES: usize = 1 << 20;
/// Largest CA bundle a remote may carry.
pub use narad_core::catalog::remote::MAX_CA_BYTES;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Guard(#[from] GuardError),
    #[error("the CA bundle is not usable: {0}")]
    Ca(String),
    #[error("could not connect to the remote: {0}")]
    Connect(String),
    #[error("TLS with the remote failed: {0}")]
    Tls(String),
    #[error("the remote did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the remote answered a redirect ({0}), which is never followed")]
    Redirect(u16),
    #[error("the remote's reply is larger than {MAX_REPLY_BYTES} bytes")]
    TooLarge,
    #[error("HTTP with the remote failed: {0}")]
    Http(String),
}

impl ClientError {
    /// The link state this failure puts a remote child in (as `GET .../children` shows it).
    pub fn state(&self) -> &'static str {
        match self {
            Self::Guard(_) => "destination_refused",
            Self::Tls(_) | Self::Ca(_) => "tls_failed",
            Self::Redirect(_) => "redirect_refused",
            Self::Connect(_) | Self::Timeout(_) | Self::TooLarge | Self::Http(_) => "unavailable",
        }
    }
}

/// A remote's answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

/// A client for one remote: its URL, credentials and trust, fixed at construction.
pub struct RemoteClient {
    url: RemoteUrl,
    guard: GuardConfig,
    tls: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
    authorization: HeaderValue,
    host_header: HeaderValue,
    timeout: Duration,
    /// Kept-alive connections (no new TLS handshake per request).
    idle: parking_lot::Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for RemoteClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // (never the credential)
        f.debug_struct("RemoteClient")
            .field("url", &self.url.canonical)
            .finish_non_exhaustive()
    }
}

/// Whether `pem` is a usable CA bundle (at most [`MAX_CA_BYTES`], at least one certificate,
/// each one parsable).
pub fn check_ca(pem: &str) -> Result<(), ClientError> {
    tls_config(Some(pem)).map(|_| ())
}

fn tls_config(ca_pem: Option<&str>) -> Result<rustls::ClientConfig, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_pem {
        Some(pem) => {
            if pem.len() > MAX_CA_BYTES {
                return Err(ClientError::Ca(format!("longer than {MAX_CA_BYTES} bytes")));
            }
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| ClientError::Ca(e.to_string()))?;
                roots
                    .add(cert)
                    .map_err(|e| ClientError::Ca(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(ClientError::Ca("it holds no certificate".into()));
            }
        }
        None => {
            // (certificates the system store holds but rustls cannot parse are skipped)
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

impl RemoteClient {
    /// A client for the remote at `url` (checked by [`RemoteUrl::parse`]) as `username`.
    pub fn new(
        url: RemoteUrl,
        username: &str,
        password: &str,
        ca_pem: Option<&str>,
        guard: GuardConfig,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let tls = tokio_rustls::TlsConnector::from(Arc::new(tls_config(ca_pem)?));
        let server_name = ServerName::try_from(url.host.clone())
            .map_err(|e| ClientError::Tls(format!("'{}': {e}", url.host)))?;
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        let mut authorization = HeaderValue::from_str(&format!("Basic {basic}"))
            .map_err(|_| ClientError::Http("the credential is not a valid header".into()))?;
        authorization.set_sensitive(true);
        let host = match url.ip {
            Some(std::net::IpAddr::V6(_)) => format!("[{}]", url.host),
            _ => url.host.clone(),
        };
        let host_header = HeaderValue::from_str(&if url.port == 443 {
            host
        } else {
            format!("{host}:{}", url.port)
        })
        .map_err(|_| ClientError::Http("the host is not a valid header".into()))?;
        Ok(Self {
            url,
            guard,
            tls,
            server_name,
            authorization,
            host_header,
            timeout,
            idle: parking_lot::Mutex::new(Vec::new()),
        })
    }

    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    /// `method` on `path` (below the remote's base URL, no leading `/`), with a JSON body.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        json: Option<Bytes>,
    ) -> Result<Reply, ClientError> {
        tokio::time::timeout(
            self.timeout,
            self.exchange(method, path, json, None, false, true),
        )
        .await
        .map_err(|_| ClientError::Timeout(self.timeout))?
    }

    /// A POST of a zstd-compressed JSON body, with `Narad-Topic-Id: <topic_id>` (the target
    /// refuses it unless its topic is that incarnation) and `Narad-Link: <link>` (the link's
    /// source and epoch: the target refuses it unless it mirrors that source at that epoch).
    pub async fn post_zstd(
        &self,
        path: &str,
        body: Bytes,
        topic_id: u64,
        link: &str,
    ) -> Result<Reply, ClientError> {
        self.post_link(path, body, topic_id, link, true).await
    }

    /// [`RemoteClient::post_zstd`] of a JSON body sent as it is: for the link's small
    /// messages.
    pub async fn post_link_json(
        &self,
        path: &str,
        json: Bytes,
        topic_id: u64,
        link: &str,
    ) -> Result<Reply, ClientError> {
        self.post_link(path, json, topic_id, link, false).await
    }

    async fn post_link(
        &self,
        path: &str,
        body: Bytes,
        topic_id: u64,
        link: &str,
        zstd: bool,
    ) -> Result<Reply, ClientError> {
        tokio::time::timeout(
            self.timeout,
            self.exchange(
                Method::POST,
                path,
                Some(body),
                Some((topic_id, link)),
                zstd,
                true,
            ),
        )
        .await
        .map_err(|_| ClientError::Timeout(self.timeout))?
    }

    /// [`RemoteClient::request`] without the credential: for checking that the remote asks
    /// for one.
    pub async fn request_anonymous(
        &self,
        method: Method,
        path: &str,
    ) -> Result<Reply, ClientError> {
        tokio::time::timeout(
            self.timeout,
            self.exchange(method, path, None, None, false, false),
        )
        .await
        .map_err(|_| ClientError::Timeout(self.timeout))?
    }

    /// A connection to the remote: a pooled idle one, else a new one (resolved and vetted
    /// now, TLS checked). `Ok((sender, driver, reused))`.
    async fn connection(&self) -> Result<(Sender, tokio::task::JoinHandle<()>, bool), ClientError> {
        loop {
            let idle = self.idle.lock().pop();
            match idle {
                Some(c) if c.since.elapsed() < IDLE_KEEP && !c.sender.is_closed() => {
                    return Ok((c.sender, c.driver, true));
                }
                // (dropping the sender ends the connection's task)
                Some(_) => {}
                None => break,
            }
        }
        let addrs = guard::resolve(&self.url, &self.guard).await?;
        let mut last = String::from("no address");
        let mut tcp = None;
        for a in addrs {
            match tokio::net::TcpStream::connect(a).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        let tcp = tcp.ok_or(ClientError::Connect(last))?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| ClientError::Tls(e.to_string()))?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok((send, driver, false))
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        json: Option<Bytes>,
        link: Option<(u64, &str)>,
        zstd: bool,
        authenticated: bool,
    ) -> Result<Reply, ClientError> {
        let base = self.url.canonical.find("://").map_or("/", |i| {
            let rest = &self.url.canonical[i + 3..];
            rest.find('/').map_or("/", |j| &rest[j..])
        });
        let uri = format!("{base}{}", path.trim_start_matches('/'));
        let build = || {
            let mut req = Request::builder()
                .method(method.clone())
                .uri(&uri)
                .header(HOST, self.host_header.clone())
                .header(USER_AGENT, "narad-xregion");
            if authenticated {
                req = req.header(AUTHORIZATION, self.authorization.clone());
            }
            if json.is_some() {
                req = req.header(CONTENT_TYPE, "application/json");
            }
            if zstd {
                req = req.header(hyper::header::CONTENT_ENCODING, "zstd");
            }
            if let Some((id, link)) = link {
                req = req
                    .header("narad-topic-id", format!("{id:016x}"))
                    .header("narad-link", link);
            }
            req.body(Full::new(json.clone().unwrap_or_default()))
                .map_err(|e| ClientError::Http(e.to_string()))
        };
        let (mut send, mut driver, mut reused) = self.connection().await?;
        let resp = loop {
            let sent = match send.ready().await {
                Ok(()) => send.send_request(build()?).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(r) => break r,
                // a pooled connection the remote closed meanwhile: once more on a new one
                Err(_) if reused => {
                    driver.abort();
                    // (another pooled one may be stale too: at most MAX_IDLE of them)
                    (send, driver, reused) = self.connection().await?;
                }
                Err(e) => {
                    driver.abort();
                    return Err(ClientError::Http(e.to_string()));
                }
            }
        };
        let status = resp.status();
        let headers = resp.headers().clone();
        if status.is_redirection() {
            driver.abort();
            return Err(ClientError::Redirect(status.as_u16()));
        }
        let body = match Limited::new(resp.into_body(), MAX_REPLY_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                driver.abort();
                return Err(
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        ClientError::TooLarge
                    } else {
                        ClientError::Http(e.to_string())
                    },
                );
            }
        };
        // whole answer read: the connection may serve the next request
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE && !send.is_closed() {
            idle.push(Idle {
                sender: send,
                driver,
                since: std::time::Instant::now(),
            });
        } else {
            driver.abort();
        }
        Ok(Reply {
            status,
            headers,
            body,
        })
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A kept-alive connection waiting for the next request (dropping `sender` closes it).
struct Idle {
    sender: Sender,
    driver: tokio::task::JoinHandle<()>,
    since: std::time::Instant,
}

/// Most idle connections kept per remote (lanes of every cursor share them), and how long.
const MAX_IDLE: usize = 16;
const IDLE_KEEP: Duration = Duration::from_secs(20);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hyper::Response;
    use hyper::service::service_fn;
    use rustls::pki_types::PrivateKeyDer;

    /// A CA, and a server certificate for `localhost` and 127.0.0.1 it signed: (ca, cert, key).
    fn certs() -> (String, String, String) {
        certs_for(&["localhost", "127.0.0.1"])
    }

    /// A CA, and a server certificate for `names` it signed: (ca, cert, key).
    fn certs_for(names: &[&str]) -> (String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let leaf = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (ca.pem(), leaf.pem(), key.serialize_pem())
    }

    /// An HTTPS server on 127.0.0.1: `/ok` echoes the Authorization header, `/redirect`
    /// answers 302, `/big` 2 MiB, `/slow` never answers. Returns its port and a count of the
    /// connections it accepted.
    async fn server(cert: &str, key: &str) -> (u16, Arc<AtomicUsize>) {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let resp = match req.uri().path() {
                            "/ok" => {
                                let auth = req
                                    .headers()
                                    .get(AUTHORIZATION)
                                    .map(|v| v.as_bytes().to_vec())
                                    .unwrap_or_default();
                                Response::new(Full::new(Bytes::from(auth)))
                            }
                            "/redirect" => Response::builder()
                                .status(302)
                                .header("location", "https://169.254.169.254/")
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                            "/big" => Response::new(Full::new(Bytes::from(vec![b'x'; 2 << 20]))),
                            _ => std::future::pending().await,
                        };
                        Ok::<_, std::convert::Infallible>(resp)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        (port, accepted)
    }

    fn loopback(port: u16) -> GuardConfig {
        GuardConfig {
            allowed_ports: vec![port],
            allow_addresses: vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
            ..GuardConfig::default()
        }
    }

    fn client(url: &str, ca: Option<&str>, guard: GuardConfig) -> RemoteClient {
        let url = RemoteUrl::parse(url, &guard).unwrap();
        RemoteClient::new(
            url,
            "mirror",
            "s3cret",
            ca,
            guard,
            Duration::from_millis(2000),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_remote_trusted_by_its_ca_answers_with_the_credential_sent() {
        let (ca, cert, key) = certs();
        let (port, _) = server(&cert, &key).await;
        for host in ["localhost", "127.0.0.1"] {
            let c = client(
                &format!("https://{host}:{port}/"),
                Some(&ca),
                loopback(port),
            );
            let r = c.request(Method::GET, "ok", None).await.unwrap();
            assert_eq!(r.status, StatusCode::OK);
            let want = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("mirror:s3cret")
            );
            assert_eq!(r.body, Bytes::from(want));
        }
    }

    #[tokio::test]
    async fn a_refused_address_is_never_connected_to() {
        let (ca, cert, key) = certs();
        let (port, accepted) = server(&cert, &key).await;
        let guard = GuardConfig {
            allowed_ports: vec![port],
            ..GuardConfig::default()
        };
        // a name that resolves to loopback, with loopback not allowed
        let c = client(&format!("https://localhost:{port}/"), Some(&ca), guard);
        let e = c.request(Method::GET, "ok", None).await.unwrap_err();
        assert!(
            matches!(e, ClientError::Guard(GuardError::Address { .. })),
            "{e}"
        );
        assert_eq!(e.state(), "destination_refused");
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn tls_is_verified_against_the_ca_and_the_name() {
        let (_, cert, key) = certs();
        let (other_ca, _, _) = certs();
        let (port, _) = server(&cert, &key).await;
        // another CA
        let c = client(
            &format!("https://localhost:{port}/"),
            Some(&other_ca),
            loopback(port),
        );
        let e = c.request(Method::GET, "ok", None).await.unwrap_err();
        assert_eq!(e.state(), "tls_failed", "{e}");
        // the system roots do not know a test CA
        let c = client(&format!("https://localhost:{port}/"), None, loopback(port));
        assert_eq!(
            c.request(Method::GET, "ok", None)
                .await
                .unwrap_err()
                .state(),
            "tls_failed"
        );
        // an address the certificate does not name (it names localhost only)
        let (ca, cert, key) = certs_for(&["localhost"]);
        let (port, _) = server(&cert, &key).await;
        let c = client(
            &format!("https://127.0.0.1:{port}/"),
            Some(&ca),
            loopback(port),
        );
        let e = c.request(Method::GET, "ok", None).await.unwrap_err();
        assert_eq!(e.state(), "tls_failed", "{e}");
        let c = client(
            &format!("https://localhost:{port}/"),
            Some(&ca),
            loopback(port),
        );
        assert_eq!(
            c.request(Method::GET, "ok", None).await.unwrap().status,
            200
        );
        // a CA bundle that is not one
        let url = RemoteUrl::parse(&format!("https://localhost:{port}/"), &loopback(port)).unwrap();
        assert!(matches!(
            RemoteClient::new(
                url,
                "u",
                "p",
                Some("not pem"),
                loopback(port),
                Duration::from_secs(1)
            ),
            Err(ClientError::Ca(_))
        ));
    }

    #[tokio::test]
    async fn redirects_large_replies_and_silence_are_bounded_answers() {
        let (ca, cert, key) = certs();
        let (port, _) = server(&cert, &key).await;
        let c = client(
            &format!("https://localhost:{port}/"),
            Some(&ca),
            loopback(port),
        );
        let e = c.request(Method::GET, "redirect", None).await.unwrap_err();
        assert!(matches!(e, ClientError::Redirect(302)), "{e}");
        assert_eq!(e.state(), "redirect_refused");
        let e = c.request(Method::GET, "big", None).await.unwrap_err();
        assert!(matches!(e, ClientError::TooLarge), "{e}");
        let e = c
            .request(Method::POST, "slow", Some(Bytes::from_static(b"{}")))
            .await
            .unwrap_err();
        assert!(matches!(e, ClientError::Timeout(_)), "{e}");
        assert_eq!(e.state(), "unavailable");
    }
}
