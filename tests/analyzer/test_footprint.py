"""analyzer.footprint: which blocks a file-scoped plan needs, what it writes and reads, and when it widens or fails."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from analyzer.footprint import DIAGNOSTICS, Footprint, compute_footprint
from analyzer.footprint_rules import FULL_PLAN, HANDLED
from analyzer.hcl import ParseCache, content_digest
from analyzer.state import ParsedState, parse_state

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SPLIT = FIXTURES / "hcl" / "split"


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(directory.glob("*.tf"))}


def _names(footprint: Footprint) -> dict[str, str]:
    """Block name -> role."""
    return {b.name: b.role for b in footprint.blocks}


# --- table tests on small configurations -------------------------------------------------------------------

PROVIDERS = '''terraform {
  required_providers {
    aws = { source = "hashicorp/aws" }
  }
  backend "s3" {
    bucket = "b"
  }
}

provider "aws" {
  region = var.region
}

provider "aws" {
  alias  = "east"
  region = local.east
}
'''
VARIABLES = '''variable "region" {
  type = string
}

variable "unused" {
  type = string
}

variable "name" {
  type = string
}
'''
LOCALS = '''locals {
  east   = "us-east-1"
  prefix = "${var.name}-x"
  tags   = { name = local.prefix }
  other  = var.unused
}
'''
NETWORK = '''resource "aws_vpc" "main" {
  cidr_block = "10.0.0.0/16"
}

resource "aws_subnet" "a" {
  vpc_id = aws_vpc.main.id
}

data "aws_ami" "ubuntu" {
  most_recent = true
}

module "dns" {
  source = "./modules/dns"
  vpc    = aws_vpc.main.id
}
'''
BASE = {"providers.tf": PROVIDERS, "variables.tf": VARIABLES, "locals.tf": LOCALS, "network.tf": NETWORK,
        "other.tf": 'resource "aws_eip" "x" {}\n'}


@dataclass(frozen=True)
class Case:
    files: dict[str, str]
    selected: tuple[str, ...] = ("app.tf",)
    writes: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    validation: tuple[str, ...] = ()
    blocks: dict[str, str] = field(default_factory=dict)  # the blocks, name -> role, exactly
    module_dirs: tuple[str, ...] = ()
    diagnostics: tuple[str, ...] = ()


CASES = {
    "resources in the file are written, with every instance": Case(
        {**BASE, "app.tf": 'resource "aws_eip" "y" {\n  count = 2\n}\n'},
        writes=("aws_eip.y", "aws_eip.y.*"),
        blocks={"aws_eip.y": "selected", "terraform": "read", "provider.aws": "read", "var.region": "read"},
    ),
    "referenced resources, data sources, variables and locals are pulled in and read": Case(
        {**BASE, "app.tf": '''resource "aws_instance" "web" {
  ami       = data.aws_ami.ubuntu.id
  subnet_id = aws_subnet.a.id
  tags      = local.tags
}
'''},
        writes=("aws_instance.web", "aws_instance.web.*"),
        reads=("aws_subnet.a.*", "aws_vpc.main.*", "data.aws_ami.ubuntu.*"),
        blocks={"aws_instance.web": "selected", "data.aws_ami.ubuntu": "read", "aws_subnet.a": "read",
                "aws_vpc.main": "read", "local.prefix": "read", "local.tags": "read", "var.name": "read",
                "var.region": "read", "terraform": "read", "provider.aws": "read"},
    ),
    "an aliased provider pulls its own block and what it references": Case(
        {**BASE, "app.tf": 'resource "aws_instance" "web" {\n  provider = aws.east\n}\n'},
        writes=("aws_instance.web", "aws_instance.web.*"),
        blocks={"aws_instance.web": "selected", "provider.aws.east": "read", "local.east": "read",
                "terraform": "read"},
    ),
    "a module output reads the whole module call and copies its directory": Case(
        {**BASE, "app.tf": 'resource "aws_instance" "web" {\n  tags = { zone = module.dns.zone_id }\n}\n'},
        writes=("aws_instance.web", "aws_instance.web.*"),
        reads=("aws_vpc.main.*", "module.dns.*"),
        blocks={"aws_instance.web": "selected", "module.dns": "read", "aws_vpc.main": "read", "terraform": "read",
                "provider.aws": "read", "var.region": "read"},
        module_dirs=("modules/dns",),
    ),
    "a module call in the file writes the module and brings every default provider": Case(
        {**BASE, "app.tf": 'module "app" {\n  source = "./modules/../modules/app"\n  name = var.name\n}\n'},
        writes=("module.app.*",),
        blocks={"module.app": "selected", "var.name": "read", "terraform": "read", "provider.aws": "read",
                "var.region": "read"},
        module_dirs=("modules/app",),
    ),
    "outputs and checks of the file pull what they need for validation only": Case(
        {**BASE, "app.tf": '''resource "aws_eip" "y" {}

output "other_ip" {
  value = aws_eip.x.public_ip
}
'''},
        writes=("aws_eip.y", "aws_eip.y.*"),
        validation=("aws_eip.x.*",),
        blocks={"aws_eip.y": "selected", "output.other_ip": "selected", "aws_eip.x": "validation",
                "terraform": "read", "provider.aws": "read", "var.region": "read"},
    ),
    "moved, removed and import blocks of the file write every address they name": Case(
        {**BASE, "app.tf": '''resource "aws_eip" "new" {}

moved {
  from = aws_eip.old
  to   = aws_eip.new
}

removed {
  from = module.gone
}

import {
  for_each = toset(["a", "b"])
  to       = aws_eip.imported[each.key]
  id       = each.value
}
'''},
        writes=("aws_eip.imported.*", "aws_eip.new", "aws_eip.new.*", "aws_eip.old", "aws_eip.old.*",
                "module.gone.*"),
        blocks={"aws_eip.new": "selected", "moved": "selected", "removed": "selected", "import": "selected",
                "terraform": "read", "provider.aws": "read", "var.region": "read"},
    ),
    "a selected file's locals block comes whole; locals elsewhere are cut one by one": Case(
        {**BASE, "app.tf": '''locals {
  mine = local.prefix
}

resource "aws_eip" "y" {
  tags = { n = local.mine }
}
'''},
        writes=("aws_eip.y", "aws_eip.y.*"),
        blocks={"locals": "selected", "aws_eip.y": "selected", "local.prefix": "read", "var.name": "read",
                "terraform": "read", "provider.aws": "read", "var.region": "read"},
    ),
    "two selected files are one footprint": Case(
        {**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { a = aws_eip.z.id }\n}\n',
         "app2.tf": 'resource "aws_eip" "z" {}\n'},
        selected=("app.tf", "app2.tf"),
        writes=("aws_eip.y", "aws_eip.y.*", "aws_eip.z", "aws_eip.z.*"),
        blocks={"aws_eip.y": "selected", "aws_eip.z": "selected", "terraform": "read", "provider.aws": "read",
                "var.region": "read"},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_footprint_of_a_small_configuration(name: str) -> None:
    case = CASES[name]
    footprint = compute_footprint(case.files, case.selected)
    assert [d.construct for d in footprint.diagnostics] == list(case.diagnostics)
    assert footprint.write_globs == case.writes
    assert footprint.read_globs == case.reads
    assert footprint.validation_globs == case.validation
    assert _names(footprint) == case.blocks
    assert footprint.module_dirs == case.module_dirs
    assert footprint.selected_files == case.selected


def test_the_terraform_block_leaves_its_backend_out() -> None:
    footprint = compute_footprint({**BASE, "app.tf": 'resource "aws_eip" "y" {}\n'}, ["app.tf"])
    (terraform,) = [b for b in footprint.blocks if b.type == "terraform"]
    (omit,) = terraform.omit
    assert PROVIDERS[omit.start_pos:omit.end_pos] == 'backend "s3" {\n    bucket = "b"\n  }'


def test_trunk_edges_read_what_the_written_resources_depend_on_and_what_depends_on_them() -> None:
    footprint = compute_footprint(
        {"app.tf": 'resource "aws_eip" "y" {}\n'}, ["app.tf"],
        trunk_edges=[("aws_eip.y", "aws_iam_role.r"), ('module.lb["a"].aws_lb.front[0]', "aws_eip.y"),
                     ("aws_other.unrelated", "aws_vpc.v"), ("aws_eip.y", "aws_eip.y")],
    )
    assert footprint.read_globs == ("aws_iam_role.r.*", 'module.lb["a"].aws_lb.front.*')


def test_trunk_edges_from_a_real_state_widen_the_reads() -> None:
    parsed = parse_state((FIXTURES / "plans" / "xmod.tfstate").read_bytes())
    assert isinstance(parsed, ParsedState)
    edges = [(row.address, dependency) for row in parsed.instances for dependency in row.dependencies]
    main = (FIXTURES / "plans" / "xmod" / "main.tf").read_text()
    audit = re.search(r'resource "terraform_data" "audit" \{.*?\n\}\n', main, re.S)
    assert audit is not None
    files = {"main.tf": main.replace(audit.group(), ""), "audit.tf": audit.group()}
    footprint = compute_footprint(files, ["audit.tf"], trunk_edges=edges)
    assert footprint.write_globs == ("terraform_data.audit", "terraform_data.audit.*")
    assert footprint.read_globs == ("module.app.*", "module.net.*")
    assert set(_names(footprint)) == {"terraform_data.audit", "module.app", "module.net", "var.app_tag", "var.token"}
    assert footprint.module_dirs == ("modules/app", "modules/net")


# --- parsing only what is needed ----------------------------------------------------------------------------


def test_only_the_selected_files_and_the_blocks_they_need_are_parsed() -> None:
    cache = ParseCache()
    files = {**BASE, "broken.tf": 'resource "x" "y" {\n  a = = 1\n}\n',
             "app.tf": 'resource "aws_instance" "web" {\n  subnet_id = aws_subnet.a.id\n}\n'}
    footprint = compute_footprint(files, ["app.tf"], cache=cache)
    assert not footprint.diagnostics  # broken.tf scans fine and nothing needs it, so it is never parsed
    assert set(cache.analyses) == {content_digest(files["app.tf"])}
    parsed = {(files_key, start) for (files_key, start) in cache.blocks}
    by_file = {content_digest(t): name for name, t in files.items()}
    assert sorted(by_file[d] for d, _ in parsed) == [
        "network.tf", "network.tf", "providers.tf", "providers.tf", "providers.tf", "variables.tf"]
    assert cache.parse_count == 7


def test_a_warm_cache_gives_the_same_footprint_without_parsing() -> None:
    cache = ParseCache()
    files = _files(SPLIT)
    cold = compute_footprint(files, ["app.tf"], cache=cache)
    parses = cache.parse_count
    assert compute_footprint(files, ["app.tf"], cache=cache) == cold == compute_footprint(files, ["app.tf"])
    assert cache.parse_count == parses


@pytest.mark.parametrize(("selected", "message"), [
    (["missing.tf"], "not among"), (["terraform.tfvars"], "not a .tf"),
])
def test_a_bad_selection_is_a_caller_error(selected: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_footprint({"a.tf": "", "terraform.tfvars": ""}, selected)


# --- every diagnostic: produced, with its action, and never a narrower footprint --------------------------


@dataclass(frozen=True)
class Risky:
    files: dict[str, str]
    selected: tuple[str, ...] = ("app.tf",)
    at_least_writes: tuple[str, ...] = ()
    at_least_reads: tuple[str, ...] = ()
    at_least_blocks: tuple[str, ...] = ()


RISKY = {
    "parse_error": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  a = = 1\n}\n'}),
    "tf_json": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { r = var.from_json }\n}\n',
                      "vars.tf.json": json.dumps({"variable": {"from_json": {"type": "string"}}})},
                     at_least_writes=("aws_eip.y", "aws_eip.y.*")),
    "override_file": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {}\n',
                            "app_override.tf": 'resource "aws_eip" "y" {\n  vpc = true\n}\n'},
                           at_least_writes=("aws_eip.y", "aws_eip.y.*")),
    "undefined_reference": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { a = var.nope }\n}\n'},
                                 at_least_writes=("aws_eip.y", "aws_eip.y.*")),
    "invalid_reference": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { a = nope }\n}\n'},
                               at_least_writes=("aws_eip.y", "aws_eip.y.*")),
    "duplicate_definition": Risky({**BASE, "app.tf": 'resource "aws_eip" "x" {}\n'},
                                  at_least_writes=("aws_eip.x", "aws_eip.x.*")),
    "unreadable_expression": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { a = local.t }\n}\n',
                                    "t.tf": 'locals {\n  t = <<EOT\n${aws_vpc.main.id\nEOT\n}\n'},
                                   at_least_writes=("aws_eip.y", "aws_eip.y.*"), at_least_blocks=("local.t",)),
    "module_source_missing": Risky({**BASE, "app.tf": 'module "m" {\n  name = var.name\n}\n'},
                                   at_least_writes=("module.m.*",)),
    "remote_state": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { r = '
                           'data.terraform_remote_state.net.outputs.r }\n}\n',
                           "remote.tf": 'data "terraform_remote_state" "net" {\n  backend = "local"\n}\n'},
                          at_least_writes=("aws_eip.y", "aws_eip.y.*"),
                          at_least_reads=("data.terraform_remote_state.net.*",)),
    "module_source_remote": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { v = module.vpc.id }\n}\n',
                                   "vpc.tf": 'module "vpc" {\n  source = "terraform-aws-modules/vpc/aws"\n}\n'},
                                  at_least_writes=("aws_eip.y", "aws_eip.y.*"), at_least_reads=("module.vpc.*",)),
    "file_function": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { p = local.policy }\n}\n',
                            "policy.tf": 'locals {\n  policy = file("${path.module}/policy.json")\n}\n'},
                           at_least_writes=("aws_eip.y", "aws_eip.y.*"), at_least_blocks=("local.policy",)),
    "moved_elsewhere": Risky({**BASE, "app.tf": 'resource "aws_eip" "new" {}\n',
                              "migrations.tf": 'moved {\n  from = aws_eip.old\n  to   = aws_eip.new\n}\n\n'
                                               'import {\n  to = aws_eip.unrelated\n  id = "x"\n}\n'},
                             at_least_writes=("aws_eip.new", "aws_eip.new.*", "aws_eip.old", "aws_eip.old.*"),
                             at_least_blocks=("moved",)),
    "migration_source_declared": Risky({**BASE, "app.tf": 'resource "aws_eip" "z" {}\n\n'
                                                  'moved {\n  from = aws_subnet.a\n  to   = aws_eip.z\n}\n'},
                                       at_least_writes=("aws_eip.z", "aws_eip.z.*", "aws_subnet.a", "aws_subnet.a.*")),
    "invalid_label": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {}\n',
                            "bad.tf": 'module "super#module" {\n  source = "./m"\n}\n'}),
    "provider_consumer": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {}\n',
                                "dns.tf": 'provider "dns" {\n  server = aws_eip.y.public_ip\n}\n'},
                               at_least_writes=("aws_eip.y", "aws_eip.y.*")),
    "consumer": Risky({**BASE, "app.tf": 'resource "aws_eip" "y" {}\n',
                       "dns.tf": 'resource "aws_route53_record" "r" {\n  records = [aws_eip.y.public_ip]\n}\n'},
                      at_least_writes=("aws_eip.y", "aws_eip.y.*", "aws_route53_record.r", "aws_route53_record.r.*"),
                      at_least_blocks=("aws_route53_record.r",)),
    "target_elsewhere": Risky({**BASE, "app.tf": 'moved {\n  from = aws_vpc.old\n  to   = aws_vpc.main\n}\n'},
                              at_least_writes=("aws_vpc.main", "aws_vpc.main.*", "aws_vpc.old", "aws_vpc.old.*"),
                              at_least_blocks=("aws_vpc.main",)),
}


def test_every_catalogued_diagnostic_has_a_case() -> None:
    assert set(RISKY) == set(DIAGNOSTICS)


@pytest.mark.parametrize("construct", sorted(RISKY))
def test_each_diagnostic_is_produced_with_its_action_and_never_narrows(construct: str) -> None:
    case = RISKY[construct]
    footprint = compute_footprint(case.files, case.selected)
    found = [d for d in footprint.diagnostics if d.construct == construct]
    assert found, footprint.diagnostics
    rule = DIAGNOSTICS[construct]
    for diagnostic in found:
        assert diagnostic.action == rule.action
        assert diagnostic.message.endswith(rule.how)
        assert diagnostic.file in case.files and diagnostic.line >= 1
    assert footprint.fails_closed is (rule.action == "fail")
    if rule.action == "fail":
        assert all(d.message.endswith(FULL_PLAN) for d in found)
    assert set(case.at_least_writes) <= set(footprint.write_globs)
    assert set(case.at_least_reads) <= set(footprint.read_globs)
    assert set(case.at_least_blocks) <= set(_names(footprint))


@pytest.mark.parametrize(("files", "construct"), [
    ({**BASE, "app.tf.json": "{}"}, "tf_json"),
    ({**BASE, "app.tf": "", "providers.tf.json": json.dumps({"terraform": {"required_version": ">= 1"}})},
     "tf_json"),
    ({**BASE, "app.tf": 'resource "aws_eip" "new" {}\n', "m.tf.json": json.dumps({"moved": [{"from": "a.b"}]})},
     "tf_json"),
    ({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  provider = aws.west\n}\n'}, "undefined_reference"),
    ({**BASE, "app.tf": 'resource "aws_eip" "y" {}\n', "x.tf": 'resource "a" "b" {\n  x = "unterminated\n}\n'},
     "parse_error"),
    ({**BASE, "app.tf": 'resource "aws_eip" "y" {\n  tags = { a = local.prefix }\n}\n',
      "more.tf": 'locals {\n  prefix = "again"\n}\n'}, "duplicate_definition"),
    ({**BASE, "override.tf": "", "app.tf": ""}, None),
], ids=["selected-json", "json-terraform-block", "json-moved", "undeclared-alias", "unscannable-file",
        "duplicate-local", "unrelated-override"])
def test_more_ways_to_fail_closed(files: dict[str, str], construct: str | None) -> None:
    selected = ["app.tf.json"] if "app.tf.json" in files else ["app.tf"]
    footprint = compute_footprint(files, selected)
    assert [d.construct for d in footprint.diagnostics if d.action == "fail"] == ([construct] if construct else [])


def test_a_selected_override_file_fails_closed() -> None:
    footprint = compute_footprint({**BASE, "app_override.tf": 'resource "aws_eip" "x" {}\n'}, ["app_override.tf"])
    assert [d.construct for d in footprint.diagnostics] == ["override_file"]


# --- constructs followed exactly, without a diagnostic --------------------------------------------------------

HANDLED_CASES = {
    "dynamic_block": ('''resource "aws_security_group" "g" {
  dynamic "ingress" {
    for_each = data.aws_ami.ubuntu.tags
    iterator = rule
    content {
      from_port = rule.value
      cidr      = aws_vpc.main.cidr_block
    }
  }
}
''', ("aws_vpc.main.*", "data.aws_ami.ubuntu.*")),
    "for_expression": ('resource "aws_eip" "y" {\n  tags = { for k, v in aws_subnet.a.tags : k => v }\n}\n',
                       ("aws_subnet.a.*", "aws_vpc.main.*")),
    "template_directive": ('resource "aws_eip" "y" {\n  name = "%{ for s in aws_subnet.a.ids }${s}%{ endfor }"\n}\n',
                           ("aws_subnet.a.*", "aws_vpc.main.*")),
    "heredoc": ('resource "aws_eip" "y" {\n  user_data = <<EOT\nid=${aws_vpc.main.id}\nEOT\n}\n', ("aws_vpc.main.*",)),
    "provider_function": ('resource "aws_eip" "y" {\n  r = provider::aws::arn_parse(aws_vpc.main.arn).region\n}\n',
                          ("aws_vpc.main.*",)),
    "check_block": ('''check "up" {
  data "http" "h" {
    url = aws_vpc.main.id
  }
  assert {
    condition     = data.http.h.status_code == 200
    error_message = "down"
  }
}
''', ("aws_vpc.main.*",)),
    "depends_on": ('resource "aws_eip" "y" {\n  depends_on = [module.dns, aws_subnet.a]\n}\n',
                   ("aws_subnet.a.*", "aws_vpc.main.*", "module.dns.*")),
    "replace_triggered_by": ('resource "aws_eip" "y" {\n  lifecycle {\n    replace_triggered_by = [aws_vpc.main.id]\n'
                             '  }\n}\n', ("aws_vpc.main.*",)),
    "module_output": ('resource "aws_eip" "y" {\n  tags = { z = module.dns["a"].zone }\n}\n',
                      ("aws_vpc.main.*", "module.dns.*")),
    "import_for_each": ('import {\n  for_each = aws_subnet.a.ids\n  to = aws_eip.i[each.key]\n  id = each.value\n}\n',
                        ("aws_subnet.a.*", "aws_vpc.main.*")),
}


def test_every_handled_construct_has_a_case() -> None:
    assert set(HANDLED_CASES) == set(HANDLED)


@pytest.mark.parametrize("construct", sorted(HANDLED_CASES))
def test_handled_constructs_reach_the_footprint_without_diagnostics(construct: str) -> None:
    text, reads = HANDLED_CASES[construct]
    footprint = compute_footprint({**BASE, "app.tf": text}, ["app.tf"])
    assert footprint.diagnostics == ()
    assert set(reads) <= set(footprint.read_globs)


# --- golden file, and a workspace made of the footprint's blocks that real Terraform validates ----------------


def test_the_split_fixture_footprint_matches_the_golden_file(request: pytest.FixtureRequest) -> None:
    edges = [("terraform_data.watcher", "terraform_data.server")]
    footprint = compute_footprint(_files(SPLIT), ["app.tf"], trunk_edges=edges)
    actual = json.dumps(asdict(footprint), indent=2, sort_keys=True) + "\n"
    path = FIXTURES / "hcl" / "split.footprint.json"
    if request.config.getoption("--update-golden"):
        path.write_text(actual, encoding="utf-8")
    assert actual == path.read_text(encoding="utf-8"), f"{path.name} differs: review, then pytest --update-golden"


def _workspace(files: dict[str, str], footprint: Footprint) -> dict[str, str]:
    """Assemble the minimal configuration the way a workspace builder would: spans, omits, locals re-wrapped."""
    out: dict[str, list[str]] = {}
    for block in footprint.blocks:
        text = files[block.file]
        pieces, cursor = [], block.span.start_pos
        for omit in block.omit:
            pieces.append(text[cursor:omit.start_pos])
            cursor = omit.end_pos
        pieces.append(text[cursor:block.span.end_pos])
        body = "".join(pieces)
        out.setdefault(block.file, []).append(f"locals {{\n  {body}\n}}" if block.type == "local" else body)
    return {name: "\n\n".join(parts) + "\n" for name, parts in out.items()}


@pytest.mark.terraform
def test_the_footprints_blocks_form_a_configuration_terraform_validates(terraform_factory: Any) -> None:
    files = _files(SPLIT)
    footprint = compute_footprint(files, ["app.tf"])
    assert not footprint.diagnostics
    tf = terraform_factory("workspace")
    for name, text in _workspace(files, footprint).items():
        tf.write(name, text)
    for directory in footprint.module_dirs:
        shutil.copytree(SPLIT / directory, tf.workdir / directory)
    assert "unused" not in (tf.workdir / "variables.tf").read_text()
    assert "other" not in (tf.workdir / "locals.tf").read_text()
    assert "backend" not in (tf.workdir / "terraform.tf").read_text()
    tf("init", "-backend=false", "-input=false")
    result = tf("validate", "-json")
    assert json.loads(result.stdout)["valid"] is True, result.output
