//! The address guard: what a remote's URL may name and which addresses a sender may connect
//! to. A remote is an admin-supplied URL that every node then dials on its own, from inside
//! the cluster's network: without a guard it is a server-side request forgery primitive
//! (the cloud metadata endpoint, a loopback admin port, a private service).
//!
//! - The URL: `https` only; no user info, query or fragment; a host; a port from
//!   `remotes_allowed_ports` (443 by default); a host from `remotes_allowed_hosts` when that
//!   is set (exact, or `*.suffix`).
//! - The addresses: the sender resolves the name itself ([`resolve`]), vets every address
//!   ([`vet`]) and connects to a vetted one (no second resolution, so a name cannot resolve
//!   to a public address for the check and a private one for the connection). Refused, unless
//!   `remotes_allow_addresses` lists them: unspecified, loopback, link-local, multicast,
//!   broadcast and reserved addresses, the cloud metadata addresses, IPv4 forms inside IPv6
//!   (mapped, compatible, NAT64, 6to4, Teredo), the addresses of this host's own interfaces
//!   (its services on allowed ports would be reachable through a remote), and, when `refuse_private` is set,
//!   private-use and shared (CGNAT) ranges. No proxy variables are read and no redirect is
//!   followed (the sender's business; stated here so the guard is read whole).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The guard's settings (flat config keys `remotes_allowed_ports`, `remotes_allowed_hosts`,
/// `remotes_allow_addresses`, `remotes_refuse_private`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardConfig {
    pub allowed_ports: Vec<u16>,
    /// Empty: any host. Else exact names or `*.suffix` patterns (lowercase).
    pub allowed_hosts: Vec<String>,
    /// Addresses allowed although a refused class holds them (tests list `127.0.0.0/8`).
    pub allow_addresses: Vec<Cidr>,
    /// Refuse private-use (10/8, 172.16/12, 192.168/16, fc00::/7) and shared (100.64/10)
    /// addresses too: for clusters whose remotes are only ever on the public internet.
    pub refuse_private: bool,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            allowed_ports: vec![443],
            allowed_hosts: Vec::new(),
            allow_addresses: Vec::new(),
            refuse_private: false,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuardError {
    #[error("the remote URL is not a valid URL: {0}")]
    Invalid(String),
    #[error("the remote URL must be https://")]
    NotHttps,
    #[error(
        "the remote URL must not carry a user name or password (they go in the remote's fields)"
    )]
    Userinfo,
    #[error("the remote URL must not carry a query or fragment")]
    QueryOrFragment,
    #[error("the remote URL has no host")]
    NoHost,
    #[error("port {0} is not in remotes_allowed_ports")]
    Port(u16),
    #[error("host '{0}' is not in remotes_allowed_hosts")]
    Host(String),
    #[error("address {addr} is refused ({class}); list it in remotes_allow_addresses to allow it")]
    Address { addr: IpAddr, class: &'static str },
    #[error("'{host}' did not resolve: {reason}")]
    Resolve { host: String, reason: String },
}

/// An IP network (`10.0.0.0/8`, `fd00::/8`, or a single address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub const fn new_v4(a: [u8; 4], prefix: u8) -> Self {
        Self {
            addr: IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
            prefix,
        }
    }

    const fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(net.to_bits()), 32, self.prefix)
                    == masked(u128::from(ip.to_bits()), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(net.to_bits(), 128, self.prefix) == masked(ip.to_bits(), 128, self.prefix)
            }
            _ => false,
        }
    }
}

/// The top `prefix` bits of a `width`-bit address.
fn masked(bits: u128, width: u32, prefix: u8) -> u128 {
    let prefix = u32::from(prefix).min(width);
    if prefix == 0 {
        return 0;
    }
    bits >> (width - prefix)
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not an address or network"))?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| format!("'{s}': the prefix length must be 0..={width}"))?,
        };
        Ok(Self { addr, prefix })
    }
}

/// Refused whatever the settings say (unless allowed by address): (network, class).
const ALWAYS_V4: &[(Cidr, &str)] = &[
    (Cidr::new_v4([0, 0, 0, 0], 8), "unspecified"),
    (Cidr::new_v4([127, 0, 0, 0], 8), "loopback"),
    (
        Cidr::new_v4([169, 254, 0, 0], 16),
        "link-local or cloud metadata",
    ),
    (Cidr::new_v4([100, 100, 100, 200], 32), "cloud metadata"),
    (
        Cidr::new_v4([192, 0, 0, 0], 24),
        "IETF protocol assignments",
    ),
    (Cidr::new_v4([224, 0, 0, 0], 4), "multicast"),
    (Cidr::new_v4([240, 0, 0, 0], 4), "reserved or broadcast"),
];
const PRIVATE_V4: &[(Cidr, &str)] = &[
    (Cidr::new_v4([10, 0, 0, 0], 8), "private-use"),
    (Cidr::new_v4([172, 16, 0, 0], 12), "private-use"),
    (Cidr::new_v4([192, 168, 0, 0], 16), "private-use"),
    (Cidr::new_v4([100, 64, 0, 0], 10), "shared address space"),
];
const ALWAYS_V6: &[(Cidr, &str)] = &[
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "unspecified"),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback"),
    (Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
    (Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), "multicast"),
    (
        Cidr::v6([0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0], 32),
        "cloud metadata",
    ),
    // IPv4 inside IPv6: each can carry an address the IPv4 rules refuse
    (Cidr::v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96), "IPv4-mapped"),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 96), "IPv4-compatible"),
    (Cidr::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), "NAT64"),
    (Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), "NAT64"),
    (Cidr::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), "6to4"),
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), "Teredo"),
];
const PRIVATE_V6: &[(Cidr, &str)] = &[(Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), "unique local")];

/// Whether a sender may connect to `ip`.
pub fn vet(ip: IpAddr, cfg: &GuardConfig) -> Result<(), GuardError> {
    if cfg.allow_addresses.iter().any(|c| c.contains(ip)) {
        return Ok(());
    }
    let (always, private) = match ip {
        IpAddr::V4(_) => (ALWAYS_V4, PRIVATE_V4),
        IpAddr::V6(_) => (ALWAYS_V6, PRIVATE_V6),
    };
    let refused = always
        .iter()
        .chain(if cfg.refuse_private { private } else { &[] })
        .find(|(net, _)| net.contains(ip));
    match refused {
        Some((_, class)) => Err(GuardError::Address { addr: ip, class }),
        None if is_this_hosts(ip) => Err(GuardError::Address {
            addr: ip,
            class: "an address of this host",
        }),
        None => Ok(()),
    }
}

/// Whether `ip` is assigned to one of this host's interfaces (in this network namespace):
/// a remote that resolves to it would reach this host's own services. Told by binding a UDP
/// socket to it (nothing is sent), which the kernel allows only for local addresses; where
/// it allows any address (the `ip_nonlocal_bind` sysctl), it cannot be told this way and is
/// not refused on that ground.
fn is_this_hosts(ip: IpAddr) -> bool {
    let sysctl = match ip {
        IpAddr::V4(_) => "/proc/sys/net/ipv4/ip_nonlocal_bind",
        IpAddr::V6(_) => "/proc/sys/net/ipv6/ip_nonlocal_bind",
    };
    let any_binds = std::fs::read_to_string(sysctl).is_ok_and(|v| v.trim() != "0");
    !any_binds && std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// A remote's base URL, checked and in canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// `https://host[:port]/path/` (lowercase, IDNA-encoded host; the path ends with `/`).
    pub canonical: String,
    /// The host as the TLS server name is checked against (a name, or an address).
    pub host: String,
    pub port: u16,
    /// The host when it is an address literal.
    pub ip: Option<IpAddr>,
}

impl RemoteUrl {
    pub fn parse(s: &str, cfg: &GuardConfig) -> Result<Self, GuardError> {
        let u = url::Url::parse(s.trim()).map_err(|e| GuardError::Invalid(e.to_string()))?;
        if u.scheme() != "https" {
            return Err(GuardError::NotHttps);
        }
        if !u.username().is_empty() || u.password().is_some() {
            return Err(GuardError::Userinfo);
        }
        if u.query().is_some() || u.fragment().is_some() {
            return Err(GuardError::QueryOrFragment);
        }
        let port = u.port_or_known_default().unwrap_or(443);
        if !cfg.allowed_ports.contains(&port) {
            return Err(GuardError::Port(port));
        }
        let (host, ip) = match u.host() {
            None => return Err(GuardError::NoHost),
            Some(url::Host::Domain(d)) => (d.trim_end_matches('.').to_owned(), None),
            Some(url::Host::Ipv4(a)) => (a.to_string(), Some(IpAddr::V4(a))),
            Some(url::Host::Ipv6(a)) => (a.to_string(), Some(IpAddr::V6(a))),
        };
        if host.is_empty() {
            return Err(GuardError::NoHost);
        }
        if !cfg.allowed_hosts.is_empty()
            && !cfg.allowed_hosts.iter().any(|h| host_matches(h, &host))
        {
            return Err(GuardError::Host(host));
        }
        if let Some(ip) = ip {
            vet(ip, cfg)?;
        }
        let mut path = u.path().to_owned();
        if !path.ends_with('/') {
            path.push('/');
        }
        let shown = match ip {
            Some(IpAddr::V6(_)) => format!("[{host}]"),
            _ => host.clone(),
        };
        let canonical = if port == 443 {
            format!("https://{shown}{path}")
        } else {
            format!("https://{shown}:{port}{path}")
        };
        Ok(Self {
            canonical,
            host,
            port,
            ip,
        })
    }
}

/// `pattern` (exact, or `*.suffix`: any name below `suffix`, not `suffix` itself).
fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .strip_suffix(suffix)
            .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
        None => pattern.eq_ignore_ascii_case(host),
    }
}

/// The vetted addresses of `url`, from the system resolver: connect to one of these, never
/// to the name again. Refused if none passes [`vet`] (the first refusal is the error).
pub async fn resolve(url: &RemoteUrl, cfg: &GuardConfig) -> Result<Vec<SocketAddr>, GuardError> {
    if let Some(ip) = url.ip {
        vet(ip, cfg)?;
        return Ok(vec![SocketAddr::new(ip, url.port)]);
    }
    let found: Vec<SocketAddr> = tokio::net::lookup_host((url.host.as_str(), url.port))
        .await
        .map_err(|e| GuardError::Resolve {
            host: url.host.clone(),
            reason: e.to_string(),
        })?
        .collect();
    vetted(&url.host, found, cfg)
}

/// The addresses of `found` that pass [`vet`]; the first refusal if none does.
pub fn vetted(
    host: &str,
    found: Vec<SocketAddr>,
    cfg: &GuardConfig,
) -> Result<Vec<SocketAddr>, GuardError> {
    let mut first_refusal = None;
    let ok: Vec<SocketAddr> = found
        .into_iter()
        .filter(|a| match vet(a.ip(), cfg) {
            Ok(()) => true,
            Err(e) => {
                first_refusal.get_or_insert(e);
                false
            }
        })
        .collect();
    if !ok.is_empty() {
        return Ok(ok);
    }
    Err(first_refusal.unwrap_or_else(|| GuardError::Resolve {
        host: host.to_owned(),
        reason: "no address".into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(ip: &str, cfg: &GuardConfig) -> bool {
        vet(ip.parse().unwrap(), cfg).is_err()
    }

    #[test]
    fn every_dangerous_address_class_is_refused() {
        let cfg = GuardConfig::default();
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "127.255.0.9",
            "169.254.169.254",
            "169.254.1.1",
            "100.100.100.200",
            "192.0.0.170",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "ff02::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b:1::a9fe:a9fe",
            "2002:7f00:1::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(refused(ip, &cfg), "{ip} must be refused");
        }
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "10.1.2.3",
            "192.168.1.1",
            "100.64.0.1",
            "fd12::1",
        ] {
            assert!(!refused(ip, &cfg), "{ip} is allowed by default");
        }
        let strict = GuardConfig {
            refuse_private: true,
            ..GuardConfig::default()
        };
        for ip in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "fd12::1",
        ] {
            assert!(refused(ip, &strict), "{ip} refused with refuse_private");
        }
        for ip in ["172.32.0.1", "8.8.8.8"] {
            assert!(!refused(ip, &strict), "{ip}");
        }
    }

    /// An address of this host's own interfaces (not loopback: a global one, as a remote
    /// name could resolve to) is refused unless listed: through it a remote reaches this
    /// host's services on the allowed ports. A documentation address no host has is not.
    #[test]
    fn this_hosts_own_addresses_are_refused_unless_listed() {
        assert!(!is_this_hosts("203.0.113.254".parse().unwrap()));
        assert!(is_this_hosts("127.0.0.1".parse().unwrap()));
        // this host's global addresses, as `ip` lists them (none: nothing more to check here)
        let out = std::process::Command::new("ip")
            .args(["-o", "addr", "show", "scope", "global"])
            .output();
        let own: Vec<IpAddr> = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                w.find(|t| *t == "inet" || *t == "inet6")?;
                w.next()?.split('/').next()?.parse().ok()
            })
            .collect();
        if own.is_empty() {
            eprintln!("skipped: this host lists no global address");
        }
        for ip in own {
            let cfg = GuardConfig::default();
            assert_eq!(
                vet(ip, &cfg),
                Err(GuardError::Address {
                    addr: ip,
                    class: "an address of this host"
                }),
                "{ip}"
            );
            let listed = GuardConfig {
                allow_addresses: vec![ip.to_string().parse().unwrap()],
                ..GuardConfig::default()
            };
            assert_eq!(vet(ip, &listed), Ok(()), "{ip} listed");
        }
    }

    #[test]
    fn listed_addresses_are_allowed_and_nothing_else() {
        let cfg = GuardConfig {
            allow_addresses: vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
            ..GuardConfig::default()
        };
        assert!(!refused("127.0.0.2", &cfg));
        assert!(!refused("::1", &cfg));
        assert!(
            refused("::ffff:127.0.0.1", &cfg),
            "mapped forms are not the listed network"
        );
        assert!(refused("169.254.169.254", &cfg));
        for bad in ["", "1.2.3.4/33", "::/129", "x/8", "1.2.3/8"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
        assert!(
            "0.0.0.0/0"
                .parse::<Cidr>()
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
    }

    #[test]
    fn urls_are_checked_and_made_canonical() {
        let cfg = GuardConfig::default();
        let u = RemoteUrl::parse("https://Narad.EU.example.com", &cfg).unwrap();
        assert_eq!(u.canonical, "https://narad.eu.example.com/");
        assert_eq!((u.host.as_str(), u.port), ("narad.eu.example.com", 443));
        let u = RemoteUrl::parse("https://narad.example:443/base", &cfg).unwrap();
        assert_eq!(u.canonical, "https://narad.example/base/");
        assert_eq!(
            RemoteUrl::parse("https://bücher.example/", &cfg)
                .unwrap()
                .host,
            "xn--bcher-kva.example"
        );
        for (bad, want) in [
            ("http://narad.example", GuardError::NotHttps),
            ("ftp://narad.example", GuardError::NotHttps),
            ("https://u:p@narad.example", GuardError::Userinfo),
            ("https://u@narad.example", GuardError::Userinfo),
            ("https://narad.example/?a=1", GuardError::QueryOrFragment),
            ("https://narad.example/#x", GuardError::QueryOrFragment),
            ("https://narad.example:8443", GuardError::Port(8443)),
        ] {
            assert_eq!(RemoteUrl::parse(bad, &cfg), Err(want), "{bad}");
        }
        assert!(matches!(
            RemoteUrl::parse("not a url", &cfg),
            Err(GuardError::Invalid(_))
        ));
        for literal in [
            "https://169.254.169.254/",
            "https://127.0.0.1/",
            "https://[::ffff:127.0.0.1]/",
            "https://[::1]/",
        ] {
            assert!(
                matches!(
                    RemoteUrl::parse(literal, &cfg),
                    Err(GuardError::Address { .. })
                ),
                "{literal}"
            );
        }
        // a decimal or hex IPv4 spelling is read as the address it is
        assert!(matches!(
            RemoteUrl::parse("https://2130706433/", &cfg),
            Err(GuardError::Address { .. })
        ));
        assert!(matches!(
            RemoteUrl::parse("https://0x7f.1/", &cfg),
            Err(GuardError::Address { .. })
        ));
    }

    #[test]
    fn allowed_hosts_match_exactly_or_below_a_suffix() {
        let cfg = GuardConfig {
            allowed_hosts: vec!["narad.example".into(), "*.corp.example".into()],
            allowed_ports: vec![443, 8443],
            ..GuardConfig::default()
        };
        for ok in [
            "https://narad.example",
            "https://a.corp.example:8443",
            "https://x.y.corp.example",
        ] {
            assert!(RemoteUrl::parse(ok, &cfg).is_ok(), "{ok}");
        }
        for bad in [
            "https://corp.example",
            "https://evilcorp.example",
            "https://narad.example.evil",
            "https://xcorp.example",
        ] {
            assert!(
                matches!(RemoteUrl::parse(bad, &cfg), Err(GuardError::Host(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_name_is_vetted_after_it_resolves() {
        let cfg = GuardConfig::default();
        let addrs = |v: &[&str]| -> Vec<SocketAddr> {
            v.iter()
                .map(|a| SocketAddr::new(a.parse().unwrap(), 443))
                .collect()
        };
        // a name that resolves to loopback (DNS rebinding) is refused
        assert!(matches!(
            vetted("evil.example", addrs(&["127.0.0.1"]), &cfg),
            Err(GuardError::Address { .. })
        ));
        // only the vetted addresses of a mixed answer are returned
        assert_eq!(
            vetted(
                "mixed.example",
                addrs(&["169.254.169.254", "93.184.216.34"]),
                &cfg
            )
            .unwrap(),
            addrs(&["93.184.216.34"])
        );
        assert!(matches!(
            vetted("none.example", Vec::new(), &cfg),
            Err(GuardError::Resolve { .. })
        ));
    }

    #[tokio::test]
    async fn localhost_resolves_to_loopback_and_is_refused_unless_listed() {
        let cfg = GuardConfig {
            allowed_ports: vec![8443],
            ..GuardConfig::default()
        };
        let url = RemoteUrl::parse("https://localhost:8443/", &cfg).unwrap();
        assert!(matches!(
            resolve(&url, &cfg).await,
            Err(GuardError::Address { .. })
        ));
        let open = GuardConfig {
            allow_addresses: vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
            ..cfg
        };
        let got = resolve(&url, &open).await.unwrap();
        assert!(
            got.iter().all(|a| a.ip().is_loopback() && a.port() == 8443),
            "{got:?}"
        );
    }
}
