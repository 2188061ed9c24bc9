"""The configuration graph's reverse closure (analyzer.consumers, analyzer.graph) and the constructs Terraform
accepts that the analyzer used to refuse."""

from __future__ import annotations

import json

import pytest

from analyzer.footprint import compute_footprint
from analyzer.graph import ReferenceMatcher, spellings
from analyzer.scoping import Deletions, changed_variables, cut_blocks, deletions

VARS = 'variable "env" {\n  default = "prod"\n}\n'
LOCALS = 'locals {\n  sizes = { a = 1 }\n  name = "${var.env}-x"\n}\n'
FLEET = 'resource "terraform_data" "node" {\n  for_each = local.sizes\n  input = local.name\n}\n'
DNS = 'resource "terraform_data" "dns" {\n  input = terraform_data.node["a"].id\n}\n'
OUT = 'output "dns" {\n  value = terraform_data.dns.id\n}\n\noutput "other" {\n  value = 1\n}\n'
FILES = {"variables.tf": VARS, "locals.tf": LOCALS, "fleet.tf": FLEET, "dns.tf": DNS, "outputs.tf": OUT}


def test_selecting_a_locals_file_writes_its_consumers_transitively_and_their_outputs():
    fp = compute_footprint(FILES, ["locals.tf"])
    assert set(fp.write_globs) == {"terraform_data.node", "terraform_data.node.*", "terraform_data.dns",
                                   "terraform_data.dns.*"}
    assert fp.outputs == ("dns",)
    assert not fp.fails_closed
    why = {d.file: d.message for d in fp.diagnostics if d.construct == "consumer"}
    assert "terraform_data.node refers to local.sizes" in why["fleet.tf"] or "local.name" in why["fleet.tf"]
    assert "output.dns refers to terraform_data.dns" in why["outputs.tf"]
    cut = cut_blocks(FILES, fp)
    assert 'output "other"' not in cut["outputs.tf"]


def test_a_variables_file_selects_every_consumer_through_locals():
    fp = compute_footprint(FILES, ["variables.tf"])
    assert "terraform_data.node.*" in fp.write_globs and "terraform_data.dns.*" in fp.write_globs


def test_a_seeded_variable_plans_its_consumers_without_any_selected_file():
    fp = compute_footprint(FILES, [], seeds=["var.env"])
    assert "terraform_data.node.*" in fp.write_globs and fp.selected_files == ()


def test_a_leaf_file_reads_what_it_needs_and_writes_only_itself():
    fp = compute_footprint(FILES, ["dns.tf"])
    assert set(fp.write_globs) == {"terraform_data.dns", "terraform_data.dns.*"}
    assert "terraform_data.node.*" in fp.read_globs


def test_a_text_mention_that_is_not_a_reference_widens_nothing():
    files = {**FILES, "note.tf": '# terraform_data.dns is documented here\nresource "terraform_data" "n" {\n'
                                 '  input = "terraform_data.dns"\n}\n'}
    fp = compute_footprint(files, ["dns.tf"])
    assert "terraform_data.n.*" not in fp.write_globs


def test_a_json_file_that_may_refer_to_the_selection_fails_closed():
    files = {**FILES, "peers.tf.json": json.dumps({"resource": {"terraform_data": {"p": {
        "input": "${terraform_data.dns.id}"}}}})}
    fp = compute_footprint(files, ["dns.tf"])
    assert fp.fails_closed and any(d.file == "peers.tf.json" and d.construct == "tf_json" for d in fp.diagnostics)


def test_data_sources_of_the_selection_or_reading_it_are_written_and_the_others_read():
    remote = 'data "terraform_remote_state" "o" {\n  backend = "local"\n}\n'
    uses = 'resource "terraform_data" "u" {\n  input = data.terraform_remote_state.o.outputs\n}\n'
    reader = 'data "terraform_remote_state" "r" {\n  backend = "local"\n  config = { p = terraform_data.u.id }\n}\n'
    fp = compute_footprint({"d.tf": remote + uses, "r.tf": reader}, ["d.tf"])
    assert {"data.terraform_remote_state.o", "data.terraform_remote_state.o.*", "data.terraform_remote_state.r",
            "data.terraform_remote_state.r.*"} <= set(fp.write_globs)
    fp = compute_footprint({"d.tf": remote, "u.tf": uses}, ["u.tf"])
    assert not any(g.startswith("data.") for g in fp.write_globs)
    assert "data.terraform_remote_state.o.*" in fp.read_globs


def test_deletions_are_what_the_earlier_texts_declared_and_no_file_declares_now():
    before = ('resource "terraform_data" "gone" {\n}\n\nresource "terraform_data" "moved_away" {\n}\n\n'
              'data "terraform_remote_state" "old" {\n  backend = "local"\n}\n\nmodule "m" {\n  source = "./m"\n}\n\n'
              'output "gone" {\n  value = 1\n}\n\noutput "kept" {\n  value = 2\n}\n')
    now = {"a.tf": 'output "kept" {\n  value = 2\n}\n', "b.tf": 'resource "terraform_data" "moved_away" {\n}\n',
           "c.tf.json": json.dumps({"module": {"m": {"source": "./m"}}})}
    assert deletions({"a.tf@HEAD": before}, now) == Deletions(
        ("data.terraform_remote_state.old.*", "terraform_data.gone.*"), ("gone",))
    assert deletions({}, now) == Deletions()


@pytest.mark.parametrize("label", ['resource "terraform_data" "1web"', 'module "super#module"', 'module ""',
                                   'data "x" "my state"'])
def test_labels_terraform_rejects_are_diagnostics(label):
    fp = compute_footprint({**FILES, "bad.tf": label + " {\n}\n"}, ["dns.tf"])
    assert [d.construct for d in fp.diagnostics if d.action == "fail"] == ["invalid_label"]


@pytest.mark.parametrize("name, text", [
    ("bom", '\ufeffresource "terraform_data" "a" {\n  input = terraform_data.dns.id\n}\n'),
    ("quoted-provider", 'provider "aws" {\n  alias = "east"\n}\nresource "aws_s3_bucket" "a" {\n'
                        '  provider = "aws.east"\n}\n'),
    ("moved-to-keyed-self", 'resource "terraform_data" "a" {\n  for_each = toset(["x"])\n}\n'
                            'moved {\n  from = terraform_data.a\n  to   = terraform_data.a["x"]\n}\n'),
    ("traversal-on-next-line", 'resource "terraform_data" "a" {\n  input = (\n    terraform_data.dns\n'
                               '      .id\n  )\n}\n'),
    ("newline-before-arrow", 'resource "terraform_data" "a" {\n  input = { for k, v in local.sizes : k\n'
                             '    => v }\n}\n'),
])
def test_constructs_terraform_accepts_are_not_refused(name, text):
    fp = compute_footprint({**FILES, "a.tf": text}, ["a.tf"])
    assert not fp.fails_closed, fp.diagnostics


def test_the_grammar_workaround_keeps_the_references_and_the_lines():
    text = 'resource "terraform_data" "a" {\n  input = (\n    terraform_data.dns\n      .id\n  )\n}\n'
    fp = compute_footprint({**FILES, "a.tf": text}, ["a.tf"])
    assert "terraform_data.dns.*" in fp.read_globs
    assert cut_blocks({**FILES, "a.tf": text}, fp)["a.tf"] == text


def test_spellings_and_matches_allow_spaces_around_dots():
    assert spellings("output.x") == () and spellings("local.a")
    hits = list(ReferenceMatcher(["local.a", "aws_vpc.main"]).hits("x = local . a\ny = resource.aws_vpc.main.id"))
    assert {h.address for h in hits} == {"local.a", "aws_vpc.main"}
    assert not list(ReferenceMatcher(["local.a"]).hits("local.ab + xlocal.a"))


def test_changed_variables_compares_values_and_fails_on_unreadable_files():
    assert changed_variables('a = 1\nb = "x"\n', 'a = 1\nb = "y"\nc = 2\n', "terraform.tfvars") == ("var.b", "var.c")
    assert changed_variables(None, '{"a": 1}', "x.auto.tfvars.json") == ("var.a",)
    assert changed_variables("a = = 1", "a = 1", "terraform.tfvars") is None


def test_file_readers_with_literal_paths_are_found_and_computed_paths_give_none():
    from analyzer.scoping import file_readers

    files = {"web.tf": 'resource "a" "b" {\n  x = file("${path.module}/templates/index.html")\n'
                       '  y = templatefile("policy.json", {})\n}\n',
             "other.tf": 'locals {\n  p = filebase64("templates/index.html")\n}\n'}
    assert file_readers(files) == {"policy.json": ("web.tf",), "templates/index.html": ("other.tf", "web.tf")}
    assert file_readers({**files, "x.tf": 'locals {\n  q = file(var.path)\n}\n'}) is None
    assert file_readers({"x.tf": 'locals {\n  q = file("${var.dir}/a")\n}\n'}) is None
