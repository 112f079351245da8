//! `narad-bench noop-server`: the no-op HTTP ceiling. An HTTP/1.1 keep-alive server that reads
//! each request's whole body and answers `202` with a fixed body shaped like Narad's
//! single-produce reply, and does nothing else: any method, any path.
//!
//! Driven by the same client as Narad (`run --target narad --label http-noop`), its figure is
//! what one request per message costs on this machine with no broker behind it: the ceiling
//! Narad's single-message produce is compared with (an nginx `return 202`, without needing
//! nginx). It is served with the building blocks Narad's own listener uses
//! (`infra/src/conn.rs`): hyper's `http1` connection builder with a tokio timer over
//! `TokioIo`, `TCP_NODELAY`, one task per connection, in a tokio multi-thread runtime with one
//! worker per core (the default both binaries build). What it leaves out is everything Narad
//! does per request: routing, limits, authentication and the broker.

use std::future::Future;
use std::io;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// The body of every reply: a single produce's `202` (`narad_wire::Produced`), fixed.
pub const REPLY: &str = r#"{"partition":0,"offset":0}"#;

/// Serves `listener` until `shutdown` resolves; the open connections are then dropped with
/// their tasks. An accept error ends the server: a ceiling measured with connections refused
/// would not be one.
pub async fn serve(listener: TcpListener, shutdown: impl Future<Output = ()>) -> io::Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut conns = JoinSet::new();
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => return Ok(()),
            Some(_) = conns.join_next() => continue,
            r = listener.accept() => r?.0,
        };
        let _ = stream.set_nodelay(true);
        conns.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(None);
            let service = hyper::service::service_fn(answer);
            // a client that drops its connection mid-request is no news to a no-op
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Reads the whole body, then answers `202` with [`REPLY`].
async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    req.into_body().collect().await?;
    let mut resp = Response::new(Full::new(Bytes::from_static(REPLY.as_bytes())));
    *resp.status_mut() = StatusCode::ACCEPTED;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::narad::Narad;
    use crate::target::Target as _;
    use hyper::Method;

    /// A no-op server on 127.0.0.1:0, stopped when the returned sender is dropped.
    async fn start() -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, async {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Two POSTs with bodies on one connection, the second after the first's reply: both get
    /// the 202 and the JSON. hyper's connection-level client cannot redial, so a server that
    /// closed after one request fails the second send.
    #[tokio::test]
    async fn answers_202_with_the_produce_reply_and_keeps_the_connection() {
        let (addr, _stop) = start().await;
        let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let conn = tokio::spawn(conn);
        for (path, body) in [
            ("/v1/topics/t/produce", "x".repeat(300_000)),
            ("/anything?at=all", "second".into()),
        ] {
            let req = Request::builder()
                .method(Method::POST)
                .uri(path)
                .header(hyper::header::HOST, &addr)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let resp = tx.send_request(req).await.expect("kept alive");
            assert_eq!(resp.status(), StatusCode::ACCEPTED, "{path}");
            assert_eq!(resp.headers()[CONTENT_TYPE], "application/json");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let produced: narad_wire::Produced = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                produced,
                narad_wire::Produced {
                    partition: 0,
                    offset: 0
                }
            );
        }
        assert!(
            !conn.is_finished(),
            "the connection closed after two requests"
        );
    }

    /// The narad target's `prepare` (DELETE and POST /v1/topics) takes the no-op's 202s as
    /// success, so `run --target narad` can drive the no-op server unchanged.
    #[tokio::test]
    async fn the_narad_client_prepares_against_it() {
        let (addr, _stop) = start().await;
        let target = Narad {
            addr,
            topic: "bench".into(),
            visibility_ms: 60_000,
        };
        target.prepare(4).await.unwrap();
    }

    /// `serve` returns once its shutdown future resolves, with connections still open.
    #[tokio::test]
    async fn stops_on_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, async {
            let _ = stopped.await;
        }));
        let _open = tokio::net::TcpStream::connect(addr).await.unwrap();
        stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .expect("serve did not return")
            .unwrap()
            .unwrap();
    }
}
