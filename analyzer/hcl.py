"""The only importer of python-hcl2: reads what Kilolock needs out of .tf files.

Owns parsing (python-hcl2's raw lark tree, with the garbage collector paused, because the tree's many small
objects make the cyclic collector cost about 3x the parse itself), the content-hash cache of analyses, the
entry points ``analyze_file``/``analyze_block``, the cheap header ``prescan``, and ``find_http_backend``. The
shape of an analysis (``FileAnalysis`` → ``Block`` → ``Reference``/``LocalDef``, with character spans so a
workspace builder can copy blocks verbatim) is defined in ``analyzer.blocks`` and ``analyzer.references`` and
re-exported here: import it from this module.

A block's ``references`` are Terraform's own (see ``analyzer.references``): every reference in the block body
except in the meta-arguments whose values are not references (``provider``/``providers``, ``moved``/``import``
``from``/``to``, ``lifecycle.ignore_changes``, a variable's ``type``, provisioner ``when``/``on_failure``,
a dynamic block's ``iterator``), and nothing from a ``terraform`` block.

Pure: callers hand in file texts; nothing here touches the filesystem. Must not decide footprints.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import hcl2
from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

from analyzer.blocks import Block, FileAnalysis, HclError, LocalDef, Span, implicit_provider, read_blocks
from analyzer.gcpause import gc_paused
from analyzer.prescan import BlockHeader, scan
from analyzer.references import ExpressionReader, Reference, UnreadableExpressionError

__all__ = [
    "Block",
    "BlockHeader",
    "FileAnalysis",
    "HclError",
    "HttpBackend",
    "LocalDef",
    "ParseCache",
    "Reference",
    "Span",
    "analyze_block",
    "analyze_file",
    "content_digest",
    "find_http_backend",
    "implicit_provider",
    "prescan",
    "tfvars_values",
]

@dataclass(slots=True)
class ParseCache:
    """Analyses and prescans keyed by content sha256, in memory; picklable, so a caller may persist it.

    An entry found for a different path is handed back re-labelled with the path asked for.
    """

    analyses: dict[str, FileAnalysis] = field(default_factory=dict)
    blocks: dict[tuple[str, int], Block] = field(default_factory=dict)
    # content sha256 -> the footprint's index of the prescanned text (``analyzer.footprint_index.FileIndex``)
    prescans: dict[str, Any] = field(default_factory=dict)
    parse_count: int = 0  # full or partial parses made through this cache (observability for callers)
    # id(text) -> (text, content_digest(text)), this run's memo so each text is hashed once (not persisted: see
    # digest)
    digests: dict[int, tuple[str, str]] = field(default_factory=dict)

    def digest(self, text: str) -> str:
        """``content_digest(text)``, hashed once per text object for as long as this cache lives in memory. The
        memo is keyed by the object's identity and holds the object, so the key cannot be reused by another
        text while the entry exists, and a text is never hashed a second time to be looked up (``str`` hashes
        its whole content for a dictionary key: the configuration's bytes once more). An edited file, or an
        equal text in another object, is another key and is hashed again."""
        found = self.digests.get(id(text))
        if found is None or found[0] is not text:
            found = self.digests[id(text)] = (text, content_digest(text))
        return found[1]

    def __len__(self) -> int:
        return len(self.analyses) + len(self.blocks)


def content_digest(text: str) -> str:
    """The sha256 hex digest the cache uses for ``text``."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def prescan(path: str, text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The top-level block headers ``(type, labels)`` of a file, found without a full parse.

    Cheap: one regular-expression pass (``analyzer.prescan``). Raises HclError when the scan cannot follow the
    text (an unterminated string or heredoc, a header it cannot read); a full parse then says more.
    """
    result = scan(text)
    if not result.complete:
        raise HclError(f"{path}:1: cannot scan the top-level blocks; parse the file for details")
    return tuple((h.type, h.labels) for h in result.headers)


def analyze_file(path: str, text: str, *, cache: ParseCache | None = None) -> FileAnalysis:
    """Parse one .tf file and describe its top-level blocks; raises HclError (``file:line: …``)."""
    digest = cache.digest(text) if cache is not None else content_digest(text)
    if cache is not None:
        hit = cache.analyses.get(digest)
        if hit is not None:
            return hit if hit.path == path else _relabel(hit, path)
        cache.parse_count += 1
    tree = _parse(path, text)
    blocks = tuple(read_blocks(path, tree, _READER))
    analysis = FileAnalysis(path=path, sha256=digest, blocks=blocks)
    if cache is not None:
        cache.analyses[digest] = analysis
    return analysis


def analyze_block(
    path: str, text: str, header: BlockHeader, *, cache: ParseCache | None = None, digest: str | None = None
) -> Block:
    """Parse only the one top-level block ``header`` (from the prescan) locates; spans and lines are the file's.

    ``digest`` is ``content_digest(text)`` when the caller has it already. Raises HclError when that part of
    the text is not exactly one block of the header's type and labels.
    """
    key = (digest or (cache.digest(text) if cache is not None else content_digest(text)), header.start_pos)
    if cache is not None:
        hit = cache.blocks.get(key)
        if hit is not None:
            return hit if hit.file == path else replace(hit, file=path)
        cache.parse_count += 1
    source = text[header.start_pos : header.end_pos]
    tree = _parse(path, source, line_offset=header.line - 1)
    blocks = list(read_blocks(path, tree, _READER, line_offset=header.line - 1, pos_offset=header.start_pos))
    if len(blocks) != 1 or (blocks[0].type, blocks[0].labels) != (header.type, header.labels):
        raise HclError(f"{path}:{header.line}: the prescan found {header.type} {header.labels!r} here but it "
                       "does not parse as that one block")
    if cache is not None:
        cache.blocks[key] = blocks[0]
    return blocks[0]


# --- parsing --------------------------------------------------------------------------------------------


def _parse(path: str, text: str, *, line_offset: int = 0) -> Tree[Token]:
    # python-hcl2 8.x cannot parse strip markers on interpolations ("${~ x ~}"), which only trim whitespace
    # from the rendered string. Blanking them keeps every offset and every reference the same.
    if "~}" in text or "${~" in text:
        text = text.replace("${~", "${ ").replace("~}", " }")
    if text.startswith("\ufeff"):
        text = " " + text[1:]  # a UTF-8 byte order mark, which Terraform skips; a space keeps every offset
    # Two python-hcl2 grammar gaps: a traversal continued on the next line (``x\n  .attr``, valid inside
    # parentheses) and a newline before ``=>`` in a ``for`` object. The continuation is moved before the line
    # break, which keeps the text's length and line count (Terraform itself validates the original text).
    if "\n" in text:
        text = _CONTINUED.sub(lambda m: m.group(1) + m.group(3) + m.group(2), text)
    try:
        with gc_paused():
            return hcl2.parses_to_tree(text)
    except (UnexpectedCharacters, UnexpectedToken) as exc:
        found = getattr(exc, "token", None) or getattr(exc, "char", "?")
        raise HclError(f"{path}:{exc.line + line_offset}: cannot parse HCL: unexpected {str(found)!r} "
                       f"at column {exc.column}") from exc
    except UnexpectedEOF as exc:
        raise HclError(f"{path}:{text.count(chr(10)) + 1 + line_offset}: cannot parse HCL: the file ends "
                       "inside a block or expression") from exc
    except LarkError as exc:
        raise HclError(f"{path}:{1 + line_offset}: cannot parse HCL: {exc}") from exc
    except RecursionError as exc:
        raise HclError(f"{path}:{1 + line_offset}: cannot parse HCL: an expression is nested too deeply") from exc


_CONTINUED = re.compile(r"([\w\])\"])([ \t]*\n[ \t\n]*)(\.[A-Za-z_][\w-]*|=>)")


def _parse_expression(source: str) -> Tree[Token]:
    """Parse the text of one expression (from inside a heredoc template)."""
    try:
        tree = _parse("<template>", f"x = (\n{source}\n)\n")
    except HclError as exc:
        raise UnreadableExpressionError(f"cannot parse the template expression {source.strip()!r}") from exc
    attribute = next(tree.find_data("attribute"))
    term = attribute.children[-1]
    assert isinstance(term, Tree)
    inner = [c for c in term.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]
    # The expression sits on line 2 of the synthetic text; the reader numbers lines from 1 at its start.
    for node in inner[0].iter_subtrees():
        if not node.meta.empty:
            node.meta.line -= 1
    for token in inner[0].scan_values(lambda v: isinstance(v, Token)):
        if token.line is not None:
            token.line -= 1
    return inner[0]


_READER = ExpressionReader(_parse_expression)


def tfvars_values(name: str, text: str) -> dict[str, str] | None:
    """The values a variable-definitions file sets (name → canonical JSON of the value as written), or None
    when it does not parse. ``.json`` files are read as JSON, others as HCL."""
    text = text.removeprefix("\ufeff")
    try:
        document = json.loads(text) if name.endswith(".json") else hcl2.loads(text)
    except Exception:  # noqa: BLE001 - python-hcl2 raises lark's and its own exceptions alike
        return None
    if not isinstance(document, dict):
        return None
    return {str(k): json.dumps(v, sort_keys=True) for k, v in document.items()}


def _relabel(analysis: FileAnalysis, path: str) -> FileAnalysis:
    return FileAnalysis(path=path, sha256=analysis.sha256,
                        blocks=tuple(replace(block, file=path) for block in analysis.blocks))


# --- the http backend ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpBackend:
    """The literal settings of a ``backend "http"`` block (None where not set)."""

    file: str
    address: str | None
    lock_address: str | None
    unlock_address: str | None
    username: str | None
    password: str | None


def _dict_literal(value: Any) -> str | None:
    """python-hcl2 8.x keeps string literals quoted (``'"x"'``); backend settings must be literals."""
    if value is None:
        return None
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            decoded = json.loads(value)
        except ValueError:
            return value[1:-1]
        return decoded if isinstance(decoded, str) else None
    return str(value)


def find_http_backend(files: Mapping[str, str]) -> HttpBackend | None:
    """The ``backend "http"`` block among the given files (path → text), or None."""
    for path in sorted(files):
        text = files[path]
        if "backend" not in text:
            continue
        try:
            doc = hcl2.loads(text)
        except Exception as exc:  # python-hcl2 raises lark errors of several kinds
            raise HclError(f"{path}: cannot parse HCL ({exc.__class__.__name__})") from exc
        for terraform in doc.get("terraform", []):
            for backend in terraform.get("backend", []):
                for label, body in backend.items():
                    if label.strip('"') != "http" or not isinstance(body, dict):
                        continue
                    return HttpBackend(
                        file=path,
                        address=_dict_literal(body.get("address")),
                        lock_address=_dict_literal(body.get("lock_address")),
                        unlock_address=_dict_literal(body.get("unlock_address")),
                        username=_dict_literal(body.get("username")),
                        password=_dict_literal(body.get("password")),
                    )
    return None
