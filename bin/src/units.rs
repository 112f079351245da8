//! Human units for the CLI: durations (`500ms`, `30s`, `15m`, `12h`, `7d`) and sizes
//! (`512B`, `64KiB`, `1MiB`, `2GiB`; `KB`/`MB`/`GB` are powers of 1000), read from flags and
//! printed in tables. A plain number keeps the unit the API uses: milliseconds or bytes.
//! `--output json` prints the server's JSON as it is, with no conversion.

const MS_UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

const BYTE_UNITS: [(&str, u64); 7] = [
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

/// Splits `12h` into (12, "h").
fn split(s: &str) -> (&str, &str) {
    let s = s.trim();
    let at = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    (&s[..at], s[at..].trim())
}

/// `s` as a number with an optional unit from `units` (a plain number has unit 1), or the
/// word `zero_word` for 0; `what` says what it should look like.
fn parse_units(s: &str, units: &[(&str, u64)], zero_word: &str, what: &str) -> Result<u64, String> {
    if s.trim() == zero_word {
        return Ok(0);
    }
    let (n, unit) = split(s);
    let n: u64 = n.parse().map_err(|_| format!("'{s}' is not {what}"))?;
    let mult = match unit {
        "" => 1,
        u => units
            .iter()
            .find(|(name, _)| *name == u)
            .map(|(_, m)| *m)
            .ok_or_else(|| {
                let names: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
                format!("'{s}': the units are {}", names.join(", "))
            })?,
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{s}' is out of range"))
}

/// A duration flag in milliseconds: `30s`, `7d`, `250ms`, or a plain number of milliseconds;
/// `forever` is 0 (for retention).
pub fn parse_ms(s: &str) -> Result<i64, String> {
    let what = "a duration (like 500ms, 30s, 15m, 12h, 7d)";
    let ms = parse_units(s, &MS_UNITS, "forever", what)?;
    i64::try_from(ms).map_err(|_| format!("'{s}' is out of range"))
}

/// A size flag in bytes: `1MiB`, `64KiB`, `2GB`, or a plain number of bytes; `unlimited` is 0
/// (for retention by size).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_units(
        s,
        &BYTE_UNITS,
        "unlimited",
        "a size (like 512B, 64KiB, 1MiB, 2GiB)",
    )
}

/// Milliseconds in the largest unit that says them exactly (`30000` → `30s`).
pub fn fmt_ms(ms: i64) -> String {
    let Ok(ms) = u64::try_from(ms) else {
        return format!("{ms}ms");
    };
    if ms == 0 {
        return "0s".into();
    }
    let (name, m) = MS_UNITS
        .iter()
        .find(|(_, m)| ms.is_multiple_of(*m))
        .expect("ms divides everything");
    format!("{}{name}", ms / m)
}

/// Unix milliseconds as a UTC time (`2026-12-07T15:30:00.250Z`; whole seconds without the
/// fraction).
pub fn fmt_time(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // the civil date of a day count (the proleptic Gregorian calendar, in 400-year eras)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, sec) = (rem / 3600, rem / 60 % 60, rem % 60);
    let frac = if milli == 0 {
        String::new()
    } else {
        format!(".{milli:03}")
    };
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{sec:02}{frac}Z")
}

/// Bytes in the largest binary unit that says them exactly (`1048576` → `1MiB`), else bytes.
pub fn fmt_bytes(b: u64) -> String {
    let (name, m) = BYTE_UNITS
        .iter()
        .filter(|(n, _)| n.ends_with("iB") || *n == "B")
        .find(|(_, m)| b.is_multiple_of(*m) && b >= *m)
        .unwrap_or(&("B", 1));
    format!("{}{name}", b / m)
}

/// Bytes rounded for reading (`8594` → `8.4KiB`).
pub fn fmt_bytes_about(b: u64) -> String {
    let (name, m) = BYTE_UNITS
        .iter()
        .filter(|(n, _)| n.ends_with("iB"))
        .find(|(_, m)| b >= *m)
        .unwrap_or(&("B", 1));
    if *m == 1 {
        format!("{b}B")
    } else {
        format!("{:.1}{name}", b as f64 / *m as f64)
    }
}

/// Rows under a header, each column as wide as its widest cell, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            out.push_str(c);
            if i < last {
                out.push_str(&" ".repeat(w - c.chars().count() + 2));
            }
        }
        out
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_and_print() {
        for (s, ms) in [
            ("30s", 30_000),
            ("7d", 604_800_000),
            ("12h", 43_200_000),
            ("15m", 900_000),
            ("250ms", 250),
            ("604800000", 604_800_000),
            ("forever", 0),
        ] {
            assert_eq!(parse_ms(s), Ok(ms), "{s}");
        }
        for bad in ["", "3 weeks", "1.5h", "-1s", "30S", "99999999999999999d"] {
            assert!(parse_ms(bad).is_err(), "{bad}");
        }
        for (ms, s) in [
            (30_000, "30s"),
            (604_800_000, "7d"),
            (1_500, "1500ms"),
            (0, "0s"),
        ] {
            assert_eq!(fmt_ms(ms), s);
            assert_eq!(parse_ms(&fmt_ms(ms)), Ok(ms), "round trip");
        }
    }

    #[test]
    fn times_print_in_utc() {
        for (ms, s) in [
            (0, "1970-01-01T00:00:00Z"),
            (1_733_585_400_250, "2024-12-07T15:30:00.250Z"),
            (951_782_400_000, "2000-02-29T00:00:00Z"),
            (4_107_542_399_999, "2100-02-28T23:59:59.999Z"),
            (-1, "1969-12-31T23:59:59.999Z"),
        ] {
            assert_eq!(fmt_time(ms), s, "{ms}");
        }
    }

    #[test]
    fn sizes_read_and_print() {
        for (s, b) in [
            ("1MiB", 1 << 20),
            ("64KiB", 64 << 10),
            ("2GB", 2_000_000_000),
            ("512B", 512),
            ("100", 100),
            ("unlimited", 0),
        ] {
            assert_eq!(parse_bytes(s), Ok(b), "{s}");
        }
        for bad in ["", "1 mib", "1.5MiB", "1TiB", "-1"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        for (b, s) in [
            (1 << 20, "1MiB"),
            (1000, "1000B"),
            (3 << 30, "3GiB"),
            (0, "0B"),
        ] {
            assert_eq!(fmt_bytes(b), s);
            assert_eq!(parse_bytes(&fmt_bytes(b)), Ok(b), "round trip");
        }
        assert_eq!(fmt_bytes_about(8594), "8.4KiB");
        assert_eq!(fmt_bytes_about(12), "12B");
    }

    #[test]
    fn columns_line_up_under_their_headers() {
        let t = table(
            &["NAME", "PARTITIONS", "RETENTION"],
            &[
                vec!["a-rather-long-name".into(), "3".into(), "7d".into()],
                vec!["b".into(), "256".into(), "forever".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        let col = |l: &str, text: &str| l.find(text).unwrap();
        assert_eq!(col(lines[0], "PARTITIONS"), col(lines[1], "3"));
        assert_eq!(col(lines[0], "PARTITIONS"), col(lines[2], "256"));
        assert_eq!(col(lines[0], "RETENTION"), col(lines[1], "7d"));
        assert_eq!(col(lines[0], "RETENTION"), col(lines[2], "forever"));
    }
}
