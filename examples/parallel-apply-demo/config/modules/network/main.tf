resource "terraform_data" "vpc" {
  input = "10.0.0.0/16"
}

resource "terraform_data" "subnet" {
  input = "subnet-of-${terraform_data.vpc.output}"
}

output "subnet" {
  value = terraform_data.subnet.output
}
