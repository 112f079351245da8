//! What the node RPC counts. Labels are bounded: op names come from a fixed table (unknown
//! numbers share `unknown`), outcomes and refusal reasons are fixed words.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpOutcome {
    pub op: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SideOutcome {
    pub side: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug)]
pub struct RpcMetrics {
    pub calls: Family<OpOutcome, Counter>,
    pub call_seconds: Family<OpLabel, Histogram>,
    pub served: Family<OpOutcome, Counter>,
    pub handshakes: Family<SideOutcome, Counter>,
    pub connections_refused: Counter,
}

impl Default for RpcMetrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            call_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 2.0, 16))
            }),
            served: Family::default(),
            handshakes: Family::default(),
            connections_refused: Counter::default(),
        }
    }
}

impl RpcMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "narad_rpc_calls",
            "node-to-node calls made, by op and outcome (ok, fault, timeout, unreachable, refused, network)",
            self.calls.clone(),
        );
        r.register(
            "narad_rpc_call_seconds",
            "node-to-node call latency as the caller saw it, by op",
            self.call_seconds.clone(),
        );
        r.register(
            "narad_rpc_served",
            "node-to-node requests served, by op and outcome (ok, fault, cancelled, malformed, too_large)",
            self.served.clone(),
        );
        r.register(
            "narad_rpc_handshakes",
            "node rpc handshakes by side and outcome (ok, or why refused: unknown_key, bad_proof, wrong_node, malformed, refused_by_peer, io, timeout)",
            self.handshakes.clone(),
        );
        r.register(
            "narad_rpc_connections_refused",
            "incoming node rpc connections refused because the connection limit was reached",
            self.connections_refused.clone(),
        );
    }

    pub(super) fn called(&self, op: &'static str, outcome: &'static str, took: Duration) {
        self.calls.get_or_create(&OpOutcome { op, outcome }).inc();
        self.call_seconds
            .get_or_create(&OpLabel { op })
            .observe(took.as_secs_f64());
    }

    pub(super) fn served(&self, op: &'static str, outcome: &'static str) {
        self.served.get_or_create(&OpOutcome { op, outcome }).inc();
    }

    pub(super) fn handshake(&self, side: &'static str, outcome: &'static str) {
        self.handshakes
            .get_or_create(&SideOutcome { side, outcome })
            .inc();
    }

    pub(super) fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// How many handshakes ended with `outcome` on `side` (for tests and status).
    pub fn handshakes_with(&self, side: &'static str, outcome: &'static str) -> u64 {
        self.handshakes
            .get_or_create(&SideOutcome { side, outcome })
            .get()
    }
}
