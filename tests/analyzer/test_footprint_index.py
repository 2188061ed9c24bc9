"""The footprint's per-file index: cached in the parse cache, merged into the configuration's index."""

from __future__ import annotations

import pickle

import pytest

from analyzer.footprint import compute_footprint
from analyzer.footprint_index import COLLECTED, Declared, DefinitionIndex, FileIndex, classify, file_index
from analyzer.hcl import ParseCache
from analyzer.prescan import BlockHeader, scan
from tests.analyzer.test_footprint import RISKY, SPLIT, _files

TEXT = '''resource "a" "b" {}
locals {
  x = 1
}
resource "a" "b" {}
variable "bad name" {}
provider "aws" {}
moved {
  from = a.c
  to   = a.b
}
output "o" {}
'''


def test_a_file_index_says_what_each_kept_header_declares() -> None:
    result = scan(TEXT)
    index = file_index(result.headers, result.complete)
    assert index.complete and index.bad == frozenset({3})
    assert [h.type for h in index.kept()] == ["resource", "locals", "resource", "provider", "moved", "output"]
    assert index.names == {"a.b": 0, "output.o": 5}
    assert index.repeats == (("a.b", 2),)
    assert index.collected == (1, 3, 4)


def test_a_file_index_pickles_without_header_objects_and_decodes_the_same_headers() -> None:
    result = scan(TEXT)
    blob = pickle.dumps(file_index(result.headers, result.complete), protocol=pickle.HIGHEST_PROTOCOL)
    assert b"BlockHeader" not in blob
    loaded = pickle.loads(blob)
    assert isinstance(loaded, FileIndex)
    assert loaded.headers == result.headers
    assert (loaded.bad, loaded.names, loaded.repeats, loaded.collected) == (
        frozenset({3}), {"a.b": 0, "output.o": 5}, (("a.b", 2),), (1, 3, 4))


def test_the_merged_index_returns_every_declaration_in_file_and_position_order() -> None:
    made: list[tuple[str, int]] = []

    def make(path: str, header: BlockHeader) -> tuple[str, int]:
        made.append((path, header.line))
        return (path, header.line)

    index: DefinitionIndex[tuple[str, int]] = DefinitionIndex(make)
    result = scan(TEXT)
    collected = index.add_index("a.tf", file_index(result.headers, result.complete))
    assert [d for _, d in collected] == [("a.tf", 2), ("a.tf", 7), ("a.tf", 8)]
    assert index.add_defs("b.tf", [(("b.tf", 1), "a.b"), (("b.tf", 3), COLLECTED), (("b.tf", 9), None)]) == [
        (1, ("b.tf", 3))]
    index.add_index("c.tf", file_index(scan('output "o" {}\n').headers, True))
    assert index.get("a.b") == [("a.tf", 1), ("a.tf", 5), ("b.tf", 1)]
    assert index.get("output.o") == [("a.tf", 12), ("c.tf", 1)]
    assert index.get("a.c") == [] and index.defs("missing.tf") == []
    assert index.defs("b.tf") == [("b.tf", 1), ("b.tf", 3), ("b.tf", 9)]
    assert [d[1] for d in index.defs("a.tf")] == [1, 2, 5, 7, 8, 12]
    assert len(made) == len(set(made))  # each definition made once, on first use


def test_classify() -> None:
    assert classify("resource", ("a", "b")) == "a.b"
    assert classify("variable", ("v",)) == "var.v"
    assert classify("resource", ("a",)) is None
    assert classify("provider", ()) is None
    assert classify("provider", ("aws",)) == classify("import", ()) == classify("terraform", ()) == COLLECTED


@pytest.mark.parametrize("construct", sorted(RISKY))
def test_a_reloaded_cache_gives_the_same_footprint(construct: str) -> None:
    case = RISKY[construct]
    cache = ParseCache()
    cold = compute_footprint(case.files, case.selected, cache=cache)
    warm = pickle.loads(pickle.dumps(cache, protocol=pickle.HIGHEST_PROTOCOL))
    assert compute_footprint(case.files, case.selected, cache=warm) == cold == compute_footprint(
        case.files, case.selected)


def test_a_reloaded_cache_gives_the_same_footprint_of_the_split_fixture() -> None:
    files = _files(SPLIT)
    cache = ParseCache()
    cold = compute_footprint(files, ["app.tf"], cache=cache)
    warm = pickle.loads(pickle.dumps(cache, protocol=pickle.HIGHEST_PROTOCOL))
    parses = warm.parse_count
    assert compute_footprint(files, ["app.tf"], cache=warm) == cold
    assert warm.parse_count == parses


def test_lookups_give_the_same_declarations_before_and_after_the_file_tables_are_merged() -> None:
    # Files declaring overlapping addresses (some twice in one file): each lookup probes every file's table
    # until the lookups have cost a merge, then one merged table answers; both must give the same answers.
    def make(path: str, header: BlockHeader) -> tuple[str, int]:
        return (path, header.line)

    index: DefinitionIndex[tuple[str, int]] = DefinitionIndex(make)
    texts = {f"f{i:02}.tf": "".join(f'resource "t" "r{(i + k) % 12}" {{}}\n' for k in range(3)) +
             ('resource "t" "r0" {}\n' if i % 5 == 0 else "") for i in range(20)}
    for path, text in texts.items():
        index.add_index(path, file_index(scan(text).headers, True))

    def expected(address: str) -> list[tuple[str, int]]:
        return [(path, line) for path, text in texts.items()
                for line, row in enumerate(text.splitlines(), 1) if f'"{address.split(".")[1]}"' in row]

    addresses = [f"t.r{n}" for n in range(12)] + ["t.none"]
    probed = [index.get(a) for a in addresses[:5]]  # 5 x 20 probes, under twice the 60 declarations
    assert index._merged is None  # noqa: SLF001 - the lookups so far probed the file tables
    assert probed == [expected(a) for a in addresses[:5]] and probed[0][1] == ("f00.tf", 4)
    for _ in range(3):
        assert [index.get(a) for a in addresses] == [expected(a) for a in addresses]
    assert index._merged is not None  # noqa: SLF001 - the later ones went through the merged table
    # A file added after the merge is in the answers too.
    texts["g.tf"] = 'resource "t" "r1" {}\n'
    index.add_index("g.tf", file_index(scan(texts["g.tf"]).headers, True))
    assert index.get("t.r1") == expected("t.r1") and index.get("t.r1")[-1] == ("g.tf", 1)


def test_expected_addresses_give_the_same_declarations_as_probing_each_file() -> None:
    # ``expect`` looks up a set of addresses in one pass over the file tables; its answers (declarations of
    # files added before and after it, in file and position order) must equal a plain index's.
    def make(path: str, header: BlockHeader) -> tuple[str, int]:
        return (path, header.line)

    texts = {f"f{i:02}.tf": "".join(f'resource "t" "r{(i + k) % 12}" {{}}\n' for k in range(3)) +
             ('resource "t" "r0" {}\n' if i % 5 == 0 else "") for i in range(20)}
    late = {"g.tf": 'resource "t" "r1" {}\nresource "t" "r13" {}\n'}
    plain: DefinitionIndex[tuple[str, int]] = DefinitionIndex(make)
    batched: DefinitionIndex[tuple[str, int]] = DefinitionIndex(make)
    for path, text in texts.items():
        plain.add_index(path, file_index(scan(text).headers, True))
        batched.add_index(path, file_index(scan(text).headers, True))
    addresses = [f"t.r{n}" for n in range(14)] + ["t.none"]
    batched.expect([*addresses[:8], "t.r13", "t.none"])
    for path, text in late.items():
        plain.add_index(path, file_index(scan(text).headers, True))
        batched.add_index(path, file_index(scan(text).headers, True))
    batched_answers = [batched.get(a) for a in addresses]
    assert batched._probes == 5 * 21  # noqa: SLF001 - only the five addresses not expected probed the 21 tables
    assert batched_answers == [plain.get(a) for a in addresses]
    assert batched.get("t.r1")[-1] == ("g.tf", 1) and batched.get("t.r13") == [("g.tf", 2)]
    assert batched.get("t.r0")[1] == ("f00.tf", 4) and batched.get("t.none") == []


def test_a_files_names_pickle_packed_and_answer_as_the_dictionary_did() -> None:
    names = {"a.b": 0, "output.o": 5, "var.x": 2}
    packed = pickle.loads(pickle.dumps(FileIndex(True, frozenset(), names, (), (), b"")))
    assert isinstance(packed.names, Declared) and list(packed.names) == list(names) and len(packed.names) == 3
    assert packed.names == names and "var.x" in packed.names and "var.y" not in packed.names
    assert packed.names["output.o"] == 5 and list(packed.names) == list(names)  # the same order once looked up
    assert pickle.loads(pickle.dumps(packed)).names == names  # packed again as it is
    empty = pickle.loads(pickle.dumps(FileIndex(True, frozenset(), {}, (), (), b"")))
    assert list(empty.names) == [] and len(empty.names) == 0 and "a.b" not in empty.names
    odd = {"a.b\nc": 1}  # an address holding the separator stays a dictionary
    assert pickle.loads(pickle.dumps(FileIndex(True, frozenset(), odd, (), (), b""))).names == odd
