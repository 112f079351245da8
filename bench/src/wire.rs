//! A lean HTTP/1.1 client connection for the load generator: one keep-alive TCP connection,
//! each request written and its response read by the calling task itself.
//!
//! hyper's connection-level client runs the connection as a task of its own and hands every
//! request and response across a channel, so each request costs two task wake-ups in the load
//! generator on top of the socket calls. On this 2-core machine the load generator shares the
//! cores with the broker it measures, so its CPU per request is taken from the broker's: a
//! lighter client measures the broker (and the no-op ceiling, driven by the same client) more
//! the way `wrk` or `redis-benchmark` measure theirs. What it does not do, it refuses: a
//! response head over 64 KiB, more than 64 headers, a body over 256 MiB, and transfer
//! codings other than `chunked`.

use std::io;

use bytes::{Buf as _, Bytes, BytesMut};
use hyper::{Method, StatusCode};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The longest response head read.
const MAX_HEAD: usize = 64 << 10;
/// The longest response body read.
const MAX_BODY: usize = 256 << 20;

/// One response.
pub struct Response {
    pub status: StatusCode,
    pub body: Bytes,
    /// The server will not take another request on this connection.
    pub close: bool,
}

/// One keep-alive HTTP/1.1 connection.
pub struct Wire {
    stream: TcpStream,
    /// Bytes read and not yet consumed.
    buf: BytesMut,
    out: Vec<u8>,
}

impl Wire {
    pub async fn connect(addr: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: BytesMut::with_capacity(16 << 10),
            out: Vec::with_capacity(1024),
        })
    }

    /// Whether the server closed the connection (or sent something unasked) while it was
    /// idle between requests: it is not to be used again. No system call unless the socket
    /// was reported readable.
    pub fn is_stale(&self) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        let mut probe = [0u8; 1];
        !matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Sends one request (head and body in one write) and reads its response. Any error
    /// leaves the connection unusable: the caller drops it.
    pub async fn request(
        &mut self,
        method: &Method,
        path: &str,
        host: &str,
        auth: Option<&[u8]>,
        body: &[u8],
    ) -> io::Result<Response> {
        let auth: Option<[(&str, &[u8]); 1]> = auth.map(|a| [("authorization", a)]);
        self.request_with(
            method,
            path,
            host,
            auth.as_ref().map_or(&[], |a| &a[..]),
            body,
        )
        .await
    }

    /// [`Wire::request`] with headers of its own (`name`, value) besides `host` and
    /// `content-length`.
    pub async fn request_with(
        &mut self,
        method: &Method,
        path: &str,
        host: &str,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> io::Result<Response> {
        let out = &mut self.out;
        out.clear();
        for part in [
            method.as_str(),
            " ",
            path,
            " HTTP/1.1\r\nhost: ",
            host,
            "\r\n",
        ] {
            out.extend_from_slice(part.as_bytes());
        }
        for (name, value) in headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        let bodiless = matches!(*method, Method::GET | Method::HEAD | Method::DELETE);
        if !body.is_empty() || !bodiless {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(body.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        self.stream.write_all(out).await?;
        if out.capacity() > 1 << 20 {
            // (a large batch body: not kept for every later request)
            *out = Vec::with_capacity(1024);
        }
        self.response(*method == Method::HEAD).await
    }

    async fn response(&mut self, head_only: bool) -> io::Result<Response> {
        loop {
            let head = self.head().await?;
            // 1xx (other than a protocol switch, never asked for) precede the real answer
            if head.status.is_informational() {
                continue;
            }
            let status = head.status;
            let body = if head_only
                || status == StatusCode::NO_CONTENT
                || status == StatusCode::NOT_MODIFIED
            {
                Bytes::new()
            } else if head.chunked {
                self.chunked().await?
            } else if let Some(n) = head.length {
                if n > MAX_BODY {
                    return Err(bad(format!("a {n}-byte body is over the client's limit")));
                }
                self.fill_to(n).await?;
                self.buf.split_to(n).freeze()
            } else {
                // no length: the body runs to the end of the connection
                while self.read_more().await? > 0 {
                    if self.buf.len() > MAX_BODY {
                        return Err(bad("a body over the client's limit".into()));
                    }
                }
                return Ok(Response {
                    status,
                    body: self.buf.split().freeze(),
                    close: true,
                });
            };
            return Ok(Response {
                status,
                body,
                close: head.close,
            });
        }
    }

    /// Reads and parses a response head, consuming it from the buffer.
    async fn head(&mut self) -> io::Result<Head> {
        loop {
            if !self.buf.is_empty() {
                let mut headers = [httparse::EMPTY_HEADER; 64];
                let mut resp = httparse::Response::new(&mut headers);
                match resp.parse(&self.buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        let head = Head::of(&resp)?;
                        self.buf.advance(n);
                        return Ok(head);
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(e) => return Err(bad(format!("unparsable response head: {e}"))),
                }
                if self.buf.len() > MAX_HEAD {
                    return Err(bad("a response head over 64 KiB".into()));
                }
            }
            if self.read_more().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed before a response",
                ));
            }
        }
    }

    /// A `chunked` body, its trailers read and dropped.
    async fn chunked(&mut self) -> io::Result<Bytes> {
        let mut body = BytesMut::new();
        loop {
            let line = self.line().await?;
            let size = line.split(|&c| c == b';').next().unwrap_or_default();
            let size = std::str::from_utf8(size)
                .ok()
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.len() <= 8)
                .and_then(|s| usize::from_str_radix(s, 16).ok())
                .ok_or_else(|| bad("a malformed chunk size".into()))?;
            if size == 0 {
                // trailers, up to the empty line
                while !self.line().await?.is_empty() {}
                return Ok(body.freeze());
            }
            if body.len() + size > MAX_BODY {
                return Err(bad("a body over the client's limit".into()));
            }
            self.fill_to(size + 2).await?;
            body.extend_from_slice(&self.buf[..size]);
            if &self.buf[size..size + 2] != b"\r\n" {
                return Err(bad("a chunk not ended by CRLF".into()));
            }
            self.buf.advance(size + 2);
        }
    }

    /// One CRLF-terminated line (without it), consumed from the buffer.
    async fn line(&mut self) -> io::Result<Bytes> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf.split_to(i).freeze();
                self.buf.advance(2);
                return Ok(line);
            }
            if self.buf.len() > 4096 {
                return Err(bad("a chunk line over 4 KiB".into()));
            }
            if self.read_more().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a chunked body",
                ));
            }
        }
    }

    /// Reads until at least `n` bytes are buffered.
    async fn fill_to(&mut self, n: usize) -> io::Result<()> {
        while self.buf.len() < n {
            self.buf.reserve(n - self.buf.len());
            if self.read_more().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a body",
                ));
            }
        }
        Ok(())
    }

    async fn read_more(&mut self) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 << 10);
        }
        self.stream.read_buf(&mut self.buf).await
    }
}

/// What a response head says about the body and the connection.
struct Head {
    status: StatusCode,
    length: Option<usize>,
    chunked: bool,
    close: bool,
}

impl Head {
    fn of(resp: &httparse::Response<'_, '_>) -> io::Result<Self> {
        let status = resp
            .code
            .and_then(|c| StatusCode::from_u16(c).ok())
            .ok_or_else(|| bad("a response without a valid status".into()))?;
        let mut head = Self {
            status,
            length: None,
            chunked: false,
            close: resp.version == Some(0),
        };
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(h.value)
                    .ok()
                    .filter(|v| !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()))
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| bad("a malformed Content-Length".into()))?;
                if head.length.is_some_and(|m| m != n) {
                    return Err(bad("conflicting Content-Length headers".into()));
                }
                head.length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                if !h.value.eq_ignore_ascii_case(b"chunked") || head.chunked {
                    return Err(bad("a transfer coding other than chunked".into()));
                }
                head.chunked = true;
            } else if h.name.eq_ignore_ascii_case("connection") {
                let v = h.value;
                if v.split(|&c| c == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
                {
                    head.close = true;
                }
            }
        }
        Ok(head)
    }
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers each request (read up to its blank line, and `body` more
    /// bytes) with the next canned answer, written in pieces of `piece` bytes.
    async fn serve(answers: Vec<&'static [u8]>, body: usize, piece: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            for answer in answers {
                loop {
                    if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n")
                        && got.len() >= i + 4 + body
                    {
                        got.drain(..i + 4 + body);
                        break;
                    }
                    let mut b = [0; 4096];
                    let n = s.read(&mut b).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&b[..n]);
                }
                for p in answer.chunks(piece) {
                    s.write_all(p).await.unwrap();
                    s.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
        });
        addr
    }

    const ANSWERS: [&[u8]; 5] = [
        b"HTTP/1.1 202 Accepted\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nt: 1\r\n\r\n",
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\nConnection: keep-alive, Close\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\n\r\nto the end",
    ];

    async fn check(piece: usize) {
        let addr = serve(ANSWERS.to_vec(), 3, piece).await;
        let mut w = Wire::connect(&addr).await.unwrap();
        let ask = async |w: &mut Wire| {
            w.request(&Method::POST, "/p", "h", Some(b"Basic x"), b"abc")
                .await
                .unwrap()
        };
        let r = ask(&mut w).await;
        assert_eq!(
            (r.status.as_u16(), &r.body[..], r.close),
            (202, &b"hello"[..], false)
        );
        let r = ask(&mut w).await;
        assert_eq!((r.status.as_u16(), r.body.len(), r.close), (204, 0, false));
        let r = ask(&mut w).await;
        assert_eq!(
            (r.status.as_u16(), &r.body[..]),
            (200, &b"abc0123456789abcdef"[..])
        );
        let r = ask(&mut w).await;
        assert_eq!(
            (r.status.as_u16(), &r.body[..], r.close),
            (503, &b"{}"[..], true)
        );
        let r = ask(&mut w).await;
        assert_eq!(
            (r.status.as_u16(), &r.body[..], r.close),
            (200, &b"to the end"[..], true)
        );
    }

    #[tokio::test]
    async fn reads_lengths_chunks_informational_answers_and_close() {
        check(4096).await;
        // and the same arriving a byte at a time
        check(1).await;
    }

    /// A keep-alive connection the server closed while idle reports itself stale, so the
    /// next request goes on a new connection instead of failing on the old one.
    #[tokio::test]
    async fn a_connection_closed_while_idle_is_stale() {
        let addr = serve(vec![ANSWERS[0]], 0, 4096).await;
        let mut w = Wire::connect(&addr).await.unwrap();
        assert!(!w.is_stale());
        let r = w.request(&Method::GET, "/", "h", None, b"").await.unwrap();
        assert_eq!(r.status.as_u16(), 202);
        // the server's task ends after its one answer, closing the connection
        tokio::time::timeout(std::time::Duration::from_secs(10), w.stream.readable())
            .await
            .expect("the close is seen")
            .unwrap();
        assert!(w.is_stale());
    }

    #[tokio::test]
    async fn refuses_what_it_cannot_frame() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
            b"NOT HTTP\r\n\r\n",
        ] {
            let addr = serve(vec![answer], 0, 4096).await;
            let mut w = Wire::connect(&addr).await.unwrap();
            let r = w.request(&Method::GET, "/", "h", None, b"").await;
            assert!(r.is_err(), "{}", String::from_utf8_lossy(answer));
        }
    }
}
