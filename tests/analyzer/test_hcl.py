"""analyzer.hcl: blocks, spans and references of .tf files, checked against the plan JSON real Terraform wrote."""

from __future__ import annotations

import gc
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analyzer.hcl import (
    Block,
    HclError,
    ParseCache,
    Reference,
    analyze_block,
    analyze_file,
    find_http_backend,
    prescan,
)
from analyzer.prescan import scan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# (configuration directory, plan JSON whose configuration section Terraform wrote from it)
PLANNED = {
    "step2": (FIXTURES / "states" / "step2", FIXTURES / "plans" / "plan2.json"),
    "refs": (FIXTURES / "hcl" / "refs", FIXTURES / "plans" / "refs.plan.json"),
    "xmod": (FIXTURES / "plans" / "xmod", FIXTURES / "plans" / "xmod.plan.json"),
    "split": (FIXTURES / "hcl" / "split", FIXTURES / "hcl" / "split.plan.json"),
}


def _blocks(text: str, path: str = "main.tf") -> dict[str, Block]:
    return {b.address: b for b in analyze_file(path, text).blocks}


def _refs(block: Block, attribute: str | None = None) -> list[str]:
    return [r.text for r in block.references if attribute is None or r.attribute == attribute]


def _plan_strings(block: Block, attribute: str) -> list[str]:
    return [s for r in block.references if r.attribute == attribute for s in r.plan_references()]


# --- equivalence with Terraform's own reference lists ------------------------------------------------------


def _expressions(directory: Path, module: dict[str, Any]) -> Iterator[tuple[str, Block, str, dict[str, Any]]]:
    """(where, block, attribute, plan expression) for every expression the plan's configuration lists."""
    blocks = {b.address: b for p in sorted(directory.glob("*.tf")) for b in analyze_file(p.name, p.read_text()).blocks}
    for resource in module.get("resources", []):
        address = ("data." if resource["mode"] == "data" else "") + f"{resource['type']}.{resource['name']}"
        block = blocks[address]
        for attribute, expression in resource.get("expressions", {}).items():
            yield f"{directory.name}:{address}", block, attribute, expression
        for key, attribute in (("count_expression", "count"), ("for_each_expression", "for_each")):
            if key in resource:
                yield f"{directory.name}:{address}", block, attribute, resource[key]
    for name, output in module.get("outputs", {}).items():
        yield f"{directory.name}:output.{name}", blocks[f"output.{name}"], "value", output["expression"]
    for name, call in module.get("module_calls", {}).items():
        block = blocks[f"module.{name}"]
        for attribute, expression in call.get("expressions", {}).items():
            yield f"{directory.name}:module.{name}", block, attribute, expression
        for key, attribute in (("count_expression", "count"), ("for_each_expression", "for_each")):
            if key in call:
                yield f"{directory.name}:module.{name}", block, attribute, call[key]
        yield from _expressions(directory / call["source"], call["module"])


def _all_expressions() -> Iterator[Any]:
    for name, (directory, plan_file) in PLANNED.items():
        plan = json.loads(plan_file.read_text(encoding="utf-8"))
        for where, block, attribute, expression in _expressions(directory, plan["configuration"]["root_module"]):
            yield pytest.param(block, attribute, expression, id=f"{name}:{where}.{attribute}")


@pytest.mark.parametrize(("block", "attribute", "expression"), list(_all_expressions()))
def test_references_equal_terraforms_plan_json_in_order_with_duplicates(
    block: Block, attribute: str, expression: dict[str, Any]
) -> None:
    assert _plan_strings(block, attribute) == expression.get("references", [])


@pytest.mark.parametrize("name", sorted(PLANNED))
def test_depends_on_and_module_sources_equal_the_plans(name: str) -> None:
    directory, plan_file = PLANNED[name]
    root = json.loads(plan_file.read_text(encoding="utf-8"))["configuration"]["root_module"]
    blocks = {b.address: b for p in sorted(directory.glob("*.tf")) for b in analyze_file(p.name, p.read_text()).blocks}
    for resource in root.get("resources", []):
        address = ("data." if resource["mode"] == "data" else "") + f"{resource['type']}.{resource['name']}"
        assert list(blocks[address].depends_on) == resource.get("depends_on", [])
    for call_name, call in root.get("module_calls", {}).items():
        assert blocks[f"module.{call_name}"].module_source == call["source"]


def test_the_equivalence_test_covers_every_kind_of_reference() -> None:
    kinds = {r.kind for p in PLANNED.values() for f in p[0].rglob("*.tf")
             for b in analyze_file(f.name, f.read_text()).blocks for r in b.references}
    assert {"resource", "data", "module", "var", "local", "each", "count", "path", "terraform"} <= kinds


# --- blocks ----------------------------------------------------------------------------------------------

BLOCKS = '''terraform {
  required_version = ">= 1.5"
  backend "http" {
    address = "http://x"
  }
}

provider "aws" {
  alias  = "east"
  region = var.region
}

resource "aws_instance" "web" {
  provider = aws.east
  for_each = var.names
  ami      = data.aws_ami.u.id

  lifecycle {
    ignore_changes       = [tags]
    replace_triggered_by = [aws_vpc.v.id, terraform_data.t]
  }
  depends_on = [module.net, aws_vpc.v]
}

module "net" {
  source    = "./modules/net"
  count     = 2
  providers = { aws = aws.east }
  cidr      = local.cidr
}

locals {
  cidr = "10.0.0.0/16"
  name = "${local.cidr}-${var.region}"
}

moved {
  to   = module.b.aws_x.y["k"]
  from = module.a[0].aws_x.y
}

removed {
  from = aws_x.gone
  lifecycle {
    destroy = false
  }
}

import {
  for_each = var.ids
  to       = aws_instance.imp[each.key]
  id       = each.value
}

check "health" {
  data "http" "h" {
    url = var.url
  }
  assert {
    condition     = data.http.h.status_code == 200
    error_message = "down"
  }
}
'''


def test_blocks_carry_their_meta_arguments() -> None:
    blocks = _blocks(BLOCKS)
    assert list(blocks) == ["terraform", "provider.aws.east", "aws_instance.web", "module.net", "locals", "moved",
                            "removed", "import", "check.health"]
    web = blocks["aws_instance.web"]
    assert (web.type, web.labels, web.provider, web.provider_configs) == (
        "resource", ("aws_instance", "web"), "aws.east", ("aws.east",))
    assert web.repetition == "for_each"
    assert web.depends_on == ("module.net", "aws_vpc.v")
    assert web.replace_triggered_by == ("aws_vpc.v.id", "terraform_data.t")
    # provider and ignore_changes hold no references
    assert _refs(web) == ["var.names", "data.aws_ami.u.id", "aws_vpc.v.id", "terraform_data.t", "module.net",
                          "aws_vpc.v"]
    net = blocks["module.net"]
    assert (net.module_source, net.repetition, net.provider_configs, _refs(net)) == (
        "./modules/net", "count", ("aws.east",), ["local.cidr"])
    assert blocks["moved"].targets == ("module.a[0].aws_x.y", 'module.b.aws_x.y["k"]')
    assert blocks["removed"].targets == ("aws_x.gone",)
    assert blocks["import"].targets == ("aws_instance.imp[*]",)
    assert _refs(blocks["import"]) == ["var.ids", "each.value"]
    health = blocks["check.health"]
    assert health.scoped_data == ("data.http.h",) and health.provider_configs == ("http",)
    assert _refs(health) == ["var.url", "data.http.h.status_code"]
    assert _refs(blocks["provider.aws.east"]) == ["var.region"]
    assert _refs(blocks["terraform"]) == []


def test_spans_cut_blocks_locals_and_backends_out_of_the_text() -> None:
    blocks = _blocks(BLOCKS)
    terraform = blocks["terraform"]
    assert BLOCKS[terraform.span.start_pos:terraform.span.end_pos].startswith("terraform {")
    (backend,) = terraform.backend_spans
    assert BLOCKS[backend.start_pos:backend.end_pos] == 'backend "http" {\n    address = "http://x"\n  }'
    web = blocks["aws_instance.web"]
    text = BLOCKS[web.span.start_pos:web.span.end_pos]
    assert text.startswith('resource "aws_instance" "web" {') and text.endswith("}")
    assert (web.span.start_line, web.span.end_line) == (13, 23)
    names = {d.name: BLOCKS[d.span.start_pos:d.span.end_pos] for d in blocks["locals"].locals}
    assert names == {"cidr": 'cidr = "10.0.0.0/16"', "name": 'name = "${local.cidr}-${var.region}"'}
    assert [r.text for r in blocks["locals"].locals[1].references] == ["local.cidr", "var.region"]


def test_a_single_block_parses_the_same_as_in_the_whole_file() -> None:
    whole = analyze_file("main.tf", BLOCKS).blocks
    headers = scan(BLOCKS).headers
    assert [analyze_block("main.tf", BLOCKS, h) for h in headers] == list(whole)


# --- references ------------------------------------------------------------------------------------------


def test_references_in_heredocs_and_template_directives_carry_their_lines() -> None:
    block = _blocks('''resource "t" "r" {
  user_data = <<-EOT
    #!/bin/sh
    echo ${var.a} "${local.b}"
    %{ for s in var.subnets ~}
    ${s.id} ${aws_subnet.x[s.key].id}
    %{~ endfor }
    $${not.a.reference} %%{ if not_either }
  EOT
  name = "%{ if var.on }${each.key}%{ else }x%{ endif }"
}
''')["t.r"]
    assert [(r.text, r.line) for r in block.references] == [
        ("var.a", 4), ("local.b", 4), ("var.subnets", 5), ("aws_subnet.x", 6), ("var.on", 10), ("each.key", 10)]


def test_loop_variables_and_dynamic_iterators_are_not_references() -> None:
    block = _blocks('''resource "t" "r" {
  list = [for var in local.list : var.x if var.ok]
  map  = { for k, v in var.m : k => v.size... }
  dynamic "disk" {
    for_each = var.disks
    iterator = d
    content {
      size = d.value.size
      kms  = aws_kms_key.k.arn
      dynamic "part" {
        for_each = d.value.parts
        content {
          x = part.value + disk.value
        }
      }
    }
  }
  dynamic "tag" {
    for_each = local.tags
    content {
      key = tag.key
    }
  }
}
''')["t.r"]
    # disk.value is not bound: the outer iterator is called d, so Terraform reads disk.value as a resource.
    assert _refs(block) == ["local.list", "var.m", "var.disks", "aws_kms_key.k.arn", "disk.value", "local.tags"]
    assert {r.attribute for r in block.references} >= {"dynamic.disk.for_each", "dynamic.disk.content.kms"}


def test_provider_functions_are_functions_not_references() -> None:
    text = 'resource "t" "r" {\n  x = provider::aws::arn_parse(var.arn).region\n  y = length(var.l)\n}\n'
    block = _blocks(text)["t.r"]
    assert _refs(block) == ["var.arn", "var.l"]
    assert block.functions == ("provider::aws::arn_parse", "length")


@pytest.mark.parametrize(("expression", "expected"), [
    ("terraform_data.web[0].id", ["terraform_data.web[0].id", "terraform_data.web[0]", "terraform_data.web"]),
    ("length(terraform_data.web)", ["terraform_data.web"]),
    ("terraform_data.web[*].id", ["terraform_data.web"]),
    ("terraform_data.web.0.id", ["terraform_data.web[0].id", "terraform_data.web[0]", "terraform_data.web"]),
    ("terraform_data.web[var.i].id", ["terraform_data.web", "var.i"]),
    ('module.each["a"].result', ['module.each["a"].result', 'module.each["a"]']),
    ('module.each["a"]', ['module.each["a"]', "module.each"]),
    ("module.child", ["module.child"]),
    ("data.t.x.outputs.region", ["data.t.x.outputs.region", "data.t.x.outputs", "data.t.x"]),
    ('var.m["a"].name', ['var.m["a"].name', 'var.m["a"]', "var.m"]),
    ("resource.aws_x.y.id", ["aws_x.y.id", "aws_x.y"]),
    ("ephemeral.random_password.p.result", ["ephemeral.random_password.p.result", "ephemeral.random_password.p"]),
    ("self.private_ip", ["self.private_ip", "self"]),
    ("(aws_vpc.v).id", ["aws_vpc.v"]),
    ("{ (each.key) = path.root, plain = terraform.workspace, var.k = 1 }",
     ["each.key", "path.root", "terraform.workspace", "var.k"]),
])
def test_plan_references_follow_marshal_expression(expression: str, expected: list[str]) -> None:
    block = _blocks(f"resource \"t\" \"r\" {{\n  x = {expression}\n}}\n")["t.r"]
    assert _plan_strings(block, "x") == expected


@pytest.mark.parametrize("expression", ["foo", "var", "data.x", "module", "template.x", "count"])
def test_references_terraform_rejects_are_marked_invalid(expression: str) -> None:
    (ref,) = _blocks(f"resource \"t\" \"r\" {{\n  x = {expression}\n}}\n")["t.r"].references
    assert (ref.kind, ref.plan_references()) == ("invalid", ())


def test_reference_fields_name_the_configuration_object() -> None:
    (ref,) = _blocks('resource "t" "r" {\n  x = module.net["a"].vpc_id\n}\n')["t.r"].references
    assert ref == Reference(text='module.net["a"].vpc_id', subject='module.net["a"].vpc_id', kind="module", line=2,
                            attribute="x", remaining=(), address="module.net")


def test_strip_markers_on_interpolations_parse_with_unchanged_positions() -> None:
    text = 'resource "t" "r" {\n  x = "a ${~ var.x ~} b"\n}\n'
    (block,) = analyze_file("main.tf", text).blocks
    assert _refs(block) == ["var.x"] and block.span.end_pos == len(text) - 1


def test_an_unreadable_heredoc_template_is_reported_not_dropped() -> None:
    block = _blocks('resource "t" "r" {\n  x = <<EOT\n${var.a\nEOT\n}\n')["t.r"]
    assert [r.kind for r in block.references] == ["unreadable"]


# --- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "message"), [
    ('resource "a" "b" {\n  x = = 1\n}\n', "bad.tf:2: cannot parse HCL"),
    ('resource "a" "b" {\n  x = 1\n', "bad.tf:"),
    ('x = 1\n', "bad.tf:1: unexpected top-level argument 'x'"),
    ('moved {\n  from = "a.b"\n  to = a.c\n}\n', "bad.tf:2: expected an address"),
])
def test_errors_name_the_file_and_line(text: str, message: str) -> None:
    with pytest.raises(HclError, match="^" + message.replace(".", r"\.").replace("(", r"\(")):
        analyze_file("bad.tf", text)


# --- parsing costs: the collector and the cache ------------------------------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_restored_only_if_it_was_enabled(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        analyze_file("main.tf", BLOCKS)
        with pytest.raises(HclError):
            analyze_file("bad.tf", "resource {")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_the_cache_answers_by_content_and_relabels_the_path() -> None:
    cache = ParseCache()
    first = analyze_file("a.tf", BLOCKS, cache=cache)
    assert analyze_file("a.tf", BLOCKS, cache=cache) is first
    moved = analyze_file("b/c.tf", BLOCKS, cache=cache)
    assert cache.parse_count == 1
    assert moved.path == "b/c.tf" and {b.file for b in moved.blocks} == {"b/c.tf"}
    assert moved.blocks[0].span == first.blocks[0].span


def test_the_cache_survives_pickling() -> None:
    cache = ParseCache()
    analysis = analyze_file("a.tf", BLOCKS, cache=cache)
    restored = pickle.loads(pickle.dumps(cache))
    assert analyze_file("a.tf", BLOCKS, cache=restored) == analysis
    assert restored.parse_count == 1


# --- prescan ---------------------------------------------------------------------------------------------

TRICKY = r'''# resource "in" "a_comment" {
/* moved {
} */
resource "a" "b" {
  s = "}"
  t = "{${ {a = "}"} }"
  u = <<EOT
resource "in" "a_heredoc" {
EOT
  v = "a ${~ var.x ~} b %{ if y }}{%{ endif }"
  w = "\"}"
  x = 1 < 2
  y = 4 / 2 // }
  nested {
    data "not" "top" {}
  }
}
locals { a = 1 }
  moved {
    from = a.b
    to   = a.c
  }
'''


def test_prescan_finds_top_level_headers_only() -> None:
    assert prescan("t.tf", TRICKY) == (("resource", ("a", "b")), ("locals", ()), ("moved", ()))


def test_prescan_positions_agree_with_the_parser() -> None:
    for text in [TRICKY, BLOCKS, *(f.read_text() for f in FIXTURES.rglob("*.tf"))]:
        found = [(h.type, h.labels, h.line, h.start_pos, h.end_pos) for h in scan(text).headers]
        parsed = [(b.type, b.labels, b.span.start_line, b.span.start_pos, b.span.end_pos)
                  for b in analyze_file("t.tf", text).blocks]
        assert found == parsed


@pytest.mark.parametrize("text", [
    'resource "a" "b" {\n  x = "unterminated\n}\n',
    'resource "a" "b" {\n  x = <<EOT\nno end marker\n}\n',
    '/* a comment first */ resource "a" "b" {\n}\n',
    'resource "a" "b" {\n}\n}\n',
])
def test_prescan_says_when_it_cannot_follow_the_text(text: str) -> None:
    assert not scan(text).complete
    with pytest.raises(HclError, match="^t.tf:1: cannot scan"):
        prescan("t.tf", text)


# --- the http backend (used by runner/core/config.py) ----------------------------------------------------------


def test_find_http_backend_reads_the_literal_settings() -> None:
    found = find_http_backend({
        "main.tf": 'resource "a" "b" {}\n',
        "backend.tf": 'terraform {\n  backend "http" {\n    address = "http://h/s"\n    username = "u"\n  }\n}\n',
    })
    assert found is not None
    assert (found.file, found.address, found.username, found.password) == ("backend.tf", "http://h/s", "u", None)
    assert find_http_backend({"main.tf": 'resource "a" "b" {}\n'}) is None
