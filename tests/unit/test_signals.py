"""SIGUSR1 (issue 34): heard while the main thread is in a long C call; a farm's stop is its own; threads."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import pytest

from nlevel.errors import ConfigError
from nlevel.runtime import signals


@pytest.fixture
def fresh_signals(monkeypatch):
    """The module as in a new process; SIGUSR1's handler and Python's wake-up fd put back after the test."""
    handler = signal.getsignal(signal.SIGUSR1)
    wake = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wake)
    for name, value in (("_installed", False), ("_wake_read", -1), ("_looked", 0.0)):
        if hasattr(signals, name):
            monkeypatch.setattr(signals, name, value)
    monkeypatch.setattr(signals, "_flag", threading.Event())
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, handler)
        signal.set_wakeup_fd(wake)


def _c_call(seconds: float) -> None:
    """A busy loop in C that releases the GIL and never looks at signals (for about ``seconds``)."""
    t0 = time.perf_counter()
    hashlib.pbkdf2_hmac("sha256", b"x", b"salt", 20_000)
    per = max((time.perf_counter() - t0) / 20_000, 1e-8)
    hashlib.pbkdf2_hmac("sha256", b"x", b"salt", int(seconds / per))


@pytest.mark.timeout(60)
def test_a_sigusr1_is_heard_within_a_second_while_the_main_thread_is_in_a_long_c_call(fresh_signals):
    """The master's server thread asks ``requested()``; its main thread runs the user's task in C.
    Before: Python ran the handler only when the C call returned."""
    assert signals.install()
    seen: dict[str, float] = {}

    def server() -> None:  # (the master's server thread, asking every few milliseconds)
        time.sleep(0.5)
        seen["sent"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        while not signals.requested() and time.monotonic() - seen["sent"] < 30:
            time.sleep(0.005)
        seen["heard"] = time.monotonic()

    t = threading.Thread(target=server)
    t.start()
    _c_call(3.0)  # (the main thread: a task in C)
    returned = time.monotonic()
    t.join()
    assert seen["heard"] - seen["sent"] < 1.0, (seen["heard"] - seen["sent"], returned - seen["sent"])
    assert seen["heard"] < returned  # heard while the C call still ran


def test_a_farms_stop_is_forgotten_at_its_end_and_one_between_farms_stops_the_next(fresh_signals):
    assert signals.install()
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)
    assert signals.requested()
    signals.reset()  # (a farm's end)
    assert not signals.requested()
    os.kill(os.getpid(), signal.SIGUSR1)  # between two farms
    time.sleep(0.05)
    assert signals.requested()


def test_a_farm_made_off_the_main_thread_refuses_when_sigusr1_would_kill_the_process(fresh_signals):
    errors: list[BaseException] = []

    def make() -> None:
        try:
            signals.check_thread()
        except ConfigError as exc:
            errors.append(exc)

    t = threading.Thread(target=make, name="worker-7")
    t.start()
    t.join()
    [error] = errors
    assert "thread 'worker-7'" in str(error) and "install_signal_handler()" in str(error)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    # Installed from the main thread first (the remedy), a farm in a thread is fine and hears SIGUSR1.
    import nlevel

    assert nlevel.install_signal_handler()
    t = threading.Thread(target=make)
    t.start()
    t.join()
    assert len(errors) == 1
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)
    assert signals.requested()


def test_a_program_that_chose_its_own_sigusr1_action_may_make_farms_in_threads(fresh_signals):
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    errors: list[BaseException] = []

    def make() -> None:
        try:
            signals.check_thread()
        except ConfigError as exc:
            errors.append(exc)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    assert errors == [] and signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
