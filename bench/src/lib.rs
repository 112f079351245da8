//! Narad's measuring tools: a load generator that runs the same workloads against Narad and
//! the brokers a user would pick instead (RabbitMQ, Redis Streams, NATS JetStream), a soak
//! runner, the message-lifecycle checker that the crash tests use to prove no loss, and a no-op
//! HTTP server: the ceiling of one request per message on this machine.

pub mod cluster;
pub mod fanout;
pub mod lifecycle;
pub mod mirror;
pub mod moves;
pub mod narad;
pub mod noop;
pub mod owner_loss;
pub mod peers;
pub mod procstat;
pub mod report;
pub mod soak;
pub mod stats;
pub mod target;
pub mod tiering;
pub mod wire;
pub mod workload;
