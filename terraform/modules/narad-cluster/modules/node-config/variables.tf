# Inputs of one node's rendered files. Key names follow Narad's configuration keys
# (infra/src/config.rs) wherever a value ends up in narad.toml.

variable "node_id" {
  type        = number
  description = "This node's `node_id` (1 or more, never reused for another node)."

  validation {
    condition     = var.node_id >= 1 && floor(var.node_id) == var.node_id
    error_message = "node_id must be a whole number of 1 or more."
  }
}

variable "bind_address" {
  type        = string
  description = "IP address the HTTP API and the cluster endpoint listen on (listen_addr and cluster_addr), e.g. 0.0.0.0."
  default     = "0.0.0.0"

  validation {
    condition     = can(regex("^(\\d{1,3}(\\.\\d{1,3}){3}|\\[[0-9A-Fa-f:.]+\\])$", var.bind_address))
    error_message = "bind_address must be an IPv4 address or a bracketed IPv6 address (Narad parses a socket address, not a host name)."
  }
}

variable "members" {
  type = map(object({
    host         = string
    http_port    = number
    cluster_port = number
  }))
  description = "Every current node of the cluster by node id: the host other members reach it at (IP or DNS name: its cluster_advertise host), its HTTP port and its QUIC/UDP cluster port. Must include node_id."

  validation {
    condition = alltrue([
      for id, m in var.members :
      can(regex("^[1-9][0-9]*$", id)) &&
      can(regex("^([A-Za-z0-9.-]{1,253}|\\[[0-9A-Fa-f:.]+\\])$", m.host)) &&
      m.http_port >= 1 && m.http_port <= 65535 && m.cluster_port >= 1 && m.cluster_port <= 65535
    ])
    error_message = "members must be keyed by node id (1 or more) with a host name or address and ports between 1 and 65535."
  }

  validation {
    condition     = length(distinct([for m in values(var.members) : "${m.host}:${m.cluster_port}"])) == length(var.members)
    error_message = "Two members share one cluster address; Narad refuses it."
  }

  validation {
    condition     = contains(keys(var.members), tostring(var.node_id))
    error_message = "members must include this node (node_id)."
  }
}

variable "initial_member_ids" {
  type        = list(number)
  description = "The node ids that formed (or form) the cluster: those of them still in members are listed in cluster_members. A node not listed (a replacement under a new id) joins instead of forming; never list a replacement, it would try to form a cluster of its own."

  validation {
    condition     = length(var.initial_member_ids) >= 1 && length(var.initial_member_ids) <= 9 && alltrue([for i in var.initial_member_ids : i >= 1 && floor(i) == i])
    error_message = "initial_member_ids must list 1 to 9 whole numbers of 1 or more (Narad takes at most 9 initial voters)."
  }

  validation {
    condition     = length([for i in var.initial_member_ids : i if contains(keys(var.members), tostring(i))]) >= 1
    error_message = "At least one of initial_member_ids must be a current member: cluster_members would be empty and a node_id without cluster_members is refused."
  }
}

variable "data_dir" {
  type        = string
  description = "`data_dir`: absolute path of the node's data directory (the mounted data volume)."

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.data_dir)) && !strcontains(var.data_dir, "..")
    error_message = "data_dir must be an absolute path of letters, digits, '.', '_', '-' and '/'."
  }
}

variable "cluster_secret_file" {
  type        = string
  description = "`cluster_secret_file`: absolute path of the 0600 file holding the cluster secret (written at start by the secrets helper; never the secret itself)."

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.cluster_secret_file))
    error_message = "cluster_secret_file must be an absolute path."
  }
}

variable "archive_url" {
  type        = string
  description = "`archive_url`: s3://bucket/prefix, file:///dir, or off."

  validation {
    condition     = var.archive_url == "off" || can(regex("^(s3://[a-z0-9.-]{3,63}/.+|file:///.+)$", var.archive_url))
    error_message = "archive_url must be off, s3://bucket/prefix (with a prefix) or file:///absolute/dir."
  }
}

variable "archive_region" {
  type        = string
  description = "`archive_region`: the bucket's region; empty: AWS_REGION / AWS_DEFAULT_REGION."
  default     = ""

  validation {
    condition     = var.archive_region == "" || can(regex("^[a-z]{2}(-[a-z]+)+-\\d$", var.archive_region))
    error_message = "archive_region must be empty or an AWS region name such as us-east-1."
  }
}

variable "archive_retention_ms" {
  type        = number
  description = "`archive_retention_ms`: archive objects whose newest record is older than this are deleted by Narad; 0 keeps forever."
  default     = 0

  validation {
    condition     = var.archive_retention_ms >= 0 && floor(var.archive_retention_ms) == var.archive_retention_ms
    error_message = "archive_retention_ms must be a whole number of 0 or more."
  }
}

variable "local_retention_ms" {
  type        = number
  description = "`local_retention_ms`: local segments older than this are deleted once archived (0: only each topic's retention applies)."
  default     = 0

  validation {
    condition     = var.local_retention_ms >= 0 && floor(var.local_retention_ms) == var.local_retention_ms
    error_message = "local_retention_ms must be a whole number of 0 or more."
  }
}

variable "segment_max_bytes" {
  type        = number
  description = "`segment_max_bytes` (Narad's default, 64 MiB, when null). Also the archive's object size: one PUT per sealed segment."
  default     = null

  validation {
    condition     = var.segment_max_bytes == null || try(var.segment_max_bytes >= 4096 && floor(var.segment_max_bytes) == var.segment_max_bytes, false)
    error_message = "segment_max_bytes must be null or a whole number of at least 4096."
  }
}

variable "segment_max_age_ms" {
  type        = number
  description = "`segment_max_age_ms` (Narad's default, 10 min, when null): a quiet partition seals (and archives) its segment this long after its first record; bounds the recovery point after a lost disk."
  default     = null

  validation {
    condition     = var.segment_max_age_ms == null || try(var.segment_max_age_ms >= 1000 && floor(var.segment_max_age_ms) == var.segment_max_age_ms, false)
    error_message = "segment_max_age_ms must be null or a whole number of at least 1000."
  }
}

variable "tiering_interval_ms" {
  type        = number
  description = "`tiering_interval_ms` (Narad's default, 1000, when null): how often the tierer looks for sealed segments; also the most frequent catalog snapshot PUT."
  default     = null

  validation {
    condition     = var.tiering_interval_ms == null || try(var.tiering_interval_ms >= 10 && floor(var.tiering_interval_ms) == var.tiering_interval_ms, false)
    error_message = "tiering_interval_ms must be null or a whole number of at least 10."
  }
}

variable "metrics_port" {
  type        = number
  description = "Port of a second, unauthenticated listener serving only /metrics (metrics_addr, on bind_address); null: none (then /metrics needs an admin on the API port)."
  default     = null

  validation {
    condition     = var.metrics_port == null || try(var.metrics_port >= 1 && var.metrics_port <= 65535 && floor(var.metrics_port) == var.metrics_port, false)
    error_message = "metrics_port must be null or a port between 1 and 65535."
  }
}

variable "tls_cert_file" {
  type        = string
  description = "`tls_cert_file`: PEM chain for the API listener (HTTPS only when set); empty: plain HTTP."
  default     = ""
}

variable "tls_key_file" {
  type        = string
  description = "`tls_key_file`: PEM private key; set together with tls_cert_file."
  default     = ""

  validation {
    condition     = (var.tls_key_file == "") == (var.tls_cert_file == "")
    error_message = "tls_cert_file and tls_key_file must be set together (Narad refuses one without the other)."
  }
}

variable "log_level" {
  type        = string
  description = "`log_level`: a tracing filter, e.g. info or narad_core=debug,info."
  default     = "info"

  validation {
    condition     = can(regex("^[A-Za-z0-9_:=,.-]+$", var.log_level))
    error_message = "log_level must be a tracing filter such as info or narad_core=debug,info."
  }
}

variable "remotes_allowed_ports" {
  type        = list(number)
  description = "`remotes_allowed_ports`: ports a remote's URL may name."
  default     = [443]

  validation {
    condition     = length(var.remotes_allowed_ports) > 0 && alltrue([for p in var.remotes_allowed_ports : p >= 1 && p <= 65535 && floor(p) == p])
    error_message = "remotes_allowed_ports must list at least one port between 1 and 65535."
  }
}

variable "remotes_allowed_hosts" {
  type        = list(string)
  description = "`remotes_allowed_hosts`: hosts a remote's URL may name (exact, or *.suffix); empty: any host."
  default     = []

  validation {
    condition     = alltrue([for h in var.remotes_allowed_hosts : can(regex("^(\\*\\.)?[A-Za-z0-9.:-]+$", h))])
    error_message = "remotes_allowed_hosts entries must be host names or *.suffix patterns."
  }
}

variable "extra_config" {
  type = object({
    strings = optional(map(string), {})
    numbers = optional(map(number), {})
    bools   = optional(map(bool), {})
  })
  description = "Further narad.toml keys by type (e.g. numbers = { max_connections = 20000 }). Keys this module sets itself and secret keys are refused."
  default     = {}

  validation {
    condition = alltrue([
      for k in concat(keys(var.extra_config.strings), keys(var.extra_config.numbers), keys(var.extra_config.bools)) :
      can(regex("^[a-z][a-z0-9_]*$", k)) && !contains([
        "listen_addr", "data_dir", "log_format", "log_level", "metrics_addr", "security_enabled",
        "node_id", "cluster_addr", "cluster_advertise", "cluster_members",
        "cluster_secret", "cluster_secret_file", "cluster_secret_previous", "cluster_secret_previous_file",
        "tls_cert_file", "tls_key_file", "archive_url", "archive_region", "archive_retention_ms",
        "local_retention_ms", "segment_max_bytes", "segment_max_age_ms", "tiering_interval_ms",
        "remotes_allowed_ports", "remotes_allowed_hosts",
      ], k)
    ])
    error_message = "extra_config keys must be lower_snake_case Narad keys that this module does not set itself; secrets (cluster_secret*) are never accepted here."
  }

  validation {
    condition     = alltrue([for v in values(var.extra_config.numbers) : floor(v) == v])
    error_message = "extra_config.numbers must be whole numbers (every numeric Narad key is an integer)."
  }

  validation {
    condition = length(distinct(concat(keys(var.extra_config.strings), keys(var.extra_config.numbers), keys(var.extra_config.bools)))) == (
      length(var.extra_config.strings) + length(var.extra_config.numbers) + length(var.extra_config.bools)
    )
    error_message = "extra_config must not give one key in two types (TOML refuses a duplicate key)."
  }
}

# --- the systemd unit -------------------------------------------------------------------

variable "narad_bin" {
  type        = string
  description = "Absolute path of the narad binary the unit runs."
  default     = "/usr/local/bin/narad"

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.narad_bin))
    error_message = "narad_bin must be an absolute path."
  }
}

variable "config_path" {
  type        = string
  description = "Absolute path narad.toml is installed at (the unit runs `narad serve --config <this>`)."
  default     = "/etc/narad/narad.toml"

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.config_path))
    error_message = "config_path must be an absolute path."
  }
}

variable "service_user" {
  type        = string
  description = "System user (and group) the broker runs as."
  default     = "narad"

  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.service_user)) && var.service_user != "root"
    error_message = "service_user must be a valid, unprivileged user name (not root)."
  }
}

variable "secrets_dir" {
  type        = string
  description = "Directory (0750 root:<service_user>) holding the secret files the secrets helper writes."
  default     = "/etc/narad/secrets"

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.secrets_dir))
    error_message = "secrets_dir must be an absolute path."
  }
}

variable "secrets_helper" {
  type        = string
  description = "Absolute path of the script the unit runs as root before each start (ExecStartPre=+) to fetch secrets; empty: none (the render test)."
  default     = "/usr/local/sbin/narad-secrets"

  validation {
    condition     = var.secrets_helper == "" || can(regex("^/[A-Za-z0-9._/-]+$", var.secrets_helper))
    error_message = "secrets_helper must be empty or an absolute path."
  }
}

variable "limit_nofile" {
  type        = number
  description = "LimitNOFILE of the unit; Narad raises its soft limit to this hard limit and sizes max_open_logs from it."
  default     = 1048576

  validation {
    condition     = var.limit_nofile >= 4096 && var.limit_nofile <= 1073741816
    error_message = "limit_nofile must be between 4096 and 1073741816."
  }
}

# --- first-boot script (AWS) ------------------------------------------------------------

variable "bootstrap" {
  type = object({
    region                      = string
    artifact_url                = string
    artifact_sha256             = string
    volume_id                   = string
    device_name                 = string
    secret_store                = string
    cluster_secret_ref          = string
    cluster_secret_previous_ref = string
    admin_password_ref          = string
    tls_cert_ref                = optional(string, "")
    tls_key_ref                 = optional(string, "")
  })
  description = "What the first-boot script needs (AWS region, artifact, data volume, where the secrets are: names, never values). Null: no user data is rendered."
  default     = null

  validation {
    condition     = var.bootstrap == null || can(regex("^[0-9a-f]{64}$", var.bootstrap.artifact_sha256))
    error_message = "bootstrap.artifact_sha256 must be 64 lowercase hex digits."
  }

  validation {
    condition     = var.bootstrap == null || can(regex("^(https|s3)://[^\\s'\"\\\\$`]+$", var.bootstrap.artifact_url))
    error_message = "bootstrap.artifact_url must be an https:// or s3:// URL without quotes, spaces, backslashes, $ or backticks."
  }

  validation {
    condition     = var.bootstrap == null || contains(["ssm", "secretsmanager"], try(var.bootstrap.secret_store, ""))
    error_message = "bootstrap.secret_store must be ssm or secretsmanager."
  }

  validation {
    condition = var.bootstrap == null || alltrue([
      for r in try([var.bootstrap.cluster_secret_ref, var.bootstrap.cluster_secret_previous_ref, var.bootstrap.admin_password_ref, var.bootstrap.tls_cert_ref, var.bootstrap.tls_key_ref], []) :
      can(regex("^[A-Za-z0-9_./:+=@-]*$", r))
    ])
    error_message = "bootstrap secret references must be parameter or secret names/ARNs (letters, digits and _ . / : + = @ -)."
  }

  validation {
    condition     = var.bootstrap == null || can(regex("^vol-[0-9a-f]{8,17}$", try(var.bootstrap.volume_id, "")))
    error_message = "bootstrap.volume_id must be an EBS volume id (vol-...)."
  }
}
