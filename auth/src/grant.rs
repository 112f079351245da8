//! Actions, topic patterns and the checks built on them.

use serde::{Deserialize, Serialize};

/// Most grants one user may hold, and most patterns in one grant.
pub const MAX_GRANTS: usize = 64;
pub const MAX_PATTERNS: usize = 64;
/// Longest pattern: a topic name (255) plus the trailing `*`.
pub const MAX_PATTERN_LEN: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Produce single messages and batches.
    Produce,
    /// Consume, and ack / extend / nack what was consumed.
    Consume,
    /// Create topics whose name matches; the creator owns the topic.
    Create,
    /// Produce records carrying an origin (`narad-origin`): what another cluster's remote
    /// child sends when it mirrors a topic here. Give it to that cluster's user, beside
    /// `produce`; nobody else may write origins (they say where a record came from).
    Replicate,
    /// Everything, on every topic and user. Only the root user grants it.
    Admin,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Produce => "produce",
            Self::Consume => "consume",
            Self::Create => "create",
            Self::Replicate => "replicate",
            Self::Admin => "admin",
        }
    }
}

/// An action on the topics matching any of `patterns` (`admin` has none: it is global).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub action: Action,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
}

/// `pattern` is an exact topic name, or a prefix followed by `*` (`orders.*` matches
/// `orders.eu` but not `orders`; `*` matches every topic).
pub fn pattern_matches(pattern: &str, topic: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => topic.starts_with(prefix),
        None => pattern == topic,
    }
}

fn validate_pattern(p: &str) -> Result<(), String> {
    let body = p.strip_suffix('*').unwrap_or(p);
    if p.is_empty() || p.len() > MAX_PATTERN_LEN {
        return Err(format!(
            "pattern \"{p}\": must be 1 to {MAX_PATTERN_LEN} characters"
        ));
    }
    if !narad_core::topic::is_name_chars(body) {
        return Err(format!(
            "pattern \"{p}\": may contain only A-Z a-z 0-9 . _ - and one trailing *"
        ));
    }
    Ok(())
}

/// Checks a set of grants as given by a client.
pub fn validate_grants(grants: &[Grant]) -> Result<(), String> {
    if grants.len() > MAX_GRANTS {
        return Err(format!("at most {MAX_GRANTS} grants"));
    }
    for (i, g) in grants.iter().enumerate() {
        match g.action {
            Action::Admin if !g.patterns.is_empty() => {
                return Err(format!(
                    "grants[{i}]: admin is global and takes no patterns"
                ));
            }
            Action::Admin => {}
            _ if g.patterns.is_empty() => {
                return Err(format!(
                    "grants[{i}]: {} needs at least one topic pattern",
                    g.action.as_str()
                ));
            }
            _ if g.patterns.len() > MAX_PATTERNS => {
                return Err(format!(
                    "grants[{i}]: at most {MAX_PATTERNS} patterns per grant"
                ));
            }
            _ => {
                for p in &g.patterns {
                    validate_pattern(p).map_err(|e| format!("grants[{i}]: {e}"))?;
                }
            }
        }
    }
    Ok(())
}

pub fn is_admin(grants: &[Grant]) -> bool {
    grants.iter().any(|g| g.action == Action::Admin)
}

/// Whether `grants` allow `action` on `topic` (admin allows everything).
pub fn allows(grants: &[Grant], action: Action, topic: &str) -> bool {
    grants.iter().any(|g| {
        g.action == Action::Admin
            || (g.action == action && g.patterns.iter().any(|p| pattern_matches(p, topic)))
    })
}

/// Whether `grants` allow any topic action on `topic`: the topic is then visible in listings
/// and its metadata readable.
pub fn may_use(grants: &[Grant], topic: &str) -> bool {
    grants
        .iter()
        .any(|g| g.action == Action::Admin || g.patterns.iter().any(|p| pattern_matches(p, topic)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(action: Action, patterns: &[&str]) -> Grant {
        Grant {
            action,
            patterns: patterns.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn patterns_match_exact_or_prefix() {
        assert!(pattern_matches("orders", "orders"));
        assert!(!pattern_matches("orders", "orders2"));
        assert!(pattern_matches("invoices.*", "invoices.eu"));
        assert!(!pattern_matches("invoices.*", "invoices"));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("orders*", "orders"));
    }

    #[test]
    fn grants_validate() {
        assert!(validate_grants(&[g(Action::Admin, &[])]).is_ok());
        assert!(validate_grants(&[g(Action::Admin, &["x"])]).is_err());
        assert!(validate_grants(&[g(Action::Produce, &[])]).is_err());
        assert!(validate_grants(&[g(Action::Produce, &[""])]).is_err());
        assert!(validate_grants(&[g(Action::Produce, &["a*b"])]).is_err());
        assert!(validate_grants(&[g(Action::Produce, &["a b"])]).is_err());
        assert!(validate_grants(&[g(Action::Consume, &["orders-*", "*", "x.y_z"])]).is_ok());
        let long = "a".repeat(MAX_PATTERN_LEN + 1);
        assert!(validate_grants(&[g(Action::Create, &[&long])]).is_err());
    }

    #[test]
    fn allows_only_the_granted_action() {
        let gs = [g(Action::Produce, &["orders-*"])];
        assert!(allows(&gs, Action::Produce, "orders-eu"));
        assert!(!allows(&gs, Action::Consume, "orders-eu"));
        assert!(!allows(&gs, Action::Produce, "payments"));
        assert!(may_use(&gs, "orders-eu"));
        assert!(!may_use(&gs, "payments"));
        let admin = [g(Action::Admin, &[])];
        assert!(allows(&admin, Action::Create, "x"));
        assert!(may_use(&admin, "x"));
    }
}
