variable "region" {
  type        = string
  description = "AWS region of the cluster."
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-\\d$", var.region))
    error_message = "region must be an AWS region name such as us-east-1."
  }
}

variable "name" {
  type        = string
  description = "Name of the cluster (prefix of every resource)."
  default     = "narad-prod"
}

variable "vpc_id" {
  type        = string
  description = "VPC of the cluster."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Three private subnets, one per availability zone."
}

variable "route_table_ids" {
  type        = list(string)
  description = "Route tables of those subnets: an S3 gateway endpoint is made on them when given (archive traffic off the NAT gateway)."
  default     = []
}

variable "client_cidrs" {
  type        = list(string)
  description = "Networks of the producers and consumers (the load balancer's listener admits only these)."
}

variable "metrics_cidrs" {
  type        = list(string)
  description = "Networks of the Prometheus scrapers (port 9100, unauthenticated)."
  default     = []
}

variable "instance_type" {
  type        = string
  description = "Instance type of the three nodes (docs/deploy-aws.md, Sizing)."
  default     = "m7i.large"
}

variable "data_volume_size_gb" {
  type        = number
  description = "gp3 data volume per node (docs/deploy-aws.md, Sizing)."
  default     = 200
}

variable "route53_zone_id" {
  type        = string
  description = "Private zone for the nodes' names (<name>-<id>.<zone>); null: the nodes use their fixed IPs."
  default     = null
}

variable "artifact_url" {
  type        = string
  description = "https:// or s3:// URL of the narad binary (x86_64 Linux, glibc <= 2.34 for Amazon Linux 2023)."
}

variable "artifact_sha256" {
  type        = string
  description = "sha256sum of the artifact."
}

variable "archive_bucket_name" {
  type        = string
  description = "Name of the archive bucket (globally unique)."
}

variable "archive_retention_days" {
  type        = number
  description = "How long the archive keeps records (0: forever)."
  default     = 90
}

variable "local_retention_hours" {
  type        = number
  description = "How long archived segments stay on the nodes' disks (local_retention_ms)."
  default     = 24
}

variable "lb_certificate_arn" {
  type        = string
  description = "ACM certificate for HTTPS on the load balancer; null: plain TCP (HTTP) inside the VPC."
  default     = null
}

variable "lb_dns" {
  type = object({
    zone_id = string
    name    = string
  })
  description = "Alias record for the load balancer (must match the certificate)."
  default     = null
}
