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
