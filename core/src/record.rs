//! The record and its on-disk frame.
//!
//! One frame per record, little-endian:
//!
//! ```text
//! 0   u32  magic "NRDF" (0x4644_524E as LE bytes N R D F)
//! 4   u32  body_len: bytes of body that follow the crc
//! 8   u32  crc32c over bytes [4..8) (body_len) and the whole body
//! 12  body:
//!     u8   format version (1)
//!     u8   flags: bit 0 = key present, bit 1 = headers present
//!     u64  offset
//!     i64  commit timestamp, unix ms
//!     u32  delay ms (0 = deliverable at commit time)
//!     [u32 key_len, key bytes]                      if flag bit 0
//!     [u16 count, count × (u16 name_len, name, u32 value_len, value)]  if flag bit 1
//!     payload: the rest of the body
//! ```
//!
//! The magic lets recovery tell "garbage after a torn write" from "a valid frame follows a
//! corrupt one" by scanning for it; the CRC covers everything but the magic and itself.
//! Full description: `docs/storage-format.md`.

use bytes::Bytes;

pub const FRAME_MAGIC: [u8; 4] = *b"NRDF";
pub const FRAME_HEADER_LEN: usize = 12;
pub const FORMAT_VERSION: u8 = 1;
/// Fixed part of the body: version, flags, offset, timestamp, delay.
const BODY_FIXED_LEN: usize = 1 + 1 + 8 + 8 + 4;
/// Upper bound on any body length read from disk; guards allocations against corruption.
pub const MAX_BODY_LEN: usize = 64 * 1024 * 1024;

const FLAG_KEY: u8 = 1;
const FLAG_HEADERS: u8 = 2;

/// A record as a producer hands it to the log (offset and timestamp are assigned by the log).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewRecord {
    pub key: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
    pub payload: Bytes,
    pub delay_ms: u32,
}

impl NewRecord {
    pub fn encoded_len(&self) -> usize {
        FRAME_HEADER_LEN + self.body_len()
    }

    fn body_len(&self) -> usize {
        let mut n = BODY_FIXED_LEN + self.payload.len();
        if let Some(k) = &self.key {
            n += 4 + k.len();
        }
        if !self.headers.is_empty() {
            n += 2;
            for (name, value) in &self.headers {
                n += 2 + name.len() + 4 + value.len();
            }
        }
        n
    }

    /// Appends this record's frame at `offset` with commit time `timestamp_ms` to `out`.
    pub fn encode(&self, offset: u64, timestamp_ms: i64, out: &mut Vec<u8>) {
        let body_len = self.body_len();
        let start = out.len();
        out.extend_from_slice(&FRAME_MAGIC);
        out.extend_from_slice(&(body_len as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]); // crc, patched below
        out.push(FORMAT_VERSION);
        let mut flags = 0;
        if self.key.is_some() {
            flags |= FLAG_KEY;
        }
        if !self.headers.is_empty() {
            flags |= FLAG_HEADERS;
        }
        out.push(flags);
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&timestamp_ms.to_le_bytes());
        out.extend_from_slice(&self.delay_ms.to_le_bytes());
        if let Some(k) = &self.key {
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(k);
        }
        if !self.headers.is_empty() {
            out.extend_from_slice(&(self.headers.len() as u16).to_le_bytes());
            for (name, value) in &self.headers {
                out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
        }
        out.extend_from_slice(&self.payload);
        debug_assert_eq!(out.len() - start, FRAME_HEADER_LEN + body_len);
        let crc = frame_crc(&out[start + 4..start + 8], &out[start + FRAME_HEADER_LEN..]);
        out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
    }
}

impl NewRecord {
    /// The record as committed, its key and payload slices of `chunk`, which holds this
    /// record's frame (as [`NewRecord::encode`] wrote it) at `at`: no copy of the bytes.
    pub fn committed_in(&self, chunk: &Bytes, at: usize, offset: u64, timestamp_ms: i64) -> Record {
        let frame_end = at + self.encoded_len();
        let key = self.key.as_ref().map(|k| {
            // after the frame header, the fixed body and the key's u32 length
            let start = at + FRAME_HEADER_LEN + BODY_FIXED_LEN + 4;
            chunk.slice(start..start + k.len())
        });
        Record {
            offset,
            timestamp_ms,
            delay_ms: self.delay_ms,
            key,
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), Bytes::copy_from_slice(v)))
                .collect(),
            payload: chunk.slice(frame_end - self.payload.len()..frame_end),
        }
    }
}

fn frame_crc(len_bytes: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(len_bytes), body)
}

/// A committed record read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset: u64,
    pub timestamp_ms: i64,
    pub delay_ms: u32,
    pub key: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
    pub payload: Bytes,
}

impl Record {
    /// The earliest time (unix ms) at which this record may be delivered.
    ///
    /// `timestamp_ms` is the commit time truncated to the millisecond, so the real commit may
    /// be up to 1 ms later; a delayed record waits one more millisecond so that it is never
    /// delivered before (real commit + delay). The lifecycle checker caught the 1 ms.
    pub fn due_ms(&self) -> i64 {
        if self.delay_ms == 0 {
            return self.timestamp_ms;
        }
        self.timestamp_ms
            .saturating_add(i64::from(self.delay_ms))
            .saturating_add(1)
    }

    /// An upper bound on the bytes this record takes in a JSON reply: the payload verbatim
    /// (JSON), as an escaped string of at most 4/3 of its size (text; heavier escaping is
    /// served as base64 instead) or base64; key, header names and values escaped at worst;
    /// and the envelope. Reads cap their replies by this, not by payload bytes alone: a
    /// record of 1 byte of payload and 1 MiB of headers is a 1 MiB record.
    pub fn reply_weight(&self) -> usize {
        const ENVELOPE: usize = 256;
        ENVELOPE
            + self.payload.len() / 3 * 4
            + 8
            + self.key.as_deref().map_or(0, json_escaped_len)
            + self
                .headers
                .iter()
                .map(|(k, v)| json_escaped_len(k.as_bytes()) + json_escaped_len(v) + 6)
                .sum::<usize>()
    }

    /// Bytes this record takes on disk.
    pub fn frame_len(&self) -> usize {
        NewRecord {
            key: self.key.clone(),
            headers: self.headers.clone(),
            payload: self.payload.clone(),
            delay_ms: self.delay_ms,
        }
        .encoded_len()
    }
}

/// An upper bound on the length of `bytes` written as the contents of a JSON string (lossy
/// UTF-8, then escaped): quotes and backslashes take 2 bytes, other control characters 6
/// (`\u00XX`), a byte of a multi-byte or invalid sequence at most 3 (a replacement
/// character for each invalid byte).
pub fn json_escaped_len(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .map(|&b| match b {
            b'"' | b'\\' => 2,
            0..0x20 => 6,
            0x80.. => 3,
            _ => 1,
        })
        .sum()
}

/// Why bytes at some position are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("incomplete frame: need {need} bytes, have {have}")]
    Incomplete { need: usize, have: usize },
    #[error("bad frame magic")]
    BadMagic,
    #[error("frame body length {0} out of bounds")]
    BadLength(usize),
    #[error("frame checksum mismatch")]
    BadChecksum,
    #[error("unsupported frame version {0}")]
    BadVersion(u8),
    #[error("malformed frame body: {0}")]
    Malformed(&'static str),
}

/// Reads the frame header at the start of `buf`: returns the full frame length.
pub fn frame_len(buf: &[u8]) -> Result<usize, FrameError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Err(FrameError::Incomplete {
            need: FRAME_HEADER_LEN,
            have: buf.len(),
        });
    }
    if buf[0..4] != FRAME_MAGIC {
        return Err(FrameError::BadMagic);
    }
    let body_len = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes")) as usize;
    if !(BODY_FIXED_LEN..=MAX_BODY_LEN).contains(&body_len) {
        return Err(FrameError::BadLength(body_len));
    }
    Ok(FRAME_HEADER_LEN + body_len)
}

/// Decodes one frame at the start of `buf`; returns the record and the frame length.
pub fn decode_frame(buf: &[u8]) -> Result<(Record, usize), FrameError> {
    let (body, len) = checked_body(buf)?;
    Ok((decode_body(body)?, len))
}

/// The body of the whole frame at the start of `buf`, checked against its CRC, and the
/// frame's length.
fn checked_body(buf: &[u8]) -> Result<(&[u8], usize), FrameError> {
    let len = frame_len(buf)?;
    if buf.len() < len {
        return Err(FrameError::Incomplete {
            need: len,
            have: buf.len(),
        });
    }
    let stored_crc = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    let body = &buf[FRAME_HEADER_LEN..len];
    if frame_crc(&buf[4..8], body) != stored_crc {
        return Err(FrameError::BadChecksum);
    }
    Ok((body, len))
}

/// The offset of the whole, checked frame at the start of `buf` (magic, length, CRC and
/// format version), without decoding the rest of its body: how a reader steps over the
/// records before the one it wants.
pub fn frame_offset(buf: &[u8]) -> Result<u64, FrameError> {
    let (body, _) = checked_body(buf)?;
    if body[0] != FORMAT_VERSION {
        return Err(FrameError::BadVersion(body[0]));
    }
    // (frame_len guarantees the fixed part of the body: version, flags, offset, ...)
    Ok(u64::from_le_bytes(body[2..10].try_into().expect("8 bytes")))
}

fn decode_body(body: &[u8]) -> Result<Record, FrameError> {
    let mut cur = Cursor { buf: body, pos: 0 };
    let version = cur.u8()?;
    if version != FORMAT_VERSION {
        return Err(FrameError::BadVersion(version));
    }
    let flags = cur.u8()?;
    if flags & !(FLAG_KEY | FLAG_HEADERS) != 0 {
        return Err(FrameError::Malformed("unknown flags"));
    }
    let offset = cur.u64()?;
    let timestamp_ms = cur.u64()? as i64;
    let delay_ms = cur.u32()?;
    let key = if flags & FLAG_KEY != 0 {
        let n = cur.u32()? as usize;
        Some(Bytes::copy_from_slice(cur.take(n)?))
    } else {
        None
    };
    let mut headers = Vec::new();
    if flags & FLAG_HEADERS != 0 {
        let count = cur.u16()?;
        for _ in 0..count {
            let n = cur.u16()? as usize;
            let name = std::str::from_utf8(cur.take(n)?)
                .map_err(|_| FrameError::Malformed("header name is not utf-8"))?
                .to_owned();
            let n = cur.u32()? as usize;
            headers.push((name, Bytes::copy_from_slice(cur.take(n)?)));
        }
    }
    let payload = Bytes::copy_from_slice(&body[cur.pos..]);
    Ok(Record {
        offset,
        timestamp_ms,
        delay_ms,
        key,
        headers,
        payload,
    })
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(FrameError::Malformed("field runs past the frame"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

/// Cases per fuzz target: `NARAD_FUZZ_CASES`, default 20,000 (what CI runs).
#[cfg(test)]
pub(crate) fn fuzz_cases() -> u32 {
    std::env::var("NARAD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_in_slices_what_encode_wrote() {
        let records = [
            NewRecord {
                payload: Bytes::from_static(b"plain"),
                ..NewRecord::default()
            },
            NewRecord {
                key: Some(Bytes::from_static(b"k-1")),
                headers: vec![("h".into(), Bytes::from_static(b"v"))],
                payload: Bytes::from_static(b"NRDF looks like a frame"),
                delay_ms: 7,
            },
            NewRecord {
                key: Some(Bytes::new()),
                payload: Bytes::from_static(b"{}"),
                ..NewRecord::default()
            },
        ];
        let mut buf = Vec::new();
        let mut at = Vec::new();
        for (i, r) in records.iter().enumerate() {
            at.push(buf.len());
            r.encode(10 + i as u64, 99, &mut buf);
        }
        let chunk = Bytes::from(buf);
        for (i, r) in records.iter().enumerate() {
            let (decoded, _) = decode_frame(&chunk[at[i]..]).unwrap();
            assert_eq!(r.committed_in(&chunk, at[i], 10 + i as u64, 99), decoded);
        }
    }

    use super::*;
    use proptest::prelude::*;

    fn sample() -> NewRecord {
        NewRecord {
            key: Some(Bytes::from_static(b"user-7")),
            headers: vec![("trace".into(), Bytes::from_static(b"abc"))],
            payload: Bytes::from_static(b"{\"a\":1}"),
            delay_ms: 250,
        }
    }

    #[test]
    fn round_trip() {
        let r = sample();
        let mut buf = Vec::new();
        r.encode(42, 1_700_000_000_000, &mut buf);
        assert_eq!(buf.len(), r.encoded_len());
        let (rec, len) = decode_frame(&buf).unwrap();
        assert_eq!(len, buf.len());
        assert_eq!(rec.offset, 42);
        assert_eq!(rec.timestamp_ms, 1_700_000_000_000);
        assert_eq!(rec.delay_ms, 250);
        assert_eq!(rec.key, r.key);
        assert_eq!(rec.headers, r.headers);
        assert_eq!(rec.payload, r.payload);
        assert_eq!(rec.frame_len(), buf.len());
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let mut buf = Vec::new();
        sample().encode(1, 2, &mut buf);
        for byte in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[byte] ^= 1 << bit;
                assert!(
                    decode_frame(&b).is_err(),
                    "flip at {byte}:{bit} not detected"
                );
            }
        }
    }

    /// Stepping over a record checks as much as decoding it, short of its fields: a flipped
    /// bit anywhere, a cut frame or another version is an error, and an intact frame gives
    /// the offset the decoder reads.
    #[test]
    fn a_frame_stepped_over_is_checked_whole() {
        let mut buf = Vec::new();
        sample().encode(77, 2, &mut buf);
        assert_eq!(frame_offset(&buf).unwrap(), 77);
        for byte in 0..buf.len() {
            for bit in 0..8 {
                let mut b = buf.clone();
                b[byte] ^= 1 << bit;
                assert!(
                    frame_offset(&b).is_err(),
                    "flip at {byte}:{bit} not detected"
                );
            }
        }
        for n in 0..buf.len() {
            assert!(frame_offset(&buf[..n]).is_err(), "cut at {n} not detected");
        }
        // a frame of another version, its CRC made right, is not read
        let mut b = buf.clone();
        b[FRAME_HEADER_LEN] = FORMAT_VERSION + 1;
        let crc = frame_crc(&b[4..8], &b[FRAME_HEADER_LEN..]);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(frame_offset(&b), Err(FrameError::BadVersion(_))));
    }

    #[test]
    fn truncation_is_incomplete() {
        let mut buf = Vec::new();
        sample().encode(1, 2, &mut buf);
        for n in 0..buf.len() {
            assert!(matches!(
                decode_frame(&buf[..n]),
                Err(FrameError::Incomplete { .. } | FrameError::BadMagic)
            ));
        }
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_frame(&data);
            let _ = frame_offset(&data);
        }

        #[test]
        fn arbitrary_records_round_trip(
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            payload in proptest::collection::vec(any::<u8>(), 0..2048),
            offset in any::<u64>(), ts in any::<i64>(), delay in any::<u32>(),
        ) {
            let r = NewRecord { key: key.map(Bytes::from), headers: vec![], payload: Bytes::from(payload), delay_ms: delay };
            let mut buf = Vec::new();
            r.encode(offset, ts, &mut buf);
            let (rec, _) = decode_frame(&buf).unwrap();
            prop_assert_eq!(rec.offset, offset);
            prop_assert_eq!(rec.timestamp_ms, ts);
            prop_assert_eq!(rec.payload, r.payload);
            prop_assert_eq!(rec.key, r.key);
        }
    }

    /// Fuzz targets for the frame decoder (`NARAD_FUZZ_CASES` sets the cases; CI runs the
    /// default). A failing input proptest finds is kept under `proptest-regressions/` and
    /// replayed first on every later run.
    mod fuzz {
        use super::*;

        /// A frame around `body` with a correct header and checksum, so the body parser
        /// itself is what gets fuzzed.
        fn framed(body: &[u8]) -> Vec<u8> {
            let len = (body.len() as u32).to_le_bytes();
            let mut out = FRAME_MAGIC.to_vec();
            out.extend_from_slice(&len);
            out.extend_from_slice(&frame_crc(&len, body).to_le_bytes());
            out.extend_from_slice(body);
            out
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(crate::record::fuzz_cases()))]

            #[test]
            fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Ok((_, n)) = decode_frame(&data) {
                    prop_assert!(n <= data.len());
                }
                let _ = frame_len(&data);
            }

            #[test]
            fn checksummed_random_bodies_never_panic(
                version in prop_oneof![Just(FORMAT_VERSION), any::<u8>()],
                flags in 0u8..8,
                rest in proptest::collection::vec(any::<u8>(), 0..400),
            ) {
                let mut body = vec![version, flags];
                body.extend_from_slice(&rest);
                let frame = framed(&body);
                match decode_frame(&frame) {
                    Ok((r, n)) => {
                        prop_assert_eq!(n, frame.len());
                        prop_assert!(r.payload.len() <= rest.len());
                    }
                    Err(FrameError::BadLength(_) | FrameError::BadVersion(_)
                        | FrameError::Malformed(_) | FrameError::Incomplete { .. }) => {}
                    Err(e) => prop_assert!(false, "unexpected {}", e),
                }
            }

            #[test]
            fn any_flipped_bit_is_detected(
                payload in proptest::collection::vec(any::<u8>(), 0..300),
                key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                bit in any::<proptest::sample::Index>(),
            ) {
                let mut frame = Vec::new();
                NewRecord {
                    key: key.map(Bytes::from),
                    headers: vec![("h".into(), Bytes::from_static(b"v"))],
                    payload: Bytes::from(payload),
                    ..Default::default()
                }
                .encode(5, 1_000, &mut frame);
                let b = bit.index(frame.len() * 8);
                frame[b / 8] ^= 1 << (b % 8);
                prop_assert!(decode_frame(&frame).is_err(), "a flipped bit went unnoticed");
            }
        }
    }
}
