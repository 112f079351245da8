# --- naming --------------------------------------------------------------------------------

variable "name" {
  type        = string
  description = "Name of the cluster: prefixes every resource, the node DNS names (<name>-<node id>) and the secret names."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,22}[a-z0-9]$", var.name))
    error_message = "name must be 3-24 characters: lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen (the load balancer's name is built from it and AWS caps that at 32)."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags for every resource of the module."
  default     = {}
}

# --- network ------------------------------------------------------------------------------

variable "vpc_id" {
  type        = string
  description = "VPC the nodes, their security groups and the load balancer are in."

  validation {
    condition     = can(regex("^vpc-[0-9a-f]{8,17}$", var.vpc_id))
    error_message = "vpc_id must be a VPC id (vpc-...)."
  }
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets for the nodes, ideally one per availability zone: the node at position i of node_ids goes to subnet_ids[i % length]. Changing the order moves (replaces) nodes."

  validation {
    condition     = length(var.subnet_ids) >= 1 && alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "subnet_ids must list at least one subnet id (subnet-...)."
  }
}

variable "host_number_offset" {
  type        = number
  description = "Each node's fixed private IP is cidrhost(<its subnet's CIDR>, host_number_offset + node id): stable across instance replacement, and a node under a new id never takes an old member's address. AWS reserves the first four addresses of a subnet."
  default     = 10

  validation {
    condition     = var.host_number_offset >= 3 && var.host_number_offset <= 60000 && floor(var.host_number_offset) == var.host_number_offset
    error_message = "host_number_offset must be a whole number of at least 3 (so the first node, id 1, gets host number 4 or more, past the four addresses AWS reserves)."
  }
}

variable "route53_zone_id" {
  type        = string
  description = "Private Route53 zone for one A record per node (<name>-<node id>.<zone>): the nodes then advertise and list each other by name. Null: by their fixed private IPs."
  default     = null

  validation {
    condition     = var.route53_zone_id == null || can(regex("^Z[0-9A-Z]{1,31}$", var.route53_zone_id))
    error_message = "route53_zone_id must be null or a Route53 hosted zone id (Z...)."
  }
}

variable "client_cidrs" {
  type        = list(string)
  description = "CIDRs allowed to reach the HTTP API through the load balancer (IPv4 or IPv6). No default: list your clients' networks. 0.0.0.0/0 is accepted only when listed here explicitly (an internet-facing API: use TLS, lb_certificate_arn)."

  validation {
    condition     = length(var.client_cidrs) >= 1 && alltrue([for c in var.client_cidrs : can(cidrhost(c, 0)) && strcontains(c, "/")])
    error_message = "client_cidrs must list at least one valid CIDR (e.g. 10.0.0.0/16 or 2001:db8::/32)."
  }
}

variable "http_port" {
  type        = number
  description = "Port of Narad's HTTP API on the nodes (listen_addr). The broker runs unprivileged, so 1024 or more."
  default     = 7942

  validation {
    condition     = var.http_port >= 1024 && var.http_port <= 65535 && floor(var.http_port) == var.http_port
    error_message = "http_port must be a whole number between 1024 and 65535."
  }
}

variable "cluster_port" {
  type        = number
  description = "UDP port of the QUIC cluster endpoint (cluster_addr): node-to-node calls and Raft. Reachable only from the nodes' own security group."
  default     = 7100

  validation {
    condition     = var.cluster_port >= 1024 && var.cluster_port <= 65535 && floor(var.cluster_port) == var.cluster_port && var.cluster_port != var.http_port
    error_message = "cluster_port must be a whole number between 1024 and 65535, different from http_port."
  }
}

variable "metrics_port" {
  type        = number
  description = "Port of the unauthenticated /metrics listener (metrics_addr); null: none (/metrics then needs an admin on the API port)."
  default     = null

  validation {
    condition     = var.metrics_port == null || try(var.metrics_port >= 1024 && var.metrics_port <= 65535 && floor(var.metrics_port) == var.metrics_port && var.metrics_port != var.http_port && var.metrics_port != var.cluster_port, false)
    error_message = "metrics_port must be null or a whole number between 1024 and 65535, different from http_port and cluster_port."
  }
}

variable "metrics_cidrs" {
  type        = list(string)
  description = "CIDRs of the scrapers allowed to the metrics port. Never the whole internet: the listener has no authentication."
  default     = []

  validation {
    condition     = alltrue([for c in var.metrics_cidrs : can(cidrhost(c, 0)) && strcontains(c, "/") && !endswith(c, "/0")])
    error_message = "metrics_cidrs must be valid CIDRs, none of them /0 (the metrics listener is unauthenticated)."
  }
}

variable "egress_https_cidrs" {
  type        = list(string)
  description = "Where the nodes may open HTTPS (TCP 443): the artifact download, the AWS APIs (SSM or Secrets Manager, KMS, S3 unless the gateway endpoint carries it) and remote clusters (remote children). Narrow it when VPC endpoints and known remotes cover everything."
  default     = ["0.0.0.0/0"]

  validation {
    condition     = alltrue([for c in var.egress_https_cidrs : can(cidrhost(c, 0)) && strcontains(c, "/")])
    error_message = "egress_https_cidrs must be valid CIDRs."
  }
}

variable "create_s3_gateway_endpoint" {
  type        = bool
  description = "Create an S3 gateway VPC endpoint on route_table_ids (archive traffic stays off the NAT gateway and its per-GB charge) and allow the nodes HTTPS to S3's prefix list."
  default     = false
}

variable "route_table_ids" {
  type        = list(string)
  description = "Route tables of the nodes' subnets, for the S3 gateway endpoint (create_s3_gateway_endpoint)."
  default     = []

  validation {
    condition     = alltrue([for r in var.route_table_ids : can(regex("^rtb-[0-9a-f]{8,17}$", r))])
    error_message = "route_table_ids must be route table ids (rtb-...)."
  }

  validation {
    condition     = !var.create_s3_gateway_endpoint || length(var.route_table_ids) > 0
    error_message = "create_s3_gateway_endpoint needs route_table_ids."
  }
}

# --- load balancer ------------------------------------------------------------------------

variable "lb_internal" {
  type        = bool
  description = "Whether the network load balancer is internal (reachable inside the VPC and its peers only)."
  default     = true
}

variable "lb_subnet_ids" {
  type        = list(string)
  description = "Subnets of the load balancer; null: subnet_ids. An internet-facing one needs public subnets."
  default     = null

  validation {
    condition     = var.lb_subnet_ids == null || try(length(var.lb_subnet_ids) >= 1 && alltrue([for s in var.lb_subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))]), false)
    error_message = "lb_subnet_ids must be null or list subnet ids (subnet-...)."
  }
}

variable "lb_certificate_arn" {
  type        = string
  description = "ACM certificate for a TLS listener on the load balancer (HTTPS for clients, and required for a remote child from another cluster: remotes are https only). Null: a plain TCP listener."
  default     = null

  validation {
    condition     = var.lb_certificate_arn == null || can(regex("^arn:aws[a-z-]*:acm:[a-z0-9-]+:\\d{12}:certificate/.+$", var.lb_certificate_arn))
    error_message = "lb_certificate_arn must be null or an ACM certificate ARN."
  }
}

variable "lb_ssl_policy" {
  type        = string
  description = "TLS policy of the TLS listener."
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"

  validation {
    condition     = can(regex("^ELBSecurityPolicy-", var.lb_ssl_policy))
    error_message = "lb_ssl_policy must be an ELBSecurityPolicy-* name."
  }
}

variable "lb_port" {
  type        = number
  description = "Listener port of the load balancer; null: 443 with lb_certificate_arn, else http_port."
  default     = null

  validation {
    condition     = var.lb_port == null || try(var.lb_port >= 1 && var.lb_port <= 65535 && floor(var.lb_port) == var.lb_port, false)
    error_message = "lb_port must be null or a whole number between 1 and 65535."
  }
}

variable "lb_deletion_protection" {
  type        = bool
  description = "Deletion protection of the load balancer (turn it off before a destroy)."
  default     = true
}

variable "lb_dns" {
  type = object({
    zone_id = string
    name    = string
  })
  description = "An alias record for the load balancer (e.g. narad.example.com in a zone you own; it must match the certificate for TLS). Null: none; use the load balancer's own DNS name."
  default     = null

  validation {
    condition     = var.lb_dns == null || try(can(regex("^Z[0-9A-Z]{1,31}$", var.lb_dns.zone_id)) && can(regex("^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$", var.lb_dns.name)), false)
    error_message = "lb_dns must be null or { zone_id = \"Z...\", name = \"host.example.com\" } (lowercase)."
  }
}

# --- nodes --------------------------------------------------------------------------------

variable "node_ids" {
  type        = list(number)
  description = "One broker node per entry, by node_id, in placement order (subnet_ids[i % length]). 3 to 9 (Narad keeps at least three voters; four are needed to decommission one). Never reuse an id: a node whose data volume is lost comes back under a new id at the same position (see README)."
  default     = [1, 2, 3]

  validation {
    condition     = length(var.node_ids) >= 3 && length(var.node_ids) <= 9
    error_message = "node_ids must list 3 to 9 nodes (fewer than three voters lose the quorum to one failure; Narad refuses to remove members below three)."
  }

  validation {
    condition     = alltrue([for i in var.node_ids : i >= 1 && i <= 9999 && floor(i) == i]) && length(distinct(var.node_ids)) == length(var.node_ids)
    error_message = "node_ids must be distinct whole numbers between 1 and 9999."
  }
}

variable "initial_member_ids" {
  type        = list(number)
  description = "The node ids that formed the cluster (Narad's initial voters). Those still in node_ids are written to cluster_members; other nodes join through them. Keep it as it was at the first apply: a replacement node must not be listed (it would try to form a cluster of its own)."
  default     = [1, 2, 3]

  validation {
    condition     = length(var.initial_member_ids) >= 1 && length(var.initial_member_ids) <= 9 && alltrue([for i in var.initial_member_ids : i >= 1 && floor(i) == i])
    error_message = "initial_member_ids must list 1 to 9 whole numbers of 1 or more (Narad takes at most 9 initial voters)."
  }

  validation {
    condition     = length(setintersection(toset(var.initial_member_ids), toset(var.node_ids))) >= 1
    error_message = "At least one initial member must still be among node_ids, or no node could form or join the cluster."
  }
}

variable "instance_type" {
  type        = string
  description = "EC2 instance type of the nodes (its architecture must match architecture and the artifact). See docs/deploy-aws.md for sizing."
  default     = "m7i.large"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.instance_type))
    error_message = "instance_type must look like m7i.large."
  }
}

variable "architecture" {
  type        = string
  description = "CPU architecture of the default AMI (Amazon Linux 2023): x86_64 or arm64. Must match instance_type and the artifact."
  default     = "x86_64"

  validation {
    condition     = contains(["x86_64", "arm64"], var.architecture)
    error_message = "architecture must be x86_64 or arm64."
  }
}

variable "ami_id" {
  type        = string
  description = "AMI of the nodes; null: the latest Amazon Linux 2023 for architecture (read once: later AMI updates do not replace running nodes). It must have bash, curl, the AWS CLI, xfsprogs and systemd, and a glibc the binary accepts (AL2023: 2.34)."
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be null or an AMI id (ami-...)."
  }
}

variable "root_volume_size_gb" {
  type        = number
  description = "Size of each node's root volume (gp3, encrypted); the data lives on the separate data volume."
  default     = 20

  validation {
    condition     = var.root_volume_size_gb >= 8 && var.root_volume_size_gb <= 1024 && floor(var.root_volume_size_gb) == var.root_volume_size_gb
    error_message = "root_volume_size_gb must be a whole number between 8 and 1024."
  }
}

variable "data_volume_size_gb" {
  type        = number
  description = "Size of each node's EBS gp3 data volume (data_dir): local retention, the write-ahead log, not-yet-archived segments. See docs/deploy-aws.md for sizing."
  default     = 100

  validation {
    condition     = var.data_volume_size_gb >= 1 && var.data_volume_size_gb <= 65536 && floor(var.data_volume_size_gb) == var.data_volume_size_gb
    error_message = "data_volume_size_gb must be a whole number between 1 and 65536 (gp3's limits)."
  }
}

variable "data_volume_iops" {
  type        = number
  description = "Provisioned IOPS of each data volume (gp3: 3000 included)."
  default     = 3000

  validation {
    condition     = var.data_volume_iops >= 3000 && var.data_volume_iops <= 80000 && floor(var.data_volume_iops) == var.data_volume_iops
    error_message = "data_volume_iops must be a whole number between 3000 and 80000 (gp3)."
  }
}

variable "data_volume_throughput" {
  type        = number
  description = "Provisioned throughput of each data volume in MiB/s (gp3: 125 included)."
  default     = 125

  validation {
    condition     = var.data_volume_throughput >= 125 && var.data_volume_throughput <= 2000 && floor(var.data_volume_throughput) == var.data_volume_throughput
    error_message = "data_volume_throughput must be a whole number between 125 and 2000 MiB/s (gp3)."
  }
}

variable "data_volume_device_name" {
  type        = string
  description = "Device name the data volume is attached as (Nitro instances show it as NVMe; the first-boot script finds it by volume id)."
  default     = "/dev/sdf"

  validation {
    condition     = can(regex("^/dev/(sd|xvd)[f-p]$", var.data_volume_device_name))
    error_message = "data_volume_device_name must be /dev/sdf ... /dev/sdp (or /dev/xvdf ... /dev/xvdp)."
  }
}

variable "data_volume_final_snapshot" {
  type        = bool
  description = "Take a snapshot of a data volume when Terraform destroys it (its node's id removed, or a destroy). Terraform cannot make prevent_destroy depend on a variable, so this is the module's guard; see README."
  default     = true
}

variable "key_name" {
  type        = string
  description = "EC2 key pair for SSH; null (recommended): none, use Session Manager (enable_session_manager)."
  default     = null
}

variable "enable_session_manager" {
  type        = bool
  description = "Let operators open a shell on the nodes with SSM Session Manager (for rolling upgrades and rotation by hand). Grants only the ssmmessages/UpdateInstanceInformation calls, not the AmazonSSMManagedInstanceCore policy, whose ssm:GetParameter on * would reach other parameters."
  default     = true
}

# --- narad --------------------------------------------------------------------------------

variable "artifact_url" {
  type        = string
  description = "Where the first-boot script downloads the narad binary (https:// or s3://; a .tar.gz/.tgz holding an executable named narad works too). Its architecture must match the instances."

  validation {
    condition     = can(regex("^(https://|s3://[a-z0-9.-]{3,63}/)[^\\s'\"\\\\$`]+$", var.artifact_url))
    error_message = "artifact_url must be an https:// or s3://bucket/key URL without quotes, spaces, backslashes, $ or backticks."
  }
}

variable "artifact_sha256" {
  type        = string
  description = "SHA-256 of the artifact (64 lowercase hex digits); the node refuses to install anything else."

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.artifact_sha256))
    error_message = "artifact_sha256 must be 64 lowercase hex digits (sha256sum prints it)."
  }
}

variable "data_dir" {
  type        = string
  description = "Where the data volume is mounted and Narad's data_dir points."
  default     = "/var/lib/narad"

  validation {
    condition     = can(regex("^/[A-Za-z0-9._/-]+$", var.data_dir)) && !strcontains(var.data_dir, "..") && !contains(["/", "/etc", "/usr", "/var", "/tmp", "/home", "/root"], var.data_dir)
    error_message = "data_dir must be an absolute path of its own (not /, /etc, /usr, /var, /tmp, /home or /root)."
  }
}

variable "log_level" {
  type        = string
  description = "Narad's log_level (a tracing filter, e.g. info or narad_core=debug,info)."
  default     = "info"

  validation {
    condition     = can(regex("^[A-Za-z0-9_:=,.-]+$", var.log_level))
    error_message = "log_level must be a tracing filter such as info or narad_core=debug,info."
  }
}

variable "segment_max_bytes" {
  type        = number
  description = "Narad's segment_max_bytes; null: Narad's default (64 MiB). Each sealed segment is one archive object (one PUT, plus a manifest PUT)."
  default     = null

  validation {
    condition     = var.segment_max_bytes == null || try(var.segment_max_bytes >= 4096 && floor(var.segment_max_bytes) == var.segment_max_bytes, false)
    error_message = "segment_max_bytes must be null or a whole number of at least 4096."
  }
}

variable "segment_max_age_ms" {
  type        = number
  description = "Narad's segment_max_age_ms; null: Narad's default (10 min). Bounds the recovery point of a lost disk: the active segment is not archived yet."
  default     = null

  validation {
    condition     = var.segment_max_age_ms == null || try(var.segment_max_age_ms >= 1000 && floor(var.segment_max_age_ms) == var.segment_max_age_ms, false)
    error_message = "segment_max_age_ms must be null or a whole number of at least 1000."
  }
}

variable "tiering_interval_ms" {
  type        = number
  description = "Narad's tiering_interval_ms; null: Narad's default (1000). Under steady fan-out traffic the catalog snapshot is PUT once per interval: raise it to pay less."
  default     = null

  validation {
    condition     = var.tiering_interval_ms == null || try(var.tiering_interval_ms >= 10 && floor(var.tiering_interval_ms) == var.tiering_interval_ms, false)
    error_message = "tiering_interval_ms must be null or a whole number of at least 10."
  }
}

variable "local_retention_ms" {
  type        = number
  description = "Narad's local_retention_ms: local segments older than this are deleted once archived (0: only each topic's retention_ms/retention_bytes apply, 7 days by default). The module always configures the archive, so it defaults to 24 h; with the data volume's size it sets how much history replays read from local disk."
  default     = 86400000

  validation {
    condition     = var.local_retention_ms >= 0 && floor(var.local_retention_ms) == var.local_retention_ms
    error_message = "local_retention_ms must be a whole number of 0 or more."
  }
}

variable "remotes_allowed_ports" {
  type        = list(number)
  description = "Narad's remotes_allowed_ports: ports a remote's URL may name."
  default     = [443]

  validation {
    condition     = length(var.remotes_allowed_ports) > 0 && alltrue([for p in var.remotes_allowed_ports : p >= 1 && p <= 65535 && floor(p) == p])
    error_message = "remotes_allowed_ports must list at least one port between 1 and 65535."
  }
}

variable "remotes_allowed_hosts" {
  type        = list(string)
  description = "Narad's remotes_allowed_hosts (exact names or *.suffix); empty: any host."
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
  description = "Further narad.toml keys by type, e.g. { numbers = { max_connections = 20000 } }. Keys the module sets and secret keys are refused (node-config checks them)."
  default     = {}
}

variable "broker_tls" {
  type = object({
    certificate_secret = string
    private_key_secret = string
  })
  description = "TLS on the brokers' own listener: names, in secret_store (SSM parameters or Secrets Manager secrets), of the PEM chain and the PEM key, encrypted with a KMS key the nodes may use through that service (this module's key: kms_key_arn). Fetched at each start into /etc/narad/tls. Null: the brokers speak plain HTTP inside the VPC (terminate TLS at the load balancer with lb_certificate_arn)."
  default     = null

  validation {
    condition     = var.broker_tls == null || try(can(regex("^/?[A-Za-z0-9_./+=@-]{1,1011}$", var.broker_tls.certificate_secret)) && can(regex("^/?[A-Za-z0-9_./+=@-]{1,1011}$", var.broker_tls.private_key_secret)), false)
    error_message = "broker_tls must name the certificate and key secrets (letters, digits and _ . / + = @ -)."
  }
}

# --- archive ------------------------------------------------------------------------------

variable "archive_bucket_name" {
  type        = string
  description = "Name of the archive bucket this module creates (narad-archive-bucket)."
}

variable "archive_prefix" {
  type        = string
  description = "Key prefix of the archive in the bucket; the nodes' role is limited to it."
  default     = "narad"
}

variable "archive_retention_days" {
  type        = number
  description = "Narad's archive retention in days (archive_retention_ms; 0 keeps forever)."
  default     = 0

  validation {
    condition     = var.archive_retention_days >= 0 && floor(var.archive_retention_days) == var.archive_retention_days
    error_message = "archive_retention_days must be a whole number of 0 or more."
  }
}

variable "archive_noncurrent_version_expiration_days" {
  type        = number
  description = "Days the archive bucket keeps replaced or deleted object versions."
  default     = 7
}

variable "archive_access_log_bucket" {
  type        = string
  description = "Existing bucket for the archive bucket's access logs; null: none, unless archive_create_access_log_bucket."
  default     = null
}

variable "archive_create_access_log_bucket" {
  type        = bool
  description = "Create a bucket for the archive bucket's access logs."
  default     = false
}

variable "archive_force_destroy" {
  type        = bool
  description = "Let `terraform destroy` delete the archive bucket with its objects. Keep false outside experiments."
  default     = false
}

# --- secrets ------------------------------------------------------------------------------

variable "secret_store" {
  type        = string
  description = "Where the cluster secret and the first root password live: ssm (Parameter Store SecureString) or secretsmanager."
  default     = "ssm"

  validation {
    condition     = contains(["ssm", "secretsmanager"], var.secret_store)
    error_message = "secret_store must be ssm or secretsmanager."
  }
}

variable "secret_name_prefix" {
  type        = string
  description = "Prefix of the secret names; null: /narad/<name> (SSM) or narad/<name> (Secrets Manager). The names are <prefix>/cluster-secret, <prefix>/cluster-secret-previous (made by hand during a rotation) and <prefix>/admin-password."
  default     = null

  validation {
    condition     = var.secret_name_prefix == null || can(regex("^/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$", var.secret_name_prefix))
    error_message = "secret_name_prefix must be null or slash-separated segments of letters, digits, _ . - (optionally starting with /), without a trailing slash."
  }
}

variable "cluster_secret_version" {
  type        = number
  description = "Generation of the cluster secret. The secret is generated in an ephemeral resource and written with a write-only argument, so it never enters the state; raising this number writes a new one (a rotation: follow docs/deploy-aws.md first, or the nodes lose each other at their next restart)."
  default     = 1

  validation {
    condition     = var.cluster_secret_version >= 1 && floor(var.cluster_secret_version) == var.cluster_secret_version
    error_message = "cluster_secret_version must be a whole number of 1 or more."
  }
}

variable "admin_password_version" {
  type        = number
  description = "Generation of the first root password (used only while the cluster has no root user). Raising it writes a new value to the secret; it does not change the password of an existing root (narad user passwd admin does)."
  default     = 1

  validation {
    condition     = var.admin_password_version >= 1 && floor(var.admin_password_version) == var.admin_password_version
    error_message = "admin_password_version must be a whole number of 1 or more."
  }
}

variable "secret_recovery_window_days" {
  type        = number
  description = "Secrets Manager only: days a deleted secret can be restored (0 deletes at once; else 7-30)."
  default     = 30

  validation {
    condition     = var.secret_recovery_window_days == 0 || (var.secret_recovery_window_days >= 7 && var.secret_recovery_window_days <= 30)
    error_message = "secret_recovery_window_days must be 0 or between 7 and 30."
  }
}

variable "kms_key_deletion_window_days" {
  type        = number
  description = "Waiting period before the cluster's KMS key (data volumes, root volumes, secrets) is deleted after a destroy (7-30 days)."
  default     = 30

  validation {
    condition     = var.kms_key_deletion_window_days >= 7 && var.kms_key_deletion_window_days <= 30 && floor(var.kms_key_deletion_window_days) == var.kms_key_deletion_window_days
    error_message = "kms_key_deletion_window_days must be a whole number between 7 and 30."
  }
}
