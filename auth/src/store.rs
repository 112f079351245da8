//! User records, kept in `<data_dir>/users.json` and replaced atomically on every change.
//!
//! Changes are [`UserCommand`]s applied by [`UserStore::apply`]. A command holds everything
//! its effect depends on (hashes are computed before, timestamps are in it), so replicas that
//! apply the same commands in the same order end with the same users.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::grant::Grant;
pub use crate::record::{
    AccessKey, Deleted, MAX_ACCESS_KEYS, MAX_PASSWORD_BYTES, MAX_PASSWORD_LEN, MAX_USERNAME_LEN,
    MAX_USERS, MIN_PASSWORD_LEN, ROOT_USER, UserRecord, Users, valid_access_key_id,
    validate_password, validate_username,
};

pub const USERS_FILE: &str = "users.json";
const USERS_VERSION: u32 = 1;

// Hashes are not secrets in the way passwords are, but they are kept out of Debug output
// anyway: a stray `{:?}` must not put them in a log.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum UserCommand {
    Create {
        user: UserRecord,
    },
    Delete {
        username: String,
    },
    SetGrants {
        username: String,
        grants: Vec<Grant>,
        at_ms: i64,
    },
    SetPassword {
        username: String,
        password_hash: String,
        at_ms: i64,
    },
    /// Gives `username` the access key `key` (its secret sealed by the node that made it).
    AddAccessKey {
        username: String,
        key: AccessKey,
    },
    /// Takes access key `key_id` from `username`.
    RemoveAccessKey {
        username: String,
        key_id: String,
    },
    /// Every user at once, from the archive's catalog snapshot after a disk loss. Applies
    /// only to an empty store (a node never trades the users it has for archived ones).
    Restore {
        users: Vec<UserRecord>,
    },
    /// Every user of cluster `source` but its root, carried over a remote (see
    /// [`crate::carry`]), sent by this cluster's user `caller` (never changed by it). Checked
    /// with [`crate::carry::check_list`] before it is proposed, and again when applied.
    /// `may_admin`: the caller is the root user, the only one who may make or change admins.
    /// `me`: this cluster's id (a user made here is never brought back by a list).
    Carry {
        me: Option<String>,
        source: String,
        caller: String,
        may_admin: bool,
        users: Vec<crate::carry::CarriedUser>,
    },
}

impl std::fmt::Debug for UserCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Create { user } => write!(f, "Create({})", user.username),
            Self::Delete { username } => write!(f, "Delete({username})"),
            Self::SetGrants { username, .. } => write!(f, "SetGrants({username})"),
            Self::SetPassword { username, .. } => write!(f, "SetPassword({username})"),
            Self::AddAccessKey { username, key } => {
                write!(f, "AddAccessKey({username}, {})", key.id)
            }
            Self::RemoveAccessKey { username, key_id } => {
                write!(f, "RemoveAccessKey({username}, {key_id})")
            }
            Self::Restore { users } => write!(f, "Restore({} users)", users.len()),
            Self::Carry { source, users, .. } => {
                write!(f, "Carry({} users from {source})", users.len())
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The command does not apply (nothing changed).
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("user file {path} is unreadable: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersFile {
    version: u32,
    users: Vec<UserRecord>,
    /// Ids of users deleted here, oldest first (see [`Deleted`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    deleted: Vec<u64>,
}

/// Why a [`UserCommand`] does not apply (the part of [`StoreError`] about the command, not
/// the disk): serialisable, so a replicated log's answer can carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    #[error("user '{0}' already exists")]
    Exists(String),
    #[error("user '{0}' not found")]
    NotFound(String),
    #[error("the root user cannot be deleted and its grants cannot change")]
    Root,
    #[error("at most {MAX_USERS} users")]
    Full,
    #[error("users can only be restored into an empty user store")]
    NotEmpty,
    #[error("restored users are invalid: {0}")]
    InvalidRestore(String),
    #[error("carried users are invalid: {0}")]
    InvalidCarry(String),
    #[error(
        "user '{0}' already has {MAX_ACCESS_KEYS} access keys, the most a user may hold; remove one first"
    )]
    TooManyAccessKeys(String),
    #[error("access key '{0}' not found")]
    AccessKeyNotFound(String),
    #[error("access key '{0}' is invalid or already exists")]
    AccessKeyInvalid(String),
}

pub struct UserStore {
    /// `None`: a replica of users kept elsewhere (a cluster's metastore), replaced whole by
    /// [`UserStore::replace_all`]; changes go through the cluster, not [`UserStore::apply`].
    path: Option<PathBuf>,
    users: RwLock<Arc<BTreeMap<String, Arc<UserRecord>>>>,
    deleted: RwLock<Arc<Deleted>>,
    /// Serialises changes: apply, persist, publish.
    write: Mutex<()>,
    /// Bumped after every change is published: requests in flight (a parked long-poll)
    /// check their caller's grants again ([`UserStore::subscribe`]).
    changed: tokio::sync::watch::Sender<u64>,
}

impl UserStore {
    /// Loads `<data_dir>/users.json` (no file: no users yet).
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let path = data_dir.join(USERS_FILE);
        let (users, deleted) = match std::fs::read(&path) {
            Ok(bytes) => {
                let f: UsersFile =
                    serde_json::from_slice(&bytes).map_err(|e| StoreError::Invalid {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                if f.version != USERS_VERSION {
                    return Err(StoreError::Invalid {
                        path,
                        reason: format!("unsupported version {}", f.version),
                    });
                }
                let users = f
                    .users
                    .into_iter()
                    .map(|u| (u.username.clone(), Arc::new(u)))
                    .collect();
                (users, Deleted::from_ids(f.deleted))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (BTreeMap::new(), Deleted::default())
            }
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        Ok(Self {
            path: Some(path),
            users: RwLock::new(Arc::new(users)),
            deleted: RwLock::new(Arc::new(deleted)),
            write: Mutex::new(()),
            changed: tokio::sync::watch::Sender::new(0),
        })
    }

    /// A store that mirrors users held elsewhere (a cluster member's metastore).
    pub fn replica() -> Self {
        Self {
            path: None,
            users: RwLock::new(Arc::new(BTreeMap::new())),
            deleted: RwLock::new(Arc::default()),
            write: Mutex::new(()),
            changed: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Whether this store mirrors users held elsewhere.
    pub fn is_replica(&self) -> bool {
        self.path.is_none()
    }

    /// Replaces every user and the deleted ones' ids (a replica following its metastore).
    pub fn replace_all(&self, users: Arc<Users>, deleted: Arc<Deleted>) {
        let _w = self.write.lock();
        let same = Arc::ptr_eq(&self.users.read(), &users);
        *self.users.write() = users;
        *self.deleted.write() = deleted;
        if !same {
            self.changed.send_modify(|v| *v += 1);
        }
    }

    /// Woken after every change of the users (a password, grants, a user deleted): what a
    /// request in flight watches to check its caller again.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub fn get(&self, username: &str) -> Option<Arc<UserRecord>> {
        self.users.read().get(username).cloned()
    }

    /// Every user, by name, as they are now.
    pub fn snapshot(&self) -> Arc<Users> {
        self.users.read().clone()
    }

    /// The ids of the users deleted here (the most recent [`crate::record::MAX_DELETED`]).
    pub fn deleted(&self) -> Arc<Deleted> {
        self.deleted.read().clone()
    }

    pub fn list(&self) -> Vec<Arc<UserRecord>> {
        self.users.read().values().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.users.read().is_empty()
    }

    /// Applies `cmd` and persists the result before anyone can read it.
    pub fn apply(&self, cmd: UserCommand) -> Result<(), StoreError> {
        let Some(path) = &self.path else {
            return Err(StoreError::Invalid {
                path: PathBuf::from("<replica>"),
                reason: "a replica's users change through its cluster".into(),
            });
        };
        let _w = self.write.lock();
        let mut next = BTreeMap::clone(&self.users.read());
        let mut deleted = Deleted::clone(&self.deleted.read());
        apply_command(&mut next, &mut deleted, cmd)?;
        let body = serde_json::to_vec_pretty(&UsersFile {
            version: USERS_VERSION,
            users: next.values().map(|u| UserRecord::clone(u)).collect(),
            deleted: deleted.ids().collect(),
        })
        .expect("users serialise");
        // password hashes: readable by the broker's user only
        narad_core::fsutil::write_file_atomic(path, &body).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
        *self.users.write() = Arc::new(next);
        *self.deleted.write() = Arc::new(deleted);
        self.changed.send_modify(|v| *v += 1);
        Ok(())
    }
}

/// The state machine: pure, deterministic (a replicated log applies it on every replica).
/// Nothing changes when it refuses. `deleted` remembers the ids of the users deleted.
pub fn apply_command(
    users: &mut Users,
    deleted: &mut Deleted,
    cmd: UserCommand,
) -> Result<(), Refusal> {
    match cmd {
        UserCommand::Create { user } => {
            if users.contains_key(&user.username) {
                return Err(Refusal::Exists(user.username));
            }
            if users.len() >= MAX_USERS {
                return Err(Refusal::Full);
            }
            users.insert(user.username.clone(), Arc::new(user));
        }
        UserCommand::Delete { username } => match users.get(&username) {
            None => return Err(Refusal::NotFound(username)),
            Some(u) if u.root => return Err(Refusal::Root),
            Some(u) => {
                deleted.add(u.id);
                users.remove(&username);
            }
        },
        UserCommand::SetGrants {
            username,
            grants,
            at_ms,
        } => {
            let u = users
                .get_mut(&username)
                .ok_or_else(|| Refusal::NotFound(username.clone()))?;
            if u.root {
                return Err(Refusal::Root);
            }
            let u = Arc::make_mut(u);
            u.grants = grants;
            u.updated_at_ms = at_ms;
        }
        UserCommand::SetPassword {
            username,
            password_hash,
            at_ms,
        } => {
            let u = users
                .get_mut(&username)
                .ok_or_else(|| Refusal::NotFound(username.clone()))?;
            let u = Arc::make_mut(u);
            u.password_hash = password_hash;
            u.updated_at_ms = at_ms;
        }
        UserCommand::AddAccessKey { username, key } => {
            let taken = users
                .values()
                .any(|u| u.access_keys.iter().any(|k| k.id == key.id));
            if taken || !valid_access_key_id(&key.id) {
                return Err(Refusal::AccessKeyInvalid(key.id));
            }
            let u = users
                .get_mut(&username)
                .ok_or_else(|| Refusal::NotFound(username.clone()))?;
            if u.access_keys.len() >= MAX_ACCESS_KEYS {
                return Err(Refusal::TooManyAccessKeys(username));
            }
            Arc::make_mut(u).access_keys.push(key);
        }
        UserCommand::RemoveAccessKey { username, key_id } => {
            let u = users
                .get_mut(&username)
                .ok_or_else(|| Refusal::NotFound(username.clone()))?;
            if !u.access_keys.iter().any(|k| k.id == key_id) {
                return Err(Refusal::AccessKeyNotFound(key_id));
            }
            Arc::make_mut(u).access_keys.retain(|k| k.id != key_id);
        }
        UserCommand::Restore { users: restored } => {
            if !users.is_empty() {
                return Err(Refusal::NotEmpty);
            }
            let checked = check_restored(restored)?;
            *users = checked;
        }
        UserCommand::Carry {
            me,
            source,
            caller,
            may_admin,
            users: carried,
        } => {
            crate::carry::check_list(&carried).map_err(Refusal::InvalidCarry)?;
            let plan = crate::carry::plan(
                users,
                deleted,
                me.as_deref(),
                &source,
                &carried,
                &caller,
                may_admin,
            );
            crate::carry::apply(users, deleted, plan);
        }
    }
    Ok(())
}

/// The checks every user passed when it was created, made again on records that come from
/// outside (an archive): names, grants, one root named [`ROOT_USER`], the user bound.
fn check_restored(restored: Vec<UserRecord>) -> Result<Users, Refusal> {
    let bad = |m: String| Err(Refusal::InvalidRestore(m));
    if restored.len() > MAX_USERS {
        return Err(Refusal::Full);
    }
    let mut out = BTreeMap::new();
    for u in restored {
        validate_username(&u.username).map_err(Refusal::InvalidRestore)?;
        crate::grant::validate_grants(&u.grants)
            .map_err(|e| Refusal::InvalidRestore(format!("user '{}': {e}", u.username)))?;
        if u.root != (u.username == ROOT_USER) {
            return bad(format!(
                "only '{ROOT_USER}' may be (and must be) the root user; '{}' is not",
                u.username
            ));
        }
        if out.contains_key(&u.username) {
            return bad(format!("user '{}' is listed twice", u.username));
        }
        if u.access_keys.len() > MAX_ACCESS_KEYS
            || u.access_keys.iter().any(|k| !valid_access_key_id(&k.id))
        {
            return bad(format!("user '{}': invalid access keys", u.username));
        }
        out.insert(u.username.clone(), Arc::new(u));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::Action;

    fn user(name: &str, root: bool) -> UserRecord {
        UserRecord {
            username: name.into(),
            id: 1,
            password_hash: format!("hash-of-{name}"),
            root,
            grants: vec![],
            created_at_ms: 1,
            updated_at_ms: 1,
            carried_from: None,
            origin: None,
            access_keys: Vec::new(),
        }
    }

    #[test]
    fn changes_persist_and_root_is_protected() {
        let dir = tempfile::tempdir().unwrap();
        let s = UserStore::open(dir.path()).unwrap();
        assert!(s.is_empty());
        s.apply(UserCommand::Create {
            user: user(ROOT_USER, true),
        })
        .unwrap();
        s.apply(UserCommand::Create {
            user: user("alice", false),
        })
        .unwrap();
        assert!(matches!(
            s.apply(UserCommand::Create {
                user: user("alice", false)
            }),
            Err(StoreError::Refused(Refusal::Exists(_)))
        ));
        assert!(matches!(
            s.apply(UserCommand::Delete {
                username: ROOT_USER.into()
            }),
            Err(StoreError::Refused(Refusal::Root))
        ));
        assert!(matches!(
            s.apply(UserCommand::SetGrants {
                username: ROOT_USER.into(),
                grants: vec![],
                at_ms: 2
            }),
            Err(StoreError::Refused(Refusal::Root))
        ));
        s.apply(UserCommand::SetGrants {
            username: "alice".into(),
            grants: vec![Grant {
                action: Action::Produce,
                patterns: vec!["o-*".into()],
            }],
            at_ms: 5,
        })
        .unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(USERS_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "hashes readable by the owner only");
        }
        let again = UserStore::open(dir.path()).unwrap();
        let a = again.get("alice").unwrap();
        assert_eq!(a.grants.len(), 1);
        assert_eq!(a.updated_at_ms, 5);
        assert!(again.get(ROOT_USER).unwrap().root);
        again
            .apply(UserCommand::Delete {
                username: "alice".into(),
            })
            .unwrap();
        let reopened = UserStore::open(dir.path()).unwrap();
        assert!(reopened.get("alice").is_none());
        assert!(
            reopened.deleted().contains(1),
            "a deleted user's id is remembered across a restart"
        );
    }

    #[test]
    fn restore_fills_an_empty_store_only_and_checks_what_it_gets() {
        let dir = tempfile::tempdir().unwrap();
        let s = UserStore::open(dir.path()).unwrap();
        let bad = |users: Vec<UserRecord>| {
            let e = s.apply(UserCommand::Restore { users }).unwrap_err();
            assert!(
                matches!(e, StoreError::Refused(Refusal::InvalidRestore(_))),
                "{e}"
            );
        };
        bad(vec![user("alice", true)]);
        bad(vec![user(ROOT_USER, false)]);
        bad(vec![user("alice", false), user("alice", false)]);
        bad(vec![user("no spaces", false)]);
        let mut g = user("bob", false);
        g.grants = vec![Grant {
            action: Action::Produce,
            patterns: vec![],
        }];
        bad(vec![g]);
        assert!(s.is_empty(), "a refused restore leaves nothing behind");
        s.apply(UserCommand::Restore {
            users: vec![user(ROOT_USER, true), user("alice", false)],
        })
        .unwrap();
        // durable before it is visible: a reopened store has them
        let again = UserStore::open(dir.path()).unwrap();
        assert_eq!(again.list().len(), 2);
        assert!(again.get(ROOT_USER).unwrap().root);
        assert!(matches!(
            s.apply(UserCommand::Restore { users: vec![] }),
            Err(StoreError::Refused(Refusal::NotEmpty))
        ));
    }

    #[test]
    fn names_and_passwords_are_bounded() {
        assert!(validate_username("a.b_c-1").is_ok());
        assert!(validate_username("").is_err());
        assert!(validate_username("a b").is_err());
        assert!(validate_username(&"x".repeat(65)).is_err());
        assert!(validate_password("short").is_err());
        assert!(validate_password("long enough").is_ok());
        assert!(validate_password(&"x".repeat(1025)).is_err());
        assert!(
            validate_password("¢c¢R¢c¢R").is_ok(),
            "characters, not bytes"
        );
        assert!(validate_password("¢c¢R¢").is_err());
    }
}
