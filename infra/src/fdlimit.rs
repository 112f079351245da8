//! The process's file-descriptor limit (RLIMIT_NOFILE) and how it is shared.
//!
//! ```text
//!  start ─► raise_nofile: soft limit := hard limit (when allowed)
//!        ─► plan(limit, config): reserve + connections + max_open_logs × 2 ≤ limit?
//!              max_open_logs = 0 ─► sized to what is left (FDS_PER_LOG each, ≤ AUTO_MAX_OPEN_LOGS)
//!              explicit and too big ─► refuse to start, naming the numbers
//! ```
//!
//! Descriptors go to client connections (one each, at most `max_connections`), open
//! partition logs (one per segment plus one for writing, at most `max_open_logs` logs) and a
//! reserve for everything else (listeners, stdio, metadata and user-store rewrites, log
//! recovery, archive uploads). Should the limit be reached anyway (another process's share
//! of a system-wide limit, logs with many segments), storage answers
//! `503 too_many_open_files` and the accept loop backs off: running out is a shortage that
//! passes, never a crash.

/// Descriptors kept for everything but connections and open logs.
pub const RESERVED_FDS: u64 = 64;
/// Descriptors an open log is budgeted when `max_open_logs` is sized automatically: the
/// write handle, the active segment and a couple of sealed ones.
pub const FDS_PER_LOG: u64 = 4;
/// The fewest descriptors an open log holds (write handle and active segment): an explicit
/// `max_open_logs` must fit at this rate.
pub const MIN_FDS_PER_LOG: u64 = 2;
/// Upper bound of an automatically sized `max_open_logs`: each open log also has a writer
/// task and a tail cache.
pub const AUTO_MAX_OPEN_LOGS: u64 = 65_536;
/// Lower bound of an automatically sized `max_open_logs` (a tiny limit still serves).
pub const AUTO_MIN_OPEN_LOGS: u64 = 8;

/// The file-descriptor limit after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoFile {
    /// The soft limit before raising it.
    pub before: u64,
    /// The soft limit in force now.
    pub soft: u64,
    /// The hard limit (`None`: unlimited).
    pub hard: Option<u64>,
}

/// Raises the soft RLIMIT_NOFILE to the hard limit, as servers that hold many files do
/// (the soft default is often 1024, far below the hard one); a failure (a platform cap
/// below the hard limit) leaves it as it was, with a log line.
pub fn raise_nofile() -> NoFile {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let cur = getrlimit(Resource::Nofile);
    // `None` is RLIM_INFINITY: as good as no limit
    let before = cur.current.unwrap_or(u64::MAX);
    let mut soft = before;
    if let Some(hard) = cur.maximum
        && hard > before
    {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        ) {
            Ok(()) => soft = hard,
            Err(e) => {
                tracing::warn!(soft = before, hard, error = %e, "could not raise the open-files limit to its hard value")
            }
        }
    }
    NoFile {
        before,
        soft,
        hard: cur.maximum,
    }
}

/// How the descriptor limit is shared; see [`plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub max_open_logs: usize,
    /// The connections served at once: `max_connections`, or the share of the limit this
    /// plan gives connections if that is less. At the cap a new client closes the idle
    /// connection idle the longest or is answered `503 too_many_connections`; past what the
    /// limit holds it would instead wait unseen while the accept loop backs off.
    pub max_connections: usize,
    /// Things an operator should hear about (logged as warnings at start).
    pub warnings: Vec<String>,
}

/// Shares `nofile` descriptors between the reserve, up to `max_connections` connections and
/// the open logs. `max_open_logs` 0 sizes the logs' share from what is left; an explicit
/// value that cannot fit (at [`MIN_FDS_PER_LOG`] each) is an error naming the numbers.
/// `max_connections` above that share is lowered to it (with a warning): a connection over
/// the limit could not be accepted, and idle keep-alive connections holding every
/// descriptor below a higher cap would shut new clients out until they time out.
pub fn plan(nofile: u64, max_connections: usize, max_open_logs: usize) -> Result<Plan, String> {
    let mut warnings = Vec::new();
    let connections = max_connections as u64;
    // connections may take at most half the limit in this budget
    let conn_share = connections.min(nofile / 2);
    if connections > conn_share {
        warnings.push(format!(
            "max_connections {connections} is more than half the open-files limit ({nofile}); serving at most {conn_share} connections at once (idle ones are closed for new clients, else 503 too_many_connections); raise the limit (ulimit -n, systemd LimitNOFILE=) to serve more"
        ));
    }
    let max_connections = usize::try_from(conn_share).unwrap_or(max_connections);
    let left = nofile.saturating_sub(RESERVED_FDS + conn_share);
    if max_open_logs == 0 {
        let auto = (left / FDS_PER_LOG).clamp(AUTO_MIN_OPEN_LOGS, AUTO_MAX_OPEN_LOGS);
        if left / FDS_PER_LOG < 64 {
            warnings.push(format!(
                "the open-files limit ({nofile}) leaves room for only {auto} open partition logs; raise it (ulimit -n, systemd LimitNOFILE=)"
            ));
        }
        return Ok(Plan {
            max_open_logs: auto as usize,
            max_connections,
            warnings,
        });
    }
    let need = max_open_logs as u64 * MIN_FDS_PER_LOG;
    if need > left {
        return Err(format!(
            "max_open_logs {max_open_logs} needs at least {need} file descriptors, but the open-files limit {nofile} leaves {left} after {RESERVED_FDS} reserved and {conn_share} for connections; lower max_open_logs (0 sizes it automatically) or max_connections, or raise the limit (ulimit -n, systemd LimitNOFILE=)"
        ));
    }
    Ok(Plan {
        max_open_logs,
        max_connections,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_sizing_takes_what_connections_and_the_reserve_leave() {
        let p = plan(1_048_576, 10_000, 0).unwrap();
        assert_eq!(p.max_open_logs, AUTO_MAX_OPEN_LOGS as usize);
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        let p = plan(65_536, 10_000, 0).unwrap();
        assert_eq!(p.max_open_logs, ((65_536 - 64 - 10_000) / 4) as usize);
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }

    #[test]
    fn a_small_limit_still_starts_and_says_so() {
        let p = plan(1024, 10_000, 0).unwrap();
        // connections get half, the reserve 64: (1024 - 64 - 512) / 4
        assert_eq!(p.max_open_logs, 112);
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(p.warnings[0].contains("max_connections"));
        // and serves no more connections than that share: idle ones make room for new
        // clients before descriptors run out
        assert_eq!(p.max_connections, 512);
        assert_eq!(plan(65_536, 10_000, 0).unwrap().max_connections, 10_000);
        let p = plan(64, 10_000, 0).unwrap();
        assert_eq!(p.max_open_logs, AUTO_MIN_OPEN_LOGS as usize);
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
    }

    #[test]
    fn an_explicit_bound_that_cannot_fit_refuses_to_start() {
        assert_eq!(plan(65_536, 1000, 20_000).unwrap().max_open_logs, 20_000);
        let e = plan(4096, 1000, 10_000).unwrap_err();
        assert!(e.contains("max_open_logs 10000"), "{e}");
        assert!(e.contains("4096"), "{e}");
    }
}
