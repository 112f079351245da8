//! What Narad's HTTP API v1 exchanges, as types: the table of error codes and the bodies of
//! requests and responses. The server, the `narad` CLI and `narad-bench` share this crate, so
//! a field renamed on one side is a compile error (or a failing round-trip test) on the other.
//!
//! ```text
//!   error    ErrorCode (number, string, HTTP status), ErrorBody {error, code}
//!   message  ProduceMessage/ProduceBatch → Produced/BatchProduced
//!            Message, Messages (consume, replay); AckBatch → AckResults
//!   topic    CreateTopic/AlterTopic → Topic, TopicList, TopicDetails;
//!            AttachChild → Children; SchemaVersions
//!   user     CreateUser/SetGrants/SetPassword → User, UserList
//! ```
//!
//! **Readers are tolerant, the check is strict.** Nothing here denies unknown fields or codes:
//! a CLI must keep working against a newer server that adds a field or an error code. The
//! black-box tests (`tests/it/wire.rs`) instead parse real server responses into these types
//! and require that writing them back gives the same JSON, which fails on any field the types
//! miss, misname or mistype.
//!
//! The server renders its hot responses (produce results, consumed messages) by hand for speed;
//! those renderings are held to these types by the same tests.

mod error;
pub mod limits;
mod message;
mod topic;
mod user;

pub use error::{ErrorBody, ErrorCode, RETIRED, UnknownCode};
pub use message::{
    AckBatch, AckResult, AckResults, BatchProduced, Encoding, Message, Messages, PayloadError,
    ProduceBatch, ProduceMessage, Produced, Settle,
};
pub use topic::{
    AlterTopic, AttachChild, Child, Children, CreateTopic, PartitionStats, SchemaVersion,
    SchemaVersions, StartFrom, Topic, TopicConfig, TopicDetails, TopicList, TopicSettings,
};
pub use user::{CreateUser, Grant, GrantAction, SetGrants, SetPassword, User, UserList};

/// `GET /healthz` and `GET /readyz` when they are not errors: `{"status": "ok" | "ready" |
/// "shutting down"}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    pub status: String,
}
