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
//!        plane::Plane ──► narad_core::broker::Broker   (a single node; max_open_logs sized
//!               │                                      by fdlimit from RLIMIT_NOFILE)
//!               └──────► forward::Ingress ──► the members owning each partition (a cluster)
//! ```
//!
//! In a cluster, [`cluster`] starts the member (the metastore, the QUIC endpoint), the
//! handlers' [`plane`] reaches partitions other members own through [`forward`] (the calling
//! side, the answering service, the one request enum of node calls, the wire codec), and [`moves`] moves partitions between
//! members and forgets a member lost for good. docs/architecture.md draws the paths.

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
pub mod plane;
pub mod reads;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod users_carry;
pub mod witness;
