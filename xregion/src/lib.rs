//! Remote children: mirroring a topic to another cluster over HTTPS.
//!
//! Built so far: [`seal`] (a remote's password sealed under the cluster secret, bound to the
//! remote's identity), [`guard`] (what a remote's URL may name and which addresses a sender
//! may connect to) and [`client`] (the HTTPS client that connects only where the guard
//! allows, follows no redirect and bounds every answer), [`remote`] (a catalog remote made
//! usable: its credential's identity, a client with the password opened) and [`checks`] (what
//! a remote must pass before anything is sent to it). The sender (lanes, breaker) comes next
//! (issue 15; docs/xregion.md).

pub mod checks;
pub mod client;
pub mod guard;
pub mod remote;
pub mod seal;
pub mod sender;
