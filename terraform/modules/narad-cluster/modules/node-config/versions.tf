# Provider-free on purpose: this module only renders text (templatefile), so
# `terraform init -backend=false && terraform validate` and a real plan/apply run
# offline. terraform/tests/render calls it to start three brokers from its output.
terraform {
  required_version = ">= 1.11"
}
