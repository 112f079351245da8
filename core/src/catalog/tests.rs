use super::*;
use proptest::prelude::*;

fn topic(id: u64, name: &str) -> TopicMeta {
    TopicMeta {
        created_at_ms: 1_000 + id as i64,
        owner: Some("alice".into()),
        owner_id: Some(7),
        ..TopicMeta::new(id, name, 0, TopicConfig::default())
    }
}

fn link(parent: &TopicMeta, epoch: u64) -> ParentLink {
    ParentLink {
        parent: parent.name.clone(),
        parent_id: parent.id,
        delay_ms: 0,
        epoch,
        starts: Vec::new(),
        floor: None,
    }
}

fn remote(id: u64, name: &str) -> RemoteMeta {
    RemoteMeta {
        id,
        name: name.into(),
        url: "https://b.example.com/".into(),
        username: "mirror".into(),
        ca_pem: None,
        credential: SealedCredential {
            key_id: "00112233".into(),
            nonce: "bm9uY2U=".into(),
            ciphertext: "c2VhbGVk".into(),
        },
        carry_users: false,
        version: 1,
        created_at_ms: 10,
        updated_at_ms: 10,
    }
}

/// Remote child `name` of topic `t` (id 1) through remote `q` (id 5), to target `target_id`.
fn remote_child(name: &str, target_id: u64) -> RemoteChild {
    RemoteChild {
        name: name.into(),
        parent: "t".into(),
        parent_id: 1,
        remote: "q".into(),
        remote_id: 5,
        remote_topic: "t".into(),
        target_id,
        lanes: 1,
        epoch: 1,
        starts: Vec::new(),
        paused: false,
        created_at_ms: 0,
        skips: Vec::new(),
    }
}

fn run(cmds: &[CatalogCommand]) -> Catalog {
    let mut c = Catalog::default();
    for cmd in cmds {
        if let Ok((next, _)) = apply(&c, cmd) {
            c = next;
        }
    }
    c
}

#[test]
fn commands_build_the_catalog_they_describe() {
    let (p, c) = (topic(1, "p"), topic(2, "c"));
    let cmds = [
        CatalogCommand::CreateTopic { topic: p.clone() },
        CatalogCommand::CreateTopic { topic: c.clone() },
        CatalogCommand::Attach {
            child_id: 2,
            link: link(&p, 9),
        },
        CatalogCommand::AddSchemaVersion {
            topic_id: 1,
            schema: SchemaVersion {
                version: 1,
                created_at_ms: 5,
                schema: serde_json::json!({"type": "object"}),
            },
        },
    ];
    let cat = run(&cmds);
    assert_eq!(cat.applied(), 4);
    assert_eq!(cat.get("c").unwrap().parent, Some(link(&p, 9)));
    assert_eq!(cat.get("p").unwrap().schemas.len(), 1);
    assert_eq!(
        cat.get("c").unwrap().schemas,
        cat_schema(),
        "the child follows"
    );
    // deleting the parent makes the child standalone, with the schema it had
    let (cat, applied) = apply(&cat, &CatalogCommand::DeleteTopic { topic_id: 1 }).unwrap();
    assert_eq!(
        applied,
        Applied::Deleted {
            topic: Arc::new(TopicMeta {
                schemas: cat_schema(),
                ..p.clone()
            }),
            unlinked: vec![2]
        }
    );
    assert!(cat.get("p").is_none());
    assert_eq!(cat.get("c").unwrap().parent, None);
    assert_eq!(cat.get("c").unwrap().schemas, cat_schema());
}

/// A child adopts its parent's schema history at attach; a child with a schema history of
/// its own is refused unless it is the parent's.
#[test]
fn a_child_adopts_its_parents_schema_or_is_refused() {
    let with = |t: TopicMeta, schemas: Vec<SchemaVersion>| TopicMeta { schemas, ..t };
    let p = with(topic(1, "p"), cat_schema());
    let cat = run(&[
        CatalogCommand::CreateTopic { topic: p.clone() },
        CatalogCommand::CreateTopic {
            topic: topic(2, "bare"),
        },
        CatalogCommand::CreateTopic {
            topic: with(topic(3, "same"), cat_schema()),
        },
        CatalogCommand::CreateTopic {
            topic: with(
                topic(4, "other"),
                vec![SchemaVersion {
                    schema: serde_json::json!({"type": "string"}),
                    ..cat_schema().remove(0)
                }],
            ),
        },
    ]);
    let attach = |id| CatalogCommand::Attach {
        child_id: id,
        link: link(&p, 9),
    };
    let (cat, _) = apply(&cat, &attach(2)).unwrap();
    assert_eq!(cat.get("bare").unwrap().schemas, cat_schema());
    let (cat, _) = apply(&cat, &attach(3)).unwrap();
    assert_eq!(cat.get("same").unwrap().schemas, cat_schema());
    assert!(matches!(
        apply(&cat, &attach(4)),
        Err(CatalogError::FanoutConflict(_))
    ));
    // a child detached before the parent's next version comes back (its versions are the
    // first of the parent's), and adopts the rest
    let v2 = SchemaVersion {
        version: 2,
        schema: serde_json::json!({"type": "object", "properties": {}}),
        ..cat_schema().remove(0)
    };
    let grown = run(&[
        CatalogCommand::CreateTopic {
            topic: with(topic(1, "p"), vec![cat_schema().remove(0), v2.clone()]),
        },
        CatalogCommand::CreateTopic {
            topic: with(topic(3, "same"), cat_schema()),
        },
    ]);
    let (grown, _) = apply(&grown, &attach(3)).unwrap();
    assert_eq!(grown.get("same").unwrap().schemas.len(), 2);
    // a schema-less parent cannot take a child with a schema
    let bare_parent = run(&[
        CatalogCommand::CreateTopic {
            topic: topic(1, "p"),
        },
        CatalogCommand::CreateTopic {
            topic: with(topic(3, "same"), cat_schema()),
        },
    ]);
    assert!(matches!(
        apply(&bare_parent, &attach(3)),
        Err(CatalogError::FanoutConflict(_))
    ));
}

#[test]
fn remotes_are_created_changed_only_from_the_version_read_and_deleted() {
    let put = |r: RemoteMeta, expect_version| CatalogCommand::PutRemote {
        remote: r,
        expect_version,
    };
    let (cat, applied) = apply(&Catalog::default(), &put(remote(5, "dr"), None)).unwrap();
    assert!(matches!(applied, Applied::Remote(r) if r.version == 1));
    // the name in another case, or the id again, is taken
    assert_eq!(
        apply(&cat, &put(remote(6, "DR"), None)).unwrap_err(),
        CatalogError::RemoteExists("dr".into())
    );
    assert!(matches!(
        apply(&cat, &put(remote(5, "other"), None)),
        Err(CatalogError::Invalid(_))
    ));
    // a change names the version it read; the creation time stays
    let changed = RemoteMeta {
        username: "mirror2".into(),
        created_at_ms: 99,
        ..remote(5, "dr")
    };
    let (cat, _) = apply(&cat, &put(changed.clone(), Some(1))).unwrap();
    let r = cat.remote("dr").unwrap();
    assert_eq!(
        (r.version, r.created_at_ms, r.username.as_str()),
        (2, 10, "mirror2")
    );
    assert!(matches!(
        apply(&cat, &put(changed.clone(), Some(1))),
        Err(CatalogError::RemoteChanged(_))
    ));
    // a change of another incarnation of the name, or of a name not there
    assert_eq!(
        apply(&cat, &put(remote(7, "dr"), Some(2))).unwrap_err(),
        CatalogError::RemoteNotFound("dr".into())
    );
    // what no node would accept is refused whoever proposed it
    for bad in [
        RemoteMeta {
            url: "http://b.example.com/".into(),
            ..remote(8, "x")
        },
        RemoteMeta {
            username: "a:b".into(),
            ..remote(8, "x")
        },
        RemoteMeta {
            name: "../x".into(),
            ..remote(8, "x")
        },
        RemoteMeta {
            ca_pem: Some("x".repeat(remote::MAX_CA_BYTES + 1)),
            ..remote(8, "x")
        },
        RemoteMeta {
            credential: SealedCredential {
                ciphertext: String::new(),
                ..remote(8, "x").credential
            },
            ..remote(8, "x")
        },
    ] {
        assert!(
            matches!(
                apply(&cat, &put(bad, None)),
                Err(CatalogError::InvalidConfig(_))
            ),
            "accepted"
        );
    }
    // at most MAX_REMOTES
    let mut full = cat.clone();
    for i in 1..remote::MAX_REMOTES as u64 {
        full = apply(&full, &put(remote(100 + i, &format!("r{i}")), None))
            .unwrap()
            .0;
    }
    assert_eq!(
        apply(&full, &put(remote(999, "one-more"), None)).unwrap_err(),
        CatalogError::TooManyRemotes(remote::MAX_REMOTES)
    );
    // deleted by id
    let (cat, applied) = apply(&cat, &CatalogCommand::DeleteRemote { remote_id: 5 }).unwrap();
    assert!(matches!(applied, Applied::RemoteDeleted(r) if r.name == "dr"));
    assert!(cat.remote("dr").is_none());
    assert!(matches!(
        apply(&cat, &CatalogCommand::DeleteRemote { remote_id: 5 }),
        Err(CatalogError::RemoteNotFound(_))
    ));
}

fn cat_schema() -> Vec<SchemaVersion> {
    vec![SchemaVersion {
        version: 1,
        created_at_ms: 5,
        schema: serde_json::json!({"type": "object"}),
    }]
}

#[test]
fn refused_commands_change_nothing() {
    let (p, c) = (topic(1, "p"), topic(2, "c"));
    let cat = run(&[
        CatalogCommand::CreateTopic { topic: p.clone() },
        CatalogCommand::CreateTopic { topic: c.clone() },
        CatalogCommand::Attach {
            child_id: 2,
            link: link(&p, 9),
        },
    ]);
    let refused = [
        // same name, and same id under another name
        CatalogCommand::CreateTopic { topic: p.clone() },
        CatalogCommand::CreateTopic {
            topic: topic(1, "other"),
        },
        // a name that is no valid directory name, whoever proposed it
        CatalogCommand::CreateTopic {
            topic: topic(9, "../escape"),
        },
        // grandchild: p's child c cannot be a parent, and c already has a parent
        CatalogCommand::Attach {
            child_id: 1,
            link: link(&c, 3),
        },
        CatalogCommand::Attach {
            child_id: 2,
            link: link(&p, 4),
        },
        // a link to a parent incarnation that is gone
        CatalogCommand::Attach {
            child_id: 1,
            link: ParentLink {
                parent_id: 99,
                ..link(&c, 5)
            },
        },
        // a child cannot get a schema; versions must follow each other
        CatalogCommand::AddSchemaVersion {
            topic_id: 2,
            schema: cat_schema().remove(0),
        },
        CatalogCommand::AddSchemaVersion {
            topic_id: 1,
            schema: SchemaVersion {
                version: 2,
                ..cat_schema().remove(0)
            },
        },
        // partitions never shrink
        CatalogCommand::AlterTopic {
            topic_id: 1,
            config: TopicConfig {
                partitions: 1,
                ..TopicConfig::default()
            },
            owners: Vec::new(),
        },
        CatalogCommand::Detach {
            child_id: 1,
            parent_id: 2,
        },
        CatalogCommand::DeleteTopic { topic_id: 77 },
    ];
    for cmd in &refused {
        assert!(apply(&cat, cmd).is_err(), "{cmd:?} applied");
    }
}

/// A cluster's partition owners: one per partition at create; growing names the new ones
/// and keeps the old; a topic of a single node (no owners) cannot be given some.
#[test]
fn partition_owners_cover_every_partition_and_never_move_on_an_alter() {
    let config = |partitions| TopicConfig {
        partitions,
        ..TopicConfig::default()
    };
    let owned = TopicMeta {
        config: config(2),
        owners: vec![1, 2],
        ..topic(1, "o")
    };
    let cat = run(&[
        CatalogCommand::CreateTopic { topic: owned },
        CatalogCommand::CreateTopic {
            topic: topic(2, "single"),
        },
    ]);
    let alter = |topic_id, partitions, owners: &[u64]| CatalogCommand::AlterTopic {
        topic_id,
        config: config(partitions),
        owners: owners.to_vec(),
    };
    let refused = [
        CatalogCommand::CreateTopic {
            topic: TopicMeta {
                config: config(3),
                owners: vec![1, 2],
                ..topic(3, "short")
            },
        },
        // new partitions without owners, old owners changed, too few, and a single node's
        alter(1, 3, &[]),
        alter(1, 3, &[2, 2, 3]),
        alter(1, 3, &[1, 2]),
        alter(2, 2, &[1, 2]),
    ];
    for cmd in &refused {
        assert!(apply(&cat, cmd).is_err(), "{cmd:?} applied");
    }
    let (grown, _) = apply(&cat, &alter(1, 3, &[1, 2, 3])).unwrap();
    assert_eq!(grown.get("o").unwrap().owners, vec![1, 2, 3]);
    // other settings alone keep the owners
    let (same, _) = apply(&grown, &alter(1, 3, &[])).unwrap();
    assert_eq!(same.get("o").unwrap().owners, vec![1, 2, 3]);
}

/// Commands as a generator makes them: a small universe of names and ids so that they
/// collide often (duplicates, missing ids, grandchildren are all exercised).
fn command() -> impl Strategy<Value = CatalogCommand> {
    let id = 1u64..6;
    let name = prop::sample::select(vec!["a", "b", "c", "d", "e"]);
    prop_oneof![
        (id.clone(), name.clone(), 1u32..5).prop_map(|(id, name, partitions)| {
            CatalogCommand::CreateTopic {
                topic: TopicMeta {
                    config: TopicConfig {
                        partitions,
                        ..TopicConfig::default()
                    },
                    ..topic(id, name)
                },
            }
        }),
        (id.clone(), 1u32..8).prop_map(|(topic_id, partitions)| CatalogCommand::AlterTopic {
            topic_id,
            config: TopicConfig {
                partitions,
                ..TopicConfig::default()
            },
            owners: Vec::new(),
        }),
        (id.clone(), 1u32..4).prop_map(|(topic_id, version)| {
            CatalogCommand::AddSchemaVersion {
                topic_id,
                schema: SchemaVersion {
                    version,
                    created_at_ms: 3,
                    schema: serde_json::json!({"type": "object"}),
                },
            }
        }),
        Just(CatalogCommand::Disown {
            owner: "alice".into(),
            owner_id: 7
        }),
        id.clone()
            .prop_map(|topic_id| CatalogCommand::DeleteTopic { topic_id }),
        (id.clone(), id.clone(), name, any::<u64>()).prop_map(
            |(child_id, parent_id, parent, epoch)| CatalogCommand::Attach {
                child_id,
                link: ParentLink {
                    parent: parent.into(),
                    parent_id,
                    delay_ms: 0,
                    epoch,
                    starts: Vec::new(),
                    floor: None,
                },
            }
        ),
        (id.clone(), id.clone()).prop_map(|(child_id, parent_id)| CatalogCommand::Detach {
            child_id,
            parent_id
        }),
        (
            id.clone(),
            prop::sample::select(vec!["r", "R", "s"]),
            prop::option::of(1u64..4)
        )
            .prop_map(|(id, name, expect_version)| CatalogCommand::PutRemote {
                remote: remote(id, name),
                expect_version,
            }),
        id.prop_map(|remote_id| CatalogCommand::DeleteRemote { remote_id }),
    ]
}

/// The invariants every catalog keeps, whatever commands made it.
fn check_invariants(cat: &Catalog) {
    let mut names = std::collections::HashSet::new();
    let mut remote_ids = std::collections::HashSet::new();
    for r in cat.remotes() {
        assert!(
            names.insert(r.name.to_ascii_lowercase()),
            "remote {} twice",
            r.name
        );
        assert!(remote_ids.insert(r.id), "remote id {} twice", r.id);
        assert!(r.version >= 1);
    }
    let mut ids = std::collections::HashSet::new();
    for t in cat.topics() {
        assert!(ids.insert(t.id), "id {} twice", t.id);
        if let Some(l) = &t.parent {
            let p = cat.get(&l.parent).expect("a link names an existing parent");
            assert_eq!(p.id, l.parent_id, "a link names the parent's incarnation");
            assert!(p.parent.is_none(), "no grandchildren");
            assert!(
                same_schema_history(&t.schemas, &p.schemas),
                "a child's schema is its parent's"
            );
        }
        for (i, v) in t.schemas.iter().enumerate() {
            assert_eq!(
                v.version as usize,
                i + 1,
                "schema versions follow each other"
            );
        }
    }
}

proptest! {
    /// Replaying the same command log gives the same catalog, also after the log went through
    /// its serialised form (as a replicated log carries it); every catalog on the way keeps
    /// the invariants.
    #[test]
    fn replaying_a_command_log_gives_the_same_catalog(cmds in prop::collection::vec(command(), 0..60)) {
        let mut cat = Catalog::default();
        let mut log = Vec::new();
        for cmd in &cmds {
            if let Ok((next, _)) = apply(&cat, cmd) {
                prop_assert_eq!(next.applied(), cat.applied() + 1);
                cat = next;
                log.push(cmd.clone());
            }
            check_invariants(&cat);
        }
        let wire = serde_json::to_vec(&log).unwrap();
        let replayed: Vec<CatalogCommand> = serde_json::from_slice(&wire).unwrap();
        let mut again = Catalog::default();
        for cmd in &replayed {
            again = apply(&again, cmd).expect("a command that applied once applies again").0;
        }
        prop_assert_eq!(&again, &cat);
        prop_assert_eq!(run(&cmds), cat);
    }
}

/// The store publishes a command's catalog only once it is on disk: a watcher sees nothing of
/// a command whose write failed, and the published catalog is what a restart reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_publishes_only_what_is_durable() {
    use store::{LocalMetaStore, MetaStore, StoreError};
    let dir = tempfile::tempdir().unwrap();
    let s = LocalMetaStore::open(dir.path()).unwrap();
    let mut watch = s.subscribe();
    let create = |id, name: &str| CatalogCommand::CreateTopic {
        topic: topic(id, name),
    };
    let published = Arc::new(std::sync::atomic::AtomicUsize::new(0));

    s.propose(create(1, "a"), Box::new(|_, _| {}))
        .await
        .unwrap();
    assert!(watch.has_changed().unwrap());
    assert_eq!(watch.borrow_and_update().applied(), 1);
    assert_eq!(store::load(dir.path()).unwrap(), *s.catalog());

    // a write that cannot happen: nothing is published, the hook does not run
    let blocker = dir.path().join(format!("{}.tmp", store::META_FILE));
    std::fs::create_dir(&blocker).unwrap();
    let ran = published.clone();
    let e = s
        .propose(
            create(2, "b"),
            Box::new(move |_, _| {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Meta(_)), "{e:?}");
    assert!(!watch.has_changed().unwrap());
    assert_eq!(published.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(s.catalog().get("b").is_none());

    // a refused command: likewise
    std::fs::remove_dir(&blocker).unwrap();
    let e = s
        .propose(create(3, "a"), Box::new(|_, _| {}))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Refused(CatalogError::Exists(_))));
    assert!(!watch.has_changed().unwrap());

    s.propose(create(2, "b"), Box::new(|_, _| {}))
        .await
        .unwrap();
    assert_eq!(watch.borrow_and_update().len(), 2);
    // remotes are kept in the same file
    s.propose(
        CatalogCommand::PutRemote {
            remote: remote(9, "dr"),
            expect_version: None,
        },
        Box::new(|_, _| {}),
    )
    .await
    .unwrap();
    assert_eq!(
        store::load(dir.path()).unwrap().remote("dr").map(|r| r.id),
        Some(9)
    );
    let reopened = LocalMetaStore::open(dir.path()).unwrap();
    assert_eq!(reopened.catalog(), s.catalog());
}

/// A move's commands are compare-and-sets: a target set only at the owner and epoch the
/// proposer saw; a flip only for the move in flight, its target, its epoch, and a token
/// the owner did not thaw; a thaw refused once the flip came first.
#[test]
fn moves_flip_only_what_was_copied() {
    let owned = TopicMeta {
        config: TopicConfig {
            partitions: 2,
            ..TopicConfig::default()
        },
        owners: vec![1, 2],
        ..topic(1, "o")
    };
    let cat = run(&[CatalogCommand::CreateTopic { topic: owned }]);
    let target = |id, node| {
        Some(MoveTarget {
            id,
            node,
            since_ms: 5,
            reason: "admin".into(),
        })
    };
    let set = |owner, epoch, t| CatalogCommand::SetMoveTarget {
        topic_id: 1,
        partition: 0,
        expect_owner: owner,
        expect_epoch: epoch,
        target: t,
    };
    let flip = |move_id, target, epoch, token| CatalogCommand::CompleteMove {
        topic_id: 1,
        partition: 0,
        move_id,
        source: 1,
        target,
        expect_epoch: epoch,
        token,
    };
    let thaw = |epoch, token| CatalogCommand::ThawPartition {
        topic_id: 1,
        partition: 0,
        owner: 1,
        expect_epoch: epoch,
        token,
    };
    let conflict = |c: &Catalog, cmd: &CatalogCommand| {
        assert!(
            matches!(apply(c, cmd), Err(CatalogError::MoveConflict(_))),
            "{cmd:?} should conflict"
        );
    };
    conflict(&cat, &set(2, 0, target(7, 3)));
    conflict(&cat, &set(1, 1, target(7, 3)));
    assert!(
        apply(&cat, &set(1, 0, target(7, 1))).is_err(),
        "to its owner"
    );
    let (cat, _) = apply(&cat, &set(1, 0, target(7, 3))).unwrap();
    assert_eq!(cat.get("o").unwrap().moves[&0].target, 3);
    // no flip without the move in flight, its id, its target, its epoch
    conflict(&cat, &flip(8, 3, 0, 11));
    conflict(&cat, &flip(7, 2, 0, 11));
    conflict(&cat, &flip(7, 3, 1, 11));
    // a thawed token never flips
    let (cat, _) = apply(&cat, &thaw(0, 11)).unwrap();
    conflict(&cat, &flip(7, 3, 0, 11));
    let (done, _) = apply(&cat, &flip(7, 3, 0, 12)).unwrap();
    let t = done.get("o").unwrap();
    assert_eq!(
        (t.owners.clone(), t.owner_epoch(0), t.owner_epoch(1)),
        (vec![3, 2], 1, 0)
    );
    assert!(t.moves.is_empty());
    // after the flip: a thaw, a second flip, a move from the old owner all conflict
    conflict(&done, &thaw(0, 12));
    conflict(&done, &flip(7, 3, 0, 12));
    conflict(&done, &set(1, 0, target(9, 2)));
    // a cancelled move cannot be flipped, even by a new move to the same node
    let (cancelled, _) = apply(&cat, &set(1, 0, None)).unwrap();
    conflict(&cancelled, &flip(7, 3, 0, 12));
    let (again, _) = apply(&cancelled, &set(1, 0, target(9, 3))).unwrap();
    conflict(&again, &flip(7, 3, 0, 12));
    assert!(apply(&again, &flip(9, 3, 0, 12)).is_ok());
    // a single node's topic has no owners to move
    let single = run(&[CatalogCommand::CreateTopic {
        topic: topic(2, "s"),
    }]);
    let cmd = CatalogCommand::SetMoveTarget {
        topic_id: 2,
        partition: 0,
        expect_owner: 1,
        expect_epoch: 0,
        target: target(1, 2),
    };
    assert!(apply(&single, &cmd).is_err());
}

#[test]
fn an_owners_witnesses_change_only_from_what_the_proposer_saw() {
    let set = |expect: &[u64], voters: &[u64]| CatalogCommand::SetInSync {
        owner: 1,
        expect: expect.to_vec(),
        voters: voters.to_vec(),
    };
    let cat = Catalog::default();
    assert!(cat.in_sync(1).is_empty());
    // the owner itself is never its own witness; duplicates collapse
    let (cat, done) = apply(&cat, &set(&[], &[3, 1, 2, 3])).unwrap();
    assert_eq!(done, Applied::InSync(vec![2, 3]));
    assert_eq!(cat.in_sync(1), vec![2, 3]);
    assert!(cat.in_sync(2).is_empty());
    // a proposer that saw an older set is refused (in any order it lists it)
    assert!(matches!(
        apply(&cat, &set(&[2], &[2])),
        Err(CatalogError::InSyncChanged(_))
    ));
    let (cat, _) = apply(&cat, &set(&[3, 2], &[3])).unwrap();
    assert_eq!(cat.in_sync(1), vec![3]);
    // emptied: as if none was ever recorded, and a snapshot keeps what is set
    let (empty, _) = apply(&cat, &set(&[3], &[])).unwrap();
    assert_eq!(empty.in_sync_all().count(), 0);
    let loaded = Catalog::default().with_in_sync(cat.in_sync_all());
    assert_eq!(loaded.in_sync(1), vec![3]);
}

/// Two attaches that raced each other's checks across two clusters: each cluster's catalog
/// refuses the half of the cycle that would come second, whichever it is (a topic never
/// mirrors a topic it ships to, nor ships to the topic it mirrors).
#[test]
fn a_topic_never_mirrors_a_topic_it_ships_to() {
    let there = role::Source {
        cluster: 0xc1,
        topic: 0xa1,
    };
    let child = remote_child;
    let base = run(&[
        CatalogCommand::CreateTopic {
            topic: topic(1, "t"),
        },
        CatalogCommand::PutRemote {
            remote: remote(5, "q"),
            expect_version: None,
        },
    ]);
    let mirror = CatalogCommand::SetRole {
        topic_id: 1,
        expect: role::TopicRole::default(),
        role: role::TopicRole::Mirror {
            epoch: 0,
            of: there,
        },
    };
    // the child first: the mirror role is refused
    let (with_child, _) = apply(
        &base,
        &CatalogCommand::AttachRemote {
            child: child("back", 0xa1),
        },
    )
    .unwrap();
    assert!(matches!(
        apply(&with_child, &mirror),
        Err(CatalogError::LoopDetected(_))
    ));
    // a child to another topic is no loop
    let (other, _) = apply(
        &base,
        &CatalogCommand::AttachRemote {
            child: child("onward", 0xb2),
        },
    )
    .unwrap();
    let (mirrored, _) = apply(&other, &mirror).unwrap();
    // the mirror role first: the child back to its source is refused
    assert!(matches!(
        apply(
            &mirrored,
            &CatalogCommand::AttachRemote {
                child: child("back", 0xa1),
            }
        ),
        Err(CatalogError::LoopDetected(_))
    ));
}

#[test]
fn a_mirror_has_no_fanout_children_and_keeps_its_sources() {
    let there = role::Source {
        cluster: 0xc1,
        topic: 0xa1,
    };
    let p = topic(1, "p");
    let base = run(&[
        CatalogCommand::CreateTopic { topic: p.clone() },
        CatalogCommand::CreateTopic {
            topic: topic(2, "c"),
        },
    ]);
    let mirror = |id: u64| CatalogCommand::SetRole {
        topic_id: id,
        expect: role::TopicRole::default(),
        role: role::TopicRole::Mirror {
            epoch: 0,
            of: there,
        },
    };
    let attach = CatalogCommand::Attach {
        child_id: 2,
        link: link(&p, 3),
    };
    // a parent does not become a mirror (its children would serve its records)
    let (parent, _) = apply(&base, &attach).unwrap();
    assert!(matches!(
        apply(&parent, &mirror(1)),
        Err(CatalogError::FanoutConflict(_))
    ));
    // a mirror takes no child, nor is one
    let (mirrored, _) = apply(&base, &mirror(1)).unwrap();
    assert!(matches!(
        apply(&mirrored, &attach),
        Err(CatalogError::FanoutConflict(_))
    ));
    let (child_mirrored, _) = apply(&base, &mirror(2)).unwrap();
    assert!(matches!(
        apply(&child_mirrored, &attach),
        Err(CatalogError::FanoutConflict(_))
    ));
    // the source's children are kept as sent, and checked
    let carried = |name: &str, partitions: u32| CarriedChild {
        name: name.into(),
        delay_ms: 60_000,
        partitions,
    };
    let set = |children: Vec<CarriedChild>| CatalogCommand::SetCarriedChildren {
        topic_id: 1,
        children,
    };
    // (names are case-sensitive: two topics)
    apply(&mirrored, &set(vec![carried("x", 1), carried("X", 1)])).unwrap();
    let (kept, _) = apply(&mirrored, &set(vec![carried("audit", 2)])).unwrap();
    assert_eq!(
        kept.get("p").unwrap().carried_children,
        vec![carried("audit", 2)]
    );
    for bad in [
        vec![carried("a/b", 1)],
        vec![carried("x", 0)],
        vec![carried("x", 1), carried("x", 2)],
        (0..=MAX_CHILDREN)
            .map(|i| carried(&format!("c{i}"), 1))
            .collect(),
    ] {
        assert!(matches!(
            apply(&mirrored, &set(bad)),
            Err(CatalogError::InvalidConfig(_))
        ));
    }
}

/// A remote that carries users acts as an admin of the other cluster: no remote child ships
/// through it, whichever of the two comes first.
#[test]
fn a_remote_that_carries_users_carries_nothing_else() {
    let child = remote_child("dr", 0xa1);
    let carrying = RemoteMeta {
        carry_users: true,
        ..remote(5, "q")
    };
    let base = |r: RemoteMeta| {
        run(&[
            CatalogCommand::CreateTopic {
                topic: topic(1, "t"),
            },
            CatalogCommand::PutRemote {
                remote: r,
                expect_version: None,
            },
        ])
    };
    let attach = CatalogCommand::AttachRemote {
        child: child.clone(),
    };
    assert!(matches!(
        apply(&base(carrying.clone()), &attach),
        Err(CatalogError::RemoteInUse(_))
    ));
    let (with_child, _) = apply(&base(remote(5, "q")), &attach).unwrap();
    let start = CatalogCommand::PutRemote {
        remote: carrying,
        expect_version: Some(1),
    };
    assert!(matches!(
        apply(&with_child, &start),
        Err(CatalogError::RemoteInUse(_))
    ));
    // without children it may start carrying
    assert!(apply(&base(remote(5, "q")), &start).is_ok());
}
