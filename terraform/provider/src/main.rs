//! terraform-provider-narad: topics, users, remotes and fan-out children of a Narad broker
//! as Terraform resources, through the broker's HTTP API (docs/api.md).

mod child;
mod client;
mod remote;
mod topic;
mod user;
mod util;

use std::collections::HashMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{AttributeType, Block, Description, Schema};
use tf_provider::value::{Value, ValueEmpty};
use tf_provider::{AttributePath, Diagnostics, DynamicResource, Provider, map, serve};

use crate::client::{Api, Settings};
use crate::util::*;

#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[serde(default)]
pub struct ProviderConfig {
    pub endpoint: Value<String>,
    pub username: Value<String>,
    pub password: Value<String>,
    pub ca_file: Value<String>,
}

struct NaradProvider {
    shared: Shared,
}

/// The config's value, else the first environment variable set (non-empty).
fn or_env(v: &Value<String>, vars: &[&str]) -> Option<String> {
    known(v).or_else(|| {
        vars.iter()
            .find_map(|k| std::env::var(k).ok().filter(|s| !s.is_empty()))
    })
}

#[async_trait]
impl Provider for NaradProvider {
    type Config<'a> = ProviderConfig;
    type MetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeType::String as Str;
        Some(Schema {
            version: 1,
            block: Block {
                version: 1,
                description: Description::plain("Narad broker (HTTP API, HTTP Basic, TLS)."),
                attributes: map! {
                    "endpoint" => attr(Str, Optional, "Broker URL, http(s)://host:port. Default: NARAD_ADDR, else http://127.0.0.1:7942."),
                    "username" => attr(Str, Optional, "HTTP Basic user. Default: NARAD_USER."),
                    "password" => sensitive(attr(Str, Optional, "HTTP Basic password. Default: NARAD_PASSWORD.")),
                    "ca_file" => attr(Str, Optional, "PEM file of a CA to trust for an https:// broker, besides the system roots. Default: NARAD_CA_CERT."),
                },
                ..Default::default()
            },
        })
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: ProviderConfig) -> Option<()> {
        if let Value::Value(e) = &config.endpoint {
            let l = e.to_ascii_lowercase();
            if !(l.starts_with("http://") || l.starts_with("https://")) {
                diags.error(
                    "Invalid endpoint",
                    format!("'{e}' must start with http:// or https://"),
                    AttributePath::new("endpoint"),
                );
            }
        }
        Some(())
    }

    async fn configure<'a>(
        &self,
        diags: &mut Diagnostics,
        _terraform_version: String,
        config: ProviderConfig,
    ) -> Option<()> {
        // An unknown value (from a resource not created yet) fails only the calls that
        // need the broker, so plans that create everything still work.
        let unknown: Vec<&str> = [
            ("endpoint", &config.endpoint),
            ("username", &config.username),
            ("password", &config.password),
            ("ca_file", &config.ca_file),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_unknown())
        .map(|(k, _)| k)
        .collect();
        let api = if !unknown.is_empty() {
            Err(format!(
                "{} not known yet (it depends on a resource not created yet)",
                unknown.join(", ")
            ))
        } else {
            Api::new(Settings {
                endpoint: or_env(&config.endpoint, &["NARAD_ADDR"])
                    .unwrap_or_else(|| "http://127.0.0.1:7942".into()),
                username: or_env(&config.username, &["NARAD_USER"]),
                password: or_env(&config.password, &["NARAD_PASSWORD"]),
                ca_file: or_env(&config.ca_file, &["NARAD_CA_CERT"]),
            })
        };
        if let (Err(e), true) = (&api, unknown.is_empty()) {
            diags.root_error("Invalid narad provider configuration", e.clone());
        }
        self.shared.set(api);
        Some(())
    }

    fn get_resources(
        &self,
        _diags: &mut Diagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicResource>>> {
        let s = &self.shared;
        Some(map! {
            "topic" => topic::TopicResource { shared: s.clone() },
            "user" => user::UserResource { shared: s.clone() },
            "remote" => remote::RemoteResource { shared: s.clone() },
            "child" => child::ChildResource { shared: s.clone() },
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    serve(
        "narad",
        NaradProvider {
            shared: Shared::default(),
        },
    )
    .await
}
