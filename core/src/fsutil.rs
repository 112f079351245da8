//! Small durable-file helpers shared by the metadata stores.

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new content:
/// write a sibling temp file, fsync it, rename it over `path`, fsync the directory.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
