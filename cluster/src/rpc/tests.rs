use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;

const SECRET: &[u8] = b"a cluster secret of at least 32 bytes, for tests";
const OTHER: &[u8] = b"another cluster secret of at least 32 bytes, too";

/// Echoes `from:body`; op 7 never answers; op 8 answers with `n` bytes (n in the body).
struct Echo;

impl Service for Echo {
    fn call(&self, from: NodeId, op: Op, body: Bytes) -> BoxFuture<Result<Bytes, Fault>> {
        Box::pin(async move {
            match op.0 {
                7 => std::future::pending().await,
                8 => {
                    let n = u32::from_be_bytes(body[..4].try_into().unwrap()) as usize;
                    Ok(Bytes::from(vec![b'x'; n]))
                }
                9 => Err(Fault::new(409, "conflict", "no")),
                _ => Ok(Bytes::from(format!(
                    "{from}:{}",
                    String::from_utf8_lossy(&body)
                ))),
            }
        })
    }
}

fn node(id: NodeId, keys: Keys) -> Rpc {
    node_with(id, keys, Limits::default())
}

fn node_with(id: NodeId, keys: Keys, limits: Limits) -> Rpc {
    Rpc::bind(
        RpcConfig {
            node_id: id,
            bind: "127.0.0.1:0".parse().unwrap(),
            keys,
            features: 0,
            limits,
        },
        Arc::new(Echo),
        Arc::new(RpcMetrics::default()),
    )
    .unwrap()
}

fn addr(n: &Rpc) -> String {
    n.local_addr().unwrap().to_string()
}

const SEC: Duration = Duration::from_secs(5);

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        // (real time: real endpoints on real sockets, no clock to drive)
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn calls_carry_the_proven_node_id_and_faults_come_back_typed() {
    let a = node(1, Keys::new(SECRET, None));
    let b = node(2, Keys::new(SECRET, None));
    let r = a
        .call(2, &addr(&b), Op(5), Bytes::from_static(b"hi"), SEC)
        .await
        .unwrap();
    assert_eq!(&r[..], b"1:hi");
    let r = b
        .call(1, &addr(&a), Op(5), Bytes::from_static(b"yo"), SEC)
        .await
        .unwrap();
    assert_eq!(&r[..], b"2:yo");
    assert!(
        a.call(2, &addr(&b), Op::PING, Bytes::new(), SEC)
            .await
            .unwrap()
            .is_empty()
    );
    match a.call(2, &addr(&b), Op(9), Bytes::new(), SEC).await {
        Err(RpcError::Remote { peer: 2, fault }) => {
            assert_eq!((fault.status, fault.code.as_str()), (409, "conflict"))
        }
        other => panic!("{other:?}"),
    }
    // many calls share one connection, concurrently
    let calls = (0..50).map(|i| {
        let (a, to) = (a.clone(), addr(&b));
        tokio::spawn(async move { a.call(2, &to, Op(5), Bytes::from(i.to_string()), SEC).await })
    });
    for (i, c) in calls.enumerate() {
        assert_eq!(c.await.unwrap().unwrap(), Bytes::from(format!("1:{i}")));
    }
    assert_eq!(b.metrics().handshakes_with("server", "ok"), 1);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_wrong_secret_or_the_wrong_node_is_refused_and_counted() {
    let b = node(2, Keys::new(SECRET, None));
    let stranger = node(1, Keys::new(OTHER, None));
    let e = stranger
        .call(2, &addr(&b), Op(5), Bytes::new(), SEC)
        .await
        .unwrap_err();
    assert!(
        matches!(e, RpcError::Refused { .. }) && e.not_sent(),
        "{e:?}"
    );
    eventually("the server to count the refusal", || {
        b.metrics().handshakes_with("server", "unknown_key") == 1
    })
    .await;

    // node 3 expected, node 2 answers at that address
    let a = node(1, Keys::new(SECRET, None));
    let e = a
        .call(3, &addr(&b), Op(5), Bytes::new(), SEC)
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::Refused { .. }), "{e:?}");
    eventually("the server to count the wrong node", || {
        b.metrics().handshakes_with("server", "wrong_node") == 1
    })
    .await;
    // a refused dial is remembered briefly: the next call fails at once, without dialing
    let t = Instant::now();
    let e = a
        .call(3, &addr(&b), Op(5), Bytes::new(), SEC)
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::Refused { .. }) && t.elapsed() < Duration::from_millis(200));
    assert_eq!(b.metrics().handshakes_with("server", "wrong_node"), 1);
    for n in [a, b, stranger] {
        n.shutdown().await;
    }
}

#[tokio::test]
async fn a_secret_rotation_keeps_old_and_new_nodes_talking() {
    let old = node(1, Keys::new(SECRET, None));
    let rotated = node(2, Keys::new(OTHER, Some(SECRET)));
    let done = node(3, Keys::new(OTHER, None));
    assert!(
        old.call(2, &addr(&rotated), Op::PING, Bytes::new(), SEC)
            .await
            .is_ok()
    );
    assert!(
        rotated
            .call(1, &addr(&old), Op::PING, Bytes::new(), SEC)
            .await
            .is_ok()
    );
    assert!(
        done.call(2, &addr(&rotated), Op::PING, Bytes::new(), SEC)
            .await
            .is_ok()
    );
    assert!(
        rotated
            .call(3, &addr(&done), Op::PING, Bytes::new(), SEC)
            .await
            .is_ok()
    );
    // the last step of a rotation drops the old secret: nodes still on it are out
    assert!(matches!(
        done.call(1, &addr(&old), Op::PING, Bytes::new(), SEC).await,
        Err(RpcError::Refused { .. })
    ));
    for n in [old, rotated, done] {
        n.shutdown().await;
    }
}

/// A bare QUIC connection with the node's TLS settings, for driving the handshake by hand.
async fn raw(to: &Rpc) -> (quinn::Endpoint, Connection) {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(
        tls::client_config().unwrap(),
    )));
    let conn = ep
        .connect(to.local_addr().unwrap(), tls::SERVER_NAME)
        .unwrap()
        .await
        .unwrap();
    (ep, conn)
}

/// Whether the server closed `conn` as unauthenticated.
async fn refused(conn: &Connection) -> bool {
    matches!(
        tokio::time::timeout(SEC, conn.closed()).await,
        Ok(ConnectionError::ApplicationClosed(c)) if c.error_code == AUTH_FAILED
    )
}

#[tokio::test]
async fn a_proof_from_another_connection_and_an_oversized_hello_are_refused() {
    let keys = Keys::new(SECRET, None);
    let b = node(2, keys.clone());

    // a full, honest handshake by hand, keeping its proof
    let (_ep, conn) = raw(&b).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let hello = auth::ClientHello::new(&keys, 1, 2, 0).encode();
    send.write_all(&hello).await.unwrap();
    let mut answer = [0; auth::SERVER_HELLO_LEN];
    recv.read_exact(&mut answer).await.unwrap();
    let ekm = export(&conn).ok().unwrap();
    let (_, proof) = auth::client_check(&keys, 2, &ekm, &hello[2..], &answer).unwrap();
    send.write_all(&proof).await.unwrap();
    let mut verdict = [9];
    recv.read_exact(&mut verdict).await.unwrap();
    assert_eq!(verdict, [auth::ACCEPTED]);

    // the same hello and proof replayed on a new connection
    let (_ep2, conn2) = raw(&b).await;
    let (mut send, mut recv) = conn2.open_bi().await.unwrap();
    send.write_all(&hello).await.unwrap();
    recv.read_exact(&mut answer).await.unwrap();
    send.write_all(&proof).await.unwrap();
    assert!(refused(&conn2).await);
    eventually("bad_proof counted", || {
        b.metrics().handshakes_with("server", "bad_proof") == 1
    })
    .await;

    // a 300-byte hello
    let (_ep3, conn3) = raw(&b).await;
    let (mut send, _recv) = conn3.open_bi().await.unwrap();
    let mut big = (300u16).to_be_bytes().to_vec();
    big.extend_from_slice(&[0xa5; 300]);
    send.write_all(&big).await.unwrap();
    assert!(refused(&conn3).await);
    eventually("malformed counted", || {
        b.metrics().handshakes_with("server", "malformed") == 1
    })
    .await;

    // a connection that never says anything is closed after the handshake timeout
    let short = Limits {
        handshake_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let c = node_with(3, keys.clone(), short);
    let (_ep4, conn4) = raw(&c).await;
    let closed = tokio::time::timeout(SEC, conn4.closed()).await;
    assert!(closed.is_ok(), "a silent connection must not be held");
    eventually("timeout counted", || {
        c.metrics().handshakes_with("server", "timeout") == 1
    })
    .await;
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test]
async fn deadlines_cancel_the_work_and_sizes_are_bounded() {
    let limits = Limits {
        max_request_bytes: 1000,
        max_reply_bytes: 2000,
        ..Limits::default()
    };
    let a = node_with(1, Keys::new(SECRET, None), limits.clone());
    let b = node_with(2, Keys::new(SECRET, None), limits);
    let to = addr(&b);
    let t = Instant::now();
    let e = a
        .call(2, &to, Op(7), Bytes::new(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(e, RpcError::Timeout { .. }) && !e.not_sent(),
        "{e:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(3));
    let served_cancelled = || {
        b.metrics()
            .served
            .get_or_create(&metrics::OpOutcome {
                op: "unknown",
                outcome: "cancelled",
            })
            .get()
    };
    eventually("the server to stop the abandoned work", || {
        served_cancelled() == 1
    })
    .await;

    match a.call(2, &to, Op(5), Bytes::from(vec![0; 1001]), SEC).await {
        Err(RpcError::Remote { fault, .. }) => assert_eq!(fault.status, 413),
        other => panic!("{other:?}"),
    }
    assert!(
        a.call(
            2,
            &to,
            Op(8),
            Bytes::from(1999u32.to_be_bytes().to_vec()),
            SEC
        )
        .await
        .is_ok()
    );
    match a
        .call(
            2,
            &to,
            Op(8),
            Bytes::from(2001u32.to_be_bytes().to_vec()),
            SEC,
        )
        .await
    {
        Err(RpcError::Remote { fault, .. }) => assert_eq!(fault.code, "reply_too_large"),
        other => panic!("{other:?}"),
    }
    // the connection survived all of it
    assert!(a.call(2, &to, Op::PING, Bytes::new(), SEC).await.is_ok());
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_node_fails_fast_and_is_retried_after_a_backoff() {
    let a = node(1, Keys::new(SECRET, None));
    // a bound, silent UDP port: nothing answers
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap().to_string();
    let t = Instant::now();
    let e = a
        .call(2, &to, Op::PING, Bytes::new(), Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(e, RpcError::Unreachable { .. }) && e.not_sent(),
        "{e:?}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "bounded by connect_timeout"
    );
    let t = Instant::now();
    let e = a
        .call(2, &to, Op::PING, Bytes::new(), SEC)
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::Unreachable { .. }));
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "remembered, not dialed again"
    );
    // the node answers at another address: that one is dialed at once
    let b = node(2, Keys::new(SECRET, None));
    a.call(2, &addr(&b), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A call that runs out of time while another call to the same peer is dialling answers by
/// its deadline (it used to wait for that dial, up to the connect timeout, before answering:
/// a produce re-placed after its owner froze took 1.5 s instead of 0.8 s).
#[tokio::test]
async fn a_call_that_times_out_behind_a_dial_answers_by_its_deadline() {
    let a = node(1, Keys::new(SECRET, None));
    // a bound, silent UDP port: a dial there takes the whole connect timeout
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap().to_string();
    let dialling = {
        let (a, to) = (a.clone(), to.clone());
        tokio::spawn(async move {
            a.call(2, &to, Op::PING, Bytes::new(), Duration::from_secs(10))
                .await
        })
    };
    // the second call waits behind the dial, and runs out first
    // (one thread: the spawned call runs until it waits for the dial, holding the peer)
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!dialling.is_finished());
    let t = Instant::now();
    let e = a
        .call(2, &to, Op::PING, Bytes::new(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::Timeout { .. }), "{e:?}");
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "answered after {:?}, past its 300 ms deadline",
        t.elapsed()
    );
    assert!(dialling.await.unwrap().is_err());
    a.shutdown().await;
}

/// A node that comes up where a dial just failed: a call trusts the remembered failure for
/// its backoff, a probe dials it at once (forget once declared a member that had just
/// restarted lost, from a remembered failure).
#[tokio::test]
async fn a_probe_dials_a_node_a_remembered_failure_says_is_unreachable() {
    let a = node(1, Keys::new(SECRET, None));
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap();
    // a failed dial is remembered for its backoff (250 ms at first)
    let _ = a
        .call(2, &to.to_string(), Op::PING, Bytes::new(), SEC)
        .await;
    drop(silent);
    let b = Rpc::bind(
        RpcConfig {
            node_id: 2,
            bind: to,
            keys: Keys::new(SECRET, None),
            features: 0,
            limits: Limits::default(),
        },
        Arc::new(Echo),
        Arc::new(RpcMetrics::default()),
    )
    .unwrap();
    let e = a
        .call(2, &to.to_string(), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap_err();
    assert!(e.not_sent(), "a call trusts the remembered failure: {e:?}");
    a.probe(2, &to.to_string(), SEC).await.unwrap();
    a.call(2, &to.to_string(), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A node that comes up where a dial just failed and calls us first: its proven handshake
/// is news that it is up, so our next call dials it rather than answering from the
/// remembered failure (a move after a member's restart failed once on a stale failure).
#[tokio::test]
async fn a_node_that_called_us_is_dialled_despite_a_remembered_failure() {
    let a = node(1, Keys::new(SECRET, None));
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = silent.local_addr().unwrap();
    let _ = a
        .call(2, &to.to_string(), Op::PING, Bytes::new(), SEC)
        .await;
    drop(silent);
    let b = Rpc::bind(
        RpcConfig {
            node_id: 2,
            bind: to,
            keys: Keys::new(SECRET, None),
            features: 0,
            limits: Limits::default(),
        },
        Arc::new(Echo),
        Arc::new(RpcMetrics::default()),
    )
    .unwrap();
    let e = a
        .call(2, &to.to_string(), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap_err();
    assert!(e.not_sent(), "still the remembered failure: {e:?}");
    b.call(1, &addr(&a), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap();
    a.call(2, &to.to_string(), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn silent_clients_cannot_hold_every_handshake_slot_of_an_address_for_long() {
    let limits = Limits {
        max_handshaking_per_network: 2,
        hello_timeout: Duration::from_secs(10),
        handshake_timeout: Duration::from_millis(800),
        ..Limits::default()
    };
    let b = node_with(2, Keys::new(SECRET, None), limits);
    let (_e1, c1) = raw(&b).await;
    let (_e2, c2) = raw(&b).await;
    // a third from the same address, while two sit in their handshake: refused
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(
        tls::client_config().unwrap(),
    )));
    let third = ep
        .connect(b.local_addr().unwrap(), tls::SERVER_NAME)
        .unwrap()
        .await;
    assert!(
        third.is_err(),
        "a third handshake from one address must be refused"
    );
    assert!(b.metrics().connections_refused.get() >= 1);
    // the silent ones are closed at the handshake timeout, and an honest peer gets in
    for c in [&c1, &c2] {
        assert!(tokio::time::timeout(SEC, c.closed()).await.is_ok());
    }
    let a = node(1, Keys::new(SECRET, None));
    a.call(2, &addr(&b), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A bare client endpoint on `ip` (any 127/8 address works on Linux's loopback).
fn client_on(ip: &str) -> quinn::Endpoint {
    let mut ep = quinn::Endpoint::client(format!("{ip}:0").parse().unwrap()).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(
        tls::client_config().unwrap(),
    )));
    ep
}

#[tokio::test]
async fn strangers_holding_every_shared_handshake_slot_cannot_keep_a_member_out() {
    let limits = Limits {
        max_handshaking: 2,
        max_handshaking_per_network: 2,
        reserved_for_members: 1,
        handshake_timeout: Duration::from_secs(20),
        hello_timeout: Duration::from_secs(20),
        ..Limits::default()
    };
    let b = node_with(2, Keys::new(SECRET, None), limits);
    let to = b.local_addr().unwrap();
    // two silent strangers from another network take both shared slots
    let stranger = client_on("127.0.1.1");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            stranger
                .connect(to, tls::SERVER_NAME)
                .unwrap()
                .await
                .unwrap(),
        );
    }
    // a third stranger is refused, and so is a member the node does not know yet
    assert!(
        stranger
            .connect(to, tls::SERVER_NAME)
            .unwrap()
            .await
            .is_err()
    );
    let a = node(1, Keys::new(SECRET, None));
    let e = a
        .call(2, &addr(&b), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap_err();
    assert!(e.not_sent(), "{e:?}");
    // once the node knows its members' addresses, a member gets a reserved slot; a stranger
    // from the member's IP (another port) does not
    let a2 = node(3, Keys::new(SECRET, None));
    b.set_known_peers([a2.local_addr().unwrap()]);
    let same_ip = client_on("127.0.0.1");
    assert!(
        same_ip
            .connect(to, tls::SERVER_NAME)
            .unwrap()
            .await
            .is_err()
    );
    a2.call(2, &addr(&b), Op::PING, Bytes::new(), SEC)
        .await
        .unwrap();
    drop(held);
    for n in [a, a2, b] {
        n.shutdown().await;
    }
}
