"""Reads Narad's archive in place with engines Narad did not write: pyarrow and DuckDB.

Usage: read_archive.py BUCKET PREFIX TOPIC   (S3 endpoint and credentials from the standard
AWS_* variables). Prints one JSON object with what each engine saw; the calling test
compares it with the broker's manifests.
"""
import glob
import json
import os
import sys
from urllib.parse import urlparse

import duckdb
import duckdb_extension_httpfs
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyarrow import fs

bucket, prefix, topic = sys.argv[1:4]
endpoint = urlparse(os.environ["AWS_ENDPOINT_URL"])
key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
region = os.environ.get("AWS_REGION", "us-east-1")
root = f"{bucket}/{prefix}/topic={topic}"

# pyarrow: Hive partitioning gives the `partition` column; `_manifest.json` is skipped
# (files starting with "_" are ignored by default).
s3 = fs.S3FileSystem(endpoint_override=endpoint.netloc, scheme=endpoint.scheme,
                     access_key=key, secret_key=secret, region=region)
table = ds.dataset(root, filesystem=s3, format="parquet", partitioning="hive").to_table()
per_partition = {}
for p in sorted(set(table.column("partition").to_pylist())):
    offsets = table.filter(pc.equal(table.column("partition"), p)).column("offset").to_pylist()
    per_partition[str(p)] = {"rows": len(offsets), "min": min(offsets), "max": max(offsets),
                             "dense": sorted(offsets) == list(range(min(offsets), max(offsets) + 1))}

# DuckDB with the httpfs extension loaded from its PyPI package (works offline).
ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_httpfs.__file__),
                             "**", "httpfs.duckdb_extension"), recursive=True)[0]
con = duckdb.connect()
con.execute(f"LOAD '{ext}'")
con.execute(f"""CREATE SECRET (TYPE s3, KEY_ID '{key}', SECRET '{secret}', REGION '{region}',
                ENDPOINT '{endpoint.netloc}', URL_STYLE 'path', USE_SSL false)""")
src = f"read_parquet('s3://{root}/*/*.parquet', hive_partitioning = true)"
total, kind_a = con.execute(f"""
    SELECT count(*),
           count(*) FILTER (WHERE json_extract_string(decode(payload), '$.kind') = 'a')
    FROM {src}""").fetchone()
first_ts_ms = con.execute(f"SELECT epoch_ms(min(timestamp)) FROM {src}").fetchone()[0]

print(json.dumps({
    "pyarrow": {"rows": table.num_rows, "partitions": per_partition,
                "columns": table.schema.names},
    "duckdb": {"rows": total, "kind_a": kind_a, "first_ts_ms": first_ts_ms},
}))
