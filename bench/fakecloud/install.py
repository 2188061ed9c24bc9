"""Building the fakecloud provider into a filesystem mirror, and the Terraform CLI configuration that
installs it from there (``provider_installation { filesystem_mirror { … } }``), as a user with a private
provider would set it up. Everything else (``terraform_data``) is built in, so nothing is downloaded.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from bench.fakecloud.provider import HOST, NAMESPACE, SOURCE, TYPE, VERSION

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """#!{python}
import sys
sys.path.insert(0, {repo!r})
from bench.fakecloud.provider import main
main()
"""

CLI_CONFIG = """provider_installation {{
  filesystem_mirror {{
    path    = "{mirror}"
    include = ["{host}/*/*"]
  }}
  direct {{
    exclude = ["{host}/*/*"]
  }}
}}
"""

REQUIRED = """terraform {{
  required_providers {{
    fakecloud = {{
      source  = "{source}"
      version = "{version}"
    }}
  }}
}}
"""


@dataclass(frozen=True, slots=True)
class Installed:
    mirror: Path
    cli_config: Path

    def env(self, cloud_root: Path) -> dict[str, str]:
        """What a Terraform (or kl) process needs to find the provider and its cloud."""
        return {"TF_CLI_CONFIG_FILE": str(self.cli_config), "FAKECLOUD_ROOT": str(cloud_root)}


def required_providers() -> str:
    """The ``terraform { required_providers }`` block naming the fakecloud provider."""
    return REQUIRED.format(source=SOURCE, version=VERSION)


def install(where: Path) -> Installed:
    """Write the provider executable, package it into ``where/mirror`` and write ``where/terraformrc``."""
    from tf.runner import install_provider

    where.mkdir(parents=True, exist_ok=True)
    script = where / "bin" / f"terraform-provider-{TYPE}"
    script.parent.mkdir(exist_ok=True)
    script.write_text(_SCRIPT.format(python=sys.executable, repo=str(REPO)))
    script.chmod(0o755)
    mirror = where / "mirror"
    install_provider(HOST, NAMESPACE, TYPE, VERSION, mirror, script)
    rc = where / "terraformrc"
    rc.write_text(CLI_CONFIG.format(mirror=mirror, host=HOST))
    return Installed(mirror, rc)
