//! Access keys: `/v1/users/{username}/access-keys...`, the credentials of signed requests
//! (AWS SigV4: the SQS endpoint).
//!
//! A key is an id (public: every signed request names it) and a secret, shown once when the
//! key is made. The secret is needed again to check each signature, so it cannot be hashed:
//! it is sealed under the cluster secret (AES-256-GCM, as remotes' passwords are) and kept
//! only so, bound to its key id and its user; a node without `cluster_secret` makes none.
//! A user manages their own keys; an admin manages others' (an admin's only as root).

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_auth::store::{AccessKey, MAX_ACCESS_KEYS, UserCommand, UserRecord};
use narad_wire::ErrorCode;
use narad_xregion::seal::{CredentialKeys, RemoteIdentity};
use serde::Serialize;

use super::access::{Caller, forbidden};
use super::query::Query;
use super::users::{apply, audit, auth, lookup, now_ms};
use super::{ApiError, ApiResult, SharedState, json_response};

/// What a key's sealed secret is bound to: opening it for another key id or user fails, and
/// no remote's credential opens as a key (no remote is named so).
pub fn identity<'a>(key_id: &'a str, user: &'a UserRecord) -> RemoteIdentity<'a> {
    RemoteIdentity {
        name: "narad access key",
        id: user.id,
        url: key_id,
        username: &user.username,
        ca_sha256: None,
    }
}

/// The keys that seal and open access keys' secrets.
pub fn keys(state: &SharedState) -> Result<&CredentialKeys, ApiError> {
    state.remotes.keys.as_deref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::CredentialUnavailable,
            format!(
                "access keys are sealed under the cluster secret, and this node has none it can use ({}): set cluster_secret (32 bytes or more)",
                state.remotes.unavailable
            ),
        )
    })
}

/// The user whose keys a request names, once the caller is found to manage them (no query
/// parameters taken).
fn keys_target<'s>(
    state: &'s SharedState,
    caller: &Caller,
    name: &str,
    uri: &Uri,
) -> Result<
    (
        &'s std::sync::Arc<narad_auth::Authenticator>,
        std::sync::Arc<UserRecord>,
    ),
    ApiError,
> {
    Query::parse(uri.query(), &[])?;
    let a = auth(state)?;
    let target = lookup(a, name)?;
    check_keys_of(caller, &target)?;
    Ok((a, target))
}

/// Who may make, list or remove `target`'s keys: the user, or an admin (an admin's or
/// root's keys only root).
fn check_keys_of(caller: &Caller, target: &UserRecord) -> Result<(), ApiError> {
    if caller.username() == Some(target.username.as_str()) {
        return Ok(());
    }
    caller.require_admin()?;
    if target.is_admin() && !caller.is_root() {
        return Err(forbidden(format!(
            "'{}' is an admin: only the root user manages its access keys",
            target.username
        )));
    }
    Ok(())
}

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// A new key id: `NRD` and 17 base32 characters (85 random bits).
fn new_key_id() -> String {
    let (a, b) = (narad_core::random_u64(), narad_core::random_u64());
    let bits = (u128::from(a) << 64) | u128::from(b);
    let mut id = String::from("NRD");
    for i in 0..17 {
        id.push(BASE32[((bits >> (i * 5)) & 31) as usize] as char);
    }
    id
}

/// A new secret: 30 random bytes from the operating system, 40 characters of base64.
fn new_secret() -> String {
    narad_auth::authn::random_key_secret()
}

#[derive(Serialize)]
struct NewKeyJson {
    access_key_id: String,
    /// Shown here only: it cannot be read back.
    secret_access_key: String,
    created_at_ms: i64,
}

#[derive(Serialize)]
struct KeyJson<'a> {
    access_key_id: &'a str,
    created_at_ms: i64,
}

/// `POST /v1/users/{username}/access-keys`: a new key; its secret is in this answer only.
pub async fn create(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult {
    let (a, target) = keys_target(&state, &caller, &name, &uri)?;
    if target.access_keys.len() >= MAX_ACCESS_KEYS {
        return Err(ApiError::new(
            ErrorCode::TooManyAccessKeys,
            format!(
                "user '{name}' already has {MAX_ACCESS_KEYS} access keys, the most a user may hold; remove one first"
            ),
        ));
    }
    let keys = keys(&state)?;
    let id = new_key_id();
    let secret = new_secret();
    let sealed = keys
        .seal(&identity(&id, &target), &secret)
        .map_err(|e| ApiError::new(ErrorCode::CredentialUnavailable, e.to_string()))?;
    let at = now_ms();
    apply(
        &state,
        a,
        UserCommand::AddAccessKey {
            username: name.clone(),
            key: AccessKey {
                id: id.clone(),
                secret: sealed,
                created_at_ms: at,
            },
        },
    )
    .await?;
    audit(&caller, "access_key_add", &format!("{name}/{id}"));
    Ok(json_response(
        StatusCode::CREATED,
        &NewKeyJson {
            access_key_id: id,
            secret_access_key: secret,
            created_at_ms: at,
        },
    ))
}

/// `GET /v1/users/{username}/access-keys`: the ids (never the secrets).
pub async fn list(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult {
    let (_, target) = keys_target(&state, &caller, &name, &uri)?;
    let items: Vec<KeyJson<'_>> = target
        .access_keys
        .iter()
        .map(|k| KeyJson {
            access_key_id: &k.id,
            created_at_ms: k.created_at_ms,
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "access_keys": items }),
    ))
}

/// `DELETE /v1/users/{username}/access-keys/{key_id}`: signatures made with it stop
/// passing at once.
pub async fn delete(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path((name, key_id)): Path<(String, String)>,
    uri: Uri,
) -> ApiResult {
    let (a, _) = keys_target(&state, &caller, &name, &uri)?;
    apply(
        &state,
        a,
        UserCommand::RemoveAccessKey {
            username: name.clone(),
            key_id: key_id.clone(),
        },
    )
    .await?;
    audit(&caller, "access_key_remove", &format!("{name}/{key_id}"));
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_have_the_form_the_store_takes_and_secrets_are_forty_characters() {
        let a = new_key_id();
        assert!(narad_auth::store::valid_access_key_id(&a), "{a}");
        assert_ne!(a, new_key_id());
        let s = new_secret();
        assert_eq!(s.len(), 40);
        assert_ne!(s, new_secret());
    }
}
