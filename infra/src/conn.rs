//! Serving the API listener: the accept loop and one task per connection.
//!
//! ```text
//!   accept ──► limits::ConnectionLimiter::admit ──► (TLS handshake, ≤ 10 s) ──► serve_connection
//!                  └─ no slot: 503 too_many_connections (plaintext) or close (TLS)
//!   serve_connection: hyper http1 ◄── Watched io (bytes read → ConnState)
//!                       │ service: request → Busy, response body dropped → Idle
//!                       └ watchdog: ConnState::check → close on header/idle timeout,
//!                                   eviction, or shutdown
//! ```
//!
//! A connection closed for a response its client would not take (`response_write_timeout_ms`,
//! or `reply_stall_ms` when a reply wanted its room) is reset (`SO_LINGER` 0), so that the
//! kernel drops what it still held of the response at once: closed normally, the socket
//! lives on as an orphan probing a closed window for minutes with megabytes of it (a
//! black-box review counted 137 such orphans holding ~797 MiB of kernel memory after 20 s of
//! a reader opening one every 0.1 s; reset, none and 1.5 MiB).
//!
//! hyper's own `header_read_timeout` is not used: in hyper 1.x its clock starts as soon as a
//! keep-alive connection waits for its next request, so it cannot tell an idle keep-alive
//! connection (allowed `keepalive_idle_timeout_ms`) from a slow header block.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::Service as _;

use crate::http::access::PeerAddr;
use crate::limits::{
    Admission, Check, CloseReason, ConnState, ConnectionLimiter, Phase, Slot, Timeouts,
};
use crate::metrics::CloseLabels;

/// What every connection task needs.
pub struct Serving {
    pub router: Router,
    /// The API's state, for the routes served without the router ([`crate::http::hot`]);
    /// `None` on a listener that serves only its router (metrics).
    pub hot: Option<crate::http::SharedState>,
    pub limiter: Arc<ConnectionLimiter>,
    pub tls: Option<Arc<crate::tls::Tls>>,
    pub timeouts: Timeouts,
    pub refused: Counter,
    pub closed: Family<CloseLabels, Counter>,
}

/// Accepts until `stopping`, then waits for every connection task to end (in-flight
/// requests finish; idle connections close at once). The connection tasks are this task's
/// own: none outlives it, and one that panics is logged here.
pub async fn serve(
    listener: TcpListener,
    serving: Arc<Serving>,
    stopping: CancellationToken,
) -> io::Result<()> {
    // consecutive failed accepts: logged on the first and then every 100th (5 s apart at
    // the 50 ms back-off), so a long shortage neither floods the log nor goes unseen
    let mut failures = 0u64;
    let mut conns = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = stopping.cancelled() => break,
            Some(ended) = conns.join_next() => {
                log_panic(ended);
                continue;
            }
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: the pending connection stays in
                    // the listen backlog, so retrying at once would spin. Back off, keep
                    // serving the connections already open (their requests give descriptors
                    // back), and say so.
                    if failures.is_multiple_of(100) {
                        tracing::error!(
                            error = %e,
                            out_of_descriptors = narad_core::log::is_out_of_descriptors(&e),
                            failures = failures + 1,
                            "accept failed; backing off"
                        );
                    }
                    failures += 1;
                    // a back-off against the kernel's descriptor table, in real time: no
                    // clock of the broker's is involved and no test drives it
                    #[allow(clippy::disallowed_methods)]
                    let back_off = tokio::time::sleep(Duration::from_millis(50));
                    tokio::select! {
                        () = stopping.cancelled() => break,
                        () = back_off => {}
                    }
                    continue;
                }
            },
        };
        if failures > 0 {
            tracing::info!(failures, "accepting again");
            failures = 0;
        }
        let _ = stream.set_nodelay(true);
        let (serving, stopping) = (serving.clone(), stopping.clone());
        let admission = serving.limiter.try_admit();
        conns.spawn(async move {
            let slot = match admission {
                Admission::Admitted(slot) => Some(slot),
                Admission::Evicting(wait) => wait.slot().await,
                Admission::Refused => None,
            };
            let Some(slot) = slot else {
                serving.refused.inc();
                refuse(stream, &serving).await;
                return;
            };
            match &serving.tls {
                None => serve_connection(stream, peer, slot, &serving, stopping).await,
                Some(tls) => {
                    if let Some(stream) = tls.handshake(stream, peer).await {
                        serve_connection(stream, peer, slot, &serving, stopping).await;
                    }
                }
            }
        });
    }
    drop(listener);
    while let Some(ended) = conns.join_next().await {
        log_panic(ended);
    }
    Ok(())
}

/// A connection task that panicked (a bug in a handler) takes only its connection down: it
/// is logged, and the node stays ready.
fn log_panic(ended: Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended
        && e.is_panic()
    {
        tracing::error!(error = %e, "a connection task panicked; its connection was dropped");
    }
}

/// A client beyond the cap: a plaintext 503 (on a TLS port the client expects a handshake,
/// so it is just closed).
async fn refuse(mut stream: TcpStream, serving: &Serving) {
    if serving.tls.is_some() {
        return;
    }
    let resp = crate::limits::refusal_response(serving.limiter.limit());
    let _ = stream.write_all(resp.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Serves HTTP/1.1 on one connection until the client closes it or its [`ConnState`] says to.
async fn serve_connection<I>(
    io: I,
    peer: SocketAddr,
    slot: Slot,
    serving: &Serving,
    stopping: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + TcpSocket + 'static,
{
    let state = slot.state().clone();
    state.start_headers();
    let service = {
        let (router, hot, state) = (serving.router.clone(), serving.hot.clone(), state.clone());
        hyper::service::service_fn(move |req| {
            state.request_started();
            let guard = InFlight(state.clone());
            call(router.clone(), hot.clone(), guard, peer, req)
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(None);
    let conn = builder.serve_connection(
        TokioIo::new(Watched {
            inner: io,
            state: state.clone(),
        }),
        service,
    );
    let mut conn = std::pin::pin!(conn);
    let t = serving.timeouts;
    let mut stopped = false;
    // One timer for the connection's life, moved as its deadline moves: most moves are later
    // (the next request's header clock), which tokio takes without touching its timer wheel.
    let mut timer = std::pin::pin!(connection_deadline(Instant::now() + t.keepalive_idle));
    let mut armed: Option<Instant> = None;
    // Set once hyper was asked to close an idle connection: the latest it may take to do so
    // unless a request that raced in is still being served.
    let mut closing: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let wake = match closing {
            Some(by) => (state.phase() != Phase::Busy).then_some(by),
            None => match state.check(&t, now, stopped) {
                // a busy connection is re-checked after `keepalive_idle`: the end of its
                // request does not wake this task (see `ConnState::request_finished`)
                Check::Until(at) => Some(at.unwrap_or(now + t.keepalive_idle)),
                Check::Close(why) => {
                    if let Some(reason) = why.label() {
                        serving.closed.get_or_create(&CloseLabels { reason }).inc();
                    }
                    tracing::debug!(%peer, ?why, "closing connection");
                    match why {
                        CloseReason::HeaderTimeout
                        | CloseReason::WriteTimeout
                        | CloseReason::StalledReply
                        | CloseReason::Shutdown => return,
                        // hyper closes an idle connection at once, after flushing what it holds
                        CloseReason::IdleTimeout | CloseReason::EvictedIdle => {
                            conn.as_mut().graceful_shutdown();
                            closing = Some(now + t.header_read);
                            continue;
                        }
                    }
                }
            },
        };
        if wake.is_some_and(|w| w <= now) && closing.is_some() {
            return;
        }
        if let Some(w) = wake
            && armed != Some(w)
        {
            timer.as_mut().reset(w);
            armed = Some(w);
        }
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            () = stopping.cancelled(), if !stopped => {
                stopped = true;
                conn.as_mut().graceful_shutdown();
            }
            () = state.changed() => {}
            () = timer.as_mut(), if wake.is_some() => armed = None,
        }
    }
}

/// Wakes the watchdog at a connection's next header, idle or write deadline. These measure a
/// client's slowness in real (monotonic) time, which no test moves by hand: the allowed
/// exception to the ban on raw sleeps.
#[allow(clippy::disallowed_methods)]
fn connection_deadline(at: Instant) -> tokio::time::Sleep {
    tokio::time::sleep_until(at)
}

/// Marks its request finished when dropped: held by the response body, which hyper drops once
/// the body is written (or with the connection).
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

async fn call(
    mut router: Router,
    hot: Option<crate::http::SharedState>,
    guard: InFlight,
    peer: SocketAddr,
    mut req: hyper::Request<Incoming>,
) -> Result<axum::response::Response, Infallible> {
    req.extensions_mut().insert(ConnectInfo(PeerAddr(peer)));
    if let Some(state) = &hot
        && crate::http::sqs::is_sqs(req.method(), req.uri().path(), req.headers())
    {
        let resp = crate::http::sqs::serve(state, req.map(Body::new)).await;
        return Ok(resp.map(|body| {
            Body::new(body.map_frame(move |frame| {
                let _held = &guard;
                frame
            }))
        }));
    }
    let hot = hot.and_then(|state| {
        let (route, topic) = crate::http::hot::route(req.method(), req.uri().path())?;
        Some((state, route, topic.to_owned()))
    });
    let resp = match hot {
        Some((state, route, topic)) => {
            crate::http::hot::serve_hot(&state, route, topic, req.map(Body::new)).await
        }
        None => router.call(req).await?,
    };
    Ok(resp.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _held = &guard;
            frame
        }))
    }))
}

/// The TCP socket under a connection's stream (plaintext or TLS).
trait TcpSocket {
    fn tcp(&self) -> &TcpStream;
}

impl TcpSocket for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl TcpSocket for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// The connection's IO, telling its [`ConnState`] when bytes arrive.
struct Watched<I: TcpSocket> {
    inner: I,
    state: Arc<ConnState>,
}

impl<I: TcpSocket> Drop for Watched<I> {
    fn drop(&mut self) {
        if self.state.aborting() {
            // a reset: the kernel drops the unsent rest of the response at once
            let _ = socket2::SockRef::from(self.inner.tcp()).set_linger(Some(Duration::ZERO));
        }
    }
}

impl<I: AsyncRead + Unpin + TcpSocket> AsyncRead for Watched<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.bytes_read();
        }
        r
    }
}

impl<I: TcpSocket> Watched<I> {
    /// A write the socket would not take starts the stall clock; one it took stops it.
    fn note_write(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.state.write_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.state.write_progressed(),
            Poll::Ready(_) => {}
        }
    }
}

impl<I: AsyncWrite + Unpin + TcpSocket> AsyncWrite for Watched<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.note_write(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.note_write(&r);
        r
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
