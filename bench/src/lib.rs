//! Narad's measuring tools: a load generator that runs the same workloads against Narad and
//! the brokers a user would pick instead (RabbitMQ, Redis Streams, NATS JetStream), a soak
//! runner, and the message-lifecycle checker that the crash tests use to prove no loss.

pub mod fanout;
pub mod lifecycle;
pub mod narad;
pub mod peers;
pub mod procstat;
pub mod report;
pub mod soak;
pub mod stats;
pub mod target;
pub mod tiering;
pub mod workload;
