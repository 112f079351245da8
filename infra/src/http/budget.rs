//! The node-wide budget of request bytes in flight.
//!
//! Every request body is counted against one semaphore of bytes while its request is being
//! served, chunk by chunk as it arrives; plus what decompression inflates it to; plus the
//! replies of consume and replay, held until the socket has taken them. When the budget is
//! spent the request is answered `503 server_busy` with `Retry-After`, instead of many
//! concurrent 16 MiB batches growing the process without bound. A produce whose
//! `Content-Length` (capped at its route's body limit) does not fit in what is free when the
//! handler starts reading it — after the caller's permission was checked — is answered so
//! before a byte of its body is read.
//!
//! Bytes are counted as they arrive, not reserved as announced: a reservation for bytes not
//! yet sent costs its client nothing, and a black-box review held the whole budget with
//! sixteen connections announcing 16 MiB and sending 3 bytes, reconnecting as each was cut
//! (every produce, consume and replay `503` 99.7% of the time). Counted as they arrive,
//! holding the budget takes sending it.
//!
//! No one user (with security on) may hold more than a quarter of the budget (at least one
//! largest body): routes that need a body's content to
//! check a permission (create a topic, change one's password) count it as it arrives, so
//! without this one authenticated user with no grants could fill the budget and starve every
//! producer.
//!
//! A body must also arrive whole within `body_read_timeout_ms` of the request's start, and,
//! after `body_grace_ms`, keep arriving at `body_min_bytes_per_s` on average: a client that
//! sends its body slowly, or stops, costs bounded time (`408 body_timeout`): one that stops
//! is cut at the grace, not the timeout.

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use narad_wire::ErrorCode;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{ApiError, SharedState};

/// The budget: bytes of request bodies (read or inflated) and replies held by requests being
/// served, node-wide and per principal.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    limit: usize,
    /// Most one principal may hold.
    per_principal: usize,
    /// Bytes each principal holds now (entries go when they reach 0).
    holders: Arc<Mutex<HashMap<String, usize>>>,
    /// The part of the budget replies may hold (`None`: all of it), and its size.
    replies: Option<(Arc<Semaphore>, usize)>,
    /// The connections whose stalled replies may be closed to make room for a new one, and
    /// how long a reply must have been stalled (`reply_stall_ms`).
    stalled: Option<(Arc<crate::limits::ConnectionLimiter>, std::time::Duration)>,
}

/// Bytes taken from the budget for one principal; given back when dropped.
#[derive(Debug)]
pub struct Taken {
    permit: Option<OwnedSemaphorePermit>,
    n: usize,
    principal: String,
    holders: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut holders = self.holders.lock();
        if let Some(used) = holders.get_mut(&self.principal) {
            *used = used.saturating_sub(self.n);
            if *used == 0 {
                holders.remove(&self.principal);
            }
        }
    }
}

/// What one request holds, and for whom (`None`: security is off, no per-user cap);
/// released when the request has been answered.
#[derive(Debug, Clone)]
pub struct Held {
    principal: Option<String>,
    inner: Arc<HeldInner>,
}

#[derive(Debug, Default)]
struct HeldInner {
    taken: Mutex<Vec<Taken>>,
    /// The handler read the request's body to its end.
    body_read: AtomicBool,
}

impl Held {
    pub fn new(principal: Option<String>) -> Self {
        Self {
            principal,
            inner: Arc::default(),
        }
    }

    /// Adds `taken` to what the request holds: into its last holding when they are the same
    /// principal's (a body counted chunk by chunk holds one permit, not one per chunk: a
    /// client sending a byte at a time must not make the server keep a record per byte).
    fn add(&self, mut taken: Taken) {
        let mut held = self.inner.taken.lock();
        if let Some(last) = held.last_mut()
            && last.principal == taken.principal
            && let (Some(into), Some(p)) = (last.permit.as_mut(), taken.permit.take())
        {
            into.merge(p);
            last.n += std::mem::take(&mut taken.n);
            return;
        }
        held.push(taken);
    }

    pub fn release(&self) {
        self.inner.taken.lock().clear();
    }

    /// Whether the handler read the request's body to its end (false for a route that
    /// reads none, and for a body it stopped reading: too large, too slow, budget spent).
    pub fn body_read(&self) -> bool {
        self.inner.body_read.load(Ordering::Relaxed)
    }
}

/// Returned by a body that did not arrive within `body_read_timeout_ms`, or fell behind
/// `body_min_bytes_per_s` after `body_grace_ms`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
pub struct BodyTimeout;

/// Returned by a body whose next chunk does not fit in the budget.
#[derive(Debug, thiserror::Error)]
#[error("the server's budget of request bytes in flight is spent")]
pub struct BudgetSpent;

impl BodyBudget {
    /// A budget of `limit` bytes, of which one principal may hold `per_principal`.
    pub fn new(limit: usize, per_principal: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(limit.min(Semaphore::MAX_PERMITS))),
            limit,
            per_principal,
            holders: Arc::default(),
            replies: None,
            stalled: None,
        }
    }

    /// Replies may hold no more than `share` of the budget together (one larger than that
    /// takes all of it, so it waits for none but is served only when no other reply holds
    /// any).
    pub fn with_reply_share(mut self, share: usize) -> Self {
        let share = share.clamp(1, self.limit.min(Semaphore::MAX_PERMITS));
        self.replies = Some((Arc::new(Semaphore::new(share)), share));
        self
    }

    /// A reply that finds no room closes the connection of `limiter` whose socket has taken
    /// nothing of its own reply for longest (at least `stall`), and takes what it held,
    /// instead of answering `503` while readers that read nothing hold the budget.
    pub fn with_stalled_replies(
        mut self,
        limiter: Arc<crate::limits::ConnectionLimiter>,
        stall: std::time::Duration,
    ) -> Self {
        self.stalled = Some((limiter, stall));
        self
    }

    /// Bytes held by requests now.
    pub fn in_use(&self) -> usize {
        self.limit - self.bytes.available_permits()
    }

    fn try_take(&self, principal: &Option<String>, n: usize) -> Result<Option<Taken>, BudgetSpent> {
        if n == 0 {
            return Ok(None);
        }
        let mut holders = self.holders.lock();
        let key = principal.as_deref().unwrap_or("");
        let used = holders.get(key).copied().unwrap_or(0);
        if principal.is_some() && used + n > self.per_principal {
            return Err(BudgetSpent);
        }
        let units = u32::try_from(n).map_err(|_| BudgetSpent)?;
        let permit = self
            .bytes
            .clone()
            .try_acquire_many_owned(units)
            .map_err(|_| BudgetSpent)?;
        *holders.entry(key.to_owned()).or_default() += n;
        Ok(Some(Taken {
            permit: Some(permit),
            n,
            principal: key.to_owned(),
            holders: self.holders.clone(),
        }))
    }

    /// `n` bytes of the replies' share (all of it when `n` is larger), if free now.
    fn try_share(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let (replies, size) = self.replies.as_ref()?;
        let units = u32::try_from(n.min(*size)).ok()?;
        replies.clone().try_acquire_many_owned(units).ok()
    }

    /// Whether `principal` may hold `n` more bytes under its own cap.
    fn within_principal_cap(&self, principal: &Option<String>, n: usize) -> bool {
        let Some(key) = principal else {
            return true;
        };
        self.holders.lock().get(key).copied().unwrap_or(0) + n <= self.per_principal
    }

    /// Whether `n` more bytes would fit now for `principal` (taking nothing).
    fn fits(&self, principal: &Option<String>, n: usize) -> bool {
        self.bytes.available_permits() >= n && self.within_principal_cap(principal, n)
    }

    /// Counts `n` more bytes (decompressed output, say) for the request that holds `held`.
    pub fn reserve(&self, held: &Held, n: usize) -> Result<(), ApiError> {
        if let Some(t) = self.try_take(&held.principal, n).map_err(|_| spent())? {
            held.add(t);
        }
        Ok(())
    }
}

/// A reply of `text` (JSON), its bytes held against the budget for as long as they exist:
/// the permit lives inside the reply's buffer, which hyper keeps until the socket has taken
/// it (or the connection is dropped). Replies are request memory too, and many concurrent
/// large replies must not grow the process without bound. Replies together hold no more than
/// their share of the budget (see `with_reply_share`), so readers that leave them unread
/// cannot take the room every producer needs; and a reply that finds no room closes the
/// connections of such readers (see `with_stalled_replies`), one at a time for up to
/// [`ROOM_WAIT`], before it is answered `503 server_busy`.
pub async fn reply(
    budget: &BodyBudget,
    held: &Held,
    status: axum::http::StatusCode,
    text: String,
) -> Result<Response, ApiError> {
    let (taken, share) = if text.is_empty() {
        (None, None) // (an empty reply holds nothing)
    } else {
        room_for_reply(budget, held, text.len()).await?
    };
    let body = Bytes::from_owner(HeldBytes {
        bytes: text.into_bytes(),
        _held: taken,
        _share: share,
    });
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// `n` (> 0) bytes of the budget and of the replies' share for a reply; if there is no room,
/// closes the connections of readers that stopped reading theirs, one at a time, for up to
/// [`ROOM_WAIT`].
async fn room_for_reply(
    budget: &BodyBudget,
    held: &Held,
    n: usize,
) -> Result<(Option<Taken>, Option<OwnedSemaphorePermit>), ApiError> {
    if n > budget.limit {
        return Err(spent()); // (no room could ever be made)
    }
    let mut share: Option<OwnedSemaphorePermit> = None;
    let mut taken: Option<Taken> = None;
    let mut until: Option<tokio::time::Instant> = None;
    loop {
        if budget.replies.is_some() && share.is_none() {
            share = budget.try_share(n);
        }
        let shared = share.is_some() || budget.replies.is_none();
        if shared && taken.is_none() {
            taken = budget.try_take(&held.principal, n).ok().flatten();
        }
        if shared && taken.is_some() {
            return Ok((taken, share));
        }
        // Readers that stopped reading may hold the room (a black-box review: 74 replay
        // requests of a few hundred bytes, their replies never read, kept every other
        // reader at 503 for a minute): close the connection stalled longest, then look
        // again. Not for a caller over its own cap: others' readers do not hold that room.
        let now = tokio::time::Instant::now();
        let until = *until.get_or_insert(now + ROOM_WAIT);
        let Some((limiter, stall)) = &budget.stalled else {
            return Err(spent());
        };
        if now >= until
            || !budget.within_principal_cap(&held.principal, n)
            || !limiter.cut_stalled_reply(*stall, until - now).await
        {
            return Err(spent());
        }
    }
}

/// How long a reply that finds no room may wait while the connections of stalled readers are
/// closed to make it (each closes within milliseconds once asked).
pub const ROOM_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Reply bytes with the budget they hold (released when the last reference is dropped).
struct HeldBytes {
    bytes: Vec<u8>,
    _held: Option<Taken>,
    /// Its part of the replies' share.
    _share: Option<OwnedSemaphorePermit>,
}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

pub fn spent() -> ApiError {
    ApiError::new(
        ErrorCode::ServerBusy,
        "the server holds as many request bytes as it may (max_request_bytes_in_flight); retry shortly",
    )
}

/// Counts the request's body against the budget while the request is served: returns the
/// holding, to be released once the response is made.
/// `route`: the route's path pattern, `None` for a request no route matched.
pub fn limit(state: &SharedState, req: &mut Request, route: Option<&str>) -> Held {
    let held = Held::new(principal(req));
    // Only produce routes check up front that their announced body fits, and never for more
    // than the route reads (a larger one is refused 413 once that much has arrived: answering
    // before the client has sent its body would leave most clients a broken pipe instead of
    // the 413).
    let announced = match body_limit(state, req.method(), route) {
        // a route that reads no body: nothing to count or time
        (0, _) => None,
        (limit, true) => Some(content_length(req.headers()).unwrap_or(0).min(limit)),
        (_, false) => Some(0),
    };
    if let Some(announced) = announced {
        let inner = std::mem::replace(req.body_mut(), Body::empty());
        let cfg = &state.cfg;
        let start = tokio::time::Instant::now();
        *req.body_mut() = Body::new(Budgeted {
            inner,
            budget: state.body_budget.clone(),
            held: held.clone(),
            announced,
            pace: Pace {
                due: start + std::time::Duration::from_millis(cfg.body_read_timeout_ms),
                grace: std::time::Duration::from_millis(cfg.body_grace_ms),
                grace_end: None,
                min_rate: cfg.body_min_bytes_per_s,
                received: 0,
            },
            deadline: None,
            small: Vec::new(),
            next: None,
        });
    }
    req.extensions_mut().insert(held.clone());
    held
}

/// A request that asks to hear back before it sends its body (`Expect: 100-continue`) and
/// announces more than its route reads is answered 413 at once, so the client never uploads
/// what would be refused (RFC 9110, 10.1.1). Without `Expect`, the body is read up to the
/// limit first: answering before the client has sent its body would leave most clients a
/// broken pipe instead of the 413.
pub fn refuse_announced_overflow(
    state: &SharedState,
    req: &Request,
    route: Option<&str>,
) -> Option<ApiError> {
    let expects = req
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if !expects {
        return None;
    }
    let (limit, _) = body_limit(state, req.method(), route);
    let announced = content_length(req.headers())?;
    (limit > 0 && announced > limit).then(|| {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("request body exceeds {limit} bytes (announced {announced})"),
        )
    })
}

/// Whom a request's bytes are counted for: its user (`None` with security off).
fn principal(req: &Request) -> Option<String> {
    req.extensions()
        .get::<super::access::Caller>()
        .and_then(|c| c.username())
        .map(str::to_owned)
}

/// The largest body the matched route reads (0 for routes that read none, and unknown ones),
/// and whether its `Content-Length` is taken from the budget up front. Only the produce
/// routes do that: they read the body after checking the caller's produce grant, so only a
/// producer can hold budget for bytes it has not sent yet. The other routes read small JSON
/// bodies (whose content they need for the permission check) and are counted as they arrive.
fn body_limit(
    state: &SharedState,
    method: &axum::http::Method,
    route: Option<&str>,
) -> (usize, bool) {
    match (method.as_str(), route) {
        ("POST", Some("/v1/topics/{topic}/produce/batch")) => (state.cfg.max_batch_bytes, true),
        ("POST", Some("/v1/topics/{topic}/produce")) => (super::MAX_BODY_LIMIT, true),
        // (the SQS endpoint: signed requests, read whole before the signature is checked)
        ("POST", Some(narad_sqs::ops::PATH)) => (narad_sqs::limits::MAX_REQUEST_BYTES, false),
        // (admins only: another cluster's users, read after the caller is checked)
        ("PUT", Some("/v1/carried-users")) => (narad_auth::carry::MAX_CARRY_BYTES, false),
        ("POST" | "PUT" | "PATCH", Some(_)) => (super::MAX_JSON_BODY, false),
        _ => (0, false),
    }
}

fn content_length(h: &HeaderMap) -> Option<usize> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Chunks smaller than this are copied together before they are handed on.
const GATHER: usize = 16 * 1024;

/// A request body that takes budget for every chunk as it arrives.
struct Budgeted {
    inner: Body,
    budget: BodyBudget,
    held: Held,
    /// The `Content-Length` (≤ the route's limit) of a produce: at the first read, it must
    /// fit in what is free, else `503` before any of the body is read.
    announced: usize,
    /// How fast the body must arrive.
    pace: Pace,
    /// Small chunks copied together, up to `GATHER` bytes (see `poll_frame`); its capacity
    /// grows with them.
    small: Vec<u8>,
    /// A frame that came after gathered chunks (a large one, or trailers), for the next poll.
    next: Option<Frame<Bytes>>,
    /// A timer for the pace's next deadline, made only once the body keeps the handler
    /// waiting (most bodies have arrived whole with their headers and never need one).
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// When a body's bytes must have arrived: all of them by `due`; after `grace_end`,
/// `min_rate` bytes a second more (so each byte received buys `1 / min_rate` s).
#[derive(Debug, Clone, Copy)]
struct Pace {
    due: tokio::time::Instant,
    grace: std::time::Duration,
    /// `grace` after the handler first asked for the body: when it takes budget for it (and
    /// when a client that sent `Expect: 100-continue` is told to send it).
    grace_end: Option<tokio::time::Instant>,
    /// Bytes a second (0: only `due`).
    min_rate: u64,
    received: u64,
}

impl Pace {
    /// The time by which more of the body must have arrived.
    fn deadline(&self) -> tokio::time::Instant {
        if self.min_rate == 0 {
            return self.due;
        }
        // (received ≤ 2^64 and rate ≥ 1: the quotient of nanoseconds fits a u128 easily)
        let ns = u128::from(self.received) * 1_000_000_000 / u128::from(self.min_rate);
        let bought = std::time::Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX));
        self.grace_end
            .and_then(|end| end.checked_add(bought))
            .map_or(self.due, |t| t.min(self.due))
    }
}

impl Budgeted {
    /// Counts a chunk that arrived: budget and pace.
    fn count(&mut self, n: usize) -> Result<(), BudgetSpent> {
        self.pace.received = self.pace.received.saturating_add(n as u64);
        if let Some(t) = self.budget.try_take(&self.held.principal, n)? {
            self.held.add(t);
        }
        Ok(())
    }

    /// The small chunks gathered so far, as one frame.
    fn gathered(&mut self) -> Frame<Bytes> {
        Frame::data(Bytes::from(std::mem::take(&mut self.small)))
    }

    fn ready(&mut self, frame: Frame<Bytes>) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        if http_body::Body::is_end_stream(self) {
            // (a reader that stops at the announced length never polls for the end)
            self.held.inner.body_read.store(true, Ordering::Relaxed);
        }
        Poll::Ready(Some(Ok(frame)))
    }
}

impl http_body::Body for Budgeted {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(next) = this.next.take() {
            return this.ready(next);
        }
        if this.pace.grace_end.is_none() {
            this.pace.grace_end = tokio::time::Instant::now().checked_add(this.pace.grace);
        }
        if this.announced > 0 {
            // the handler has begun to read: would the whole announced body fit now? (Taken
            // as it arrives: a body that does not fit by then, after others took the room,
            // is 503 part-way)
            let n = std::mem::take(&mut this.announced);
            if !this.budget.fits(&this.held.principal, n) {
                return Poll::Ready(Some(Err(Box::new(BudgetSpent))));
            }
        }
        loop {
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) if this.small.is_empty() => {
                    this.held.inner.body_read.store(true, Ordering::Relaxed);
                    return Poll::Ready(None);
                }
                Poll::Ready(None) => {
                    let frame = this.gathered();
                    return this.ready(frame);
                }
                Poll::Pending => {
                    let due = this.pace.deadline();
                    // a client's slowness, in real (monotonic) time: no clock of the broker's
                    #[allow(clippy::disallowed_methods)]
                    let deadline = this
                        .deadline
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                    if deadline.deadline() != due {
                        // bytes arrived since it was set: the body has bought more time
                        deadline.as_mut().reset(due);
                    }
                    return match deadline.as_mut().poll(cx) {
                        Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout)))),
                        Poll::Pending => Poll::Pending,
                    };
                }
            };
            let Some(data) = frame.data_ref() else {
                // trailers, after what was gathered
                if this.small.is_empty() {
                    return this.ready(frame);
                }
                this.next = Some(frame);
                let frame = this.gathered();
                return this.ready(frame);
            };
            if let Err(e) = this.count(data.len()) {
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            // A chunk is a slice of the connection's read buffer and keeps all of it alive:
            // a body sent a byte at a time held ~1.2 KiB per byte that the budget did not see
            // (a black-box review: +800 MiB RSS, 0.74 MiB counted). Small chunks are copied
            // together instead; a large one, or the whole body at once, goes as it is.
            if this.small.is_empty() && (data.len() >= GATHER || this.inner.is_end_stream()) {
                return this.ready(frame);
            }
            if data.len() >= GATHER {
                this.next = Some(frame);
                let frame = this.gathered();
                return this.ready(frame);
            }
            // (grown as bytes arrive, so it never holds more than twice what was counted:
            // 16 KiB made for each of a few bytes from ten thousand connections was 160 MiB
            // the budget did not see)
            this.small.extend_from_slice(data);
            if this.small.len() >= GATHER || this.inner.is_end_stream() {
                let frame = this.gathered();
                return this.ready(frame);
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.small.is_empty() && self.next.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let waiting = self
            .next
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, Bytes::len);
        let gathered = (self.small.len() + waiting) as u64;
        hint.set_lower(hint.lower() + gathered);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + gathered);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_byte_received_buys_time_after_the_grace() {
        use std::time::Duration;
        let start = tokio::time::Instant::now();
        let mut pace = Pace {
            due: start + Duration::from_secs(60),
            grace: Duration::from_secs(5),
            grace_end: Some(start + Duration::from_secs(5)),
            min_rate: 1000,
            received: 0,
        };
        // nothing yet: cut at the end of the grace
        assert_eq!(pace.deadline(), start + Duration::from_secs(5));
        pace.received = 1500;
        assert_eq!(pace.deadline(), start + Duration::from_millis(6500));
        // never past the whole body's timeout
        pace.received = 10_000_000;
        assert_eq!(pace.deadline(), start + Duration::from_secs(60));
        pace.received = u64::MAX;
        pace.min_rate = 1;
        assert_eq!(pace.deadline(), start + Duration::from_secs(60));
        // no rate: the timeout alone
        pace.received = 0;
        pace.min_rate = 0;
        assert_eq!(pace.deadline(), start + Duration::from_secs(60));
    }

    fn budgeted(budget: &BodyBudget, frames: Vec<Frame<Bytes>>) -> (Budgeted, Held) {
        let held = Held::new(None);
        let stream =
            futures_util::stream::iter(frames.into_iter().map(Ok::<_, std::convert::Infallible>));
        let start = tokio::time::Instant::now();
        let body = Budgeted {
            inner: Body::new(http_body_util::StreamBody::new(stream)),
            budget: budget.clone(),
            held: held.clone(),
            announced: 0,
            pace: Pace {
                due: start + std::time::Duration::from_secs(60),
                grace: std::time::Duration::from_secs(5),
                grace_end: None,
                min_rate: 0,
                received: 0,
            },
            deadline: None,
            small: Vec::new(),
            next: None,
        };
        (body, held)
    }

    /// What `body` yields: its data frames' lengths, the bytes, and whether trailers came last.
    async fn drain(mut body: Budgeted) -> (Vec<usize>, Vec<u8>, bool) {
        use http_body_util::BodyExt as _;
        let (mut sizes, mut bytes, mut trailers) = (Vec::new(), Vec::new(), false);
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            assert!(!trailers, "a frame after the trailers");
            match frame.into_data() {
                Ok(d) => {
                    sizes.push(d.len());
                    bytes.extend_from_slice(&d);
                }
                Err(f) => trailers = f.is_trailers(),
            }
        }
        (sizes, bytes, trailers)
    }

    #[tokio::test]
    async fn small_chunks_are_gathered_and_large_ones_pass() {
        let budget = BodyBudget::new(1 << 30, 1 << 30);
        // a byte at a time: copied together, GATHER bytes a frame, all counted
        let want: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let frames = want
            .iter()
            .map(|&b| Frame::data(Bytes::copy_from_slice(&[b])))
            .collect();
        let (body, held) = budgeted(&budget, frames);
        let (sizes, bytes, _) = drain(body).await;
        assert_eq!(bytes, want);
        assert_eq!(sizes, [GATHER, GATHER, 40_000 - 2 * GATHER]);
        assert_eq!(budget.in_use(), 40_000);
        assert!(held.body_read());
        held.release();
        // a large chunk goes as it is, after what was gathered before it; trailers too
        let mut trailer = HeaderMap::new();
        trailer.insert("x-t", "1".parse().unwrap());
        let frames = vec![
            Frame::data(Bytes::from_static(b"ab")),
            Frame::data(Bytes::from(vec![7u8; GATHER + 1])),
            Frame::data(Bytes::from_static(b"c")),
            Frame::trailers(trailer),
        ];
        let (body, held) = budgeted(&budget, frames);
        let (sizes, bytes, trailers) = drain(body).await;
        assert_eq!(sizes, [2, GATHER + 1, 1]);
        assert_eq!(&bytes[..2], b"ab");
        assert_eq!(bytes[GATHER + 3], b'c');
        assert!(trailers);
        assert!(held.body_read());
        held.release();
        // the whole body in one small chunk (its end known with it) is handed on, not copied
        let one = Bytes::from_static(b"{\"whole\":1}");
        let (mut body, held) = budgeted(&budget, Vec::new());
        body.inner = Body::new(http_body_util::Full::new(one.clone()));
        let got = http_body_util::BodyExt::frame(&mut body)
            .await
            .unwrap()
            .unwrap()
            .into_data()
            .unwrap();
        assert_eq!(got.as_ptr(), one.as_ptr(), "copied");
        assert!(held.body_read());
        held.release();
        // a few bytes gathered hold a buffer of about their size, not of GATHER bytes
        let pieces = (0..3)
            .map(|_| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"z"))));
        let open = futures_util::StreamExt::chain(
            futures_util::stream::iter(pieces),
            futures_util::stream::pending(),
        );
        let (mut body, held) = budgeted(&budget, Vec::new());
        body.inner = Body::new(http_body_util::StreamBody::new(open));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(http_body::Body::poll_frame(Pin::new(&mut body), &mut cx).is_pending());
        assert_eq!(body.small.len(), 3);
        assert!(body.small.capacity() <= 16, "{}", body.small.capacity());
        assert_eq!(budget.in_use(), 3);
        drop(body);
        held.release();
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn replies_hold_no_more_than_their_share() {
        let b = BodyBudget::new(1000, 1000).with_reply_share(700);
        let held = Held::new(None);
        let ok = axum::http::StatusCode::OK;
        let first = reply(&b, &held, ok, "x".repeat(600)).await.unwrap();
        assert!(
            reply(&b, &held, ok, "x".repeat(200)).await.is_err(),
            "past the share"
        );
        // what is left beyond the share is the bodies'
        let body = Held::new(None);
        b.reserve(&body, 400).unwrap();
        body.release();
        drop(first);
        assert_eq!(b.in_use(), 0);
        // a reply larger than the share takes all of it
        let large = reply(&b, &held, ok, "x".repeat(800)).await.unwrap();
        assert_eq!(b.in_use(), 800);
        assert!(reply(&b, &held, ok, "x".to_owned()).await.is_err());
        drop(large);
        assert_eq!(b.in_use(), 0);
        reply(&b, &held, ok, "x".to_owned()).await.unwrap();
    }

    /// A connection as its task runs it: closed when its state says so, dropping what it
    /// holds (its unread reply) and then its slot.
    fn serve_until_closed(
        slot: crate::limits::Slot,
        unread: Response,
    ) -> tokio::task::JoinHandle<crate::limits::CloseReason> {
        use crate::limits::{Check, Timeouts};
        let t = Timeouts {
            header_read: std::time::Duration::from_secs(10),
            keepalive_idle: std::time::Duration::from_secs(60),
            write_stall: std::time::Duration::from_secs(60),
        };
        tokio::spawn(async move {
            let state = slot.state().clone();
            loop {
                if let Check::Close(why) = state.check(&t, tokio::time::Instant::now(), false) {
                    drop(unread);
                    drop(slot);
                    return why;
                }
                state.changed().await;
            }
        })
    }

    const STALL: std::time::Duration = std::time::Duration::from_secs(1);

    #[tokio::test]
    async fn a_reply_without_room_closes_the_reader_stalled_longest() {
        use crate::limits::{CloseReason, ConnectionLimiter};
        let limiter = ConnectionLimiter::new(8);
        let b = BodyBudget::new(1000, 1000)
            .with_reply_share(700)
            .with_stalled_replies(limiter.clone(), STALL);
        let ok = axum::http::StatusCode::OK;
        let held = Held::new(None);
        // two readers that read nothing hold the share, the first stalled since longer
        let ms = std::time::Duration::from_millis;
        let ago = |d| tokio::time::Instant::now().checked_sub(d).unwrap();
        let mut readers = Vec::new();
        for stalled in [ms(500), ms(400)] {
            let slot = limiter.admit().await.unwrap();
            let unread = reply(&b, &held, ok, "x".repeat(300)).await.unwrap();
            slot.state().request_started();
            slot.state().stall_since(ago(stalled));
            readers.push((slot, unread));
        }
        // one that reads (slowly) holds the rest
        let slot = limiter.admit().await.unwrap();
        let reading = reply(&b, &held, ok, "x".repeat(100)).await.unwrap();
        slot.state().write_blocked();
        slot.state().write_progressed();
        let (slow, slow_reply) = (slot, reading);
        // not stalled for STALL yet: 503 at once
        let t = std::time::Instant::now();
        assert!(reply(&b, &held, ok, "y".repeat(250)).await.is_err());
        assert!(t.elapsed() < ROOM_WAIT / 2, "it waited {:?}", t.elapsed());
        readers[0].0.state().stall_since(ago(STALL + ms(200)));
        readers[1].0.state().stall_since(ago(STALL + ms(100)));
        let (second, first) = (readers.pop().unwrap(), readers.pop().unwrap());
        let first = serve_until_closed(first.0, first.1);
        let second = serve_until_closed(second.0, second.1);
        // the reader stalled longest is closed and its room taken; no other
        let got = reply(&b, &held, ok, "y".repeat(250)).await.unwrap();
        assert_eq!(first.await.unwrap(), CloseReason::StalledReply);
        assert!(!second.is_finished());
        assert_eq!(b.in_use(), 300 + 100 + 250);
        // a caller over its own cap closes no one
        let b2 = BodyBudget::new(1000, 100).with_stalled_replies(limiter.clone(), STALL);
        let alice = Held::new(Some("alice".into()));
        let mine = reply(&b2, &alice, ok, "z".repeat(100)).await.unwrap();
        assert!(reply(&b2, &alice, ok, "z".to_owned()).await.is_err());
        assert!(!second.is_finished());
        drop((mine, got));
        // a reader that reads, however slowly, is never closed so: the next stalled one is
        let more = reply(&b, &held, ok, "y".repeat(400)).await.unwrap();
        assert_eq!(second.await.unwrap(), CloseReason::StalledReply);
        assert!(reply(&b, &held, ok, "y".repeat(400)).await.is_err());
        assert_eq!(b.in_use(), 100 + 400);
        drop((more, slow_reply, slow));
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn a_body_counted_a_byte_at_a_time_holds_one_permit() {
        let b = BodyBudget::new(1000, 250);
        let held = Held::new(Some("a".into()));
        for _ in 0..200 {
            b.reserve(&held, 1).unwrap();
        }
        assert_eq!(held.inner.taken.lock().len(), 1);
        assert_eq!(b.in_use(), 200);
        assert_eq!(b.holders.lock()["a"], 200);
        assert!(b.fits(&Some("a".into()), 50));
        assert!(!b.fits(&Some("a".into()), 51), "past the principal's share");
        assert!(b.fits(&None, 800));
        assert!(!b.fits(&None, 801), "past the node's budget");
        held.release();
        assert_eq!(b.in_use(), 0);
        assert!(b.holders.lock().is_empty());
    }

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let b = BodyBudget::new(1000, 1000);
        let (one, two) = (Held::new(Some("a".into())), Held::new(Some("b".into())));
        b.reserve(&one, 600).unwrap();
        assert_eq!(b.in_use(), 600);
        assert!(b.reserve(&two, 500).is_err());
        b.reserve(&two, 400).unwrap();
        assert!(b.reserve(&one, 1).is_err());
        one.release();
        assert_eq!(b.in_use(), 400);
        b.reserve(&two, 600).unwrap();
        two.release();
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn one_principal_holds_at_most_its_share() {
        let b = BodyBudget::new(1000, 250);
        let (a1, a2, other) = (
            Held::new(Some("a".into())),
            Held::new(Some("a".into())),
            Held::new(Some("b".into())),
        );
        b.reserve(&a1, 200).unwrap();
        // another request of the same principal shares its cap
        assert!(b.reserve(&a2, 100).is_err());
        b.reserve(&a2, 50).unwrap();
        b.reserve(&other, 250).unwrap();
        a1.release();
        b.reserve(&a2, 200).unwrap();
        a2.release();
        other.release();
        assert_eq!(b.in_use(), 0);
        assert!(
            b.holders.lock().is_empty(),
            "entries of principals holding nothing stay"
        );
        // security off: no per-user cap
        let open = Held::new(None);
        b.reserve(&open, 900).unwrap();
        open.release();
    }
}
