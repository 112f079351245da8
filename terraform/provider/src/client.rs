//! The broker's HTTP API as the provider uses it: JSON bodies, HTTP Basic, and every error
//! a JSON body with `code` and `error` (docs/api.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value as Json;

/// How long a call keeps retrying answers that say "retry" (`503` with `Retry-After`:
/// `not_ready`, `server_busy`...; `429 login_throttled`).
const RETRY_BUDGET: Duration = Duration::from_secs(30);
/// One request, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A failed call: the broker's answer (`status`, `code`, `error`) or a transport failure.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl ApiError {
    fn transport(message: String) -> Self {
        ApiError {
            status: 0,
            code: "transport".into(),
            message,
        }
    }
    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.status == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{} {}: {}", self.status, self.code, self.message)
        }
    }
}

pub struct Api {
    http: reqwest::Client,
    base: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Where and how to reach the broker, after the provider block and the environment.
pub struct Settings {
    pub endpoint: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub ca_file: Option<String>,
}

impl Api {
    pub fn new(s: Settings) -> Result<Arc<Api>, String> {
        let endpoint = s.endpoint.trim_end_matches('/').to_string();
        let lower = endpoint.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Err(format!(
                "endpoint '{endpoint}' must start with http:// or https://"
            ));
        }
        // TLS: rustls with ring (the provider's own stack), verifying the broker's
        // certificate against the system roots plus `ca_file`.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            let _ = roots.add(cert);
        }
        if let Some(path) = &s.ca_file {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("ca_file '{path}': {e}"))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("ca_file '{path}': {e}"))?;
            if certs.is_empty() {
                return Err(format!("ca_file '{path}' holds no PEM certificate"));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("ca_file '{path}': {e}"))?;
            }
        }
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!(
                "terraform-provider-narad/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Arc::new(Api {
            http,
            base: endpoint,
            username: s.username,
            password: s.password,
        }))
    }

    /// One call; `Ok(None)` for a `204`. Retries `503` and `429` (honouring `Retry-After`)
    /// within [`RETRY_BUDGET`]; any other error is returned at once.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Json>,
    ) -> Result<Option<Json>, ApiError> {
        let url = format!("{}{}", self.base, path);
        let deadline = Instant::now() + RETRY_BUDGET;
        loop {
            let mut req = self.http.request(method.clone(), &url);
            if let Some(user) = &self.username {
                req = req.basic_auth(user, self.password.as_deref());
            }
            if let Some(body) = body {
                req = req.json(body);
            }
            let resp = req.send().await.map_err(|e| {
                let mut msg = format!("{} {url}: {e}", method);
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(&format!(": {s}"));
                    src = s.source();
                }
                ApiError::transport(msg)
            })?;
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let bytes = resp
                .bytes()
                .await
                .map_err(|e| ApiError::transport(format!("{method} {url}: reading: {e}")))?;
            if status == StatusCode::NO_CONTENT {
                return Ok(None);
            }
            if status.is_success() {
                if bytes.is_empty() {
                    return Ok(None);
                }
                return serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                    ApiError::transport(format!("{method} {url}: answer is not JSON: {e}"))
                });
            }
            let parsed: Option<Json> = serde_json::from_slice(&bytes).ok();
            let err = ApiError {
                status: status.as_u16(),
                code: parsed
                    .as_ref()
                    .and_then(|j| j.get("code"))
                    .and_then(|c| c.as_str())
                    .unwrap_or("unknown")
                    .to_string(),
                message: parsed
                    .as_ref()
                    .and_then(|j| j.get("error"))
                    .and_then(|c| c.as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned()),
            };
            let retryable = status == StatusCode::SERVICE_UNAVAILABLE
                || status == StatusCode::TOO_MANY_REQUESTS;
            if retryable {
                let wait = Duration::from_secs(retry_after.unwrap_or(1).clamp(1, 10));
                if Instant::now() + wait < deadline {
                    // real time is right here: the broker asked for this wait (`Retry-After`)
                    #[allow(clippy::disallowed_methods)]
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
            return Err(err);
        }
    }

    pub async fn get(&self, path: &str) -> Result<Json, ApiError> {
        self.call(Method::GET, path, None)
            .await
            .map(|j| j.unwrap_or(Json::Null))
    }
}
