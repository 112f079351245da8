//! Per-worker counters and latency histograms, merged into one [`Summary`] per run.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in microseconds, 1 µs .. 120 s, 3 significant digits.
const MAX_US: u64 = 120_000_000;

pub struct Stats {
    pub hist: Histogram<u64>,
    pub messages: u64,
    pub requests: u64,
    pub bytes: u64,
    /// Failed requests by cause ("http 503", "io", "timeout", ...): a non-2xx is never a success.
    pub errors: BTreeMap<String, u64>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds"),
            messages: 0,
            requests: 0,
            bytes: 0,
            errors: BTreeMap::new(),
        }
    }
}

impl Stats {
    pub fn ok(&mut self, latency: Duration, messages: u64, bytes: u64) {
        self.record(latency);
        self.requests += 1;
        self.messages += messages;
        self.bytes += bytes;
    }

    pub fn record(&mut self, latency: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, MAX_US);
        self.hist
            .record(us)
            .expect("clamped into the histogram's range");
    }

    pub fn error(&mut self, cause: impl Into<String>) {
        *self.errors.entry(cause.into()).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Stats) {
        self.hist.add(&other.hist).expect("same histogram bounds");
        self.messages += other.messages;
        self.requests += other.requests;
        self.bytes += other.bytes;
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
    }

    pub fn summary(&self, elapsed: Duration) -> Summary {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let q = |p: f64| self.hist.value_at_quantile(p) as f64 / 1000.0;
        Summary {
            elapsed_s: round3(secs),
            messages: self.messages,
            requests: self.requests,
            msgs_per_s: round3(self.messages as f64 / secs),
            mb_per_s: round3(self.bytes as f64 / secs / 1e6),
            latency_ms: Latency {
                p50: q(0.50),
                p90: q(0.90),
                p99: q(0.99),
                p999: q(0.999),
                max: self.hist.max() as f64 / 1000.0,
                samples: self.hist.len(),
            },
            errors: self.errors.clone(),
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub samples: u64,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Summary {
    pub elapsed_s: f64,
    pub messages: u64,
    pub requests: u64,
    pub msgs_per_s: f64,
    pub mb_per_s: f64,
    pub latency_ms: Latency,
    pub errors: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_and_quantiles() {
        let mut a = Stats::default();
        let mut b = Stats::default();
        for i in 1..=100u64 {
            a.ok(Duration::from_millis(i), 1, 10);
        }
        b.ok(Duration::from_secs(500), 2, 20); // clamped, still counted
        b.error("http 503");
        a.merge(&b);
        let s = a.summary(Duration::from_secs(1));
        assert_eq!(s.messages, 102);
        assert_eq!(s.requests, 101);
        assert_eq!(s.errors["http 503"], 1);
        assert!((s.latency_ms.p50 - 51.0).abs() < 0.5, "{:?}", s.latency_ms);
        assert!(s.latency_ms.max >= 119_000.0);
    }
}
