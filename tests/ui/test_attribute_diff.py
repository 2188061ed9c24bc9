"""Attribute diffs between lifecycles: changed leaves only, sensitive values masked."""

from __future__ import annotations

from app.domain.attributes import ChangeKind, attribute_diff, format_path, sensitive_paths

MASK_INPUT = [[{"type": "get_attr", "value": "input"}]]


def test_only_changed_leaves_are_listed_with_their_kind():
    before = {"id": "1", "tags": {"Name": "a", "Team": "x"}, "ports": [80, 443]}
    after = {"id": "1", "tags": {"Name": "b"}, "ports": [80, 443, 8080], "new": True}
    changes = {c.path: c for c in attribute_diff(before, after)}
    assert set(changes) == {"tags.Name", "tags.Team", "ports[2]", "new"}
    name = changes["tags.Name"]
    assert name.kind is ChangeKind.CHANGED and (name.before, name.after) == ('"a"', '"b"')
    assert changes["tags.Team"].kind is ChangeKind.REMOVED and changes["tags.Team"].after is None
    assert changes["ports[2]"].kind is ChangeKind.ADDED and changes["new"].after == "true"


def test_a_first_lifecycle_lists_every_attribute_as_added():
    changes = attribute_diff(None, {"a": 1, "b": {"c": None}, "empty": {}})
    assert [(c.path, c.kind) for c in changes] == [("a", "added"), ("b.c", "added"), ("empty", "added")]


def test_values_under_sensitive_paths_are_masked_but_still_reported():
    masked = sensitive_paths(MASK_INPUT + [[{"type": "get_attr", "value": "list"},
                                            {"type": "index", "value": {"value": 1, "type": "number"}}]])
    assert masked == frozenset({("input",), ("list", 1)})
    before = {"input": {"value": "hunter2"}, "list": ["a", "b"], "plain": "x"}
    after = {"input": {"value": "hunter3"}, "list": ["a", "c"], "plain": "y"}
    changes = {c.path: c for c in attribute_diff(before, after, masked=masked)}
    assert changes["input.value"].sensitive and changes["input.value"].before is None
    assert changes["input.value"].after is None
    assert changes["list[1]"].sensitive and not changes["plain"].sensitive
    assert "hunter" not in repr(changes)


def test_names_that_hold_credentials_are_masked_even_when_the_state_does_not_say_so():
    changes = attribute_diff({"master_password": "p1", "api_token": "t"}, {"master_password": "p2", "api_token": "u"})
    assert all(c.sensitive and c.before is None and c.after is None for c in changes)


def test_odd_keys_are_quoted_and_long_values_are_cut():
    assert format_path(("tags", "a b", 0, "x")) == 'tags["a b"][0].x'
    [change] = attribute_diff(None, {"blob": "z" * 1000})
    assert change.after is not None and len(change.after) == 300 and change.after.endswith("…")


def test_malformed_sensitive_paths_mask_more_not_less():
    assert sensitive_paths("nope") == frozenset()
    assert sensitive_paths([[{"type": "get_attr", "value": "a"}, {"weird": True}]]) == frozenset({("a",)})


def test_a_secret_looking_field_name_inside_a_type_descriptor_is_not_masked_but_its_value_is():
    before = None
    after = {"input": {"value": {"password": "hunter2", "user": "u"},
                       "type": ["object", {"password": "string", "user": "string"}]}}
    changes = {c.path: c for c in attribute_diff(before, after)}
    assert changes["input.type[1].password"].sensitive is False
    assert changes["input.type[1].password"].after == '"string"'
    assert changes["input.value.password"].sensitive is True and changes["input.value.password"].after is None
    # A value that is not a bare type name under such a path stays masked: only type names are unmasked.
    odd = {c.path: c for c in attribute_diff(None, {"x": {"type": ["object", {"token": "abc123"}]}})}
    assert odd["x.type[1].token"].sensitive is True
    # And a path Terraform marks sensitive is masked whatever it looks like.
    marked = {c.path: c for c in attribute_diff(None, after, masked=[("input",)])}
    assert marked["input.type[1].password"].sensitive is True
