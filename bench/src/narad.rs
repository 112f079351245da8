//! Narad over its HTTP API: one keep-alive HTTP/1.1 connection per worker, driven by a
//! minimal client of its own ([`crate::wire`]) so the load generator adds no pooling or retry
//! behaviour of its own, and little CPU.

use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use narad_wire::{AckBatch, AckResults, CreateTopic, ErrorBody, Messages};
pub use narad_wire::{Message, Settle};

use crate::target::{BenchError, Conn, Received, Result, Target};
use crate::wire::Wire;

/// The address and topic a run uses.
#[derive(Clone)]
pub struct Narad {
    /// `host:port`
    pub addr: String,
    pub topic: String,
    pub visibility_ms: u64,
}

/// HTTP Basic credentials from `NARAD_USER` and `NARAD_PASSWORD`, sent on every request when
/// both are set (a broker with security on).
fn credentials() -> Option<&'static hyper::header::HeaderValue> {
    static AUTH: std::sync::OnceLock<Option<hyper::header::HeaderValue>> =
        std::sync::OnceLock::new();
    AUTH.get_or_init(|| {
        use base64::Engine as _;
        let user = std::env::var("NARAD_USER").ok()?;
        let pass = std::env::var("NARAD_PASSWORD").ok()?;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        hyper::header::HeaderValue::from_str(&format!("Basic {token}")).ok()
    })
    .as_ref()
}

/// One HTTP/1.1 keep-alive connection ([`crate::wire::Wire`]: each request written and its
/// response read by the calling task, without a connection task of its own).
pub struct Http {
    addr: String,
    conn: Option<Wire>,
}

impl Http {
    pub async fn connect(addr: &str) -> Result<Self> {
        let mut h = Self {
            addr: addr.to_owned(),
            conn: None,
        };
        h.ensure().await?;
        Ok(h)
    }

    async fn ensure(&mut self) -> Result<&mut Wire> {
        // (a keep-alive connection the server closed while idle is redialled, not written to)
        if self.conn.as_ref().is_none_or(Wire::is_stale) {
            let wire = Wire::connect(&self.addr)
                .await
                .map_err(|e| BenchError::new("connect", e))?;
            self.conn = Some(wire);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Sends one request; any transport failure drops the connection so the next call redials.
    pub async fn request(
        &mut self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes)> {
        let auth = credentials().map(hyper::header::HeaderValue::as_bytes);
        self.ensure().await?;
        let wire = self.conn.as_mut().expect("connected above");
        match wire.request(&method, path, &self.addr, auth, &body).await {
            Ok(r) => {
                if r.close {
                    self.conn = None;
                }
                Ok((r.status, r.body))
            }
            Err(e) => {
                self.conn = None;
                Err(BenchError::new("io", e))
            }
        }
    }

    /// Like [`request`](Self::request) but a non-2xx is an error counted under its status.
    pub async fn expect_2xx(&mut self, method: Method, path: &str, body: Bytes) -> Result<Bytes> {
        let (status, body) = self.request(method, path, body).await?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(http_error(status, &body))
        }
    }
}

/// A non-2xx answer, counted under its status; the detail names the error code.
pub fn http_error(status: StatusCode, body: &[u8]) -> BenchError {
    match serde_json::from_slice::<ErrorBody>(body) {
        // the code is part of the cause, so a run's error counts say which 503 it was
        Ok(e) => BenchError::new(
            format!("http {} {}", status.as_u16(), e.code),
            format!("{}: {}", e.code, e.error),
        ),
        Err(_) => BenchError::new(
            format!("http {}", status.as_u16()),
            String::from_utf8_lossy(body),
        ),
    }
}

/// A JSON body for a request.
pub fn json_body(v: &impl serde::Serialize) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("request bodies serialise"))
}

/// A message's payload bytes (the bench sends UTF-8 text: a `utf8` string comes back).
fn payload_bytes(m: &Message) -> Result<Bytes> {
    m.payload_bytes()
        .map(|b| Bytes::copy_from_slice(&b))
        .map_err(|e| BenchError::new("bad response", e))
}

/// Builds a batch-produce body of UTF-8 payloads. Written by hand (the bench's payloads are
/// ASCII without quotes or backslashes) so the load generator spends little CPU per message.
pub fn batch_body(payloads: &[Bytes], delay_ms: Option<u32>) -> Bytes {
    let per: usize = payloads.iter().map(|p| p.len() + 64).sum();
    let mut out = Vec::with_capacity(16 + per);
    out.extend_from_slice(b"{\"messages\":[");
    for (i, p) in payloads.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // (a fold, not `all`: without an early exit the check is vectorised)
        let plain = p.iter().fold(true, |ok, &c| {
            ok & ((0x20..0x7f).contains(&c) & (c != b'"') & (c != b'\\'))
        });
        out.extend_from_slice(b"{\"payload_encoding\":\"utf8\",\"payload\":");
        if plain {
            out.push(b'"');
            out.extend_from_slice(p);
            out.push(b'"');
        } else {
            let s = String::from_utf8_lossy(p);
            out.extend_from_slice(serde_json::to_string(&s).expect("string").as_bytes());
        }
        if let Some(d) = delay_ms {
            out.extend_from_slice(format!(",\"delay_ms\":{d}").as_bytes());
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

/// A queue read: `max` messages, waiting up to `wait`. 204 is an empty vector.
pub async fn consume(
    http: &mut Http,
    topic: &str,
    max: usize,
    wait: Duration,
) -> Result<Vec<Message>> {
    let path = if wait.is_zero() {
        format!("/v1/topics/{topic}/consume?max={max}")
    } else {
        format!(
            "/v1/topics/{topic}/consume?max={max}&wait={}ms",
            wait.as_millis()
        )
    };
    let (status, body) = http.request(Method::GET, &path, Bytes::new()).await?;
    match status {
        StatusCode::NO_CONTENT => Ok(Vec::new()),
        StatusCode::OK => serde_json::from_slice::<Messages>(&body)
            .map(|m| m.messages)
            .map_err(|e| BenchError::new("bad response", e)),
        s => Err(http_error(s, &body)),
    }
}

/// Per-handle outcome of a batch ack, extend or nack: the HTTP status of each item.
pub async fn ack(
    http: &mut Http,
    topic: &str,
    handles: &[String],
    settle: Settle,
) -> Result<Vec<u16>> {
    let body = json_body(&AckBatch {
        receipt_handles: handles.to_vec(),
        extend: Some(settle),
    });
    let res = http
        .expect_2xx(Method::POST, &format!("/v1/topics/{topic}/ack"), body)
        .await?;
    let r: AckResults =
        serde_json::from_slice(&res).map_err(|e| BenchError::new("bad response", e))?;
    Ok(r.results.into_iter().map(|i| i.status).collect())
}

impl Target for Narad {
    type Conn = NaradConn;

    fn name(&self) -> &'static str {
        "narad"
    }

    async fn prepare(&self, partitions: u32) -> Result<()> {
        let mut http = Http::connect(&self.addr).await?;
        let path = format!("/v1/topics/{}", self.topic);
        let (status, body) = http.request(Method::DELETE, &path, Bytes::new()).await?;
        if !status.is_success() && status != StatusCode::NOT_FOUND {
            return Err(http_error(status, &body));
        }
        let mut create = CreateTopic::new(&self.topic);
        create.settings.partitions = Some(partitions);
        create.settings.visibility_timeout_ms = i64::try_from(self.visibility_ms).ok();
        create.settings.max_in_flight_per_partition = Some(1_000_000);
        http.expect_2xx(Method::POST, "/v1/topics", json_body(&create))
            .await?;
        Ok(())
    }

    async fn connect(&self, _worker: usize) -> Result<NaradConn> {
        Ok(NaradConn {
            http: Http::connect(&self.addr).await?,
            produce_path: format!("/v1/topics/{}/produce", self.topic),
            batch_path: format!("/v1/topics/{}/produce/batch", self.topic),
            topic: self.topic.clone(),
        })
    }

    fn notes(&self) -> Vec<String> {
        vec![
            "HTTP/1.1 keep-alive, one connection per worker; 202 only after fdatasync (group commit)"
                .into(),
        ]
    }
}

pub struct NaradConn {
    http: Http,
    produce_path: String,
    batch_path: String,
    topic: String,
}

impl Conn for NaradConn {
    type Token = String;

    async fn produce(&mut self, payloads: &[Bytes]) -> Result<()> {
        if let [one] = payloads {
            self.http
                .expect_2xx(Method::POST, &self.produce_path, one.clone())
                .await?;
        } else {
            self.http
                .expect_2xx(Method::POST, &self.batch_path, batch_body(payloads, None))
                .await?;
        }
        Ok(())
    }

    async fn consume(&mut self, max: usize, wait: Duration) -> Result<Vec<Received<String>>> {
        let path = if wait.is_zero() {
            format!("/v1/topics/{}/consume?max={max}", self.topic)
        } else {
            format!(
                "/v1/topics/{}/consume?max={max}&wait={}ms",
                self.topic,
                wait.as_millis()
            )
        };
        let (status, body) = self.http.request(Method::GET, &path, Bytes::new()).await?;
        match status {
            StatusCode::NO_CONTENT => Ok(Vec::new()),
            StatusCode::OK => received(&body),
            s => Err(http_error(s, &body)),
        }
    }

    async fn ack(&mut self, tokens: Vec<String>) -> Result<()> {
        if let [one] = tokens.as_slice() {
            let path = format!("/v1/topics/{}/ack?receipt_handle={one}", self.topic);
            self.http
                .expect_2xx(Method::POST, &path, Bytes::new())
                .await?;
            return Ok(());
        }
        let path = format!("/v1/topics/{}/ack", self.topic);
        let res = self
            .http
            .expect_2xx(Method::POST, &path, ack_body(&tokens))
            .await?;
        let statuses: Statuses =
            serde_json::from_slice(&res).map_err(|e| BenchError::new("bad response", e))?;
        match statuses.results.iter().find(|r| r.status != 204) {
            None if statuses.results.len() == tokens.len() => Ok(()),
            None => Err(BenchError::new(
                "bad response",
                format!(
                    "{} ack results for {} handles",
                    statuses.results.len(),
                    tokens.len()
                ),
            )),
            Some(r) => Err(BenchError::new(
                format!("ack item {}", r.status),
                "batch ack item failed",
            )),
        }
    }
}

/// The fields of a queue read the load generator uses, borrowed from the body: the full
/// [`Message`] (every field owned, the payload scanned twice) cost the load generator more CPU
/// per message than the broker spent serving it. A body this does not read (a payload that
/// is not a JSON string) takes the full parse.
#[derive(serde::Deserialize)]
struct Lean<'a> {
    #[serde(borrow)]
    messages: Vec<LeanMessage<'a>>,
}

#[derive(serde::Deserialize)]
struct LeanMessage<'a> {
    #[serde(borrow)]
    payload: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    payload_encoding: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    receipt_handle: Option<std::borrow::Cow<'a, str>>,
}

/// A queue read's messages: payloads sliced from `body` where the text needs no unescaping.
fn received(body: &Bytes) -> Result<Vec<Received<String>>> {
    let lean = std::str::from_utf8(body)
        .ok()
        .and_then(|text| serde_json::from_str::<Lean>(text).ok())
        .filter(|l| l.messages.iter().all(|m| m.payload_encoding == "utf8"));
    let Some(lean) = lean else {
        let msgs = serde_json::from_slice::<Messages>(body)
            .map_err(|e| BenchError::new("bad response", e))?
            .messages;
        return msgs
            .into_iter()
            .map(|m| {
                Ok(Received {
                    payload: payload_bytes(&m)?,
                    token: m.receipt_handle.unwrap_or_default(),
                })
            })
            .collect();
    };
    Ok(lean
        .messages
        .into_iter()
        .map(|m| Received {
            payload: match m.payload {
                std::borrow::Cow::Borrowed(p) => body.slice_ref(p.as_bytes()),
                std::borrow::Cow::Owned(p) => Bytes::from(p),
            },
            token: m.receipt_handle.map(|h| h.into_owned()).unwrap_or_default(),
        })
        .collect())
}

/// A batch ack body, written by hand (receipt handles are URL-safe text; any other string is
/// escaped by serde).
fn ack_body(handles: &[String]) -> Bytes {
    let mut out = Vec::with_capacity(24 + handles.iter().map(|h| h.len() + 3).sum::<usize>());
    out.extend_from_slice(b"{\"receipt_handles\":[");
    for (i, h) in handles.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if h.bytes()
            .all(|c| (0x20..0x7f).contains(&c) && c != b'"' && c != b'\\')
        {
            out.push(b'"');
            out.extend_from_slice(h.as_bytes());
            out.push(b'"');
        } else {
            out.extend_from_slice(serde_json::to_string(h).expect("string").as_bytes());
        }
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

/// A batch ack's statuses, the rest of each result unread.
#[derive(serde::Deserialize)]
struct Statuses {
    results: Vec<Status>,
}

#[derive(serde::Deserialize)]
struct Status {
    status: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lean_queue_read_and_ack_body_say_what_the_wire_types_say() {
        let body = Bytes::from_static(
            br#"{"messages":[
              {"topic":"t","partition":0,"offset":7,"payload":"plain","payload_encoding":"utf8",
               "timestamp_ms":1,"delivery_count":1,"receipt_handle":"h-1_A"},
              {"topic":"t","partition":1,"offset":8,"payload":"q\"uote\u00e9","payload_encoding":"utf8",
               "timestamp_ms":1,"headers":{"a":"b"},"receipt_handle":"h2"}]}"#,
        );
        let got = received(&body).unwrap();
        assert_eq!(got[0].payload, Bytes::from_static(b"plain"));
        assert_eq!(got[0].token, "h-1_A");
        assert_eq!(got[1].payload, Bytes::from("q\"uote\u{e9}"));
        assert_eq!(got[1].token, "h2");
        // a payload that is not a string takes the full parse
        let json = Bytes::from_static(
            br#"{"messages":[{"topic":"t","partition":0,"offset":0,"payload":{"a":[1]},"payload_encoding":"json","timestamp_ms":1,"receipt_handle":"h"}]}"#,
        );
        assert_eq!(
            received(&json).unwrap()[0].payload,
            Bytes::from_static(br#"{"a":[1]}"#)
        );
        let b64 = Bytes::from_static(
            br#"{"messages":[{"topic":"t","partition":0,"offset":0,"payload":"/w==","payload_encoding":"base64","timestamp_ms":1,"receipt_handle":"h"}]}"#,
        );
        assert_eq!(
            received(&b64).unwrap()[0].payload,
            Bytes::from_static(&[0xff])
        );
        assert!(received(&Bytes::from_static(b"{\"messages\":[{}]}")).is_err());
        let handles = vec!["a-b_c".to_owned(), "q\"x".to_owned()];
        let parsed: AckBatch = serde_json::from_slice(&ack_body(&handles)).unwrap();
        assert_eq!(parsed.receipt_handles, handles);
        assert_eq!(parsed.extend, None);
    }

    #[test]
    fn batch_body_is_valid_json() {
        let body = batch_body(
            &[Bytes::from_static(b"abc"), Bytes::from_static(b"q\"uote\n")],
            Some(5),
        );
        // what the hand-written body says is what the wire type says
        let b: narad_wire::ProduceBatch = serde_json::from_slice(&body).unwrap();
        assert_eq!(b.messages[0].payload.get(), "\"abc\"");
        assert_eq!(
            serde_json::from_str::<String>(b.messages[1].payload.get()).unwrap(),
            "q\"uote\n"
        );
        assert_eq!(b.messages[0].delay_ms, Some(5));
        assert_eq!(b.messages[1].delay_ms, Some(5));
        for m in &b.messages {
            assert_eq!(m.payload_encoding, Some(narad_wire::Encoding::Utf8));
        }
    }
}
