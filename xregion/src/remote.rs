//! A catalog remote made usable: the identity its credential is bound to, and a client that
//! calls it with the credential opened.

use std::time::Duration;

use narad_core::catalog::RemoteMeta;

use crate::client::{ClientError, RemoteClient};
use crate::guard::{GuardConfig, GuardError, RemoteUrl};
use crate::seal::{CredentialKeys, RemoteIdentity, SealError};

/// SHA-256 of a CA bundle, as a credential's identity binds it.
pub fn ca_sha256(pem: &str) -> [u8; 32] {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, pem.as_bytes());
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// The identity `remote`'s credential is sealed for.
pub fn identity(remote: &RemoteMeta) -> RemoteIdentity<'_> {
    RemoteIdentity {
        name: &remote.name,
        id: remote.id,
        url: &remote.url,
        username: &remote.username,
        ca_sha256: remote.ca_pem.as_deref().map(ca_sha256),
    }
}

/// Why a client for a remote could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The password does not open with this node's keys.
    #[error("{0}")]
    Credential(#[from] SealError),
    /// The stored URL no longer passes the guard (its settings changed since).
    #[error("{0}")]
    Guard(#[from] GuardError),
    #[error("{0}")]
    Client(#[from] ClientError),
}

impl RemoteError {
    /// The link state this puts a remote child in.
    pub fn state(&self) -> &'static str {
        match self {
            Self::Credential(_) => "auth_failed",
            Self::Guard(_) => "destination_refused",
            Self::Client(e) => e.state(),
        }
    }
}

/// A client for `remote` with its password opened by `keys`, each request bounded by
/// `timeout`.
pub fn client(
    remote: &RemoteMeta,
    keys: &CredentialKeys,
    guard: &GuardConfig,
    timeout: Duration,
) -> Result<RemoteClient, RemoteError> {
    let password = keys.open(&identity(remote), &remote.credential)?;
    let url = RemoteUrl::parse(&remote.url, guard)?;
    Ok(RemoteClient::new(
        url,
        &remote.username,
        &password,
        remote.ca_pem.as_deref(),
        guard.clone(),
        timeout,
    )?)
}
