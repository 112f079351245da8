//! Starts the real `narad` binary on 127.0.0.1 with an ephemeral port and a temp data dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use reqwest::StatusCode;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_narad");

/// The pause between two looks of a poll with a deadline.
const POLL_PAUSE: Duration = Duration::from_millis(20);

/// Pauses between two looks of a poll with a deadline. These tests drive a real `narad`
/// process, which runs on the system clock, so waiting for it takes real time: this is the one
/// raw sleep they make besides chaos timings (clippy.toml bans the others), short and fixed, and every caller loops
/// on a condition under a deadline. Waiting for time itself to pass is not what it is for.
pub async fn poll_pause() {
    #[allow(clippy::disallowed_methods)]
    tokio::time::sleep(POLL_PAUSE).await;
}

/// The value of one sample (`name` with its labels) in the Prometheus text.
pub fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
}

/// The wall clock as the server reads it (both run on the same host), for comparing with
/// the timestamps it returns.
pub fn wall_clock_ms() -> i64 {
    use narad_core::clock::Clock as _;
    narad_core::clock::SystemClock.now_ms()
}

pub struct Server {
    pub child: Option<Child>,
    pub base: String,
    pub data_dir: PathBuf,
    env: Vec<(String, String)>,
    /// `server start` arguments before the common ones (`--dev` unless secure).
    mode: Vec<&'static str>,
    scheme: &'static str,
    /// A command the binary runs under (e.g. `prlimit --nofile=256:256 --`); empty: none.
    wrapper: Vec<String>,
    pub http: reqwest::Client,
}

impl Server {
    /// Starts a dev server with its own data directory (kept in `dir`).
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[]).await
    }

    pub async fn start_with(dir: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_opts(dir, true, env, None).await
    }

    /// Starts a production-mode server (security on; `NARAD_ADMIN_PASSWORD` in `env` seeds
    /// the root user). With `tls_ca`, the server is expected to speak HTTPS with a certificate
    /// signed by that PEM CA (its files are given through `env`).
    pub async fn start_opts(
        dir: &Path,
        dev: bool,
        env: &[(&str, &str)],
        tls_ca: Option<&[u8]>,
    ) -> Self {
        Self::start_wrapped(dir, dev, env, tls_ca, &[]).await
    }

    /// [`Server::start_opts`], the binary run under `wrapper` (a command and its arguments,
    /// the binary's path appended).
    pub async fn start_wrapped(
        dir: &Path,
        dev: bool,
        env: &[(&str, &str)],
        tls_ca: Option<&[u8]>,
        wrapper: &[&str],
    ) -> Self {
        let mut http = reqwest::Client::builder().timeout(Duration::from_secs(60));
        if let Some(pem) = tls_ca {
            http = http.add_root_certificate(reqwest::Certificate::from_pem(pem).unwrap());
        }
        let mut s = Self {
            child: None,
            base: String::new(),
            data_dir: dir.join("data"),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            mode: if dev { vec!["--dev"] } else { vec![] },
            scheme: if tls_ca.is_some() { "https" } else { "http" },
            wrapper: wrapper.iter().map(|w| w.to_string()).collect(),
            http: http.build().unwrap(),
        };
        s.launch().await;
        s
    }

    async fn launch(&mut self) {
        let addr_file = self.data_dir.with_extension("addr");
        let _ = std::fs::remove_file(&addr_file);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.with_extension("log"))
            .unwrap();
        let mut cmd = match self.wrapper.split_first() {
            None => Command::new(BIN),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
        };
        cmd.args(["server", "start"])
            .args(&self.mode)
            .args(["--port", "0", "--data-dir"])
            .arg(&self.data_dir)
            .arg("--addr-file")
            .arg(&addr_file)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("start narad"));
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            if let Ok(a) = std::fs::read_to_string(&addr_file) {
                break a;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("narad exited early ({status}); log:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "narad did not bind in time");
            poll_pause().await;
        };
        self.base = format!("{}://{addr}", self.scheme);
        loop {
            if let Ok(r) = self.http.get(self.url("/readyz")).send().await
                && r.status() == StatusCode::OK
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "narad not ready in time; log:\n{}",
                self.log()
            );
            poll_pause().await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// kill -9, no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    assert!(st.success(), "narad exited with {st}; log:\n{}", self.log());
                    // a stopped broker leaves no address for a script to find
                    let addr_file = self.data_dir.with_extension("addr");
                    assert!(
                        !addr_file.exists(),
                        "a stopped broker left its --addr-file behind"
                    );
                    break;
                }
                assert!(Instant::now() < deadline, "narad did not stop on SIGTERM");
                poll_pause().await;
            }
        }
    }

    pub async fn restart(&mut self) {
        self.launch().await;
    }

    /// Sets (or with `None` removes) an environment variable for the next start.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_owned(), v.to_owned()));
        }
    }

    pub async fn create_topic(&self, body: Value) -> Value {
        let r = self
            .http
            .post(self.url("/v1/topics"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
        r.json().await.unwrap()
    }

    pub async fn produce(
        &self,
        topic: &str,
        query: &str,
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        self.http
            .post(self.url(&format!("/v1/topics/{topic}/produce{query}")))
            .body(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.unwrap()
    }

    pub async fn post(&self, path: &str) -> reqwest::Response {
        self.http.post(self.url(path)).send().await.unwrap()
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// One queue consume; `None` on 204.
    pub async fn consume(&self, topic: &str, query: &str) -> Option<Value> {
        let r = self
            .get(&format!("/v1/topics/{topic}/consume{query}"))
            .await;
        match r.status() {
            StatusCode::NO_CONTENT => None,
            StatusCode::OK => Some(r.json().await.unwrap()),
            s => panic!("consume answered {s}: {}", r.text().await.unwrap()),
        }
    }

    pub async fn ack(&self, topic: &str, handle: &str, extend: Option<&str>) -> StatusCode {
        let ext = extend.map(|e| format!("&extend={e}")).unwrap_or_default();
        self.post(&format!(
            "/v1/topics/{topic}/ack?receipt_handle={handle}{ext}"
        ))
        .await
        .status()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Asserts an error response: status and JSON `code`; the body is exactly `{error, code}`
/// with a code of the table (`narad_wire::ErrorCode`) whose status is the one answered, and
/// `Retry-After` comes with every 503 and 429.
pub async fn expect_error(r: reqwest::Response, status: StatusCode, code: &str) {
    let got = r.status();
    let retry_after = r.headers().contains_key(reqwest::header::RETRY_AFTER);
    let text = r.text().await.unwrap();
    assert_eq!(got, status, "body: {text}");
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("error body is not JSON: {text}"));
    assert_eq!(v["code"], code, "body: {text}");
    assert!(
        v["error"].as_str().is_some_and(|e| !e.is_empty()),
        "body: {text}"
    );
    assert_eq!(v.as_object().map(|o| o.len()), Some(2), "body: {text}");
    let known = narad_wire::ErrorCode::from_code(code)
        .unwrap_or_else(|| panic!("`{code}` is not in the error table"));
    assert_eq!(
        known.http_status(),
        status.as_u16(),
        "the table's status for {code}"
    );
    assert_eq!(
        retry_after,
        known.is_retryable(),
        "Retry-After on {code}: body {text}"
    );
}

/// One request as `who` (HTTP Basic), with an optional JSON body.
pub async fn call_as(
    s: &Server,
    who: (&str, &str),
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut r = s
        .http
        .request(method, s.url(path))
        .basic_auth(who.0, Some(who.1));
    if let Some(b) = body {
        r = r.json(&b);
    }
    r.send().await.unwrap()
}

/// Reads one HTTP/1.1 response from a raw connection: status, head (lowercased) and its
/// `Content-Length` body; `None` if the connection closed first.
pub async fn read_http_response(
    c: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<(u16, String, String)> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = c.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                let status = head[9..12].parse().unwrap();
                let body = text[end + 4..end + 4 + len].to_owned();
                return Some((status, head, body));
            }
        }
    }
}
