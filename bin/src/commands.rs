//! What each subcommand does.

use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use narad_infra::config::{LogFormat, ServerConfig};
use narad_wire as wire;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::client::{ApiFailure, BoxError, Client, Connect, Json, Reply, enc};
use crate::process::{shutdown_signal, write_addr_file};
use crate::units::{fmt_bytes, fmt_bytes_about, fmt_ms, table};
use crate::{
    Cli, ClusterCmd, Command, Output, PubArgs, RemoteCmd, ReplayArgs, ServeArgs, ServerCmd,
    StorageArgs, SubArgs, TopicCmd, TopicSettings, UserCmd,
};

/// The port `server start` listens on unless told otherwise.
const DEFAULT_PORT: u16 = 7942;

pub async fn run(cli: Cli) -> Result<(), BoxError> {
    let output = cli.output;
    match cli.command {
        Command::Server(ServerCmd::Start(a)) if a.nodes > 1 => {
            let dir = a.data_dir.clone().unwrap_or_else(default_dev_dir);
            crate::devcluster::run(crate::devcluster::Launch {
                nodes: a.nodes,
                port: a.port.unwrap_or(DEFAULT_PORT),
                dir: &dir,
                config: a.config.as_deref(),
                storage: &a.storage,
                addr_file: a.addr_file.as_deref(),
            })
            .await
        }
        Command::Server(ServerCmd::Start(a)) => {
            crate::devcluster::follow_launcher()?;
            let mut cfg = ServerConfig::load(a.config.as_deref(), std::env::vars())?;
            // --dev always binds loopback; otherwise the configured address (loopback by
            // default) keeps its IP and --port picks the port.
            // (--port, else the configured one: a config file's or NARAD_LISTEN_ADDR's port
            // is not overridden by a default; 7942 when nothing names one)
            let port = a.port.unwrap_or(cfg.listen_addr.port());
            if a.dev {
                cfg.listen_addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            } else {
                cfg.listen_addr.set_port(port);
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
            // NARAD_PASS: the original Narad's name for it
            let password = cli.password.or_else(|| std::env::var("NARAD_PASS").ok());
            let c = Client::new(&Connect {
                server: &cli.server,
                user: cli.user.as_deref(),
                password: password.as_deref(),
                ca_cert: cli.ca_cert.as_deref(),
            })?;
            match command {
                Command::Topic(t) => topic(&c, t, output).await,
                Command::Pub(a) => publish(&c, a).await,
                Command::Sub(a) => subscribe(&c, a).await,
                Command::Replay(a) => replay(&c, a).await,
                Command::User(u) => user(&c, u, output).await,
                Command::Cluster(cmd) => cluster(&c, cmd, output).await,
                Command::Remote(cmd) => remote(&c, cmd, output).await,
                Command::Server(_) | Command::Serve(_) => unreachable!("handled above"),
            }
        }
    }
}

async fn cluster(c: &Client, cmd: ClusterCmd, output: Output) -> Result<(), BoxError> {
    if let ClusterCmd::Remove { node_id } = cmd {
        return print_reply(
            c.delete(&format!("/v1/cluster/members/{node_id}")).await?,
            output,
        );
    }
    match &cmd {
        ClusterCmd::Move {
            topic,
            partition,
            to,
        } => {
            let body = serde_json::json!({"topic": topic, "partition": partition, "to": to});
            print_reply(c.post_json("/v1/cluster/moves", &body).await?, output)?;
            if output == Output::Table {
                outln!(
                    "partition {partition} of {topic} moves to node {to} and stays there: the planner leaves it (`narad cluster unpin {topic} {partition}` gives it back)"
                );
            }
            return Ok(());
        }
        ClusterCmd::Unpin { topic, partition } => {
            c.delete(&format!("/v1/cluster/moves/{}/{partition}/pin", enc(topic)))
                .await?;
            return done(
                output,
                format!("partition {partition} of {topic} is the planner's to place again"),
                serde_json::json!({"topic": topic, "partition": partition, "pinned": false}),
            );
        }
        ClusterCmd::MoveCancel { topic, partition } => {
            return print_reply(
                c.delete(&format!("/v1/cluster/moves/{}/{partition}", enc(topic)))
                    .await?,
                output,
            );
        }
        ClusterCmd::Forget { node_id } => {
            return print_reply(
                c.post_json(
                    &format!("/v1/cluster/members/{node_id}/forget"),
                    &serde_json::json!({}),
                )
                .await?,
                output,
            );
        }
        ClusterCmd::Rebalance => {
            return print_reply(
                c.post_json("/v1/cluster/rebalance", &serde_json::json!({}))
                    .await?,
                output,
            );
        }
        ClusterCmd::Decommission { node_id, cancel } => {
            let path = format!("/v1/cluster/members/{node_id}/decommission");
            return print_reply(
                if *cancel {
                    c.delete(&path).await?
                } else {
                    c.post_json(&path, &serde_json::json!({})).await?
                },
                output,
            );
        }
        ClusterCmd::Moves => {
            let Reply::Json(j) = c.get("/v1/cluster/moves").await? else {
                return Err("the broker answered /v1/cluster/moves with no body".into());
            };
            if output == Output::Json {
                return j.print_pretty();
            }
            let v: serde_json::Value = j.parse()?;
            let rows: Vec<Vec<String>> = v["moves"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    vec![
                        m["topic"].as_str().unwrap_or("-").to_owned(),
                        scalar_text(&m["partition"]),
                        scalar_text(&m["from"]),
                        scalar_text(&m["to"]),
                        m["phase"].as_str().unwrap_or("waiting").to_owned(),
                        m["bytes_copied"].as_u64().unwrap_or(0).to_string(),
                        m["reason"].as_str().unwrap_or("-").to_owned(),
                    ]
                })
                .collect();
            let head = ["TOPIC", "PART", "FROM", "TO", "PHASE", "BYTES", "REASON"];
            outln!("{}", table(&head, &rows));
            let pinned: Vec<Vec<String>> = v["pinned"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    vec![
                        p["topic"].as_str().unwrap_or("-").to_owned(),
                        scalar_text(&p["partition"]),
                        scalar_text(&p["owner"]),
                    ]
                })
                .collect();
            if !pinned.is_empty() {
                outln!();
                outln!("placed by hand (the planner leaves them where they are):");
                outln!("{}", table(&["PINNED", "PART", "OWNER"], &pinned));
            }
            return Ok(());
        }
        _ => {}
    }
    if let ClusterCmd::ReencryptRemotes = cmd {
        return print_reply(
            c.post_json("/v1/cluster/reencrypt-remotes", &serde_json::json!({}))
                .await?,
            output,
        );
    }
    let Reply::Json(j) = c.get("/v1/cluster").await? else {
        return Err("the broker answered /v1/cluster with no body".into());
    };
    if output == Output::Json {
        return j.print_pretty();
    }
    let s: serde_json::Value = j.parse()?;
    let num = |v: &serde_json::Value| v.as_u64().map_or("-".to_owned(), |n| n.to_string());
    match cmd {
        ClusterCmd::Status => {
            if s["single_node"].as_bool() == Some(true) {
                outln!("single node (no cluster_members configured)");
                return Ok(());
            }
            outln!("node        {}", num(&s["node_id"]));
            outln!("state       {}", s["state"].as_str().unwrap_or("-"));
            outln!("leader      {}", num(&s["leader"]));
            outln!("term        {}", num(&s["term"]));
            outln!("ready       {}", s["ready"].as_bool().unwrap_or(false));
            outln!("applied     {}", num(&s["last_applied"]));
            outln!("log         {}", num(&s["last_log"]));
        }
        ClusterCmd::Remove { .. }
        | ClusterCmd::ReencryptRemotes
        | ClusterCmd::Move { .. }
        | ClusterCmd::Moves
        | ClusterCmd::Rebalance
        | ClusterCmd::Forget { .. }
        | ClusterCmd::Decommission { .. }
        | ClusterCmd::MoveCancel { .. }
        | ClusterCmd::Unpin { .. } => unreachable!("handled above"),
        ClusterCmd::Members => {
            outln!(
                "{:<8} {:<32} {:<6} {:>10} {:<9} MATCHED",
                "NODE",
                "RPC ADDRESS",
                "VOTER",
                "PARTITIONS",
                "DRAINING"
            );
            for m in s["members"].as_array().into_iter().flatten() {
                outln!(
                    "{:<8} {:<32} {:<6} {:>10} {:<9} {}",
                    num(&m["node_id"]),
                    m["rpc_addr"].as_str().unwrap_or("-"),
                    m["voter"].as_bool().unwrap_or(false),
                    num(&m["partitions"]),
                    m["draining"].as_bool().unwrap_or(false),
                    num(&m["matched_index"]),
                );
            }
        }
    }
    Ok(())
}

/// `ACTION:PATTERN[,PATTERN...]` or `admin` as a grant.
fn parse_grant(spec: &str) -> Result<wire::Grant, BoxError> {
    let (action, patterns) = spec.split_once(':').unwrap_or((spec, ""));
    let action = match action {
        "produce" => wire::GrantAction::Produce,
        "consume" => wire::GrantAction::Consume,
        "create" => wire::GrantAction::Create,
        "replicate" => wire::GrantAction::Replicate,
        "admin" => wire::GrantAction::Admin,
        _ => {
            return Err(format!(
                "grant '{spec}': the action must be produce, consume, create, replicate or admin"
            )
            .into());
        }
    };
    let patterns = patterns
        .split(',')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    Ok(wire::Grant { action, patterns })
}

fn grant_text(g: &wire::Grant) -> String {
    let action = match g.action {
        wire::GrantAction::Produce => "produce",
        wire::GrantAction::Consume => "consume",
        wire::GrantAction::Create => "create",
        wire::GrantAction::Replicate => "replicate",
        wire::GrantAction::Admin => "admin",
    };
    if g.patterns.is_empty() {
        action.to_owned()
    } else {
        format!("{action}:{}", g.patterns.join(","))
    }
}

/// A reply as `-o` says: the server's JSON as it came (pretty), or its fields one per line
/// (`key  value`; nested fields as `key.sub`).
fn print_reply(r: Reply, output: Output) -> Result<(), BoxError> {
    let Reply::Json(j) = r else { return Ok(()) };
    if output == Output::Json {
        return j.print_pretty();
    }
    let v: Value = j.parse()?;
    let mut rows = Vec::new();
    flatten("", &v, &mut rows);
    print_fields(&rows);
    Ok(())
}

/// `key  value` lines, the values aligned (a row with no key prints its value alone).
fn print_fields<K: AsRef<str>>(rows: &[(K, String)]) {
    let width = rows
        .iter()
        .map(|(k, _)| k.as_ref().len())
        .max()
        .unwrap_or(0);
    for (k, val) in rows {
        let k = k.as_ref();
        if k.is_empty() {
            outln!("{val}");
        } else {
            outln!("{k:<width$}  {val}");
        }
    }
}

/// `v`'s scalar fields under `prefix` as `(key, text)`, depth first.
fn flatten(prefix: &str, v: &Value, rows: &mut Vec<(String, String)>) {
    let key = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                flatten(&key(k), x, rows);
            }
        }
        Value::Array(a) if a.is_empty() => rows.push((prefix.to_owned(), "(none)".to_owned())),
        Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
            let items: Vec<String> = a.iter().map(scalar_text).collect();
            rows.push((prefix.to_owned(), items.join(", ")));
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), x, rows);
            }
        }
        other => rows.push((prefix.to_owned(), scalar_text(other))),
    }
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The outcome of a command the server answers with no body: `text` for a person, or `json`
/// under `-o json`.
fn done(output: Output, text: String, json: Value) -> Result<(), BoxError> {
    if output == Output::Json {
        outln!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        outln!("{text}");
    }
    Ok(())
}

/// A new password: given, or asked for on a terminal (not shown, typed twice), or the
/// first line of stdin.
fn new_password(given: Option<String>) -> Result<String, BoxError> {
    if let Some(p) = given {
        return Ok(p);
    }
    let p = if std::io::stdin().is_terminal() {
        let p = read_hidden("new password: ")?;
        if read_hidden("again: ")? != p {
            return Err("the two passwords differ: nothing was changed".into());
        }
        p
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    };
    if p.is_empty() {
        return Err("no password given (--new-password, NARAD_NEW_PASSWORD or stdin)".into());
    }
    Ok(p)
}

/// A line typed on the terminal without showing it (echo off while it is read, and back on
/// whatever happens).
fn read_hidden(prompt: &str) -> Result<String, BoxError> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    let stdin = std::io::stdin();
    eprint!("{prompt}");
    let before = tcgetattr(&stdin)?;
    let mut quiet = before.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    tcsetattr(&stdin, OptionalActions::Now, &quiet)?;
    let mut line = String::new();
    let read = stdin.read_line(&mut line);
    let _ = tcsetattr(&stdin, OptionalActions::Now, &before);
    eprintln!();
    read?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

async fn user(c: &Client, cmd: UserCmd, output: Output) -> Result<(), BoxError> {
    let path = |name: &str| format!("/v1/users/{}", enc(name));
    match cmd {
        UserCmd::Add {
            name,
            grants,
            new_password: pw,
        } => {
            // the grants are checked before a password is asked for
            let grants = grants
                .iter()
                .map(|g| parse_grant(g))
                .collect::<Result<_, _>>()?;
            let body = wire::CreateUser {
                username: name,
                password: new_password(pw)?,
                grants,
            };
            print_reply(c.post_json("/v1/users", &body).await?, output)?;
        }
        UserCmd::Ls => {
            if let Reply::Json(j) = c.get("/v1/users").await? {
                if output == Output::Json {
                    return j.print_pretty();
                }
                let list: wire::UserList = j.parse()?;
                outln!("{:<32} {:<6} GRANTS", "USERNAME", "ROOT");
                for u in &list.users {
                    let grants: Vec<String> = u.grants.iter().map(grant_text).collect();
                    outln!(
                        "{:<32} {:<6} {}",
                        u.username,
                        if u.root { "yes" } else { "" },
                        grants.join(" ")
                    );
                }
            }
        }
        UserCmd::Show { name } => print_reply(c.get(&path(&name)).await?, output)?,
        UserCmd::Rm { name } => {
            c.delete(&path(&name)).await?;
            done(
                output,
                format!("deleted user {name}"),
                serde_json::json!({"deleted": name}),
            )?;
        }
        UserCmd::Grant { name, grants } => {
            let body = wire::SetGrants {
                grants: grants
                    .iter()
                    .map(|g| parse_grant(g))
                    .collect::<Result<_, _>>()?,
            };
            print_reply(
                c.put_json(&format!("{}/grants", path(&name)), &body)
                    .await?,
                output,
            )?;
        }
        UserCmd::Passwd {
            name,
            new_password: pw,
            current,
        } => {
            let body = wire::SetPassword {
                new_password: new_password(pw)?,
                current_password: current,
            };
            c.put_json(&format!("{}/password", path(&name)), &body)
                .await?;
            done(
                output,
                format!("password of {name} changed"),
                serde_json::json!({"password_changed": name}),
            )?;
        }
    }
    Ok(())
}

/// A remote's password: given, or asked for on a terminal (not shown), or the first line of
/// stdin.
fn remote_password(given: Option<String>) -> Result<String, BoxError> {
    if let Some(p) = given {
        return Ok(p);
    }
    let p = if std::io::stdin().is_terminal() {
        read_hidden("the remote user's password: ")?
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    };
    if p.is_empty() {
        return Err("no password given (--remote-password, NARAD_REMOTE_PASSWORD or stdin)".into());
    }
    Ok(p)
}

fn read_ca(path: &std::path::Path) -> Result<String, BoxError> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()).into())
}

async fn remote(c: &Client, cmd: RemoteCmd, output: Output) -> Result<(), BoxError> {
    let path = |name: &str| format!("/v1/remotes/{}", enc(name));
    match cmd {
        RemoteCmd::Add {
            name,
            url,
            remote_user,
            remote_password: pw,
            remote_ca,
        } => {
            let ca = remote_ca.as_deref().map(read_ca).transpose()?;
            let body = serde_json::json!({
                "name": name,
                "url": url,
                "username": remote_user,
                "password": remote_password(pw)?,
                "ca_pem": ca,
            });
            print_reply(c.post_json("/v1/remotes", &body).await?, output)?;
        }
        RemoteCmd::Ls => {
            let Reply::Json(j) = c.get("/v1/remotes").await? else {
                return Ok(());
            };
            if output == Output::Json {
                return j.print_pretty();
            }
            let v: Value = j.parse()?;
            let mut rows = Vec::new();
            for r in v["remotes"].as_array().into_iter().flatten() {
                let s = |k: &str| r[k].as_str().unwrap_or("").to_owned();
                rows.push(vec![
                    s("name"),
                    s("url"),
                    s("username"),
                    if r["ca_sha256"].is_string() {
                        "own".into()
                    } else {
                        "system".into()
                    },
                    r["credential"]["sealed_with"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                ]);
            }
            outln!(
                "{}",
                table(&["NAME", "URL", "USER", "CA", "SEALED WITH"], &rows)
            );
        }
        RemoteCmd::Show { name } => print_reply(c.get(&path(&name)).await?, output)?,
        RemoteCmd::Edit {
            name,
            url,
            remote_user,
            remote_password: pw,
            password_stdin,
            remote_ca,
            system_roots,
        } => {
            let mut body = serde_json::Map::new();
            let rebinds =
                url.is_some() || remote_user.is_some() || remote_ca.is_some() || system_roots;
            if let Some(u) = url {
                body.insert("url".into(), u.into());
            }
            if let Some(u) = remote_user {
                body.insert("username".into(), u.into());
            }
            if let Some(p) = &remote_ca {
                body.insert("ca_pem".into(), read_ca(p)?.into());
            } else if system_roots {
                body.insert("ca_pem".into(), Value::Null);
            }
            if pw.is_some() || password_stdin || rebinds {
                body.insert("password".into(), remote_password(pw)?.into());
            }
            if body.is_empty() {
                return Err("nothing to change: give --url, --remote-user, --remote-ca, --system-roots or a password".into());
            }
            print_reply(c.patch_json(&path(&name), &body).await?, output)?;
        }
        RemoteCmd::Test {
            name,
            topic,
            parent,
        } => {
            let mut p = format!("{}/test", path(&name));
            if let Some(t) = &topic {
                p.push_str(&format!("?topic={}", enc(t)));
            }
            if let Some(parent) = &parent {
                p.push_str(&format!("&parent={}", enc(parent)));
            }
            let Reply::Json(j) = c.post_json(&p, &serde_json::json!({})).await? else {
                return Err("the broker answered the test with no body".into());
            };
            let v: Value = j.parse()?;
            if output == Output::Json {
                j.print_pretty()?;
            } else {
                let mut rows = Vec::new();
                for ch in v["checks"].as_array().into_iter().flatten() {
                    rows.push(vec![
                        ch["name"].as_str().unwrap_or("").to_owned(),
                        if ch["ok"] == Value::Bool(true) {
                            "yes".into()
                        } else {
                            "NO".into()
                        },
                        ch["detail"].as_str().unwrap_or("").to_owned(),
                    ]);
                }
                outln!("{}", table(&["CHECK", "OK", "DETAIL"], &rows));
            }
            if v["ok"] != Value::Bool(true) {
                return Err(format!(
                    "remote '{name}' failed its checks (state {})",
                    v["state"].as_str().unwrap_or("?")
                )
                .into());
            }
        }
        RemoteCmd::Rm { name } => {
            c.delete(&path(&name)).await?;
            done(
                output,
                format!("deleted remote {name}"),
                serde_json::json!({"deleted": name}),
            )?;
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
    let addr = listener.local_addr()?.to_string();
    // written once this process holds the data directory and serves: a second broker that
    // the directory's lock refuses leaves no address behind
    let written = std::sync::atomic::AtomicBool::new(false);
    let announce = || match &addr_file {
        Some(path) => {
            write_addr_file(path, &addr)
                .map_err(|e| format!("cannot write --addr-file {}: {e}", path.display()))?;
            written.store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        None => Ok(()),
    };
    let result = narad_infra::server::run(listener, cfg, shutdown_signal(), announce).await;
    // and gone once it no longer serves (stopped, or failed after it started): a script
    // polling for the file finds no address of a process that has exited
    if let Some(path) = &addr_file
        && written.load(std::sync::atomic::Ordering::Relaxed)
    {
        remove_addr_file(path, &addr);
    }
    result?;
    Ok(())
}

/// Removes `--addr-file` if it still holds `addr` (another process may have written its own
/// address there since).
fn remove_addr_file(path: &std::path::Path, addr: &str) {
    if std::fs::read_to_string(path).is_ok_and(|held| held == addr)
        && let Err(e) = std::fs::remove_file(path)
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove --addr-file");
    }
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

async fn topic(c: &Client, cmd: TopicCmd, output: Output) -> Result<(), BoxError> {
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
        m.delay_ms = a.delay_ms;
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
            let want = a.max.map_or(100, |m| (m - got).min(100));
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
                Reply::Json(j) => j.parse::<wire::Message>()?.offset,
                Reply::Empty => to, // nothing at or after that time
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

#[cfg(test)]
mod tests {
    use super::*;

    /// From the black-box review: the temporary file was `<path with extension tmp>`, opened
    /// without `O_EXCL`: a symbolic link planted there had its target overwritten, and a
    /// `broker.tmp` beside `broker.addr` was replaced.
    #[test]
    fn the_addr_file_is_never_written_through_a_planted_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.addr");
        let precious = dir.path().join("precious");
        std::fs::write(&precious, "keep me").unwrap();
        // the old temporary name: another file, left alone
        let sibling = dir.path().join("broker.tmp");
        std::fs::write(&sibling, "mine").unwrap();
        // a link planted at the temporary name: never written through
        std::os::unix::fs::symlink(&precious, dir.path().join("broker.addr.tmp")).unwrap();
        write_addr_file(&path, "127.0.0.1:1").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "127.0.0.1:1");
        assert_eq!(std::fs::read_to_string(&sibling).unwrap(), "mine");
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
        assert!(!path.symlink_metadata().unwrap().file_type().is_symlink());
    }
}
