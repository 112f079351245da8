//! The deliveries journal of a partition: delivery counts written as they are handed out, so
//! that a process crash between two queue snapshots does not lose them.
//!
//! ```text
//!  consume ─► queue.take (count + 1) ─► reply built ─► journal.append (one write, page cache) ─► reply
//!  tick    ─► snapshot due? ─► capture queue state + rotate journal ─► write queue.state (fsync)
//!                                                                     └► delete covered journals
//!          └► else: fdatasync the journal if it grew (bounds what a power loss can cost)
//!  open    ─► queue.state ─► replay every journal file over it, max() per offset
//! ```
//!
//! Every record holds an absolute count, and replay keeps the highest count seen for an
//! offset, so replaying a journal over a snapshot never lowers a count, whatever their order:
//! a journal the snapshot already covers (a crash between writing the snapshot and deleting
//! the journal) changes nothing. Rotation happens in the same critical section as the capture
//! of the snapshot (see `Partition::persist_queue`): every count missing from a snapshot is in
//! a journal generation newer than the ones that snapshot lets go.
//!
//! File `deliveries.<generation, 20 digits>.journal`: magic `NRDDJ001`, then 16-byte records
//! `u64 offset, u32 count, u32 CRC32C(offset ‖ count)`. The files are ours but are read as
//! untrusted bytes: replay stops at the first record that is short, fails its CRC or has a
//! zero count (a torn tail), and a file without the magic is ignored.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A journal generation this large asks for a queue snapshot (which lets it go), so replay at
/// open reads at most about this much per generation.
pub(crate) const JOURNAL_SNAPSHOT_BYTES: u64 = 4 << 20;

/// While this many generations are on disk (snapshots keep failing), a snapshot does not
/// start a new one and no new file is created: the current file keeps growing instead of the
/// file count.
const MAX_GENERATIONS: usize = 16;

const MAGIC: &[u8; 8] = b"NRDDJ001";
pub(crate) const RECORD_LEN: usize = 16;
const PREFIX: &str = "deliveries.";
const SUFFIX: &str = ".journal";

fn file_name(generation: u64) -> String {
    format!("{PREFIX}{generation:020}{SUFFIX}")
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // (u64::MAX is no generation: the next one could not follow it)
    digits.parse().ok().filter(|&g| g != u64::MAX)
}

/// Appends the records of `entries` to `out`.
pub(crate) fn encode_records(entries: &[(u64, u32)], out: &mut Vec<u8>) {
    for &(offset, count) in entries {
        let start = out.len();
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// One record, or `None` if it is not one we wrote whole.
pub(crate) fn decode_record(rec: &[u8; RECORD_LEN]) -> Option<(u64, u32)> {
    let (body, crc) = rec.split_at(12);
    let crc = u32::from_le_bytes(crc.try_into().ok()?);
    if crc32c::crc32c(body) != crc {
        return None;
    }
    let offset = u64::from_le_bytes(body[..8].try_into().ok()?);
    let count = u32::from_le_bytes(body[8..].try_into().ok()?);
    (count > 0).then_some((offset, count))
}

/// What replaying one file found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    pub records: u64,
    /// Bytes after the last good record (a torn or damaged tail), or the whole file if it
    /// does not start with the magic.
    pub ignored_bytes: u64,
}

/// Feeds every good record of the first `len` bytes of `reader` to `apply`, stopping at the
/// first bad one. What follows a bad record is not read: it is counted from `len` (a large
/// damaged file costs no more than its good part).
pub(crate) fn replay(
    reader: impl Read,
    len: u64,
    mut apply: impl FnMut(u64, u32),
) -> std::io::Result<Replayed> {
    let mut reader = reader.take(len);
    let mut out = Replayed::default();
    let mut magic = [0u8; 8];
    let got = read_full(&mut reader, &mut magic)?;
    if got < magic.len() || &magic != MAGIC {
        out.ignored_bytes = len;
        return Ok(out);
    }
    let mut good = magic.len() as u64;
    let mut rec = [0u8; RECORD_LEN];
    loop {
        let got = read_full(&mut reader, &mut rec)?;
        if got == 0 {
            return Ok(out);
        }
        match (got == RECORD_LEN).then(|| decode_record(&rec)).flatten() {
            Some((offset, count)) => {
                apply(offset, count);
                out.records += 1;
                good += RECORD_LEN as u64;
            }
            None => {
                out.ignored_bytes = len - good;
                return Ok(out);
            }
        }
    }
}

/// Reads until `buf` is full or the input ends; returns how many bytes it read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The journal files of one partition directory and the one being written.
#[derive(Debug)]
pub(crate) struct DeliveryJournal {
    dir: PathBuf,
    /// The generation new records go to (its file is created on the first write).
    generation: u64,
    file: Option<File>,
    /// Bytes written to the current generation's file.
    len: u64,
    /// The current file has bytes no `fdatasync` covered yet.
    unsynced: bool,
    /// The current file's directory entry was made durable.
    named: bool,
    /// Generations whose file is (or may be) on disk.
    on_disk: BTreeSet<u64>,
    /// A write failed: appends fail at once until the next rotation (the snapshot that holds
    /// their counts), so a failing disk costs one attempt, and one file, per snapshot pass.
    broken: bool,
    /// The bytes of one append, kept between appends (no allocation per consume).
    buf: Vec<u8>,
}

/// A journal file to `fdatasync` outside the journal's lock.
pub(crate) struct PendingSync {
    file: File,
    dir: Option<PathBuf>,
}

impl PendingSync {
    /// Makes the journal's bytes (and, for a new file, its name) durable. Blocking.
    pub fn run(self) -> std::io::Result<()> {
        self.file.sync_data()?;
        match self.dir {
            Some(dir) => crate::fsutil::sync_dir(&dir),
            None => Ok(()),
        }
    }
}

impl DeliveryJournal {
    /// Replays every journal file in `dir` into `apply` (in no particular order: counts are
    /// merged with max) and returns the journal, set to write a new generation. Unreadable
    /// files are logged and skipped: the counts they held fall back to the snapshot's. Only a
    /// shortage of file descriptors fails the open (it says nothing of the files, and a
    /// journal that had not seen them would write over a generation still on disk). Blocking.
    pub fn open(dir: &Path, mut apply: impl FnMut(u64, u32)) -> std::io::Result<Self> {
        let mut on_disk = BTreeSet::new();
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                for e in entries.flatten() {
                    if let Some(generation) = e.file_name().to_str().and_then(parse_name) {
                        on_disk.insert(generation);
                    }
                }
            }
            Err(e) if crate::log::is_out_of_descriptors(&e) => return Err(e),
            Err(e) => {
                tracing::error!(dir = %dir.display(), error = %e, "cannot list the deliveries journals; delivery counts fall back to the queue snapshot");
            }
        }
        for &generation in &on_disk {
            let path = dir.join(file_name(generation));
            // Only a regular file is read: a link to a device or a FIFO (never written by us)
            // would block or never end, and keep the node from becoming ready.
            let result = match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => {
                    File::open(&path).and_then(|f| replay(BufReader::new(f), m.len(), &mut apply))
                }
                Ok(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "not a regular file",
                )),
                Err(e) => Err(e),
            };
            match result {
                Err(e) if crate::log::is_out_of_descriptors(&e) => return Err(e),
                Ok(r) if r.ignored_bytes > 0 => {
                    tracing::warn!(path = %path.display(), records = r.records, ignored_bytes = r.ignored_bytes, "deliveries journal ends in a torn or damaged tail; it was ignored");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "cannot read deliveries journal; its counts fall back to the queue snapshot");
                }
            }
        }
        let generation = on_disk.last().map_or(0, |g| g.saturating_add(1));
        Ok(Self {
            dir: dir.to_owned(),
            generation,
            file: None,
            len: 0,
            unsynced: false,
            named: false,
            on_disk,
            broken: false,
            buf: Vec::new(),
        })
    }

    /// Whether journal files are on disk (a snapshot would let them go).
    pub fn has_files(&self) -> bool {
        !self.on_disk.is_empty()
    }

    /// Whether the current generation is big enough to ask for a snapshot.
    pub fn wants_snapshot(&self) -> bool {
        self.len >= JOURNAL_SNAPSHOT_BYTES
    }

    /// Whether the maintenance pass has something to do: a snapshot, or an `fdatasync`.
    pub fn needs_work(&self) -> bool {
        self.unsynced || self.wants_snapshot()
    }

    /// Whether a journal file is open (holding a descriptor).
    pub fn has_open_file(&self) -> bool {
        self.file.is_some()
    }

    /// Appends `entries` with one positional write (the page cache: a process crash keeps
    /// it; `fdatasync` comes from [`Self::pending_sync`]). After a failure the next append
    /// starts a new generation, so a short write never misaligns later records.
    pub fn append(&mut self, entries: &[(u64, u32)]) -> std::io::Result<()> {
        if self.broken {
            return Err(std::io::Error::other(
                "an earlier journal write failed; waiting for the next queue snapshot",
            ));
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let result = (|| {
            if self.file.is_none() {
                if self.on_disk.len() >= MAX_GENERATIONS {
                    return Err(std::io::Error::other(
                        "too many deliveries journals wait for a queue snapshot",
                    ));
                }
                let path = self.dir.join(file_name(self.generation));
                let file = crate::fsutil::create_new_private(&path)?;
                self.on_disk.insert(self.generation);
                self.file = Some(file);
                self.len = 0;
                self.named = false;
            }
            if self.len == 0 {
                buf.extend_from_slice(MAGIC);
            }
            encode_records(entries, &mut buf);
            let file = self.file.as_ref().expect("opened above");
            file.write_all_at(&buf, self.len)
        })();
        let written = buf.len() as u64;
        // (a reply's worth of records: small; an unusually large one is not kept)
        if buf.capacity() <= 64 << 10 {
            self.buf = buf;
        }
        match result {
            Ok(()) => {
                self.len += written;
                self.unsynced = true;
                Ok(())
            }
            Err(e) => {
                self.next_generation();
                self.broken = true;
                Err(e)
            }
        }
    }

    fn next_generation(&mut self) {
        self.file = None;
        self.len = 0;
        self.unsynced = false;
        self.named = false;
        self.generation = self.generation.saturating_add(1);
    }

    /// Starts a new generation for later records (unless the current one is empty or too
    /// many are on disk) and returns the newest generation that holds only records written
    /// before now: once a queue snapshot captured now is durable, every generation up to it
    /// may go ([`Self::remove_through`]).
    pub fn rotate(&mut self) -> Option<u64> {
        if self.file.is_some() && self.on_disk.len() < MAX_GENERATIONS {
            self.next_generation();
        }
        self.broken = false;
        self.generation.checked_sub(1)
    }

    /// Deletes the files of every generation up to `covered`. A failed delete is logged and
    /// retried after the next snapshot (replaying a covered journal is harmless).
    pub fn remove_through(&mut self, covered: u64) {
        let gone: Vec<u64> = self.on_disk.range(..=covered).copied().collect();
        for generation in gone {
            let path = self.dir.join(file_name(generation));
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    self.on_disk.remove(&generation);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.on_disk.remove(&generation);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not delete a deliveries journal a snapshot covers");
                }
            }
        }
    }

    /// The `fdatasync` the current file needs, if it has unsynced bytes: run it without the
    /// journal's lock (appends go on meanwhile and are synced on the next call).
    pub fn pending_sync(&mut self) -> std::io::Result<Option<PendingSync>> {
        let Some(file) = self.file.as_ref().filter(|_| self.unsynced) else {
            return Ok(None);
        };
        let file = file.try_clone()?;
        self.unsynced = false;
        let dir = (!self.named).then(|| self.dir.clone());
        self.named = true;
        Ok(Some(PendingSync { file, dir }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn collect(bytes: &[u8]) -> (Vec<(u64, u32)>, Replayed) {
        let mut got = Vec::new();
        let r = replay(bytes, bytes.len() as u64, |o, c| got.push((o, c))).unwrap();
        (got, r)
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_ignored() {
        let mut bytes = MAGIC.to_vec();
        encode_records(&[(7, 1), (9, 3), (7, 2)], &mut bytes);
        let (got, r) = collect(&bytes);
        assert_eq!(got, vec![(7, 1), (9, 3), (7, 2)]);
        assert_eq!(r.ignored_bytes, 0);
        // a record cut short
        let (got, r) = collect(&bytes[..bytes.len() - 5]);
        assert_eq!(got, vec![(7, 1), (9, 3)]);
        assert_eq!(r.ignored_bytes, 11);
        // a damaged record stops the replay there
        let mut damaged = bytes.clone();
        damaged[8 + 16 + 3] ^= 0x40;
        let (got, _) = collect(&damaged);
        assert_eq!(got, vec![(7, 1)]);
        // no magic: nothing
        let (got, r) = collect(&bytes[1..]);
        assert!(got.is_empty());
        assert_eq!(r.ignored_bytes, bytes.len() as u64 - 1);
    }

    #[test]
    fn a_zero_count_is_not_a_record() {
        let mut bytes = MAGIC.to_vec();
        encode_records(&[(1, 0), (2, 1)], &mut bytes);
        assert!(collect(&bytes).0.is_empty());
    }

    #[test]
    fn generations_are_replayed_rotated_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = DeliveryJournal::open(dir.path(), |_, _| panic!("empty")).unwrap();
        assert_eq!(j.rotate(), None, "nothing written yet");
        j.append(&[(1, 1), (2, 1)]).unwrap();
        j.append(&[(1, 2)]).unwrap();
        let covered = j.rotate().unwrap();
        assert_eq!(covered, 0);
        j.append(&[(2, 2)]).unwrap();
        assert!(j.pending_sync().unwrap().is_some());
        assert!(j.pending_sync().unwrap().is_none(), "synced already");
        drop(j);
        let mut counts = BTreeMap::new();
        let mut j = DeliveryJournal::open(dir.path(), |o, c| {
            let e = counts.entry(o).or_insert(0);
            *e = c.max(*e);
        })
        .unwrap();
        assert_eq!(counts, BTreeMap::from([(1, 2), (2, 2)]));
        assert!(j.has_files());
        // nothing new since open: every file on disk is covered
        let covered = j.rotate().unwrap();
        assert_eq!(covered, 1);
        j.remove_through(covered);
        assert!(!j.has_files());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(names.is_empty(), "{names:?}");
    }

    /// Review of issue 12: a journal name that is a link to an endless device or a FIFO
    /// stalled the open forever (the node never became ready). Only regular files are read.
    #[test]
    fn journals_that_are_not_regular_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = DeliveryJournal::open(dir.path(), |_, _| {}).unwrap();
        j.append(&[(7, 3)]).unwrap();
        drop(j);
        std::os::unix::fs::symlink("/dev/zero", dir.path().join(file_name(5))).unwrap();
        let fifo = dir.path().join(file_name(6));
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let (done_tx, done) = std::sync::mpsc::channel();
        let path = dir.path().to_owned();
        std::thread::spawn(move || {
            let mut counts = Vec::new();
            let j = DeliveryJournal::open(&path, |o, c| counts.push((o, c))).unwrap();
            let _ = done_tx.send((counts, j.generation));
        });
        let (counts, generation) = done
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the open stalled on a journal that is not a regular file");
        assert_eq!(counts, vec![(7, 3)]);
        assert_eq!(generation, 7, "new writes go past every name on disk");
    }

    #[test]
    fn a_failed_write_waits_for_the_next_snapshot() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("p");
        std::fs::create_dir(&dir).unwrap();
        let mut j = DeliveryJournal::open(&dir, |_, _| {}).unwrap();
        j.append(&[(1, 1)]).unwrap();
        j.rotate();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            j.append(&[(2, 1)]).is_err(),
            "no directory to create the file in"
        );
        std::fs::create_dir(&dir).unwrap();
        assert!(j.append(&[(2, 1)]).is_err(), "no retry before the snapshot");
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
        j.rotate();
        j.append(&[(2, 2)]).unwrap();
        let mut got = Vec::new();
        DeliveryJournal::open(&dir, |o, c| got.push((o, c))).unwrap();
        assert_eq!(got, vec![(2, 2)]);
    }

    #[test]
    fn generations_on_disk_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = DeliveryJournal::open(dir.path(), |_, _| {}).unwrap();
        // snapshots that never become durable: nothing is removed
        for i in 0..40u64 {
            j.append(&[(i, 1)]).unwrap();
            j.rotate();
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            MAX_GENERATIONS
        );
        let mut got = Vec::new();
        DeliveryJournal::open(dir.path(), |o, _| got.push(o)).unwrap();
        got.sort_unstable();
        assert_eq!(
            got,
            (0..40).collect::<Vec<_>>(),
            "the last file kept growing"
        );
    }

    #[test]
    fn a_big_generation_asks_for_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = DeliveryJournal::open(dir.path(), |_, _| {}).unwrap();
        let n = JOURNAL_SNAPSHOT_BYTES / RECORD_LEN as u64;
        let entries: Vec<(u64, u32)> = (0..n - 1).map(|o| (o, 1)).collect();
        j.append(&entries).unwrap();
        assert!(!j.wants_snapshot());
        j.append(&[(n, 1)]).unwrap();
        assert!(j.wants_snapshot());
        j.rotate();
        assert!(!j.wants_snapshot());
    }

    #[test]
    fn journal_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut j = DeliveryJournal::open(dir.path(), |_, _| {}).unwrap();
        j.append(&[(1, 1)]).unwrap();
        let meta = std::fs::metadata(dir.path().join(file_name(0))).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn names_parse_strictly() {
        assert_eq!(parse_name(&file_name(42)), Some(42));
        assert_eq!(
            parse_name(&file_name(u64::MAX)),
            None,
            "no generation can follow it"
        );
        assert_eq!(parse_name("deliveries.42.journal"), None);
        assert_eq!(parse_name("deliveries.0000000000000000004a.journal"), None);
        assert_eq!(parse_name("deliveries.99999999999999999999.journal"), None);
        assert_eq!(parse_name("queue.state"), None);
    }

    proptest! {
        /// Any bytes: replay never panics, and yields only records that were written whole,
        /// in order, before the first damage.
        #[test]
        fn replay_of_any_bytes_is_a_prefix_of_good_records(
            entries in proptest::collection::vec((any::<u64>(), 1u32..), 0..20),
            cut in any::<prop::sample::Index>(),
            flip in proptest::option::of((any::<prop::sample::Index>(), 1u8..)),
            garbage in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bytes = MAGIC.to_vec();
            encode_records(&entries, &mut bytes);
            bytes.extend_from_slice(&garbage);
            let cut = cut.index(bytes.len() + 1);
            bytes.truncate(cut);
            if let Some((at, x)) = flip && !bytes.is_empty() {
                let at = at.index(bytes.len());
                bytes[at] ^= x;
            }
            let (got, r) = collect(&bytes);
            prop_assert!(got.len() <= entries.len());
            prop_assert_eq!(&got[..], &entries[..got.len()]);
            let used = if got.is_empty() && r.ignored_bytes == bytes.len() as u64 { 0 } else { 8 + got.len() * RECORD_LEN };
            prop_assert_eq!(used as u64 + r.ignored_bytes, bytes.len() as u64);
        }
    }
}
