"""The run's control directory: how an operator talks to a running job (``python -m nlevel.drain``).

A request is a small JSON file dropped into the directory (written to a temporary name,
then renamed, so the job never reads half a file), named ``request-<anything>.json``. The
master looks every ``--control-interval`` seconds (:class:`Inbox`):

1. it *takes* each request by renaming it to ``<name>.taken`` (so a request is read once,
   and never again by a new master that takes over after a death);
2. it reads and checks it (:func:`check`): a file that is not a regular file, is empty,
   over :data:`MAX_BYTES`, not UTF-8 JSON, or a JSON object that is not a drain request
   (unknown keys or action, ranks or count that are not whole numbers, ...) is answered at
   once with an error naming the value;
3. the master acts on a valid request, or refuses it (a rank not in the job, one that runs
   no tasks, a count that would leave no slave);
4. the answer goes to ``<name>.done`` (the request's fields plus ``"result"``: what it did,
   or ``"error"``: why it refused), and the taken request is removed (a directory is
   renamed ``<name>.refused``, never deleted).

A ``<name>.taken`` without its ``.done`` is a request a master took and did not answer (it
died meanwhile): the next master answers it with an error saying so. Nothing here raises
on what an operator put in the directory. The directory is ``<checkpoint>.control`` beside
the checkpoint file. Files only, no MPI.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["MAX_BYTES", "PREFIX", "SUFFIX", "Inbox", "Taken", "answer", "check", "control_dir", "submit",
           "wait_answer"]

SUFFIX = ".control"
PREFIX = "request-"

#: The largest request file read (bytes); a larger one is answered with an error unread.
MAX_BYTES = 64 * 1024
#: Requests taken per look (the rest wait for the next look: a flood cannot stall the master).
MOST_PER_LOOK = 64

_KEYS = ("action", "ranks", "count", "submitted_at")
_ACTIONS = ("drain",)
_DONE, _TAKEN, _REFUSED = ".done", ".taken", ".refused"


def control_dir(checkpoint: str | os.PathLike[str]) -> str:
    """Return the control directory of the run whose checkpoint is ``checkpoint``."""
    return os.fspath(checkpoint) + SUFFIX


# ---------------------------------------------------------------- what a request may say


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shown(x: Any) -> str:
    """A value as the message names it: its JSON-ish repr and, when that could mislead, its type."""
    text = repr(x)
    if len(text) > 60:
        text = text[:57] + "..."
    return text if _whole(x) or x is None else f"{text} ({type(x).__name__})"


def check(request: Any) -> tuple[tuple[int, ...] | None, int | None]:
    """Check an operator's request (a parsed JSON value) without knowing the job.

    A request is ``{"action": "drain", "ranks": [5, 6]}`` or ``{"action": "drain", "count": 2}``
    (``submitted_at``, a number, may come with it). Ranks are whole numbers >= 0, each once;
    a count is a whole number >= 1. Whether the ranks are in the job and run tasks, and
    whether the count leaves a slave, is the master's to say.

    Returns:
        ``(ranks, count)``: one of them None.

    Raises:
        ValueError: naming the value and what was expected.
    """
    if not isinstance(request, dict):
        raise ValueError(f'a request is a JSON object like {{"action": "drain", "count": 2}}, got {_shown(request)}')
    unknown = [k for k in request if k not in _KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (a request has: {', '.join(_KEYS)})")
    action = request.get("action")
    if action not in _ACTIONS:
        raise ValueError(f"action must be {' or '.join(map(repr, _ACTIONS))}, got {_shown(action)}"
                         if "action" in request else "no action (a request has \"action\": \"drain\")")
    at = request.get("submitted_at")
    if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float))):
        raise ValueError(f"submitted_at must be a number (seconds since the epoch), got {_shown(at)}")
    ranks, count = request.get("ranks"), request.get("count")
    if ranks is not None and count is not None:
        raise ValueError(f"give ranks or count, not both (ranks {_shown(ranks)}, count {_shown(count)})")
    if ranks is None and count is None:
        raise ValueError("a drain request names ranks (e.g. [5, 6]) or a count (e.g. 2)")
    if count is not None:
        if not _whole(count) or count < 1:
            raise ValueError(f"count must be a whole number >= 1, got {_shown(count)}")
        return None, count
    if not isinstance(ranks, list):
        raise ValueError(f"ranks must be a list of rank numbers like [5, 6], got {_shown(ranks)}")
    if not ranks:
        raise ValueError("ranks must name at least one rank, got []")
    for r in ranks:
        if not _whole(r) or r < 0:
            raise ValueError(f"ranks must be whole numbers >= 0, got {_shown(r)} in ranks")
    seen: set[int] = set()
    for r in ranks:
        if r in seen:
            raise ValueError(f"rank {r} is named twice in ranks")
        seen.add(r)
    return tuple(ranks), None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice")
        out[k] = v
    return out


def parse(raw: bytes) -> Any:
    """The JSON value of a request file's bytes.

    Raises:
        ValueError: empty, not UTF-8, not JSON (where), a key twice, nested too deeply.
    """
    if not raw.strip():
        raise ValueError("the file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from None
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise ValueError("not a request: JSON nested too deeply") from None
    except ValueError as exc:  # (a key twice; an integer of too many digits)
        raise ValueError(f"not a request: {exc}") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read(path: str) -> bytes:
    """The bytes of the request file ``path``: a regular file (not a link) of at most :data:`MAX_BYTES`.

    Never blocks (a named pipe is refused, not waited on).

    Raises:
        ValueError: why it cannot be a request.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("a symbolic link, not a file (write the request itself into the directory)") from None
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{_kind(st.st_mode)}, not a file")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than a request's {MAX_BYTES}")
        chunks, n = [], 0
        while n <= MAX_BYTES:
            b = os.read(fd, MAX_BYTES + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > MAX_BYTES:
            raise ValueError(f"more than a request's {MAX_BYTES} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the operator's side


def _write(path: str, data: dict[str, Any]) -> None:
    import tempfile  # (only an operator's request or its answer: a farm without one does not pay it)

    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=repr)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def submit(directory: str, request: dict[str, Any]) -> str:
    """Drop ``request`` into ``directory``; return the request's path (its answer appears at ``path + '.done'``).

    Raises:
        ValueError: the request is not one the job accepts (:func:`check`), naming the value.
    """
    check({**request, "submitted_at": 0.0})
    name = f"{PREFIX}{time.time():.6f}-{os.getpid()}.json"
    path = os.path.join(directory, name)
    _write(path, {**request, "submitted_at": time.time()})
    return path


def wait_answer(path: str, timeout: float) -> dict[str, Any] | None:
    """Wait up to ``timeout`` seconds for the answer to the request at ``path``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path + _DONE) as f:
                data = json.load(f)
            if isinstance(data, dict):
                return data
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return None


def answer(path: str, request: Any, **outcome: Any) -> None:
    """Record the job's answer to the request at ``path`` (``path + '.done'``).

    Raises:
        OSError: the answer cannot be written.
    """
    fields = request if isinstance(request, dict) else {}
    _write(path + _DONE, {**fields, **outcome, "answered_at": time.time()})


# ---------------------------------------------------------------- the master's side


@dataclass(frozen=True)
class Taken:
    """A valid request the master took: ``token`` is its path (its answer goes to ``token + '.done'``)."""

    token: str
    ranks: tuple[int, ...] | None
    count: int | None


class Inbox:
    """The master's side of the control directory: take requests, answer them; never raises.

    Args:
        directory: The control directory.
        log: Where a line for the user goes (a request that cannot be answered, ...).
    """

    def __init__(self, directory: str, log: Callable[[str], None]) -> None:
        self.directory = directory
        self.log = log
        self._taken: dict[str, Any] = {}  # token -> the request's JSON (None when unreadable), not yet answered
        self._unsent: dict[str, dict[str, Any]] = {}  # token -> an answer that could not be written yet
        self._stuck: set[str] = set()  # names that cannot be taken or cleared away: not looked at again

    def take(self) -> list[Taken]:
        """The valid requests waiting, oldest first; every other one is answered with an error now."""
        for token, outcome in list(self._unsent.items()):
            self._answer(token, outcome)
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []  # (no directory: nothing was asked)
        present = set(names)
        for n in names:
            if n.endswith(_TAKEN) and n not in self._stuck:
                token = os.path.join(self.directory, n[:-len(_TAKEN)])
                if token in self._taken or token in self._unsent:
                    continue
                if n[:-len(_TAKEN)] + _DONE in present:
                    self._clear(token)  # answered; its master died before clearing it away
                else:  # taken by a master that died before answering it
                    self._answer(token, {"error": "the master that took this request ended before answering it "
                                         "(a new master took over); it may or may not have been acted on: see the "
                                         "run's report or python -m nlevel.status, and submit it again if needed"})
        out: list[Taken] = []
        for n in names:
            if len(out) >= MOST_PER_LOOK:
                break
            if not (n.startswith(PREFIX) and n.endswith(".json")) or n in self._stuck:
                continue
            token = os.path.join(self.directory, n)
            if n + _DONE in present:
                self._clear(token, taken=False)  # (answered before: never acted on twice)
                continue
            try:
                os.rename(token, token + _TAKEN)
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._stuck.add(n)
                self._answer(token, {"error": f"the master cannot take this request ({exc.strerror or exc})"},
                             clear=False)
                continue
            request: Any = None
            try:
                request = parse(read(token + _TAKEN))
                ranks, count = check(request)
            except ValueError as exc:
                self._answer(token, {"error": f"not a valid request: {exc}"}, request)
                continue
            except Exception as exc:  # (anything else an operator's file can cause: answered, never raised)
                self._answer(token, {"error": f"not a valid request: {exc!r}"}, request)
                continue
            self._taken[token] = request
            out.append(Taken(token, ranks, count))
        return out

    def answer(self, token: str, outcome: dict[str, Any]) -> None:
        """Answer the taken request ``token`` (once: a second answer to it is ignored)."""
        if token not in self._taken:
            return
        self._answer(token, outcome, self._taken.pop(token))

    def pending(self) -> list[str]:
        """Requests taken and not answered yet (tokens)."""
        return list(self._taken)

    def _answer(self, token: str, outcome: dict[str, Any], request: Any = None, clear: bool = True) -> None:
        try:
            answer(token, request, **outcome)
        except Exception as exc:  # (a full disk...): tried again at the next look
            if token not in self._unsent:
                self.log(f"cannot write the answer to the operator's request {token}{_DONE} ({exc}); trying again")
            self._unsent[token] = {**(request if isinstance(request, dict) else {}), **outcome}
            return
        self._unsent.pop(token, None)
        if clear:
            self._clear(token)

    def _clear(self, token: str, taken: bool = True) -> None:
        """Remove an answered request (a directory is renamed ``.refused``: what is in it is kept)."""
        path = token + _TAKEN if taken else token
        try:
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                os.rename(path, token + _REFUSED)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._stuck.add(os.path.basename(path))
            self.log(f"cannot clear away the answered request {path} ({exc.strerror or exc}); remove it by hand")
