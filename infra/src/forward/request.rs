//! Every data-plane call one member makes of another, as one enum: [`DataRequest::decode`]
//! turns an op and its body into a typed request (or refuses it as malformed: any bytes, never
//! a panic), and [`DataRequest::frame`] turns a request into the op and body that carry it, so
//! no caller can pair a body with another op's number. The service
//! ([`super::service::DataService`]) matches on the decoded request; the bodies' shapes are
//! in [`super::codec`]; the op numbers in `narad_cluster::rpc::ops`.
//!
//! Checks that need no state are made here, once: batch bounds, the settle action, a replay's
//! start, a fan-out append's one partition and delays, a delivery token's id.

use bytes::Bytes;
use narad_cluster::rpc::ops::{
    CANCEL_WAIT, CHILDREN, CONSUME, DELIVER, FANOUT_APPEND, GIVE_BACK, MIRROR_PROGRESS,
    MIRROR_REPORT, PRODUCE, PURGE, REPLAY, SETTLE, STATS, WAIT_TOKEN,
};
use narad_cluster::rpc::{Fault, Op};
use narad_core::broker::{AckAction, ProduceMessage, ReplayFrom};
use narad_core::record::NewRecord;
use narad_wire::limits::{MAX_BATCH_ACK, MAX_CONSUME_BATCH};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::codec::*;

/// Messages an owner pushes to the member holding a reader's delivery token.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Delivered {
    pub(crate) topic: String,
    pub(crate) token: u64,
    pub(crate) messages: Vec<Box<RawValue>>,
}

/// A fan-out append: copies for one partition of a child, checked.
pub(crate) struct FanoutAppend {
    pub(crate) topic: String,
    pub(crate) topic_id: u64,
    pub(crate) catalog: u64,
    pub(crate) partition: u32,
    pub(crate) records: Vec<NewRecord>,
}

/// One data-plane call.
pub(crate) enum DataRequest {
    /// Append messages on their partitions' owner (binary body).
    Produce(ProduceRequest),
    /// Lease messages (`wait_id` not 0: the wait can be cancelled).
    Consume(ConsumeRequest),
    /// Read records, changing nothing.
    Replay {
        req: ReplayRequest,
        from: ReplayFrom,
    },
    /// Ack, extend or nack deliveries; `None`: give them back (as [`Self::GiveBack`]).
    Settle {
        req: SettleRequest,
        action: Option<AckAction>,
    },
    /// Give deliveries back: a consume that could not be answered.
    GiveBack(SettleRequest),
    /// Append fan-out copies to one partition of a child (binary body).
    FanoutAppend(FanoutAppend),
    /// The children of a topic with the lag of the cursors this member runs.
    Children(StatsRequest),
    /// A mirror's source progress, to settle what it covers.
    MirrorProgress(MirrorProgressRequest),
    /// This member's share of a mirror's report.
    MirrorReport(MirrorReportRequest),
    /// The figures of the partitions this member owns.
    Stats(StatsRequest),
    /// Empty the queue of the partitions this member owns.
    Purge(StatsRequest),
    /// A reader's delivery token: push it messages when there are some.
    WaitToken(ConsumeRequest),
    /// Messages pushed for a delivery token this member holds.
    Deliver(Delivered),
    /// A reader gave up: end its wait or drop its token.
    CancelWait(CancelWait),
}

/// The refusal of a body that is not what its op carries.
pub(crate) fn malformed(what: &str) -> Fault {
    Fault::new(
        400,
        "malformed_request",
        format!("a malformed {what} request"),
    )
}

fn json<'a, T: Deserialize<'a>>(body: &'a [u8], what: &str) -> Result<T, Fault> {
    serde_json::from_slice(body).map_err(|_| malformed(what))
}

fn to_json(v: &impl Serialize) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("requests serialise"))
}

/// The settle action a body names (`None`: give back).
fn settle_action(action: Option<&str>) -> Result<Option<AckAction>, Fault> {
    match action {
        None => Ok(None),
        Some("ack") => Ok(Some(AckAction::Ack)),
        Some("extend") => Ok(Some(AckAction::Extend)),
        Some("nack") => Ok(Some(AckAction::Nack)),
        Some(a) => match a.strip_prefix("extend:").map(str::parse::<i64>) {
            Some(Ok(ms)) if ms > 0 => Ok(Some(AckAction::ExtendFor(ms))),
            _ => Err(malformed("ack")),
        },
    }
}

impl DataRequest {
    /// The request `op` carries in `body`; `None` if `op` is not a data-plane call (another
    /// service's, or unknown).
    pub(crate) fn decode(op: Op, body: Bytes) -> Option<Result<Self, Fault>> {
        Some(match op {
            PRODUCE => decode_produce(body)
                .map(Self::Produce)
                .ok_or_else(|| malformed("produce")),
            CONSUME => json(&body, "consume").map(Self::Consume),
            REPLAY => json::<ReplayRequest>(&body, "replay").and_then(|req| {
                let from = match (req.offset, req.from_time_ms) {
                    (Some(o), _) => ReplayFrom::Offset(o),
                    (None, Some(t)) => ReplayFrom::TimeMs(t),
                    (None, None) => return Err(malformed("replay")),
                };
                Ok(Self::Replay { req, from })
            }),
            SETTLE | GIVE_BACK => json::<SettleRequest>(&body, "ack").and_then(|req| {
                if req.handles.len() > MAX_BATCH_ACK {
                    return Err(malformed("ack"));
                }
                let action = settle_action(req.action.as_deref())?;
                Ok(match (op, action) {
                    (GIVE_BACK, None) => Self::GiveBack(req),
                    (GIVE_BACK, Some(_)) => return Err(malformed("give-back")),
                    (_, action) => Self::Settle { req, action },
                })
            }),
            FANOUT_APPEND => decode_fanout(body).map(Self::FanoutAppend),
            CHILDREN => json(&body, "children").map(Self::Children),
            MIRROR_PROGRESS => json(&body, "mirror progress").map(Self::MirrorProgress),
            MIRROR_REPORT => json(&body, "mirror report").map(Self::MirrorReport),
            STATS => json(&body, "stats").map(Self::Stats),
            PURGE => json(&body, "purge").map(Self::Purge),
            WAIT_TOKEN => json::<ConsumeRequest>(&body, "token").and_then(|req| {
                if req.wait_id == 0 {
                    return Err(malformed("token"));
                }
                Ok(Self::WaitToken(req))
            }),
            DELIVER => json::<Delivered>(&body, "delivery").and_then(|req| {
                if req.messages.len() > MAX_CONSUME_BATCH as usize {
                    return Err(malformed("delivery"));
                }
                Ok(Self::Deliver(req))
            }),
            CANCEL_WAIT => json(&body, "cancel").map(Self::CancelWait),
            _ => return None,
        })
    }

    /// The op and the body that carry this request to another member.
    pub(crate) fn frame(&self) -> (Op, Bytes) {
        match self {
            Self::Produce(r) => (
                PRODUCE,
                encode_produce(&r.topic, r.topic_id, r.catalog, &r.msgs),
            ),
            Self::Consume(r) => (CONSUME, to_json(r)),
            Self::Replay { req, .. } => (REPLAY, to_json(req)),
            Self::Settle { req, .. } => (SETTLE, to_json(req)),
            Self::GiveBack(req) => (GIVE_BACK, to_json(req)),
            Self::FanoutAppend(f) => {
                let msgs: Vec<ProduceMessage> = f
                    .records
                    .iter()
                    .map(|r| ProduceMessage {
                        key: r.key.clone(),
                        partition: Some(f.partition),
                        // (no delay is sent as none)
                        delay_ms: (r.delay_ms > 0).then_some(i64::from(r.delay_ms)),
                        headers: r.headers.clone(),
                        payload: r.payload.clone(),
                    })
                    .collect();
                (
                    FANOUT_APPEND,
                    encode_produce(&f.topic, f.topic_id, f.catalog, &msgs),
                )
            }
            Self::Children(r) => (CHILDREN, to_json(r)),
            Self::MirrorProgress(r) => (MIRROR_PROGRESS, to_json(r)),
            Self::MirrorReport(r) => (MIRROR_REPORT, to_json(r)),
            Self::Stats(r) => (STATS, to_json(r)),
            Self::Purge(r) => (PURGE, to_json(r)),
            Self::WaitToken(r) => (WAIT_TOKEN, to_json(r)),
            Self::Deliver(r) => (DELIVER, to_json(r)),
            Self::CancelWait(r) => (CANCEL_WAIT, to_json(r)),
        }
    }
}

/// A fan-out append's body: a produce body whose messages all name one partition, with
/// delays a record can hold.
fn decode_fanout(body: Bytes) -> Result<FanoutAppend, Fault> {
    let bad = || malformed("fan-out append");
    let req = decode_produce(body).ok_or_else(bad)?;
    // one partition per call (a cursor's group for one child partition)
    let partition = req.msgs.first().and_then(|m| m.partition).ok_or_else(bad)?;
    let mut records = Vec::with_capacity(req.msgs.len());
    for m in req.msgs {
        let delay = m.delay_ms.unwrap_or(0);
        if m.partition != Some(partition) || !(0..=i64::from(u32::MAX)).contains(&delay) {
            return Err(bad());
        }
        records.push(NewRecord {
            key: m.key,
            headers: m.headers,
            payload: m.payload,
            delay_ms: delay as u32,
        });
    }
    Ok(FanoutAppend {
        topic: req.topic,
        topic_id: req.topic_id,
        catalog: req.catalog,
        partition,
        records,
    })
}

#[cfg(test)]
mod tests {
    use narad_cluster::rpc::ops::ALL;

    use super::*;

    /// Every op of the data plane.
    const DATA_OPS: [Op; 14] = [
        PRODUCE,
        CONSUME,
        REPLAY,
        SETTLE,
        GIVE_BACK,
        FANOUT_APPEND,
        CHILDREN,
        MIRROR_PROGRESS,
        MIRROR_REPORT,
        STATS,
        PURGE,
        WAIT_TOKEN,
        DELIVER,
        CANCEL_WAIT,
    ];

    fn requests() -> Vec<DataRequest> {
        let consume = || ConsumeRequest {
            topic: "t".into(),
            partition: Some(1),
            max: 10,
            wait_ms: 500,
            catalog: 7,
            wait_id: 9,
            visibility_ms: Some(60_000),
        };
        let settle = |action: Option<&str>| SettleRequest {
            topic: "t".into(),
            handles: vec!["1.abc".into()],
            action: action.map(str::to_owned),
            catalog: 7,
            deadline_ms: Some(5),
        };
        let stats = || StatsRequest {
            topic: "t".into(),
            catalog: 7,
            topic_id: Some(3),
        };
        let msg = |partition| ProduceMessage {
            key: Some(Bytes::from_static(b"k")),
            partition,
            delay_ms: Some(20),
            headers: vec![("h".into(), Bytes::from_static(b"v"))],
            payload: Bytes::from_static(b"{}"),
        };
        vec![
            DataRequest::Produce(ProduceRequest {
                topic: "t".into(),
                topic_id: 3,
                catalog: 7,
                msgs: vec![msg(Some(0)), msg(None)],
            }),
            DataRequest::Consume(consume()),
            DataRequest::Replay {
                req: ReplayRequest {
                    topic: "t".into(),
                    partition: 2,
                    offset: Some(4),
                    from_time_ms: None,
                    max: 3,
                    catalog: 7,
                },
                from: ReplayFrom::Offset(4),
            },
            DataRequest::Settle {
                req: settle(Some("extend")),
                action: Some(AckAction::Extend),
            },
            DataRequest::GiveBack(settle(None)),
            DataRequest::FanoutAppend(FanoutAppend {
                topic: "c".into(),
                topic_id: 4,
                catalog: 7,
                partition: 1,
                records: vec![NewRecord {
                    key: None,
                    headers: Vec::new(),
                    payload: Bytes::from_static(b"1"),
                    delay_ms: 0,
                }],
            }),
            DataRequest::Children(stats()),
            DataRequest::MirrorProgress(MirrorProgressRequest {
                topic: "m".into(),
                topic_id: 5,
                catalog: 7,
                source: narad_core::catalog::role::Source {
                    cluster: 1,
                    topic: 2,
                },
                partition: 1,
                progress: Default::default(),
                end: None,
                returned: vec![(1, 2, 3)],
            }),
            DataRequest::MirrorReport(MirrorReportRequest {
                topic: "m".into(),
                topic_id: 5,
                catalog: 7,
                last: true,
            }),
            DataRequest::Stats(stats()),
            DataRequest::Purge(stats()),
            DataRequest::WaitToken(consume()),
            DataRequest::Deliver(Delivered {
                topic: "t".into(),
                token: 11,
                messages: vec![RawValue::from_string("{\"a\":1}".into()).unwrap()],
            }),
            DataRequest::CancelWait(CancelWait { wait_id: 9 }),
        ]
    }

    /// Every request goes out on its own op and comes back as itself (its body framed
    /// again is the same bytes).
    #[test]
    fn every_request_crosses_nodes_as_itself() {
        for req in requests() {
            let (op, body) = req.frame();
            let back = DataRequest::decode(op, body.clone())
                .unwrap_or_else(|| panic!("{op:?} is a data-plane op"))
                .unwrap_or_else(|f| panic!("{op:?}: {f}"));
            let (op2, body2) = back.frame();
            assert_eq!((op2, &body2), (op, &body), "{op:?}");
        }
    }

    /// Bodies that are not their op's are refused as malformed, whatever the bytes.
    #[test]
    fn a_body_that_is_not_its_ops_is_refused() {
        let refused = |op: Op, body: &[u8]| {
            matches!(
                DataRequest::decode(op, Bytes::copy_from_slice(body)),
                Some(Err(f)) if f.status == 400 && f.code == "malformed_request"
            )
        };
        for op in DATA_OPS {
            for body in [&b""[..], b"{", b"\xff\x00\x01", b"[]"] {
                assert!(refused(op, body), "{op:?} {body:?}");
            }
        }
        // checks that need no state
        let replay_from_nowhere =
            br#"{"topic":"t","partition":0,"offset":null,"from_time_ms":null,"max":1,"catalog":0}"#;
        assert!(refused(REPLAY, replay_from_nowhere));
        let token_without_id = br#"{"topic":"t","partition":null,"max":1,"wait_ms":1,"catalog":0}"#;
        assert!(refused(WAIT_TOKEN, token_without_id));
        let bad_action = br#"{"topic":"t","handles":[],"action":"burn","catalog":0}"#;
        assert!(refused(SETTLE, bad_action));
        let acking_give_back = br#"{"topic":"t","handles":[],"action":"ack","catalog":0}"#;
        assert!(refused(GIVE_BACK, acking_give_back));
        let too_many = format!(
            r#"{{"topic":"t","handles":{},"catalog":0}}"#,
            serde_json::to_string(&vec!["h"; MAX_BATCH_ACK + 1]).unwrap()
        );
        assert!(refused(SETTLE, too_many.as_bytes()));
        // a fan-out append over two partitions
        let two = encode_produce(
            "c",
            1,
            0,
            &[0, 1].map(|p| ProduceMessage {
                key: None,
                partition: Some(p),
                delay_ms: None,
                headers: Vec::new(),
                payload: Bytes::from_static(b"1"),
            }),
        );
        assert!(refused(FANOUT_APPEND, &two));
    }

    /// Only the data plane's ops are decoded here: the others are another service's.
    #[test]
    fn other_services_ops_are_not_decoded_here() {
        for &(op, _) in ALL {
            let decoded = DataRequest::decode(op, Bytes::new()).is_some();
            assert_eq!(decoded, DATA_OPS.contains(&op), "{op:?}");
        }
    }
}
