//! Node-to-node RPC: one QUIC endpoint per node (one UDP port) carries every call between
//! nodes, each on a stream of its own, over connections admitted by [`auth`]'s handshake.
//!
//! ```text
//!  caller                                   server
//!  Rpc::call(peer, addr, op, body, deadline)
//!   ├─ connection(peer): cached, or dial + handshake (one dial per peer at a time;
//!   │                    a failed dial is remembered 250 ms → 2 s, so callers fail fast)
//!   ├─ open_bi, write request, finish ───────▶ accept_bi (≤ max_streams_per_connection)
//!   │                                         read to end (≤ max_request_bytes)
//!   │                                         Service::call(from, op, body) within the deadline,
//!   │                                         cancelled if the caller stops reading
//!   └─ read reply to end (≤ max_reply_bytes) ◀ write reply, finish
//! ```
//!
//! A stream per request makes cancellation a stream reset and keeps one slow call from
//! holding up another. Every connection is authenticated before its first request is served,
//! and the identity the handshake proved (the peer's node id) is what [`Service::call`] gets.
//! What a caller may conclude from an error: [`RpcError::not_sent`] says the request never
//! left (safe to send elsewhere); otherwise its outcome is unknown.

pub mod auth;
pub mod frame;
mod metrics;
pub mod ops;
#[cfg(test)]
mod tests;
pub mod tls;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use quinn::{Connection, ConnectionError, Incoming, ReadError, ReadExactError, VarInt};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

pub use auth::{Keys, Refusal};
pub use frame::{Fault, Op};
pub use metrics::RpcMetrics;

/// The fault a call gets when the serving member did not finish it within the caller's
/// deadline: the work was dropped where it stood, so it may have been done in part or whole.
pub const DEADLINE_EXCEEDED: &str = "deadline_exceeded";
/// The fault a call gets when its reply was over the reply limit: the work was done.
pub const REPLY_TOO_LARGE: &str = "reply_too_large";

pub type NodeId = u64;

/// The QUIC application error code a node closes a connection with when the handshake fails.
pub const AUTH_FAILED: VarInt = VarInt::from_u32(0x4e01);
const SHUTDOWN: VarInt = VarInt::from_u32(0);

/// Bounds on what one peer can make this node hold or do.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request payload served (`413 request_too_large` beyond).
    pub max_request_bytes: usize,
    /// Largest reply payload read (a longer one fails the call).
    pub max_reply_bytes: usize,
    /// A connection must complete the handshake within this.
    pub handshake_timeout: Duration,
    /// Dial plus handshake, from the caller's side.
    pub connect_timeout: Duration,
    /// Connections (authenticated or not) served at once; more are refused.
    pub max_connections: usize,
    /// Connections still in their handshake at once, and from one network (an IPv4 /24, an
    /// IPv6 /64): an unauthenticated client holds one for at most `hello_timeout` unless it
    /// sends a hello, and `handshake_timeout` in all; the addresses of known members have
    /// slots of their own ([`Rpc::set_known_peers`]) that strangers cannot take.
    pub max_handshaking: usize,
    pub max_handshaking_per_network: usize,
    pub reserved_for_members: usize,
    /// The client's hello must arrive within this of the QUIC handshake.
    pub hello_timeout: Duration,
    /// Unread bytes the endpoint buffers per connection (QUIC flow control): what a peer,
    /// authenticated or not, can make this node hold before it reads.
    pub connection_window: u32,
    /// Requests one connection may have in flight (QUIC stream credit).
    pub max_streams_per_connection: u32,
    /// The longest deadline a server grants a request, whatever the caller asked.
    pub max_deadline: Duration,
    /// Idle connections close after this; keep-alives go at a fifth of it.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // a forwarded produce carries a whole batch (16 MiB by default) and a consume's
            // reply up to 4 MiB of messages plus one of up to 8 MiB, rendered as JSON
            max_request_bytes: 24 << 20,
            max_reply_bytes: 24 << 20,
            handshake_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            max_connections: 256,
            max_handshaking: 32,
            max_handshaking_per_network: 8,
            reserved_for_members: 16,
            hello_timeout: Duration::from_millis(500),
            connection_window: 2 << 20,
            max_streams_per_connection: 256,
            max_deadline: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(10),
        }
    }
}

pub struct RpcConfig {
    pub node_id: NodeId,
    /// UDP address to bind (the node's own address: outgoing connections use it too).
    pub bind: SocketAddr,
    pub keys: Keys,
    /// Capability bits this node announces in the handshake.
    pub features: u64,
    pub limits: Limits,
}

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a node serves. `from` is the peer's node id as its handshake proved it.
pub trait Service: Send + Sync + 'static {
    fn call(&self, from: NodeId, op: Op, body: Bytes) -> BoxFuture<Result<Bytes, Fault>>;
    /// Whether a reply to `op` hands something over (a lease, say) that must be taken back
    /// if the caller never receives it: then the endpoint waits for the caller's transport
    /// to acknowledge the whole reply, and calls [`Service::undelivered`] if it does not.
    fn wants_receipt(&self, _op: Op) -> bool {
        false
    }
    /// `reply` to `op` did not reach the caller (it gave up, or the connection failed).
    fn undelivered(&self, _op: Op, _reply: Bytes) {}
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The request was not sent: no connection (dial failed, timed out, or was refused
    /// recently).
    #[error("node {peer} is unreachable: {reason}")]
    Unreachable { peer: NodeId, reason: String },
    /// The handshake failed: wrong secret, or a different node answered at the address.
    #[error("node {peer} refused the connection or failed authentication: {reason}")]
    Refused { peer: NodeId, reason: String },
    /// No reply within the deadline; the request may have been served.
    #[error("no reply from node {peer} within {ms} ms")]
    Timeout { peer: NodeId, ms: u64 },
    /// The connection failed after the request may have been sent.
    #[error("the call to node {peer} failed: {reason}")]
    Network { peer: NodeId, reason: String },
    /// The peer served the request and refused it.
    #[error("node {peer} answered {fault}")]
    Remote { peer: NodeId, fault: Fault },
}

impl RpcError {
    /// Whether the request certainly never reached the peer (so sending it elsewhere cannot
    /// make it happen twice).
    pub fn not_sent(&self) -> bool {
        matches!(self, Self::Unreachable { .. } | Self::Refused { .. })
    }

    fn label(&self) -> &'static str {
        match self {
            Self::Unreachable { .. } => "unreachable",
            Self::Refused { .. } => "refused",
            Self::Timeout { .. } => "timeout",
            Self::Network { .. } => "network",
            Self::Remote { .. } => "fault",
        }
    }
}

/// A node's RPC endpoint: serves its [`Service`] and calls other nodes. Clones share it.
#[derive(Clone)]
pub struct Rpc {
    inner: Arc<Inner>,
}

struct Inner {
    me: NodeId,
    keys: Keys,
    features: u64,
    limits: Limits,
    endpoint: quinn::Endpoint,
    client: quinn::ClientConfig,
    service: Arc<dyn Service>,
    metrics: Arc<RpcMetrics>,
    peers: Mutex<HashMap<NodeId, Arc<Peer>>>,
    connections: Arc<Semaphore>,
    handshaking: Arc<Semaphore>,
    /// Handshake slots only the addresses of known members may use.
    reserved: Arc<Semaphore>,
    known_peers: parking_lot::RwLock<std::collections::HashSet<SocketAddr>>,
    /// Handshakes in progress per remote network.
    handshaking_by_net: Mutex<HashMap<Network, usize>>,
    accept_loop: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// When a refusal was last logged (refusals are counted always, logged ≤ 1 per 10 s).
    last_refusal_log: AtomicU64,
    started: Instant,
}

#[derive(Default)]
struct Peer {
    state: tokio::sync::Mutex<PeerState>,
    /// When a call to the peer last timed out: a connection made before then is not handed
    /// out again (set without waiting for `state`, which a dial may hold for its timeout).
    stale_at: parking_lot::Mutex<Option<Instant>>,
}

#[derive(Default)]
struct PeerState {
    /// The address, the connection and when it was made.
    conn: Option<(String, Connection, Instant)>,
    backoff: Duration,
    /// The last failed dial: the address, when to try it again, and what failed.
    failed: Option<(String, Instant, RpcErrorKind)>,
}

#[derive(Clone)]
enum RpcErrorKind {
    Unreachable(String),
    Refused(String),
}

const MIN_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A handle that does not keep the endpoint alive (for a [`Service`] that calls other nodes:
/// the endpoint owns the service, so a strong handle there would keep both forever).
#[derive(Clone)]
pub struct WeakRpc(std::sync::Weak<Inner>);

impl WeakRpc {
    pub fn upgrade(&self) -> Option<Rpc> {
        self.0.upgrade().map(|inner| Rpc { inner })
    }
}

impl Rpc {
    pub fn downgrade(&self) -> WeakRpc {
        WeakRpc(Arc::downgrade(&self.inner))
    }

    /// Binds the endpoint and starts serving `service`. Must run inside a tokio runtime.
    pub fn bind(
        cfg: RpcConfig,
        service: Arc<dyn Service>,
        metrics: Arc<RpcMetrics>,
    ) -> std::io::Result<Self> {
        let other = |e: String| std::io::Error::other(e);
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(cfg.limits.max_streams_per_connection.into())
            .max_concurrent_uni_streams(0u32.into())
            .receive_window(cfg.limits.connection_window.into())
            .stream_receive_window((cfg.limits.connection_window / 2).into())
            .keep_alive_interval(Some(cfg.limits.idle_timeout / 5))
            .max_idle_timeout(Some(
                cfg.limits
                    .idle_timeout
                    .try_into()
                    .map_err(|_| other("idle timeout out of range".into()))?,
            ));
        let transport = Arc::new(transport);
        let mut server =
            quinn::ServerConfig::with_crypto(Arc::new(tls::server_config().map_err(other)?));
        server.transport_config(transport.clone());
        let mut client = quinn::ClientConfig::new(Arc::new(tls::client_config().map_err(other)?));
        client.transport_config(transport);
        let reset_key = cfg.keys.current.reset_key(cfg.node_id);
        let socket = std::net::UdpSocket::bind(cfg.bind)?;
        let runtime = quinn::default_runtime().ok_or_else(|| other("no async runtime".into()))?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::new(Arc::new(reset_key)),
            Some(server),
            socket,
            runtime,
        )?;
        let inner = Arc::new(Inner {
            me: cfg.node_id,
            keys: cfg.keys,
            features: cfg.features,
            connections: Arc::new(Semaphore::new(cfg.limits.max_connections)),
            handshaking: Arc::new(Semaphore::new(cfg.limits.max_handshaking)),
            reserved: Arc::new(Semaphore::new(cfg.limits.reserved_for_members)),
            known_peers: parking_lot::RwLock::new(std::collections::HashSet::new()),
            handshaking_by_net: Mutex::new(HashMap::new()),
            limits: cfg.limits,
            endpoint,
            client,
            service,
            metrics,
            peers: Mutex::new(HashMap::new()),
            accept_loop: Mutex::new(None),
            last_refusal_log: AtomicU64::new(0),
            started: Instant::now(),
        });
        let task = tokio::spawn(accept_loop(inner.clone()));
        *inner.accept_loop.lock() = Some(task);
        Ok(Self { inner })
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.me
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.endpoint.local_addr()
    }

    pub fn metrics(&self) -> &Arc<RpcMetrics> {
        &self.inner.metrics
    }

    /// The addresses of the cluster's members (IP and port: a member dials from its own
    /// cluster endpoint, so its connections come from exactly its address): their handshakes
    /// may use the slots reserved for members, so strangers holding every other slot, even
    /// from a member's IP, cannot keep a member out.
    pub fn set_known_peers(&self, addrs: impl IntoIterator<Item = SocketAddr>) {
        *self.inner.known_peers.write() = addrs.into_iter().map(canonical).collect();
    }

    /// Calls `op` on node `peer` at `addr` (`host:port`; a name is resolved at dial time)
    /// and returns its reply, within `deadline` (which the peer is told too).
    pub async fn call(
        &self,
        peer: NodeId,
        addr: &str,
        op: Op,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RpcError> {
        let inner = &self.inner;
        let start = Instant::now();
        let result = match tokio::time::timeout(
            deadline,
            inner.call(peer, addr, op, body, deadline),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => {
                // a peer that restarted leaves its old connection looking alive here until
                // the idle timeout (its new process cannot reset it), and every call on it
                // would wait out its deadline: the next call dials afresh (calls in flight
                // keep the old one until they end)
                inner.evict(peer);
                Err(RpcError::Timeout {
                    peer,
                    ms: deadline.as_millis() as u64,
                })
            }
        };
        let name = op.name();
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.label(),
        };
        inner.metrics.called(name, outcome, start.elapsed());
        result
    }

    /// Whether node `peer` at `addr` answers a ping now, within `deadline`. Unlike
    /// [`Self::call`] it trusts nothing remembered: a failed dial's backoff is set aside (a
    /// node that restarted a moment ago is dialled, not reported unreachable from memory), and
    /// if the ping over the cached connection fails, the node is dialled afresh on a
    /// connection of the probe's own (closed after it; the cached one, which other calls may
    /// be using, is left alone) within what is left of `deadline` (a connection to a process
    /// that died looks alive until its idle timeout). For decisions that must not rest on a
    /// stale failure, such as declaring a member lost.
    pub async fn probe(
        &self,
        peer: NodeId,
        addr: &str,
        deadline: Duration,
    ) -> Result<(), RpcError> {
        let start = Instant::now();
        let inner = &self.inner;
        inner.forget_failure(peer).await;
        let first = self
            .call(peer, addr, Op::PING, Bytes::new(), deadline / 2)
            .await;
        if first.is_ok() {
            return Ok(());
        }
        let fresh = async {
            let conn = inner
                .dial(peer, addr)
                .await
                .map_err(|k| k.to_error(peer, false))?;
            let r = inner
                .call_on(&conn, peer, Op::PING, Bytes::new(), deadline / 2)
                .await;
            conn.close(SHUTDOWN, b"probe done");
            r.map(|_| ())
        };
        let left = deadline.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, fresh).await {
            Ok(r) => r,
            Err(_) => Err(RpcError::Timeout {
                peer,
                ms: deadline.as_millis() as u64,
            }),
        }
    }

    /// Stops serving and closes every connection; calls in flight fail.
    pub async fn shutdown(&self) {
        let task = self.inner.accept_loop.lock().take();
        self.inner.endpoint.close(SHUTDOWN, b"shutting down");
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.endpoint.wait_idle()).await;
    }
}

impl Inner {
    /// Stops handing out the cached connection to `peer`: the next call dials. Never waits
    /// (a dial under way holds the peer's state up to the connect timeout, and the call
    /// that timed out must answer by its deadline).
    fn evict(&self, peer: NodeId) {
        let Some(slot) = self.peers.lock().get(&peer).cloned() else {
            return;
        };
        *slot.stale_at.lock() = Some(Instant::now());
    }

    /// Forgets the last failed dial to `peer` (and its backoff), so that the next call dials.
    async fn forget_failure(&self, peer: NodeId) {
        let Some(slot) = self.peers.lock().get(&peer).cloned() else {
            return;
        };
        let mut st = slot.state.lock().await;
        st.failed = None;
        st.backoff = Duration::ZERO;
    }

    /// `peer` just proved itself on a connection of its own: a failed dial to it (from
    /// before it restarted, say) is not waited out. Never waits: a dial in progress settles
    /// the state itself.
    fn peer_proved_itself(&self, peer: NodeId) {
        let Some(slot) = self.peers.lock().get(&peer).cloned() else {
            return;
        };
        if let Ok(mut st) = slot.state.try_lock()
            && st.failed.is_some()
        {
            st.failed = None;
            st.backoff = Duration::ZERO;
        }
    }

    async fn call(
        &self,
        peer: NodeId,
        addr: &str,
        op: Op,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RpcError> {
        let conn = self.connection(peer, addr).await?;
        self.call_on(&conn, peer, op, body, deadline).await
    }

    /// [`Inner::call`] on connection `conn`.
    async fn call_on(
        &self,
        conn: &Connection,
        peer: NodeId,
        op: Op,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, RpcError> {
        let net = |reason: String| RpcError::Network { peer, reason };
        let (mut send, mut recv) = match conn.open_bi().await {
            Ok(s) => s,
            // the connection was already gone: nothing was sent
            Err(e) => {
                return Err(RpcError::Unreachable {
                    peer,
                    reason: e.to_string(),
                });
            }
        };
        let deadline_ms = deadline.as_millis().min(u32::MAX as u128) as u32;
        send.write_all(&frame::encode_request(op, deadline_ms, &body))
            .await
            .map_err(|e| net(e.to_string()))?;
        let _ = send.finish();
        let reply = recv
            .read_to_end(self.limits.max_reply_bytes + 1)
            .await
            .map_err(|e| net(e.to_string()))?;
        match frame::decode_reply(Bytes::from(reply)) {
            Some(Ok(b)) => Ok(b),
            Some(Err(fault)) => Err(RpcError::Remote { peer, fault }),
            None => Err(net("malformed reply".into())),
        }
    }

    /// The connection to `peer`: the cached one, or a new one (one dial per peer at a time).
    async fn connection(&self, peer: NodeId, addr: &str) -> Result<Connection, RpcError> {
        if peer == self.me {
            return Err(RpcError::Unreachable {
                peer,
                reason: "a node does not call itself over the network".into(),
            });
        }
        let slot = self.peers.lock().entry(peer).or_default().clone();
        let mut st = slot.state.lock().await;
        if let Some((a, c, made)) = &st.conn {
            let stale = slot.stale_at.lock().is_some_and(|t| *made <= t);
            if a == addr && c.close_reason().is_none() && !stale {
                return Ok(c.clone());
            }
            st.conn = None;
        }
        if let Some((failed, at, kind)) = &st.failed
            && failed == addr
            && Instant::now() < *at
        {
            return Err(kind.to_error(peer, true));
        }
        let dialed =
            match tokio::time::timeout(self.limits.connect_timeout, self.dial(peer, addr)).await {
                Ok(r) => r,
                Err(_) => Err(RpcErrorKind::Unreachable(format!(
                    "no connection within {} ms",
                    self.limits.connect_timeout.as_millis()
                ))),
            };
        match dialed {
            Ok(c) => {
                st.conn = Some((addr.to_owned(), c.clone(), Instant::now()));
                st.backoff = Duration::ZERO;
                st.failed = None;
                Ok(c)
            }
            Err(kind) => {
                st.backoff = (st.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                let e = kind.to_error(peer, false);
                st.failed = Some((addr.to_owned(), Instant::now() + st.backoff, kind));
                Err(e)
            }
        }
    }

    async fn dial(&self, peer: NodeId, addr: &str) -> Result<Connection, RpcErrorKind> {
        let unreachable = |e: String| RpcErrorKind::Unreachable(e);
        let sock = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| unreachable(format!("cannot resolve {addr}: {e}")))?
            .next()
            .ok_or_else(|| unreachable(format!("{addr} resolves to no address")))?;
        let conn = self
            .endpoint
            .connect_with(self.client.clone(), sock, tls::SERVER_NAME)
            .map_err(|e| unreachable(e.to_string()))?
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        match self.client_handshake(&conn, peer).await {
            Ok(()) => {
                self.metrics.handshake("client", "ok");
                Ok(conn)
            }
            Err(e) => {
                let (label, kind) = match e {
                    Handshake::Refused(r) => {
                        conn.close(AUTH_FAILED, b"auth failed");
                        (r.label(), RpcErrorKind::Refused(r.to_string()))
                    }
                    Handshake::Closed => (
                        "refused_by_peer",
                        RpcErrorKind::Refused(
                            "the peer refused our proof of the cluster secret".into(),
                        ),
                    ),
                    Handshake::Io(s) => {
                        conn.close(SHUTDOWN, b"");
                        ("io", RpcErrorKind::Unreachable(s))
                    }
                };
                self.metrics.handshake("client", label);
                self.log_refusal("client", peer, &kind);
                Err(kind)
            }
        }
    }

    async fn client_handshake(&self, conn: &Connection, peer: NodeId) -> Result<(), Handshake> {
        let (mut send, mut recv) = conn.open_bi().await.map_err(Handshake::conn)?;
        let hello = auth::ClientHello::new(&self.keys, self.me, peer, self.features).encode();
        send.write_all(&hello)
            .await
            .map_err(|e| Handshake::Io(e.to_string()))?;
        let mut answer = [0; auth::SERVER_HELLO_LEN];
        recv.read_exact(&mut answer)
            .await
            .map_err(Handshake::read)?;
        let ekm = export(conn)?;
        let (_server, proof) = auth::client_check(&self.keys, peer, &ekm, &hello[2..], &answer)
            .map_err(Handshake::Refused)?;
        send.write_all(&proof)
            .await
            .map_err(|e| Handshake::Io(e.to_string()))?;
        let mut verdict = [0; 1];
        recv.read_exact(&mut verdict)
            .await
            .map_err(Handshake::read)?;
        if verdict[0] != auth::ACCEPTED {
            return Err(Handshake::Closed);
        }
        Ok(())
    }

    /// The server's side of the handshake; the peer's node id once admitted.
    async fn server_handshake(&self, conn: &Connection) -> Result<NodeId, Handshake> {
        // the hello comes at once or not at all: a client that connects and stays silent is
        // let go well before the handshake timeout
        let (mut send, mut recv, hello) = tokio::time::timeout(self.limits.hello_timeout, async {
            let (send, mut recv) = conn.accept_bi().await.map_err(Handshake::conn)?;
            let mut len = [0; 2];
            recv.read_exact(&mut len).await.map_err(Handshake::read)?;
            let len = u16::from_be_bytes(len) as usize;
            if len > auth::MAX_HELLO {
                return Err(Handshake::Refused(Refusal::Malformed(
                    "client hello too long",
                )));
            }
            let mut hello = vec![0; len];
            recv.read_exact(&mut hello).await.map_err(Handshake::read)?;
            Ok((send, recv, hello))
        })
        .await
        .map_err(|_| Handshake::Io("no hello in time".into()))??;
        let ekm = export(conn)?;
        let (client, answer, expect, _key) =
            auth::server_answer(&self.keys, self.me, self.features, &ekm, &hello)
                .map_err(Handshake::Refused)?;
        send.write_all(&answer)
            .await
            .map_err(|e| Handshake::Io(e.to_string()))?;
        let mut proof = [0; auth::PROOF_LEN];
        recv.read_exact(&mut proof).await.map_err(Handshake::read)?;
        auth::check_client_proof(&expect, &proof).map_err(Handshake::Refused)?;
        send.write_all(&[auth::ACCEPTED])
            .await
            .map_err(|e| Handshake::Io(e.to_string()))?;
        let _ = send.finish();
        Ok(client.from)
    }

    fn log_refusal(&self, side: &str, peer: NodeId, kind: &RpcErrorKind) {
        let RpcErrorKind::Refused(reason) = kind else {
            return;
        };
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.last_refusal_log.load(Ordering::Relaxed);
        if now >= last + 10
            && self
                .last_refusal_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(side, peer, %reason, "node rpc handshake refused (logged at most every 10 s; narad_rpc_handshakes_total counts each)");
        }
    }
}

impl RpcErrorKind {
    fn to_error(&self, peer: NodeId, cached: bool) -> RpcError {
        let note = if cached {
            " (recent attempt; retrying shortly)"
        } else {
            ""
        };
        match self {
            Self::Unreachable(r) => RpcError::Unreachable {
                peer,
                reason: format!("{r}{note}"),
            },
            Self::Refused(r) => RpcError::Refused {
                peer,
                reason: format!("{r}{note}"),
            },
        }
    }
}

enum Handshake {
    Refused(Refusal),
    /// The peer closed the connection during the handshake: it refused us.
    Closed,
    Io(String),
}

impl Handshake {
    fn conn(e: ConnectionError) -> Self {
        match e {
            ConnectionError::ApplicationClosed(c) if c.error_code == AUTH_FAILED => Self::Closed,
            e => Self::Io(e.to_string()),
        }
    }

    fn read(e: ReadExactError) -> Self {
        match e {
            ReadExactError::ReadError(ReadError::ConnectionLost(c)) => Self::conn(c),
            ReadExactError::FinishedEarly(_) => {
                Self::Refused(Refusal::Malformed("handshake stream ended early"))
            }
            e => Self::Io(e.to_string()),
        }
    }
}

fn export(conn: &Connection) -> Result<[u8; 32], Handshake> {
    let mut ekm = [0; 32];
    conn.export_keying_material(&mut ekm, auth::EXPORT_LABEL, b"")
        .map_err(|_| Handshake::Io("no TLS keying material to export".into()))?;
    Ok(ekm)
}

async fn accept_loop(inner: Arc<Inner>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            incoming = inner.endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                // a client must prove it receives at its source address (a stateless retry
                // costs it one round trip) before it may hold any slot: no spoofed floods
                if !incoming.remote_address_validated() && incoming.may_retry() {
                    let _ = incoming.retry();
                    continue;
                }
                let Ok(permit) = inner.connections.clone().try_acquire_owned() else {
                    inner.metrics.connection_refused();
                    incoming.refuse();
                    continue;
                };
                let Some(handshake) = inner.start_handshake(incoming.remote_address()) else {
                    inner.metrics.connection_refused();
                    incoming.refuse();
                    continue;
                };
                let inner = inner.clone();
                conns.spawn(async move {
                    serve_connection(&inner, incoming, handshake).await;
                    drop(permit);
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Where a handshake comes from, for its per-network bound: an IPv4 /24 or an IPv6 /64 (one
/// party rarely holds more than a few of these; it easily holds many addresses in one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Network {
    V4([u8; 3]),
    V6([u8; 8]),
}

impl Network {
    fn of(ip: std::net::IpAddr) -> Self {
        // (a v4-mapped v6 address counts as the v4 address it is)
        match ip.to_canonical() {
            std::net::IpAddr::V4(v4) => {
                let [a, b, c, _] = v4.octets();
                Self::V4([a, b, c])
            }
            std::net::IpAddr::V6(v6) => {
                let o = v6.octets();
                Self::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
            }
        }
    }
}

/// A handshake in progress: its slot (shared, or reserved for members) and its place in its
/// network's count, given back on drop.
struct HandshakeSlot {
    inner: Arc<Inner>,
    /// `None` for a member's address in a reserved slot (not counted per network).
    net: Option<Network>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let Some(net) = self.net else { return };
        let mut by_net = self.inner.handshaking_by_net.lock();
        if let Some(n) = by_net.get_mut(&net) {
            *n -= 1;
            if *n == 0 {
                by_net.remove(&net);
            }
        }
    }
}

impl Inner {
    fn start_handshake(self: &Arc<Self>, from: SocketAddr) -> Option<HandshakeSlot> {
        let net = Network::of(from.ip());
        {
            let mut by_net = self.handshaking_by_net.lock();
            let n = by_net.entry(net).or_default();
            if *n < self.limits.max_handshaking_per_network
                && let Ok(permit) = self.handshaking.clone().try_acquire_owned()
            {
                *n += 1;
                return Some(HandshakeSlot {
                    inner: self.clone(),
                    net: Some(net),
                    _permit: permit,
                });
            }
            if *n == 0 {
                by_net.remove(&net);
            }
        }
        // the shared slots are taken (or this network has its share): a member still gets in
        if self.known_peers.read().contains(&canonical(from)) {
            let permit = self.reserved.clone().try_acquire_owned().ok()?;
            return Some(HandshakeSlot {
                inner: self.clone(),
                net: None,
                _permit: permit,
            });
        }
        None
    }
}

async fn serve_connection(inner: &Arc<Inner>, incoming: Incoming, handshake: HandshakeSlot) {
    let remote = incoming.remote_address();
    let admitted = tokio::time::timeout(inner.limits.handshake_timeout, async {
        let conn = incoming.await.map_err(Handshake::conn)?;
        let from = inner.server_handshake(&conn).await;
        Ok::<_, Handshake>((conn, from))
    })
    .await;
    // admitted or not, this connection no longer counts as handshaking
    drop(handshake);
    let (conn, from) = match admitted {
        Ok(Ok((conn, Ok(from)))) => {
            inner.metrics.handshake("server", "ok");
            inner.peer_proved_itself(from);
            (conn, from)
        }
        Ok(Ok((conn, Err(e)))) => {
            let label = match &e {
                Handshake::Refused(r) => r.label(),
                Handshake::Closed => "refused_by_peer",
                Handshake::Io(_) => "io",
            };
            inner.metrics.handshake("server", label);
            if let Handshake::Refused(r) = e {
                conn.close(AUTH_FAILED, b"auth failed");
                tracing::debug!(%remote, reason = %r, "node rpc connection refused");
                inner.log_refusal(
                    "server",
                    0,
                    &RpcErrorKind::Refused(format!("{r} (from {remote})")),
                );
            } else {
                conn.close(SHUTDOWN, b"");
            }
            return;
        }
        Ok(Err(_)) => {
            inner.metrics.handshake("server", "io");
            return;
        }
        Err(_) => {
            // (the connection, if any, is dropped here, which closes it)
            inner.metrics.handshake("server", "timeout");
            return;
        }
    };
    let mut streams = JoinSet::new();
    loop {
        tokio::select! {
            s = conn.accept_bi() => match s {
                Ok((send, recv)) => {
                    let inner = inner.clone();
                    streams.spawn(async move { serve_stream(&inner, from, send, recv).await });
                }
                Err(_) => break,
            },
            Some(_) = streams.join_next(), if !streams.is_empty() => {}
        }
    }
    // the connection is gone: whatever its requests were doing, nobody can read the answer
    streams.shutdown().await;
}

async fn serve_stream(
    inner: &Inner,
    from: NodeId,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let request = match recv
        .read_to_end(frame::REQUEST_HEADER + inner.limits.max_request_bytes)
        .await
    {
        Ok(b) => frame::decode_request(Bytes::from(b)),
        Err(quinn::ReadToEndError::TooLong) => {
            inner.metrics.served("unknown", "too_large");
            let limit = inner.limits.max_request_bytes;
            let fault = Fault::new(
                413,
                "request_too_large",
                format!("requests are limited to {limit} bytes"),
            );
            reply(&mut send, &Err(fault)).await;
            return;
        }
        Err(_) => return,
    };
    let Some((op, deadline_ms, body)) = request else {
        inner.metrics.served("unknown", "malformed");
        reply(
            &mut send,
            &Err(Fault::new(
                400,
                "malformed_request",
                "a request needs its 6-byte header",
            )),
        )
        .await;
        return;
    };
    let name = op.name();
    let deadline = Duration::from_millis(deadline_ms.into()).min(inner.limits.max_deadline);
    let work = async {
        if op == Op::PING {
            Ok(Bytes::new())
        } else {
            inner.service.call(from, op, body).await
        }
    };
    // the caller gave up (its deadline, or it went away, its connection with it: then this
    // task is dropped): the work stops, counted as cancelled
    struct Cancelled<'a> {
        inner: &'a Inner,
        name: &'static str,
        armed: bool,
    }
    impl Drop for Cancelled<'_> {
        fn drop(&mut self) {
            if self.armed {
                self.inner.metrics.served(self.name, "cancelled");
            }
        }
    }
    let mut cancelled = Cancelled {
        inner,
        name,
        armed: true,
    };
    let result = tokio::select! {
        r = tokio::time::timeout(deadline, work) => r.unwrap_or_else(|_| {
            Err(Fault::new(504, DEADLINE_EXCEEDED, format!("not done within the caller's {deadline_ms} ms")))
        }),
        _ = send.stopped() => return,
    };
    cancelled.armed = false;
    let result = match result {
        Ok(b) if b.len() > inner.limits.max_reply_bytes => Err(Fault::new(
            500,
            REPLY_TOO_LARGE,
            format!(
                "the reply of {} bytes is over the {}-byte limit",
                b.len(),
                inner.limits.max_reply_bytes
            ),
        )),
        r => r,
    };
    inner
        .metrics
        .served(name, if result.is_ok() { "ok" } else { "fault" });
    let sent = reply(&mut send, &result).await;
    if let Ok(body) = result
        && inner.service.wants_receipt(op)
    {
        // finished and every byte acknowledged: the caller's transport has the reply
        let received = sent && matches!(send.stopped().await, Ok(None));
        if !received {
            inner.metrics.served(name, "undelivered");
            inner.service.undelivered(op, body);
        }
    }
}

/// Writes the reply and finishes the stream: `false` if it could not (the caller is gone).
async fn reply(send: &mut quinn::SendStream, r: &Result<Bytes, Fault>) -> bool {
    send.write_all(&frame::encode_reply(r)).await.is_ok() && send.finish().is_ok()
}
