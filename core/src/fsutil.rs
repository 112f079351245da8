//! Small durable-file helpers: the one atomic-replace routine and private permissions.
//!
//! Everything Narad writes holds client data or secrets, so directories are created `0700`
//! and files `0600` (the process umask can only narrow these).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// Permission bits of every data file.
pub const FILE_MODE: u32 = 0o600;
/// Permission bits of every data directory.
pub const DIR_MODE: u32 = 0o700;

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content:
/// write a sibling temp file (mode `0600`), fsync it, rename it over `path`, fsync the
/// directory. The one copy of this routine: every metadata, index, cursor and queue file goes
/// through it.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = parent_dir(path);
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let _ = std::fs::remove_file(&tmp); // a leftover could carry other permissions
    let mut f = create_new_private(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}

/// The directory `path` is in: `.` for a bare file name (whose `parent()` is empty, which
/// names no directory to open and sync).
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Creates `path` (which must not exist) for writing, mode `0600`.
pub fn create_new_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Opens `path` for writing, creating it with mode `0600` if it is missing (never truncates).
pub fn open_or_create_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
}

/// `create_dir_all` with every directory it creates mode `0700`.
pub fn create_dir_private(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// Fsyncs a directory, making the names created, renamed or removed in it durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// From a black-box review: `--addr-file addr` (a bare name) wrote the file, then failed
    /// to sync its directory `""` and stopped the server.
    #[test]
    fn a_bare_file_name_is_in_the_current_directory() {
        assert_eq!(parent_dir(Path::new("addr")), Path::new("."));
        assert_eq!(parent_dir(Path::new("./addr")), Path::new("."));
        assert_eq!(parent_dir(Path::new("d/addr")), Path::new("d"));
        assert_eq!(parent_dir(Path::new("/addr")), Path::new("/"));
    }

    #[test]
    fn files_and_directories_are_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        create_dir_private(&dir).unwrap();
        let file = dir.join("f");
        write_file_atomic(&file, b"one").unwrap();
        write_file_atomic(&file, b"two").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"two");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
        assert!(!dir.join("f.tmp").exists());
    }
}
