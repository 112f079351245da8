//! Produce: one raw message per request, or a JSON batch of up to `max_batch_messages`.
//! A 202 means every message of the request is fsynced.

use std::borrow::Cow;
use std::io::Read;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use narad_core::broker::{BrokerError, ProduceMessage};

use crate::plane::Written;
use narad_core::topic::{MAX_DELAY_MS, MAX_MESSAGE_BYTES_LIMIT};
use narad_wire::ErrorCode;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::access::Caller;
use super::query::Query;
use super::{
    ApiError, ApiResult, SharedState, json_response, json_text_response, parse_json_borrowed,
    read_body,
};
use narad_schema::{CheckError, Lookup, SchemaError};

/// Longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;
/// Most headers on one message, and their sizes.
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEADER_NAME: usize = 256;
pub const MAX_HEADER_VALUE: usize = 16 * 1024;
/// Request headers of this prefix become message headers on single produce.
const HEADER_PREFIX: &str = "x-narad-header-";

fn check_key(key: &str, index: Option<usize>) -> Result<(), ApiError> {
    if key.len() > MAX_KEY_BYTES {
        let at = index.map(|i| format!("message {i}: ")).unwrap_or_default();
        return Err(ApiError::new(
            ErrorCode::InvalidKey,
            format!("{at}key is longer than {MAX_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn check_headers(h: &[(String, Bytes)], at: &str) -> Result<(), ApiError> {
    if h.len() > MAX_HEADERS {
        return Err(ApiError::new(
            ErrorCode::InvalidHeaders,
            format!("{at}more than {MAX_HEADERS} headers"),
        ));
    }
    for (k, v) in h {
        if k.is_empty() || k.len() > MAX_HEADER_NAME || v.len() > MAX_HEADER_VALUE {
            return Err(ApiError::new(
                ErrorCode::InvalidHeaders,
                format!(
                    "{at}header names must be 1 to {MAX_HEADER_NAME} bytes and values at most {MAX_HEADER_VALUE} bytes"
                ),
            ));
        }
    }
    Ok(())
}

/// Validates every payload against the topic's latest JSON Schema, if it has one; the whole
/// request is refused (400 naming the message and the violation) before anything is written.
///
/// What the broker would refuse anyway is refused first, in the broker's order (a malformed
/// delay, then a size over the topic's `max_message_bytes`), so an oversized payload costs no
/// parsing; then the validation is priced and refused over budget before boon runs.
async fn check_schema(
    state: &SharedState,
    broker: &narad_core::broker::Broker,
    topic: &str,
    msgs: &[ProduceMessage],
) -> Result<(), ApiError> {
    let (lookup, max_bytes, default_delay) = broker.with_topic_meta(topic, |m| {
        let lookup = state.schemas.lookup(m);
        (lookup, m.config.max_message_bytes, m.config.delay_ms)
    })?;
    if let Lookup::None = lookup {
        return Ok(());
    }
    for (index, m) in msgs.iter().enumerate() {
        let delay = m.delay_ms.unwrap_or(default_delay);
        if !(0..=MAX_DELAY_MS).contains(&delay) {
            return Err(BrokerError::InvalidMessage {
                index,
                reason: format!("delay_ms must be between 0 and {MAX_DELAY_MS}"),
            }
            .into());
        }
        if m.payload.len() as u64 > max_bytes {
            return Err(BrokerError::MessageTooLarge {
                index,
                size: m.payload.len(),
                max: max_bytes,
            }
            .into());
        }
    }
    let compiled = match lookup {
        Lookup::None => return Ok(()),
        Lookup::Hit(c) => c,
        Lookup::Miss { key, schema } => state
            .schemas
            .compile_latest(key, schema)
            .await
            .map_err(|e| stored_schema_error(topic, e))?,
    };
    let payloads = msgs.iter().map(|m| m.payload.clone()).collect();
    let at = |i: usize| {
        if msgs.len() > 1 {
            format!("message {i}: ")
        } else {
            String::new()
        }
    };
    match state.schemas.check(compiled, payloads).await {
        Ok(()) => Ok(()),
        Err(CheckError::Violation(i, e)) => {
            state
                .metrics
                .schema_rejected
                .get_or_create(&crate::metrics::SchemaLabels {
                    topic: topic.to_owned(),
                })
                .inc();
            Err(ApiError::new(
                ErrorCode::SchemaViolation,
                format!("{}{e}", at(i)),
            ))
        }
        Err(CheckError::TooComplex(i, e)) => Err(ApiError::new(
            ErrorCode::PayloadTooComplex,
            format!("{}{e}", i.map(at).unwrap_or_default()),
        )),
        Err(CheckError::Busy(e)) => Err(ApiError::new(ErrorCode::SchemaBusy, e)),
    }
}

/// A stored schema that cannot be compiled now is the server's problem, not the request's.
fn stored_schema_error(topic: &str, e: SchemaError) -> ApiError {
    match e {
        SchemaError::Busy(e) => ApiError::new(ErrorCode::SchemaBusy, e),
        SchemaError::Invalid(_) | SchemaError::TooComplex(_) => {
            tracing::error!(topic, error = %e, "a stored topic schema does not compile");
            ApiError::new(
                ErrorCode::SchemaUnavailable,
                format!("the topic's schema cannot be used: {e}"),
            )
        }
    }
}

/// A delay from the wire; anything above `i64::MAX` is out of range anyway (the broker caps
/// delays at 15 minutes and says so).
fn delay(v: Option<u64>) -> Option<i64> {
    v.map(|d| i64::try_from(d).unwrap_or(i64::MAX))
}

/// The request's `Content-Encoding`, trimmed (`None`: absent, empty or `identity`). Several
/// headers make one list (RFC 9110, 5.3), which no route decodes: it is refused whole, not
/// read as its first member.
fn content_encoding(headers: &HeaderMap) -> Option<String> {
    let mut values = headers.get_all(header::CONTENT_ENCODING).iter();
    let first = values.next()?;
    let mut list = first.to_str().unwrap_or("(invalid)").trim().to_owned();
    for v in values {
        list.push_str(", ");
        list.push_str(v.to_str().unwrap_or("(invalid)").trim());
    }
    (!matches!(list.as_str(), "" | "identity")).then_some(list)
}

/// A compressed batch body's coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    Gzip,
    Zstd,
}

/// The coding of a batch body (`None`: not compressed), or `415` for one it does not decode.
fn batch_coding(headers: &HeaderMap) -> Result<Option<Coding>, ApiError> {
    match content_encoding(headers).as_deref() {
        None => Ok(None),
        Some("gzip") => Ok(Some(Coding::Gzip)),
        Some("zstd") => Ok(Some(Coding::Zstd)),
        Some(other) => Err(ApiError::new(
            ErrorCode::UnsupportedEncoding,
            format!("Content-Encoding '{other}' is not supported (use zstd or gzip)"),
        )),
    }
}

pub async fn single(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    single_message(&state, &caller, &topic, uri.query(), &headers, body).await
}

/// One message from a request's parts: [`single`] through the router, or the hot route in
/// [`super::hot`] without it.
pub(super) async fn single_message(
    state: &SharedState,
    caller: &Caller,
    topic: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult {
    caller.require(narad_auth::Action::Produce, topic)?;
    let q = Query::parse(query, &["key", "partition", "delay_ms"])?;
    // the query is judged before the body is read (a bad parameter is a 400 even when the
    // body would also be too large)
    let delay_ms = delay(q.u64("delay_ms")?);
    if delay_ms.is_some_and(|d| d > narad_core::topic::MAX_DELAY_MS) {
        return Err(ApiError::new(
            ErrorCode::InvalidMessage,
            format!(
                "message 0: delay_ms must be between 0 and {}",
                narad_core::topic::MAX_DELAY_MS
            ),
        ));
    }
    let partition = q.u32("partition")?;
    let broker = state.broker()?.clone();
    let payload = read_body(body, MAX_MESSAGE_BYTES_LIMIT as usize).await?;
    if let Some(encoding) = content_encoding(headers) {
        // the body is the payload as sent: stored compressed, it would read back compressed
        // (refused once it is read, as a body too large is: see `batch`)
        return Err(ApiError::new(
            ErrorCode::UnsupportedEncoding,
            format!(
                "Content-Encoding '{encoding}' is not supported here: a single message's body is stored as sent (send it uncompressed, or use /produce/batch, which takes zstd or gzip)"
            ),
        ));
    }
    if payload.is_empty() {
        return Err(ApiError::new(
            ErrorCode::EmptyMessage,
            "message body is empty: send the payload as the request body",
        ));
    }
    let key = q.str("key").filter(|k| !k.is_empty());
    if let Some(k) = key {
        check_key(k, None)?;
    }
    let mut msg_headers = Vec::new();
    for (name, value) in headers {
        if let Some(h) = name.as_str().strip_prefix(HEADER_PREFIX) {
            msg_headers.push((h.to_owned(), Bytes::copy_from_slice(value.as_bytes())));
        }
    }
    check_headers(&msg_headers, "")?;
    let msg = ProduceMessage {
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        partition,
        delay_ms,
        headers: msg_headers,
        payload,
    };
    check_origins(caller, &broker, topic, std::slice::from_ref(&msg))?;
    // (a link sends batches only: a single message is a client's, for a primary)
    if headers.contains_key(LINK_HEADER) {
        return Err(ApiError::new(
            ErrorCode::InvalidHeaders,
            format!("{LINK_HEADER} goes with /produce/batch only (a remote child's batches)"),
        ));
    }
    check_intake(
        caller,
        broker.with_topic_meta(topic, |m| m.role).ok(),
        topic,
        None,
    )?;
    check_schema(state, &broker, topic, std::slice::from_ref(&msg)).await?;
    // (one message: written, or not at all)
    let r = match state.plane()?.produce(topic, vec![msg]).await? {
        Written::All(mut r) => r.remove(0),
        Written::Each(mut o) => o.remove(0)?,
    };
    // the wire type itself: written straight to text, no JSON map in between
    let produced = narad_wire::Produced {
        partition: r.partition,
        offset: r.offset,
    };
    Ok(json_response(StatusCode::ACCEPTED, &produced))
}

/// The batch body, parsed without copying: message texts, keys and (escape-free) payloads
/// borrow from the request body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchMessage<'a> {
    #[serde(borrow)]
    payload: &'a RawValue,
    #[serde(default, borrow)]
    payload_encoding: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    key: Option<Cow<'a, str>>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    headers: Option<std::collections::BTreeMap<String, String>>,
}

/// Bytes of `s` as a slice of `body` when `s` points into it (no copy), else a copy.
fn share(body: &Bytes, s: &str) -> Bytes {
    let (start, end) = (body.as_ptr() as usize, body.as_ptr() as usize + body.len());
    let p = s.as_ptr() as usize;
    if p >= start && p + s.len() <= end {
        body.slice_ref(s.as_bytes())
    } else {
        Bytes::copy_from_slice(s.as_bytes())
    }
}

/// The content size a body of exactly one zstd frame declares, if it does.
fn zstd_declared_size(body: &[u8]) -> Option<usize> {
    use zstd::zstd_safe;
    (zstd_safe::find_frame_compressed_size(body).ok()? == body.len())
        .then(|| zstd_safe::get_frame_content_size(body).ok().flatten())
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
}

/// The log2 of the largest window a zstd frame may make its decoder keep: the batch limit
/// (`max_batch_bytes`), rounded up to a power of two. A window larger than the content is
/// never needed, and compressors that know the content's size fit the window to it (the
/// `zstd` tool does); a frame asking for more (up to 128 MiB by default, whatever it holds) is
/// refused instead of allocated.
fn zstd_window_log(limit: usize) -> u32 {
    limit
        .max(1 << 10)
        .checked_next_power_of_two()
        .map_or(31, usize::trailing_zeros)
        .min(31)
}

/// What a zstd decoder keeps besides its window: a block (128 KiB at most) and its context.
const ZSTD_DECODER_EXTRA: usize = 256 * 1024;

/// Memory a compressed batch may take while it inflates, to reserve in the body budget:
/// the inflated copy (`cap`, what a zstd frame declares if it does, else the limit), and a
/// zstd decoder's window (no larger than the content its frame declares).
fn inflating_cost(coding: Coding, body: &[u8], limit: usize) -> (usize, usize) {
    if coding == Coding::Gzip {
        return (limit, limit);
    }
    let declared = zstd_declared_size(body);
    let cap = declared.unwrap_or(limit).min(limit);
    let window = declared
        .unwrap_or(usize::MAX)
        .min(1 << zstd_window_log(limit));
    (cap, cap + window + ZSTD_DECODER_EXTRA)
}

/// Inflates `body` into at most `cap` bytes; a zstd frame's window may be at most
/// `2^window_log` bytes.
fn decompress(
    coding: Coding,
    body: Bytes,
    limit: usize,
    window_log: u32,
) -> Result<Bytes, ApiError> {
    let gzip = coding == Coding::Gzip;
    // Room for exactly what may be read (the limit and one byte to tell it was passed), so the
    // buffer never doubles past it: grown by doubling, telling 16 MiB + 1 from 16 MiB took a
    // 32 MiB buffer beside the 16 MiB one, ~3× what the budget counted (found by a black-box
    // review: 24 clients sending 16 KiB bombs took the process from 241 MB to 1 GB while the
    // budget read 256 MiB). Untouched pages of it cost no memory.
    let mut out = Vec::with_capacity(limit + 1);
    let read = if gzip {
        // every member of the stream (RFC 1952 allows several, as `cat a.gz b.gz` makes);
        // bytes after the last that are not a member are an error, not ignored
        flate2::read::MultiGzDecoder::new(&body[..])
            .take(limit as u64 + 1)
            .read_to_end(&mut out)
    } else {
        zstd::stream::read::Decoder::new(&body[..]).and_then(|mut d| {
            d.window_log_max(window_log)?;
            d.take(limit as u64 + 1).read_to_end(&mut out)
        })
    };
    read.map_err(|e| {
        // (trailing bytes that are not a member read as a member cut short: say what is wanted)
        let hint = if gzip {
            " (a gzip body is one or more whole members, with nothing after the last)".to_owned()
        } else {
            format!(
                " (a zstd body is one or more whole frames, each with a window of at most {} bytes)",
                1u64 << window_log
            )
        };
        ApiError::new(
            ErrorCode::InvalidEncoding,
            format!("cannot decompress body: {e}{hint}"),
        )
    })?;
    if out.len() > limit {
        return Err(ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("decompressed body exceeds {limit} bytes"),
        ));
    }
    Ok(Bytes::from(out))
}

/// The common case parsed in one pass; any error falls back to [`Batch`] and per-message
/// parsing, which names the offending message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchFast<'a> {
    #[serde(borrow)]
    messages: Vec<BatchMessage<'a>>,
}

fn parse_message(i: usize, raw: &RawValue) -> Result<BatchMessage<'_>, ApiError> {
    serde_json::from_str(raw.get())
        .map_err(|e| ApiError::new(ErrorCode::InvalidMessage, format!("message {i}: {e}")))
}

/// The text of a JSON string that holds no escape, without parsing it again: `raw` is a value
/// the parser has already checked, so a string without a backslash is its bytes between the
/// quotes (control characters are refused by the parser). Anything else: `None`.
fn plain_string(raw: &str) -> Option<&str> {
    let inner = raw.trim().strip_prefix('"')?.strip_suffix('"')?;
    (!inner.as_bytes().contains(&b'\\')).then_some(inner)
}

fn message(i: usize, m: BatchMessage<'_>, body: &Bytes) -> Result<ProduceMessage, ApiError> {
    let bad = |code: ErrorCode, m: String| ApiError::new(code, format!("message {i}: {m}"));
    let encoding = m.payload_encoding.as_deref().unwrap_or("json");
    let as_string = || -> Result<Cow<'_, str>, ApiError> {
        if let Some(s) = plain_string(m.payload.get()) {
            return Ok(Cow::Borrowed(s));
        }
        serde_json::from_str::<Cow<'_, str>>(m.payload.get()).map_err(|_| {
            bad(
                ErrorCode::InvalidMessage,
                format!("payload must be a JSON string with payload_encoding {encoding}"),
            )
        })
    };
    let payload = match encoding {
        "json" => share(body, m.payload.get().trim()),
        "utf8" => match as_string()? {
            Cow::Borrowed(s) => share(body, s),
            Cow::Owned(s) => Bytes::from(s),
        },
        "base64" => Bytes::from(STANDARD.decode(as_string()?.as_bytes()).map_err(|e| {
            bad(
                ErrorCode::InvalidMessage,
                format!("payload is not valid base64: {e}"),
            )
        })?),
        other => {
            return Err(bad(
                ErrorCode::InvalidMessage,
                format!("payload_encoding must be json, utf8 or base64, got '{other}'"),
            ));
        }
    };
    if payload.is_empty() {
        return Err(bad(ErrorCode::EmptyMessage, "payload is empty".into()));
    }
    if let Some(k) = &m.key {
        check_key(k, Some(i))?;
    }
    let headers: Vec<(String, Bytes)> = m
        .headers
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, Bytes::from(v)))
        .collect();
    if !headers.is_empty() {
        check_headers(&headers, &format!("message {i}: "))?;
    }
    Ok(ProduceMessage {
        key: m.key.filter(|k| !k.is_empty()).map(|k| match k {
            Cow::Borrowed(k) => share(body, k),
            Cow::Owned(k) => Bytes::from(k),
        }),
        partition: m.partition,
        delay_ms: delay(m.delay_ms),
        headers,
        payload,
    })
}

pub async fn batch(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Extension(held): Extension<super::budget::Held>,
    Path(topic): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    caller.require(narad_auth::Action::Produce, &topic)?;
    Query::parse(uri.query(), &[])?;
    let broker = state.broker()?.clone();
    let limit = state.cfg.max_batch_bytes;
    // (a coding it cannot decode is refused once the body is read, as a body too large is:
    // answered before it, most clients would see a broken pipe instead of the 415)
    let coding = batch_coding(&headers);
    let body = read_body(body, limit).await?;
    let coding = coding?;
    // a compressed body's inflated copy is request memory too: as much as one zstd frame
    // says it holds (and may then hold no more), else the whole limit; and a zstd decoder's
    // window
    let inflated = coding.map(|c| (c, inflating_cost(c, &body, limit)));
    if let Some((_, (_, cost))) = inflated {
        state.body_budget.reserve(&held, cost)?;
    }
    let body = match inflated {
        None => body,
        // Inflating runs on the blocking pool: 16 KiB of gzip can ask for 16 MiB of work, and
        // on a runtime worker that stalled every other request it would have served (a
        // black-box review saw `/healthz` go from 1 to 45 ms behind four such clients). The
        // task holds the request's budget until it ends, so clients that hang up at once
        // cannot pile up inflations beyond what the budget allows.
        Some((coding, (cap, _))) => {
            let window_log = zstd_window_log(limit);
            tokio::task::spawn_blocking(move || {
                let _held = held;
                decompress(coding, body, cap, window_log)
            })
            .await
            .map_err(|e| ApiError::new(ErrorCode::InternalError, e.to_string()))??
        }
    };
    let max = state.cfg.max_batch_messages;
    let check_count = |n: usize| {
        if n == 0 || n > max {
            return Err(ApiError::new(
                ErrorCode::InvalidBatch,
                format!("messages must hold 1 to {max} messages, got {n}"),
            ));
        }
        Ok(())
    };
    let parsed: Vec<BatchMessage> = match serde_json::from_slice::<BatchFast>(&body) {
        Ok(b) => {
            check_count(b.messages.len())?;
            b.messages
        }
        Err(_) => {
            let batch: Batch = parse_json_borrowed(&body)?;
            check_count(batch.messages.len())?;
            batch
                .messages
                .iter()
                .enumerate()
                .map(|(i, raw)| parse_message(i, raw))
                .collect::<Result<_, _>>()?
        }
    };
    let msgs = parsed
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m, &body))
        .collect::<Result<Vec<_>, _>>()?;
    check_origins(&caller, &broker, &topic, &msgs)?;
    // which incarnation takes them: a remote child mirroring here names the one it was
    // attached to, and nothing is written to another (deleted and created again)
    // (one look at the topic for its incarnation and its role)
    let (topic_id, role) = broker
        .with_topic_meta(&topic, |m| (m.id, m.role))
        .ok()
        .unzip();
    if let Some(want) = headers.get("narad-topic-id") {
        let want = want
            .to_str()
            .ok()
            .filter(|v| v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    "Narad-Topic-Id must be a topic incarnation id (16 hex digits)",
                )
            })?;
        if let Some(id) = topic_id
            && id != want
        {
            return Err(ApiError::new(
                ErrorCode::TopicReplaced,
                format!(
                    "topic '{topic}' is incarnation {id:016x}, not {want:016x}: it was deleted and created again; nothing was written"
                ),
            ));
        }
    }
    // (after the incarnation: a target deleted and created again says so, whatever its role)
    let link = link_of(&headers)?;
    let late = match check_intake(&caller, role, &topic, link) {
        Ok(intake) => intake == Some(narad_core::catalog::role::LinkIntake::Late),
        Err(Refused::Plain(e)) => return Err(e),
        Err(Refused::Fenced(e, role)) => {
            return Ok(e.response_with(FencedBody {
                role: role_json(&role),
            }));
        }
    };
    check_schema(&state, &broker, &topic, &msgs).await?;
    let with_id = |mut resp: axum::response::Response| {
        if let Some(id) = topic_id
            && let Ok(v) = axum::http::HeaderValue::from_str(&format!("{id:016x}"))
        {
            resp.headers_mut().insert("narad-topic-id", v);
        }
        resp
    };
    let results = match state.plane()?.produce(&topic, msgs).await? {
        Written::All(results) => results,
        Written::Each(outcomes) => {
            // a cluster member: each owner's messages all-or-none; one outcome per message
            if late {
                count_late(
                    &broker,
                    &topic,
                    outcomes.iter().filter(|o| o.is_ok()).count(),
                );
            }
            let (status, text) = crate::forward::batch_reply(&outcomes);
            return Ok(with_id(json_text_response(status, text)));
        }
    };
    if late {
        count_late(&broker, &topic, results.len());
    }
    // written by hand: one allocation instead of a JSON map per message, and integers
    // without the formatting machinery (which cost 4% of a batch produce's CPU)
    use super::render::write_int;
    let mut out = String::with_capacity(32 + results.len() * 40);
    out.push_str("{\"accepted\":");
    write_int(&mut out, results.len());
    out.push_str(",\"results\":[");
    for (i, r) in results.iter().enumerate() {
        out.push_str(if i == 0 {
            "{\"partition\":"
        } else {
            ",{\"partition\":"
        });
        write_int(&mut out, r.partition);
        out.push_str(",\"offset\":");
        write_int(&mut out, r.offset);
        out.push('}');
    }
    out.push_str("]}");
    Ok(with_id(json_text_response(StatusCode::ACCEPTED, out)))
}

/// The header a remote child's batches carry: `<cluster>/<topic>/<epoch>` (ids in 16 hex
/// digits) names the link's source and its epoch, `/tail` after it says the source is
/// demoted and ships what it had not shipped yet.
pub const LINK_HEADER: &str = "narad-link";

/// A link header's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub source: narad_core::catalog::role::Source,
    pub epoch: u64,
    pub tail: bool,
}

/// Parses a [`LINK_HEADER`] value, in the one form the sender writes.
pub(super) fn parse_link(v: &[u8]) -> Result<Link, ApiError> {
    let bad = || {
        ApiError::new(
            ErrorCode::InvalidHeaders,
            format!(
                "{LINK_HEADER} must be <cluster>/<topic>/<epoch>[/tail] (ids in 16 hex digits)"
            ),
        )
    };
    let v = std::str::from_utf8(v).map_err(|_| bad())?;
    let hex16 = |s: &str| {
        (s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    let mut parts = v.split('/');
    let (c, t, e) = (parts.next(), parts.next(), parts.next());
    let tail = match parts.next() {
        None => false,
        Some("tail") => true,
        Some(_) => return Err(bad()),
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    let epoch = e
        .filter(|e| !e.is_empty() && e.len() <= 20 && e.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|e| e.parse::<u64>().ok())
        .filter(|e| *e <= narad_core::catalog::role::MAX_EPOCH)
        .ok_or_else(bad)?;
    Ok(Link {
        source: narad_core::catalog::role::Source {
            cluster: c.and_then(hex16).ok_or_else(bad)?,
            topic: t.and_then(hex16).ok_or_else(bad)?,
        },
        epoch,
        tail,
    })
}

/// The request's [`LINK_HEADER`], if it has one (once: two could name two links).
pub(super) fn link_of(headers: &HeaderMap) -> Result<Option<Link>, ApiError> {
    let mut all = headers.get_all(LINK_HEADER).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(ApiError::new(
            ErrorCode::InvalidHeaders,
            format!("{LINK_HEADER} is given more than once"),
        ));
    }
    parse_link(v.as_bytes()).map(Some)
}

/// Why [`check_intake`] refused a produce.
pub(super) enum Refused {
    Plain(ApiError),
    /// `409 fenced`, answered with the topic's role.
    Fenced(ApiError, narad_core::catalog::TopicRole),
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> Self {
        match r {
            Refused::Plain(e) | Refused::Fenced(e, _) => e,
        }
    }
}

#[derive(serde::Serialize)]
pub(super) struct FencedBody {
    pub(super) role: super::topics::RoleJson,
}

use super::topics::role_json;

/// Whether topic `topic`'s role lets this produce in: a primary takes clients' produces, a
/// mirror only its link's batches at its epoch (`link`), a promoted primary its old
/// source's tail; the rest is refused (`409 mirror_read_only`, `fenced`,
/// `not_your_mirror`). A link's batches need the `replicate` grant.
pub(super) fn check_intake(
    caller: &Caller,
    role: Option<narad_core::catalog::TopicRole>,
    topic: &str,
    link: Option<Link>,
) -> Result<Option<narad_core::catalog::role::LinkIntake>, Refused> {
    use narad_core::catalog::role::{RoleRefusal, decide_link};
    let Some(role) = role else {
        // (a topic that does not exist: the produce says so)
        return Ok(None);
    };
    let Some(link) = link else {
        if role.is_primary() {
            return Ok(None);
        }
        return Err(Refused::Plain(ApiError::new(
            ErrorCode::MirrorReadOnly,
            format!(
                "topic '{topic}' is {}: it takes records only from its link; promote it (narad topic promote) to take produces here",
                role.describe()
            ),
        )));
    };
    if !caller.allows(narad_auth::Action::Replicate, topic) {
        return Err(Refused::Plain(super::access::forbidden(format!(
            "only a user granted replicate on '{topic}' may send the {LINK_HEADER} header (a remote child's batches)"
        ))));
    }
    match decide_link(role, link.source, link.epoch, link.tail) {
        Ok(intake) => Ok(Some(intake)),
        Err(RoleRefusal::Fenced { role }) => Err(Refused::Fenced(
            ApiError::new(
                ErrorCode::Fenced,
                format!(
                    "topic '{topic}' is {}, newer than the link's epoch {}: a mirror of the sender was promoted; the sender is fenced",
                    role.describe(),
                    link.epoch
                ),
            ),
            role,
        )),
        Err(RoleRefusal::MirrorOfOther { of }) => Err(Refused::Plain(ApiError::new(
            ErrorCode::NotYourMirror,
            format!(
                "topic '{topic}' mirrors topic {:016x} of cluster {:016x}, not this link's source",
                of.topic, of.cluster
            ),
        ))),
        Err(RoleRefusal::NotAMirror { role }) => Err(Refused::Plain(ApiError::new(
            ErrorCode::NotYourMirror,
            format!(
                "topic '{topic}' is {}, not a mirror of this link at epoch {}: the link's checks (resume) make it one",
                role.describe(),
                link.epoch
            ),
        ))),
    }
}

/// What every produce passes that is not about its form, for a produce that did not come
/// through the native routes (the SQS endpoint): the topic's role takes a client's produces
/// (a mirror does not), and every payload satisfies the topic's JSON Schema.
pub(super) async fn admit(
    state: &SharedState,
    caller: &Caller,
    topic: &str,
    msgs: &[ProduceMessage],
) -> Result<(), ApiError> {
    let broker = state.broker()?.clone();
    check_intake(
        caller,
        broker.with_topic_meta(topic, |m| m.role).ok(),
        topic,
        None,
    )?;
    check_schema(state, &broker, topic, msgs).await
}

fn count_late(broker: &narad_core::broker::Broker, topic: &str, n: usize) {
    broker
        .metrics()
        .mirror_late
        .get_or_create(&narad_core::metrics::TopicLabel {
            topic: topic.to_owned(),
        })
        .inc_by(n as u64);
}

/// Records carrying an origin (`narad-origin`: another cluster's remote child mirrors them
/// here) need the `replicate` grant, name their origin in the one form the sender writes,
/// and never name this cluster (a loop). So do the earlier hops of a record forwarded again
/// (`narad-via`), which only come with an origin and number at most `MAX_HOPS - 1`.
fn check_origins(
    caller: &Caller,
    broker: &narad_core::broker::Broker,
    topic: &str,
    msgs: &[ProduceMessage],
) -> Result<(), ApiError> {
    use narad_core::broker::{MAX_HOPS, ORIGIN_HEADER, VIA_HEADER};
    let mut own = None;
    for (i, m) in msgs.iter().enumerate() {
        // every one, in any case: header names are kept as sent (a later hop must not miss
        // one), and a name given twice keeps its last value
        let mut origins = 0usize;
        let mut vias = 0usize;
        for (h, v) in m.headers.iter() {
            let via = h.eq_ignore_ascii_case(VIA_HEADER);
            if !via && !h.eq_ignore_ascii_case(ORIGIN_HEADER) {
                continue;
            }
            if !caller.allows(narad_auth::Action::Replicate, topic) {
                return Err(super::access::forbidden(format!(
                    "message {i}: only a user granted replicate on '{topic}' may send the {h} header (it says which cluster a record came from)"
                )));
            }
            let clusters: Vec<u64> = if via {
                vias += 1;
                let hops: Vec<&[u8]> = v.split(|&b| b == b',').collect();
                let parsed: Option<Vec<u64>> = (hops.len() < MAX_HOPS)
                    .then(|| {
                        hops.iter()
                            .map(|hop| std::str::from_utf8(hop).ok().and_then(parse_origin))
                            .collect()
                    })
                    .flatten();
                parsed.ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::InvalidHeaders,
                        format!(
                            "message {i}: {VIA_HEADER} must be at most {} origins <cluster>/<topic>/<partition>/<offset> (ids in 16 hex digits), comma separated",
                            MAX_HOPS - 1
                        ),
                    )
                })?
            } else {
                origins += 1;
                let cluster = std::str::from_utf8(v)
                    .ok()
                    .and_then(parse_origin)
                    .ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::InvalidHeaders,
                            format!(
                                "message {i}: {ORIGIN_HEADER} must be <cluster>/<topic>/<partition>/<offset> (ids in 16 hex digits)"
                            ),
                        )
                    })?;
                vec![cluster]
            };
            let own = *own.get_or_insert_with(|| broker.cluster_id());
            if let Some(cluster) = clusters.into_iter().find(|c| Some(*c) == own) {
                return Err(ApiError::new(
                    ErrorCode::LoopDetected,
                    format!(
                        "message {i}: {h} names this cluster ({cluster:016x}): a remote child here mirrors to a topic that mirrors back"
                    ),
                ));
            }
        }
        if vias > 0 && origins == 0 {
            return Err(ApiError::new(
                ErrorCode::InvalidHeaders,
                format!("message {i}: {VIA_HEADER} comes only with {ORIGIN_HEADER}"),
            ));
        }
    }
    Ok(())
}

/// The cluster id of an origin value `<cluster>/<topic>/<partition>/<offset>`, in the one
/// form the sender writes: ids in 16 lowercase hex digits, numbers in plain decimal.
fn parse_origin(v: &str) -> Option<u64> {
    let hex16 = |s: &str| {
        (s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u64::from_str_radix(s, 16).ok())
            .flatten()
    };
    let decimal = |s: &str| {
        (!s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0')))
        .then(|| s.parse::<u64>().ok())
        .flatten()
    };
    let mut parts = v.split('/');
    let (c, t, p, o) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    hex16(t)?;
    u32::try_from(decimal(p)?).ok()?;
    decimal(o)?;
    hex16(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload of message 0 of a batch body, as the batch route reads it.
    fn utf8_payload(body: &'static str) -> Result<Bytes, ApiError> {
        let body = Bytes::from_static(body.as_bytes());
        let parsed: BatchFast = serde_json::from_slice(&body)
            .map_err(|e| ApiError::new(ErrorCode::InvalidJson, e.to_string()))?;
        let m = parsed.messages.into_iter().next().expect("one message");
        message(0, m, &body).map(|m| m.payload)
    }

    /// A zstd decoder's window is bounded by the batch limit and counted with the inflated
    /// copy: a frame that declares its content counts that much twice, one that does not
    /// counts the limit twice.
    #[test]
    fn inflating_counts_the_zstd_window() {
        let mib = 1 << 20;
        assert_eq!(zstd_window_log(16 * mib), 24);
        assert_eq!(zstd_window_log(16 * mib + 1), 25);
        assert_eq!(zstd_window_log(1), 10);
        let body = vec![b'x'; 100_000];
        let declared = zstd::encode_all(&body[..], 3).unwrap();
        assert_eq!(
            inflating_cost(Coding::Zstd, &declared, 16 * mib),
            (100_000, 200_000 + ZSTD_DECODER_EXTRA)
        );
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_contentsize(false).unwrap();
        std::io::Write::write_all(&mut enc, &body).unwrap();
        let undeclared = enc.finish().unwrap();
        assert_eq!(
            inflating_cost(Coding::Zstd, &undeclared, 16 * mib),
            (16 * mib, 32 * mib + ZSTD_DECODER_EXTRA)
        );
        assert_eq!(inflating_cost(Coding::Gzip, &undeclared, mib), (mib, mib));
        // a window past the bound is refused, one at it inflates
        for (window_log, ok) in [(24, true), (27, false)] {
            let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            enc.window_log(window_log).unwrap();
            enc.include_contentsize(false).unwrap();
            std::io::Write::write_all(&mut enc, &body).unwrap();
            let stream = Bytes::from(enc.finish().unwrap());
            let got = decompress(Coding::Zstd, stream, 16 * mib, zstd_window_log(16 * mib));
            match (got, ok) {
                (Ok(b), true) => assert_eq!(b.len(), body.len()),
                (Err(e), false) => {
                    assert_eq!(e.code, ErrorCode::InvalidEncoding);
                    assert!(
                        e.message.contains("window of at most 16777216"),
                        "{}",
                        e.message
                    );
                }
                (got, _) => panic!("window 2^{window_log}: {:?}", got.map(|b| b.len())),
            }
        }
    }

    #[test]
    fn a_utf8_payload_without_escapes_is_its_text_and_one_with_them_is_unescaped() {
        let plain = r#"{"messages":[{"payload":"h\u00e9llo wörld","payload_encoding":"utf8"}]}"#;
        assert_eq!(utf8_payload(plain).unwrap(), "h\u{e9}llo wörld");
        let raw = r#"{"messages":[{"payload":"héllo wörld","payload_encoding":"utf8"}]}"#;
        assert_eq!(utf8_payload(raw).unwrap(), "héllo wörld");
        let escaped = r#"{"messages":[{"payload_encoding":"utf8","payload":"a\"b\\c\nd"}]}"#;
        assert_eq!(utf8_payload(escaped).unwrap(), "a\"b\\c\nd");
        let empty = r#"{"messages":[{"payload":"","payload_encoding":"utf8"}]}"#;
        assert!(utf8_payload(empty).is_err());
        // a raw control character is not JSON: the parser refuses it before the fast path
        let control = "{\"messages\":[{\"payload\":\"a\u{1}b\",\"payload_encoding\":\"utf8\"}]}";
        assert!(utf8_payload(control).is_err());
        let not_string = r#"{"messages":[{"payload":{"a":1},"payload_encoding":"utf8"}]}"#;
        assert!(utf8_payload(not_string).is_err());
        // base64 text takes the same path: plain, or unescaped first
        let b64 = r#"{"messages":[{"payload":"aGk=","payload_encoding":"base64"}]}"#;
        assert_eq!(utf8_payload(b64).unwrap(), "hi");
        let b64 = r#"{"messages":[{"payload":"aGk\u003d","payload_encoding":"base64"}]}"#;
        assert_eq!(utf8_payload(b64).unwrap(), "hi");
        assert_eq!(plain_string(r#""abc""#), Some("abc"));
        assert_eq!(plain_string(r#""a\"c""#), None);
        assert_eq!(plain_string("12"), None);
    }
}
