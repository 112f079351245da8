//! How messages look on the wire: JSON payloads stay JSON, UTF-8 text becomes a string, other
//! bytes are base64 with `"payload_encoding": "base64"`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use narad_core::broker::Delivery;
use narad_core::record::Record;
use serde::Serialize;
use serde_json::value::RawValue;

#[derive(Serialize)]
#[serde(untagged)]
enum Payload<'a> {
    Json(&'a RawValue),
    Text(Cow<'a, str>),
}

#[derive(Serialize)]
pub struct MessageJson<'a> {
    topic: &'a str,
    partition: u32,
    offset: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_encoding: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<BTreeMap<&'a str, String>>,
    payload: Payload<'a>,
    payload_encoding: &'static str,
    timestamp_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delivery_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt_handle: Option<&'a str>,
}

/// How a payload is written: JSON verbatim when any ordinary JSON reader can read it back
/// ([`plain_json`]); UTF-8 text as a string when escaping grows it by at most a third;
/// anything else as base64 (so a reply is never several times the size of what it carries).
fn payload(bytes: &[u8]) -> (Payload<'_>, &'static str) {
    // (a JSON value with whitespace around it is text: embedding the value would drop the
    // whitespace, and a payload is served byte for byte)
    if let Ok(raw) = serde_json::from_slice::<&RawValue>(bytes)
        && raw.get().len() == bytes.len()
        && plain_json(bytes)
    {
        return (Payload::Json(raw), "json");
    }
    match std::str::from_utf8(bytes) {
        Ok(s) if escaped_len(s) <= s.len() / 3 * 4 + 8 => (Payload::Text(Cow::Borrowed(s)), "utf8"),
        _ => (Payload::Text(Cow::Owned(STANDARD.encode(bytes))), "base64"),
    }
}

/// Bytes `s` takes as the contents of a JSON string (serde_json's escaping).
fn escaped_len(s: &str) -> usize {
    let b = s.as_bytes();
    let mut n = b.len();
    let mut i = 0;
    while i < b.len() {
        if let Some(chunk) = b.get(i..i + 32)
            && !any_needs_escape(chunk)
        {
            i += 32;
            continue;
        }
        if let Some(chunk) = b.get(i..i + 8)
            && !word_needs_escape(chunk)
        {
            i += 8;
            continue;
        }
        n += match b[i] {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
            0..0x20 => 5,
            _ => 0,
        };
        i += 1;
    }
    n
}

/// Whether any byte of `chunk` needs escaping in a JSON string: a control byte, `"` or `\`.
/// A fold without branches, which the compiler turns into vector compares: 32 bytes a step
/// where the word below takes 8.
fn any_needs_escape(chunk: &[u8]) -> bool {
    chunk.iter().fold(0u8, |acc, &c| {
        acc | u8::from(c < 0x20) | u8::from(c == b'"') | u8::from(c == b'\\')
    }) != 0
}

/// Whether any of these 8 bytes needs escaping in a JSON string: a control byte, `"` or `\`.
/// (Bit tricks on one word: exact as a yes/no answer.)
fn word_needs_escape(chunk: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let w = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS != 0;
    // a byte below 0x20: `w - 0x20` per byte borrows (top bit set) where `w`'s top bit was not
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGHS != 0;
    below_space || has_zero(w ^ (ONES * u64::from(b'"'))) || has_zero(w ^ (ONES * u64::from(b'\\')))
}

/// `s` as a JSON string, escaped exactly as serde_json escapes it.
fn write_str(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let b = s.as_bytes();
    out.reserve(b.len() + 2);
    out.push('"');
    let (mut start, mut i) = (0, 0);
    while i < b.len() {
        if let Some(chunk) = b.get(i..i + 32)
            && !any_needs_escape(chunk)
        {
            i += 32;
            continue;
        }
        if let Some(chunk) = b.get(i..i + 8)
            && !word_needs_escape(chunk)
        {
            i += 8;
            continue;
        }
        let c = b[i];
        let short = match c {
            b'"' => '"',
            b'\\' => '\\',
            b'\n' => 'n',
            b'\r' => 'r',
            b'\t' => 't',
            0x08 => 'b',
            0x0c => 'f',
            0..0x20 => '\0',
            _ => {
                i += 1;
                continue;
            }
        };
        // (`i` is at an ASCII byte: a character boundary)
        out.push_str(&s[start..i]);
        if short == '\0' {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(c >> 4)]));
            out.push(char::from(HEX[usize::from(c & 0xf)]));
        } else {
            out.push('\\');
            out.push(short);
        }
        i += 1;
        start = i;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// An integer in decimal, without the formatting machinery.
pub(super) fn write_int(out: &mut String, n: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Nesting a JSON payload may have and still be served as JSON: the reply wraps it two or
/// three levels deeper, and common readers stop at 128 levels.
const MAX_PLAIN_DEPTH: usize = 100;

/// Whether JSON text (already known to be syntactically valid) is something an ordinary
/// reader accepts too: nesting within [`MAX_PLAIN_DEPTH`], every number finite as an f64,
/// and no lone UTF-16 surrogate in a `\u` escape. A payload that is valid JSON but not plain
/// (`1e400`, 129 nested arrays, `"\ud800"`) is served as text or base64 instead, so no client
/// (the `narad` CLI included) fails to read a reply because of another producer's payload.
fn plain_json(bytes: &[u8]) -> bool {
    let (mut depth, mut i) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_PLAIN_DEPTH {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        if bytes.get(i + 1) == Some(&b'u') {
                            let Some(unit) = hex4(bytes.get(i + 2..i + 6)) else {
                                return false;
                            };
                            if (0xDC00..0xE000).contains(&unit) {
                                return false; // a low surrogate with no high one before it
                            }
                            if (0xD800..0xDC00).contains(&unit) {
                                let low = (bytes.get(i + 6..i + 8) == Some(&b"\\u"[..]))
                                    .then(|| hex4(bytes.get(i + 8..i + 12)))
                                    .flatten();
                                if !low.is_some_and(|l| (0xDC00..0xE000).contains(&l)) {
                                    return false;
                                }
                                i += 6;
                            }
                            i += 6;
                            continue;
                        }
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len()
                    && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let finite = std::str::from_utf8(&bytes[start..i])
                    .ok()
                    .and_then(|n| n.parse::<f64>().ok())
                    .is_some_and(f64::is_finite);
                if !finite {
                    return false;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    true
}

fn hex4(b: Option<&[u8]>) -> Option<u32> {
    u32::from_str_radix(std::str::from_utf8(b?).ok()?, 16).ok()
}

impl MessageJson<'_> {
    /// Appends the message as JSON: the same text as `serde_json::to_string(self)` (a test
    /// compares them), written without a serializer (consume replies are on the hot path).
    pub fn write_json(&self, out: &mut String) {
        out.push_str("{\"topic\":");
        write_str(out, self.topic);
        out.push_str(",\"partition\":");
        write_int(out, self.partition);
        out.push_str(",\"offset\":");
        write_int(out, self.offset);
        if let Some(k) = &self.key {
            out.push_str(",\"key\":");
            write_str(out, k);
        }
        if let Some(e) = self.key_encoding {
            out.push_str(",\"key_encoding\":");
            write_str(out, e);
        }
        if let Some(h) = &self.headers {
            out.push_str(",\"headers\":{");
            for (n, (k, v)) in h.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                write_str(out, v);
            }
            out.push('}');
        }
        out.push_str(",\"payload\":");
        match &self.payload {
            Payload::Json(raw) => out.push_str(raw.get()),
            Payload::Text(t) => write_str(out, t),
        }
        out.push_str(",\"payload_encoding\":");
        write_str(out, self.payload_encoding);
        out.push_str(",\"timestamp_ms\":");
        write_int(out, self.timestamp_ms);
        if let Some(d) = self.delay_ms {
            out.push_str(",\"delay_ms\":");
            write_int(out, d);
        }
        if let Some(c) = self.delivery_count {
            out.push_str(",\"delivery_count\":");
            write_int(out, c);
        }
        if let Some(h) = self.receipt_handle {
            out.push_str(",\"receipt_handle\":");
            write_str(out, h);
        }
        out.push('}');
    }
}

/// One message's JSON text ([`MessageJson::write_json`]).
pub fn message_text(m: &MessageJson<'_>) -> String {
    let mut out = String::with_capacity(512);
    m.write_json(&mut out);
    out
}

/// A consume or replay reply: the one message alone, or `{"messages": [...]}` when `batch`
/// (`max` was given). `msgs` holds at least one message.
pub fn reply_text(msgs: &[MessageJson<'_>], batch: bool) -> String {
    if batch {
        batch_text(msgs)
    } else {
        message_text(&msgs[0])
    }
}

/// A batch reply, `{"messages": [...]}`, written as [`MessageJson::write_json`] does. Payloads
/// are written verbatim as they were accepted, never re-parsed into a `serde_json::Value`
/// (which has stricter limits than the produce side — `1e400`, deep nesting — and would fail
/// on them).
pub fn batch_text(msgs: &[MessageJson<'_>]) -> String {
    let mut out = String::with_capacity(16 + msgs.len() * 512);
    out.push_str("{\"messages\":[");
    for (n, m) in msgs.iter().enumerate() {
        if n > 0 {
            out.push(',');
        }
        m.write_json(&mut out);
    }
    out.push_str("]}");
    out
}

pub fn record<'a>(topic: &'a str, partition: u32, r: &'a Record) -> MessageJson<'a> {
    let (payload, payload_encoding) = payload(&r.payload);
    let (key, key_encoding) = match &r.key {
        None => (None, None),
        Some(k) => match std::str::from_utf8(k) {
            Ok(s) => (Some(s.to_owned()), None),
            Err(_) => (Some(STANDARD.encode(k)), Some("base64")),
        },
    };
    let headers = (!r.headers.is_empty()).then(|| {
        r.headers
            .iter()
            .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v).into_owned()))
            .collect()
    });
    MessageJson {
        topic,
        partition,
        offset: r.offset,
        key,
        key_encoding,
        headers,
        payload,
        payload_encoding,
        timestamp_ms: r.timestamp_ms,
        delay_ms: (r.delay_ms > 0).then_some(r.delay_ms),
        delivery_count: None,
        receipt_handle: None,
    }
}

pub fn delivery<'a>(topic: &'a str, d: &'a Delivery) -> MessageJson<'a> {
    delivery_as(topic, d, &d.receipt_handle)
}

/// [`delivery`] with another receipt handle (a cluster member's names the member).
pub fn delivery_as<'a>(topic: &'a str, d: &'a Delivery, handle: &'a str) -> MessageJson<'a> {
    let mut m = record(topic, d.partition, &d.record);
    m.delivery_count = Some(d.delivery_count);
    m.receipt_handle = Some(handle);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch reply as serde_json writes it: what [`batch_text`] must equal.
    #[derive(Serialize)]
    struct Batch<'a> {
        messages: &'a [MessageJson<'a>],
    }

    #[test]
    fn only_plain_json_is_served_as_json() {
        for ok in [
            r#"{"a":[1,2.5,-3e10,"x\u00e9\ud83d\ude00"]}"#,
            "100000000000000000000",
            r#""\\u""#,
        ] {
            assert_eq!(payload(ok.as_bytes()).1, "json", "{ok}");
        }
        // whitespace around a value would be dropped if it were embedded: served as text
        for spaced in [" {\"a\":1} \n", "\t1\n", "[1,2]\n\n"] {
            assert_eq!(payload(spaced.as_bytes()).1, "utf8", "{spaced:?}");
        }
        let deep = format!("{}{}", "[".repeat(101), "]".repeat(101));
        let long = "9".repeat(400);
        for (poison, as_) in [
            (r#"{"n":1e400}"#, "utf8"),
            (long.as_str(), "utf8"),
            (deep.as_str(), "utf8"),
            (r#""\ud800""#, "utf8"),
            (r#""\udc00x""#, "utf8"),
            (r#"["\ud800\u0041"]"#, "utf8"),
        ] {
            assert_eq!(payload(poison.as_bytes()).1, as_, "{poison}");
            // what is served reads back with a default serde_json
            let m = serde_json::to_string(&payload(poison.as_bytes()).0).unwrap();
            serde_json::from_str::<serde_json::Value>(&m).unwrap();
        }
    }

    /// The hand-written writer gives exactly serde_json's text, for every kind of payload,
    /// key, header and optional field (seeded random cases, escapes and multi-byte characters
    /// at every position of the 32- and 8-byte chunks the fast paths skip).
    #[test]
    fn written_json_is_serde_json_byte_for_byte() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let pieces: [&[u8]; 15] = [
            b"x",
            b"0123456789abcdef0123456789abcdef01234567",
            b"plain text ",
            b"\"",
            b"\\",
            b"\n",
            b"\t\r",
            &[0x00],
            &[0x08, 0x0c],
            &[0x1f, 0x7f],
            "é€😀".as_bytes(),
            b"{\"a\":[1,2.5,{\"b\":null}]}",
            b"1e400",
            &[0xff, 0xfe],
            b"\\u0041",
        ];
        for case in 0..3000 {
            let mut bytes = Vec::new();
            for _ in 0..next(12) {
                bytes.extend_from_slice(pieces[next(pieces.len() as u64) as usize]);
            }
            let text = |n: &mut dyn FnMut(u64) -> u64| {
                let mut t = String::new();
                for _ in 0..n(6) {
                    t.push_str(["k", "\"", "\u{1}", "ü", "abcdefgh", "\\"][n(6) as usize]);
                }
                t
            };
            let r = Record {
                offset: next(u64::MAX),
                timestamp_ms: next(u64::MAX) as i64,
                delay_ms: if next(2) == 0 {
                    0
                } else {
                    next(1 << 32) as u32
                },
                key: match next(3) {
                    0 => None,
                    1 => Some(bytes::Bytes::from(text(&mut next))),
                    _ => Some(bytes::Bytes::from_static(&[0xc3, 0x28])),
                },
                headers: (0..next(3))
                    .map(|_| (text(&mut next), bytes::Bytes::from(text(&mut next))))
                    .collect(),
                payload: bytes::Bytes::from(bytes),
            };
            let topic = text(&mut next);
            let handle = text(&mut next);
            let one = record(&topic, next(1 << 32) as u32, &r);
            let mut two = record(&topic, 0, &r);
            two.delivery_count = Some(next(1 << 32) as u32);
            two.receipt_handle = Some(&handle);
            for m in [&one, &two] {
                assert_eq!(
                    message_text(m),
                    serde_json::to_string(m).unwrap(),
                    "case {case}"
                );
            }
            let msgs = [one, two];
            assert_eq!(
                batch_text(&msgs),
                serde_json::to_string(&Batch { messages: &msgs }).unwrap(),
                "case {case}"
            );
        }
        assert_eq!(batch_text(&[]), r#"{"messages":[]}"#);
    }

    #[test]
    fn heavily_escaped_text_is_base64() {
        assert_eq!(payload(b"plain text, \"quoted\"").1, "utf8");
        assert_eq!(payload(&[1u8; 100]).1, "base64");
        assert_eq!(payload(&[0xffu8, 0xfe]).1, "base64");
        let (p, _) = payload(&[1u8; 300]);
        assert!(serde_json::to_string(&p).unwrap().len() <= 300 / 3 * 4 + 8);
    }
}
