//! The catalog snapshot: every topic's metadata (fan-out links included), the fan-out cursor
//! positions and, when a cluster secret is configured, every user, as one object in the
//! archive, so a node that lost its disk comes back whole (`docs/archive-format.md`).
//!
//! ```text
//! header (38 bytes, big-endian):
//!   magic "NARADCAT" | version u8 = 1 | mode u8 | key id [8] | written_at_ms i64 | nonce [12]
//! mode 1 (sealed):   header | AES-256-GCM(JSON body) | tag [16]    (AAD = the header)
//! mode 0 (unsealed): header | JSON body | crc32c(header | body) u32
//! ```
//!
//! The key is derived from the cluster secret with HKDF-SHA256 (a salt and an info string
//! that name the purpose), so the same secret can key other uses (node-to-node auth) without
//! two uses ever sharing a key. The key id is derived the same way under another info string:
//! it tells which configured secret (current or previous) sealed an object, without revealing
//! either. The nonce is 96 random bits per object; at one object per tiering interval a key
//! seals far fewer than the 2^32 objects random nonces allow.
//!
//! Users (argon2 hashes, grants) are only ever written sealed: without a secret the snapshot
//! holds topics and links only, and an unsealed snapshot's users are never restored (anyone
//! who can write the bucket could otherwise plant an admin).

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hkdf::{HKDF_SHA256, KeyType, Salt};
use narad_auth::UserRecord;
use narad_core::broker::TopicMeta;
use narad_core::catalog::{RemoteChild, RemoteMeta};
use serde::{Deserialize, Serialize};

/// The one object, `<prefix>/_catalog/catalog.bin`, replaced whole by each upload (an S3 PUT
/// is atomic: readers see the old or the new object, never a mix). A snapshot a restore could
/// not open is first copied beside it (`_catalog/unopened-<ms>.bin`), so the node's own
/// uploads never destroy the only copy of its users.
pub const CATALOG_DIR: &str = "_catalog";
pub const CATALOG_FILE: &str = "catalog.bin";
pub const CATALOG_FORMAT_VERSION: u8 = 1;
const MAGIC: [u8; 8] = *b"NARADCAT";
pub const HEADER_LEN: usize = 38;
const TAG_LEN: usize = 16;
const CRC_LEN: usize = 4;
const MODE_UNSEALED: u8 = 0;
const MODE_SEALED: u8 = 1;
/// Largest snapshot a restore reads (and an upload writes); larger ones are refused whole.
pub const MAX_CATALOG_BYTES: u64 = 512 << 20;
/// Shortest cluster secret accepted: 256 bits if it is random bytes.
pub const MIN_SECRET_BYTES: usize = 32;

const HKDF_SALT: &[u8] = b"narad cluster secret v1";
const SNAPSHOT_KEY_INFO: &[u8] = b"narad catalog snapshot v1: aes-256-gcm key";
const KEY_ID_INFO: &[u8] = b"narad catalog snapshot v1: key id";

/// What the snapshot holds. Stale cursor positions are harmless: a restore never puts a cursor
/// ahead of what the restored parent holds, they only make the "missed records" count larger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogSnapshot {
    /// Every topic, with its incarnation id, settings, owner, schemas and fan-out link.
    pub topics: Vec<TopicMeta>,
    #[serde(default)]
    pub cursors: Vec<CursorPosition>,
    /// Every user; `None` when the snapshot is unsealed or security is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<Vec<UserRecord>>,
    /// Every remote (their passwords sealed under the cluster secret); only in a sealed
    /// snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remotes: Vec<RemoteMeta>,
    /// Every remote child; only in a sealed snapshot (they name remotes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_children: Vec<RemoteChild>,
}

/// Where one fan-out cursor was: the next parent offset to copy to `child`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CursorPosition {
    pub child: String,
    /// The link's epoch when the position was taken; another epoch's position is ignored.
    pub epoch: u64,
    pub parent_partition: u32,
    pub next_offset: u64,
}

/// Which configured secret opened a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUsed {
    /// Unsealed: no key.
    None,
    Current,
    Previous,
}

/// A snapshot read back from the archive.
#[derive(Debug)]
pub struct Opened {
    pub snapshot: CatalogSnapshot,
    pub written_at_ms: i64,
    pub key: KeyUsed,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{0} bytes is too short for a catalog snapshot")]
    Truncated(usize),
    #[error("not a catalog snapshot (bad magic)")]
    BadMagic,
    #[error(
        "catalog snapshot format version {0} is unknown to this narad (it reads version {CATALOG_FORMAT_VERSION})"
    )]
    UnsupportedVersion(u8),
    #[error("catalog snapshot sealing mode {0} is unknown")]
    UnknownMode(u8),
    #[error("the catalog snapshot is sealed and no cluster_secret is configured")]
    NoSecret,
    #[error(
        "the catalog snapshot was sealed under another cluster secret (key id {found}; cluster_secret has {current}{previous})"
    )]
    UnknownKey {
        found: String,
        current: String,
        previous: String,
    },
    #[error(
        "the catalog snapshot failed authentication (AES-GCM): it was altered or corrupted in the archive"
    )]
    Authentication,
    #[error("the unsealed catalog snapshot failed its checksum: it is corrupted")]
    Checksum,
    #[error("the catalog snapshot's contents are unreadable: {0}")]
    Contents(#[source] serde_json::Error),
}

/// One derived key and its id.
struct DerivedKey {
    id: [u8; 8],
    key: LessSafeKey,
}

impl DerivedKey {
    fn derive(secret: &[u8]) -> Self {
        let prk = Salt::new(HKDF_SHA256, HKDF_SALT).extract(secret);
        let mut key = [0u8; 32];
        let mut id = [0u8; 8];
        prk.expand(&[SNAPSHOT_KEY_INFO], Len(key.len()))
            .and_then(|okm| okm.fill(&mut key))
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        prk.expand(&[KEY_ID_INFO], Len(id.len()))
            .and_then(|okm| okm.fill(&mut id))
            .expect("8 bytes is a valid HKDF-SHA256 output length");
        let key = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &key).expect("32 bytes is an AES-256 key"),
        );
        Self { id, key }
    }
}

struct Len(usize);

impl KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// The snapshot keys derived from `cluster_secret` (seals and opens) and
/// `cluster_secret_previous` (opens only, during a rotation).
pub struct CatalogKeys {
    current: DerivedKey,
    previous: Option<DerivedKey>,
}

impl std::fmt::Debug for CatalogKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogKeys")
            .field("current_id", &hex(&self.current.id))
            .field("previous_id", &self.previous.as_ref().map(|k| hex(&k.id)))
            .finish_non_exhaustive()
    }
}

impl CatalogKeys {
    pub fn derive(current: &[u8], previous: Option<&[u8]>) -> Self {
        Self {
            current: DerivedKey::derive(current),
            previous: previous.map(DerivedKey::derive),
        }
    }

    /// The id of the current key, as written in the headers it seals (for logs).
    pub fn current_id(&self) -> String {
        hex(&self.current.id)
    }

    fn find(&self, id: &[u8]) -> Option<(&DerivedKey, KeyUsed)> {
        if self.current.id == id {
            return Some((&self.current, KeyUsed::Current));
        }
        self.previous
            .as_ref()
            .filter(|k| k.id == id)
            .map(|k| (k, KeyUsed::Previous))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn header(mode: u8, key_id: [u8; 8], written_at_ms: i64, nonce: [u8; NONCE_LEN]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(&MAGIC);
    h.push(CATALOG_FORMAT_VERSION);
    h.push(mode);
    h.extend_from_slice(&key_id);
    h.extend_from_slice(&written_at_ms.to_be_bytes());
    h.extend_from_slice(&nonce);
    debug_assert_eq!(h.len(), HEADER_LEN);
    h
}

/// The object for `snapshot`: sealed under the current key with `keys`, else unsealed and
/// without users (they are dropped here whatever the caller passed).
pub fn seal(snapshot: &CatalogSnapshot, keys: Option<&CatalogKeys>, written_at_ms: i64) -> Vec<u8> {
    match keys {
        Some(keys) => {
            let mut nonce = [0u8; NONCE_LEN];
            #[allow(clippy::disallowed_methods)] // a sealing nonce: from the OS, never seeded
            aws_lc_rs::rand::fill(&mut nonce).expect("the OS random source works");
            let mut out = header(MODE_SEALED, keys.current.id, written_at_ms, nonce);
            let mut body = serde_json::to_vec(snapshot).expect("the catalog serialises");
            keys.current
                .key
                .seal_in_place_append_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(&out[..]),
                    &mut body,
                )
                .expect("AES-GCM seals any body below 64 GiB");
            out.extend_from_slice(&body);
            out
        }
        None => {
            let unsealed = CatalogSnapshot {
                users: None,
                remotes: Vec::new(),
                remote_children: Vec::new(),
                ..snapshot.clone()
            };
            let mut out = header(MODE_UNSEALED, [0; 8], written_at_ms, [0; NONCE_LEN]);
            out.extend_from_slice(&serde_json::to_vec(&unsealed).expect("the catalog serialises"));
            let crc = crc32c::crc32c(&out);
            out.extend_from_slice(&crc.to_be_bytes());
            out
        }
    }
}

/// Reads an object back. The bytes come from the bucket and are untrusted: every length is
/// checked before use, and a sealed body is parsed only after it authenticated. An unsealed
/// snapshot's users are dropped (see the module doc).
pub fn open(bytes: &[u8], keys: Option<&CatalogKeys>) -> Result<Opened, OpenError> {
    if bytes.len() < HEADER_LEN {
        return Err(OpenError::Truncated(bytes.len()));
    }
    let (head, rest) = bytes.split_at(HEADER_LEN);
    if head[..8] != MAGIC {
        return Err(OpenError::BadMagic);
    }
    if head[8] != CATALOG_FORMAT_VERSION {
        return Err(OpenError::UnsupportedVersion(head[8]));
    }
    let key_id = &head[10..18];
    let written_at_ms = i64::from_be_bytes(head[18..26].try_into().expect("8 bytes"));
    let nonce: [u8; NONCE_LEN] = head[26..38].try_into().expect("12 bytes");
    match head[9] {
        MODE_SEALED => {
            if rest.len() < TAG_LEN {
                return Err(OpenError::Truncated(bytes.len()));
            }
            let keys = keys.ok_or(OpenError::NoSecret)?;
            let (key, used) = keys.find(key_id).ok_or_else(|| OpenError::UnknownKey {
                found: hex(key_id),
                current: hex(&keys.current.id),
                previous: keys
                    .previous
                    .as_ref()
                    .map(|k| format!(", cluster_secret_previous has {}", hex(&k.id)))
                    .unwrap_or_default(),
            })?;
            let mut body = rest.to_vec();
            let plain = key
                .key
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(head),
                    &mut body,
                )
                .map_err(|_| OpenError::Authentication)?;
            let snapshot = serde_json::from_slice(plain).map_err(OpenError::Contents)?;
            Ok(Opened {
                snapshot,
                written_at_ms,
                key: used,
            })
        }
        MODE_UNSEALED => {
            if rest.len() < CRC_LEN {
                return Err(OpenError::Truncated(bytes.len()));
            }
            let (signed, crc) = bytes.split_at(bytes.len() - CRC_LEN);
            if crc32c::crc32c(signed).to_be_bytes() != crc {
                return Err(OpenError::Checksum);
            }
            let mut snapshot: CatalogSnapshot =
                serde_json::from_slice(&signed[HEADER_LEN..]).map_err(OpenError::Contents)?;
            if snapshot.users.take().is_some() {
                tracing::warn!(
                    "an unsealed catalog snapshot lists users; they are ignored (users are only restored from a sealed snapshot)"
                );
            }
            snapshot.remote_children.clear();
            if !std::mem::take(&mut snapshot.remotes).is_empty() {
                tracing::warn!(
                    "an unsealed catalog snapshot lists remotes; they are ignored (remotes are only restored from a sealed snapshot)"
                );
            }
            Ok(Opened {
                snapshot,
                written_at_ms,
                key: KeyUsed::None,
            })
        }
        m => Err(OpenError::UnknownMode(m)),
    }
}

/// SHA-256 of `bytes`, to tell whether the catalog changed since the last upload.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_core::topic::TopicConfig;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-current";
    const OTHER: &[u8] = b"fedcba9876543210fedcba9876543210-previous";

    fn snapshot() -> CatalogSnapshot {
        CatalogSnapshot {
            topics: vec![TopicMeta {
                owner: Some("alice".into()),
                owner_id: Some(3),
                ..TopicMeta::new(7, "orders", 1, TopicConfig::default())
            }],
            cursors: vec![CursorPosition {
                child: "orders-audit".into(),
                epoch: 9,
                parent_partition: 0,
                next_offset: 42,
            }],
            users: Some(vec![UserRecord {
                username: "alice".into(),
                id: 3,
                password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into(),
                root: false,
                grants: Vec::new(),
                created_at_ms: 1,
                updated_at_ms: 2,
                carried_from: None,
                origin: None,
                access_keys: Vec::new(),
            }]),
            remotes: vec![RemoteMeta {
                id: 11,
                name: "dr".into(),
                url: "https://b.example.com/".into(),
                username: "mirror".into(),
                ca_pem: None,
                credential: narad_core::catalog::SealedCredential {
                    key_id: "k".into(),
                    nonce: "n".into(),
                    ciphertext: "c".into(),
                },
                carry_users: false,
                version: 1,
                created_at_ms: 1,
                updated_at_ms: 1,
            }],
            remote_children: Vec::new(),
        }
    }

    #[test]
    fn sealed_round_trip_with_current_and_previous_keys() {
        let keys = CatalogKeys::derive(SECRET, None);
        let obj = seal(&snapshot(), Some(&keys), 1234);
        let o = open(&obj, Some(&keys)).unwrap();
        assert_eq!(o.snapshot, snapshot());
        assert_eq!((o.written_at_ms, o.key), (1234, KeyUsed::Current));
        // the hash never appears in the object in clear
        let hash = b"aGFzaA";
        assert!(!obj.windows(hash.len()).any(|w| w == hash));
        // after a rotation, the old secret opens it as the previous one
        let rotated = CatalogKeys::derive(OTHER, Some(SECRET));
        assert_eq!(open(&obj, Some(&rotated)).unwrap().key, KeyUsed::Previous);
        // two seals of the same snapshot differ (fresh nonce)
        assert_ne!(seal(&snapshot(), Some(&keys), 1234), obj);
    }

    #[test]
    fn wrong_or_missing_key_fails() {
        let obj = seal(&snapshot(), Some(&CatalogKeys::derive(SECRET, None)), 1);
        let e = open(&obj, Some(&CatalogKeys::derive(OTHER, None))).unwrap_err();
        assert!(matches!(e, OpenError::UnknownKey { .. }), "{e}");
        assert!(matches!(open(&obj, None), Err(OpenError::NoSecret)));
    }

    #[test]
    fn any_changed_byte_fails_authentication() {
        let keys = CatalogKeys::derive(SECRET, None);
        let obj = seal(&snapshot(), Some(&keys), 1);
        // every byte after the key id (written_at, nonce, ciphertext, tag) is authenticated
        for i in 18..obj.len() {
            let mut bad = obj.clone();
            bad[i] ^= 0x01;
            assert!(
                matches!(open(&bad, Some(&keys)), Err(OpenError::Authentication)),
                "byte {i}"
            );
        }
        // the key id is authenticated too: pointing it at another configured key fails
        let rotated = CatalogKeys::derive(SECRET, Some(OTHER));
        let mut bad = obj.clone();
        bad[10..18].copy_from_slice(&rotated.previous.as_ref().unwrap().id);
        assert!(matches!(
            open(&bad, Some(&rotated)),
            Err(OpenError::Authentication)
        ));
        let mut bad = obj.clone();
        bad[8] = 2;
        assert!(matches!(
            open(&bad, Some(&keys)),
            Err(OpenError::UnsupportedVersion(2))
        ));
        bad = obj.clone();
        bad[0] = b'X';
        assert!(matches!(open(&bad, Some(&keys)), Err(OpenError::BadMagic)));
        bad = obj.clone();
        bad[9] = 7;
        assert!(matches!(
            open(&bad, Some(&keys)),
            Err(OpenError::UnknownMode(7))
        ));
    }

    #[test]
    fn truncated_and_garbage_objects_fail_cleanly() {
        let keys = CatalogKeys::derive(SECRET, None);
        for obj in [
            seal(&snapshot(), Some(&keys), 1),
            seal(&snapshot(), None, 1),
        ] {
            for len in 0..obj.len() {
                assert!(open(&obj[..len], Some(&keys)).is_err(), "length {len}");
            }
        }
        // random bytes, with and without a valid header in front: errors, never a panic
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..200 {
            let mut b: Vec<u8> = (0..n * 3)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            assert!(open(&b, Some(&keys)).is_err());
            if b.len() >= HEADER_LEN {
                b[..HEADER_LEN].copy_from_slice(&header(
                    (n % 2) as u8,
                    keys.current.id,
                    0,
                    [0; 12],
                ));
                assert!(open(&b, Some(&keys)).is_err());
            }
        }
    }

    #[test]
    fn unsealed_snapshots_carry_no_users_and_detect_corruption() {
        let obj = seal(&snapshot(), None, 5);
        let o = open(&obj, None).unwrap();
        assert_eq!(o.key, KeyUsed::None);
        assert_eq!(o.snapshot.users, None);
        assert_eq!(o.snapshot.topics, snapshot().topics);
        assert!(!String::from_utf8_lossy(&obj).contains("argon2"));
        // a node with a secret reads an unsealed snapshot too (topics and links only)
        let keys = CatalogKeys::derive(SECRET, None);
        assert!(open(&obj, Some(&keys)).is_ok());
        let mut bad = obj.clone();
        bad[HEADER_LEN + 3] ^= 0x20;
        assert!(matches!(open(&bad, None), Err(OpenError::Checksum)));
        // users planted in an unsealed snapshot (with a valid checksum) are ignored
        let mut planted = header(MODE_UNSEALED, [0; 8], 5, [0; 12]);
        planted.extend_from_slice(&serde_json::to_vec(&snapshot()).unwrap());
        let crc = crc32c::crc32c(&planted);
        planted.extend_from_slice(&crc.to_be_bytes());
        let planted = open(&planted, None).unwrap().snapshot;
        assert_eq!(planted.users, None);
        assert!(
            planted.remotes.is_empty(),
            "remotes from an unsealed snapshot"
        );
        assert!(o.snapshot.remotes.is_empty());
    }

    #[test]
    fn keys_are_derived_per_purpose_and_not_shown() {
        let a = CatalogKeys::derive(SECRET, None);
        let b = CatalogKeys::derive(SECRET, None);
        assert_eq!(a.current.id, b.current.id, "deterministic");
        assert_ne!(a.current.id, CatalogKeys::derive(OTHER, None).current.id);
        // the key id is not a prefix of the secret or of the key
        assert!(!SECRET.windows(8).any(|w| w == a.current.id));
        let shown = format!("{a:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
    }
}
