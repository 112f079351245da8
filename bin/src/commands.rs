//! What each subcommand does.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use narad_infra::config::{LogFormat, ServerConfig};
use serde_json::{Value, json};

use crate::client::{BoxError, Client, Connect, Reply, enc};
use crate::{
    Cli, Command, PubArgs, ReplayArgs, ServeArgs, ServerCmd, StorageArgs, SubArgs, TopicCmd,
    TopicSettings, UserCmd,
};

pub async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Server(ServerCmd::Start(a)) => {
            let mut cfg = ServerConfig::load(a.config.as_deref(), std::env::vars())?;
            // --dev always binds loopback; otherwise the configured address (loopback by
            // default) keeps its IP and --port picks the port.
            if a.dev {
                cfg.listen_addr = std::net::SocketAddr::from(([127, 0, 0, 1], a.port));
            } else {
                cfg.listen_addr.set_port(a.port);
            }
            if a.dev {
                // development: no users, no passwords (serve and start without --dev keep
                // security on); said in the log at start
                cfg.security_enabled = false;
                cfg.log_format = LogFormat::Text;
                cfg.data_dir = a.data_dir.unwrap_or_else(default_dev_dir);
            } else if let Some(d) = a.data_dir {
                cfg.data_dir = d;
            }
            apply_storage(&mut cfg, &a.storage)?;
            if a.dev && cfg.archive_url.trim().is_empty() {
                // --dev tiers too, into a directory beside the data
                let dir = std::path::absolute(&cfg.data_dir)?.join("archive");
                cfg.archive_url = format!("file://{}", dir.display());
            }
            cfg.validate()?;
            serve(cfg, a.dev, a.addr_file).await
        }
        Command::Serve(ServeArgs {
            config,
            listen,
            data_dir,
            addr_file,
            storage,
        }) => {
            let mut cfg = ServerConfig::load(config.as_deref(), std::env::vars())?;
            if let Some(l) = listen {
                cfg.listen_addr = l;
            }
            if let Some(d) = data_dir {
                cfg.data_dir = d;
            }
            apply_storage(&mut cfg, &storage)?;
            cfg.validate()?;
            serve(cfg, false, addr_file).await
        }
        command => {
            let c = Client::new(&Connect {
                server: &cli.server,
                user: cli.user.as_deref(),
                password: cli.password.as_deref(),
                ca_cert: cli.ca_cert.as_deref(),
            })?;
            match command {
                Command::Topic(t) => topic(&c, t).await,
                Command::Pub(a) => publish(&c, a).await,
                Command::Sub(a) => subscribe(&c, a).await,
                Command::Replay(a) => replay(&c, a).await,
                Command::User(u) => user(&c, u).await,
                Command::Server(_) | Command::Serve(_) => unreachable!("handled above"),
            }
        }
    }
}

/// `ACTION:PATTERN[,PATTERN...]` or `admin` as a grant object.
fn parse_grant(spec: &str) -> Result<Value, BoxError> {
    let (action, patterns) = spec.split_once(':').unwrap_or((spec, ""));
    let patterns: Vec<&str> = patterns.split(',').filter(|p| !p.is_empty()).collect();
    if !matches!(action, "produce" | "consume" | "create" | "admin") {
        return Err(format!(
            "grant '{spec}': the action must be produce, consume, create or admin"
        )
        .into());
    }
    Ok(json!({"action": action, "patterns": patterns}))
}

/// A new password: given, or the first line of stdin.
fn new_password(given: Option<String>) -> Result<String, BoxError> {
    if let Some(p) = given {
        return Ok(p);
    }
    if std::io::stdin().is_terminal() {
        eprint!("new password: ");
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let p = line.trim_end_matches(['\r', '\n']).to_owned();
    if p.is_empty() {
        return Err("no password given (--new-password, NARAD_NEW_PASSWORD or stdin)".into());
    }
    Ok(p)
}

async fn user(c: &Client, cmd: UserCmd) -> Result<(), BoxError> {
    let path = |name: &str| format!("/v1/users/{}", enc(name));
    match cmd {
        UserCmd::Add {
            name,
            grants,
            new_password: pw,
        } => {
            let grants = grants
                .iter()
                .map(|g| parse_grant(g))
                .collect::<Result<Vec<_>, _>>()?;
            let body = json!({"username": name, "password": new_password(pw)?, "grants": grants});
            if let Reply::Json(v) = c.post_json("/v1/users", &body).await? {
                print_json(&v);
            }
        }
        UserCmd::Ls => {
            if let Reply::Json(v) = c.get("/v1/users").await? {
                println!("{:<32} {:<6} GRANTS", "USERNAME", "ROOT");
                for u in v["users"].as_array().into_iter().flatten() {
                    let grants: Vec<String> = u["grants"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|g| {
                            let pats: Vec<&str> = g["patterns"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(Value::as_str)
                                .collect();
                            let action = g["action"].as_str().unwrap_or("?");
                            if pats.is_empty() {
                                action.to_owned()
                            } else {
                                format!("{action}:{}", pats.join(","))
                            }
                        })
                        .collect();
                    println!(
                        "{:<32} {:<6} {}",
                        u["username"].as_str().unwrap_or(""),
                        if u["root"].as_bool() == Some(true) {
                            "yes"
                        } else {
                            ""
                        },
                        grants.join(" ")
                    );
                }
            }
        }
        UserCmd::Show { name } => {
            if let Reply::Json(v) = c.get(&path(&name)).await? {
                print_json(&v);
            }
        }
        UserCmd::Rm { name } => {
            c.delete(&path(&name)).await?;
            println!("deleted user {name}");
        }
        UserCmd::Grant { name, grants } => {
            let grants = grants
                .iter()
                .map(|g| parse_grant(g))
                .collect::<Result<Vec<_>, _>>()?;
            let body = json!({"grants": grants});
            if let Reply::Json(v) = c
                .put_json(&format!("{}/grants", path(&name)), &body)
                .await?
            {
                print_json(&v);
            }
        }
        UserCmd::Passwd {
            name,
            new_password: pw,
            current,
        } => {
            let mut body = json!({"new_password": new_password(pw)?});
            if let Some(cur) = current {
                body["current_password"] = Value::from(cur);
            }
            c.put_json(&format!("{}/password", path(&name)), &body)
                .await?;
            println!("password of {name} changed");
        }
    }
    Ok(())
}

/// Reads a JSON Schema file (`-`: stdin).
fn read_schema(path: &std::path::Path) -> Result<Value, BoxError> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read schema {}: {e}", path.display()))?
    };
    serde_json::from_str(&text)
        .map_err(|e| format!("schema {} is not JSON: {e}", path.display()).into())
}

fn apply_storage(cfg: &mut ServerConfig, a: &StorageArgs) -> Result<(), BoxError> {
    if let Some(u) = &a.archive_url {
        cfg.archive_url = u.clone();
    }
    if let Some(v) = a.segment_max_age_ms {
        cfg.segment_max_age_ms = v;
    }
    if let Some(v) = a.segment_max_bytes {
        cfg.segment_max_bytes = v;
    }
    if let Some(v) = a.local_retention_ms {
        cfg.local_retention_ms = v;
    }
    Ok(())
}

fn default_dev_dir() -> std::path::PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| ".".into(), std::path::PathBuf::from);
    home.join(".narad").join("data")
}

async fn serve(
    cfg: ServerConfig,
    dev: bool,
    addr_file: Option<std::path::PathBuf>,
) -> Result<(), BoxError> {
    narad_infra::telemetry::init(&cfg.log_format, &cfg.log_level);
    if dev {
        tracing::info!("development mode: bound to loopback, text logs");
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen_addr)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen_addr))?;
    if let Some(path) = addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, listener.local_addr()?.to_string())?;
        std::fs::rename(&tmp, &path)?;
    }
    narad_infra::server::run(listener, cfg, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn settings_json(s: &TopicSettings) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.into(), v);
        }
    };
    put("partitions", s.partitions.map(Value::from));
    put(
        "visibility_timeout_ms",
        s.visibility_timeout_ms.map(Value::from),
    );
    put("retention_ms", s.retention_ms.map(Value::from));
    put("retention_bytes", s.retention_bytes.map(Value::from));
    put(
        "max_in_flight_per_partition",
        s.max_in_flight.map(Value::from),
    );
    put("delay_ms", s.delay_ms.map(Value::from));
    put("max_message_bytes", s.max_message_bytes.map(Value::from));
    m
}

fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

async fn topic(c: &Client, cmd: TopicCmd) -> Result<(), BoxError> {
    match cmd {
        TopicCmd::Add(a) => {
            let mut body = settings_json(&a.settings);
            body.insert("name".into(), Value::from(a.name));
            if let Some(p) = &a.schema {
                body.insert("schema".into(), read_schema(p)?);
            }
            if let Reply::Json(v) = c.post_json("/v1/topics", &Value::Object(body)).await? {
                print_json(&v);
            }
        }
        TopicCmd::Ls { json } => {
            let mut token = String::new();
            let mut all = Vec::new();
            loop {
                let path = format!("/v1/topics?limit=1000&page_token={}", enc(&token));
                let Reply::Json(v) = c.get(&path).await? else {
                    break;
                };
                all.extend(v["topics"].as_array().cloned().unwrap_or_default());
                token = v["next_page_token"].as_str().unwrap_or("").to_owned();
                if token.is_empty() {
                    break;
                }
            }
            if json {
                print_json(&Value::Array(all));
            } else {
                println!(
                    "{:<40} {:>10} {:>12} {:>14}",
                    "NAME", "PARTITIONS", "VISIBILITY", "RETENTION"
                );
                for t in all {
                    println!(
                        "{:<40} {:>10} {:>10}ms {:>12}ms",
                        t["name"].as_str().unwrap_or(""),
                        t["partitions"],
                        t["visibility_timeout_ms"],
                        t["retention_ms"]
                    );
                }
            }
        }
        TopicCmd::Info { name } => {
            if let Reply::Json(v) = c.get(&format!("/v1/topics/{}", enc(&name))).await? {
                print_json(&v);
            }
        }
        TopicCmd::Rm { name } => {
            c.delete(&format!("/v1/topics/{}", enc(&name))).await?;
            println!("deleted {name}");
        }
        TopicCmd::Attach {
            parent,
            child,
            delay_ms,
            earliest,
        } => {
            let body = json!({"child": child, "delay_ms": delay_ms,
                              "from": if earliest { "earliest" } else { "latest" }});
            let path = format!("/v1/topics/{}/children", enc(&parent));
            if let Reply::Json(v) = c.post_json(&path, &body).await? {
                print_json(&v);
            }
        }
        TopicCmd::Detach { parent, child } => {
            c.delete(&format!(
                "/v1/topics/{}/children/{}",
                enc(&parent),
                enc(&child)
            ))
            .await?;
            println!("detached {child} from {parent}");
        }
        TopicCmd::Children { parent } => {
            if let Reply::Json(v) = c
                .get(&format!("/v1/topics/{}/children", enc(&parent)))
                .await?
            {
                print_json(&v);
            }
        }
        TopicCmd::Schema { name } => {
            if let Reply::Json(v) = c.get(&format!("/v1/topics/{}/schema", enc(&name))).await? {
                print_json(&v);
            }
        }
        TopicCmd::Edit(a) => {
            let mut body = settings_json(&a.settings);
            if let Some(p) = &a.schema {
                body.insert("schema".into(), read_schema(p)?);
            }
            if let Reply::Json(v) = c
                .patch_json(
                    &format!("/v1/topics/{}", enc(&a.name)),
                    &Value::Object(body),
                )
                .await?
            {
                print_json(&v);
            }
        }
    }
    Ok(())
}

fn progress(len: Option<u64>, what: &str) -> Option<ProgressBar> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let pb = match len {
        Some(n) => ProgressBar::new(n),
        None => ProgressBar::new_spinner(),
    };
    let template = format!("{{spinner}} {what} {{pos}}/{{len}} [{{elapsed_precise}}] {{per_sec}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        pb.set_style(style);
    }
    Some(pb)
}

async fn publish(c: &Client, a: PubArgs) -> Result<(), BoxError> {
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
    if let Some(d) = a.delay_ms {
        q.push(format!("delay_ms={d}"));
    }
    // One request carries `per_request` messages: the raw body, or a JSON batch of copies.
    let (path, body, content_type, per_request) = if a.batch > 1 {
        let (value, encoding) = match std::str::from_utf8(&payload) {
            Ok(s) => (Value::from(s), "utf8"),
            Err(_) => {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::STANDARD.encode(&payload);
                (Value::from(b64), "base64")
            }
        };
        let mut m = json!({"payload": value, "payload_encoding": encoding});
        if let Some(k) = &a.key {
            m["key"] = Value::from(k.as_str());
        }
        if let Some(p) = a.partition {
            m["partition"] = Value::from(p);
        }
        if let Some(d) = a.delay_ms {
            m["delay_ms"] = Value::from(d);
        }
        let body = serde_json::to_vec(&json!({"messages": vec![m; a.batch as usize]}))?;
        let path = format!("/v1/topics/{}/produce/batch", enc(&a.topic));
        (path, body, "application/json", a.batch)
    } else {
        let path = format!("/v1/topics/{}/produce?{}", enc(&a.topic), q.join("&"));
        (path, payload, "application/octet-stream", 1)
    };
    if a.count == 1 && per_request == 1 {
        if let Reply::Json(v) = c.post_body(&path, body, content_type).await? {
            println!("{v}");
        }
        return Ok(());
    }
    let requests = a.count.div_ceil(per_request);
    let pb = progress(Some(requests * per_request), "published");
    let started = std::time::Instant::now();
    let mut sent = 0u64;
    if a.rate > 0.0 {
        // the client's --rate is real time against a real server
        #[allow(clippy::disallowed_methods)]
        let mut tick = tokio::time::interval(Duration::from_secs_f64(per_request as f64 / a.rate));
        for _ in 0..requests {
            tick.tick().await;
            c.post_body(&path, body.clone(), content_type).await?;
            sent += per_request;
            if let Some(pb) = &pb {
                pb.inc(per_request);
            }
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
    eprintln!(
        "published {sent} messages in {secs:.2}s ({:.0} msg/s)",
        sent as f64 / secs.max(1e-9)
    );
    Ok(())
}

async fn subscribe(c: &Client, a: SubArgs) -> Result<(), BoxError> {
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
        let want = a.max.map_or(100, |m| (m - got).min(100));
        let reply = c
            .get(&format!(
                "/v1/topics/{topic}/consume?wait=5s&max={want}{part}"
            ))
            .await?;
        let msgs = match reply {
            Reply::Json(v) => v["messages"].as_array().cloned().unwrap_or_default(),
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
        for m in &msgs {
            writeln!(out, "{m}")?;
            if let Some(h) = m["receipt_handle"].as_str() {
                handles.push(h.to_owned());
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

/// Acks a batch, retrying the handles that answered 503 (not applied) a few times.
async fn ack_with_retry(c: &Client, topic: &str, mut handles: Vec<String>) -> Result<(), BoxError> {
    for attempt in 0..5u64 {
        let reply = c
            .post_json(
                &format!("/v1/topics/{topic}/ack"),
                &json!({"receipt_handles": handles}),
            )
            .await?;
        let Reply::Json(v) = reply else { return Ok(()) };
        let results = v["results"].as_array().cloned().unwrap_or_default();
        let retry: Vec<String> = handles
            .iter()
            .zip(&results)
            .filter(|(_, r)| r["status"] == 503)
            .map(|(h, _)| h.clone())
            .collect();
        for (h, r) in handles.iter().zip(&results) {
            if r["status"] == 410 {
                eprintln!(
                    "ack of {h}: lease gone ({})",
                    r["error"].as_str().unwrap_or("")
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
    Err(format!(
        "{} acks were not applied after retries; they will be redelivered",
        handles.len()
    )
    .into())
}

async fn partitions_of(c: &Client, topic: &str) -> Result<Vec<(u32, u64, u64)>, BoxError> {
    let Reply::Json(v) = c.get(&format!("/v1/topics/{topic}")).await? else {
        return Err("empty topic description".into());
    };
    Ok(v["partition_stats"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["partition"].as_u64().unwrap_or(0) as u32,
                p["oldest_offset"].as_u64().unwrap_or(0),
                p["next_offset"].as_u64().unwrap_or(0),
            )
        })
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
            let reply = c
                .get(&format!(
                    "/v1/topics/{topic}/consume?partition={p}&offset={next}&max=100"
                ))
                .await;
            let msgs = match reply {
                Ok(Reply::Json(v)) => v["messages"].as_array().cloned().unwrap_or_default(),
                Ok(Reply::Empty) => continue,
                Err(e) => match e.downcast_ref::<crate::client::ApiFailure>() {
                    Some(f) if f.code == "offset_truncated" => {
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
            for m in &msgs {
                writeln!(out, "{m}")?;
                *next = m["offset"].as_u64().unwrap_or(*next) + 1;
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

async fn replay(c: &Client, a: ReplayArgs) -> Result<(), BoxError> {
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
                Reply::Json(v) => v["offset"].as_u64().unwrap_or(to),
                _ => to, // nothing at or after that time
            }
        }
    };
    let pb = progress(Some(to.saturating_sub(from)), "replayed");
    let mut next = from;
    let mut out = std::io::stdout().lock();
    while next < to {
        let max = (to - next).min(100);
        let reply = c
            .get(&format!(
                "/v1/topics/{topic}/consume?partition={}&offset={next}&max={max}",
                a.partition
            ))
            .await?;
        let Reply::Json(v) = reply else { break };
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        if msgs.is_empty() {
            break;
        }
        for m in &msgs {
            let off = m["offset"].as_u64().unwrap_or(next);
            let ts = m["timestamp_ms"].as_i64().unwrap_or(i64::MIN);
            if off >= to || ts > to_time {
                next = to;
                break;
            }
            writeln!(out, "{m}")?;
            next = off + 1;
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
