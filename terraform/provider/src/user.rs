//! `narad_user`: `POST/GET/DELETE /v1/users[/{username}]`, `PUT .../grants`,
//! `PUT .../password`.

use std::collections::BTreeSet;

use async_trait::async_trait;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};
use tf_provider::schema::{AttributeType, Block, Description, NestedBlock, Schema};
use tf_provider::value::{Value, ValueEmpty};
use tf_provider::{AttributePath, Diagnostics, Resource, map};

use crate::util::*;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[serde(default)]
pub struct Grant {
    pub action: Value<String>,
    pub patterns: Value<BTreeSet<Value<String>>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct UserState {
    pub id: Value<String>,
    pub username: Value<String>,
    pub password: Value<String>,
    pub grant: Value<BTreeSet<Grant>>,
    pub root: Value<bool>,
    pub created_at_ms: Value<i64>,
}

/// Private state: a digest of the password this provider last set (never the password).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PasswordMark {
    pub sha256: String,
}

type Private = Value<PasswordMark>;

fn mark(username: &str, password: &str) -> PasswordMark {
    let mut h = Sha256::new();
    h.update(b"narad-provider-password\0");
    h.update(username.as_bytes());
    h.update(b"\0");
    h.update(password.as_bytes());
    PasswordMark {
        sha256: h.finalize().iter().map(|b| format!("{b:02x}")).collect(),
    }
}

pub struct UserResource {
    pub shared: Shared,
}

const ACTIONS: [&str; 5] = ["produce", "consume", "create", "replicate", "admin"];

fn pattern_ok(p: &str) -> bool {
    let body = p.strip_suffix('*').unwrap_or(p);
    !p.is_empty()
        && body.len() <= 255
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn validate_user(diags: &mut Diagnostics, c: &UserState) {
    if let Value::Value(u) = &c.username
        && !name_chars_ok(u, 64)
    {
        diags.error(
            "Invalid username",
            format!("'{u}' is not a username: ^[A-Za-z0-9._-]{{1,64}}$"),
            AttributePath::new("username"),
        );
    }
    if let Value::Value(p) = &c.password {
        let n = p.chars().count();
        if !(8..=1024).contains(&n) {
            diags.error(
                "Invalid password",
                format!("a password has 8 to 1024 characters, this one {n}"),
                AttributePath::new("password"),
            );
        }
    }
    if let Value::Value(grants) = &c.grant {
        if grants.len() > 64 {
            diags.error_short("At most 64 grants per user", AttributePath::new("grant"));
        }
        for g in grants {
            let Value::Value(action) = &g.action else {
                continue;
            };
            let path = AttributePath::new("grant");
            if !ACTIONS.contains(&action.as_str()) {
                diags.error(
                    "Invalid grant action",
                    format!("'{action}': one of {}", ACTIONS.join(", ")),
                    path.clone(),
                );
            }
            match (&g.patterns, action.as_str()) {
                (Value::Unknown, _) => {}
                (Value::Null, "admin") => {}
                (Value::Value(_), "admin") => diags.error(
                    "Invalid grant",
                    "the admin grant is global: omit patterns",
                    path.clone(),
                ),
                (Value::Null, _) => diags.error(
                    "Invalid grant",
                    format!("a {action} grant needs at least one pattern"),
                    path.clone(),
                ),
                (Value::Value(ps), _) => {
                    if ps.is_empty() || ps.len() > 64 {
                        diags.error(
                            "Invalid grant",
                            format!("a {action} grant has 1 to 64 patterns"),
                            path.clone(),
                        );
                    }
                    for p in ps.iter().filter_map(known) {
                        if !pattern_ok(&p) {
                            diags.error(
                                "Invalid grant pattern",
                                format!(
                                    "'{p}': 1 to 256 characters, ^[A-Za-z0-9._-]{{0,255}}\\*?$"
                                ),
                                path.clone(),
                            );
                        }
                    }
                }
            }
        }
    }
}

fn grants_json(g: &Value<BTreeSet<Grant>>) -> Json {
    let list: Vec<Json> = g
        .iter()
        .flatten()
        .map(|g| {
            let patterns: Vec<String> = g.patterns.iter().flatten().filter_map(known).collect();
            json!({"action": known(&g.action).unwrap_or_default(), "patterns": patterns})
        })
        .collect();
    Json::Array(list)
}

fn grants_from(j: &Json) -> BTreeSet<Grant> {
    j.get("grants")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .map(|g| {
            let patterns: BTreeSet<Value<String>> = g
                .get("patterns")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
                .filter_map(Json::as_str)
                .map(|p| Value::Value(p.to_string()))
                .collect();
            Grant {
                action: opt(g.get("action").and_then(Json::as_str).map(str::to_string)),
                patterns: if patterns.is_empty() {
                    Value::Null
                } else {
                    Value::Value(patterns)
                },
            }
        })
        .collect()
}

impl UserState {
    fn absorb(&mut self, j: &Json) {
        self.username = opt(j.get("username").and_then(Json::as_str).map(str::to_string));
        self.id = self.username.clone();
        self.grant = Value::Value(grants_from(j));
        self.root = Value::Value(j.get("root").and_then(Json::as_bool).unwrap_or(false));
        self.created_at_ms = opt(j.get("created_at_ms").and_then(Json::as_i64));
    }
}

#[async_trait]
impl Resource for UserResource {
    type State<'a> = UserState;
    type PrivateState<'a> = Private;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeType::{Bool, Number, Set, String as Str};
        Some(Schema {
            version: 1,
            block: Block {
                version: 1,
                description: Description::plain(
                    "A Narad user (security on). `username` forces replacement; the password \
                     and the grants are changed in place.",
                ),
                attributes: map! {
                    "id" => attr(Str, Computed, "The username."),
                    "username" => attr(Str, Required, "^[A-Za-z0-9._-]{1,64}$. Forces replacement."),
                    "password" => sensitive(attr(Str, Required, "8..=1024 characters. Sensitive; never read back (the broker keeps only an argon2id hash); a change goes through PUT /v1/users/{username}/password.")),
                    "root" => attr(Bool, Computed, "Whether this is the root user."),
                    "created_at_ms" => attr(Number, Computed, "Creation time, unix ms."),
                },
                blocks: map! {
                    "grant" => NestedBlock::Set(Block {
                        version: 1,
                        description: Description::plain("A grant: an action on topic patterns (replaces all grants in place)."),
                        attributes: map! {
                            "action" => attr(Str, Required, "produce, consume, create, replicate or admin (admin only by root)."),
                            "patterns" => attr(Set(Box::new(Str)), Optional, "Topic names or prefixes ending in `*`; 1..=64, none for admin."),
                        },
                        ..Default::default()
                    }),
                },
                ..Default::default()
            },
        })
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: UserState) -> Option<()> {
        validate_user(diags, &config);
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: UserState,
        private: Private,
        _meta: ValueEmpty,
    ) -> Option<(UserState, Private)> {
        let api = self.shared.api(diags)?;
        let name = known(&state.username)?;
        match api.get(&format!("/v1/users/{name}")).await {
            Ok(j) => {
                let mut s = state.clone();
                s.absorb(&j);
                Some((s, private))
            }
            Err(e) if e.is("user_not_found") => None,
            Err(e) => {
                api_error(diags, &format!("reading user '{name}'"), &e);
                Some((state, private))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        diags: &mut Diagnostics,
        proposed: UserState,
        _config: UserState,
        _meta: ValueEmpty,
    ) -> Option<(UserState, Private)> {
        validate_user(diags, &proposed);
        let mut s = proposed;
        s.id = s.username.clone();
        s.root = Value::Value(false);
        s.created_at_ms = Value::Unknown;
        Some((s, Value::Null))
    }

    async fn plan_update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: UserState,
        proposed: UserState,
        _config: UserState,
        private: Private,
        _meta: ValueEmpty,
    ) -> Option<(UserState, Private, Vec<AttributePath>)> {
        validate_user(diags, &proposed);
        let mut replace = vec![];
        if proposed.username != prior.username {
            replace.push(AttributePath::new("username"));
        }
        Some((proposed, private, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: UserState,
        private: Private,
        _meta: ValueEmpty,
    ) -> Option<Private> {
        Some(private)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned: UserState,
        _config: UserState,
        _private: Private,
        _meta: ValueEmpty,
    ) -> Option<(UserState, Private)> {
        let api = self.shared.api(diags)?;
        let name = known(&planned.username)?;
        let password = known(&planned.password)?;
        let body =
            json!({"username": name, "password": password, "grants": grants_json(&planned.grant)});
        match api.call(Method::POST, "/v1/users", Some(&body)).await {
            Ok(j) => {
                let mut s = planned.clone();
                s.absorb(&j.unwrap_or(Json::Null));
                // the grants as configured (the broker's answer holds the same set)
                s.grant = planned.grant.clone();
                Some((s, Value::Value(mark(&name, &password))))
            }
            Err(e) => {
                api_error(diags, &format!("creating user '{name}'"), &e);
                None
            }
        }
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: UserState,
        planned: UserState,
        _config: UserState,
        private: Private,
        _meta: ValueEmpty,
    ) -> Option<(UserState, Private)> {
        let api = self.shared.api(diags)?;
        let name = known(&prior.username)?;
        let mut private = private;
        if planned.grant != prior.grant {
            let body = json!({"grants": grants_json(&planned.grant)});
            if let Err(e) = api
                .call(
                    Method::PUT,
                    &format!("/v1/users/{name}/grants"),
                    Some(&body),
                )
                .await
            {
                api_error(diags, &format!("setting the grants of user '{name}'"), &e);
                return None;
            }
        }
        if let Value::Value(password) = &planned.password {
            let applied = matches!(&private, Value::Value(m) if *m == mark(&name, password));
            if planned.password != prior.password && !applied {
                let mut body = json!({"new_password": password});
                // changing one's own password needs the current one
                if api.username.as_deref() == Some(name.as_str()) {
                    body["current_password"] = json!(api.password.clone().unwrap_or_default());
                }
                if let Err(e) = api
                    .call(
                        Method::PUT,
                        &format!("/v1/users/{name}/password"),
                        Some(&body),
                    )
                    .await
                {
                    api_error(
                        diags,
                        &format!("changing the password of user '{name}'"),
                        &e,
                    );
                    let mut s = planned.clone();
                    s.password = prior.password.clone();
                    return Some((s, private));
                }
                private = Value::Value(mark(&name, password));
            }
        }
        Some((planned, private))
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: UserState,
        _private: Private,
        _meta: ValueEmpty,
    ) -> Option<()> {
        let api = self.shared.api(diags)?;
        let name = known(&prior.username)?;
        destroy_at(
            &api,
            diags,
            &format!("/v1/users/{name}"),
            &["user_not_found"],
            &format!("deleting user '{name}'"),
        )
        .await
    }

    async fn import<'a>(
        &self,
        diags: &mut Diagnostics,
        id: String,
    ) -> Option<(UserState, Private)> {
        let api = self.shared.api(diags)?;
        match api.get(&format!("/v1/users/{id}")).await {
            Ok(j) => {
                let mut s = UserState::default();
                s.absorb(&j);
                // the password is unknown to the provider: the next apply sets the
                // configured one
                s.password = Value::Null;
                Some((s, Value::Null))
            }
            Err(e) => {
                api_error(
                    diags,
                    &format!("importing user '{id}' (import by username)"),
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
    fn grant_patterns() {
        assert!(pattern_ok("orders"));
        assert!(pattern_ok("orders.*"));
        assert!(pattern_ok("*"));
        assert!(!pattern_ok("a*b"));
        assert!(!pattern_ok("a b"));
        assert!(!pattern_ok(""), "the broker refuses an empty pattern");
    }

    #[test]
    fn the_mark_depends_on_user_and_password() {
        assert_eq!(mark("u", "p"), mark("u", "p"));
        assert_ne!(mark("u", "p"), mark("u", "q"));
        assert_ne!(mark("u", "p"), mark("v", "p"));
    }
}
