"""The parse cache in a shared data directory: concurrent writers (processes and threads) never fail and never
leave a file a reader cannot use; a missing, truncated, corrupt or foreign file is a miss, never an error."""

from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import threading
from pathlib import Path

from analyzer.hcl import ParseCache, analyze_file, content_digest
from app import atomic
from runner.core.parsecache import cache_path, load_cache, prune_cache, save_cache, signature


def _texts(writer: int, round_: int) -> dict[str, str]:
    return {f"w{writer}.tf": f'resource "terraform_data" "w{writer}" {{\n  input = "r{round_}"\n}}\n',
            "shared.tf": 'locals {\n  shared = ["a", { k = 1.5 }, null]\n}\n'}


def _hammer(data_dir: str, writer: int, rounds: int) -> None:
    """What one kl process does to the cache: load, parse what is missing, prune to its files, save."""
    where = Path(data_dir)
    for round_ in range(rounds):
        cache = load_cache(where)
        loaded = signature(cache)
        texts = _texts(writer, round_)
        for name, text in texts.items():
            analysis = analyze_file(name, text, cache=cache)
            assert analysis.blocks and analysis.path == name
        prune_cache(cache, texts)
        save_cache(where, cache, loaded=loaded)


def _entries(cache: ParseCache) -> set[str]:
    return {block.address for analysis in cache.analyses.values() for block in analysis.blocks}


def test_eight_processes_saving_one_cache_at_once_all_succeed_and_leave_a_readable_file(tmp_path):
    analyze_file("warm.tf", "locals {}\n")  # the parser is built once, here; forked writers inherit it
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_hammer, args=(str(tmp_path), n, 20)) for n in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert [w.exitcode for w in workers] == [0] * 8
    final = load_cache(tmp_path)
    # The last writer's entries: its own resource and the shared locals, each parsed from its last round.
    found = _entries(final)
    assert "locals" in found and len(found) == 2 and found - {"locals"} <= {
        f"terraform_data.w{n}" for n in range(8)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hcl-cache.pickle"]  # no temporary file left behind


def test_threads_saving_at_once_never_see_a_partial_cache(tmp_path):
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            _hammer(str(tmp_path), n, 20)
        except BaseException as exc:  # noqa: BLE001 - collected and reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert "locals" in _entries(load_cache(tmp_path))


def test_a_missing_truncated_corrupt_or_foreign_cache_is_a_miss(tmp_path):
    assert len(load_cache(tmp_path / "absent")) == 0
    cache = ParseCache()
    analyze_file("a.tf", 'resource "terraform_data" "a" {}\n', cache=cache)
    save_cache(tmp_path, cache)
    good = cache_path(tmp_path).read_bytes()
    assert _entries(load_cache(tmp_path)) == {"terraform_data.a"}
    other = pickle.dumps({"not": "a cache"})
    damaged = {
        "truncated": good[: len(good) // 2],
        "header only": good[:30],
        "empty": b"",
        "a flipped byte": good[:-5] + bytes([good[-5] ^ 0xFF]) + good[-4:],
        "an old bare pickle": pickle.dumps(cache),
        "a checksum that does not match": good[:23] + b"\0" * 32 + good[55:],
        "another object": good[:23] + hashlib.sha256(other).digest() + other,
    }
    for what, data in damaged.items():
        atomic.write_bytes(cache_path(tmp_path), data)
        loaded = load_cache(tmp_path)
        assert isinstance(loaded, ParseCache) and len(loaded) == 0, what
    # Saving replaces whatever was there.
    atomic.write_bytes(cache_path(tmp_path), b"junk")
    save_cache(tmp_path, cache)
    assert _entries(load_cache(tmp_path)) == {"terraform_data.a"}


def test_an_unchanged_cache_is_not_written_again(tmp_path):
    cache = ParseCache()
    analyze_file("a.tf", 'resource "terraform_data" "a" {}\n', cache=cache)
    save_cache(tmp_path, cache)
    before = cache_path(tmp_path).stat().st_mtime_ns
    again = load_cache(tmp_path)
    cache_path(tmp_path).unlink()
    save_cache(tmp_path, again, loaded=signature(again))
    assert not cache_path(tmp_path).exists() and before > 0


def test_each_text_is_hashed_once_and_an_edited_text_again(tmp_path):
    cache = ParseCache()
    text = 'resource "terraform_data" "a" {}\n'
    first = analyze_file("a.tf", text, cache=cache)
    assert cache.digests == {id(text): (text, content_digest(text))} and first.sha256 == content_digest(text)
    assert analyze_file("a.tf", text, cache=cache) is first and cache.parse_count == 1
    edited = text.replace('"a"', '"b"')
    second = analyze_file("a.tf", edited, cache=cache)
    assert second.sha256 == content_digest(edited) != first.sha256
    assert [b.address for b in second.blocks] == ["terraform_data.b"] and cache.parse_count == 2
    # Pruning to the edited file keeps its entry only; the memo is this run's and is not written.
    prune_cache(cache, {"a.tf": edited})
    assert set(cache.analyses) == {content_digest(edited)}
    save_cache(tmp_path, cache)
    loaded = load_cache(tmp_path)
    assert loaded.digests == {} and set(loaded.analyses) == {content_digest(edited)}


def test_the_digest_memo_holds_each_text_object_and_an_equal_text_elsewhere_gets_the_same_digest():
    cache = ParseCache()
    text = "".join(['resource "terraform_data" "a" {', "}\n"])
    twin = "".join(['resource "terraform_data" "a" {', "}\n"])
    assert twin == text and twin is not text
    assert cache.digest(text) == content_digest(text) == cache.digest(twin)
    # One entry per object, each holding its text: an id is never reused while its entry lives.
    assert sorted(cache.digests) == sorted({id(text), id(twin)})
    assert cache.digests[id(text)][0] is text and cache.digests[id(twin)][0] is twin
    assert cache.digest(text.replace('"a"', '"b"')) == content_digest('resource "terraform_data" "b" {}\n')


def test_a_cache_of_the_previous_format_is_a_miss_and_is_written_again(tmp_path):
    cache = ParseCache()
    analyze_file("a.tf", 'resource "terraform_data" "a" {}\n', cache=cache)
    save_cache(tmp_path, cache)
    current = cache_path(tmp_path).read_bytes()
    assert current.startswith(b"kilolock-parse-cache 4\n")
    # The same pickle framed as the earlier version wrote it (a valid checksum under the old magic line).
    atomic.write_bytes(cache_path(tmp_path), b"kilolock-parse-cache 3\n" + current[23:])
    assert len(load_cache(tmp_path)) == 0
    save_cache(tmp_path, cache)
    assert _entries(load_cache(tmp_path)) == {"terraform_data.a"}
