//! CPU time of another process, from /proc (Linux).

use std::sync::OnceLock;

/// Clock ticks per second for /proc/<pid>/stat times (`getconf CLK_TCK`, 100 on Linux).
fn ticks_per_second() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// User + system CPU seconds used so far by `pid` (all its threads), or `None` if it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|ticks| ticks as f64 / ticks_per_second())
}

/// utime + stime (fields 14 and 15). The command name (field 2) may contain spaces and
/// parentheses, so fields are counted from the last ')'.
fn parse_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 → index 11
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let s = "1234 (we ird) name)) S 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 1";
        assert_eq!(parse_stat(s), Some(281));
        assert!(cpu_seconds(std::process::id()).is_some());
    }
}
