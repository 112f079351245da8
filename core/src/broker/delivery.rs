//! Consume, settle (ack, extend, nack) and the per-topic timer that expires leases and ends
//! delays: how records reach the waiters of a topic.

use super::maintenance::TIMER_TASK;
use super::*;

/// A lease length asked for, within the bounds a topic's visibility timeout has.
fn clamp_visibility(ms: i64) -> i64 {
    ms.clamp(
        crate::topic::MIN_VISIBILITY_MS,
        crate::topic::MAX_VISIBILITY_MS,
    )
}

impl Broker {
    /// Leases up to `max` messages, waiting up to `wait` for the first one.
    pub async fn consume(
        &self,
        topic_name: &str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        self.consume_for(topic_name, partition, max, wait, None)
            .await
    }

    /// [`Broker::consume`] with leases of `visibility_ms` (clamped to the topic limits)
    /// instead of the topic's visibility timeout.
    pub async fn consume_for(
        &self,
        topic_name: &str,
        partition: Option<u32>,
        max: usize,
        wait: Duration,
        visibility_ms: Option<i64>,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let visibility_ms = visibility_ms.map(clamp_visibility);
        self.check_running()?;
        let topic = self.topic(topic_name)?;
        if let Some(p) = partition {
            let n = topic.config().partitions;
            if p >= n {
                return Err(BrokerError::PartitionOutOfRange {
                    index: None,
                    partition: p,
                    partitions: n,
                });
            }
            // a partition being rebuilt from the archive has records to deliver that are not
            // back yet: "nothing" would be a lie (a reader draining it would stop)
            if topic
                .partition(p)
                .is_ok_and(|part| part.is_awaiting_rebuild() || part.is_unverified())
            {
                return Err(BrokerError::PartitionMoving {
                    topic: topic_name.to_owned(),
                    partition: p,
                });
            }
        }
        // Readers already in line are served first: a newcomer (even one that does not wait)
        // never takes a message that became deliverable while they were waiting.
        if !topic.waiters.lock().is_empty() {
            self.dispatch(&topic).await;
        }
        let got = self.try_take(&topic, partition, max, visibility_ms).await?;
        if !got.is_empty() || wait.is_zero() || self.draining.load(Ordering::Acquire) {
            self.count_consumed(&topic, got.len() as u64);
            return Ok(got);
        }
        let (tx, rx) = oneshot::channel();
        let id = topic.waiters.lock().push(Waiter {
            id: 0,
            partition,
            max,
            visibility_ms,
            tx,
        });
        let mut parked = Parked {
            broker: self,
            topic: &topic,
            id,
            rx,
            done: false,
        };
        // A message may have arrived between the attempt above and joining the line.
        self.dispatch(&topic).await;
        let outcome = tokio::select! {
            got = &mut parked.rx => Some(got.unwrap_or_default()),
            () = self.clock.sleep(wait) => None,
            () = self.shutdown.notified() => None,
        };
        parked.done = true;
        match outcome {
            // woken with nothing: a dispatch could not read for this reader (asking again
            // gives it the error, or what is there now), or the line went with its topic; a
            // shutdown's drain answers nothing, as it says
            Some(got) if got.is_empty() && !self.draining.load(Ordering::Acquire) => {
                let got = self.try_take(&topic, partition, max, visibility_ms).await?;
                self.count_consumed(&topic, got.len() as u64);
                Ok(got)
            }
            Some(got) => Ok(got),
            None => {
                topic.waiters.lock().remove(id);
                // A dispatcher may have served us just before we left the line (it counted it).
                Ok(parked.rx.try_recv().unwrap_or_default())
            }
        }
    }

    /// One pass over the topic's partitions (or the pinned one), round-robin.
    pub(super) async fn try_take(
        &self,
        topic: &Arc<Topic>,
        only: Option<u32>,
        max: usize,
        visibility_ms: Option<i64>,
    ) -> Result<Vec<Delivery>, BrokerError> {
        if topic.deleted.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        // a mirror (or a demoted primary) leases nothing: its records are another
        // cluster's consumers' to process until it is promoted
        let role = topic.meta.read().role;
        if !role.is_primary() {
            return Err(BrokerError::MirrorReadOnly(format!(
                "topic '{}' is {}: it serves no queue until it is promoted (replay by offset or time works)",
                topic.label.topic,
                role.describe()
            )));
        }
        // nor does a fan-out child of one: its records are copies of the parent's
        let parent = topic
            .meta
            .read()
            .parent
            .as_ref()
            .map(|l| (l.parent.clone(), l.parent_id));
        if let Some((name, id)) = parent
            && let Ok(p) = self.topic(&name)
            && p.id() == id
        {
            let role = p.meta.read().role;
            if !role.is_primary() {
                return Err(BrokerError::MirrorReadOnly(format!(
                    "topic '{}' is a fan-out child of a topic that is {}: it serves no queue until its parent is promoted (replay by offset or time works)",
                    topic.label.topic,
                    role.describe()
                )));
            }
        }
        let cfg = topic.config();
        let parts = topic.partitions();
        let n = parts.len();
        let order: Vec<usize> = match only {
            Some(p) => vec![p as usize],
            None => {
                let start = topic.consume_rr.fetch_add(1, Ordering::Relaxed) as usize % n;
                (0..n).map(|i| (start + i) % n).collect()
            }
        };
        let mut out = Vec::new();
        let mut out_bytes = 0usize;
        // the first record a partition could not read: reported if nothing else is delivered
        let mut unreadable: Option<LogError> = None;
        let now = self.clock.now_ms();
        let max_in_flight = cfg.max_in_flight_per_partition as usize;
        // (in a cluster: only the partitions this node owns, at their owner epoch)
        let owned: Option<Vec<(bool, u64)>> = {
            let meta = topic.meta.read();
            (!meta.owners.is_empty()).then(|| {
                (0..n as u32)
                    .map(|p| (self.is_local(&meta, p), meta.owner_epoch(p)))
                    .collect()
            })
        };
        for i in order {
            if out.len() >= max {
                break;
            }
            let owner_epoch = match owned.as_ref().and_then(|o| o.get(i)) {
                Some(&(false, _)) => continue,
                Some(&(true, e)) => e,
                None => 0,
            };
            let part = &parts[i];
            // frozen for a move: nothing leased from it until it thaws (or moves)
            let Some(_busy) = part.enter() else {
                continue;
            };
            {
                let mut q = part.queue.lock();
                // Appends whose producer went away before telling the queue are still
                // durable: the log's end is the truth.
                if let Some(log) = part.open_log() {
                    q.on_append(log.next_offset());
                }
                let expired = q.expire(now);
                if !expired.is_empty() {
                    self.metrics
                        .lease_expiries
                        .get_or_create(&topic.label)
                        .inc_by(expired.len() as u64);
                }
                q.promote_due(now);
                if !q.may_deliver(max_in_flight) {
                    continue;
                }
            }
            let log = self.log_of(part).await?;
            part.touch(now);
            let mut source = ReadAhead {
                log: &log,
                runs: Vec::new(),
                ahead: (max - out.len()).clamp(1, READ_AHEAD_MAX),
                topic: &topic.label.topic,
                partition: part.index,
                failed: None,
            };
            let leased = {
                let mut q = part.queue.lock();
                // one lease at a time, so the reply stops at MAX_READ_BYTES of payload
                let mut leased = Vec::new();
                while out.len() + leased.len() < max && out_bytes < MAX_READ_BYTES {
                    let Some(l) = q
                        .take(
                            now,
                            1,
                            max_in_flight,
                            visibility_ms.unwrap_or(cfg.visibility_timeout_ms),
                            &mut source,
                        )
                        .pop()
                    else {
                        break;
                    };
                    out_bytes += source.reply_weight(l.offset);
                    leased.push(l);
                }
                if let Some(at) = q.next_wakeup() {
                    self.arm_timer(topic, at);
                }
                leased
            };
            let topic_id = topic.id();
            let mut counted = Vec::with_capacity(leased.len());
            for l in leased {
                let record = match source.get(l.offset) {
                    Some(r) => Some(r.clone()),
                    None => log
                        .read(l.offset, 1, 0)
                        .ok()
                        .and_then(|mut v| v.pop())
                        .filter(|r| r.offset == l.offset),
                };
                let Some(record) = record else {
                    // Unreadable now (e.g. just deleted by retention): give the lease back.
                    let _ = part.queue.lock().unlease(l.offset, l.nonce, now);
                    continue;
                };
                counted.push((l.offset, l.delivery_count));
                out.push(Delivery {
                    partition: part.index,
                    record,
                    receipt_handle: self.handles.encode(&ReceiptHandle {
                        topic_id,
                        partition: part.index,
                        offset: l.offset,
                        nonce: l.nonce,
                        owner_epoch,
                    }),
                    delivery_count: l.delivery_count,
                    lease_deadline_ms: l.deadline_ms,
                });
            }
            // before the reply leaves: a crash from here on keeps these counts
            part.journal_deliveries(&counted);
            if unreadable.is_none() {
                unreadable = source.failed.take();
            }
        }
        // A partition whose next record cannot be read (a damaged frame) is stuck there: an
        // empty answer would pass for an empty queue, so one that has nothing else to give
        // says why (other partitions' messages still go out, and the error is logged).
        match unreadable {
            Some(e) if out.is_empty() => Err(e.into()),
            _ => Ok(out),
        }
    }

    /// Hands deliverable messages to waiting readers, first in line first.
    ///
    /// A pass holds each waiter out of the line while it looks for messages for it. Another
    /// dispatch that runs meanwhile (after an append, say) may find the line empty and leave,
    /// though the held waiter is the one its messages were for; if this pass then gives that
    /// waiter back with nothing, the messages would wait for the next event. So a pass that
    /// gave waiters back goes again when some dispatch missed meanwhile (a bounded number of
    /// times: under a stream of misses every one of them is a dispatch that will come again).
    pub(super) async fn dispatch(&self, topic: &Arc<Topic>) {
        for _ in 0..=MAX_DISPATCH_REPEATS {
            if !self.dispatch_pass(topic).await {
                return;
            }
        }
    }

    /// One pass over the line; each waiter that gets nothing stops it (an unpinned waiter
    /// that finds nothing means nobody can). True if it gave waiters back while another
    /// dispatch missed them.
    async fn dispatch_pass(&self, topic: &Arc<Topic>) -> bool {
        let mut skip_pins: Vec<u32> = Vec::new();
        let mut held = Held {
            topic,
            skipped: Vec::new(),
            done: 0,
            missed_before: topic.waiters.lock().missed(),
            own_misses: 0,
        };
        loop {
            let (w, missed) = topic.waiters.lock().pop_first_except(
                &skip_pins,
                held.skipped.len(),
                std::mem::take(&mut held.done),
            );
            held.own_misses += u64::from(missed);
            let Some(w) = w else { break };
            if w.tx.is_closed() {
                held.done += 1;
                continue;
            }
            let got = match self
                .try_take(topic, w.partition, w.max, w.visibility_ms)
                .await
            {
                Ok(got) => got,
                Err(e) => {
                    // (a partition it cannot read): the reader is woken with nothing and asks
                    // again itself, so the error is its answer rather than a 204 after its wait
                    tracing::warn!(topic = %topic.label.topic, error = %e, "dispatch failed");
                    held.done += 1;
                    let _ = w.tx.send(Vec::new());
                    continue;
                }
            };
            if got.is_empty() {
                #[cfg(test)]
                topic.pause_for_test().await;
                let pinned = w.partition;
                held.skipped.push(w);
                match pinned {
                    Some(p) => {
                        skip_pins.push(p);
                        continue;
                    }
                    None => break,
                }
            }
            held.done += 1;
            let n = got.len() as u64;
            match w.tx.send(got) {
                Ok(()) => self.count_consumed(topic, n),
                // The reader left; give its messages back at once.
                Err(got) => self.release(topic, &got),
            }
        }
        let skipped = std::mem::take(&mut held.skipped);
        let mut line = topic.waiters.lock();
        line.release_held(skipped.len() + std::mem::take(&mut held.done));
        let gave_back = !skipped.is_empty();
        if gave_back {
            line.restore_front(skipped);
        }
        // (this pass's own misses were for waiters it held itself: no reason to go again)
        gave_back && line.missed() - held.own_misses != held.missed_before
    }

    pub(super) fn count_consumed(&self, topic: &Topic, n: u64) {
        if n > 0 {
            topic.series.consumed(&self.metrics, &topic.label).inc_by(n);
        }
    }

    /// Gives leases back that were never handed to the consumer (its reply could not be
    /// sent): the messages are deliverable again at once and the deliveries do not count.
    pub fn give_back(&self, topic_name: &str, deliveries: &[Delivery]) {
        if let Ok(topic) = self.topic(topic_name) {
            self.release(&topic, deliveries);
            topic.given_back.store(true, Ordering::Release);
            topic.timer.notify_one();
        }
    }

    /// [`Broker::give_back`] by receipt handles alone (another cluster member took the
    /// messages for a reader it could not answer). Handles that do not decode, or name
    /// another topic or partition, are passed over.
    pub fn give_back_handles(&self, topic_name: &str, handles: &[String]) {
        let Ok(topic) = self.topic(topic_name) else {
            return;
        };
        let parts = topic.partitions();
        let now = self.clock.now_ms();
        for h in handles {
            if let Ok(h) = self.handles.decode(h)
                && h.topic_id == topic.id()
                && let Some(part) = parts.get(h.partition as usize)
            {
                let _ = part.queue.lock().unlease(h.offset, h.nonce, now);
            }
        }
        topic.given_back.store(true, Ordering::Release);
        topic.timer.notify_one();
    }

    /// Moves the topic's readers' round-robin cursor on and returns where it was (a cluster
    /// member rotates the owners it reads from with it).
    pub fn consume_cursor(&self, topic_name: &str) -> Result<u64, BrokerError> {
        Ok(self
            .topic(topic_name)?
            .consume_rr
            .fetch_add(1, Ordering::Relaxed))
    }

    pub(super) fn release(&self, topic: &Arc<Topic>, deliveries: &[Delivery]) {
        let parts = topic.partitions();
        let now = self.clock.now_ms();
        for d in deliveries {
            if let Ok(h) = self.handles.decode(&d.receipt_handle) {
                let _ = parts[d.partition as usize]
                    .queue
                    .lock()
                    .unlease(h.offset, h.nonce, now);
            }
        }
    }

    /// Takes every message of `topic` written so far out of its queue, on the partitions this
    /// node serves (SQS's PurgeQueue): each is settled as if acked and never delivered again,
    /// leased or not; the log keeps them for replay. Like acks, the change is kept on disk
    /// within `ack_flush_interval_ms` (a crash before that may bring some back: at least
    /// once). Returns how many were waiting or leased, and the partitions not purged because
    /// they are frozen for a move (purge again once it ends).
    pub async fn purge(&self, topic_name: &str) -> Result<(u64, Vec<u32>), BrokerError> {
        self.check_running()?;
        let topic = self.topic(topic_name)?;
        let role = topic.meta.read().role;
        if !role.is_primary() {
            return Err(BrokerError::MirrorReadOnly(format!(
                "topic '{}' is {}: it serves no queue to purge until it is promoted",
                topic.label.topic,
                role.describe()
            )));
        }
        let local: Vec<bool> = {
            let meta = topic.meta.read();
            (0..meta.config.partitions)
                .map(|p| meta.owners.is_empty() || self.is_local(&meta, p))
                .collect()
        };
        let (mut purged, mut frozen) = (0, Vec::new());
        for part in topic.partitions().iter() {
            if !local.get(part.index as usize).copied().unwrap_or(false) {
                continue;
            }
            let Some(_busy) = part.enter() else {
                frozen.push(part.index);
                continue;
            };
            let mut q = part.queue.lock();
            if let Some(log) = part.open_log() {
                q.on_append(log.next_offset());
            }
            let end = q.hwm();
            purged += q.truncate_below(end);
        }
        Ok((purged, frozen))
    }

    pub async fn settle(
        &self,
        topic_name: &str,
        handle: &str,
        action: AckAction,
    ) -> Result<(), BrokerError> {
        let mut results = self.settle_many(topic_name, &[handle], action).await;
        results.pop().expect("one result per handle")
    }

    /// Settles each handle as [`Broker::settle`] would alone, in order, with one result per
    /// handle. The handles of one partition share the wait for a freeze to end, one lock of
    /// its queue and the metrics; the line of waiting readers is served once at the end.
    pub async fn settle_many<H: AsRef<str>>(
        &self,
        topic_name: &str,
        handles: &[H],
        action: AckAction,
    ) -> Vec<Result<(), BrokerError>> {
        let mut results: Vec<Result<(), BrokerError>> = Vec::with_capacity(handles.len());
        // (index into `results`, the handle) of the handles still to apply
        let mut pending: Vec<(usize, ReceiptHandle)> = Vec::with_capacity(handles.len());
        let topic = self.topic(topic_name);
        for (i, handle) in handles.iter().enumerate() {
            let decoded = self.check_running().and_then(|()| {
                self.handles.decode(handle.as_ref()).map_err(|e| match e {
                    HandleError::Malformed => BrokerError::HandleMalformed(e),
                    HandleError::OtherEpoch => BrokerError::LeaseGone(e.to_string()),
                })
            });
            let checked = decoded.and_then(|h| match &topic {
                Err(_) => Err(BrokerError::TopicNotFound(topic_name.to_owned())),
                Ok(topic) if topic.id() != h.topic_id => Err(BrokerError::LeaseGone(
                    "receipt handle belongs to another topic (or an earlier topic of this name)"
                        .into(),
                )),
                Ok(_) => Ok(h),
            });
            match checked {
                Ok(h) => {
                    pending.push((i, h));
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        let Ok(topic) = topic else {
            return results;
        };
        // by partition, in order within each
        pending.sort_by_key(|&(i, h)| (h.partition, i));
        let mut served = false;
        for group in pending.chunk_by(|a, b| a.1.partition == b.1.partition) {
            served |= self
                .settle_in_partition(&topic, topic_name, group, action, &mut results)
                .await;
        }
        if served && !matches!(action, AckAction::Extend | AckAction::ExtendFor(_)) {
            // Freed capacity (ack) or a released message (nack): serve the line.
            self.dispatch(&topic).await;
        }
        results
    }

    /// [`Broker::settle_many`] for the handles of one partition (`group`, all naming it):
    /// writes each one's result into `results`, and says whether any was applied.
    async fn settle_in_partition(
        &self,
        topic: &Arc<Topic>,
        topic_name: &str,
        group: &[(usize, ReceiptHandle)],
        action: AckAction,
        results: &mut [Result<(), BrokerError>],
    ) -> bool {
        let partition = group[0].1.partition;
        // every handle of `group` starts with `Ok(())` in `results`: one turned into an error
        // below (its partition moved) is left out of what follows
        let live = |results: &[Result<(), BrokerError>], i: usize| results[i].is_ok();
        // a partition frozen for a move settles once it thaws; one that moved away (or
        // came back since the lease) has no lease of these handles
        let deadline = tokio::time::Instant::now() + SETTLE_FREEZE_WAIT;
        let (part, _busy) = loop {
            let parts = topic.partitions();
            let Some(part) = parts.get(partition as usize).cloned() else {
                for &(i, _) in group {
                    if live(results, i) {
                        results[i] = Err(BrokerError::LeaseGone(
                            "receipt handle names no partition of this topic".into(),
                        ));
                    }
                }
                return false;
            };
            {
                let meta = topic.meta.read();
                if !meta.owners.is_empty() {
                    let local = self.is_local(&meta, partition);
                    let epoch = meta.owner_epoch(partition);
                    for &(i, h) in group {
                        if live(results, i) && (!local || epoch != h.owner_epoch) {
                            results[i] = Err(BrokerError::LeaseGone(
                                "the partition moved to another node since this lease: the message will be delivered again".into(),
                            ));
                        }
                    }
                    if !group.iter().any(|&(i, _)| live(results, i)) {
                        return false;
                    }
                }
            }
            let waiter = part.clone();
            let thawed = waiter.thawed.notified();
            tokio::pin!(thawed);
            thawed.as_mut().enable();
            if let Some(busy) = part.enter() {
                break (part, busy);
            }
            if tokio::time::timeout_at(deadline, thawed).await.is_err() {
                for &(i, _) in group {
                    if live(results, i) {
                        results[i] = Err(BrokerError::PartitionMoving {
                            topic: topic_name.to_owned(),
                            partition,
                        });
                    }
                }
                return false;
            }
        };
        let cfg = topic.config();
        let now = self.clock.now_ms();
        let mut outcomes = [0u64; crate::metrics::ACK_OUTCOMES.len()];
        let mut applied = false;
        {
            let mut q = part.queue.lock();
            for &(i, h) in group {
                if !live(results, i) {
                    continue;
                }
                let result = match action {
                    AckAction::Ack => q.ack(h.offset, h.nonce, now),
                    AckAction::Extend => q
                        .extend(h.offset, h.nonce, now, cfg.visibility_timeout_ms)
                        .map(|_| ()),
                    AckAction::ExtendFor(ms) => q
                        .extend(h.offset, h.nonce, now, clamp_visibility(ms))
                        .map(|_| ()),
                    AckAction::Nack => q.nack(h.offset, h.nonce, now),
                };
                let outcome = match (&result, action) {
                    (Ok(()), AckAction::Ack) => 0,
                    (Ok(()), AckAction::Extend | AckAction::ExtendFor(_)) => 1,
                    (Ok(()), AckAction::Nack) => 2,
                    (Err(LeaseError::Stale), _) => 3,
                    (Err(LeaseError::AckSetFull), _) => 4,
                };
                outcomes[outcome] += 1;
                applied |= result.is_ok();
                results[i] = match result {
                    Ok(()) => Ok(()),
                    Err(LeaseError::Stale) => {
                        Err(BrokerError::LeaseGone(LeaseError::Stale.to_string()))
                    }
                    Err(e @ LeaseError::AckSetFull) => Err(BrokerError::AckSetFull(e)),
                };
            }
            // (a lease renewed for less than it had left ends sooner: the timer must wake
            // then, for the readers waiting)
            if applied
                && matches!(action, AckAction::ExtendFor(_))
                && let Some(at) = q.next_wakeup()
            {
                self.arm_timer(topic, at);
            }
        }
        // in the order of `crate::metrics::ACK_OUTCOMES`
        for (n, outcome) in outcomes.into_iter().zip(crate::metrics::ACK_OUTCOMES) {
            if n > 0 {
                topic
                    .series
                    .ack(&self.metrics, &topic.label, outcome)
                    .inc_by(n);
            }
        }
        applied
    }

    pub(super) fn arm_timer(&self, topic: &Topic, at: i64) {
        if at < topic.timer_at.load(Ordering::Acquire) {
            topic.timer_at.store(at, Ordering::Release);
            topic.timer.notify_one();
        }
    }

    /// Expires leases and ends delays of `topic` when they fall due, on the broker's clock
    /// (a test's manual clock moves it by hand). Ends with the topic, or when stopped.
    pub(super) fn spawn_topic_timer(self: &Arc<Self>, topic: Arc<Topic>) {
        let weak = Arc::downgrade(self);
        self.tasks.spawn(TIMER_TASK, move |stop| async move {
            loop {
                let Some(broker) = weak.upgrade() else { return };
                if topic.deleted.load(Ordering::Acquire)
                    || broker.shutting_down.load(Ordering::Acquire)
                {
                    return;
                }
                // From here on every new deadline (a lease or delay made by the dispatch below,
                // or by any consume meanwhile) re-arms the timer: `arm_timer` compares against
                // this, and a notification that arrives before the sleep is kept as a permit.
                topic.timer_at.store(i64::MAX, Ordering::Release);
                let now = broker.clock.now_ms();
                let mut released = 0u64;
                // messages given back are offered to the waiting readers at once, as a nack's
                let mut any_ready = topic.given_back.swap(false, Ordering::AcqRel);
                for p in topic.partitions().iter() {
                    let mut q = p.queue.lock();
                    let expired = q.expire(now);
                    released += expired.len() as u64;
                    any_ready |= !expired.is_empty() | (q.promote_due(now) > 0);
                }
                if released > 0 {
                    broker
                        .metrics
                        .lease_expiries
                        .get_or_create(&topic.label)
                        .inc_by(released);
                }
                if any_ready {
                    broker.dispatch(&topic).await;
                }
                // the next deadline is taken after the dispatch, which may have made new ones
                let next = topic
                    .partitions()
                    .iter()
                    .filter_map(|p| p.queue.lock().next_wakeup())
                    .min()
                    .unwrap_or(i64::MAX);
                let next = topic.timer_at.fetch_min(next, Ordering::AcqRel).min(next);
                let clock = broker.clock.clone();
                let until = next.min(clock.now_ms().saturating_add(60_000));
                drop(broker);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = clock.sleep_until(until) => {}
                    () = topic.timer.notified() => {}
                }
            }
        });
    }
}

/// Most records one read of a consume takes ahead.
const READ_AHEAD_MAX: usize = 64;
/// How long a settle waits for its partition's freeze (a move's last copy) to end.
const SETTLE_FREEZE_WAIT: Duration = Duration::from_secs(2);

/// The records a consume looks at, read ahead from the log: the next offsets are usually
/// scanned right after this one. The first read takes as many as the consume wants (one for
/// `max=1`), each further read twice as many, up to [`READ_AHEAD_MAX`]; the records are kept
/// as the contiguous runs the log returned (no map per request).
pub(super) struct ReadAhead<'a> {
    log: &'a crate::log::PartitionLog,
    runs: Vec<Vec<Arc<Record>>>,
    ahead: usize,
    topic: &'a str,
    partition: u32,
    /// The first read that failed for a reason other than retention (a damaged frame, an
    /// I/O error): the queue's scan stops at that offset.
    failed: Option<crate::log::LogError>,
}

impl ReadAhead<'_> {
    /// The reply weight of the record at `offset` (0 if it cannot be read now).
    pub(super) fn reply_weight(&mut self, offset: u64) -> usize {
        use crate::queue::DueSource as _;
        self.due_ms(offset);
        self.get(offset).map_or(0, |r| r.reply_weight())
    }

    fn get(&self, o: u64) -> Option<&Arc<Record>> {
        self.runs.iter().find_map(|run| {
            let first = run.first()?.offset;
            let i = usize::try_from(o.checked_sub(first)?).ok()?;
            run.get(i).filter(|r| r.offset == o)
        })
    }
}

impl crate::queue::DueSource for ReadAhead<'_> {
    fn due_ms(&mut self, o: u64) -> Option<i64> {
        if let Some(r) = self.get(o) {
            return Some(r.due_ms());
        }
        let ahead = self.ahead;
        self.ahead = (ahead * 2).min(READ_AHEAD_MAX);
        match self.log.read(o, ahead, 1 << 20) {
            Ok(recs) => {
                let due = recs.first().filter(|r| r.offset == o).map(|r| r.due_ms());
                if !recs.is_empty() {
                    self.runs.push(recs);
                }
                due
            }
            // retention deleted it meanwhile: the queue moves past it on its own
            Err(e @ crate::log::LogError::Truncated { .. }) => {
                tracing::debug!(topic = %self.topic, partition = self.partition, offset = o, error = %e, "record gone to retention before delivery");
                None
            }
            Err(e) => {
                // every consume that reaches a damaged record fails here: a few lines per
                // window, the rest counted into the next
                if let Some(suppressed) = READ_FAILURES_LOGGED.admit() {
                    tracing::error!(topic = %self.topic, partition = self.partition, offset = o, error = %e, suppressed, "cannot read record for delivery");
                }
                self.failed.get_or_insert(e);
                None
            }
        }
    }
}

/// Lines about records that cannot be read for delivery: at most 10 per 10 s.
static READ_FAILURES_LOGGED: crate::loggate::LogGate =
    crate::loggate::LogGate::new(10, std::time::Duration::from_secs(10));

/// How many more passes one dispatch makes, at most, for misses (see `Broker::dispatch`).
const MAX_DISPATCH_REPEATS: usize = 8;

/// The waiters a dispatch pass holds out of the line: those it may give back (`skipped`) and
/// those it is finished with but has not yet released (`done`). Released however the pass
/// ends (a dropped pass included), so the miss count stays meaningful.
struct Held<'a> {
    topic: &'a Topic,
    skipped: Vec<Waiter>,
    done: usize,
    missed_before: u64,
    own_misses: u64,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let n = self.skipped.len() + self.done;
        if n > 0 {
            self.topic.waiters.lock().release_held(n);
        }
    }
}

/// A reader waiting in a topic's line. Dropped before it finished (its caller gave up: a
/// client that disconnected, a cancelled call from another node), it leaves the line, and
/// what a dispatcher already handed it is given back at once instead of staying leased to
/// nobody until the visibility timeout.
struct Parked<'a> {
    broker: &'a Broker,
    topic: &'a Arc<Topic>,
    id: u64,
    rx: oneshot::Receiver<Vec<Delivery>>,
    done: bool,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.topic.waiters.lock().remove(self.id);
        if let Ok(got) = self.rx.try_recv()
            && !got.is_empty()
        {
            self.broker.release(self.topic, &got);
            // (offered to the readers still waiting, as any give-back is)
            self.topic.given_back.store(true, Ordering::Release);
            self.topic.timer.notify_one();
        }
    }
}
