terraform {
  required_version = ">= 1.11"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.25"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.7"
    }
    # Narad's own provider (built from terraform/provider/, no registry): narad.tf uses it.
    narad = {
      source = "example.com/narad/narad"
    }
  }
}
