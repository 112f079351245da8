//! What a cluster member knows of how far each partition was acknowledged, kept on its disk.
//!
//! A member remembers, per partition, one past the highest offset it saw acknowledged (the
//! produces it forwarded, and the durable ends owners report to it). An owner restored from
//! an older copy of its data directory asks the other members for these at its start (see
//! [`crate::moves`]), so they must survive the other members' own restarts: held only in
//! memory, a restored member and one other that restarted made a majority that remembered
//! nothing, and offsets that clients had been told of were handed out again.
//!
//! The file is `<data_dir>/acked-ends`, replaced atomically (mode `0600`), written by the
//! witness task at most every half second and only when something grew. One line per
//! partition, a header and a count line, so that a file that is not whole is recognised (and
//! ignored, with a warning: it can only say less than the others remember).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use narad_core::ids::PartitionId;

/// Per partition: one past the highest offset seen acknowledged.
pub type Ends = HashMap<PartitionId, u64>;

const HEADER: &str = "narad acked ends v1";
const FILE: &str = "acked-ends";

/// The file's path under `data_dir`.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE)
}

/// The ends the file holds; none if it does not exist. A file that is not whole (a header,
/// one well-formed line per entry and a matching count line) is ignored with a warning.
pub fn load(path: &Path) -> Ends {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ends::new(),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "the acknowledged ends this member remembered could not be read; it starts knowing only what it hears from now on");
            return Ends::new();
        }
    };
    match parse(&text) {
        Some(ends) => ends,
        None => {
            tracing::warn!(file = %path.display(), "the acknowledged ends this member remembered are not whole; ignored: it starts knowing only what it hears from now on");
            Ends::new()
        }
    }
}

fn parse(text: &str) -> Option<Ends> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut ends = Ends::new();
    for line in lines {
        let mut f = line.split(' ');
        match (f.next(), f.next(), f.next(), f.next()) {
            (Some("count"), Some(n), None, None) => {
                return (n.parse::<usize>().ok()? == ends.len()).then_some(ends);
            }
            (Some(t), Some(p), Some(e), None) => {
                let key = PartitionId::new(t.parse().ok()?, p.parse().ok()?);
                let end: u64 = e.parse().ok()?;
                let slot = ends.entry(key).or_insert(0);
                *slot = (*slot).max(end);
            }
            _ => return None,
        }
    }
    None
}

fn render(ends: &Ends) -> String {
    use std::fmt::Write as _;
    let mut entries: Vec<_> = ends.iter().collect();
    entries.sort_unstable();
    let mut out = String::with_capacity(24 * entries.len() + 32);
    out.push_str(HEADER);
    out.push('\n');
    for (k, e) in entries {
        let _ = writeln!(out, "{} {} {e}", k.topic, k.partition);
    }
    let _ = writeln!(out, "count {}", ends.len());
    out
}

/// Replaces the file with `ends` (atomically: the old content or the new survives a crash).
pub fn store(path: &Path, ends: &Ends) -> std::io::Result<()> {
    narad_core::fsutil::write_file_atomic(path, render(ends).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_survive_a_round_trip_and_a_file_cut_short_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        assert!(load(&path).is_empty(), "no file: nothing known");
        let ends: Ends = [
            (PartitionId::new(7, 0), 20),
            (PartitionId::new(7, 1), 0),
            (PartitionId::new(u64::MAX, u32::MAX), u64::MAX),
        ]
        .into();
        store(&path, &ends).unwrap();
        assert_eq!(load(&path), ends);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let whole = std::fs::read_to_string(&path).unwrap();
        // every shorter prefix, and a line that is not a number, is ignored as a whole
        for cut in 0..whole.len() - 1 {
            assert!(
                parse(&whole[..cut]).is_none(),
                "cut at {cut}: {:?}",
                &whole[..cut]
            );
        }
        assert!(parse(&whole.replace("7 0 20", "7 0 2x")).is_none());
        assert!(parse(&whole.replace("7 0 20", "7 0 20 1")).is_none());
        assert!(parse(&whole.replace("count 3", "count 2")).is_none());
        std::fs::write(&path, "garbage").unwrap();
        assert!(load(&path).is_empty());
    }
}
