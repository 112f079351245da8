output "cluster_members" {
  description = "The cluster_members value written (the initial voters still present)."
  value       = local.cluster_members
}

output "cluster_advertise" {
  description = "The cluster_advertise value written (HOST:PORT)."
  value       = local.cluster_advertise
}

output "listen_addr" {
  description = "The listen_addr value written (IP:PORT)."
  value       = local.listen_addr
}

output "narad_toml" {
  description = "The node's narad.toml (no secret in it: the cluster secret is read from cluster_secret_file)."
  value       = local.narad_toml
}

output "systemd_unit" {
  description = "The node's narad.service unit."
  value       = local.systemd_unit
}

output "secrets_script" {
  description = "The secrets helper (run as root before each start); null without bootstrap."
  value       = local.secrets_script
}

output "bootstrap_script" {
  description = "The first-boot script (user, data volume, binary, service); null without bootstrap."
  value       = local.bootstrap_script
}

output "user_data" {
  description = "cloud-init user data (#cloud-config) installing all of the above; null without bootstrap."
  value       = local.user_data
}
