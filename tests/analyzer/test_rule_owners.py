"""The analyzer's single owners of rules that once had diverging copies."""

from __future__ import annotations

import gc

from analyzer.addresses import declared_address
from analyzer.footprint import Footprint
from analyzer.gcpause import gc_paused
from analyzer.hcl import ParseCache, analyze_file
from analyzer.scoping import declaring_files, deletions, described_in


def test_declared_address_names_every_kind_of_block_header() -> None:
    assert declared_address("resource", ("aws_instance", "web")) == "aws_instance.web"
    assert declared_address("data", ("aws_ami", "x")) == "data.aws_ami.x"
    assert declared_address("ephemeral", ("random_password", "p")) == "ephemeral.random_password.p"
    assert declared_address("action", ("aws_lambda_invoke", "a")) == "action.aws_lambda_invoke.a"
    assert declared_address("variable", ("region",)) == "var.region"
    assert declared_address("locals", ("name",)) == "local.name"
    assert declared_address("provider", ("aws",)) == "provider.aws"
    assert declared_address("provider", ("aws",), "east") == "provider.aws.east"
    assert declared_address("module", ("net",)) == "module.net"
    assert declared_address("output", ("id",)) == "output.id"


def test_a_parsed_block_gets_the_address_its_header_declares() -> None:
    text = 'provider "aws" {\n  alias = "east"\n}\nephemeral "random_password" "p" {\n  length = 8\n}\n'
    blocks = analyze_file("main.tf", text, cache=ParseCache()).blocks
    assert [b.address for b in blocks] == ["provider.aws.east", "ephemeral.random_password.p"]


def test_declaring_files_knows_every_block_with_an_address_and_deletions_only_stateful_ones() -> None:
    text = ('resource "t" "a" {}\ndata "t" "b" {}\nephemeral "t" "c" {}\naction "t" "d" {}\n'
            'module "m" {\n  source = "./m"\n}\n')
    assert declaring_files({"main.tf": text}) == {
        "t.a": "main.tf", "data.t.b": "main.tf", "ephemeral.t.c": "main.tf", "action.t.d": "main.tf",
        "module.m": "main.tf",
    }
    # Data sources leave the state without a planned change (the commit drops their rows); ephemeral resources
    # and actions have no rows.
    assert deletions({"gone.tf": text}, {}).globs == ("data.t.b.*", "module.m.*", "t.a.*")


def test_described_in_reads_module_and_resource_names_from_parsed_globs() -> None:
    fp = Footprint(selected_files=(), write_globs=('module.a["x.y"].t.n.*', 'data.t.n["k.1"]', "*"), read_globs=(),
                   validation_globs=(), blocks=(), module_dirs=(), diagnostics=())
    assert described_in(fp) == ("*", "data.t.n", "module.a.*")


def test_the_collector_is_switched_back_on_only_if_it_was_on() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
