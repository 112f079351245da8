provider "aws" {
  region = var.region

  default_tags {
    tags = {
      "narad:example" = "single-region"
    }
  }
}

module "narad" {
  source = "../../modules/narad-cluster"

  name       = var.name
  vpc_id     = var.vpc_id
  subnet_ids = var.subnet_ids

  # Only your clients' networks; never a default of 0.0.0.0/0.
  client_cidrs = var.client_cidrs

  node_ids            = [1, 2, 3]
  initial_member_ids  = [1, 2, 3]
  instance_type       = var.instance_type
  data_volume_size_gb = var.data_volume_size_gb
  route53_zone_id     = var.route53_zone_id

  artifact_url    = var.artifact_url
  artifact_sha256 = var.artifact_sha256

  archive_bucket_name              = var.archive_bucket_name
  archive_retention_days           = var.archive_retention_days
  archive_create_access_log_bucket = true
  local_retention_ms               = var.local_retention_hours * 3600000

  lb_certificate_arn = var.lb_certificate_arn
  lb_dns             = var.lb_dns

  create_s3_gateway_endpoint = length(var.route_table_ids) > 0
  route_table_ids            = var.route_table_ids

  metrics_port  = 9100
  metrics_cidrs = var.metrics_cidrs
}
