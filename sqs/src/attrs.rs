//! Message attributes: checked as SQS checks them, and kept as the record's headers.
//!
//! A `String` attribute is the header of its name with its value, so a native consumer sees
//! it as an ordinary header and an ordinary header comes back to SQS as a `String`
//! attribute. Every other data type (`Number`, `Binary`, or a custom `String.x`) is a header
//! too, its value as text (a binary value in base64), and its data type is listed in one
//! reserved header, [`TYPES_HEADER`]. Header names starting with `narad-` are the broker's and
//! never attributes.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;

use crate::error::{Kind, SqsError};
use crate::limits::{MAX_ATTRIBUTE_NAME, MAX_ATTRIBUTES, MAX_DATA_TYPE};

/// The header listing the data types of the attributes that are not plain `String`s, as a
/// JSON object of name → data type.
pub const TYPES_HEADER: &str = "narad-sqs-types";
/// The header holding `MessageSystemAttributes.AWSTraceHeader`.
pub const TRACE_HEADER: &str = "narad-sqs-trace";
/// Header names the broker keeps for itself.
pub const RESERVED_PREFIX: &str = "narad-";

/// An attribute as a client sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct WireAttribute {
    pub data_type: Option<String>,
    pub string_value: Option<String>,
    pub binary_value: Option<String>,
    // (StringListValues and BinaryListValues are reserved by AWS and refused if given)
    #[serde(default)]
    pub string_list_values: Option<serde_json::Value>,
    #[serde(default)]
    pub binary_list_values: Option<serde_json::Value>,
}

/// A checked attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageAttribute {
    pub data_type: String,
    pub value: AttrValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttrValue {
    String(String),
    Binary(Vec<u8>),
}

impl MessageAttribute {
    /// Bytes it counts towards the message's size: name, data type and value.
    pub fn size(&self, name: &str) -> usize {
        name.len()
            + self.data_type.len()
            + match &self.value {
                AttrValue::String(s) => s.len(),
                AttrValue::Binary(b) => b.len(),
            }
    }

    /// The answer's form: `{"DataType", "StringValue" | "BinaryValue"}`.
    pub fn to_json(&self) -> serde_json::Value {
        match &self.value {
            AttrValue::String(s) => {
                serde_json::json!({"DataType": self.data_type, "StringValue": s})
            }
            AttrValue::Binary(b) => {
                serde_json::json!({"DataType": self.data_type, "BinaryValue": B64.encode(b)})
            }
        }
    }
}

/// The base type of a data type (`String`, `Number` or `Binary`, before any `.custom`).
fn base_type(data_type: &str) -> Option<&'static str> {
    let base = data_type.split_once('.').map_or(data_type, |(b, _)| b);
    ["String", "Number", "Binary"]
        .into_iter()
        .find(|&b| b == base)
}

/// Whether `name` is a name SQS accepts for an attribute.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ATTRIBUTE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.to_ascii_lowercase().starts_with("aws.")
        && !name.to_ascii_lowercase().starts_with("amazon.")
}

/// Whether `s` is a number as SQS takes one: an optional sign, digits with an optional
/// fraction, and an optional exponent.
fn valid_number(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (mantissa, exp) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (s, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    let exp_ok = exp.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.len() <= 4 && digits(e)
    });
    !(int.is_empty() && frac.is_empty())
        && digits(int)
        && digits(frac)
        && int.len() + frac.len() <= 38
        && exp_ok
}

/// Whether `s` holds only the characters SQS allows in a message (XML's).
pub fn valid_text(s: &str) -> bool {
    // (printable ASCII and tab, newline, return, byte by byte, first: what nearly every
    // message is; a fold, not `all`, so the check is vectorised)
    let ascii = s.bytes().fold(true, |ok, b| {
        ok & ((0x20..0x7f).contains(&b) | (b == b'\t') | (b == b'\n') | (b == b'\r'))
    });
    ascii || s.chars().all(|c| {
        matches!(c, '\u{9}' | '\u{a}' | '\u{d}' | '\u{20}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}')
            || c >= '\u{10000}'
    })
}

/// Checks the attributes of one message; `what` names them in errors
/// (`MessageAttributes`, or `MessageSystemAttributes`).
pub fn check(
    what: &str,
    given: BTreeMap<String, WireAttribute>,
) -> Result<BTreeMap<String, MessageAttribute>, SqsError> {
    if given.len() > MAX_ATTRIBUTES {
        return Err(SqsError::new(
            Kind::InvalidParameterValue,
            format!(
                "Number of message attributes [{}] exceeds the allowed maximum [{MAX_ATTRIBUTES}].",
                given.len()
            ),
        ));
    }
    let mut out = BTreeMap::new();
    for (name, a) in given {
        if !valid_name(&name) || name.to_ascii_lowercase().starts_with(RESERVED_PREFIX) {
            return Err(SqsError::new(
                Kind::InvalidParameterValue,
                format!(
                    "{what} name '{}' is invalid: names are 1 to {MAX_ATTRIBUTE_NAME} of A-Z, a-z, 0-9, '_', '-' and '.', not starting or ending with '.', without '..', and not starting with 'AWS.', 'Amazon.' or 'narad-'.",
                    clip(&name)
                ),
            ));
        }
        let Some(data_type) = a.data_type.filter(|t| !t.is_empty()) else {
            return Err(SqsError::new(
                Kind::InvalidParameterValue,
                format!(
                    "The message attribute '{name}' must contain non-empty message attribute type."
                ),
            ));
        };
        let Some(base) = base_type(&data_type).filter(|_| data_type.len() <= MAX_DATA_TYPE) else {
            return Err(SqsError::new(
                Kind::InvalidParameterValue,
                format!(
                    "The type of message (user) attribute '{name}' is invalid. You must use only the following supported type prefixes: Binary, Number, String."
                ),
            ));
        };
        if a.string_list_values.is_some() || a.binary_list_values.is_some() {
            return Err(SqsError::new(
                Kind::InvalidParameterValue,
                format!("Message attribute '{name}': list values are not supported."),
            ));
        }
        let value = match (base, a.string_value, a.binary_value) {
            ("Binary", None, Some(b)) => {
                AttrValue::Binary(B64.decode(b.as_bytes()).map_err(|_| {
                    SqsError::new(
                        Kind::InvalidParameterValue,
                        format!("Message attribute '{name}' has a BinaryValue that is not base64."),
                    )
                })?)
            }
            ("String" | "Number", Some(s), None) => {
                if s.is_empty() {
                    return Err(SqsError::new(
                        Kind::InvalidParameterValue,
                        format!(
                            "Message attribute '{name}' must contain a non-empty value of type '{base}'."
                        ),
                    ));
                }
                if base == "Number" && !valid_number(&s) {
                    return Err(SqsError::new(
                        Kind::InvalidParameterValue,
                        format!(
                            "Value {} for parameter MessageAttributes.{name} is invalid. Reason: '{}' is not a valid number.",
                            clip(&s),
                            clip(&s)
                        ),
                    ));
                }
                if !valid_text(&s) {
                    return Err(SqsError::new(
                        Kind::InvalidParameterValue,
                        format!(
                            "Message attribute '{name}' contains characters SQS does not allow."
                        ),
                    ));
                }
                AttrValue::String(s)
            }
            _ => {
                return Err(SqsError::new(
                    Kind::InvalidParameterValue,
                    format!(
                        "Message attribute '{name}' with type '{base}' must use field '{}' (and only it).",
                        if base == "Binary" {
                            "BinaryValue"
                        } else {
                            "StringValue"
                        }
                    ),
                ));
            }
        };
        out.insert(name, MessageAttribute { data_type, value });
    }
    Ok(out)
}

/// At most 64 characters of `s`, for an error message.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The headers that keep `attrs` (and the trace header, if given) on the record.
pub fn to_headers(
    attrs: &BTreeMap<String, MessageAttribute>,
    trace: Option<&str>,
) -> Vec<(String, Vec<u8>)> {
    let mut headers = Vec::with_capacity(attrs.len() + 2);
    let mut types = serde_json::Map::new();
    for (name, a) in attrs {
        let value = match &a.value {
            AttrValue::String(s) => s.as_bytes().to_vec(),
            AttrValue::Binary(b) => B64.encode(b).into_bytes(),
        };
        if a.data_type != "String" {
            types.insert(name.clone(), a.data_type.clone().into());
        }
        headers.push((name.clone(), value));
    }
    if !types.is_empty() {
        headers.push((
            TYPES_HEADER.to_owned(),
            serde_json::Value::Object(types).to_string().into_bytes(),
        ));
    }
    if let Some(t) = trace {
        headers.push((TRACE_HEADER.to_owned(), t.as_bytes().to_vec()));
    }
    headers
}

/// The attributes a record's headers hold (the `narad-` headers are not attributes): what
/// [`to_headers`] wrote comes back as it was; an ordinary header is a `String` attribute, or
/// a `Binary` one when its value is not UTF-8. A header whose name SQS would refuse, or a
/// type the types header names but the value cannot be, is left out: a consumer through
/// the native API sees it.
pub fn from_headers<'a, I>(headers: I) -> BTreeMap<String, MessageAttribute>
where
    I: IntoIterator<Item = (&'a str, &'a [u8])> + Clone,
{
    let types: BTreeMap<String, String> = headers
        .clone()
        .into_iter()
        .find(|(n, _)| *n == TYPES_HEADER)
        .and_then(|(_, v)| serde_json::from_slice(v).ok())
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        if name.to_ascii_lowercase().starts_with(RESERVED_PREFIX) || !valid_name(name) {
            continue;
        }
        let attr = match types.get(name) {
            Some(t) => match base_type(t) {
                Some("Binary") => match B64.decode(value) {
                    Ok(b) => MessageAttribute {
                        data_type: t.clone(),
                        value: AttrValue::Binary(b),
                    },
                    Err(_) => continue,
                },
                Some(_) => match std::str::from_utf8(value) {
                    Ok(s) => MessageAttribute {
                        data_type: t.clone(),
                        value: AttrValue::String(s.to_owned()),
                    },
                    Err(_) => continue,
                },
                None => continue,
            },
            None => match std::str::from_utf8(value) {
                Ok(s) if !s.is_empty() => MessageAttribute {
                    data_type: "String".into(),
                    value: AttrValue::String(s.to_owned()),
                },
                _ => MessageAttribute {
                    data_type: "Binary".into(),
                    value: AttrValue::Binary(value.to_vec()),
                },
            },
        };
        out.insert(name.to_owned(), attr);
    }
    out
}

/// Whether attribute `name` is selected by `MessageAttributeNames` (`All`, `.*`, a name, or
/// a `prefix.*`).
pub fn selected(names: &[String], name: &str) -> bool {
    names.iter().any(|n| {
        n == "All"
            || n == ".*"
            || n == name
            || n.strip_suffix(".*")
                .is_some_and(|p| name.starts_with(p) && name[p.len()..].starts_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(t: &str, s: Option<&str>, b: Option<&str>) -> WireAttribute {
        WireAttribute {
            data_type: Some(t.into()),
            string_value: s.map(Into::into),
            binary_value: b.map(Into::into),
            string_list_values: None,
            binary_list_values: None,
        }
    }

    #[test]
    fn attributes_come_back_from_their_headers_as_they_were_sent() {
        let given: BTreeMap<_, _> = [
            ("s".to_owned(), wire("String", Some("text é"), None)),
            ("n".to_owned(), wire("Number.int", Some("-12.5e3"), None)),
            ("b".to_owned(), wire("Binary", None, Some("AAEC/w=="))),
            ("c".to_owned(), wire("String.json", Some("{}"), None)),
        ]
        .into();
        let attrs = check("MessageAttributes", given).unwrap();
        let headers = to_headers(&attrs, Some("Root=1"));
        let back = from_headers(headers.iter().map(|(n, v)| (n.as_str(), v.as_slice())));
        assert_eq!(back, attrs);
        assert_eq!(
            attrs["b"].value,
            AttrValue::Binary(vec![0, 1, 2, 255]),
            "binary values are the decoded bytes"
        );
        // a String attribute is a plain header a native consumer reads as is
        assert!(headers.contains(&("s".to_owned(), "text é".as_bytes().to_vec())));
    }

    #[test]
    fn a_native_header_is_a_string_or_binary_attribute() {
        let headers = [
            ("trace", b"abc".as_slice()),
            ("raw", &[0xff, 0xfe][..]),
            ("narad-origin", b"x".as_slice()),
            ("bad name!", b"x".as_slice()),
        ];
        let attrs = from_headers(headers.iter().copied());
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs["trace"].value, AttrValue::String("abc".into()));
        assert_eq!(attrs["raw"].data_type, "Binary");
    }

    #[test]
    fn bad_attributes_are_refused() {
        for (name, a) in [
            ("AWS.x", wire("String", Some("v"), None)),
            ("narad-x", wire("String", Some("v"), None)),
            ("a..b", wire("String", Some("v"), None)),
            ("", wire("String", Some("v"), None)),
            ("n", wire("Number", Some("1x"), None)),
            ("n", wire("Number", Some("."), None)),
            ("n", wire("Float", Some("1"), None)),
            ("n", wire("String", None, None)),
            ("n", wire("String", Some(""), None)),
            ("n", wire("String", Some("\u{0}"), None)),
            ("n", wire("Binary", Some("v"), None)),
            ("n", wire("Binary", None, Some("!!"))),
            ("n", wire("", Some("v"), None)),
        ] {
            let r = check("MessageAttributes", [(name.to_owned(), a.clone())].into());
            assert_eq!(
                r.map_err(|e| e.kind),
                Err(Kind::InvalidParameterValue),
                "{name:?} {a:?}"
            );
        }
        let many = (0..11)
            .map(|i| (format!("a{i}"), wire("String", Some("v"), None)))
            .collect();
        assert!(check("MessageAttributes", many).is_err());
        for ok in [
            "1",
            "-1.5",
            "+3e-7",
            ".5",
            "5.",
            "12345678901234567890123456789012345678",
        ] {
            assert!(valid_number(ok), "{ok}");
        }
        assert!(!valid_number("123456789012345678901234567890123456789"));
    }

    #[test]
    fn names_are_selected_by_exact_name_prefix_or_all() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(selected(&names(&["All"]), "x"));
        assert!(selected(&names(&[".*"]), "x"));
        assert!(selected(&names(&["x"]), "x"));
        assert!(selected(&names(&["a.*"]), "a.b"));
        assert!(!selected(&names(&["a.*"]), "ab"));
        assert!(!selected(&names(&["y"]), "x"));
        assert!(!selected(&[], "x"));
    }

    #[test]
    fn message_text_is_xmls_characters() {
        assert!(valid_text("hello\t\n\r é 😀"));
        assert!(!valid_text("\u{0}"));
        assert!(!valid_text("\u{1f}"));
        assert!(!valid_text("\u{fffe}"));
    }
}
