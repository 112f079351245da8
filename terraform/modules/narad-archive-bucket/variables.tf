variable "bucket_name" {
  type        = string
  description = "Name of the archive bucket (globally unique). Narad's archive_url becomes s3://<bucket_name>/<prefix>."

  validation {
    condition = (
      can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name)) &&
      !strcontains(var.bucket_name, "..") &&
      !can(regex("^\\d+\\.\\d+\\.\\d+\\.\\d+$", var.bucket_name)) &&
      !startswith(var.bucket_name, "xn--") &&
      !startswith(var.bucket_name, "sthree-") &&
      !endswith(var.bucket_name, "-s3alias") &&
      !endswith(var.bucket_name, "--ol-s3")
    )
    error_message = "bucket_name must follow the S3 naming rules: 3-63 lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit, no '..', not an IP address, no xn--/sthree- prefix or -s3alias/--ol-s3 suffix."
  }
}

variable "prefix" {
  type        = string
  description = "Key prefix Narad archives under (no leading or trailing slash). The role of narad-cluster is limited to it, so it must not be empty."
  default     = "narad"

  validation {
    condition     = can(regex("^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$", var.prefix)) && !contains(split("/", var.prefix), "..") && !contains(split("/", var.prefix), ".")
    error_message = "prefix must be one or more path segments of S3-safe characters (letters, digits, ! _ . * ' ( ) -), joined by single slashes, with no leading or trailing slash and no '.' or '..' segment."
  }
}

variable "archive_retention_days" {
  type        = number
  description = "Narad's archive retention in days (archive_retention_ms; 0 keeps forever). Narad deletes archived files itself, manifest first; S3's own expiration (expire_current_objects) is only a safety net, off by default."
  default     = 0

  validation {
    condition     = var.archive_retention_days >= 0 && floor(var.archive_retention_days) == var.archive_retention_days
    error_message = "archive_retention_days must be a whole number of 0 or more."
  }
}

variable "expire_current_objects" {
  type        = bool
  description = "Also let S3 expire current objects under <prefix>/topic= once they are archive_retention_days + expiration_margin_days old (needs archive_retention_days > 0). Off by default: S3 ages objects by upload time, and an idle topic's _topic.json or manifest can be older than that while still needed by a restore (see README)."
  default     = false

  validation {
    condition     = !var.expire_current_objects || var.archive_retention_days > 0
    error_message = "expire_current_objects needs archive_retention_days > 0."
  }
}

variable "expiration_margin_days" {
  type        = number
  description = "Days added to archive_retention_days before the S3 safety-net expiration (expire_current_objects) acts, so Narad's own retention always acts first."
  default     = 30

  validation {
    condition     = var.expiration_margin_days >= 1 && floor(var.expiration_margin_days) == var.expiration_margin_days
    error_message = "expiration_margin_days must be a whole number of 1 or more."
  }
}

variable "noncurrent_version_expiration_days" {
  type        = number
  description = "Days a replaced or deleted object version is kept (versioning keeps every overwrite of manifests and of the catalog snapshot: this bounds their cost)."
  default     = 7

  validation {
    condition     = var.noncurrent_version_expiration_days >= 1 && var.noncurrent_version_expiration_days <= 3650 && floor(var.noncurrent_version_expiration_days) == var.noncurrent_version_expiration_days
    error_message = "noncurrent_version_expiration_days must be a whole number between 1 and 3650."
  }
}

variable "abort_incomplete_multipart_upload_days" {
  type        = number
  description = "Days after which an unfinished multipart upload (a Parquet object over 8 MiB whose upload was interrupted) is aborted and its parts freed."
  default     = 2

  validation {
    condition     = var.abort_incomplete_multipart_upload_days >= 1 && floor(var.abort_incomplete_multipart_upload_days) == var.abort_incomplete_multipart_upload_days
    error_message = "abort_incomplete_multipart_upload_days must be a whole number of 1 or more."
  }
}

variable "kms_key_deletion_window_days" {
  type        = number
  description = "Waiting period before the bucket's KMS key is deleted after a destroy (7-30 days). Objects encrypted under a deleted key cannot be read by anyone."
  default     = 30

  validation {
    condition     = var.kms_key_deletion_window_days >= 7 && var.kms_key_deletion_window_days <= 30 && floor(var.kms_key_deletion_window_days) == var.kms_key_deletion_window_days
    error_message = "kms_key_deletion_window_days must be a whole number between 7 and 30."
  }
}

variable "access_log_bucket" {
  type        = string
  description = "Existing bucket that receives this bucket's server access logs (under access-logs/<bucket_name>/); null: none, unless create_access_log_bucket."
  default     = null

  validation {
    condition     = var.access_log_bucket == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.access_log_bucket))
    error_message = "access_log_bucket must be null or a valid S3 bucket name."
  }
}

variable "create_access_log_bucket" {
  type        = bool
  description = "Create a bucket <bucket_name>-logs for this bucket's server access logs (SSE-S3: S3 log delivery cannot write with a customer KMS key). Not together with access_log_bucket."
  default     = false

  validation {
    condition     = !(var.create_access_log_bucket && var.access_log_bucket != null)
    error_message = "Set access_log_bucket or create_access_log_bucket, not both."
  }
}

variable "access_log_retention_days" {
  type        = number
  description = "Days the created access-log bucket keeps its logs."
  default     = 90

  validation {
    condition     = var.access_log_retention_days >= 1 && floor(var.access_log_retention_days) == var.access_log_retention_days
    error_message = "access_log_retention_days must be a whole number of 1 or more."
  }
}

variable "force_destroy" {
  type        = bool
  description = "Let `terraform destroy` delete a bucket that still holds objects (every archived record). Keep false outside experiments."
  default     = false
}

variable "tags" {
  type        = map(string)
  description = "Tags for every resource of the module."
  default     = {}
}
