//! Small durable-file helpers shared by the metadata stores.

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content:
/// write a sibling temp file, fsync it, rename it over `path`, fsync the directory.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_file_atomic_mode(path, bytes, 0o644)
}

/// [`write_file_atomic`] creating the file with Unix permission bits `mode` (e.g. `0o600`
/// for secrets; the umask can only narrow them), whatever the old file had.
pub fn write_file_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let _ = std::fs::remove_file(&tmp); // a leftover could carry other permissions
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;

    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
