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


SAMPLE = """{required}

provider "fakecloud" {{
  root = "{cloud}"  # the "cloud": one JSON file per object; edit or delete one to make drift
}}

resource "fakecloud_bucket" "logs" {{
  name = "logs"
  size = 10
}}
"""


def sample_configuration(cloud_root: Path) -> str:
    """A configuration with one bucket in the cloud at ``cloud_root`` (add a backend block to it)."""
    return SAMPLE.format(required=required_providers().rstrip("\n"), cloud=cloud_root)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.fakecloud.install [DIR]``: install the provider under DIR (default ./fakecloud) for
    trying drift locally, and print the CLI configuration to export and a configuration to start from."""
    args = sys.argv[1:] if argv is None else argv
    where = Path(args[0] if args else "fakecloud").absolute()
    installed = install(where)
    cloud = where / "cloud"
    cloud.mkdir(exist_ok=True)
    print(f"installed the fakecloud provider {SOURCE} {VERSION} into {installed.mirror}")
    print(f"\nexport TF_CLI_CONFIG_FILE={installed.cli_config}\n")
    print("# a configuration to start from (add your backend \"http\" block):")
    print(sample_configuration(cloud), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
