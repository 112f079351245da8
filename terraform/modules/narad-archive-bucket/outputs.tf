output "bucket" {
  description = "Name of the archive bucket."
  value       = aws_s3_bucket.archive.id
}

output "bucket_arn" {
  description = "ARN of the archive bucket."
  value       = aws_s3_bucket.archive.arn
}

output "bucket_region" {
  description = "Region of the archive bucket (Narad's archive_region)."
  value       = aws_s3_bucket.archive.region
}

output "kms_key_arn" {
  description = "ARN of the KMS key the bucket encrypts with by default (rotation on). A role that reads or writes the archive needs kms:Decrypt and kms:GenerateDataKey on it."
  value       = aws_kms_key.archive.arn
}

output "prefix" {
  description = "Key prefix Narad archives under (no trailing slash)."
  value       = var.prefix
}

output "prefix_arn" {
  description = "ARN pattern of every object under the prefix (arn:...:s3:::bucket/prefix/*): the only objects a node's role may read, write or delete."
  value       = "${aws_s3_bucket.archive.arn}/${var.prefix}/*"
}

output "archive_url" {
  description = "Narad's archive_url for this bucket: s3://<bucket>/<prefix>."
  value       = "s3://${aws_s3_bucket.archive.id}/${var.prefix}"
}

output "archive_retention_ms" {
  description = "archive_retention_days in milliseconds, for Narad's archive_retention_ms (0 keeps forever)."
  value       = var.archive_retention_days * 86400000
}

output "access_log_bucket" {
  description = "Bucket receiving the server access logs, or null."
  value       = local.log_bucket
}
