"""Reading drift out of a refresh-only plan (``show -json``): names only, data sources never, gone objects."""

from __future__ import annotations

import pytest

from analyzer.plan_drift import DriftedInstance, DriftFormatError, changed_attributes, drift_in_plan


def _drift(address: str, before, after, actions=("update",), mode="managed", **extra):  # type: ignore[no-untyped-def]
    return {"address": address, "mode": mode, "change": {"actions": list(actions), "before": before,
                                                         "after": after}, **extra}


def test_changed_top_level_attributes_are_named_and_values_are_dropped():
    plan = {"resource_drift": [
        _drift("fakecloud_bucket.a", {"size": 1, "secret": "x", "labels": {"k": "1"}, "id": "a"},
               {"size": 2, "secret": "y", "labels": {"k": "2"}, "id": "a"}),
        _drift("fakecloud_bucket.b", {"size": 1}, None, actions=("delete",)),
        _drift("data.fakecloud_bucket.a", {"size": 1}, {"size": 2}, mode="data"),
        _drift("module.m.data.fakecloud_bucket.a", {"size": 1}, {"size": 2}),
        _drift("fakecloud_bucket.c", {"size": 1}, {"size": 1}),
        _drift("fakecloud_bucket.d", {"size": 1}, {"size": 5}, deposed="00000001"),
    ]}
    found = drift_in_plan(plan)
    assert found == (DriftedInstance("fakecloud_bucket.a", ("labels", "secret", "size"), False),
                     DriftedInstance("fakecloud_bucket.b", (), True))
    assert "y" not in repr(found) and "2" not in repr([d.attributes for d in found])


def test_include_limits_the_check_and_a_missing_key_counts_as_changed():
    plan = {"resource_drift": [_drift("a.b", {"x": 1}, {"x": 1, "y": None}), _drift("a.c", {"x": 1}, {"x": 2})]}
    assert drift_in_plan(plan, include=lambda a: a == "a.c") == (DriftedInstance("a.c", ("x",), False),)
    assert changed_attributes({"x": 1}, {"y": 1}) == ("x", "y")
    assert drift_in_plan({}) == ()


def test_a_malformed_plan_is_a_format_error():
    with pytest.raises(DriftFormatError):
        drift_in_plan({"resource_drift": {"a": 1}})
    with pytest.raises(DriftFormatError):
        drift_in_plan({"resource_drift": [{"change": {}}]})
