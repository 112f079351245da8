//! Remote children: mirroring a topic to another cluster over HTTPS.
//!
//! - [`seal`]: a remote's password sealed under the cluster secret, bound to the remote's
//!   identity.
//! - [`guard`]: what a remote's URL may name and which addresses a sender may connect to.
//! - [`client`]: the HTTPS client that connects only where the guard allows, follows no
//!   redirect and bounds every answer.
//! - [`remote`]: a catalog remote made usable (its credential's identity, a client with the
//!   password opened).
//! - [`checks`]: what a remote must pass before anything is sent to it.
//! - [`sender`]: ships a topic's records, settings and consumer progress to its remote
//!   children (lanes per remote, a gate per remote, retries that never skip a record).
//!
//! The cursors that read the parent's partitions, the topic roles (primary, mirror, demoted)
//! and promote are in `narad_core` (`broker::remotes`, `broker::progress`, `catalog::role`);
//! the HTTP side of links and roles is in `narad_infra::http`. See docs/xregion.md.

pub mod checks;
pub mod client;
pub mod guard;
pub mod remote;
pub mod seal;
pub mod sender;
