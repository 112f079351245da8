//! The queue's unit and property tests, the model-based one among them.

use super::*;
use proptest::prelude::*;

const VIS: i64 = 1000;

fn q(hwm: u64) -> PartitionQueue {
    PartitionQueue::new(QueueSnapshot::default(), 0, hwm, 7, 1024)
}

fn now_due(_: u64) -> Option<i64> {
    Some(0)
}

#[test]
fn delivers_lowest_first_and_acks_move_the_frontier() {
    let mut q = q(3);
    let l = q.take(10, 3, 100, VIS, &mut now_due);
    assert_eq!(
        l.iter().map(|l| l.offset).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(q.take(10, 1, 100, VIS, &mut now_due).is_empty());
    q.ack(1, l[1].nonce, 11).unwrap();
    q.ack(2, l[2].nonce, 11).unwrap();
    assert_eq!(q.frontier(), 0);
    assert_eq!(q.stats().acked_ahead, 2);
    q.ack(0, l[0].nonce, 11).unwrap();
    assert_eq!(q.frontier(), 3);
    assert_eq!(q.stats().acked_ahead, 0);
    assert_eq!(q.stats().unacked, 0);
}

#[test]
fn records_processed_elsewhere_are_settled_and_never_delivered() {
    let mut q = q(6);
    let l = q.take(0, 1, 100, VIS, &mut now_due)[0];
    assert_eq!(l.offset, 0);
    // a leased one, one ahead, one at the end; twice is a no-op; past the end is not
    assert!(q.settle_processed(0));
    assert!(q.settle_processed(3));
    assert!(q.settle_processed(5));
    assert!(!q.settle_processed(3));
    assert!(!q.settle_processed(6));
    assert_eq!(q.frontier(), 1);
    assert_eq!(
        q.ack(0, l.nonce, 1),
        Err(LeaseError::Stale),
        "its lease is gone"
    );
    let got: Vec<u64> = q
        .take(1, 10, 100, VIS, &mut now_due)
        .iter()
        .map(|l| l.offset)
        .collect();
    assert_eq!(got, vec![1, 2, 4]);
    assert_eq!(q.stats().unacked, 3);
}

#[test]
fn stale_handles() {
    let mut q = q(1);
    let l = q.take(0, 1, 100, VIS, &mut now_due)[0];
    assert_eq!(q.ack(0, l.nonce + 1, 1), Err(LeaseError::Stale));
    q.ack(0, l.nonce, 1).unwrap();
    assert_eq!(q.ack(0, l.nonce, 1), Err(LeaseError::Stale), "double ack");
    assert_eq!(q.extend(0, l.nonce, 1, VIS), Err(LeaseError::Stale));
    assert_eq!(q.nack(0, l.nonce, 1), Err(LeaseError::Stale));
}

#[test]
fn expiry_redelivers_with_a_new_nonce_and_count() {
    let mut q = q(1);
    let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
    // a lease lasts at least VIS in real time: clock readings are whole milliseconds
    assert_eq!(q.next_wakeup(), Some(VIS + 1));
    assert!(q.expire(VIS).is_empty());
    assert_eq!(q.expire(VIS + 1), vec![0]);
    let b = q.take(VIS + 1, 1, 100, VIS, &mut now_due)[0];
    assert_eq!(b.offset, 0);
    assert_ne!(a.nonce, b.nonce);
    assert_eq!(b.delivery_count, 2);
    assert_eq!(q.ack(0, a.nonce, VIS + 2), Err(LeaseError::Stale));
    q.ack(0, b.nonce, VIS + 2).unwrap();
}

#[test]
fn an_unreaped_expired_lease_is_stale() {
    let mut q = q(1);
    let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
    assert_eq!(q.ack(0, a.nonce, VIS + 1), Err(LeaseError::Stale));
}

#[test]
fn extend_resets_to_a_full_timeout() {
    let mut q = q(1);
    let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
    assert_eq!(q.extend(0, a.nonce, 900, VIS), Ok(1901));
    assert!(q.expire(1500).is_empty());
    q.ack(0, a.nonce, 1800).unwrap();
}

#[test]
fn nack_releases_at_once() {
    let mut q = q(2);
    let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
    q.nack(0, a.nonce, 1).unwrap();
    let b = q.take(1, 1, 100, VIS, &mut now_due)[0];
    assert_eq!(b.offset, 0);
    assert_eq!(b.delivery_count, 2);
}

#[test]
fn unlease_does_not_count_a_delivery() {
    let mut q = q(1);
    let a = q.take(0, 1, 100, VIS, &mut now_due)[0];
    q.unlease(0, a.nonce, 1).unwrap();
    assert_eq!(q.take(1, 1, 100, VIS, &mut now_due)[0].delivery_count, 1);
}

#[test]
fn in_flight_cap() {
    let mut q = q(5);
    assert_eq!(q.take(0, 10, 2, VIS, &mut now_due).len(), 2);
    assert!(q.take(0, 10, 2, VIS, &mut now_due).is_empty());
    assert!(!q.may_deliver(2));
}

#[test]
fn delayed_records_never_early_and_do_not_block_later_ones() {
    let mut q = q(3);
    let mut due = |o: u64| Some(if o == 0 { 5000 } else { 0 });
    let l = q.take(100, 10, 100, VIS, &mut due);
    assert_eq!(l.iter().map(|l| l.offset).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(q.next_wakeup(), Some(1101));
    assert!(q.take(4999, 10, 100, VIS, &mut due).is_empty());
    let l = q.take(5000, 10, 100, VIS, &mut due);
    assert_eq!(l[0].offset, 0);
}

#[test]
fn unreadable_record_stops_the_scan_without_losing_it() {
    let mut q = q(2);
    let mut broken = |_| None;
    assert!(q.take(0, 1, 100, VIS, &mut broken).is_empty());
    assert_eq!(q.take(0, 1, 100, VIS, &mut now_due)[0].offset, 0);
}

#[test]
fn ack_set_bound() {
    let mut q = PartitionQueue::new(QueueSnapshot::default(), 0, 10, 1, 2);
    let l = q.take(0, 10, 100, VIS, &mut now_due);
    q.ack(2, l[2].nonce, 1).unwrap();
    q.ack(4, l[4].nonce, 1).unwrap();
    assert_eq!(q.ack(6, l[6].nonce, 1), Err(LeaseError::AckSetFull));
    q.ack(3, l[3].nonce, 1).unwrap(); // joins ranges
    q.ack(6, l[6].nonce, 1).unwrap();
    q.ack(0, l[0].nonce, 1).unwrap();
    q.ack(1, l[1].nonce, 1).unwrap();
    assert_eq!(q.frontier(), 5);
}

#[test]
fn snapshot_restores_acked_state_and_drops_leases() {
    let mut q = q(5);
    let l = q.take(0, 5, 100, VIS, &mut now_due);
    q.ack(0, l[0].nonce, 1).unwrap();
    q.ack(2, l[2].nonce, 1).unwrap();
    q.ack(3, l[3].nonce, 1).unwrap();
    let snap = QueueSnapshot::decode(&q.snapshot().encode()).unwrap();
    assert_eq!(snap.frontier, 1);
    assert_eq!(snap.acked, vec![(2, 4)]);
    let mut r = PartitionQueue::new(snap, 0, 5, 99, 1024);
    let l = r.take(0, 10, 100, VIS, &mut now_due);
    assert_eq!(l.iter().map(|l| l.offset).collect::<Vec<_>>(), vec![1, 4]);
}

#[test]
fn snapshot_decode_rejects_garbage() {
    let mut bytes = QueueSnapshot {
        frontier: 3,
        acked: vec![(5, 6)],
        counts: vec![(4, 2)],
    }
    .encode();
    assert!(QueueSnapshot::decode(&bytes[..bytes.len() - 1]).is_none());
    bytes[9] ^= 1;
    assert!(QueueSnapshot::decode(&bytes).is_none());
    assert!(QueueSnapshot::decode(b"short").is_none());
}

#[test]
fn truncation_counts_unacked_losses() {
    let mut q = q(10);
    let l = q.take(0, 4, 100, VIS, &mut now_due);
    q.ack(1, l[1].nonce, 1).unwrap();
    // offsets 0,2,3 leased, 4..9 never delivered; retention removes 0..6
    assert_eq!(q.truncate_below(6), 5);
    assert_eq!(q.frontier(), 6);
    assert_eq!(q.in_flight(), 0);
    assert_eq!(q.take(2, 10, 100, VIS, &mut now_due)[0].offset, 6);
}

/// Leases every ready offset of `q` `times` times (nacking in between); the last leases.
fn deliver_times(q: &mut PartitionQueue, times: u32, now: i64) -> Vec<Leased> {
    let mut last = Vec::new();
    for _ in 0..times {
        last = q.take(now, 100, 100, VIS, &mut now_due);
        for l in &last {
            q.nack(l.offset, l.nonce, now).unwrap();
        }
    }
    last
}

#[test]
fn snapshot_v2_round_trips_delivery_counts() {
    let mut q = q(6);
    deliver_times(&mut q, 2, 0);
    let l = q.take(0, 6, 100, VIS, &mut now_due);
    assert!(l.iter().all(|l| l.delivery_count == 3));
    q.ack(0, l[0].nonce, 1).unwrap();
    q.ack(2, l[2].nonce, 1).unwrap();
    q.nack(4, l[4].nonce, 1).unwrap();
    let snap = q.snapshot();
    assert_eq!(snap.frontier, 1);
    assert_eq!(snap.acked, vec![(2, 3)]);
    assert_eq!(snap.counts, vec![(1, 3), (3, 3), (4, 3), (5, 3)]);
    let bytes = snap.encode();
    assert_eq!(&bytes[..8], b"NRDQST02");
    let back = QueueSnapshot::decode(&bytes).unwrap();
    assert_eq!(back, snap);
    // after a restart the next delivery is the persisted count + 1
    let mut r = PartitionQueue::new(back, 0, 6, 99, 1024);
    let l = r.take(0, 10, 100, VIS, &mut now_due);
    let got: Vec<(u64, u32)> = l.iter().map(|l| (l.offset, l.delivery_count)).collect();
    assert_eq!(got, vec![(1, 4), (3, 4), (4, 4), (5, 4)]);
}

#[test]
fn snapshot_v1_is_still_read_without_counts() {
    let mut v1 = b"NRDQST01".to_vec();
    for x in [3u64, 1, 5, 7] {
        v1.extend_from_slice(&x.to_le_bytes());
    }
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    let snap = QueueSnapshot::decode(&v1).unwrap();
    assert_eq!(
        snap,
        QueueSnapshot {
            frontier: 3,
            acked: vec![(5, 7)],
            counts: vec![],
        }
    );
    let mut q = PartitionQueue::new(snap, 0, 8, 1, 1024);
    let l = q.take(0, 10, 100, VIS, &mut now_due);
    let got: Vec<(u64, u32)> = l.iter().map(|l| (l.offset, l.delivery_count)).collect();
    assert_eq!(got, vec![(3, 1), (4, 1), (7, 1)]);
}

/// `NRDQST02` with the given header fields and payload, checksummed.
fn v2(frontier: u64, n: u64, m: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = b"NRDQST02".to_vec();
    for x in [frontier, n, m] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn ranges_and_counts(ranges: &[(u64, u64)], counts: &[(u64, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (s, e) in ranges {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&e.to_le_bytes());
    }
    for (o, c) in counts {
        out.extend_from_slice(&o.to_le_bytes());
        out.extend_from_slice(&c.to_le_bytes());
    }
    out
}

#[test]
fn snapshot_v2_refuses_inconsistent_counts() {
    let ok = v2(3, 1, 2, &ranges_and_counts(&[(5, 7)], &[(3, 1), (7, 2)]));
    assert!(QueueSnapshot::decode(&ok).is_some());
    let bad = [
        ("below the frontier", &[(2, 1), (7, 2)][..]),
        ("inside an acked range", &[(3, 1), (6, 2)]),
        ("at a range's start", &[(3, 1), (5, 2)]),
        ("out of order", &[(7, 1), (3, 2)]),
        ("duplicate", &[(3, 1), (3, 2)]),
        ("zero count", &[(3, 0), (7, 2)]),
    ];
    for (why, counts) in bad {
        let bytes = v2(3, 1, 2, &ranges_and_counts(&[(5, 7)], counts));
        assert!(QueueSnapshot::decode(&bytes).is_none(), "{why}");
    }
    // declared lengths that do not match the bytes, however large, allocate nothing
    let payload = ranges_and_counts(&[(5, 7)], &[(3, 1), (7, 2)]);
    for (n, m) in [
        (1, 1),
        (1, 3),
        (2, 2),
        (u64::MAX, 2),
        (1, u64::MAX),
        (u64::MAX / 16, u64::MAX / 12),
    ] {
        assert!(
            QueueSnapshot::decode(&v2(3, n, m, &payload)).is_none(),
            "n={n} m={m}"
        );
    }
    // a v1 file carries no count section
    let mut v1 = ok.clone();
    v1[..8].copy_from_slice(b"NRDQST01");
    let crc = crc32c::crc32c(&v1[..v1.len() - 4]);
    let at = v1.len() - 4;
    v1[at..].copy_from_slice(&crc.to_le_bytes());
    assert!(QueueSnapshot::decode(&v1).is_none());
}

#[test]
fn snapshot_keeps_the_lowest_counts_within_its_bound() {
    let mut q = PartitionQueue::with_max_counts(QueueSnapshot::default(), 0, 5, 1, 1024, 2);
    deliver_times(&mut q, 1, 0);
    assert_eq!(q.counts_left_out(), 3);
    let snap = q.snapshot();
    assert_eq!(snap.counts, vec![(0, 1), (1, 1)]);
    // in memory every count is kept
    assert_eq!(q.delivery_count(4), 1);
    // a restart keeps the persisted ones; the others start again
    let mut r = PartitionQueue::with_max_counts(snap, 0, 5, 2, 1024, 2);
    let l = r.take(0, 10, 100, VIS, &mut now_due);
    let got: Vec<u32> = l.iter().map(|l| l.delivery_count).collect();
    assert_eq!(got, vec![2, 2, 1, 1, 1]);
}

#[test]
fn restored_counts_never_go_down_and_skip_settled_offsets() {
    let snap = QueueSnapshot {
        frontier: 2,
        acked: vec![(4, 5)],
        counts: vec![(2, 5), (3, 1)],
    };
    let mut q = PartitionQueue::new(snap, 0, 8, 1, 1024);
    // an older journal (lower count), a newer one, acked / settled / future offsets
    q.restore_counts([(2, 3), (3, 4), (1, 9), (4, 9), (8, 9), (6, 0)]);
    assert_eq!(q.delivery_count(2), 5, "max, never lowered");
    assert_eq!(q.delivery_count(3), 4);
    for o in [1, 4, 6, 8] {
        assert_eq!(q.delivery_count(o), 0, "offset {o}");
    }
    // retention removed offsets the snapshot counted
    let q = PartitionQueue::new(q.snapshot(), 3, 8, 1, 1024);
    assert_eq!(q.snapshot().counts, vec![(3, 4)]);
}

#[test]
fn counts_end_with_the_ack_and_an_undelivered_lease() {
    let mut q = q(2);
    let l = q.take(0, 2, 100, VIS, &mut now_due);
    q.unlease(1, l[1].nonce, 1).unwrap();
    assert_eq!(q.snapshot().counts, vec![(0, 1)], "no zero count kept");
    q.ack(0, l[0].nonce, 1).unwrap();
    assert!(q.snapshot().counts.is_empty());
    let l = q.take(1, 1, 100, VIS, &mut now_due);
    q.nack(1, l[0].nonce, 2).unwrap();
    assert_eq!(q.truncate_below(2), 1);
    assert!(q.snapshot().counts.is_empty(), "retention drops counts");
}

#[test]
fn a_huge_restored_count_saturates() {
    let snap = QueueSnapshot {
        counts: vec![(0, u32::MAX)],
        ..Default::default()
    };
    let mut q = PartitionQueue::new(snap, 0, 1, 1, 1024);
    assert_eq!(
        q.take(0, 1, 100, VIS, &mut now_due)[0].delivery_count,
        u32::MAX
    );
}

/// Checks what a decoded snapshot promises.
fn consistent(s: &QueueSnapshot) -> Result<(), TestCaseError> {
    let mut prev = s.frontier;
    for &(a, b) in &s.acked {
        prop_assert!(a > prev && b > a, "ranges {:?}", s.acked);
        prev = b;
    }
    let mut last: Option<u64> = None;
    for &(o, c) in &s.counts {
        prop_assert!(c >= 1 && o >= s.frontier && last.is_none_or(|l| o > l));
        prop_assert!(
            !s.acked.iter().any(|&(a, b)| a <= o && o < b),
            "acked {o} counted"
        );
        last = Some(o);
    }
    Ok(())
}

fn arb_snapshot() -> impl Strategy<Value = QueueSnapshot> {
    (
        0u64..1000,
        proptest::collection::vec((1u64..5, 1u64..5, any::<bool>(), 1u32..), 0..30),
    )
        .prop_map(|(frontier, steps)| {
            // walk upwards: each step is a gap of `g` offsets, then a run of `r`, either
            // acked (a range) or counted (one count per offset)
            let mut s = QueueSnapshot {
                frontier,
                ..Default::default()
            };
            let mut at = frontier;
            for (g, r, is_range, c) in steps {
                at += g;
                if is_range {
                    s.acked.push((at, at + r));
                } else {
                    s.counts.extend((at..at + r).map(|o| (o, c)));
                }
                at += r;
            }
            s
        })
}
proptest! {
    #[test]
    fn snapshots_round_trip(s in arb_snapshot()) {
        consistent(&s)?;
        prop_assert_eq!(QueueSnapshot::decode(&s.encode()), Some(s));
    }

    /// Untrusted bytes never panic the decoder, and whatever it accepts is consistent
    /// (and encodes back to the same bytes). The CRC is recomputed, so damage reaches the
    /// structural checks instead of stopping at the checksum.
    #[test]
    fn decode_of_any_bytes_never_panics_or_yields_inconsistent_state(
        base in arb_snapshot(),
        v1 in any::<bool>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<prop::sample::Index>()),
        raw in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut body = base.encode();
        body.truncate(body.len() - 4);
        if v1 {
            body[..8].copy_from_slice(b"NRDQST01");
        }
        for (at, x) in edits {
            let at = at.index(body.len());
            body[at] = x;
        }
        if let Some(cut) = cut {
            body.truncate(cut.index(body.len() + 1));
        }
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        if let Some(s) = QueueSnapshot::decode(&body) {
            consistent(&s)?;
            if &body[..8] == b"NRDQST02" {
                prop_assert_eq!(s.encode(), body);
            }
        }
        let mut raw = raw;
        let crc = crc32c::crc32c(&raw);
        raw.extend_from_slice(&crc.to_le_bytes());
        if let Some(s) = QueueSnapshot::decode(&raw) {
            consistent(&s)?;
        }
    }

    /// Random operation sequences keep the invariants: no offset is leased twice at once,
    /// the frontier never moves back, acked offsets are never delivered again, and once
    /// everything is acked the frontier reaches the end.
    #[test]
    fn random_operations_keep_invariants(ops in proptest::collection::vec((0u8..8, 0u64..40, 0i64..400), 1..300), seed in any::<u64>()) {
        let mut q = PartitionQueue::new(QueueSnapshot::default(), 0, 0, seed, 8);
        let mut now = 0i64;
        let mut hwm = 0u64;
        let mut live: HashMap<u64, Leased> = HashMap::new();
        let mut acked: BTreeSet<u64> = BTreeSet::new();
        let mut delays: HashMap<u64, i64> = HashMap::new();
        let mut counts: HashMap<u64, u32> = HashMap::new();
        let mut last_frontier = 0;
        for (op, arg, dt) in ops {
            now += dt;
            // leases past their deadline are gone from the model's point of view
            live.retain(|_, l| l.deadline_ms > now);
            match op {
                0 => { for _ in 0..=arg % 4 { delays.insert(hwm, now + (arg as i64 % 3) * 100); hwm += 1; } q.on_append(hwm); }
                1 => {
                    q.expire(now);
                    let mut src = |o: u64| delays.get(&o).copied();
                    for l in q.take(now, (arg % 5 + 1) as usize, 6, VIS, &mut src) {
                        prop_assert!(!live.contains_key(&l.offset), "double lease of {}", l.offset);
                        prop_assert!(!acked.contains(&l.offset), "acked {} delivered again", l.offset);
                        prop_assert!(delays[&l.offset] <= now, "delivered early");
                        let count = counts.entry(l.offset).or_insert(0);
                        *count += 1;
                        prop_assert_eq!(l.delivery_count, *count, "count of {}", l.offset);
                        live.insert(l.offset, l);
                    }
                }
                2 | 3 => {
                    if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                        let l = live[&o];
                        match q.ack(o, l.nonce, now) {
                            Ok(()) => { live.remove(&o); acked.insert(o); counts.remove(&o); }
                            Err(LeaseError::AckSetFull) => {}
                            Err(e) => prop_assert!(false, "live lease rejected: {e}"),
                        }
                    }
                }
                4 => {
                    if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                        let l = live.remove(&o).unwrap();
                        q.nack(o, l.nonce, now).unwrap();
                    }
                }
                5 => {
                    if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                        let d = q.extend(o, live[&o].nonce, now, VIS).unwrap();
                        live.get_mut(&o).unwrap().deadline_ms = d;
                    }
                }
                6 => {
                    // a delivery that never reached its reader does not count
                    if let Some(&o) = live.keys().nth(arg as usize % live.len().max(1)) {
                        let l = live.remove(&o).unwrap();
                        q.unlease(o, l.nonce, now).unwrap();
                        let c = counts.get_mut(&o).unwrap();
                        *c -= 1;
                        if *c == 0 { counts.remove(&o); }
                    }
                }
                _ => {
                    // restart from the snapshot: leases go, counts stay
                    let snap = QueueSnapshot::decode(&q.snapshot().encode());
                    prop_assert!(snap.is_some(), "own snapshot refused");
                    q = PartitionQueue::new(snap.unwrap(), 0, hwm, seed ^ now as u64, 8);
                    live.clear();
                }
            }
            let snap = q.snapshot();
            prop_assert_eq!(snap.counts.len(), counts.len());
            for &(o, c) in &snap.counts { prop_assert_eq!(counts.get(&o), Some(&c)); }
            prop_assert!(q.frontier() >= last_frontier);
            last_frontier = q.frontier();
            for o in 0..q.frontier() { prop_assert!(acked.contains(&o)); }
        }
        // drain: everything eventually delivered and acked
        for _ in 0..10_000 {
            now += 500;
            q.expire(now);
            let mut src = |o: u64| delays.get(&o).copied();
            let got = q.take(now, 5, 6, VIS, &mut src);
            for l in got {
                match q.ack(l.offset, l.nonce, now) {
                    Ok(()) => { acked.insert(l.offset); }
                    Err(LeaseError::AckSetFull) => { q.nack(l.offset, l.nonce, now).unwrap(); }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
            if q.frontier() == hwm { break; }
        }
        prop_assert_eq!(q.frontier(), hwm);
    }
}

/// What a partition's queue must do, written as plainly as it can be: every offset is
/// acked, leased (nonce, deadline) or waiting (its due time), and nothing else. The real
/// queue is checked against it operation by operation.
#[derive(Default)]
struct Model {
    hwm: u64,
    due: Vec<i64>,
    acked: BTreeSet<u64>,
    leases: BTreeMap<u64, (u64, i64)>,
    counts: BTreeMap<u64, u32>,
}

impl Model {
    fn live(&self, o: u64, nonce: u64, now: i64) -> bool {
        self.leases
            .get(&o)
            .is_some_and(|&(n, d)| n == nonce && d > now)
    }

    /// Leases whose deadline passed are gone.
    fn expire(&mut self, now: i64) {
        self.leases.retain(|_, &mut (_, d)| d > now);
    }

    /// What a take must lease: the lowest offsets neither acked, leased nor early.
    fn takes(&self, now: i64, max: usize, max_in_flight: usize) -> Vec<u64> {
        let room = max.min(max_in_flight.saturating_sub(self.leases.len()));
        (0..self.hwm)
            .filter(|o| !self.acked.contains(o) && !self.leases.contains_key(o))
            .filter(|&o| self.due[o as usize] <= now)
            .take(room)
            .collect()
    }

    fn frontier(&self) -> u64 {
        (0..self.hwm)
            .find(|o| !self.acked.contains(o))
            .unwrap_or(self.hwm)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Append {
        n: u64,
        delay: i64,
    },
    Take {
        max: usize,
    },
    Ack {
        pick: usize,
    },
    Nack {
        pick: usize,
    },
    Extend {
        pick: usize,
    },
    Unlease {
        pick: usize,
    },
    /// A handle handed out earlier (maybe superseded, expired or acked since).
    StaleAck {
        pick: usize,
    },
    SettleProcessed {
        offset: u64,
    },
    Restart,
    Wait {
        ms: i64,
    },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..5, prop_oneof![Just(0i64), 1i64..3000]).prop_map(|(n, delay)| Op::Append { n, delay }),
        4 => (1usize..6).prop_map(|max| Op::Take { max }),
        3 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Nack { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Extend { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Unlease { pick }),
        1 => any::<usize>().prop_map(|pick| Op::StaleAck { pick }),
        1 => (0u64..40).prop_map(|offset| Op::SettleProcessed { offset }),
        1 => Just(Op::Restart),
        3 => (1i64..1500).prop_map(|ms| Op::Wait { ms }),
    ]
}

proptest! {
    /// Any sequence of appends (some delayed), takes, acks, nacks, extends, unleases,
    /// stale handles, settles, restarts from the snapshot and waits: the queue leases
    /// exactly what the model says, answers every handle as the model does, and agrees
    /// on the frontier, the leases in flight and every delivery count.
    #[test]
    fn a_queue_does_what_its_model_says(ops in proptest::collection::vec(arb_op(), 1..200), seed in any::<u64>()) {
        const IN_FLIGHT: usize = 6;
        let mut q = PartitionQueue::new(QueueSnapshot::default(), 0, 0, seed, 1 << 20);
        let mut m = Model::default();
        let mut now = 0i64;
        let mut handed: Vec<(u64, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Append { n, delay } => {
                    for _ in 0..n {
                        m.due.push(now + delay);
                        m.hwm += 1;
                    }
                    q.on_append(m.hwm);
                }
                Op::Take { max } => {
                    q.expire(now);
                    m.expire(now);
                    let want = m.takes(now, max, IN_FLIGHT);
                    let due = m.due.clone();
                    let got = q.take(now, max, IN_FLIGHT, VIS, &mut |o: u64| due.get(o as usize).copied());
                    let offsets: Vec<u64> = got.iter().map(|l| l.offset).collect();
                    prop_assert_eq!(&offsets, &want, "leased at {}", now);
                    for l in got {
                        let c = m.counts.entry(l.offset).or_insert(0);
                        *c += 1;
                        prop_assert_eq!(l.delivery_count, *c, "count of {}", l.offset);
                        prop_assert_eq!(l.deadline_ms, now + VIS + 1);
                        m.leases.insert(l.offset, (l.nonce, l.deadline_ms));
                        handed.push((l.offset, l.nonce));
                    }
                }
                Op::Ack { pick } | Op::Nack { pick } | Op::Extend { pick } | Op::Unlease { pick } | Op::StaleAck { pick } => {
                    let (o, nonce) = if let Op::StaleAck { .. } = op {
                        let Some(&h) = handed.get(pick % handed.len().max(1)) else { continue };
                        h
                    } else {
                        let live: Vec<(u64, u64)> = m.leases.iter().map(|(&o, &(n, _))| (o, n)).collect();
                        let Some(&h) = live.get(pick % live.len().max(1)) else { continue };
                        h
                    };
                    let ok = m.live(o, nonce, now);
                    let got = match op {
                        Op::Ack { .. } | Op::StaleAck { .. } => q.ack(o, nonce, now),
                        Op::Nack { .. } => q.nack(o, nonce, now),
                        Op::Extend { .. } => q.extend(o, nonce, now, VIS).map(|d| {
                            assert_eq!(d, now + VIS + 1);
                        }),
                        _ => q.unlease(o, nonce, now),
                    };
                    prop_assert_eq!(got.is_ok(), ok, "{:?} of {} at {}: {:?}", op, o, now, got);
                    if let Err(e) = got {
                        prop_assert_eq!(e, LeaseError::Stale);
                    }
                    if ok {
                        match op {
                            Op::Ack { .. } | Op::StaleAck { .. } => {
                                m.leases.remove(&o);
                                m.acked.insert(o);
                                m.counts.remove(&o);
                            }
                            Op::Nack { .. } => {
                                m.leases.remove(&o);
                            }
                            Op::Extend { .. } => {
                                m.leases.insert(o, (nonce, now + VIS + 1));
                            }
                            _ => {
                                m.leases.remove(&o);
                                let c = m.counts.get_mut(&o).unwrap();
                                *c -= 1;
                                if *c == 0 {
                                    m.counts.remove(&o);
                                }
                            }
                        }
                    }
                }
                Op::SettleProcessed { offset } => {
                    let want = offset < m.hwm && !m.acked.contains(&offset);
                    prop_assert_eq!(q.settle_processed(offset), want, "settle {}", offset);
                    if want {
                        m.leases.remove(&offset);
                        m.acked.insert(offset);
                        m.counts.remove(&offset);
                    }
                }
                Op::Restart => {
                    // leases go (their messages are deliverable again), acks and counts stay
                    let snap = QueueSnapshot::decode(&q.snapshot().encode());
                    prop_assert!(snap.is_some(), "own snapshot refused");
                    q = PartitionQueue::new(snap.unwrap(), 0, m.hwm, seed ^ now as u64, 1 << 20);
                    m.leases.clear();
                }
                Op::Wait { ms } => now += ms,
            }
            prop_assert_eq!(q.frontier(), m.frontier());
            q.expire(now);
            m.expire(now);
            prop_assert_eq!(q.in_flight(), m.leases.len());
            let counts: BTreeMap<u64, u32> = q.snapshot().counts.into_iter().collect();
            prop_assert_eq!(&counts, &m.counts);
        }
    }
}

/// Leases a partition's previous owner handed out are held (under no handle) until
/// their deadline: the scan passes them by, nothing delivers them before, and they come
/// back once their time is up; acked or out-of-range offsets are not held.
#[test]
fn held_leases_of_a_previous_owner_wait_for_their_deadline() {
    let mut q = q(6);
    // offset 4 was acked on the previous owner: not held
    let l = q.take(0, 5, 100, VIS, &mut now_due);
    q.ack(4, l[4].nonce, 1).unwrap();
    let mut q = PartitionQueue::new(q.snapshot(), 0, 6, 9, 1024);
    q.hold(1, 500);
    q.hold(4, 500);
    q.hold(9, 500);
    assert_eq!(q.held_leases(), vec![(1, 500)]);
    let got: Vec<u64> = q
        .take(10, 10, 100, VIS, &mut now_due)
        .iter()
        .map(|l| l.offset)
        .collect();
    assert_eq!(got, vec![0, 2, 3, 5], "held and acked offsets are skipped");
    assert!(q.take(499, 10, 100, VIS, &mut now_due).is_empty());
    assert_eq!(q.expire(500), vec![1]);
    let again = q.take(500, 10, 100, VIS, &mut now_due);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].offset, 1);
    assert_ne!(again[0].nonce, 0, "no handle carries the hold's nonce");
    assert_eq!(q.ack(1, 0, 501), Err(LeaseError::Stale));
}
