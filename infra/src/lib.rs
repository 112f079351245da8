//! Narad infra: configuration, the HTTP API, metrics, logging, and the server entry point.
//!
//! ```text
//!   bin (clap) ──► config::ServerConfig ──► server::run(listener, config, shutdown, announce)
//!                                               │
//!                      conn::serve: accept ──► limits (slots, header/idle timeouts, eviction)
//!                                               │ (tls handshake) ──► hyper http1, per connection
//!                                               ▼
//!             http::router ◄── AppState { broker (opened in the background), metrics }
//!               │  /healthz /readyz /metrics /v1/topics/...
//!               ▼
//!        narad_core::broker::Broker   (max_open_logs sized by fdlimit from RLIMIT_NOFILE)
//! ```

pub mod acked_ends;
pub mod cluster;
pub mod config;
pub mod conn;
pub mod fdlimit;
pub mod forward;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod moves;
pub mod reads;
pub mod schema;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod witness;
