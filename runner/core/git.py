"""Git, through GitPython: the only module that imports it.

Owns: opening the repository that contains a directory, resolving refs, collecting what changed between
a ref and the working tree (or another ref) as :class:`analyzer.gitdiff.DiffEntry` values, reading a
file's text at a ref, merge bases, and :func:`changed_from`, which feeds all of that to
:func:`analyzer.gitdiff.scope_changes` for ``kl plan --changed-from REF`` and the pull-request bot.

For the pull-request bot it also owns a cache of bare mirrors (:func:`mirror`: clone once, fetch after,
the token kept out of argv and config) and private per-job checkouts (:func:`worktree`).

Must not: decide what a change means for a plan (``analyzer.gitdiff`` does), commit, or fetch into, check
out in, or write the index or working tree of a user's repository (only the bot's own cache is fetched).
The working-tree diff runs against a private copy of the index, so a concurrent ``git`` command never
meets a lock or a changed index; the only trace it can leave is the
empty blob object that ``git add --intent-to-add`` records.
"""

from __future__ import annotations

import base64
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import urlsplit

import git.cmd
from git import Blob, Commit, Diff, Repo
from git.diff import Diffable
from git.exc import CommandError, GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from analyzer.gitdiff import Change, ChangeScope, DiffEntry, scope_changes
from app import atomic
from runner.core import childenv

_popen = git.cmd.safer_popen


def _explicit_popen(*args: Any, env: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
    # GitPython starts every git from a copy of os.environ (plus its own and our GIT_* additions) and has
    # no way to start from less; this is the one place its children are spawned, so the allowlist is
    # applied here: git never sees the worker's KL_* secrets or a provider credential.
    return _popen(*args, env=childenv.for_git(env if env is not None else {}), **kwargs)


git.cmd.safer_popen = _explicit_popen

_CHANGE_KINDS: Final = {
    "A": Change.ADDED,
    "M": Change.MODIFIED,
    "D": Change.DELETED,
    "R": Change.RENAMED,
    "C": Change.COPIED,
    "T": Change.TYPE_CHANGED,
    "U": Change.UNMERGED,
}
_CONFIG_SUFFIXES = (".tf", ".tf.json")
_NO_MODULES: Final[Mapping[str, str]] = MappingProxyType({})
_NO_READERS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType({})
_DEEPEN = "fetch more history (git fetch --unshallow, or fetch-depth: 0 with actions/checkout)"


class GitError(Exception):
    """A git operation failed; the message says what to do next."""


class NotARepositoryError(GitError):
    """The directory is not inside a git working tree; carries the directory."""

    def __init__(self, path: Path, message: str):
        super().__init__(message)
        self.path = path


class UnknownRefError(GitError):
    """A ref does not name a commit in the repository; carries the ref and how to fetch it."""

    def __init__(self, ref: str, hint: str):
        super().__init__(f"unknown git ref {ref!r}: {hint}")
        self.ref = ref
        self.hint = hint


def changed_entries(repo_dir: Path, ref: str, *, against: str | None = None) -> list[DiffEntry]:
    """What changed from ``ref`` to the working tree, or to the commit ``against`` when given.

    The working-tree side includes staged and unstaged changes and untracked files that are not
    ignored (as ``added``). Renames are detected on both sides (git's default 50 % similarity), also
    for an unstaged delete plus an untracked add of similar content, because untracked files join a
    private copy of the index as intent-to-add entries before diffing. For a pull request pass the merge
    base as ``ref`` and the head as ``against`` (see :func:`merge_base`). Raises :class:`GitError`.
    """
    with _open(repo_dir) as repo:
        return _changed_entries(repo, ref, against)


def work_tree_root(path: Path) -> Path | None:
    """The top of the git work tree holding ``path`` (resolved), or None when it is in none."""
    try:
        repo = Repo(path, search_parent_directories=True)
    except (InvalidGitRepositoryError, NoSuchPathError):
        return None
    try:
        return Path(repo.working_tree_dir).resolve() if repo.working_tree_dir else None
    finally:
        repo.close()


def text_at(repo_dir: Path, ref: str, path: str) -> str:
    """The UTF-8 text of the file at repository-relative ``path`` in ``ref`` (``git show REF:path``).

    Raises :class:`GitError` when the path is missing at ``ref``, is not a regular file (a directory, a
    symbolic link or a submodule), or is not UTF-8.
    """
    with _open(repo_dir) as repo, _git_errors(f"reading {path} at {ref}"):
        return _text(_resolve(repo, ref), ref, path)


def merge_base(repo_dir: Path, a: str, b: str) -> str:
    """The commit id of the best common ancestor of ``a`` and ``b`` (what ``a...b`` diffs from)."""
    with _open(repo_dir) as repo:
        with _git_errors(f"finding the merge base of {a} and {b}"):
            bases = repo.merge_base(_resolve(repo, a), _resolve(repo, b))
        commits = [c for c in bases if isinstance(c, Commit)]
        if not commits:
            shallow = " this is a shallow clone:" if _is_shallow(repo) else ""
            raise GitError(f"{a} and {b} have no common ancestor in {_where(repo)};{shallow} {_DEEPEN}")
        return commits[0].hexsha


def changed_from(
    repo_dir: Path,
    config_dir: Path,
    ref: str,
    *,
    against: str | None = None,
    module_sources: Mapping[str, str] = _NO_MODULES,
    file_readers: Mapping[str, tuple[str, ...]] = _NO_READERS,
    is_artifact: Callable[[Path], bool] | None = None,
) -> ChangeScope:
    """The file-scoped plan scope of ``config_dir`` for the changes since ``ref`` (see :func:`changed_entries`).

    ``repo_dir`` may be any directory inside the working tree; a relative ``config_dir`` is taken
    relative to it. The text at ``ref`` of every removed ``.tf``/``.tf.json`` file is collected; one that
    cannot be read (a symbolic link, not UTF-8) is left out, which ``scope_changes`` reports as a failure.
    ``module_sources`` and ``file_readers`` come from the HCL analysis (see ``scope_changes``). On the
    working-tree side (no ``against``), ``is_artifact`` is asked about every added or modified file that is
    not a ``.tf`` file; those it recognises as Kilolock's own (plan files) are passed on as ``artifacts``.
    """
    with _open(repo_dir) as repo:
        relative_dir = _config_dir_in(repo, repo_dir, config_dir)
        entries = _changed_entries(repo, ref, against)
        texts = _removed_texts(repo, ref, entries)
        root = Path(repo.working_tree_dir).resolve() if repo.working_tree_dir else None
    # Only a file inside the configuration directory can change the scope by being recognised (one outside it
    # is unrelated anyway, or claimed by a module or a file() reader, which come first).
    inside = f"{relative_dir}/" if relative_dir else ""
    artifacts = frozenset(
        e.path for e in entries
        if is_artifact is not None and against is None and root is not None and e.change in _PRESENT
        and e.path.startswith(inside) and not e.path.endswith(_CONFIG_SUFFIXES) and is_artifact(root / e.path))
    return scope_changes(entries, config_dir=relative_dir, texts_at_ref=texts, module_sources=module_sources,
                         file_readers=file_readers, artifacts=artifacts)


# The changes after which a path exists on the compared side.
_PRESENT: Final = frozenset({Change.ADDED, Change.MODIFIED, Change.COPIED, Change.RENAMED})


def _removed_texts(repo: Repo, ref: str, entries: list[DiffEntry]) -> dict[str, str]:
    """The text at ``ref`` of every deleted or renamed-away ``.tf``/``.tf.json`` file that has one."""
    texts: dict[str, str] = {}
    with _git_errors(f"reading removed files at {ref}"):
        base = _resolve(repo, ref)
        for entry in entries:
            if entry.change == Change.DELETED:
                removed: str | None = entry.path
            elif entry.change == Change.RENAMED:
                removed = entry.old_path
            else:
                continue
            if removed is None or not removed.endswith(_CONFIG_SUFFIXES):
                continue
            try:
                texts[removed] = _text(base, ref, removed)
            except GitError:
                continue  # scope_changes reports the missing text as a failure
    return texts


def _open(repo_dir: Path) -> Repo:
    try:
        return Repo(repo_dir, search_parent_directories=True)
    except NoSuchPathError:
        raise NotARepositoryError(repo_dir, f"{repo_dir} does not exist") from None
    except InvalidGitRepositoryError:
        raise NotARepositoryError(repo_dir, f"{repo_dir} is not inside a git repository: run kl from a clone of "
                                            "the repository that holds the configuration") from None


@contextmanager
def _git_errors(doing: str) -> Iterator[None]:
    """Turn GitPython's command errors (including a missing ``git`` binary) into :class:`GitError`."""
    try:
        yield
    except CommandError as exc:
        detail = (exc.stderr or "").strip() if isinstance(exc, GitCommandError) else str(exc)
        raise GitError(f"git failed while {doing}: {detail or exc}") from exc


def _where(repo: Repo) -> str:
    return str(repo.working_tree_dir or repo.git_dir)


def _is_shallow(repo: Repo) -> bool:
    return (Path(repo.git_dir) / "shallow").exists()


def _resolve(repo: Repo, ref: str) -> Commit:
    # A ref is never allowed to look like an option: it is passed to git on a command line.
    if not ref or ref.startswith("-"):
        raise UnknownRefError(ref, "a ref is a branch, tag or commit id and cannot be empty or start with '-'")
    try:
        sha = repo.git.rev_parse("--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    except GitCommandError:
        raise UnknownRefError(ref, _fetch_hint(repo, ref)) from None
    return repo.commit(sha)


def _fetch_hint(repo: Repo, ref: str) -> str:
    remotes = [remote.name for remote in repo.remotes]
    head, _, rest = ref.partition("/")
    if head in remotes and rest:
        hint = f"fetch it first: git fetch {head} {rest}"
    elif remotes:
        remote = "origin" if "origin" in remotes else remotes[0]
        hint = f"check the spelling, or fetch it first: git fetch {remote} {ref}"
    else:
        hint = "check the spelling (git branch -a and git tag list what exists); this repository has no remote"
    if _is_shallow(repo):
        hint += f"; this is a shallow clone, so older commits are missing: {_DEEPEN}"
    return f"{hint} (in {_where(repo)})"


def _changed_entries(repo: Repo, ref: str, against: str | None) -> list[DiffEntry]:
    with _git_errors(f"diffing {ref}"):
        base = _resolve(repo, ref)
        if against is not None:
            diffs = list(base.diff(_resolve(repo, against)))
        else:
            diffs = _diff_working_tree(repo, base)
    return [_entry(diff) for diff in diffs]


def _diff_working_tree(repo: Repo, base: Commit) -> list[Diff]:
    """REF against the working tree, by content: a private index is filled from REF's tree (entries with no
    stat data) and every working-tree file is hashed into it, so git's stat cache is never trusted (an edit
    in the same second as the last commit, with the same size, is seen)."""
    if repo.bare or repo.working_tree_dir is None:
        raise GitError(f"{repo.git_dir} is a bare repository with no working tree: compare two refs with against=")
    with tempfile.TemporaryDirectory(prefix="kl-git-index-") as tmp:
        index = Path(tmp) / "index"
        with repo.git.custom_environment(GIT_INDEX_FILE=str(index)):
            repo.git.read_tree(base.hexsha)
            # Every tracked and untracked, non-ignored file is hashed by content (the private index has no
            # stat data to trust); the real index is never touched.
            repo.git.add("--all", "--", ".")
            return list(base.diff(Diffable.INDEX))


def _entry(diff: Diff) -> DiffEntry:
    kind = _CHANGE_KINDS.get(diff.change_type or "")
    old, new = diff.a_path, diff.b_path
    if kind in (Change.RENAMED, Change.COPIED) and old and new:
        return DiffEntry(kind, new, old, diff.score)
    path = (old if kind == Change.DELETED else new) or old or new or ""
    return DiffEntry(kind if kind is not None else f"unknown ({diff.change_type})", path)


def _text(commit: Commit, ref: str, path: str) -> str:
    try:
        item = commit.tree / path
    except KeyError:
        raise GitError(f"{path} does not exist at {ref}") from None
    if not isinstance(item, Blob):
        raise GitError(f"{path} is not a file at {ref}")
    if item.mode == Blob.link_mode:
        raise GitError(f"{path} is a symbolic link at {ref}, not a file")
    data: bytes = item.data_stream.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise GitError(f"{path} is not UTF-8 text at {ref}") from None


def _config_dir_in(repo: Repo, repo_dir: Path, config_dir: Path) -> str:
    """``config_dir`` relative to the repository root, ``/``-separated (``""`` for the root itself)."""
    if repo.working_tree_dir is None:
        if config_dir.is_absolute():
            raise GitError(f"{repo.git_dir} is a bare repository: give the config dir relative to its root")
        relative = config_dir
    else:
        root = Path(repo.working_tree_dir).resolve()
        target = (config_dir if config_dir.is_absolute() else repo_dir / config_dir).resolve()
        try:
            relative = target.relative_to(root)
        except ValueError:
            raise GitError(f"{target} is not inside the repository at {root}: pass the configuration directory "
                           "of a Terraform root module in that repository") from None
    posix = relative.as_posix()
    return "" if posix == "." else posix


# --- The bot's repository cache (appended for the GitHub bot) -------------------------------------------
#
# Workers keep one bare mirror per repository under KL_REPO_CACHE_DIR: cloned once, fetched after, with
# the installation token sent as an HTTP header through the environment (never in argv, the remote URL or
# the mirror's config). Each job checks out the commit it needs into a private worktree and removes it
# afterwards. A file lock next to the mirror serialises clone, fetch and worktree bookkeeping between
# worker processes; jobs on different repositories never wait on each other.

_REPO_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def clone_url(repo: str, *, clone_urls: Mapping[str, str], api_url: str) -> str:
    """Where to clone ``owner/name`` from: the configured URL (``KL_GITHUB_CLONE_URLS``, used by tests
    and mirrors), else the web host of ``api_url`` (github.com, or a GitHub Enterprise Server)."""
    if repo in clone_urls:
        return clone_urls[repo]
    parts = urlsplit(api_url)
    host = "github.com" if parts.netloc in ("api.github.com", "api.github.com:443") else parts.netloc
    return f"{parts.scheme or 'https'}://{host}/{repo}.git"


def mirror(cache_dir: Path, repo: str, url: str, *, token: str | None = None, want: Sequence[str] = (),
           refresh: bool = False) -> Path:
    """The bare mirror of ``repo`` under ``cache_dir``: cloned on first use, fetched when ``refresh`` is
    set or a commit in ``want`` is missing. Raises :class:`GitError` when the clone or fetch fails or a
    wanted commit is still missing afterwards (force-pushed away, or not pushed yet)."""
    if not _REPO_NAME.match(repo) or ".." in repo.split("/"):
        raise GitError(f"{repo!r} is not an owner/name repository")
    owner, name = repo.split("/")
    where = cache_dir / owner / f"{name}.git"
    where.parent.mkdir(parents=True, exist_ok=True)
    with atomic.locked(where.with_name(f"{name}.git.lock")), _auth_env(url, token) as env:
        if not (where / "HEAD").exists():
            shutil.rmtree(where, ignore_errors=True)
            with _git_errors(f"cloning {repo}"):
                Repo.clone_from(url, where, mirror=True, env=env)
        bare = Repo(where)
        try:
            missing = [sha for sha in want if not _has_commit(bare, sha)]
            if refresh or missing:
                with bare.git.custom_environment(**env), _git_errors(f"fetching {repo}"):
                    bare.git.fetch("--prune", "--quiet", url, *_MIRROR_REFSPECS)
            for sha in [s for s in want if not _has_commit(bare, s)]:
                # A commit no ref points at any more (a force-pushed head) can still be fetched by id.
                try:
                    with bare.git.custom_environment(**env):
                        bare.git.fetch("--quiet", url, sha)
                except GitCommandError:
                    pass
                if not _has_commit(bare, sha):
                    raise GitError(f"commit {sha} is not in {repo} after fetching from {_safe_url(url)}: it may "
                                   "have been force-pushed away, or not pushed yet")
        finally:
            bare.close()
    return where


@contextmanager
def worktree(mirror_dir: Path, sha: str) -> Iterator[Path]:
    """A private checkout of ``sha`` from a mirror, removed when the block ends."""
    if not re.fullmatch(r"[0-9a-fA-F]{7,64}", sha):
        raise UnknownRefError(sha, "a job checks out commit ids only")
    base = Path(tempfile.mkdtemp(prefix="kl-checkout-"))
    path = base / f"{mirror_dir.name.removesuffix('.git')}-{sha[:12]}"
    lock = mirror_dir.with_name(mirror_dir.name + ".lock")
    with atomic.locked(lock):
        with Repo(mirror_dir) as bare, _git_errors(f"checking out {sha}"):
            bare.git.worktree("add", "--detach", "--force", str(path), sha)
    try:
        yield path
    finally:
        with atomic.locked(lock):
            with Repo(mirror_dir) as bare:
                try:
                    bare.git.worktree("remove", "--force", str(path))
                except GitCommandError:
                    pass
                shutil.rmtree(base, ignore_errors=True)
                bare.git.worktree("prune")


def resolve_commit(repo_dir: Path, ref: str) -> str:
    """The commit id ``ref`` names. Raises :class:`UnknownRefError`."""
    with _open(repo_dir) as repo:
        return _resolve(repo, ref).hexsha


def is_ancestor(repo_dir: Path, ancestor: str, descendant: str) -> bool:
    """Whether ``ancestor`` is reachable from ``descendant`` (a commit is its own ancestor)."""
    with _open(repo_dir) as repo:
        with _git_errors(f"comparing {ancestor} and {descendant}"):
            return bool(repo.is_ancestor(_resolve(repo, ancestor), _resolve(repo, descendant)))


def parents(repo_dir: Path, sha: str) -> tuple[str, ...]:
    """The parent commit ids of ``sha``, first parent first."""
    with _open(repo_dir) as repo, _git_errors(f"reading {sha}"):
        return tuple(p.hexsha for p in _resolve(repo, sha).parents)


def first_parent_back(repo_dir: Path, sha: str, steps: int) -> str | None:
    """The commit ``steps`` first-parent steps behind ``sha`` (``sha~steps``), or None past the root."""
    with _open(repo_dir) as repo:
        commit = _resolve(repo, sha)
        for _ in range(steps):
            if not commit.parents:
                return None
            commit = commit.parents[0]
        return commit.hexsha


def commit_count(repo_dir: Path, since: str, until: str) -> int:
    """How many commits ``since..until`` holds."""
    with _open(repo_dir) as repo, _git_errors(f"counting {since}..{until}"):
        return int(repo.git.rev_list("--count", f"{_resolve(repo, since).hexsha}..{_resolve(repo, until).hexsha}"))


def changed_paths(repo_dir: Path, ref: str, against: str) -> tuple[str, ...]:
    """Every repository path touched between two commits (both sides of a rename)."""
    found: dict[str, None] = {}
    for entry in changed_entries(repo_dir, ref, against=against):
        if entry.old_path:
            found[entry.old_path] = None
        found[entry.path] = None
    return tuple(found)


def commit_subject(repo_dir: Path, sha: str) -> str:
    with _open(repo_dir) as repo, _git_errors(f"reading {sha}"):
        message = _resolve(repo, sha).message
        text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
        return text.strip().splitlines()[0] if text.strip() else ""


_MIRROR_REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", "+refs/pull/*:refs/pull/*")


def _has_commit(repo: Repo, sha: str) -> bool:
    try:
        repo.git.cat_file("-e", f"{sha}^{{commit}}")
        return True
    except GitCommandError:
        return False


@contextmanager
def _auth_env(url: str, token: str | None) -> Iterator[dict[str, str]]:
    """Environment for git: no prompts, and the token as an Authorization header for http(s) URLs,
    through GIT_CONFIG_* so it appears in no command line, remote URL or config file."""
    env = {"GIT_TERMINAL_PROMPT": "0"}
    if token and url.startswith(("https://", "http://")):
        basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
        env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0="http.extraHeader",
                   GIT_CONFIG_VALUE_0=f"Authorization: Basic {basic}")
    yield env


def _safe_url(url: str) -> str:
    parts = urlsplit(url)
    return url if not parts.password else url.replace(parts.password, "***")
