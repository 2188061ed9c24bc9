"""Plan JSON to write and read sets, checked on plans real Terraform wrote and on small hand-made plans."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.addresses import parse_instance_address
from analyzer.globs import matches, parse_glob
from analyzer.plan import AddressChange, PlanAnalysis, PlanFormatError, analyze_plan
from analyzer.rewrites import rewritten_rows
from analyzer.state import ParsedState, parse_state

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "plans"
PLANS = ("plan1", "plan2", "refs", "xmod")
PLAN_FILES = {"plan1": "plan1.json", "plan2": "plan2.json", "refs": "refs.plan.json", "xmod": "xmod.plan.json"}


def _load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / PLAN_FILES[name]).read_text(encoding="utf-8"))
    return doc


def _state(name: str) -> ParsedState:
    parsed = parse_state((FIXTURES / name).read_bytes())
    assert isinstance(parsed, ParsedState)
    return parsed


def _state_edges(parsed: ParsedState) -> list[tuple[str, str]]:
    return [(row.address, dependency) for row in parsed.instances for dependency in row.dependencies]


def _as_json(analysis: PlanAnalysis) -> str:
    doc = {
        "terraform_version": analysis.terraform_version,
        "changes": [{**dataclasses.asdict(c), "summary": c.summary} for c in analysis.changes],
        "write_set": sorted(analysis.write_set),
        "read_set": sorted(analysis.read_set),
        "write_globs": list(analysis.write_globs),
        "read_globs": list(analysis.read_globs),
        "config_refs": {node: sorted(refs) for node, refs in analysis.config_refs.items()},
        "warnings": list(analysis.warnings),
        "output_changes": {name: list(actions) for name, actions in analysis.output_changes.items()},
        "has_changes": analysis.has_changes,
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _check_coverage(analysis: PlanAnalysis) -> None:
    write_globs = [parse_glob(text) for text in analysis.write_globs]
    assert all(g.is_exact for g in write_globs)
    assert {str(g.address) for g in write_globs} == analysis.write_set
    read_globs = [parse_glob(text) for text in analysis.read_globs]
    for address in analysis.read_set:
        assert any(matches(g, address) for g in read_globs), f"{address} is not covered by {analysis.read_globs}"
    assert not analysis.read_set & analysis.write_set


# --- hand-made plans ----------------------------------------------------------------------------------------


def _resource(address: str, *references: str, **fields: Any) -> dict[str, Any]:
    """A configuration resource (module-relative address) whose ``input`` holds ``references``."""
    parsed = parse_instance_address(address)
    entry: dict[str, Any] = {"address": address, "mode": parsed.mode, "type": parsed.type, "name": parsed.name}
    entry["expressions"] = {"input": {"references": list(references)}} if references else {}
    entry.update(fields)
    return entry


def _change(address: str, *actions: str, **fields: Any) -> dict[str, Any]:
    parsed = parse_instance_address(address)
    entry: dict[str, Any] = {"address": address, "mode": parsed.mode, "type": parsed.type, "name": parsed.name}
    if parsed.module:
        entry["module_address"] = parsed.module_path
    if parsed.key is not None:
        entry["index"] = parsed.key
    entry["change"] = {"actions": list(actions or ("no-op",)), "before": None, "after": None}
    entry.update(fields)
    return entry


def _module(*resources: dict[str, Any], outputs: Mapping[str, list[str]] | None = None,
            arguments: Mapping[str, list[str]] | None = None, **call: Any) -> dict[str, Any]:
    """A module call with its child configuration; ``outputs`` and ``arguments`` map names to references."""
    body = {
        "resources": list(resources),
        "outputs": {name: {"expression": {"references": refs}} for name, refs in (outputs or {}).items()},
        "variables": {name: {} for name in arguments or {}},
        "module_calls": call.pop("module_calls", {}),
    }
    expressions = {name: {"references": refs} for name, refs in (arguments or {}).items()}
    return {"source": "./mod", "expressions": expressions, "module": body, **call}


def _plan(*changes: dict[str, Any], resources: tuple[dict[str, Any], ...] = (),
          module_calls: Mapping[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {
        "format_version": "1.2",
        "terraform_version": "1.15.5",
        "planned_values": {"root_module": {}},
        "resource_changes": list(changes),
        "configuration": {"root_module": {"resources": list(resources), "module_calls": dict(module_calls or {})}},
        **top,
    }


def _analyze(plan: dict[str, Any], **kwargs: Any) -> PlanAnalysis:
    analysis = analyze_plan(plan, **kwargs)
    _check_coverage(analysis)
    return analysis


# --- real plans ----------------------------------------------------------------------------------------------


def test_plan1_writes_every_instance_it_creates() -> None:
    analysis = _analyze(_load("plan1"))
    assert {c.summary for c in analysis.changes} == {"create"}
    assert analysis.write_set == {c.address for c in analysis.changes}
    assert len(analysis.write_set) == 9
    assert analysis.write_globs == tuple(sorted(analysis.write_set))
    assert analysis.has_changes


def test_plan1_reads_the_data_source_its_resources_reference() -> None:
    analysis = _analyze(_load("plan1"))
    # Read at plan time, the data source is in prior_state only, never in resource_changes.
    assert analysis.read_set == {"data.terraform_remote_state.other"}
    assert "data.terraform_remote_state.other" in analysis.config_refs["terraform_data.after"]


def test_plan1_widens_to_everything_because_a_resource_reads_a_root_local() -> None:
    analysis = _analyze(_load("plan1"))
    assert analysis.read_globs == ("*",)
    assert analysis.warnings == (
        "terraform_data.web references local.prefix in the root module, and plan JSON leaves out what locals "
        "refer to: read set widened to *",
    )


@pytest.mark.parametrize(
    ("address", "summary", "reason"),
    [
        ("terraform_data.cbd", "replace", "replace_because_cannot_update"),
        ("terraform_data.final", "replace", "replace_because_cannot_update"),
        ('terraform_data.item["a"]', "update", ""),
        ('terraform_data.item["b"]', "delete", "delete_because_each_key"),
        ("terraform_data.web[0]", "update", ""),
        ("terraform_data.web[1]", "delete", "delete_because_count_index"),
        ("module.child.terraform_data.inner[0]", "replace", "replace_by_request"),
        ('module.each["a"].terraform_data.inner[0]', "no-op", ""),
        ('module.each["b"].terraform_data.inner[0]', "delete", "delete_because_no_module"),
    ],
)
def test_plan2_summarises_each_change(address: str, summary: str, reason: str) -> None:
    analysis = _analyze(_load("plan2"))
    changes = {c.address: c for c in analysis.changes}
    assert (changes[address].summary, changes[address].action_reason) == (summary, reason)
    assert (address in analysis.write_set) == (summary != "no-op")


def test_plan2_keeps_the_create_before_destroy_order_of_actions() -> None:
    changes = {c.address: c for c in _analyze(_load("plan2")).changes}
    assert changes["terraform_data.cbd"].actions == ("create", "delete")
    assert changes["terraform_data.final"].actions == ("delete", "create")


def test_plan2_writes_both_the_moved_from_and_the_moved_to_address() -> None:
    analysis = _analyze(_load("plan2"))
    final = next(c for c in analysis.changes if c.address == "terraform_data.final")
    assert final.previous_address == "terraform_data.after"
    assert {"terraform_data.after", "terraform_data.final"} <= analysis.write_set
    assert {"terraform_data.after", "terraform_data.final"} <= set(analysis.write_globs)


def test_plan2_reads_the_untouched_module_instance_and_the_data_source() -> None:
    analysis = _analyze(_load("plan2"))
    assert analysis.read_set == {'module.each["a"].terraform_data.inner[0]', "data.terraform_remote_state.other"}


def test_plan2_address_changes_carry_module_and_index() -> None:
    changes = {c.address: c for c in _analyze(_load("plan2")).changes}
    assert changes['module.each["b"].terraform_data.inner[0]'] == AddressChange(
        address='module.each["b"].terraform_data.inner[0]',
        module_address='module.each["b"]',
        mode="managed",
        type="terraform_data",
        name="inner",
        index=0,
        deposed="",
        actions=("delete",),
        action_reason="delete_because_no_module",
        previous_address="",
    )
    assert changes['terraform_data.item["a"]'].index == "a"
    assert changes["terraform_data.cbd"].module_address == ""


def test_plan2_output_changes_carry_actions_only() -> None:
    analysis = _analyze(_load("plan2"))
    assert dict(analysis.output_changes) == {
        "child_result": ("no-op",),
        "secret_echo": ("no-op",),
        "web_ids": ("update",),
    }


def test_config_refs_resolve_module_outputs_depends_on_and_keyed_references() -> None:
    refs = _analyze(_load("plan2")).config_refs
    assert refs["terraform_data.final"] == {
        "data.terraform_remote_state.other",
        "module.child.terraform_data.inner",  # depends_on = [module.child]
        "terraform_data.item",
        "terraform_data.web",
    }
    # module.child's input label is terraform_data.web[0].id; module.each's are each.key and a constant.
    assert refs["module.child.terraform_data.inner"] == {"terraform_data.web"}
    assert refs["module.each.terraform_data.inner"] == frozenset()


def test_every_reference_form_of_the_refs_plan_resolves_to_the_one_resource() -> None:
    analysis = _analyze(_load("refs"))
    assert dict(analysis.config_refs) == {
        "terraform_data.base": frozenset(),
        "terraform_data.t": {"terraform_data.base"},  # splats, legacy .*/.0, dynamic index, for-expressions, ...
    }
    assert len(analysis.warnings) == 1 and "local.names" in analysis.warnings[0]


def test_xmod_reads_the_vpc_behind_another_modules_output() -> None:
    analysis = _analyze(_load("xmod"))
    assert analysis.write_set == {"module.app.terraform_data.server"}
    assert "module.net.terraform_data.vpc" in analysis.read_set
    assert analysis.config_refs["module.app.terraform_data.server"] == {"module.net.terraform_data.vpc"}


def test_xmod_reads_the_resource_that_depends_on_the_written_one_through_an_output() -> None:
    analysis = _analyze(_load("xmod"))
    assert analysis.config_refs["terraform_data.audit"] == {"module.app.terraform_data.server"}
    assert "terraform_data.audit" in analysis.read_set


def test_xmod_widens_only_the_module_whose_local_the_written_resource_reads() -> None:
    analysis = _analyze(_load("xmod"))
    assert analysis.read_set == {
        "module.app.terraform_data.sidecar",
        "module.net.terraform_data.vpc",
        "terraform_data.audit",
    }
    assert analysis.read_globs == ("module.app.*", "module.net.terraform_data.vpc.*", "terraform_data.audit.*")
    assert analysis.warnings == (
        "module.app.terraform_data.server references local.name in module.app, and plan JSON leaves out what "
        "locals refer to: read set widened to module.app.*",
    )


def test_replace_triggered_by_is_missing_from_the_configuration_but_recorded_in_state() -> None:
    plan = _load("xmod")
    assert "replace_triggered_by" not in json.dumps(plan["configuration"])
    assert "terraform_data.rotation" not in _analyze(plan).config_refs["terraform_data.consumer"]
    consumer = next(r for r in _state("xmod.tfstate").instances if r.address == "terraform_data.consumer")
    assert "terraform_data.rotation" in consumer.dependencies


def test_a_replace_triggered_by_edge_is_followed_from_prior_state_or_from_state_edges() -> None:
    plan = _load("xmod")
    rotation = next(c for c in plan["resource_changes"] if c["address"] == "terraform_data.rotation")
    rotation["change"]["actions"] = ["update"]
    assert "terraform_data.consumer" in _analyze(plan).read_set

    without_prior_state = {key: value for key, value in plan.items() if key != "prior_state"}
    assert "terraform_data.consumer" not in _analyze(without_prior_state).read_set
    edges = _state_edges(_state("xmod.tfstate"))
    assert "terraform_data.consumer" in _analyze(without_prior_state, state_edges=edges).read_set


def test_state1_dependencies_give_plan2_the_same_read_set_as_its_prior_state() -> None:
    plan = _load("plan2")
    state1 = _state("state1.tfstate")
    without_prior_state = {key: value for key, value in plan.items() if key != "prior_state"}
    from_state = _analyze(
        without_prior_state,
        state_edges=_state_edges(state1),
        state_addresses=[row.address for row in state1.instances],
    )
    assert from_state.read_set == _analyze(plan).read_set
    assert from_state.write_set == _analyze(plan).write_set


@pytest.mark.parametrize("name", PLANS)
def test_analysis_matches_the_golden_file(name: str, request: pytest.FixtureRequest) -> None:
    actual = _as_json(_analyze(_load(name)))
    path = FIXTURES / f"{name}.analysis.json"
    if request.config.getoption("--update-golden"):
        path.write_text(actual, encoding="utf-8")
    assert actual == path.read_text(encoding="utf-8"), f"{path.name} differs: review, then pytest --update-golden"


@pytest.mark.parametrize("name", ("plan1", "plan2", "xmod"))
def test_the_analysis_never_carries_attribute_values(name: str) -> None:
    plan = _load(name)
    assert "s3cr3t" in json.dumps(plan)  # the fixture does hold the secret, in plain text
    analysis = _analyze(plan)
    assert "s3cr3t" not in _as_json(analysis)
    assert "s3cr3t" not in repr(analysis)


def test_the_analysis_is_immutable() -> None:
    analysis = _analyze(_load("plan2"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        analysis.read_globs = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        analysis.config_refs["x"] = frozenset()  # type: ignore[index]
    assert not hasattr(analysis, "__dict__")


# --- write set ------------------------------------------------------------------------------------------------


def test_a_deposed_object_is_written_under_its_address() -> None:
    plan = _plan(
        _change("aws_instance.a", "no-op"),
        _change("aws_instance.a", "delete", deposed="0000abcd"),
        resources=(_resource("aws_instance.a"),),
    )
    analysis = _analyze(plan)
    deposed = analysis.changes[1]
    assert (deposed.deposed, deposed.summary) == ("0000abcd", "delete")
    assert analysis.write_set == {"aws_instance.a"}
    assert analysis.write_globs == ("aws_instance.a",)


def test_a_forgotten_resource_is_written() -> None:
    analysis = _analyze(_plan(_change("aws_instance.a", "forget"), resources=()))
    assert analysis.changes[0].summary == "forget"
    assert analysis.write_set == {"aws_instance.a"}


def test_a_move_without_other_changes_writes_both_addresses() -> None:
    plan = _plan(_change("aws_instance.new", previous_address="aws_instance.old"),
                 resources=(_resource("aws_instance.new"),))
    analysis = _analyze(plan)
    assert analysis.changes[0].summary == "move"
    assert analysis.write_set == {"aws_instance.new", "aws_instance.old"}


def test_an_import_without_other_changes_is_a_write() -> None:
    change = _change("aws_instance.a")
    change["change"]["importing"] = {"id": "i-123"}
    analysis = _analyze(_plan(change, resources=(_resource("aws_instance.a"),)))
    assert analysis.changes[0].summary == "import"
    assert analysis.write_set == {"aws_instance.a"}


def test_a_data_source_read_during_apply_is_read_not_written() -> None:
    plan = _plan(
        _change("data.aws_ami.x", "read", action_reason="read_because_config_unknown"),
        _change("aws_instance.a", "update"),
        resources=(_resource("data.aws_ami.x"), _resource("aws_instance.a", "data.aws_ami.x.id", "data.aws_ami.x")),
    )
    analysis = _analyze(plan)
    assert analysis.changes[0].summary == "read"
    assert analysis.write_set == {"aws_instance.a"}
    assert analysis.read_set == {"data.aws_ami.x"}


def test_an_unknown_action_is_treated_as_a_write_with_a_warning() -> None:
    analysis = _analyze(_plan(_change("aws_instance.a", "teleport"), resources=(_resource("aws_instance.a"),)))
    assert analysis.changes[0].summary == "teleport"
    assert analysis.write_set == {"aws_instance.a"}
    assert analysis.warnings == ("aws_instance.a: unknown action teleport is treated as a write",)


def test_a_plan_of_no_ops_has_no_changes_and_reserves_nothing() -> None:
    analysis = _analyze(_plan(_change("aws_instance.a"), resources=(_resource("aws_instance.a"),)))
    assert not analysis.has_changes
    assert not (analysis.write_set or analysis.read_set or analysis.write_globs or analysis.read_globs)


def test_an_output_change_alone_is_a_change() -> None:
    plan = _plan(output_changes={"o": {"actions": ["update"], "before": 1, "after": 2}})
    assert _analyze(plan).has_changes


def test_a_plan_without_resource_changes_is_accepted_as_empty() -> None:
    plan = _plan()
    del plan["resource_changes"]
    analysis = _analyze(plan)
    assert analysis.changes == () and not analysis.has_changes


# --- read set: the closure ------------------------------------------------------------------------------------


def _chain() -> dict[str, Any]:
    # a -> b -> c (a references b, b references c); d references c too; only b changes.
    return _plan(
        _change("aws_instance.a"),
        _change("aws_instance.b", "update"),
        _change("aws_instance.c"),
        _change("aws_instance.d"),
        resources=(
            _resource("aws_instance.a", "aws_instance.b.id", "aws_instance.b"),
            _resource("aws_instance.b", "aws_instance.c.id", "aws_instance.c"),
            _resource("aws_instance.c"),
            _resource("aws_instance.d", "aws_instance.c.id", "aws_instance.c"),
        ),
    )


def test_a_chain_reads_both_the_dependency_and_the_dependent_of_the_changed_resource() -> None:
    analysis = _analyze(_chain())
    assert analysis.write_set == {"aws_instance.b"}
    assert analysis.read_set == {"aws_instance.a", "aws_instance.c"}
    assert analysis.read_globs == ("aws_instance.a.*", "aws_instance.c.*")
    assert analysis.warnings == ()


def test_a_resource_that_only_shares_a_dependency_is_not_read() -> None:
    # d reads c as b does, but neither reads the other: d's values cannot change with b.
    assert "aws_instance.d" not in _analyze(_chain()).read_set


def test_the_closure_is_transitive_in_both_directions() -> None:
    plan = _plan(
        _change("aws_instance.top"),
        _change("aws_instance.a"),
        _change("aws_instance.b", "update"),
        _change("aws_instance.c"),
        _change("aws_instance.root"),
        resources=(
            _resource("aws_instance.top", "aws_instance.a"),
            _resource("aws_instance.a", "aws_instance.b"),
            _resource("aws_instance.b", "aws_instance.c"),
            _resource("aws_instance.c", "aws_instance.root"),
            _resource("aws_instance.root"),
        ),
    )
    assert _analyze(plan).read_set == {"aws_instance.top", "aws_instance.a", "aws_instance.c", "aws_instance.root"}


def test_a_module_output_reference_reads_the_resource_behind_the_output() -> None:
    plan = _plan(
        _change("aws_instance.app", "update"),
        _change("module.net.aws_vpc.main"),
        _change("module.net.aws_subnet.other"),
        resources=(_resource("aws_instance.app", "module.net.vpc_id", "module.net"),),
        module_calls={
            "net": _module(
                _resource("aws_vpc.main"),
                _resource("aws_subnet.other"),
                outputs={"vpc_id": ["aws_vpc.main.id", "aws_vpc.main"]},
            )
        },
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"module.net.aws_vpc.main"}
    assert analysis.read_globs == ("module.net.aws_vpc.main.*",)
    assert analysis.warnings == ()  # the trailing "module.net" is derived from the output reference


def test_an_output_of_a_keyed_module_instance_reads_the_resource_in_every_instance() -> None:
    plan = _plan(
        _change("aws_instance.app", "update"),
        _change('module.net["a"].aws_vpc.main'),
        _change('module.net["b"].aws_vpc.main'),
        resources=(_resource("aws_instance.app", 'module.net["a"].vpc_id', 'module.net["a"]'),),
        module_calls={"net": _module(_resource("aws_vpc.main"), outputs={"vpc_id": ["aws_vpc.main"]})},
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {'module.net["a"].aws_vpc.main', 'module.net["b"].aws_vpc.main'}
    assert analysis.read_globs == ("module.net.aws_vpc.main.*",)


def test_a_variable_is_followed_through_nested_module_calls() -> None:
    plan = _plan(
        _change("aws_vpc.main"),
        _change("module.outer.module.inner.aws_instance.x", "update"),
        resources=(_resource("aws_vpc.main"),),
        module_calls={
            "outer": _module(
                arguments={"vpc": ["aws_vpc.main.id", "aws_vpc.main"]},
                module_calls={"inner": _module(_resource("aws_instance.x", "var.id"), arguments={"id": ["var.vpc"]})},
            )
        },
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"aws_vpc.main"}
    assert analysis.config_refs["module.outer.module.inner.aws_instance.x"] == {"aws_vpc.main"}


def test_a_changed_resource_makes_the_resources_reading_it_through_a_module_input_read() -> None:
    plan = _plan(
        _change("aws_vpc.main", "update"),
        _change("module.app.aws_instance.x"),
        resources=(_resource("aws_vpc.main"),),
        module_calls={"app": _module(_resource("aws_instance.x", "var.vpc"), arguments={"vpc": ["aws_vpc.main"]})},
    )
    assert _analyze(plan).read_set == {"module.app.aws_instance.x"}


def test_depends_on_a_resource_and_on_a_module_are_followed() -> None:
    plan = _plan(
        _change("aws_instance.a", "update"),
        _change("aws_iam_role.r"),
        _change("module.m.aws_s3_bucket.b"),
        _change("module.m.module.n.aws_s3_bucket.deep"),
        resources=(_resource("aws_instance.a", depends_on=["aws_iam_role.r", "module.m"]), _resource("aws_iam_role.r")),
        module_calls={
            "m": _module(_resource("aws_s3_bucket.b"), module_calls={"n": _module(_resource("aws_s3_bucket.deep"))})
        },
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"aws_iam_role.r", "module.m.aws_s3_bucket.b", "module.m.module.n.aws_s3_bucket.deep"}
    assert analysis.read_globs == ("aws_iam_role.r.*", "module.m.*")
    assert analysis.warnings == ()  # depends_on a module means all of it: exact, not a widening


def test_a_referenced_data_source_is_read() -> None:
    plan = _plan(
        _change("aws_instance.a", "create"),
        resources=(_resource("data.aws_ami.u"), _resource("aws_instance.a", "data.aws_ami.u.id", "data.aws_ami.u")),
        prior_state={"values": {"root_module": {"resources": [{"address": "data.aws_ami.u", "mode": "data"}]}}},
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"data.aws_ami.u"}
    assert analysis.read_globs == ("data.aws_ami.u.*",)


def test_a_splat_reads_every_instance_of_the_resource() -> None:
    # aws_instance.web[*].id is listed by Terraform as just "aws_instance.web".
    plan = _plan(
        _change("aws_lb.front", "update"),
        *(_change(f"aws_instance.web[{i}]") for i in range(3)),
        resources=(_resource("aws_lb.front", "aws_instance.web"), _resource("aws_instance.web", count_expression={
            "constant_value": 3})),
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"aws_instance.web[0]", "aws_instance.web[1]", "aws_instance.web[2]"}
    assert analysis.read_globs == ("aws_instance.web.*",)


def test_a_reference_to_one_instance_reserves_the_whole_resource() -> None:
    plan = _plan(
        _change("aws_lb.front", "update"),
        _change('aws_instance.web["a"]'),
        _change('aws_instance.web["b"]'),
        resources=(_resource("aws_lb.front", 'aws_instance.web["a"].id', 'aws_instance.web["a"]', "aws_instance.web"),),
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {'aws_instance.web["a"]', 'aws_instance.web["b"]'}
    assert analysis.read_globs == ("aws_instance.web.*",)


def test_a_sibling_instance_of_a_written_instance_is_not_read_on_its_own() -> None:
    plan = _plan(_change("aws_instance.web[0]", "update"), _change("aws_instance.web[1]"),
                 resources=(_resource("aws_instance.web"),))
    analysis = _analyze(plan)
    assert analysis.read_set == frozenset()
    assert analysis.read_globs == ()


def test_count_and_for_each_expressions_are_dependencies() -> None:
    plan = _plan(
        _change("aws_instance.a[0]", "create"),
        _change('aws_instance.b["k"]', "create"),
        _change("aws_ssm_parameter.n"),
        _change("aws_ssm_parameter.keys"),
        resources=(
            _resource("aws_instance.a", count_expression={"references": ["aws_ssm_parameter.n.value",
                                                                         "aws_ssm_parameter.n"]}),
            _resource("aws_instance.b", for_each_expression={"references": ["aws_ssm_parameter.keys"]}),
        ),
    )
    assert _analyze(plan).read_set == {"aws_ssm_parameter.n", "aws_ssm_parameter.keys"}


def test_a_module_calls_for_each_and_depends_on_are_dependencies_of_everything_inside() -> None:
    plan = _plan(
        _change('module.m["a"].aws_instance.x', "update"),
        _change("aws_ssm_parameter.keys"),
        _change("aws_iam_role.r"),
        module_calls={"m": _module(_resource("aws_instance.x"), for_each_expression={
            "references": ["aws_ssm_parameter.keys"]}, depends_on=["aws_iam_role.r"])},
    )
    assert _analyze(plan).read_set == {"aws_ssm_parameter.keys", "aws_iam_role.r"}


def test_references_in_nested_blocks_and_provisioners_are_followed() -> None:
    resource = _resource("aws_instance.a")
    resource["expressions"] = {"ebs": [{"kms_key": {"references": ["aws_kms_key.k.arn", "aws_kms_key.k"]}}]}
    resource["provisioners"] = [{"type": "local-exec", "expressions": {"command": {"references": ["aws_eip.ip"]}}}]
    plan = _plan(_change("aws_instance.a", "create"), _change("aws_kms_key.k"), _change("aws_eip.ip"),
                 resources=(resource,))
    assert _analyze(plan).read_set == {"aws_kms_key.k", "aws_eip.ip"}


def test_state_edges_add_an_edge_the_configuration_lacks() -> None:
    plan = _chain()
    assert "aws_instance.x" not in _analyze(plan).read_set
    edges = [("aws_instance.b", "aws_instance.x"), ("aws_instance.y[0]", "aws_instance.b")]
    analysis = _analyze(plan, state_edges=edges)
    # x has no instance the plan or the caller knows of, so only its glob is reserved.
    assert analysis.read_set == {"aws_instance.a", "aws_instance.c", "aws_instance.y[0]"}
    assert analysis.read_globs == ("aws_instance.a.*", "aws_instance.c.*", "aws_instance.x.*", "aws_instance.y.*")


def test_a_state_edge_to_a_resource_expands_to_every_known_instance_of_it() -> None:
    edges = [("aws_instance.b", "aws_instance.x")]
    addresses = ['aws_instance.x["one"]', 'aws_instance.x["two"]', "aws_instance.unrelated"]
    analysis = _analyze(_chain(), state_edges=edges, state_addresses=addresses)
    assert {'aws_instance.x["one"]', 'aws_instance.x["two"]'} <= analysis.read_set
    assert "aws_instance.unrelated" not in analysis.read_set


def test_prior_state_depends_on_is_followed_for_a_deleted_resource_without_configuration() -> None:
    plan = _plan(
        _change("aws_instance.gone", "delete", action_reason="delete_because_no_resource_config"),
        _change("aws_iam_role.r"),
        resources=(_resource("aws_iam_role.r"),),
        prior_state={"values": {"root_module": {"resources": [
            {"address": "aws_instance.gone", "depends_on": ["aws_iam_role.r"]},
            {"address": "aws_iam_role.r"},
        ]}}},
    )
    assert _analyze(plan).read_set == {"aws_iam_role.r"}


# --- widenings: every warning -----------------------------------------------------------------------------------


def test_a_root_local_widens_the_read_set_to_everything() -> None:
    plan = _plan(_change("aws_instance.a", "update"), _change("aws_instance.other"),
                 resources=(_resource("aws_instance.a", "local.name"), _resource("aws_instance.other")))
    analysis = _analyze(plan)
    assert analysis.read_globs == ("*",)
    assert analysis.read_set == {"aws_instance.other"}
    assert analysis.warnings == (
        "aws_instance.a references local.name in the root module, and plan JSON leaves out what locals refer to: "
        "read set widened to *",
    )


def test_a_module_local_widens_to_the_module_and_what_flows_into_it() -> None:
    plan = _plan(
        _change("module.app.aws_instance.x", "update"),
        _change("module.app.aws_instance.y"),
        _change("aws_vpc.main"),
        _change("aws_vpc.unrelated"),
        resources=(_resource("aws_vpc.main"), _resource("aws_vpc.unrelated")),
        module_calls={"app": _module(_resource("aws_instance.x", "local.l"), _resource("aws_instance.y"),
                                     arguments={"vpc": ["aws_vpc.main.id", "aws_vpc.main"]})},
    )
    analysis = _analyze(plan)
    # local.l may hold var.vpc, so what the module's inputs read is read too.
    assert analysis.read_set == {"module.app.aws_instance.y", "aws_vpc.main"}
    assert analysis.read_globs == ("aws_vpc.main.*", "module.app.*")
    assert analysis.warnings == (
        "module.app.aws_instance.x references local.l in module.app, and plan JSON leaves out what locals refer to: "
        "read set widened to module.app.*",
    )


def test_a_module_argument_that_reads_a_parent_local_widens_the_parent() -> None:
    plan = _plan(
        _change("module.app.aws_instance.x", "update"),
        _change("aws_vpc.main"),
        resources=(_resource("aws_vpc.main"),),
        module_calls={"app": _module(_resource("aws_instance.x", "var.tag"), arguments={"tag": ["local.tag"]})},
    )
    analysis = _analyze(plan)
    assert analysis.read_globs == ("*",)
    assert analysis.warnings == (
        "argument tag of module call module.app references local.tag in the root module, and plan JSON leaves out "
        "what locals refer to: read set widened to *",
    )


def test_a_resource_reading_a_local_is_read_when_something_it_might_depend_on_is_written() -> None:
    plan = _plan(
        _change("aws_vpc.main", "update"),
        _change("aws_instance.x"),
        resources=(_resource("aws_vpc.main"), _resource("aws_instance.x", "local.whatever")),
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"aws_instance.x"}
    assert analysis.warnings == (
        "aws_instance.x references local.whatever in the root module, and plan JSON leaves out what locals refer "
        "to: aws_instance.x is read in case that value comes from a written resource",
    )


def test_a_reference_to_a_whole_module_widens_to_the_module() -> None:
    plan = _plan(
        _change("aws_instance.a", "update"),
        _change("module.m.aws_s3_bucket.b"),
        resources=(_resource("aws_instance.a", "module.m"),),
        module_calls={"m": _module(_resource("aws_s3_bucket.b"), outputs={"all": ["aws_s3_bucket.b"]})},
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"module.m.aws_s3_bucket.b"}
    assert analysis.read_globs == ("module.m.*",)
    assert analysis.warnings == ("aws_instance.a references the whole module module.m: read set widened to module.m.*",)


def test_a_reference_to_a_missing_output_widens_to_the_module() -> None:
    plan = _plan(
        _change("aws_instance.a", "update"),
        resources=(_resource("aws_instance.a", "module.m.nope", "module.m"),),
        module_calls={"m": _module(_resource("aws_s3_bucket.b"))},
    )
    analysis = _analyze(plan)
    assert analysis.read_globs == ("module.m.*",)
    assert analysis.warnings == (
        "aws_instance.a references module.m.nope, which is not an output of module.m in the plan: "
        "read set widened to module.m.*",
    )


def test_a_module_whose_configuration_is_missing_is_widened_as_a_whole() -> None:
    plan = _plan(
        _change("aws_instance.a", "update"),
        _change("module.m.aws_s3_bucket.b", "update"),
        _change("module.m.aws_s3_bucket.c"),
        resources=(_resource("aws_instance.a", "module.m.out", "module.m"),),
        module_calls={"m": {"source": "./m"}},
    )
    analysis = _analyze(plan)
    assert analysis.read_set == {"module.m.aws_s3_bucket.c"}
    # aws_instance.a is reached back from module.m's written bucket, so its own glob is reserved too.
    assert analysis.read_globs == ("aws_instance.a.*", "module.m.*")
    assert analysis.warnings == (
        "aws_instance.a references module.m.out, but the plan has no configuration for module.m: "
        "read set widened to module.m.*",
        "module.m.aws_s3_bucket.b lies in module.m, whose configuration the plan does not include: "
        "read set widened to module.m.*",
        "module.m.aws_s3_bucket.c lies in module.m, whose configuration the plan does not include: "
        "module.m.aws_s3_bucket.c is read in case that value comes from a written resource",
        # c is read, and what c reads is unknown too: the same widening, for a second reason.
        "module.m.aws_s3_bucket.c lies in module.m, whose configuration the plan does not include: "
        "read set widened to module.m.*",
    )


def test_a_reference_plan_json_does_not_describe_widens_to_its_module() -> None:
    plan = _plan(
        _change("module.m.aws_instance.a", "update"),
        _change("module.m.aws_instance.b"),
        module_calls={"m": _module(_resource("aws_instance.a", "ephemeral.vault_secret.s.data",
                                             "ephemeral.vault_secret.s"), _resource("aws_instance.b"))},
    )
    analysis = _analyze(plan)
    assert analysis.read_globs == ("module.m.*",)
    assert analysis.warnings == (
        "module.m.aws_instance.a references ephemeral.vault_secret.s.data, which plan JSON does not describe: "
        "read set widened to module.m.*",
    )


def test_a_reference_cycle_is_widened_instead_of_looping() -> None:
    # Terraform rejects such a configuration; the analysis must still terminate and stay conservative.
    plan = _plan(
        _change("aws_instance.a", "update"),
        resources=(_resource("aws_instance.a", "module.m.out", "module.m"),),
        module_calls={"m": _module(outputs={"out": ["var.x"]}, arguments={"x": ["module.m.out", "module.m"]})},
    )
    analysis = _analyze(plan)
    assert analysis.read_globs == ("module.m.*",)
    assert analysis.warnings == ("reference cycle through output out of module.m: read set widened to module.m.*",)


def test_each_count_path_terraform_and_root_variables_are_not_dependencies() -> None:
    plan = _plan(
        _change('aws_instance.a["k"]', "update"),
        _change("aws_instance.other"),
        resources=(_resource("aws_instance.a", "each.key", "each.value", "count.index", "path.module",
                             "terraform.workspace", "var.region", "self"), _resource("aws_instance.other")),
    )
    analysis = _analyze(plan)
    assert (analysis.read_set, analysis.read_globs, analysis.warnings) == (frozenset(), (), ())


# --- rejected input ---------------------------------------------------------------------------------------------


def _without(key: str) -> dict[str, Any]:
    plan = _plan(_change("aws_instance.a", "update"), resources=(_resource("aws_instance.a"),))
    del plan[key]
    return plan


def _with(**changes: Any) -> dict[str, Any]:
    plan = _plan(_change("aws_instance.a", "update"), resources=(_resource("aws_instance.a"),))
    plan.update(changes)
    return plan


def _with_change(**fields: Any) -> dict[str, Any]:
    change = _change("aws_instance.a", "update")
    change.update(fields)
    return _plan(change)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ([], "must be a JSON object, not list"),
        ({}, "no format_version"),
        (_without("format_version"), "no format_version"),
        (_with(format_version="2.0"), "format_version 2.0 is not supported"),
        ({"format_version": "1.0", "terraform_version": "1.15.5", "values": {}}, "of a state, not of a plan"),
        ({"format_version": "1.0"}, "no planned_values or resource_changes"),
        (_with(resource_changes={"a": 1}), "resource_changes must be a list"),
        (_with(resource_changes=["aws_instance.a"]), "resource_changes[0] must be a JSON object"),
        (_with(resource_changes=[{"change": {"actions": ["update"]}}]), "resource_changes[0] has no address"),
        (_with_change(address="aws_instance"), "resource_changes[0] (aws_instance): invalid address"),
        (_with_change(change={"actions": "update"}), "actions must be a non-empty list of strings"),
        (_with_change(change={"actions": []}), "actions must be a non-empty list of strings"),
        (_with_change(change=None), "change must be a JSON object"),
        (_with_change(mode=None), "has no mode"),
        (_with_change(index=True), "index must be a number, a string or absent"),
        (_with_change(previous_address="module.x"), "previous_address: invalid address"),
        (_with(errored=True), "the plan errored and cannot be applied"),
        (_without("configuration"), "no configuration section"),
        (_with(configuration={"root_module": []}), "no configuration section"),
        (_with(output_changes={"o": {"actions": None}}), "output_changes.o.actions must be a non-empty list"),
    ],
)
def test_input_that_is_not_a_plan_is_rejected_saying_what_to_do(plan: Any, message: str) -> None:
    with pytest.raises(PlanFormatError) as caught:
        analyze_plan(plan)
    assert message in str(caught.value)
    if "errored" not in message:
        assert "terraform show -json PLANFILE" in str(caught.value) or "format_version 2.0" in message


@pytest.mark.parametrize("version", ["1.0", "1.2", "1.9"])
def test_every_1x_format_version_is_accepted(version: str) -> None:
    plan = _with(format_version=version)
    assert _analyze(plan).write_set == {"aws_instance.a"}


def test_a_state_edge_that_does_not_parse_is_rejected() -> None:
    with pytest.raises(ValueError, match="invalid address"):
        analyze_plan(_chain(), state_edges=[("aws_instance.b", "not an address")])


# --- properties ---------------------------------------------------------------------------------------------------

_NAMES = ("a", "b", "c", "d")


@st.composite
def _random_plans(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A root module and a module ``m`` (optionally keyed), random references, instances and actions."""
    keyed = draw(st.booleans())
    module_keys = ['["x"]', '["y"]'] if keyed else [""]
    root_refs = [f"aws_instance.{n}" for n in _NAMES] + ["module.m.o", "module.m", "local.l", "var.v"]
    module_refs = [f"aws_instance.{n}" for n in _NAMES] + ["var.v", "local.l", "each.key"]

    def refs(pool: list[str]) -> list[str]:
        return draw(st.lists(st.sampled_from(pool), max_size=3))

    root = [_resource(f"aws_instance.{n}", *refs(root_refs)) for n in _NAMES[:3]]
    inner = [_resource(f"aws_instance.{n}", *refs(module_refs)) for n in _NAMES[:3]]
    call = _module(*inner, outputs={"o": refs(module_refs)}, arguments={"v": refs(root_refs[:4])})
    if keyed:
        call["for_each_expression"] = {"references": refs(root_refs[:4])}
    actions = st.sampled_from([("no-op",), ("update",), ("create",), ("delete",), ("delete", "create"), ("read",)])
    changes = []
    for name in _NAMES:
        for key in draw(st.sampled_from([[""], ["[0]", "[1]"], ['["k"]']])):
            changes.append(_change(f"aws_instance.{name}{key}", *draw(actions)))
            for module_key in module_keys:
                changes.append(_change(f"module.m{module_key}.aws_instance.{name}{key}", *draw(actions)))
    everything = [c["address"] for c in changes]
    edges = draw(st.lists(st.tuples(st.sampled_from(everything), st.sampled_from(everything)), max_size=3))
    return _plan(*changes, resources=tuple(root), module_calls={"m": call}), edges


@settings(max_examples=200, deadline=None)
@given(_random_plans())
def test_read_globs_cover_the_read_set_and_write_globs_are_exactly_the_write_set(
    case: tuple[dict[str, Any], list[tuple[str, str]]],
) -> None:
    plan, edges = case
    analysis = analyze_plan(plan)
    _check_coverage(analysis)
    assert analysis.write_set == {
        address for c in analysis.changes if c.is_write for address in (c.address, c.previous_address) if address
    }


@settings(max_examples=200, deadline=None)
@given(_random_plans())
def test_every_direct_reference_of_a_written_resource_is_reserved(
    case: tuple[dict[str, Any], list[tuple[str, str]]],
) -> None:
    plan, _ = case
    analysis = analyze_plan(plan)
    reserved = analysis.read_set | analysis.write_set
    known = {c.address for c in analysis.changes}
    written_nodes = {_node(a) for a in analysis.write_set}
    for node, targets in analysis.config_refs.items():
        for target in targets:
            if node in written_nodes:  # what a written resource reads
                assert {a for a in known if _node(a) == target} <= reserved
            if target in written_nodes:  # what reads a written resource
                assert {a for a in known if _node(a) == node} <= reserved


@settings(max_examples=200, deadline=None)
@given(_random_plans())
def test_state_edges_only_ever_widen_the_read_set(case: tuple[dict[str, Any], list[tuple[str, str]]]) -> None:
    plan, edges = case
    without = analyze_plan(plan)
    with_edges = analyze_plan(plan, state_edges=edges)
    _check_coverage(with_edges)
    assert without.read_set <= with_edges.read_set | with_edges.write_set
    assert with_edges.write_set == without.write_set


def _node(address: str) -> str:
    """The resource an instance belongs to, with module keys left out, as config_refs names it."""
    parsed = parse_instance_address(address)
    keyless = dataclasses.replace(parsed, module=tuple(dataclasses.replace(s, key=None) for s in parsed.module))
    return keyless.resource_address


@pytest.mark.parametrize("name", PLANS)
def test_read_globs_cover_the_read_set_of_every_real_plan(name: str) -> None:
    _check_coverage(analyze_plan(_load(name)))


def test_analyze_plan_leaves_its_input_unchanged() -> None:
    # Callers may reuse the parsed JSON (to write kl-plan.json, say).
    plan = _chain()
    before = copy.deepcopy(plan)
    analyze_plan(plan, state_edges=[("aws_instance.b", "aws_instance.x")])
    assert plan == before


def test_rows_an_apply_rewrites_without_a_planned_change_are_found():
    def res(mode: str, name: str, attributes: dict, deps: list[str] | None = None) -> dict:  # type: ignore[type-arg]
        inst = {"schema_version": 0, "attributes": attributes, **({"dependencies": deps} if deps else {})}
        return {"mode": mode, "type": "terraform_data" if mode == "managed" else "fakecloud_bucket", "name": name,
                "provider": 'provider["x"]', "instances": [inst]}

    trunk = parse_state(json.dumps({"version": 4, "terraform_version": "1.11.0", "serial": 3, "lineage": "l",
                                    "outputs": {}, "resources": [
        res("managed", "d", {"input": "a"}, ["module.m.terraform_data.x"]),
        res("managed", "e", {"input": "b"}, ["terraform_data.c"]),
        res("data", "same", {"size": 1}), res("data", "stale", {"size": 1}), res("data", "other", {"size": 1}),
    ]}).encode())
    assert isinstance(trunk, ParsedState)
    rows = {r.address: r for r in trunk.instances}

    def prior(address: str, mode: str, values: dict, deps: list[str] = ()) -> dict:  # type: ignore[type-arg, assignment]
        return {"address": address, "mode": mode, "values": values, "depends_on": list(deps)}

    plan = {"prior_state": {"values": {"root_module": {"resources": [
        prior("terraform_data.d", "managed", {"input": "a"}, ["module.m2.terraform_data.x"]),
        prior("terraform_data.e", "managed", {"input": "b"}, ["terraform_data.c"]),
        prior("data.fakecloud_bucket.same", "data", {"size": 1}),
        prior("data.fakecloud_bucket.stale", "data", {"size": 2}),
        prior("data.fakecloud_bucket.other", "data", {"size": 2}),
    ], "child_modules": [{"resources": [prior("data.fakecloud_bucket.new", "data", {"size": 1})]}]}}},
        "resource_changes": [{"address": "data.fakecloud_bucket.later", "mode": "data",
                              "change": {"actions": ["read"]}}]}
    written = {"data.fakecloud_bucket.same", "data.fakecloud_bucket.stale", "data.fakecloud_bucket.new",
               "data.fakecloud_bucket.later"}
    assert rewritten_rows(plan, rows, written.__contains__) == {
        "terraform_data.d", "data.fakecloud_bucket.stale", "data.fakecloud_bucket.new", "data.fakecloud_bucket.later"}
