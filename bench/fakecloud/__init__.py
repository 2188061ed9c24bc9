"""The fakecloud test provider: real remote objects (files in a directory) behind a real Terraform provider."""
