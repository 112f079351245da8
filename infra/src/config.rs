//! Server configuration: defaults, then a TOML file, then `NARAD_*` environment variables,
//! then command-line flags (applied by the binary). Unknown keys are an error; an invalid value
//! names its key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use narad_core::broker::BrokerConfig;
use narad_core::log::LogConfig;
use narad_core::topic::TopicConfig;
use serde::{Deserialize, Serialize};

/// Longest long-poll a consumer may ask for; longer requests are clamped (and told so).
pub const MAX_WAIT_MS_LIMIT: u64 = 20_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// A secret given in the configuration. Its `Debug` and `Serialize` never show the value
/// (the defaults table and any dump of the config see `<redacted>`), so no log line or
/// response can carry it by accident.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<redacted>"
        })
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { "<redacted>" })
    }
}

/// A TOML syntax error as shown to the operator. The parser quotes the offending line; when
/// that line may hold a secret (any `*secret*` key), only its number is given.
fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else {
        return e.to_string();
    };
    let line_start = text[..span.start.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or_default();
    if line.to_ascii_lowercase().contains("secret") {
        let n = text[..line_start].matches('\n').count() + 1;
        return format!("syntax error on line {n} (not shown: it may hold a secret)");
    }
    e.to_string()
}

/// Longest cluster secret accepted.
pub const MAX_SECRET_BYTES: usize = 4096;

/// The cluster secret and, during a rotation, the one before it, as read from the
/// configuration (values or files). `Debug` shows neither.
pub struct ClusterSecrets {
    pub current: Vec<u8>,
    pub previous: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClusterSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSecrets")
            .field("previous", &self.previous.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// A cluster member's settings, checked (see [`ServerConfig::cluster`]).
#[derive(Debug)]
pub struct ClusterSettings {
    pub node_id: u64,
    pub bind: SocketAddr,
    pub advertise: String,
    pub members: Vec<narad_cluster::members::Member>,
    pub secrets: ClusterSecrets,
}

impl ClusterSettings {
    /// Whether this node is one of the initial voters (else it joins through them).
    pub fn is_initial_member(&self) -> bool {
        self.members.iter().any(|m| m.id == self.node_id)
    }
}

/// A secret kept in a file: its content without one trailing newline (as `echo` and editors
/// leave it).
pub fn read_secret_file(path: &str) -> std::io::Result<Vec<u8>> {
    let mut b = std::fs::read(path)?;
    if b.ends_with(b"\n") {
        b.pop();
        if b.ends_with(b"\r") {
            b.pop();
        }
    }
    Ok(b)
}

/// One secret from its value or its file (never both), checked for length. Errors name the
/// key and the file, never the content.
fn read_secret(key: &str, value: &Secret, file: &str) -> Result<Option<Vec<u8>>, ConfigError> {
    let bad = |key: String, message: String| Err(ConfigError::Invalid { key, message });
    let file = file.trim();
    let bytes = match (value.is_empty(), file.is_empty()) {
        (true, true) => return Ok(None),
        (false, false) => {
            return bad(key.into(), format!("set {key} or {key}_file, not both"));
        }
        (false, true) => value.bytes().to_vec(),
        (true, false) => read_secret_file(file).map_err(|e| ConfigError::Invalid {
            key: format!("{key}_file"),
            message: format!("cannot read {file}: {e}"),
        })?,
    };
    let min = narad_tiering::catalog::MIN_SECRET_BYTES;
    if bytes.len() < min {
        return bad(
            key.into(),
            format!("must be at least {min} bytes (generate one with `openssl rand -base64 48`)"),
        );
    }
    if bytes.len() > MAX_SECRET_BYTES {
        return bad(
            key.into(),
            format!("must be at most {MAX_SECRET_BYTES} bytes"),
        );
    }
    Ok(Some(bytes))
}

/// `NARAD_*` variables that are no configuration key but are read: the server's root
/// password, the CLI's, the dev cluster's and the test tools'.
const CLIENT_ENV: [&str; 12] = [
    "NARAD_ADMIN_PASSWORD",
    "NARAD_ADDR",
    "NARAD_USER",
    "NARAD_PASSWORD",
    "NARAD_PASS",
    "NARAD_CA_CERT",
    "NARAD_NEW_PASSWORD",
    "NARAD_CURRENT_PASSWORD",
    "NARAD_REMOTE_PASSWORD",
    "NARAD_DEV_CLUSTER_PARENT",
    "NARAD_BIN",
    "NARAD_FUZZ_CASES",
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address of the HTTP listener.
    pub listen_addr: SocketAddr,
    /// Users, passwords and grants (HTTP Basic). On unless `server start --dev`. Off: no
    /// authentication and every request is allowed; never run it so on a shared network.
    pub security_enabled: bool,
    /// Optional second listener serving only `/metrics`, without authentication (bind it to
    /// an address only the scraper reaches). Empty: none; `/metrics` on the API listener
    /// then needs an admin.
    pub metrics_addr: String,
    /// `NARAD_*` variables in the environment that are no setting here (nor a CLI variable),
    /// warned about at start: the original Narad's names (`NARAD_HTTP_ADDR`, ...) would
    /// otherwise be ignored in silence.
    #[serde(skip)]
    pub ignored_env: Vec<String>,
    /// Consecutive failed logins allowed for one username from one address before it is
    /// blocked (1 s, doubling per further failure, at most 60 s; answered 429 + Retry-After).
    /// 0 never blocks.
    pub login_failures_before_block: u32,
    /// The cluster secret, shared by every node of a cluster and by any node restored from its
    /// archive: the archive's catalog snapshot (users with their password hashes and grants,
    /// topics, fan-out links) is sealed under a key derived from it, and the Raft cluster will
    /// authenticate nodes to each other with it. At least 32 bytes (e.g. the output of
    /// `openssl rand -base64 48`). Empty: snapshots are unsealed and hold no users, so a restore
    /// after a disk loss brings back topics and links but not users. Never logged or shown;
    /// prefer `cluster_secret_file` (a secret in the environment or a config file is easier
    /// to leak).
    pub cluster_secret: Secret,
    /// A file (keep it 0600) whose content is the cluster secret; one trailing newline is
    /// ignored. Not together with `cluster_secret`.
    pub cluster_secret_file: String,
    /// During a rotation, the secret `cluster_secret` replaces: snapshots sealed under it
    /// still open in a restore, new ones are sealed under `cluster_secret` only. Drop it once
    /// a snapshot under the new secret was uploaded (`narad_archive_catalog_uploads_total`).
    pub cluster_secret_previous: Secret,
    /// A file holding `cluster_secret_previous`. A file that does not exist (the previous
    /// secret was removed once the rotation was done) is logged and ignored.
    pub cluster_secret_previous_file: String,
    /// A file (keep it 0600) holding the root user's first password, instead of the
    /// `NARAD_ADMIN_PASSWORD` environment variable (one trailing newline is ignored). Read
    /// only while the root user does not exist yet.
    pub admin_password_file: String,
    /// This node's id in its cluster: 1 or more, never reused for another node (a node that
    /// lost its disk comes back under a new id). 0 with no `cluster_members`: a single node.
    pub node_id: u64,
    /// Where the cluster endpoint listens (UDP; node-to-node calls over QUIC, Raft included),
    /// e.g. `0.0.0.0:7100`. Required with `cluster_members`.
    pub cluster_addr: String,
    /// The address other nodes reach this one at (`host:port`, a DNS name is fine). Empty:
    /// `cluster_addr`, which must then name a specific address (not `0.0.0.0`).
    pub cluster_advertise: String,
    /// The cluster's initial voters, `ID@HOST:PORT,...` (their advertised addresses). Every
    /// listed node forms the cluster with the others on first start; a node not listed joins
    /// it through them. Empty: no cluster (a single node, as `server start --dev` runs).
    pub cluster_members: String,
    /// PEM certificate chain and private key: when both are set the API listener speaks
    /// HTTPS only. The files are re-read on SIGHUP and when they change.
    pub tls_cert_file: String,
    pub tls_key_file: String,
    /// Where partition logs, queue state and topic metadata live.
    pub data_dir: PathBuf,
    /// `text` (human) or `json` (one object per line, for log shippers).
    pub log_format: LogFormat,
    /// `tracing` filter, e.g. `info` or `narad_core=debug,info`.
    pub log_level: String,

    /// Seal a segment at this size. Larger segments mean fewer files; retention and tiering
    /// work in whole segments, so they also mean coarser deletion.
    pub segment_max_bytes: u64,
    /// Seal a segment this long after its first record, so quiet partitions seal too.
    pub segment_max_age_ms: i64,
    /// Memory for the newest records kept decoded, so fresh reads skip the disk: one budget
    /// for the whole node, shared by every open partition (each evicts its own oldest records
    /// when the node is over it). 0 turns the cache off; reads then always use the page cache.
    pub tail_cache_bytes: usize,
    /// Close a partition's files after this long unused; reopening costs a scan of its active
    /// segment.
    pub idle_close_ms: i64,
    /// How often acked state is persisted. A crash redelivers acks younger than this;
    /// shorter means more small fsyncs.
    pub ack_flush_interval_ms: u64,
    /// How often a remote child sends its parent's consumer progress at most (a mirror's
    /// queue follows the source's within this); 0: never (a failover then delivers again
    /// everything the source's consumers processed, and an idle old primary learns it was
    /// fenced only on its next produce).
    pub mirror_progress_interval_ms: u64,
    /// Most MiB of records remote children's cursors hold at once on this node (4 MiB
    /// slabs: each cursor holds one at most while it ships, and waits its turn for one).
    pub remote_memory_mib: u64,
    /// How often retention runs.
    pub retention_interval_ms: u64,
    /// Bound on out-of-order acked ranges per partition; beyond it acks answer 503 (retry).
    pub max_ack_ranges: usize,

    /// Most topics on the node; a create beyond it answers `409 too_many_topics`, for the
    /// root too. Each topic costs a directory, a metadata entry (`topics.json` is rewritten
    /// whole on every change, so it also slows creates and deletes) and its partitions.
    pub max_topics: usize,
    /// Most partitions summed over every topic; a create or a partition increase beyond it
    /// answers `409 too_many_partitions`. Each partition costs memory (queue state, a tail
    /// cache of up to `tail_cache_bytes` once written) and, while open, file descriptors.
    pub max_partitions: u64,
    /// Most topics one user may own (the topics it created); beyond it its creates answer
    /// `409 too_many_owned_topics`. Admins are exempt. Keeps one `create` grant from taking
    /// the whole of `max_topics` from everyone else. 0: no per-user bound.
    pub max_topics_per_user: usize,
    /// Most partition logs open at once. Each open log holds one file descriptor per segment
    /// plus one for writing; past the bound the least recently used idle logs are closed
    /// (reopening costs a scan of the active segment), and with none idle a request that
    /// needs one more answers `503 too_many_open_logs` with `Retry-After`; a produce batch
    /// that spans more partitions than this can never be written whole and answers
    /// `400 invalid_batch`. 0 (default):
    /// sized at start from the file-descriptor limit (RLIMIT_NOFILE, whose soft value the
    /// server first raises to the hard one) after `max_connections` and a reserve, at most
    /// 65536. A value that cannot fit in the limit (2 descriptors a log) refuses to start.
    pub max_open_logs: usize,

    /// Longest `wait` a consume may ask for (at most 20 s).
    pub max_wait_ms: u64,
    /// Most messages in one batch produce.
    pub max_batch_messages: usize,
    /// Largest batch produce body (before and after decompression).
    pub max_batch_bytes: usize,
    /// Request body bytes the whole node holds at once (read, and inflated by
    /// decompression), over every request being served. A request that would take more is
    /// answered `503 server_busy` with `Retry-After: 1` (up front when its `Content-Length`
    /// does not fit). Bounds memory under many concurrent large batches; at least
    /// `2 × max_batch_bytes` so one compressed batch always fits.
    pub max_request_bytes_in_flight: usize,
    /// Longest a request's body may take to arrive, from the start of the request: a client
    /// that sends its body slowly or stops is answered `408 body_timeout` and costs no more
    /// than this (its connection slot and body budget come back). Allow for the largest batch
    /// over the slowest link you serve.
    pub body_read_timeout_ms: u64,
    /// Slowest a request's body may arrive, on average, after `body_grace_ms`: a body must
    /// have `(elapsed − grace) × rate` bytes in by any time, else it is answered
    /// `408 body_timeout`. Bounds how long a client that sends its body slowly or not at all
    /// holds its connection slot and what it sent of the body budget (one that stops is cut
    /// at the grace; one that trickles pays for the time in bytes). 0: only
    /// `body_read_timeout_ms` applies. The default, 128 KiB/s, is 1 Mbit/s.
    pub body_min_bytes_per_s: u64,
    /// Time a request's body may take before `body_min_bytes_per_s` starts to count, from
    /// when the server starts reading it (when a produce checks that its announced length fits
    /// in the budget).
    pub body_grace_ms: u64,
    /// Client connections served at once. One more takes the place of the keep-alive
    /// connection idle the longest (closed); with none idle it is answered
    /// `503 too_many_connections` with `Retry-After: 1` and closed. Keep it below the
    /// process's file-descriptor limit.
    pub max_connections: usize,
    /// Longest a client may take to send a request's header block: from accept (after the
    /// TLS handshake) or, on a keep-alive connection, from the first byte of the request.
    /// Then the connection is closed without an answer. Shorter frees the slots of silent
    /// and slow clients sooner, but cuts clients on very slow links; a request body and the
    /// response (a long-poll) are not bounded by it.
    pub header_read_timeout_ms: u64,
    /// A keep-alive connection with no request in progress is closed after this long. Longer
    /// saves clients new connections (and TLS handshakes) but holds a slot and a file
    /// descriptor per idle client; at `max_connections` idle ones are closed for new clients
    /// anyway. Keep it above the idle timeout of clients' connection pools where you can,
    /// so a pooled request never races the close.
    pub keepalive_idle_timeout_ms: u64,
    /// A response the client does not read: once the socket takes no more bytes, the
    /// connection is closed if it stays that way this long, so a client that never reads
    /// (its response may be several MiB) costs a bounded time and memory. Allow for your
    /// slowest readers; a long-poll that is still waiting is not writing, so never cut.
    pub response_write_timeout_ms: u64,
    /// How long a reader may take none of its reply before that reply counts as stalled: a
    /// reply that finds `max_request_bytes_in_flight` full closes the connection stalled
    /// longest (at least this long) and takes the room its reply held, instead of `503`.
    /// What counts is whether the writer could hand the socket more: the kernel may hold
    /// megabytes of a response, so a reader that drains it very slowly (a review cut one
    /// taking 20 KB/s through an 8 KiB receive buffer; none at 82-328 KB/s with the usual
    /// buffers) can look stalled too, and is closed only while the budget is full.
    pub reply_stall_ms: u64,
    /// How long a graceful shutdown waits for in-flight requests.
    pub shutdown_grace_ms: u64,

    /// Where sealed segments are archived as Parquet: `file:///abs/dir`, `s3://bucket/prefix`
    /// or `memory://` (tests). Empty or `off`: no archive (`server start --dev` turns empty
    /// into `file://<data_dir>/archive`; `off` opts out). With an archive, local retention deletes only segments
    /// the archive has verified.
    pub archive_url: String,
    /// S3 endpoint (e.g. `http://127.0.0.1:5055`); empty: `AWS_ENDPOINT_URL` or AWS.
    pub archive_endpoint: String,
    /// S3 region; empty: `AWS_REGION` / `AWS_DEFAULT_REGION`.
    pub archive_region: String,
    /// Allow a plain-HTTP endpoint (loopback test servers); also `AWS_ALLOW_HTTP=true`.
    pub archive_allow_http: bool,
    /// The account id the SQS endpoint's queue URLs and ARNs name (12 digits). Clients keep
    /// it in queue URLs; it grants nothing (access is Narad's users and grants).
    pub sqs_account_id: String,
    /// The region the SQS endpoint's ARNs name. Clients sign requests for a region; any
    /// region's signature is checked, this one is what queue ARNs say.
    pub sqs_region: String,
    /// Archive objects whose newest record is older than this are deleted; 0 keeps forever.
    pub archive_retention_ms: i64,
    /// Local segments older than this are deleted once archived (0: only the topic's
    /// `retention_ms`/`retention_bytes` apply). Without an archive it has no effect.
    pub local_retention_ms: i64,
    /// How often the tiering loop looks for newly sealed segments.
    pub tiering_interval_ms: u64,
    /// Partitions uploaded at the same time.
    pub tiering_concurrency: usize,

    /// Ports a remote's URL may name (comma-separated); every node dials remotes from inside
    /// the cluster's network, so this and the next three keep a remote from pointing at an
    /// internal service.
    pub remotes_allowed_ports: String,
    /// Hosts a remote's URL may name (comma-separated; exact names, or `*.suffix` for any
    /// name below it). Empty: any host.
    pub remotes_allowed_hosts: String,
    /// Addresses (CIDR, comma-separated) a remote may resolve to although the guard refuses
    /// their class (loopback, link-local, metadata, ...); tests list `127.0.0.0/8`.
    pub remotes_allow_addresses: String,
    /// Refuse private-use and shared addresses (10/8, 172.16/12, 192.168/16, 100.64/10,
    /// fc00::/7) too: for clusters whose remotes are only on the public internet.
    pub remotes_refuse_private: bool,

    /// A partition move's freeze (its source takes no appends while the last bytes are
    /// copied) lapses this long after its mover last renewed it; the source then thaws
    /// through the cluster. The mover renews it every quarter of this.
    pub move_freeze_ttl_ms: u64,
    /// Bytes per second one member copies in for moves, all moves together (0: no limit):
    /// keeps moves from crowding out produce and consume traffic on the same disks and links.
    pub move_max_bytes_per_sec: u64,
    /// Moves in flight in the whole cluster, at most (the planner's budget; moves asked for
    /// by hand are not held back).
    pub moves_max_in_flight: usize,
    /// Whether the leader moves partitions by itself: onto members that join (a fair
    /// share), and off members being decommissioned.
    pub cluster_auto_rebalance: bool,
    /// A move whose target member has not answered for this long is cancelled (its
    /// source never froze for long: a freeze lapses on its own).
    pub move_dead_target_abort_ms: u64,

    /// Defaults for topics created without these fields.
    pub default_partitions: u32,
    pub default_visibility_timeout_ms: i64,
    pub default_retention_ms: i64,
    pub default_retention_bytes: u64,
    pub default_max_in_flight_per_partition: u32,
    pub default_delay_ms: i64,
    pub default_max_message_bytes: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        let log = LogConfig::default();
        let topic = TopicConfig::default();
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 7942)),
            security_enabled: true,
            metrics_addr: String::new(),
            ignored_env: Vec::new(),
            login_failures_before_block: narad_auth::authn::DEFAULT_FREE_FAILURES,
            cluster_secret: Secret::default(),
            cluster_secret_file: String::new(),
            cluster_secret_previous: Secret::default(),
            cluster_secret_previous_file: String::new(),
            admin_password_file: String::new(),
            node_id: 0,
            cluster_addr: String::new(),
            cluster_advertise: String::new(),
            cluster_members: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            data_dir: PathBuf::from("data"),
            log_format: LogFormat::Json,
            log_level: "info".into(),
            segment_max_bytes: log.segment_max_bytes,
            segment_max_age_ms: log.segment_max_age_ms,
            tail_cache_bytes: log.tail_cache.limit(),
            idle_close_ms: 10 * 60 * 1000,
            ack_flush_interval_ms: 100,
            mirror_progress_interval_ms: 1000,
            remote_memory_mib: 256,
            retention_interval_ms: 30_000,
            max_ack_ranges: 65_536,
            max_topics: 10_000,
            max_partitions: 100_000,
            max_topics_per_user: 1_000,
            max_open_logs: 0,
            max_wait_ms: MAX_WAIT_MS_LIMIT,
            max_batch_messages: 1000,
            max_batch_bytes: 16 * 1024 * 1024,
            max_request_bytes_in_flight: 256 * 1024 * 1024,
            body_read_timeout_ms: 60_000,
            body_min_bytes_per_s: 128 * 1024,
            body_grace_ms: 5_000,
            shutdown_grace_ms: 10_000,
            max_connections: 10_000,
            header_read_timeout_ms: 10_000,
            keepalive_idle_timeout_ms: 60_000,
            response_write_timeout_ms: 60_000,
            reply_stall_ms: 1_000,
            archive_url: String::new(),
            archive_endpoint: String::new(),
            archive_region: String::new(),
            archive_allow_http: false,
            sqs_account_id: "000000000000".into(),
            sqs_region: "us-east-1".into(),
            archive_retention_ms: 0,
            local_retention_ms: 0,
            tiering_interval_ms: 1000,
            tiering_concurrency: 2,
            remotes_allowed_ports: "443".into(),
            remotes_allowed_hosts: String::new(),
            remotes_allow_addresses: String::new(),
            remotes_refuse_private: false,
            move_freeze_ttl_ms: 30_000,
            move_max_bytes_per_sec: 0,
            moves_max_in_flight: 8,
            cluster_auto_rebalance: true,
            move_dead_target_abort_ms: 120_000,
            default_partitions: topic.partitions,
            default_visibility_timeout_ms: topic.visibility_timeout_ms,
            default_retention_ms: topic.retention_ms,
            default_retention_bytes: topic.retention_bytes,
            default_max_in_flight_per_partition: topic.max_in_flight_per_partition,
            default_delay_ms: topic.delay_ms,
            default_max_message_bytes: topic.max_message_bytes,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("config key {key}: {message}")]
    Invalid { key: String, message: String },
    /// A value of the wrong type or out of its type's range (the message names the key).
    #[error("configuration: {message}")]
    Value { message: String },
}

impl ServerConfig {
    /// Defaults overlaid by `file` (if any), then by `NARAD_<KEY>` variables from `env`.
    pub fn load(
        file: Option<&std::path::Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table = toml::Table::try_from(Self::default()).expect("defaults serialise");
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let file_table: toml::Table =
                toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: path.to_owned(),
                    message: parse_message(&text, &e),
                })?;
            for (k, v) in file_table {
                if !table.contains_key(&k) {
                    return Err(ConfigError::Parse {
                        path: path.to_owned(),
                        message: format!("unknown key '{k}'"),
                    });
                }
                table.insert(k, v);
            }
        }
        let mut ignored = Vec::new();
        for (var, raw) in env {
            let Some(key) = var.strip_prefix("NARAD_") else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            let Some(current) = table.get(&key) else {
                // other NARAD_* variables belong to the CLI, the tools and the failpoints; the rest
                // is noted
                if !CLIENT_ENV.contains(&var.as_str())
                    && var != narad_core::failpoint::ENV
                    && !var.starts_with("NARAD_TEST_")
                    && !var.starts_with("NARAD_REQUIRE_")
                {
                    ignored.push(var);
                }
                continue;
            };
            let value = match current {
                toml::Value::Integer(_) => raw
                    .trim()
                    .parse::<i64>()
                    .map(toml::Value::Integer)
                    .map_err(|e| ConfigError::Env {
                        var: var.clone(),
                        message: format!("expected an integer: {e}"),
                    })?,
                toml::Value::Boolean(_) => raw
                    .trim()
                    .parse::<bool>()
                    .map(toml::Value::Boolean)
                    .map_err(|e| ConfigError::Env {
                        var: var.clone(),
                        message: format!("expected true or false: {e}"),
                    })?,
                _ => toml::Value::String(raw),
            };
            table.insert(key, value);
        }
        let mut cfg: Self = table
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Value {
                // (toml ends its message with a line naming the key)
                message: e.to_string().trim().replace('\n', " "),
            })?;
        cfg.validate()?;
        ignored.sort();
        cfg.ignored_env = ignored;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                key: key.into(),
                message: message.into(),
            })
        };
        if self.segment_max_bytes < 4096 {
            return bad("segment_max_bytes", "must be at least 4096");
        }
        if self.segment_max_age_ms < 1000 {
            return bad("segment_max_age_ms", "must be at least 1000");
        }
        if self.idle_close_ms < 1000 {
            return bad("idle_close_ms", "must be at least 1000");
        }
        if !(1..=60_000).contains(&self.ack_flush_interval_ms) {
            return bad("ack_flush_interval_ms", "must be between 1 and 60000");
        }
        if self.mirror_progress_interval_ms > 60_000 {
            return bad("mirror_progress_interval_ms", "must be between 0 and 60000");
        }
        if !(4..=65_536).contains(&self.remote_memory_mib) {
            return bad("remote_memory_mib", "must be between 4 and 65536");
        }
        if self.retention_interval_ms < 10 {
            return bad("retention_interval_ms", "must be at least 10");
        }
        if self.max_ack_ranges < 16 {
            return bad("max_ack_ranges", "must be at least 16");
        }
        if !(1..=1_000_000).contains(&self.max_topics) {
            return bad("max_topics", "must be between 1 and 1000000");
        }
        if !(1..=10_000_000).contains(&self.max_partitions) {
            return bad("max_partitions", "must be between 1 and 10000000");
        }
        if self.max_topics_per_user > self.max_topics {
            return bad(
                "max_topics_per_user",
                "must be at most max_topics (0: no per-user bound)",
            );
        }
        if self.max_open_logs != 0 && !(16..=1_000_000).contains(&self.max_open_logs) {
            return bad(
                "max_open_logs",
                "must be 0 (sized from the file-descriptor limit) or between 16 and 1000000",
            );
        }
        if self.max_wait_ms > MAX_WAIT_MS_LIMIT {
            return bad("max_wait_ms", "must be at most 20000");
        }
        if !(1..=10_000).contains(&self.max_batch_messages) {
            return bad("max_batch_messages", "must be between 1 and 10000");
        }
        if !(1024..=256 * 1024 * 1024).contains(&self.max_batch_bytes) {
            return bad("max_batch_bytes", "must be between 1 KiB and 256 MiB");
        }
        if !(100..=3_600_000).contains(&self.body_read_timeout_ms) {
            return bad("body_read_timeout_ms", "must be between 100 and 3600000");
        }
        if self.body_min_bytes_per_s > 1 << 30 {
            return bad(
                "body_min_bytes_per_s",
                "must be at most 1073741824 (0: off)",
            );
        }
        if self.sqs_account_id.len() != 12
            || !self.sqs_account_id.bytes().all(|b| b.is_ascii_digit())
        {
            return bad("sqs_account_id", "must be 12 digits");
        }
        if self.sqs_region.is_empty()
            || self.sqs_region.len() > 32
            || !self
                .sqs_region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return bad("sqs_region", "must be 1 to 32 of a-z, 0-9 and '-'");
        }
        if !(100..=3_600_000).contains(&self.body_grace_ms) {
            return bad("body_grace_ms", "must be between 100 and 3600000");
        }
        let floor = 2 * self.largest_body();
        if !(floor..=1 << 40).contains(&self.max_request_bytes_in_flight) {
            return bad(
                "max_request_bytes_in_flight",
                "must be at least 2 × max(max_batch_bytes, 8 MiB) (and at most 1 TiB)",
            );
        }
        let url = self.archive_url.trim();
        if !(url.is_empty()
            || url == "off"
            || url.starts_with("s3://")
            || url.starts_with("file:///")
            || url.starts_with("memory://"))
        {
            return bad(
                "archive_url",
                "must be empty, off, s3://bucket/prefix, file:///absolute/dir or memory://",
            );
        }
        if self.archive_retention_ms < 0 || self.local_retention_ms < 0 {
            return bad(
                "archive_retention_ms",
                "retentions must be >= 0 (0 = keep forever)",
            );
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return bad("max_connections", "must be between 1 and 1000000");
        }
        if !(100..=300_000).contains(&self.header_read_timeout_ms) {
            return bad(
                "header_read_timeout_ms",
                "must be between 100 and 300000 (5 min)",
            );
        }
        if !(100..=3_600_000).contains(&self.response_write_timeout_ms) {
            return bad(
                "response_write_timeout_ms",
                "must be between 100 and 3600000 (1 h)",
            );
        }
        if !(100..=3_600_000).contains(&self.reply_stall_ms) {
            return bad("reply_stall_ms", "must be between 100 and 3600000 (1 h)");
        }
        if !(100..=3_600_000).contains(&self.keepalive_idle_timeout_ms) {
            return bad(
                "keepalive_idle_timeout_ms",
                "must be between 100 and 3600000 (1 h)",
            );
        }
        if !self.metrics_addr.trim().is_empty()
            && self.metrics_addr.trim().parse::<SocketAddr>().is_err()
        {
            return bad(
                "metrics_addr",
                "must be empty or an address like 127.0.0.1:9090",
            );
        }
        if self.tls_cert_file.trim().is_empty() != self.tls_key_file.trim().is_empty() {
            return bad(
                "tls_cert_file",
                "tls_cert_file and tls_key_file must be set together",
            );
        }
        self.cluster_secrets()?;
        self.cluster()?;
        if self.tiering_interval_ms < 10 {
            return bad("tiering_interval_ms", "must be at least 10");
        }
        if !(1..=64).contains(&self.tiering_concurrency) {
            return bad("tiering_concurrency", "must be between 1 and 64");
        }
        self.remote_guard()?;
        if !(1_000..=120_000).contains(&self.move_freeze_ttl_ms) {
            return bad("move_freeze_ttl_ms", "must be between 1000 and 120000");
        }
        if !(1..=64).contains(&self.moves_max_in_flight) {
            return bad("moves_max_in_flight", "must be between 1 and 64");
        }
        if self.move_dead_target_abort_ms < 1_000 {
            return bad("move_dead_target_abort_ms", "must be at least 1000");
        }
        self.topic_defaults()
            .validate()
            .map_err(|e| ConfigError::Invalid {
                key: format!("default_{}", e.field),
                message: e.reason,
            })
    }

    pub fn topic_defaults(&self) -> TopicConfig {
        TopicConfig {
            partitions: self.default_partitions,
            visibility_timeout_ms: self.default_visibility_timeout_ms,
            retention_ms: self.default_retention_ms,
            retention_bytes: self.default_retention_bytes,
            max_in_flight_per_partition: self.default_max_in_flight_per_partition,
            delay_ms: self.default_delay_ms,
            max_message_bytes: self.default_max_message_bytes,
            key_policy: narad_core::topic::KeyPolicy::Prefer,
        }
    }

    /// The largest body a route reads: a batch's `max_batch_bytes`, or a single message's
    /// route limit.
    fn largest_body(&self) -> usize {
        self.max_batch_bytes.max(MAX_BODY_LIMIT)
    }

    /// Most request and reply bytes one user holds at once (security on): a quarter of
    /// `max_request_bytes_in_flight`, and at least one largest body.
    pub fn max_request_bytes_per_user(&self) -> usize {
        (self.max_request_bytes_in_flight / 4).max(self.largest_body())
    }

    /// Most of the body budget replies may hold at once: all of it but one largest request
    /// body, so readers that leave their replies unread cannot refuse every produce (a
    /// larger reply is still served when no other reply holds any of the share).
    pub fn max_reply_bytes_in_flight(&self) -> usize {
        self.max_request_bytes_in_flight
            .saturating_sub(self.largest_body())
            .max(1)
    }

    pub fn connection_timeouts(&self) -> Timeouts {
        Timeouts {
            header_read: Duration::from_millis(self.header_read_timeout_ms),
            keepalive_idle: Duration::from_millis(self.keepalive_idle_timeout_ms),
            write_stall: Duration::from_millis(self.response_write_timeout_ms),
        }
    }

    /// How long a reader may take none of its reply before a reply without room may close
    /// its connection (`reply_stall_ms`).
    pub fn reply_stall(&self) -> Duration {
        Duration::from_millis(self.reply_stall_ms)
    }

    /// The broker's settings; `max_open_logs` is the resolved value (see
    /// [`crate::fdlimit::plan`]), never 0.
    pub fn broker_config(&self, max_open_logs: usize) -> BrokerConfig {
        BrokerConfig {
            data_dir: self.data_dir.clone(),
            log: LogConfig {
                segment_max_bytes: self.segment_max_bytes,
                segment_max_age_ms: self.segment_max_age_ms,
                tail_cache: narad_core::log::TailBudget::new(self.tail_cache_bytes),
                wal: None,
            },
            topic_defaults: self.topic_defaults(),
            idle_close_ms: self.idle_close_ms,
            ack_flush_interval_ms: self.ack_flush_interval_ms,
            mirror_progress_interval_ms: self.mirror_progress_interval_ms,
            remote_memory_bytes: (self.remote_memory_mib as usize) << 20,
            retention_interval_ms: self.retention_interval_ms,
            max_ack_ranges: self.max_ack_ranges,
            archive_gate: self.archive_settings().is_some(),
            local_retention_ms: self.local_retention_ms,
            limits: narad_core::broker::Limits {
                max_topics: self.max_topics,
                max_partitions: self.max_partitions,
                max_topics_per_user: self.max_topics_per_user,
                max_open_logs,
            },
        }
    }

    /// The address guard remotes are checked and dialled with.
    pub fn remote_guard(&self) -> Result<narad_xregion::guard::GuardConfig, ConfigError> {
        let bad = |key: &str, message: String| ConfigError::Invalid {
            key: key.into(),
            message,
        };
        let items = |s: &str| {
            s.split(',')
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let allowed_ports = items(&self.remotes_allowed_ports)
            .iter()
            .map(|p| match p.parse::<u16>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(bad(
                    "remotes_allowed_ports",
                    format!("'{p}' is not a port (1..=65535)"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if allowed_ports.is_empty() {
            return Err(bad(
                "remotes_allowed_ports",
                "must list at least one port (443 by default)".into(),
            ));
        }
        let allowed_hosts = items(&self.remotes_allowed_hosts)
            .into_iter()
            .map(|h| h.to_ascii_lowercase())
            .collect::<Vec<_>>();
        if let Some(h) = allowed_hosts.iter().find(|h| {
            let name = h.strip_prefix("*.").unwrap_or(h);
            name.is_empty()
                || name.contains('*')
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':'))
        }) {
            return Err(bad(
                "remotes_allowed_hosts",
                format!("'{h}' is not a host name or a *.suffix pattern"),
            ));
        }
        let allow_addresses = items(&self.remotes_allow_addresses)
            .iter()
            .map(|c| {
                c.parse::<narad_xregion::guard::Cidr>()
                    .map_err(|e| bad("remotes_allow_addresses", e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(narad_xregion::guard::GuardConfig {
            allowed_ports,
            allowed_hosts,
            allow_addresses,
            refuse_private: self.remotes_refuse_private,
        })
    }

    /// How this member moves partitions.
    pub fn move_settings(&self) -> MoveSettings {
        MoveSettings {
            freeze_ttl: Duration::from_millis(self.move_freeze_ttl_ms),
            max_bytes_per_sec: self.move_max_bytes_per_sec,
            max_in_flight: self.moves_max_in_flight,
            auto_rebalance: self.cluster_auto_rebalance,
            dead_target_abort: Duration::from_millis(self.move_dead_target_abort_ms),
        }
    }

    /// The cluster secrets (reading their files), or `None` when no `cluster_secret` is set.
    pub fn cluster_secrets(&self) -> Result<Option<ClusterSecrets>, ConfigError> {
        let current = read_secret(
            "cluster_secret",
            &self.cluster_secret,
            &self.cluster_secret_file,
        )?;
        // (a rotation's last step removes the previous secret's file: that is no reason not
        // to start)
        let previous_file = self.cluster_secret_previous_file.trim();
        let previous_gone = !previous_file.is_empty()
            && std::fs::symlink_metadata(previous_file)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
        if previous_gone {
            tracing::warn!(
                file = previous_file,
                "cluster_secret_previous_file names no file: starting with cluster_secret alone (what was sealed under the previous secret only does not open; unset the key once a rotation is done)"
            );
        }
        let previous = read_secret(
            "cluster_secret_previous",
            &self.cluster_secret_previous,
            if previous_gone { "" } else { previous_file },
        )?;
        match (current, previous) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(ConfigError::Invalid {
                key: "cluster_secret_previous".into(),
                message: "needs cluster_secret (the secret that replaces it)".into(),
            }),
            (Some(current), previous) => Ok(Some(ClusterSecrets { current, previous })),
        }
    }

    /// The cluster this node belongs to, or `None` for a single node (no `cluster_members`).
    pub fn cluster(&self) -> Result<Option<ClusterSettings>, ConfigError> {
        let bad = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: key.into(),
                message,
            })
        };
        let members = self.cluster_members.trim();
        if members.is_empty() {
            if self.node_id != 0 || !self.cluster_addr.trim().is_empty() {
                return bad(
                    "cluster_members",
                    "node_id and cluster_addr need cluster_members (the initial voters, ID@HOST:PORT,...)".into(),
                );
            }
            return Ok(None);
        }
        let members = match narad_cluster::members::parse_members(members) {
            Ok(m) if !m.is_empty() => m,
            Ok(_) => return bad("cluster_members", "names no node".into()),
            Err(e) => return bad("cluster_members", e),
        };
        if self.node_id == 0 {
            return bad(
                "node_id",
                "a cluster member needs a node_id of 1 or more".into(),
            );
        }
        let bind: SocketAddr = match self.cluster_addr.trim().parse() {
            Ok(a) => a,
            Err(_) => {
                return bad(
                    "cluster_addr",
                    "must be an address to listen on, like 0.0.0.0:7100".into(),
                );
            }
        };
        let advertise = match self.cluster_advertise.trim() {
            "" if bind.ip().is_unspecified() => {
                return bad(
                    "cluster_advertise",
                    format!(
                        "cluster_addr {bind} is not an address other nodes can reach: set cluster_advertise to this node's host:port"
                    ),
                );
            }
            "" => match narad_cluster::members::parse_addr(&bind.to_string()) {
                Ok(a) => a,
                Err(e) => return bad("cluster_addr", e),
            },
            a => match narad_cluster::members::parse_addr(a) {
                Ok(a) => a,
                Err(e) => return bad("cluster_advertise", e),
            },
        };
        if let Some(me) = members.iter().find(|m| m.id == self.node_id)
            && me.addr != advertise
        {
            return bad(
                "cluster_members",
                format!(
                    "lists node {} at {}, but this node advertises {advertise}",
                    me.id, me.addr
                ),
            );
        }
        if members
            .iter()
            .any(|m| m.id != self.node_id && m.addr == advertise)
        {
            return bad(
                "cluster_members",
                format!("another node is listed at this node's address {advertise}"),
            );
        }
        let Some(secrets) = self.cluster_secrets()? else {
            return bad(
                "cluster_secret",
                "a cluster needs a cluster_secret (nodes prove it to each other)".into(),
            );
        };
        Ok(Some(ClusterSettings {
            node_id: self.node_id,
            bind,
            advertise,
            members,
            secrets,
        }))
    }

    /// The archive settings, if an archive is configured.
    pub fn archive_settings(&self) -> Option<narad_tiering::archive::ArchiveSettings> {
        let url = self.archive_url.trim();
        if url.is_empty() || url == "off" {
            return None;
        }
        let opt = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        Some(narad_tiering::archive::ArchiveSettings {
            url: url.to_owned(),
            endpoint: opt(&self.archive_endpoint),
            region: opt(&self.archive_region),
            allow_http: self.archive_allow_http.then_some(true),
            ..Default::default()
        })
    }
}

// ── sections: the typed settings each component is handed (config imports none of them) ──

/// The largest body a single-message route reads: one message at the largest size a
/// topic may allow.
pub const MAX_BODY_LIMIT: usize = narad_core::topic::MAX_MESSAGE_BYTES_LIMIT as usize;

/// The two connection timeouts (see [`ServerConfig`]).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// From accept (after the TLS handshake), or from the first byte of a later request on a
    /// keep-alive connection, until its whole header block is read.
    pub header_read: Duration,
    /// From the end of a response until the first byte of the next request.
    pub keepalive_idle: Duration,
    /// How long a write may stay blocked (the client reads nothing) before the connection
    /// is closed.
    pub write_stall: Duration,
}

/// How this member moves partitions (configuration keys `move_*`).
#[derive(Debug, Clone)]
pub struct MoveSettings {
    pub freeze_ttl: Duration,
    /// 0: no limit.
    pub max_bytes_per_sec: u64,
    /// The planner's budget of moves in flight in the cluster.
    pub max_in_flight: usize,
    pub auto_rebalance: bool,
    pub dead_target_abort: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        ServerConfig::default().validate().unwrap();
        ServerConfig::load(None, Vec::new()).unwrap();
    }

    #[test]
    fn file_then_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("narad.toml");
        std::fs::write(&path, "data_dir = \"/tmp/x\"\ndefault_partitions = 5\n").unwrap();
        let cfg = ServerConfig::load(
            Some(&path),
            vec![
                ("NARAD_DEFAULT_PARTITIONS".into(), "7".into()),
                ("NARAD_ADDR".into(), "ignored by the server".into()),
                ("HOME".into(), "/root".into()),
                ("NARAD_HTTP_ADDR".into(), ":7942".into()),
                ("NARAD_ADMIN_PASSWORD".into(), "read by the server".into()),
                ("NARAD_TOPIC_DEFAULT_PARTITIONS".into(), "6".into()),
            ],
        )
        .unwrap();
        assert_eq!(cfg.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(cfg.default_partitions, 7);
        // the original Narad's names are no setting here: named, to be warned about at start
        assert_eq!(
            cfg.ignored_env,
            ["NARAD_HTTP_ADDR", "NARAD_TOPIC_DEFAULT_PARTITIONS"]
        );
    }

    #[test]
    fn unknown_and_invalid_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("narad.toml");
        std::fs::write(&path, "segment_bytes = 5\n").unwrap();
        let e = ServerConfig::load(Some(&path), Vec::new()).unwrap_err();
        assert!(e.to_string().contains("segment_bytes"), "{e}");
        let e =
            ServerConfig::load(None, vec![("NARAD_MAX_WAIT_MS".into(), "x".into())]).unwrap_err();
        assert!(e.to_string().contains("NARAD_MAX_WAIT_MS"), "{e}");
        let e = ServerConfig::load(None, vec![("NARAD_DEFAULT_PARTITIONS".into(), "0".into())])
            .unwrap_err();
        assert!(e.to_string().contains("default_partitions"), "{e}");
        // a value its type cannot hold: one line that names the key
        let e = ServerConfig::load(None, vec![("NARAD_BODY_GRACE_MS".into(), "-1".into())])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`body_grace_ms`") && !e.contains('\n'), "{e}");
        let e = ServerConfig::load(
            None,
            vec![("NARAD_HEADER_READ_TIMEOUT_MS".into(), "0".into())],
        )
        .unwrap_err();
        assert!(e.to_string().contains("header_read_timeout_ms"), "{e}");
        let e = ServerConfig::load(
            None,
            vec![("NARAD_KEEPALIVE_IDLE_TIMEOUT_MS".into(), "50".into())],
        )
        .unwrap_err();
        assert!(e.to_string().contains("keepalive_idle_timeout_ms"), "{e}");
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn cluster_secret_from_env_or_file_is_checked_and_never_shown() {
        let env = |pairs: &[(&str, &str)]| {
            ServerConfig::load(
                None,
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        assert!(env(&[]).unwrap().cluster_secrets().unwrap().is_none());
        let cfg = env(&[("NARAD_CLUSTER_SECRET", SECRET)]).unwrap();
        let s = cfg.cluster_secrets().unwrap().unwrap();
        assert_eq!(s.current, SECRET.as_bytes());
        assert!(s.previous.is_none());
        // never in Debug output, nor in a serialised config
        for shown in [
            format!("{cfg:?}"),
            format!("{s:?}"),
            toml::to_string(&cfg).unwrap(),
        ] {
            assert!(!shown.contains("0123456789abcdef"), "{shown}");
        }
        // too short: refused at load, naming the key and not the value
        let short = &SECRET[..31];
        let e = env(&[("NARAD_CLUSTER_SECRET", short)]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("cluster_secret") && msg.contains("32 bytes"),
            "{msg}"
        );
        assert!(!msg.contains(short), "{msg}");
        let e = env(&[
            ("NARAD_CLUSTER_SECRET", SECRET),
            ("NARAD_CLUSTER_SECRET_PREVIOUS", "short"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("cluster_secret_previous"), "{e}");
        let e = env(&[("NARAD_CLUSTER_SECRET_PREVIOUS", SECRET)]).unwrap_err();
        assert!(e.to_string().contains("needs cluster_secret"), "{e}");
        // from a file: one trailing newline is not part of it
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, format!("{SECRET}\n")).unwrap();
        let path = file.display().to_string();
        let cfg = env(&[
            ("NARAD_CLUSTER_SECRET_FILE", &path),
            ("NARAD_CLUSTER_SECRET_PREVIOUS", &SECRET.replace('0', "z")),
        ])
        .unwrap();
        let s = cfg.cluster_secrets().unwrap().unwrap();
        assert_eq!(s.current, SECRET.as_bytes());
        assert_eq!(s.previous.unwrap(), SECRET.replace('0', "z").as_bytes());
        let e = env(&[
            ("NARAD_CLUSTER_SECRET_FILE", &path),
            ("NARAD_CLUSTER_SECRET", SECRET),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("not both"), "{e}");
        let e = env(&[("NARAD_CLUSTER_SECRET_FILE", "/nonexistent/secret")]).unwrap_err();
        assert!(e.to_string().contains("cluster_secret_file"), "{e}");
        std::fs::write(&file, "too short\n").unwrap();
        assert!(env(&[("NARAD_CLUSTER_SECRET_FILE", &path)]).is_err());
        // a syntax error on the secret's line does not quote it
        let toml_file = dir.path().join("narad.toml");
        std::fs::write(
            &toml_file,
            format!("data_dir = \"x\"\ncluster_secret = \"{SECRET}\n"),
        )
        .unwrap();
        let e = ServerConfig::load(Some(&toml_file), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && !e.contains("0123456789"), "{e}");
        std::fs::write(&toml_file, "data_dir = \"x\nsegment_max_bytes = 5\n").unwrap();
        let e = ServerConfig::load(Some(&toml_file), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("data_dir"),
            "other syntax errors still quote their line: {e}"
        );
    }

    #[test]
    fn cluster_settings_are_checked_and_say_what_is_wrong() {
        let env = |pairs: &[(&str, &str)]| {
            let mut all = vec![("NARAD_CLUSTER_SECRET".to_owned(), SECRET.to_owned())];
            all.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            ServerConfig::load(None, all)
        };
        let members = "1@10.0.0.1:7100,2@10.0.0.2:7100,3@10.0.0.3:7100";
        let ok = env(&[
            ("NARAD_NODE_ID", "2"),
            ("NARAD_CLUSTER_ADDR", "0.0.0.0:7100"),
            ("NARAD_CLUSTER_ADVERTISE", "10.0.0.2:7100"),
            ("NARAD_CLUSTER_MEMBERS", members),
        ])
        .unwrap();
        let c = ok.cluster().unwrap().unwrap();
        assert_eq!(
            (c.node_id, c.advertise.as_str(), c.members.len()),
            (2, "10.0.0.2:7100", 3)
        );
        assert!(c.is_initial_member());
        // a fourth node joins through the listed ones
        let c = env(&[
            ("NARAD_NODE_ID", "4"),
            ("NARAD_CLUSTER_ADDR", "10.0.0.4:7100"),
            ("NARAD_CLUSTER_MEMBERS", members),
        ])
        .unwrap()
        .cluster()
        .unwrap()
        .unwrap();
        assert!(!c.is_initial_member());
        assert_eq!(c.advertise, "10.0.0.4:7100");
        assert!(env(&[]).unwrap().cluster().unwrap().is_none());
        for (pairs, key, why) in [
            (
                vec![("NARAD_NODE_ID", "2")],
                "cluster_members",
                "need cluster_members",
            ),
            (
                vec![
                    ("NARAD_CLUSTER_MEMBERS", members),
                    ("NARAD_CLUSTER_ADDR", "0.0.0.0:7100"),
                ],
                "node_id",
                "node_id of 1",
            ),
            (
                vec![("NARAD_CLUSTER_MEMBERS", members), ("NARAD_NODE_ID", "2")],
                "cluster_addr",
                "address to listen on",
            ),
            (
                vec![
                    ("NARAD_CLUSTER_MEMBERS", members),
                    ("NARAD_NODE_ID", "2"),
                    ("NARAD_CLUSTER_ADDR", "0.0.0.0:7100"),
                ],
                "cluster_advertise",
                "set cluster_advertise",
            ),
            (
                vec![
                    ("NARAD_CLUSTER_MEMBERS", members),
                    ("NARAD_NODE_ID", "2"),
                    ("NARAD_CLUSTER_ADDR", "10.0.0.9:7100"),
                ],
                "cluster_members",
                "lists node 2 at 10.0.0.2:7100",
            ),
            (
                vec![
                    ("NARAD_CLUSTER_MEMBERS", members),
                    ("NARAD_NODE_ID", "5"),
                    ("NARAD_CLUSTER_ADDR", "10.0.0.1:7100"),
                ],
                "cluster_members",
                "another node is listed",
            ),
            (
                vec![
                    ("NARAD_CLUSTER_MEMBERS", members),
                    ("NARAD_NODE_ID", "4"),
                    ("NARAD_CLUSTER_ADDR", "127.0.0.1:0"),
                ],
                "cluster_addr",
                "not a port",
            ),
            (
                vec![
                    ("NARAD_CLUSTER_MEMBERS", "1@a:1,1@b:1"),
                    ("NARAD_NODE_ID", "1"),
                ],
                "cluster_members",
                "appears twice",
            ),
        ] {
            let e = env(&pairs).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(why), "{pairs:?}: {e}");
        }
        // no secret: refused
        let e = ServerConfig::load(
            None,
            vec![
                ("NARAD_NODE_ID".into(), "1".into()),
                ("NARAD_CLUSTER_ADDR".into(), "10.0.0.1:7100".into()),
                ("NARAD_CLUSTER_MEMBERS".into(), members.into()),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cluster_secret"), "{e}");
    }
}
