//! `narad_remote`: `POST/GET/PATCH/DELETE /v1/remotes[/{name}]` (admin; the broker needs
//! security on and a `cluster_secret`).

use async_trait::async_trait;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};
use tf_provider::schema::{AttributeType, Block, Description, Schema};
use tf_provider::value::{Value, ValueEmpty};
use tf_provider::{AttributePath, Diagnostics, Resource, map};

use crate::util::*;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct RemoteState {
    pub id: Value<String>,
    pub name: Value<String>,
    pub url: Value<String>,
    pub username: Value<String>,
    pub password: Value<String>,
    pub ca_pem: Value<String>,
    pub ca_sha256: Value<String>,
    pub sealed_with: Value<String>,
    pub version: Value<i64>,
}

pub struct RemoteResource {
    pub shared: Shared,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn ca_sha256(pem: &str) -> String {
    hex(&Sha256::digest(pem.as_bytes()))
}

/// The URL as the broker stores it, near enough to tell "the same URL" from a change:
/// lower case, no trailing `/`, no `:443`.
fn loose_url(u: &str) -> String {
    let l = u.trim().to_ascii_lowercase();
    let l = l.trim_end_matches('/');
    let (scheme, rest) = l.split_once("://").unwrap_or(("", l));
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = host.strip_suffix(":443").unwrap_or(host);
    format!("{scheme}://{host}{path}")
}

pub fn remote_name_ok(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

fn validate_remote(diags: &mut Diagnostics, c: &RemoteState) {
    if let Value::Value(n) = &c.name
        && !remote_name_ok(n)
    {
        diags.error(
            "Invalid name",
            format!("'{n}' is not a remote name: ^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}$"),
            AttributePath::new("name"),
        );
    }
    if let Value::Value(u) = &c.url {
        let l = u.to_ascii_lowercase();
        if !l.starts_with("https://") || l.contains('?') || l.contains('#') || l[8..].contains('@')
        {
            diags.error(
                "Invalid url",
                format!("'{u}': a remote's URL is https:// without user info, query or fragment"),
                AttributePath::new("url"),
            );
        }
    }
    if let Value::Value(u) = &c.username
        && (u.is_empty() || u.len() > 256 || u.contains(':'))
    {
        diags.error(
            "Invalid username",
            "1..=256 bytes without ':'",
            AttributePath::new("username"),
        );
    }
    if let Value::Value(p) = &c.password
        && (p.is_empty() || p.len() > 1024)
    {
        diags.error(
            "Invalid password",
            "1..=1024 bytes",
            AttributePath::new("password"),
        );
    }
    if let Value::Value(p) = &c.ca_pem
        && (p.len() > 64 * 1024 || !p.contains("-----BEGIN CERTIFICATE-----"))
    {
        diags.error(
            "Invalid ca_pem",
            "a PEM bundle of at most 64 KiB holding at least one certificate",
            AttributePath::new("ca_pem"),
        );
    }
}

impl RemoteState {
    /// Takes the broker's remote object; `url` and `ca_pem` stay as written while they
    /// are what the broker holds.
    fn absorb(&mut self, j: &Json, diags: &mut Diagnostics) {
        let s = |k: &str| opt(j.get(k).and_then(Json::as_str).map(str::to_string));
        self.id = s("id");
        self.name = s("name");
        let api_url = s("url");
        self.url = match (&self.url, &api_url) {
            (Value::Value(mine), Value::Value(theirs)) if loose_url(mine) == loose_url(theirs) => {
                Value::Value(mine.clone())
            }
            _ => api_url,
        };
        self.username = s("username");
        let api_ca = s("ca_sha256");
        self.ca_pem = match (&self.ca_pem, &api_ca) {
            (_, Value::Null) => Value::Null,
            (Value::Value(pem), Value::Value(h)) if ca_sha256(pem) == *h => {
                Value::Value(pem.clone())
            }
            // a bundle set outside Terraform: it cannot be read back, only told apart
            (_, Value::Value(h)) => Value::Value(format!("(CA bundle with SHA-256 {h})")),
            (_, Value::Unknown) => Value::Unknown,
        };
        self.ca_sha256 = api_ca;
        self.sealed_with = opt(j
            .get("credential")
            .and_then(|c| c.get("sealed_with"))
            .and_then(Json::as_str)
            .map(str::to_string));
        if self.sealed_with == Value::Value("unknown".into()) && self.password.is_value() {
            diags.root_warning(
                "The remote's password does not open with the broker's cluster secret",
                "the next apply gives the password again",
            );
            self.password = Value::Null;
        }
        self.version = opt(j.get("version").and_then(Json::as_i64));
    }
}

#[async_trait]
impl Resource for RemoteResource {
    type State<'a> = RemoteState;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeType::{Number, String as Str};
        Some(Schema {
            version: 1,
            block: Block {
                version: 1,
                description: Description::plain(
                    "A remote: another Narad cluster remote children ship to. `name` forces \
                     replacement; the rest is changed in place (any change sends the password \
                     again, sealed by the broker).",
                ),
                attributes: map! {
                    "id" => attr(Str, Computed, "The remote's id."),
                    "name" => attr(Str, Required, "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$. Forces replacement."),
                    "url" => attr(Str, Required, "https:// URL of the other cluster (its port must be in the broker's remotes_allowed_ports)."),
                    "username" => attr(Str, Required, "A user of the other cluster with produce and replicate on the target topics (not an admin)."),
                    "password" => sensitive(attr(Str, Required, "Its password. Sensitive; sealed by the broker under its cluster secret and never read back.")),
                    "ca_pem" => attr(Str, Optional, "PEM bundle that alone verifies the remote (absent: the system roots). Read back only as its SHA-256."),
                    "ca_sha256" => attr(Str, Computed, "SHA-256 of ca_pem as the broker holds it."),
                    "sealed_with" => attr(Str, Computed, "current, previous or unknown: which cluster secret seals the password."),
                    "version" => attr(Number, Computed, "The remote's version (changes on every edit)."),
                },
                ..Default::default()
            },
        })
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: RemoteState) -> Option<()> {
        validate_remote(diags, &config);
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: RemoteState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(RemoteState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let name = known(&state.name)?;
        match api.get(&format!("/v1/remotes/{name}")).await {
            Ok(j) => {
                let mut s = state.clone();
                s.absorb(&j, diags);
                Some((s, private))
            }
            Err(e) if e.is("remote_not_found") => None,
            Err(e) => {
                api_error(diags, &format!("reading remote '{name}'"), &e);
                Some((state, private))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        diags: &mut Diagnostics,
        proposed: RemoteState,
        _config: RemoteState,
        _meta: ValueEmpty,
    ) -> Option<(RemoteState, ValueEmpty)> {
        validate_remote(diags, &proposed);
        let mut s = proposed;
        s.id = Value::Unknown;
        s.version = Value::Unknown;
        s.sealed_with = Value::Unknown;
        s.ca_sha256 = match &s.ca_pem {
            Value::Value(p) => Value::Value(ca_sha256(p)),
            Value::Null => Value::Null,
            Value::Unknown => Value::Unknown,
        };
        Some((s, ValueEmpty::Null))
    }

    async fn plan_update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: RemoteState,
        proposed: RemoteState,
        _config: RemoteState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(RemoteState, ValueEmpty, Vec<AttributePath>)> {
        validate_remote(diags, &proposed);
        let mut replace = vec![];
        let mut s = proposed;
        if s.name != prior.name {
            replace.push(AttributePath::new("name"));
        }
        let changed = s.url != prior.url
            || s.username != prior.username
            || s.password != prior.password
            || s.ca_pem != prior.ca_pem;
        if changed {
            s.version = Value::Unknown;
            s.sealed_with = Value::Unknown;
            s.ca_sha256 = match &s.ca_pem {
                Value::Value(p) => Value::Value(ca_sha256(p)),
                Value::Null => Value::Null,
                Value::Unknown => Value::Unknown,
            };
        }
        Some((s, private, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: RemoteState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<ValueEmpty> {
        Some(private)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned: RemoteState,
        _config: RemoteState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(RemoteState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let name = known(&planned.name)?;
        let mut body = json!({
            "name": name,
            "url": known(&planned.url)?,
            "username": known(&planned.username)?,
            "password": known(&planned.password)?,
        });
        if let Value::Value(pem) = &planned.ca_pem {
            body["ca_pem"] = json!(pem);
        }
        match api.call(Method::POST, "/v1/remotes", Some(&body)).await {
            Ok(j) => {
                let mut s = planned.clone();
                s.absorb(&j.unwrap_or(Json::Null), diags);
                Some((s, private))
            }
            Err(e) => {
                api_error(diags, &format!("creating remote '{name}'"), &e);
                None
            }
        }
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: RemoteState,
        planned: RemoteState,
        _config: RemoteState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(RemoteState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let name = known(&prior.name)?;
        // a new url, username or CA needs the password again; send it with every change
        let mut body = json!({"password": known(&planned.password)?});
        if planned.url != prior.url {
            body["url"] = json!(known(&planned.url)?);
        }
        if planned.username != prior.username {
            body["username"] = json!(known(&planned.username)?);
        }
        if planned.ca_pem != prior.ca_pem {
            body["ca_pem"] = match &planned.ca_pem {
                Value::Value(p) => json!(p),
                _ => Json::Null,
            };
        }
        if let Value::Value(v) = prior.version {
            body["version"] = json!(v);
        }
        match api
            .call(Method::PATCH, &format!("/v1/remotes/{name}"), Some(&body))
            .await
        {
            Ok(j) => {
                let mut s = planned.clone();
                s.absorb(&j.unwrap_or(Json::Null), diags);
                Some((s, private))
            }
            Err(e) => {
                api_error(diags, &format!("updating remote '{name}'"), &e);
                None
            }
        }
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: RemoteState,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<()> {
        let api = self.shared.api(diags)?;
        let name = known(&prior.name)?;
        destroy_at(
            &api,
            diags,
            &format!("/v1/remotes/{name}"),
            &["remote_not_found"],
            &format!("deleting remote '{name}'"),
        )
        .await
    }

    async fn import<'a>(
        &self,
        diags: &mut Diagnostics,
        id: String,
    ) -> Option<(RemoteState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        match api.get(&format!("/v1/remotes/{id}")).await {
            Ok(j) => {
                let mut s = RemoteState::default();
                s.absorb(&j, diags);
                // neither the password nor the CA bundle can be read back: the next apply
                // gives them (and the broker seals the password again)
                s.password = Value::Null;
                s.ca_pem = Value::Null;
                Some((s, ValueEmpty::Null))
            }
            Err(e) => {
                api_error(
                    diags,
                    &format!("importing remote '{id}' (import by name)"),
                    &e,
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_url_as_the_broker_stores_it() {
        assert_eq!(
            loose_url("https://B.example.com"),
            loose_url("https://b.example.com/")
        );
        assert_eq!(
            loose_url("https://b.example.com:443/x/"),
            loose_url("https://b.example.com/x")
        );
        assert_ne!(
            loose_url("https://b.example.com:8443"),
            loose_url("https://b.example.com")
        );
        assert_ne!(
            loose_url("https://b.example.com/a"),
            loose_url("https://b.example.com/b")
        );
    }

    #[test]
    fn remote_names() {
        assert!(remote_name_ok("dr"));
        assert!(remote_name_ok("a.b-c_d"));
        assert!(!remote_name_ok(".dr"));
        assert!(!remote_name_ok(""));
        assert!(!remote_name_ok(&"a".repeat(65)));
    }
}
