"""The parse cache's overlay: after a small change to a large cache only the change is written, beside the
cache it extends; it is read back exactly, ignored on top of any other cache or when damaged, and folded
into a whole rewrite once the change is large."""

from __future__ import annotations

from pathlib import Path

from analyzer.hcl import ParseCache, analyze_file, content_digest
from app import atomic
from runner.core.parsecache import (
    OVERLAY_MIN_ENTRIES,
    cache_path,
    load_cache,
    overlay_path,
    prune_cache,
    save_cache,
    signature,
)

FILES = OVERLAY_MIN_ENTRIES + 8  # one analysis per file: a cache past the minimum


def _text(i: int, value: str = "v") -> str:
    return (f'resource "terraform_data" "r{i}" {{\n  input = {{ a = [1, null, "{value}-{i}"], "é" = 2.5 }}\n}}\n'
            f'output "o{i}" {{\n  value = terraform_data.r{i}.output\n}}\n')


def _cache_of(texts: dict[str, str], cache: ParseCache | None = None) -> ParseCache:
    cache = cache if cache is not None else ParseCache()
    for name, text in texts.items():
        analyze_file(name, text, cache=cache)
    prune_cache(cache, texts)
    return cache


def _addresses(cache: ParseCache) -> set[str]:
    return {b.address for a in cache.analyses.values() for b in a.blocks}


def _edit(data_dir: Path, texts: dict[str, str], changed: range, value: str) -> tuple[ParseCache, dict[str, str]]:
    cache = load_cache(data_dir)
    loaded = signature(cache)
    texts = {**texts, **{f"f{i}.tf": _text(i, value) for i in changed}}
    _cache_of(texts, cache)
    save_cache(data_dir, cache, loaded=loaded)
    return cache, texts


def test_a_small_change_to_a_large_cache_writes_only_an_overlay_that_reads_back_exactly(tmp_path):
    texts = {f"f{i}.tf": _text(i) for i in range(FILES)}
    save_cache(tmp_path, _cache_of(texts))
    whole = cache_path(tmp_path).read_bytes()
    cache, texts = _edit(tmp_path, texts, range(2), "edited")
    assert cache_path(tmp_path).read_bytes() == whole and overlay_path(tmp_path).is_file()
    assert overlay_path(tmp_path).stat().st_size * 20 < len(whole)
    again = load_cache(tmp_path)
    assert signature(again) == signature(cache)
    assert content_digest(texts["f0.tf"]) in again.analyses and content_digest(_text(0)) not in again.analyses
    assert again.analyses[content_digest(texts["f0.tf"])] == cache.analyses[content_digest(texts["f0.tf"])]
    # A second small change replaces the overlay, still over the same cache file.
    cache, texts = _edit(tmp_path, texts, range(1, 3), "again")
    assert cache_path(tmp_path).read_bytes() == whole
    assert signature(load_cache(tmp_path)) == signature(cache)


def test_an_overlay_on_top_of_another_cache_or_damaged_is_ignored(tmp_path):
    texts = {f"f{i}.tf": _text(i) for i in range(FILES)}
    save_cache(tmp_path, _cache_of(texts))
    _edit(tmp_path, texts, range(1), "edited")
    overlay = overlay_path(tmp_path).read_bytes()
    # Another process rewrote the whole cache (for other contents): the overlay named the old one.
    other = {f"g{i}.tf": _text(i, "other") for i in range(FILES)}
    save_cache(tmp_path, _cache_of(other))
    atomic.write_bytes(overlay_path(tmp_path), overlay)
    assert signature(load_cache(tmp_path)) == signature(_cache_of(other))
    # A truncated or flipped overlay over the right cache is a miss for its entries, never an error.
    save_cache(tmp_path, _cache_of(texts))
    base = signature(load_cache(tmp_path))
    _edit(tmp_path, texts, range(1), "edited")
    good = overlay_path(tmp_path).read_bytes()
    for damaged in (good[: len(good) // 2], good[:-3] + bytes([good[-3] ^ 0xFF]) + good[-2:], b""):
        atomic.write_bytes(overlay_path(tmp_path), damaged)
        assert signature(load_cache(tmp_path)) == base


def test_a_large_change_or_a_small_cache_is_written_whole_and_drops_the_overlay(tmp_path):
    texts = {f"f{i}.tf": _text(i) for i in range(FILES)}
    save_cache(tmp_path, _cache_of(texts))
    _edit(tmp_path, texts, range(1), "edited")
    assert overlay_path(tmp_path).is_file()
    cache, texts = _edit(tmp_path, texts, range(FILES // 2), "many")
    assert not overlay_path(tmp_path).exists()
    assert signature(load_cache(tmp_path)) == signature(cache)
    assert _addresses(load_cache(tmp_path)) == {f"terraform_data.r{i}" for i in range(FILES)} | {
        f"output.o{i}" for i in range(FILES)}
    small = tmp_path / "small"
    save_cache(small, _cache_of({"a.tf": _text(0)}))
    _edit(small, {"a.tf": _text(0)}, range(1), "edited")
    assert sorted(p.name for p in small.iterdir()) == ["hcl-cache.pickle"]
