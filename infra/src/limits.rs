//! The connection limit: at most `max_connections` client connections are served at once.
//! One more is answered at once with `503 too_many_connections` and `Retry-After: 1` (a JSON
//! body like every other error) and closed, instead of queueing unseen in the kernel's backlog.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A listener that hands out at most `limit` connections at a time.
pub struct LimitedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    limit: usize,
    refused: prometheus_client::metrics::counter::Counter,
    /// Answer a refused connection with a plaintext HTTP 503 (not on a TLS port, where the
    /// client expects a handshake: there it is just closed).
    http_refusal: bool,
}

impl LimitedListener {
    /// Refused connections are closed without the plaintext 503 (for a TLS listener).
    pub fn without_http_refusal(mut self) -> Self {
        self.http_refusal = false;
        self
    }

    pub fn new(
        inner: TcpListener,
        limit: usize,
        refused: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        Self {
            inner,
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            refused,
            http_refusal: true,
        }
    }
}

/// A served connection; dropping it (hyper closes the connection) frees its slot.
pub struct LimitedStream {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (mut stream, addr) = match self.inner.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // out of file descriptors and the like: say so, back off, keep serving
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    return (
                        LimitedStream {
                            inner: stream,
                            _permit: permit,
                        },
                        addr,
                    );
                }
                Err(_) if !self.http_refusal => {
                    self.refused.inc();
                    drop(stream);
                }
                Err(_) => {
                    self.refused.inc();
                    let limit = self.limit;
                    tokio::spawn(async move {
                        let body = format!(
                            "{{\"error\":\"the server already serves {limit} connections (max_connections); retry later\",\"code\":\"too_many_connections\"}}"
                        );
                        let resp = format!(
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(resp.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    });
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}
