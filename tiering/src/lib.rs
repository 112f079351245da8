//! Tiering: every sealed segment becomes one Parquet object in S3-compatible storage (or a
//! local directory, or memory), verified from its stored footer before local retention may
//! delete the segment. The archive serves long replay, analytics engines reading it in place,
//! and rebuilding a node that lost its disk (with the catalog snapshot: topics, fan-out links and
//! users, sealed under the cluster secret). Format and layout: `docs/archive-format.md`.

pub mod archive;
pub mod catalog;
pub mod format;
pub mod tierer;
