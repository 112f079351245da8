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

fn payload(bytes: &[u8]) -> (Payload<'_>, &'static str) {
    if let Ok(raw) = serde_json::from_slice::<&RawValue>(bytes) {
        return (Payload::Json(raw), "json");
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => (Payload::Text(s.to_owned()), "utf8"),
        Err(_) => (Payload::Text(STANDARD.encode(bytes)), "base64"),
    }
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
    let mut m = record(topic, d.partition, &d.record);
    m.delivery_count = Some(d.delivery_count);
    m.receipt_handle = Some(&d.receipt_handle);
    m
}
