data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

data "aws_region" "current" {}

data "aws_subnet" "node" {
  for_each = toset(var.subnet_ids)
  id       = each.value
}

data "aws_route53_zone" "nodes" {
  count   = var.route53_zone_id == null ? 0 : 1
  zone_id = var.route53_zone_id
}

# Read once at create time: lifecycle.ignore_changes on the instances keeps a newer AMI from
# replacing running nodes (an upgrade of the OS is a node replacement, one at a time).
data "aws_ssm_parameter" "al2023" {
  count = var.ami_id == null ? 1 : 0
  name  = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-${var.architecture}"
}

locals {
  region     = data.aws_region.current.region
  partition  = data.aws_partition.current.partition
  account_id = data.aws_caller_identity.current.account_id
  ami_id     = var.ami_id != null ? var.ami_id : data.aws_ssm_parameter.al2023[0].insecure_value

  zone_name = var.route53_zone_id == null ? null : trimsuffix(data.aws_route53_zone.nodes[0].name, ".")

  # One entry per node, keyed by its id (a string, for for_each). Placement follows the
  # position in node_ids; the address follows the id, so a node under a new id at the same
  # position never takes the address an old member is still listed at.
  nodes = {
    for pos, id in var.node_ids : tostring(id) => {
      id         = id
      subnet_id  = var.subnet_ids[pos % length(var.subnet_ids)]
      az         = data.aws_subnet.node[var.subnet_ids[pos % length(var.subnet_ids)]].availability_zone
      private_ip = cidrhost(data.aws_subnet.node[var.subnet_ids[pos % length(var.subnet_ids)]].cidr_block, var.host_number_offset + id)
      dns_name   = local.zone_name == null ? null : "${var.name}-${id}.${local.zone_name}"
    }
  }

  members = {
    for id, n in local.nodes : id => {
      host         = coalesce(n.dns_name, n.private_ip)
      http_port    = var.http_port
      cluster_port = var.cluster_port
    }
  }

  secret_prefix = coalesce(var.secret_name_prefix, var.secret_store == "ssm" ? "/narad/${var.name}" : "narad/${var.name}")
  secret_names = {
    cluster_secret          = "${local.secret_prefix}/cluster-secret"
    cluster_secret_previous = "${local.secret_prefix}/cluster-secret-previous"
    admin_password          = "${local.secret_prefix}/admin-password"
  }

  data_dir            = var.data_dir
  secrets_dir         = "/etc/narad/secrets"
  cluster_secret_file = "${local.secrets_dir}/cluster-secret"
  tls_dir             = "/etc/narad/tls"

  lb_tls     = var.lb_certificate_arn != null
  broker_tls = var.broker_tls != null
  lb_port    = coalesce(var.lb_port, local.lb_tls ? 443 : var.http_port)
  scheme     = local.lb_tls ? "https" : (local.broker_tls ? "https" : "http")

  common_tags = merge(var.tags, {
    "narad:cluster" = var.name
  })
}

module "archive" {
  source = "../narad-archive-bucket"

  bucket_name                        = var.archive_bucket_name
  prefix                             = var.archive_prefix
  archive_retention_days             = var.archive_retention_days
  noncurrent_version_expiration_days = var.archive_noncurrent_version_expiration_days
  access_log_bucket                  = var.archive_access_log_bucket
  create_access_log_bucket           = var.archive_create_access_log_bucket
  force_destroy                      = var.archive_force_destroy
  tags                               = local.common_tags
}

# Every node's files, rendered by the provider-free submodule that tests/render also runs
# (and boots three brokers from).
module "node_config" {
  source   = "./modules/node-config"
  for_each = local.nodes

  node_id               = each.value.id
  bind_address          = "0.0.0.0"
  members               = local.members
  initial_member_ids    = var.initial_member_ids
  data_dir              = local.data_dir
  cluster_secret_file   = local.cluster_secret_file
  archive_url           = module.archive.archive_url
  archive_region        = local.region
  archive_retention_ms  = module.archive.archive_retention_ms
  local_retention_ms    = var.local_retention_ms
  segment_max_bytes     = var.segment_max_bytes
  segment_max_age_ms    = var.segment_max_age_ms
  tiering_interval_ms   = var.tiering_interval_ms
  metrics_port          = var.metrics_port
  tls_cert_file         = local.broker_tls ? "${local.tls_dir}/cert.pem" : ""
  tls_key_file          = local.broker_tls ? "${local.tls_dir}/key.pem" : ""
  log_level             = var.log_level
  remotes_allowed_ports = var.remotes_allowed_ports
  remotes_allowed_hosts = var.remotes_allowed_hosts
  extra_config          = var.extra_config
  secrets_dir           = local.secrets_dir

  bootstrap = {
    region                      = local.region
    artifact_url                = var.artifact_url
    artifact_sha256             = var.artifact_sha256
    volume_id                   = aws_ebs_volume.data[each.key].id
    device_name                 = var.data_volume_device_name
    secret_store                = var.secret_store
    cluster_secret_ref          = local.secret_names.cluster_secret
    cluster_secret_previous_ref = local.secret_names.cluster_secret_previous
    admin_password_ref          = local.secret_names.admin_password
    tls_cert_ref                = local.broker_tls ? var.broker_tls.certificate_secret : ""
    tls_key_ref                 = local.broker_tls ? var.broker_tls.private_key_secret : ""
  }
}
