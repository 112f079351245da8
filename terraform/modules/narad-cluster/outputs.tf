output "http_endpoint" {
  description = "URL of the HTTP API through the load balancer (NARAD_ADDR for the CLI): its alias name when lb_dns is set, else its AWS DNS name."
  value       = "${local.scheme}://${var.lb_dns == null ? aws_lb.api.dns_name : var.lb_dns.name}:${local.lb_port}"
}

output "lb_dns_name" {
  description = "AWS DNS name of the network load balancer."
  value       = aws_lb.api.dns_name
}

output "lb_zone_id" {
  description = "Route53 zone id of the load balancer (for alias records of your own)."
  value       = aws_lb.api.zone_id
}

output "lb_arn" {
  description = "ARN of the network load balancer."
  value       = aws_lb.api.arn
}

output "archive_bucket" {
  description = "Name of the archive bucket."
  value       = module.archive.bucket
}

output "archive_bucket_arn" {
  description = "ARN of the archive bucket."
  value       = module.archive.bucket_arn
}

output "archive_url" {
  description = "The archive_url every node is configured with (s3://bucket/prefix)."
  value       = module.archive.archive_url
}

output "archive_kms_key_arn" {
  description = "ARN of the archive bucket's KMS key."
  value       = module.archive.kms_key_arn
}

output "node_ids" {
  description = "The nodes' Narad node ids, in placement order."
  value       = var.node_ids
}

output "node_private_ips" {
  description = "Fixed private IP of each node, by node id."
  value       = { for id, n in local.nodes : id => n.private_ip }
}

output "node_dns_names" {
  description = "Private DNS name of each node by node id (null without route53_zone_id)."
  value       = { for id, n in local.nodes : id => n.dns_name }
}

output "node_addresses" {
  description = "Each node's cluster address (cluster_advertise, HOST:PORT), by node id."
  value       = { for id, m in local.members : id => "${m.host}:${m.cluster_port}" }
}

output "node_http_urls" {
  description = "Each node's own HTTP API (inside the VPC, from the nodes' security group), by node id: for rolling upgrades, ask each node's /readyz."
  value       = { for id, m in local.members : id => "${local.broker_tls ? "https" : "http"}://${m.host}:${m.http_port}" }
}

output "cluster_members" {
  description = "The cluster_members value written to every node (the initial voters still present)."
  value       = module.node_config[tostring(var.node_ids[0])].cluster_members
}

output "instance_ids" {
  description = "EC2 instance id of each node, by node id."
  value       = { for id, i in aws_instance.node : id => i.id }
}

output "data_volume_ids" {
  description = "EBS data volume id of each node, by node id."
  value       = { for id, v in aws_ebs_volume.data : id => v.id }
}

output "security_group_ids" {
  description = "Security groups: nodes (cluster port only from itself) and lb (the listener from client_cidrs)."
  value = {
    nodes = aws_security_group.nodes.id
    lb    = aws_security_group.lb.id
  }
}

output "secret_store" {
  description = "Where the secrets are: ssm or secretsmanager."
  value       = var.secret_store
}

output "secret_names" {
  description = "Names of the SSM parameters (or Secrets Manager secrets): cluster_secret, cluster_secret_previous (exists only during a rotation; made by hand) and admin_password. Read the root password with: aws ssm get-parameter --with-decryption --name <admin_password> --query Parameter.Value --output text."
  value       = local.secret_names
}

output "kms_key_arn" {
  description = "ARN of the cluster's KMS key (data and root volumes, secrets)."
  value       = aws_kms_key.cluster.arn
}

output "iam_role_arn" {
  description = "ARN of the nodes' IAM role."
  value       = aws_iam_role.node.arn
}

output "instance_profile_name" {
  description = "Name of the nodes' instance profile."
  value       = aws_iam_instance_profile.node.name
}
