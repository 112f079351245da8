//! Failpoints: named places where a test makes this process stall or misbehave, to reach
//! states that real faults reach only by chance (a move frozen too long, a flip whose answer
//! was lost). They are not configuration: they are set by the `NARAD_FAILPOINTS` environment
//! variable, `name=value` pairs separated by `;` (a bare `name` means on), read once when the
//! server starts, and honoured by debug builds only; a release build says it ignores them.
//!
//! | point | value | effect |
//! |---|---|---|
//! | `move.stall_before_freeze` | ms | a move's first attempt stalls right before it asks its source to freeze (a cancel can overtake the freeze) |
//! | `move.stall_frozen` | ms | ... once its source froze (a target too slow for the freeze) |
//! | `move.stall_flip` | ms | ... right before it proposes its flip (to kill a leader or the source then) |
//! | `move.lose_flip_reply` | on | a move's first flip answer is treated as lost (the mover asks the cluster) |
//! | `meta.snapshot_after` | entries | the metastore snapshots and purges its log after this many entries (default 5,000) |

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable that sets failpoints.
pub const ENV: &str = "NARAD_FAILPOINTS";

/// Every failpoint, and whether it takes a number (`true`) or is only on or off.
const KNOWN: &[(&str, bool)] = &[
    ("move.stall_before_freeze", true),
    ("move.stall_frozen", true),
    ("move.stall_flip", true),
    ("move.lose_flip_reply", false),
    ("meta.snapshot_after", true),
];

static POINTS: OnceLock<BTreeMap<&'static str, u64>> = OnceLock::new();

/// The failpoints `spec` sets (the value of [`ENV`]), or what is wrong with it: an unknown
/// point, a number missing or malformed, a point named twice.
pub fn parse(spec: &str) -> Result<BTreeMap<&'static str, u64>, String> {
    let mut points = BTreeMap::new();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = match item.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (item, None),
        };
        let Some(&(known, numeric)) = KNOWN.iter().find(|(k, _)| *k == name) else {
            let names: Vec<&str> = KNOWN.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "{ENV}: unknown failpoint '{name}' (known: {})",
                names.join(", ")
            ));
        };
        let value = match (numeric, value) {
            (true, Some(v)) => v
                .parse::<u64>()
                .map_err(|_| format!("{ENV}: {name} takes a whole number, got '{v}'"))?,
            (true, None) => return Err(format!("{ENV}: {name} takes a value ({name}=N)")),
            (false, None) => 1,
            (false, Some(v)) => return Err(format!("{ENV}: {name} takes no value, got '{v}'")),
        };
        if points.insert(known, value).is_some() {
            return Err(format!("{ENV}: {name} is set twice"));
        }
    }
    Ok(points)
}

/// Sets this process's failpoints from `spec` (the value of [`ENV`], if set), once: the
/// points now on, for the server to log. A release build takes none. A later call changes
/// nothing.
pub fn init(spec: Option<&str>) -> Result<Vec<String>, String> {
    let points = match spec {
        Some(s) => parse(s)?,
        None => BTreeMap::new(),
    };
    if !cfg!(debug_assertions) {
        if !points.is_empty() {
            tracing::warn!("{ENV} is set but this is a release build: failpoints are ignored");
        }
        let _ = POINTS.set(BTreeMap::new());
        return Ok(Vec::new());
    }
    let on = points.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = POINTS.set(points);
    Ok(on)
}

fn get(name: &str) -> Option<u64> {
    debug_assert!(KNOWN.iter().any(|(k, _)| *k == name), "failpoint {name}");
    POINTS.get()?.get(name).copied()
}

/// How long failpoint `name` stalls (zero when it is not set).
pub fn millis(name: &str) -> Duration {
    Duration::from_millis(get(name).unwrap_or(0))
}

/// The number failpoint `name` is set to, if it is.
pub fn number(name: &str) -> Option<u64> {
    get(name)
}

/// Whether failpoint `name` is on.
pub fn on(name: &str) -> bool {
    get(name).is_some_and(|v| v != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failpoints_are_read_and_mistakes_named() {
        let p = parse(" move.stall_flip=3000 ; move.lose_flip_reply;").unwrap();
        assert_eq!(p.get("move.stall_flip"), Some(&3000));
        assert_eq!(p.get("move.lose_flip_reply"), Some(&1));
        assert!(parse("").unwrap().is_empty());
        for (bad, says) in [
            ("move.stall_flap=1", "unknown failpoint 'move.stall_flap'"),
            ("move.stall_flip", "takes a value"),
            ("move.stall_flip=1s", "whole number"),
            ("move.lose_flip_reply=true", "takes no value"),
            ("meta.snapshot_after=8;meta.snapshot_after=9", "set twice"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
