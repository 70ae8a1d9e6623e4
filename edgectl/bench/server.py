"""One server process per pass: started in its own session, its tree's memory sampled, stopped.

Memory is the PSS of the whole process tree (``edgectl.contract.procmem.tree_mem``): vLLM keeps the
model in a child process, and RSS would count a memory-mapped checkpoint as resident; both
mistakes were made and retracted once (procmem's docstring). The peak is sampled every
``SAMPLE_INTERVAL_S`` by a thread from launch until the harness calls :meth:`stop_sampling`
(at ready), so a load-time spike that has gone by steady state still counts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from edgectl.contract.procmem import TreeMem, tree_mem, tree_pids

SAMPLE_INTERVAL_S = 0.2


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server started as the leader of a new session, so its whole tree can be stopped."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path, cwd: str | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("wb")
        self.t_start = time.perf_counter()
        try:
            self.proc = subprocess.Popen(self.argv, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
        except OSError:
            self._log.close()
            raise
        self.pid = self.proc.pid
        self.peak_pss_bytes = 0
        self.samples = 0
        self._seen_pids: set[int] = {self.pid}
        self._stop_sampler = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, name=f"pss-{self.pid}", daemon=True)
        self._sampler.start()

    # -- memory ---------------------------------------------------------------------------

    def _sample_loop(self) -> None:
        while not self._stop_sampler.is_set():
            try:
                m = tree_mem(self.pid)
                self._seen_pids.update(p.pid for p in m.processes)
                if m.processes:
                    self.samples += 1
                    self.peak_pss_bytes = max(self.peak_pss_bytes, m.pss_bytes)
            except OSError:
                pass  # the tree changed while it was read: the next sample counts
            self._stop_sampler.wait(SAMPLE_INTERVAL_S)

    def stop_sampling(self) -> int:
        """Stop the peak sampler (after one last sample); the peak PSS seen since launch."""
        self._stop_sampler.set()
        self._sampler.join(timeout=10)
        try:
            m = tree_mem(self.pid)
            self.peak_pss_bytes = max(self.peak_pss_bytes, m.pss_bytes)
        except OSError:
            pass
        return self.peak_pss_bytes

    def memory(self) -> TreeMem:
        m = tree_mem(self.pid)
        self._seen_pids.update(p.pid for p in m.processes)
        return m

    # -- life -----------------------------------------------------------------------------

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t_start

    def returncode(self) -> int | None:
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM the session, wait, then SIGKILL whatever is left of the tree; the exit code."""
        self._stop_sampler.set()
        try:
            self._seen_pids.update(tree_pids(self.pid))
        except OSError:
            pass
        if self.proc.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        # vLLM's children can outlive the parent for a moment (or for good after a crash).
        deadline = time.monotonic() + 15
        while True:
            left = [p for p in self._seen_pids if p != self.pid and _alive_in_session(p, self.pid)]
            if not left:
                break
            if time.monotonic() > deadline:
                for p in left:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                break
            time.sleep(0.2)
        _signal_group(self.pid, signal.SIGKILL)  # anything else still in the session
        self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 15) -> list[str]:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if ln.strip()][-lines:]


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive_in_session(pid: int, sid: int) -> bool:
    """Whether ``pid`` still runs in session ``sid`` (a recycled pid in another session does not count)."""
    try:
        return os.getsid(pid) == sid and _state(pid) != "Z"
    except (ProcessLookupError, PermissionError, OSError):
        return False


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "X"
    return stat[stat.rfind(")") + 2:].split()[0]
