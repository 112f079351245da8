//! Users and grants (`/v1/users...`).

use serde::{Deserialize, Serialize};

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrantAction {
    Produce,
    Consume,
    Create,
    /// Produce records carrying an origin (a remote child of another cluster).
    Replicate,
    /// Everything; global (no patterns). Only the root user grants it.
    Admin,
}

/// An action on the topics matching any of `patterns` (exact names, or a prefix and `*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub action: GrantAction,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
}

/// A user as the server shows it (never its password hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub username: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub root: bool,
    pub grants: Vec<Grant>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// `GET /v1/users`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserList {
    pub users: Vec<User>,
}

/// The body of `POST /v1/users`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateUser {
    pub username: String,
    pub password: String,
    #[serde(default)]
    pub grants: Vec<Grant>,
}

/// The body of `PUT /v1/users/{username}/grants` (replaces every grant).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetGrants {
    pub grants: Vec<Grant>,
}

/// The body of `PUT /v1/users/{username}/password`; `current_password` when changing your own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetPassword {
    pub new_password: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_password: Option<String>,
}
