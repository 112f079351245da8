//! The archive's Parquet format (version 1, documented in `docs/archive-format.md`): one file
//! per sealed segment, one row per record.
//!
//! | column      | type                              | null |
//! |-------------|-----------------------------------|------|
//! | `offset`    | int64                             | no   |
//! | `timestamp` | timestamp(ms, UTC) — commit time  | no   |
//! | `delay_ms`  | int32                             | no   |
//! | `key`       | binary                            | yes  |
//! | `headers`   | map<utf8, binary>                 | yes  |
//! | `payload`   | binary                            | no   |
//! | `topic_id`  | uint64 — the topic incarnation    | no   |
//!
//! zstd, statistics at page level (so the column and offset indexes are written), row groups
//! of [`ROW_GROUP_ROWS`] rows and pages of [`PAGE_ROWS`] rows: an offset or time lookup reads
//! one row group of a file, and one page of its `offset` column to find the row.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int32Builder, Int64Builder, MapBuilder, StringBuilder,
    TimestampMillisecondBuilder, UInt64Builder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMillisecondType};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use bytes::Bytes;
use narad_core::record::Record;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::{KeyValue, ParquetMetaData};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;

/// Bumped on any incompatible change; readers refuse versions they do not know.
pub const FORMAT_VERSION: u32 = 1;
pub const ROW_GROUP_ROWS: usize = 16 * 1024;
pub const PAGE_ROWS: usize = 1024;

/// Key-value metadata in every file's footer.
pub const META_VERSION: &str = "narad.format_version";
pub const META_TOPIC: &str = "narad.topic";
pub const META_TOPIC_ID: &str = "narad.topic_id";
pub const META_PARTITION: &str = "narad.partition";

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("not a narad archive file: {0}")]
    Foreign(String),
}

/// What a file must hold, checked after upload from its footer alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSummary {
    pub rows: u64,
    pub first_offset: u64,
    pub last_offset: u64,
    pub min_ts: i64,
    pub max_ts: i64,
}

fn schema(headers_type: DataType) -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("delay_ms", DataType::Int32, false),
        Field::new("key", DataType::Binary, true),
        Field::new("headers", headers_type, true),
        Field::new("payload", DataType::Binary, false),
        Field::new("topic_id", DataType::UInt64, false),
    ]))
}

/// Encodes one segment's records (in offset order) as a Parquet file.
pub fn encode(
    topic: &str,
    topic_id: u64,
    partition: u32,
    records: &[Record],
) -> Result<Bytes, FormatError> {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_key_value_metadata(Some(vec![
            KeyValue::new(META_VERSION.into(), FORMAT_VERSION.to_string()),
            KeyValue::new(META_TOPIC.into(), topic.to_owned()),
            KeyValue::new(META_TOPIC_ID.into(), topic_id.to_string()),
            KeyValue::new(META_PARTITION.into(), partition.to_string()),
        ]))
        .build();
    let mut writer: Option<ArrowWriter<Vec<u8>>> = None;
    for chunk in records.chunks(ROW_GROUP_ROWS) {
        let batch = to_batch(topic_id, chunk)?;
        let w = match &mut writer {
            Some(w) => w,
            None => writer.insert(ArrowWriter::try_new(
                Vec::new(),
                batch.schema(),
                Some(props.clone()),
            )?),
        };
        w.write(&batch)?;
    }
    let w = match writer {
        Some(w) => w,
        None => ArrowWriter::try_new(Vec::new(), to_batch(topic_id, &[])?.schema(), Some(props))?,
    };
    Ok(Bytes::from(w.into_inner()?))
}

fn to_batch(topic_id: u64, records: &[Record]) -> Result<RecordBatch, FormatError> {
    let n = records.len();
    let mut offset = Int64Builder::with_capacity(n);
    let mut ts = TimestampMillisecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut delay = Int32Builder::with_capacity(n);
    let mut key = BinaryBuilder::new();
    let mut headers = MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new());
    let mut payload =
        BinaryBuilder::with_capacity(n, records.iter().map(|r| r.payload.len()).sum());
    let mut tid = UInt64Builder::with_capacity(n);
    for r in records {
        offset.append_value(r.offset as i64);
        ts.append_value(r.timestamp_ms);
        delay.append_value(r.delay_ms as i32);
        key.append_option(r.key.as_deref());
        if r.headers.is_empty() {
            headers.append(false)?;
        } else {
            for (k, v) in &r.headers {
                headers.keys().append_value(k);
                headers.values().append_value(v);
            }
            headers.append(true)?;
        }
        payload.append_value(&r.payload);
        tid.append_value(topic_id);
    }
    let headers = headers.finish();
    let schema = schema(headers.data_type().clone());
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(offset.finish()),
            Arc::new(ts.finish()),
            Arc::new(delay.finish()),
            Arc::new(key.finish()),
            Arc::new(headers),
            Arc::new(payload.finish()),
            Arc::new(tid.finish()),
        ],
    )?)
}

/// Checks the footer's version and returns `(topic_id, summary)` from row counts and the
/// `offset`/`timestamp` column statistics of every row group.
pub fn summarize(meta: &ParquetMetaData) -> Result<(u64, FileSummary), FormatError> {
    let kv = meta.file_metadata().key_value_metadata();
    let get = |k: &str| {
        kv.and_then(|kv| kv.iter().find(|e| e.key == k))
            .and_then(|e| e.value.clone())
    };
    match get(META_VERSION).and_then(|v| v.parse::<u32>().ok()) {
        Some(v) if v == FORMAT_VERSION => {}
        other => {
            return Err(FormatError::Foreign(format!(
                "format version {other:?}, this build reads {FORMAT_VERSION}"
            )));
        }
    }
    let topic_id = get(META_TOPIC_ID)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| FormatError::Foreign("no topic id".into()))?;
    let mut s = FileSummary {
        rows: meta.file_metadata().num_rows() as u64,
        first_offset: u64::MAX,
        last_offset: 0,
        min_ts: i64::MAX,
        max_ts: i64::MIN,
    };
    for rg in meta.row_groups() {
        let (lo, hi) = int64_range(rg.column(0).statistics())
            .ok_or_else(|| FormatError::Foreign("offset column has no statistics".into()))?;
        s.first_offset = s.first_offset.min(lo as u64);
        s.last_offset = s.last_offset.max(hi as u64);
        if let Some((lo, hi)) = int64_range(rg.column(1).statistics()) {
            s.min_ts = s.min_ts.min(lo);
            s.max_ts = s.max_ts.max(hi);
        }
    }
    Ok((topic_id, s))
}

/// `(min, max)` of an int64 (or timestamp) column chunk.
pub fn int64_range(stats: Option<&Statistics>) -> Option<(i64, i64)> {
    match stats? {
        Statistics::Int64(v) => Some((*v.min_opt()?, *v.max_opt()?)),
        _ => None,
    }
}

/// Decodes the given row groups (all if `None`) of a file back into records.
pub fn decode(file: Bytes, row_groups: Option<Vec<usize>>) -> Result<Vec<Record>, FormatError> {
    let mut builder = ParquetRecordBatchReaderBuilder::try_new(file)?;
    if let Some(rg) = row_groups {
        builder = builder.with_row_groups(rg);
    }
    let mut out = Vec::new();
    for batch in builder.with_batch_size(8192).build()? {
        let b = batch?;
        let col = |name: &str| {
            b.column_by_name(name)
                .cloned()
                .ok_or_else(|| FormatError::Foreign(format!("missing column {name}")))
        };
        let (offset, ts, delay, key, headers, payload) = (
            col("offset")?,
            col("timestamp")?,
            col("delay_ms")?,
            col("key")?,
            col("headers")?,
            col("payload")?,
        );
        let offset = offset.as_primitive::<Int64Type>();
        let ts = ts.as_primitive::<TimestampMillisecondType>();
        let delay = delay.as_primitive::<Int32Type>();
        let key = key.as_binary::<i32>();
        let headers = headers.as_map();
        let payload = payload.as_binary::<i32>();
        for i in 0..b.num_rows() {
            let hs = if headers.is_null(i) {
                Vec::new()
            } else {
                let entry = headers.value(i);
                let ks = entry.column(0).as_string::<i32>();
                let vs = entry.column(1).as_binary::<i32>();
                (0..entry.len())
                    .map(|j| (ks.value(j).to_owned(), Bytes::copy_from_slice(vs.value(j))))
                    .collect()
            };
            out.push(Record {
                offset: offset.value(i) as u64,
                timestamp_ms: ts.value(i),
                delay_ms: delay.value(i) as u32,
                key: (!key.is_null(i)).then(|| Bytes::copy_from_slice(key.value(i))),
                headers: hs,
                payload: Bytes::copy_from_slice(payload.value(i)),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    pub fn records(first: u64, n: u64) -> Vec<Record> {
        (first..first + n)
            .map(|o| Record {
                offset: o,
                timestamp_ms: 1_764_000_000_000 + o as i64,
                delay_ms: (o % 3) as u32 * 100,
                key: (o % 2 == 0).then(|| Bytes::from(format!("k{o}"))),
                headers: if o % 5 == 0 {
                    vec![("trace".into(), Bytes::from(format!("t{o}")))]
                } else {
                    Vec::new()
                },
                payload: Bytes::from(format!("{{\"n\":{o}}}")),
            })
            .collect()
    }

    #[test]
    fn round_trip_summary_and_row_group_pruning() {
        let recs = records(1000, 40_000);
        let file = encode("orders", 7, 2, &recs).unwrap();
        let reader = SerializedFileReader::new(file.clone()).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.num_row_groups(), 3, "16k rows per group");
        let (tid, s) = summarize(meta).unwrap();
        assert_eq!(tid, 7);
        assert_eq!(
            s,
            FileSummary {
                rows: 40_000,
                first_offset: 1000,
                last_offset: 40_999,
                min_ts: recs[0].timestamp_ms,
                max_ts: recs[39_999].timestamp_ms,
            }
        );
        assert!(
            meta.row_group(0).column(0).column_index_offset().is_some()
                && meta.row_group(0).column(0).offset_index_offset().is_some(),
            "page index written"
        );
        let back = decode(file.clone(), None).unwrap();
        assert_eq!(back.len(), recs.len());
        for (a, b) in back.iter().zip(&recs) {
            assert_eq!(
                (
                    a.offset,
                    a.timestamp_ms,
                    a.delay_ms,
                    &a.key,
                    &a.headers,
                    &a.payload
                ),
                (
                    b.offset,
                    b.timestamp_ms,
                    b.delay_ms,
                    &b.key,
                    &b.headers,
                    &b.payload
                )
            );
        }
        let second = decode(file, Some(vec![1])).unwrap();
        assert_eq!(second[0].offset, 1000 + 16 * 1024);
        assert_eq!(second.len(), 16 * 1024);
    }

    #[test]
    fn empty_and_foreign_files() {
        let file = encode("t", 1, 0, &[]).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        assert_eq!(reader.metadata().file_metadata().num_rows(), 0);
        // a Parquet file without our metadata is refused
        let props = WriterProperties::builder().build();
        let batch = to_batch(1, &records(0, 3)).unwrap();
        let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        let foreign = Bytes::from(w.into_inner().unwrap());
        let reader = SerializedFileReader::new(foreign).unwrap();
        assert!(matches!(
            summarize(reader.metadata()),
            Err(FormatError::Foreign(_))
        ));
    }
}
