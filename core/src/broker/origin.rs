//! Where a mirrored record came from: the headers a link writes on what it ships (its
//! origin, the hops before it, its original commit time) and how they are read back. Read by
//! the remote cursors (a link never ships a record back where it came from) and the fan-out
//! cursors (a promoted topic's child leaves out what its source's consumers processed).

use bytes::Bytes;

use crate::catalog::link::OriginFloor;
use crate::record::Record;

/// The header a mirrored record carries on the target: `<cluster>/<topic>/<partition>/<offset>`
/// of the copy it was shipped from (the cluster and topic ids in 16 hex digits). A target
/// refuses one naming itself.
pub const ORIGIN_HEADER: &str = "narad-origin";

/// The header a record forwarded again carries (re-protection: a promoted mirror ships what
/// it inherited to a third cluster): the origins it had at its earlier hops, oldest first,
/// comma separated. A link never ships a record to a topic its origin or these name (that
/// topic holds it), and a target refuses one naming itself anywhere (a loop).
pub const VIA_HEADER: &str = "narad-via";

/// The header a mirrored record carries on the target: its commit time (unix ms) on the
/// cluster it was first produced to. Its own timestamp on the target is its arrival there
/// (what replay by time and retention use); this keeps the original. Set at the first hop
/// (over whatever a producer put there) and kept at the later ones.
pub const ORIGIN_TIME_HEADER: &str = "narad-origin-time";

/// Most links one record goes through: one origin and at most `MAX_HOPS - 1` earlier ones.
pub const MAX_HOPS: usize = 8;

/// Where a record came from, as a link sees it.
pub(crate) enum Route {
    /// Written here.
    Own,
    /// Shipped here: its earlier hops, oldest first, then its origin.
    Through(Vec<Hop>),
    /// An origin this version cannot read (never forwarded).
    Unreadable,
}

/// One place a record sat: the topic (on its cluster), the partition and the offset.
pub(crate) type Hop = (crate::catalog::role::Source, u32, u64);

/// The last value of header `name` in `headers` (names in any case: the last one counts).
pub(crate) fn last_header<'a>(headers: &'a [(String, Bytes)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .rev()
        .find(|(h, _)| h.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_ref())
}

/// One hop `<cluster>/<topic>/<partition>/<offset>` (ids in 16 hex digits), as a sender
/// writes it in [`ORIGIN_HEADER`] and [`VIA_HEADER`].
pub(crate) fn parse_hop(v: &[u8]) -> Option<Hop> {
    let mut parts = std::str::from_utf8(v).ok()?.split('/');
    let hex = |s: Option<&str>| {
        s.filter(|s| s.len() == 16)
            .and_then(|s| u64::from_str_radix(s, 16).ok())
    };
    let cluster = hex(parts.next())?;
    let topic = hex(parts.next())?;
    let p = parts.next()?.parse().ok()?;
    let o = parts.next()?.parse().ok()?;
    parts
        .next()
        .is_none()
        .then_some((crate::catalog::role::Source { cluster, topic }, p, o))
}

/// The origin a record with `headers` names, if it carries one this version reads.
pub(crate) fn origin_of(headers: &[(String, Bytes)]) -> Option<Hop> {
    last_header(headers, ORIGIN_HEADER).and_then(parse_hop)
}

/// Where `r` sat in topic `topic` if it came from there or passed through it: the partition
/// and offset its origin or one of its earlier hops names there.
pub(crate) fn position_in(r: &Record, topic: u64) -> Option<(u32, u64)> {
    match route_of(r) {
        Route::Through(hops) => hops
            .into_iter()
            .find(|(s, _, _)| s.topic == topic)
            .map(|(_, p, o)| (p, o)),
        Route::Own | Route::Unreadable => None,
    }
}

/// Whether `r` came from topic `topic` or passed through it, or names an origin this
/// version cannot read.
pub(crate) fn came_through(r: &Record, topic: u64) -> bool {
    match route_of(r) {
        Route::Own => false,
        Route::Through(hops) => hops.iter().any(|(s, _, _)| s.topic == topic),
        Route::Unreadable => true,
    }
}

/// The route `r` came by (see [`ORIGIN_HEADER`] and [`VIA_HEADER`]).
pub(crate) fn route_of(r: &Record) -> Route {
    let Some(origin) = last_header(&r.headers, ORIGIN_HEADER) else {
        return Route::Own;
    };
    let hops = last_header(&r.headers, VIA_HEADER)
        .into_iter()
        .flat_map(|via| via.split(|&b| b == b','))
        .chain(std::iter::once(origin))
        .map(parse_hop)
        .collect::<Option<Vec<Hop>>>();
    match hops {
        Some(hops) => Route::Through(hops),
        None => Route::Unreadable,
    }
}

impl OriginFloor {
    /// Whether record `r` of the parent's partition `p` was processed by the child's
    /// consumers at the source (so it is not copied again).
    pub(crate) fn skips(&self, p: u32, r: &Record) -> bool {
        match super::origin::origin_of(&r.headers) {
            Some((src, op, o)) if src == self.source => {
                self.below.get(op as usize).is_some_and(|&b| o < b)
            }
            _ => self.own.get(p as usize).is_some_and(|&b| r.offset < b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_leaves_out_only_what_came_from_its_source_below_it() {
        let source = crate::catalog::role::Source {
            cluster: 0xa,
            topic: 0xb,
        };
        let floor = OriginFloor {
            source,
            below: vec![5, 0],
            own: vec![0, 7],
        };
        let record = |offset: u64, origin: Option<(u64, u32, u64)>| Record {
            offset,
            timestamp_ms: 0,
            key: None,
            headers: origin
                .map(|(cluster, p, o)| {
                    (
                        super::super::origin::ORIGIN_HEADER.to_owned(),
                        bytes::Bytes::from(format!("{cluster:016x}/{:016x}/{p}/{o}", 0xbu64)),
                    )
                })
                .into_iter()
                .collect(),
            payload: bytes::Bytes::new(),
            delay_ms: 0,
        };
        // from the source: by its partition and offset, whichever partition here
        assert!(floor.skips(1, &record(100, Some((0xa, 0, 4)))));
        assert!(!floor.skips(0, &record(0, Some((0xa, 0, 5)))));
        assert!(!floor.skips(0, &record(0, Some((0xa, 1, 0)))));
        assert!(
            !floor.skips(0, &record(0, Some((0xa, 2, 0)))),
            "a partition past the list"
        );
        // not from the source (its own, or from a third cluster): by its place here
        assert!(!floor.skips(0, &record(0, None)));
        assert!(floor.skips(1, &record(6, None)));
        assert!(floor.skips(1, &record(6, Some((0xc, 0, 0)))));
        assert!(!floor.skips(1, &record(7, None)));
        assert!(
            !floor.skips(2, &record(0, None)),
            "a partition past the list"
        );
    }
}
