//! Connection slots: silent and slow clients lose theirs in bounded time, an idle keep-alive
//! connection gives its slot to a new client, and a long-poll is never cut.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: narad\r\n\r\n";

/// Reads one HTTP/1.1 response: status and body; `None` if the connection closed first.
pub(crate) async fn read_response(c: &mut (impl AsyncRead + Unpin)) -> Option<(u16, String)> {
    read_http_response(c)
        .await
        .map(|(status, _, body)| (status, body))
}

/// One `GET /healthz` on a new connection: its status, or `None` if closed unanswered.
async fn probe(addr: &str) -> Option<u16> {
    let mut c = TcpStream::connect(addr).await.ok()?;
    c.write_all(HEALTHZ).await.ok()?;
    read_response(&mut c).await.map(|r| r.0)
}

/// Waits until the server closes `c` (EOF or reset), at most `limit`; returns how long it took.
pub(crate) async fn closed_within(
    c: &mut (impl AsyncRead + Unpin),
    limit: Duration,
    what: &str,
) -> Duration {
    let start = Instant::now();
    let mut chunk = [0u8; 1024];
    let r = tokio::time::timeout(limit, async {
        loop {
            match c.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(r.is_ok(), "{what}: still open after {limit:?}");
    start.elapsed()
}

fn addr(s: &Server) -> String {
    s.base.trim_start_matches("http://").to_owned()
}

/// Polls `probe` until it answers 200, at most `limit`; returns how long it took.
async fn served_within(addr: &str, limit: Duration, s: &Server) -> Duration {
    let start = Instant::now();
    loop {
        if probe(addr).await == Some(200) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "no new client served within {limit:?}; log:\n{}",
            s.log()
        );
        poll_pause().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_header_clients_cannot_lock_others_out() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(
        dir.path(),
        &[
            ("NARAD_MAX_CONNECTIONS", "4"),
            ("NARAD_HEADER_READ_TIMEOUT_MS", "1500"),
        ],
    )
    .await;
    let addr = addr(&s);
    // Two silent connections and two that send an endless header block one line at a time.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    let mut slow = Vec::new();
    for i in 0..2 {
        let mut c = TcpStream::connect(&addr).await.unwrap();
        slow.push(tokio::spawn(async move {
            let start = Instant::now();
            if c.write_all(b"GET /healthz HTTP/1.1\r\nHost: narad\r\n")
                .await
                .is_err()
            {
                return start.elapsed();
            }
            // a slow client dribbles its header block in real time: the server's header
            // timeout is what is under test, and it runs on the monotonic clock
            #[allow(clippy::disallowed_methods)]
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut buf = [0u8; 64];
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if c.write_all(format!("x-slow-{i}: 1\r\n").as_bytes()).await.is_err() {
                            return start.elapsed();
                        }
                    }
                    r = c.read(&mut buf) => if matches!(r, Ok(0) | Err(_)) {
                        return start.elapsed();
                    }
                }
            }
        }));
    }
    // Every slot is soon held by a connection that has not finished a header block (the test
    // client's pooled idle connection, if any, is evicted), so nobody idle can make room.
    let deadline = Instant::now() + Duration::from_secs(1);
    while probe(&addr).await != Some(503) {
        assert!(Instant::now() < deadline, "the cap was not reached");
        poll_pause().await;
    }
    // Within the header timeout (plus scheduling), the slots come free.
    let took = served_within(&addr, Duration::from_secs(10), &s).await;
    eprintln!("a new client was served {took:?} after the cap was reached");
    for (i, c) in silent.iter_mut().enumerate() {
        let t = closed_within(c, Duration::from_secs(10), &format!("silent client {i}")).await;
        eprintln!("silent client {i} closed after a further {t:?}");
    }
    for (i, h) in slow.into_iter().enumerate() {
        let t = tokio::time::timeout(Duration::from_secs(10), h)
            .await
            .unwrap_or_else(|_| panic!("slow client {i} still open"))
            .unwrap();
        eprintln!("slow client {i} closed after {t:?}");
        assert!(t < Duration::from_secs(10), "slow client {i} took {t:?}");
    }
    let metrics = s.get("/metrics").await.text().await.unwrap();
    let timed_out = sample(
        &metrics,
        "narad_http_connections_closed_total{reason=\"header_timeout\"}",
    );
    assert!(timed_out >= 4.0, "{timed_out} header timeouts counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keepalive_connection_gives_its_slot_to_a_new_client() {
    let dir = tempfile::tempdir().unwrap();
    // timeouts far longer than the test: only eviction can free a slot
    let s = Server::start_with(
        dir.path(),
        &[
            ("NARAD_MAX_CONNECTIONS", "2"),
            ("NARAD_KEEPALIVE_IDLE_TIMEOUT_MS", "600000"),
        ],
    )
    .await;
    let addr = addr(&s);
    // two keep-alive connections, each idle after one request (the test client's pooled
    // connection, if any, is evicted by the second)
    let mut older = TcpStream::connect(&addr).await.unwrap();
    older.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut older).await.unwrap().0, 200);
    let mut newer = TcpStream::connect(&addr).await.unwrap();
    newer.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut newer).await.unwrap().0, 200);
    // the cap is reached; a new client takes the slot of the one idle the longest, at once
    let start = Instant::now();
    let mut third = TcpStream::connect(&addr).await.unwrap();
    third.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut third).await.map(|r| r.0), Some(200));
    eprintln!(
        "served by evicting an idle connection in {:?}",
        start.elapsed()
    );
    closed_within(
        &mut older,
        Duration::from_secs(5),
        "the older idle connection",
    )
    .await;
    // the other one is still served
    newer.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut newer).await.map(|r| r.0), Some(200));
    drop((third, newer));
    // a long-poll and a client still sending its header block: nobody is idle, so a new
    // client is refused (and the long-poll is not cut)
    s.create_topic(json!({"name": "t", "partitions": 1})).await;
    let mut polling = TcpStream::connect(&addr).await.unwrap();
    polling
        .write_all(b"GET /v1/topics/t/consume?wait=5s HTTP/1.1\r\nHost: narad\r\n\r\n")
        .await
        .unwrap();
    let mut partial = TcpStream::connect(&addr).await.unwrap();
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    // probes are served while the slots of the closed connections come free, then refused
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        if probe(&addr).await == Some(503) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a busy or mid-header connection was evicted"
        );
        poll_pause().await;
    }
    assert_eq!(read_response(&mut polling).await.map(|r| r.0), Some(204));
    drop(partial);
    let metrics = s.get("/metrics").await.text().await.unwrap();
    let evicted = sample(
        &metrics,
        "narad_http_connections_closed_total{reason=\"evicted_idle\"}",
    );
    assert!(evicted >= 1.0, "{evicted} evictions counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_outlives_the_header_timeout_and_idle_connections_close() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start_with(
        dir.path(),
        &[
            ("NARAD_HEADER_READ_TIMEOUT_MS", "300"),
            ("NARAD_KEEPALIVE_IDLE_TIMEOUT_MS", "500"),
        ],
    )
    .await;
    let addr = addr(&s);
    s.create_topic(json!({"name": "t", "partitions": 1})).await;
    let mut c = TcpStream::connect(&addr).await.unwrap();
    let start = Instant::now();
    c.write_all(b"GET /v1/topics/t/consume?wait=2s HTTP/1.1\r\nHost: narad\r\n\r\n")
        .await
        .unwrap();
    let r = read_response(&mut c).await;
    let waited = start.elapsed();
    assert_eq!(r.map(|r| r.0), Some(204), "long-poll cut after {waited:?}");
    assert!(waited >= Duration::from_millis(1900), "{waited:?}");
    // the same connection is kept alive, then closed once idle for keepalive_idle_timeout_ms
    c.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut c).await.map(|r| r.0), Some(200));
    let idle = closed_within(&mut c, Duration::from_secs(5), "idle keep-alive").await;
    eprintln!("idle keep-alive connection closed after {idle:?}");
    assert!(
        idle >= Duration::from_millis(400),
        "closed too early: {idle:?}"
    );
    let metrics = s.get("/metrics").await.text().await.unwrap();
    let closed = sample(
        &metrics,
        "narad_http_connections_closed_total{reason=\"idle_timeout\"}",
    );
    assert!(closed >= 1.0, "{closed} idle timeouts counted");
}

/// A TLS client trusting `ca` (PEM).
pub(crate) fn tls_connector(ca: &str) -> tokio_rustls::TlsConnector {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
}

/// Over TLS, the header and idle timeouts apply after the handshake.
pub(crate) async fn check_tls_timeouts(addr: &str, ca: &str) {
    let connector = tls_connector(ca);
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    // handshake, then silence
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut silent = connector.connect(name.clone(), tcp).await.unwrap();
    let t = closed_within(
        &mut silent,
        Duration::from_secs(10),
        "silent client after the TLS handshake",
    )
    .await;
    eprintln!("silent TLS client closed after {t:?}");
    // one request, then idle
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut idle = connector.connect(name, tcp).await.unwrap();
    idle.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut idle).await.map(|r| r.0), Some(200));
    let t = closed_within(&mut idle, Duration::from_secs(10), "idle TLS keep-alive").await;
    eprintln!("idle TLS keep-alive closed after {t:?}");
}

/// From the black-box review: an answer given before the request's body had arrived (a bad
/// query, an unknown route, a refused caller) closed the connection without saying so, and a
/// keep-alive client's next request on it failed. Such an answer now carries
/// `Connection: close`; an answer given after the body was read keeps the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_body_says_the_connection_closes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 1})).await;
    let addr = addr(&s);
    // the head and a tenth of the body: the rest is still on its way when the answer goes
    for (head, want) in [
        ("POST /v1/topics/t/produce?partition=x", 400),
        ("POST /v1/topics/t/produce?nonsense=1", 400),
        ("POST /v1/no/such/route", 404),
        ("DELETE /v1/topics/t/produce", 405),
    ] {
        let mut c = TcpStream::connect(&addr).await.unwrap();
        let req =
            format!("{head} HTTP/1.1\r\nHost: narad\r\nContent-Length: 100\r\n\r\n0123456789");
        c.write_all(req.as_bytes()).await.unwrap();
        let (status, headers, body) = read_http_response(&mut c).await.expect(head);
        assert_eq!(status, want, "{head}: {body}");
        assert!(body.starts_with('{'), "{head}: not JSON: {body}");
        assert!(
            headers.lines().any(|l| l == "connection: close"),
            "{head}: answered before its body without saying the connection closes:\n{headers}"
        );
        closed_within(&mut c, Duration::from_secs(5), head).await;
    }
    // answers given after the whole body was read, an error among them: the same
    // connection serves the next request
    let mut c = TcpStream::connect(&addr).await.unwrap();
    for (head, want) in [
        ("POST /v1/topics/t/produce", 202),
        ("POST /v1/topics/missing/produce", 404),
        ("POST /v1/topics/t/produce", 202),
    ] {
        let req = format!("{head} HTTP/1.1\r\nHost: narad\r\nContent-Length: 10\r\n\r\n0123456789");
        c.write_all(req.as_bytes()).await.unwrap();
        let (status, headers, body) = read_http_response(&mut c).await.expect(head);
        assert_eq!(status, want, "{head}: {body}");
        assert!(
            !headers.contains("connection: close"),
            "{head}: a read body closed the connection:\n{headers}"
        );
    }
    c.write_all(HEALTHZ).await.unwrap();
    assert_eq!(read_response(&mut c).await.map(|r| r.0), Some(200));
    // a client that waits for `100 Continue` before its body: one announcing more than the
    // route reads is refused at once (it never uploads the body), one within it is told to go on
    let mut c = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/topics/t/produce HTTP/1.1\r\nHost: narad\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        9 << 20
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let (status, headers, body) = read_http_response(&mut c).await.expect("an answer");
    assert_eq!(status, 413, "{headers}\n{body}");
    assert!(body.contains("body_too_large"), "{body}");
    assert!(
        headers.lines().any(|l| l == "connection: close"),
        "{headers}"
    );
    let mut c = TcpStream::connect(&addr).await.unwrap();
    c.write_all(
        b"POST /v1/topics/t/produce HTTP/1.1\r\nHost: narad\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(read_response(&mut c).await.map(|r| r.0), Some(100));
    c.write_all(b"0123456789").await.unwrap();
    assert_eq!(read_response(&mut c).await.map(|r| r.0), Some(202));
}

/// From the black-box review: hyper undoes only the chunking of `Transfer-Encoding: gzip,
/// chunked`, and the still-compressed bytes were stored as the message. Any transfer coding
/// but `chunked` is now refused with `501 unsupported_transfer_encoding`, before anything is
/// written; plain `chunked`, in any case, is still read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coding_other_than_chunked_is_refused_and_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path()).await;
    s.create_topic(json!({"name": "t", "partitions": 1})).await;
    let addr = addr(&s);
    let chunked_body = "a\r\n0123456789\r\n0\r\n\r\n";
    for codings in [
        &["gzip, chunked"][..],
        &["deflate,chunked"],
        &["chunked, chunked"],
        &["gzip", "chunked"],
        &["x-custom ,  Chunked"],
    ] {
        let mut head = String::from("POST /v1/topics/t/produce HTTP/1.1\r\nHost: narad\r\n");
        for c in codings {
            head.push_str(&format!("Transfer-Encoding: {c}\r\n"));
        }
        let mut c = TcpStream::connect(&addr).await.unwrap();
        c.write_all(format!("{head}\r\n{chunked_body}").as_bytes())
            .await
            .unwrap();
        let Some((status, headers, body)) = read_http_response(&mut c).await else {
            panic!("{codings:?}: connection closed without an answer");
        };
        // hyper itself refuses some framings (a repeated `chunked`) with an empty 400
        if status == 400 && body.is_empty() {
            eprintln!("{codings:?}: refused by the HTTP parser");
            continue;
        }
        assert_eq!(status, 501, "{codings:?}: {headers}\n{body}");
        assert!(
            body.contains("\"code\":\"unsupported_transfer_encoding\""),
            "{codings:?}: {body}"
        );
        assert!(
            headers.lines().any(|l| l == "connection: close"),
            "{codings:?}: {headers}"
        );
    }
    let replay = s
        .get("/v1/topics/t/consume?partition=0&offset=0&max=100")
        .await;
    let text = replay.text().await.unwrap();
    assert!(
        !text.contains("\"offset\""),
        "a refused body was stored: {text}"
    );
    // plain chunked, whatever its case, is read and stored
    for coding in ["chunked", "Chunked", " CHUNKED "] {
        let mut c = TcpStream::connect(&addr).await.unwrap();
        let req = format!(
            "POST /v1/topics/t/produce HTTP/1.1\r\nHost: narad\r\nTransfer-Encoding: {coding}\r\n\r\n{chunked_body}"
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let (status, headers, body) = read_http_response(&mut c).await.expect(coding);
        assert_eq!(status, 202, "{coding}: {headers}\n{body}");
    }
    let replay = s
        .get("/v1/topics/t/consume?partition=0&offset=0&max=100")
        .await;
    let text = replay.text().await.unwrap();
    assert_eq!(text.matches("0123456789").count(), 3, "{text}");
}
