//! What the peers of some TCP sockets have not yet acknowledged, from the kernel's tables of
//! this process's network namespace (`/proc/self/net/tcp` and `tcp6`): their `tx_queue`
//! column, the bytes written to the socket that the peer has not acknowledged
//! (`write_seq - snd_una`).
//!
//! A reader that takes any of its response lowers it, even while the server's writer sleeps
//! because the kernel grew the socket's send buffer to megabytes (the writer is woken only
//! once a third of it is free, which a slow reader may take seconds to make). So it tells a
//! slow reader from one that stopped, where the writer's own view cannot
//! ([`crate::limits::ConnectionLimiter::cut_stalled_reply`]).
//!
//! Reading the tables costs time in proportion to the sockets the namespace holds (about
//! 150 bytes of text each), so it is done only on that rare path, on the blocking pool.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader};

/// The kernel's TCP tables for IPv4 and IPv6 sockets of this process's network namespace.
const TABLES: [&str; 2] = ["/proc/self/net/tcp", "/proc/self/net/tcp6"];

/// The unacknowledged bytes of each socket of `inodes` (socket inode numbers, as `fstat`
/// gives them) that the tables hold; a socket they do not hold is left out. An error if
/// neither table could be read (no procfs).
pub fn unacked(inodes: &[u64]) -> io::Result<HashMap<u64, u64>> {
    let mut found = HashMap::with_capacity(inodes.len());
    let mut failed = None;
    let mut read_one = false;
    for path in TABLES {
        match std::fs::File::open(path) {
            Ok(file) => {
                scan(BufReader::new(file), inodes, &mut found)?;
                read_one = true;
            }
            Err(e) => failed = Some(e),
        }
        if found.len() == inodes.len() {
            break;
        }
    }
    match (read_one, failed) {
        (false, Some(e)) => Err(e),
        _ => Ok(found),
    }
}

/// Reads a table from `r`, noting the sockets of `inodes` in `found`. Lines that do not parse
/// (the header among them) are skipped; stops once every socket is found.
fn scan(mut r: impl BufRead, inodes: &[u64], found: &mut HashMap<u64, u64>) -> io::Result<()> {
    let mut line = String::new();
    while found.len() < inodes.len() {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        if let Some((inode, tx)) = parse_line(&line)
            && inodes.contains(&inode)
        {
            found.insert(inode, tx);
        }
    }
    Ok(())
}

/// A socket's line: `sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt
/// uid timeout inode ...` (hexadecimal queues, decimal inode), as its inode and `tx_queue`.
fn parse_line(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_ascii_whitespace();
    // the header's first field is "sl"; a socket's is its slot number and a colon
    fields.next()?.strip_suffix(':')?;
    let queues = fields.nth(3)?;
    let (tx, _rx) = queues.split_once(':')?;
    let tx = u64::from_str_radix(tx, 16).ok()?;
    let inode: u64 = fields.nth(4)?.parse().ok()?;
    (inode != 0).then_some((inode, tx))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 003D0900:00000000 01:00000014 00000000  1000        0 777 2 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:C351 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0000000000000000
   3: garbage
   4: 0100007F:1F90 0100007F:C352 01 zz:00000000 01:00000014 00000000  1000        0 778 2
";

    #[test]
    fn lines_are_read_by_inode_and_the_rest_skipped() {
        let mut found = HashMap::new();
        scan(TABLE.as_bytes(), &[777, 4242, 778, 9], &mut found).unwrap();
        // 0x3D0900 bytes unacknowledged on 777, none on the listener; the time-wait socket
        // (inode 0), the short line and the bad queue are skipped; 9 is not there
        assert_eq!(found, HashMap::from([(777, 0x3D0900), (4242, 0)]));
        assert_eq!(parse_line(TABLE.lines().next().unwrap()), None);
    }

    #[test]
    fn a_scan_stops_once_every_socket_is_found() {
        let mut found = HashMap::new();
        // (a reader that would fail past the second line)
        let r = io::Read::chain(TABLE.as_bytes(), FailingReader);
        scan(BufReader::new(r), &[4242], &mut found).unwrap();
        assert_eq!(found, HashMap::from([(4242, 0)]));
    }

    struct FailingReader;
    impl io::Read for FailingReader {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("read past what was needed"))
        }
    }

    /// The kernel's own figures: a socket whose peer reads nothing holds what was written to
    /// it, and less once the peer reads.
    #[test]
    fn a_socket_whose_peer_reads_shows_less_unacknowledged() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        client.set_recv_buffer_size(4096).unwrap();
        client
            .connect(&listener.local_addr().unwrap().into())
            .unwrap();
        let mut client: std::net::TcpStream = client.into();
        let (mut server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 64 << 10];
        let mut written = 0;
        loop {
            match server.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let inode = rustix::fs::fstat(server.as_fd()).unwrap().st_ino;
        let before = unacked(&[inode]).unwrap()[&inode];
        assert!(
            before > 0 && before <= written as u64,
            "{before} of {written}"
        );
        // the client reads what it was sent: the kernel sends and the client acknowledges
        // more, so less is left unacknowledged (polled with a deadline)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = client.read(&mut buf).unwrap();
            assert!(n > 0);
            let now = unacked(&[inode]).unwrap()[&inode];
            if now < before {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "still {now} of {before}"
            );
        }
        assert_eq!(unacked(&[]).unwrap(), HashMap::new());
    }
}
