//! Users carried from another cluster, over a remote with `carry_users` on.
//!
//! The source sends every user it has but its root, whole (name, id, password hash, grants,
//! times), whenever they change; this cluster takes the list as one
//! `store::UserCommand::Carry`, planned by [`plan`]:
//!
//! - a user this cluster lacks is created, marked as carried from that source;
//! - a user of the same name **and id** (the same user, carried earlier, or one of ours that
//!   came back after a failover) takes the source's hash and grants when the source changed
//!   it later than this cluster did (the newer change wins, by the clusters' clocks);
//! - a user of the same name carried from the same source but with another id (deleted and
//!   created again there) is replaced;
//! - a user carried from that source and no longer in its list is deleted;
//! - anything else of the same name (a user of this cluster's own, the root, the caller
//!   itself) is left alone and reported as a conflict, and so is every admin (carried or
//!   here) unless the caller is this cluster's root user: only root makes or changes admins.
//!
//! Hashes are checked before anything is planned: only argon2id at this crate's own
//! parameters is taken, so a carried hash can never make a login cost more than a local one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::grant::{Grant, validate_grants};
use crate::record::{Deleted, MAX_USERS, ROOT_USER, UserRecord, Users, validate_username};

/// Largest list one carry request may hold (the source sends nothing bigger and says why).
pub const MAX_CARRY_BYTES: usize = 4 << 20;
/// Longest password hash taken (argon2id's default PHC string is under 100 bytes).
const MAX_HASH_BYTES: usize = 256;
/// Most conflicts a plan names (the rest are counted).
pub const MAX_CONFLICTS_NAMED: usize = 20;
const ADMIN: &str = "an admin: carried only when the link's user here is the root user";
const DELETED_HERE: &str = "deleted here since: not brought back";
const CALLER: &str = "the link's own user here";
const ROOT: &str = "the root user";
const ID_TAKEN: &str = "its id is another user's here";
const NAME_TAKEN: &str = "another user of that name lives here";
const FULL: &str = "this cluster holds the most users it may";
/// Every reason a plan gives for leaving a user alone: a sender shows only these from an
/// answer (a remote's words are not repeated).
pub const REASONS: &[&str] = &[
    ADMIN,
    DELETED_HERE,
    CALLER,
    ROOT,
    ID_TAKEN,
    NAME_TAKEN,
    FULL,
];

/// One user as a source sends it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarriedUser {
    pub username: String,
    pub id: u64,
    pub password_hash: String,
    #[serde(default)]
    pub grants: Vec<Grant>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The cluster (id, hex) the user was made on, when not the sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

impl std::fmt::Debug for CarriedUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CarriedUser")
            .field("username", &self.username)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl CarriedUser {
    /// `u` as a source sends it.
    pub fn of(u: &UserRecord) -> Self {
        Self {
            username: u.username.clone(),
            id: u.id,
            password_hash: u.password_hash.clone(),
            grants: u.grants.clone(),
            created_at_ms: u.created_at_ms,
            updated_at_ms: u.updated_at_ms,
            origin: u.origin.clone(),
        }
    }
}

/// A carried user's hash is argon2id (v19) at the parameters [`crate::authn::hash_password`]
/// uses: anything else could make every login of that user cost what its sender chose.
pub fn check_hash(hash: &str) -> Result<(), String> {
    use argon2::password_hash::PasswordHash;
    if hash.len() > MAX_HASH_BYTES {
        return Err(format!("password_hash: longer than {MAX_HASH_BYTES} bytes"));
    }
    let h = PasswordHash::new(hash).map_err(|e| format!("password_hash: {e}"))?;
    if h.algorithm.as_str() != "argon2id" || h.version != Some(0x13) {
        return Err("password_hash: must be argon2id, version 19".into());
    }
    let p = argon2::Params::try_from(&h).map_err(|e| format!("password_hash: {e}"))?;
    let d = argon2::Params::DEFAULT;
    // a salt argon2 takes (a shorter one makes a user nobody can sign in as)
    let mut buf = [0u8; 64];
    let salt = h
        .salt
        .and_then(|s| s.decode_b64(&mut buf).ok().map(<[u8]>::len));
    if (p.m_cost(), p.t_cost(), p.p_cost()) != (d.m_cost(), d.t_cost(), d.p_cost())
        || !p.keyid().is_empty()
        || !p.data().is_empty()
        || salt.is_none_or(|n| n < argon2::MIN_SALT_LEN)
        || h.hash
            .is_none_or(|o| o.len() != argon2::Params::DEFAULT_OUTPUT_LEN)
    {
        return Err(format!(
            "password_hash: must have this broker's parameters (m={}, t={}, p={}, no keyid or data, a salt of at least {} bytes and a {}-byte hash)",
            d.m_cost(),
            d.t_cost(),
            d.p_cost(),
            argon2::MIN_SALT_LEN,
            argon2::Params::DEFAULT_OUTPUT_LEN
        ));
    }
    Ok(())
}

/// The checks a carried list passes before it is planned: every user valid, not the root,
/// no name or id twice, within [`MAX_USERS`].
pub fn check_list(users: &[CarriedUser]) -> Result<(), String> {
    if users.len() > MAX_USERS {
        return Err(format!("users: at most {MAX_USERS}"));
    }
    let (mut names, mut ids) = (BTreeSet::new(), BTreeSet::new());
    for u in users {
        let at = |e: String| format!("user '{}': {e}", u.username);
        validate_username(&u.username).map_err(at)?;
        if u.username == ROOT_USER {
            return Err(at("the root user is never carried".into()));
        }
        if u.id == 0 {
            return Err(at("id: must not be 0".into()));
        }
        validate_grants(&u.grants).map_err(at)?;
        check_hash(&u.password_hash).map_err(at)?;
        if u.origin.as_ref().is_some_and(|o| !is_cluster_id(o)) {
            return Err(at(
                "origin: must be a cluster id, 16 lowercase hex digits".into()
            ));
        }
        if !names.insert(u.username.as_str()) || !ids.insert(u.id) {
            return Err(at("listed twice (by name or id)".into()));
        }
    }
    Ok(())
}

/// A cluster id as users name it: 16 lowercase hex digits.
pub fn is_cluster_id(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What a carried list does to this cluster's users.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct CarryPlan {
    #[serde(skip)]
    pub create: Vec<UserRecord>,
    /// Records replacing the same name (an update, or a user of another id replaced).
    #[serde(skip)]
    pub update: Vec<UserRecord>,
    #[serde(skip)]
    pub delete: Vec<String>,
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    pub unchanged: usize,
    /// Users left alone, and why (at most [`MAX_CONFLICTS_NAMED`]; `conflict_count` has all).
    pub conflicts: Vec<Conflict>,
    pub conflict_count: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conflict {
    pub username: String,
    pub reason: &'static str,
}

impl CarryPlan {
    fn conflict(&mut self, username: &str, reason: &'static str) {
        self.conflict_count += 1;
        if self.conflicts.len() < MAX_CONFLICTS_NAMED {
            self.conflicts.push(Conflict {
                username: username.to_owned(),
                reason,
            });
        }
    }

    /// Whether applying it changes anything.
    pub fn changes(&self) -> bool {
        !(self.create.is_empty() && self.update.is_empty() && self.delete.is_empty())
    }
}

/// What `carried` (a list [`check_list`] passed) from cluster `source` does to `users` of
/// cluster `me` (its id, if it has one), when `caller` (the link's user here, never touched;
/// `may_admin` if it is the root user) sends it. Pure: every replica plans the same.
pub fn plan(
    users: &Users,
    deleted: &Deleted,
    me: Option<&str>,
    source: &str,
    carried: &[CarriedUser],
    caller: &str,
    may_admin: bool,
) -> CarryPlan {
    let mut p = CarryPlan::default();
    let listed: BTreeMap<&str, &CarriedUser> =
        carried.iter().map(|c| (c.username.as_str(), c)).collect();
    let from_source = |l: &UserRecord| l.carried_from.as_deref() == Some(source);
    // deletes first, so that they free room for creates
    for l in users.values() {
        if from_source(l) && !l.root && l.username != caller && !listed.contains_key(&*l.username) {
            if l.is_admin() && !may_admin {
                p.conflict(&l.username, ADMIN);
            } else {
                p.delete.push(l.username.clone());
            }
        }
    }
    // (a set: a list of 10,000 against as many deletes stays n log n)
    let deleting: BTreeSet<&str> = p.delete.iter().map(String::as_str).collect();
    let mut ids: BTreeSet<u64> = users
        .values()
        .filter(|u| !deleting.contains(u.username.as_str()))
        .map(|u| u.id)
        .collect();
    let mut count = users.len() - p.delete.len();
    for c in carried {
        let origin = c.origin.as_deref().unwrap_or(source);
        let fresh = || UserRecord {
            username: c.username.clone(),
            id: c.id,
            password_hash: c.password_hash.clone(),
            root: false,
            grants: c.grants.clone(),
            created_at_ms: c.created_at_ms,
            updated_at_ms: c.updated_at_ms,
            carried_from: Some(source.to_owned()),
            origin: Some(origin.to_owned()),
            access_keys: Vec::new(),
        };
        // a user made here that this cluster no longer has (by that id) was deleted here:
        // a copy coming back from a cluster that has not heard of the delete yet is not
        // brought back
        let ours = me == Some(origin);
        // a user deleted here (by hand, or by an earlier list) that comes back from a
        // cluster that had not heard of the delete when it sent this list
        if deleted.contains(c.id) {
            p.conflict(&c.username, DELETED_HERE);
            continue;
        }
        if c.username == caller {
            p.conflict(&c.username, CALLER);
            continue;
        }
        let admin = crate::grant::is_admin(&c.grants);
        match users.get(&c.username) {
            Some(l) if l.root => p.conflict(&c.username, ROOT),
            Some(l) if ours && l.id != c.id => p.conflict(&c.username, DELETED_HERE),
            None if ours => p.conflict(&c.username, DELETED_HERE),
            Some(l) if (admin || l.is_admin()) && !may_admin => {
                // unchanged is not a conflict: nothing would be made or changed
                let same =
                    l.id == c.id && l.password_hash == c.password_hash && l.grants == c.grants;
                if same {
                    p.unchanged += 1;
                } else {
                    p.conflict(&c.username, ADMIN);
                }
            }
            None if admin && !may_admin => p.conflict(&c.username, ADMIN),
            Some(l) if l.id == c.id => {
                let differs = l.password_hash != c.password_hash || l.grants != c.grants;
                if differs && c.updated_at_ms > l.updated_at_ms {
                    p.update.push(UserRecord {
                        password_hash: c.password_hash.clone(),
                        grants: c.grants.clone(),
                        updated_at_ms: c.updated_at_ms,
                        ..UserRecord::clone(l)
                    });
                } else {
                    p.unchanged += 1;
                }
            }
            Some(l) if from_source(l) => {
                // deleted and created again at the source: the old one's id goes
                if ids.contains(&c.id) {
                    p.conflict(&c.username, ID_TAKEN);
                    continue;
                }
                ids.remove(&l.id);
                ids.insert(c.id);
                p.update.push(fresh());
            }
            Some(_) => p.conflict(&c.username, NAME_TAKEN),
            None => {
                if ids.contains(&c.id) {
                    p.conflict(&c.username, ID_TAKEN);
                } else if count >= MAX_USERS {
                    p.conflict(&c.username, FULL);
                } else {
                    ids.insert(c.id);
                    count += 1;
                    p.create.push(fresh());
                }
            }
        }
    }
    p.created = p.create.len();
    p.updated = p.update.len();
    p.deleted = p.delete.len();
    p
}

/// Applies `plan` to `users` (what [`plan`] returned for them), remembering the ids of the
/// users it deletes or replaces in `deleted`.
pub(crate) fn apply(users: &mut Users, deleted: &mut Deleted, plan: CarryPlan) {
    for name in plan.delete {
        if let Some(gone) = users.remove(&name) {
            deleted.add(gone.id);
        }
    }
    for mut u in plan.create.into_iter().chain(plan.update) {
        // (access keys made here for a carried user stay: the list cannot carry them)
        if let Some(old) = users.get(&u.username).filter(|old| old.id == u.id) {
            u.access_keys = old.access_keys.clone();
        }
        if let Some(old) = users.insert(u.username.clone(), Arc::new(u))
            && users.get(&old.username).is_some_and(|new| new.id != old.id)
        {
            deleted.add(old.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::Action;

    fn hash() -> String {
        crate::authn::hash_password("a password")
    }

    fn carried(name: &str, id: u64, hash: &str, at: i64) -> CarriedUser {
        CarriedUser {
            username: name.into(),
            id,
            password_hash: hash.into(),
            grants: vec![Grant {
                action: Action::Consume,
                patterns: vec!["orders".into()],
            }],
            created_at_ms: 1,
            updated_at_ms: at,
            origin: None,
        }
    }

    fn local(name: &str, id: u64, from: Option<&str>) -> (String, Arc<UserRecord>) {
        (
            name.into(),
            Arc::new(UserRecord {
                username: name.into(),
                id,
                password_hash: "local".into(),
                root: name == ROOT_USER,
                grants: vec![],
                created_at_ms: 1,
                updated_at_ms: 5,
                carried_from: from.map(str::to_owned),
                origin: from.map(str::to_owned),
                access_keys: Vec::new(),
            }),
        )
    }

    #[test]
    fn only_this_brokers_own_kind_of_hash_is_taken() {
        let h = hash();
        assert!(check_hash(&h).is_ok(), "{h}");
        // dearer parameters, another algorithm, garbage
        let dear = h.replace("m=19456", "m=4194304");
        assert!(check_hash(&dear).is_err(), "{dear}");
        let argon2i = h.replace("$argon2id$", "$argon2i$");
        assert!(check_hash(&argon2i).is_err());
        assert!(check_hash("hash-of-alice").is_err());
        // a salt argon2 refuses (under 8 bytes), a key id, associated data
        let short_salt =
            "$argon2id$v=19$m=19456,t=2,p=1$AAAAAAA$bnmkTuB9RskNq4uVZ3ykJgPZfbhK9l2d6URfYAUY/nE";
        assert!(check_hash(short_salt).is_err());
        let (head, tail) = h.split_once(",p=1$").unwrap();
        for extra in [",keyid=AAAAAAAA", ",data=AAAAAAAA"] {
            let with = format!("{head},p=1{extra}${tail}");
            assert!(check_hash(&with).is_err(), "{with}");
        }
        assert!(check_hash(&"$".repeat(300)).is_err());
    }

    #[test]
    fn a_list_is_checked_whole() {
        let h = hash();
        assert!(check_list(&[carried("alice", 1, &h, 2)]).is_ok());
        for bad in [
            vec![carried(ROOT_USER, 1, &h, 2)],
            vec![carried("alice", 0, &h, 2)],
            vec![carried("no spaces", 1, &h, 2)],
            vec![carried("alice", 1, "plain", 2)],
            vec![carried("alice", 1, &h, 2), carried("alice", 2, &h, 2)],
            vec![carried("alice", 1, &h, 2), carried("bob", 1, &h, 2)],
        ] {
            assert!(check_list(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_plan_creates_updates_deletes_and_leaves_others_alone() {
        let users: Users = [
            local(ROOT_USER, 100, None),
            local("link", 101, None),
            local("ours", 102, None),
            local("kept", 7, Some("a")),
            local("stale", 8, Some("a")),
            local("gone", 9, Some("a")),
            local("from-c", 10, Some("c")),
            local("renewed", 11, Some("a")),
        ]
        .into_iter()
        .collect();
        let list = vec![
            carried("new", 1, "h-new", 2),
            carried("ours", 2, "h", 9), // one of ours by name: left alone
            carried("link", 3, "h", 9), // the caller: left alone
            carried("kept", 7, "local", 9), // same hash and grants... but grants differ
            carried("stale", 8, "h2", 4), // older than here: unchanged
            carried("from-c", 12, "h", 9), // another source's: left alone
            carried("renewed", 13, "h", 9), // recreated at the source: replaced
            carried("taken", 102, "h", 9), // an id another user holds
        ];
        let p = plan(&users, &Deleted::default(), None, "a", &list, "link", false);
        let names = |v: &[UserRecord]| v.iter().map(|u| u.username.clone()).collect::<Vec<_>>();
        assert_eq!(names(&p.create), ["new"]);
        assert_eq!(names(&p.update), ["kept", "renewed"]);
        assert_eq!(p.delete, ["gone"]);
        assert_eq!(p.unchanged, 1);
        let conflicts: Vec<&str> = p.conflicts.iter().map(|c| c.username.as_str()).collect();
        assert_eq!(conflicts, ["ours", "link", "from-c", "taken"]);
        assert_eq!(p.create[0].carried_from.as_deref(), Some("a"));
        assert_eq!(p.update[1].id, 13);
        let mut after = users.clone();
        apply(&mut after, &mut Deleted::default(), p);
        assert!(!after.contains_key("gone"));
        assert_eq!(after["kept"].grants.len(), 1);
        assert_eq!(after["ours"].password_hash, "local");
        // the same list again changes nothing
        let again = plan(&after, &Deleted::default(), None, "a", &list, "link", false);
        assert!(!again.changes(), "{again:?}");
        assert_eq!(again.conflict_count, 4);
    }

    /// Two clusters carrying users to each other: a user made on `a` and deleted there while
    /// its copy on `b` had not heard of it yet is not brought back to `a` by `b`'s list, and
    /// `b`'s copy goes with `a`'s next list.
    #[test]
    fn a_user_deleted_where_it_was_made_is_not_brought_back() {
        let a = "00000000000000aa";
        let b = "00000000000000bb";
        let on_a: Users = [local("keep", 2, None)].into_iter().collect();
        // b's copies name a as their origin
        let on_b = {
            let mut users = Users::new();
            let list = vec![carried("gone", 1, "h", 2), carried("keep", 2, "h", 2)];
            let p = plan(
                &users,
                &Deleted::default(),
                Some(b),
                a,
                &list,
                "link",
                false,
            );
            apply(&mut users, &mut Deleted::default(), p);
            users
        };
        assert_eq!(on_b["gone"].origin.as_deref(), Some(a));
        let from_b: Vec<CarriedUser> = on_b.values().map(|u| CarriedUser::of(u)).collect();
        let p = plan(
            &on_a,
            &Deleted::default(),
            Some(a),
            b,
            &from_b,
            "link",
            false,
        );
        assert!(p.create.is_empty(), "{p:?}");
        assert_eq!(p.conflicts[0].username, "gone");
        // (a user of a's own coming back under a new id is not taken either)
        let mut renewed = from_b.clone();
        renewed[1].id = 9;
        let p = plan(
            &on_a,
            &Deleted::default(),
            Some(a),
            b,
            &renewed,
            "link",
            false,
        );
        assert!(!p.changes(), "{p:?}");
        // and a's next list removes b's copy
        let from_a: Vec<CarriedUser> = on_a.values().map(|u| CarriedUser::of(u)).collect();
        let p = plan(
            &on_b,
            &Deleted::default(),
            Some(b),
            a,
            &from_a,
            "link",
            false,
        );
        assert_eq!(p.delete, ["gone"]);
    }

    /// Three clusters carrying users in a ring: a user made on `b` and deleted there is
    /// deleted on `a` by `b`'s next list, and `c`, which had not heard of the delete, does
    /// not bring it back to `a` (nor would any other cluster, or a hand delete on `a`).
    #[test]
    fn a_deleted_user_is_not_brought_back_by_a_stale_list_from_anywhere() {
        let (a, b, c) = ("00000000000000aa", "00000000000000bb", "00000000000000cc");
        let made_on_b = carried("bu", 7, "h", 2);
        let mut on_a = Users::new();
        let mut deleted_a = Deleted::default();
        let p = plan(
            &on_a,
            &deleted_a,
            Some(a),
            b,
            std::slice::from_ref(&made_on_b),
            "link",
            false,
        );
        apply(&mut on_a, &mut deleted_a, p);
        assert!(on_a.contains_key("bu"));
        // b deleted it: its next list has nobody
        let p = plan(&on_a, &deleted_a, Some(a), b, &[], "link", false);
        assert_eq!(p.delete, ["bu"]);
        apply(&mut on_a, &mut deleted_a, p);
        assert!(deleted_a.contains(7));
        // c's stale copy names b as its origin and c as its sender
        let stale = CarriedUser {
            origin: Some(b.into()),
            ..made_on_b
        };
        let p = plan(&on_a, &deleted_a, Some(a), c, &[stale], "link", false);
        assert!(!p.changes(), "{p:?}");
        assert_eq!(p.conflicts[0].reason, DELETED_HERE);
    }

    #[test]
    fn deleted_ids_are_remembered_up_to_a_bound() {
        let mut d = Deleted::default();
        for id in 1..=(crate::record::MAX_DELETED as u64 + 5) {
            d.add(id);
        }
        assert_eq!(d.len(), crate::record::MAX_DELETED);
        assert!(!d.contains(5), "the oldest forgotten first");
        assert!(d.contains(6) && d.contains(crate::record::MAX_DELETED as u64 + 5));
        d.add(0);
        assert!(!d.contains(0), "0 is no user's id");
    }

    #[test]
    fn only_a_root_caller_makes_or_changes_admins() {
        let mut boss = local("boss", 7, Some("a"));
        Arc::make_mut(&mut boss.1).grants = vec![Grant {
            action: Action::Admin,
            patterns: vec![],
        }];
        let users: Users = [local(ROOT_USER, 100, None), boss].into_iter().collect();
        let mut admin = carried("root2", 1, "h", 9);
        admin.grants = vec![Grant {
            action: Action::Admin,
            patterns: vec![],
        }];
        // a new admin, and an admin here demoted by the source
        let list = vec![admin, carried("boss", 7, "h", 9)];
        let p = plan(&users, &Deleted::default(), None, "a", &list, "link", false);
        assert!(!p.changes(), "{p:?}");
        assert_eq!(p.conflict_count, 2);
        // nor deleted
        let p = plan(&users, &Deleted::default(), None, "a", &[], "link", false);
        assert!(!p.changes() && p.conflict_count == 1, "{p:?}");
        let p = plan(
            &users,
            &Deleted::default(),
            None,
            "a",
            &list,
            ROOT_USER,
            true,
        );
        assert_eq!((p.created, p.updated), (1, 1), "{p:?}");
    }

    #[test]
    fn a_full_store_takes_what_fits_after_its_deletes() {
        let mut users: Users = (0..MAX_USERS as u64)
            .map(|i| local(&format!("u{i}"), 1000 + i, (i == 0).then_some("a")))
            .collect();
        let list = vec![carried("x", 1, "h", 2), carried("y", 2, "h", 2)];
        let p = plan(&users, &Deleted::default(), None, "a", &list, "link", false);
        assert_eq!((p.created, p.deleted, p.conflict_count), (1, 1, 1));
        apply(&mut users, &mut Deleted::default(), p);
        assert_eq!(users.len(), MAX_USERS);
    }
}
