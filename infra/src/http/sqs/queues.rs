//! Queue operations: a queue is a topic of the same name.

use std::collections::BTreeMap;

use axum::response::Response;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use narad_auth::Action;
use narad_core::catalog::TopicMeta;
use narad_core::topic::{CreateTopic, MIN_VISIBILITY_MS, TopicPatch};
use narad_sqs::limits::{DEFAULT_RETENTION_S, MAX_LIST_RESULTS};
use narad_sqs::ops::{self, required};
use narad_sqs::queue::{QueueSettings, check_new_name, no_such_queue, parse_settings};
use narad_sqs::{Kind, SqsError};
use serde_json::json;

use super::{Ctx, ok};

/// The topic settings of SQS queue attributes. A visibility timeout of 0 is the broker's
/// shortest, 100 ms (shown as 0 seconds).
fn patch_of(s: &QueueSettings) -> TopicPatch {
    TopicPatch {
        visibility_timeout_ms: s
            .visibility_timeout_s
            .map(|v| (v * 1000).max(MIN_VISIBILITY_MS)),
        delay_ms: s.delay_s.map(|v| v * 1000),
        retention_ms: s.retention_s.map(|v| v * 1000),
        max_message_bytes: s.max_message_bytes.map(|v| v as u64),
        ..TopicPatch::default()
    }
}

/// `ReceiveMessageWaitTimeSeconds` is not kept yet: only its default, 0, is taken.
fn check_unkept(s: &QueueSettings) -> Result<(), SqsError> {
    if s.receive_wait_s.is_some_and(|w| w != 0) {
        return Err(SqsError::new(
            Kind::InvalidAttributeValue,
            "ReceiveMessageWaitTimeSeconds other than 0 is not supported yet: pass WaitTimeSeconds to ReceiveMessage",
        ));
    }
    Ok(())
}

/// The value each given attribute has on `meta`, to compare with what was asked.
fn differs(meta: &TopicMeta, s: &QueueSettings) -> Option<&'static str> {
    let c = &meta.config;
    let visibility_s = c.visibility_timeout_ms / 1000;
    if s.visibility_timeout_s.is_some_and(|v| v != visibility_s) {
        return Some("VisibilityTimeout");
    }
    if s.delay_s.is_some_and(|v| v * 1000 != c.delay_ms) {
        return Some("DelaySeconds");
    }
    if s.retention_s.is_some_and(|v| v * 1000 != c.retention_ms) {
        return Some("MessageRetentionPeriod");
    }
    if s.max_message_bytes
        .is_some_and(|v| v as u64 != c.max_message_bytes)
    {
        return Some("MaximumMessageSize");
    }
    None
}

pub(super) async fn create(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::CreateQueue = ops::parse(body)?;
    let name = required(r.queue_name, "QueueName")?;
    check_new_name(&name)?;
    let settings = parse_settings(&r.attributes)?;
    check_unkept(&settings)?;
    if !r.tags.is_empty() {
        return Err(SqsError::new(
            Kind::InvalidParameterValue,
            "queue tags are not supported by this endpoint yet",
        ));
    }
    ctx.caller.require(Action::Create, &name)?;
    let broker = ctx.state.broker()?;
    let mut patch = patch_of(&settings);
    // SQS's retention by default (4 days), not the broker's (7)
    patch.retention_ms.get_or_insert(DEFAULT_RETENTION_S * 1000);
    let req = CreateTopic {
        name: name.clone(),
        settings: patch,
        owner: ctx.caller.owner(),
        schema: None,
        count_against_owner: !ctx.caller.is_admin(),
    };
    match broker.create_topic(req).await {
        Ok(_) => {}
        Err(narad_core::broker::BrokerError::TopicExists(_)) => {
            // the same attributes: the existing queue (CreateQueue is idempotent)
            let meta = broker
                .topic_meta(&name)
                .map_err(super::super::ApiError::from)?;
            if !ctx.caller.may_see(&meta) {
                return Err(SqsError::new(
                    Kind::QueueNameExists,
                    format!("A queue named {name} already exists."),
                ));
            }
            if let Some(attr) = differs(&meta, &settings) {
                return Err(SqsError::new(
                    Kind::QueueNameExists,
                    format!(
                        "A queue already exists with the same name and a different value for attribute {attr}"
                    ),
                ));
            }
        }
        Err(e) => return Err(super::super::ApiError::from(e).into()),
    }
    Ok(ok(&json!({"QueueUrl": ctx.url(&name)})))
}

pub(super) fn get_url(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::GetQueueUrl = ops::parse(body)?;
    let name = required(r.queue_name, "QueueName")?;
    if r.queue_owner_aws_account_id
        .is_some_and(|a| a != ctx.endpoint.account)
    {
        return Err(no_such_queue());
    }
    ctx.caller.see_topic(ctx.state.broker()?, &name)?;
    Ok(ok(&json!({"QueueUrl": ctx.url(&name)})))
}

pub(super) fn list(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::ListQueues = ops::parse(body)?;
    let max = match r.max_results {
        None => None,
        Some(n) if (1..=MAX_LIST_RESULTS).contains(&n) => Some(n as usize),
        Some(n) => {
            return Err(SqsError::invalid_value(
                "MaxResults",
                n,
                &format!("Must be between 1 and {MAX_LIST_RESULTS}, if provided."),
            ));
        }
    };
    let prefix = r.queue_name_prefix.unwrap_or_default();
    let after = match r.next_token.filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(
            B64.decode(t.as_bytes())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    SqsError::invalid_value("NextToken", "given", "Invalid NextToken.")
                })?,
        ),
    };
    let broker = ctx.state.broker()?;
    let want = max.unwrap_or(MAX_LIST_RESULTS as usize);
    let mut urls = Vec::new();
    let mut cursor = after;
    let mut next = None;
    'pages: loop {
        let (page, more) = broker.list_topics(cursor.as_deref(), 1000);
        for t in page {
            cursor = Some(t.name.clone());
            if !t.name.starts_with(&prefix) || !ctx.caller.may_see(&t) {
                continue;
            }
            if urls.len() == want {
                // one more exists: with MaxResults, the next page starts after the last
                if max.is_some() {
                    next = urls.last().map(|(n, _): &(String, String)| B64.encode(n));
                }
                break 'pages;
            }
            urls.push((t.name.clone(), ctx.url(&t.name)));
        }
        if !more {
            break;
        }
    }
    let mut out = serde_json::Map::new();
    if !urls.is_empty() {
        out.insert(
            "QueueUrls".into(),
            urls.into_iter().map(|(_, u)| u).collect::<Vec<_>>().into(),
        );
    }
    if let Some(n) = next {
        out.insert("NextToken".into(), n.into());
    }
    Ok(ok(&serde_json::Value::Object(out)))
}

pub(super) async fn delete(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::QueueOnly = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    super::super::topics::delete_topic(ctx.state, &ctx.caller, name, false).await?;
    Ok(ok(&json!({})))
}

const ALL_ATTRIBUTES: [&str; 10] = [
    "VisibilityTimeout",
    "DelaySeconds",
    "MessageRetentionPeriod",
    "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
];
const DELAYED: &str = "ApproximateNumberOfMessagesDelayed";

pub(super) async fn get_attributes(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::GetQueueAttributes = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    let broker = ctx.state.broker()?;
    let meta = ctx.caller.see_topic(broker, name)?;
    let mut wanted: Vec<&str> = Vec::new();
    for n in &r.attribute_names {
        if n == "All" {
            wanted.extend(ALL_ATTRIBUTES);
            wanted.push(DELAYED);
        } else if let Some(&known) = ALL_ATTRIBUTES
            .iter()
            .chain(std::iter::once(&DELAYED))
            .find(|&&a| a == n)
        {
            wanted.push(known);
        } else {
            return Err(SqsError::new(
                Kind::InvalidAttributeName,
                format!(
                    "Unknown Attribute {}.",
                    n.chars().take(256).collect::<String>()
                ),
            ));
        }
    }
    wanted.sort_unstable();
    wanted.dedup();
    let counts = if wanted.iter().any(|a| a.starts_with("Approximate")) {
        Some(counts(ctx, name).await?)
    } else {
        None
    };
    let c = &meta.config;
    let mut out = BTreeMap::new();
    for a in wanted {
        let v = match a {
            "VisibilityTimeout" => (c.visibility_timeout_ms / 1000).to_string(),
            "DelaySeconds" => (c.delay_ms / 1000).to_string(),
            "MessageRetentionPeriod" => (c.retention_ms / 1000).to_string(),
            "MaximumMessageSize" => c.max_message_bytes.to_string(),
            "ReceiveMessageWaitTimeSeconds" => "0".to_owned(),
            // (no time of the last change is kept: the creation time stands for it)
            "CreatedTimestamp" | "LastModifiedTimestamp" => (meta.created_at_ms / 1000).to_string(),
            "QueueArn" => ctx.endpoint.arn(name),
            "ApproximateNumberOfMessages" => counts.map_or(0, |c| c.0).to_string(),
            "ApproximateNumberOfMessagesNotVisible" => counts.map_or(0, |c| c.1).to_string(),
            _ => counts.map_or(0, |c| c.2).to_string(),
        };
        out.insert(a, v);
    }
    if out.is_empty() {
        return Ok(ok(&json!({})));
    }
    Ok(ok(&json!({ "Attributes": out })))
}

/// (visible, in flight, delayed) over the queue's partitions; the partitions no member
/// could tell are left out.
async fn counts(ctx: &Ctx<'_>, name: &str) -> Result<(u64, u64, u64), SqsError> {
    let broker = ctx.state.broker()?;
    let info = broker
        .topic_info(name)
        .map_err(super::super::ApiError::from)?;
    let mut stats = crate::reads::local_stats(broker, &info, None);
    let (theirs, _unavailable) = ctx.state.plane()?.others_stats(&info.meta, None).await;
    stats.extend(theirs);
    let mut total = (0, 0, 0);
    for s in stats {
        let (in_flight, delayed) = (s.in_flight as u64, s.delayed as u64);
        total.0 += s.unacked.saturating_sub(in_flight + delayed);
        total.1 += in_flight;
        total.2 += delayed;
    }
    Ok(total)
}

pub(super) async fn set_attributes(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::SetQueueAttributes = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    let attrs = required(r.attributes, "Attributes")?;
    let settings = parse_settings(&attrs)?;
    check_unkept(&settings)?;
    let broker = ctx.state.broker()?;
    ctx.caller.manage_topic(broker, name)?;
    let patch = patch_of(&settings);
    if !patch.is_empty() {
        broker
            .alter_topic(name, patch)
            .await
            .map_err(super::super::ApiError::from)?;
    }
    Ok(ok(&json!({})))
}

/// PurgeQueue: every message sent so far is taken out of the queue (leased or not); the
/// topic's log keeps them for replay.
pub(super) async fn purge(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::QueueOnly = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    ctx.caller.manage_topic(ctx.state.broker()?, name)?;
    let (purged, left) = ctx.state.plane()?.purge(name).await?;
    if !left.is_empty() {
        // (part of it was applied: not a 503, which says nothing was)
        return Err(SqsError::new(
            Kind::InternalFailure,
            format!(
                "{purged} messages were purged, but not those of partitions {left:?}: they are moving between members, or their owner did not answer (it may have purged them); purge again"
            ),
        ));
    }
    tracing::info!(
        component = "audit",
        actor = ctx.caller.username().unwrap_or("-"),
        queue = name,
        purged,
        "queue purged"
    );
    Ok(ok(&json!({})))
}

pub(super) fn dead_letter_sources(ctx: &Ctx<'_>, body: &[u8]) -> Result<Response, SqsError> {
    let r: ops::QueueOnly = ops::parse(body)?;
    let name = ctx.queue(r.queue_url.as_deref())?;
    ctx.caller.see_topic(ctx.state.broker()?, name)?;
    // (no queue has a dead-letter queue yet: none names this one)
    Ok(ok(&json!({"queueUrls": []})))
}
