"""Where the server is and who we are, for kl commands that talk to a running server.

Resolution order, first found wins: ``--address``/``--state``/``--token`` flags; ``KL_ADDRESS``,
``KL_STATE``, ``KL_TOKEN``; the ``TF_HTTP_*`` variables Terraform itself reads; the
configuration directory's own ``backend "http"`` block. This and ``app.config`` are the only
modules that read the environment: the client's variables are the rows of :data:`TABLE`, read by
``app.envtable`` into one :class:`ClientSettings` (``docs/configuration.md`` is checked against it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from analyzer.hcl import HclError, find_http_backend
from app.config import DATA_DIR, resolve_data_dir
from app.envtable import Setting, bind, read_table, text, verbatim
from runner.core.workspace import OVERRIDE_NAME


class ClientConfigError(Exception):
    """kl cannot tell which server or state to use; the message says what to set."""


@dataclass(frozen=True, slots=True)
class ClientConfig:
    base_url: str
    state: str | None
    username: str | None
    token: str | None
    token_source: str | None = None  # where the token came from, for error messages


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """The environment as ``kl`` (and a worker's Terraform runs) read it: :data:`TABLE`, once per call."""

    address: str | None = None
    state: str | None = None
    token: str | None = None
    tf_http_address: str | None = None
    tf_http_username: str | None = None
    tf_http_password: str | None = None
    actor: str | None = None
    data_dir: Path | None = None
    terraform_bin: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientSettings:
        values, _ = read_table(TABLE, os.environ if env is None else env)  # no client parser refuses a value
        return cls(**values)


TABLE: tuple[Setting, ...] = bind(ClientSettings, (
    Setting("address", "KL_ADDRESS", text, "the server, or a full backend address (as --address)"),
    Setting("state", "KL_STATE", text, "the state name (as --state)", shown="unset: the address's"),
    Setting("token", "KL_TOKEN", verbatim, "the credential (as --token)"),
    Setting("tf_http_address", "TF_HTTP_ADDRESS", text, "Terraform's own backend address, after KL_ADDRESS"),
    Setting("tf_http_username", "TF_HTTP_USERNAME", verbatim, "Terraform's own backend username"),
    Setting("tf_http_password", "TF_HTTP_PASSWORD", verbatim, "Terraform's own password, after KL_TOKEN"),
    Setting("actor", "KL_ACTOR", verbatim, "who kl apply records as the run's holder", shown="`user@host`"),
    DATA_DIR,
    Setting("terraform_bin", "KL_TERRAFORM_BIN", verbatim, "the Terraform binary kl and workers run"),
))


def split_backend_address(address: str) -> tuple[str, str | None]:
    """``http://h:8080/v1/states/prod`` → (``http://h:8080``, ``prod``); a bare base URL has no state."""
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ClientConfigError(f"address {address!r} must be an http(s) URL")
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    marker = "/v1/states/"
    if marker in path + "/":
        prefix, _, rest = (path + "/").partition(marker)
        return base + prefix, unquote(rest.rstrip("/")) or None
    return base + path, None


def read_configuration(config_dir: Path) -> dict[str, str]:
    """The root module's .tf and .tf.json files, by name (modules are copied whole, not read here)."""
    return read_tf(config_dir)


def read_tf(directory: Path) -> dict[str, str]:
    """The .tf and .tf.json files of one directory (not the workspace's backend override), by name."""
    # One directory listing (``os.scandir`` knows each entry's type without a stat per file).
    with os.scandir(directory) as entries:
        names = sorted(e.name for e in entries if e.name.endswith((".tf", ".tf.json")) and e.name != OVERRIDE_NAME
                       and e.is_file())
    # Read as bytes and decoded once, without a file object per file: the same text as ``read_text(encoding=
    # "utf-8", errors="surrogateescape")``, universal newlines included (``\r\n`` and a lone ``\r`` become ``\n``).
    texts: dict[str, str] = {}
    with _directory_fd(directory) as (base, dir_fd):
        for name in names:
            text = _read_bytes(name if dir_fd is not None else os.path.join(base, name), dir_fd).decode(
                "utf-8", "surrogateescape")
            texts[name] = text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
    return texts


@contextmanager
def _directory_fd(directory: Path) -> Iterator[tuple[str, int | None]]:
    """The directory's path and, where ``os.open`` takes one, a descriptor of it, so each file is opened by its
    name alone (no path joined and walked per file of a large directory)."""
    base = os.fspath(directory)
    if os.open not in os.supports_dir_fd:
        yield base, None
        return
    dir_fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        yield base, dir_fd
    finally:
        os.close(dir_fd)


_CHUNK = 1 << 16


def _read_bytes(path: str, dir_fd: int | None) -> bytes:
    """The whole content of one file, read with plain ``os.read`` calls up to the empty read at its end."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    try:
        data = os.read(fd, _CHUNK)
        if not data:
            return data
        chunks = [data]
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


def read_tf_files(config_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text(errors="replace") for p in sorted(config_dir.glob("*.tf")) if p.is_file()}


def backend_texts(config_dir: Path, texts: Mapping[str, str] | None) -> dict[str, str]:
    """The ``.tf`` files the backend block is looked for in: read from ``config_dir``, or taken from ``texts``
    (its ``.tf`` and ``.tf.json`` files as ``read_configuration`` reads them, so a
    file-scoped command reads every file once) with undecodable bytes replaced as a fresh read would."""
    if texts is None:
        return read_tf_files(config_dir) if config_dir.is_dir() else {}
    # Only texts that contain "backend" can hold the block (``find_http_backend`` skips the others unparsed).
    found = {name: _replaced(text) for name, text in texts.items() if name.endswith(".tf") and "backend" in text}
    override = config_dir / OVERRIDE_NAME  # the one .tf file read_configuration leaves out
    if OVERRIDE_NAME not in texts and override.is_file():
        found[OVERRIDE_NAME] = override.read_text(errors="replace")
    return dict(sorted(found.items()))


def _replaced(text: str) -> str:
    """``text`` read with ``errors="surrogateescape"`` as if read with ``errors="replace"``."""
    if "backend" not in text or text.isascii():  # find_http_backend never parses a file without "backend"
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def resolve(
    *,
    config_dir: Path,
    address: str | None = None,
    state: str | None = None,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    texts: Mapping[str, str] | None = None,
) -> ClientConfig:
    settings = ClientSettings.from_env(env)
    username = settings.tf_http_username
    password, source = None, None
    for value, named in ((token, "--token"), (settings.token, "KL_TOKEN"),
                         (settings.tf_http_password, "TF_HTTP_PASSWORD")):
        if value:
            password, source = value, named
            break
    chosen = address or settings.address or settings.tf_http_address
    if chosen is None or password is None or username is None:
        try:
            block = find_http_backend(backend_texts(config_dir, texts))
        except HclError as exc:
            raise ClientConfigError(str(exc)) from exc
        if block is not None:
            chosen = chosen or block.address
            username = username or block.username
            if password is None and block.password:
                password, source = block.password, f"the backend block's password in {config_dir}"
    if not chosen:
        raise ClientConfigError(
            f"no Kilolock server found: {config_dir} has no backend \"http\" block; "
            "pass --address http://HOST:PORT/v1/states/NAME or set KL_ADDRESS"
        )
    base, state_from_address = split_backend_address(chosen)
    return ClientConfig(
        base_url=base,
        state=state or settings.state or state_from_address,
        username=username,
        token=password,
        token_source=source,
    )


def process_env() -> dict[str, str]:
    """The environment kl passes on to Terraform (read here, once, at the process edge)."""
    return dict(os.environ)


def data_dir(env: Mapping[str, str]) -> Path:
    """Where kl keeps its plugin cache, parse cache and recoverable run states: KL_DATA_DIR or the user
    data folder (the same directory the embedded servers use)."""
    return resolve_data_dir(ClientSettings.from_env(env).data_dir)


def default_actor(env: Mapping[str, str]) -> str:
    import getpass
    import socket

    explicit = ClientSettings.from_env(env).actor
    if explicit:
        return explicit
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "kl"
    return f"{user}@{socket.gethostname()}"
