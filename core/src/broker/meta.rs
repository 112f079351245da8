//! Topic metadata on disk: `<data_dir>/topics.json`, replaced atomically (temp file, fsync,
//! rename, fsync of the directory) on every create, change and delete.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::topic::TopicConfig;

pub const META_FILE: &str = "topics.json";
const META_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TopicMeta {
    /// Incarnation id: a topic deleted and re-created with the same name gets a new one, and
    /// its data directory and receipt handles are keyed by it.
    pub id: u64,
    pub name: String,
    pub created_at_ms: i64,
    pub config: TopicConfig,
    /// Set when this topic is a fan-out child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<super::fanout::ParentLink>,
    /// The user who created the topic (with security on); it may alter and delete it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The owning user's id (users of one name over time have different ids).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<u64>,
    /// JSON Schema versions, oldest first; produce validates against the last one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<SchemaVersion>,
}

/// One version of a topic's JSON Schema. Versions only grow; each is kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SchemaVersion {
    pub version: u32,
    pub created_at_ms: i64,
    pub schema: serde_json::Value,
}

impl TopicMeta {
    pub fn dir_name(&self) -> String {
        format!("{}.{:016x}", self.name, self.id)
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetaFile {
    version: u32,
    topics: Vec<TopicMeta>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("io error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("topic metadata {path} is unreadable: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

impl MetaError {
    /// Whether this failed for want of a file descriptor.
    pub fn is_out_of_descriptors(&self) -> bool {
        match self {
            Self::Io { source, .. } => crate::log::is_out_of_descriptors(source),
            Self::Invalid { .. } => false,
        }
    }
}

pub fn load(data_dir: &Path) -> Result<Vec<TopicMeta>, MetaError> {
    let path = data_dir.join(META_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(MetaError::Io { path, source }),
    };
    let file: MetaFile = serde_json::from_slice(&bytes).map_err(|e| MetaError::Invalid {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if file.version != META_VERSION {
        return Err(MetaError::Invalid {
            path,
            reason: format!("unsupported version {}", file.version),
        });
    }
    Ok(file.topics)
}

pub fn store(data_dir: &Path, topics: Vec<TopicMeta>) -> Result<(), MetaError> {
    let path = data_dir.join(META_FILE);
    let body = serde_json::to_vec_pretty(&MetaFile {
        version: META_VERSION,
        topics,
    })
    .expect("metadata serialises");
    crate::fsutil::write_file_atomic(&path, &body).map_err(|source| MetaError::Io { path, source })
}
