//! The interface every broker under test implements, so that Narad and its peers run the same
//! workloads through the same client machinery.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

/// Why a request did not succeed. `cause` is the bucket the report counts it under.
#[derive(Debug, thiserror::Error)]
#[error("{cause}: {detail}")]
pub struct BenchError {
    pub cause: String,
    pub detail: String,
}

impl BenchError {
    pub fn new(cause: impl Into<String>, detail: impl ToString) -> Self {
        Self {
            cause: cause.into(),
            detail: detail.to_string(),
        }
    }
}

pub type Result<T> = std::result::Result<T, BenchError>;

/// One received message and what the broker needs to settle it.
pub struct Received<T> {
    pub payload: Bytes,
    pub token: T,
}

/// One client connection (or session) to the broker.
pub trait Conn: Send + 'static {
    type Token: Send + 'static;

    /// Durably produce every payload; `Ok` only once the broker confirmed all of them.
    fn produce(&mut self, payloads: &[Bytes]) -> impl Future<Output = Result<()>> + Send;

    /// Lease up to `max` messages, waiting up to `wait` for the first one.
    fn consume(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Received<Self::Token>>>> + Send;

    /// Acknowledge messages received on this connection (one request for all of them).
    fn ack(&mut self, tokens: Vec<Self::Token>) -> impl Future<Output = Result<()>> + Send;
}

/// A broker under test.
pub trait Target: Send + Sync + 'static {
    type Conn: Conn;

    fn name(&self) -> &'static str;

    /// Creates (or empties) the queue the workload uses.
    fn prepare(&self, partitions: u32) -> impl Future<Output = Result<()>> + Send;

    /// Opens a connection; `worker` names the consumer where the broker wants one.
    fn connect(&self, worker: usize) -> impl Future<Output = Result<Self::Conn>> + Send;

    /// What the reader of the figures must know (durability settings, caveats).
    fn notes(&self) -> Vec<String>;
}
