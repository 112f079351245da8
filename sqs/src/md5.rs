//! The MD5 digests SQS answers beside a message, which the JavaScript, Java, Go, Ruby and
//! PHP SDKs check: of the body, and of the message attributes in AWS's byte layout.

use md5::{Digest as _, Md5};

use crate::attrs::{AttrValue, MessageAttribute};

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// `MD5OfMessageBody` / `MD5OfBody`: of the body's UTF-8 bytes.
pub fn of_body(body: &[u8]) -> String {
    hex(&Md5::digest(body))
}

/// `MD5OfMessageAttributes`: the attributes sorted by name, each as its name, its data type
/// and its value, each with a big-endian 32-bit length before it, and the value after one
/// byte telling its kind (1: a string, 2: binary). `None` without attributes (the field is
/// then left out).
pub fn of_attributes<'a, I>(attrs: I) -> Option<String>
where
    I: IntoIterator<Item = (&'a str, &'a MessageAttribute)>,
{
    let mut sorted: Vec<_> = attrs.into_iter().collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Md5::new();
    let field = |h: &mut Md5, bytes: &[u8]| {
        h.update((bytes.len() as u32).to_be_bytes());
        h.update(bytes);
    };
    for (name, a) in sorted {
        field(&mut h, name.as_bytes());
        field(&mut h, a.data_type.as_bytes());
        match &a.value {
            AttrValue::String(s) => {
                h.update([1]);
                field(&mut h, s.as_bytes());
            }
            AttrValue::Binary(b) => {
                h.update([2]);
                field(&mut h, b);
            }
        }
    }
    Some(hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(data_type: &str, value: AttrValue) -> MessageAttribute {
        MessageAttribute {
            data_type: data_type.into(),
            value,
        }
    }

    #[test]
    fn digests_match_awss() {
        // (vectors checked against moto's implementation of AWS's rule)
        assert_eq!(of_body(b"hello"), "5d41402abc4b2a76b9719d911017c592");
        let k = attr("String", AttrValue::String("v".into()));
        assert_eq!(
            of_attributes([("k", &k)]).as_deref(),
            Some("0a77b0642718c3d9dd47090567d11e0d")
        );
        assert_eq!(of_attributes(std::iter::empty()), None);
        // a binary value and a number (computed apart with Python's hashlib by the rule)
        let b = attr("Binary", AttrValue::Binary(vec![0, 1, 2, 255]));
        let n = attr("Number", AttrValue::String("1.5".into()));
        assert_eq!(
            of_attributes([("n", &n), ("b", &b)]).as_deref(),
            Some("9536601cfefd78803218dbb2bac3afe0")
        );
    }

    #[test]
    fn the_order_attributes_come_in_does_not_matter() {
        let a = attr("Number", AttrValue::String("1".into()));
        let b = attr("Binary", AttrValue::Binary(vec![0, 1, 2]));
        assert_eq!(
            of_attributes([("a", &a), ("b", &b)]),
            of_attributes([("b", &b), ("a", &a)])
        );
        // a binary value and the same bytes as a string differ (the kind byte)
        let s = attr("Binary", AttrValue::String("\0\u{1}\u{2}".into()));
        assert_ne!(of_attributes([("b", &b)]), of_attributes([("b", &s)]));
    }
}
