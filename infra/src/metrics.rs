//! The Prometheus registry: core counters, HTTP metrics, and gauges sampled at scrape time.

use std::sync::Arc;

use narad_core::broker::Broker;
use narad_core::metrics::CoreMetrics;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The matched route pattern (a fixed set) or `unmatched`.
    pub route: &'static str,
    /// A fixed set (see `http::method_label`).
    pub method: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    pub topic: String,
    pub partition: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChildLabels {
    pub parent: String,
    pub child: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthLabels {
    /// `missing`, `malformed`, `bad_credentials`, `throttled`, `forbidden`
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloseLabels {
    /// `header_timeout`, `idle_timeout`, `evicted_idle`, `write_timeout`, `stalled_reply`
    /// (`limits::CloseReason::COUNTED`)
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SchemaLabels {
    pub topic: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    pub topic: String,
}

type HistogramFamily = Family<HttpLabels, Histogram, fn() -> Histogram>;

/// The answers of the hot routes that nearly every request gets, as (route, method, status):
/// their two series are looked up once and kept (a family lookup hashes the labels and
/// takes a lock, twice per request otherwise). Any other request goes through the families.
const COMMON_HTTP: [(&str, &str, u16); 6] = [
    ("/v1/topics/{topic}/produce", "POST", 202),
    ("/v1/topics/{topic}/consume", "GET", 200),
    ("/v1/topics/{topic}/consume", "GET", 204),
    ("/v1/topics/{topic}/ack", "POST", 200),
    ("/v1/topics/{topic}/ack", "POST", 204),
    ("/v1/topics/{topic}/produce/batch", "POST", 202),
];

pub struct Metrics {
    registry: Mutex<Registry>,
    pub core: Arc<CoreMetrics>,
    pub http_requests: Family<HttpLabels, Counter>,
    /// Connections answered 503 because `max_connections` were already served.
    pub connections_refused: Counter,
    /// Connections the server closed: header block too slow, idle too long, or idle when a
    /// new client needed the slot.
    pub connections_closed: Family<CloseLabels, Counter>,
    pub http_duration: HistogramFamily,
    /// The series of [`COMMON_HTTP`], each made on its first use (so `/metrics` lists only
    /// series that were used, as with the families).
    common_http: [std::sync::OnceLock<(Counter, Histogram)>; COMMON_HTTP.len()],
    /// Requests refused by authentication or authorisation, by reason.
    pub auth_refused: Family<AuthLabels, Counter>,
    /// Messages refused because they do not match the topic's JSON Schema.
    pub schema_rejected: Family<SchemaLabels, Counter>,
    unacked: Family<PartitionLabels, Gauge>,
    in_flight: Family<PartitionLabels, Gauge>,
    delayed: Family<PartitionLabels, Gauge>,
    next_offset: Family<PartitionLabels, Gauge>,
    partition_bytes: Family<PartitionLabels, Gauge>,
    segments: Family<PartitionLabels, Gauge>,
    waiters: Family<TopicLabels, Gauge>,
    topic_epoch: Family<TopicLabels, Gauge>,
    topic_read_only: Family<TopicLabels, Gauge>,
    fanout_lag: Family<ChildLabels, Gauge>,
    fanout_due_lag: Family<ChildLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    remote_lag: Family<ChildLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Bytes free and in all on the data directory's filesystem.
    disk_available: Gauge,
    disk_capacity: Gauge,
    topics: Gauge,
    open_logs: Gauge,
    /// Request body bytes held by requests being served (`max_request_bytes_in_flight`).
    pub request_bytes_in_flight: Gauge,
    /// Bytes the tail caches of all open partitions hold (`tail_cache_bytes`).
    pub tail_cache_bytes: Gauge,
    /// The process's own figures, read from `/proc` at each scrape.
    process: ProcessMetrics,
}

/// The `process_*` series Prometheus users expect of any server (the names and meanings of
/// the Prometheus client libraries' process collector), read from `/proc/self` at each
/// scrape. Where `/proc` cannot be read they keep their last values.
#[derive(Default)]
struct ProcessMetrics {
    cpu_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// What `cpu_seconds` has counted so far (the counter only goes up by the difference).
    cpu_counted: Mutex<f64>,
    resident_bytes: Gauge,
    virtual_bytes: Gauge,
    open_fds: Gauge,
    max_fds: Gauge,
    start_time: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl ProcessMetrics {
    fn register(&self, r: &mut Registry) {
        r.register(
            "process_cpu_seconds",
            "user and system CPU time the process spent, in seconds",
            self.cpu_seconds.clone(),
        );
        r.register(
            "process_resident_memory_bytes",
            "resident memory of the process",
            self.resident_bytes.clone(),
        );
        r.register(
            "process_virtual_memory_bytes",
            "virtual memory of the process",
            self.virtual_bytes.clone(),
        );
        r.register(
            "process_open_fds",
            "file descriptors the process has open",
            self.open_fds.clone(),
        );
        r.register(
            "process_max_fds",
            "most file descriptors the process may open (its soft limit)",
            self.max_fds.clone(),
        );
        r.register(
            "process_start_time_seconds",
            "when the process started, in seconds since the Unix epoch",
            self.start_time.clone(),
        );
    }

    fn sample(&self) {
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
            && let Some((_, rest)) = stat.rsplit_once(") ")
        {
            // the fields after the command name, from the third (`state`) on
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
            if let (Some(utime), Some(stime)) = (num(11), num(12)) {
                let total = (utime + stime) as f64 / ticks;
                let mut counted = self.cpu_counted.lock();
                if total > *counted {
                    self.cpu_seconds.inc_by(total - *counted);
                    *counted = total;
                }
            }
            if let Some(v) = num(20) {
                self.virtual_bytes.set(v.min(i64::MAX as u64) as i64);
            }
            if let Some(pages) = num(21) {
                let bytes = pages.saturating_mul(rustix::param::page_size() as u64);
                self.resident_bytes.set(bytes.min(i64::MAX as u64) as i64);
            }
            if let Some(start) = num(19)
                && self.start_time.get() == 0.0
                && let Some(boot) = boot_time()
            {
                self.start_time.set(boot + start as f64 / ticks);
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // (less the one this listing holds open)
            let n = dir.count().saturating_sub(1);
            self.open_fds.set(n as i64);
        }
        if let Some(max) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            self.max_fds.set(max.min(i64::MAX as u64) as i64);
        }
    }
}

/// When the machine booted, in seconds since the Unix epoch (`btime` of `/proc/stat`).
fn boot_time() -> Option<f64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Counts an answered request and its duration.
    pub fn observe_http(&self, labels: &HttpLabels, seconds: f64) {
        let common = COMMON_HTTP.iter().position(|&(route, method, status)| {
            status == labels.status && method == labels.method && route == labels.route
        });
        match common {
            Some(i) => {
                let (count, duration) = self.common_http[i].get_or_init(|| {
                    let count = self.http_requests.get_or_create(labels).clone();
                    let duration = self.http_duration.get_or_create(labels).clone();
                    (count, duration)
                });
                count.inc();
                duration.observe(seconds);
            }
            None => {
                self.http_requests.get_or_create(labels).inc();
                self.http_duration.get_or_create(labels).observe(seconds);
            }
        }
    }

    /// Lets another component (the tiering loop) add its metrics to the same registry.
    pub fn register_with(&self, f: impl FnOnce(&mut Registry)) {
        f(&mut self.registry.lock());
    }

    pub fn new() -> Self {
        let core = Arc::new(CoreMetrics::default());
        let mut registry = Registry::default();
        core.register(&mut registry);
        let m = Self {
            core,
            http_requests: Family::default(),
            connections_refused: Counter::default(),
            connections_closed: Family::default(),
            http_duration: Family::new_with_constructor(latency_histogram),
            common_http: Default::default(),
            auth_refused: Family::default(),
            schema_rejected: Family::default(),
            unacked: Family::default(),
            in_flight: Family::default(),
            delayed: Family::default(),
            next_offset: Family::default(),
            partition_bytes: Family::default(),
            segments: Family::default(),
            waiters: Family::default(),
            topic_epoch: Family::default(),
            topic_read_only: Family::default(),
            fanout_lag: Family::default(),
            fanout_due_lag: Family::default(),
            remote_lag: Family::default(),
            disk_available: Gauge::default(),
            disk_capacity: Gauge::default(),
            topics: Gauge::default(),
            open_logs: Gauge::default(),
            request_bytes_in_flight: Gauge::default(),
            tail_cache_bytes: Gauge::default(),
            process: ProcessMetrics::default(),
            registry: Mutex::new(Registry::default()),
        };
        m.process.register(&mut registry);
        registry.register(
            "narad_build",
            "the broker's version (always 1)",
            prometheus_client::metrics::info::Info::new(vec![(
                "version".to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            )]),
        );
        registry.register(
            "narad_http_connections_refused",
            "connections answered 503 because max_connections were already open",
            m.connections_refused.clone(),
        );
        for reason in crate::limits::CloseReason::COUNTED {
            // every reason shows, at 0 until it happens
            let _ = m.connections_closed.get_or_create(&CloseLabels { reason });
        }
        registry.register(
            "narad_http_connections_closed",
            "connections closed by the server: header_timeout (its request head came too slowly), idle_timeout, evicted_idle (an idle one gave its slot to a new client), write_timeout (it did not read its answer), stalled_reply (its answer's body stalled)",
            m.connections_closed.clone(),
        );
        registry.register(
            "narad_auth_refused",
            "requests refused by authentication (401, 429) or authorisation (403), by reason",
            m.auth_refused.clone(),
        );
        registry.register(
            "narad_schema_rejected_messages",
            "produced messages refused because they violate the topic's JSON Schema",
            m.schema_rejected.clone(),
        );
        registry.register(
            "narad_http_requests",
            "HTTP requests by route, method and status",
            m.http_requests.clone(),
        );
        registry.register(
            "narad_http_request_duration_seconds",
            "HTTP request latency",
            m.http_duration.clone(),
        );
        registry.register(
            "narad_consumer_lag_messages",
            "messages not yet acked (next offset - frontier - acked ahead)",
            m.unacked.clone(),
        );
        registry.register(
            "narad_in_flight_messages",
            "leased messages awaiting ack",
            m.in_flight.clone(),
        );
        registry.register(
            "narad_delayed_messages",
            "messages seen by consumers but not yet due",
            m.delayed.clone(),
        );
        registry.register(
            "narad_partition_next_offset",
            "next offset to be written",
            m.next_offset.clone(),
        );
        registry.register(
            "narad_partition_size_bytes",
            "bytes of log on local disk",
            m.partition_bytes.clone(),
        );
        registry.register(
            "narad_partition_segments",
            "segments on local disk",
            m.segments.clone(),
        );
        registry.register(
            "narad_consume_waiters",
            "readers long-polling a topic",
            m.waiters.clone(),
        );
        registry.register(
            "narad_topic_epoch",
            "a topic's failover epoch (one more at every promotion)",
            m.topic_epoch.clone(),
        );
        registry.register(
            "narad_topic_read_only",
            "1 while a topic is a mirror of another cluster's or demoted (no produces, no leases)",
            m.topic_read_only.clone(),
        );
        registry.register(
            "narad_fanout_lag_messages",
            "parent records not yet copied to a fan-out child",
            m.fanout_lag.clone(),
        );
        registry.register(
            "narad_fanout_due_lag_seconds",
            "delay children: how far past its due time the oldest uncopied due record is",
            m.fanout_due_lag.clone(),
        );
        registry.register(
            "narad_remote_child_lag_seconds",
            "remote children: how long the oldest record not yet accepted by the remote has waited",
            m.remote_lag.clone(),
        );
        registry.register(
            "narad_data_dir_available_bytes",
            "bytes an unprivileged writer may still use on the data directory's filesystem",
            m.disk_available.clone(),
        );
        registry.register(
            "narad_data_dir_capacity_bytes",
            "size of the data directory's filesystem",
            m.disk_capacity.clone(),
        );
        registry.register("narad_topics", "topics", m.topics.clone());
        registry.register(
            "narad_http_request_bytes_in_flight",
            "request body bytes held by requests being served (bounded by max_request_bytes_in_flight)",
            m.request_bytes_in_flight.clone(),
        );
        registry.register(
            "narad_tail_cache_bytes",
            "bytes the tail caches of all open partitions hold (bounded by tail_cache_bytes)",
            m.tail_cache_bytes.clone(),
        );
        registry.register(
            "narad_open_partition_logs",
            "partition logs with open files",
            m.open_logs.clone(),
        );
        *m.registry.lock() = registry;
        m
    }

    /// Samples state gauges from the broker and encodes everything in the text format.
    pub fn render(&self, broker: Option<&Broker>) -> String {
        self.process.sample();
        for f in [
            &self.unacked,
            &self.in_flight,
            &self.delayed,
            &self.next_offset,
            &self.partition_bytes,
            &self.segments,
        ] {
            f.clear();
        }
        self.waiters.clear();
        self.topic_epoch.clear();
        self.topic_read_only.clear();
        self.fanout_lag.clear();
        self.fanout_due_lag.clear();
        self.remote_lag.clear();
        if let Some(b) = broker {
            let names = b.topic_names();
            self.topics.set(names.len() as i64);
            let mut open = 0;
            for name in names {
                let Ok(info) = b.topic_info(&name) else {
                    continue;
                };
                self.waiters
                    .get_or_create(&TopicLabels {
                        topic: name.clone(),
                    })
                    .set(info.waiters as i64);
                if let Ok(role) = b.with_topic_meta(&name, |m| m.role) {
                    let l = TopicLabels {
                        topic: name.clone(),
                    };
                    self.topic_epoch
                        .get_or_create(&l)
                        .set(role.epoch().min(i64::MAX as u64) as i64);
                    self.topic_read_only
                        .get_or_create(&l)
                        .set(i64::from(!role.is_primary()));
                }
                for c in b.children(&name).unwrap_or_default() {
                    let l = ChildLabels {
                        parent: name.clone(),
                        child: c.name.clone(),
                    };
                    self.fanout_lag.get_or_create(&l).set(c.lag_messages as i64);
                    self.fanout_due_lag.get_or_create(&l).set(c.due_lag_seconds);
                    if let Some(r) = &c.remote {
                        self.remote_lag.get_or_create(&l).set(r.lag_seconds);
                    }
                }
                for p in info.partitions {
                    let l = PartitionLabels {
                        topic: name.clone(),
                        partition: p.partition,
                    };
                    self.unacked.get_or_create(&l).set(p.queue.unacked as i64);
                    self.in_flight
                        .get_or_create(&l)
                        .set(p.queue.in_flight as i64);
                    self.delayed.get_or_create(&l).set(p.queue.delayed as i64);
                    self.next_offset
                        .get_or_create(&l)
                        .set(p.log.next_offset as i64);
                    self.partition_bytes
                        .get_or_create(&l)
                        .set(p.log.bytes as i64);
                    self.segments.get_or_create(&l).set(p.log.segments as i64);
                    open += i64::from(p.open);
                }
            }
            self.open_logs.set(open);
            // a failed statvfs leaves the last figures (never a false "disk full")
            if let Ok(fs) = rustix::fs::statvfs(b.data_dir()) {
                let unit = fs.f_frsize;
                self.disk_available
                    .set(fs.f_bavail.saturating_mul(unit).min(i64::MAX as u64) as i64);
                self.disk_capacity
                    .set(fs.f_blocks.saturating_mul(unit).min(i64::MAX as u64) as i64);
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry.lock())
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series kept in `common_http` is one the server can answer: its route and method are
    /// in the route table (a pattern spelled differently would silently never be kept).
    #[test]
    fn common_http_series_are_routes() {
        for (route, method, _) in COMMON_HTTP {
            assert!(
                crate::http::ROUTES.contains(&(method, route)),
                "{method} {route} is not a route"
            );
        }
    }

    #[test]
    fn common_and_other_answers_count_alike() {
        let m = Metrics::new();
        let labels = |status| HttpLabels {
            route: "/v1/topics/{topic}/produce",
            method: "POST",
            status,
        };
        for _ in 0..3 {
            m.observe_http(&labels(202), 0.001);
        }
        m.observe_http(&labels(400), 0.001);
        assert_eq!(m.http_requests.get_or_create(&labels(202)).get(), 3);
        assert_eq!(m.http_requests.get_or_create(&labels(400)).get(), 1);
        let text = m.render(None);
        assert!(text.contains(
            r#"narad_http_request_duration_seconds_count{route="/v1/topics/{topic}/produce",method="POST",status="202"} 3"#
        ), "{text}");
    }
}
