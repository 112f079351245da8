//! A small HTTP client for the v1 API, used by the CLI.

use std::time::Duration;

use serde_json::Value;

#[derive(Debug)]
pub struct ApiFailure {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}, HTTP {})", self.message, self.code, self.status)
    }
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl std::error::Error for ApiFailure {}

#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    /// HTTP Basic credentials, sent with every request when set.
    creds: Option<(String, String)>,
}

/// How the CLI reaches the broker: address, credentials, extra CA.
pub struct Connect<'a> {
    pub server: &'a str,
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
    pub ca_cert: Option<&'a std::path::Path>,
}

pub enum Reply {
    Json(Value),
    Empty,
}

impl Client {
    pub fn new(c: &Connect<'_>) -> Result<Self, BoxError> {
        let base = c.server.trim_end_matches('/').to_owned();
        let base = if base.starts_with("http://") || base.starts_with("https://") {
            base
        } else {
            format!("http://{base}")
        };
        let mut http = reqwest::Client::builder().timeout(Duration::from_secs(60));
        if let Some(path) = c.ca_cert {
            let pem = std::fs::read(path)
                .map_err(|e| format!("cannot read CA certificate {}: {e}", path.display()))?;
            http = http.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
        }
        let creds = match (c.user, c.password) {
            (Some(u), Some(p)) => Some((u.to_owned(), p.to_owned())),
            (Some(_), None) => return Err("--user needs --password (or NARAD_PASSWORD)".into()),
            (None, Some(_)) => return Err("--password needs --user (or NARAD_USER)".into()),
            (None, None) => None,
        };
        Ok(Self {
            base,
            http: http.build()?,
            creds,
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Result<Reply, BoxError> {
        let req = match &self.creds {
            Some((u, p)) => req.basic_auth(u, Some(p)),
            None => req,
        };
        let resp = req
            .send()
            .await
            .map_err(|e| format!("cannot reach the broker at {}: {e}", self.base))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        if status >= 400 {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if status == 401 && self.creds.is_none() {
                return Err(Box::new(ApiFailure {
                    status,
                    code: "unauthorized".into(),
                    message: "the broker needs credentials: set --user/--password or NARAD_USER/NARAD_PASSWORD".into(),
                }));
            }
            return Err(Box::new(ApiFailure {
                status,
                code: v["code"].as_str().unwrap_or("unknown").to_owned(),
                message: v["error"].as_str().map_or_else(
                    || String::from_utf8_lossy(&bytes).into_owned(),
                    str::to_owned,
                ),
            }));
        }
        if bytes.is_empty() {
            return Ok(Reply::Empty);
        }
        Ok(Reply::Json(serde_json::from_slice(&bytes)?))
    }

    pub async fn get(&self, path: &str) -> Result<Reply, BoxError> {
        self.send(self.http.get(self.url(path))).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Reply, BoxError> {
        self.send(self.http.post(self.url(path)).json(body)).await
    }

    pub async fn patch_json(&self, path: &str, body: &Value) -> Result<Reply, BoxError> {
        self.send(self.http.patch(self.url(path)).json(body)).await
    }

    pub async fn post_body(
        &self,
        path: &str,
        body: Vec<u8>,
        content_type: &'static str,
    ) -> Result<Reply, BoxError> {
        self.send(
            self.http
                .post(self.url(path))
                .header("content-type", content_type)
                .body(body),
        )
        .await
    }

    pub async fn put_json(&self, path: &str, body: &Value) -> Result<Reply, BoxError> {
        self.send(self.http.put(self.url(path)).json(body)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Reply, BoxError> {
        self.send(self.http.delete(self.url(path))).await
    }
}

/// Percent-encodes a query-string value.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
