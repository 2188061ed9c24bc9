"""The HCL parse cache kept between ``kl`` runs in the data directory (``KL_DATA_DIR/hcl-cache.pickle``).

Entries are keyed by content hash (``analyzer.hcl.ParseCache``), so a stale entry is never used. Any number
of ``kl`` processes may share the file: it is written whole through ``app.atomic`` (unique temporary name,
atomic replace; the last writer's entries win, the others' are parsed again next time), and read as a miss
when it is missing, from another version, truncated or corrupt: the file starts with a magic line and the
SHA-256 of its pickle, checked before anything is unpickled.

Must not: decide what is parsed, or hold entries for contents no configuration file has any more.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping
from pathlib import Path

from analyzer.hcl import ParseCache, content_digest
from app import atomic

__all__ = ["Signature", "cache_path", "load_cache", "prune_cache", "save_cache", "signature"]

CACHE_NAME = "hcl-cache.pickle"
_MAGIC = b"kilolock-parse-cache 1\n"
_DIGEST_SIZE = hashlib.sha256().digest_size

Signature = tuple[frozenset[str], frozenset[tuple[str, int]], frozenset[str]]


def cache_path(data_dir: Path) -> Path:
    return data_dir / CACHE_NAME


def load_cache(data_dir: Path) -> ParseCache:
    """The parse cache kept between runs, or an empty one when there is none that can be trusted."""
    try:
        data = cache_path(data_dir).read_bytes()
    except OSError:  # missing, or replaced and removed between two steps of another process
        return ParseCache()
    return _decode(data)


def _decode(data: bytes) -> ParseCache:
    header = len(_MAGIC) + _DIGEST_SIZE
    if len(data) < header or not data.startswith(_MAGIC):
        return ParseCache()
    payload = data[header:]
    if hashlib.sha256(payload).digest() != data[len(_MAGIC):header]:
        return ParseCache()  # truncated or corrupt: the checksum says so before unpickling
    try:
        cache = pickle.loads(payload)
    except (pickle.PickleError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return ParseCache()  # written by another version of Kilolock whose classes differ
    return cache if isinstance(cache, ParseCache) else ParseCache()


def signature(cache: ParseCache) -> Signature:
    """Which entries the cache holds (entries are immutable, so equal keys mean equal contents)."""
    return (frozenset(cache.analyses), frozenset(cache.blocks), frozenset(cache.prescans))


def prune_cache(cache: ParseCache, files: Mapping[str, str]) -> None:
    """Keep only entries for the current contents of the files (the cache never grows without bound)."""
    digests = {content_digest(text) for text in files.values()}
    for key in [k for k in cache.analyses if k not in digests]:
        del cache.analyses[key]
    for key in [k for k in cache.prescans if k not in digests]:
        del cache.prescans[key]
    for block_key in [k for k in cache.blocks if k[0] not in digests]:
        del cache.blocks[block_key]


def save_cache(data_dir: Path, cache: ParseCache, *, loaded: Signature | None = None) -> None:
    """Persist the cache atomically (skipped when nothing changed since ``loaded``, its signature when read)."""
    if loaded is not None and signature(cache) == loaded:
        return
    payload = pickle.dumps(cache, protocol=pickle.HIGHEST_PROTOCOL)
    # Not flushed to disk: after a crash a half-written cache fails its checksum and is parsed again.
    atomic.write_bytes(cache_path(data_dir), _MAGIC + hashlib.sha256(payload).digest() + payload, durable=False)
