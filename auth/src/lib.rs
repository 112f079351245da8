//! Users, grants and credential checks.
//!
//! - [`grant`]: actions, topic patterns, and what a user may do.
//! - [`record`]: a user record and the bounds on its fields.
//! - [`store`]: the user records and the commands that change them, persisted in the data
//!   directory. Every change is a [`store::UserCommand`] that carries its result (the password
//!   is hashed before the command exists), so applying it is deterministic: a replicated
//!   metastore can ship the same commands unchanged.
//! - [`carry`]: users carried from another cluster over a remote, and the plan that says
//!   what such a list changes here.
//! - [`root`]: the root user made at a secured first start.
//! - [`authn`]: HTTP Basic credentials checked against argon2 hashes, with a per-process
//!   cache of verified credentials and failed-login throttling.

pub mod authn;
pub mod carry;
pub mod grant;
pub mod record;
pub mod root;
pub mod store;

pub use authn::{AuthError, Authenticator};
pub use grant::{Action, Grant};
pub use store::{UserCommand, UserRecord, UserStore};
