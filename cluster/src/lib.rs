//! Narad as a cluster.
//!
//! Layout:
//!
//! ```text
//!   rpc      one QUIC endpoint per node: authenticated connections (cluster secret bound to
//!            the TLS session, node ids proven), a stream per request, bounded everywhere
//!   members  the `cluster_members` list: who the initial voters are and where
//! ```

pub mod members;
pub mod rpc;

pub use rpc::NodeId;
