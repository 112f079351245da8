//! Users and grants: `/v1/users...`.
//!
//! No privilege escalation: only the root user grants `admin` or changes an admin's grants or
//! password; nobody changes their own grants or deletes themselves; the root user cannot be
//! deleted and its grants are fixed. Every change is an audit log line (`component=audit`).

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_auth::carry::{self, CarriedUser, MAX_CARRY_BYTES};
use narad_auth::grant::{self, Grant};
use narad_auth::store::{self as users, Refusal, StoreError, UserCommand, UserRecord};
use narad_auth::{Authenticator, authn};
use narad_wire::ErrorCode;
use serde::{Deserialize, Serialize};

use super::access::{Caller, Peer, forbidden};
use super::query::Query;
use super::{
    ApiError, ApiResult, MAX_JSON_BODY, SharedState, json_response, parse_json, read_body,
};

#[derive(Serialize)]
struct UserJson<'a> {
    username: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    root: bool,
    grants: &'a [Grant],
    created_at_ms: i64,
    updated_at_ms: i64,
    /// The cluster this user was carried from (its id), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    carried_from: Option<&'a str>,
}

fn user_json(u: &UserRecord) -> UserJson<'_> {
    UserJson {
        username: &u.username,
        root: u.root,
        grants: &u.grants,
        created_at_ms: u.created_at_ms,
        updated_at_ms: u.updated_at_ms,
        carried_from: u.carried_from.as_deref(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateUser {
    username: String,
    password: String,
    #[serde(default)]
    grants: Vec<Grant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsBody {
    grants: Vec<Grant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PasswordBody {
    new_password: String,
    #[serde(default)]
    current_password: Option<String>,
}

pub(super) fn auth(state: &SharedState) -> Result<&Arc<Authenticator>, ApiError> {
    state.auth.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::SecurityDisabled,
            "security is off on this broker (development mode): there are no users",
        )
    })
}

fn store_error(e: StoreError) -> ApiError {
    let msg = e.to_string();
    match e {
        StoreError::Refused(Refusal::Exists(_)) => ApiError::new(ErrorCode::UserExists, msg),
        StoreError::Refused(Refusal::NotFound(_)) => ApiError::new(ErrorCode::UserNotFound, msg),
        StoreError::Refused(Refusal::Root) => forbidden(msg),
        StoreError::Refused(Refusal::Full) => ApiError::new(ErrorCode::TooManyUsers, msg),
        StoreError::Refused(Refusal::TooManyAccessKeys(_)) => {
            ApiError::new(ErrorCode::TooManyAccessKeys, msg)
        }
        StoreError::Refused(Refusal::AccessKeyNotFound(_)) => {
            ApiError::new(ErrorCode::AccessKeyNotFound, msg)
        }
        // (the last two come only from a restore, never from a request)
        StoreError::Io { .. }
        | StoreError::Invalid { .. }
        | StoreError::Refused(
            Refusal::NotEmpty
            | Refusal::InvalidRestore(_)
            | Refusal::InvalidCarry(_)
            // (a key id made at random colliding with one held: retry)
            | Refusal::AccessKeyInvalid(_),
        ) => {
            tracing::error!(error = %msg, "user store failure");
            ApiError::new(ErrorCode::MetadataFailed, msg)
        }
    }
}

fn invalid(msg: String) -> ApiError {
    ApiError::new(ErrorCode::InvalidField, msg)
}

pub(super) fn now_ms() -> i64 {
    use narad_core::clock::Clock as _;
    narad_core::clock::SystemClock.now_ms()
}

async fn hash(password: String) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || authn::hash_password(&password))
        .await
        .map_err(|e| ApiError::new(ErrorCode::HashFailed, e.to_string()))
}

pub(super) fn audit(caller: &Caller, action: &str, subject: &str) {
    tracing::info!(
        component = "audit",
        actor = caller.username().unwrap_or("-"),
        action,
        subject,
        "user change"
    );
}

/// Only root hands out `admin`.
fn check_grantable(caller: &Caller, grants: &[Grant]) -> Result<(), ApiError> {
    if grant::is_admin(grants) && !caller.is_root() {
        return Err(forbidden(
            "cannot grant permissions you do not hold: only the root user grants admin",
        ));
    }
    Ok(())
}

/// Applies a user change: on a single node on a blocking thread (it fsyncs), on a cluster
/// member through the cluster's metastore (answered once this node has applied it). Either
/// way it completes even if the client goes away.
pub(super) async fn apply(
    state: &super::AppState,
    a: &Authenticator,
    cmd: UserCommand,
) -> Result<(), ApiError> {
    if let Some(c) = state.cluster.clone() {
        let task = tokio::spawn(async move { c.propose_users(cmd).await });
        return match task.await {
            Ok(Ok(verdict)) => verdict.map_err(|r| store_error(r.into())),
            Ok(Err(e)) => Err(propose_error(e)),
            Err(e) => Err(ApiError::new(ErrorCode::MetadataFailed, e.to_string())),
        };
    }
    let store = a.store().clone();
    tokio::task::spawn_blocking(move || store.apply(cmd))
        .await
        .map_err(|e| ApiError::new(ErrorCode::MetadataFailed, e.to_string()))?
        .map_err(store_error)
}

/// A metadata change the cluster could not confirm: retryable, and the message says
/// whether it may still take effect.
fn propose_error(e: narad_cluster::meta::ProposeError) -> ApiError {
    use narad_cluster::meta::ProposeError as P;
    match e {
        P::Unavailable(why) => ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!("no metadata leader could take the change, which was not made: {why}"),
        ),
        P::Unknown(why) => ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!(
                "the change was sent but not confirmed, and may still take effect: {why}; read before retrying"
            ),
        ),
        P::Stopped(why) => ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!("this node's metastore has stopped: {why}"),
        ),
        e @ P::TooLarge(_) => ApiError::new(ErrorCode::BodyTooLarge, e.to_string()),
    }
}

pub(super) fn lookup(a: &Authenticator, name: &str) -> Result<Arc<UserRecord>, ApiError> {
    a.store()
        .get(name)
        .ok_or_else(|| store_error(Refusal::NotFound(name.to_owned()).into()))
}

/// `POST /v1/users`
pub async fn create(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let a = auth(&state)?;
    caller.require_admin()?;
    let body = read_body(body, MAX_JSON_BODY).await?;
    let req: CreateUser = parse_json(&body)?;
    users::validate_username(&req.username).map_err(invalid)?;
    users::validate_password(&req.password).map_err(invalid)?;
    grant::validate_grants(&req.grants).map_err(invalid)?;
    check_grantable(&caller, &req.grants)?;
    if a.store().get(&req.username).is_some() {
        return Err(store_error(Refusal::Exists(req.username).into()));
    }
    let now = now_ms();
    let user = UserRecord {
        username: req.username.clone(),
        id: authn::new_user_id(),
        password_hash: hash(req.password).await?,
        root: false,
        grants: req.grants,
        created_at_ms: now,
        updated_at_ms: now,
        carried_from: None,
        origin: None,
        access_keys: Vec::new(),
    };
    apply(&state, a, UserCommand::Create { user }).await?;
    audit(&caller, "user_create", &req.username);
    let u = lookup(a, &req.username)?;
    Ok(json_response(StatusCode::CREATED, &user_json(&u)))
}

/// `GET /v1/users`
pub async fn list(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let a = auth(&state)?;
    caller.require_admin()?;
    let all = a.store().list();
    let items: Vec<_> = all.iter().map(|u| user_json(u)).collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({"users": items}),
    ))
}

/// `GET /v1/users/{username}`: admins see anyone, users see themselves.
pub async fn get(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let a = auth(&state)?;
    if caller.username() != Some(name.as_str()) {
        caller.require_admin()?;
    }
    let u = lookup(a, &name)?;
    Ok(json_response(StatusCode::OK, &user_json(&u)))
}

/// Who may change `target`'s grants or delete it: an admin, on others only; an admin
/// target only by root.
fn check_manage_user(caller: &Caller, target: &UserRecord, what: &str) -> Result<(), ApiError> {
    caller.require_admin()?;
    if caller.username() == Some(target.username.as_str()) {
        return Err(forbidden(format!("nobody may {what} their own account")));
    }
    if target.root {
        return Err(forbidden(format!("the root user: cannot {what} it")));
    }
    if target.is_admin() && !caller.is_root() {
        return Err(forbidden(format!(
            "'{}' is an admin: only the root user may {what} it",
            target.username
        )));
    }
    Ok(())
}

/// `DELETE /v1/users/{username}`
pub async fn delete(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let a = auth(&state)?;
    caller.require_admin()?;
    let target = lookup(a, &name)?;
    check_manage_user(&caller, &target, "delete")?;
    let broker = state.broker()?.clone();
    apply(
        &state,
        a,
        UserCommand::Delete {
            username: name.clone(),
        },
    )
    .await?;
    // Its topics keep the old user's id, so a later user of the same name never owns them;
    // clearing the owner makes that visible (admin-managed). Best effort: the id is the guard.
    // (In a cluster this is a catalog command through the metastore like any other.)
    match broker.disown(&name, target.id).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(component = "audit", user = %name, topics = n, "topics of a deleted user are now managed by admins only")
        }
        Err(e) => {
            tracing::warn!(user = %name, error = %e, "could not clear the owner of a deleted user's topics; they stay unmanageable by any later user of the name")
        }
    }
    a.forget(&name);
    audit(&caller, "user_delete", &name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `PUT /v1/users/{username}/grants`: replaces all grants.
pub async fn set_grants(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let a = auth(&state)?;
    caller.require_admin()?;
    let body = read_body(body, MAX_JSON_BODY).await?;
    let req: GrantsBody = parse_json(&body)?;
    grant::validate_grants(&req.grants).map_err(invalid)?;
    let target = lookup(a, &name)?;
    check_manage_user(&caller, &target, "change the grants of")?;
    check_grantable(&caller, &req.grants)?;
    apply(
        &state,
        a,
        UserCommand::SetGrants {
            username: name.clone(),
            grants: req.grants,
            at_ms: now_ms(),
        },
    )
    .await?;
    audit(&caller, "user_grants", &name);
    let u = lookup(a, &name)?;
    Ok(json_response(StatusCode::OK, &user_json(&u)))
}

/// `PUT /v1/users/{username}/password`: yourself with `current_password`; others as an admin
/// (an admin's only as root).
pub async fn set_password(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    peer: Peer,
    Path(name): Path<String>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let a = auth(&state)?;
    let body = read_body(body, MAX_JSON_BODY).await?;
    let req: PasswordBody = parse_json(&body)?;
    let own = caller.username() == Some(name.as_str());
    if !own {
        caller.require_admin()?;
    }
    users::validate_password(&req.new_password).map_err(invalid)?;
    let target = lookup(a, &name)?;
    if own {
        let current = req.current_password.as_deref().unwrap_or_default();
        match a.check(&name, current, peer.0).await {
            Ok(_) => {}
            Err(e @ narad_auth::AuthError::Throttled { .. }) => {
                return Err(super::access::auth_error(&e).0);
            }
            Err(_) => {
                return Err(forbidden(
                    "changing your own password needs the correct current_password",
                ));
            }
        }
    } else if target.is_admin() && !caller.is_root() {
        return Err(forbidden(format!(
            "'{name}' is an admin: only the root user may change its password"
        )));
    }
    apply(
        &state,
        a,
        UserCommand::SetPassword {
            username: name.clone(),
            password_hash: hash(req.new_password).await?,
            at_ms: now_ms(),
        },
    )
    .await?;
    a.forget(&name);
    audit(&caller, "user_password", &name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CarriedList {
    /// The sending cluster's id (16 hex digits).
    source_cluster: String,
    users: Vec<CarriedUser>,
}

/// `PUT /v1/carried-users`: every user of another cluster but its root, sent by its remote
/// to this cluster with `carry_users` on (admin; only the root user carries admins). What
/// the list changes is `narad_auth::carry`'s plan, which the answer reports.
pub async fn carried(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    let a = auth(&state)?;
    caller.require_admin()?;
    let body = read_body(body, MAX_CARRY_BYTES).await?;
    let req: CarriedList = parse_json(&body)?;
    let source = &req.source_cluster;
    if !carry::is_cluster_id(source) {
        return Err(invalid(
            "source_cluster: must be a cluster id, 16 lowercase hex digits".into(),
        ));
    }
    let broker = state.broker()?.clone();
    let me = broker.cluster_id().map(|id| format!("{id:016x}"));
    if me.as_deref() == Some(source.as_str()) {
        return Err(invalid(
            "source_cluster: is this cluster: users are not carried to where they live".into(),
        ));
    }
    carry::check_list(&req.users).map_err(invalid)?;
    let caller_name = caller.username().unwrap_or_default().to_owned();
    let may_admin = caller.is_root();
    let before = a.store().snapshot();
    let plan = carry::plan(
        &before,
        &a.store().deleted(),
        me.as_deref(),
        source,
        &req.users,
        &caller_name,
        may_admin,
    );
    if plan.changes() {
        apply(
            &state,
            a,
            UserCommand::Carry {
                me,
                source: source.clone(),
                caller: caller_name,
                may_admin,
                users: req.users,
            },
        )
        .await?;
        for name in plan.update.iter().map(|u| &u.username).chain(&plan.delete) {
            a.forget(name);
        }
        // the topics of a user deleted, or replaced by another of its name, are nobody's
        // now, as after a delete by hand
        let replaced = plan.update.iter().filter_map(|u| {
            let old = before.get(&u.username)?;
            (old.id != u.id).then_some(&u.username)
        });
        for name in plan.delete.iter().chain(replaced) {
            let Some(gone) = before.get(name) else {
                continue;
            };
            if let Err(e) = broker.disown(name, gone.id).await {
                tracing::warn!(user = %name, error = %e, "could not clear the owner of a carried user's topics after its delete");
            }
        }
        tracing::info!(
            component = "audit",
            actor = caller.username().unwrap_or("-"),
            action = "users_carried",
            subject = %source,
            created = plan.created,
            updated = plan.updated,
            deleted = plan.deleted,
            conflicts = plan.conflict_count,
            "user change"
        );
    }
    Ok(json_response(StatusCode::OK, &plan))
}
