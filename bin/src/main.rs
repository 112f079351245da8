//! The `narad` binary: the broker server and a command-line client, both thin over the
//! libraries (`narad-infra` serves, `client` speaks the HTTP API).

/// mimalloc: the broker's hot paths allocate per message (records, tail cache entries, HTTP
/// buffers); glibc malloc cost about a fifth of the CPU of a batch produce.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A line to stdout for a command's output. A reader that stopped reading (`| head`) ends
/// the command quietly, as it ends other Unix tools, instead of a panic on the closed pipe
/// (`println!` panics).
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

mod client;
mod commands;
mod devcluster;
mod process;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// The heading of the options that only commands calling a broker use (`server start` and
/// `serve` take none of them).
const CLIENT: &str = "Client options (for commands that call a broker)";

#[derive(Parser)]
#[command(
    name = "narad",
    version,
    about = "Narad: a durable, replayable message queue"
)]
struct Cli {
    /// Broker address for client commands.
    #[arg(
        short = 's',
        long,
        global = true,
        help_heading = CLIENT,
        env = "NARAD_ADDR",
        default_value = "http://127.0.0.1:7942"
    )]
    server: String,
    /// Username for client commands (HTTP Basic).
    #[arg(short = 'u', long, global = true,
        help_heading = CLIENT, env = "NARAD_USER")]
    user: Option<String>,
    /// Password for client commands (also read from NARAD_PASS).
    #[arg(
        short = 'p',
        long,
        global = true,
        help_heading = CLIENT,
        env = "NARAD_PASSWORD",
        hide_env_values = true
    )]
    password: Option<String>,
    /// PEM file of a CA to trust for an https:// broker (besides the system roots).
    #[arg(long, global = true,
        help_heading = CLIENT, env = "NARAD_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// How commands print: `table` (for a person) or `json` (the server's JSON as is).
    #[arg(short = 'o', long, global = true,
        help_heading = CLIENT, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker (`server start --dev` for development: no config, no security).
    #[command(subcommand)]
    Server(ServerCmd),
    /// Run a broker for production (JSON logs, config file).
    Serve(ServeArgs),
    /// Manage topics.
    #[command(subcommand)]
    Topic(TopicCmd),
    /// Publish messages.
    Pub(PubArgs),
    /// Consume messages (acking them unless --no-ack), or tail with --peek.
    Sub(SubArgs),
    /// Read a partition's history without changing queue state.
    Replay(ReplayArgs),
    /// Manage users and their grants (needs an admin; `passwd` also works on yourself).
    #[command(subcommand)]
    User(UserCmd),
    /// The cluster as the node at --server sees it (needs an admin).
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Other clusters topics are mirrored to (needs an admin; the server needs security on
    /// and a cluster_secret, under which it seals each remote's password).
    #[command(subcommand)]
    Remote(RemoteCmd),
}

#[derive(Subcommand)]
enum RemoteCmd {
    /// Add a remote. Its user's password comes from --remote-password,
    /// NARAD_REMOTE_PASSWORD, or the first line of stdin.
    Add {
        /// The remote's name here (a topic's remote child names it).
        name: String,
        /// The other cluster's base URL (https://).
        #[arg(long)]
        url: String,
        /// The user this cluster acts as on the other one (give it produce on the target
        /// topics, not admin).
        #[arg(long = "remote-user")]
        remote_user: String,
        #[arg(long, env = "NARAD_REMOTE_PASSWORD", hide_env_values = true)]
        remote_password: Option<String>,
        /// PEM file of the CA the other cluster's certificate is checked against (alone);
        /// without it, the system's roots.
        #[arg(long = "remote-ca")]
        remote_ca: Option<PathBuf>,
        /// Carry this cluster's users (all but the root, with their password hashes and
        /// grants) to the remote. Its user must then be an admin there (the root user to
        /// carry admins too), and the remote carries nothing else: attach remote children
        /// through another remote.
        #[arg(long)]
        carry_users: bool,
    },
    /// List remotes.
    Ls,
    /// Show one remote.
    Show {
        /// The remote's name.
        name: String,
    },
    /// Change a remote's URL, user, CA or password, or whether it carries users. A new URL,
    /// user or CA takes the password again (--remote-password, NARAD_REMOTE_PASSWORD, or
    /// stdin).
    Edit {
        /// The remote's name.
        name: String,
        /// A new base URL (https://).
        #[arg(long)]
        url: Option<String>,
        #[arg(long = "remote-user")]
        remote_user: Option<String>,
        #[arg(long, env = "NARAD_REMOTE_PASSWORD", hide_env_values = true)]
        remote_password: Option<String>,
        /// Read the password from stdin (when it is the only change).
        #[arg(long)]
        password_stdin: bool,
        #[arg(long = "remote-ca", conflicts_with = "system_roots")]
        remote_ca: Option<PathBuf>,
        /// Check the remote against the system's roots again instead of a CA file.
        #[arg(long)]
        system_roots: bool,
        /// Turn the carrying of this cluster's users to the remote on or off.
        #[arg(long, value_name = "true|false")]
        carry_users: Option<bool>,
    },
    /// Check the remote from the node at --server: reachable, a Narad with security on, the
    /// credential works and is not an admin's, and (with --topic) the topic exists and takes
    /// produces; with --parent too, every check of the remote an attach of that local topic
    /// runs (the loop rule, its JSON Schema, whether the remote topic would become its
    /// mirror; this cluster's own rules, such as a free child name, are the attach's). Exits
    /// non-zero when a check fails.
    Test {
        /// The remote's name.
        name: String,
        /// The topic on the remote that records would be sent to.
        #[arg(long)]
        topic: Option<String>,
        /// The local topic that would be mirrored (needs --topic).
        #[arg(long, requires = "topic")]
        parent: Option<String>,
    },
    /// Delete a remote.
    Rm {
        /// The remote's name.
        name: String,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Leader, term, readiness and how far this node applied the metadata log.
    Status,
    /// The members: id, address, voter or not (and, asked of the leader, how far each
    /// member's log matches).
    Members,
    /// Remove a member for good (a node that is lost or retired). Refused for the leader
    /// and when fewer than three voters would be left.
    Remove {
        /// The member's node id.
        node_id: u64,
    },
    /// Seal every remote's password under the current cluster_secret (after a rotation,
    /// before cluster_secret_previous is dropped).
    ReencryptRemotes,
    /// Move a partition to another member (copied while it serves, then a brief freeze). It
    /// stays there: the planner does not move it back (`cluster unpin` gives it back).
    Move {
        /// The topic.
        topic: String,
        /// The partition of it to move.
        partition: u32,
        /// The member to move it to.
        #[arg(long)]
        to: u64,
    },
    /// Partition moves in flight (phase and bytes copied), and the partitions an admin
    /// placed by hand.
    Moves,
    /// Give a partition an admin moved back to the planner (it may move it to balance).
    Unpin {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
    },
    /// Cancel the move of a partition (a move that already flipped is done).
    MoveCancel {
        /// The topic.
        topic: String,
        /// The partition being moved.
        partition: u32,
    },
    /// A member lost for good (its disk with it): its partitions go to live members, rebuilt
    /// from the archive; what the archive did not hold is reported lost. Refused while it
    /// answers (decommission it instead).
    Forget {
        /// The lost member's node id.
        node_id: u64,
    },
    /// Ask the leader for a planning pass now: partitions move from the members with the
    /// most to those with the fewest (a member that joined gets its share).
    Rebalance,
    /// Drain a member (every partition moves away, no produce is refused), then remove it
    /// from the cluster. Refused below four voters (three are kept).
    Decommission {
        /// The member's node id.
        node_id: u64,
        /// Call a decommission off (partitions moved stay where they went).
        #[arg(long)]
        cancel: bool,
    },
}

#[derive(Subcommand)]
enum UserCmd {
    /// Create a user. The password comes from --new-password, NARAD_NEW_PASSWORD, or the
    /// first line of stdin.
    Add {
        /// The new user's name.
        name: String,
        /// ACTION:PATTERN[,PATTERN...] (actions: produce, consume, create, replicate) or
        /// `admin`; repeatable. Patterns are topic names or prefixes ending in `*`.
        #[arg(long = "grant")]
        grants: Vec<String>,
        /// The new user's password (else NARAD_NEW_PASSWORD, or asked for: typed twice,
        /// not shown; or the first line of stdin when it is not a terminal).
        #[arg(long, env = "NARAD_NEW_PASSWORD", hide_env_values = true)]
        new_password: Option<String>,
    },
    /// List users.
    Ls,
    /// Show one user.
    Show {
        /// The user's name.
        name: String,
    },
    /// Delete a user.
    Rm {
        /// The user's name.
        name: String,
    },
    /// Replace a user's grants with the given ones (none: no grants).
    Grant {
        /// The user's name.
        name: String,
        /// ACTION:PATTERN[,PATTERN...] or `admin`, as for `user add`; repeatable.
        #[arg(long = "grant")]
        grants: Vec<String>,
    },
    /// Change a password (your own needs --current).
    Passwd {
        /// The user's name (yours, or any with the admin grant).
        name: String,
        #[arg(long, env = "NARAD_NEW_PASSWORD", hide_env_values = true)]
        new_password: Option<String>,
        /// Your current password, when changing your own.
        #[arg(long, env = "NARAD_CURRENT_PASSWORD", hide_env_values = true)]
        current: Option<String>,
    },
    /// Access keys: credentials for signed requests (the SQS endpoint's AWS SDKs and CLI).
    Key {
        #[command(subcommand)]
        cmd: KeyCmd,
    },
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Make an access key for a user (yours, or any as an admin); its secret is shown once.
    Add {
        /// The user's name.
        name: String,
    },
    /// List a user's access keys (their ids; secrets cannot be read back).
    Ls {
        /// The user's name.
        name: String,
    },
    /// Remove an access key: requests signed with it are refused at once.
    Rm {
        /// The user's name.
        name: String,
        /// The key's id (`NRD...`).
        key_id: String,
    },
}

#[derive(Subcommand)]
enum ServerCmd {
    /// Start a broker: `--dev` for zero config on 127.0.0.1 with data under ~/.narad/data.
    Start(StartArgs),
}

#[derive(Args)]
struct StartArgs {
    /// Development mode: bind 127.0.0.1, human-readable logs, data under ~/.narad/data.
    #[arg(long)]
    dev: bool,
    /// HTTP port (0: any free one; see --addr-file). Default: the config file's, else 7942.
    #[arg(long)]
    port: Option<u16>,
    /// Where the broker keeps its data (default with --dev: ~/.narad/data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Optional TOML config file (same keys as `narad serve`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Write the bound address to this file once listening with the data directory held (useful
    /// with --port 0; a start refused by the data directory's lock writes nothing). With
    /// --nodes: node 1's address, once every node listens (node N's is in
    /// <data-dir>/nN.addr).
    #[arg(long)]
    addr_file: Option<PathBuf>,
    /// With --dev: a local cluster of this many nodes (1 to 7), each a process of its own,
    /// HTTP on --port and the ports after it (any free ones with --port 0), data under
    /// <data-dir>/n1, n2, ...; Ctrl-C stops them all.
    #[arg(long, default_value_t = 1, requires = "dev", value_parser = clap::value_parser!(u8).range(1..=7))]
    nodes: u8,
    #[command(flatten)]
    storage: StorageArgs,
}

/// Storage and archive settings shared by `server start` and `serve`; each overrides the
/// config file and its `NARAD_*` variable.
#[derive(Args, Default)]
pub struct StorageArgs {
    /// Archive for sealed segments: file:///dir, s3://bucket/prefix, memory:// or off
    /// (`--dev` default: file://<data-dir>/archive).
    #[arg(long)]
    pub archive_url: Option<String>,
    /// Seal the active segment this long after its first record.
    #[arg(long)]
    pub segment_max_age_ms: Option<i64>,
    /// Seal the active segment at this size.
    #[arg(long)]
    pub segment_max_bytes: Option<u64>,
    /// Delete archived local segments older than this (0 = only topic retention).
    #[arg(long)]
    pub local_retention_ms: Option<i64>,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file; every key can also be set as NARAD_<KEY>.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Listen address (overrides the config file).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Where the broker keeps its data (overrides the config file).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Write the bound address to this file once listening with the data directory held.
    #[arg(long)]
    addr_file: Option<PathBuf>,
    #[command(flatten)]
    storage: StorageArgs,
}

#[derive(Subcommand)]
enum TopicCmd {
    /// Create a topic.
    Add(TopicAddArgs),
    /// List topics.
    Ls {
        /// The same as `--output json`.
        #[arg(long, hide = true)]
        json: bool,
    },
    /// Show a topic's configuration and partition statistics.
    Info {
        /// The topic.
        name: String,
    },
    /// Delete a topic and its data.
    Rm {
        /// The topic.
        name: String,
        /// With remote children that have records not shipped yet: abandon them.
        #[arg(long)]
        force: bool,
    },
    /// Change a topic's settings.
    Edit(TopicEditArgs),
    /// Attach CHILD as a fan-out child of PARENT (every parent record is copied to it).
    Attach {
        /// The topic whose records are copied.
        parent: String,
        /// The topic that gets the copies (with --remote: the link's name).
        child: String,
        /// A delay child: records arrive this long after their parent commit (`30s`, `5m`;
        /// a plain number is milliseconds).
        #[arg(long, alias = "delay-ms", default_value = "0", value_parser = units::parse_ms)]
        delay: i64,
        /// Copy what the parent already holds, not only new records.
        #[arg(long)]
        earliest: bool,
        /// A remote child (admin): mirror PARENT to --remote-topic on this remote
        /// (`narad remote`); CHILD names the link.
        #[arg(long, requires = "remote_topic", conflicts_with = "delay")]
        remote: Option<String>,
        /// With --remote: the topic on the remote that the records go to.
        #[arg(long)]
        remote_topic: Option<String>,
        /// Requests in flight at once per parent partition (1..=8); a key's records keep
        /// their order whatever the count.
        #[arg(long, requires = "remote")]
        lanes: Option<u8>,
        /// With --remote: also what consumers of PARENT have not acked yet.
        #[arg(long, requires = "remote", conflicts_with = "earliest")]
        unconsumed: bool,
    },
    /// Detach CHILD from PARENT (the child keeps its data; a remote child is removed).
    Detach {
        /// The parent topic.
        parent: String,
        /// The child (or remote child) to detach.
        child: String,
        /// A remote child with records not shipped yet: abandon them.
        #[arg(long)]
        force: bool,
    },
    /// Pause a remote child: it ships nothing until resumed.
    Pause {
        /// The parent topic.
        parent: String,
        /// The remote child.
        child: String,
    },
    /// Resume a remote child (the remote is checked again first).
    Resume {
        /// The parent topic.
        parent: String,
        /// The remote child.
        child: String,
    },
    /// Skip the records a remote refused (`rejected_record`, `record_too_large`) that block a
    /// remote child now, or only the one named; they never reach the remote (audited).
    Skip {
        /// The parent topic.
        parent: String,
        /// The remote child.
        child: String,
        /// Only the record at this partition of the parent (with --offset).
        #[arg(long, requires = "offset")]
        partition: Option<u32>,
        /// Only the record at this offset (with --partition).
        #[arg(long, requires = "partition")]
        offset: Option<u64>,
    },
    /// Make a mirror of a topic on another cluster the primary (a failover): one epoch more,
    /// so the old primary's link is fenced; the old primary's tail is still taken.
    Promote {
        /// The mirror topic to promote.
        name: String,
        /// Also a demoted topic, as it is (two primaries if its replacement lives on).
        #[arg(long)]
        force: bool,
        /// A planned switchover (demote the source first): wait until every record, ack
        /// and lease of the source is settled here, then promote (at most `--timeout`).
        #[arg(long, conflicts_with = "force")]
        wait_drained: bool,
        /// How long `--wait-drained` waits (`60s`; at most `10m`).
        #[arg(long, requires = "wait_drained", value_parser = units::parse_ms)]
        timeout: Option<i64>,
    },
    /// Stop a primary taking produces and leases (a planned switchover): its remote children
    /// ship what they hold, then promote the mirror.
    Demote {
        /// The topic.
        name: String,
    },
    /// List PARENT's children with their lag.
    Children {
        /// The parent topic.
        parent: String,
    },
    /// Show a topic's JSON Schema versions.
    Schema {
        /// The topic.
        name: String,
    },
}

/// Durations take `ms`, `s`, `m`, `h`, `d` (`30s`, `7d`) and sizes `B`, `KiB`, `MiB`, `GiB`
/// (`1MiB`); a plain number is milliseconds or bytes, as in the API.
#[derive(Args)]
struct TopicSettings {
    /// Partitions (1 to 256; they only grow).
    #[arg(long)]
    partitions: Option<u32>,
    /// How long a consumed message stays leased (`30s`).
    #[arg(long, alias = "visibility-timeout-ms", value_parser = units::parse_ms)]
    visibility: Option<i64>,
    /// How long records are kept (`7d`; `forever`).
    #[arg(long, alias = "retention-ms", value_parser = units::parse_ms)]
    retention: Option<i64>,
    /// Most bytes kept per partition (`10GiB`; `unlimited`).
    #[arg(long, value_parser = units::parse_bytes)]
    retention_bytes: Option<u64>,
    /// Most messages leased at once per partition (consumes get fewer beyond it).
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// Default delay of messages produced without their own (`10s`).
    #[arg(long, alias = "delay-ms", value_parser = units::parse_ms)]
    delay: Option<i64>,
    /// Largest message (`1MiB`).
    #[arg(long, value_parser = units::parse_bytes)]
    max_message_bytes: Option<u64>,
    /// In a cluster, where a keyed message goes while its partition's owner is down:
    /// `prefer` (the next live partition) or `strict` (503, retry later).
    #[arg(long, value_parser = ["prefer", "strict"])]
    key_policy: Option<String>,
}

#[derive(Args)]
struct TopicAddArgs {
    /// The topic's name (letters, digits, `.`, `_`, `-`).
    name: String,
    #[command(flatten)]
    settings: TopicSettings,
    /// JSON Schema file that every produced payload must match.
    #[arg(long)]
    schema: Option<PathBuf>,
}

#[derive(Args)]
struct TopicEditArgs {
    /// The topic.
    name: String,
    #[command(flatten)]
    settings: TopicSettings,
    /// A new JSON Schema version (additive changes only).
    #[arg(long)]
    schema: Option<PathBuf>,
}

#[derive(Args)]
struct PubArgs {
    /// The topic to publish to.
    topic: String,
    /// The message; when absent (and no --file), all of stdin, read to its end, is one
    /// message (to send a file's lines as messages, use `--batch` from a script or one call
    /// a line).
    message: Option<String>,
    /// The message's key: messages of one key go to one partition, in order.
    #[arg(short, long)]
    key: Option<String>,
    /// This partition, whatever the key.
    #[arg(long)]
    partition: Option<u32>,
    /// Read the message from a file.
    #[arg(short, long)]
    file: Option<PathBuf>,
    /// Send the message this many times.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Messages per second (0 = as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Deliver the message this long after it is committed (`500ms`, `10s`, `5m`; a plain
    /// number is milliseconds).
    #[arg(long, alias = "delay-ms", value_parser = units::parse_ms)]
    delay: Option<i64>,
    /// Send copies in batches of this size through the batch endpoint (`--count` is rounded up
    /// to a whole number of batches).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    batch: u64,
    /// Requests in flight at once (with --rate: at most; the rate is kept while they
    /// suffice, and a shortfall is reported).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
}

#[derive(Args)]
struct SubArgs {
    /// The topic to consume from.
    topic: String,
    /// Do not ack (messages come back after their visibility timeout).
    #[arg(long)]
    no_ack: bool,
    /// Stop after this many messages.
    #[arg(long)]
    max: Option<u64>,
    /// Tail every partition with replay reads: reserves and acks nothing.
    #[arg(long)]
    peek: bool,
    /// Only this partition.
    #[arg(long)]
    partition: Option<u32>,
    /// With --peek: start at this offset instead of the current end.
    #[arg(long, requires = "peek")]
    from: Option<u64>,
    /// Stop when nothing arrives for this many seconds (default: never).
    #[arg(long)]
    idle_exit: Option<u64>,
}

#[derive(Args)]
struct ReplayArgs {
    /// The topic to read.
    topic: String,
    /// The partition to read.
    #[arg(long)]
    partition: u32,
    /// Start at this offset.
    #[arg(long, default_value_t = 0, conflicts_with = "from_time")]
    from: u64,
    /// Stop before this offset (default: the current end).
    #[arg(long)]
    to: Option<u64>,
    /// Start at the first message committed at or after this time (RFC 3339 or unix ms);
    /// found through the archive when older than local data.
    #[arg(long)]
    from_time: Option<String>,
    /// Stop after the last message committed at or before this time (RFC 3339 or unix ms).
    #[arg(long)]
    to_time: Option<String>,
}

fn main() -> ExitCode {
    // Files and directories Narad creates hold messages, users and keys: nobody but the
    // broker's own user may read them, whatever writes them (our code creates them 0600/0700
    // already; the object-store library writing a `file://` archive honours only the umask).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("narad: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("narad: {e}");
            ExitCode::FAILURE
        }
    }
}
