//! Remote credentials sealed under the cluster secret.
//!
//! A remote's password is needed by every node that sends to it, so it has to live in the
//! replicated catalog; it must never be readable there, in a Raft snapshot, in the archive's
//! catalog snapshot or in any response. The node that takes the password seals it at once
//! and drops it: AES-256-GCM under a key derived with HKDF-SHA-256 from the cluster secret,
//! a random 96-bit nonce per seal, and the remote's identity (name, id, URL, username, the
//! CA bundle's SHA-256, the key's id) as associated data. A ciphertext copied onto another
//! remote, or kept after the URL, user or CA changed, fails to open: changing any of them
//! takes the password again.
//!
//! `cluster_secret_previous` opens (never seals) during a rotation; [`CredentialKeys::reseal`]
//! moves a credential to the current key.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::hkdf::{HKDF_SHA256, KeyType, Salt};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
pub use narad_core::catalog::SealedCredential;

/// Shortest cluster secret that may seal: 256 bits if it is random bytes.
pub const MIN_SECRET_BYTES: usize = 32;
/// Longest password a remote may have (it is sent in a header on every request).
pub const MAX_PASSWORD_BYTES: usize = 1024;

const SALT: &[u8] = b"narad remote credentials v1: salt";
const KEY_INFO: &[u8] = b"narad remote credentials v1: aes-256-gcm key";
const ID_INFO: &[u8] = b"narad remote credentials v1: key id";
const TAG_LEN: usize = 16;

/// What a credential is bound to: opening it for any other identity fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteIdentity<'a> {
    pub name: &'a str,
    /// The remote's incarnation: a remote deleted and added again under the same name does
    /// not open its predecessor's credential.
    pub id: u64,
    /// The canonical URL ([`crate::guard::RemoteUrl`]).
    pub url: &'a str,
    pub username: &'a str,
    /// SHA-256 of the CA bundle the remote is verified with; `None`: the system roots.
    pub ca_sha256: Option<[u8; 32]>,
}

impl RemoteIdentity<'_> {
    /// The associated data: every field length-prefixed, so no two identities encode alike.
    fn aad(&self, key_id: &[u8; 8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + self.name.len() + self.url.len());
        for field in [
            self.name.as_bytes(),
            self.url.as_bytes(),
            self.username.as_bytes(),
        ] {
            out.extend_from_slice(&(field.len() as u32).to_be_bytes());
            out.extend_from_slice(field);
        }
        out.extend_from_slice(&self.id.to_be_bytes());
        match &self.ca_sha256 {
            Some(h) => {
                out.push(1);
                out.extend_from_slice(h);
            }
            None => out.push(0),
        }
        out.extend_from_slice(key_id);
        out
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error(
        "the cluster secret is shorter than {MIN_SECRET_BYTES} bytes: it cannot seal credentials"
    )]
    WeakSecret,
    #[error("the password is empty or longer than {MAX_PASSWORD_BYTES} bytes")]
    Password,
    #[error(
        "the credential was sealed under another cluster secret (key id {found}); set cluster_secret_previous to the secret it was sealed with"
    )]
    UnknownKey { found: String },
    #[error(
        "the credential does not open for this remote: it was altered, or sealed for another name, id, URL, user or CA"
    )]
    Authentication,
    #[error("the sealed credential is malformed")]
    Malformed,
}

struct Key {
    id: [u8; 8],
    aead: LessSafeKey,
}

struct Len(usize);

impl KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl Key {
    fn derive(secret: &[u8]) -> Result<Self, SealError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(SealError::WeakSecret);
        }
        let prk = Salt::new(HKDF_SHA256, SALT).extract(secret);
        let (mut key, mut id) = ([0u8; 32], [0u8; 8]);
        for (info, out) in [(KEY_INFO, &mut key[..]), (ID_INFO, &mut id[..])] {
            prk.expand(&[info], Len(out.len()))
                .and_then(|okm| okm.fill(out))
                .expect("8 and 32 bytes are valid HKDF-SHA256 output lengths");
        }
        let aead = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &key).expect("32 bytes is an AES-256 key"),
        );
        Ok(Self { id, aead })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The keys derived from `cluster_secret` (seals and opens) and `cluster_secret_previous`
/// (opens only).
pub struct CredentialKeys {
    current: Key,
    previous: Option<Key>,
}

impl std::fmt::Debug for CredentialKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialKeys")
            .field("current_id", &hex(&self.current.id))
            .field("previous_id", &self.previous.as_ref().map(|k| hex(&k.id)))
            .finish_non_exhaustive()
    }
}

impl CredentialKeys {
    pub fn derive(current: &[u8], previous: Option<&[u8]>) -> Result<Self, SealError> {
        Ok(Self {
            current: Key::derive(current)?,
            previous: previous.map(Key::derive).transpose()?,
        })
    }

    /// The current key's id (hex), as sealed credentials name it.
    pub fn current_id(&self) -> String {
        hex(&self.current.id)
    }

    /// The previous key's id (hex), when there is a previous secret.
    pub fn previous_id(&self) -> Option<String> {
        self.previous.as_ref().map(|k| hex(&k.id))
    }

    /// Seals `password` for `identity` under the current key.
    pub fn seal(
        &self,
        identity: &RemoteIdentity<'_>,
        password: &str,
    ) -> Result<SealedCredential, SealError> {
        if password.is_empty() || password.len() > MAX_PASSWORD_BYTES {
            return Err(SealError::Password);
        }
        let mut nonce = [0u8; NONCE_LEN];
        #[allow(clippy::disallowed_methods)] // a sealing nonce: from the OS, never seeded
        aws_lc_rs::rand::fill(&mut nonce).expect("the OS random source works");
        let mut data = password.as_bytes().to_vec();
        self.current
            .aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(identity.aad(&self.current.id)),
                &mut data,
            )
            .expect("AES-GCM seals any password this short");
        Ok(SealedCredential {
            key_id: hex(&self.current.id),
            nonce: B64.encode(nonce),
            ciphertext: B64.encode(&data),
        })
    }

    /// Opens `sealed` for `identity` with whichever key sealed it.
    pub fn open(
        &self,
        identity: &RemoteIdentity<'_>,
        sealed: &SealedCredential,
    ) -> Result<String, SealError> {
        let key = [Some(&self.current), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .find(|k| hex(&k.id) == sealed.key_id)
            .ok_or_else(|| SealError::UnknownKey {
                found: sealed.key_id.chars().take(16).collect(),
            })?;
        let nonce: [u8; NONCE_LEN] = B64
            .decode(&sealed.nonce)
            .ok()
            .and_then(|n| n.try_into().ok())
            .ok_or(SealError::Malformed)?;
        let mut data = B64
            .decode(&sealed.ciphertext)
            .map_err(|_| SealError::Malformed)?;
        if data.len() < TAG_LEN || data.len() > MAX_PASSWORD_BYTES + TAG_LEN {
            return Err(SealError::Malformed);
        }
        let plain = key
            .aead
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(identity.aad(&key.id)),
                &mut data,
            )
            .map_err(|_| SealError::Authentication)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SealError::Malformed)
    }

    /// `sealed` under the current key (as it is, if the current key sealed it): for moving
    /// every credential off a previous secret before it is dropped.
    pub fn reseal(
        &self,
        identity: &RemoteIdentity<'_>,
        sealed: &SealedCredential,
    ) -> Result<Option<SealedCredential>, SealError> {
        let password = self.open(identity, sealed)?;
        if sealed.key_id == self.current_id() {
            return Ok(None);
        }
        self.seal(identity, &password).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[u8] = b"the first cluster secret, 32+ bytes long";
    const B: &[u8] = b"the second cluster secret, also 32+ bytes";

    fn ident(url: &str) -> RemoteIdentity<'_> {
        RemoteIdentity {
            name: "eu",
            id: 7,
            url,
            username: "mirror",
            ca_sha256: None,
        }
    }

    #[test]
    fn a_sealed_password_opens_only_for_its_identity() {
        let keys = CredentialKeys::derive(A, None).unwrap();
        let id = ident("https://eu.example:443/");
        let sealed = keys.seal(&id, "hunter2-but-longer").unwrap();
        assert!(!sealed.ciphertext.contains("hunter2"));
        assert_eq!(keys.open(&id, &sealed).unwrap(), "hunter2-but-longer");
        // every field of the identity is bound
        let others = [
            RemoteIdentity {
                name: "us",
                ..id.clone()
            },
            RemoteIdentity {
                id: 8,
                ..id.clone()
            },
            ident("https://evil.example:443/"),
            RemoteIdentity {
                username: "admin",
                ..id.clone()
            },
            RemoteIdentity {
                ca_sha256: Some([0; 32]),
                ..id.clone()
            },
        ];
        for other in &others {
            assert_eq!(
                keys.open(other, &sealed),
                Err(SealError::Authentication),
                "{other:?}"
            );
        }
        // two seals of one password differ (random nonce)
        assert_ne!(keys.seal(&id, "hunter2-but-longer").unwrap(), sealed);
    }

    #[test]
    fn tampering_is_refused_without_panicking() {
        let keys = CredentialKeys::derive(A, None).unwrap();
        let id = ident("https://eu.example:443/");
        let sealed = keys.seal(&id, "pw-pw-pw").unwrap();
        let mut ct = B64.decode(&sealed.ciphertext).unwrap();
        for i in 0..ct.len() {
            ct[i] ^= 1;
            let bad = SealedCredential {
                ciphertext: B64.encode(&ct),
                ..sealed.clone()
            };
            assert_eq!(keys.open(&id, &bad), Err(SealError::Authentication));
            ct[i] ^= 1;
        }
        for (nonce, ciphertext) in [
            ("", sealed.ciphertext.as_str()),
            ("!!", sealed.ciphertext.as_str()),
            (sealed.nonce.as_str(), ""),
            (sealed.nonce.as_str(), "AAAA"),
        ] {
            let bad = SealedCredential {
                key_id: sealed.key_id.clone(),
                nonce: nonce.into(),
                ciphertext: ciphertext.into(),
            };
            assert_eq!(keys.open(&id, &bad), Err(SealError::Malformed));
        }
    }

    #[test]
    fn a_rotation_opens_old_seals_and_reseals_them_under_the_new_secret() {
        let old = CredentialKeys::derive(A, None).unwrap();
        let id = ident("https://eu.example:443/");
        let sealed = old.seal(&id, "pw-of-the-remote").unwrap();
        // the new secret alone does not know the old key
        let new_only = CredentialKeys::derive(B, None).unwrap();
        assert!(matches!(
            new_only.open(&id, &sealed),
            Err(SealError::UnknownKey { .. })
        ));
        let rotating = CredentialKeys::derive(B, Some(A)).unwrap();
        assert_eq!(rotating.open(&id, &sealed).unwrap(), "pw-of-the-remote");
        let moved = rotating.reseal(&id, &sealed).unwrap().expect("resealed");
        assert_eq!(moved.key_id, rotating.current_id());
        assert_eq!(new_only.open(&id, &moved).unwrap(), "pw-of-the-remote");
        assert_eq!(rotating.reseal(&id, &moved).unwrap(), None);
    }

    #[test]
    fn weak_secrets_and_bad_passwords_are_refused() {
        assert!(matches!(
            CredentialKeys::derive(b"short", None),
            Err(SealError::WeakSecret)
        ));
        assert!(matches!(
            CredentialKeys::derive(A, Some(b"short")),
            Err(SealError::WeakSecret)
        ));
        let keys = CredentialKeys::derive(A, None).unwrap();
        let id = ident("https://eu.example:443/");
        assert_eq!(keys.seal(&id, ""), Err(SealError::Password));
        let long = "x".repeat(MAX_PASSWORD_BYTES + 1);
        assert_eq!(keys.seal(&id, &long), Err(SealError::Password));
        assert!(keys.seal(&id, &long[1..]).is_ok());
    }
}
