//! Requests and replies on an RPC stream: one request per stream, written by the caller and
//! finished, then one reply, finished. The stream's end is the frame's end, so no length
//! prefix is needed; each side reads to the end with a cap.
//!
//! ```text
//! request: u16 op | u32 deadline_ms | payload
//! reply:   u8 0   | payload                                   (done)
//!          u8 1   | u16 status | u8 code_len | code | message (refused; HTTP vocabulary)
//! ```

use bytes::{BufMut, Bytes, BytesMut};

/// An operation, by number. Numbers are never reused for another meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Op(pub u16);

impl Op {
    /// Answered by the transport itself: is the peer there and admitting us?
    pub const PING: Op = super::ops::PING;

    /// The name used in metric labels (bounded: numbers no op has share one).
    pub fn name(self) -> &'static str {
        super::ops::name(self).unwrap_or("unknown")
    }
}

pub const REQUEST_HEADER: usize = 6;
/// Longest error message carried in a reply.
pub const MAX_MESSAGE: usize = 1024;

pub fn encode_request(op: Op, deadline_ms: u32, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(REQUEST_HEADER + payload.len());
    b.put_u16(op.0);
    b.put_u32(deadline_ms);
    b.put_slice(payload);
    b.freeze()
}

pub fn decode_request(mut b: Bytes) -> Option<(Op, u32, Bytes)> {
    if b.len() < REQUEST_HEADER {
        return None;
    }
    let head = b.split_to(REQUEST_HEADER);
    let op = u16::from_be_bytes([head[0], head[1]]);
    let deadline = u32::from_be_bytes([head[2], head[3], head[4], head[5]]);
    Some((Op(op), deadline, b))
}

/// A refusal by the serving node, in the vocabulary of the HTTP API: the status a client
/// would get, a stable code, and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct Fault {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl Fault {
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// What a service answers for an op it does not serve.
    pub fn unknown_op(op: Op) -> Self {
        Self::new(400, "unknown_op", format!("op {} is not served", op.0))
    }
}

pub fn encode_reply(r: &Result<Bytes, Fault>) -> Bytes {
    match r {
        Ok(payload) => {
            let mut b = BytesMut::with_capacity(1 + payload.len());
            b.put_u8(0);
            b.put_slice(payload);
            b.freeze()
        }
        Err(f) => {
            let code = truncate(&f.code, u8::MAX as usize);
            let msg = truncate(&f.message, MAX_MESSAGE);
            let mut b = BytesMut::with_capacity(4 + code.len() + msg.len());
            b.put_u8(1);
            b.put_u16(f.status);
            b.put_u8(code.len() as u8);
            b.put_slice(code.as_bytes());
            b.put_slice(msg.as_bytes());
            b.freeze()
        }
    }
}

pub fn decode_reply(mut b: Bytes) -> Option<Result<Bytes, Fault>> {
    match *b.first()? {
        0 => Some(Ok(b.split_off(1))),
        1 if b.len() >= 4 => {
            let status = u16::from_be_bytes([b[1], b[2]]);
            let n = b[3] as usize;
            let code = b.get(4..4 + n)?;
            let message = b.get(4 + n..)?;
            Some(Err(Fault {
                status,
                code: String::from_utf8_lossy(code).into_owned(),
                message: String::from_utf8_lossy(&message[..message.len().min(MAX_MESSAGE)])
                    .into_owned(),
            }))
        }
        _ => None,
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let req = encode_request(Op(300), 1500, b"body");
        assert_eq!(
            decode_request(req),
            Some((Op(300), 1500, Bytes::from_static(b"body")))
        );
        let ok = encode_reply(&Ok(Bytes::from_static(b"x")));
        assert_eq!(decode_reply(ok), Some(Ok(Bytes::from_static(b"x"))));
        let f = Fault::new(503, "not_owner", "é".repeat(2000));
        let back = decode_reply(encode_reply(&Err(f.clone())))
            .unwrap()
            .unwrap_err();
        assert_eq!((back.status, back.code.as_str()), (503, "not_owner"));
        assert!(back.message.len() <= MAX_MESSAGE && f.message.starts_with(&back.message));
    }

    #[test]
    fn junk_decodes_to_none_or_a_value_never_a_panic() {
        for n in 0..12 {
            for fill in [0u8, 1, 0xff] {
                let b = Bytes::from(vec![fill; n]);
                let _ = decode_request(b.clone());
                let _ = decode_reply(b);
            }
        }
        assert_eq!(decode_reply(Bytes::new()), None);
        assert_eq!(
            decode_reply(Bytes::from_static(&[1, 0, 200, 9, b'a'])),
            None
        );
    }
}
