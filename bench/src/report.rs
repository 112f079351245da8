//! Renders bench results (JSON lines of [`RunResult`]) as the Markdown table in
//! `docs/benchmarks.md`: absolute figures per broker and Narad's ratio to each peer.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Deserialize;

use crate::stats::{Latency, Summary};

/// The parts of a result line the report reads (a subset of `RunResult`).
#[derive(Debug, Deserialize)]
pub struct ResultLine {
    pub target: String,
    pub config: ConfigLine,
    pub summary: Summary,
    pub e2e_latency_ms: Option<Latency>,
    pub cpu_ms_per_msg: Option<f64>,
    #[serde(default)]
    pub broker_cpu_s: Option<f64>,
    #[serde(default)]
    pub client_cpu_s: Option<f64>,
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct ConfigLine {
    pub workload: String,
    pub connections: usize,
    pub consumers: usize,
    pub waiters: usize,
    pub message_bytes: usize,
    pub batch: usize,
    pub rate: Option<f64>,
}

impl ConfigLine {
    fn scenario(&self) -> String {
        let size = self.message_bytes;
        match self.workload.as_str() {
            "produce" => format!(
                "produce, batch {}, {size} B, {} conns{}",
                self.batch,
                self.connections,
                rate(self.rate)
            ),
            "consume" => format!(
                "consume + ack, max {}, {size} B, {} conns",
                self.batch, self.connections
            ),
            "flow" => format!(
                "full flow, batch {}, {size} B, {} producers + {} consumers{}",
                self.batch,
                self.connections,
                self.consumers,
                rate(self.rate)
            ),
            "fanin" => format!(
                "long-poll fan-in, {} idle readers{}",
                self.waiters,
                rate(self.rate)
            ),
            other => other.to_owned(),
        }
    }
}

fn rate(r: Option<f64>) -> String {
    r.map(|r| format!(", open loop {r:.0}/s"))
        .unwrap_or_default()
}

/// The columns, in order; Narad's ratio is given against each of the others.
const TARGETS: [&str; 5] = ["narad", "http-noop", "redis", "rabbitmq", "nats"];

/// Whether `target` is measured on this scenario at all. The no-op HTTP ceiling stores
/// nothing, so only single-message produce means anything against it: its other cells read
/// "n/a", while a missing figure of a target that should have one reads "–".
fn measures(target: &str, c: &ConfigLine) -> bool {
    target != "http-noop" || (c.workload == "produce" && c.batch == 1)
}

/// The text for a cell with no result.
fn missing(target: &str, c: &ConfigLine) -> String {
    if measures(target, c) { "–" } else { "n/a" }.into()
}

fn cell(r: &ResultLine) -> String {
    let s = &r.summary;
    let mut c = if r.config.workload == "fanin" {
        match r.cpu_ms_per_msg {
            Some(cpu) => format!("{cpu:.3} ms CPU/msg ({} delivered)", s.messages),
            None => format!("{} delivered (no CPU figure)", s.messages),
        }
    } else {
        let lat = r.e2e_latency_ms.as_ref().unwrap_or(&s.latency_ms);
        let what = if r.e2e_latency_ms.is_some() {
            "e2e "
        } else {
            ""
        };
        let mut c = format!(
            "{:.0} msg/s, {what}p50 {:.2} / p99 {:.2} ms",
            s.msgs_per_s, lat.p50, lat.p99
        );
        // the broker's own CPU per message: what the throughput costs, independent of noise
        if let Some(cpu) = r.broker_cpu_s.filter(|_| s.messages > 0) {
            let _ = write!(c, ", {:.1} µs CPU/msg", cpu * 1e6 / s.messages as f64);
            // and the load generator's, on the same cores: the two together bound the rate
            if let Some(client) = r.client_cpu_s {
                let _ = write!(c, " (+ {:.1} client)", client * 1e6 / s.messages as f64);
            }
        }
        c
    };
    let errors: u64 = s.errors.values().sum();
    if errors > 0 {
        let _ = write!(c, " **{errors} errors** {:?}", s.errors);
    }
    c
}

/// Narad's advantage: throughput ratio, or the peer's CPU per message over Narad's for fan-in
/// (> 1 means Narad is better either way).
fn ratio(narad: &ResultLine, peer: &ResultLine) -> String {
    if narad.config.workload == "fanin" {
        match (narad.cpu_ms_per_msg, peer.cpu_ms_per_msg) {
            (Some(n), Some(p)) if n > 0.0 => format!("{:.2}×", p / n),
            _ => "–".into(),
        }
    } else if peer.summary.msgs_per_s > 0.0 {
        format!("{:.2}×", narad.summary.msgs_per_s / peer.summary.msgs_per_s)
    } else {
        "–".into()
    }
}

pub fn parse_lines(text: &str) -> Result<Vec<ResultLine>, serde_json::Error> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect()
}

/// The Markdown table: one row per scenario, in first-seen order.
pub fn table(results: &[ResultLine]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut rows: BTreeMap<String, BTreeMap<&str, &ResultLine>> = BTreeMap::new();
    for r in results {
        let key = r.config.scenario();
        if !order.contains(&key) {
            order.push(key.clone());
        }
        rows.entry(key).or_default().insert(r.target.as_str(), r);
    }
    let mut out = String::from("| scenario |");
    for t in TARGETS {
        let _ = write!(out, " {t} |");
    }
    for peer in &TARGETS[1..] {
        let _ = write!(out, " narad ÷ {peer} |");
    }
    out += "\n|---|";
    out += &"---|".repeat(2 * TARGETS.len() - 1);
    out.push('\n');
    for key in &order {
        let row = &rows[key];
        // every row holds at least the result that named it
        let Some(config) = row.values().next().map(|r| &r.config) else {
            continue;
        };
        let _ = write!(out, "| {key} |");
        for t in TARGETS {
            let c = row.get(t).map_or_else(|| missing(t, config), |r| cell(r));
            let _ = write!(out, " {c} |");
        }
        for peer in &TARGETS[1..] {
            let r = match (row.get("narad"), row.get(peer)) {
                (Some(n), Some(p)) => ratio(n, p),
                (_, None) if !measures(peer, config) => "n/a".into(),
                _ => "–".into(),
            };
            let _ = write!(out, " {r} |");
        }
        out.push('\n');
    }
    let mut notes: BTreeMap<&str, &str> = BTreeMap::new();
    for r in results {
        for n in &r.notes {
            notes.entry(r.target.as_str()).or_insert(n.as_str());
        }
    }
    out += "\nHow each broker was driven:\n\n";
    for (t, n) in notes {
        let _ = writeln!(out, "- **{t}**: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(target: &str, workload: &str, rate: f64, cpu: Option<f64>) -> String {
        serde_json::json!({
            "target": target,
            "config": {"workload": workload, "connections": 64, "consumers": 0, "waiters": 10,
                       "message_bytes": 256, "batch": 1, "rate": null},
            "summary": {"elapsed_s": 1.0, "messages": 10, "requests": 10, "msgs_per_s": rate,
                        "mb_per_s": 1.0, "errors": {},
                        "latency_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0, "p999": 4.0,
                                       "max": 5.0, "samples": 10}},
            "e2e_latency_ms": null, "cpu_ms_per_msg": cpu, "notes": [format!("{target} note")]
        })
        .to_string()
    }

    #[test]
    fn ratios_per_scenario() {
        let text = [
            line("narad", "produce", 30000.0, None),
            line("redis", "produce", 20000.0, None),
            line("narad", "fanin", 0.0, Some(0.1)),
            line("nats", "fanin", 0.0, Some(0.3)),
        ]
        .join("\n");
        let t = table(&parse_lines(&text).unwrap());
        assert!(t.contains("| produce, batch 1, 256 B, 64 conns |"), "{t}");
        assert!(t.contains("1.50×"), "{t}");
        assert!(t.contains("3.00×"), "{t}");
        assert!(t.contains("- **redis**: redis note"), "{t}");
    }

    /// The cells of the row whose scenario starts with `scenario`.
    fn row<'t>(table: &'t str, scenario: &str) -> Vec<&'t str> {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("| {scenario}")))
            .unwrap_or_else(|| panic!("no row {scenario} in\n{table}"));
        line.trim_matches('|').split(" | ").map(str::trim).collect()
    }

    /// The no-op HTTP ceiling runs only single-message produce: it gets a column and a ratio
    /// there, "n/a" in every other row, while a peer not run reads "–".
    #[test]
    fn a_target_measured_on_some_scenarios_reads_n_a_elsewhere() {
        let text = [
            line("narad", "produce", 30000.0, None),
            line("http-noop", "produce", 60000.0, None),
            line("narad", "consume", 20000.0, None),
        ]
        .join("\n");
        let t = table(&parse_lines(&text).unwrap());
        let header = row(&t, "scenario");
        assert_eq!(header[2], "http-noop", "{t}");
        assert_eq!(header[6], "narad ÷ http-noop", "{t}");
        let produce = row(&t, "produce, batch 1");
        assert!(produce[2].starts_with("60000 msg/s"), "{t}");
        assert_eq!(produce[3], "–", "redis was not run: {t}");
        assert_eq!(produce[6], "0.50×", "{t}");
        let consume = row(&t, "consume + ack");
        assert_eq!(consume[2], "n/a", "{t}");
        assert_eq!(consume[6], "n/a", "{t}");
        assert_eq!(consume[7], "–", "{t}");
        assert_eq!(
            t.lines().nth(1),
            Some("|---|---|---|---|---|---|---|---|---|---|"),
            "{t}"
        );
        assert!(t.contains("- **http-noop**: http-noop note"), "{t}");
    }

    /// The broker's CPU per message, and the load generator's beside it when the line has it
    /// (older lines do not).
    #[test]
    fn cells_give_broker_and_client_cpu_per_message() {
        let mut with: serde_json::Value =
            serde_json::from_str(&line("narad", "produce", 30000.0, None)).unwrap();
        with["broker_cpu_s"] = serde_json::json!(0.0004);
        with["client_cpu_s"] = serde_json::json!(0.00025);
        let mut without: serde_json::Value =
            serde_json::from_str(&line("redis", "produce", 20000.0, None)).unwrap();
        without["broker_cpu_s"] = serde_json::json!(0.0003);
        let text = format!("{with}\n{without}");
        let t = table(&parse_lines(&text).unwrap());
        let produce = row(&t, "produce, batch 1");
        assert!(
            produce[1].ends_with(", 40.0 µs CPU/msg (+ 25.0 client)"),
            "{t}"
        );
        assert!(produce[3].ends_with(", 30.0 µs CPU/msg"), "{t}");
    }
}
