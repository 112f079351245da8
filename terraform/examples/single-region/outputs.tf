output "http_endpoint" {
  description = "NARAD_ADDR for the CLI and clients."
  value       = module.narad.http_endpoint
}

output "admin_password_parameter" {
  description = "SSM parameter holding the first password of the root user admin."
  value       = module.narad.secret_names.admin_password
}

output "archive_url" {
  description = "The cluster's archive."
  value       = module.narad.archive_url
}

output "node_private_ips" {
  description = "Fixed private IP of each node, by node id."
  value       = module.narad.node_private_ips
}

output "instance_ids" {
  description = "Instance of each node, by node id (Session Manager: aws ssm start-session --target <id>)."
  value       = module.narad.instance_ids
}
