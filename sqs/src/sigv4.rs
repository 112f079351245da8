//! AWS Signature Version 4, the server's side: a request's `Authorization` header read,
//! its canonical request rebuilt, and its signature checked against the key derived from
//! the caller's secret. Signing is here too, for the benchmark's driver and the tests.
//!
//! The canonical request is the method, the path, the sorted query, each signed header as
//! `name:value` (lower-case name, value trimmed with inner runs of spaces made one), the list
//! of signed headers, and the hex SHA-256 of the body (SQS clients send no
//! `x-amz-content-sha256`: the body is hashed here). The string to sign is the algorithm,
//! `X-Amz-Date`, the scope (`date/region/service/aws4_request`) and the canonical request's
//! hex SHA-256. The key is HMAC-SHA-256 chained over `"AWS4" + secret`, the date, the region,
//! the service and `aws4_request`.

use aws_lc_rs::{constant_time, digest, hmac};

use crate::error::{Kind, SqsError};
use crate::limits::MAX_CLOCK_SKEW_S;
use crate::md5::hex;

pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The service name in an SQS request's scope.
pub const SERVICE: &str = "sqs";

/// A parsed `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorization<'a> {
    pub access_key: &'a str,
    /// `yyyymmdd`.
    pub date: &'a str,
    pub region: &'a str,
    pub service: &'a str,
    /// Lower-case, in the order given (which must be sorted).
    pub signed_headers: Vec<&'a str>,
    /// 64 hex digits.
    pub signature: &'a str,
}

fn incomplete(why: &str) -> SqsError {
    SqsError::new(
        Kind::IncompleteSignature,
        format!("The request signature does not conform to AWS standards: {why}"),
    )
}

/// Reads `AWS4-HMAC-SHA256 Credential=AKID/date/region/service/aws4_request,
/// SignedHeaders=a;b, Signature=hex`.
pub fn parse_authorization(header: &str) -> Result<Authorization<'_>, SqsError> {
    let rest = header
        .strip_prefix(ALGORITHM)
        .filter(|r| r.starts_with(' '))
        .ok_or_else(|| incomplete("the algorithm must be AWS4-HMAC-SHA256"))?;
    let (mut credential, mut signed, mut signature) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim();
        let Some((k, v)) = part.split_once('=') else {
            return Err(incomplete("a part is not key=value"));
        };
        let slot = match k {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed,
            "Signature" => &mut signature,
            _ => return Err(incomplete("an unknown part")),
        };
        if slot.replace(v).is_some() {
            return Err(incomplete("a part is repeated"));
        }
    }
    let credential = credential.ok_or_else(|| incomplete("Credential is missing"))?;
    let signed = signed.ok_or_else(|| incomplete("SignedHeaders is missing"))?;
    let signature = signature.ok_or_else(|| incomplete("Signature is missing"))?;
    let mut c = credential.split('/');
    let (Some(access_key), Some(date), Some(region), Some(service), Some("aws4_request"), None) =
        (c.next(), c.next(), c.next(), c.next(), c.next(), c.next())
    else {
        return Err(incomplete(
            "Credential must be <key id>/<date>/<region>/<service>/aws4_request",
        ));
    };
    if access_key.is_empty()
        || date.len() != 8
        || !date.bytes().all(|b| b.is_ascii_digit())
        || region.is_empty()
    {
        return Err(incomplete("the credential's scope is malformed"));
    }
    let signed_headers: Vec<&str> = signed.split(';').collect();
    let well_formed = signed_headers.iter().all(|h| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    }) && signed_headers.windows(2).all(|w| w[0] < w[1]);
    if !well_formed {
        return Err(incomplete(
            "SignedHeaders must be lower-case header names, sorted, each once",
        ));
    }
    if signature.len() != 64 || !signature.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(incomplete("Signature must be 64 hex digits"));
    }
    Ok(Authorization {
        access_key,
        date,
        region,
        service,
        signed_headers,
        signature,
    })
}

/// Seconds since the Unix epoch of an `X-Amz-Date` (`yyyymmddThhmmssZ`).
pub fn parse_amz_date(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (h, mi, se) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3_600 + mi * 60 + se)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `X-Amz-Date` for Unix time `secs`.
pub fn amz_date(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // (the inverse of days_from_civil)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// What of a request the signature covers.
pub struct Request<'a> {
    pub method: &'a str,
    /// As received (percent-escapes kept).
    pub path: &'a str,
    pub query: &'a str,
    /// Every header: name (any case) and value.
    pub headers: &'a [(&'a str, &'a [u8])],
    pub body: &'a [u8],
}

/// AWS's URI encoding: everything but `A-Za-z0-9-_.~` as `%XX` (and `/` kept when `path`).
fn uri_encode(s: &[u8], path: bool, out: &mut String) {
    for &b in s {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (path && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hexval = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    out
}

/// The canonical request of `req` over `signed` headers. A signed header the request lacks
/// is an error (the signature cannot be over it).
pub fn canonical_request(req: &Request<'_>, signed: &[&str]) -> Result<String, SqsError> {
    let mut out = String::with_capacity(256);
    out.push_str(req.method);
    out.push('\n');
    // (every service but S3 encodes the path as received once more)
    let path = if req.path.is_empty() { "/" } else { req.path };
    uri_encode(path.as_bytes(), true, &mut out);
    out.push('\n');
    let mut pairs: Vec<(String, String)> = req
        .query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let (mut ke, mut ve) = (String::new(), String::new());
            uri_encode(&percent_decode(k), false, &mut ke);
            uri_encode(&percent_decode(v), false, &mut ve);
            (ke, ve)
        })
        .collect();
    pairs.sort();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out.push('\n');
    for name in signed {
        let values: Vec<&[u8]> = req
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
            .collect();
        if values.is_empty() {
            return Err(SqsError::new(
                Kind::SignatureDoesNotMatch,
                format!(
                    "The request signature we calculated does not match the signature you provided: signed header '{name}' is not in the request."
                ),
            ));
        }
        out.push_str(name);
        out.push(':');
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let text = String::from_utf8_lossy(v);
            let mut first = true;
            for word in text.split(' ').filter(|w| !w.is_empty()) {
                if !first {
                    out.push(' ');
                }
                out.push_str(word.trim_matches(['\t']));
                first = false;
            }
        }
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&signed.join(";"));
    out.push('\n');
    out.push_str(&hex(digest::digest(&digest::SHA256, req.body).as_ref()));
    Ok(out)
}

/// The string to sign for `canonical` at `amz_date` in `scope` (`date/region/service/aws4_request`).
pub fn string_to_sign(amz_date: &str, scope: &str, canonical: &str) -> String {
    format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    )
}

/// The signing key of `secret` for one day, region and service.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let step = |key: &[u8], data: &str| -> Vec<u8> {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
            .as_ref()
            .to_vec()
    };
    let k = step(format!("AWS4{secret}").as_bytes(), date);
    let k = step(&k, region);
    let k = step(&k, service);
    let k = step(&k, "aws4_request");
    let mut out = [0; 32];
    out.copy_from_slice(&k);
    out
}

/// The signature of `string_to_sign` under `key`, in hex.
pub fn signature(key: &[u8; 32], string_to_sign: &str) -> String {
    hex(hmac::sign(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        string_to_sign.as_bytes(),
    )
    .as_ref())
}

/// Checks what a signature must hold before any key is looked up: `host`, `x-amz-date` and
/// every other `x-amz-*` header of the request signed (as AWS requires: an unsigned
/// `X-Amz-Target` could be changed to another operation over the same signed body), the
/// scope's service SQS's and its date the request's, and the request's time within
/// [`MAX_CLOCK_SKEW_S`] of `now_s`. Returns the request's `X-Amz-Date`.
pub fn check_scope<'a>(
    auth: &Authorization<'_>,
    req: &Request<'a>,
    now_s: i64,
) -> Result<&'a str, SqsError> {
    for needed in ["host", "x-amz-date"] {
        if !auth.signed_headers.contains(&needed) {
            return Err(incomplete(&format!("'{needed}' must be a signed header")));
        }
    }
    for (name, _) in req.headers {
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("x-amz-") && !auth.signed_headers.contains(&lower.as_str()) {
            return Err(incomplete(&format!(
                "header '{lower}' is in the request but not signed (every x-amz-* header must be)"
            )));
        }
    }
    if auth.service != SERVICE {
        return Err(incomplete("the credential's service must be sqs"));
    }
    let amz = req
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("x-amz-date"))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .ok_or_else(|| incomplete("X-Amz-Date is missing"))?;
    let at = parse_amz_date(amz).ok_or_else(|| incomplete("X-Amz-Date is malformed"))?;
    if !amz.starts_with(auth.date) {
        return Err(incomplete("the credential's date must be X-Amz-Date's day"));
    }
    if (at - now_s).abs() > MAX_CLOCK_SKEW_S {
        return Err(SqsError::new(
            Kind::RequestExpired,
            format!(
                "Signature expired: {amz} is now earlier or later than {} (15 minutes either way of the server's time).",
                amz_date(now_s)
            ),
        ));
    }
    Ok(amz)
}

/// Checks `auth`'s signature of `req` under `key` (the caller's signing key for the scope's
/// day and region); `amz_date` as [`check_scope`] returned it.
pub fn verify(
    auth: &Authorization<'_>,
    req: &Request<'_>,
    amz_date: &str,
    key: &[u8; 32],
) -> Result<(), SqsError> {
    let canonical = canonical_request(req, &auth.signed_headers)?;
    let scope = format!(
        "{}/{}/{}/aws4_request",
        auth.date, auth.region, auth.service
    );
    let want = signature(key, &string_to_sign(amz_date, &scope, &canonical));
    constant_time::verify_slices_are_equal(want.as_bytes(), auth.signature.as_bytes()).map_err(
        |_| {
            SqsError::new(
                Kind::SignatureDoesNotMatch,
                "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method.",
            )
        },
    )
}

/// The `Authorization` header for `req` signed with `access_key`/`secret` in `region` at
/// `amz_date`, over every header of `req` (whose names must be lower-case).
pub fn sign(
    req: &Request<'_>,
    access_key: &str,
    secret: &str,
    region: &str,
    amz_date: &str,
) -> String {
    let mut signed: Vec<&str> = req.headers.iter().map(|(n, _)| *n).collect();
    signed.sort_unstable();
    signed.dedup();
    let canonical = canonical_request(req, &signed).expect("every signed header is present");
    let date = &amz_date[..8];
    let scope = format!("{date}/{region}/{SERVICE}/aws4_request");
    let key = signing_key(secret, date, region, SERVICE);
    format!(
        "{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={}, Signature={}",
        signed.join(";"),
        signature(&key, &string_to_sign(amz_date, &scope, &canonical))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(parse_amz_date("19700101T000000Z"), Some(0));
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(1_440_938_160));
        assert_eq!(amz_date(1_440_938_160), "20150830T123600Z");
        for secs in [0, 951_782_400, 1_709_164_800, 4_102_444_799] {
            assert_eq!(parse_amz_date(&amz_date(secs)), Some(secs));
        }
        for bad in [
            "",
            "20150830T123600",
            "2015-08-30T12:36:00Z",
            "20151330T123600Z",
            "2015083OT123600Z",
        ] {
            assert_eq!(parse_amz_date(bad), None, "{bad}");
        }
    }

    /// AWS's published example (the IAM ListUsers request of the SigV4 documentation,
    /// "Examples of the complete Version 4 signing process").
    #[test]
    fn awss_example_signs_to_its_published_signature() {
        let headers: [(&str, &[u8]); 3] = [
            (
                "content-type",
                b"application/x-www-form-urlencoded; charset=utf-8",
            ),
            ("host", b"iam.amazonaws.com"),
            ("x-amz-date", b"20150830T123600Z"),
        ];
        let req = Request {
            method: "GET",
            path: "/",
            query: "Action=ListUsers&Version=2010-05-08",
            headers: &headers,
            body: b"",
        };
        let signed = ["content-type", "host", "x-amz-date"];
        let canonical = canonical_request(&req, &signed).unwrap();
        let sts = string_to_sign(
            "20150830T123600Z",
            "20150830/us-east-1/iam/aws4_request",
            &canonical,
        );
        assert!(sts.ends_with("f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"));
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            "20150830",
            "us-east-1",
            "iam",
        );
        assert_eq!(
            signature(&key, &sts),
            "5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    /// A request botocore signed (boto3's own SigV4Auth, an SQS SendMessage as boto3 sends
    /// it), checked here.
    #[test]
    fn botocores_signature_verifies() {
        let body = "{\"QueueUrl\":\"http://127.0.0.1:9000/000000000000/jobs\",\"MessageBody\":\"hello \u{e9}\"}";
        let header = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261207/us-east-1/sqs/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode, Signature=4f5790299695788709ca80c70c458574c2488a7808bcf92d5f47fd6d72c5ec02";
        let headers: [(&str, &[u8]); 6] = [
            ("Content-Type", b"application/x-amz-json-1.0"),
            ("X-Amz-Target", b"AmazonSQS.SendMessage"),
            ("x-amzn-query-mode", b"true"),
            ("X-Amz-Date", b"20261207T204439Z"),
            ("Host", b"127.0.0.1:9000"),
            ("Authorization", header.as_bytes()),
        ];
        let req = Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body: body.as_bytes(),
        };
        let auth = parse_authorization(header).unwrap();
        let amz = check_scope(&auth, &req, parse_amz_date("20261207T204439Z").unwrap()).unwrap();
        let key = signing_key(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            auth.date,
            auth.region,
            SERVICE,
        );
        assert_eq!(verify(&auth, &req, amz, &key), Ok(()));
    }

    fn signed_request(body: &'static [u8]) -> (Vec<(&'static str, Vec<u8>)>, String) {
        let headers: Vec<(&str, Vec<u8>)> = vec![
            ("content-type", b"application/x-amz-json-1.0".to_vec()),
            ("host", b"127.0.0.1:9000".to_vec()),
            ("x-amz-date", b"20261207T120000Z".to_vec()),
            ("x-amz-target", b"AmazonSQS.SendMessage".to_vec()),
        ];
        let h: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let req = Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &h,
            body,
        };
        let auth = sign(&req, "NRDKEY", "secret", "us-east-1", "20261207T120000Z");
        (headers, auth)
    }

    #[test]
    fn a_signed_request_verifies_and_any_change_does_not() {
        let now = parse_amz_date("20261207T120500Z").unwrap();
        let body: &[u8] = br#"{"QueueUrl":"q"}"#;
        let (headers, header) = signed_request(br#"{"QueueUrl":"q"}"#);
        let auth = parse_authorization(&header).unwrap();
        assert_eq!(auth.access_key, "NRDKEY");
        assert_eq!(auth.region, "us-east-1");
        let key = signing_key("secret", auth.date, auth.region, SERVICE);
        let check = |headers: &[(&str, Vec<u8>)], body: &[u8], key: &[u8; 32], now: i64| {
            let h: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
            let req = Request {
                method: "POST",
                path: "/",
                query: "",
                headers: &h,
                body,
            };
            let amz = check_scope(&auth, &req, now)?;
            verify(&auth, &req, amz, key)
        };
        assert_eq!(check(&headers, body, &key, now), Ok(()));
        // another body, another header value, another secret: refused
        let e = check(&headers, br#"{"QueueUrl":"r"}"#, &key, now).unwrap_err();
        assert_eq!(e.kind, Kind::SignatureDoesNotMatch);
        let mut other = headers.clone();
        other[3].1 = b"AmazonSQS.DeleteQueue".to_vec();
        assert_eq!(
            check(&other, body, &key, now).unwrap_err().kind,
            Kind::SignatureDoesNotMatch
        );
        let wrong = signing_key("Secret", auth.date, auth.region, SERVICE);
        assert_eq!(
            check(&headers, body, &wrong, now).unwrap_err().kind,
            Kind::SignatureDoesNotMatch
        );
        // a signed header removed
        let fewer: Vec<_> = headers
            .iter()
            .filter(|(n, _)| *n != "x-amz-target")
            .cloned()
            .collect();
        assert_eq!(
            check(&fewer, body, &key, now).unwrap_err().kind,
            Kind::SignatureDoesNotMatch
        );
        // outside the window either way
        for skew in [-16 * 60, 16 * 60] {
            assert_eq!(
                check(&headers, body, &key, now + skew - 300)
                    .unwrap_err()
                    .kind,
                Kind::RequestExpired,
                "{skew}"
            );
        }
        // spaces in a value are collapsed on both sides
        let mut spaced = headers.clone();
        spaced[0].1 = b"  application/x-amz-json-1.0 ".to_vec();
        assert_eq!(check(&spaced, body, &key, now), Ok(()));
    }

    #[test]
    fn malformed_headers_are_incomplete_signatures() {
        let good = "AWS4-HMAC-SHA256 Credential=AK/20261207/us-east-1/sqs/aws4_request, SignedHeaders=host;x-amz-date, Signature=".to_owned() + &"a".repeat(64);
        assert!(parse_authorization(&good).is_ok());
        for bad in [
            String::new(),
            "Basic dXNlcjpwYXNz".into(),
            good.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA1"),
            good.replace("/aws4_request", ""),
            good.replace("20261207", "2026127"),
            good.replace("host;x-amz-date", "x-amz-date;host"),
            good.replace("host;x-amz-date", "Host;x-amz-date"),
            good.replace("host;x-amz-date", "host;;x-amz-date"),
            good.replace(&"a".repeat(64), "abc"),
            good.replace("Signature=", "Signature=x, Signature="),
            good.replace("Credential=AK", "Credential="),
        ] {
            assert_eq!(
                parse_authorization(&bad).map_err(|e| e.kind),
                Err(Kind::IncompleteSignature),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_unsigned_amz_header_is_refused() {
        // signed over host and date only: the target could be swapped for another operation
        let h = "AWS4-HMAC-SHA256 Credential=AK/20261207/us-east-1/sqs/aws4_request, SignedHeaders=host;x-amz-date, Signature=".to_owned() + &"a".repeat(64);
        let auth = parse_authorization(&h).unwrap();
        let headers: [(&str, &[u8]); 3] = [
            ("host", b"h"),
            ("x-amz-date", b"20261207T120000Z"),
            ("X-Amz-Target", b"AmazonSQS.DeleteQueue"),
        ];
        let req = Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body: b"",
        };
        let now = parse_amz_date("20261207T120000Z").unwrap();
        assert_eq!(
            check_scope(&auth, &req, now).unwrap_err().kind,
            Kind::IncompleteSignature
        );
        assert!(
            check_scope(
                &auth,
                &Request {
                    headers: &headers[..2],
                    ..req
                },
                now
            )
            .is_ok()
        );
    }

    #[test]
    fn a_scope_without_host_or_date_signed_is_refused() {
        let h = "AWS4-HMAC-SHA256 Credential=AK/20261207/us-east-1/sqs/aws4_request, SignedHeaders=x-amz-date, Signature=".to_owned() + &"a".repeat(64);
        let auth = parse_authorization(&h).unwrap();
        let headers: [(&str, &[u8]); 1] = [("x-amz-date", b"20261207T120000Z")];
        let req = Request {
            method: "POST",
            path: "/",
            query: "",
            headers: &headers,
            body: b"",
        };
        assert_eq!(
            check_scope(&auth, &req, 0).unwrap_err().kind,
            Kind::IncompleteSignature
        );
    }

    proptest::proptest! {
        #[test]
        fn any_header_bytes_or_body_never_panic(header in ".{0,200}", body in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            if let Ok(auth) = parse_authorization(&header) {
                let headers: [(&str, &[u8]); 2] = [("host", b"h"), ("x-amz-date", b"20261207T120000Z")];
                let req = Request { method: "POST", path: "/%zz/ä", query: "a=%&b", headers: &headers, body: &body };
                if let Ok(amz) = check_scope(&auth, &req, 1_796_644_800) {
                    let _ = verify(&auth, &req, amz, &[0; 32]);
                }
            }
        }
    }
}
