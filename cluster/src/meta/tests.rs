use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_core::catalog::{CatalogCommand, CatalogError, TopicMeta};
use narad_core::topic::TopicConfig;
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};

use super::*;
use crate::rpc::{Keys, Limits, RpcConfig, RpcMetrics};

const SECRET: &[u8] = b"a cluster secret of at least 32 bytes, for tests";

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(dir.path()).unwrap();
        let sm = StateMachine::open(dir.path()).unwrap();
        Ok((dir, log, sm))
    }
}

#[test]
fn the_log_store_and_state_machine_pass_openraft_s_suite() {
    Suite::test_all(Builder).unwrap();
}

fn topic(id: u64, name: &str) -> TopicMeta {
    TopicMeta::new(id, name, 1_000, TopicConfig::default())
}

fn create(id: u64, name: &str) -> MetaCmd {
    MetaCmd::Catalog(CatalogCommand::CreateTopic {
        topic: topic(id, name),
    })
}

fn blank(index: u64) -> Entry {
    Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Blank,
    }
}

async fn append(log: &mut LogStore, entries: Vec<Entry>) {
    use openraft::storage::RaftLogStorageExt;
    log.blocking_append(entries).await.unwrap();
}

async fn indexes(log: &mut LogStore) -> Vec<u64> {
    use openraft::storage::RaftLogReader;
    log.try_get_log_entries(0..u64::MAX)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect()
}

#[tokio::test]
async fn a_torn_last_append_is_cut_and_damage_in_the_middle_refuses_start() {
    use openraft::storage::RaftLogStorage;
    let dir = tempfile::tempdir().unwrap();
    let mut log = LogStore::open(dir.path()).unwrap();
    // (openraft always saves a vote before the first entry)
    log.save_vote(&openraft::Vote::new(1, 1)).await.unwrap();
    append(&mut log, (1..=3).map(blank).collect()).await;
    append(&mut log, vec![blank(4)]).await;
    drop(log);
    // the last append half written: cut, the rest kept
    let len = log_store::log_len(dir.path());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("log"))
        .unwrap();
    f.set_len(len - 5).unwrap();
    let mut log = LogStore::open(dir.path()).unwrap();
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3]);
    append(&mut log, vec![blank(4), blank(5)]).await;
    drop(log);
    let mut log = LogStore::open(dir.path()).unwrap();
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4, 5]);
    drop(log);
    // a flipped byte in the last entry: an incomplete append, cut
    log_store::damage(dir.path(), 3, b'#');
    let mut log = LogStore::open(dir.path()).unwrap();
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4]);
    drop(log);
    // a flipped byte in the second entry, valid entries after it: refuse
    let len = log_store::log_len(dir.path());
    log_store::damage(dir.path(), len - 16 - 20 - 60, b'#');
    match LogStore::open(dir.path()) {
        Err(OpenError::CorruptMiddle { .. }) => {}
        other => panic!("expected CorruptMiddle, got {:?}", other.err()),
    }
}

#[test]
fn a_retried_request_takes_effect_once() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use openraft::storage::RaftStateMachine;
        let mut sm = StateMachine::open(dir.path()).unwrap();
        let req = MetaRequest {
            id: 42,
            cmd: create(1, "a"),
        };
        let entry = |i| Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), i),
            payload: openraft::EntryPayload::Normal(req.clone()),
        };
        let first = sm.apply(vec![entry(1)]).await.unwrap();
        let again = sm.apply(vec![entry(2)]).await.unwrap();
        // the second copy answers like the first (index included) instead of "exists"
        assert_eq!(first, again);
        assert!(matches!(first[0].outcome, Outcome::Catalog(Ok(_))));
        let other = MetaRequest {
            id: 43,
            cmd: create(2, "a"),
        };
        let r = sm
            .apply(vec![Entry {
                log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), 3),
                payload: openraft::EntryPayload::Normal(other),
            }])
            .await
            .unwrap();
        assert_eq!(
            r[0].outcome,
            Outcome::Catalog(Err(CatalogError::Exists("a".into())))
        );
    });
}

struct Node {
    store: Metastore,
    addr: String,
}

fn tuning() -> Tuning {
    Tuning {
        heartbeat_ms: 100,
        election_min_ms: 600,
        election_max_ms: 1200,
        snapshot_after: 8,
        keep_after_snapshot: 2,
    }
}

async fn start(id: NodeId, dir: &Path, bind: &str) -> Node {
    let store = start_at(id, &dir.join("raft"), bind).await.unwrap();
    let addr = store.rpc().local_addr().unwrap().to_string();
    Node { store, addr }
}

async fn start_at(id: NodeId, raft: &Path, bind: &str) -> Result<Metastore, StartError> {
    Metastore::start(
        MetaConfig {
            node_id: id,
            dir: raft.to_owned(),
            tuning: tuning(),
        },
        RpcConfig {
            node_id: id,
            bind: bind.parse().unwrap(),
            keys: Keys::new(SECRET, None),
            features: 0,
            limits: Limits::default(),
        },
        Arc::new(RpcMetrics::default()),
    )
    .await
}

/// Polls `f` (the state of real nodes talking over the network) until it holds, within a
/// deadline.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        // (real time: these are real nodes on real sockets, no clock to drive)
        #[allow(clippy::disallowed_methods)]
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const DEADLINE: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_agree_survive_a_leader_loss_and_a_lagging_node_catches_up_by_snapshot() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        nodes.push(Some(start(i as u64 + 1, d.path(), "127.0.0.1:0").await));
    }
    let members: BTreeMap<NodeId, NodeInfo> = nodes
        .iter()
        .flatten()
        .map(|n| {
            (
                n.store.node_id(),
                NodeInfo {
                    rpc_addr: n.addr.clone(),
                },
            )
        })
        .collect();
    for n in nodes.iter().flatten() {
        n.store.bootstrap(&members).await.unwrap();
    }
    // a proposal through any node, follower included, is applied there before it answers
    for (i, n) in nodes.iter().flatten().enumerate() {
        let r = n
            .store
            .propose(create(i as u64 + 1, &format!("t{i}")), DEADLINE)
            .await
            .unwrap();
        assert!(matches!(r.outcome, Outcome::Catalog(Ok(_))), "{r:?}");
        assert!(
            n.store.view().catalog.get(&format!("t{i}")).is_some(),
            "visible where it was made"
        );
    }
    let all =
        |n: &Node, k: usize| (0..k).all(|i| n.store.view().catalog.get(&format!("t{i}")).is_some());
    for n in nodes.iter().flatten() {
        eventually("every node applies every proposal", || all(n, 3)).await;
    }
    // a refused command is refused everywhere, the same way
    let r = nodes[1]
        .as_ref()
        .unwrap()
        .store
        .propose(create(99, "t0"), DEADLINE)
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        Outcome::Catalog(Err(CatalogError::Exists("t0".into())))
    );

    // the leader goes away: the other two elect one and keep taking proposals
    let leader = nodes[0]
        .as_ref()
        .unwrap()
        .store
        .raft()
        .current_leader()
        .await
        .unwrap();
    let old = nodes[leader as usize - 1].take().unwrap();
    let old_addr = old.addr.clone();
    old.store.shutdown().await;
    drop(old);
    let survivor = nodes.iter().flatten().next().unwrap();
    let t = Instant::now();
    let r = survivor
        .store
        .propose(create(10, "after-leader-loss"), DEADLINE)
        .await
        .unwrap();
    assert!(matches!(r.outcome, Outcome::Catalog(Ok(_))));
    let new_leader = survivor.store.raft().current_leader().await.unwrap();
    assert_ne!(new_leader, leader);
    eprintln!("a proposal after the leader's loss took {:?}", t.elapsed());
    // enough proposals for a snapshot and a purge while it is away
    for i in 0..20 {
        survivor
            .store
            .propose(create(100 + i, &format!("s{i}")), DEADLINE)
            .await
            .unwrap();
    }
    // the leader purged what the stopped node lacks: it can only catch up by a snapshot
    let had = survivor.store.status().last_applied.unwrap();
    eventually("a snapshot and a purge on the survivors", || {
        nodes.iter().flatten().all(|n| {
            let m = n.store.raft().metrics().borrow().clone();
            m.purged.is_some_and(|p| p.index > r.index) && m.snapshot.is_some()
        })
    })
    .await;
    eprintln!(
        "applied {had}, purged up to {:?}",
        survivor.store.raft().metrics().borrow().purged
    );
    // it comes back on its address and catches up
    let back = start(leader, dirs[leader as usize - 1].path(), &old_addr).await;
    eventually("the restarted node catches up", || {
        let v = back.store.view();
        v.catalog.get("after-leader-loss").is_some()
            && v.catalog.get("s19").is_some()
            && all(&back, 3)
    })
    .await;
    let status = back.store.status();
    assert_eq!(status.members.len(), 3);
    back.store.shutdown().await;
    for n in nodes.into_iter().flatten() {
        n.store.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_not_in_the_initial_members_joins_as_a_voter_and_reads_are_current() {
    let (_dirs, nodes) = three_nodes().await;
    nodes[0]
        .store
        .propose(create(1, "before-join"), DEADLINE)
        .await
        .unwrap();
    let d4 = tempfile::tempdir().unwrap();
    let fourth = start(4, d4.path(), "127.0.0.1:0").await;
    assert!(!fourth.store.is_voter());
    // seeds that do not lead name the leader, which the joiner asks next (these seeds do
    // not list it)
    let leader = nodes[0].store.status().leader;
    let seeds: Vec<(NodeId, String)> = nodes
        .iter()
        .filter(|n| Some(n.store.node_id()) != leader)
        .map(|n| (n.store.node_id(), n.addr.clone()))
        .collect();
    let me = NodeInfo {
        rpc_addr: fourth.addr.clone(),
    };
    let t = Instant::now();
    loop {
        match fourth.store.join(&seeds, me.clone(), DEADLINE).await {
            Ok(()) => break,
            Err(e) => assert!(t.elapsed() < DEADLINE, "{e}"),
        }
    }
    eventually("the fourth node is a voter", || fourth.store.is_voter()).await;
    // joining again changes nothing
    fourth
        .store
        .join(&seeds, me.clone(), DEADLINE)
        .await
        .unwrap();
    // another node claiming the fourth's address is refused
    let imposter = start(5, tempfile::tempdir().unwrap().path(), "127.0.0.1:0").await;
    assert!(
        imposter
            .store
            .join(&seeds, me, DEADLINE)
            .await
            .unwrap_err()
            .contains("node_conflict")
    );
    imposter.store.shutdown().await;
    // a read index on the newcomer covers what was written before it joined
    let at = fourth.store.read_index(DEADLINE).await.unwrap();
    assert!(at > 0);
    assert!(fourth.store.view().catalog.get("before-join").is_some());
    // and it takes proposals
    fourth
        .store
        .propose(create(2, "from-the-fourth"), DEADLINE)
        .await
        .unwrap();
    for n in &nodes {
        eventually("everyone sees it", || {
            n.store.view().catalog.get("from-the-fourth").is_some()
        })
        .await;
        n.store.read_index(DEADLINE).await.unwrap();
    }
    assert_eq!(
        fourth.store.status().members.iter().filter(|m| m.2).count(),
        4
    );
    fourth.store.shutdown().await;
    for n in nodes {
        n.store.shutdown().await;
    }
}

#[test]
fn users_are_applied_and_carried_by_snapshots() {
    use narad_auth::store::{Refusal as UserRefusal, UserCommand, UserRecord};
    use openraft::RaftSnapshotBuilder;
    use openraft::storage::RaftStateMachine;
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut sm = StateMachine::open(a.path()).unwrap();
        let user = UserRecord {
            username: "alice".into(),
            id: 7,
            password_hash: "$argon2id$not-a-real-hash".into(),
            root: false,
            grants: vec![],
            created_at_ms: 1,
            updated_at_ms: 1,
            carried_from: None,
            origin: None,
            access_keys: Vec::new(),
        };
        let entry = |i, id, cmd| Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), i),
            payload: openraft::EntryPayload::Normal(MetaRequest { id, cmd }),
        };
        let create = MetaCmd::Users(UserCommand::Create { user: user.clone() });
        let r = sm
            .apply(vec![entry(1, 1, create.clone()), entry(2, 2, create)])
            .await
            .unwrap();
        assert_eq!(r[0].outcome, Outcome::Users(Ok(())));
        assert_eq!(
            r[1].outcome,
            Outcome::Users(Err(UserRefusal::Exists("alice".into())))
        );
        let snap = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let mut other = StateMachine::open(b.path()).unwrap();
        other
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        let view = other.subscribe().borrow().clone();
        assert_eq!(view.users.get("alice").map(|u| u.id), Some(7));
        // and from disk after a restart
        let reopened = StateMachine::open(b.path()).unwrap();
        assert!(reopened.subscribe().borrow().users.contains_key("alice"));
    });
}

#[tokio::test]
async fn a_lost_state_file_or_snapshot_refuses_start_and_says_which() {
    use openraft::storage::RaftLogStorage;
    let dir = tempfile::tempdir().unwrap();
    let mut log = LogStore::open(dir.path()).unwrap();
    log.save_vote(&openraft::Vote::new(1, 1)).await.unwrap();
    append(&mut log, (1..=3).map(blank).collect()).await;
    drop(log);
    std::fs::remove_file(dir.path().join("state")).unwrap();
    match LogStore::open(dir.path()) {
        Err(OpenError::Invalid { path, reason }) => {
            assert!(
                path.ends_with("state") && reason.contains("vote"),
                "{reason}"
            );
        }
        other => panic!("expected a refusal, got {:?}", other.err()),
    }
    // a log purged up to a snapshot that is gone
    let dir = tempfile::tempdir().unwrap();
    let raft = dir.path().join("raft");
    let mut log = LogStore::open(&raft).unwrap();
    log.save_vote(&openraft::Vote::new(1, 1)).await.unwrap();
    append(&mut log, (1..=3).map(blank).collect()).await;
    log.purge(openraft::LogId::new(
        openraft::CommittedLeaderId::new(1, 1),
        2,
    ))
    .await
    .unwrap();
    drop(log);
    let e = start_at(1, &raft, "127.0.0.1:0")
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("snapshot is missing"), "{e}");
}

async fn three_nodes() -> (Vec<tempfile::TempDir>, Vec<Node>) {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        nodes.push(start(i as u64 + 1, d.path(), "127.0.0.1:0").await);
    }
    let members: BTreeMap<NodeId, NodeInfo> = nodes
        .iter()
        .map(|n| {
            (
                n.store.node_id(),
                NodeInfo {
                    rpc_addr: n.addr.clone(),
                },
            )
        })
        .collect();
    for n in &nodes {
        n.store.bootstrap(&members).await.unwrap();
    }
    let t = Instant::now();
    while nodes[0].store.read_index(DEADLINE).await.is_err() {
        assert!(t.elapsed() < DEADLINE, "no leader");
    }
    (dirs, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_claiming_a_voter_s_id_or_unreachable_at_its_address_never_becomes_a_voter() {
    let (_dirs, nodes) = three_nodes().await;
    let seeds: Vec<(NodeId, String)> = nodes
        .iter()
        .map(|n| (n.store.node_id(), n.addr.clone()))
        .collect();
    // node 2's id at another address
    let d = tempfile::tempdir().unwrap();
    let imposter = start(2, d.path(), "127.0.0.1:0").await;
    let me = NodeInfo {
        rpc_addr: imposter.addr.clone(),
    };
    let e = imposter.store.join(&seeds, me, DEADLINE).await.unwrap_err();
    assert!(e.contains("node_conflict"), "{e}");
    imposter.store.shutdown().await;
    // a joiner advertising an address where nobody answers: never a voter, never a learner
    let d = tempfile::tempdir().unwrap();
    let lost = start(4, d.path(), "127.0.0.1:0").await;
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let nowhere = NodeInfo {
        rpc_addr: silent.local_addr().unwrap().to_string(),
    };
    for _ in 0..3 {
        let e = lost
            .store
            .join(&seeds, nowhere.clone(), DEADLINE)
            .await
            .unwrap_err();
        assert!(
            e.contains("joiner_unreachable") || e.contains("not_leader"),
            "{e}"
        );
    }
    let status = nodes[0].store.status();
    assert_eq!(status.members.len(), 3, "{status:?}");
    assert_eq!(status.members.iter().filter(|m| m.2).count(), 3);
    lost.store.shutdown().await;
    for n in nodes {
        n.store.shutdown().await;
    }
}
