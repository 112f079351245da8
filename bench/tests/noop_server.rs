//! The `narad-bench noop-server` binary as `scripts/bench-peers` runs it: it writes its
//! address to `--addr-file`, answers there, and exits 0 on SIGTERM.

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_narad-bench");

/// Pauses between two looks of a poll with a deadline: the server is a real process on the
/// system clock, so waiting for it takes real time; every caller loops on a condition.
fn poll_pause() {
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(Duration::from_millis(20));
}

/// Kills the server if the test fails before it stopped it.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn writes_its_address_answers_there_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let addr_file = dir.path().join("noop.addr");
    let mut server = Reap(
        Command::new(BIN)
            .args(["noop-server", "--addr-file"])
            .arg(&addr_file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let child = &mut server.0;
    let deadline = Instant::now() + Duration::from_secs(30);
    let addr = loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            break a;
        }
        assert!(child.try_wait().unwrap().is_none(), "exited early");
        assert!(Instant::now() < deadline, "never wrote its address");
        poll_pause();
    };

    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.write_all(b"POST /v1/topics/t/produce HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 202 Accepted\r\n"), "{reply}");
    assert!(reply.ends_with(narad_bench::noop::REPLY), "{reply}");

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exited with {status}");
            break;
        }
        assert!(Instant::now() < deadline, "did not stop on SIGTERM");
        poll_pause();
    }
}
