//! One segment file of a partition log, its sparse index and its recovery scan.
//!
//! A segment is `<base offset, 20 digits>.log`. When a segment is sealed its sparse index is
//! written beside it as `<base>.idx` so that opening a partition reads only the small index
//! files of sealed segments and scans only the active segment.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::record::{self, FRAME_HEADER_LEN, FRAME_MAGIC, FrameError, Record};

/// A sparse index entry every `INDEX_INTERVAL_BYTES` of log.
pub const INDEX_INTERVAL_BYTES: u64 = 4096;
const INDEX_MAGIC: &[u8; 8] = b"NRDIDX01";
/// The largest read a [`SegmentReader`] makes at once.
const READ_CHUNK: usize = 64 * 1024;
/// A reader's first read: a point read (a consume of one message) finds its record within
/// one index interval of where it starts, so this covers it and its neighbours without
/// copying (and zeroing) a whole [`READ_CHUNK`]; each later read doubles, up to that.
const FIRST_CHUNK: usize = 2 * INDEX_INTERVAL_BYTES as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the record at `pos`.
    pub offset: u64,
    /// Byte position of that record's frame in the segment file.
    pub pos: u64,
    /// Its commit timestamp (timestamps never decrease within a partition).
    pub timestamp_ms: i64,
}

#[derive(Debug, Clone, Default)]
pub struct SegmentMeta {
    /// Offset one past the last record in the segment.
    pub end: u64,
    /// Committed bytes: readers never look past this.
    pub size: u64,
    pub min_ts: Option<i64>,
    pub max_ts: Option<i64>,
    pub index: Vec<IndexEntry>,
    pub sealed: bool,
    /// Position of the last index entry, to space the next one.
    last_indexed_pos: Option<u64>,
}

impl SegmentMeta {
    pub fn new_empty(base: u64) -> Self {
        Self {
            end: base,
            ..Default::default()
        }
    }

    /// Notes a record appended at `pos` (its frame `len` bytes long).
    pub fn note_record(&mut self, offset: u64, pos: u64, len: u64, ts: i64) {
        let due = match self.last_indexed_pos {
            None => true,
            Some(p) => pos >= p + INDEX_INTERVAL_BYTES,
        };
        if due {
            self.index.push(IndexEntry {
                offset,
                pos,
                timestamp_ms: ts,
            });
            self.last_indexed_pos = Some(pos);
        }
        self.end = offset + 1;
        self.size = pos + len;
        self.min_ts.get_or_insert(ts);
        self.max_ts = Some(ts);
    }
}

#[derive(Debug)]
pub struct Segment {
    pub base: u64,
    pub path: PathBuf,
    /// Read handle; reads use positional IO so one handle serves every reader.
    pub file: File,
    pub meta: Mutex<SegmentMeta>,
}

/// Errors that make a partition refuse to open.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "corrupt frame in {path} at byte {pos} ({reason}) with valid frames after it; refusing to open"
    )]
    CorruptMiddle {
        path: PathBuf,
        pos: u64,
        reason: String,
    },
    #[error("segment {path} ends at offset {end} but the next segment starts at {next_base}")]
    Discontinuity {
        path: PathBuf,
        end: u64,
        next_base: u64,
    },
}

pub fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}

pub fn index_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.idx"))
}

/// Outcome of scanning a segment's bytes.
pub struct ScanResult {
    pub meta: SegmentMeta,
    /// `Some(pos)` when the bytes from `pos` on are a torn tail (no valid frame follows).
    pub torn_at: Option<u64>,
}

/// Scans `data` (a whole segment file) from the start, verifying every frame.
///
/// Returns the metadata of the valid prefix. A bad frame followed by nothing valid is a torn
/// tail; a bad frame with any valid frame after it is corruption in the middle.
pub fn scan(path: &Path, base: u64, data: &[u8]) -> Result<ScanResult, RecoveryError> {
    let mut meta = SegmentMeta::new_empty(base);
    let mut pos = 0usize;
    let mut expected = base;
    while pos < data.len() {
        let reason = match record::decode_frame(&data[pos..]) {
            Ok((rec, len)) if rec.offset == expected => {
                meta.note_record(rec.offset, pos as u64, len as u64, rec.timestamp_ms);
                pos += len;
                expected += 1;
                continue;
            }
            Ok((rec, _)) => format!("offset {} where {} was expected", rec.offset, expected),
            Err(e) => e.to_string(),
        };
        // The bytes inside a frame's declared extent are that frame's body, and its payload
        // is a client's bytes: it may hold anything, including a valid-looking frame. So a
        // frame that runs past the end of the file is a torn tail whatever it contains, and
        // the search for evidence of mid-log damage starts only past the declared extent.
        let search_from = match record::frame_len(&data[pos..]) {
            Ok(len) if len > data.len() - pos => {
                return Ok(ScanResult {
                    meta,
                    torn_at: Some(pos as u64),
                });
            }
            Ok(len) => pos + len,
            Err(_) => pos + 1,
        };
        if let Some(valid) = find_valid_frame(&data[search_from..]) {
            return Err(RecoveryError::CorruptMiddle {
                path: path.to_owned(),
                pos: pos as u64,
                reason: format!(
                    "{reason}; a valid frame starts at byte {}",
                    search_from + valid
                ),
            });
        }
        return Ok(ScanResult {
            meta,
            torn_at: Some(pos as u64),
        });
    }
    Ok(ScanResult {
        meta,
        torn_at: None,
    })
}

/// Position of the first byte in `data` where a complete, checksum-valid frame starts.
fn find_valid_frame(data: &[u8]) -> Option<usize> {
    let mut from = 0;
    while from + FRAME_HEADER_LEN <= data.len() {
        let rel = data[from..].windows(4).position(|w| w == FRAME_MAGIC)?;
        let at = from + rel;
        if record::decode_frame(&data[at..]).is_ok() {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// What a [`SegmentReader`] had buffered beyond where it stopped ([`SegmentReader::into_state`]),
/// to go on later without reading those bytes again ([`SegmentReader::resume`]). Only
/// meaningful for the same segment: its bytes below a size once read never change.
#[derive(Debug)]
pub struct ReaderState {
    pos: u64,
    buf: Vec<u8>,
    buf_start: u64,
    chunk: usize,
}

/// Sequential frame reader over a committed prefix of a segment, using positional reads.
pub struct SegmentReader<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
    buf: Vec<u8>,
    buf_start: u64,
    /// The size of the next read (before the frame at hand's own length).
    chunk: usize,
}

impl<'a> SegmentReader<'a> {
    pub fn new(file: &'a File, pos: u64, end: u64) -> Self {
        Self {
            file,
            pos,
            end,
            buf: Vec::new(),
            buf_start: pos,
            chunk: FIRST_CHUNK,
        }
    }

    /// A reader that goes on where an earlier one over the same segment stopped, with the
    /// bytes it had read past that point; `None` if those bytes are not all below `end`.
    pub fn resume(file: &'a File, state: ReaderState, end: u64) -> Option<Self> {
        let ReaderState {
            pos,
            buf,
            buf_start,
            chunk,
        } = state;
        (pos >= buf_start && buf_start + buf.len() as u64 <= end).then_some(Self {
            file,
            pos,
            end,
            buf,
            buf_start,
            chunk,
        })
    }

    /// Where this reader stopped, with the bytes it read past that point, if there are any
    /// and its buffer is at most `max_bytes` (a large frame's buffer is not kept).
    pub fn into_state(self, max_bytes: usize) -> Option<ReaderState> {
        let unread = (self.buf_start + self.buf.len() as u64).saturating_sub(self.pos);
        (unread > 0 && self.buf.capacity() <= max_bytes).then_some(ReaderState {
            pos: self.pos,
            buf: self.buf,
            buf_start: self.buf_start,
            chunk: self.chunk,
        })
    }

    /// Ensures bytes `[pos, pos + n)` are buffered.
    fn fill(&mut self, n: usize) -> io::Result<()> {
        let have_from = self.pos - self.buf_start;
        if (self.buf.len() as u64) >= have_from + n as u64 {
            return Ok(());
        }
        let want = n.max(self.chunk).min((self.end - self.pos) as usize);
        self.chunk = (self.chunk * 2).min(READ_CHUNK);
        let mut buf = vec![0u8; want];
        self.file.read_exact_at(&mut buf, self.pos)?;
        self.buf = buf;
        self.buf_start = self.pos;
        Ok(())
    }

    /// The next record and the position of its frame, or `None` at the end.
    pub fn next_record(&mut self) -> Result<Option<(Record, u64)>, ReadError> {
        self.next_record_from(0)
    }

    /// The next record whose offset is at least `min_offset`, and the position of its frame,
    /// or `None` at the end. The frames before it are checked whole (CRC included) but not
    /// decoded: a read from the middle of an index interval does not build the records it
    /// steps over.
    pub fn next_record_from(
        &mut self,
        min_offset: u64,
    ) -> Result<Option<(Record, u64)>, ReadError> {
        loop {
            let Some(len) = self.buffer_frame()? else {
                return Ok(None);
            };
            let at = self.pos;
            let corrupt = |e: FrameError| ReadError::Corrupt { pos: at, error: e };
            let off = (self.pos - self.buf_start) as usize;
            let frame = &self.buf[off..off + len];
            if min_offset > 0 && record::frame_offset(frame).map_err(corrupt)? < min_offset {
                self.pos += len as u64;
                continue;
            }
            let (rec, len) = record::decode_frame(frame).map_err(corrupt)?;
            self.pos += len as u64;
            return Ok(Some((rec, at)));
        }
    }

    /// Buffers the frame at `pos` whole and returns its length (from its header, not yet
    /// checked against its CRC); `None` at the end.
    fn buffer_frame(&mut self) -> Result<Option<usize>, ReadError> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let at = self.pos;
        let corrupt = |e: FrameError| ReadError::Corrupt { pos: at, error: e };
        if self.end - self.pos < FRAME_HEADER_LEN as u64 {
            return Err(corrupt(FrameError::Incomplete {
                need: FRAME_HEADER_LEN,
                have: (self.end - self.pos) as usize,
            }));
        }
        self.fill(FRAME_HEADER_LEN)?;
        let off = (self.pos - self.buf_start) as usize;
        let len = record::frame_len(&self.buf[off..]).map_err(corrupt)?;
        if self.pos + len as u64 > self.end {
            return Err(corrupt(FrameError::Incomplete {
                need: len,
                have: (self.end - self.pos) as usize,
            }));
        }
        self.fill(len)?;
        Ok(Some(len))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("io: {0}")]
    Io(#[from] io::Error),
    #[error("corrupt frame at byte {pos}: {error}")]
    Corrupt { pos: u64, error: FrameError },
}

/// Writes the sparse index of a sealed segment (temp file + rename; best effort: a missing or
/// invalid index is rebuilt by scanning the segment).
pub fn write_index(dir: &Path, base: u64, meta: &SegmentMeta) -> io::Result<()> {
    let mut out = Vec::with_capacity(64 + meta.index.len() * 24);
    out.extend_from_slice(INDEX_MAGIC);
    out.extend_from_slice(&base.to_le_bytes());
    out.extend_from_slice(&meta.end.to_le_bytes());
    out.extend_from_slice(&meta.size.to_le_bytes());
    out.extend_from_slice(&meta.min_ts.unwrap_or(i64::MIN).to_le_bytes());
    out.extend_from_slice(&meta.max_ts.unwrap_or(i64::MIN).to_le_bytes());
    out.extend_from_slice(&(meta.index.len() as u64).to_le_bytes());
    for e in &meta.index {
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.pos.to_le_bytes());
        out.extend_from_slice(&e.timestamp_ms.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    crate::fsutil::write_file_atomic(&index_path(dir, base), &out)
}

/// Loads a sealed segment's index if it is present, intact and matches `file_size`.
pub fn read_index(dir: &Path, base: u64, file_size: u64) -> Option<SegmentMeta> {
    let data = std::fs::read(index_path(dir, base)).ok()?;
    if data.len() < 8 + 6 * 8 + 4 {
        return None;
    }
    let (body, crc) = data.split_at(data.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().ok()?) || &body[..8] != INDEX_MAGIC
    {
        return None;
    }
    let u = |i: usize| u64::from_le_bytes(body[8 + i * 8..16 + i * 8].try_into().expect("8"));
    let (b, end, size, min_ts, max_ts, n) = (u(0), u(1), u(2), u(3) as i64, u(4) as i64, u(5));
    if b != base || size != file_size || end < base {
        return None;
    }
    let entries = &body[56..];
    if entries.len() as u64 != n.checked_mul(24)? {
        return None;
    }
    let index = entries
        .chunks_exact(24)
        .map(|c| IndexEntry {
            offset: u64::from_le_bytes(c[0..8].try_into().expect("8")),
            pos: u64::from_le_bytes(c[8..16].try_into().expect("8")),
            timestamp_ms: i64::from_le_bytes(c[16..24].try_into().expect("8")),
        })
        .collect::<Vec<_>>();
    let ts = |t: i64| (t != i64::MIN).then_some(t);
    Some(SegmentMeta {
        end,
        size,
        min_ts: ts(min_ts),
        max_ts: ts(max_ts),
        last_indexed_pos: index.last().map(|e| e.pos),
        index,
        sealed: true,
    })
}

/// The file listing a log's known gaps: offset ranges no record will ever fill (a partition
/// rebuilt from the archive after its owner was lost: the lost tail between the archive's end
/// and where the new log starts). Recovery accepts a discontinuity between two segments only
/// when this file names it; any other one is damage.
pub const GAPS_FILE: &str = "log.gaps";
const GAPS_MAGIC: &[u8; 8] = b"NRDGAP01";

/// Writes the gaps `[end, next_base)` of the log in `dir` (sorted, disjoint), durably (temp
/// file + rename + directory sync).
pub fn write_gaps(dir: &Path, gaps: &[(u64, u64)]) -> io::Result<()> {
    let mut out = Vec::with_capacity(20 + gaps.len() * 16);
    out.extend_from_slice(GAPS_MAGIC);
    out.extend_from_slice(&(gaps.len() as u64).to_le_bytes());
    for &(end, next) in gaps {
        out.extend_from_slice(&end.to_le_bytes());
        out.extend_from_slice(&next.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    crate::fsutil::write_file_atomic(&dir.join(GAPS_FILE), &out)
}

/// The gaps [`write_gaps`] recorded in `dir`: none when there is no file; an error when the
/// file is there but damaged (recovery then refuses every discontinuity, naming the file).
pub fn read_gaps(dir: &Path) -> io::Result<Vec<(u64, u64)>> {
    let path = dir.join(GAPS_FILE);
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let damaged = || io::Error::new(io::ErrorKind::InvalidData, "a damaged gaps file");
    if data.len() < 8 + 8 + 4 {
        return Err(damaged());
    }
    let (body, crc) = data.split_at(data.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4"))
        || &body[..8] != GAPS_MAGIC
    {
        return Err(damaged());
    }
    let n = u64::from_le_bytes(body[8..16].try_into().expect("8"));
    let entries = &body[16..];
    if Some(entries.len() as u64) != n.checked_mul(16) {
        return Err(damaged());
    }
    let gaps: Vec<(u64, u64)> = entries
        .chunks_exact(16)
        .map(|c| {
            (
                u64::from_le_bytes(c[..8].try_into().expect("8")),
                u64::from_le_bytes(c[8..].try_into().expect("8")),
            )
        })
        .collect();
    if gaps.iter().any(|&(s, e)| e <= s) || gaps.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(damaged());
    }
    Ok(gaps)
}

/// Writes `records` (offsets `base`, `base + 1`, ...) as a sealed segment of the log
/// in `dir`, with its index, and syncs both: what a rebuild from the archive puts back.
/// Returns the segment's end offset.
pub fn write_sealed(dir: &Path, base: u64, records: &[crate::record::Record]) -> io::Result<u64> {
    use std::io::Write;
    let mut meta = SegmentMeta::new_empty(base);
    let mut buf = Vec::new();
    let mut next = base;
    for r in records {
        if r.offset != next {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a segment's records follow each other from its base {base}: offset {} where {next} was due",
                    r.offset
                ),
            ));
        }
        // what a frame can hold (the archive's records came from frames, but its objects
        // are read back from outside): a record past it would be written damaged
        let frame_fits = r.headers.len() <= usize::from(u16::MAX)
            && r.headers
                .iter()
                .all(|(n, _)| n.len() <= usize::from(u16::MAX))
            && r.frame_len() <= crate::record::FRAME_HEADER_LEN + crate::record::MAX_BODY_LEN;
        if !frame_fits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the record at offset {} does not fit a frame", r.offset),
            ));
        }
        let pos = buf.len() as u64;
        crate::record::NewRecord {
            key: r.key.clone(),
            headers: r.headers.clone(),
            payload: r.payload.clone(),
            delay_ms: r.delay_ms,
        }
        .encode(r.offset, r.timestamp_ms, &mut buf);
        meta.note_record(r.offset, pos, buf.len() as u64 - pos, r.timestamp_ms);
        next = r.offset + 1;
    }
    meta.sealed = true;
    let path = segment_path(dir, base);
    let mut f = crate::fsutil::create_new_private(&path)?;
    f.write_all(&buf)?;
    f.sync_all()?;
    write_index(dir, base, &meta)?;
    Ok(meta.end)
}

pub fn open_read(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

pub use crate::fsutil::sync_dir;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::NewRecord;
    use bytes::Bytes;

    /// Storage fuzzing: a segment of valid frames, then one of three damages (a torn tail, bytes
    /// overwritten from some point on, garbage appended). Recovery must never panic or loop,
    /// never invent a record, and never drop a frame that lies wholly before the damage:
    /// either it keeps every such frame, or (valid frames after the damage) it refuses to open.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn segment(sizes: &[usize]) -> (Vec<u8>, Vec<usize>) {
            let mut out = Vec::new();
            let mut ends = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                NewRecord {
                    key: (i % 3 == 0).then(|| Bytes::from(format!("k{i}"))),
                    payload: Bytes::from(vec![(i % 251) as u8; n]),
                    ..Default::default()
                }
                .encode(7 + i as u64, 1000 + i as i64, &mut out);
                ends.push(out.len());
            }
            (out, ends)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(crate::record::fuzz_cases()))]
            #[test]
            fn recovery_never_drops_a_valid_frame(
                sizes in proptest::collection::vec(1usize..300, 1..30),
                kind in 0u8..3,
                at in any::<proptest::sample::Index>(),
                noise in proptest::collection::vec(any::<u8>(), 1..64),
            ) {
                let (mut data, ends) = segment(&sizes);
                let damaged_from = match kind {
                    0 => { let p = at.index(data.len()); data.truncate(p); p }
                    1 => {
                        let p = at.index(data.len());
                        for (i, b) in noise.iter().enumerate() {
                            if let Some(x) = data.get_mut(p + i) { *x ^= b | 1; }
                        }
                        p
                    }
                    _ => { let p = data.len(); data.extend_from_slice(&noise); p }
                };
                let intact = ends.iter().filter(|&&e| e <= damaged_from).count() as u64;
                match scan(Path::new("fuzz.log"), 7, &data) {
                    Ok(r) => {
                        let kept = r.meta.end - 7;
                        prop_assert!(kept >= intact, "kept {} of {} intact frames", kept, intact);
                        prop_assert!(kept <= sizes.len() as u64, "invented records");
                    }
                    // refusing to open is allowed only when valid frames follow the damage
                    Err(RecoveryError::CorruptMiddle { .. }) => prop_assert_eq!(kind, 1),
                    Err(e) => prop_assert!(false, "unexpected error {}", e),
                }
            }
        }
    }

    /// A reader started anywhere before a record finds it by stepping over the frames ahead
    /// of it, across reads of every size (frames larger than a whole read included) and
    /// through payloads that are themselves frames; a damaged frame it steps over is an
    /// error, not a skip.
    #[test]
    fn reading_from_an_offset_steps_over_earlier_frames() {
        let sizes = [
            10usize, 300, 5_000, 1, 70_000, 4_000, 200, 9_000, 130_000, 50, 3, 8_192,
        ];
        let mut data = Vec::new();
        let mut starts = Vec::new();
        let mut records = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let offset = 100 + i as u64;
            // odd payloads are frames with the offsets that follow
            let payload = if i % 2 == 1 {
                let mut fake = Vec::new();
                NewRecord {
                    payload: Bytes::from(vec![b'f'; n]),
                    ..Default::default()
                }
                .encode(offset + 1, 5, &mut fake);
                fake
            } else {
                vec![(i % 251) as u8; n]
            };
            let r = NewRecord {
                key: (i % 3 == 0).then(|| Bytes::from(format!("k{i}"))),
                payload: Bytes::from(payload),
                ..Default::default()
            };
            starts.push(data.len() as u64);
            r.encode(offset, 1000 + i as i64, &mut data);
            records.push(r);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("read.log");
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let end = data.len() as u64;
        for (from, &start) in starts.iter().enumerate() {
            for want in from..sizes.len() {
                let mut reader = SegmentReader::new(&file, start, end);
                let (rec, at) = reader
                    .next_record_from(100 + want as u64)
                    .unwrap()
                    .expect("a record");
                assert_eq!((rec.offset, at), (100 + want as u64, starts[want]));
                assert_eq!(rec.payload, records[want].payload);
                assert_eq!(rec.key, records[want].key);
                // and the reader goes on from there
                let next = reader.next_record().unwrap().map(|(r, _)| r.offset);
                let expect = (want + 1 < sizes.len()).then_some(101 + want as u64);
                assert_eq!(next, expect);
            }
        }
        let mut reader = SegmentReader::new(&file, 0, end);
        assert!(reader.next_record_from(1_000).unwrap().is_none());
        // a flipped bit in a frame stepped over stops the read
        let mut damaged = data.clone();
        damaged[starts[2] as usize + 40] ^= 4;
        std::fs::write(&path, &damaged).unwrap();
        let file = File::open(&path).unwrap();
        let mut reader = SegmentReader::new(&file, 0, end);
        assert!(matches!(
            reader.next_record_from(105),
            Err(ReadError::Corrupt { pos, .. }) if pos == starts[2]
        ));
    }

    /// Payloads are client bytes: a producer may send a payload that is itself a sequence of
    /// valid frames (with the very offsets that follow). A kill -9 that tears such a record
    /// must still recover as a torn tail: the partition opens, nothing before the tear is
    /// lost, and no frame inside a payload is ever taken for a record.
    mod fuzz_payload_frames {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(crate::record::fuzz_cases()))]
            #[test]
            fn a_torn_record_whose_payload_holds_frames_is_a_torn_tail(
                sizes in proptest::collection::vec(1usize..200, 1..12),
                inner in proptest::collection::vec(1usize..200, 1..6),
                at in any::<proptest::sample::Index>(),
                garbage in any::<bool>(),
            ) {
                let base = 3u64;
                let mut data = Vec::new();
                let mut ends = Vec::new();
                let n = sizes.len() as u64;
                for (i, &len) in sizes.iter().enumerate() {
                    let offset = base + i as u64;
                    // every other payload is a run of frames that would follow this record
                    let payload = if i % 2 == 1 {
                        let mut fake = Vec::new();
                        for (j, &m) in inner.iter().enumerate() {
                            NewRecord {
                                payload: Bytes::from(vec![b'f'; m]),
                                ..Default::default()
                            }
                            .encode(offset + 1 + j as u64, 5000, &mut fake);
                        }
                        fake
                    } else {
                        vec![b'p'; len]
                    };
                    NewRecord { payload: Bytes::from(payload), ..Default::default() }
                        .encode(offset, 1000 + i as i64, &mut data);
                    ends.push(data.len());
                }
                let cut = at.index(data.len());
                data.truncate(cut);
                if garbage {
                    data.extend_from_slice(&[0u8; 7]);
                }
                let intact = ends.iter().filter(|&&e| e <= cut).count() as u64;
                let r = scan(Path::new("payload.log"), base, &data);
                prop_assert!(r.is_ok(), "a torn tail refused to open: {:?}", r.err());
                let kept = r.expect("checked").meta.end - base;
                prop_assert_eq!(kept, intact);
                prop_assert!(kept <= n);
            }
        }
    }

    #[test]
    fn a_torn_frame_with_a_frame_in_its_payload_is_a_torn_tail() {
        let mut data = frames(0, 2);
        let mut fake = Vec::new();
        NewRecord {
            payload: Bytes::from_static(b"forged"),
            ..Default::default()
        }
        .encode(3, 1000, &mut fake);
        fake.extend_from_slice(&[b'z'; 64]);
        let whole = data.len();
        NewRecord {
            payload: Bytes::from(fake),
            ..Default::default()
        }
        .encode(2, 1000, &mut data);
        // torn after the forged frame but before the end of the real one
        data.truncate(data.len() - 10);
        let r = scan(Path::new("x"), 0, &data).expect("opens");
        assert_eq!(r.torn_at, Some(whole as u64));
        assert_eq!(r.meta.end, 2);
    }

    fn frames(base: u64, n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            NewRecord {
                payload: Bytes::from(vec![b'x'; 100 + i as usize]),
                ..Default::default()
            }
            .encode(base + i, 1000 + i as i64, &mut out);
        }
        out
    }

    #[test]
    fn scan_clean_segment() {
        let data = frames(10, 100);
        let r = scan(Path::new("x"), 10, &data).unwrap();
        assert!(r.torn_at.is_none());
        assert_eq!(r.meta.end, 110);
        assert_eq!(r.meta.size, data.len() as u64);
        assert!(r.meta.index.len() > 1);
        assert_eq!(r.meta.min_ts, Some(1000));
        assert_eq!(r.meta.max_ts, Some(1099));
    }

    #[test]
    fn scan_every_truncation_is_a_torn_tail() {
        let data = frames(0, 5);
        for cut in 0..data.len() {
            let r = scan(Path::new("x"), 0, &data[..cut]).unwrap();
            assert!(r.meta.size <= cut as u64);
            // every complete frame before the cut survives
            let full = frames(0, r.meta.end).len();
            assert_eq!(r.meta.size as usize, full);
        }
    }

    #[test]
    fn scan_zero_filled_tail_is_torn() {
        let mut data = frames(0, 5);
        let good = data.len();
        data.extend_from_slice(&[0u8; 4096]);
        let r = scan(Path::new("x"), 0, &data).unwrap();
        assert_eq!(r.torn_at, Some(good as u64));
        assert_eq!(r.meta.end, 5);
    }

    #[test]
    fn scan_refuses_corruption_in_the_middle() {
        let mut data = frames(0, 5);
        let second = frames(0, 1).len();
        data[second + 20] ^= 0xff;
        match scan(Path::new("seg.log"), 0, &data) {
            Err(RecoveryError::CorruptMiddle { pos, .. }) => assert_eq!(pos, second as u64),
            other => panic!(
                "expected corruption error, got {:?}",
                other.map(|r| r.torn_at)
            ),
        }
    }

    #[test]
    fn index_round_trip_and_rejects_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let data = frames(7, 200);
        let mut meta = scan(Path::new("x"), 7, &data).unwrap().meta;
        meta.sealed = true;
        write_index(dir.path(), 7, &meta).unwrap();
        let back = read_index(dir.path(), 7, data.len() as u64).unwrap();
        assert_eq!(back.index, meta.index);
        assert_eq!(back.end, 207);
        assert!(read_index(dir.path(), 7, data.len() as u64 + 1).is_none());
        assert!(read_index(dir.path(), 8, data.len() as u64).is_none());
    }
}
