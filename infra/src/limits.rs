//! The connection limit and what each served connection is doing.
//!
//! At most `max_connections` client connections hold a [`Slot`] at once. A new client that
//! finds every slot taken closes the keep-alive connection idle the longest (no request in
//! progress, no byte of the next one read) and takes its slot; when no connection is idle it is
//! answered at once with `503 too_many_connections` and `Retry-After: 1` (a JSON body like
//! every other error) and closed, instead of queueing unseen in the kernel's backlog.
//!
//! Each slot carries a [`ConnState`]: the connection's [`Phase`] and since when. The connection
//! task (`crate::conn`) reads it to close connections that send their header block too slowly
//! (`header_read_timeout_ms`) or sit idle between requests (`keepalive_idle_timeout_ms`).
//!
//! ```text
//!   accept ──► admit ──► Headers ──(header block read)──► Busy ──(response written)──► Idle
//!                           ▲                                                          │
//!                           └────────────(first byte of the next request)──────────────┘
//!   Headers: closed header_read_timeout after it began.  Busy: never cut (long-polls).
//!   Idle: closed keepalive_idle_timeout after it began, or at once for a new client at the cap.
//! ```
//!
//! In any phase, a connection whose socket has taken none of its response for
//! `response_write_timeout_ms` is closed; and one whose socket has taken nothing for
//! `reply_stall_ms` is closed at once when a reply that does not fit in the budget wants
//! the room its own reply holds ([`ConnectionLimiter::cut_stalled_reply`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How long a new client at the cap waits for the idle connection it evicted to close before
/// it is refused after all (the evicted one closes at once unless a request raced in).
pub const EVICTION_WAIT: Duration = Duration::from_secs(1);

pub use crate::config::Timeouts;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reading a request header block: a new connection, or a keep-alive one whose next
    /// request has begun to arrive.
    Headers,
    /// A request is being served, its response not yet fully handed to the socket (this
    /// includes a long-poll consume waiting for messages).
    Busy,
    /// Keep-alive between requests: the last response is written, nothing of the next read.
    Idle,
}

/// Why the server closed a connection (the `reason` label of
/// `narad_http_connections_closed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// Its header block did not arrive within `header_read_timeout_ms`.
    HeaderTimeout,
    /// Idle between requests for `keepalive_idle_timeout_ms`.
    IdleTimeout,
    /// Idle when a new client arrived with every slot taken.
    EvictedIdle,
    /// The server is stopping and no request was in progress.
    Shutdown,
    /// The client read nothing of its response for `response_write_timeout_ms`.
    WriteTimeout,
    /// The client read nothing of its response for `reply_stall_ms`, and a reply that did
    /// not fit in the budget wanted the room it held.
    StalledReply,
}

impl CloseReason {
    /// The metric label; `None` for closes not counted (shutdown).
    pub fn label(self) -> Option<&'static str> {
        match self {
            Self::HeaderTimeout => Some("header_timeout"),
            Self::IdleTimeout => Some("idle_timeout"),
            Self::EvictedIdle => Some("evicted_idle"),
            Self::WriteTimeout => Some("write_timeout"),
            Self::StalledReply => Some("stalled_reply"),
            Self::Shutdown => None,
        }
    }

    pub const COUNTED: [&'static str; 5] = [
        "header_timeout",
        "idle_timeout",
        "evicted_idle",
        "write_timeout",
        "stalled_reply",
    ];
}

/// What the connection task should do next.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// Close the connection now.
    Close(CloseReason),
    /// Nothing is due before this instant (`None`: nothing is due until the state changes).
    Until(Option<Instant>),
}

#[derive(Debug)]
struct Inner {
    phase: Phase,
    since: Instant,
    in_flight: u32,
    /// A new client asked for this connection's slot while it was idle.
    evict: bool,
    /// Since when the socket has taken none of the bytes written to it.
    write_blocked: Option<Instant>,
    /// Its stalled response's room was wanted: close now.
    cut: bool,
    /// Closed for a response its client would not take: reset, so that the kernel drops
    /// what it still holds of it (an orphaned socket would keep it for minutes).
    abort: bool,
}

/// One connection's phase, shared by its IO wrapper, its service and the limiter.
#[derive(Debug)]
pub struct ConnState {
    inner: Mutex<Inner>,
    changed: Notify,
    /// Set when its slot is given up (the connection, and what it held, is gone).
    gone: std::sync::atomic::AtomicBool,
    /// Notified when `gone` is set.
    closed: Notify,
}

impl ConnState {
    fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                phase: Phase::Headers,
                since: Instant::now(),
                in_flight: 0,
                evict: false,
                write_blocked: None,
                cut: false,
                abort: false,
            }),
            changed: Notify::new(),
            gone: std::sync::atomic::AtomicBool::new(false),
            closed: Notify::new(),
        }
    }

    pub fn phase(&self) -> Phase {
        self.inner.lock().phase
    }

    /// HTTP begins (after a TLS handshake, which has its own timeout): the header clock starts.
    pub fn start_headers(&self) {
        let mut s = self.inner.lock();
        s.phase = Phase::Headers;
        s.since = Instant::now();
        drop(s);
        self.changed.notify_one();
    }

    /// Bytes arrived from the client: on an idle connection the next request has begun.
    pub fn bytes_read(&self) {
        let mut s = self.inner.lock();
        if s.phase == Phase::Idle {
            s.phase = Phase::Headers;
            s.since = Instant::now();
            drop(s);
            self.changed.notify_one();
        }
    }

    /// A write found the socket full (the client is not reading).
    pub fn write_blocked(&self) {
        let mut s = self.inner.lock();
        if s.write_blocked.is_none() {
            s.write_blocked = Some(Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }

    /// Whether the connection was closed for a response its client would not take (see
    /// `Inner::abort`).
    pub fn aborting(&self) -> bool {
        self.inner.lock().abort
    }

    /// As if a write had found the socket full at `at`.
    #[cfg(test)]
    pub(crate) fn stall_since(&self, at: Instant) {
        self.inner.lock().write_blocked = Some(at);
    }

    /// The socket took bytes again.
    pub fn write_progressed(&self) {
        self.inner.lock().write_blocked = None;
    }

    /// A header block was read and its request handed to the router. The connection task is
    /// not woken: a busy connection has no deadline, so the one it sleeps on can only come
    /// early (it then finds the connection busy and waits for the next change).
    pub fn request_started(&self) {
        let mut s = self.inner.lock();
        s.in_flight += 1;
        s.phase = Phase::Busy;
    }

    /// The response body was written out (or dropped with the connection). The connection
    /// task is not woken (this happens once per request, inside its own poll): the idle
    /// clock starts now, and the task, which re-checks a busy connection at least every
    /// `keepalive_idle`, finds it idle and sleeps until `since + keepalive_idle`.
    pub fn request_finished(&self) {
        let mut s = self.inner.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            s.phase = Phase::Idle;
            s.since = Instant::now();
        }
    }

    /// Resolves when a header block began, a write stalled, or an eviction was asked for
    /// since the last call (a change between a [`check`](Self::check) and this call is not
    /// lost). The end of a request does not resolve it (see [`Self::request_finished`]).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Whether the connection is due to close at `now` and, if not, when it next may be.
    /// `stopping`: the server is shutting down, so a connection still reading a header block
    /// is closed at once (its request would be refused anyway).
    pub fn check(&self, t: &Timeouts, now: Instant, stopping: bool) -> Check {
        let mut s = self.inner.lock();
        if s.evict && s.phase != Phase::Idle {
            // a request arrived before the eviction took effect: it stays
            s.evict = false;
        }
        let due = |at: Instant, why| {
            if at <= now {
                Check::Close(why)
            } else {
                Check::Until(Some(at))
            }
        };
        if s.cut {
            s.abort = true;
            return Check::Close(CloseReason::StalledReply);
        }
        // whatever the phase, a response (or what hyper still holds of one) may be stuck
        let stall_at = s.write_blocked.map(|since| since + t.write_stall);
        if stall_at.is_some_and(|at| at <= now) {
            s.abort = true;
            return Check::Close(CloseReason::WriteTimeout);
        }
        let by_phase = match s.phase {
            Phase::Busy => Check::Until(None),
            Phase::Headers if stopping => Check::Close(CloseReason::Shutdown),
            Phase::Headers => due(s.since + t.header_read, CloseReason::HeaderTimeout),
            Phase::Idle if s.evict => Check::Close(CloseReason::EvictedIdle),
            Phase::Idle => due(s.since + t.keepalive_idle, CloseReason::IdleTimeout),
        };
        match (by_phase, stall_at) {
            (Check::Until(None), at) => Check::Until(at),
            (Check::Until(Some(a)), Some(b)) => Check::Until(Some(a.min(b))),
            (other, _) => other,
        }
    }
}

/// Hands out at most `limit` slots; see the module docs.
#[derive(Debug)]
pub struct ConnectionLimiter {
    permits: Arc<Semaphore>,
    limit: usize,
    open: Mutex<HashMap<u64, Arc<ConnState>>>,
    next_id: AtomicU64,
}

/// What a new connection gets from [`ConnectionLimiter::try_admit`].
pub enum Admission {
    Admitted(Slot),
    /// An idle connection was asked to close; [`EvictionWait::slot`] waits for its slot.
    Evicting(EvictionWait),
    Refused,
}

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// A new client's place in the semaphore's queue, taken when it evicted an idle connection.
pub struct EvictionWait {
    limiter: Arc<ConnectionLimiter>,
    acquire: Acquire,
}

impl EvictionWait {
    /// The slot freed by the eviction, waiting up to [`EVICTION_WAIT`]; `None`: refuse.
    pub async fn slot(self) -> Option<Slot> {
        match tokio::time::timeout(EVICTION_WAIT, self.acquire).await {
            Ok(Ok(p)) => Some(self.limiter.slot(p)),
            _ => None,
        }
    }
}

/// A served connection's place under the limit; dropping it frees the place.
#[derive(Debug)]
pub struct Slot {
    id: u64,
    state: Arc<ConnState>,
    limiter: Arc<ConnectionLimiter>,
    _permit: OwnedSemaphorePermit,
}

impl Slot {
    pub fn state(&self) -> &Arc<ConnState> {
        &self.state
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // the permit (a field) is released after this, once the entry is gone
        self.limiter.open.lock().remove(&self.id);
        // (the connection task drops its slot after the connection and its response)
        self.state.gone.store(true, Ordering::Release);
        self.state.closed.notify_waiters();
    }
}

impl ConnectionLimiter {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(ConnState::new());
        self.open.lock().insert(id, state.clone());
        Slot {
            id,
            state,
            limiter: self.clone(),
            _permit: permit,
        }
    }

    /// Decides at once (in accept order) what a new connection gets: a free slot; else the
    /// connection idle the longest is asked to close and the client queues for a slot; else
    /// a refusal.
    pub fn try_admit(self: &Arc<Self>) -> Admission {
        // Outside tokio's cooperative budget: the accept loop calls this after running
        // through many ready accepts and ended connections, and a budgeted acquire then
        // answers Pending with permits free, which evicted an idle client under the cap.
        let mut acquire: Acquire = Box::pin(tokio::task::unconstrained(
            self.permits.clone().acquire_owned(),
        ));
        // One poll queues the client now: the semaphore hands a freed permit to the oldest
        // waiter, so the evicted connection's slot cannot go to a client accepted later.
        // (The waker is replaced when the wait is polled for real.)
        match acquire
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(p)) => return Admission::Admitted(self.slot(p)),
            Poll::Ready(Err(_)) => return Admission::Refused, // never closed
            Poll::Pending => {}
        }
        if self.evict_longest_idle() {
            Admission::Evicting(EvictionWait {
                limiter: self.clone(),
                acquire,
            })
        } else {
            Admission::Refused
        }
    }

    /// [`Self::try_admit`], then [`EvictionWait::slot`] if it evicted.
    pub async fn admit(self: &Arc<Self>) -> Option<Slot> {
        match self.try_admit() {
            Admission::Admitted(s) => Some(s),
            Admission::Evicting(wait) => wait.slot().await,
            Admission::Refused => None,
        }
    }

    /// Marks the longest-idle connection not yet marked for eviction; false if none is idle.
    fn evict_longest_idle(&self) -> bool {
        let open = self.open.lock();
        let victim = open
            .values()
            .filter_map(|c| {
                let s = c.inner.lock();
                (s.phase == Phase::Idle && !s.evict).then_some((s.since, c))
            })
            .min_by_key(|(since, _)| *since)
            .map(|(_, c)| c);
        let Some(c) = victim else {
            return false;
        };
        let mut s = c.inner.lock();
        if s.phase != Phase::Idle || s.evict {
            return false; // it woke up in between: rare, and the client is told to retry
        }
        s.evict = true;
        drop(s);
        c.changed.notify_one();
        true
    }

    /// Asks the connection whose socket has taken nothing of its response for longest, and
    /// for at least `min`, to close (it is not closed again if asked twice); resolves once it
    /// has, with what it held, or after `within`. False if no connection is stalled so long.
    pub async fn cut_stalled_reply(&self, min: Duration, within: Duration) -> bool {
        let now = Instant::now();
        let victim = {
            let open = self.open.lock();
            open.values()
                .filter_map(|c| {
                    let s = c.inner.lock();
                    let since = s.write_blocked?;
                    (!s.cut && now.saturating_duration_since(since) >= min).then_some((since, c))
                })
                .min_by_key(|(since, _)| *since)
                .map(|(_, c)| c.clone())
        };
        let Some(c) = victim else {
            return false;
        };
        let closed = c.closed.notified();
        let mut closed = std::pin::pin!(closed);
        closed.as_mut().enable();
        c.inner.lock().cut = true;
        c.changed.notify_one();
        if !c.gone.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(within, closed).await;
        }
        true
    }

    /// Resolves once every slot is free: all served connections have closed.
    pub async fn all_closed(&self) {
        let n = u32::try_from(self.limit).unwrap_or(u32::MAX);
        let _ = self.permits.acquire_many(n).await;
    }
}

/// The answer to a client refused at the cap, on a plaintext listener. Written to the socket
/// directly (the connection never reaches hyper), so the status line, `Retry-After` and body
/// are made here from the error table like every other error answer.
pub fn refusal_response(limit: usize) -> String {
    raw_error_response(
        narad_wire::ErrorCode::TooManyConnections,
        &format!("the server already serves {limit} connections (max_connections); retry later"),
    )
}

/// A whole HTTP/1.1 error response for `code`, closing the connection, for answers written
/// outside axum: the table's status and code, `Retry-After: 1` on a 503, and the JSON body.
pub fn raw_error_response(code: narad_wire::ErrorCode, message: &str) -> String {
    let status = crate::http::error::status_of(code);
    let body = serde_json::to_string(&narad_wire::ErrorBody::new(code, message))
        .expect("error body serialises");
    let retry = if code.http_status() == 503 {
        "retry-after: 1\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n{retry}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("Error"),
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header_read: Duration::from_secs(10),
        keepalive_idle: Duration::from_secs(60),
        write_stall: Duration::from_secs(30),
    };
    const HOUR: Duration = Duration::from_secs(3600);

    impl ConnState {
        fn set_since(&self, at: Instant) {
            self.inner.lock().since = at;
        }
    }

    #[tokio::test]
    async fn a_stalled_write_is_due_in_any_phase() {
        let l = ConnectionLimiter::new(1);
        let slot = l.admit().await.unwrap();
        let c = slot.state().clone();
        c.request_started();
        c.write_blocked();
        let t0 = c.inner.lock().write_blocked.unwrap();
        assert_eq!(
            c.check(&T, t0, false),
            Check::Until(Some(t0 + T.write_stall))
        );
        // progress stops the clock: a slow but steady reader is never cut
        c.write_progressed();
        assert_eq!(c.check(&T, t0 + HOUR, false), Check::Until(None));
        c.write_blocked();
        let t1 = c.inner.lock().write_blocked.unwrap();
        // hyper may hold the rest of a response after the request counts as finished
        c.request_finished();
        c.set_since(t1);
        assert_eq!(
            c.check(&T, t1, false),
            Check::Until(Some(t1 + T.write_stall))
        );
        assert!(!c.aborting(), "reset before its time");
        assert_eq!(
            c.check(&T, t1 + T.write_stall, false),
            Check::Close(CloseReason::WriteTimeout)
        );
        // closed for a response its client would not take: reset, so the kernel drops it
        assert!(c.aborting());
    }

    #[tokio::test]
    async fn phases_and_their_deadlines() {
        let l = ConnectionLimiter::new(1);
        let slot = l.admit().await.unwrap();
        let c = slot.state().clone();
        let t0 = Instant::now();
        c.set_since(t0);
        assert_eq!(
            c.check(&T, t0, false),
            Check::Until(Some(t0 + T.header_read))
        );
        assert_eq!(
            c.check(&T, t0 + T.header_read, false),
            Check::Close(CloseReason::HeaderTimeout)
        );
        // a request in progress (a long-poll) is never due
        c.request_started();
        assert_eq!(c.check(&T, t0 + HOUR, false), Check::Until(None));
        c.request_finished();
        assert_eq!(c.phase(), Phase::Idle);
        c.set_since(t0);
        assert_eq!(
            c.check(&T, t0, false),
            Check::Until(Some(t0 + T.keepalive_idle))
        );
        assert_eq!(
            c.check(&T, t0 + T.keepalive_idle, false),
            Check::Close(CloseReason::IdleTimeout)
        );
        // the first byte of the next request starts its header clock
        c.bytes_read();
        assert_eq!(c.phase(), Phase::Headers);
        c.set_since(t0);
        assert_eq!(
            c.check(&T, t0, false),
            Check::Until(Some(t0 + T.header_read))
        );
        // more bytes do not restart it
        c.bytes_read();
        assert_eq!(
            c.check(&T, t0 + T.header_read, false),
            Check::Close(CloseReason::HeaderTimeout)
        );
        assert_eq!(c.check(&T, t0, true), Check::Close(CloseReason::Shutdown));
    }

    /// The accept loop admits after draining many ready events, when its task may have
    /// spent tokio's cooperative budget: a free slot must still be taken at once, and no
    /// idle connection asked to close.
    #[tokio::test]
    async fn a_free_slot_is_taken_even_with_the_task_budget_spent() {
        let l = ConnectionLimiter::new(3);
        let idle = l.admit().await.unwrap();
        idle.state().request_started();
        idle.state().request_finished();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..10_000 {
            tx.send(i).unwrap();
        }
        let admitted = std::future::poll_fn(|cx| {
            // receive until the budget, not the channel, runs out
            let mut spent = false;
            for _ in 0..10_000 {
                if rx.poll_recv(cx).is_pending() {
                    spent = true;
                    break;
                }
            }
            assert!(spent, "the budget never ran out");
            Poll::Ready(matches!(l.try_admit(), Admission::Admitted(_)))
        })
        .await;
        assert!(admitted, "a free slot was not taken");
        assert!(
            !idle.state().inner.lock().evict,
            "an idle client was evicted under the cap"
        );
    }

    #[tokio::test]
    async fn a_new_client_at_the_cap_evicts_the_longest_idle_connection() {
        let l = ConnectionLimiter::new(3);
        let (a, b, c) = (
            l.admit().await.unwrap(),
            l.admit().await.unwrap(),
            l.admit().await.unwrap(),
        );
        // nobody idle: refused at once
        assert!(l.admit().await.is_none());
        for s in [&a, &b, &c] {
            s.state().request_started();
        }
        let t0 = Instant::now();
        b.state().request_finished();
        c.state().request_finished();
        b.state().set_since(t0 + Duration::from_millis(1));
        c.state().set_since(t0);
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.admit().await }
        });
        // c has been idle longest: it is asked to close, b is not
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.state().check(&T, t0, false) != Check::Close(CloseReason::EvictedIdle) {
            assert!(Instant::now() < deadline, "c never asked to close");
            tokio::task::yield_now().await;
        }
        assert!(matches!(b.state().check(&T, t0, false), Check::Until(_)));
        drop(c);
        let d = waiting
            .await
            .unwrap()
            .expect("the evicted slot goes to the new client");
        // b, woken by a request before its eviction took effect, keeps its slot; the next
        // client waits EVICTION_WAIT and is refused
        let waiting = tokio::spawn({
            let l = l.clone();
            async move { l.admit().await }
        });
        while !b.state().inner.lock().evict {
            assert!(Instant::now() < deadline, "b never asked to close");
            tokio::task::yield_now().await;
        }
        b.state().bytes_read();
        assert!(matches!(b.state().check(&T, t0, false), Check::Until(_)));
        assert!(waiting.await.unwrap().is_none());
        drop((a, b, d));
        l.all_closed().await;
    }

    #[test]
    fn the_refusal_is_the_tables_answer() {
        let r = refusal_response(7);
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nretry-after: 1\r\n"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
        let b: narad_wire::ErrorBody = serde_json::from_str(body).unwrap();
        assert_eq!(
            b.known_code(),
            Some(narad_wire::ErrorCode::TooManyConnections)
        );
        assert!(b.error.contains("7 connections"), "{}", b.error);
        // a code that is not a 503 gets its own status line and no Retry-After
        let r = raw_error_response(narad_wire::ErrorCode::BodyTimeout, "late");
        assert!(r.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{r}");
        assert!(!r.contains("retry-after"), "{r}");
    }
}
