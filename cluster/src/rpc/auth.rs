//! The handshake that admits a QUIC connection to the node RPC: both sides prove they know
//! the cluster secret, bound to this TLS session, and say which node they are.
//!
//! TLS gives the connection its keys, not its trust: each process uses a throw-away
//! self-signed certificate that nobody checks beyond the handshake signature. Trust comes
//! from the secret, as an HMAC over a transcript that includes keying material exported from
//! the TLS session ([RFC 5705]/RFC 8446 §7.5). A party in the middle that terminates TLS
//! twice sees two different exports and cannot produce either proof; a proof captured on
//! one connection is worthless on another (fresh export, fresh nonces).
//!
//! On the connection's first bidirectional stream, opened by the client:
//!
//! ```text
//! C→S  u16 len | "NRPC" v=1 | from u64 | to u64 | features u64 | key_id[8] × 2 | nonce_c[32]
//! S→C  "NRPC" v=1 | from u64 | features u64 | key_id[8] | nonce_s[32] | proof_s[32]
//! C→S  proof_c[32]
//! S→C  0x00                                         (accepted; else the connection is closed)
//!
//! K       = HKDF-SHA256(ikm = secret, salt = "narad-rs", info = "rpc-auth v1")
//! key_id  = HMAC(K, "key id")[..8]
//! proof_x = HMAC(K, label_x | export(32, "EXPORTER-narad-rs-rpc-v1") | client hello | server hello without proof)
//! ```
//!
//! The client offers the ids of its current key and, during a rotation, its previous one;
//! the server answers with the first it holds (as its current or previous key), so nodes on
//! either side of a rolling secret change keep talking. The node ids are inside both proofs:
//! a client that reached the wrong node (`to` ≠ the server's id) is refused, and a client
//! learns which node answered, which is what Raft needs of its transport.
//!
//! [RFC 5705]: https://www.rfc-editor.org/rfc/rfc5705

use aws_lc_rs::{hkdf, hmac};

use super::NodeId;

pub const MAGIC: &[u8; 4] = b"NRPC";
pub const VERSION: u8 = 1;
/// Largest client hello a server reads (its length prefix says more: refused).
pub const MAX_HELLO: usize = 256;
pub const CLIENT_HELLO_LEN: usize = 4 + 1 + 8 + 8 + 8 + 8 + 8 + 32;
pub const SERVER_HELLO_LEN: usize = 4 + 1 + 8 + 8 + 8 + 32 + PROOF_LEN;
pub const PROOF_LEN: usize = 32;
pub const EXPORT_LABEL: &[u8] = b"EXPORTER-narad-rs-rpc-v1";
const SERVER_LABEL: &[u8] = b"narad-rs rpc server proof v1";
const CLIENT_LABEL: &[u8] = b"narad-rs rpc client proof v1";
/// The verdict byte a server sends when it admits the client.
pub const ACCEPTED: u8 = 0;

/// One key derived from a cluster secret.
#[derive(Clone)]
pub struct Key {
    hmac: hmac::Key,
    pub id: [u8; 8],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("id", &hex(&self.id)).finish()
    }
}

impl Key {
    pub fn derive(secret: &[u8]) -> Self {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"narad-rs").extract(secret);
        let hmac: hmac::Key = prk
            .expand(&[b"rpc-auth v1"], hmac::HMAC_SHA256)
            .expect("32 bytes is a valid HKDF-SHA256 output length")
            .into();
        let tag = hmac::sign(&hmac, b"key id");
        let mut id = [0; 8];
        id.copy_from_slice(&tag.as_ref()[..8]);
        Self { hmac, id }
    }

    /// A key for the endpoint's stateless resets: stable across restarts of this node (so a
    /// restarted peer's reset ends a stale connection at once), different for every node.
    pub fn reset_key(&self, node: NodeId) -> hmac::Key {
        let mut ctx = hmac::Context::with_key(&self.hmac);
        ctx.update(b"stateless reset v1");
        ctx.update(&node.to_be_bytes());
        hmac::Key::new(hmac::HMAC_SHA256, ctx.sign().as_ref())
    }

    fn proof(&self, label: &[u8], ekm: &[u8], client_hello: &[u8], server_head: &[u8]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.hmac);
        for part in [label, ekm, client_hello, server_head] {
            ctx.update(&(part.len() as u32).to_be_bytes());
            ctx.update(part);
        }
        let mut out = [0; 32];
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }
}

/// The keys a node holds: the current one, and the previous one during a rotation.
#[derive(Clone, Debug)]
pub struct Keys {
    pub current: Key,
    pub previous: Option<Key>,
}

impl Keys {
    pub fn new(current: &[u8], previous: Option<&[u8]>) -> Self {
        Self {
            current: Key::derive(current),
            previous: previous.map(Key::derive),
        }
    }

    fn find(&self, id: &[u8; 8]) -> Option<&Key> {
        if *id == [0; 8] {
            return None;
        }
        std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .find(|k| k.id == *id)
    }
}

/// Why a handshake did not admit a connection. `label` is the metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("malformed handshake: {0}")]
    Malformed(&'static str),
    #[error("the peer is node {got}, not node {expected}")]
    WrongNode { expected: NodeId, got: NodeId },
    #[error("the peer holds none of our cluster secret keys")]
    UnknownKey,
    #[error("the peer's proof of the cluster secret is wrong")]
    BadProof,
}

impl Refusal {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::WrongNode { .. } => "wrong_node",
            Self::UnknownKey => "unknown_key",
            Self::BadProof => "bad_proof",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    pub from: NodeId,
    pub to: NodeId,
    pub features: u64,
    pub key_ids: [[u8; 8]; 2],
    pub nonce: [u8; 32],
}

impl ClientHello {
    pub fn new(keys: &Keys, from: NodeId, to: NodeId, features: u64) -> Self {
        Self {
            from,
            to,
            features,
            key_ids: [
                keys.current.id,
                keys.previous.as_ref().map_or([0; 8], |k| k.id),
            ],
            nonce: random(),
        }
    }

    /// The hello with its length prefix, as sent.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(2 + CLIENT_HELLO_LEN);
        b.extend_from_slice(&(CLIENT_HELLO_LEN as u16).to_be_bytes());
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.extend_from_slice(&self.from.to_be_bytes());
        b.extend_from_slice(&self.to.to_be_bytes());
        b.extend_from_slice(&self.features.to_be_bytes());
        b.extend_from_slice(&self.key_ids[0]);
        b.extend_from_slice(&self.key_ids[1]);
        b.extend_from_slice(&self.nonce);
        b
    }

    /// Parses a hello's body (after the length prefix). A longer body from a later version
    /// is read for what this version knows; it is bounded by [`MAX_HELLO`] before this.
    pub fn decode(b: &[u8]) -> Result<Self, Refusal> {
        if b.len() < CLIENT_HELLO_LEN {
            return Err(Refusal::Malformed("client hello too short"));
        }
        let mut r = Reader(b);
        if r.take::<4>() != *MAGIC {
            return Err(Refusal::Malformed("not a narad rpc hello"));
        }
        if r.take::<1>()[0] != VERSION {
            return Err(Refusal::Malformed("unknown handshake version"));
        }
        Ok(Self {
            from: r.u64(),
            to: r.u64(),
            features: r.u64(),
            key_ids: [r.take(), r.take()],
            nonce: r.take(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    pub from: NodeId,
    pub features: u64,
    pub key_id: [u8; 8],
    pub nonce: [u8; 32],
}

impl ServerHello {
    /// The part of the hello the proofs cover.
    pub fn head(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(SERVER_HELLO_LEN);
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.extend_from_slice(&self.from.to_be_bytes());
        b.extend_from_slice(&self.features.to_be_bytes());
        b.extend_from_slice(&self.key_id);
        b.extend_from_slice(&self.nonce);
        b
    }

    pub fn decode(b: &[u8; SERVER_HELLO_LEN]) -> Result<(Self, [u8; PROOF_LEN]), Refusal> {
        let mut r = Reader(b);
        if r.take::<4>() != *MAGIC {
            return Err(Refusal::Malformed("not a narad rpc server"));
        }
        if r.take::<1>()[0] != VERSION {
            return Err(Refusal::Malformed("unknown handshake version"));
        }
        let hello = Self {
            from: r.u64(),
            features: r.u64(),
            key_id: r.take(),
            nonce: r.take(),
        };
        Ok((hello, r.take()))
    }
}

/// The server's side once it has read the client's hello: checks it, picks the key, and
/// returns its hello (with proof) and what it expects as the client's proof.
pub fn server_answer(
    keys: &Keys,
    me: NodeId,
    features: u64,
    ekm: &[u8],
    client_raw: &[u8],
) -> Result<(ClientHello, Vec<u8>, [u8; PROOF_LEN], Key), Refusal> {
    let hello = ClientHello::decode(client_raw)?;
    if hello.to != me {
        return Err(Refusal::WrongNode {
            expected: hello.to,
            got: me,
        });
    }
    if hello.from == 0 {
        return Err(Refusal::Malformed("node id 0"));
    }
    let key = hello
        .key_ids
        .iter()
        .find_map(|id| keys.find(id))
        .ok_or(Refusal::UnknownKey)?
        .clone();
    let answer = ServerHello {
        from: me,
        features,
        key_id: key.id,
        nonce: random(),
    };
    let head = answer.head();
    let mut out = head.clone();
    out.extend_from_slice(&key.proof(SERVER_LABEL, ekm, client_raw, &head));
    let expect = key.proof(CLIENT_LABEL, ekm, client_raw, &head);
    Ok((hello, out, expect, key))
}

/// The client's side once it has the server's hello: checks the server is `expected` and
/// knows the secret, and returns the client's proof and the server's hello.
pub fn client_check(
    keys: &Keys,
    expected: NodeId,
    ekm: &[u8],
    client_raw: &[u8],
    server: &[u8; SERVER_HELLO_LEN],
) -> Result<(ServerHello, [u8; PROOF_LEN]), Refusal> {
    let (hello, proof) = ServerHello::decode(server)?;
    if hello.from != expected {
        return Err(Refusal::WrongNode {
            expected,
            got: hello.from,
        });
    }
    let key = keys.find(&hello.key_id).ok_or(Refusal::UnknownKey)?;
    let head = hello.head();
    verify(key, SERVER_LABEL, ekm, client_raw, &head, &proof)?;
    Ok((
        hello.clone(),
        key.proof(CLIENT_LABEL, ekm, client_raw, &head),
    ))
}

/// Constant-time check of a client's proof against the one the server expects.
pub fn check_client_proof(
    expected: &[u8; PROOF_LEN],
    got: &[u8; PROOF_LEN],
) -> Result<(), Refusal> {
    aws_lc_rs::constant_time::verify_slices_are_equal(expected, got).map_err(|_| Refusal::BadProof)
}

fn verify(
    key: &Key,
    label: &[u8],
    ekm: &[u8],
    client_raw: &[u8],
    head: &[u8],
    proof: &[u8; PROOF_LEN],
) -> Result<(), Refusal> {
    check_client_proof(&key.proof(label, ekm, client_raw, head), proof)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().expect("split at N")
    }

    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
}

pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0; N];
    #[allow(clippy::disallowed_methods)] // challenges and proofs: from the OS, never seeded
    getrandom::fill(&mut b).expect("the OS random source works");
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[u8] = b"0123456789abcdef0123456789abcdef-a";
    const B: &[u8] = b"0123456789abcdef0123456789abcdef-b";

    fn run(client: &Keys, server: &Keys, ekm_c: &[u8], ekm_s: &[u8]) -> Result<(), Refusal> {
        let hello = ClientHello::new(client, 1, 2, 0).encode();
        let (_, answer, expect, _) = server_answer(server, 2, 0, ekm_s, &hello[2..])?;
        let (_, proof) = client_check(client, 2, ekm_c, &hello[2..], &answer.try_into().unwrap())?;
        check_client_proof(&expect, &proof)
    }

    #[test]
    fn same_secret_admits_and_another_does_not() {
        let ekm = [7u8; 32];
        assert_eq!(
            run(&Keys::new(A, None), &Keys::new(A, None), &ekm, &ekm),
            Ok(())
        );
        assert_eq!(
            run(&Keys::new(B, None), &Keys::new(A, None), &ekm, &ekm),
            Err(Refusal::UnknownKey)
        );
    }

    #[test]
    fn a_rotation_keeps_old_and_new_nodes_talking() {
        let ekm = [1u8; 32];
        let rotated = Keys::new(B, Some(A));
        let old = Keys::new(A, None);
        assert_eq!(run(&rotated, &old, &ekm, &ekm), Ok(()));
        assert_eq!(run(&old, &rotated, &ekm, &ekm), Ok(()));
        assert_eq!(run(&rotated, &rotated, &ekm, &ekm), Ok(()));
        assert_eq!(
            run(&Keys::new(B, None), &old, &ekm, &ekm),
            Err(Refusal::UnknownKey)
        );
    }

    #[test]
    fn a_different_session_export_fails_the_proofs() {
        // a party in the middle terminating TLS twice sees two exports
        let k = Keys::new(A, None);
        assert_eq!(run(&k, &k, &[1; 32], &[2; 32]), Err(Refusal::BadProof));
    }

    #[test]
    fn the_wrong_node_is_refused_on_both_sides() {
        let k = Keys::new(A, None);
        let hello = ClientHello::new(&k, 1, 3, 0).encode();
        assert_eq!(
            server_answer(&k, 2, 0, &[0; 32], &hello[2..]).unwrap_err(),
            Refusal::WrongNode {
                expected: 3,
                got: 2
            }
        );
        let hello = ClientHello::new(&k, 1, 2, 0).encode();
        let (_, answer, _, _) = server_answer(&k, 2, 0, &[0; 32], &hello[2..]).unwrap();
        assert_eq!(
            client_check(&k, 5, &[0; 32], &hello[2..], &answer.try_into().unwrap()).unwrap_err(),
            Refusal::WrongNode {
                expected: 5,
                got: 2
            }
        );
    }

    #[test]
    fn malformed_hellos_are_refused_without_panicking() {
        let k = Keys::new(A, None);
        for len in 0..CLIENT_HELLO_LEN + 4 {
            let junk = vec![0xa5; len];
            assert!(server_answer(&k, 2, 0, &[0; 32], &junk).is_err());
        }
        let mut hello = ClientHello::new(&k, 1, 2, 0).encode();
        hello[6] = 9; // version
        assert_eq!(
            server_answer(&k, 2, 0, &[0; 32], &hello[2..]).unwrap_err(),
            Refusal::Malformed("unknown handshake version")
        );
    }
}
