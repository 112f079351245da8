//! Produce, consume, replay and ack bodies.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// How a payload (or key) is written in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The bytes are a JSON document, embedded as is.
    Json,
    /// UTF-8 text, as a JSON string.
    Utf8,
    /// Other bytes, as a JSON string in standard base64.
    Base64,
}

/// One message of `POST /v1/topics/{topic}/produce/batch`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProduceMessage {
    /// Interpreted per `payload_encoding` (JSON by default): carried verbatim.
    pub payload: Box<RawValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_encoding: Option<Encoding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
}

impl ProduceMessage {
    /// A UTF-8 text payload (`payload_encoding: utf8`), nothing else set.
    pub fn text(payload: &str) -> Self {
        let json = serde_json::to_string(payload).expect("a string serialises");
        Self {
            payload: RawValue::from_string(json).expect("a JSON string is JSON"),
            payload_encoding: Some(Encoding::Utf8),
            key: None,
            partition: None,
            delay_ms: None,
            headers: None,
        }
    }
}

/// The body of a batch produce.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProduceBatch {
    pub messages: Vec<ProduceMessage>,
}

/// Where one produced message went (the `202` of a single produce).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Produced {
    pub partition: u32,
    pub offset: u64,
}

/// The `202` of a batch produce: `results` in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchProduced {
    pub accepted: u64,
    pub results: Vec<Produced>,
}

/// A message as consume and replay return it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Present (`base64`) only when the key bytes are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_encoding: Option<Encoding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// Exactly as the server wrote it; decode with [`Message::payload_bytes`].
    pub payload: Box<RawValue>,
    pub payload_encoding: Encoding,
    pub timestamp_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u32>,
    /// Queue reads only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_count: Option<u32>,
    /// Queue reads only: pass it to `/ack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_handle: Option<String>,
}

/// A payload that does not decode as its `payload_encoding` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadError(pub String);

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "payload does not decode: {}", self.0)
    }
}

impl std::error::Error for PayloadError {}

impl Message {
    /// The stored bytes: the JSON text itself, the text of a `utf8` string, or the bytes a
    /// `base64` string decodes to.
    pub fn payload_bytes(&self) -> Result<Cow<'_, [u8]>, PayloadError> {
        let raw = self.payload.get();
        match self.payload_encoding {
            Encoding::Json => Ok(Cow::Borrowed(raw.as_bytes())),
            Encoding::Utf8 => Ok(match json_string(raw)? {
                Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
                Cow::Owned(s) => Cow::Owned(s.into_bytes()),
            }),
            Encoding::Base64 => base64_decode(json_string(raw)?.as_bytes()).map(Cow::Owned),
        }
    }

    /// The stored bytes as text, when they are UTF-8.
    pub fn payload_str(&self) -> Option<Cow<'_, str>> {
        match self.payload_bytes().ok()? {
            Cow::Borrowed(b) => std::str::from_utf8(b).ok().map(Cow::Borrowed),
            Cow::Owned(b) => String::from_utf8(b).ok().map(Cow::Owned),
        }
    }
}

fn json_string(raw: &str) -> Result<Cow<'_, str>, PayloadError> {
    serde_json::from_str::<Cow<'_, str>>(raw).map_err(|e| PayloadError(e.to_string()))
}

/// Standard base64 with padding (what the server writes), strictly: no whitespace, no
/// missing or extra padding, no stray bits (the `base64` crate's `STANDARD` engine).
fn base64_decode(text: &[u8]) -> Result<Vec<u8>, PayloadError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| PayloadError("not standard base64".into()))
}

/// A batch reply of consume or replay (`max` given). `M` is [`Message`], or
/// `Box<RawValue>` to keep each message's text as the server sent it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Messages<M = Message> {
    pub messages: Vec<M>,
}

/// What a batch ack does to each lease (`extend` in the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Done with the message.
    Ack,
    /// Reset the lease to a full visibility timeout from now.
    Extend,
    /// Release the lease: deliverable again at once.
    Nack,
}

impl Serialize for Settle {
    /// `false`, `true`, `0`: the forms the server reads as ack, extend and nack.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Ack => s.serialize_bool(false),
            Self::Extend => s.serialize_bool(true),
            Self::Nack => s.serialize_u8(0),
        }
    }
}

impl Settle {
    /// The server's mapping of a string `extend` (also the query parameter's values).
    pub fn from_extend(v: &str) -> Option<Self> {
        match v {
            "" | "false" => Some(Self::Ack),
            "true" | "1" => Some(Self::Extend),
            "0" => Some(Self::Nack),
            _ => None,
        }
    }
}

impl<'de> Deserialize<'de> for Settle {
    /// Every form the server accepts: a boolean, `0`/`1`, or one of their strings.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Settle;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false, 0 or 1 (or one of them as a string)")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Settle, E> {
                Ok(if b { Settle::Extend } else { Settle::Ack })
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Settle, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Settle, E> {
                self.visit_str(&n.to_string())
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Settle, E> {
                Settle::from_extend(s).ok_or_else(|| E::custom(format!("bad extend '{s}'")))
            }
        }
        d.deserialize_any(V)
    }
}

/// The body of a batch ack, extend or nack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckBatch {
    pub receipt_handles: Vec<String>,
    /// Absent: ack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extend: Option<Settle>,
}

/// One handle's outcome in a batch ack: `204` alone, or an error status with its body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckResult {
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl AckResult {
    pub const APPLIED: u16 = 204;

    pub fn applied() -> Self {
        Self {
            status: Self::APPLIED,
            code: None,
            error: None,
        }
    }

    /// A failed item: the code's own status, its string and the message.
    pub fn failed(code: crate::ErrorCode, error: impl Into<String>) -> Self {
        Self {
            status: code.http_status(),
            code: Some(code.as_str().to_owned()),
            error: Some(error.into()),
        }
    }

    pub fn known_code(&self) -> Option<crate::ErrorCode> {
        self.code.as_deref().and_then(crate::ErrorCode::from_code)
    }
}

/// The `200` of a batch ack: one result per handle, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckResults {
    pub results: Vec<AckResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &str, encoding: &str) -> Message {
        serde_json::from_str(&format!(
            r#"{{"topic":"t","partition":0,"offset":1,"payload":{payload},"payload_encoding":"{encoding}","timestamp_ms":5}}"#
        ))
        .unwrap()
    }

    #[test]
    fn payloads_decode_to_the_stored_bytes() {
        let m = message(r#"{"a": [1, 2.50]}"#, "json");
        assert_eq!(&*m.payload_bytes().unwrap(), br#"{"a": [1, 2.50]}"#);
        let m = message(r#""line\n\"q\" \u00e9""#, "utf8");
        assert_eq!(m.payload_str().unwrap(), "line\n\"q\" é");
        for (b64, bytes) in [
            ("", &b""[..]),
            ("AA==", &[0u8][..]),
            ("AAE=", &[0, 1][..]),
            ("AAEC/w==", &[0, 1, 2, 255][..]),
            ("+/+/", &[0xfb, 0xff, 0xbf][..]),
        ] {
            let m = message(&format!("\"{b64}\""), "base64");
            assert_eq!(&*m.payload_bytes().unwrap(), bytes, "{b64}");
        }
        for bad in ["A", "AA=", "A===", "AB==", "AA==AA==", "AA A", "AA\\nA"] {
            let m = message(&format!("\"{bad}\""), "base64");
            assert!(m.payload_bytes().is_err(), "{bad}");
        }
        assert!(message("1", "utf8").payload_bytes().is_err());
    }

    #[test]
    fn settle_is_written_as_the_server_reads_it() {
        let body = |s| {
            serde_json::to_string(&AckBatch {
                receipt_handles: vec!["h".into()],
                extend: s,
            })
            .unwrap()
        };
        assert_eq!(body(None), r#"{"receipt_handles":["h"]}"#);
        assert_eq!(
            body(Some(Settle::Ack)),
            r#"{"receipt_handles":["h"],"extend":false}"#
        );
        assert_eq!(
            body(Some(Settle::Extend)),
            r#"{"receipt_handles":["h"],"extend":true}"#
        );
        assert_eq!(
            body(Some(Settle::Nack)),
            r#"{"receipt_handles":["h"],"extend":0}"#
        );
        for (v, s) in [
            ("false", Settle::Ack),
            ("\"\"", Settle::Ack),
            ("true", Settle::Extend),
            ("\"1\"", Settle::Extend),
            ("1", Settle::Extend),
            ("0", Settle::Nack),
            ("\"0\"", Settle::Nack),
        ] {
            assert_eq!(serde_json::from_str::<Settle>(v).unwrap(), s, "{v}");
        }
        assert!(serde_json::from_str::<Settle>("2").is_err());
        assert!(serde_json::from_str::<Settle>("\"yes\"").is_err());
    }

    #[test]
    fn a_text_message_is_a_utf8_string() {
        let m = ProduceMessage::text("a \"b\"");
        assert_eq!(
            serde_json::to_string(&m).unwrap(),
            r#"{"payload":"a \"b\"","payload_encoding":"utf8"}"#
        );
    }
}
