# Two clusters in two regions, each with its own archive bucket. Cluster A (primary) mirrors
# var.topic to cluster B (standby) through a remote child declared in narad.tf.

provider "aws" {
  alias  = "primary"
  region = var.primary.region

  default_tags {
    tags = {
      "narad:example" = "two-region-dr"
      "narad:role"    = "primary"
    }
  }
}

provider "aws" {
  alias  = "standby"
  region = var.standby.region

  default_tags {
    tags = {
      "narad:example" = "two-region-dr"
      "narad:role"    = "standby"
    }
  }
}

module "primary" {
  source = "../../modules/narad-cluster"

  providers = {
    aws = aws.primary
  }

  name                = var.primary.name
  vpc_id              = var.primary.vpc_id
  subnet_ids          = var.primary.subnet_ids
  client_cidrs        = var.primary.client_cidrs
  instance_type       = var.instance_type
  data_volume_size_gb = var.data_volume_size_gb

  artifact_url    = var.artifact_url
  artifact_sha256 = var.artifact_sha256

  archive_bucket_name              = var.primary.archive_bucket_name
  archive_retention_days           = var.archive_retention_days
  archive_create_access_log_bucket = true

  # HTTPS for clients and for the provider; B's remote (if B ever mirrors back, failback)
  # needs A to speak https too.
  lb_certificate_arn = var.primary.lb_certificate_arn
  lb_dns             = var.primary.lb_dns
  lb_internal        = var.lb_internal
}

module "standby" {
  source = "../../modules/narad-cluster"

  providers = {
    aws = aws.standby
  }

  name                = var.standby.name
  vpc_id              = var.standby.vpc_id
  subnet_ids          = var.standby.subnet_ids
  client_cidrs        = var.standby.client_cidrs
  instance_type       = var.instance_type
  data_volume_size_gb = var.data_volume_size_gb

  artifact_url    = var.artifact_url
  artifact_sha256 = var.artifact_sha256

  archive_bucket_name              = var.standby.archive_bucket_name
  archive_retention_days           = var.archive_retention_days
  archive_create_access_log_bucket = true

  # A remote is https only, on a port of remotes_allowed_ports (443): B's listener is TLS
  # on 443 under a name its certificate covers.
  lb_certificate_arn = var.standby.lb_certificate_arn
  lb_dns             = var.standby.lb_dns
  lb_internal        = var.lb_internal
}
