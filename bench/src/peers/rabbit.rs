//! RabbitMQ quorum queue: persistent messages with publisher confirms (a confirm means the
//! message is on a quorum of disks, here the single node's fsynced log), manual acks.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer};

use crate::target::{BenchError, Conn, Received, Result, Target};

pub struct RabbitQuorum {
    pub url: String,
    pub queue: String,
}

fn err(e: lapin::Error) -> BenchError {
    BenchError::new("amqp", e)
}

impl RabbitQuorum {
    async fn channel(&self) -> Result<(Connection, Channel)> {
        let conn = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(|e| BenchError::new("connect", e))?;
        let ch = conn.create_channel().await.map_err(err)?;
        Ok((conn, ch))
    }
}

impl Target for RabbitQuorum {
    type Conn = RabbitConn;

    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    async fn prepare(&self, _partitions: u32) -> Result<()> {
        let (_conn, ch) = self.channel().await?;
        ch.queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .map_err(err)?;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        ch.queue_declare(
            self.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .map_err(err)?;
        Ok(())
    }

    async fn connect(&self, worker: usize) -> Result<RabbitConn> {
        let (conn, ch) = self.channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(err)?;
        Ok(RabbitConn {
            _conn: conn,
            ch,
            queue: self.queue.clone(),
            tag: format!("c{worker}"),
            consumer: None,
            prefetch: 0,
        })
    }

    fn notes(&self) -> Vec<String> {
        vec![
            "RabbitMQ quorum queue, persistent messages, publisher confirms awaited before counting, \
             manual acks (batch = ack multiple); consumers use basic.consume with prefetch = batch size"
                .into(),
        ]
    }
}

pub struct RabbitConn {
    _conn: Connection,
    ch: Channel,
    queue: String,
    tag: String,
    consumer: Option<Consumer>,
    prefetch: u16,
}

impl Conn for RabbitConn {
    type Token = u64;

    async fn produce(&mut self, payloads: &[Bytes]) -> Result<()> {
        let mut confirms = Vec::with_capacity(payloads.len());
        for p in payloads {
            let c = self
                .ch
                .basic_publish(
                    "".into(),
                    self.queue.as_str().into(),
                    BasicPublishOptions::default(),
                    p,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .map_err(err)?;
            confirms.push(c);
        }
        for c in confirms {
            match c.await.map_err(err)? {
                Confirmation::Ack(_) => {}
                other => return Err(BenchError::new("nack", format!("{other:?}"))),
            }
        }
        Ok(())
    }

    async fn consume(&mut self, max: usize, wait: Duration) -> Result<Vec<Received<u64>>> {
        let max = max.clamp(1, u16::MAX as usize);
        if self.consumer.is_none() || self.prefetch != max as u16 {
            self.ch
                .basic_qos(max as u16, BasicQosOptions::default())
                .await
                .map_err(err)?;
            if self.consumer.is_none() {
                let c = self
                    .ch
                    .basic_consume(
                        self.queue.as_str().into(),
                        self.tag.as_str().into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(err)?;
                self.consumer = Some(c);
            }
            self.prefetch = max as u16;
        }
        let consumer = self.consumer.as_mut().expect("set above");
        let mut out = Vec::new();
        // the first delivery may wait; the rest only take what has already arrived
        let first =
            match tokio::time::timeout(wait.max(Duration::from_millis(1)), consumer.next()).await {
                Err(_) => return Ok(out),
                Ok(None) => return Err(BenchError::new("amqp", "consumer cancelled")),
                Ok(Some(d)) => d.map_err(err)?,
            };
        out.push(Received {
            payload: Bytes::from(first.data),
            token: first.delivery_tag,
        });
        while out.len() < max {
            let next = futures_util::FutureExt::now_or_never(consumer.next());
            match next {
                Some(Some(d)) => {
                    let d = d.map_err(err)?;
                    out.push(Received {
                        payload: Bytes::from(d.data),
                        token: d.delivery_tag,
                    });
                }
                _ => break,
            }
        }
        Ok(out)
    }

    async fn ack(&mut self, tokens: Vec<u64>) -> Result<()> {
        let Some(&last) = tokens.iter().max() else {
            return Ok(());
        };
        // every earlier delivery on this channel was received by this worker and is being acked
        // now, so one `multiple` ack settles the batch
        self.ch
            .basic_ack(
                last,
                BasicAckOptions {
                    multiple: tokens.len() > 1,
                },
            )
            .await
            .map_err(err)
    }
}
