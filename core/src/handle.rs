//! Receipt handles: opaque, unforgeable, and bound to the process that issued them.
//!
//! A handle is base64url (no padding) of
//! `version u8 | epoch u64 | topic_id u64 | partition u32 | offset u64 | nonce u64 |
//! owner_epoch u64 | tag [16]`
//! where `tag` is HMAC-SHA256 (truncated to 16 bytes) over the preceding bytes with a key drawn
//! at random when the process starts, and `epoch` is a random per-process number. A handle from
//! an earlier process (different epoch) is stale, never valid: leases do not survive a restart.
//! The nonce names one lease of one offset, so a superseded handle never settles a later lease.
//! `owner_epoch` is the partition's owner epoch when it was leased (always 0 on a single
//! node): in a cluster a handle from before the partition moved is stale, even on a node
//! the partition later came back to.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const VERSION: u8 = 2;
const BODY_LEN: usize = 1 + 8 + 8 + 4 + 8 + 8 + 8;
const TAG_LEN: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptHandle {
    pub topic_id: u64,
    pub partition: u32,
    pub offset: u64,
    pub nonce: u64,
    pub owner_epoch: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    #[error("receipt handle is malformed")]
    Malformed,
    #[error("receipt handle was issued before the broker restarted; its lease is gone")]
    OtherEpoch,
}

pub struct HandleCodec {
    epoch: u64,
    /// The MAC with the key already absorbed: every consume makes a handle and every settle
    /// checks one, and a clone of this costs less than scheduling the key again.
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for HandleCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleCodec")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl HandleCodec {
    /// A codec with a fresh random epoch and key.
    pub fn random() -> Self {
        let mut seed = [0u8; 40];
        getrandom::fill(&mut seed).expect("operating system random source");
        let mut key = [0u8; 32];
        key.copy_from_slice(&seed[8..]);
        Self::with_key(
            u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")),
            key,
        )
    }

    /// The process's random epoch (different at every start).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn with_key(epoch: u64, key: [u8; 32]) -> Self {
        let keyed = Hmac::<Sha256>::new_from_slice(&key).expect("any key length");
        Self { epoch, keyed }
    }

    fn mac(&self, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(body);
        mac
    }

    fn tag(&self, body: &[u8]) -> [u8; TAG_LEN] {
        let full = self.mac(body).finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&full[..TAG_LEN]);
        tag
    }

    pub fn encode(&self, h: &ReceiptHandle) -> String {
        let mut buf = Vec::with_capacity(BODY_LEN + TAG_LEN);
        buf.push(VERSION);
        buf.extend_from_slice(&self.epoch.to_le_bytes());
        buf.extend_from_slice(&h.topic_id.to_le_bytes());
        buf.extend_from_slice(&h.partition.to_le_bytes());
        buf.extend_from_slice(&h.offset.to_le_bytes());
        buf.extend_from_slice(&h.nonce.to_le_bytes());
        buf.extend_from_slice(&h.owner_epoch.to_le_bytes());
        let tag = self.tag(&buf);
        buf.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(buf)
    }

    pub fn decode(&self, s: &str) -> Result<ReceiptHandle, HandleError> {
        if s.len() > 128 {
            return Err(HandleError::Malformed);
        }
        let buf = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| HandleError::Malformed)?;
        if buf.len() != BODY_LEN + TAG_LEN || buf[0] != VERSION {
            return Err(HandleError::Malformed);
        }
        let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
        if u64_at(1) != self.epoch {
            return Err(HandleError::OtherEpoch);
        }
        let (body, tag) = buf.split_at(BODY_LEN);
        // Constant-time comparison through the MAC API.
        self.mac(body)
            .verify_truncated_left(tag)
            .map_err(|_| HandleError::Malformed)?;
        Ok(ReceiptHandle {
            topic_id: u64_at(9),
            partition: u32::from_le_bytes(buf[17..21].try_into().expect("4 bytes")),
            offset: u64_at(21),
            nonce: u64_at(29),
            owner_epoch: u64_at(37),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tamper() {
        let c = HandleCodec::random();
        let h = ReceiptHandle {
            topic_id: 9,
            partition: 2,
            offset: 123,
            nonce: 77,
            owner_epoch: 3,
        };
        let s = c.encode(&h);
        assert_eq!(c.decode(&s), Ok(h));
        // flipping any character either breaks decoding or the tag
        let bytes = s.as_bytes();
        for i in 0..bytes.len() {
            let mut t = bytes.to_vec();
            t[i] = if t[i] == b'A' { b'B' } else { b'A' };
            let t = String::from_utf8(t).unwrap();
            assert_ne!(c.decode(&t), Ok(h), "tampered handle accepted at {i}");
        }
        assert_eq!(c.decode("not a handle"), Err(HandleError::Malformed));
        assert_eq!(c.decode(""), Err(HandleError::Malformed));
    }

    #[test]
    fn other_process_handles_are_stale_not_valid() {
        let a = HandleCodec::random();
        let b = HandleCodec::random();
        let h = ReceiptHandle {
            topic_id: 1,
            partition: 0,
            offset: 0,
            nonce: 1,
            owner_epoch: 0,
        };
        assert_eq!(b.decode(&a.encode(&h)), Err(HandleError::OtherEpoch));
        // same epoch, different key: forged
        let forger = HandleCodec::with_key(b.epoch, [0; 32]);
        assert_eq!(b.decode(&forger.encode(&h)), Err(HandleError::Malformed));
    }
}
