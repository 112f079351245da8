//! A user as every cluster member keeps it, and the bounds on its fields: what the store
//! persists and what a carried list ([`crate::carry`]) is made of.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::grant::Grant;

/// The root user's name.
pub const ROOT_USER: &str = "admin";
/// Longest username.
pub const MAX_USERNAME_LEN: usize = 64;
/// Password length bounds, in characters (Unicode code points, as JSON Schema's `minLength`
/// counts). The upper bound keeps hashing cost bounded.
pub const MIN_PASSWORD_LEN: usize = 8;
pub const MAX_PASSWORD_LEN: usize = 1024;
/// Longest password in bytes (1024 characters of up to 4 bytes).
pub const MAX_PASSWORD_BYTES: usize = 4 * MAX_PASSWORD_LEN;
/// Most users a node holds.
pub const MAX_USERS: usize = 10_000;

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserRecord {
    pub username: String,
    /// Random, fixed at creation: a user deleted and created again under the same name is
    /// another user (it does not inherit the old one's topics).
    #[serde(default)]
    pub id: u64,
    /// argon2id PHC string; never leaves the node through the API or the logs.
    pub password_hash: String,
    #[serde(default)]
    pub root: bool,
    #[serde(default)]
    pub grants: Vec<Grant>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The cluster (id, hex) this user was carried from over its remote with `carry_users`
    /// (see [`crate::carry`]); `None`: made here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_from: Option<String>,
    /// The cluster (id, hex) this user was made on, when it was carried here (through any
    /// number of clusters); `None`: made here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// Keys for signed requests (AWS SigV4, the SQS endpoint): at most
    /// [`MAX_ACCESS_KEYS`], each secret sealed under the cluster secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_keys: Vec<AccessKey>,
}

/// Most access keys a user holds at once (two, as AWS allows: one to rotate to).
pub const MAX_ACCESS_KEYS: usize = 2;

/// An access key: its id (public, in every signed request) and its secret, sealed (the
/// secret must be recoverable to check signatures, so it is never hashed, and never kept in
/// clear: not on disk, in the Raft log, the archive or a log line).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessKey {
    pub id: String,
    pub secret: narad_core::catalog::SealedCredential,
    pub created_at_ms: i64,
}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessKey")
            .field("id", &self.id)
            .field("secret", &"<sealed>")
            .finish_non_exhaustive()
    }
}

/// Whether `id` has the form of an access key id this broker makes: `NRD` and 17 of
/// `A-Z2-7` (base32), 20 characters as AWS's.
pub fn valid_access_key_id(id: &str) -> bool {
    id.len() == 20
        && id.starts_with("NRD")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
}

impl std::fmt::Debug for UserRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserRecord")
            .field("username", &self.username)
            .field("password_hash", &"<redacted>")
            .field("root", &self.root)
            .field("grants", &self.grants)
            .field("carried_from", &self.carried_from)
            .field("access_keys", &self.access_keys)
            .finish_non_exhaustive()
    }
}

impl UserRecord {
    pub fn is_admin(&self) -> bool {
        self.root || crate::grant::is_admin(&self.grants)
    }
}

/// Every user, by name: what `store::apply_command` changes.
pub type Users = BTreeMap<String, Arc<UserRecord>>;

pub fn validate_username(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_USERNAME_LEN {
        return Err(format!(
            "username: must be 1 to {MAX_USERNAME_LEN} characters"
        ));
    }
    if !narad_core::topic::is_name_chars(name) {
        return Err("username: may contain only A-Z a-z 0-9 . _ -".into());
    }
    Ok(())
}

pub fn validate_password(pw: &str) -> Result<(), String> {
    let chars = pw.chars().count();
    if !(MIN_PASSWORD_LEN..=MAX_PASSWORD_LEN).contains(&chars) {
        return Err(format!(
            "password: must be {MIN_PASSWORD_LEN} to {MAX_PASSWORD_LEN} characters"
        ));
    }
    Ok(())
}

/// Most ids of deleted users a store remembers (the oldest are forgotten first).
pub const MAX_DELETED: usize = 10_000;

/// The ids of the users deleted here, newest last: a user id is never reused (a user made
/// again under its name gets another), so a copy of a deleted user that comes back from
/// another cluster (one that carried users here before it heard of the delete) is known
/// for what it is and not taken (see [`crate::carry`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deleted {
    order: std::collections::VecDeque<u64>,
    set: std::collections::HashSet<u64>,
}

impl Deleted {
    pub fn from_ids(ids: impl IntoIterator<Item = u64>) -> Self {
        let mut d = Self::default();
        for id in ids {
            d.add(id);
        }
        d
    }

    pub fn contains(&self, id: u64) -> bool {
        self.set.contains(&id)
    }

    /// Remembers `id` (forgetting the oldest beyond [`MAX_DELETED`]).
    pub fn add(&mut self, id: u64) {
        if id == 0 || !self.set.insert(id) {
            return;
        }
        self.order.push_back(id);
        if self.order.len() > MAX_DELETED
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
    }

    /// Oldest first.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.order.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}
