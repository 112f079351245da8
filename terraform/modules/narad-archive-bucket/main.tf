data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  log_bucket = var.create_access_log_bucket ? aws_s3_bucket.logs[0].id : var.access_log_bucket
}

# --- the key ----------------------------------------------------------------------------

data "aws_iam_policy_document" "key" {
  #checkov:skip=CKV_AWS_111:A key policy's "*" resource is the key itself; this is AWS's default key policy (the account administers the key through IAM), written out.
  #checkov:skip=CKV_AWS_356:A key policy's "*" resource is the key itself; this is AWS's default key policy (the account administers the key through IAM), written out.
  #checkov:skip=CKV_AWS_109:A key policy's "*" resource is the key itself; this is AWS's default key policy (the account administers the key through IAM), written out.
  # The account administers the key through IAM (the default key policy, written out);
  # narad-cluster grants its nodes kms:Decrypt/GenerateDataKey on this key only through S3.
  statement {
    sid       = "AccountAdministersTheKeyThroughIAM"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }
}

resource "aws_kms_key" "archive" {
  description             = "Narad archive ${var.bucket_name}: S3 default encryption"
  enable_key_rotation     = true
  deletion_window_in_days = var.kms_key_deletion_window_days
  policy                  = data.aws_iam_policy_document.key.json
  tags                    = var.tags
}

resource "aws_kms_alias" "archive" {
  name          = "alias/narad-archive-${replace(var.bucket_name, ".", "-")}"
  target_key_id = aws_kms_key.archive.key_id
}

# --- the bucket -------------------------------------------------------------------------

resource "aws_s3_bucket" "archive" {
  #checkov:skip=CKV_AWS_144:Cross-region copies of Narad's data are made by Narad itself (remote children into the standby cluster's own archive, examples/two-region-dr); replicating this bucket would copy manifests and a catalog snapshot no standby can own.
  #checkov:skip=CKV2_AWS_62:Nothing consumes bucket events; Narad lists and reads manifests itself.
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_ownership_controls" "archive" {
  bucket = aws_s3_bucket.archive.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "archive" {
  bucket                  = aws_s3_bucket.archive.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "archive" {
  bucket = aws_s3_bucket.archive.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "archive" {
  bucket = aws_s3_bucket.archive.id

  rule {
    # An S3 Bucket Key cuts KMS requests (and their cost) to one per bucket and key period
    # instead of one per object.
    bucket_key_enabled = true

    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.archive.arn
    }
  }
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.archive.arn,
      "${aws_s3_bucket.archive.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid     = "DenyOutdatedTLS"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.archive.arn,
      "${aws_s3_bucket.archive.arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "archive" {
  bucket = aws_s3_bucket.archive.id
  policy = data.aws_iam_policy_document.bucket.json

  # a policy put before the public access block could be refused as public
  depends_on = [aws_s3_bucket_public_access_block.archive]
}

resource "aws_s3_bucket_lifecycle_configuration" "archive" {
  bucket = aws_s3_bucket.archive.id

  # Every overwrite of a manifest or of the catalog snapshot, and every object Narad's
  # retention deletes, leaves a noncurrent version; they go after this many days.
  rule {
    id     = "noncurrent-versions"
    status = "Enabled"

    filter {
      prefix = "${var.prefix}/"
    }

    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_expiration_days
    }

    expiration {
      expired_object_delete_marker = true
    }
  }

  # The whole bucket: a part left by an interrupted upload is never of use to anyone.
  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_upload_days
    }
  }

  # Safety net behind Narad's own retention (archive_retention_ms), only when asked for:
  # under <prefix>/topic= only, never <prefix>/_catalog/ (the catalog snapshot holds the
  # users and is rewritten only when something changes).
  dynamic "rule" {
    for_each = var.expire_current_objects ? [1] : []

    content {
      id     = "archive-retention-safety-net"
      status = "Enabled"

      filter {
        prefix = "${var.prefix}/topic="
      }

      expiration {
        days = var.archive_retention_days + var.expiration_margin_days
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.archive]
}

resource "aws_s3_bucket_logging" "archive" {
  count = var.create_access_log_bucket || var.access_log_bucket != null ? 1 : 0

  bucket        = aws_s3_bucket.archive.id
  target_bucket = local.log_bucket
  target_prefix = "access-logs/${var.bucket_name}/"
}

# --- the optional access-log bucket -----------------------------------------------------

resource "aws_s3_bucket" "logs" {
  #checkov:skip=CKV_AWS_144:Access logs are not replicated; they are diagnostic, kept access_log_retention_days.
  #checkov:skip=CKV2_AWS_62:Nothing consumes events of the log bucket.
  #checkov:skip=CKV_AWS_18:This is the access-log bucket itself; logging it into itself would loop.
  #checkov:skip=CKV_AWS_145:S3 server access log delivery writes only with SSE-S3 (a customer KMS key on the target bucket is not supported), so this bucket uses SSE-S3.
  count = var.create_access_log_bucket ? 1 : 0

  bucket        = "${var.bucket_name}-logs"
  force_destroy = var.force_destroy
  tags          = var.tags
}

resource "aws_s3_bucket_ownership_controls" "logs" {
  count  = var.create_access_log_bucket ? 1 : 0
  bucket = aws_s3_bucket.logs[0].id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "logs" {
  count                   = var.create_access_log_bucket ? 1 : 0
  bucket                  = aws_s3_bucket.logs[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "logs" {
  count  = var.create_access_log_bucket ? 1 : 0
  bucket = aws_s3_bucket.logs[0].id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "logs" {
  count  = var.create_access_log_bucket ? 1 : 0
  bucket = aws_s3_bucket.logs[0].id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "logs" {
  count  = var.create_access_log_bucket ? 1 : 0
  bucket = aws_s3_bucket.logs[0].id

  rule {
    id     = "expire-access-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = var.access_log_retention_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 1
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }

  depends_on = [aws_s3_bucket_versioning.logs]
}

data "aws_iam_policy_document" "logs" {
  count = var.create_access_log_bucket ? 1 : 0

  statement {
    sid       = "S3ServerAccessLogsFromTheArchiveBucket"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs[0].arn}/access-logs/${var.bucket_name}/*"]

    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = [aws_s3_bucket.archive.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }

  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.logs[0].arn,
      "${aws_s3_bucket.logs[0].arn}/*",
    ]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "logs" {
  count  = var.create_access_log_bucket ? 1 : 0
  bucket = aws_s3_bucket.logs[0].id
  policy = data.aws_iam_policy_document.logs[0].json

  depends_on = [aws_s3_bucket_public_access_block.logs]
}
