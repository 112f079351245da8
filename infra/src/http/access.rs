//! Who is calling, and what they may do.
//!
//! The `authenticate` middleware turns the `Authorization` header into a [`Caller`] for every
//! route but `/healthz` and `/readyz`; handlers ask the caller before they touch anything. With
//! security off every caller is [`Caller::Open`] and every check passes.
//!
//! Checks come before existence: a caller without rights on a name gets 403 whether or not
//! the topic exists, so names do not leak to those who may not use them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use narad_auth::grant::{self, Action};
use narad_auth::{AuthError, UserRecord};
use narad_core::broker::{Broker, BrokerError, TopicMeta};
use narad_wire::ErrorCode;

use super::{ApiError, AppState, SharedState};
use crate::metrics::AuthLabels;

/// The client's address, when known (for throttling failed logins per address). An
/// extractor: read from the connection's `ConnectInfo<PeerAddr>`, not kept in the request's
/// extensions (a fourth entry there makes the map grow on every request).
#[derive(Clone, Copy)]
pub struct Peer(pub Option<std::net::IpAddr>);

impl Peer {
    fn of(extensions: &axum::http::Extensions) -> Self {
        Self(
            extensions
                .get::<axum::extract::ConnectInfo<PeerAddr>>()
                .map(|c| c.0.0.ip()),
        )
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self::of(&parts.extensions))
    }
}

/// The connection's remote address, put in every API request's extensions as
/// `ConnectInfo<PeerAddr>` by the connection task (`crate::conn`).
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub std::net::SocketAddr);

#[derive(Clone)]
pub enum Caller {
    /// Security is off.
    Open,
    User(Arc<UserRecord>),
}

pub fn forbidden(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::Forbidden, message)
}

impl Caller {
    pub fn username(&self) -> Option<&str> {
        match self {
            Self::Open => None,
            Self::User(u) => Some(&u.username),
        }
    }

    /// The owner a topic created by this caller gets: name and id.
    pub fn owner(&self) -> Option<(String, u64)> {
        match self {
            Self::Open => None,
            Self::User(u) => Some((u.username.clone(), u.id)),
        }
    }

    pub fn is_root(&self) -> bool {
        match self {
            Self::Open => true,
            Self::User(u) => u.root,
        }
    }

    pub fn is_admin(&self) -> bool {
        match self {
            Self::Open => true,
            Self::User(u) => u.is_admin(),
        }
    }

    pub fn allows(&self, action: Action, topic: &str) -> bool {
        match self {
            Self::Open => true,
            Self::User(u) => u.is_admin() || grant::allows(&u.grants, action, topic),
        }
    }

    pub fn require(&self, action: Action, topic: &str) -> Result<(), ApiError> {
        if self.allows(action, topic) {
            return Ok(());
        }
        Err(forbidden(format!(
            "user '{}' may not {} on topic '{topic}'",
            self.username().unwrap_or_default(),
            action.as_str()
        )))
    }

    /// Whether the caller may still `action` on `topic` as the users are now, for a request
    /// in flight whose caller changed meanwhile (a parked long-poll): `401` if the user was
    /// deleted (or deleted and made again) or its password changed, `403` if its grants no
    /// longer allow it.
    pub fn still_allowed(
        &self,
        store: &narad_auth::store::UserStore,
        action: Action,
        topic: &str,
    ) -> Result<(), ApiError> {
        let Self::User(u) = self else { return Ok(()) };
        match store.get(&u.username) {
            Some(now) if now.id == u.id && now.password_hash == u.password_hash => {
                if now.is_admin() || grant::allows(&now.grants, action, topic) {
                    Ok(())
                } else {
                    Err(forbidden(format!(
                        "user '{}' may no longer {} on topic '{topic}' (its grants changed while the request waited)",
                        u.username,
                        action.as_str()
                    )))
                }
            }
            _ => Err(ApiError::new(
                ErrorCode::Unauthorized,
                format!(
                    "user '{}' was deleted or its password changed while the request waited",
                    u.username
                ),
            )),
        }
    }

    pub fn require_admin(&self) -> Result<(), ApiError> {
        if self.is_admin() {
            return Ok(());
        }
        Err(forbidden("this needs the admin grant"))
    }

    fn owns(&self, meta: &TopicMeta) -> bool {
        match self {
            Self::Open => false,
            Self::User(u) => {
                // topics from before owner ids match only users from before them (id 0);
                // new users never have id 0
                meta.owner.as_deref() == Some(u.username.as_str())
                    && meta.owner_id.unwrap_or(0) == u.id
            }
        }
    }

    /// Listed and readable: an admin, the owner, or anyone with a grant on the name.
    pub fn may_see(&self, meta: &TopicMeta) -> bool {
        match self {
            Self::Open => true,
            Self::User(u) => {
                u.is_admin() || self.owns(meta) || grant::may_use(&u.grants, &meta.name)
            }
        }
    }

    /// Alter, delete, attach and detach: an admin or the owner.
    pub fn may_manage(&self, meta: &TopicMeta) -> bool {
        self.is_admin() || self.owns(meta)
    }

    /// The topic's metadata, if the caller may read it (403 otherwise, 404 only to those
    /// who could see the name if it existed).
    pub fn see_topic(&self, broker: &Broker, name: &str) -> Result<TopicMeta, ApiError> {
        match broker.topic_meta(name) {
            Ok(m) if self.may_see(&m) => Ok(m),
            Ok(_) => Err(self.no_access(name)),
            Err(e @ BrokerError::TopicNotFound(_)) => match self {
                Self::User(u) if !u.is_admin() && !grant::may_use(&u.grants, name) => {
                    Err(self.no_access(name))
                }
                _ => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// The topic's metadata, if the caller may manage it.
    pub fn manage_topic(&self, broker: &Broker, name: &str) -> Result<TopicMeta, ApiError> {
        match broker.topic_meta(name) {
            Ok(m) if self.may_manage(&m) => Ok(m),
            // those who cannot see it learn nothing, not even that it exists
            Ok(m) if !self.may_see(&m) => Err(self.no_access(name)),
            Ok(_) => Err(forbidden(format!(
                "only the owner of topic '{name}' or an admin may change it"
            ))),
            Err(e @ BrokerError::TopicNotFound(_)) => {
                if self.is_admin() || self.allows(Action::Create, name) {
                    Err(e.into())
                } else {
                    Err(self.no_access(name))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    fn no_access(&self, name: &str) -> ApiError {
        forbidden(format!(
            "user '{}' has no access to topic '{name}'",
            self.username().unwrap_or_default()
        ))
    }
}

/// Routes anyone may call: probes must work without credentials.
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

pub fn auth_error(e: &AuthError) -> (ApiError, &'static str) {
    let msg = e.to_string();
    match e {
        AuthError::Missing => (ApiError::new(ErrorCode::Unauthorized, msg), "missing"),
        AuthError::Malformed(_) => (ApiError::new(ErrorCode::Unauthorized, msg), "malformed"),
        AuthError::BadCredentials => (
            ApiError::new(ErrorCode::Unauthorized, msg),
            "bad_credentials",
        ),
        AuthError::Throttled { retry_after_secs } => {
            let mut err = ApiError::new(ErrorCode::LoginThrottled, msg);
            err.retry_after = Some(u32::try_from(*retry_after_secs).unwrap_or(u32::MAX));
            (err, "throttled")
        }
    }
}

/// Authenticates the request: records the caller in its extensions, or
/// answers the refusal (401 with a challenge, 429 when throttled).
pub async fn authenticate(state: &SharedState, req: &mut Request) -> Result<(), Response> {
    let peer = Peer::of(req.extensions());
    let caller = match &state.auth {
        None => Caller::Open,
        Some(_) if is_public(req.uri().path()) => Caller::Open,
        Some(auth) if !users_loaded(state, auth) => {
            // Before the root user is seeded, restored or mirrored no credentials can be
            // checked: a right password would be refused as wrong (and counted towards a
            // throttle). Every caller is told the same, that the node is not ready, so the
            // answer says nothing of the credentials.
            return Err(ApiError::new(
                ErrorCode::NotReady,
                "the broker is still loading its users; retry shortly",
            )
            .into_response());
        }
        Some(auth) => {
            let header = req
                .headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes);
            match auth.authenticate(header, peer.0).await {
                Ok(user) => Caller::User(user),
                Err(e) => {
                    let (err, reason) = auth_error(&e);
                    state
                        .metrics
                        .auth_refused
                        .get_or_create(&AuthLabels { reason })
                        .inc();
                    let mut resp = err.into_response();
                    if resp.status() == StatusCode::UNAUTHORIZED {
                        resp.headers_mut().insert(
                            header::WWW_AUTHENTICATE,
                            HeaderValue::from_static("Basic realm=\"narad\", charset=\"UTF-8\""),
                        );
                    }
                    return Err(resp);
                }
            }
        }
    };
    req.extensions_mut().insert(caller);
    Ok(())
}

/// Whether the user store holds the root user yet (latched: it is never removed).
pub(super) fn users_loaded(state: &AppState, auth: &narad_auth::Authenticator) -> bool {
    if state.users_loaded.load(Ordering::Acquire) {
        return true;
    }
    let loaded = auth.store().get(narad_auth::store::ROOT_USER).is_some();
    if loaded {
        state.users_loaded.store(true, Ordering::Release);
    }
    loaded
}

/// Counts an answer that refused an authenticated caller (`forbidden`).
pub fn count_refusal(state: &SharedState, resp: &Response) {
    if resp.status() == StatusCode::FORBIDDEN {
        state
            .metrics
            .auth_refused
            .get_or_create(&AuthLabels {
                reason: "forbidden",
            })
            .inc();
    }
}
