locals {
  templates = "${path.module}/../../templates"

  me = var.members[tostring(var.node_id)]

  # The initial voters still present, in id order: every listed node advertises exactly the
  # address it is listed at (Narad refuses a start otherwise).
  listed = sort([for id in var.initial_member_ids : format("%05d", id) if contains(keys(var.members), tostring(id))])
  cluster_members = join(",", [
    for padded in local.listed :
    "${tonumber(padded)}@${var.members[tostring(tonumber(padded))].host}:${var.members[tostring(tonumber(padded))].cluster_port}"
  ])
  listen_addr       = "${var.bind_address}:${local.me.http_port}"
  cluster_addr      = "${var.bind_address}:${local.me.cluster_port}"
  cluster_advertise = "${local.me.host}:${local.me.cluster_port}"
  metrics_addr      = var.metrics_port == null ? "" : "${var.bind_address}:${var.metrics_port}"

  narad_toml = templatefile("${local.templates}/narad.toml.tftpl", {
    node_id               = var.node_id
    listen_addr           = local.listen_addr
    data_dir              = var.data_dir
    log_level             = var.log_level
    metrics_addr          = local.metrics_addr
    tls_cert_file         = var.tls_cert_file
    tls_key_file          = var.tls_key_file
    cluster_addr          = local.cluster_addr
    cluster_advertise     = local.cluster_advertise
    cluster_members       = local.cluster_members
    cluster_secret_file   = var.cluster_secret_file
    archive_url           = var.archive_url
    archive_region        = var.archive_region
    archive_retention_ms  = var.archive_retention_ms
    local_retention_ms    = var.local_retention_ms
    segment_max_bytes     = var.segment_max_bytes
    segment_max_age_ms    = var.segment_max_age_ms
    tiering_interval_ms   = var.tiering_interval_ms
    remotes_allowed_ports = join(",", [for p in var.remotes_allowed_ports : tostring(p)])
    remotes_allowed_hosts = join(",", var.remotes_allowed_hosts)
    extra_strings         = var.extra_config.strings
    extra_numbers         = var.extra_config.numbers
    extra_bools           = var.extra_config.bools
  })

  # ReadWritePaths: the data directory, and the secrets directory only for the helper
  # (it runs with + , outside the sandbox), so the broker itself can write its data only.
  systemd_unit = templatefile("${local.templates}/narad.service.tftpl", {
    node_id        = var.node_id
    narad_bin      = var.narad_bin
    config_path    = var.config_path
    service_user   = var.service_user
    data_dir       = var.data_dir
    env_file       = "${var.secrets_dir}/narad.env"
    secrets_helper = var.secrets_helper
    limit_nofile   = var.limit_nofile
  })

  secrets_script = var.bootstrap == null ? null : templatefile("${local.templates}/narad-secrets.sh.tftpl", {
    region                      = var.bootstrap.region
    secret_store                = var.bootstrap.secret_store
    cluster_secret_ref          = var.bootstrap.cluster_secret_ref
    cluster_secret_previous_ref = var.bootstrap.cluster_secret_previous_ref
    admin_password_ref          = var.bootstrap.admin_password_ref
    tls_cert_ref                = var.bootstrap.tls_cert_ref
    tls_key_ref                 = var.bootstrap.tls_key_ref
    tls_cert_file               = var.tls_cert_file
    tls_key_file                = var.tls_key_file
    secrets_dir                 = var.secrets_dir
    cluster_secret_file         = var.cluster_secret_file
    service_user                = var.service_user
  })

  bootstrap_script = var.bootstrap == null ? null : templatefile("${local.templates}/narad-bootstrap.sh.tftpl", {
    region          = var.bootstrap.region
    artifact_url    = var.bootstrap.artifact_url
    artifact_sha256 = var.bootstrap.artifact_sha256
    volume_id       = var.bootstrap.volume_id
    device_name     = var.bootstrap.device_name
    data_dir        = var.data_dir
    narad_bin       = var.narad_bin
    service_user    = var.service_user
    secrets_dir     = var.secrets_dir
    secrets_helper  = var.secrets_helper
  })

  user_data = var.bootstrap == null ? null : templatefile("${local.templates}/cloud-init.yaml.tftpl", {
    node_id          = var.node_id
    narad_toml       = local.narad_toml
    systemd_unit     = local.systemd_unit
    secrets_script   = local.secrets_script
    bootstrap_script = local.bootstrap_script
    config_path      = var.config_path
    secrets_helper   = var.secrets_helper
  })
}
