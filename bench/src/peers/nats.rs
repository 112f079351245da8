//! NATS JetStream: a file-storage stream with a durable pull consumer and explicit acks.
//! Publishes count once the server's PubAck arrived. Debian's nats-server 2.9 does not fsync per
//! message (it syncs the file store periodically), so its figures are not fsync-per-2xx.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, Context, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::target::{BenchError, Conn, Received, Result, Target};

const SUBJECT: &str = "bench.q";
const DURABLE: &str = "bench";

pub struct NatsJetStream {
    pub url: String,
    pub stream: String,
}

fn err(cause: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::new(cause, e)
}

impl NatsJetStream {
    async fn context(&self) -> Result<Context> {
        let client = async_nats::connect(&self.url)
            .await
            .map_err(|e| err("connect", e))?;
        Ok(jetstream::new(client))
    }
}

impl Target for NatsJetStream {
    type Conn = NatsConn;

    fn name(&self) -> &'static str {
        "nats"
    }

    async fn prepare(&self, _partitions: u32) -> Result<()> {
        let js = self.context().await?;
        let _ = js.delete_stream(&self.stream).await;
        let s = js
            .create_stream(stream::Config {
                name: self.stream.clone(),
                subjects: vec![SUBJECT.into()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| err("setup", e))?;
        s.create_consumer(pull::Config {
            durable_name: Some(DURABLE.into()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: 1_000_000,
            max_waiting: 4096,
            ack_wait: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .map_err(|e| err("setup", e))?;
        Ok(())
    }

    async fn connect(&self, _worker: usize) -> Result<NatsConn> {
        let js = self.context().await?;
        let stream = js
            .get_stream(&self.stream)
            .await
            .map_err(|e| err("setup", e))?;
        let consumer: PullConsumer = stream
            .get_consumer(DURABLE)
            .await
            .map_err(|e| err("setup", e))?;
        Ok(NatsConn { js, consumer })
    }

    fn notes(&self) -> Vec<String> {
        vec![
            "NATS JetStream, file storage, durable pull consumer with explicit acks, one client \
             connection per worker; a publish counts once its PubAck arrived. nats-server 2.9 \
             (Debian) does not fsync per message: it syncs the store in the background, so its \
             figures are NOT fsync-before-ack"
                .into(),
        ]
    }
}

pub struct NatsConn {
    js: Context,
    consumer: PullConsumer,
}

impl Conn for NatsConn {
    type Token = jetstream::Message;

    async fn produce(&mut self, payloads: &[Bytes]) -> Result<()> {
        let mut acks = Vec::with_capacity(payloads.len());
        for p in payloads {
            acks.push(
                self.js
                    .publish(SUBJECT, p.clone())
                    .await
                    .map_err(|e| err("publish", e))?,
            );
        }
        for a in acks {
            a.await.map_err(|e| err("puback", e))?;
        }
        Ok(())
    }

    async fn consume(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Received<jetstream::Message>>> {
        let mut batch = if wait.is_zero() {
            self.consumer
                .fetch()
                .max_messages(max)
                .messages()
                .await
                .map_err(|e| err("fetch", e))?
        } else {
            self.consumer
                .batch()
                .max_messages(max)
                .expires(wait)
                .messages()
                .await
                .map_err(|e| err("fetch", e))?
        };
        let mut out = Vec::new();
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| err("fetch", e))?;
            out.push(Received {
                payload: m.payload.clone(),
                token: m,
            });
        }
        Ok(out)
    }

    async fn ack(&mut self, tokens: Vec<jetstream::Message>) -> Result<()> {
        for m in tokens {
            m.ack().await.map_err(|e| err("ack", e))?;
        }
        Ok(())
    }
}
