//! The cursor file of a fan-out or remote cursor: `fanout-<child>.<epoch>.offset` in the
//! parent partition's directory, written whole (temp file, rename, fsync). The epoch is the
//! attachment's: a file of another attachment is never resumed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::BrokerError;
use crate::log::LogError;

#[derive(Debug, Serialize, Deserialize)]
struct CursorFile {
    epoch: u64,
    next_offset: u64,
}

/// The cursor file of one attachment. The epoch is in the name: a cursor task of an earlier
/// attachment that is still finishing its last slab can only ever write its own file.
pub(super) fn cursor_path(parent_partition_dir: &Path, child: &str, epoch: u64) -> PathBuf {
    parent_partition_dir.join(format!("fanout-{child}.{epoch:016x}.offset"))
}

/// The child and attach epoch a cursor file (or its temp file) belongs to: the file name is
/// exactly `fanout-<child>.<16 hex digits>.offset[.tmp]`. Topic names may contain dots, so a
/// name is matched whole, never by prefix (`a-c` must not claim the cursor of its sibling
/// `a-c.x`).
fn cursor_file_of(file_name: &str) -> Option<(&str, u64)> {
    let rest = file_name.strip_prefix("fanout-")?;
    let rest = rest
        .strip_suffix(".offset.tmp")
        .or_else(|| rest.strip_suffix(".offset"))?;
    let (child, epoch) = rest.rsplit_once('.')?;
    if epoch.len() != 16 || !epoch.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((child, u64::from_str_radix(epoch, 16).ok()?))
}

/// Removes every cursor file of `child` in a parent partition directory (all epochs).
pub(crate) fn remove_cursor_files(parent_partition_dir: &Path, child: &str) {
    remove_cursor_files_but(parent_partition_dir, child, None);
}

/// Removes the cursor files of `child` in a parent partition directory, except those of
/// attachment `keep`.
pub(super) fn remove_cursor_files_but(parent_partition_dir: &Path, child: &str, keep: Option<u64>) {
    let Ok(entries) = std::fs::read_dir(parent_partition_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if let Some((c, epoch)) = cursor_file_of(&name.to_string_lossy())
            && c == child
            && Some(epoch) != keep
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

pub(super) fn read_cursor(path: &Path, epoch: u64) -> Option<u64> {
    let text = std::fs::read(path).ok()?;
    let c: CursorFile = serde_json::from_slice(&text).ok()?;
    (c.epoch == epoch).then_some(c.next_offset)
}

pub(super) fn write_cursor(path: &Path, epoch: u64, next_offset: u64) -> std::io::Result<()> {
    // (the epoch in the file name makes the temp file per attachment too)
    let body = serde_json::to_vec(&CursorFile { epoch, next_offset }).expect("cursor serialises");
    crate::fsutil::write_file_atomic(path, &body)
}

pub(super) async fn persist(path: &Path, epoch: u64, next: u64) -> Result<(), BrokerError> {
    let p = path.to_owned();
    tokio::task::spawn_blocking(move || write_cursor(&p, epoch, next))
        .await
        .expect("cursor write task")
        .map_err(|source| {
            LogError::Io {
                path: path.to_owned(),
                source,
            }
            .into()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_files_match_whole_child_names() {
        let dir = tempfile::tempdir().unwrap();
        let (a, sibling) = ("a-c", "a-c.x");
        write_cursor(&cursor_path(dir.path(), a, 0x11), 0x11, 5).unwrap();
        write_cursor(&cursor_path(dir.path(), sibling, 0x22), 0x22, 7).unwrap();
        std::fs::write(dir.path().join("fanout-a-c.x.tmp"), b"not a cursor").unwrap();
        assert_eq!(
            cursor_file_of("fanout-a-c.x.0000000000000022.offset"),
            Some((sibling, 0x22))
        );
        assert_eq!(
            cursor_file_of("fanout-a-c.0000000000000011.offset.tmp"),
            Some((a, 0x11))
        );
        assert_eq!(cursor_file_of("fanout-a-c.x.tmp"), None);
        remove_cursor_files(dir.path(), a);
        assert!(!cursor_path(dir.path(), a, 0x11).exists());
        assert_eq!(
            read_cursor(&cursor_path(dir.path(), sibling, 0x22), 0x22),
            Some(7)
        );
        assert!(dir.path().join("fanout-a-c.x.tmp").exists());
    }
}
