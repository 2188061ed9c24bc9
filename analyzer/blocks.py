"""The shape of a parsed .tf file (``Block``, ``LocalDef``, ``Span``, ``FileAnalysis``) and the reader that builds
it from python-hcl2's raw lark tree.

Owns which attributes of which blocks are meta-arguments (``count``, ``for_each``, ``provider``, ``depends_on``,
``lifecycle.replace_triggered_by``, a module's ``source``/``providers``, moved/removed/import addresses) and
which are not references at all (``provider``/``providers``, ``moved``/``import`` ``from``/``to``,
``lifecycle.ignore_changes``, a variable's ``type``, provisioner ``when``/``on_failure``, a dynamic block's
``iterator``, anything inside a ``terraform`` block).

Must not import hcl2 (``analyzer.hcl`` parses and hands the tree in) or touch the filesystem.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from lark import Token, Tree

from analyzer.addresses import declared_address
from analyzer.references import (
    ExpressionReader,
    Reference,
    UnreadableExpressionError,
    literal_string,
)

__all__ = ["Block", "FileAnalysis", "HclError", "LocalDef", "Span", "implicit_provider", "read_blocks"]

_RESOURCE_TYPES = frozenset({"resource", "data", "ephemeral", "action"})
_NOT_REFERENCES = {
    # block type -> attribute names in the top-level body whose values are addresses or keywords
    "resource": {"provider"}, "data": {"provider"}, "ephemeral": {"provider"}, "action": {"provider"},
    "module": {"providers", "source"}, "variable": {"type"}, "moved": {"from", "to"}, "removed": {"from"},
    "import": {"to", "provider"},
}
_NESTED_NOT_REFERENCES = {"lifecycle": {"ignore_changes"}, "provisioner": {"when", "on_failure"},
                          "action_trigger": {"events"}}


class HclError(ValueError):
    """A .tf file that cannot be read; the message is ``file:line: what is wrong``.

    Defined here so the block reader can raise it; ``analyzer.hcl`` re-exports it, and callers import it there.
    """


@dataclass(frozen=True, slots=True)
class Span:
    """Where something lies in a file: 1-based lines, and character offsets into the text (end exclusive)."""

    start_line: int
    end_line: int
    start_pos: int
    end_pos: int


@dataclass(frozen=True, slots=True)
class LocalDef:
    """One local value of a ``locals`` block: ``name = expression`` spans the whole attribute."""

    name: str
    span: Span
    references: tuple[Reference, ...]
    functions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Block:
    """One top-level block of a .tf file.

    ``address`` names the configuration object: ``aws_instance.web``, ``data.aws_ami.x``, ``ephemeral.t.n``,
    ``module.net``, ``var.region``, ``output.name``, ``provider.aws`` / ``provider.aws.east``, ``check.name``, and
    for blocks without a name their type (``terraform``, ``locals``, ``moved``, ``removed``, ``import``).

    ``references`` lists every reference in the body in source order (Terraform's order within one attribute;
    ``Reference.attribute`` tells the attributes apart). ``functions`` are the functions called, provider
    functions as ``provider::ns::fn``. ``provider`` is the ``provider`` meta-argument as written (``aws.east``),
    ``""`` if absent; ``provider_configs`` are the provider configurations the block needs from its module
    (``aws.east``, or the implicit ``aws`` for an ``aws_instance`` without the meta-argument; a module call's
    ``providers`` values; a check block's scoped data sources'). ``module_source`` is a module call's literal
    ``source`` (None for other blocks, or when it is not a literal). ``depends_on`` and
    ``replace_triggered_by`` are the traversals as written. ``repetition`` is ``count``, ``for_each`` or ``""``.
    ``targets`` are the addresses a ``moved`` (from, to), ``removed`` (from,) or ``import`` (to,) block names,
    with ``[*]`` for an instance key that is not a literal. ``locals`` are a ``locals`` block's values.
    ``scoped_data`` are the data sources declared inside a ``check`` block. ``backend_spans`` are the
    ``backend``/``cloud`` blocks inside a ``terraform`` block, which a workspace copy leaves out.
    """

    file: str
    type: str
    labels: tuple[str, ...]
    span: Span
    address: str
    references: tuple[Reference, ...] = ()
    functions: tuple[str, ...] = ()
    provider: str = ""
    provider_configs: tuple[str, ...] = ()
    module_source: str | None = None
    depends_on: tuple[str, ...] = ()
    replace_triggered_by: tuple[str, ...] = ()
    repetition: str = ""
    targets: tuple[str, ...] = ()
    locals: tuple[LocalDef, ...] = ()
    scoped_data: tuple[str, ...] = ()
    backend_spans: tuple[Span, ...] = ()


@dataclass(frozen=True, slots=True)
class FileAnalysis:
    """Every top-level block of one file; ``sha256`` is the hex digest of its text (UTF-8)."""

    path: str
    sha256: str
    blocks: tuple[Block, ...]


# --- reading blocks ----------------------------------------------------------------------------------------


def implicit_provider(resource_type: str) -> str:
    """The provider local name Terraform infers from a resource type: the part before the first ``_``."""
    return resource_type.split("_", 1)[0]


def read_blocks(
    path: str, tree: Tree[Token], reader: ExpressionReader, *, line_offset: int = 0, pos_offset: int = 0
) -> Iterator[Block]:
    """The top-level blocks of a parsed file (or of a part of it starting at ``line_offset``/``pos_offset``).

    Raises HclError for constructs Terraform rejects (a top-level argument, a templated label, a moved block
    whose ``to`` is not an address).
    """
    body = tree.children[0]
    assert isinstance(body, Tree)
    for node in body.children:
        if not isinstance(node, Tree):
            continue
        if node.data == "attribute":
            raise HclError(f"{path}:{node.meta.line + line_offset}: unexpected top-level argument "
                           f"{_name(node)!r}: a .tf file holds blocks only")
        if node.data == "block":
            try:
                yield _BlockReader(path, reader, line_offset, pos_offset).read(node)
            except RecursionError as exc:
                raise HclError(f"{path}:{node.meta.line + line_offset}: an expression is nested too deeply") from exc


@dataclass(slots=True)
class _BlockReader:
    path: str
    reader: ExpressionReader
    line_offset: int
    pos_offset: int
    references: list[Reference] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    depends_on: list[str] = field(default_factory=list)
    replace_triggered_by: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)

    def read(self, node: Tree[Token]) -> Block:
        type_ = _name(node)
        labels = _labels(node, self.path, node.meta.line + self.line_offset)
        body = _body(node)
        if type_ == "locals":
            self._locals(body)
        elif type_ == "terraform":
            self._terraform(body)
        else:
            self._body(body, type_, "", frozenset(), top=True)
        provider = str(self.fields.get("provider", ""))
        configs: list[str] = []
        if type_ in _RESOURCE_TYPES and len(labels) == 2:
            configs.append(provider or implicit_provider(labels[0]))
        elif type_ == "import" and provider:
            configs.append(provider)
        configs.extend(self.fields.get("passed_providers", ()))
        configs.extend(self.fields.get("scoped_providers", ()))
        return Block(
            file=self.path,
            type=type_,
            labels=labels,
            span=self._span(node),
            address=declared_address(type_, labels, str(self.fields.get("alias", ""))),
            references=tuple(self.references),
            functions=tuple(self.functions),
            provider=provider,
            provider_configs=tuple(dict.fromkeys(configs)),
            module_source=self.fields.get("source"),
            depends_on=tuple(self.depends_on),
            replace_triggered_by=tuple(self.replace_triggered_by),
            repetition=str(self.fields.get("repetition", "")),
            targets=tuple(self.fields.get("targets", ())),
            locals=tuple(self.fields.get("locals", ())),
            scoped_data=tuple(self.fields.get("scoped_data", ())),
            backend_spans=tuple(self.fields.get("backend_spans", ())),
        )

    def _span(self, node: Tree[Token]) -> Span:
        meta = node.meta
        return Span(meta.line + self.line_offset, meta.end_line + self.line_offset,
                    meta.start_pos + self.pos_offset, meta.end_pos + self.pos_offset)

    def _read(self, expression: Tree[Token] | Token, attribute: str, scope: frozenset[str]) -> list[Reference]:
        try:
            refs, functions = self.reader.read(expression, attribute=attribute, scope=scope,
                                               line_offset=self.line_offset)
        except UnreadableExpressionError as exc:
            line = (expression.meta.line if isinstance(expression, Tree) else 0) + self.line_offset
            refs = (Reference(text=str(exc), subject=str(exc), kind="unreadable", line=line, attribute=attribute,
                              address=str(exc)),)
            functions = ()
        self.references.extend(refs)
        self.functions.extend(functions)
        return list(refs)

    def _locals(self, body: Tree[Token]) -> None:
        defs: list[LocalDef] = []
        for node in body.children:
            if isinstance(node, Tree) and node.data == "attribute":
                before = len(self.functions)
                refs = self._read(node.children[-1], _name(node), frozenset())
                defs.append(LocalDef(_name(node), self._span(node), tuple(refs), tuple(self.functions[before:])))
            elif isinstance(node, Tree) and node.data == "block":
                raise HclError(f"{self.path}:{node.meta.line + self.line_offset}: a locals block holds arguments "
                               f"only, not the block {_name(node)!r}")
        self.fields["locals"] = defs

    def _terraform(self, body: Tree[Token]) -> None:
        self.fields["backend_spans"] = [
            self._span(node) for node in body.children
            if isinstance(node, Tree) and node.data == "block" and _name(node) in ("backend", "cloud")
        ]

    def _body(self, body: Tree[Token], block_type: str, prefix: str, scope: frozenset[str], *, top: bool) -> None:
        skipped = _NOT_REFERENCES.get(block_type, set()) if top else _NESTED_NOT_REFERENCES.get(block_type, set())
        for node in body.children:
            if not isinstance(node, Tree):
                continue
            if node.data == "attribute":
                self._attribute(node, block_type, prefix, scope, top=top, skipped=skipped)
            elif node.data == "block":
                self._nested_block(node, block_type, prefix, scope, top=top)

    def _attribute(self, node: Tree[Token], block_type: str, prefix: str, scope: frozenset[str], *, top: bool,
                   skipped: set[str]) -> None:
        name = _name(node)
        expression = node.children[-1]
        assert isinstance(expression, Tree)
        if top:
            self._meta_argument(block_type, name, expression)
        if name in skipped:
            return
        refs = self._read(expression, prefix + name, scope)
        if name == "depends_on" and top:
            self.depends_on.extend(r.text for r in refs)
        elif name == "replace_triggered_by" and block_type == "lifecycle":
            self.replace_triggered_by.extend(r.text for r in refs)

    def _meta_argument(self, block_type: str, name: str, expression: Tree[Token]) -> None:
        if name in ("count", "for_each") and block_type in (*_RESOURCE_TYPES, "module", "import"):
            self.fields["repetition"] = name
        elif name == "provider" and block_type in (*_RESOURCE_TYPES, "import"):
            self.fields["provider"] = _provider_text(expression, self.path, self.line_offset)
        elif name == "providers" and block_type == "module":
            self.fields["passed_providers"] = [
                _provider_text(value, self.path, self.line_offset) for value in _object_values(expression)
            ]
        elif name == "source" and block_type == "module":
            self.fields["source"] = _literal(expression)
        elif name == "alias" and block_type == "provider":
            self.fields["alias"] = _literal(expression) or ""
        elif (block_type, name) in (("moved", "from"), ("moved", "to"), ("removed", "from"), ("import", "to")):
            targets = self.fields.setdefault("targets", [])
            target = _traversal_text(expression, self.path, self.line_offset, allow_keys=True)
            # moved blocks list (from, to) whatever order they are written in
            if block_type == "moved" and name == "from":
                targets.insert(0, target)
            else:
                targets.append(target)

    def _nested_block(self, node: Tree[Token], block_type: str, prefix: str, scope: frozenset[str], *,
                      top: bool) -> None:
        nested = _name(node)
        labels = _labels(node, self.path, node.meta.line + self.line_offset)
        body = _body(node)
        if nested == "dynamic":
            self._dynamic(body, labels, prefix, scope)
            return
        if block_type == "check" and top and nested == "data" and len(labels) == 2:
            self.fields.setdefault("scoped_data", []).append(f"data.{labels[0]}.{labels[1]}")
            inner = _BlockReader(self.path, self.reader, self.line_offset, self.pos_offset)
            inner._body(body, "data", f"{prefix}data.{labels[0]}.{labels[1]}.", scope, top=True)
            self.references.extend(inner.references)
            self.functions.extend(inner.functions)
            self.fields.setdefault("scoped_providers", []).append(
                str(inner.fields.get("provider", "")) or implicit_provider(labels[0]))
            return
        self._body(body, nested, f"{prefix}{nested}.", scope, top=False)

    def _dynamic(self, body: Tree[Token], labels: tuple[str, ...], prefix: str, scope: frozenset[str]) -> None:
        label = labels[0] if labels else ""
        iterator = label
        for node in body.children:
            if isinstance(node, Tree) and node.data == "attribute" and _name(node) == "iterator":
                iterator = _traversal_text(node.children[-1], self.path, self.line_offset, allow_keys=False)
        where = f"{prefix}dynamic.{label}."
        inner = scope | {iterator}
        for node in body.children:
            if not isinstance(node, Tree):
                continue
            name = _name(node)
            if node.data == "attribute" and name == "for_each":
                self._read(node.children[-1], where + name, scope)  # evaluated outside the iteration
            elif node.data == "attribute" and name != "iterator":
                self._read(node.children[-1], where + name, inner)
            elif node.data == "block":
                nested_labels = _labels(node, self.path, node.meta.line + self.line_offset)
                if name == "dynamic":
                    self._dynamic(_body(node), nested_labels, where, inner)
                else:
                    self._body(_body(node), name, f"{where}{name}.", inner, top=False)


def _name(node: Tree[Token]) -> str:
    """The name of an attribute or the type of a block: its first child's token."""
    first = node.children[0]
    while isinstance(first, Tree):
        first = first.children[0]
    return str(first)


def _labels(node: Tree[Token], path: str, line: int) -> tuple[str, ...]:
    labels: list[str] = []
    for child in node.children[1:]:
        if isinstance(child, Token):
            break  # LBRACE
        if child.data == "string":
            value = literal_string(child)
            if value is None:
                raise HclError(f"{path}:{line}: a block label cannot contain a template")
            labels.append(value)
        elif child.data in ("identifier", "keyword", "literal_value"):
            labels.append(_name(child))
        elif child.data != "new_line_or_comment":
            break
    return tuple(labels)


def _body(node: Tree[Token]) -> Tree[Token]:
    for child in node.children:
        if isinstance(child, Tree) and child.data == "body":
            return child
    raise AssertionError("a block without a body")


def _literal(expression: Tree[Token]) -> str | None:
    """The value of a literal string expression, else None."""
    term = expression
    while term.data == "expr_term" and len(term.children) == 1 and isinstance(term.children[0], Tree):
        term = term.children[0]
    return literal_string(term) if term.data == "string" else None


_PROVIDER_REF = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)?")


def _provider_text(expression: Tree[Token], path: str, line_offset: int) -> str:
    """A provider configuration reference: ``aws.east``, or the legacy quoted ``"aws.east"`` Terraform still
    accepts (with a deprecation warning)."""
    quoted = _literal(expression)
    if quoted is not None and _PROVIDER_REF.fullmatch(quoted):
        return quoted
    return _traversal_text(expression, path, line_offset, allow_keys=False)


def _object_values(expression: Tree[Token]) -> Iterator[Tree[Token]]:
    for elem in expression.find_data("object_elem"):
        value = elem.children[-1]
        if isinstance(value, Tree):
            yield value


def _traversal_text(expression: Tree[Token] | Token, path: str, line_offset: int, *, allow_keys: bool) -> str:
    """An address written as a bare traversal (``aws.east``, ``module.a["x"].t.n[0]``), normalised.

    Keys that are not literals render as ``[*]``. Raises HclError for anything that is not a traversal.
    """
    line = (expression.meta.line if isinstance(expression, Tree) and not expression.meta.empty else 0) + line_offset
    parts: list[str] = []

    def fail() -> HclError:
        return HclError(f"{path}:{line}: expected an address such as aws_instance.web or aws.east here")

    def walk(node: Tree[Token] | Token) -> None:
        if isinstance(node, Token):
            raise fail()
        if node.data == "expr_term" and len(node.children) == 1:
            walk(node.children[0])
        elif node.data == "identifier":
            parts.append(_name(node))
        elif node.data == "get_attr_expr_term":
            walk(node.children[0])
            step = node.children[1]
            assert isinstance(step, Tree)
            parts.append("." + _name([c for c in step.children if isinstance(c, Tree)][0]))
        elif node.data == "index_expr_term" and allow_keys:
            walk(node.children[0])
            step = node.children[1]
            assert isinstance(step, Tree)
            parts.append(_key_text(step))
        else:
            raise fail()

    walk(expression)
    return "".join(parts)


def _key_text(step: Tree[Token]) -> str:
    if step.data == "short_index":
        return f"[{step.children[-1]}]"
    values = [c for c in step.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    term = values[0] if values else step
    while term.data == "expr_term" and len(term.children) == 1 and isinstance(term.children[0], Tree):
        term = term.children[0]
    if term.data == "int_lit" and str(term.children[0]).lstrip("-").isdigit():
        return f"[{term.children[0]}]"
    if term.data == "string":
        value = literal_string(term)
        if value is not None:
            return "[" + json.dumps(value, ensure_ascii=False) + "]"
    return "[*]"


