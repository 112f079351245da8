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
use crate::units::{self, fmt_bytes, fmt_bytes_about, fmt_ms, table};
use crate::{
    Cli, ClusterCmd, Command, KeyCmd, Output, PubArgs, RemoteCmd, ReplayArgs, ServeArgs, ServerCmd,
    StorageArgs, SubArgs, TopicCmd, TopicSettings, UserCmd,
};

mod cluster;
mod messages;
mod remote;
mod topic;
mod user;

/// The port `server start` listens on unless told otherwise.
use crate::client::DEFAULT_PORT;

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
                Command::Topic(t) => topic::run(&c, t, output).await,
                Command::Pub(a) => messages::publish(&c, a).await,
                Command::Sub(a) => messages::subscribe(&c, a).await,
                Command::Replay(a) => messages::replay(&c, a).await,
                Command::User(u) => user::run(&c, u, output).await,
                Command::Cluster(cmd) => cluster::run(&c, cmd, output).await,
                Command::Remote(cmd) => remote::run(&c, cmd, output).await,
                Command::Server(_) | Command::Serve(_) => unreachable!("handled above"),
            }
        }
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
        other => rows.push(labelled(prefix, other)),
    }
}

/// A scalar field for a person: a time (`..._at_ms`) as UTC, a duration (`..._ms`) or a size
/// (`..._bytes`) in units, the unit's suffix off its name.
fn labelled(key: &str, v: &Value) -> (String, String) {
    let Some(n) = v.as_i64() else {
        return (key.to_owned(), scalar_text(v));
    };
    // a time: `..._at_ms`, `at_ms` alone (as a nested object's `x.at_ms`), and the other
    // instants the API names in milliseconds
    let last = key.rsplit('.').next().unwrap_or(key);
    let instant = [
        "at_ms",
        "timestamp_ms",
        "since_ms",
        "deadline_ms",
        "unshipped_ms",
    ]
    .iter()
    .any(|t| last == *t || last.ends_with(&format!("_{t}")));
    if instant {
        // (0: never)
        let text = if n == 0 {
            "-".into()
        } else {
            units::fmt_time(n)
        };
        return (key.strip_suffix("_ms").unwrap_or(key).to_owned(), text);
    }
    if let Some(k) = key.strip_suffix("_ms") {
        return (k.to_owned(), units::fmt_ms(n));
    }
    if let Some(k) = key.strip_suffix("_bytes")
        && let Ok(b) = u64::try_from(n)
    {
        return (k.to_owned(), units::fmt_bytes(b));
    }
    (key.to_owned(), scalar_text(v))
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
    let failpoints =
        narad_core::failpoint::init(std::env::var(narad_core::failpoint::ENV).ok().as_deref())?;
    if !failpoints.is_empty() {
        tracing::warn!(?failpoints, "failpoints on: for tests only");
    }
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Fields for a person: times in UTC, durations and sizes in units, their suffixes off.
    #[test]
    fn fields_say_times_durations_and_sizes_as_a_person_reads_them() {
        let mut rows = Vec::new();
        super::flatten(
            "",
            &json!({
                "name": "x",
                "created_at_ms": 1_733_585_400_250i64,
                "never_at_ms": 0,
                "delay_ms": 1500,
                "retention_bytes": 1_048_576,
                "nested": {"updated_at_ms": 0, "count": 3, "at_ms": 1_733_585_400_000i64},
                "timestamp_ms": 1_733_585_400_000i64,
            }),
            &mut rows,
        );
        let got: Vec<(&str, &str)> = rows.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            got,
            [
                ("created_at", "2024-12-07T15:30:00.250Z"),
                ("delay", "1500ms"),
                ("name", "x"),
                ("nested.at", "2024-12-07T15:30:00Z"),
                ("nested.count", "3"),
                ("nested.updated_at", "-"),
                ("never_at", "-"),
                ("retention", "1MiB"),
                ("timestamp", "2024-12-07T15:30:00Z"),
            ]
        );
    }
}
