//! Shared bits: the configured client handed to every resource, diagnostics for API
//! errors, and the plan-time checks that mirror the broker's documented limits.

use std::sync::{Arc, RwLock};

use tf_provider::schema::{Attribute, AttributeConstraint, AttributeType, Description};
use tf_provider::value::Value;
use tf_provider::{AttributePath, Diagnostics};

use crate::client::{Api, ApiError};

/// The client, or why it could not be made.
type Configured = Result<Arc<Api>, String>;

/// The client, set by `configure`.
#[derive(Clone, Default)]
pub struct Shared(Arc<RwLock<Option<Configured>>>);

impl Shared {
    pub fn set(&self, api: Configured) {
        *self.0.write().expect("poisoned") = Some(api);
    }
    pub fn api(&self, diags: &mut Diagnostics) -> Option<Arc<Api>> {
        match &*self.0.read().expect("poisoned") {
            Some(Ok(api)) => Some(api.clone()),
            Some(Err(e)) => {
                diags.root_error("The narad provider is not configured", e.clone());
                None
            }
            None => {
                diags.root_error_short("The narad provider was not configured");
                None
            }
        }
    }
}

pub fn api_error(diags: &mut Diagnostics, what: &str, e: &ApiError) {
    diags.root_error(format!("{what}: {}", e.code), e.to_string());
}

/// `DELETE path` for a destroy: an object already gone (one of the `gone` error codes)
/// counts as destroyed; any other failure is reported as `what`.
pub async fn destroy_at(
    api: &crate::client::Api,
    diags: &mut Diagnostics,
    path: &str,
    gone: &[&str],
    what: &str,
) -> Option<()> {
    match api.call(reqwest::Method::DELETE, path, None).await {
        Ok(_) => Some(()),
        Err(e) if gone.iter().any(|c| e.is(c)) => Some(()),
        Err(e) => {
            api_error(diags, what, &e);
            None
        }
    }
}

// ---------------------------------------------------------------- schema helpers

pub fn attr(t: AttributeType, c: AttributeConstraint, desc: &str) -> Attribute {
    Attribute {
        attr_type: t,
        description: Description::plain(desc),
        constraint: c,
        sensitive: false,
        deprecated: false,
    }
}

pub fn sensitive(mut a: Attribute) -> Attribute {
    a.sensitive = true;
    a
}

pub use AttributeConstraint::{Computed, Optional, OptionalComputed, Required};

// ---------------------------------------------------------------- value helpers

/// A known value (not null, not unknown).
pub fn known<T: Clone>(v: &Value<T>) -> Option<T> {
    match v {
        Value::Value(x) => Some(x.clone()),
        _ => None,
    }
}

/// For an optional+computed attribute at create: the config's value, or unknown (the
/// broker's default, known after apply).
pub fn or_unknown<T>(v: Value<T>) -> Value<T> {
    match v {
        Value::Null => Value::Unknown,
        x => x,
    }
}

pub fn opt<T>(o: Option<T>) -> Value<T> {
    match o {
        Some(x) => Value::Value(x),
        None => Value::Null,
    }
}

// ---------------------------------------------------------------- validation

/// `^[A-Za-z0-9._-]{1,max}$`.
pub fn name_chars_ok(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

pub fn check_topic_name(diags: &mut Diagnostics, v: &Value<String>, field: &'static str) {
    if let Value::Value(s) = v
        && (!name_chars_ok(s, 200) || s == "." || s == "..")
    {
        diags.error(
            format!("Invalid {field}"),
            format!("'{s}' is not a topic name: ^[A-Za-z0-9._-]{{1,200}}$, not '.' or '..'"),
            AttributePath::new(field),
        );
    }
}

pub fn check_range(diags: &mut Diagnostics, v: &Value<i64>, field: &'static str, lo: i64, hi: i64) {
    if let Value::Value(n) = v
        && (*n < lo || *n > hi)
    {
        diags.error(
            format!("Invalid {field}"),
            format!("{field} = {n} is outside {lo}..={hi}"),
            AttributePath::new(field),
        );
    }
}
