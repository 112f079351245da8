//! Message operations: send, receive, delete and change visibility, single and batch.
//!
//! A message's body is the record's payload; its attributes are the record's headers
//! ([`narad_sqs::attrs`]); its `MessageId` is made from where the record is, so it is the
//! same on every delivery and in a replay; its receipt handle is the broker's.

use std::collections::BTreeMap;

use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use narad_auth::Action;
use narad_core::broker::{AckAction, ProduceMessage, Produced};
use narad_core::topic::MIN_VISIBILITY_MS;
use narad_sqs::attrs::{self, TRACE_HEADER};
use narad_sqs::limits::{MAX_BATCH_BYTES, MAX_DELAY_S, MAX_RECEIVE, MAX_VISIBILITY_S, MAX_WAIT_S};
use narad_sqs::ops::{self, SendEntry, check_batch_ids, required};
use narad_sqs::queue::message_id;
use narad_sqs::{Kind, SqsError, md5};
use narad_wire::ErrorCode;
use serde::Serialize;
use serde_json::{Value, json};

use super::super::ApiError;
use super::{Ctx, ok, ok_text, set_headers};
use crate::plane::Written;

/// A message checked and ready to produce, with what the answer says of it.
struct Outgoing {
    msg: ProduceMessage,
    md5_body: String,
    md5_attrs: Option<String>,
    md5_system: Option<String>,
}

/// Checks one message to send to a queue whose messages may be `max_bytes` long (body and
/// attributes).
fn outgoing(e: SendEntry, max_bytes: u64) -> Result<Outgoing, SqsError> {
    let body = e
        .message_body
        .filter(|b| !b.is_empty())
        .ok_or_else(|| SqsError::missing("MessageBody"))?;
    if !attrs::valid_text(&body) {
        return Err(SqsError::new(
            Kind::InvalidMessageContents,
            "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF",
        ));
    }
    let delay_ms = match e.delay_seconds {
        None => None,
        Some(d) if (0..=MAX_DELAY_S).contains(&d) => Some(d * 1000),
        Some(d) => {
            return Err(SqsError::invalid_value(
                "DelaySeconds",
                d,
                &format!("DelaySeconds must be >= 0 and <= {MAX_DELAY_S}"),
            ));
        }
    };
    if e.message_deduplication_id.is_some() {
        return Err(SqsError::new(
            Kind::InvalidParameterValue,
            "The request include parameter that is not valid for this queue type: MessageDeduplicationId is for FIFO queues",
        ));
    }
    let attributes = attrs::check("MessageAttributes", e.message_attributes)?;
    let system = attrs::check("MessageSystemAttributes", e.message_system_attributes)?;
    let mut trace = None;
    for (name, a) in &system {
        match (name.as_str(), &a.value) {
            ("AWSTraceHeader", attrs::AttrValue::String(s)) if a.data_type == "String" => {
                trace = Some(s.clone());
            }
            _ => {
                return Err(SqsError::new(
                    Kind::InvalidParameterValue,
                    format!(
                        "Message system attribute '{name}' is not supported: only AWSTraceHeader, of type String"
                    ),
                ));
            }
        }
    }
    let size = body.len()
        + attributes
            .iter()
            .chain(&system)
            .map(|(n, a)| a.size(n))
            .sum::<usize>();
    if size as u64 > max_bytes {
        return Err(SqsError::new(
            Kind::InvalidParameterValue,
            format!(
                "One or more parameters are invalid. Reason: Message must be shorter than {max_bytes} bytes."
            ),
        ));
    }
    let md5_body = md5::of_body(body.as_bytes());
    let md5_attrs = md5::of_attributes(attributes.iter().map(|(n, a)| (n.as_str(), a)));
    let md5_system = md5::of_attributes(system.iter().map(|(n, a)| (n.as_str(), a)));
    let headers = attrs::to_headers(&attributes, trace.as_deref())
        .into_iter()
        .map(|(n, v)| (n, Bytes::from(v)))
        .collect();
    Ok(Outgoing {
        msg: ProduceMessage {
            key: None,
            partition: None,
            delay_ms,
            headers,
            payload: Bytes::from(body),
        },
        md5_body,
        md5_attrs,
        md5_system,
    })
}

/// A message with nothing in it, left where one was moved out.
fn empty_message() -> ProduceMessage {
    ProduceMessage {
        key: None,
        partition: None,
        delay_ms: None,
        headers: Vec::new(),
        payload: Bytes::new(),
    }
}

/// The answer for one message sent (`id`: its batch entry's).
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Sent<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    message_id: String,
    #[serde(rename = "MD5OfMessageBody")]
    md5_of_message_body: &'a str,
    #[serde(
        rename = "MD5OfMessageAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    md5_of_message_attributes: Option<&'a str>,
    #[serde(
        rename = "MD5OfMessageSystemAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    md5_of_message_system_attributes: Option<&'a str>,
}

fn sent<'a>(o: &'a Outgoing, id: Option<&'a str>, topic_id: u64, p: Produced) -> Sent<'a> {
    Sent {
        id,
        message_id: message_id(topic_id, p.partition, p.offset),
        md5_of_message_body: &o.md5_body,
        md5_of_message_attributes: o.md5_attrs.as_deref(),
        md5_of_message_system_attributes: o.md5_system.as_deref(),
    }
}

/// The queue's topic id and largest message, for a send.
fn queue_facts(ctx: &Ctx<'_>, name: &str) -> Result<(u64, u64), SqsError> {
    let broker = ctx.state.broker()?;
    Ok(broker
        .with_topic_meta(name, |m| (m.id, m.config.max_message_bytes))
        .map_err(ApiError::from)?)
}

/// After a produce to `name` (topic id `id` before it): a queue deleted and made again
/// meanwhile leaves the message in one of the two, and which is not known.
fn same_queue(ctx: &Ctx<'_>, name: &str, id: u64) -> Result<(), SqsError> {
    let now = ctx.state.broker()?.with_topic_meta(name, |m| m.id).ok();
    if now == Some(id) {
        return Ok(());
    }
    Err(SqsError::new(
        Kind::InternalFailure,
        "outcome unknown: the queue was deleted (and perhaps made again) while the message was sent; it may or may not have been written",
    ))
}

pub(super) async fn send(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::SendMessage = ops::parse(body)?;
    let (url, entry) = r.split();
    let name = ctx.queue(url.as_deref())?;
    ctx.caller.require(Action::Produce, name)?;
    let (id, max_bytes) = queue_facts(ctx, name)?;
    let o = outgoing(entry, max_bytes)?;
    super::super::produce::admit(ctx.state, &ctx.caller, name, std::slice::from_ref(&o.msg))
        .await?;
    let written = ctx
        .state
        .plane()?
        .produce(name, vec![o.msg.clone()])
        .await?;
    let p = match written {
        Written::All(mut r) => r.remove(0),
        Written::Each(mut e) => e.remove(0)?,
    };
    same_queue(ctx, name, id)?;
    Ok(ok_text(
        serde_json::to_string(&sent(&o, None, id, p)).expect("an answer serialises"),
    ))
}

/// A batch entry's failure.
fn failed(id: &str, e: &SqsError) -> Value {
    json!({
        "Id": id,
        "SenderFault": e.sender_fault(),
        "Code": e.kind.query_code(),
        "Message": e.message,
    })
}

pub(super) async fn send_batch(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::SendMessageBatch = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    let entries = required(r.entries, "Entries")?;
    check_batch_ids(
        entries.iter().map(|e| e.id.as_deref()),
        "SendMessageBatchRequestEntry",
    )?;
    let total: usize = entries
        .iter()
        .map(|e| {
            e.message_body.as_ref().map_or(0, String::len)
                + e.message_attributes
                    .iter()
                    .map(|(n, a)| {
                        n.len()
                            + a.data_type.as_ref().map_or(0, String::len)
                            + a.string_value.as_ref().map_or(0, String::len)
                            + a.binary_value.as_ref().map_or(0, |b| b.len() / 4 * 3)
                    })
                    .sum::<usize>()
        })
        .sum();
    if total > MAX_BATCH_BYTES {
        return Err(SqsError::new(
            Kind::BatchRequestTooLong,
            format!(
                "Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. You have sent {total} bytes."
            ),
        ));
    }
    ctx.caller.require(Action::Produce, name)?;
    let (topic_id, max_bytes) = queue_facts(ctx, name)?;
    let mut failures = Vec::new();
    let mut checked: Vec<(String, Outgoing)> = Vec::new();
    for mut e in entries {
        let id = e.id.take().unwrap_or_default();
        match outgoing(e, max_bytes) {
            Err(err) => failures.push(failed(&id, &err)),
            Ok(o) => checked.push((id, o)),
        }
    }
    // the topic's checks (its role, its JSON Schema) for all at once; only if they refuse,
    // entry by entry, to say which
    let mut ready = if super::super::produce::admit(
        ctx.state,
        &ctx.caller,
        name,
        &checked
            .iter()
            .map(|(_, o)| o.msg.clone())
            .collect::<Vec<_>>(),
    )
    .await
    .is_ok()
    {
        checked
    } else {
        let mut ready = Vec::with_capacity(checked.len());
        for (id, o) in checked {
            match super::super::produce::admit(
                ctx.state,
                &ctx.caller,
                name,
                std::slice::from_ref(&o.msg),
            )
            .await
            {
                Ok(()) => ready.push((id, o)),
                Err(err) => failures.push(failed(&id, &err.into())),
            }
        }
        ready
    };
    let mut successes = Vec::new();
    if !ready.is_empty() {
        // (moved out: the answers need only the digests)
        let msgs = ready
            .iter_mut()
            .map(|(_, o)| std::mem::replace(&mut o.msg, empty_message()))
            .collect();
        let outcomes: Vec<Result<Produced, ApiError>> =
            match ctx.state.plane()?.produce(name, msgs).await? {
                Written::All(r) => r.into_iter().map(Ok).collect(),
                Written::Each(o) => o,
            };
        same_queue(ctx, name, topic_id)?;
        for ((id, o), outcome) in ready.iter().zip(outcomes) {
            match outcome {
                Ok(p) => successes.push(
                    serde_json::to_value(sent(o, Some(id), topic_id, p))
                        .expect("an answer serialises"),
                ),
                Err(e) => failures.push(failed(id, &e.into())),
            }
        }
    }
    Ok(ok(&json!({"Successful": successes, "Failed": failures})))
}

/// Whether `names` (system attribute names asked for) includes `name`.
fn asked(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name || n == "All")
}

pub(super) async fn receive(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::ReceiveMessage = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    ctx.caller.require(Action::Consume, name)?;
    let max = match r.max_number_of_messages {
        None => 1,
        Some(n) if (1..=MAX_RECEIVE).contains(&n) => n as usize,
        Some(n) => {
            return Err(SqsError::invalid_value(
                "MaxNumberOfMessages",
                n,
                &format!("Must be between 1 and {MAX_RECEIVE}, if provided."),
            ));
        }
    };
    let wait_s = match r.wait_time_seconds {
        None => 0,
        Some(w) if (0..=MAX_WAIT_S).contains(&w) => w,
        Some(w) => {
            return Err(SqsError::invalid_value(
                "WaitTimeSeconds",
                w,
                &format!("Must be >= 0 and <= {MAX_WAIT_S}, if provided."),
            ));
        }
    };
    let visibility_ms = match r.visibility_timeout {
        None => None,
        // (0: the broker's shortest lease, 100 ms)
        Some(v) if (0..=MAX_VISIBILITY_S).contains(&v) => Some((v * 1000).max(MIN_VISIBILITY_MS)),
        Some(v) => {
            return Err(SqsError::invalid_value(
                "VisibilityTimeout",
                v,
                &format!("Must be >= 0 and <= {MAX_VISIBILITY_S}, if provided."),
            ));
        }
    };
    let broker = ctx.state.broker()?;
    let topic_id = broker
        .with_topic_meta(name, |m| m.id)
        .map_err(ApiError::from)?;
    let wait =
        std::time::Duration::from_millis((wait_s as u64 * 1000).min(ctx.state.cfg.max_wait_ms));
    let state = ctx.state;
    let revoked = super::super::consume::revoked(state, &ctx.caller, name);
    let plane = state.plane()?;
    let got = tokio::select! {
        biased;
        e = revoked => return Err(e.into()),
        r = plane.consume_for(name, None, max, wait, ctx.caller.username(), visibility_ms) => r?,
    };
    if let Err(e) = super::super::consume::still_allowed(state, &ctx.caller, name) {
        got.give_back();
        return Err(e.into());
    }
    if got.is_empty() {
        return Ok(ok(&json!({})));
    }
    // (a queue deleted and made again during the wait: its messages would get ids of the
    // old one; nothing is handed out, they are deliverable again at once)
    if broker.with_topic_meta(name, |m| m.id).ok() != Some(topic_id) {
        got.give_back();
        return Ok(ok(&json!({})));
    }
    let leased = match got.leased() {
        Ok(l) => l,
        Err(e) => {
            got.give_back();
            return Err(e.into());
        }
    };
    let system: Vec<String> = r
        .attribute_names
        .iter()
        .chain(&r.message_system_attribute_names)
        .cloned()
        .collect();
    let messages = leased
        .iter()
        .map(|m| render(m, topic_id, &system, &r.message_attribute_names))
        .collect();
    let text = serde_json::to_string(&Received { messages }).expect("messages serialise");
    let mut resp = got.reply_with(&state.body_budget, ctx.held, text).await?;
    set_headers(resp.headers_mut());
    Ok(resp)
}

/// One received message in SQS's form.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Out<'a> {
    message_id: String,
    receipt_handle: &'a str,
    #[serde(rename = "MD5OfBody")]
    md5_of_body: String,
    body: std::borrow::Cow<'a, str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    attributes: BTreeMap<&'static str, String>,
    #[serde(
        rename = "MD5OfMessageAttributes",
        skip_serializing_if = "Option::is_none"
    )]
    md5_of_message_attributes: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    message_attributes: BTreeMap<String, Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct Received<'a> {
    messages: Vec<Out<'a>>,
}

fn render<'a>(
    m: &'a crate::plane::Leased,
    topic_id: u64,
    system: &[String],
    names: &[String],
) -> Out<'a> {
    // (a payload that is not UTF-8, produced through the native API, is given in base64)
    let body = match std::str::from_utf8(&m.payload) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(B64.encode(&m.payload)),
    };
    let mut attributes = BTreeMap::new();
    if asked(system, "SentTimestamp") {
        attributes.insert("SentTimestamp", m.timestamp_ms.to_string());
    }
    if asked(system, "ApproximateReceiveCount") {
        attributes.insert("ApproximateReceiveCount", m.delivery_count.to_string());
    }
    if asked(system, "AWSTraceHeader")
        && let Some((_, v)) = m.headers.iter().find(|(n, _)| n == TRACE_HEADER)
    {
        attributes.insert("AWSTraceHeader", String::from_utf8_lossy(v).into_owned());
    }
    let (mut md5_of_message_attributes, mut message_attributes) = (None, BTreeMap::new());
    if !m.headers.is_empty() && !names.is_empty() {
        let all = attrs::from_headers(m.headers.iter().map(|(n, v)| (n.as_str(), v.as_ref())));
        let chosen: BTreeMap<&str, &attrs::MessageAttribute> = all
            .iter()
            .filter(|(n, _)| attrs::selected(names, n))
            .map(|(n, a)| (n.as_str(), a))
            .collect();
        md5_of_message_attributes = md5::of_attributes(chosen.iter().map(|(n, a)| (*n, *a)));
        message_attributes = chosen
            .iter()
            .map(|(n, a)| ((*n).to_owned(), a.to_json()))
            .collect();
    }
    Out {
        message_id: message_id(topic_id, m.partition, m.offset),
        receipt_handle: &m.receipt_handle,
        md5_of_body: md5::of_body(body.as_bytes()),
        body,
        attributes,
        md5_of_message_attributes,
        message_attributes,
    }
}

/// A settle's error as SQS says it for an operation on one handle.
fn settle_error(e: ApiError, handle: &str, act: AckAction) -> Option<SqsError> {
    match (e.code, act) {
        // deleting what is no longer leased to this handle: AWS's deletes are idempotent (the
        // message may be delivered again: at least once)
        (ErrorCode::LeaseGone, AckAction::Ack) => None,
        (ErrorCode::LeaseGone, _) => Some(SqsError::new(
            Kind::MessageNotInflight,
            "Message does not exist or is not available for visibility timeout change.",
        )),
        (ErrorCode::InvalidReceiptHandle, _) => Some(SqsError::new(
            Kind::ReceiptHandleIsInvalid,
            format!(
                "The input receipt handle \"{}\" is not a valid receipt handle.",
                handle.chars().take(128).collect::<String>()
            ),
        )),
        _ => Some(e.into()),
    }
}

pub(super) async fn delete(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::DeleteMessage = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    let handle = required(r.receipt_handle, "ReceiptHandle")?;
    ctx.caller.require(Action::Consume, name)?;
    settle_one(ctx, name, &handle, AckAction::Ack).await
}

async fn settle_one(
    ctx: &Ctx<'_>,
    name: &str,
    handle: &str,
    act: AckAction,
) -> Result<Response, SqsError> {
    match ctx.state.plane()?.settle(name, handle, act).await {
        Ok(()) => Ok(ok(&json!({}))),
        Err(e) => match settle_error(e, handle, act) {
            None => Ok(ok(&json!({}))),
            Some(e) => Err(e),
        },
    }
}

/// The settle a visibility timeout of `v` seconds is: 0 makes the message visible at once
/// (nack); any other renews the lease for that long from now.
fn visibility_action(v: Option<i64>) -> Result<AckAction, SqsError> {
    let v = required(v, "VisibilityTimeout")?;
    if !(0..=MAX_VISIBILITY_S).contains(&v) {
        return Err(SqsError::invalid_value(
            "VisibilityTimeout",
            v,
            &format!("Must be between 0 and {MAX_VISIBILITY_S}, if provided."),
        ));
    }
    Ok(if v == 0 {
        AckAction::Nack
    } else {
        AckAction::ExtendFor(v * 1000)
    })
}

pub(super) async fn change_visibility(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::ChangeMessageVisibility = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    let handle = required(r.receipt_handle, "ReceiptHandle")?;
    ctx.caller.require(Action::Consume, name)?;
    let act = visibility_action(r.visibility_timeout)?;
    settle_one(ctx, name, &handle, act).await
}

pub(super) async fn delete_batch(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    settle_batch(ctx, body, "DeleteMessageBatchRequestEntry", false).await
}

pub(super) async fn change_visibility_batch(
    ctx: &Ctx<'_>,
    body: &[u8],
) -> Result<Response, SqsError> {
    settle_batch(ctx, body, "ChangeMessageVisibilityBatchRequestEntry", true).await
}

/// `DeleteMessageBatch`, or `ChangeMessageVisibilityBatch` when `visibility`: each entry
/// answered on its own.
async fn settle_batch(
    ctx: &Ctx<'_>,
    body: &[u8],
    entry_name: &str,
    visibility: bool,
) -> Result<Response, SqsError> {
    let r: ops::HandleBatch = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    let entries = required(r.entries, "Entries")?;
    check_batch_ids(entries.iter().map(|e| e.id.as_deref()), entry_name)?;
    ctx.caller.require(Action::Consume, name)?;
    let mut failures = Vec::new();
    // (the entries by the settle they ask for: one call for each)
    let mut groups: Vec<(AckAction, Vec<(String, String)>)> = Vec::new();
    for e in entries {
        let id = e.id.unwrap_or_default();
        let Some(handle) = e.receipt_handle else {
            failures.push(failed(&id, &SqsError::missing("ReceiptHandle")));
            continue;
        };
        let act = if visibility {
            match visibility_action(e.visibility_timeout) {
                Ok(a) => a,
                Err(err) => {
                    failures.push(failed(&id, &err));
                    continue;
                }
            }
        } else {
            AckAction::Ack
        };
        match groups.iter_mut().find(|(a, _)| *a == act) {
            Some((_, g)) => g.push((id, handle)),
            None => groups.push((act, vec![(id, handle)])),
        }
    }
    let plane = ctx.state.plane()?;
    let mut successes = Vec::new();
    for (act, group) in groups {
        let handles: Vec<String> = group.iter().map(|(_, h)| h.clone()).collect();
        let results = plane.settle_many(name, &handles, act).await;
        for ((id, handle), result) in group.into_iter().zip(results) {
            match result.err().and_then(|e| settle_error(e, &handle, act)) {
                None => successes.push(json!({"Id": id})),
                Some(err) => failures.push(failed(&id, &err)),
            }
        }
    }
    Ok(ok(&json!({"Successful": successes, "Failed": failures})))
}
