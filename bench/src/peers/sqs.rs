//! Narad through its SQS-compatible endpoint: SendMessage (SendMessageBatch for more than one
//! message, ten at a time), ReceiveMessage and DeleteMessage (DeleteMessageBatch), each
//! request signed with SigV4 as an AWS SDK signs it, over one keep-alive HTTP/1.1 connection
//! per worker. The key is `NARAD_SQS_KEY_ID` and `NARAD_SQS_SECRET` (an access key of a broker
//! with security on); without them a made-up key signs (a `--dev` broker checks none), so
//! the client's cost is the same either way.

use std::time::Duration;

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use crate::target::{BenchError, Conn, Received, Result, Target};
use crate::wire::Wire;

/// The endpoint, queue and key a run uses.
#[derive(Clone)]
pub struct NaradSqs {
    /// `host:port`
    pub addr: String,
    pub queue: String,
    pub visibility_s: u64,
}

fn key() -> (String, String) {
    match (
        std::env::var("NARAD_SQS_KEY_ID"),
        std::env::var("NARAD_SQS_SECRET"),
    ) {
        (Ok(id), Ok(secret)) => (id, secret),
        _ => ("NRDBENCHBENCHBENCHBE".into(), "bench-secret".into()),
    }
}

/// One connection, signing each request.
pub struct SqsHttp {
    addr: String,
    conn: Option<Wire>,
    key: (String, String),
}

impl SqsHttp {
    pub async fn connect(addr: &str) -> Result<Self> {
        Ok(Self {
            addr: addr.to_owned(),
            conn: None,
            key: key(),
        })
    }

    /// Calls `op` with `body`; a non-2xx is an error counted under its AWS error code.
    pub async fn call(&mut self, op: &str, body: &serde_json::Value) -> Result<Bytes> {
        if self.conn.as_ref().is_none_or(Wire::is_stale) {
            self.conn = Some(
                Wire::connect(&self.addr)
                    .await
                    .map_err(|e| BenchError::new("connect", e))?,
            );
        }
        let body = serde_json::to_vec(body).expect("requests serialise");
        // (the load generator's own clock: a signature's date, no broker logic involved)
        #[allow(clippy::disallowed_methods)]
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let amz = narad_sqs::sigv4::amz_date(now);
        let target = format!("AmazonSQS.{op}");
        let signed: [(&str, &[u8]); 4] = [
            ("content-type", b"application/x-amz-json-1.0"),
            ("host", self.addr.as_bytes()),
            ("x-amz-date", amz.as_bytes()),
            ("x-amz-target", target.as_bytes()),
        ];
        let auth = narad_sqs::sigv4::sign(
            &narad_sqs::sigv4::Request {
                method: "POST",
                path: "/",
                query: "",
                headers: &signed,
                body: &body,
            },
            &self.key.0,
            &self.key.1,
            "us-east-1",
            &amz,
        );
        let headers: [(&str, &[u8]); 4] = [
            ("content-type", b"application/x-amz-json-1.0"),
            ("x-amz-date", amz.as_bytes()),
            ("x-amz-target", target.as_bytes()),
            ("authorization", auth.as_bytes()),
        ];
        let wire = self.conn.as_mut().expect("connected above");
        match wire
            .request_with(&Method::POST, "/", &self.addr, &headers, &body)
            .await
        {
            Ok(r) => {
                if r.close {
                    self.conn = None;
                }
                if r.status == StatusCode::OK {
                    Ok(r.body)
                } else {
                    Err(sqs_error(r.status, &r.body))
                }
            }
            Err(e) => {
                self.conn = None;
                Err(BenchError::new("io", e))
            }
        }
    }
}

fn sqs_error(status: StatusCode, body: &[u8]) -> BenchError {
    #[derive(Deserialize)]
    struct E {
        #[serde(rename = "__type", default)]
        kind: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<E>(body) {
        Ok(e) => BenchError::new(
            format!(
                "http {} {}",
                status.as_u16(),
                e.kind.rsplit('#').next().unwrap_or("")
            ),
            e.message,
        ),
        Err(_) => BenchError::new(
            format!("http {}", status.as_u16()),
            String::from_utf8_lossy(body),
        ),
    }
}

fn bad(e: impl ToString) -> BenchError {
    BenchError::new("bad response", e)
}

impl Target for NaradSqs {
    type Conn = SqsConn;

    fn name(&self) -> &'static str {
        "narad-sqs"
    }

    async fn prepare(&self, partitions: u32) -> Result<()> {
        // (the queue is made through the native API: SQS has no partition count)
        let mut http = crate::narad::Http::connect(&self.addr).await?;
        let path = format!("/v1/topics/{}", self.queue);
        let (status, body) = http.request(Method::DELETE, &path, Bytes::new()).await?;
        if !status.is_success() && status != StatusCode::NOT_FOUND {
            return Err(crate::narad::http_error(status, &body));
        }
        let mut create = narad_wire::CreateTopic::new(&self.queue);
        create.settings.partitions = Some(partitions);
        create.settings.visibility_timeout_ms = Some(self.visibility_s as i64 * 1000);
        create.settings.max_in_flight_per_partition = Some(1_000_000);
        http.expect_2xx(Method::POST, "/v1/topics", crate::narad::json_body(&create))
            .await?;
        Ok(())
    }

    async fn connect(&self, _worker: usize) -> Result<SqsConn> {
        Ok(SqsConn {
            http: SqsHttp::connect(&self.addr).await?,
            url: format!("http://{}/000000000000/{}", self.addr, self.queue),
        })
    }

    fn notes(&self) -> Vec<String> {
        vec![
            "AWS JSON 1.0, SigV4-signed by the client; SendMessageBatch/DeleteMessageBatch take 10 at most, so a batch of more is several requests".into(),
        ]
    }
}

pub struct SqsConn {
    http: SqsHttp,
    url: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Receive {
    #[serde(default)]
    messages: Vec<Msg>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Msg {
    body: String,
    receipt_handle: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BatchAnswer {
    #[serde(default)]
    failed: Vec<serde_json::Value>,
}

impl SqsConn {
    /// A batch call; an entry it failed is an error.
    async fn batch(&mut self, op: &str, entries: Vec<serde_json::Value>) -> Result<()> {
        let r = self
            .http
            .call(op, &json!({"QueueUrl": self.url, "Entries": entries}))
            .await?;
        let a: BatchAnswer = serde_json::from_slice(&r).map_err(bad)?;
        match a.failed.first() {
            Some(f) => Err(BenchError::new("batch entry failed", f)),
            None => Ok(()),
        }
    }
}

impl Conn for SqsConn {
    type Token = String;

    async fn produce(&mut self, payloads: &[Bytes]) -> Result<()> {
        if let [one] = payloads {
            let body = String::from_utf8_lossy(one);
            self.http
                .call(
                    "SendMessage",
                    &json!({"QueueUrl": self.url, "MessageBody": body}),
                )
                .await?;
            return Ok(());
        }
        for chunk in payloads.chunks(10) {
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, p)| json!({"Id": format!("m{i}"), "MessageBody": String::from_utf8_lossy(p)}))
                .collect();
            self.batch("SendMessageBatch", entries).await?;
        }
        Ok(())
    }

    async fn consume(&mut self, max: usize, wait: Duration) -> Result<Vec<Received<String>>> {
        let wait_s = wait.as_secs().min(20) + u64::from(wait.subsec_nanos() > 0);
        let r = self
            .http
            .call(
                "ReceiveMessage",
                &json!({
                    "QueueUrl": self.url,
                    "MaxNumberOfMessages": max.clamp(1, 10),
                    "WaitTimeSeconds": wait_s.min(20),
                }),
            )
            .await?;
        let got: Receive = serde_json::from_slice(&r).map_err(bad)?;
        Ok(got
            .messages
            .into_iter()
            .map(|m| Received {
                payload: Bytes::from(m.body),
                token: m.receipt_handle,
            })
            .collect())
    }

    async fn ack(&mut self, tokens: Vec<String>) -> Result<()> {
        if let [one] = tokens.as_slice() {
            self.http
                .call(
                    "DeleteMessage",
                    &json!({"QueueUrl": self.url, "ReceiptHandle": one}),
                )
                .await?;
            return Ok(());
        }
        for chunk in tokens.chunks(10) {
            let entries: Vec<_> = chunk
                .iter()
                .enumerate()
                .map(|(i, h)| json!({"Id": format!("d{i}"), "ReceiptHandle": h}))
                .collect();
            self.batch("DeleteMessageBatch", entries).await?;
        }
        Ok(())
    }
}
