//! What a server process needs whether it runs one member or a dev cluster: its address
//! file and its shutdown signal.

/// Writes `addr` to `--addr-file` whole (`fsutil::write_file_atomic`: a sibling temporary
/// file created new, renamed over it), so a reader polling for the file never sees a part of
/// it, and a link or another file planted at the temporary name is never written through.
pub fn write_addr_file(path: &std::path::Path, addr: &str) -> std::io::Result<()> {
    narad_core::fsutil::write_file_atomic(path, addr.as_bytes())
}

pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// From the black-box review: the temporary file was `<path with extension tmp>`, opened
    /// without `O_EXCL`: a symbolic link planted there had its target overwritten, and a
    /// `broker.tmp` beside `broker.addr` was replaced.
    #[test]
    fn the_addr_file_is_never_written_through_a_planted_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.addr");
        let precious = dir.path().join("precious");
        std::fs::write(&precious, "keep me").unwrap();
        // the old temporary name: another file, left alone
        let sibling = dir.path().join("broker.tmp");
        std::fs::write(&sibling, "mine").unwrap();
        // a link planted at the temporary name: never written through
        std::os::unix::fs::symlink(&precious, dir.path().join("broker.addr.tmp")).unwrap();
        write_addr_file(&path, "127.0.0.1:1").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "127.0.0.1:1");
        assert_eq!(std::fs::read_to_string(&sibling).unwrap(), "mine");
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
        assert!(!path.symlink_metadata().unwrap().file_type().is_symlink());
    }
}
