//! Remotes, the other clusters topics are mirrored to: `/v1/remotes...` (admin only).
//!
//! The password a request brings is sealed on this node at once (under `cluster_secret`,
//! bound to the remote's name, id, URL, user and CA) and only the ciphertext is proposed to
//! the catalog: it never reaches the metadata log, a snapshot, a response or a log line in
//! clear. Changing the URL, the user or the CA takes the password again, since the sealed
//! one is bound to them. Every change is an audit log line (`component=audit`).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::IntoResponse;
use narad_core::catalog::RemoteMeta;
use narad_core::catalog::remote::{MAX_USERNAME_BYTES, validate_remote_name};
use narad_wire::ErrorCode;
use narad_xregion::guard::{GuardConfig, GuardError, RemoteUrl};
use narad_xregion::seal::{CredentialKeys, SealError};
use serde::{Deserialize, Deserializer, Serialize};

use super::access::Caller;
use super::query::Query;
use super::{
    ApiError, ApiResult, MAX_JSON_BODY, SharedState, json_response, parse_json, read_body,
};

/// Longest one request to a remote may take during checks.
const CHECK_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What remotes need on this node: the keys that seal and open their passwords (`None`
/// with security off or without a `cluster_secret`, and why) and the address guard.
#[derive(Debug, Default)]
pub struct RemotesKit {
    pub keys: Option<Arc<CredentialKeys>>,
    /// Why `keys` is `None`.
    pub unavailable: String,
    pub guard: GuardConfig,
    /// The sender's metrics (registered with the server's).
    pub metrics: Arc<narad_xregion::sender::SenderMetrics>,
    /// Held by an attach from its own checks to its commit: the checks' last step makes the
    /// target the parent's mirror, so two attaches racing for one child name (or the last
    /// free child) would both reach it, and the one refused at the commit would leave its
    /// target read-only for nothing.
    pub attaching: tokio::sync::Mutex<()>,
    /// The last carry of this cluster's users to each remote with `carry_users` (by id).
    pub carries: crate::users_carry::CarryBoard,
}

impl RemotesKit {
    /// The kit a node with `security`, the cluster `secrets` and `guard` gets.
    pub fn new(
        security: bool,
        secrets: Option<&crate::config::ClusterSecrets>,
        guard: GuardConfig,
    ) -> Self {
        let (keys, unavailable) = match (security, secrets) {
            (false, _) => (
                None,
                "remotes need security on (this node runs with --dev): a remote's password is a credential of another cluster".to_owned(),
            ),
            (true, None) => (
                None,
                "remotes need a cluster_secret (at least 32 bytes): their passwords are sealed under it".to_owned(),
            ),
            (true, Some(s)) => match CredentialKeys::derive(&s.current, s.previous.as_deref()) {
                Ok(k) => (Some(Arc::new(k)), String::new()),
                Err(e) => (None, format!("remotes are unavailable: {e}")),
            },
        };
        Self {
            keys,
            unavailable,
            guard,
            metrics: Arc::default(),
            attaching: tokio::sync::Mutex::new(()),
            carries: Default::default(),
        }
    }

    fn keys(&self) -> Result<&CredentialKeys, ApiError> {
        self.keys
            .as_deref()
            .ok_or_else(|| ApiError::new(ErrorCode::RemotesUnavailable, self.unavailable.clone()))
    }
}

#[derive(Serialize)]
struct CredentialJson {
    /// Which cluster secret sealed the password: `current`, `previous` (reseal it with
    /// `POST /v1/cluster/reencrypt-remotes` before dropping `cluster_secret_previous`) or
    /// `unknown` (this node cannot open it).
    sealed_with: &'static str,
    key_id: String,
}

#[derive(Serialize)]
struct RemoteJson<'a> {
    name: &'a str,
    id: String,
    url: &'a str,
    username: &'a str,
    /// SHA-256 of the CA bundle (hex); absent: the system's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_sha256: Option<String>,
    credential: CredentialJson,
    /// Whether this cluster's users are carried to the remote.
    carry_users: bool,
    /// The last carry of the users (absent until one was tried from this node).
    #[serde(skip_serializing_if = "Option::is_none")]
    users_carry: Option<crate::users_carry::CarryStatus>,
    version: u64,
    created_at_ms: i64,
    updated_at_ms: i64,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn remote_json<'a>(r: &'a RemoteMeta, kit: &RemotesKit) -> RemoteJson<'a> {
    let key_id = r.credential.key_id.chars().take(16).collect::<String>();
    let sealed_with = match &kit.keys {
        Some(k) if k.current_id() == r.credential.key_id => "current",
        Some(k) if k.previous_id().is_some_and(|p| p == r.credential.key_id) => "previous",
        _ => "unknown",
    };
    RemoteJson {
        name: &r.name,
        id: format!("{:016x}", r.id),
        url: &r.url,
        username: &r.username,
        ca_sha256: r
            .ca_pem
            .as_deref()
            .map(|c| hex(&narad_xregion::remote::ca_sha256(c))),
        credential: CredentialJson {
            sealed_with,
            key_id,
        },
        carry_users: r.carry_users,
        users_carry: r
            .carry_users
            .then(|| kit.carries.lock().get(&r.id).cloned())
            .flatten(),
        version: r.version,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
    }
}

// (no Debug: it holds a password)
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRemote {
    name: String,
    url: String,
    username: String,
    password: String,
    #[serde(default)]
    ca_pem: Option<String>,
    /// Carry this cluster's users (all but the root) to the remote, where `username` must be
    /// an admin.
    #[serde(default)]
    carry_users: bool,
}

/// `Some(None)` for an explicit `null`, `None` when absent.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchRemote {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    /// A PEM bundle, or `null` for the system's roots.
    #[serde(default, deserialize_with = "present")]
    ca_pem: Option<Option<String>>,
    #[serde(default)]
    carry_users: Option<bool>,
    /// The version the change is based on: refused (409) if the remote moved on.
    #[serde(default)]
    version: Option<u64>,
}

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidField, msg)
}

fn guard_error(e: GuardError) -> ApiError {
    let code = match e {
        GuardError::Invalid(_)
        | GuardError::NotHttps
        | GuardError::Userinfo
        | GuardError::QueryOrFragment
        | GuardError::NoHost => ErrorCode::InvalidField,
        _ => ErrorCode::DestinationRefused,
    };
    ApiError::new(code, format!("url: {e}"))
}

fn seal_error(e: SealError) -> ApiError {
    match e {
        SealError::Password => invalid(format!("password: {e}")),
        SealError::UnknownKey { .. } | SealError::Authentication | SealError::Malformed => {
            ApiError::new(ErrorCode::CredentialUnavailable, e.to_string())
        }
        SealError::WeakSecret => ApiError::new(ErrorCode::RemotesUnavailable, e.to_string()),
    }
}

fn check_username(u: &str) -> Result<(), ApiError> {
    if u.is_empty()
        || u.len() > MAX_USERNAME_BYTES
        || u.contains(':')
        || u.chars().any(char::is_control)
    {
        return Err(invalid(format!(
            "username: must be 1 to {MAX_USERNAME_BYTES} bytes, without ':' or control characters"
        )));
    }
    Ok(())
}

fn check_ca(pem: &str) -> Result<(), ApiError> {
    narad_xregion::client::check_ca(pem).map_err(|e| invalid(format!("ca_pem: {e}")))
}

fn audit(caller: &Caller, action: &str, subject: &str) {
    tracing::info!(
        component = "audit",
        actor = caller.username().unwrap_or("-"),
        action,
        subject,
        "remote change"
    );
}

fn now_ms() -> i64 {
    use narad_core::clock::Clock as _;
    narad_core::clock::SystemClock.now_ms()
}

/// Seals `password` for `remote` (whose credential field is then replaced).
fn sealed(
    keys: &CredentialKeys,
    mut remote: RemoteMeta,
    password: &str,
) -> Result<RemoteMeta, ApiError> {
    remote.credential = keys
        .seal(&narad_xregion::remote::identity(&remote), password)
        .map_err(seal_error)?;
    Ok(remote)
}

/// `POST /v1/remotes`
pub async fn create(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let keys = state.remotes.keys()?;
    let broker = state.broker()?.clone();
    let body = read_body(body, MAX_JSON_BODY).await?;
    let req: CreateRemote = parse_json(&body)?;
    validate_remote_name(&req.name).map_err(invalid)?;
    let url = RemoteUrl::parse(&req.url, &state.remotes.guard).map_err(guard_error)?;
    check_username(&req.username)?;
    if let Some(ca) = &req.ca_pem {
        check_ca(ca)?;
    }
    if let Some(taken) = broker
        .remotes()
        .iter()
        .find(|r| r.name.eq_ignore_ascii_case(&req.name))
    {
        return Err(ApiError::new(
            ErrorCode::RemoteExists,
            format!("remote '{}' already exists", taken.name),
        ));
    }
    let now = now_ms();
    let remote = RemoteMeta {
        id: narad_core::random_u64() | 1,
        name: req.name.clone(),
        url: url.canonical,
        username: req.username,
        ca_pem: req.ca_pem,
        credential: narad_core::catalog::SealedCredential {
            key_id: String::new(),
            nonce: String::new(),
            ciphertext: String::new(),
        },
        carry_users: req.carry_users,
        version: 1,
        created_at_ms: now,
        updated_at_ms: now,
    };
    let remote = sealed(keys, remote, &req.password)?;
    let r = broker.put_remote(remote, None).await?;
    audit(&caller, "remote_create", &r.name);
    Ok(json_response(
        StatusCode::CREATED,
        &remote_json(&r, &state.remotes),
    ))
}

/// `GET /v1/remotes`
pub async fn list(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let all = state.broker()?.remotes();
    let items: Vec<_> = all.iter().map(|r| remote_json(r, &state.remotes)).collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "remotes": items }),
    ))
}

/// `GET /v1/remotes/{name}`
pub async fn get(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let r = state.broker()?.remote(&name)?;
    Ok(json_response(
        StatusCode::OK,
        &remote_json(&r, &state.remotes),
    ))
}

/// `PATCH /v1/remotes/{name}`: a new URL, user, CA or password, or `carry_users` on or off.
pub async fn patch(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
    body: Body,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let keys = state.remotes.keys()?;
    let broker = state.broker()?.clone();
    let body = read_body(body, MAX_JSON_BODY).await?;
    let req: PatchRemote = parse_json(&body)?;
    let old = broker.remote(&name)?;
    if let Some(v) = req.version
        && v != old.version
    {
        return Err(ApiError::new(
            ErrorCode::RemoteChanged,
            format!(
                "remote '{name}' is at version {}, not {v}: read it again and retry",
                old.version
            ),
        ));
    }
    let mut next = RemoteMeta::clone(&old);
    if let Some(u) = &req.url {
        next.url = RemoteUrl::parse(u, &state.remotes.guard)
            .map_err(guard_error)?
            .canonical;
    }
    if let Some(u) = req.username {
        check_username(&u)?;
        next.username = u;
    }
    if let Some(ca) = req.ca_pem {
        if let Some(pem) = &ca {
            check_ca(pem)?;
        }
        next.ca_pem = ca;
    }
    let rebound = next.url != old.url || next.username != old.username || next.ca_pem != old.ca_pem;
    let next = match req.password.as_deref() {
        Some(p) => sealed(keys, next, p)?,
        None if rebound => {
            return Err(invalid(
                "password: changing url, username or ca_pem takes the password again (the stored one is sealed for the old values)",
            ));
        }
        None if req.carry_users.is_none_or(|c| c == old.carry_users) => {
            // nothing changes
            return Ok(json_response(
                StatusCode::OK,
                &remote_json(&old, &state.remotes),
            ));
        }
        // (carry_users is not bound into the sealed password)
        None => next,
    };
    let next = RemoteMeta {
        carry_users: req.carry_users.unwrap_or(old.carry_users),
        updated_at_ms: now_ms(),
        ..next
    };
    let r = broker.put_remote(next, Some(old.version)).await?;
    audit(&caller, "remote_update", &r.name);
    Ok(json_response(
        StatusCode::OK,
        &remote_json(&r, &state.remotes),
    ))
}

/// `DELETE /v1/remotes/{name}`
pub async fn delete(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let broker = state.broker()?.clone();
    let r = broker.remote(&name)?;
    broker.delete_remote(r.id).await?;
    audit(&caller, "remote_delete", &r.name);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/remotes/{name}/test[?topic=T[&parent=P]]`: runs the checks a remote must pass
/// (see `narad_xregion::checks`) from this node, and reports each; with `parent`, every check
/// an attach of local topic P to T runs (the loop rule against P, P's JSON Schema, and
/// whether T would become P's mirror, asked without changing it).
pub async fn test(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    uri: Uri,
) -> ApiResult {
    let q = Query::parse(uri.query(), &["topic", "parent"])?;
    caller.require_admin()?;
    let topic = q.str("topic");
    for (field, name) in [("topic", topic), ("parent", q.str("parent"))] {
        if let Some(t) = name {
            narad_core::topic::validate_name(t).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!("{field}: {}", e.reason),
                )
            })?;
        }
    }
    let parent = match q.str("parent") {
        Some(_) if topic.is_none() => {
            return Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "parent: comes only with topic (the remote's topic it would ship to)",
            ));
        }
        // (a parent that is not here is a fault of the query, as a missing remote is of an
        // attach's body)
        Some(p) => Some(state.broker()?.topic_meta(p).map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidParameter,
                format!("parent: no topic is named '{p}'"),
            )
        })?),
        None => None,
    };
    let mirror = match &parent {
        Some(meta) => super::remote_children::mirror_of(state.broker()?, meta)
            .await?
            .map(|m| narad_xregion::checks::MirrorOf { dry: true, ..m }),
        None => None,
    };
    let keys = state.remotes.keys()?;
    let r = state.broker()?.remote(&name)?;
    let client =
        narad_xregion::remote::client(&r, keys, &state.remotes.guard, CHECK_REQUEST_TIMEOUT)
            .map_err(|e| match e {
                narad_xregion::remote::RemoteError::Credential(e) => seal_error(e),
                narad_xregion::remote::RemoteError::Guard(e) => guard_error(e),
                narad_xregion::remote::RemoteError::Client(e) => invalid(format!("ca_pem: {e}")),
            })?;
    let report = narad_xregion::checks::check(
        &client,
        narad_xregion::checks::Target {
            topic,
            parent_id: parent.as_ref().map(|m| m.id),
            schema: parent.as_ref().map(|m| m.schemas.last().map(|v| &v.schema)),
            mirror,
            carries_users: r.carry_users,
        },
    )
    .await;
    Ok(json_response(StatusCode::OK, &report))
}

/// `POST /v1/cluster/reencrypt-remotes`: seals every remote's password under the current
/// `cluster_secret` (those sealed under `cluster_secret_previous` during a rotation), so the
/// previous secret can be dropped.
pub async fn reencrypt(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    uri: Uri,
) -> ApiResult {
    Query::parse(uri.query(), &[])?;
    caller.require_admin()?;
    let keys = state.remotes.keys()?;
    let broker = state.broker()?.clone();
    let (mut resealed, mut current) = (Vec::new(), Vec::new());
    let mut failed = Vec::new();
    for r in broker.remotes() {
        match keys.reseal(&narad_xregion::remote::identity(&r), &r.credential) {
            Ok(None) => current.push(r.name.clone()),
            Ok(Some(credential)) => {
                let next = RemoteMeta {
                    credential,
                    updated_at_ms: now_ms(),
                    ..RemoteMeta::clone(&r)
                };
                match broker.put_remote(next, Some(r.version)).await {
                    Ok(_) => resealed.push(r.name.clone()),
                    Err(e) => {
                        failed.push(serde_json::json!({"name": r.name, "error": e.to_string()}))
                    }
                }
            }
            Err(e) => failed.push(serde_json::json!({"name": r.name, "error": e.to_string()})),
        }
    }
    if !resealed.is_empty() {
        audit(&caller, "remotes_reencrypt", &resealed.join(","));
    }
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({"resealed": resealed, "current": current, "failed": failed}),
    ))
}
