//! How messages look on the wire: JSON payloads stay JSON, UTF-8 text becomes a string, other
//! bytes are base64 with `"payload_encoding": "base64"`.

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
    Text(String),
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
        Ok(s) if escaped_len(s) <= s.len() / 3 * 4 + 8 => (Payload::Text(s.to_owned()), "utf8"),
        _ => (Payload::Text(STANDARD.encode(bytes)), "base64"),
    }
}

/// Bytes `s` takes as the contents of a JSON string (serde_json's escaping).
fn escaped_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
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

/// A batch reply, `{"messages": [...]}`. Serialised straight to text: payloads are written
/// verbatim as they were accepted, never re-parsed into a `serde_json::Value` (which has
/// stricter limits than the produce side — `1e400`, deep nesting — and would fail on them).
#[derive(Serialize)]
pub struct Batch<'a> {
    pub messages: &'a [MessageJson<'a>],
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

    #[test]
    fn heavily_escaped_text_is_base64() {
        assert_eq!(payload(b"plain text, \"quoted\"").1, "utf8");
        assert_eq!(payload(&[1u8; 100]).1, "base64");
        assert_eq!(payload(&[0xffu8, 0xfe]).1, "base64");
        let (p, _) = payload(&[1u8; 300]);
        assert!(serde_json::to_string(&p).unwrap().len() <= 300 / 3 * 4 + 8);
    }
}
