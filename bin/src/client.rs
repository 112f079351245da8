//! A small HTTP client for the v1 API, used by the CLI. Bodies sent and fields read are the
//! `narad-wire` types; a reply is kept as the server's bytes so that commands which print it
//! print what the server said.

use std::time::Duration;

use narad_wire::{ErrorBody, ErrorCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A non-2xx answer.
#[derive(Debug)]
pub struct ApiFailure {
    pub status: u16,
    /// The body's `code`: as sent, also when this build does not know it; `None` when the
    /// body was not an error body (a proxy's page, hyper's empty `431`).
    pub code: Option<String>,
    pub message: String,
}

impl ApiFailure {
    /// The code, when it is one of the table's.
    pub fn known_code(&self) -> Option<ErrorCode> {
        self.code.as_deref().and_then(ErrorCode::from_code)
    }

    fn from_body(status: u16, body: &[u8]) -> Self {
        match serde_json::from_slice::<ErrorBody>(body) {
            Ok(b) => Self {
                status,
                code: Some(b.code),
                message: b.error,
            },
            Err(_) => {
                let text = String::from_utf8_lossy(body).trim().to_owned();
                Self {
                    status,
                    code: None,
                    message: if text.is_empty() {
                        "the broker answered without an error body".into()
                    } else {
                        text
                    },
                }
            }
        }
    }
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.code {
            Some(code) => write!(f, "{} ({code}, HTTP {})", self.message, self.status),
            None => write!(f, "{} (HTTP {})", self.message, self.status),
        }
    }
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl std::error::Error for ApiFailure {}

/// A JSON reply, as the server's bytes.
pub struct Json(Vec<u8>);

impl Json {
    /// The reply as a wire type.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, BoxError> {
        serde_json::from_slice(&self.0)
            .map_err(|e| format!("unexpected reply from the broker: {e}").into())
    }

    /// Pretty-printed on stdout.
    pub fn print_pretty(&self) -> Result<(), BoxError> {
        let v: Value = self.parse()?;
        outln!("{}", serde_json::to_string_pretty(&v)?);
        Ok(())
    }

    /// On one line of stdout.
    pub fn print_line(&self) -> Result<(), BoxError> {
        let v: Value = self.parse()?;
        outln!("{v}");
        Ok(())
    }
}

#[derive(Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    /// HTTP Basic credentials, sent with every request when set.
    creds: Option<(String, String)>,
}

/// How the CLI reaches the broker: address, credentials, extra CA.
/// The broker's port when nothing names one.
pub const DEFAULT_PORT: u16 = 7942;

pub struct Connect<'a> {
    pub server: &'a str,
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
    pub ca_cert: Option<&'a std::path::Path>,
}

pub enum Reply {
    Json(Json),
    Empty,
}

impl Client {
    pub fn new(c: &Connect<'_>) -> Result<Self, BoxError> {
        let base = c.server.trim_end_matches('/').to_owned();
        // a bare IPv6 address takes brackets in a URL
        let base = match base.parse::<std::net::Ipv6Addr>() {
            Ok(_) => format!("[{base}]"),
            Err(_) => base,
        };
        let scheme_like = base.split_once(':').is_some_and(|(s, rest)| {
            matches!(s, "http" | "https") && !rest.starts_with(|c: char| c.is_ascii_digit())
        });
        let base = if base.starts_with("http://") || base.starts_with("https://") {
            base
        } else if let Some((scheme, _)) = base.split_once("://") {
            return Err(format!(
                "--server {base}: the scheme must be http:// or https://, not {scheme}://"
            )
            .into());
        } else if scheme_like {
            // `https:/host`, `http:`: a scheme mistyped, not a host named `https`
            return Err(format!(
                "--server {}: not an address (http://HOST[:PORT] or https://HOST[:PORT])",
                c.server
            )
            .into());
        } else {
            // a bare host is the broker's own port unless it names one (`http://` alone
            // would mean port 80)
            let mut url = reqwest::Url::parse(&format!("http://{base}"))
                .map_err(|e| format!("--server {base}: {e}"))?;
            if url.port().is_none() {
                let _ = url.set_port(Some(DEFAULT_PORT));
            }
            url.as_str().trim_end_matches('/').to_owned()
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

    /// What a request that got no answer says: a refused connection is the common case (no
    /// broker started yet), said plainly; anything else names its cause.
    fn unreachable(&self, e: &reqwest::Error) -> String {
        if e.is_connect() {
            let mut cause: Option<&dyn std::error::Error> = Some(e);
            let mut refused = false;
            while let Some(c) = cause {
                if c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
                {
                    refused = true;
                }
                cause = c.source();
            }
            if refused {
                return format!(
                    "no broker at {}: is it running? (`narad server start --dev` starts one; --server or NARAD_ADDR names another)",
                    self.base
                );
            }
        }
        if e.is_timeout() {
            return format!("the broker at {} did not answer in time", self.base);
        }
        // TLS spoken to a plain HTTP listener: its first bytes are not a TLS record
        let mut cause: Option<&dyn std::error::Error> = Some(e);
        while let Some(c) = cause {
            let text = c.to_string();
            if self.base.starts_with("https://")
                && (text.contains("InvalidContentType") || text.contains("corrupt message"))
            {
                return format!(
                    "the broker at {} does not speak TLS there: use http://{}",
                    self.base,
                    self.base.trim_start_matches("https://")
                );
            }
            cause = c.source();
        }
        let mut msg = format!("cannot reach the broker at {}: {e}", self.base);
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            msg.push_str(&format!(": {c}"));
            cause = c.source();
        }
        msg
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Result<Reply, BoxError> {
        let req = match &self.creds {
            Some((u, p)) => req.basic_auth(u, Some(p)),
            None => req,
        };
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await?;
        if status >= 400 {
            if status == 401 && self.creds.is_none() {
                return Err(Box::new(ApiFailure {
                    status,
                    code: Some(ErrorCode::Unauthorized.as_str().to_owned()),
                    message: "the broker needs credentials: set --user/--password or NARAD_USER/NARAD_PASSWORD".into(),
                }));
            }
            return Err(Box::new(ApiFailure::from_body(status, &bytes)));
        }
        if bytes.is_empty() {
            return Ok(Reply::Empty);
        }
        Ok(Reply::Json(Json(bytes.to_vec())))
    }

    pub async fn get(&self, path: &str) -> Result<Reply, BoxError> {
        self.send(self.http.get(self.url(path))).await
    }

    pub async fn post_json(&self, path: &str, body: &impl Serialize) -> Result<Reply, BoxError> {
        self.send(self.http.post(self.url(path)).json(body)).await
    }

    pub async fn patch_json(&self, path: &str, body: &impl Serialize) -> Result<Reply, BoxError> {
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

    pub async fn put_json(&self, path: &str, body: &impl Serialize) -> Result<Reply, BoxError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_becomes_a_message_naming_its_code() {
        let f = ApiFailure::from_body(
            404,
            br#"{"error": "topic 'x' not found", "code": "topic_not_found"}"#,
        );
        assert_eq!(f.known_code(), Some(ErrorCode::TopicNotFound));
        assert_eq!(
            f.to_string(),
            "topic 'x' not found (topic_not_found, HTTP 404)"
        );
        // a code newer than this build is shown as it came
        let f = ApiFailure::from_body(409, br#"{"error": "later", "code": "from_the_future"}"#);
        assert_eq!(f.known_code(), None);
        assert_eq!(f.to_string(), "later (from_the_future, HTTP 409)");
        // not an error body: the text, and no code
        let f = ApiFailure::from_body(502, b"<html>bad gateway</html>");
        assert_eq!(f.to_string(), "<html>bad gateway</html> (HTTP 502)");
        let f = ApiFailure::from_body(431, b"");
        assert_eq!(
            f.to_string(),
            "the broker answered without an error body (HTTP 431)"
        );
    }

    #[test]
    fn a_bare_host_is_the_brokers_port() {
        let base = |server: &str| {
            Client::new(&Connect {
                server,
                user: None,
                password: None,
                ca_cert: None,
            })
            .map(|c| c.base)
            .map_err(|e| e.to_string())
        };
        assert_eq!(base("127.0.0.1").unwrap(), "http://127.0.0.1:7942");
        assert_eq!(
            base("broker.example:8080/").unwrap(),
            "http://broker.example:8080"
        );
        assert_eq!(base("[::1]").unwrap(), "http://[::1]:7942");
        assert_eq!(base("host/prefix").unwrap(), "http://host:7942/prefix");
        // a scheme given means its own default port
        assert_eq!(
            base("http://broker.example").unwrap(),
            "http://broker.example"
        );
        assert!(base("ftp://broker.example").is_err());
        // a scheme mistyped or alone is no host named `https`
        for bad in [
            "https:/127.0.0.1:7942",
            "http:",
            "https://",
            "http://",
            "https:127.0.0.1",
        ] {
            assert!(base(bad).is_err(), "{bad}");
        }
        assert_eq!(base("::1").unwrap(), "http://[::1]:7942");
        assert_eq!(base("localhost:8080").unwrap(), "http://localhost:8080");
    }
}
