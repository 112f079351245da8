//! Redis Streams as a queue: XADD to produce, XREADGROUP (consumer group) to lease, XACK to ack.
//! Durability comes from the server's `appendfsync always`, which `scripts/bench-peers` sets
//! and [`RedisStreams::prepare`] verifies.

use std::time::Duration;

use bytes::Bytes;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use redis::streams::StreamReadReply;

use crate::target::{BenchError, Conn, Received, Result, Target};

const GROUP: &str = "bench";

pub struct RedisStreams {
    pub url: String,
    pub stream: String,
}

fn err(e: redis::RedisError) -> BenchError {
    let cause = if e.is_io_error() { "io" } else { "redis" };
    BenchError::new(cause, e)
}

impl RedisStreams {
    async fn conn(&self) -> Result<MultiplexedConnection> {
        let client = redis::Client::open(self.url.as_str()).map_err(err)?;
        // No response timeout: blocking reads wait as long as the workload asks.
        let cfg = AsyncConnectionConfig::new().set_response_timeout(None);
        client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(err)
    }
}

impl Target for RedisStreams {
    type Conn = RedisConn;

    fn name(&self) -> &'static str {
        "redis"
    }

    async fn prepare(&self, _partitions: u32) -> Result<()> {
        let mut c = self.conn().await?;
        let fsync: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendfsync")
            .query_async(&mut c)
            .await
            .map_err(err)?;
        if fsync.get(1).map(String::as_str) != Some("always") {
            return Err(BenchError::new(
                "setup",
                format!("redis must run with appendfsync always, has {fsync:?}"),
            ));
        }
        redis::cmd("DEL")
            .arg(&self.stream)
            .query_async::<()>(&mut c)
            .await
            .map_err(err)?;
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(GROUP)
            .arg("$")
            .arg("MKSTREAM")
            .query_async::<()>(&mut c)
            .await
            .map_err(err)
    }

    async fn connect(&self, worker: usize) -> Result<RedisConn> {
        Ok(RedisConn {
            con: self.conn().await?,
            stream: self.stream.clone(),
            consumer: format!("c{worker}"),
        })
    }

    fn notes(&self) -> Vec<String> {
        vec![
            "Redis Streams, appendonly yes + appendfsync always (fsync before replying); one stream, \
             consumer group, one multiplexed connection per worker; batches are pipelined XADDs"
                .into(),
        ]
    }
}

pub struct RedisConn {
    con: MultiplexedConnection,
    stream: String,
    consumer: String,
}

impl Conn for RedisConn {
    type Token = String;

    async fn produce(&mut self, payloads: &[Bytes]) -> Result<()> {
        let mut pipe = redis::pipe();
        for p in payloads {
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("*")
                .arg("p")
                .arg(p.as_ref());
        }
        pipe.query_async::<Vec<String>>(&mut self.con)
            .await
            .map(drop)
            .map_err(err)
    }

    async fn consume(&mut self, max: usize, wait: Duration) -> Result<Vec<Received<String>>> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(max);
        if !wait.is_zero() {
            // BLOCK 0 would wait forever, so a zero wait sends no BLOCK at all
            cmd.arg("BLOCK").arg(wait.as_millis().max(1) as u64);
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(">");
        let reply: Option<StreamReadReply> = cmd.query_async(&mut self.con).await.map_err(err)?;
        let mut out = Vec::new();
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for id in key.ids {
                let payload = match id.map.get("p") {
                    Some(redis::Value::BulkString(b)) => Bytes::from(b.clone()),
                    other => {
                        return Err(BenchError::new(
                            "bad response",
                            format!("stream entry without payload: {other:?}"),
                        ));
                    }
                };
                out.push(Received {
                    payload,
                    token: id.id,
                });
            }
        }
        Ok(out)
    }

    async fn ack(&mut self, tokens: Vec<String>) -> Result<()> {
        let n: usize = redis::cmd("XACK")
            .arg(&self.stream)
            .arg(GROUP)
            .arg(&tokens)
            .query_async(&mut self.con)
            .await
            .map_err(err)?;
        if n == tokens.len() {
            Ok(())
        } else {
            Err(BenchError::new(
                "ack refused",
                format!("XACK acked {n} of {}", tokens.len()),
            ))
        }
    }
}
