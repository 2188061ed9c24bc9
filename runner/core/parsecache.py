"""The HCL parse cache kept between ``kl`` runs in the data directory (``KL_DATA_DIR/hcl-cache.pickle``).

Entries are keyed by content hash (``analyzer.hcl.ParseCache``), so a stale entry is never used. Any number
of ``kl`` processes may share the file: it is written whole through ``app.atomic`` (unique temporary name,
atomic replace; the last writer's entries win, the others' are parsed again next time), and read as a miss
when it is missing, from another version, truncated or corrupt: the file starts with a magic line and the
SHA-256 of its pickle, checked before anything is unpickled.

A large cache is not rewritten whole for the few files one change edits: the entries added and removed since
it was written go into a small overlay file beside it (``hcl-cache.overlay.pickle``, same framing) that names
the SHA-256 of the cache it extends; it is applied only on top of exactly that cache (otherwise it is a miss),
and the whole cache is written again, the overlay folded in, once the overlay holds more than a fraction of
it. So saving after an edit costs the edit, not the configuration.

Must not: decide what is parsed, or hold entries for contents no configuration file has any more.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.hcl import ParseCache
from app import atomic

__all__ = ["Signature", "cache_path", "load_cache", "overlay_path", "prune_cache", "save_cache", "signature"]

CACHE_NAME = "hcl-cache.pickle"
OVERLAY_NAME = "hcl-cache.overlay.pickle"
# 2: prescans hold footprint_index.FileIndex; 3: no digest memo; 4: a FileIndex's names packed (Declared)
_MAGIC = b"kilolock-parse-cache 4\n"
_OVERLAY_MAGIC = b"kilolock-parse-overlay 4\n"
_DIGEST_SIZE = hashlib.sha256().digest_size
# An overlay is written instead of the whole cache only for a cache of at least this many entries, and only
# while it holds at most this share of the cache's entries.
OVERLAY_MIN_ENTRIES = 256
OVERLAY_MAX_SHARE = 0.1

Signature = tuple[frozenset[str], frozenset[tuple[str, int]], frozenset[str]]


@dataclass(slots=True)
class LoadedCache(ParseCache):
    """A cache read from the data directory: ``base`` is the SHA-256 of the whole-cache file it came from and
    ``base_keys`` that file's entries (before any overlay), so a save can write only what changed since."""

    base: bytes = b""
    base_keys: Signature | None = None


def cache_path(data_dir: Path) -> Path:
    return data_dir / CACHE_NAME


def overlay_path(data_dir: Path) -> Path:
    return data_dir / OVERLAY_NAME


def load_cache(data_dir: Path) -> ParseCache:
    """The parse cache kept between runs, or an empty one when there is none that can be trusted."""
    try:
        data = cache_path(data_dir).read_bytes()
    except OSError:  # missing, or replaced and removed between two steps of another process
        return ParseCache()
    payload, digest = _payload(data, _MAGIC)
    cache = _unpickle(payload) if payload is not None else None
    if not isinstance(cache, ParseCache):
        return ParseCache()
    loaded = LoadedCache(cache.analyses, cache.blocks, cache.prescans, cache.parse_count, base=digest,
                         base_keys=signature(cache))
    _apply_overlay(data_dir, loaded)
    return loaded


def _payload(data: bytes, magic: bytes) -> tuple[bytes | None, bytes]:
    """The framed pickle and its checksum, or None when the frame is truncated or corrupt."""
    header = len(magic) + _DIGEST_SIZE
    if len(data) < header or not data.startswith(magic):
        return None, b""
    payload, digest = data[header:], data[len(magic):header]
    if hashlib.sha256(payload).digest() != digest:
        return None, b""  # truncated or corrupt: the checksum says so before unpickling
    return payload, digest


def _unpickle(payload: bytes) -> Any:
    try:
        return pickle.loads(payload)
    except (pickle.PickleError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return None  # written by another version of Kilolock whose classes differ


def _apply_overlay(data_dir: Path, cache: LoadedCache) -> None:
    """Fold in the overlay written on top of exactly this cache file (any other overlay is ignored)."""
    try:
        data = overlay_path(data_dir).read_bytes()
    except OSError:
        return
    payload, _ = _payload(data, _OVERLAY_MAGIC)
    doc = _unpickle(payload) if payload is not None else None
    if not (isinstance(doc, tuple) and len(doc) == 4 and doc[0] == cache.base and isinstance(doc[1], ParseCache)
            and isinstance(doc[2], tuple) and len(doc[2]) == 3 and isinstance(doc[3], int)):
        return
    added, removed = doc[1], doc[2]
    for table, gone in zip(_tables(cache), removed, strict=True):
        for key in gone:
            table.pop(key, None)
    cache.analyses.update(added.analyses)
    cache.blocks.update(added.blocks)
    cache.prescans.update(added.prescans)
    cache.parse_count = doc[3]


def _tables(cache: ParseCache) -> tuple[dict[Any, Any], dict[Any, Any], dict[Any, Any]]:
    """The cache's three tables (their keys and values differ in type), in the order of a signature."""
    return cache.analyses, cache.blocks, cache.prescans


def signature(cache: ParseCache) -> Signature:
    """Which entries the cache holds (entries are immutable, so equal keys mean equal contents)."""
    return (frozenset(cache.analyses), frozenset(cache.blocks), frozenset(cache.prescans))


def prune_cache(cache: ParseCache, files: Mapping[str, str]) -> None:
    """Keep only entries for the current contents of the files (the cache never grows without bound)."""
    digests = {cache.digest(text) for text in files.values()}
    for key in [k for k in cache.analyses if k not in digests]:
        del cache.analyses[key]
    for key in [k for k in cache.prescans if k not in digests]:
        del cache.prescans[key]
    for block_key in [k for k in cache.blocks if k[0] not in digests]:
        del cache.blocks[block_key]


def save_cache(data_dir: Path, cache: ParseCache, *, loaded: Signature | None = None) -> None:
    """Persist the cache atomically (skipped when nothing changed since ``loaded``, its signature when read):
    as an overlay on the cache file it was read from when that is large and the change small, else whole."""
    if loaded is not None and signature(cache) == loaded:
        return
    if isinstance(cache, LoadedCache) and cache.base_keys is not None and _save_overlay(data_dir, cache):
        return
    whole = ParseCache(cache.analyses, cache.blocks, cache.prescans, cache.parse_count)
    payload = pickle.dumps(whole, protocol=pickle.HIGHEST_PROTOCOL)
    # Not flushed to disk: after a crash a half-written cache fails its checksum and is parsed again.
    atomic.write_bytes(cache_path(data_dir), _MAGIC + hashlib.sha256(payload).digest() + payload, durable=False)
    overlay_path(data_dir).unlink(missing_ok=True)  # it named the cache just replaced: folded in or obsolete


def _save_overlay(data_dir: Path, cache: LoadedCache) -> bool:
    """Write what changed since the cache file ``cache`` was read from as its overlay; False (nothing
    written) when the cache is small or the change is not."""
    assert cache.base_keys is not None
    tables = _tables(cache)
    size = sum(len(keys) for keys in cache.base_keys)
    if size < OVERLAY_MIN_ENTRIES:
        return False
    added = ParseCache({k: v for k, v in cache.analyses.items() if k not in cache.base_keys[0]},
                       {k: v for k, v in cache.blocks.items() if k not in cache.base_keys[1]},
                       {k: v for k, v in cache.prescans.items() if k not in cache.base_keys[2]})
    removed = tuple(frozenset(k for k in keys if k not in table) for keys, table in zip(cache.base_keys, tables,
                                                                                        strict=True))
    changed = len(added.analyses) + len(added.blocks) + len(added.prescans) + sum(len(r) for r in removed)
    if changed > OVERLAY_MAX_SHARE * size:
        return False
    payload = pickle.dumps((cache.base, added, removed, cache.parse_count), protocol=pickle.HIGHEST_PROTOCOL)
    atomic.write_bytes(overlay_path(data_dir), _OVERLAY_MAGIC + hashlib.sha256(payload).digest() + payload,
                       durable=False)
    return True
