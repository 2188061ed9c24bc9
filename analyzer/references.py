"""Terraform references in one HCL expression, read from python-hcl2's raw lark tree.

Owns the rules that decide what Terraform counts as a reference (``addrs.ParseRef`` over the traversals
``hclsyntax`` reports from an expression) and how Terraform prints them in a plan's ``configuration``
section (``marshalExpression`` in ``internal/command/jsonconfig/expression.go``):

- A traversal runs from a root name through attribute steps and *literal* index steps (``[0]``, ``["a"]``,
  the legacy ``.0``). A splat (``[*]``, ``.*``) or a non-literal index (``[var.i]``) ends it; what follows is
  not part of the reference, though references inside a non-literal index key are references of their own.
- The referenced object (the *subject*) is found by the root: ``var.x``, ``local.x``, ``count.index``,
  ``each.key``/``each.value``, ``path.*``, ``terraform.*``, ``self``, ``data.T.N[key]``, ``ephemeral.T.N``,
  ``action.T.N``, ``module.N[key]`` (a module call, one of its instances, or with one more attribute one of
  its outputs), ``resource.T.N`` and any other root as a managed resource ``T.N[key]``.
- Names bound by for-expressions, ``%{for}`` directives and ``dynamic`` block iterators are not references.
- Provider functions (``provider::ns::fn``) are not references in plan JSON; they are reported as
  functions, with every other function called.
- Expressions in heredocs, which python-hcl2 keeps as one opaque token, are found by scanning the heredoc
  template here and parsing each ``${…}`` / ``%{…}`` through the parser the caller hands in.

Must not import hcl2 (``analyzer.hcl`` is its only importer) and must not decide what a reference means for a
footprint: it reports references, the footprint module resolves them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from lark import Token, Tree

from analyzer.addresses import quote_hcl_string
from analyzer.prescan import Unterminated, expression_end

__all__ = [
    "ExpressionReader",
    "ParseExpression",
    "Reference",
    "UnreadableExpressionError",
    "decode_string_literal",
    "literal_string",
]

# Parses the text of one expression and returns its tree; raises UnreadableExpressionError when it cannot.
ParseExpression = Callable[[str], Tree[Token]]

_CHAINS = frozenset({"get_attr_expr_term", "index_expr_term", "attr_splat_expr_term", "full_splat_expr_term"})
_SINGLE_ATTR_ROOTS = {"var": "var", "local": "local", "count": "count", "each": "each", "path": "path",
                      "terraform": "terraform"}
_RESOURCE_LIKE_ROOTS = {"data": "data", "ephemeral": "ephemeral", "action": "action", "resource": "resource"}
# Reserved by Terraform for future language features; any reference through them is an error today.
_RESERVED_ROOTS = frozenset({"template", "lazy", "arg", "list"})
_HCL_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
_DIRECTIVE = re.compile(
    r"\s*(?:(?P<kw>if|else|endif|endfor)\b(?P<rest>.*)"
    r"|for\s+(?P<k>[A-Za-z_][\w-]*)(?:\s*,\s*(?P<v>[A-Za-z_][\w-]*))?\s+in\b(?P<coll>.*))",
    re.S,
)


class UnreadableExpressionError(ValueError):
    """A template or expression the extractor cannot read; the footprint fails closed on it."""


@dataclass(frozen=True, slots=True)
class Reference:
    """One reference, as Terraform reports it.

    ``text`` is the whole traversal (the first entry Terraform lists in plan JSON, e.g.
    ``terraform_data.web[0].id``); ``subject`` is the referenceable object Terraform resolves it to
    (``terraform_data.web[0]``, ``module.net.vpc_id``, ``var.m``, ``each.value``, ``self``); ``remaining`` are the
    traversal steps after the subject (``(".id",)``). ``address`` is the configuration object the subject belongs
    to, without instance keys, in the same vocabulary as ``Block.address``: ``terraform_data.web``,
    ``data.aws_ami.x``, ``module.net`` (for a call, an instance or an output), ``var.m``, ``local.x``; for
    ``each``/``count``/``path``/``terraform``/``self`` it is the subject. ``kind`` is one of ``resource``,
    ``data``, ``ephemeral``, ``action``, ``module``, ``var``, ``local``, ``each``, ``count``, ``path``,
    ``terraform``, ``self``, ``invalid`` (Terraform rejects it: ``var`` alone, a bare unknown name, a reserved
    root) and ``unreadable`` (an expression this module cannot read, e.g. a malformed heredoc template).
    ``attribute`` says where in the block it was found: ``input``, ``count``, ``lifecycle.replace_triggered_by``.
    """

    text: str
    subject: str
    kind: str
    line: int
    attribute: str = ""
    remaining: tuple[str, ...] = ()
    address: str = ""

    def plan_references(self) -> tuple[str, ...]:
        """The strings Terraform's plan JSON lists for this one reference, in its order.

        The full traversal, then one trailing step dropped at a time down to the subject; then the un-keyed
        resource for a keyed resource instance, the module call for a keyed module instance and the module
        instance for a module output (``marshalExpression``).
        """
        if self.kind in ("invalid", "unreadable"):
            return ()
        out = [self.subject + "".join(self.remaining[:n]) for n in range(len(self.remaining), 0, -1)]
        out.append(self.subject)
        if self.kind in ("resource", "data", "ephemeral", "action") and self.subject != self.address:
            out.append(self.address)
        elif self.kind == "module" and self.subject != self.address:
            head, dot, _ = self.subject.rpartition(".")
            # module.x["k"] adds module.x; module.x.out and module.x["k"].out add the call instance.
            out.append(self.address if self.subject.endswith("]") else head if dot else self.address)
        return tuple(out)


@dataclass(slots=True)
class _Collector:
    """Where references and function names go while one block is read."""

    attribute: str
    line_offset: int
    references: list[Reference] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)


class ExpressionReader:
    """Collects references and called function names from expression trees.

    ``parse`` re-parses the expressions found inside heredoc templates. ``scope`` names are bound (loop
    variables, dynamic iterators) and therefore not references.
    """

    def __init__(self, parse: ParseExpression) -> None:
        self._parse = parse

    def read(
        self, node: Tree[Token] | Token, *, attribute: str, scope: frozenset[str] = frozenset(), line_offset: int = 0
    ) -> tuple[tuple[Reference, ...], tuple[str, ...]]:
        """References (in Terraform's order, duplicates kept) and function names called in ``node``."""
        out = _Collector(attribute, line_offset)
        self._walk(node, scope, out)
        return tuple(out.references), tuple(out.functions)

    # --- the walk ---------------------------------------------------------------------------------------

    def _walk(self, node: Tree[Token] | Token, scope: frozenset[str], out: _Collector) -> None:
        if isinstance(node, Token):
            return
        kind = node.data
        if kind in _CHAINS or kind == "identifier":
            self._chain(node, scope, out)
        elif kind == "expr_term":
            for child in node.children:
                self._walk(child, scope, out)
        elif kind == "function_call":
            self._function_call(node, scope, out)
        elif kind in ("for_tuple_expr", "for_object_expr"):
            self._for_expr(node, scope, out)
        elif kind == "object_elem":
            self._object_elem(node, scope, out)
        elif kind == "string":
            self._string_parts(node.children, scope, out)
        elif kind in ("heredoc_template", "heredoc_template_trim"):
            token = node.children[0]
            assert isinstance(token, Token)
            self._heredoc(token, scope, out)
        else:
            for child in node.children:
                self._walk(child, scope, out)

    def _function_call(self, node: Tree[Token], scope: frozenset[str], out: _Collector) -> None:
        names = [_token_text(c) for c in node.children if isinstance(c, Tree) and c.data == "identifier"]
        out.functions.append("::".join(names))
        for child in node.children:
            if isinstance(child, Tree) and child.data == "arguments":
                self._walk(child, scope, out)

    def _for_expr(self, node: Tree[Token], scope: frozenset[str], out: _Collector) -> None:
        inner = scope
        for child in node.children:
            if isinstance(child, Tree) and child.data == "for_intro":
                names = [_token_text(c) for c in child.children if isinstance(c, Tree) and c.data == "identifier"]
                for part in child.children:
                    if isinstance(part, Tree) and part.data != "identifier":
                        self._walk(part, scope, out)  # the collection is evaluated outside the loop
                inner = scope | frozenset(names)
            else:
                self._walk(child, inner, out)

    def _object_elem(self, node: Tree[Token], scope: frozenset[str], out: _Collector) -> None:
        key, *rest = node.children
        assert isinstance(key, Tree)
        if not _is_keyword_key(key):
            self._walk(key, scope, out)
        for child in rest:
            self._walk(child, scope, out)

    def _string_parts(self, parts: list[Tree[Token] | Token], scope: frozenset[str], out: _Collector) -> None:
        # Template directives are flat in the tree: a %{for} binds its names until the matching %{endfor}.
        stack: list[frozenset[str]] = [scope]
        for part in parts:
            if not isinstance(part, Tree):
                continue
            inner = part.children[0] if part.data == "string_part" and part.children else part
            if not isinstance(inner, Tree):
                continue
            if inner.data == "template_for_start":
                names = [_token_text(c) for c in inner.children if isinstance(c, Tree) and c.data == "identifier"]
                for child in inner.children:
                    if isinstance(child, Tree) and child.data != "identifier":
                        self._walk(child, stack[-1], out)
                stack.append(stack[-1] | frozenset(names))
            elif inner.data == "template_endfor":
                if len(stack) > 1:
                    stack.pop()
            else:
                self._walk(inner, stack[-1], out)

    def _heredoc(self, token: Token, scope: frozenset[str], out: _Collector) -> None:
        text = str(token)
        first_newline = text.find("\n")
        body = text[first_newline + 1 :]
        line = (token.line or 1) + 1 + out.line_offset
        stack: list[frozenset[str]] = [scope]
        try:
            for kind, source, line_no in _template_sequences(body, line):
                self._template_sequence(kind, source, line_no, stack, out)
        except UnreadableExpressionError as exc:
            out.references.append(Reference(text=str(exc), subject=str(exc), kind="unreadable", line=line,
                                            attribute=out.attribute, address=str(exc)))

    def _template_sequence(
        self, kind: str, source: str, line: int, stack: list[frozenset[str]], out: _Collector
    ) -> None:
        source = source.strip()
        if source.startswith("~"):
            source = source[1:]
        if source.endswith("~"):
            source = source[:-1]
        if kind == "$":
            self._reparsed(source, line, stack[-1], out)
            return
        match = _DIRECTIVE.fullmatch(source)
        if match is None:
            raise UnreadableExpressionError(f"template directive %{{{source}}}")
        if match.group("kw") == "if":
            self._reparsed(match.group("rest"), line, stack[-1], out)
        elif match.group("kw") == "endfor":
            if len(stack) > 1:
                stack.pop()
        elif match.group("coll") is not None:
            self._reparsed(match.group("coll"), line, stack[-1], out)
            names = {match.group("k")} | ({match.group("v")} if match.group("v") else set())
            stack.append(stack[-1] | frozenset(names))

    def _reparsed(self, source: str, line: int, scope: frozenset[str], out: _Collector) -> None:
        tree = self._parse(source)
        saved = out.line_offset
        # The parser numbers lines from 1 at the start of ``source``.
        out.line_offset = line - 1
        try:
            self._walk(tree, scope, out)
        finally:
            out.line_offset = saved

    # --- traversals -------------------------------------------------------------------------------------

    def _chain(self, node: Tree[Token], scope: frozenset[str], out: _Collector) -> None:
        base, steps = _flatten(node)
        live: list[tuple[str, str | int]] | None = None
        root_line = 0
        if base.data == "identifier":
            name = _token_text(base)
            if name not in scope:
                live = [("attr", name)]
                root_line = (base.meta.line if not base.meta.empty else 0) + out.line_offset
        else:
            self._walk(base, scope, out)
        for step in steps:
            kind = step.data
            if kind == "get_attr":
                if live is not None:
                    live.append(("attr", _get_attr_name(step)))
            elif kind in ("short_index", "braces_index"):
                key = _literal_key(step)
                if live is not None and key is not None:
                    live.append(("index", key))
                    continue
                if live is not None:
                    out.references.append(_reference(live, root_line, out.attribute))
                    live = None
                if kind == "braces_index":
                    self._walk(step, scope, out)
            else:  # attr_splat / full_splat: the traversal ends; keys inside the splat may still reference
                if live is not None:
                    out.references.append(_reference(live, root_line, out.attribute))
                    live = None
                for inner in step.children:
                    if isinstance(inner, Tree) and inner.data == "braces_index" and _literal_key(inner) is None:
                        self._walk(inner, scope, out)
        if live is not None:
            out.references.append(_reference(live, root_line, out.attribute))


def _flatten(node: Tree[Token]) -> tuple[Tree[Token], list[Tree[Token]]]:
    """A postfix chain as its base term and its steps, left to right."""
    steps: list[Tree[Token]] = []
    while node.data in _CHAINS:
        base, step = node.children
        assert isinstance(base, Tree) and isinstance(step, Tree)
        steps.append(step)
        node = _unwrap(base)
    steps.reverse()
    return node, steps


def _unwrap(node: Tree[Token]) -> Tree[Token]:
    """The term inside an ``expr_term`` wrapper, unless it is a parenthesised expression (which ends a traversal)."""
    if node.data == "expr_term" and len(node.children) == 1 and isinstance(node.children[0], Tree):
        return node.children[0]
    return node


def _token_text(node: Tree[Token]) -> str:
    for child in node.children:
        if isinstance(child, Token):
            return str(child)
        return _token_text(child)
    return ""


def _get_attr_name(step: Tree[Token]) -> str:
    for child in step.children:
        if isinstance(child, Tree):
            return _token_text(child)
    return ""


def _literal_key(step: Tree[Token]) -> int | str | None:
    """The key of an index step when hclsyntax folds it into the traversal: an integer or a plain string."""
    if step.data == "short_index":
        token = step.children[-1]
        return int(str(token)) if isinstance(token, Token) and str(token).isdigit() else None
    expressions = [c for c in step.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    if len(expressions) != 1:
        return None
    term = _unwrap(expressions[0])
    if term.data == "int_lit":
        text = _token_text(term)
        return int(text) if text.isdigit() else None
    if term.data == "string":
        return literal_string(term)
    return None


def literal_string(node: Tree[Token]) -> str | None:
    """The value of a ``string`` node without interpolations or directives, or None."""
    pieces: list[str] = []
    for part in node.children:
        if isinstance(part, Token):
            continue
        token = part.children[0] if part.children else None
        if not isinstance(token, Token):
            return None
        if token.type == "STRING_CHARS":
            pieces.append(decode_string_literal(str(token)))
        elif token.type in ("ESCAPED_INTERPOLATION", "ESCAPED_DIRECTIVE"):
            pieces.append(str(token)[1:])
        else:
            return None
    return "".join(pieces)


def decode_string_literal(chars: str) -> str:
    """Undo HCL's backslash escapes (``\\n``, ``\\"``, ``\\uXXXX``, ``\\UXXXXXXXX``) in literal string chars."""

    def replace(match: re.Match[str]) -> str:
        short, long, other = match.groups()
        if short or long:
            return chr(int(short or long, 16))
        return _SIMPLE_ESCAPES.get(other, "\\" + other)

    return _HCL_ESCAPE.sub(replace, chars) if "\\" in chars else chars


def _is_keyword_key(key: Tree[Token]) -> bool:
    """Whether an object key is read as a literal name: a bare identifier or keyword (``hcl.ExprAsKeyword``)."""
    children = [c for c in key.children if isinstance(c, Tree)]
    if not children:
        return True
    term = _unwrap(children[0])
    return term.data in ("identifier", "keyword", "literal_value")


def _reference(steps: list[tuple[str, str | int]], line: int, attribute: str) -> Reference:
    """Resolve a traversal to its subject the way ``addrs.ParseRef`` does."""
    root = str(steps[0][1])
    rest = steps[1:]
    text = root + "".join(_render_step(s) for s in rest)

    def invalid() -> Reference:
        return Reference(text=text, subject=text, kind="invalid", line=line, attribute=attribute, address=text)

    def made(kind: str, subject_len: int, address: str) -> Reference:
        subject = root + "".join(_render_subject_step(s) for s in rest[:subject_len])
        remaining = tuple(_render_step(s) for s in rest[subject_len:])
        return Reference(text=text, subject=subject, kind=kind, line=line, attribute=attribute,
                         remaining=remaining, address=address)

    if root in _RESERVED_ROOTS:
        return invalid()
    if root == "self":
        return made("self", 0, "self")
    if root in _SINGLE_ATTR_ROOTS:
        if not rest or rest[0][0] != "attr":
            return invalid()
        subject_address = f"{root}.{rest[0][1]}"
        return made(_SINGLE_ATTR_ROOTS[root], 1, subject_address)
    if root == "module":
        if not rest or rest[0][0] != "attr":
            return invalid()
        call = f"module.{rest[0][1]}"
        n = 1
        if len(rest) > n and rest[n][0] == "index":
            n += 1
        if len(rest) > n and rest[n][0] == "attr":
            n += 1
        return made("module", n, call)
    prefix_len = 0
    kind = "resource"
    address_prefix = ""
    if root in _RESOURCE_LIKE_ROOTS:
        kind = "data" if root == "data" else "ephemeral" if root == "ephemeral" else \
            "action" if root == "action" else "resource"
        address_prefix = "" if root == "resource" else root + "."
        if not rest or rest[0][0] != "attr":
            return invalid()
        type_name = str(rest[0][1])
        prefix_len = 1
    else:
        type_name = root
    if len(rest) <= prefix_len or rest[prefix_len][0] != "attr":
        return invalid()
    address = f"{address_prefix}{type_name}.{rest[prefix_len][1]}"
    n = prefix_len + 1
    if len(rest) > n and rest[n][0] == "index":
        n += 1
    reference = made(kind, n, address)
    if root == "resource":
        # resource.T.N is an alias of T.N: Terraform prints the subject without the prefix.
        subject = reference.subject[len("resource."):]
        return Reference(text=subject + "".join(reference.remaining), subject=subject, kind=kind, line=line,
                         attribute=attribute, remaining=reference.remaining, address=address)
    return reference


def _render_subject_step(step: tuple[str, str | int]) -> str:
    """A step inside a subject: instance keys are quoted as Terraform's ``toHCLQuotedString`` does."""
    kind, value = step
    if kind == "attr":
        return f".{value}"
    return f"[{value}]" if isinstance(value, int) else f"[{quote_hcl_string(value)}]"


def _render_step(step: tuple[str, str | int]) -> str:
    """A step after the subject, as ``traversalStr`` prints it (Go's ``%q`` for string keys)."""
    kind, value = step
    if kind == "attr":
        return f".{value}"
    return f"[{value}]" if isinstance(value, int) else f"[{json.dumps(value, ensure_ascii=False)}]"


def _template_sequences(body: str, first_line: int) -> Iterator[tuple[str, str, int]]:
    """The ``${…}`` (kind ``$``) and ``%{…}`` (kind ``%``) sequences of a template, with their line numbers.

    ``$${`` and ``%%{`` are escapes, not sequences. Raises UnreadableExpressionError for an unterminated one.
    """
    pos = 0
    length = len(body)
    while True:
        start = _next_sequence(body, pos)
        if start < 0:
            return
        end = _sequence_end(body, start + 2)
        line = first_line + body.count("\n", 0, start)
        yield body[start], body[start + 2 : end], line
        pos = end + 1
        if pos >= length:
            return


def _next_sequence(body: str, pos: int) -> int:
    while True:
        dollar = body.find("${", pos)
        percent = body.find("%{", pos)
        candidates = [i for i in (dollar, percent) if i >= 0]
        if not candidates:
            return -1
        start = min(candidates)
        if start > 0 and body[start - 1] == body[start]:
            # $${ and %%{ are escapes, unless the introducer before them is itself escaped.
            run = start - 1
            while run > 0 and body[run - 1] == body[start]:
                run -= 1
            if (start - run) % 2 == 1:
                pos = start + 2
                continue
        return start


def _sequence_end(body: str, pos: int) -> int:
    """The index of the ``}`` closing a sequence whose expression starts at ``pos`` (the scan is
    ``analyzer.prescan``'s, so a template is read here as the block scan reads it)."""
    try:
        return expression_end(body, pos) - 1
    except Unterminated as exc:
        if exc.what == "string":
            raise UnreadableExpressionError(
                f"unterminated string in template {body[exc.start - 1 : exc.start + 40]!r}") from None
        raise UnreadableExpressionError(
            f"unterminated template sequence {body[exc.start - 2 : exc.start + 40]!r}") from None
