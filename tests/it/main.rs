//! Black-box tests: each starts the real `narad` binary on 127.0.0.1 with an ephemeral port
//! and a temporary data directory, and talks HTTP to it.

mod api;
mod archive;
mod carried_users;
mod cli;
mod cluster;
mod connections;
mod crash;
mod fanout;
mod hardening;
mod lifecycle;
mod limits;
mod openapi;
mod playbooks;
mod queue;
mod remotes;
mod roles;
mod security;
mod sqs;
mod support;
mod wire;
