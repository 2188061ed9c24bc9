"""The footprint's diagnostics catalogue and the glob arithmetic it needs.

Owns ``DIAGNOSTICS``: every construct ``analyzer.footprint`` widens a footprint for or fails closed on, with
what it does about it, so the rules are listed in one place (and a test walks the list), and ``HANDLED``,
the risky-looking constructs followed exactly. Also the conversions from configuration addresses and trunk
dependency edges to reservation globs, and the "does this glob cover that one" rule.

Must not do I/O or parse HCL.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from analyzer.addresses import AddressError, parse_instance_address, parse_module_path
from analyzer.globs import Glob, canonical, intersects, parse_glob
from analyzer.globs import covers as covers_glob

__all__ = [
    "DIAGNOSTICS",
    "FILE_FUNCTIONS",
    "FULL_PLAN",
    "HANDLED",
    "Diagnostic",
    "GlobCover",
    "Rule",
    "covers",
    "is_local_source",
    "is_override_file",
    "json_declarations",
    "json_document_declarations",
    "minimal",
    "parsed_glob",
    "resource_globs",
    "target_globs",
    "trunk_reads",
    "uncovered",
]

FULL_PLAN = "run kl plan without -f (full plan)"
# Built-in functions that read files next to the configuration (path.module), which a workspace of copied
# blocks does not hold unless the builder copies them.
FILE_FUNCTIONS = frozenset({
    "file", "filebase64", "filebase64sha256", "filemd5", "filesha1", "filesha256", "filesha512", "fileexists",
    "fileset", "templatefile",
})


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """Something the footprint could not take at face value, and what was done about it.

    ``action`` is ``widen`` (the footprint was made wider, and ``message`` says how) or ``fail`` (the footprint
    must not be used; ``message`` says why and ends with the full-plan fallback command).
    """

    file: str
    line: int
    construct: str
    message: str
    action: str


@dataclass(frozen=True, slots=True)
class Rule:
    """One catalogued construct: ``action`` taken, ``when`` it applies, and ``how`` (appended to messages)."""

    action: str
    when: str
    how: str


def _fail(when: str) -> Rule:
    return Rule("fail", when, FULL_PLAN)


DIAGNOSTICS: Mapping[str, Rule] = MappingProxyType({
    "parse_error": _fail("a selected file, or a file holding a block the footprint needs or might need (any "
                        "file whose top-level blocks the prescan cannot list), does not parse"),
    "tf_json": _fail("a selected file is .tf.json, or a .tf.json file declares something the workspace needs "
                     "(a referenced object, a provider configuration, a terraform block, locals) or a "
                     "moved/removed/import block, which could touch the selected files unseen"),
    "override_file": _fail("a selected file is an override file, or an override file changes a block the "
                           "workspace contains"),
    "undefined_reference": _fail("a reference names an object no file declares, or a provider meta-argument "
                                 "names an aliased configuration no provider block declares: the configuration "
                                 "is invalid"),
    "invalid_reference": _fail("a reference Terraform rejects (var alone, a bare name, a reserved root)"),
    "duplicate_definition": _fail("an object the workspace needs is declared more than once"),
    "unreadable_expression": _fail("an expression the analyzer cannot read, such as a heredoc template it "
                                   "cannot scan: a local or argument whose references cannot be followed"),
    "module_source_missing": _fail("a module call in the workspace has no literal source"),
    "migration_source_declared": _fail("a moved or removed block of the workspace moves or removes a resource or "
                                       "module call (written without a key) that a file still declares: Terraform "
                                       "rejects that, and a workspace without that file would apply it anyway"),
    "invalid_label": _fail("a block label Terraform rejects as a name (it must start with a letter or an "
                           "underscore and hold only letters, digits, underscores and dashes), or an empty one"),
    "provider_consumer": _fail("a provider configuration refers to something the selection writes or defines, so "
                               "every resource using it could change"),
    "consumer": Rule("widen", "a block of a file that is not selected refers (directly or through locals, data "
                     "sources and other resources) to something the selection writes or defines",
                     "kl plan lists its changes with the selection's"),
    "remote_state": Rule("widen", "a terraform_remote_state data source is in the workspace",
                         "the data source is copied and read; the other state's outputs are taken as they are "
                         "at plan time"),
    "module_source_remote": Rule("widen", "a module call in the workspace has a non-local source whose files "
                                 "cannot be read", "module.NAME.* is read (written when the call is in a "
                                 "selected file) as a whole"),
    "file_function": Rule("widen", "a block in the workspace calls a file-reading function (file, templatefile, "
                          "fileset, …)", "the workspace must also carry the configuration directory's non-.tf "
                          "files"),
    "moved_elsewhere": Rule("widen", "a moved, removed or import block in a file that is not selected names an "
                            "address the selected files write", "the block is copied into the workspace and every "
                            "address it names is added to the write globs"),
    "target_elsewhere": Rule("widen", "a moved or import block of the workspace moves or imports into a resource "
                             "declared in a file that is not selected", "that resource block is copied into the "
                             "workspace and written (TYPE.NAME and TYPE.NAME.*)"),
})


# Constructs that look risky but are followed exactly, so they need no diagnostic; listed so that the choice is
# visible and tested (tests/analyzer/test_footprint.py checks each one's references reach the footprint).
HANDLED: Mapping[str, str] = MappingProxyType({
    "dynamic_block": "for_each, labels and content are read; the iterator (the label, or `iterator`) is bound "
                     "inside content and is not a reference. Plan JSON leaves dynamic blocks out, the HCL does not",
    "for_expression": "the collection is read outside the loop, key/value/condition inside with the loop names bound",
    "template_directive": "%{for}/%{if} in quoted strings and heredocs are read; %{for} names are bound",
    "heredoc": "each ${…} and %{…} in the heredoc body is parsed on its own and read",
    "provider_function": "provider::NS::FN is not a reference (as in plan JSON); its arguments are",
    "check_block": "scoped data sources are written with the check block's file; references to them stay inside",
    "depends_on": "module.N and TYPE.NAME entries pull the module call or resource block and read its globs",
    "replace_triggered_by": "its references pull and read what they name, like any other reference",
    "module_output": "module.N.OUT and module.N[KEY].OUT pull the module call: module.N.* is read whole, "
                     "because Terraform plans the whole call once its block is in the workspace",
    "import_for_each": "an import `to` with a non-literal key writes every instance of the resource",
})


def is_local_source(source: str) -> bool:
    """Whether a module source is a local path, which Terraform reads in place rather than installing."""
    return source in (".", "..") or source.startswith(("./", "../", ".\\", "..\\"))


def resource_globs(address: str, *, exact: bool = False) -> tuple[str, ...]:
    """Globs covering a configuration object: ``T.N.*`` (and ``T.N`` when ``exact``), or ``module.N.*``."""
    if address.startswith("module.") and "." not in address[len("module."):]:
        return (canonical(Glob.module_prefix(parse_module_path(address))),)
    parsed = parse_instance_address(address)
    prefix = canonical(Glob.resource_prefix(parsed.module, parsed.mode, parsed.type, parsed.name))
    return (canonical(Glob.exact(parsed)), prefix) if exact else (prefix,)


def target_globs(target: str) -> tuple[str, ...]:
    """Globs for an address a moved/removed/import block names (``[*]`` marks a key that is not literal).

    A resource gives itself and every instance, an instance gives itself, a module (instance) gives every
    address inside it. Wildcard keys widen to every instance of the step. Raises AddressError when the text
    is not an address.
    """
    wildcard = "[*]" in target
    text = target.replace("[*]", "")
    try:
        address = parse_instance_address(text)
    except AddressError:
        return (canonical(Glob.module_prefix(parse_module_path(text))),)
    if wildcard or address.key is None:
        prefix = canonical(Glob.resource_prefix(address.module, address.mode, address.type, address.name))
        return (prefix,) if wildcard else (canonical(Glob.exact(address)), prefix)
    return (canonical(Glob.exact(address)),)


def minimal(globs: Iterable[str]) -> tuple[str, ...]:
    """Sorted, de-duplicated globs in canonical text."""
    return tuple(sorted({canonical(parsed_glob(g)) for g in globs}))


@lru_cache(maxsize=1 << 16)
def parsed_glob(text: str) -> Glob:
    # Footprints of large configurations compare thousands of globs; each text is parsed once.
    return parse_glob(text)


class GlobCover:
    """A set of globs that answers "is this glob covered by one of them" without comparing against each.

    Module prefixes are few and checked one by one; resource and exact globs are indexed by their resource.
    """

    def __init__(self, globs: Iterable[str] = ()) -> None:
        self._everything = False
        self._all: list[Glob] = []
        self._modules: list[Glob] = []
        self._by_resource: dict[tuple[str, str, str], list[Glob]] = {}
        for glob in globs:
            self.add(glob)

    def add(self, text: str) -> None:
        glob = parsed_glob(text)
        self._all.append(glob)
        if glob.is_everything:
            self._everything = True
        elif glob.resource is None:  # module and type prefixes
            self._modules.append(glob)
        else:
            self._by_resource.setdefault(glob.resource, []).append(glob)

    def covers(self, text: str, *, strictly: bool = False) -> bool:
        """Whether a glob of the set covers ``text`` (with ``strictly``, a glob other than ``text`` itself)."""
        narrow = parsed_glob(text)
        candidates = [*self._modules, *(self._by_resource.get(narrow.resource, ()) if narrow.resource else ())]
        if self._everything and not (strictly and narrow.is_everything):
            return True
        return any(_covers(wide, narrow) for wide in candidates if not (strictly and wide == narrow))

    def intersects(self, text: str) -> bool:
        """Whether some address matches both ``text`` and a glob of the set."""
        narrow = parsed_glob(text)
        if self._everything or narrow.is_everything:
            return bool(self._all)
        if narrow.resource is None:
            candidates = self._all  # a module prefix may meet any resource inside it
        else:
            candidates = [*self._modules, *self._by_resource.get(narrow.resource, ())]
        return any(intersects(wide, narrow) for wide in candidates)


def trunk_reads(edges: Iterable[tuple[str, str]], writes: Iterable[str]) -> set[str]:
    """Read globs for the trunk's resources the written ones depend on, and for those that depend on them.

    ``edges`` are ``(instance address, resource address it depends on)`` pairs, as state stores them
    (transitive already, so one hop suffices). Raises AddressError for an edge that does not parse.
    """
    written = GlobCover(writes)
    out: set[str] = set()
    for source, target in edges:
        dependent = parse_instance_address(source)
        depended = parse_instance_address(target)
        dependent_glob = canonical(Glob.resource_prefix(dependent.module, dependent.mode, dependent.type,
                                                        dependent.name))
        depended_glob = canonical(Glob.resource_prefix(depended.module, depended.mode, depended.type, depended.name))
        if written.intersects(canonical(Glob.exact(dependent))):
            out.add(depended_glob)
        if written.intersects(depended_glob):
            out.add(dependent_glob)
    return out


def covers(globs: Iterable[str], glob: str) -> bool:
    """Whether some glob in ``globs`` covers every address ``glob`` covers (an equal glob does)."""
    return GlobCover(globs).covers(glob)


_covers = covers_glob  # the conflict matrix's containment, one function (analyzer.globs.covers)


def json_document_declarations(text: str) -> list[tuple[str, tuple[str, ...]]] | None:
    """The ``(type, labels)`` declarations of a ``.tf.json`` file, or None when it is not JSON."""
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return []
    return [(type_, labels) for type_, body in document.items()
            for entry in (body if isinstance(body, list) else [body]) for labels in json_declarations(type_, entry)]


def uncovered(globs: Iterable[str], wider: Iterable[str]) -> tuple[str, ...]:
    """``globs``, sorted and unique, without those another of them, or one of ``wider``, already covers."""
    unique = minimal(globs)
    outside, inside = GlobCover(wider), GlobCover(unique)
    return tuple(g for g in unique if not outside.covers(g) and not inside.covers(g, strictly=True))


def json_declarations(type_: str, entry: object) -> list[tuple[str, ...]]:
    """The label tuples a JSON-syntax top-level entry declares (locals: one per local name)."""
    depth = {"resource": 2, "data": 2, "ephemeral": 2, "action": 2, "module": 1, "variable": 1, "output": 1,
             "provider": 1, "check": 1, "locals": 1}.get(type_, 0)
    if depth == 0 or not isinstance(entry, dict):
        return [()]
    if depth == 1:
        return [(k,) for k in entry]
    return [(t, n) for t, names in entry.items() if isinstance(names, dict) for n in names]


def is_override_file(path: str) -> bool:
    """Whether Terraform treats the file as an override file (merged into blocks declared elsewhere)."""
    if not path.endswith(("override.tf", "override.tf.json")):  # every override file's name ends so
        return False
    name = posixpath.basename(path)
    return name in ("override.tf", "override.tf.json") or name.endswith(("_override.tf", "_override.tf.json"))
