//! The sender: ships remote children's records to their remotes (the broker's
//! [`RemoteShipper`]).
//!
//! - **Lanes**: a slab is split into the child's lanes (1..=8) by FNV-1a-32 of the key, keyless
//!   records by parent offset. Within a lane records keep their order and one request is in
//!   flight; lanes go at once. So records of one key reach the target in the order they were
//!   written (one lane, sequential requests, and the target puts a key in one partition).
//! - **Chunks**: each request is the target's batch produce, at most [`CHUNK_RECORDS`] records
//!   and [`CHUNK_BYTES`] of JSON (a larger record goes alone), zstd-compressed. Payloads go as
//!   base64 (exact bytes); every record carries its origin in the [`ORIGIN_HEADER`] header.
//! - **Commit-before-advance**: `ship` resolves `Ok` only when every lane's every chunk was
//!   answered `202`; the cursor moves only then. A failure reports which lanes were done, so
//!   the retry sends only the others; a crash in between means duplicates on the target,
//!   never a gap.
//! - **Answers** map to the link states (`auth_failed`, `forbidden`, `target_missing`,
//!   `rejected_record`, `record_too_large`, `throttled`, `unavailable`, `loop_detected`,
//!   `target_replaced` when the target topic's incarnation is not the one attached to, ...);
//!   nothing the target writes is logged beyond its status and error code.
//! - **Gate** (circuit breaker), one per remote on each node: see [`Gate`].

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use narad_core::broker::{
    Broker, CatalogSync, ORIGIN_HEADER, ORIGIN_TIME_HEADER, ProgressRefused, ProgressUpdate,
    RemoteShipper, ShipBatch, ShipFailure, SyncRefused, VIA_HEADER,
};
use narad_core::catalog::{RemoteChild, RemoteMeta};
use narad_core::record::Record;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::client::{ClientError, RemoteClient, Reply};
use crate::guard::GuardConfig;
use crate::seal::CredentialKeys;

/// Most records in one request.
pub const CHUNK_RECORDS: usize = 1000;
/// Most JSON bytes in one request (before compression); a larger record goes alone.
pub const CHUNK_BYTES: usize = 960 << 10;
/// One request's deadline, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most requests in flight to one remote from one node.
pub const MAX_IN_FLIGHT: usize = 16;
/// Transient failures in a row (over a remote's lanes) that open its gate.
pub const FAILURES_TO_OPEN: u32 = 3;
/// First and largest wait of an open gate.
pub const GATE_MIN: Duration = Duration::from_millis(250);
pub const GATE_MAX: Duration = Duration::from_secs(30);
/// How long a refused credential keeps the gate shut, and the longest `Retry-After` honoured.
pub const AUTH_WAIT: Duration = Duration::from_secs(30);
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The wait after an answer that needs someone to act (a refused record, a missing topic,
/// a refused destination): the link stays stopped, looking again this often.
pub const STOPPED_WAIT: Duration = Duration::from_secs(30);

/// The sender's metrics (labels from a fixed set: bounded whatever the remotes).
#[derive(Debug, Default)]
pub struct SenderMetrics {
    /// Requests to remotes by outcome: `accepted`, or the link state a failure means.
    pub requests: Family<OutcomeLabel, Counter>,
    /// Records remotes accepted.
    pub records: Counter,
    /// Remotes whose gate is open on this node.
    pub gates_open: Gauge,
    /// Users lists sent to remotes with `carry_users`, by outcome (`carried`, or why not).
    pub users_carries: Family<OutcomeLabel, Counter>,
    /// Remotes with `carry_users` whose last carry from this node failed.
    pub users_carry_failing: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

impl SenderMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "narad_remote_requests",
            "requests to remotes (batch produce), by outcome: accepted or the link state a failure means",
            self.requests.clone(),
        );
        r.register(
            "narad_remote_records",
            "records remote children shipped and their remotes accepted",
            self.records.clone(),
        );
        r.register(
            "narad_remote_gates_open",
            "remotes whose gate (circuit breaker) is open on this node: one probe per backoff step goes out",
            self.gates_open.clone(),
        );
        r.register(
            "narad_remote_users_carries",
            "users lists sent to remotes with carry_users, by outcome: carried, auth_failed, refused, unreachable or too_large",
            self.users_carries.clone(),
        );
        r.register(
            "narad_remote_users_carry_failing",
            "remotes with carry_users whose last carry from this node failed (see GET /v1/remotes/{name})",
            self.users_carry_failing.clone(),
        );
    }
}

/// FNV-1a, 32 bits.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The lane of `record` among `lanes`.
pub fn lane_of(record: &Record, lanes: u8) -> usize {
    let n = u32::from(lanes.max(1));
    match &record.key {
        Some(k) if !k.is_empty() => (fnv1a32(k) % n) as usize,
        _ => (record.offset % u64::from(n)) as usize,
    }
}

/// A uniformly random duration in `0..=max` (full jitter).
fn jitter(max: Duration) -> Duration {
    let ms = max.as_millis().max(1) as u64;
    Duration::from_millis(narad_core::random_u64() % (ms + 1))
}

/// How a failure weighs on the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Weight {
    /// The remote as a whole refuses (401, 429, TLS): the gate opens at once.
    RemoteWide,
    /// One request failed (timeout, 5xx, reset): three in a row open the gate.
    Transient,
    /// The answer is about this link or record (403, 404, a refused record): the gate is
    /// not concerned; the link stops until someone acts.
    Link,
}

/// One request's failure.
#[derive(Debug, Clone)]
struct Failed {
    state: &'static str,
    message: String,
    weight: Weight,
    retry_after: Option<Duration>,
    /// The parent offset of the record the target refused.
    blocked: Option<u64>,
}

/// A remote's gate on this node: a circuit breaker. Closed, requests flow. A remote-wide
/// failure, or [`FAILURES_TO_OPEN`] transient ones in a row, open it; while open, cursors
/// read nothing and exactly one probe goes out per backoff step (0.25 s doubling to 30 s,
/// full jitter; 30 s after a refused credential; the target's `Retry-After`, at most 60 s,
/// after a 429). The first accepted request closes it.
#[derive(Debug)]
pub struct Gate {
    inner: Mutex<GateState>,
    /// Requests in flight to the remote from this node, over every lane of every cursor:
    /// at most [`MAX_IN_FLIGHT`] (so the first failure of an outage costs a bounded burst).
    slots: tokio::sync::Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            slots: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        }
    }
}

#[derive(Debug, Default)]
struct GateState {
    /// Set while open: no request before this.
    open_until: Option<Instant>,
    /// Backoff steps taken since it opened.
    step: u32,
    consecutive: u32,
    /// A probe is out (since then): no other request until it answers, or until it is
    /// surely lost (its request's deadline passed well ago).
    probing: Option<Instant>,
    state: &'static str,
    message: String,
    /// Requests sent since the gate last opened (for the breaker tests and metrics).
    opened_total: u64,
}

/// What the gate lets a ship do.
enum Admit {
    /// Closed: every lane may go.
    Open,
    /// Open, and this caller holds the step's single probe: one request only.
    Probe,
}

impl Gate {
    fn admit(&self) -> Result<Admit, (Duration, &'static str, String)> {
        let mut g = self.inner.lock();
        let Some(until) = g.open_until else {
            return Ok(Admit::Open);
        };
        let now = Instant::now();
        let probe_out = g
            .probing
            .is_some_and(|since| now < since + REQUEST_TIMEOUT * 2);
        if now < until || probe_out {
            let wait = until.saturating_duration_since(now).max(GATE_MIN);
            return Err((wait, g.state, g.message.clone()));
        }
        g.probing = Some(now);
        Ok(Admit::Probe)
    }

    fn success(&self) {
        let mut g = self.inner.lock();
        if g.open_until.is_some() {
            tracing::info!(target: "narad_xregion", "remote reachable again: gate closed");
        }
        *g = GateState {
            opened_total: g.opened_total,
            ..GateState::default()
        };
    }

    /// Records `f`; returns how long the caller waits before its retry.
    fn failure(&self, f: &Failed, probe: bool) -> Duration {
        let mut g = self.inner.lock();
        if probe {
            g.probing = None;
        }
        if f.weight == Weight::Link {
            // the remote answered: it is reachable, whatever it said of this link (a gate
            // left open here held back the very request that would set the link right, such
            // as the target's follow to a new epoch)
            if probe && g.open_until.is_some() {
                tracing::info!(target: "narad_xregion", "remote reachable again: gate closed");
                *g = GateState {
                    opened_total: g.opened_total,
                    ..GateState::default()
                };
            }
            return STOPPED_WAIT;
        }
        g.consecutive += 1;
        let opens = f.weight == Weight::RemoteWide || g.consecutive >= FAILURES_TO_OPEN;
        if !opens {
            // a lane's own backoff, 250 ms to 2 s
            let cap = GATE_MIN * 2u32.saturating_pow(g.consecutive.saturating_sub(1));
            return jitter(cap.min(Duration::from_secs(2))).max(Duration::from_millis(50));
        }
        if g.open_until.is_some() {
            g.step = g.step.saturating_add(1);
        } else {
            g.opened_total += 1;
        }
        let backoff = match f.retry_after {
            Some(d) => d.min(MAX_RETRY_AFTER),
            None if f.state == "auth_failed" => AUTH_WAIT,
            None => jitter(
                GATE_MIN
                    .saturating_mul(2u32.saturating_pow(g.step.min(16)))
                    .min(GATE_MAX),
            )
            .max(Duration::from_millis(50)),
        };
        g.open_until = Some(Instant::now() + backoff);
        g.state = f.state;
        g.message = f.message.clone();
        backoff
    }

    /// Whether the gate is open (requests held back).
    pub fn is_open(&self) -> bool {
        self.inner.lock().open_until.is_some()
    }

    /// While open and no probe may go yet (or one is out): how long until one may.
    fn wait(&self) -> Option<Duration> {
        let g = self.inner.lock();
        let until = g.open_until?;
        let now = Instant::now();
        let probe_out = g
            .probing
            .is_some_and(|since| now < since + REQUEST_TIMEOUT * 2);
        (now < until || probe_out).then(|| until.saturating_duration_since(now).max(GATE_MIN))
    }
}

/// The sender: one per node, for every remote child whose parent partitions the node serves.
pub struct Sender {
    broker: Weak<Broker>,
    keys: Option<Arc<CredentialKeys>>,
    guard: GuardConfig,
    /// A client per remote (id), rebuilt when the remote's version changes.
    clients: Mutex<HashMap<u64, (u64, Arc<RemoteClient>)>>,
    gates: Mutex<HashMap<u64, Arc<Gate>>>,
    metrics: Arc<SenderMetrics>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl Sender {
    pub fn new(
        broker: Weak<Broker>,
        keys: Option<Arc<CredentialKeys>>,
        guard: GuardConfig,
        metrics: Arc<SenderMetrics>,
    ) -> Arc<Self> {
        Arc::new(Self {
            broker,
            keys,
            guard,
            clients: Mutex::new(HashMap::new()),
            gates: Mutex::new(HashMap::new()),
            metrics,
        })
    }

    /// Counts one request's outcome, and the gates open now.
    fn count(&self, outcome: &'static str) {
        self.metrics
            .requests
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    fn count_gates(&self) {
        let open = self.gates.lock().values().filter(|g| g.is_open()).count();
        self.metrics.gates_open.set(open as i64);
    }

    /// The gate of remote `remote_id` on this node.
    pub fn gate(&self, remote_id: u64) -> Arc<Gate> {
        self.gates.lock().entry(remote_id).or_default().clone()
    }

    /// A client for `remote` (the one this node keeps for it), or why not.
    pub fn remote_client(&self, remote: &RemoteMeta) -> Result<Arc<RemoteClient>, String> {
        self.client(remote).map_err(|f| f.message)
    }

    fn client(&self, remote: &RemoteMeta) -> Result<Arc<RemoteClient>, Failed> {
        if let Some((v, c)) = self.clients.lock().get(&remote.id)
            && *v == remote.version
        {
            return Ok(c.clone());
        }
        let Some(keys) = &self.keys else {
            return Err(Failed {
                state: "auth_failed",
                message: "this node has no cluster_secret to open the remote's password".into(),
                weight: Weight::Link,
                retry_after: None,
                blocked: None,
            });
        };
        let c = crate::remote::client(remote, keys, &self.guard, REQUEST_TIMEOUT)
            .map(Arc::new)
            .map_err(|e| Failed {
                state: e.state(),
                message: e.to_string(),
                weight: Weight::Link,
                retry_after: None,
                blocked: None,
            })?;
        self.clients
            .lock()
            .insert(remote.id, (remote.version, c.clone()));
        Ok(c)
    }

    async fn ship_batch(self: Arc<Self>, batch: ShipBatch) -> Result<(), ShipFailure> {
        let child = batch.child.clone();
        let lanes = usize::from(child.lanes.max(1));
        let mut done = if batch.done.len() == lanes {
            batch.done.clone()
        } else {
            vec![false; lanes]
        };
        let fail = |f: Failed, wait: Duration, done: Vec<bool>| ShipFailure {
            state: f.state,
            message: f.message,
            retry_in: wait,
            done,
            blocked: f.blocked,
        };
        let remote = self
            .broker
            .upgrade()
            .and_then(|b| b.remote(&child.remote).ok())
            .filter(|r| r.id == child.remote_id);
        let Some(remote) = remote else {
            let f = Failed {
                state: "destination_refused",
                message: format!("remote '{}' is gone", child.remote),
                weight: Weight::Link,
                retry_after: None,
                blocked: None,
            };
            return Err(fail(f, STOPPED_WAIT, done));
        };
        let client = match self.client(&remote) {
            Ok(c) => c,
            Err(f) => return Err(fail(f, STOPPED_WAIT, done)),
        };
        let gate = self.gate(remote.id);
        let probe = match gate.admit() {
            Ok(Admit::Open) => false,
            Ok(Admit::Probe) => true,
            Err((wait, state, message)) => {
                return Err(ShipFailure {
                    state,
                    message,
                    retry_in: wait,
                    done,
                    blocked: None,
                });
            }
        };
        let mut by_lane: Vec<Vec<&Arc<Record>>> = vec![Vec::new(); lanes];
        for r in &batch.records {
            by_lane[lane_of(r, child.lanes)].push(r);
        }
        let origin = |r: &Record| {
            format!(
                "{:016x}/{:016x}/{}/{}",
                batch.cluster_id, child.parent_id, batch.parent_partition, r.offset
            )
        };
        let path = format!("v1/topics/{}/produce/batch", child.remote_topic);
        let link = format!(
            "{:016x}/{:016x}/{}{}",
            batch.cluster_id,
            child.parent_id,
            batch.epoch,
            if batch.tail { "/tail" } else { "" }
        );
        let chunks: Vec<(usize, Vec<Chunk>)> = by_lane
            .iter()
            .enumerate()
            .filter(|(i, recs)| !done[*i] && !recs.is_empty())
            .map(|(i, recs)| (i, encode_chunks(recs, &origin, batch.now_ms)))
            .collect();
        // lanes with nothing to send are done
        for (i, recs) in by_lane.iter().enumerate() {
            if recs.is_empty() {
                done[i] = true;
            }
        }
        let mut pending = chunks;
        if probe && !pending.is_empty() {
            // one request while the gate is open: the first chunk of the first lane
            let head = pending[0].1.remove(0);
            let sent = {
                let _slot = gate.slots.acquire().await;
                send_chunk(&client, &path, &link, &child, head).await
            };
            self.count(sent.as_ref().map_or_else(
                |f| f.state,
                |n| {
                    self.metrics.records.inc_by(*n as u64);
                    "accepted"
                },
            ));
            match sent.map(|_| ()) {
                Ok(()) => gate.success(),
                Err(f) => {
                    let wait = gate.failure(&f, true);
                    self.count_gates();
                    return Err(fail(f, wait, done));
                }
            }
        }
        let results = futures_util::future::join_all(pending.into_iter().map(|(lane, bodies)| {
            let (client, path, link, child, this, gate) = (
                client.clone(),
                path.clone(),
                link.clone(),
                child.clone(),
                self.clone(),
                gate.clone(),
            );
            async move {
                for body in bodies {
                    // a lane whose earlier chunk failed has returned already; while the
                    // gate is open, no lane gets this far (admit refused the ship)
                    let sent = {
                        let _slot = gate.slots.acquire().await;
                        send_chunk(&client, &path, &link, &child, body).await
                    };
                    match sent {
                        Ok(n) => {
                            this.count("accepted");
                            this.metrics.records.inc_by(n as u64);
                        }
                        Err(f) => {
                            this.count(f.state);
                            return (lane, Err(f));
                        }
                    }
                }
                (lane, Ok(()))
            }
        }))
        .await;
        let mut worst: Option<Failed> = None;
        for (lane, r) in results {
            match r {
                Ok(()) => done[lane] = true,
                Err(f) => {
                    let worse = worst.as_ref().is_none_or(|w| {
                        narad_core::broker::state_rank(f.state)
                            > narad_core::broker::state_rank(w.state)
                    });
                    if worse {
                        worst = Some(f);
                    }
                }
            }
        }
        let outcome = match worst {
            None => {
                gate.success();
                Ok(())
            }
            Some(f) => {
                let wait = gate.failure(&f, false);
                Err(fail(f, wait, done))
            }
        };
        self.count_gates();
        outcome
    }
}

impl Sender {
    /// Remote child `child`'s remote and a client for it, or why not.
    fn link_client(&self, child: &RemoteChild) -> Result<(RemoteMeta, Arc<RemoteClient>), String> {
        let remote = self
            .broker
            .upgrade()
            .and_then(|b| b.remote(&child.remote).ok())
            .filter(|r| r.id == child.remote_id)
            .ok_or_else(|| format!("remote '{}' is gone", child.remote))?;
        let client = self.client(&remote).map_err(|f| f.message)?;
        Ok(((*remote).clone(), client))
    }

    /// Brings the target topic to the parent's settings and schema versions (`POST
    /// .../mirror` with them: the target is, or becomes, the parent's mirror at its epoch).
    async fn sync_catalog(self: Arc<Self>, u: CatalogSync) -> Result<(), SyncRefused> {
        let refused = |message: String| SyncRefused {
            schema: false,
            followed: false,
            message,
        };
        let child = u.child.clone();
        let (remote, client) = self.link_client(&child).map_err(refused)?;
        // through the remote's gate like a batch (nothing goes while it is open)
        let gate = self.gate(remote.id);
        if gate.is_open() {
            return Err(refused("the remote's gate is open".into()));
        }
        // the newest versions that fit one request (the target holds the older ones, or
        // says which it lacks)
        let mut versions = Vec::new();
        let mut bytes = 0usize;
        for v in u.schemas.iter().rev() {
            let text = v.schema.to_string();
            bytes += text.len() + 32;
            if bytes > SYNC_SCHEMA_BYTES && !versions.is_empty() {
                break;
            }
            versions.push(serde_json::json!({"version": v.version, "schema": v.schema}));
        }
        versions.reverse();
        let c = &u.config;
        let body = serde_json::json!({
            "source_cluster": format!("{:016x}", u.cluster_id),
            "source_topic": format!("{:016x}", child.parent_id),
            "epoch": u.epoch,
            "settings": {
                "visibility_timeout_ms": c.visibility_timeout_ms,
                "retention_ms": c.retention_ms,
                "retention_bytes": c.retention_bytes,
                "delay_ms": c.delay_ms,
                "max_message_bytes": c.max_message_bytes,
                "key_policy": c.key_policy,
            },
            "schemas": versions,
            "children": u.children,
        });
        let path = format!("v1/topics/{}/mirror", child.remote_topic);
        let reply = {
            let _slot = gate.slots.acquire().await;
            client
                .request(
                    hyper::Method::POST,
                    &path,
                    Some(Bytes::from(body.to_string())),
                )
                .await
                .map_err(|e| refused(e.to_string()))?
        };
        let code = code_of(&reply);
        let status = reply.status.as_u16();
        if status == 200 {
            // (settings it could not take are said in the answer)
            let settings_error = serde_json::from_slice::<serde_json::Value>(&reply.body)
                .ok()
                .and_then(|v| {
                    v["settings_error"]
                        .as_str()
                        .map(|s| s.chars().take(200).collect::<String>())
                });
            return match settings_error {
                Some(e) => Err(SyncRefused {
                    schema: false,
                    followed: true,
                    message: format!("the remote did not take the settings: {e}"),
                }),
                None => Ok(()),
            };
        }
        Err(SyncRefused {
            schema: code.as_deref() == Some("schema_incompatible"),
            followed: false,
            message: match code {
                Some(c) => format!(
                    "bringing the target's settings and schemas to the parent's: the remote answered {status} {c}"
                ),
                None => format!(
                    "bringing the target's settings and schemas to the parent's: the remote answered {status}"
                ),
            },
        })
    }

    /// Sends one parent partition's consumer progress (`POST .../progress`), through the
    /// remote's gate like a batch (nothing goes while it is open).
    async fn send_progress(self: Arc<Self>, u: ProgressUpdate) -> Result<(), ProgressRefused> {
        let refused = |message: String| ProgressRefused {
            fenced: false,
            message,
        };
        let child = u.child.clone();
        let (remote, client) = self.link_client(&child).map_err(refused)?;
        let gate = self.gate(remote.id);
        if gate.is_open() {
            return Err(refused("the remote's gate is open".into()));
        }
        let link = format!(
            "{:016x}/{:016x}/{}{}",
            u.cluster_id,
            child.parent_id,
            u.epoch,
            if u.tail { "/tail" } else { "" }
        );
        let body = serde_json::json!({
            "partition": u.parent_partition,
            "frontier": u.progress.frontier,
            "acked": u.progress.acked,
            "end": u.end.end,
            "shipped": u.end.shipped,
            "leased": u.end.leased,
            "unreturned": u.end.unreturned,
            "partitions": u.end.partitions,
            "returned": u.returned,
            "children": u.progress.children,
            "children_returned": u.progress.children_returned,
        });
        let path = format!("v1/topics/{}/progress", child.remote_topic);
        let reply = {
            let _slot = gate.slots.acquire().await;
            client
                .post_link_json(&path, Bytes::from(body.to_string()), child.target_id, &link)
                .await
                .map_err(|e| refused(e.to_string()))?
        };
        let code = code_of(&reply);
        match reply.status.as_u16() {
            204 => Ok(()),
            s => Err(ProgressRefused {
                fenced: s == 409 && code.as_deref() == Some("fenced"),
                message: match code {
                    Some(c) => format!("the remote answered {s} {c}"),
                    None => format!("the remote answered {s}"),
                },
            }),
        }
    }
}

/// Most schema text one settings-and-schemas request carries.
const SYNC_SCHEMA_BYTES: usize = 768 << 10;

/// The broker's handle on the [`Sender`].
pub struct Shipper(pub Arc<Sender>);

impl RemoteShipper for Shipper {
    fn ship(
        &self,
        batch: ShipBatch,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ShipFailure>> + Send>> {
        Box::pin(self.0.clone().ship_batch(batch))
    }

    fn gate_wait(&self, remote_id: u64) -> Option<Duration> {
        self.0.gates.lock().get(&remote_id)?.wait()
    }

    fn sync_catalog(
        &self,
        sync: CatalogSync,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), SyncRefused>> + Send>> {
        Box::pin(self.0.clone().sync_catalog(sync))
    }

    fn send_progress(
        &self,
        update: ProgressUpdate,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ProgressRefused>> + Send>>
    {
        Box::pin(self.0.clone().send_progress(update))
    }
}

/// One request's body (zstd-compressed JSON) and the parent offsets of its records.
type Chunk = (Bytes, Vec<u64>);

/// The records of one lane as request bodies (zstd-compressed JSON), in order.
fn encode_chunks(
    records: &[&Arc<Record>],
    origin: &dyn Fn(&Record) -> String,
    now_ms: i64,
) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut body = String::with_capacity(64 << 10);
    let mut offsets = Vec::new();
    let mut count = 0;
    let start = |body: &mut String| {
        body.clear();
        body.push_str("{\"messages\":[");
    };
    start(&mut body);
    for r in records {
        let msg = encode_record(r, &origin(r), now_ms);
        if count > 0 && (count == CHUNK_RECORDS || body.len() + msg.len() + 2 > CHUNK_BYTES) {
            body.push_str("]}");
            out.push((compress(&body), std::mem::take(&mut offsets)));
            start(&mut body);
            count = 0;
        }
        if count > 0 {
            body.push(',');
        }
        body.push_str(&msg);
        offsets.push(r.offset);
        count += 1;
    }
    if count > 0 {
        body.push_str("]}");
        out.push((compress(&body), offsets));
    }
    out
}

fn compress(json: &str) -> Bytes {
    Bytes::from(zstd::bulk::compress(json.as_bytes(), 1).expect("zstd compresses in memory"))
}

/// One record as a batch produce message: the payload in base64, its key and headers, what
/// is left of its delay at `now_ms` (it becomes due there when it would have here), and its
/// origin here. A record forwarded again (it came from elsewhere) keeps the origin it had
/// as the last of its `narad-via` hops.
fn encode_record(r: &Record, origin: &str, now_ms: i64) -> String {
    let mut headers = serde_json::Map::new();
    let (mut before, mut via, mut time) = (None, None, None);
    for (k, v) in &r.headers {
        let v = String::from_utf8_lossy(v).into_owned();
        // (in any case: the last one counts, as the target reads them)
        if k.eq_ignore_ascii_case(ORIGIN_HEADER) {
            before = Some(v);
        } else if k.eq_ignore_ascii_case(VIA_HEADER) {
            via = Some(v);
        } else if k.eq_ignore_ascii_case(ORIGIN_TIME_HEADER) {
            time = Some(v);
        } else {
            headers.insert(k.clone(), serde_json::Value::String(v));
        }
    }
    // the original commit time: this record's own at its first hop (a producer's value is
    // not the broker's), kept from an earlier hop after
    let time = match (&before, time) {
        (Some(_), Some(t)) if t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit()) => t,
        _ => r.timestamp_ms.to_string(),
    };
    headers.insert(
        ORIGIN_TIME_HEADER.to_owned(),
        serde_json::Value::String(time),
    );
    if let Some(before) = before {
        let hops = match via {
            Some(via) => format!("{via},{before}"),
            None => before,
        };
        headers.insert(VIA_HEADER.to_owned(), serde_json::Value::String(hops));
    }
    headers.insert(
        ORIGIN_HEADER.to_owned(),
        serde_json::Value::String(origin.to_owned()),
    );
    let mut m = serde_json::Map::new();
    m.insert("payload".into(), B64.encode(&r.payload).into());
    m.insert("payload_encoding".into(), "base64".into());
    if let Some(k) = r.key.as_ref().filter(|k| !k.is_empty()) {
        m.insert("key".into(), String::from_utf8_lossy(k).into_owned().into());
    }
    let left = r
        .timestamp_ms
        .saturating_add(i64::from(r.delay_ms))
        .saturating_sub(now_ms)
        .clamp(0, i64::from(r.delay_ms));
    if left > 0 {
        m.insert("delay_ms".into(), left.into());
    }
    m.insert("headers".into(), serde_json::Value::Object(headers));
    serde_json::Value::Object(m).to_string()
}

/// The Narad error code of an answer, if its body is one (checked to look like a code: the
/// target is not trusted to write into our state or logs).
fn code_of(reply: &Reply) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()?
        .get("code")?
        .as_str()
        .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_owned)
}

/// Sends one chunk; `Ok` on `202` from the attached incarnation of the target topic.
async fn send_chunk(
    client: &RemoteClient,
    path: &str,
    link: &str,
    child: &RemoteChild,
    (body, offsets): Chunk,
) -> Result<usize, Failed> {
    let reply = client
        .post_zstd(path, body, child.target_id, link)
        .await
        .map_err(|e| {
            let weight = match e {
                ClientError::Tls(_) | ClientError::Ca(_) => Weight::RemoteWide,
                ClientError::Guard(_) | ClientError::Redirect(_) => Weight::Link,
                _ => Weight::Transient,
            };
            Failed {
                state: e.state(),
                message: e.to_string(),
                weight,
                retry_after: None,
                blocked: None,
            }
        })?;
    let status = reply.status.as_u16();
    if status == 202 {
        let id = reply
            .headers
            .get("narad-topic-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        if id.is_some_and(|id| id != child.target_id) {
            return Err(Failed {
                state: "target_replaced",
                message: format!(
                    "topic '{}' on the remote was deleted and created again (incarnation {:016x}, attached to {:016x}): detach and attach again",
                    child.remote_topic,
                    id.unwrap_or(0),
                    child.target_id
                ),
                weight: Weight::Link,
                retry_after: None,
                blocked: None,
            });
        }
        return Ok(offsets.len());
    }
    let code = code_of(&reply);
    let said = match &code {
        Some(c) => format!("the remote answered {status} {c}"),
        None => format!("the remote answered {status}"),
    };
    let (state, weight) = match (status, code.as_deref()) {
        (401, _) => ("auth_failed", Weight::RemoteWide),
        (429, _) => ("throttled", Weight::RemoteWide),
        (403, _) => ("forbidden", Weight::Link),
        (404, _) => ("target_missing", Weight::Link),
        (409, Some("loop_detected")) => ("loop_detected", Weight::Link),
        (409, Some("topic_replaced")) => ("target_replaced", Weight::Link),
        (409, Some("fenced")) => ("fenced", Weight::Link),
        (409, Some("not_your_mirror" | "mirror_read_only")) => ("not_a_mirror", Weight::Link),
        (413, Some("message_too_large")) => ("record_too_large", Weight::Link),
        (400 | 409 | 413, _) => ("rejected_record", Weight::Link),
        _ => ("unavailable", Weight::Transient),
    };
    let retry_after = (status == 429)
        .then(|| {
            reply
                .headers
                .get(hyper::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs)
        })
        .flatten();
    // the record refused: the one the answer names (`message N: ...`), else the chunk's
    // first (a skip then moves one record at a time)
    let blocked = matches!(state, "rejected_record" | "record_too_large")
        .then(|| {
            message_index(&reply)
                .and_then(|i| offsets.get(i))
                .or(offsets.first())
                .copied()
        })
        .flatten();
    Err(Failed {
        state,
        message: said,
        weight,
        retry_after,
        blocked,
    })
}

/// `N` of an error answer whose message starts `message N:` or `message N ` (a batch
/// produce names the message it refused: `message 3: ...`, `message 3 is 2048 bytes; ...`).
fn message_index(reply: &Reply) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(&reply.body).ok()?;
    let rest = v.get("error")?.as_str()?.strip_prefix("message ")?;
    let digits: String = rest
        .chars()
        .take_while(char::is_ascii_digit)
        .take(7)
        .collect();
    (!digits.is_empty() && rest[digits.len()..].starts_with([':', ' ']))
        .then(|| digits.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(delay_ms: u32, headers: &[(&str, &str)]) -> Record {
        Record {
            offset: 7,
            timestamp_ms: 1_000_000,
            delay_ms,
            key: None,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Bytes::from(v.to_string())))
                .collect(),
            payload: Bytes::from_static(b"x"),
        }
    }

    fn encoded(r: &Record, now_ms: i64) -> serde_json::Value {
        serde_json::from_str(&encode_record(r, "c/t/0/7", now_ms)).unwrap()
    }

    #[test]
    fn a_delayed_record_goes_with_what_is_left_of_its_delay() {
        let r = record(10_000, &[]);
        assert_eq!(encoded(&r, 1_000_000)["delay_ms"], 10_000);
        assert_eq!(encoded(&r, 1_004_000)["delay_ms"], 6_000);
        // due already: none; a clock behind the record's time: never more than its delay
        assert!(encoded(&r, 1_020_000).get("delay_ms").is_none());
        assert_eq!(encoded(&r, 900_000)["delay_ms"], 10_000);
        assert!(
            encoded(&record(0, &[]), 1_000_000)
                .get("delay_ms")
                .is_none()
        );
    }

    #[test]
    fn a_forwarded_record_names_this_hop_and_keeps_the_earlier_ones() {
        let own = encoded(&record(0, &[("a", "1")]), 0);
        assert_eq!(own["headers"]["narad-origin"], "c/t/0/7");
        assert!(own["headers"].get("narad-via").is_none());
        let once = encoded(&record(0, &[("Narad-Origin", "a/a/1/2")]), 0);
        assert_eq!(once["headers"]["narad-origin"], "c/t/0/7");
        assert_eq!(once["headers"]["narad-via"], "a/a/1/2");
        assert!(once["headers"].get("Narad-Origin").is_none());
        let twice = encoded(
            &record(0, &[("narad-via", "z/z/0/0"), ("narad-origin", "a/a/1/2")]),
            0,
        );
        assert_eq!(twice["headers"]["narad-via"], "z/z/0/0,a/a/1/2");
    }

    #[test]
    fn a_mirrored_record_keeps_its_original_commit_time() {
        // first hop: its own time, whatever a producer put in the header
        let own = encoded(&record(0, &[("narad-origin-time", "5")]), 0);
        assert_eq!(own["headers"]["narad-origin-time"], "1000000");
        // a later hop: the time the first hop gave it
        let again = encoded(
            &record(
                0,
                &[("narad-origin", "a/a/1/2"), ("Narad-Origin-Time", "123")],
            ),
            0,
        );
        assert_eq!(again["headers"]["narad-origin-time"], "123");
        assert!(again["headers"].get("Narad-Origin-Time").is_none());
        // (one that is not a time is replaced)
        let bad = encoded(
            &record(
                0,
                &[("narad-origin", "a/a/1/2"), ("narad-origin-time", "x")],
            ),
            0,
        );
        assert_eq!(bad["headers"]["narad-origin-time"], "1000000");
    }
}
