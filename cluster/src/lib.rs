//! Narad as a cluster.
//!
//! Layout:
//!
//! ```text
//!   rpc      one QUIC endpoint per node: authenticated connections (cluster secret bound to
//!            the TLS session, node ids proven), a stream per request, bounded everywhere
//!   members  the `cluster_members` list: who the initial voters are and where
//!   meta     the metastore: catalog commands in an openraft state machine, its log and
//!            snapshots on disk, proposals forwarded to the leader over rpc
//! ```

pub mod members;
pub mod meta;
pub mod rpc;

pub use rpc::NodeId;
