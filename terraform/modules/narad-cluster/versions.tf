terraform {
  # 1.11: ephemeral resources and write-only arguments, so the generated secrets never
  # reach the state; validations may refer to other variables (1.9).
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
  }
}
