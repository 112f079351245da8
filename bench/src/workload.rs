//! The benchmark workloads, generic over the broker under test.

// A load generator paces producers, waits for consumers and lets readers park in real time
// against a real broker process: nothing here runs on a test clock, so the raw sleeps that
// clippy.toml bans elsewhere are what this module is for.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;

use crate::procstat;
use crate::stats::{Latency, Stats, Summary};
use crate::target::{Conn, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Produce only; `--batch 1` is one message per request.
    Produce,
    /// Consume + ack a prefilled queue; `--batch N` reads up to N per request and acks them in one.
    Consume,
    /// Producers and consumers at once; reports end-to-end latency (produce start → consumed).
    Flow,
    /// W idle long-polling readers and a trickle of messages; reports broker CPU per delivery.
    Fanin,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    pub workload: Workload,
    /// Producer connections (and consumer connections for `consume`).
    pub connections: usize,
    /// Consumer connections for `flow`.
    pub consumers: usize,
    /// Idle readers for `fanin`.
    pub waiters: usize,
    pub message_bytes: usize,
    pub batch: usize,
    pub partitions: u32,
    #[serde(serialize_with = "ser_secs")]
    pub duration: Duration,
    /// Requests to send (produce) or messages to prefill and drain (consume).
    pub count: Option<u64>,
    /// Open-loop target rate in requests/s over all producers (fanin: messages/s); latency is
    /// measured from each request's scheduled start, so stalls are not hidden.
    pub rate: Option<f64>,
    /// The broker's process, for CPU accounting.
    pub pid: Option<u32>,
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub target: String,
    pub config: RunConfig,
    /// The measured operation: produce requests, consume+ack cycles, or consumed messages.
    pub summary: Summary,
    /// `flow` and `fanin`: produce start → consumer received it.
    pub e2e_latency_ms: Option<Latency>,
    /// `fanin`: broker CPU (user + system) per delivered message.
    pub cpu_ms_per_msg: Option<f64>,
    /// Broker CPU seconds over the measured phase, when `pid` is known.
    pub broker_cpu_s: Option<f64>,
    /// This load generator's own CPU seconds over the same phase: it shares the machine's
    /// cores with the broker, so what it spends per message bounds the rate as much as the
    /// broker does.
    pub client_cpu_s: Option<f64>,
    pub notes: Vec<String>,
}

/// Payloads carry the send time (ns since the run started) and a sequence number in ASCII, so
/// every broker stores them verbatim and a consumer can compute end-to-end latency.
pub fn payload(t0: Instant, seq: u64, size: usize) -> Bytes {
    payload_at(t0.elapsed().as_nanos() as u64, seq, size)
}

/// [`payload`] with its send time given: a batch reads the clock once. Written without a
/// formatter: the load generator shares the cores with the broker, and a `format!` plus a
/// character-at-a-time fill cost it more CPU per message than the broker spent.
pub fn payload_at(sent_ns: u64, seq: u64, size: usize) -> Bytes {
    const FILL: [u8; 256] = [b'x'; 256];
    let mut s = Vec::with_capacity(size.max(PAYLOAD_HEAD));
    push_hex16(&mut s, sent_ns);
    s.push(b':');
    push_hex16(&mut s, seq);
    s.push(b':');
    while s.len() < size {
        let n = (size - s.len()).min(FILL.len());
        s.extend_from_slice(&FILL[..n]);
    }
    Bytes::from(s)
}

/// The bytes before a payload's fill: two 16-digit hex numbers and their colons.
const PAYLOAD_HEAD: usize = 34;

fn push_hex16(out: &mut Vec<u8>, v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for i in (0..16).rev() {
        out.push(DIGITS[((v >> (i * 4)) & 0xf) as usize]);
    }
}

/// The send time embedded by [`payload`].
pub fn sent_at(p: &[u8]) -> Option<u64> {
    let hex = std::str::from_utf8(p.get(..16)?).ok()?;
    u64::from_str_radix(hex, 16).ok()
}

struct Pacer {
    start: Instant,
    interval: Option<Duration>,
    k: u64,
}

impl Pacer {
    /// `rate` is this worker's share of the total; `phase` spreads workers over one interval.
    fn new(start: Instant, rate: Option<f64>, phase: f64) -> Self {
        let interval = rate.map(|r| Duration::from_secs_f64(1.0 / r.max(1e-6)));
        let start = match interval {
            Some(i) => start + i.mul_f64(phase),
            None => start,
        };
        Self {
            start,
            interval,
            k: 0,
        }
    }

    /// Waits for the next scheduled start and returns it (now, in closed loop).
    async fn next(&mut self) -> Instant {
        match self.interval {
            None => Instant::now(),
            Some(i) => {
                let at = self.start + i * self.k as u32;
                self.k += 1;
                tokio::time::sleep_until(at.into()).await;
                at
            }
        }
    }
}

/// What one workload measured.
struct Measured {
    stats: Stats,
    e2e: Option<Stats>,
    elapsed: Duration,
    cpu_s: Option<f64>,
    client_cpu_s: Option<f64>,
}

/// CPU seconds used while `f` runs: the broker's (when its pid is known) and this process's.
async fn with_cpu<F: std::future::Future>(
    pid: Option<u32>,
    f: F,
) -> (F::Output, Option<f64>, Option<f64>) {
    let me = std::process::id();
    let before = pid.and_then(procstat::cpu_seconds);
    let own_before = procstat::cpu_seconds(me);
    let out = f.await;
    let after = pid.and_then(procstat::cpu_seconds);
    let own_after = procstat::cpu_seconds(me);
    // (clock ticks are 10 ms: rounded to the millisecond, a difference prints as it was read)
    let diff =
        |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| ((b - a) * 1e3).round() / 1e3);
    (out, diff(before, after), diff(own_before, own_after))
}

pub async fn run<T: Target>(target: Arc<T>, cfg: RunConfig) -> crate::target::Result<RunResult> {
    target.prepare(cfg.partitions).await?;
    let m = match cfg.workload {
        Workload::Produce => {
            let t0 = Instant::now();
            let (stats, cpu_s, client_cpu_s) = with_cpu(
                cfg.pid,
                produce(target.clone(), &cfg, cfg.rate, cfg.count, t0),
            )
            .await;
            Measured {
                stats,
                e2e: None,
                elapsed: t0.elapsed(),
                cpu_s,
                client_cpu_s,
            }
        }
        Workload::Consume => consume(target.clone(), &cfg).await?,
        Workload::Flow => flow(target.clone(), &cfg).await,
        Workload::Fanin => fanin(target.clone(), &cfg).await?,
    };
    let delivered = m.stats.messages;
    let cpu_ms_per_msg = match m.cpu_s {
        Some(c) if delivered > 0 => Some(c * 1000.0 / delivered as f64),
        _ => None,
    };
    Ok(RunResult {
        target: target.name().to_owned(),
        summary: m.stats.summary(m.elapsed),
        e2e_latency_ms: m.e2e.map(|e| e.summary(m.elapsed).latency_ms),
        cpu_ms_per_msg,
        broker_cpu_s: m.cpu_s,
        client_cpu_s: m.client_cpu_s,
        notes: target.notes(),
        config: cfg,
    })
}

/// Producers for `cfg.duration` (or `count` requests), timestamps relative to `t0`.
async fn produce<T: Target>(
    target: Arc<T>,
    cfg: &RunConfig,
    rate: Option<f64>,
    count: Option<u64>,
    t0: Instant,
) -> Stats {
    let started = Instant::now();
    let deadline = started + cfg.duration;
    let remaining = Arc::new(AtomicU64::new(count.unwrap_or(u64::MAX)));
    let seq = Arc::new(AtomicU64::new(0));
    let workers = cfg.connections.max(1);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (target, remaining, seq) = (target.clone(), remaining.clone(), seq.clone());
        let (size, batch) = (cfg.message_bytes, cfg.batch.max(1));
        let per_worker = rate.map(|r| r / workers as f64);
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            let mut conn = match target.connect(w).await {
                Ok(c) => c,
                Err(e) => {
                    stats.error(e.cause);
                    return stats;
                }
            };
            let mut pacer = Pacer::new(started, per_worker, w as f64 / workers as f64);
            loop {
                let start = pacer.next().await;
                if start >= deadline
                    || remaining
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
                        .is_err()
                {
                    break;
                }
                let first = seq.fetch_add(batch as u64, Ordering::Relaxed);
                let sent = t0.elapsed().as_nanos() as u64;
                let payloads: Vec<Bytes> = (0..batch as u64)
                    .map(|i| payload_at(sent, first + i, size))
                    .collect();
                match conn.produce(&payloads).await {
                    Ok(()) => stats.ok(start.elapsed(), batch as u64, (batch * size) as u64),
                    Err(e) => stats.error(e.cause),
                }
            }
            stats
        }));
    }
    let mut all = Stats::default();
    for t in tasks {
        all.merge(&t.await.expect("producer task"));
    }
    all
}

async fn consume<T: Target>(target: Arc<T>, cfg: &RunConfig) -> crate::target::Result<Measured> {
    let total = cfg.count.unwrap_or(100_000);
    // prefill with large batches, unmeasured
    let fill = RunConfig {
        batch: 100,
        duration: Duration::from_secs(3600),
        ..cfg.clone()
    };
    let filled = produce(
        target.clone(),
        &fill,
        None,
        Some(total.div_ceil(100)),
        Instant::now(),
    )
    .await;
    if !filled.errors.is_empty() || filled.messages < total {
        return Err(crate::target::BenchError::new(
            "prefill",
            format!(
                "stored {} of {total} messages, errors {:?}",
                filled.messages, filled.errors
            ),
        ));
    }
    let total = filled.messages;
    let t0 = Instant::now();
    let deadline = t0 + cfg.duration;
    let consumed = Arc::new(AtomicU64::new(0));
    // When the last message was acked: the run ends there, not when the last worker's empty
    // long poll (up to 100 ms, for messages the others hold) returns, which on a run of a
    // second was a tenth of it.
    let done_at = Arc::new(std::sync::OnceLock::<Instant>::new());
    let run = async {
        let mut tasks = Vec::new();
        for w in 0..cfg.connections.max(1) {
            let (target, consumed, done_at) = (target.clone(), consumed.clone(), done_at.clone());
            let (size, batch) = (cfg.message_bytes as u64, cfg.batch.max(1));
            tasks.push(tokio::spawn(async move {
                let mut stats = Stats::default();
                let mut conn = match target.connect(w).await {
                    Ok(c) => c,
                    Err(e) => {
                        stats.error(e.cause);
                        return stats;
                    }
                };
                let mut empty = 0;
                while consumed.load(Ordering::Relaxed) < total && Instant::now() < deadline {
                    let start = Instant::now();
                    let got = match conn.consume(batch, Duration::from_millis(100)).await {
                        Ok(g) => g,
                        Err(e) => {
                            stats.error(e.cause);
                            continue;
                        }
                    };
                    if got.is_empty() {
                        // the rest may be leased by other workers: give up after a while
                        empty += 1;
                        if empty > 20 {
                            break;
                        }
                        continue;
                    }
                    empty = 0;
                    let n = got.len() as u64;
                    let tokens = got.into_iter().map(|r| r.token).collect();
                    match conn.ack(tokens).await {
                        Ok(()) => {
                            stats.ok(start.elapsed(), n, n * size);
                            if consumed.fetch_add(n, Ordering::Relaxed) + n >= total {
                                let _ = done_at.set(Instant::now());
                            }
                        }
                        Err(e) => stats.error(e.cause),
                    }
                }
                stats
            }));
        }
        let mut all = Stats::default();
        for t in tasks {
            all.merge(&t.await.expect("consumer task"));
        }
        all
    };
    let (stats, cpu_s, client_cpu_s) = with_cpu(cfg.pid, run).await;
    let elapsed = done_at.get().map_or_else(|| t0.elapsed(), |t| *t - t0);
    Ok(Measured {
        stats,
        e2e: None,
        elapsed,
        cpu_s,
        client_cpu_s,
    })
}

/// Consumer stats and end-to-end latencies, shared so aborted readers lose nothing.
type Sink = Arc<parking_lot::Mutex<(Stats, Stats)>>;

/// Consumer loop shared by `flow` and `fanin`: records end-to-end latency per message.
async fn consumer_loop<C: Conn>(
    mut conn: C,
    t0: Instant,
    batch: usize,
    wait: Duration,
    size: u64,
    stop: Arc<AtomicBool>,
    sink: Sink,
) {
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let got = match conn.consume(batch, wait).await {
            Ok(g) => g,
            Err(e) => {
                sink.lock().0.error(e.cause);
                continue;
            }
        };
        if got.is_empty() {
            continue;
        }
        let now = t0.elapsed().as_nanos() as u64;
        {
            let mut s = sink.lock();
            for r in &got {
                if let Some(t) = sent_at(&r.payload) {
                    s.1.record(Duration::from_nanos(now.saturating_sub(t)));
                }
            }
        }
        let n = got.len() as u64;
        let res = conn.ack(got.into_iter().map(|r| r.token).collect()).await;
        let mut s = sink.lock();
        match res {
            Ok(()) => s.0.ok(start.elapsed(), n, n * size),
            Err(e) => s.0.error(e.cause),
        }
    }
}

/// Waits (bounded) until consumers have received what producers stored.
async fn drain(sink: &Sink, produced: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    while sink.lock().0.messages < produced && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn finish(sink: Sink, produced: &Stats) -> (Stats, Stats) {
    let mut g = sink.lock();
    let (mut stats, e2e) = std::mem::take(&mut *g);
    for (k, v) in &produced.errors {
        *stats.errors.entry(format!("produce {k}")).or_default() += v;
    }
    (stats, e2e)
}

async fn flow<T: Target>(target: Arc<T>, cfg: &RunConfig) -> Measured {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sink = Sink::default();
    let mut consumers = Vec::new();
    for w in 0..cfg.consumers.max(1) {
        let (target, stop, sink) = (target.clone(), stop.clone(), sink.clone());
        let (batch, size) = (cfg.batch.max(1), cfg.message_bytes as u64);
        consumers.push(tokio::spawn(async move {
            match target.connect(10_000 + w).await {
                Ok(c) => {
                    let wait = Duration::from_millis(200);
                    consumer_loop(c, t0, batch, wait, size, stop, sink).await;
                }
                Err(e) => sink.lock().0.error(e.cause),
            }
        }));
    }
    let (produced, cpu_s, client_cpu_s) = with_cpu(cfg.pid, async {
        let produced = produce(target.clone(), cfg, cfg.rate, None, t0).await;
        drain(&sink, produced.messages, Duration::from_secs(10)).await;
        produced
    })
    .await;
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for c in consumers {
        let _ = c.await;
    }
    let (stats, e2e) = finish(sink, &produced);
    Measured {
        stats,
        e2e: Some(e2e),
        elapsed,
        cpu_s,
        client_cpu_s,
    }
}

async fn fanin<T: Target>(target: Arc<T>, cfg: &RunConfig) -> crate::target::Result<Measured> {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sink = Sink::default();
    let mut waiters = Vec::new();
    for w in 0..cfg.waiters.max(1) {
        let conn = target.connect(10_000 + w).await?;
        let (stop, sink) = (stop.clone(), sink.clone());
        let size = cfg.message_bytes as u64;
        let wait = Duration::from_secs(20);
        waiters.push(tokio::spawn(consumer_loop(
            conn, t0, 1, wait, size, stop, sink,
        )));
    }
    // let every reader park its long poll before the measured phase
    tokio::time::sleep(Duration::from_millis(500 + cfg.waiters as u64)).await;
    let trickle = RunConfig {
        connections: 1,
        batch: 1,
        ..cfg.clone()
    };
    let started = Instant::now();
    let (produced, cpu_s, client_cpu_s) = with_cpu(cfg.pid, async {
        let rate = Some(cfg.rate.unwrap_or(100.0));
        let produced = produce(target.clone(), &trickle, rate, None, t0).await;
        drain(&sink, produced.messages, Duration::from_secs(10)).await;
        produced
    })
    .await;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in waiters {
        w.abort();
    }
    let (stats, e2e) = finish(sink, &produced);
    Ok(Measured {
        stats,
        e2e: Some(e2e),
        elapsed,
        cpu_s,
        client_cpu_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_carries_its_send_time_and_sequence_and_has_its_size() {
        for size in [1, 33, 34, 35, 256, 300, 4096] {
            let p = payload_at(0x0123_4567_89ab_cdef, 42, size);
            assert_eq!(p.len(), size.max(PAYLOAD_HEAD), "size {size}");
            assert_eq!(&p[..34], b"0123456789abcdef:000000000000002a:");
            assert!(p[34..].iter().all(|&c| c == b'x'));
            assert_eq!(sent_at(&p), Some(0x0123_4567_89ab_cdef));
        }
    }
}
