//! `narad_child`: a fan-out link `POST/GET /v1/topics/{parent}/children`,
//! `DELETE .../children/{child}`, and for remote children `.../pause` and `.../resume`.
//! Local child (`delay_ms` 0), delay child (`delay_ms` > 0), remote child (`remote` +
//! `remote_topic`).

use async_trait::async_trait;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};
use tf_provider::schema::{AttributeType, Block, Description, Schema};
use tf_provider::value::{Value, ValueEmpty};
use tf_provider::{AttributePath, Diagnostics, Resource, map};

use crate::client::{Api, ApiError};
use crate::util::*;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct ChildState {
    pub id: Value<String>,
    pub parent: Value<String>,
    pub child: Value<String>,
    pub delay_ms: Value<i64>,
    pub from: Value<String>,
    pub remote: Value<String>,
    pub remote_topic: Value<String>,
    pub lanes: Value<i64>,
    pub paused: Value<bool>,
    pub force_destroy: Value<bool>,
    pub kind: Value<String>,
}

pub struct ChildResource {
    pub shared: Shared,
}

const MAX_FANOUT_DELAY_MS: i64 = 31_536_000_000;

fn is_remote(c: &ChildState) -> bool {
    !c.remote.is_null() || !c.remote_topic.is_null()
}

fn validate_child(diags: &mut Diagnostics, c: &ChildState) {
    check_topic_name(diags, &c.parent, "parent");
    check_topic_name(diags, &c.child, "child");
    check_range(diags, &c.delay_ms, "delay_ms", 0, MAX_FANOUT_DELAY_MS);
    check_range(diags, &c.lanes, "lanes", 1, 8);
    if let (Value::Value(p), Value::Value(ch)) = (&c.parent, &c.child)
        && p == ch
    {
        diags.error_short(
            "A topic cannot be its own child",
            AttributePath::new("child"),
        );
    }
    if let Value::Value(r) = &c.remote
        && !crate::remote::remote_name_ok(r)
    {
        diags.error_short(
            format!("'{r}' is not a remote name"),
            AttributePath::new("remote"),
        );
    }
    check_topic_name(diags, &c.remote_topic, "remote_topic");
    if is_remote(c) {
        if c.remote.is_null() || c.remote_topic.is_null() {
            diags.root_error_short("A remote child needs both remote and remote_topic");
        }
        if matches!(c.delay_ms, Value::Value(d) if d != 0) {
            diags.error_short(
                "A remote child has no delay",
                AttributePath::new("delay_ms"),
            );
        }
        if let Value::Value(f) = &c.from
            && !matches!(f.as_str(), "attach" | "latest" | "unconsumed" | "earliest")
        {
            diags.error(
                "Invalid from",
                "a remote child starts at \"attach\" (\"latest\"), \"unconsumed\" or \"earliest\"",
                AttributePath::new("from"),
            );
        }
    } else {
        if c.lanes.is_value() {
            diags.error_short("lanes is for remote children", AttributePath::new("lanes"));
        }
        if c.paused.is_value() {
            diags.error_short(
                "paused is for remote children",
                AttributePath::new("paused"),
            );
        }
        if let Value::Value(f) = &c.from
            && !matches!(f.as_str(), "latest" | "earliest")
        {
            diags.error(
                "Invalid from",
                "a local child starts at \"latest\" or \"earliest\"",
                AttributePath::new("from"),
            );
        }
    }
}

/// The link as the broker lists it, or `None` when the parent or the link is gone.
async fn fetch(api: &Api, parent: &str, child: &str) -> Result<Option<Json>, ApiError> {
    match api.get(&format!("/v1/topics/{parent}/children")).await {
        Ok(j) => Ok(j
            .get("children")
            .and_then(Json::as_array)
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.get("name").and_then(Json::as_str) == Some(child))
            })
            .cloned()),
        Err(e) if e.is("topic_not_found") => Ok(None),
        Err(e) => Err(e),
    }
}

impl ChildState {
    fn absorb(&mut self, j: &Json) {
        self.delay_ms = opt(j.get("delay_ms").and_then(Json::as_i64));
        match j.get("remote") {
            Some(r) if r.is_object() => {
                let s = |k: &str| opt(r.get(k).and_then(Json::as_str).map(str::to_string));
                self.remote = s("remote");
                self.remote_topic = s("remote_topic");
                self.lanes = opt(r.get("lanes").and_then(Json::as_i64));
                self.paused = opt(r.get("paused").and_then(Json::as_bool));
                self.kind = Value::Value("remote".into());
            }
            _ => {
                self.remote = Value::Null;
                self.remote_topic = Value::Null;
                self.lanes = Value::Null;
                self.paused = Value::Null;
                self.kind = Value::Value(
                    if matches!(self.delay_ms, Value::Value(d) if d > 0) {
                        "delay"
                    } else {
                        "local"
                    }
                    .into(),
                );
            }
        }
    }
}

async fn set_paused(api: &Api, parent: &str, child: &str, paused: bool) -> Result<(), ApiError> {
    let verb = if paused { "pause" } else { "resume" };
    api.call(
        Method::POST,
        &format!("/v1/topics/{parent}/children/{child}/{verb}"),
        None,
    )
    .await
    .map(|_| ())
}

#[async_trait]
impl Resource for ChildResource {
    type State<'a> = ChildState;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeType::{Bool, Number, String as Str};
        Some(Schema {
            version: 1,
            block: Block {
                version: 1,
                description: Description::plain(
                    "A fan-out child of a parent topic: local (delay_ms 0), delay (delay_ms > 0) \
                     or remote (remote + remote_topic). Everything but `paused`, `from` and \
                     `force_destroy` forces replacement (detach and attach again: a new link \
                     starts where `from` says).",
                ),
                attributes: map! {
                    "id" => attr(Str, Computed, "parent/child (the import id)."),
                    "parent" => attr(Str, Required, "The parent topic. Forces replacement."),
                    "child" => attr(Str, Required, "Local and delay children: the child topic (it must exist). Remote children: the link's name. Forces replacement."),
                    "delay_ms" => attr(Number, OptionalComputed, "Delay child: copy each record delay_ms after its commit, 0..=31536000000; the parent's retention_ms must be 0 or >= delay + 1 h. Forces replacement."),
                    "from" => attr(Str, Optional, "Where the link starts, used at attach only: latest (default) or earliest; remote: attach (default), unconsumed or earliest."),
                    "remote" => attr(Str, Optional, "Remote child: the narad_remote's name. Forces replacement."),
                    "remote_topic" => attr(Str, Optional, "Remote child: the topic on the remote. Forces replacement."),
                    "lanes" => attr(Number, OptionalComputed, "Remote child: 1..=8 lanes (default 1). Forces replacement."),
                    "paused" => attr(Bool, OptionalComputed, "Remote child: paused (in place: pause/resume)."),
                    "force_destroy" => attr(Bool, Optional, "Detach a remote child even while records are not shipped (DELETE ?force=true)."),
                    "kind" => attr(Str, Computed, "local, delay or remote."),
                },
                ..Default::default()
            },
        })
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: ChildState) -> Option<()> {
        validate_child(diags, &config);
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: ChildState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ChildState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let (parent, child) = (known(&state.parent)?, known(&state.child)?);
        match fetch(&api, &parent, &child).await {
            Ok(Some(j)) => {
                let mut s = state.clone();
                s.absorb(&j);
                Some((s, private))
            }
            Ok(None) => None,
            Err(e) => {
                api_error(diags, &format!("reading child '{child}' of '{parent}'"), &e);
                Some((state, private))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        diags: &mut Diagnostics,
        proposed: ChildState,
        _config: ChildState,
        _meta: ValueEmpty,
    ) -> Option<(ChildState, ValueEmpty)> {
        validate_child(diags, &proposed);
        let mut s = proposed;
        s.id = match (&s.parent, &s.child) {
            (Value::Value(p), Value::Value(c)) => Value::Value(format!("{p}/{c}")),
            _ => Value::Unknown,
        };
        let remote = is_remote(&s);
        if s.delay_ms.is_null() {
            s.delay_ms = Value::Value(0);
        }
        if remote {
            if s.lanes.is_null() {
                s.lanes = Value::Value(1);
            }
            if s.paused.is_null() {
                s.paused = Value::Value(false);
            }
            s.kind = Value::Value("remote".into());
        } else {
            s.kind = match s.delay_ms {
                Value::Value(d) => Value::Value(if d > 0 { "delay" } else { "local" }.into()),
                _ => Value::Unknown,
            };
        }
        Some((s, ValueEmpty::Null))
    }

    async fn plan_update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: ChildState,
        proposed: ChildState,
        _config: ChildState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ChildState, ValueEmpty, Vec<AttributePath>)> {
        validate_child(diags, &proposed);
        let mut replace = vec![];
        for (field, a, b) in [
            ("parent", &prior.parent, &proposed.parent),
            ("child", &prior.child, &proposed.child),
            ("remote", &prior.remote, &proposed.remote),
            ("remote_topic", &prior.remote_topic, &proposed.remote_topic),
        ] {
            if a != b {
                replace.push(AttributePath::new(field));
            }
        }
        if prior.delay_ms != proposed.delay_ms {
            replace.push(AttributePath::new("delay_ms"));
        }
        if prior.lanes != proposed.lanes {
            replace.push(AttributePath::new("lanes"));
        }
        Some((proposed, private, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: ChildState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<ValueEmpty> {
        Some(private)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned: ChildState,
        _config: ChildState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ChildState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let (parent, child) = (known(&planned.parent)?, known(&planned.child)?);
        let mut body = json!({"child": child});
        if is_remote(&planned) {
            body["remote"] = json!(known(&planned.remote)?);
            body["remote_topic"] = json!(known(&planned.remote_topic)?);
            if let Value::Value(l) = planned.lanes {
                body["lanes"] = json!(l);
            }
        } else if let Value::Value(d) = planned.delay_ms {
            body["delay_ms"] = json!(d);
        }
        if let Value::Value(f) = &planned.from {
            body["from"] = json!(f);
        }
        if let Err(e) = api
            .call(
                Method::POST,
                &format!("/v1/topics/{parent}/children"),
                Some(&body),
            )
            .await
        {
            api_error(diags, &format!("attaching '{child}' to '{parent}'"), &e);
            return None;
        }
        let mut s = planned.clone();
        if matches!(planned.paused, Value::Value(true))
            && let Err(e) = set_paused(&api, &parent, &child, true).await
        {
            api_error(diags, &format!("pausing '{child}' of '{parent}'"), &e);
            s.paused = Value::Value(false);
        }
        match fetch(&api, &parent, &child).await {
            Ok(Some(j)) => s.absorb(&j),
            Ok(None) => diags.root_error_short(format!(
                "'{child}' is not listed among the children of '{parent}' right after the attach"
            )),
            Err(e) => api_error(diags, &format!("reading child '{child}' of '{parent}'"), &e),
        }
        Some((s, private))
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: ChildState,
        planned: ChildState,
        _config: ChildState,
        private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<(ChildState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let (parent, child) = (known(&prior.parent)?, known(&prior.child)?);
        if let (Value::Value(want), true) = (planned.paused, planned.paused != prior.paused)
            && let Err(e) = set_paused(&api, &parent, &child, want).await
        {
            let verb = if want { "pausing" } else { "resuming" };
            api_error(diags, &format!("{verb} '{child}' of '{parent}'"), &e);
            return None;
        }
        Some((planned, private))
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: ChildState,
        _private: ValueEmpty,
        _meta: ValueEmpty,
    ) -> Option<()> {
        let api = self.shared.api(diags)?;
        let (parent, child) = (known(&prior.parent)?, known(&prior.child)?);
        let q = if matches!(prior.force_destroy, Value::Value(true)) {
            "?force=true"
        } else {
            ""
        };
        destroy_at(
            &api,
            diags,
            &format!("/v1/topics/{parent}/children/{child}{q}"),
            &["not_a_child", "topic_not_found"],
            &format!("detaching '{child}' from '{parent}'"),
        )
        .await
    }

    async fn import<'a>(
        &self,
        diags: &mut Diagnostics,
        id: String,
    ) -> Option<(ChildState, ValueEmpty)> {
        let api = self.shared.api(diags)?;
        let Some((parent, child)) = id.split_once('/') else {
            diags.root_error(
                "Cannot import narad_child",
                format!("'{id}': import a child as PARENT/CHILD"),
            );
            return None;
        };
        match fetch(&api, parent, child).await {
            Ok(Some(j)) => {
                let mut s = ChildState {
                    id: Value::Value(id.clone()),
                    parent: Value::Value(parent.into()),
                    child: Value::Value(child.into()),
                    ..Default::default()
                };
                s.absorb(&j);
                Some((s, ValueEmpty::Null))
            }
            Ok(None) => {
                diags.root_error(
                    "Cannot import narad_child",
                    format!("'{child}' is not a child of '{parent}'"),
                );
                None
            }
            Err(e) => {
                api_error(diags, &format!("importing child '{id}'"), &e);
                None
            }
        }
    }
}
