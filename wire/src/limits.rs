//! The API's per-request limits that both a member's HTTP handlers and the calls members make
//! on each other enforce (a member forwarding a request must not ask its owner for more than
//! a client could).

/// Most messages one consume answers (`max`, 1 to this).
pub const MAX_CONSUME_BATCH: u64 = 100;

/// Most receipt handles one batch ack, extend or nack takes.
pub const MAX_BATCH_ACK: usize = 100;
