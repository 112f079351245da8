//! Produce: validate every message, group by partition, append (fsync), then wake readers.

use super::*;

impl Broker {
    /// Produces `messages` all-or-none with respect to validation: every message is checked
    /// before anything is written. Returns once every message is durable.
    pub async fn produce(
        &self,
        topic_name: &str,
        messages: Vec<ProduceMessage>,
    ) -> Result<Vec<Produced>, BrokerError> {
        self.check_running()?;
        let topic = self.topic(topic_name)?;
        let (cfg, role) = {
            let meta = topic.meta.read();
            if meta.parent.as_ref().is_some_and(|l| l.delay_ms > 0) {
                // (the parent is not named: the producer may not be allowed to see it)
                return Err(BrokerError::FanoutConflict(format!(
                    "'{topic_name}' is a delay child: it only receives copies from its parent"
                )));
            }
            (meta.config.clone(), meta.role)
        };
        // a mirror indexes what its link brings by origin as it takes it (see `progress`)
        let mirror_of = match role {
            crate::catalog::TopicRole::Mirror { of, .. } => Some(of),
            _ => None,
        };
        let n = cfg.partitions;
        let total = messages.len();
        let spread = self.spread(&topic, n, &messages);
        let mut placed: Vec<(u32, usize, NewRecord)> = Vec::with_capacity(total);
        let mut bytes = 0u64;
        for (index, m) in messages.into_iter().enumerate() {
            bytes += m.payload.len() as u64;
            // a malformed field (400) is reported before a size that is merely over this
            // topic's limit (413)
            let delay = m.delay_ms.unwrap_or(cfg.delay_ms);
            if !(0..=MAX_DELAY_MS).contains(&delay) {
                return Err(BrokerError::InvalidMessage {
                    index,
                    reason: format!("delay_ms must be between 0 and {MAX_DELAY_MS}"),
                });
            }
            if m.payload.len() as u64 > cfg.max_message_bytes {
                return Err(BrokerError::MessageTooLarge {
                    index,
                    size: m.payload.len(),
                    max: cfg.max_message_bytes,
                });
            }
            let partition = match (m.partition, &m.key) {
                (Some(p), _) if p >= n => {
                    return Err(BrokerError::PartitionOutOfRange {
                        index: Some(index),
                        partition: p,
                        partitions: n,
                    });
                }
                (Some(p), _) => p,
                (None, Some(k)) => partition_for_key(k, n),
                (None, None) => spread.place(),
            };
            placed.push((
                partition,
                index,
                NewRecord {
                    key: m.key,
                    headers: m.headers,
                    payload: m.payload,
                    delay_ms: delay as u32,
                },
            ));
        }
        // by partition, in request order within each (a stable sort: no map per request)
        placed.sort_by_key(|&(p, _, _)| p);
        // in a cluster only a partition's owner writes it (the caller routed it here); a
        // single node's topics name no owners, and skip the scan
        {
            let meta = topic.meta.read();
            if !meta.owners.is_empty()
                && let Some(&(p, _, _)) = placed.iter().find(|(p, _, _)| !self.is_local(&meta, *p))
            {
                return Err(BrokerError::NotOwner {
                    topic: topic_name.to_owned(),
                    partition: p,
                    owner: meta.owners[p as usize],
                });
            }
        }
        // Every partition's log stays open until the batch is written, so a batch that spans
        // more partitions than may be open at once would wait for a slot it holds itself:
        // refuse it for good rather than with a retryable 503 it can never get past.
        let spanned = placed.len().min(1) + placed.windows(2).filter(|w| w[0].0 != w[1].0).count();
        let max_open = self.open_logs.max();
        if spanned > max_open {
            return Err(BrokerError::BatchSpansTooManyLogs {
                partitions: spanned,
                max: max_open,
            });
        }
        let parts = topic.partitions();
        // a partition frozen for a move takes nothing; one being frozen waits for these
        let mut busy = Vec::new();
        for &(p, _, _) in &placed {
            if busy.last().is_some_and(|&(q, _)| q == p) {
                continue;
            }
            match parts[p as usize].enter() {
                Some(b) => busy.push((p, b)),
                None => {
                    return Err(BrokerError::PartitionMoving {
                        topic: topic_name.to_owned(),
                        partition: p,
                    });
                }
            }
        }
        let mut results = vec![
            Produced {
                partition: 0,
                offset: 0
            };
            total
        ];
        // Open every log first, so no append starts unless all can be attempted.
        let mut batches: Vec<(u32, Vec<usize>, Vec<NewRecord>, _)> = Vec::new();
        for (p, index, record) in placed {
            match batches.last_mut() {
                Some((last, indices, records, _)) if *last == p => {
                    indices.push(index);
                    records.push(record);
                }
                _ => {
                    let log = self.log_of(&parts[p as usize]).await?;
                    batches.push((p, vec![index], vec![record], log));
                }
            }
        }
        // Every partition's appends are queued before any is awaited, so they share the
        // write-ahead log's next round (one fsync for all of them).
        let submitted: Vec<_> = batches
            .into_iter()
            .map(|(p, indices, records, log)| (p, indices, log.submit(records)))
            .collect();
        let mut outcomes = Vec::with_capacity(submitted.len());
        for (p, indices, rx) in submitted {
            let result = match rx {
                Ok(rx) => match rx.await {
                    // (a mirror keeps the records to index them)
                    Ok(r) => r.map(|(appended, records)| {
                        (
                            appended,
                            if mirror_of.is_some() {
                                records
                            } else {
                                Vec::new()
                            },
                        )
                    }),
                    Err(_) => Err(crate::log::LogError::Closed),
                },
                Err(e) => Err(e),
            };
            outcomes.push((p, indices, result));
        }
        let mut touched = Vec::new();
        let mut taken = Vec::new();
        let mut first_err = None;
        for (p, indices, result) in outcomes {
            match result {
                Ok((appended, records)) => {
                    if !records.is_empty() {
                        taken.push((p, appended.base_offset, records));
                    }
                    for (i, idx) in indices.into_iter().enumerate() {
                        results[idx] = Produced {
                            partition: p,
                            offset: appended.base_offset + i as u64,
                        };
                    }
                    touched.push((p, appended.base_offset + u64::from(appended.count)));
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let now = self.clock.now_ms();
        for &(p, end) in &touched {
            let part = &parts[p as usize];
            part.touch(now);
            part.queue.lock().on_append(end);
        }
        if let Some(source) = mirror_of {
            for (p, base, records) in &taken {
                self.index_taken(&topic, source, *p, *base, records);
            }
        }
        if !touched.is_empty() {
            topic.appended.notify_waiters();
            self.dispatch(&topic).await;
        }
        drop(busy);
        if let Some(e) = first_err {
            return Err(e.into());
        }
        let (messages, volume) = topic.series.produced(&self.metrics, &topic.label);
        messages.inc_by(total as u64);
        volume.inc_by(bytes);
        Ok(results)
    }
}

/// Where a request's messages with neither key nor partition go: all to one partition, the
/// next of the topic's round-robin cursor, which moves one partition per request (sticky, as
/// Kafka's producers place keyless records). Batch after batch reaches every partition, and a
/// batch costs the same however many partitions the topic has: spread over all of them, a
/// batch of 100 cost twice the CPU per message on 64 partitions as on one (a group, a
/// segment write and a reply per partition). The partition is one the request may open
/// beside the ones its other messages name: among those when they already name
/// `max_open_logs` (a batch is never refused for a spread it did not ask for). A single node
/// and a cluster member taking a produce for other owners place with the same spread (the
/// member with its own `max_open_logs`: members are expected to share their storage
/// settings).
#[derive(Debug, Clone, Copy)]
pub struct KeylessSpread {
    partition: u32,
}

impl KeylessSpread {
    /// The partition of the request's keyless messages.
    pub fn place(&self) -> u32 {
        self.partition
    }
}

impl Broker {
    /// The spread of `messages`' keyless messages on topic `topic_name` (moves its cursor).
    pub fn keyless_spread(
        &self,
        topic_name: &str,
        messages: &[ProduceMessage],
    ) -> Result<KeylessSpread, BrokerError> {
        let topic = self.topic(topic_name)?;
        let n = topic.meta.read().config.partitions;
        Ok(self.spread(&topic, n, messages))
    }

    fn spread(&self, topic: &Topic, n: u32, messages: &[ProduceMessage]) -> KeylessSpread {
        let keyless = messages
            .iter()
            .filter(|m| m.partition.is_none() && m.key.is_none())
            .count();
        if keyless == 0 {
            return KeylessSpread { partition: 0 };
        }
        let slot = topic.produce_rr.fetch_add(1, Ordering::Relaxed);
        let max_open = self.open_logs.max();
        // (fewer named messages than the budget name fewer partitions: no key is hashed)
        if messages.len() - keyless >= max_open {
            let mut named: Vec<u32> = messages
                .iter()
                .filter_map(|m| match (m.partition, &m.key) {
                    (Some(p), _) => Some(p),
                    (None, Some(k)) => Some(partition_for_key(k, n)),
                    (None, None) => None,
                })
                .collect();
            named.sort_unstable();
            named.dedup();
            if named.len() >= max_open {
                return KeylessSpread {
                    partition: named[(slot % named.len() as u64) as usize],
                };
            }
        }
        KeylessSpread {
            partition: (slot % u64::from(n.max(1))) as u32,
        }
    }
}
