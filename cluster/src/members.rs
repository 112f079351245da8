//! The `cluster_members` setting: the initial voters, as `ID@HOST:PORT,...`.

use std::fmt;

use crate::NodeId;

/// One node of the initial membership: its id and its RPC address (`host:port`; the host
/// may be a DNS name, resolved whenever the node is dialed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.id, self.addr)
    }
}

/// Most initial members (a Raft group of more voters gains nothing and costs every write).
pub const MAX_MEMBERS: usize = 9;

/// Parses `ID@HOST:PORT,...` (spaces around entries allowed). Ids are non-zero and unique,
/// addresses unique.
pub fn parse_members(s: &str) -> Result<Vec<Member>, String> {
    let mut out: Vec<Member> = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, addr) = entry
            .split_once('@')
            .ok_or_else(|| format!("'{entry}' is not ID@HOST:PORT"))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| format!("'{entry}': the node id must be a number"))?;
        if id == 0 {
            return Err(format!("'{entry}': node ids start at 1"));
        }
        let addr = parse_addr(addr.trim()).map_err(|e| format!("'{entry}': {e}"))?;
        if out.iter().any(|m| m.id == id) {
            return Err(format!("node id {id} appears twice"));
        }
        if out.iter().any(|m| m.addr == addr) {
            return Err(format!("address {addr} appears twice"));
        }
        out.push(Member { id, addr });
    }
    if out.len() > MAX_MEMBERS {
        return Err(format!("at most {MAX_MEMBERS} initial members"));
    }
    Ok(out)
}

/// Checks `HOST:PORT` (host a name, an IPv4 address or a bracketed IPv6 one; port 1–65535).
pub fn parse_addr(s: &str) -> Result<String, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}' has no :PORT"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("'{port}' is not a port (1-65535)")),
    }
    let ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    };
    if !ok {
        return Err(format!("'{host}' is not a host name or address"));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_bad_lists_say_why() {
        let m = parse_members(" 1@10.0.0.1:7001, 2@node-2.internal:7001,3@[::1]:7001 ,").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].to_string(), "2@node-2.internal:7001");
        for (bad, why) in [
            ("1@a:1,1@b:1", "appears twice"),
            ("1@a:1,2@a:1", "appears twice"),
            ("0@a:1", "start at 1"),
            ("x@a:1", "must be a number"),
            ("1@a", "no :PORT"),
            ("1@a:0", "not a port"),
            ("1@a:99999", "not a port"),
            ("1@a b:5", "not a host"),
            ("1@[zz]:5", "not a host"),
            ("1a:5", "not ID@HOST:PORT"),
        ] {
            let e = parse_members(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let many: Vec<String> = (1..=10).map(|i| format!("{i}@h{i}:1")).collect();
        assert!(parse_members(&many.join(",")).is_err());
        assert_eq!(parse_members("").unwrap(), vec![]);
    }
}
