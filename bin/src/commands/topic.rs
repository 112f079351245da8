//! `narad topic`: create, show, change, delete, children, schemas.

use super::*;

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

fn settings(s: &TopicSettings) -> wire::TopicSettings {
    wire::TopicSettings {
        partitions: s.partitions,
        visibility_timeout_ms: s.visibility,
        retention_ms: s.retention,
        retention_bytes: s.retention_bytes,
        max_in_flight_per_partition: s.max_in_flight,
        delay_ms: s.delay,
        max_message_bytes: s.max_message_bytes,
        key_policy: s.key_policy.clone(),
    }
}

/// A topic as the server answered it: its JSON as is, or a table in human units (with its
/// partitions' figures when the answer has them).
fn show_topic(r: Reply, output: Output) -> Result<(), BoxError> {
    let Reply::Json(j) = r else {
        return Ok(());
    };
    if output == Output::Json {
        return j.print_pretty();
    }
    let v: Value = j.parse()?;
    let t: wire::Topic = serde_json::from_value(v.clone())
        .map_err(|e| format!("unexpected topic from the broker: {e}"))?;
    let cfg = &t.config;
    let mut rows: Vec<(&str, String)> = vec![
        ("name", t.name.clone()),
        ("id", t.id.clone()),
        ("role", t.role.clone()),
        ("partitions", cfg.partitions.to_string()),
        ("visibility", fmt_ms(cfg.visibility_timeout_ms)),
        (
            "retention",
            match cfg.retention_ms {
                0 => "forever".into(),
                ms => fmt_ms(ms),
            },
        ),
        (
            "retention bytes",
            match cfg.retention_bytes {
                0 => "unlimited".into(),
                b => fmt_bytes(b),
            },
        ),
        ("max in flight", cfg.max_in_flight_per_partition.to_string()),
        ("delay", fmt_ms(cfg.delay_ms)),
        ("max message", fmt_bytes(cfg.max_message_bytes)),
        ("key policy", cfg.key_policy.clone()),
    ];
    if let Some(p) = &t.parent {
        let delay = t.fanout_delay_ms.unwrap_or(0);
        rows.push(("parent", format!("{p} (delay {})", fmt_ms(delay))));
    }
    if !t.children.is_empty() {
        rows.push(("children", t.children.join(", ")));
    }
    if let Some(o) = &t.owner {
        rows.push(("owner", o.clone()));
    }
    if let Some(v) = t.schema_version {
        rows.push(("schema version", v.to_string()));
    }
    if let Some(f) = &t.failover {
        let text = match (&f.mirror_of, &f.promoted_from) {
            (Some(s), _) => format!(
                "mirror of topic {} of cluster {} (epoch {})",
                s.topic, s.cluster, f.epoch
            ),
            (None, Some(s)) => format!(
                "{} (epoch {}), promoted from topic {} of cluster {}",
                f.role, f.epoch, s.topic, s.cluster
            ),
            (None, None) => format!("{} (epoch {})", f.role, f.epoch),
        };
        rows.push(("failover", text));
    }
    print_fields(&rows);
    let unavailable: Vec<u64> =
        serde_json::from_value(v["partitions_unavailable"].clone()).unwrap_or_default();
    if let Ok(d) = serde_json::from_value::<wire::TopicDetails>(v) {
        let owners = &t.partition_owners;
        let parts: Vec<Vec<String>> = d
            .partition_stats
            .iter()
            .map(|p| {
                let mut row = vec![p.partition.to_string()];
                if !owners.is_empty() {
                    let owner = owners.get(p.partition as usize);
                    row.push(owner.map_or("-".into(), u64::to_string));
                }
                row.extend([
                    p.oldest_offset.to_string(),
                    p.next_offset.to_string(),
                    p.unacked.to_string(),
                    p.in_flight.to_string(),
                    p.delayed.to_string(),
                    fmt_bytes_about(p.bytes),
                    p.segments.to_string(),
                ]);
                row
            })
            .collect();
        outln!();
        let mut head = vec!["PARTITION"];
        if !owners.is_empty() {
            head.push("OWNER");
        }
        head.extend([
            "OLDEST",
            "NEXT",
            "UNACKED",
            "IN FLIGHT",
            "DELAYED",
            "SIZE",
            "SEGMENTS",
        ]);
        outln!("{}", table(&head, &parts));
        if !unavailable.is_empty() {
            let list: Vec<String> = unavailable.iter().map(u64::to_string).collect();
            outln!(
                "not shown: partition {} (the owner could not be asked)",
                list.join(", ")
            );
        }
    }
    Ok(())
}

pub(super) async fn run(c: &Client, cmd: TopicCmd, output: Output) -> Result<(), BoxError> {
    match cmd {
        TopicCmd::Add(a) => {
            let mut body = wire::CreateTopic::new(a.name);
            body.settings = settings(&a.settings);
            if let Some(p) = &a.schema {
                body.schema = Some(read_schema(p)?);
            }
            show_topic(c.post_json("/v1/topics", &body).await?, output)?;
        }
        TopicCmd::Ls { json } => {
            let mut token = String::new();
            // each topic as the server wrote it: printed as is with --json, read for the table
            let mut all: Vec<Box<RawValue>> = Vec::new();
            loop {
                let path = format!("/v1/topics?limit=1000&page_token={}", enc(&token));
                let Reply::Json(j) = c.get(&path).await? else {
                    break;
                };
                let page: wire::TopicList<Box<RawValue>> = j.parse()?;
                all.extend(page.topics);
                token = page.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            if json || output == Output::Json {
                let all = all
                    .iter()
                    .map(|t| serde_json::from_str(t.get()))
                    .collect::<Result<Vec<Value>, _>>()?;
                outln!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                let mut rows = Vec::with_capacity(all.len());
                for t in &all {
                    let t: wire::Topic = serde_json::from_str(t.get())?;
                    let retention = match t.config.retention_ms {
                        0 => "forever".into(),
                        ms => fmt_ms(ms),
                    };
                    rows.push(vec![
                        t.name,
                        t.config.partitions.to_string(),
                        fmt_ms(t.config.visibility_timeout_ms),
                        retention,
                        fmt_bytes(t.config.max_message_bytes),
                        t.role,
                    ]);
                }
                let head = [
                    "NAME",
                    "PARTITIONS",
                    "VISIBILITY",
                    "RETENTION",
                    "MAX MESSAGE",
                    "ROLE",
                ];
                outln!("{}", table(&head, &rows));
            }
        }
        TopicCmd::Info { name } => {
            show_topic(c.get(&format!("/v1/topics/{}", enc(&name))).await?, output)?;
        }
        TopicCmd::Rm { name, force } => {
            let force = if force { "?force=true" } else { "" };
            c.delete(&format!("/v1/topics/{}{force}", enc(&name)))
                .await?;
            done(
                output,
                format!("deleted {name}"),
                serde_json::json!({"deleted": name}),
            )?;
        }
        TopicCmd::Attach {
            parent,
            child,
            remote: Some(remote),
            remote_topic,
            lanes,
            earliest,
            unconsumed,
            ..
        } => {
            let from = if earliest {
                "earliest"
            } else if unconsumed {
                "unconsumed"
            } else {
                "attach"
            };
            let body = serde_json::json!({
                "child": child,
                "remote": remote,
                "remote_topic": remote_topic,
                "lanes": lanes,
                "from": from,
            });
            let path = format!("/v1/topics/{}/children", enc(&parent));
            print_reply(c.post_json(&path, &body).await?, output)?;
        }
        TopicCmd::Attach {
            parent,
            child,
            delay,
            earliest,
            ..
        } => {
            let body = wire::AttachChild {
                child,
                delay_ms: delay,
                from: Some(if earliest {
                    wire::StartFrom::Earliest
                } else {
                    wire::StartFrom::Latest
                }),
            };
            let path = format!("/v1/topics/{}/children", enc(&parent));
            print_reply(c.post_json(&path, &body).await?, output)?;
        }
        TopicCmd::Detach {
            parent,
            child,
            force,
        } => {
            let force = if force { "?force=true" } else { "" };
            c.delete(&format!(
                "/v1/topics/{}/children/{}{force}",
                enc(&parent),
                enc(&child)
            ))
            .await?;
            done(
                output,
                format!("detached {child} from {parent}"),
                serde_json::json!({"parent": parent, "detached": child}),
            )?;
        }
        TopicCmd::Pause { parent, child } => {
            let path = format!("/v1/topics/{}/children/{}/pause", enc(&parent), enc(&child));
            c.post_json(&path, &serde_json::json!({})).await?;
            done(
                output,
                format!("paused {child} of {parent}"),
                serde_json::json!({"parent": parent, "paused": child}),
            )?;
        }
        TopicCmd::Skip {
            parent,
            child,
            partition,
            offset,
        } => {
            let mut path = format!("/v1/topics/{}/children/{}/skip", enc(&parent), enc(&child));
            if let (Some(p), Some(o)) = (partition, offset) {
                path.push_str(&format!("?partition={p}&offset={o}"));
            }
            print_reply(c.post_json(&path, &serde_json::json!({})).await?, output)?;
        }
        TopicCmd::Resume { parent, child } => {
            let path = format!(
                "/v1/topics/{}/children/{}/resume",
                enc(&parent),
                enc(&child)
            );
            c.post_json(&path, &serde_json::json!({})).await?;
            done(
                output,
                format!("resumed {child} of {parent}"),
                serde_json::json!({"parent": parent, "resumed": child}),
            )?;
        }
        TopicCmd::Promote {
            name,
            force,
            wait_drained,
            timeout,
        } => {
            let query = match (force, wait_drained, timeout) {
                (true, _, _) => "?force=true".to_owned(),
                (_, true, Some(ms)) => format!("?wait_drained=true&timeout_ms={ms}"),
                (_, true, None) => "?wait_drained=true".to_owned(),
                _ => String::new(),
            };
            let path = format!("/v1/topics/{}/promote{query}", enc(&name));
            print_reply(c.post_json(&path, &serde_json::json!({})).await?, output)?;
        }
        TopicCmd::Demote { name } => {
            let path = format!("/v1/topics/{}/demote", enc(&name));
            print_reply(c.post_json(&path, &serde_json::json!({})).await?, output)?;
        }
        TopicCmd::Children { parent } => {
            let reply = c
                .get(&format!("/v1/topics/{}/children", enc(&parent)))
                .await?;
            let Reply::Json(j) = reply else {
                return Ok(());
            };
            if output == Output::Json {
                return j.print_pretty();
            }
            let v: Value = j.parse()?;
            let mut rows = Vec::new();
            for ch in v["children"].as_array().into_iter().flatten() {
                let remote = &ch["remote"];
                let delay = ch["delay_ms"].as_i64().unwrap_or(0);
                let (kind, target, state) = if remote.is_null() {
                    (
                        if delay > 0 { "delay" } else { "fan-out" }.to_owned(),
                        "-".to_owned(),
                        "-".to_owned(),
                    )
                } else {
                    (
                        "remote".to_owned(),
                        format!(
                            "{}/{}",
                            remote["remote"].as_str().unwrap_or("?"),
                            remote["remote_topic"].as_str().unwrap_or("?")
                        ),
                        remote["state"].as_str().unwrap_or("-").to_owned(),
                    )
                };
                rows.push(vec![
                    ch["name"].as_str().unwrap_or("-").to_owned(),
                    kind,
                    if delay > 0 {
                        fmt_ms(delay)
                    } else {
                        "-".to_owned()
                    },
                    ch["lag_messages"].as_u64().unwrap_or(0).to_string(),
                    target,
                    state,
                ]);
            }
            outln!(
                "{}",
                table(&["NAME", "KIND", "DELAY", "LAG", "REMOTE", "STATE"], &rows)
            );
        }
        TopicCmd::Schema { name } => {
            print_reply(
                c.get(&format!("/v1/topics/{}/schema", enc(&name))).await?,
                output,
            )?;
        }
        TopicCmd::Edit(a) => {
            let mut body = wire::AlterTopic {
                settings: settings(&a.settings),
                schema: None,
            };
            if let Some(p) = &a.schema {
                body.schema = Some(read_schema(p)?);
            }
            show_topic(
                c.patch_json(&format!("/v1/topics/{}", enc(&a.name)), &body)
                    .await?,
                output,
            )?;
        }
    }
    Ok(())
}
