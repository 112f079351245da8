//! `narad-bench`: run a workload against Narad or a peer broker, soak a broker, serve the no-op
//! HTTP ceiling, or render the benchmark report.

use std::io::Write as _;
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use narad_bench::peers::{nats::NatsJetStream, rabbit::RabbitQuorum, redis::RedisStreams};
use narad_bench::workload::{self, RunConfig, RunResult, Workload};
use narad_bench::{narad::Narad, report, soak, target::Target};

#[derive(Parser)]
#[command(name = "narad-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Broker {
    Narad,
    /// Narad through its SQS-compatible endpoint (SigV4-signed AWS JSON 1.0).
    NaradSqs,
    Redis,
    Rabbitmq,
    Nats,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one workload against one broker and print its figures.
    Run(RunArgs),
    /// Send, read and ack nonstop, tracking every message; exit 1 on any lost or misdelivered.
    Soak(SoakArgs),
    /// Fan-out copy rate with N children and the produce-rate cost of adding them.
    Fanout(FanoutArgs),
    /// A remote child's mirroring rate with 1, 4 and 8 lanes, its lag at a steady rate, and
    /// the produce rate's cost on the source (scripts/bench-mirror sets up both clusters).
    Mirror(MirrorArgs),
    /// Archive costs and speeds: Parquet conversion, compression, replay from the archive vs
    /// local segments, time lookups in a large archived partition.
    Tiering(TieringArgs),
    /// A cluster's control plane on real processes: metadata write latency through the
    /// leader and a follower, time to a new leader after a SIGKILL. Needs NARAD_USER=admin and
    /// NARAD_PASSWORD (the members' root password).
    Cluster(ClusterArgs),
    /// Partition moves on four members on loopback: move throughput, produce latency during
    /// a move, the freeze producers see, time to decommission a member. Needs NARAD_USER=admin
    /// and NARAD_PASSWORD (the members' root password).
    Moves(MovesArgs),
    /// Producers through the other members while a partition owner is SIGKILLed, then
    /// frozen with SIGSTOP: the worst and p99 produce latency after each, and the duplicates
    /// re-placement wrote. Needs NARAD_USER=admin and NARAD_PASSWORD.
    OwnerLoss(OwnerLossArgs),
    /// Answer every HTTP/1.1 request with a fixed 202 after reading its body: the ceiling of
    /// one request per message on this machine (drive it with `run --target narad`).
    NoopServer(NoopArgs),
    /// Render JSON-lines results (from `run --json`) as a Markdown table.
    Report {
        /// File of JSON lines.
        results: std::path::PathBuf,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    #[arg(long, value_enum, default_value = "narad")]
    target: Broker,
    /// narad: host:port; redis: redis://127.0.0.1:6379; rabbitmq: amqp://127.0.0.1:5672/%2f;
    /// nats: nats://127.0.0.1:4222.
    #[arg(long, default_value = "127.0.0.1:7942")]
    url: String,
    #[arg(long, value_enum, default_value = "produce")]
    workload: Workload,
    /// Producer connections (consumer connections for `consume`).
    #[arg(long, short = 'c', default_value_t = 64)]
    connections: usize,
    /// Consumer connections for `flow` (default: same as --connections).
    #[arg(long)]
    consumers: Option<usize>,
    /// Idle long-polling readers for `fanin`.
    #[arg(long, default_value_t = 10)]
    waiters: usize,
    /// Message size in bytes.
    #[arg(long, short = 's', default_value_t = 256)]
    size: usize,
    /// Messages per produce request / max per consume.
    #[arg(long, short = 'b', default_value_t = 1)]
    batch: usize,
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    /// How long to run, e.g. 10s, 500ms, 2m.
    #[arg(long, short = 'd', default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Produce: stop after this many requests. Consume: messages to prefill and drain.
    #[arg(long, short = 'n')]
    count: Option<u64>,
    /// Open-loop rate: requests/s over all producers (fanin: messages/s, default 100).
    #[arg(long)]
    rate: Option<f64>,
    /// The broker's pid, to report its CPU time.
    #[arg(long)]
    pid: Option<u32>,
    /// Queue/topic/stream name.
    #[arg(long, default_value = "bench")]
    queue: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Report the run under this name instead of the target's (e.g. `http-noop` for the narad
    /// client driving `noop-server`).
    #[arg(long)]
    label: Option<String>,
    /// Replace the target's notes in the output with this one (repeatable).
    #[arg(long)]
    note: Vec<String>,
}

#[derive(clap::Args)]
struct NoopArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// Write the bound address here once listening.
    #[arg(long)]
    addr_file: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct MovesArgs {
    /// The narad binary (default: `narad` beside this one).
    #[arg(long)]
    binary: Option<std::path::PathBuf>,
    /// Size of the partition whose move is timed, MiB.
    #[arg(long, default_value_t = 1024)]
    partition_mib: u64,
    /// Moves of a small partition under a pinned producer (the freeze it sees).
    #[arg(long, default_value_t = 20)]
    freezes: usize,
    /// Partitions the decommissioned member holds.
    #[arg(long, default_value_t = 6)]
    decommission_partitions: usize,
    /// Where the members keep their data (a temporary directory by default).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct OwnerLossArgs {
    /// The narad binary (default: `narad` beside this one).
    #[arg(long)]
    binary: Option<std::path::PathBuf>,
    /// Sequential producers through each of the two members that stay.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Seconds measured after each fault.
    #[arg(long, default_value_t = 10)]
    window: u64,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ClusterArgs {
    /// The narad binary (default: `narad` beside this one).
    #[arg(long)]
    binary: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Metadata writes through the leader, then as many through a follower.
    #[arg(long, default_value_t = 200)]
    writes: usize,
    /// Leader kills (each followed by a restart).
    #[arg(long, default_value_t = 3)]
    kills: usize,
    /// Single produces through a partition's owner, then as many through another member
    /// (and up to 500 cross-member wake-ups).
    #[arg(long, default_value_t = 2000)]
    produces: usize,
    /// Seconds of batch-100 produce through every member at once.
    #[arg(long, default_value_t = 5)]
    batch_secs: u64,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct FanoutArgs {
    /// Narad's host:port.
    #[arg(long, default_value = "127.0.0.1:7942")]
    url: String,
    /// Child counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4,16")]
    children: Vec<usize>,
    #[arg(long, short = 'n', default_value_t = 200_000)]
    count: u64,
    #[arg(long, short = 'c', default_value_t = 8)]
    connections: usize,
    #[arg(long, short = 'b', default_value_t = 100)]
    batch: usize,
    #[arg(long, short = 's', default_value_t = 256)]
    size: usize,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct MirrorArgs {
    /// The source's host:port (security on: NARAD_USER, NARAD_PASSWORD).
    #[arg(long, default_value = "127.0.0.1:7942")]
    url: String,
    /// The source's remote to mirror to, and the topics there: `<remote-topic>-<lanes>` for
    /// each lane count and `<remote-topic>-steady` (each takes one source topic only).
    #[arg(long, default_value = "target")]
    remote: String,
    #[arg(long, default_value = "bench-mirror")]
    remote_topic: String,
    /// Lane counts to measure (0: no remote child, the baseline), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4,8")]
    lanes: Vec<u8>,
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    #[arg(long, short = 'n', default_value_t = 200_000)]
    count: u64,
    #[arg(long, short = 'c', default_value_t = 4)]
    connections: usize,
    #[arg(long, short = 'b', default_value_t = 100)]
    batch: usize,
    #[arg(long, short = 's', default_value_t = 256)]
    size: usize,
    /// Readers taking and acking the source topic's messages during each throughput run
    /// (their acks are the consumer progress the remote child ships with the records).
    #[arg(long, default_value_t = 0)]
    consumers: usize,
    /// The steady run: messages per second (0: none), for this long, with --steady-lanes.
    #[arg(long, default_value_t = 5000)]
    rate: u64,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    #[arg(long, default_value_t = 4)]
    steady_lanes: u8,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct TieringArgs {
    /// Raw size of the archived partition, in MiB.
    #[arg(long, default_value_t = 1024)]
    partition_mib: u64,
    /// Segment size, in MiB (the broker's default is 64).
    #[arg(long, default_value_t = 64)]
    segment_mib: u64,
    /// Scratch directory (created, removed afterwards).
    #[arg(long, default_value = "target/bench-tiering")]
    dir: std::path::PathBuf,
    #[arg(long, default_value_t = 200_000)]
    replay_records: usize,
    #[arg(long, default_value_t = 20)]
    lookups: usize,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct SoakArgs {
    /// Narad's host:port.
    #[arg(long, default_value = "127.0.0.1:7942")]
    url: String,
    #[arg(long, short = 'd', default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Messages per second over all producers.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    report_every: Duration,
    #[arg(long, default_value = "soak")]
    topic: String,
    #[arg(long, default_value_t = 2000)]
    visibility_ms: u64,
    #[arg(long, default_value_t = 128)]
    size: usize,
    /// Print tallies and the report as JSON lines.
    #[arg(long)]
    json: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num.parse().map_err(|_| format!("bad duration '{s}'"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(format!("bad duration unit in '{s}' (ms, s, m, h, d)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(real_main(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("narad-bench: {e}");
            ExitCode::from(2)
        }
    }
}

async fn real_main(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match cli.cmd {
        Cmd::Run(a) => {
            let cfg = RunConfig {
                workload: a.workload,
                connections: a.connections,
                consumers: a.consumers.unwrap_or(a.connections),
                waiters: a.waiters,
                message_bytes: a.size.max(34),
                batch: a.batch,
                partitions: a.partitions,
                duration: a.duration,
                count: a.count,
                rate: a.rate,
                pid: a.pid,
            };
            let mut res = match a.target {
                Broker::Narad => {
                    let t = Narad {
                        addr: a.url.trim_start_matches("http://").to_owned(),
                        topic: a.queue,
                        visibility_ms: 60_000,
                    };
                    run(t, cfg).await?
                }
                Broker::NaradSqs => {
                    let t = narad_bench::peers::sqs::NaradSqs {
                        addr: a.url.trim_start_matches("http://").to_owned(),
                        queue: a.queue,
                        visibility_s: 60,
                    };
                    run(t, cfg).await?
                }
                Broker::Redis => {
                    let t = RedisStreams {
                        url: a.url,
                        stream: a.queue,
                    };
                    run(t, cfg).await?
                }
                Broker::Rabbitmq => {
                    let t = RabbitQuorum {
                        url: a.url,
                        queue: a.queue,
                    };
                    run(t, cfg).await?
                }
                Broker::Nats => {
                    let t = NatsJetStream {
                        url: a.url,
                        stream: a.queue,
                    };
                    run(t, cfg).await?
                }
            };
            if let Some(label) = a.label {
                res.target = label;
            }
            if !a.note.is_empty() {
                res.notes = a.note;
            }
            if a.json {
                println!("{}", serde_json::to_string(&res)?);
            } else {
                print_text(&res);
            }
            let errors: u64 = res.summary.errors.values().sum();
            Ok(if errors == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Soak(a) => {
            let cfg = soak::SoakConfig {
                addr: a.url.trim_start_matches("http://").to_owned(),
                topic: a.topic,
                duration: a.duration,
                rate: a.rate,
                report_every: a.report_every,
                visibility_ms: a.visibility_ms,
                payload_bytes: a.size,
            };
            let json = a.json;
            let report = soak::soak(cfg, |t| {
                if json {
                    println!("{}", serde_json::to_string(t).unwrap_or_default());
                } else {
                    println!("{t}");
                }
            })
            .await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{report}");
            }
            Ok(if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Fanout(a) => {
            for n in a.children {
                let r = narad_bench::fanout::run(
                    a.url.trim_start_matches("http://"),
                    n,
                    a.count,
                    a.connections,
                    a.batch,
                    a.size.max(34),
                )
                .await?;
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    println!(
                        "{n:>3} children: produce {:.0} msg/s, copy {:.0} records/s, caught up {:.2}s after the last produce",
                        r.produce_msgs_per_s, r.copy_records_per_s, r.catch_up_s
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Mirror(a) => {
            let cfg = narad_bench::mirror::MirrorConfig {
                addr: a.url.trim_start_matches("http://").to_owned(),
                remote: a.remote,
                remote_topic: a.remote_topic,
                partitions: a.partitions,
            };
            let size = a.size.max(34);
            for lanes in a.lanes {
                let r = narad_bench::mirror::run(
                    &cfg,
                    lanes,
                    a.count,
                    a.connections,
                    a.batch,
                    size,
                    a.consumers,
                )
                .await?;
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else if lanes == 0 {
                    println!("no remote child: produce {:.0} msg/s", r.produce_msgs_per_s);
                } else {
                    println!(
                        "{lanes} lanes: produce {:.0} msg/s, mirrored {:.0} msg/s ({:.1} MB/s of payload), caught up {:.2}s after the last produce, {} acked on the source meanwhile",
                        r.produce_msgs_per_s,
                        r.mirror_msgs_per_s,
                        r.mirror_mb_per_s,
                        r.catch_up_s,
                        r.acked
                    );
                }
            }
            if a.rate > 0 {
                let r = narad_bench::mirror::steady(&cfg, a.steady_lanes, a.rate, a.seconds, size)
                    .await?;
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    println!(
                        "steady {} msg/s for {}s with {} lanes: lag p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                        r.rate, r.seconds, r.lanes, r.lag_p50_ms, r.lag_p99_ms, r.lag_max_ms
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Tiering(a) => {
            let r = narad_bench::tiering::run(narad_bench::tiering::TieringBenchConfig {
                partition_bytes: a.partition_mib << 20,
                segment_bytes: a.segment_mib << 20,
                dir: a.dir,
                replay_records: a.replay_records,
                lookups: a.lookups,
            })
            .await?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("{r:#?}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Moves(a) => {
            let binary = match a.binary {
                Some(b) => b,
                None => std::env::current_exe()?.with_file_name("narad"),
            };
            let tmp = tempfile::tempdir()?;
            let dir = a.dir.unwrap_or_else(|| tmp.path().to_owned());
            let r = narad_bench::moves::run(narad_bench::moves::MovesBenchConfig {
                binary,
                partition_mib: a.partition_mib,
                freezes: a.freezes,
                decommission_partitions: a.decommission_partitions,
                dir,
            })
            .await
            .map_err(|e| e.to_string())?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let l = |x: &narad_bench::cluster::Latency| {
                    format!(
                        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples)",
                        x.p50, x.p99, x.max, x.samples
                    )
                };
                println!("four members on loopback");
                println!(
                    "move of a {} MiB partition: {:.1} s, {:.1} MB/s",
                    r.partition_mib, r.move_seconds, r.move_mb_per_s
                );
                println!("produce without a move: {}", l(&r.produce_without_move));
                println!(
                    "produce during the move: {} ({} refused)",
                    l(&r.produce_during_move),
                    r.produce_failures_during_move
                );
                println!(
                    "freeze seen by a pinned producer (worst latency per move): {} ({} refused)",
                    l(&r.freeze_seen_by_producers_ms),
                    r.freeze_produce_failures
                );
                println!(
                    "freeze at the source (freeze to flip), mean: {:.1} ms",
                    r.freeze_mean_ms
                );
                println!(
                    "decommission of a member holding {} partitions: {:.1} s",
                    r.decommission_partitions, r.decommission_seconds
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::OwnerLoss(a) => {
            let binary = match a.binary {
                Some(b) => b,
                None => std::env::current_exe()?.with_file_name("narad"),
            };
            let dir = tempfile::tempdir()?;
            let r = narad_bench::owner_loss::run(narad_bench::owner_loss::OwnerLossConfig {
                binary,
                producers: a.producers,
                window: Duration::from_secs(a.window),
                dir: dir.path().to_owned(),
            })
            .await
            .map_err(|e| e.to_string())?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let l = |x: &narad_bench::owner_loss::Latency| {
                    format!(
                        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} produces)",
                        x.p50, x.p99, x.max, x.samples
                    )
                };
                println!(
                    "keyless produces through the two other members, {} sequential producers each",
                    a.producers
                );
                println!("steady:               {}", l(&r.steady_ms));
                for f in &r.faults {
                    println!(
                        "{} of an owner, next {} s: {}",
                        f.fault,
                        a.window,
                        l(&f.latency_ms)
                    );
                    if !f.errors.is_empty() {
                        println!("  errors: {:?}", f.errors);
                    }
                    if f.over_1s_count > 0 {
                        println!(
                            "  {} took over 1 s (started at ms after the fault, took ms): {:?}",
                            f.over_1s_count, f.over_1s
                        );
                    }
                }
                println!(
                    "accepted {}, read back {}, duplicates {}, missing {}",
                    r.accepted, r.read_back, r.duplicates, r.missing
                );
            }
            if r.missing > 0 {
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Cluster(a) => {
            let binary = match a.binary {
                Some(b) => b,
                None => std::env::current_exe()?.with_file_name("narad"),
            };
            let dir = tempfile::tempdir()?;
            let r = narad_bench::cluster::run(narad_bench::cluster::ClusterBenchConfig {
                binary,
                nodes: a.nodes,
                writes: a.writes,
                produces: a.produces,
                batch_secs: a.batch_secs,
                kills: a.kills,
                dir: dir.path().to_owned(),
            })
            .await
            .map_err(|e| e.to_string())?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                let l = |x: &narad_bench::cluster::Latency| {
                    format!(
                        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} writes)",
                        x.p50, x.p99, x.max, x.samples
                    )
                };
                println!("{} members on loopback", r.nodes);
                println!(
                    "metadata write through the leader:   {}",
                    l(&r.write_through_leader)
                );
                println!(
                    "metadata write through a follower:   {}",
                    l(&r.write_through_follower)
                );
                if r.failed_writes != [0, 0] {
                    println!(
                        "failed metadata writes (leader, follower): {:?}",
                        r.failed_writes
                    );
                }
                println!(
                    "SIGKILL of the leader → new leader:  {:?} ms",
                    r.new_leader_ms
                        .iter()
                        .map(|v| v.round())
                        .collect::<Vec<_>>()
                );
                println!(
                    "SIGKILL of the leader → writes again: {:?} ms",
                    r.writes_again_ms
                        .iter()
                        .map(|v| v.round())
                        .collect::<Vec<_>>()
                );
                let d = &r.data;
                let p = |x: &narad_bench::cluster::Latency| {
                    format!(
                        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({})",
                        x.p50, x.p99, x.max, x.samples
                    )
                };
                println!(
                    "produce through the owner:           {}, {:.0} µs CPU/msg (all members)",
                    p(&d.produce_through_owner),
                    d.cpu_us_per_message[0]
                );
                println!(
                    "produce through another member:      {}, {:.0} µs CPU/msg (all members)",
                    p(&d.produce_forwarded),
                    d.cpu_us_per_message[1]
                );
                println!(
                    "  forwarded / owner: p50 {:.2}×, CPU {:.2}×",
                    d.produce_forwarded.p50 / d.produce_through_owner.p50.max(1e-9),
                    d.cpu_us_per_message[1] / d.cpu_us_per_message[0].max(1e-9)
                );
                if d.failed_produces != [0, 0] {
                    println!(
                        "failed produces (owner, forwarded): {:?}",
                        d.failed_produces
                    );
                }
                println!(
                    "cross-member wake (produce → reader): {}",
                    p(&d.cross_member_wake)
                );
                println!(
                    "batch-100 through every member:      {:.0} msg/s ({} batches failed)",
                    d.batch_msgs_per_s, d.failed_batches
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::NoopServer(a) => {
            let listener = tokio::net::TcpListener::bind(a.listen).await?;
            if let Some(path) = a.addr_file {
                // written whole, then renamed: a reader polling for the file never sees half
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, listener.local_addr()?.to_string())?;
                std::fs::rename(&tmp, &path)?;
            }
            narad_bench::noop::serve(listener, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Report { results } => {
            let text = std::fs::read_to_string(&results)?;
            print!("{}", report::table(&report::parse_lines(&text)?));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn run<T: Target>(t: T, cfg: RunConfig) -> Result<RunResult, Box<dyn std::error::Error>> {
    Ok(workload::run(Arc::new(t), cfg).await?)
}

fn print_text(r: &RunResult) {
    // a closed pipe (`| head`) is not an error worth a panic
    let mut out = std::io::stdout().lock();
    let s = &r.summary;
    let c = &r.config;
    let _ = writeln!(
        out,
        "{} {:?}: {} conns, batch {}, {} B: {} messages in {:.2}s = {:.0} msg/s, {:.1} MB/s",
        r.target,
        c.workload,
        c.connections,
        c.batch,
        c.message_bytes,
        s.messages,
        s.elapsed_s,
        s.msgs_per_s,
        s.mb_per_s
    );
    let l = &s.latency_ms;
    let _ = writeln!(
        out,
        "  latency ms: p50 {:.3} p90 {:.3} p99 {:.3} p99.9 {:.3} max {:.3} ({} samples)",
        l.p50, l.p90, l.p99, l.p999, l.max, l.samples
    );
    if let Some(l) = &r.e2e_latency_ms {
        let _ = writeln!(
            out,
            "  end-to-end ms: p50 {:.3} p90 {:.3} p99 {:.3} p99.9 {:.3} max {:.3}",
            l.p50, l.p90, l.p99, l.p999, l.max
        );
    }
    if let Some(cpu) = r.broker_cpu_s {
        let _ = writeln!(out, "  broker CPU: {cpu:.2}s");
    }
    if let Some(cpu) = r.client_cpu_s {
        let per = if s.messages > 0 {
            format!(" ({:.1} µs per message)", cpu * 1e6 / s.messages as f64)
        } else {
            String::new()
        };
        let _ = writeln!(out, "  load generator CPU: {cpu:.2}s{per}");
    }
    if let Some(c) = r.cpu_ms_per_msg {
        let _ = writeln!(out, "  broker CPU per delivered message: {c:.3} ms");
    }
    if !s.errors.is_empty() {
        let _ = writeln!(out, "  errors: {:?}", s.errors);
    }
}
