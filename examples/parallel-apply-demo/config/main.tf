# A three-module configuration on one shared state. Each module's resources sleep while they are
# created, so two applies that overlap in time are easy to see.
variable "sleep" {
  type    = number
  default = 10
}

variable "web_version" {
  type    = string
  default = "1"
}

variable "db_version" {
  type    = string
  default = "1"
}

module "network" {
  source = "./modules/network"
}

module "web" {
  source  = "./modules/web"
  subnet  = module.network.subnet
  release = var.web_version
  sleep   = var.sleep
}

module "db" {
  source  = "./modules/db"
  subnet  = module.network.subnet
  release = var.db_version
  sleep   = var.sleep
}

output "web_url" {
  value = module.web.url
}
