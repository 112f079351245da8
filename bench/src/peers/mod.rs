//! Drivers for the peer brokers, each implementing [`crate::target::Target`].

pub mod nats;
pub mod rabbit;
pub mod redis;
pub mod sqs;
