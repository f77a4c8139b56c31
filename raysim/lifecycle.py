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
Ray start-up that was interrupted halfway. A guardian killed before the driver is replaced at once.

A run tells the guardian its directory (:func:`watch_run`). A driver that ends without leaving the
guarded block — killed by SIGKILL or the OOM killer, or ended by Ray itself when its raylet was
lost — cannot say what happened; the guardian then prints one ``error:`` line naming the run's
directory and releases the run's lock, if the lock is still the driver's.
"""

from __future__ import annotations

import json
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
DONE = b"done\n"  # the driver's last line to its guardian: it left the guarded block
_guardian: list = []  # the guardian of this process, while a guarded block runs


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
    """Run a block under a guardian process (started again should it die first); on leaving the
    block, end this process's descendants (the guardian excepted) that are still alive."""
    guardian = _Guardian()
    _guardian.append(guardian)
    try:
        yield
    finally:
        _guardian.remove(guardian)
        guardian.close()


class _Guardian:
    """This process's guardian; a guardian that dies (killed) while the block runs is replaced by a new
    one, told what the old one was, so that the driver is never left unguarded."""

    def __init__(self):
        self.told = b""  # the run being watched (see watch_run), told again to a replacement
        self.closing = False
        self.lock = threading.Lock()
        self.process = self._start()
        threading.Thread(target=self._replace_when_gone, name="raysim-guardian", daemon=True).start()

    def tell(self, line: bytes, keep: bool = True) -> None:
        """Write ``line`` to the guardian; ``keep``: tell it to a replacement too."""
        with self.lock:
            if keep:
                self.told = line
            _write(self.process, line)

    def close(self) -> None:
        """End this process's descendants, then tell the guardian that nothing is left for it to do."""
        with self.lock:
            self.closing = True
        end_processes([p for p in psutil.Process().children(recursive=True) if p.pid != self.process.pid])
        _write(self.process, DONE)
        self.process.stdin.close()  # the guardian reads EOF: nothing left for it to end
        self.process.wait()

    def _start(self) -> subprocess.Popen:
        from raysim.import_path import PACKAGES_ROOT

        # started where raysim's packages are: ``-m`` puts the working directory first on the guardian's
        # path, and the user's may hold a module named raysim
        process = subprocess.Popen([sys.executable, "-m", "raysim.lifecycle", str(os.getpid())],
                                   stdin=subprocess.PIPE, start_new_session=True, cwd=PACKAGES_ROOT)
        _write(process, self.told)
        return process

    def _replace_when_gone(self) -> None:
        while True:
            self.process.wait()
            with self.lock:
                if self.closing:
                    return
                self.process = self._start()


def watch_run(run_dir: str, lock: str | None, checkpoint: str | None) -> None:
    """Tell the guardian (if this process runs under one) the directory of the run it starts, and
    the paths of its lock and checkpoint files on a local disk (None elsewhere): see the module."""
    for guardian in _guardian:
        guardian.tell(json.dumps({"dir": run_dir, "lock": lock, "checkpoint": checkpoint}).encode() + b"\n")


def leaving() -> None:
    """Tell the guardian that this process ends on purpose (before ``os._exit``, which skips the
    guarded block's clean-up); it then ends the descendants as usual and reports nothing."""
    for guardian in _guardian:
        guardian.tell(DONE, keep=False)


def _write(process: subprocess.Popen, line: bytes) -> None:
    try:
        process.stdin.write(line)
        process.stdin.flush()
    except (BrokenPipeError, ValueError):  # the guardian is gone, or its pipe closed
        pass


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


class _DriverLines:
    """What the driver wrote on the guardian's stdin: the run it watches, and whether it left on purpose."""

    def __init__(self):
        self.buffer, self.run, self.done = b"", None, False

    def gone(self, timeout: float) -> bool:
        """Read what arrived within ``timeout``; whether stdin (a pipe only the driver holds) reached EOF."""
        ready, _, _ = select.select([sys.stdin], [], [], timeout)
        if not ready:
            return False
        data = os.read(sys.stdin.fileno(), 65536)
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if line + b"\n" == DONE:
                self.done = True
            elif line:
                self.run = json.loads(line)
        return not data


def guard(driver_pid: int) -> None:
    """The guardian's loop: record ``driver_pid``'s descendants until the driver is gone, then
    end those still alive, and their own descendants; report a run the driver left unfinished."""
    try:
        driver = psutil.Process(driver_pid)
    except psutil.NoSuchProcess:  # gone before it started anything
        return
    me, seen, said = os.getpid(), set(), _DriverLines()
    while not said.gone(POLL_SECONDS):
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
    if said.run is not None and not said.done:
        _report_lost_run(driver, said.run)


def _report_lost_run(driver: psutil.Process, run: dict) -> None:
    """One ``error:`` line for a run whose driver ended abruptly; its lock goes if it is still the driver's."""
    lock = run["lock"]
    if lock is not None:
        try:
            with open(lock) as f:
                held = json.load(f)
            if isinstance(held, dict) and (held.get("pid"), held.get("process_started")) == (driver.pid,
                                                                                            driver.create_time()):
                os.remove(lock)
        except (OSError, ValueError):  # gone, or not a lock this guardian can read
            pass
    run_dir, checkpoint = run["dir"], run["checkpoint"]
    go_on = (f"raysim resume {run_dir} goes on from its last checkpoint" if checkpoint is None or
             os.path.exists(checkpoint) else "it took no checkpoint to resume from")
    print(f"error: the run's process (pid {driver.pid}) ended without finishing: it was killed, or Ray ended it "
          f"because its raylet was lost; what it wrote is in {run_dir} ({go_on})", file=sys.stderr, flush=True)


if __name__ == "__main__":
    guard(int(sys.argv[1]))
