//! The root user: made once, when a secured node (or cluster) starts with no users, with
//! the password an operator gave (`NARAD_ADMIN_PASSWORD`, `admin_password_file`) or a
//! generated one shown once.

use narad_core::clock::{Clock as _, SystemClock};

use crate::authn;
use crate::store::{ROOT_USER, UserRecord};

/// The root user's record, with `password` (`NARAD_ADMIN_PASSWORD`) or a generated one,
/// which is returned too so that it can be shown once. Hashing runs on a blocking thread.
pub async fn new_root(password: Option<String>) -> Result<(UserRecord, Option<String>), String> {
    let generated = password.is_none();
    let password = password.unwrap_or_else(authn::random_password);
    let (hash, password) =
        tokio::task::spawn_blocking(move || (authn::hash_password(&password), password))
            .await
            .map_err(|e| e.to_string())?;
    let now = SystemClock.now_ms();
    let root = UserRecord {
        username: ROOT_USER.into(),
        id: authn::new_user_id(),
        password_hash: hash,
        root: true,
        grants: Vec::new(),
        created_at_ms: now,
        updated_at_ms: now,
        carried_from: None,
        origin: None,
        access_keys: Vec::new(),
    };
    Ok((root, generated.then_some(password)))
}

/// Says that the root user was created: a generated password once on stderr (never in the
/// log), else that `NARAD_ADMIN_PASSWORD` was used.
pub fn announce_root(generated: Option<&str>) {
    match generated {
        Some(password) => {
            eprintln!(
                "narad: created the root user '{ROOT_USER}' with password: {password}\nnarad: it is shown only this once; change it with `narad user passwd {ROOT_USER}`"
            );
            tracing::warn!(
                user = ROOT_USER,
                "root user created with a generated password (printed once on stderr)"
            );
        }
        None => tracing::info!(
            user = ROOT_USER,
            "root user created with the password from NARAD_ADMIN_PASSWORD"
        ),
    }
}
