//! Strict query-string parsing: each route names the parameters it accepts; an unknown or
//! repeated parameter is a 400, never silently ignored.

use narad_wire::ErrorCode;
use std::borrow::Cow;
use std::time::Duration;

use super::ApiError;

/// The parameters of one query string, in the order given. Names are the route's own (a
/// linear scan of at most a handful); a value borrows the query string unless it had to be
/// decoded, so a plain query costs no allocation.
#[derive(Debug, Default)]
pub struct Query<'a> {
    params: Vec<(&'static str, Cow<'a, str>)>,
}

fn percent_decode(s: &str) -> Result<Cow<'_, str>, ApiError> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Ok(Cow::Borrowed(s));
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                // two hex digits, nothing else (`from_str_radix` alone would take "+1")
                let hex = bytes
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::InvalidQuery,
                            "bad percent-encoding in query string",
                        )
                    })?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| ApiError::new(ErrorCode::InvalidQuery, "query string is not valid UTF-8"))
}

impl<'a> Query<'a> {
    /// Parses `raw`, accepting only the parameter names in `allowed`.
    pub fn parse(raw: Option<&'a str>, allowed: &[&'static str]) -> Result<Self, ApiError> {
        let mut params: Vec<(&'static str, Cow<'a, str>)> = Vec::new();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = percent_decode(k)?;
            let Some(&name) = allowed.iter().find(|&&a| a == k) else {
                return Err(ApiError::new(
                    ErrorCode::UnknownParameter,
                    format!(
                        "unknown query parameter '{k}' (accepted: {})",
                        allowed.join(", ")
                    ),
                ));
            };
            if params.iter().any(|&(n, _)| n == name) {
                return Err(ApiError::new(
                    ErrorCode::DuplicateParameter,
                    format!("query parameter '{name}' is given more than once"),
                ));
            }
            // (at most one entry per allowed name: the list is bounded by the route)
            params.push((name, percent_decode(v)?));
        }
        Ok(Self { params })
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_ref())
    }

    pub fn has(&self, name: &str) -> bool {
        self.params.iter().any(|(n, _)| *n == name)
    }

    /// An unsigned integer parameter.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.str(name)
            .map(|v| {
                // digits only: `str::parse` would also take "+5"
                let digits = !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit());
                digits
                    .then(|| v.parse::<u64>().ok())
                    .flatten()
                    .ok_or_else(|| {
                        ApiError::new(
                            ErrorCode::InvalidParameter,
                            format!(
                                "query parameter '{name}' must be a non-negative integer, got '{v}'"
                            ),
                        )
                    })
            })
            .transpose()
    }

    /// A `true`/`false` parameter.
    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.str(name) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(v) => Err(ApiError::new(
                ErrorCode::InvalidParameter,
                format!("query parameter '{name}' must be true or false, got '{v}'"),
            )),
        }
    }

    pub fn u32(&self, name: &str) -> Result<Option<u32>, ApiError> {
        match self.u64(name)? {
            None => Ok(None),
            Some(v) => u32::try_from(v).map(Some).map_err(|_| {
                ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!("query parameter '{name}' is too large"),
                )
            }),
        }
    }
}

/// Parses a wait duration: `500ms`, `2s`, `1.5s`, `1m`, or a bare number of seconds. The
/// number is decimal digits with at most one `.` (no sign, exponent, spaces, `inf` or `NaN`).
pub fn parse_duration(v: &str) -> Option<Duration> {
    let (num, unit_ms) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = v.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (v, 1000.0)
    };
    let plain = num.bytes().any(|c| c.is_ascii_digit())
        && num.bytes().all(|c| c.is_ascii_digit() || c == b'.')
        && num.bytes().filter(|&c| c == b'.').count() <= 1;
    if !plain {
        return None;
    }
    let x: f64 = num.parse().ok()?;
    let ms = x * unit_ms;
    if ms > 1e12 {
        return Some(Duration::from_millis(1_000_000_000_000));
    }
    Some(Duration::from_millis(ms as u64))
}

/// Parses a point in time: RFC 3339 (`2026-11-29T10:00:00Z`, `...+01:00`, fractional seconds)
/// or unix milliseconds.
pub fn parse_time_ms(v: &str) -> Option<i64> {
    // unix milliseconds: digits, with a leading `-` for times before 1970 (not `+`)
    let unsigned = v.strip_prefix('-').unwrap_or(v);
    if !unsigned.is_empty() && unsigned.bytes().all(|c| c.is_ascii_digit()) {
        return v.parse::<i64>().ok();
    }
    let b = v.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    // digits only: `str::parse` would also take a sign ("+5")
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<i64>().ok())
            .flatten()
    };
    let year = num(v.get(0..4)?)?;
    let month = num(v.get(5..7)?)?;
    let day = num(v.get(8..10)?)?;
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let hour = num(v.get(11..13)?)?;
    let min = num(v.get(14..16)?)?;
    let sec = num(v.get(17..19)?)?;
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=12).contains(&month)
        || !(1..=month_days).contains(&day)
        || hour > 23
        || min > 59
        || sec > 60
    {
        return None;
    }
    let mut rest = &v[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let mut f = frac[..digits.min(3)].to_owned();
        while f.len() < 3 {
            f.push('0');
        }
        millis = f.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let (h, m) = (num(rest.get(1..3)?)?, num(rest.get(4..6)?)?);
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 60 + m)
        }
    };
    // days from civil (Howard Hinnant's algorithm)
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_min * 60;
    Some(secs * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_params() {
        let q = Query::parse(Some("key=a%20b&partition=2"), &["key", "partition"]).unwrap();
        assert_eq!(q.str("key"), Some("a b"));
        assert_eq!(q.u32("partition").unwrap(), Some(2));
        assert!(Query::parse(Some("key=a&key=b"), &["key"]).is_err());
        assert!(Query::parse(Some("nope=1"), &["key"]).is_err());
        for bad in [
            "partition=-1",
            "partition=%2B2",
            "partition=+2",
            "partition=",
            "partition=2x",
        ] {
            let q = Query::parse(Some(bad), &["partition"]).unwrap();
            assert!(q.u32("partition").is_err(), "{bad}");
        }
        // a name is matched decoded, so an escaped repeat is still a repeat
        let q = Query::parse(Some("k%65y=a+b&max"), &["key", "max"]).unwrap();
        assert_eq!((q.str("key"), q.str("max")), (Some("a b"), Some("")));
        assert!(q.has("max") && !q.has("wait"));
        let e = Query::parse(Some("key=a&k%65y=b"), &["key"]).unwrap_err();
        assert_eq!(e.code, ErrorCode::DuplicateParameter);
        let e = Query::parse(Some("key=%zz"), &["key"]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidQuery);
        for bad in ["key=%+1", "key=%-1", "key=%1", "key=%"] {
            let e = Query::parse(Some(bad), &["key"]).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidQuery, "{bad}");
        }
        let e = Query::parse(Some("key=%ff"), &["key"]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidQuery);
        // a plain value is the query string's own bytes
        let q = Query::parse(Some("key=abc"), &["key"]).unwrap();
        assert!(matches!(q.params[0].1, Cow::Borrowed("abc")));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_duration("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_duration("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration(".5"), Some(Duration::from_millis(500)));
        for bad in [
            "abc", "-1s", "", "1d", "NaNs", "+2s", "1e1", "1E1s", " 2", "2 ", "2 s", "inf", ".",
            "1.2.3", "0x10", "1_000ms",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn times() {
        assert_eq!(parse_time_ms("1700000000000"), Some(1_700_000_000_000));
        assert_eq!(parse_time_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_time_ms("2023-11-14T22:13:20Z"),
            Some(1_700_000_000_000)
        );
        assert_eq!(
            parse_time_ms("2023-11-14T22:13:20.5Z"),
            Some(1_700_000_000_500)
        );
        assert_eq!(
            parse_time_ms("2023-11-14T23:13:20+01:00"),
            Some(1_700_000_000_000)
        );
        assert_eq!(
            parse_time_ms("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
        assert_eq!(parse_time_ms("-1"), Some(-1), "unix ms before 1970");
        for bad in [
            "yesterday",
            "2023-13-01T00:00:00Z",
            "2023-11-14T22:13:20",
            "2026-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2023-04-31T00:00:00Z",
            "2023-11-14T22:13:20+99:00",
            "2023-11-14T22:13:20+01:60",
            "2023-11-14T22:13:20+1:000",
            "+023-11-14T22:13:20Z",
            "2023-+1-14T22:13:20Z",
            "2023-11-14T22:13:20.Z",
            "+1",
            "--1",
            "-",
            "99999999999999999999",
        ] {
            assert_eq!(parse_time_ms(bad), None, "{bad}");
        }
    }
}
