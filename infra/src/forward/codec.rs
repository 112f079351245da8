//! What members send each other for the data plane: the JSON requests and replies, the
//! produce call's binary encoding (built to be refused, never to panic, on any bytes), and
//! errors as they cross nodes (an `ErrorCode` and a message).

use bytes::{BufMut, Bytes, BytesMut};
use narad_cluster::rpc::Fault;
use narad_core::broker::{ProduceMessage, Produced};

use narad_wire::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::http::error::ApiError;

#[derive(Deserialize)]
pub(crate) struct HandleOnly {
    pub(crate) receipt_handle: String,
}

#[derive(Deserialize)]
pub(crate) struct TopicAndHandle {
    pub(crate) topic: String,
    pub(crate) receipt_handle: String,
}

/// The faults the serving member's RPC layer answers once the work ran or while it ran: the
/// call's deadline passed mid-way (the work was dropped where it stood), or the reply was
/// too large to send. What the call does may have been done.
const MAY_HAVE_RUN: [&str; 2] = [
    narad_cluster::rpc::DEADLINE_EXCEEDED,
    narad_cluster::rpc::REPLY_TOO_LARGE,
];

pub(crate) fn from_fault(f: &Fault) -> ApiError {
    match ErrorCode::from_code(&f.code) {
        Some(code) => ApiError::new(code, f.message.clone()),
        None if MAY_HAVE_RUN.contains(&f.code.as_str()) => ApiError::new(
            ErrorCode::OutcomeUnknown,
            format!(
                "the owner answered {} {}: {}; it may or may not have been applied",
                f.status, f.code, f.message
            ),
        ),
        None => ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!("the owner answered {} {}: {}", f.status, f.code, f.message),
        ),
    }
}

pub(crate) fn to_fault(e: &ApiError) -> Fault {
    Fault::new(e.code.http_status(), e.code.as_str(), e.message.clone())
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConsumeRequest {
    pub(crate) topic: String,
    pub(crate) partition: Option<u32>,
    pub(crate) max: usize,
    pub(crate) wait_ms: u64,
    /// Catalog commands the sender had followed.
    pub(crate) catalog: u64,
    /// Names a wait so the sender can cancel it (0: not cancellable).
    #[serde(default)]
    pub(crate) wait_id: u64,
    /// The lease the messages get (absent: the topic's visibility timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) visibility_ms: Option<i64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelWait {
    pub(crate) wait_id: u64,
}

/// One progress message of a mirror's source, passed on to the members that own the
/// mirror's other partitions (the member the link reached checked it).
#[derive(Debug, Serialize, Deserialize)]
pub struct MirrorProgressRequest {
    pub topic: String,
    pub topic_id: u64,
    pub catalog: u64,
    pub source: narad_core::catalog::role::Source,
    pub partition: u32,
    pub progress: narad_core::broker::PartitionProgress,
    #[serde(default)]
    pub end: Option<narad_core::broker::SourceEnd>,
    #[serde(default)]
    pub returned: Vec<(u32, u64, u64)>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MirrorReportRequest {
    pub(crate) topic: String,
    pub(crate) topic_id: u64,
    pub(crate) catalog: u64,
    /// A promote's last look: settle what the progress covers and drop the index.
    pub(crate) last: bool,
}

/// One member's share of a mirror's report (`last`: only what it settled).
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct MirrorReportReply {
    pub(crate) report: Option<narad_core::broker::MirrorReport>,
    pub(crate) settled: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StatsRequest {
    pub(crate) topic: String,
    pub(crate) catalog: u64,
    /// The incarnation the caller means: an owner holding another answers `404` (its
    /// figures would be another topic's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) topic_id: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayRequest {
    pub(crate) topic: String,
    pub(crate) partition: u32,
    pub(crate) offset: Option<u64>,
    pub(crate) from_time_ms: Option<i64>,
    pub(crate) max: usize,
    pub(crate) catalog: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleRequest {
    pub(crate) topic: String,
    pub(crate) handles: Vec<String>,
    /// `None`: give the leases back (a consume that could not be answered).
    pub(crate) action: Option<String>,
    pub(crate) catalog: u64,
    /// When the caller gives up waiting for the answer (its clock, ms since the epoch): a
    /// settle that reaches the owner later is refused, not applied, so a caller that answered
    /// "unknown" is not followed by a late apply when clocks are in step. Absent: no limit
    /// (a give-back, which must always take effect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deadline_ms: Option<i64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleOutcome {
    pub(crate) code: Option<String>,
    pub(crate) message: Option<String>,
}

impl SettleOutcome {
    pub(crate) fn of(r: Result<(), ApiError>) -> Self {
        match r {
            Ok(()) => Self {
                code: None,
                message: None,
            },
            Err(e) => Self {
                code: Some(e.code.as_str().to_owned()),
                message: Some(e.message),
            },
        }
    }

    pub(crate) fn into_result(self) -> Result<(), ApiError> {
        match self.code {
            None => Ok(()),
            Some(code) => Err(from_fault(&Fault::new(
                0,
                code,
                self.message.unwrap_or_default(),
            ))),
        }
    }
}

// ── the produce call's encoding ──
//
// Records travel as bytes (no JSON escaping of payloads): u64 topic id, u64 catalog, u16 name
// length, name, u32 count, then per message: u32 partition, u8 flags (1: key, 2: delay), [u32
// key length, key], [i64 delay], u16 header count, per header (u16 name length, name, u32
// value length, value), u32 payload length, payload. The reply: u32 count, then (u32
// partition, u64 offset) per message.

/// The fewest bytes one message takes: partition, flags, header count, payload length.
pub(crate) const MIN_MESSAGE_BYTES: usize = 4 + 1 + 2 + 4;

pub(crate) fn encode_produce(
    topic: &str,
    topic_id: u64,
    catalog: u64,
    msgs: &[ProduceMessage],
) -> Bytes {
    let size: usize = msgs
        .iter()
        .map(|m| {
            24 + m.key.as_ref().map_or(0, Bytes::len)
                + m.headers
                    .iter()
                    .map(|(k, v)| 6 + k.len() + v.len())
                    .sum::<usize>()
                + m.payload.len()
        })
        .sum();
    let mut b = BytesMut::with_capacity(24 + topic.len() + size);
    b.put_u64(topic_id);
    b.put_u64(catalog);
    b.put_u16(topic.len() as u16);
    b.put_slice(topic.as_bytes());
    b.put_u32(msgs.len() as u32);
    for m in msgs {
        b.put_u32(m.partition.unwrap_or(0));
        let flags = u8::from(m.key.is_some()) | (u8::from(m.delay_ms.is_some()) << 1);
        b.put_u8(flags);
        if let Some(k) = &m.key {
            b.put_u32(k.len() as u32);
            b.put_slice(k);
        }
        if let Some(d) = m.delay_ms {
            b.put_i64(d);
        }
        b.put_u16(m.headers.len() as u16);
        for (k, v) in &m.headers {
            b.put_u16(k.len() as u16);
            b.put_slice(k.as_bytes());
            b.put_u32(v.len() as u32);
            b.put_slice(v);
        }
        b.put_u32(m.payload.len() as u32);
        b.put_slice(&m.payload);
    }
    b.freeze()
}

/// A bounds-checked reader over a request: every read that would run past the end is
/// `None`, never a panic (another member's bytes carry a client's).
pub(crate) struct Reader {
    pub(crate) b: Bytes,
    pub(crate) at: usize,
}

impl Reader {
    fn take(&mut self, n: usize) -> Option<Bytes> {
        let end = self.at.checked_add(n)?;
        if end > self.b.len() {
            return None;
        }
        let s = self.b.slice(self.at..end);
        self.at = end;
        Some(s)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.as_ref().try_into().ok()
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.array()?))
    }

    fn left(&self) -> usize {
        self.b.len() - self.at
    }
}

pub(crate) struct ProduceRequest {
    pub(crate) topic: String,
    pub(crate) topic_id: u64,
    pub(crate) catalog: u64,
    pub(crate) msgs: Vec<ProduceMessage>,
}

pub(crate) fn decode_produce(body: Bytes) -> Option<ProduceRequest> {
    let mut r = Reader { b: body, at: 0 };
    let topic_id = r.u64()?;
    let catalog = r.u64()?;
    let len = r.u16()? as usize;
    let topic = String::from_utf8(r.take(len)?.to_vec()).ok()?;
    let count = r.u32()? as usize;
    // a count that the bytes left cannot hold is a lie (and would size a huge Vec)
    if count > r.left() / MIN_MESSAGE_BYTES {
        return None;
    }
    let mut msgs = Vec::with_capacity(count);
    for _ in 0..count {
        let partition = r.u32()?;
        let flags = r.u8()?;
        if flags & !3 != 0 {
            return None;
        }
        let key = if flags & 1 != 0 {
            let n = r.u32()? as usize;
            Some(r.take(n)?)
        } else {
            None
        };
        let delay_ms = if flags & 2 != 0 {
            Some(i64::from_be_bytes(r.array()?))
        } else {
            None
        };
        let nh = r.u16()? as usize;
        let mut headers = Vec::with_capacity(nh.min(64));
        for _ in 0..nh {
            let kl = r.u16()? as usize;
            let k = String::from_utf8(r.take(kl)?.to_vec()).ok()?;
            let vl = r.u32()? as usize;
            headers.push((k, r.take(vl)?));
        }
        let pl = r.u32()? as usize;
        let payload = r.take(pl)?;
        msgs.push(ProduceMessage {
            key,
            partition: Some(partition),
            delay_ms,
            headers,
            payload,
        });
    }
    (r.left() == 0).then_some(ProduceRequest {
        topic,
        topic_id,
        catalog,
        msgs,
    })
}

pub(crate) fn encode_produced(produced: &[Produced]) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + produced.len() * 12);
    b.put_u32(produced.len() as u32);
    for p in produced {
        b.put_u32(p.partition);
        b.put_u64(p.offset);
    }
    b.freeze()
}

pub(crate) fn decode_produced(body: &Bytes) -> Option<Vec<Produced>> {
    let mut r = Reader {
        b: body.clone(),
        at: 0,
    };
    let count = r.u32()? as usize;
    if count > r.left() / 12 {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(Produced {
            partition: r.u32()?,
            offset: r.u64()?,
        });
    }
    (r.left() == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(payload: &'static [u8]) -> ProduceMessage {
        ProduceMessage {
            payload: Bytes::from_static(payload),
            partition: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn produce_calls_round_trip_however_small_their_messages() {
        let mut msgs: Vec<ProduceMessage> = (0..50).map(|_| msg(b"1")).collect();
        msgs.push(ProduceMessage {
            key: Some(Bytes::from_static(b"k")),
            delay_ms: Some(7),
            headers: vec![("h".into(), Bytes::from_static(b"v"))],
            ..msg(b"")
        });
        let b = encode_produce("t", 9, 4, &msgs);
        let r = decode_produce(b).expect("decodes");
        assert_eq!((r.topic.as_str(), r.topic_id, r.catalog), ("t", 9, 4));
        assert_eq!(r.msgs.len(), 51);
        assert_eq!(r.msgs[50].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(r.msgs[50].delay_ms, Some(7));
        assert_eq!(r.msgs[0].payload, Bytes::from_static(b"1"));
    }

    #[test]
    fn junk_produce_calls_are_refused_without_panicking() {
        let good = encode_produce("topic", 1, 2, &[msg(b"payload"), msg(b"x")]);
        // every truncation, and every single-byte change, decodes or is refused: no panic
        for n in 0..good.len() {
            let _ = decode_produce(good.slice(..n));
        }
        for i in 0..good.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = good.to_vec();
                b[i] = v;
                let _ = decode_produce(Bytes::from(b));
            }
        }
        // a count far beyond what the bytes hold
        let mut b = BytesMut::new();
        b.put_u64(1);
        b.put_u64(0);
        b.put_u16(1);
        b.put_slice(b"t");
        b.put_u32(u32::MAX);
        assert!(decode_produce(b.freeze()).is_none());
        // trailing bytes
        let mut b = good.to_vec();
        b.push(0);
        assert!(decode_produce(Bytes::from(b)).is_none());
    }

    #[test]
    fn every_error_crosses_nodes_as_itself() {
        for &code in ErrorCode::ALL {
            let e = ApiError::new(code, format!("{code:?} at the owner"));
            let back = from_fault(&to_fault(&e));
            assert_eq!(back.code, code);
            assert_eq!(back.message, e.message);
        }
        // the owner's RPC layer cut the work off at the caller's deadline, or could not send
        // its reply: it may have been done, so never "not applied"
        for code in [
            narad_cluster::rpc::DEADLINE_EXCEEDED,
            narad_cluster::rpc::REPLY_TOO_LARGE,
        ] {
            let back = from_fault(&Fault::new(504, code, "not done within 800 ms"));
            assert_eq!(back.code, ErrorCode::OutcomeUnknown, "{code}");
            assert!(back.message.contains("may or may not"), "{}", back.message);
        }
        // a code this member does not know (a newer owner's): unavailable, saying what came
        let back = from_fault(&Fault::new(409, "brand_new_code", "something new"));
        assert_eq!(back.code, ErrorCode::ClusterUnavailable);
        assert!(
            back.message.contains("409 brand_new_code: something new"),
            "{}",
            back.message
        );
    }

    #[test]
    fn produced_replies_round_trip_and_junk_is_refused() {
        let produced: Vec<Produced> = (0..5)
            .map(|i| Produced {
                partition: i,
                offset: u64::MAX - u64::from(i),
            })
            .collect();
        let b = encode_produced(&produced);
        let back = decode_produced(&b).expect("decodes");
        assert_eq!(
            back.iter()
                .map(|p| (p.partition, p.offset))
                .collect::<Vec<_>>(),
            produced
                .iter()
                .map(|p| (p.partition, p.offset))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            decode_produced(&encode_produced(&[])).map(|v| v.len()),
            Some(0)
        );
        for n in 0..b.len() {
            assert!(decode_produced(&b.slice(..n)).is_none(), "cut at {n}");
        }
        let mut long = b.to_vec();
        long.push(0);
        assert!(
            decode_produced(&Bytes::from(long)).is_none(),
            "trailing bytes"
        );
        let mut lie = BytesMut::new();
        lie.put_u32(u32::MAX);
        assert!(
            decode_produced(&lie.freeze()).is_none(),
            "a count the bytes cannot hold"
        );
    }

    #[test]
    fn produce_calls_with_unknown_flags_or_a_name_not_utf8_are_refused() {
        let good = encode_produce("t", 1, 2, &[msg(b"x")]);
        // the flags byte follows ids (16), name (2 + 1), count (4) and partition (4)
        let flags_at = 16 + 2 + 1 + 4 + 4;
        assert_eq!(good[flags_at], 0);
        for bad in [4u8, 8, 0x80] {
            let mut b = good.to_vec();
            b[flags_at] = bad;
            assert!(decode_produce(Bytes::from(b)).is_none(), "flags {bad:#x}");
        }
        let mut b = good.to_vec();
        b[18] = 0xff; // the name's one byte
        assert!(decode_produce(Bytes::from(b)).is_none());
    }

    #[test]
    fn settle_outcomes_carry_their_error_and_nothing_else() {
        assert!(SettleOutcome::of(Ok(())).into_result().is_ok());
        let e = ApiError::new(ErrorCode::LeaseGone, "too late");
        let back = SettleOutcome::of(Err(e)).into_result().unwrap_err();
        assert_eq!(
            (back.code, back.message.as_str()),
            (ErrorCode::LeaseGone, "too late")
        );
        // an outcome naming a code this member does not know
        let odd = SettleOutcome {
            code: Some("from_a_newer_member".into()),
            message: None,
        };
        assert_eq!(
            odd.into_result().unwrap_err().code,
            ErrorCode::ClusterUnavailable
        );
    }

    #[test]
    fn requests_between_members_take_no_unknown_field() {
        let consume = r#"{"topic":"t","partition":null,"max":1,"wait_ms":0,"catalog":3}"#;
        let c: ConsumeRequest = serde_json::from_str(consume).unwrap();
        assert_eq!(
            (c.max, c.wait_id),
            (1, 0),
            "an older member's request: not cancellable"
        );
        let extra = consume.replace('}', r#","more":1}"#);
        assert!(serde_json::from_str::<ConsumeRequest>(&extra).is_err());
        assert!(
            serde_json::from_str::<StatsRequest>(r#"{"topic":"t","catalog":1,"x":0}"#).is_err()
        );
        assert!(serde_json::from_str::<CancelWait>(r#"{"wait_id":1,"x":0}"#).is_err());
        // a give-back has no deadline, and says so by leaving it out
        let settle = SettleRequest {
            topic: "t".into(),
            handles: vec![],
            action: None,
            catalog: 1,
            deadline_ms: None,
        };
        assert!(
            !serde_json::to_string(&settle)
                .unwrap()
                .contains("deadline_ms")
        );
    }

    proptest::proptest! {
        #[test]
        fn any_produce_call_round_trips(
            topic in "[a-z]{1,20}",
            msgs in proptest::collection::vec(
                (
                    proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 0..20)),
                    proptest::option::of(proptest::num::i64::ANY),
                    proptest::collection::vec(("[a-z-]{1,8}", proptest::collection::vec(proptest::num::u8::ANY, 0..8)), 0..3),
                    proptest::collection::vec(proptest::num::u8::ANY, 0..64),
                    0u32..64,
                ),
                0..20,
            ),
        ) {
            let msgs: Vec<ProduceMessage> = msgs
                .into_iter()
                .map(|(key, delay_ms, headers, payload, partition)| ProduceMessage {
                    key: key.map(Bytes::from),
                    delay_ms,
                    headers: headers.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect(),
                    payload: Bytes::from(payload),
                    partition: Some(partition),
                })
                .collect();
            let r = decode_produce(encode_produce(&topic, 5, 6, &msgs)).expect("decodes");
            proptest::prop_assert_eq!(&r.topic, &topic);
            proptest::prop_assert_eq!(r.msgs.len(), msgs.len());
            for (a, b) in r.msgs.iter().zip(&msgs) {
                proptest::prop_assert_eq!(&a.key, &b.key);
                proptest::prop_assert_eq!(a.delay_ms, b.delay_ms);
                proptest::prop_assert_eq!(&a.headers, &b.headers);
                proptest::prop_assert_eq!(&a.payload, &b.payload);
                proptest::prop_assert_eq!(a.partition, b.partition);
            }
        }
    }
}
