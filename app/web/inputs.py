"""The one validated layer between raw HTTP input and the views: bodies, JSON, query arguments, paths.

Every request passes ``check_request`` first (registered by ``init_app``): a path or query argument
with control characters, an over-long query argument, or an encoded slash in a state path is a 400
before any view runs. Bodies are read whole but bounded (``read_body``: 413 when over the limit,
whether or not the client sent a Content-Length; never a truncated body); JSON bodies go through
``analyzer.jsontext.load_json`` (bounded depth, no NUL or lone surrogates, 64-bit integers, finite
numbers) via the app's JSON provider, so ``request.get_json`` everywhere gets the same rules. Query
integers come from ``int_arg``. A parsed document becomes a typed body through ``body_as`` and the
models of ``app.web.bodies`` (``app.wiremodels``: the field's own message on a refusal).

Refusals raise KlErrors, which ``app.web.errors`` turns into the lane's answer; messages name the
offending field and never quote its value.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import re
import threading
from typing import Any, TypeVar

from flask import Flask, Request, Response, current_app, g, request
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge

from analyzer.jsontext import INT64_MAX, JsonInputError, load_json
from app.config import Settings
from app.errors import BadRequestError, BodyCapacityError, InvalidStateNameError
from app.wiremodels import Wire, WireError, parse

W = TypeVar("W", bound=Wire)

# C0 controls, DEL and C1 controls: never part of a name, an ID or a URL we route.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MAX_QUERY_ARG = 4096
_ENCODED_SLASH = re.compile(r"%2f", re.IGNORECASE)
_STATE_PREFIXES = ("/v1/states/", "/v1/state-unlock/", "/v1/engine/states/", "/ui/states/")
BODY_LIMIT = "KL_BODY_LIMIT"
LARGE_BODIES = "kilolock.large_bodies"
# What a client refused for capacity is told to wait before retrying.
CAPACITY_RETRY_SECONDS = 5


class LargeBodies:
    """At most ``slots`` large bodies (``threshold`` bytes or more, or of unknown length) are read and
    processed at once in this process; one more is refused at once (503 + Retry-After) rather than
    queued, so memory stays bounded and no worker thread waits."""

    def __init__(self, *, threshold: int, slots: int) -> None:
        self.threshold = threshold
        self._slots = threading.BoundedSemaphore(slots)

    def enter(self) -> None:
        """Take a slot for the current request (released when the request ends)."""
        if g.get("_large_body"):
            return
        if not self._slots.acquire(blocking=False):
            raise BodyCapacityError(
                "the server is already processing its maximum of large request bodies: retry shortly "
                "(Terraform retries by itself; an operator can raise KL_MAX_LARGE_BODIES)",
                retry_after=CAPACITY_RETRY_SECONDS)
        g._large_body = True

    def after(self, response: Response) -> Response:
        """Leave the memory return of a request that held a slot to when its response closes (after the
        WSGI server sent it): the client does not wait for the collection and the heap trim."""
        if g.get("_large_body") and not g.get("_memory_later"):
            response.call_on_close(_return_memory)
            g._memory_later = True
        return response

    def leave(self, _exc: BaseException | None = None) -> None:
        if g.pop("_large_body", False):
            self._slots.release()
            if not g.pop("_memory_later", False):
                _return_memory()  # no response took it (``after`` did not run): now

    def release(self) -> None:
        """Give back a slot that a response holds until it closes (``slot_until_closed``), and the memory
        its work freed to the system."""
        self._slots.release()
        _return_memory()


def _load_libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


_LIBC = _load_libc()


def _return_memory() -> None:
    """After a large body: collect its cycles and hand freed heap pages back to the system (glibc keeps
    them otherwise, and the worker would stay at its peak size)."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class BoundedRequest(Request):
    """Werkzeug stops reading a body of unknown length at MAX_CONTENT_LENGTH and returns what it read;
    the app sets that one byte past the configured limit, and this request refuses a body longer than
    the limit with 413, so a chunked body is never silently truncated."""

    def get_data(self, cache: bool = True, as_text: bool = False,  # type: ignore[override]
                 parse_form_data: bool = False) -> Any:
        data = super().get_data(cache=cache, as_text=False, parse_form_data=parse_form_data)
        limit = current_app.config.get(BODY_LIMIT)
        if limit is not None and len(data) > int(limit):
            raise RequestEntityTooLarge()
        return data.decode("utf-8", "replace") if as_text else data

    def on_json_loading_failed(self, e: ValueError | None) -> Any:
        """A 400 that says what is wrong with the JSON (Flask's own hides it outside debug mode)."""
        if isinstance(e, JsonInputError):
            raise BadRequest(description=f"the request body is not acceptable JSON: {e}")
        return super().on_json_loading_failed(e)


def read_body() -> bytes | bytearray:
    """The whole request body, at most the configured limit (413 beyond it). With a Content-Length the
    bytes are read into one buffer of that size (no intermediate copies of a large state)."""
    limit = int(current_app.config[BODY_LIMIT])
    length = request.content_length
    if length is not None and length > limit:
        raise RequestEntityTooLarge()
    bodies: LargeBodies = current_app.extensions[LARGE_BODIES]
    if length is None or length >= bodies.threshold:
        bodies.enter()
    if length is None:
        return request.get_data(cache=False)
    buffer = bytearray(length)
    view = memoryview(buffer)
    stream = request.stream
    filled = 0
    while filled < length:
        got = stream.readinto(view[filled:])  # type: ignore[attr-defined]
        if not got:
            break
        filled += got
    view.release()
    if filled < length:
        raise BadRequestError(f"the body ended after {filled} of the {length} bytes its Content-Length announced")
    return buffer


def large_body_slot(size: int) -> None:
    """Take a large-body slot for work on a whole state of about ``size`` bytes that is not a request body
    (a first GET's assembly) when that is a large body: 503 + Retry-After when all are taken, released when
    the request (or its streamed response) ends."""
    bodies: LargeBodies = current_app.extensions[LARGE_BODIES]
    if size >= bodies.threshold:
        bodies.enter()


def slot_until_closed(response: Any) -> None:
    """Keep the request's large-body slot, when it took one, until ``response`` closes rather than until the
    request ends: a first GET's assembly holds its pieces until its cache write, after the body (callbacks
    registered on ``response`` before this one run first)."""
    if not g.pop("_large_body", False):
        return
    bodies: LargeBodies = current_app.extensions[LARGE_BODIES]
    response.call_on_close(bodies.release)


def return_memory_after(response: Any, size: int | None) -> None:
    """Return freed memory to the system once ``response`` closes when it carried a large body that took no
    large-body slot (a GET of stored bytes: they were held twice, by libpq and as the body)."""
    bodies: LargeBodies = current_app.extensions[LARGE_BODIES]
    if size is not None and size >= bodies.threshold and not g.get("_large_body"):
        response.call_on_close(_return_memory)


def json_loads(raw: str | bytes | bytearray) -> Any:
    """The app JSON provider's parser: ``load_json`` with its refusals as ValueError (werkzeug's
    get_json turns them into a 400 with the message)."""
    return load_json(raw)


def json_body(what: str = "request body") -> Any:
    """The request body parsed as bounded JSON, or BadRequestError naming the problem."""
    try:
        return load_json(read_body())
    except JsonInputError as exc:
        raise BadRequestError(f"{what}: {exc}") from None


def body_as(model: type[W], doc: object) -> W:
    """A parsed JSON document as the body ``model`` describes, or BadRequestError with the refused field's
    message."""
    try:
        return parse(model, doc)
    except WireError as exc:
        raise BadRequestError(exc.message) from None


def check_json(raw: bytes | bytearray, what: str) -> bool:
    """Refuse (400) a body that looks like JSON but is not acceptable JSON (too deep, NUL, lone
    surrogates). True when it was JSON; other bodies are left to the caller's own rules."""
    text = raw.strip()
    if not text or text[:1] not in (b"{", b"[", b'"'):
        return False
    try:
        load_json(text)
    except JsonInputError as exc:
        raise BadRequestError(f"{what}: {exc}") from None
    return True


def int_arg(name: str, minimum: int = 0, maximum: int = INT64_MAX) -> int | None:
    """Query argument ``name`` as an integer in [minimum, maximum], None when absent or empty."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    if not re.fullmatch(r"-?[0-9]{1,19}", raw):
        raise BadRequestError(f"query parameter {name} must be a whole number between {minimum} and {maximum}")
    value = int(raw)
    if not minimum <= value <= maximum:
        raise BadRequestError(f"query parameter {name} must be between {minimum} and {maximum}")
    return value


def has_control(text: str) -> bool:
    """True when ``text`` holds a control character (tabs and newlines included)."""
    return _CONTROL.search(text) is not None


def _plain(text: str) -> str:
    return _CONTROL.sub("?", text[:80]).encode("ascii", "backslashreplace").decode()


def check_request() -> None:
    """Refuse paths and query arguments no view could use safely (the app's before_request, right
    after the request id is assigned)."""
    path = request.path
    if _CONTROL.search(path):
        if path.startswith(_STATE_PREFIXES):
            raise InvalidStateNameError(f"the path {_plain(path)!r} holds a control character: state names use "
                                        "A-Z a-z 0-9 . _ - only")
        raise BadRequestError("the request path holds a control character")
    raw_uri = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or ""
    raw_path = raw_uri.split("?", 1)[0]
    if path.startswith(_STATE_PREFIXES) and _ENCODED_SLASH.search(raw_path):
        raise InvalidStateNameError("an encoded slash (%2F) is not a path separator and not part of a state name: "
                                    "use /v1/states/NAME or /v1/states/ws_.../env_.../NAME")
    for key, values in request.args.lists():
        for value in (key, *values):
            if len(value) > MAX_QUERY_ARG:
                raise BadRequestError(f"query parameter {_plain(key)!r} is longer than {MAX_QUERY_ARG} characters")
            if _CONTROL.search(value):
                raise BadRequestError(f"query parameter {_plain(key)!r} holds a control character")


def init_app(app: Flask, settings: Settings) -> None:
    app.request_class = BoundedRequest
    app.config[BODY_LIMIT] = settings.max_body_bytes
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1
    bodies = LargeBodies(threshold=settings.large_body_bytes, slots=settings.max_large_bodies)
    app.extensions[LARGE_BODIES] = bodies
    # Registered first, so it runs after every other after_request function, on the response that is sent.
    app.after_request(bodies.after)
    app.teardown_request(bodies.leave)
