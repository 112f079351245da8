//! The failover playbooks under random load (seeded): an unplanned failover keeps its
//! bounds, a planned switchover processes each record once.

use super::*;

/// A small seeded generator (xorshift64): a run's choices replay from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One request to `s` as admin that may fail (a server killed under load): the status and
/// the JSON body (`Null` when there is none), or `None` when no answer came.
async fn try_call(
    s: &Server,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Option<(StatusCode, Value)> {
    let mut req = s
        .http
        .request(method, s.url(path))
        .basic_auth("admin", Some(ROOT_PW));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = tokio::time::timeout(std::time::Duration::from_secs(10), req.send())
        .await
        .ok()?
        .ok()?;
    let status = r.status();
    let text = r.text().await.ok()?;
    Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// A mirroring to B (`orders`, 3 partitions on A, 2 on B, a 2-lane link), and the seed of a
/// random run (`NARAD_TEST_SEED`, or the clock's; printed).
async fn random_pair() -> (tempfile::TempDir, Server, Server, u64) {
    let seed: u64 = std::env::var("NARAD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| crate::support::wall_clock_ms() as u64 | 1);
    eprintln!("NARAD_TEST_SEED={seed}");
    let dir = tempfile::tempdir().unwrap();
    let (b, ca) = target(dir.path()).await;
    let a = source(dir.path(), port_of(&b)).await;
    create_topic(&a, "orders", 3).await;
    add_remote(&a, "b", port_of(&b), &ca).await;
    attach(&a, "orders", "dr", "b", "orders", "attach").await;
    (dir, b, a, seed)
}

/// What [`random_load`] did on A.
struct Load {
    /// Records A answered 2xx for.
    produced: HashSet<u64>,
    /// Records whose ack A answered 204 for, and when the answer came.
    acked: std::collections::HashMap<u64, std::time::Instant>,
    /// Receipt handles of records still leased on A when the load stopped.
    leased: Vec<Value>,
    /// When A was killed (with `kill`).
    killed_at: Option<std::time::Instant>,
}

/// Seeded random load on A's `orders` while it mirrors to B: keyed and keyless batches, and
/// two consumers that take random counts and ack random parts of what they hold, out of
/// order, leaving one record in forty leased. Runs until A's consumers acked 6,000 records
/// and B settled 4,000 of them from their progress; then, with `kill`, A is killed -9
/// under the load.
async fn random_load(a: &Server, b: &Server, seed: u64, kill: bool) -> Load {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Instant;
    let pid = a.child.as_ref().unwrap().id().to_string();
    let stop = AtomicBool::new(false);
    let next_seq = AtomicU64::new(0);
    let produced: Mutex<HashSet<u64>> = Mutex::default();
    let acked_on_a: Mutex<HashMap<u64, Instant>> = Mutex::default();
    let killed_at: Mutex<Option<Instant>> = Mutex::default();
    let producer = async {
        let mut rng = Rng(seed);
        while !stop.load(Ordering::SeqCst) {
            let n = 1 + rng.below(50);
            let keyed = rng.below(2) == 0;
            let first = next_seq.fetch_add(n, Ordering::SeqCst);
            let msgs: Vec<Value> = (first..first + n)
                .map(|s| {
                    if keyed {
                        json!({"key": format!("k{}", s % 13), "payload": {"seq": s}})
                    } else {
                        json!({"payload": {"seq": s}})
                    }
                })
                .collect();
            let body = json!({ "messages": msgs });
            match try_call(
                a,
                Method::POST,
                "/v1/topics/orders/produce/batch",
                Some(body),
            )
            .await
            {
                Some((StatusCode::ACCEPTED, _)) => {
                    produced.lock().unwrap().extend(first..first + n)
                }
                Some((st, v)) => panic!("produce answered {st}: {v}"),
                None => break,
            }
        }
    };
    let consumer = |id: u64| {
        let (stop, acked_on_a) = (&stop, &acked_on_a);
        async move {
            let mut rng = Rng(seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut held: Vec<(u64, Value)> = Vec::new();
            let mut kept = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let max = 1 + rng.below(20);
                let path = format!("/v1/topics/orders/consume?max={max}&wait=100ms");
                let Some((st, v)) = try_call(a, Method::GET, &path, None).await else {
                    break;
                };
                match st {
                    StatusCode::OK => {
                        for m in v["messages"].as_array().unwrap() {
                            // one in forty stays leased, never acked
                            if rng.below(40) == 0 {
                                kept.push(m["receipt_handle"].clone());
                            } else {
                                let seq = m["payload"]["seq"].as_u64().unwrap();
                                held.push((seq, m["receipt_handle"].clone()));
                            }
                        }
                    }
                    StatusCode::NO_CONTENT => {}
                    st => panic!("consume answered {st}: {v}"),
                }
                if held.is_empty() || rng.below(3) != 0 {
                    continue;
                }
                // a random part of what is held, in a random order
                for i in (1..held.len()).rev() {
                    held.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let k = 1 + rng.below(held.len().min(100) as u64) as usize;
                let batch: Vec<(u64, Value)> = held.drain(..k).collect();
                let handles: Vec<Value> = batch.iter().map(|(_, h)| h.clone()).collect();
                let body = json!({ "receipt_handles": handles });
                match try_call(a, Method::POST, "/v1/topics/orders/ack", Some(body)).await {
                    Some((StatusCode::OK, v)) => {
                        let now = Instant::now();
                        let mut acked = acked_on_a.lock().unwrap();
                        for (i, (seq, _)) in batch.iter().enumerate() {
                            if v["results"][i]["status"] == 204 {
                                acked.insert(*seq, now);
                            }
                        }
                    }
                    Some((st, v)) => panic!("ack answered {st}: {v}"),
                    None => break,
                }
            }
            kept.extend(held.into_iter().map(|(_, h)| h));
            kept
        }
    };
    let controller = async {
        // steady state: records flow, consumers ack, and their progress reaches B
        until("A's consumers' progress on B", async || {
            acked_on_a.lock().unwrap().len() >= 6000 && settled_on(b, "orders").await >= 4000
        })
        .await;
        if kill {
            let killed = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status()
                .unwrap();
            assert!(killed.success());
            *killed_at.lock().unwrap() = Some(Instant::now());
        }
        stop.store(true, Ordering::SeqCst);
    };
    let ((), mut leased, more, ()) = tokio::join!(producer, consumer(1), consumer(2), controller);
    leased.extend(more);
    Load {
        produced: produced.into_inner().unwrap(),
        acked: acked_on_a.into_inner().unwrap(),
        leased,
        killed_at: killed_at.into_inner().unwrap(),
    }
}

/// An unplanned failover under random load (seeded: `NARAD_TEST_SEED` replays a run):
/// keyed and keyless batches, two consumers that take random counts and ack random parts
/// of what they hold, out of order, and leave some leased; A is killed -9 in steady state
/// and B promoted. Checked against the promote's own report: B holds exactly what the
/// report says it received from each of A's partitions; every record A acknowledged that
/// B holds was processed on A or is delivered on B; a record processed on A comes again on
/// B only if it was acked within the age of A's last progress (as the report gives it, plus
/// a second for the link's own lag); and once A returns (fenced, its tail shipped) nothing
/// A acknowledged is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplanned_failover_under_random_load_keeps_its_bounds() {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};
    let (_dir, b, mut a, seed) = random_pair().await;
    let Load {
        produced,
        acked: acked_on_a,
        killed_at,
        ..
    } = random_load(&a, &b, seed, true).await;
    a.kill9();
    // failover: B is promoted; its report is what B holds from each of A's partitions
    let promoted_at = Instant::now();
    let r = call(&b, Method::POST, "/v1/topics/orders/promote", None).await;
    let v = json_of(r, StatusCode::OK).await;
    let report = &v["report"];
    let on_b = replay_all(&b, "orders", 2).await;
    let mut partition_of: HashMap<u64, usize> = HashMap::new();
    let mut received = [0u64; 3];
    for (_, _, seq, origin) in &on_b {
        let hop: Vec<&str> = origin.split('/').collect();
        let (p, o): (usize, u64) = (hop[2].parse().unwrap(), hop[3].parse().unwrap());
        received[p] = received[p].max(o + 1);
        assert!(
            partition_of.insert(*seq, p).is_none(),
            "{seq} is on B twice (seed {seed})"
        );
    }
    let reported: Vec<u64> = (0..3)
        .map(|p| report["partitions"][p]["received_to"].as_u64().unwrap_or(0))
        .collect();
    // (a batch A sent just before it died may still be written while the promote runs:
    // the report says what B held when it was made)
    assert!(
        reported
            .iter()
            .zip(&received)
            .all(|(r, h)| r <= h && h - r <= 1000),
        "the report's received_to {reported:?}, B holds {received:?} (seed {seed}): {v}"
    );
    // B's consumers take over
    let mut on_b_delivered: Vec<u64> = process(&b, "orders", 1_000_000).await;
    let delivered: HashSet<u64> = on_b_delivered.iter().copied().collect();
    assert_eq!(
        delivered.len(),
        on_b_delivered.len(),
        "delivered twice on B (seed {seed})"
    );
    for seq in partition_of.keys() {
        assert!(
            acked_on_a.contains_key(seq) || delivered.contains(seq),
            "{seq} was on B, acked nowhere and never delivered (seed {seed})"
        );
    }
    // processed twice: only what was acked on A within the last progress's age
    let mut twice = 0;
    for seq in delivered.iter().filter(|s| acked_on_a.contains_key(s)) {
        twice += 1;
        let p = partition_of[seq];
        let age = report["partitions"][p]["progress_age_ms"]
            .as_u64()
            .unwrap_or(u64::MAX);
        let window = Duration::from_millis(age.saturating_add(1000));
        let acked = acked_on_a[seq];
        assert!(
            acked + window >= promoted_at,
            "{seq} was acked on A {:?} before the promote, outside the last progress's age of {age} ms (seed {seed}): {v}",
            promoted_at - acked
        );
    }
    let killed_at = killed_at.unwrap();
    eprintln!(
        "produced {}, acked on A {}, on B at the promote {}, delivered on B {}, processed twice {}, promote {:?} after the kill",
        produced.len(),
        acked_on_a.len(),
        on_b.len(),
        delivered.len(),
        twice,
        promoted_at - killed_at
    );
    // A returns with its disk: fenced, it demotes itself and ships its tail
    a.restart().await;
    until("A demoted itself and shipped its tail", async || {
        role_of(&a, "orders").await.0 == "demoted" && lag(&a, "orders").await.0 == 0
    })
    .await;
    on_b_delivered.extend(process(&b, "orders", 1_000_000).await);
    let delivered: HashSet<u64> = on_b_delivered.into_iter().collect();
    let lost: Vec<u64> = produced
        .iter()
        .copied()
        .filter(|s| !acked_on_a.contains_key(s) && !delivered.contains(s))
        .collect();
    assert!(
        lost.is_empty(),
        "{} records A acknowledged were processed nowhere (seed {seed}): {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
}

/// A planned switchover under the same random load: A's consumers stop and give back what
/// they held, A is demoted, and B promoted once drained. B's consumers then get exactly
/// what A's consumers had not acked: nothing lost, nothing processed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_switchover_under_random_load_processes_each_record_once() {
    let (_dir, b, a, seed) = random_pair().await;
    let Load {
        produced,
        acked,
        leased,
        ..
    } = random_load(&a, &b, seed, false).await;
    // A's consumers give back what they hold (a lease is not carried)
    for chunk in leased.chunks(100) {
        let r = call(
            &a,
            Method::POST,
            "/v1/topics/orders/ack",
            Some(json!({"receipt_handles": chunk, "extend": 0})),
        )
        .await;
        let v = json_of(r, StatusCode::OK).await;
        assert!(
            v["results"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["status"] == 204),
            "{v}"
        );
    }
    let v = switch_over(&a, &b).await;
    assert_eq!(v["report"]["drained"], true, "(seed {seed}) {v}");
    let on_b = process(&b, "orders", 1_000_000).await;
    let delivered: HashSet<u64> = on_b.iter().copied().collect();
    assert_eq!(
        delivered.len(),
        on_b.len(),
        "delivered twice on B (seed {seed})"
    );
    let twice: Vec<u64> = on_b
        .iter()
        .copied()
        .filter(|s| acked.contains_key(s))
        .collect();
    let unacked: HashSet<u64> = produced
        .iter()
        .copied()
        .filter(|s| !acked.contains_key(s))
        .collect();
    eprintln!(
        "produced {}, acked on A {}, given back {}, delivered on B {}",
        produced.len(),
        acked.len(),
        leased.len(),
        delivered.len()
    );
    assert!(
        twice.is_empty(),
        "{} processed on A and again on B (seed {seed}): {:?}",
        twice.len(),
        &twice[..twice.len().min(20)]
    );
    assert_eq!(
        delivered, unacked,
        "B delivers exactly what A's consumers had not acked (seed {seed})"
    );
}
