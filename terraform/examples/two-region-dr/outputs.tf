output "primary_endpoint" {
  description = "A's HTTP API (NARAD_ADDR)."
  value       = module.primary.http_endpoint
}

output "standby_endpoint" {
  description = "B's HTTP API (NARAD_ADDR)."
  value       = module.standby.http_endpoint
}

output "primary_admin_password_parameter" {
  description = "SSM parameter (in A's region) holding A's first root password."
  value       = module.primary.secret_names.admin_password
}

output "standby_admin_password_parameter" {
  description = "SSM parameter (in B's region) holding B's first root password."
  value       = module.standby.secret_names.admin_password
}

output "primary_archive_url" {
  description = "A's archive."
  value       = module.primary.archive_url
}

output "standby_archive_url" {
  description = "B's archive."
  value       = module.standby.archive_url
}

output "mirror_users" {
  description = "The user each cluster's remote child sends as on the other (produce and replicate on the topic, not an admin)."
  value = {
    on_standby = narad_user.mirror_from_primary.username
    on_primary = narad_user.mirror_from_standby.username
  }
}
