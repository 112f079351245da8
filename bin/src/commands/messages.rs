//! `narad pub`, `sub` (with `--peek`) and `replay`: messages in and out.

use super::*;

fn progress(len: Option<u64>, what: &str) -> Option<ProgressBar> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let pb = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    // (a rate in whole messages a second: `{per_sec}` prints four decimals)
    let template = format!("{{spinner}} {what} {{pos}}/{{len}} [{{elapsed_precise}}] {{rate}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        pb.set_style(style.with_key(
            "rate",
            |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", state.per_sec());
            },
        ));
    }
    Some(pb)
}

/// The most messages one consume or replay read answers (the API's limit).
const BATCH: u64 = narad_wire::limits::MAX_CONSUME_BATCH;

pub(super) async fn publish(c: &Client, a: PubArgs) -> Result<(), BoxError> {
    let payload = match (&a.message, &a.file) {
        (Some(m), _) => m.clone().into_bytes(),
        (None, Some(f)) => {
            std::fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?
        }
        (None, None) => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf)?;
            buf
        }
    };
    let mut q = Vec::new();
    if let Some(k) = &a.key {
        q.push(format!("key={}", enc(k)));
    }
    if let Some(p) = a.partition {
        q.push(format!("partition={p}"));
    }
    let delay_ms = a.delay.map(|d| d.unsigned_abs());
    if let Some(d) = delay_ms {
        q.push(format!("delay_ms={d}"));
    }
    // One request carries `per_request` messages: the raw body, or a JSON batch of copies.
    let (path, body, content_type, per_request) = if a.batch > 1 {
        let mut m = match std::str::from_utf8(&payload) {
            Ok(s) => wire::ProduceMessage::text(s),
            Err(_) => {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::STANDARD.encode(&payload);
                let mut m = wire::ProduceMessage::text(&b64);
                m.payload_encoding = Some(wire::Encoding::Base64);
                m
            }
        };
        m.key.clone_from(&a.key);
        m.partition = a.partition;
        m.delay_ms = delay_ms;
        let body = serde_json::to_vec(&wire::ProduceBatch {
            messages: vec![m; a.batch as usize],
        })?;
        let path = format!("/v1/topics/{}/produce/batch", enc(&a.topic));
        (path, body, "application/json", a.batch)
    } else {
        let path = format!("/v1/topics/{}/produce?{}", enc(&a.topic), q.join("&"));
        (path, payload, "application/octet-stream", 1)
    };
    if a.count == 1 && per_request == 1 {
        if let Reply::Json(j) = c.post_body(&path, body, content_type).await? {
            j.print_line()?;
        }
        return Ok(());
    }
    let requests = a.count.div_ceil(per_request);
    let pb = progress(Some(requests * per_request), "published");
    let started = std::time::Instant::now();
    let mut sent = 0u64;
    if a.rate > 0.0 {
        // the client's --rate is real time against a real server: a request starts at each
        // tick, up to --concurrency of them in flight (one at a time fell short of the rate
        // by the round trip); when all are in flight the rate falls short, and says so below
        #[allow(clippy::disallowed_methods)]
        let mut tick = tokio::time::interval(Duration::from_secs_f64(per_request as f64 / a.rate));
        let mut tasks = tokio::task::JoinSet::new();
        let done = |r: Result<Result<Reply, BoxError>, tokio::task::JoinError>,
                    sent: &mut u64|
         -> Result<(), BoxError> {
            r??;
            *sent += per_request;
            if let Some(pb) = &pb {
                pb.inc(per_request);
            }
            Ok(())
        };
        for _ in 0..requests {
            tick.tick().await;
            while let Some(r) = tasks.try_join_next() {
                done(r, &mut sent)?;
            }
            while tasks.len() >= a.concurrency.max(1) {
                if let Some(r) = tasks.join_next().await {
                    done(r, &mut sent)?;
                }
            }
            let (c, path, body) = (c.clone(), path.clone(), body.clone());
            tasks.spawn(async move { c.post_body(&path, body, content_type).await });
        }
        while let Some(r) = tasks.join_next().await {
            done(r, &mut sent)?;
        }
    } else {
        let mut tasks = tokio::task::JoinSet::new();
        let mut launched = 0u64;
        while sent < requests * per_request {
            while launched < requests && tasks.len() < a.concurrency.max(1) {
                let (c, path, body) = (c.clone(), path.clone(), body.clone());
                tasks.spawn(async move { c.post_body(&path, body, content_type).await });
                launched += 1;
            }
            if let Some(r) = tasks.join_next().await {
                r??;
                sent += per_request;
                if let Some(pb) = &pb {
                    pb.inc(per_request);
                }
            }
        }
    }
    if let Some(pb) = pb {
        pb.finish();
    }
    let secs = started.elapsed().as_secs_f64();
    let reached = sent as f64 / secs.max(1e-9);
    eprintln!("published {sent} messages in {secs:.2}s ({reached:.0} msg/s)");
    // (a rate asked for and not reached is said, not left to be noticed)
    if a.rate > 0.0 && sent > per_request && reached < 0.95 * a.rate {
        eprintln!(
            "narad: --rate {} was not reached ({reached:.0} msg/s): {} requests in flight were not enough for this broker's round trip; raise --concurrency or --batch",
            a.rate,
            a.concurrency.max(1)
        );
    }
    Ok(())
}

/// The messages of a batch reply, each as the server wrote it (printed as a line) and typed
/// (for the fields the CLI reads).
fn messages(j: &Json) -> Result<Vec<(Value, wire::Message)>, BoxError> {
    let page: wire::Messages<Box<RawValue>> = j.parse()?;
    page.messages
        .iter()
        .map(|raw| {
            let typed = serde_json::from_str(raw.get())
                .map_err(|e| format!("unexpected message from the broker: {e}"))?;
            Ok((serde_json::from_str(raw.get())?, typed))
        })
        .collect()
}

pub(super) async fn subscribe(c: &Client, a: SubArgs) -> Result<(), BoxError> {
    if a.peek {
        return peek(c, a).await;
    }
    let mut got = 0u64;
    let mut idle_since = std::time::Instant::now();
    let topic = enc(&a.topic);
    let part = a
        .partition
        .map(|p| format!("&partition={p}"))
        .unwrap_or_default();
    let mut out = std::io::stdout().lock();
    loop {
        if a.max.is_some_and(|m| got >= m) {
            break;
        }
        let want = a.max.map_or(BATCH, |m| (m - got).min(BATCH));
        let reply = c
            .get(&format!(
                "/v1/topics/{topic}/consume?wait=5s&max={want}{part}"
            ))
            .await?;
        let msgs = match reply {
            Reply::Json(j) => messages(&j)?,
            Reply::Empty => {
                if a.idle_exit
                    .is_some_and(|s| idle_since.elapsed() >= Duration::from_secs(s))
                {
                    break;
                }
                continue;
            }
        };
        idle_since = std::time::Instant::now();
        let mut handles = Vec::new();
        for (line, m) in msgs.iter() {
            writeln!(out, "{line}")?;
            if let Some(h) = &m.receipt_handle {
                handles.push(h.clone());
            }
        }
        out.flush()?;
        got += msgs.len() as u64;
        if !a.no_ack && !handles.is_empty() {
            ack_with_retry(c, &topic, handles).await?;
        }
    }
    Ok(())
}

/// Acks a batch, retrying a few times the handles that answered 503 (not applied) or 504
/// `outcome_unknown` (the member holding the lease did not answer: maybe applied). A `410`
/// after an unknown outcome most likely means the first try was applied, and is not
/// reported as a lost lease.
async fn ack_with_retry(c: &Client, topic: &str, mut handles: Vec<String>) -> Result<(), BoxError> {
    let mut unknown: std::collections::HashSet<String> = std::collections::HashSet::new();
    for attempt in 0..5u64 {
        let body = wire::AckBatch {
            receipt_handles: handles.clone(),
            extend: None,
        };
        let reply = c
            .post_json(&format!("/v1/topics/{topic}/ack"), &body)
            .await?;
        let Reply::Json(j) = reply else { return Ok(()) };
        let results = j.parse::<wire::AckResults>()?.results;
        let retry: Vec<String> = handles
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.status == 503 || r.status == 504)
            .map(|(h, _)| h.clone())
            .collect();
        for (h, r) in handles.iter().zip(&results) {
            if r.status == 504 {
                unknown.insert(h.clone());
            } else if r.status == 410 && !unknown.contains(h) {
                eprintln!(
                    "ack of {h}: lease gone ({})",
                    r.error.as_deref().unwrap_or("")
                );
            }
        }
        if retry.is_empty() {
            return Ok(());
        }
        handles = retry;
        // a client's back-off before retrying a server, in real time
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(Duration::from_millis(200 * (attempt + 1))).await;
    }
    let maybe = handles.iter().filter(|h| unknown.contains(*h)).count();
    Err(format!(
        "{} acks were not confirmed after retries ({maybe} of them may have been applied); those that were not will be redelivered",
        handles.len()
    )
    .into())
}

async fn partitions_of(c: &Client, topic: &str) -> Result<Vec<(u32, u64, u64)>, BoxError> {
    let Reply::Json(j) = c.get(&format!("/v1/topics/{topic}")).await? else {
        return Err("empty topic description".into());
    };
    let t: wire::TopicDetails = j.parse()?;
    Ok(t.partition_stats
        .iter()
        .map(|p| (p.partition, p.oldest_offset, p.next_offset))
        .collect())
}

async fn peek(c: &Client, a: SubArgs) -> Result<(), BoxError> {
    let topic = enc(&a.topic);
    let parts = partitions_of(c, &topic).await?;
    let mut cursors: Vec<(u32, u64)> = parts
        .iter()
        .filter(|(p, _, _)| a.partition.is_none_or(|only| only == *p))
        .map(|&(p, oldest, next)| (p, a.from.map_or(next, |f| f.max(oldest))))
        .collect();
    let mut got = 0u64;
    let mut idle_since = std::time::Instant::now();
    let mut out = std::io::stdout().lock();
    loop {
        let mut any = false;
        for (p, next) in cursors.iter_mut() {
            if a.max.is_some_and(|m| got >= m) {
                return Ok(());
            }
            // (no more than `--max` still wants)
            let want = a.max.map_or(BATCH, |m| (m - got).min(BATCH));
            let reply = c
                .get(&format!(
                    "/v1/topics/{topic}/consume?partition={p}&offset={next}&max={want}"
                ))
                .await;
            let msgs = match reply {
                Ok(Reply::Json(j)) => messages(&j)?,
                Ok(Reply::Empty) => continue,
                Err(e) => match e.downcast_ref::<ApiFailure>() {
                    Some(f) if f.known_code() == Some(wire::ErrorCode::OffsetTruncated) => {
                        // Retention overtook the cursor: skip to what is left.
                        let parts = partitions_of(c, &topic).await?;
                        if let Some(&(_, oldest, _)) = parts.iter().find(|(q, _, _)| q == p) {
                            *next = oldest;
                        }
                        continue;
                    }
                    _ => return Err(e),
                },
            };
            for (line, m) in &msgs {
                if a.max.is_some_and(|m| got >= m) {
                    break;
                }
                writeln!(out, "{line}")?;
                *next = m.offset + 1;
                got += 1;
                any = true;
            }
        }
        out.flush()?;
        if a.max.is_some_and(|m| got >= m) {
            return Ok(());
        }
        if any {
            idle_since = std::time::Instant::now();
        } else {
            if a.idle_exit
                .is_some_and(|s| idle_since.elapsed() >= Duration::from_secs(s))
            {
                return Ok(());
            }
            // Replay reads do not long-poll: poll gently (in real time, as a client) while
            // the topic is quiet.
            #[allow(clippy::disallowed_methods)]
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

pub(super) async fn replay(c: &Client, a: ReplayArgs) -> Result<(), BoxError> {
    let topic = enc(&a.topic);
    let to = match a.to {
        Some(t) => t,
        None => partitions_of(c, &topic)
            .await?
            .iter()
            .find(|(p, _, _)| *p == a.partition)
            .map(|&(_, _, next)| next)
            .ok_or_else(|| format!("partition {} does not exist", a.partition))?,
    };
    let to_time = match &a.to_time {
        None => i64::MAX,
        Some(t) => narad_infra::http::query::parse_time_ms(t)
            .ok_or_else(|| format!("--to-time '{t}': expected RFC 3339 or unix milliseconds"))?,
    };
    let from = match &a.from_time {
        None => a.from,
        Some(t) => {
            if narad_infra::http::query::parse_time_ms(t).is_none() {
                return Err(
                    format!("--from-time '{t}': expected RFC 3339 or unix milliseconds").into(),
                );
            }
            let reply = c
                .get(&format!(
                    "/v1/topics/{topic}/consume?partition={}&from_time={}",
                    a.partition,
                    enc(t)
                ))
                .await?;
            match reply {
                Reply::Json(j) => j.parse::<wire::Message>()?.offset,
                Reply::Empty => to, // nothing at or after that time
            }
        }
    };
    let pb = progress(Some(to.saturating_sub(from)), "replayed");
    let mut next = from;
    let mut out = std::io::stdout().lock();
    while next < to {
        let max = (to - next).min(BATCH);
        let reply = c
            .get(&format!(
                "/v1/topics/{topic}/consume?partition={}&offset={next}&max={max}",
                a.partition
            ))
            .await?;
        let Reply::Json(j) = reply else { break };
        let msgs = messages(&j)?;
        if msgs.is_empty() {
            break;
        }
        for (line, m) in &msgs {
            if m.offset >= to || m.timestamp_ms > to_time {
                next = to;
                break;
            }
            writeln!(out, "{line}")?;
            next = m.offset + 1;
            if let Some(pb) = &pb {
                pb.inc(1);
            }
        }
    }
    out.flush()?;
    if let Some(pb) = pb {
        pb.finish();
    }
    Ok(())
}
