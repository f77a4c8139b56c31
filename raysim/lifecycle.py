"""How a run's driver process ends: signals, and a guardian that ends what the driver leaves behind.

SIGTERM stops a run as Ctrl-C does (:class:`Terminated` is a KeyboardInterrupt); the first
SIGINT or SIGTERM raises, later ones only print ``stopping…`` so that the clean-up finishes. A
run started by a sweep gets SIGTERM when the sweep's process ends (:func:`end_with_parent`).

The guardian (:func:`guarded`) is a small process (standard library and psutil only) started
before Ray: it records the driver's descendants as they appear (Ray's daemons, and the
DashboardAgent and RuntimeEnvAgent that the raylet starts) and, once the driver is gone — even
killed by SIGKILL — ends those still alive (same pid and create time): SIGTERM, then SIGKILL
after a grace period. It never touches a process it did not see descend from the driver. On
leaving the guarded block the driver itself ends its remaining descendants, which covers a
Ray start-up that was interrupted halfway.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager

import psutil

POLL_SECONDS = 0.25  # how often the guardian records the driver's descendants
GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL
END_WITH_PARENT = "RAYSIM_END_WITH_PARENT"  # the parent's pid, in a child's environment: see end_with_parent
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that started it ends


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the run stops as on Ctrl-C; the command exits with status 143."""

    EXIT_STATUS = 128 + signal.SIGTERM


_stopped_by: list = []  # the first SIGINT or SIGTERM handled


def terminated() -> bool:
    """Whether a SIGTERM (rather than a SIGINT) stopped this process. Ask this rather than catch
    :class:`Terminated`: an exception raised by a signal handler while Ray waits reaches the
    caller as a plain KeyboardInterrupt (Ray's ``check_signals`` in ``_raylet.pyx``)."""
    return _stopped_by[:1] == [signal.SIGTERM]


def handle_signals() -> None:
    """From now on the first SIGINT raises KeyboardInterrupt and the first SIGTERM
    :class:`Terminated`; later ones print one ``stopping…`` line and are ignored. (Outside the
    main thread, where Python cannot set handlers, nothing changes.)"""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _first_signal)


def _first_signal(signum, frame):
    _stopped_by.append(signum)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _later_signal)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _later_signal(signum, frame):
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    print("stopping…", file=sys.stderr, flush=True)


def end_with_parent() -> None:
    """In a process started with :data:`END_WITH_PARENT` set to its parent's pid (a sweep's point),
    have Linux send it SIGTERM when that parent ends, even by SIGKILL, so that the process stops as
    on Ctrl-C instead of running on alone; at once if the parent has already gone. The variable is
    removed, so this process's own children do not see it. Elsewhere than Linux, nothing."""
    parent = os.environ.pop(END_WITH_PARENT, None)
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # it ended before the request: nobody would send the signal
        os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def guarded():
    """Run a block under a guardian process; on leaving it, end this process's descendants
    (the guardian excepted) that are still alive."""
    from raysim.import_path import PACKAGES_ROOT

    # started where raysim's packages are: ``-m`` puts the working directory first on the guardian's
    # path, and the user's may hold a module named raysim
    guardian = subprocess.Popen([sys.executable, "-m", "raysim.lifecycle", str(os.getpid())],
                                stdin=subprocess.PIPE, start_new_session=True, cwd=PACKAGES_ROOT)
    try:
        yield
    finally:
        end_processes([p for p in psutil.Process().children(recursive=True) if p.pid != guardian.pid])
        guardian.stdin.close()  # the guardian reads EOF: nothing left for it to end
        guardian.wait()


def end_processes(processes: list) -> None:
    """SIGTERM each process still alive, SIGKILL those left after :data:`GRACE_SECONDS`
    (psutil checks the create time, so a reused pid is never signalled)."""
    for signal_them in (psutil.Process.terminate, psutil.Process.kill):
        for p in processes:
            try:
                signal_them(p)
            except psutil.Error:  # gone already, or not ours to signal
                pass
        _, processes = psutil.wait_procs(processes, timeout=GRACE_SECONDS)
        if not processes:
            return


def _driver_gone(timeout: float) -> bool:
    """Whether stdin (a pipe only the driver writes to, and never does) reached EOF."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and not os.read(sys.stdin.fileno(), 4096)


def guard(driver_pid: int) -> None:
    """The guardian's loop: record ``driver_pid``'s descendants until the driver is gone, then
    end those still alive, and their own descendants."""
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:  # gone before it started anything
        return
    me, seen = os.getpid(), set()
    while not _driver_gone(POLL_SECONDS):
        try:
            seen.update(p for p in driver.children(recursive=True) if p.pid != me)
        except psutil.NoSuchProcess:
            break
    alive = [p for p in seen if p.is_running()]
    for p in list(alive):
        try:
            alive += p.children(recursive=True)
        except psutil.Error:
            pass
    end_processes(list(set(alive)))


if __name__ == "__main__":
    guard(int(sys.argv[1]))
