"""One scanner of quoted strings and ``${…}`` sequences (analyzer.prescan) serves the block scan and the
references of heredoc templates (analyzer.references): both read the same text the same way."""

from __future__ import annotations

import pytest

from analyzer.hcl import analyze_file
from analyzer.prescan import Unterminated, expression_end, scan, template_end

# Quoted strings whose contents start at index 1, and where they end (just past the closing quote).
STRINGS = [
    ('"plain" tail', 7),
    ('"a \\" b" tail', 8),  # a backslash escapes the quote
    ('"${ "}" } x" tail', 12),  # a quote inside a sequence is a string of its own
    ('"$${ "not a sequence" tail', 6),  # $${ is an escape: the next quote ends the string
    ('"%%{ " tail', 6),  # so is %%{
    ('"${ { a = "}" }["a"] }" tail', 23),  # braces nest inside a sequence
    ('"%{ if x }y%{ endif }" tail', 22),
]


@pytest.mark.parametrize(("text", "end"), STRINGS)
def test_a_quoted_string_ends_where_terraform_ends_it(text: str, end: int) -> None:
    assert template_end(text, 1) == end
    assert text[end - 1] == '"'


@pytest.mark.parametrize(
    ("text", "what", "start"),
    [
        ('"no end\n"', "string", 1),  # a newline ends a quoted string unterminated
        ('"${ x ', "sequence", 3),
        ('"${ "inner }', "string", 5),  # the innermost construct that does not end is named
    ],
)
def test_the_innermost_unterminated_construct_is_named(text: str, what: str, start: int) -> None:
    with pytest.raises(Unterminated) as caught:
        template_end(text, 1)
    assert (caught.value.what, caught.value.start) == (what, start)


def test_a_sequence_may_span_lines_and_ends_past_its_brace() -> None:
    text = '${ merge(\n  {a = "}"},\n  var.b) } tail'
    assert text[: expression_end(text, 2)].endswith(") }")


def test_the_block_scan_skips_braces_inside_strings_and_sequences() -> None:
    text = 'locals {\n  a = "${ "}" } $${ { %%{"\n  b = "\\" }"\n}\nresource "t" "r" {\n}\n'
    found = scan(text)
    assert found.complete
    assert [(h.type, h.labels) for h in found.headers] == [("locals", ()), ("resource", ("t", "r"))]


def test_the_block_scan_is_incomplete_on_an_unterminated_string() -> None:
    assert not scan('locals {\n  a = "${ "x }\n}\n').complete


def _heredoc_refs(body: str) -> list[tuple[str, str]]:
    text = 'resource "t" "r" {\n  x = <<EOT\n' + body + "\nEOT\n}\n"
    block = next(b for b in analyze_file("main.tf", text).blocks if b.address == "t.r")
    return [(r.kind, r.text) for r in block.references]


def test_heredoc_sequences_are_read_with_the_same_scanner() -> None:
    refs = _heredoc_refs('${ lookup(var.m, "}") } $${var.not} ${ {a = local.b}["a"] } "${var.c}"')
    assert [text for _, text in refs] == ["var.m", "local.b", "var.c"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("${var.a", "unterminated template sequence '${var.a\\nEOT\\n'"),
        ('${var.a("x', "unterminated string in template '\"x\\nEOT\\n'"),
    ],
)
def test_an_unterminated_heredoc_sequence_names_what_is_open(body: str, message: str) -> None:
    assert _heredoc_refs(body) == [("unreadable", message)]
