//! Who sent an SQS request: its SigV4 signature checked against the secret of the access
//! key it names ([`crate::http::access_keys`]).
//!
//! What needs no body is checked before the body is read (the header's form, the scope,
//! the 15-minute window, that the key exists): a request that fails those is refused without
//! its body. The signature itself covers the body, so it is checked once the body is in.
//! The key a signature is checked with (the secret opened, then the day's key derived from
//! it) is kept per key id, day and region until the users next change (four at most per
//! key), so a request costs two SHA-256 and two HMAC, not an AES open and five HMAC; key ids
//! are found through an index of the users' keys, made once per change of the users.

use std::collections::HashMap;
use std::sync::Arc;

use narad_auth::Authenticator;
use narad_auth::store::{UserRecord, Users};
use narad_core::clock::Clock as _;
use narad_sqs::sigv4::{self, Request as Signed};
use narad_sqs::{Kind, SqsError};
use parking_lot::Mutex;

/// The most signing keys kept for one access key (one per day and region it signs for):
/// each key has its own share, so one key signing for many regions cannot push the others'
/// out; beyond it, that key's requests derive theirs each time.
const MAX_CACHED_PER_KEY: usize = 4;

/// A key a signature is checked with, and whose it is.
struct Signer {
    key: [u8; 32],
    user: Arc<UserRecord>,
}

/// Signing keys opened, for the users as they were (`users`): cleared when they change.
#[derive(Default)]
pub struct SigningKeys {
    inner: Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    users: Option<Arc<Users>>,
    /// Access key id → its user's name, for those users.
    owners: HashMap<String, String>,
    /// Access key id → (day, region) → its signing key.
    keys: HashMap<String, HashMap<(String, String), Arc<Signer>>>,
}

/// Logs of secrets that do not open, bounded: a request can cause one.
static NOT_OPENED_LOGGED: narad_core::loggate::LogGate =
    narad_core::loggate::LogGate::new(5, std::time::Duration::from_secs(60));

/// A request whose signature is still to be checked against its body.
pub(super) struct Pending {
    header: String,
    signer: Arc<Signer>,
}

impl Pending {
    pub(super) fn user(&self) -> &Arc<UserRecord> {
        &self.signer.user
    }
}

fn header_str<'h>(headers: &'h axum::http::HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn signed<'a>(
    parts: &'a axum::http::request::Parts,
    headers: &'a [(&'a str, &'a [u8])],
    body: &'a [u8],
) -> Signed<'a> {
    Signed {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query().unwrap_or(""),
        headers,
        body,
    }
}

fn header_list(parts: &axum::http::request::Parts) -> Vec<(&str, &[u8])> {
    parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect()
}

/// The checks that need no body, and the key the signature is to be checked with.
pub(super) fn before_body(
    keys: &SigningKeys,
    state: &super::SharedState,
    auth: &Authenticator,
    parts: &axum::http::request::Parts,
) -> Result<Pending, SqsError> {
    let Some(header) = header_str(&parts.headers, "authorization") else {
        return Err(SqsError::new(
            Kind::MissingAuthenticationToken,
            "Request is missing Authentication Token: sign it with an access key (narad user key add)",
        ));
    };
    let parsed = sigv4::parse_authorization(header)?;
    let headers = header_list(parts);
    let req = signed(parts, &headers, b"");
    let now_s = narad_core::clock::SystemClock.now_ms() / 1000;
    sigv4::check_scope(&parsed, &req, now_s)?;
    let signer = keys.signer(state, auth, &parsed)?;
    Ok(Pending {
        header: header.to_owned(),
        signer,
    })
}

/// Checks the signature of the request now that its body is in, and answers the caller as
/// the users are now: a key removed, or a user deleted, while the body arrived refuses the
/// request; grants changed meanwhile are the ones that count.
pub(super) fn with_body(
    pending: &Pending,
    state: &super::SharedState,
    parts: &axum::http::request::Parts,
    body: &[u8],
) -> Result<Arc<UserRecord>, SqsError> {
    let parsed = sigv4::parse_authorization(&pending.header)?;
    let headers = header_list(parts);
    let req = signed(parts, &headers, body);
    let amz = header_str(&parts.headers, "x-amz-date").unwrap_or("");
    sigv4::verify(&parsed, &req, amz, &pending.signer.key)?;
    let then = &pending.signer.user;
    state
        .auth
        .as_ref()
        .and_then(|a| a.store().get(&then.username))
        .filter(|u| u.id == then.id && u.access_keys.iter().any(|k| k.id == parsed.access_key))
        .ok_or_else(unknown_key)
}

fn unknown_key() -> SqsError {
    SqsError::new(
        Kind::InvalidClientTokenId,
        "The security token included in the request is invalid.",
    )
}

impl SigningKeys {
    fn signer(
        &self,
        state: &super::SharedState,
        auth: &Authenticator,
        a: &sigv4::Authorization<'_>,
    ) -> Result<Arc<Signer>, SqsError> {
        // (ids have a fixed form: anything else names no key, without a look)
        if !narad_auth::store::valid_access_key_id(a.access_key) {
            return Err(unknown_key());
        }
        let users = auth.store().snapshot();
        let scope = (a.date.to_owned(), a.region.to_owned());
        let owner = {
            let mut c = self.inner.lock();
            if !c.users.as_ref().is_some_and(|u| Arc::ptr_eq(u, &users)) {
                c.owners = users
                    .values()
                    .flat_map(|u| {
                        u.access_keys
                            .iter()
                            .map(|k| (k.id.clone(), u.username.clone()))
                    })
                    .collect();
                c.keys.clear();
                c.users = Some(users.clone());
            }
            if let Some(s) = c.keys.get(a.access_key).and_then(|k| k.get(&scope)) {
                return Ok(s.clone());
            }
            c.owners.get(a.access_key).cloned()
        };
        let Some((user, key)) = owner.and_then(|name| {
            let u = users.get(&name)?;
            let k = u.access_keys.iter().find(|k| k.id == a.access_key)?;
            Some((u.clone(), k.clone()))
        }) else {
            return Err(unknown_key());
        };
        let keys = crate::http::access_keys::keys(state)
            .map_err(|e| SqsError::new(Kind::ServiceUnavailable, e.message))?;
        let secret = keys
            .open(&crate::http::access_keys::identity(&key.id, &user), &key.secret)
            .map_err(|e| {
                if let Some(dropped) = NOT_OPENED_LOGGED.admit() {
                    tracing::warn!(key = %key.id, user = %user.username, error = %e, dropped, "an access key's secret does not open on this node");
                }
                SqsError::new(
                    Kind::InternalFailure,
                    "this node cannot open the access key's secret (was the cluster secret changed?)",
                )
            })?;
        let signer = Arc::new(Signer {
            key: sigv4::signing_key(&secret, a.date, a.region, a.service),
            user,
        });
        let mut c = self.inner.lock();
        if c.users.as_ref().is_some_and(|u| Arc::ptr_eq(u, &users)) {
            let mine = c.keys.entry(a.access_key.to_owned()).or_default();
            if mine.len() < MAX_CACHED_PER_KEY {
                mine.insert(scope, signer.clone());
            }
        }
        Ok(signer)
    }
}
