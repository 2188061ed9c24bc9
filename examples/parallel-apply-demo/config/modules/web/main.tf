variable "subnet" { type = string }
variable "release" { type = string }
variable "sleep" { type = number }

resource "terraform_data" "server" {
  count            = 2
  input            = "web-${var.release}-${count.index} in ${var.subnet}"
  triggers_replace = var.release

  provisioner "local-exec" {
    command = "sleep ${var.sleep}"
  }
}

output "url" {
  value = "https://web.example/${var.release}"
}
