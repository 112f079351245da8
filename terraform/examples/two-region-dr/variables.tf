variable "primary" {
  type = object({
    region              = string
    name                = string
    vpc_id              = string
    subnet_ids          = list(string)
    client_cidrs        = list(string)
    archive_bucket_name = string
    lb_certificate_arn  = string
    lb_dns = object({
      zone_id = string
      name    = string
    })
  })
  description = "Cluster A (primary): region, network, clients (include the standby's NAT addresses or VPC CIDR for failback), archive bucket, and the TLS name of its API."
}

variable "standby" {
  type = object({
    region              = string
    name                = string
    vpc_id              = string
    subnet_ids          = list(string)
    client_cidrs        = list(string)
    archive_bucket_name = string
    lb_certificate_arn  = string
    lb_dns = object({
      zone_id = string
      name    = string
    })
  })
  description = "Cluster B (standby): as primary. Its client_cidrs must include the networks A's nodes send from (A's VPC CIDR over peering or a transit gateway, or A's NAT gateway addresses /32 when the load balancer is internet-facing): A's remote child reaches B through B's load balancer."

  validation {
    condition     = var.standby.region != var.primary.region
    error_message = "The standby belongs in another region than the primary."
  }
}

variable "lb_internal" {
  type        = bool
  description = "Internal load balancers (the two VPCs connected by peering or a transit gateway, and each API name resolvable from the other) or internet-facing ones (then keep client_cidrs to known addresses)."
  default     = true
}

variable "instance_type" {
  type        = string
  description = "Instance type of every node (both clusters: B must take A's load after a failover)."
  default     = "m7i.large"
}

variable "data_volume_size_gb" {
  type        = number
  description = "gp3 data volume per node (both clusters)."
  default     = 200
}

variable "artifact_url" {
  type        = string
  description = "https:// or s3:// URL of the narad binary. An s3:// URL must be readable from both regions."
}

variable "artifact_sha256" {
  type        = string
  description = "sha256sum of the artifact."
}

variable "archive_retention_days" {
  type        = number
  description = "Archive retention of both clusters (0: forever)."
  default     = 90
}

variable "topic" {
  type        = string
  description = "The topic A mirrors to B."
  default     = "orders"

  validation {
    condition     = can(regex("^[A-Za-z0-9._-]{1,200}$", var.topic)) && !contains([".", ".."], var.topic)
    error_message = "topic must be a Narad topic name (letters, digits, . _ -; not . or ..)."
  }
}

variable "topic_partitions" {
  type        = number
  description = "Partitions of the topic on each cluster (they may differ: records are re-keyed by the same hash)."
  default     = 6

  validation {
    condition     = var.topic_partitions >= 1 && var.topic_partitions <= 256 && floor(var.topic_partitions) == var.topic_partitions
    error_message = "topic_partitions must be a whole number between 1 and 256."
  }
}

variable "topic_retention_ms" {
  type        = number
  description = "retention_ms of the topic on both clusters: long enough to hold everything the link may fall behind by during the longest outage of the link between the regions you want to survive (docs/playbooks/disaster-recovery.md), e.g. 72 h."
  default     = 259200000

  validation {
    condition     = var.topic_retention_ms == 0 || var.topic_retention_ms >= 1000
    error_message = "topic_retention_ms must be 0 (keep forever) or at least 1000."
  }
}

variable "mirror_direction" {
  type        = string
  description = "Which way the topic is mirrored: primary_to_standby (peacetime, and while A is lost: A's remote child dr ships A's tail when A returns), none (between the two), standby_to_primary (failback: B's remote child back). Change it through none: a topic never mirrors the topic it ships to (loop_detected)."
  default     = "primary_to_standby"

  validation {
    condition     = contains(["primary_to_standby", "none", "standby_to_primary"], var.mirror_direction)
    error_message = "mirror_direction must be primary_to_standby, none or standby_to_primary."
  }
}

variable "mirror_lanes" {
  type        = number
  description = "Lanes of the remote child (1-8): records of one key keep their order within a lane."
  default     = 2

  validation {
    condition     = var.mirror_lanes >= 1 && var.mirror_lanes <= 8 && floor(var.mirror_lanes) == var.mirror_lanes
    error_message = "mirror_lanes must be a whole number between 1 and 8."
  }
}

variable "mirror_from" {
  type        = string
  description = "Where A's remote child starts: attach (records written from now on), unconsumed (everything A's consumers have not acked: use it when A already holds records they have not processed) or earliest (all A still holds)."
  default     = "attach"

  validation {
    condition     = contains(["attach", "unconsumed", "earliest"], var.mirror_from)
    error_message = "mirror_from must be attach, unconsumed or earliest."
  }
}

variable "mirror_password_version" {
  type        = number
  description = "Generation of the mirror users' passwords (random_password keepers): raising it draws new ones, which the narad provider sets in place on each user and on the other cluster's remote."
  default     = 1

  validation {
    condition     = var.mirror_password_version >= 1 && floor(var.mirror_password_version) == var.mirror_password_version
    error_message = "mirror_password_version must be a whole number of 1 or more."
  }
}

variable "primary_admin_password" {
  type        = string
  description = "Password of A's root user admin, for the narad provider (read it from A's admin_password parameter; see README). Ephemeral: never in the plan or the state."
  sensitive   = true
  ephemeral   = true
}

variable "standby_admin_password" {
  type        = string
  description = "Password of B's root user admin, for the narad provider. Ephemeral: never in the plan or the state."
  sensitive   = true
  ephemeral   = true
}
