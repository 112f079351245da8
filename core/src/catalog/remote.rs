//! Remotes: other clusters a topic may be mirrored to, as the catalog keeps them.
//!
//! A remote is a name, an `https://` base URL (canonical form, checked by the address guard
//! before it is proposed), the user this cluster acts as there, an optional CA bundle, and
//! that user's password **sealed** under the cluster secret (`narad-xregion`'s `seal`): the
//! catalog, and so the Raft log, its snapshots and every response, only ever holds the
//! ciphertext. [`apply_put`] and [`apply_delete`] are pure, like the rest of [`super::apply`];
//! they check the shape of what they store (a replica must never hold what no node would
//! have accepted), while the proposer checked the URL and sealed the password.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Applied, Catalog, CatalogError};

/// Most remotes one cluster keeps.
pub const MAX_REMOTES: usize = 64;
/// Longest remote name.
pub const MAX_REMOTE_NAME: usize = 64;
/// Longest base URL.
pub const MAX_URL_BYTES: usize = 2048;
/// Longest user name on the remote.
pub const MAX_USERNAME_BYTES: usize = 256;
/// Largest CA bundle.
pub const MAX_CA_BYTES: usize = 64 << 10;
/// Longest sealed field (base64 of at most 1 KiB of password and its tag).
const MAX_SEALED_FIELD: usize = 2048;

/// A password sealed under the cluster secret (base64 fields; see `narad-xregion`'s `seal`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealedCredential {
    /// Which key sealed it (hex): the current or the previous cluster secret's.
    pub key_id: String,
    pub nonce: String,
    /// The password encrypted, with the GCM tag.
    pub ciphertext: String,
}

/// One remote as the catalog keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteMeta {
    /// Incarnation: a remote deleted and added again under its name gets a new one, and a
    /// credential sealed for one does not open for the other.
    pub id: u64,
    pub name: String,
    /// The canonical base URL (`https://host[:port]/path/`).
    pub url: String,
    pub username: String,
    /// PEM CA bundle the remote's certificate is checked against alone; `None`: the
    /// system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    pub credential: SealedCredential,
    /// Whether this cluster's users (all but its root, with their password hashes and
    /// grants) are carried to the remote, which must let this cluster's user there be an
    /// admin (see `narad_auth::carry`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carry_users: bool,
    /// 1 at creation, one more at every change: a sender rebuilds its client when it moves,
    /// and a change names the version it read (a concurrent change is refused).
    pub version: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// Remote names: like topic names but shorter (`A-Z a-z 0-9 . _ -`, starting with a letter
/// or digit).
pub fn validate_remote_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_REMOTE_NAME {
        return Err(format!("name: must be 1 to {MAX_REMOTE_NAME} characters"));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err("name: must start with a letter or a digit".into());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("name: may contain only A-Z a-z 0-9 . _ -".into());
    }
    Ok(())
}

fn check_shape(r: &RemoteMeta) -> Result<(), CatalogError> {
    let bad = |m: String| Err(CatalogError::InvalidConfig(m));
    validate_remote_name(&r.name).or_else(bad)?;
    if !r.url.starts_with("https://") || r.url.len() > MAX_URL_BYTES {
        return bad(format!(
            "url: must be an https:// URL of at most {MAX_URL_BYTES} bytes"
        ));
    }
    if r.username.is_empty()
        || r.username.len() > MAX_USERNAME_BYTES
        || r.username.contains(':')
        || r.username.chars().any(char::is_control)
    {
        return bad(format!(
            "username: must be 1 to {MAX_USERNAME_BYTES} bytes, without ':' or control characters"
        ));
    }
    if r.ca_pem.as_ref().is_some_and(|c| c.len() > MAX_CA_BYTES) {
        return bad(format!("ca_pem: must be at most {MAX_CA_BYTES} bytes"));
    }
    let c = &r.credential;
    if [&c.key_id, &c.nonce, &c.ciphertext]
        .iter()
        .any(|f| f.is_empty() || f.len() > MAX_SEALED_FIELD)
    {
        return bad("credential: malformed".into());
    }
    Ok(())
}

/// A new remote (`expect_version: None`), or a change of the remote of that name and id
/// which must still be at `expect_version`.
pub(super) fn apply_put(
    next: &mut Catalog,
    remote: &RemoteMeta,
    expect_version: Option<u64>,
) -> Result<Applied, CatalogError> {
    check_shape(remote)?;
    let stored = match expect_version {
        None => {
            if let Some(taken) = next
                .remotes
                .values()
                .find(|r| r.name.eq_ignore_ascii_case(&remote.name))
            {
                return Err(CatalogError::RemoteExists(taken.name.clone()));
            }
            if next.remotes.values().any(|r| r.id == remote.id) {
                return Err(CatalogError::Invalid(format!(
                    "remote id {:016x} is taken",
                    remote.id
                )));
            }
            if next.remotes.len() >= MAX_REMOTES {
                return Err(CatalogError::TooManyRemotes(MAX_REMOTES));
            }
            RemoteMeta {
                version: 1,
                ..remote.clone()
            }
        }
        Some(v) => {
            let old = next
                .remotes
                .get(&remote.name)
                .filter(|r| r.id == remote.id)
                .ok_or_else(|| CatalogError::RemoteNotFound(remote.name.clone()))?;
            if remote.carry_users
                && let Some(c) = next
                    .remote_children
                    .values()
                    .find(|c| c.remote_id == remote.id)
            {
                return Err(CatalogError::RemoteInUse(format!(
                    "remote '{}' is in use by remote child '{}' of '{}': a remote that carries users acts as an admin there, so it carries nothing else; add another remote (same URL, an admin user) with carry_users",
                    remote.name, c.name, c.parent
                )));
            }
            if old.version != v {
                return Err(CatalogError::RemoteChanged(format!(
                    "remote '{}' changed meanwhile (version {} is now {}): read it again and retry",
                    remote.name, v, old.version
                )));
            }
            RemoteMeta {
                version: v + 1,
                created_at_ms: old.created_at_ms,
                ..remote.clone()
            }
        }
    };
    let stored = Arc::new(stored);
    next.remotes.insert(stored.name.clone(), stored.clone());
    Ok(Applied::Remote(stored))
}

/// Why remote children never ship through a remote that carries users.
fn users_only(remote: &str) -> CatalogError {
    CatalogError::RemoteInUse(format!(
        "remote '{remote}' carries users (as an admin of the other cluster): remote children ship through a remote whose user has only produce and replicate there"
    ))
}

/// Removes the remote of id `remote_id`.
pub(super) fn apply_delete(next: &mut Catalog, remote_id: u64) -> Result<Applied, CatalogError> {
    let gone = next
        .remotes
        .values()
        .find(|r| r.id == remote_id)
        .cloned()
        .ok_or_else(|| CatalogError::RemoteNotFound(format!("#{remote_id:016x}")))?;
    if let Some(c) = next
        .remote_children
        .values()
        .find(|c| c.remote_id == remote_id)
    {
        return Err(CatalogError::RemoteInUse(format!(
            "remote '{}' is in use by remote child '{}' of '{}': detach it first",
            gone.name, c.name, c.parent
        )));
    }
    next.remotes.remove(&gone.name);
    Ok(Applied::RemoteDeleted(gone))
}

/// Most lanes (requests in flight at once) one remote child's cursor uses per parent
/// partition.
pub const MAX_LANES: u8 = 8;

/// A remote child: parent `parent`'s records mirrored to topic `remote_topic` on remote
/// `remote`. Its cursors run where the parent's partitions are served and ship to the
/// remote instead of appending locally.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteChild {
    /// Unique among the parent's children, local and remote.
    pub name: String,
    pub parent: String,
    /// The parent's incarnation: a re-created parent has no remote children.
    pub parent_id: u64,
    pub remote: String,
    pub remote_id: u64,
    pub remote_topic: String,
    /// The target topic's incarnation when the link was made: a target deleted and
    /// re-created stops the link (`target_replaced`).
    pub target_id: u64,
    /// 1..=[`MAX_LANES`].
    pub lanes: u8,
    /// Changes on every attach: cursors of an earlier attachment are never resumed.
    pub epoch: u64,
    /// Where each parent partition's cursor starts, as for a local child's link.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub starts: Vec<u64>,
    /// Paused: its cursors ship nothing until resumed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    pub created_at_ms: i64,
    /// Records an admin skipped (the target refused them): `(parent partition, offset)`,
    /// the newest [`MAX_SKIPS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skips: Vec<(u32, u64)>,
}

/// Most skipped records a remote child remembers (older ones are behind its cursors).
pub const MAX_SKIPS: usize = 256;

pub(super) fn apply_skip_remote(
    next: &mut Catalog,
    name: &str,
    epoch: u64,
    record: (u32, u64),
) -> Result<Applied, CatalogError> {
    let old = remote_child(next, name, epoch)?;
    let mut c = (*old).clone();
    if !c.skips.contains(&record) {
        if c.skips.len() >= MAX_SKIPS {
            c.skips.remove(0);
        }
        c.skips.push(record);
    }
    let c = Arc::new(c);
    next.remote_children.insert(c.name.clone(), c.clone());
    Ok(Applied::RemoteChild(c))
}

pub(super) fn apply_attach_remote(
    next: &mut Catalog,
    child: &RemoteChild,
) -> Result<Applied, CatalogError> {
    let invalid = |m: String| Err(CatalogError::InvalidConfig(m));
    crate::topic::validate_name(&child.name)
        .map_err(|e| CatalogError::InvalidConfig(format!("child: {}", e.reason)))?;
    crate::topic::validate_name(&child.remote_topic)
        .map_err(|e| CatalogError::InvalidConfig(format!("remote_topic: {}", e.reason)))?;
    if !(1..=MAX_LANES).contains(&child.lanes) {
        return invalid(format!("lanes: must be between 1 and {MAX_LANES}"));
    }
    let parent = next
        .get(&child.parent)
        .filter(|p| p.id == child.parent_id)
        .ok_or_else(|| CatalogError::NotFound(child.parent.clone()))?;
    if parent.parent.is_some() {
        return Err(CatalogError::FanoutConflict(format!(
            "'{}' is itself a fan-out child: no grandchildren",
            parent.name
        )));
    }
    let Some(remote) = next
        .remotes
        .get(&child.remote)
        .filter(|r| r.id == child.remote_id)
    else {
        return Err(CatalogError::RemoteNotFound(child.remote.clone()));
    };
    if remote.carry_users {
        return Err(users_only(&remote.name));
    }
    // the other half of the loop rule the checks apply across clusters, here where it is
    // atomic: a topic never ships to the topic it mirrors
    if let super::role::TopicRole::Mirror { of, .. } = parent.role
        && of.topic == child.target_id
    {
        return Err(CatalogError::LoopDetected(format!(
            "'{}' mirrors the topic this child would ship to: links do not loop",
            parent.name
        )));
    }
    let taken = next.remote_children.contains_key(&child.name)
        || next
            .children_of(parent.id)
            .any(|c| c.name.eq_ignore_ascii_case(&child.name));
    if taken {
        return Err(CatalogError::FanoutConflict(format!(
            "a child named '{}' exists already",
            child.name
        )));
    }
    let children = next.children_of(parent.id).count()
        + next
            .remote_children
            .values()
            .filter(|c| c.parent_id == parent.id)
            .count();
    if children >= super::MAX_CHILDREN {
        return Err(CatalogError::FanoutConflict(format!(
            "'{}' already has {} children",
            parent.name,
            super::MAX_CHILDREN
        )));
    }
    let c = Arc::new(child.clone());
    next.remote_children.insert(c.name.clone(), c.clone());
    Ok(Applied::RemoteChild(c))
}

/// The remote child `name` of attachment `epoch`, if it is still that one.
fn remote_child(next: &Catalog, name: &str, epoch: u64) -> Result<Arc<RemoteChild>, CatalogError> {
    next.remote_children
        .get(name)
        .filter(|c| c.epoch == epoch)
        .cloned()
        .ok_or_else(|| CatalogError::NotChild(format!("'{name}' is not a remote child")))
}

pub(super) fn apply_detach_remote(
    next: &mut Catalog,
    name: &str,
    epoch: u64,
) -> Result<Applied, CatalogError> {
    let gone = remote_child(next, name, epoch)?;
    next.remote_children.remove(name);
    Ok(Applied::RemoteChildGone(gone))
}

pub(super) fn apply_pause_remote(
    next: &mut Catalog,
    name: &str,
    epoch: u64,
    paused: bool,
) -> Result<Applied, CatalogError> {
    let old = remote_child(next, name, epoch)?;
    let c = Arc::new(RemoteChild {
        paused,
        ..(*old).clone()
    });
    next.remote_children.insert(c.name.clone(), c.clone());
    Ok(Applied::RemoteChild(c))
}
