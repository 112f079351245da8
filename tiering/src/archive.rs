//! Where the archive lives: an `object_store` behind `Arc<dyn ObjectStore>` (local files,
//! memory or S3 run the same code), its Hive-style layout, and the manifests.
//!
//! ```text
//! <prefix>/topic=<name>/_topic.json
//! <prefix>/topic=<name>/partition=<p>/_manifest.json
//! <prefix>/topic=<name>/partition=<p>/<first offset, 20 digits>-<last offset, 20 digits>.parquet
//! <prefix>/_catalog/catalog.bin            (the catalog snapshot, see `catalog.rs`)
//! <prefix>/_catalog/unopened-<ms>.bin      (a snapshot a restore could not open, kept)
//! ```
//!
//! Object names are deterministic, so a retried upload overwrites the same object. A manifest
//! is one object replaced by a single PUT (atomic on S3; write-then-rename on local files).

use std::sync::Arc;

use bytes::Bytes;
use narad_core::topic::TopicConfig;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::format::FORMAT_VERSION;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("archive url '{0}' not understood: use file:///path, memory:// or s3://bucket/prefix")]
    BadUrl(String),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("manifest {path}: {reason}")]
    BadManifest { path: String, reason: String },
    #[error("format: {0}")]
    Format(#[from] crate::format::FormatError),
    #[error("verification of {path} failed: {reason}")]
    Verify { path: String, reason: String },
    #[error("restoring {what}: {source}")]
    Restore {
        what: String,
        #[source]
        source: narad_core::broker::BrokerError,
    },
    #[error("restoring users: {0}")]
    RestoreUsers(#[source] narad_auth::store::StoreError),
    #[error("catalog snapshot of {0} bytes exceeds the {max} byte limit", max = crate::catalog::MAX_CATALOG_BYTES)]
    CatalogTooLarge(usize),
}

/// How to reach the archive. `s3://` settings left empty come from the standard AWS
/// environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`).
#[derive(Debug, Clone, Default)]
pub struct ArchiveSettings {
    pub url: String,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub allow_http: Option<bool>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Virtual-hosted-style requests (`bucket.host`); path style by default, which is what
    /// local S3-compatible servers want.
    pub virtual_hosted: bool,
}

/// One archive: a store and the prefix everything lives under.
#[derive(Clone, Debug)]
pub struct Archive {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: Path,
    /// The URL it was opened from, for logs.
    pub url: String,
}

impl Archive {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, url: &str) -> Self {
        Self {
            store,
            prefix: Path::from(prefix),
            url: url.to_owned(),
        }
    }

    /// Opens the archive a URL names. `file://` creates its directory.
    pub fn open(s: &ArchiveSettings) -> Result<Self, ArchiveError> {
        let url = s.url.trim();
        if let Some(rest) = url.strip_prefix("memory://") {
            let store = Arc::new(object_store::memory::InMemory::new());
            return Ok(Self::new(store, rest.trim_matches('/'), url));
        }
        if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() || !path.starts_with('/') {
                return Err(ArchiveError::BadUrl(url.into()));
            }
            narad_core::fsutil::create_dir_private(std::path::Path::new(path)).map_err(|e| {
                ArchiveError::Store(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(e),
                })
            })?;
            let store = Arc::new(object_store::local::LocalFileSystem::new_with_prefix(path)?);
            return Ok(Self::new(store, "", url));
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(ArchiveError::BadUrl(url.into()));
            }
            let mut b = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_virtual_hosted_style_request(s.virtual_hosted);
            let endpoint = s
                .endpoint
                .clone()
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
            if let Some(e) = endpoint {
                b = b.with_endpoint(e);
            }
            if let Some(r) = &s.region {
                b = b.with_region(r);
            }
            if let Some(h) = s.allow_http {
                b = b.with_allow_http(h);
            }
            if let Some(k) = &s.access_key_id {
                b = b.with_access_key_id(k);
            }
            if let Some(k) = &s.secret_access_key {
                b = b.with_secret_access_key(k);
            }
            return Ok(Self::new(
                Arc::new(b.build()?),
                prefix.trim_matches('/'),
                url,
            ));
        }
        Err(ArchiveError::BadUrl(url.into()))
    }

    fn join(&self, parts: &[&str]) -> Path {
        let mut p = self.prefix.clone();
        for part in parts {
            p = p.join(*part);
        }
        p
    }

    pub fn topic_dir(&self, topic: &str) -> Path {
        self.join(&[&format!("topic={topic}")])
    }

    pub fn topic_manifest_path(&self, topic: &str) -> Path {
        self.join(&[&format!("topic={topic}"), "_topic.json"])
    }

    /// The catalog snapshot object.
    pub fn catalog_path(&self) -> Path {
        self.join(&[crate::catalog::CATALOG_DIR, crate::catalog::CATALOG_FILE])
    }

    /// Where a snapshot that could not be opened is kept, named by its modification time.
    pub fn unopened_catalog_path(&self, modified_ms: i64) -> Path {
        self.join(&[
            crate::catalog::CATALOG_DIR,
            &format!("unopened-{modified_ms}.bin"),
        ])
    }

    /// The catalog snapshot object as stored (not opened), if there is one.
    pub async fn load_catalog(&self) -> Result<Option<Bytes>, ArchiveError> {
        match self.store.get(&self.catalog_path()).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Names of the objects under `_catalog/`: the snapshot and any kept unopened ones.
    pub async fn catalog_objects(&self) -> Result<Vec<String>, ArchiveError> {
        let dir = self.join(&[crate::catalog::CATALOG_DIR]);
        let listing = self.store.list_with_delimiter(Some(&dir)).await?;
        let mut names: Vec<String> = listing
            .objects
            .iter()
            .filter_map(|o| o.location.filename().map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    pub fn partition_dir(&self, topic: &str, partition: u32) -> Path {
        self.join(&[&format!("topic={topic}"), &format!("partition={partition}")])
    }

    pub fn manifest_path(&self, topic: &str, partition: u32) -> Path {
        self.partition_dir(topic, partition).join("_manifest.json")
    }

    pub fn segment_path(&self, topic: &str, partition: u32, first: u64, last: u64) -> Path {
        self.partition_dir(topic, partition)
            .join(segment_file_name(first, last).as_str())
    }

    /// The partition's manifest, or `None` if nothing was archived yet.
    pub async fn load_manifest(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Option<PartitionManifest>, ArchiveError> {
        let path = self.manifest_path(topic, partition);
        load_json(self.store.as_ref(), &path).await
    }

    pub async fn save_manifest(&self, m: &PartitionManifest) -> Result<(), ArchiveError> {
        let path = self.manifest_path(&m.topic, m.partition);
        save_json(self.store.as_ref(), &path, m).await
    }

    pub async fn load_topic(&self, topic: &str) -> Result<Option<TopicManifest>, ArchiveError> {
        load_json(self.store.as_ref(), &self.topic_manifest_path(topic)).await
    }

    pub async fn save_topic(&self, t: &TopicManifest) -> Result<(), ArchiveError> {
        save_json(self.store.as_ref(), &self.topic_manifest_path(&t.name), t).await
    }

    /// Names of the topics the archive holds (from their `_topic.json`).
    pub async fn list_topics(&self) -> Result<Vec<String>, ArchiveError> {
        let listing = self.store.list_with_delimiter(Some(&self.prefix)).await?;
        let mut names: Vec<String> = listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename()?.strip_prefix("topic=").map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }
}

pub fn segment_file_name(first: u64, last: u64) -> String {
    format!("{first:020}-{last:020}.parquet")
}

async fn load_json<T: serde::de::DeserializeOwned>(
    store: &dyn ObjectStore,
    path: &Path,
) -> Result<Option<T>, ArchiveError> {
    let bytes = match store.get(path).await {
        Ok(r) => r.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ArchiveError::BadManifest {
            path: path.to_string(),
            reason: e.to_string(),
        })
}

async fn save_json<T: Serialize>(
    store: &dyn ObjectStore,
    path: &Path,
    value: &T,
) -> Result<(), ArchiveError> {
    let body = serde_json::to_vec_pretty(value).expect("manifest serialises");
    store.put(path, PutPayload::from(Bytes::from(body))).await?;
    Ok(())
}

/// One archived segment, as the partition manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchivedSegment {
    pub first_offset: u64,
    pub last_offset: u64,
    pub rows: u64,
    pub min_ts: i64,
    pub max_ts: i64,
    /// Size of the Parquet object.
    pub object_bytes: u64,
    /// Size of the local segment it came from.
    pub segment_bytes: u64,
    /// File name inside the partition directory.
    pub object: String,
    pub archived_at_ms: i64,
}

/// What the archive holds for one partition. Segments are sorted and contiguous; offsets
/// below `start_offset` were deleted by archive retention (or never archived).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionManifest {
    pub format_version: u32,
    pub topic: String,
    pub topic_id: u64,
    pub partition: u32,
    pub start_offset: u64,
    /// One past the last archived offset.
    pub next_offset: u64,
    pub segments: Vec<ArchivedSegment>,
    /// The owner's queue frontier when it last archived a segment: its consumers had acked
    /// every offset below it. A partition rebuilt from the archive after its owner was lost
    /// delivers the archived records from here on again (absent: from the archive's start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_frontier: Option<u64>,
    /// Offset ranges `[from, to)` between archived segments that no record will ever fill
    /// (the lost tail of a partition rebuilt after its owner was lost): a replay from inside
    /// one goes on at its end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<(u64, u64)>,
}

impl PartitionManifest {
    pub fn new(topic: &str, topic_id: u64, partition: u32) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            topic: topic.to_owned(),
            topic_id,
            partition,
            start_offset: 0,
            next_offset: 0,
            segments: Vec::new(),
            queue_frontier: None,
            gaps: Vec::new(),
        }
    }

    /// The archived segment holding `offset`, or the first one after it.
    pub fn segment_at_or_after(&self, offset: u64) -> Option<&ArchivedSegment> {
        let i = self.segments.partition_point(|s| s.last_offset < offset);
        self.segments.get(i)
    }

    /// Where a read from `offset` goes on when the archive holds no record there: the end of
    /// the recorded gap holding it, if one does.
    pub fn gap_end(&self, offset: u64) -> Option<u64> {
        self.gaps
            .iter()
            .find(|&&(from, to)| from <= offset && offset < to)
            .map(|&(_, to)| to)
    }

    /// The first segment whose newest record is at or after `ts_ms`.
    pub fn segment_for_time(&self, ts_ms: i64) -> Option<&ArchivedSegment> {
        let i = self.segments.partition_point(|s| s.max_ts < ts_ms);
        self.segments.get(i)
    }
}

/// A topic's settings as archived, so a fresh node can rebuild it from the bucket alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicManifest {
    pub format_version: u32,
    pub name: String,
    pub topic_id: u64,
    pub created_at_ms: i64,
    pub config: TopicConfig,
    /// The creating user (security on), restored with the topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<u64>,
    /// The topic's JSON Schema versions, restored with the topic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schemas: Vec<narad_core::broker::SchemaVersion>,
}
