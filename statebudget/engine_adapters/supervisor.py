"""Engine processes under supervision: start, health, restart after a crash, stop.

An engine server given by a command template (`vllm serve … --port ${PORT}`, as llama-swap's
`cmd`) is a process this adapter owns. The planner's ops drive its life: a promote of the model's
weights from disk onto its GPU group starts it (a fresh server loads its weights: a cold start), a
drop or a demote to disk stops it (all its GPU memory comes free), sleep and wake go through the
engine's own routes. A process that exits while it is wanted is started again, with a back-off
(1 s doubling to 30 s); the adapter's health probe then sees the engine come back and sends the
planner its inventory (`engine restarted`), which is what a restarted engine holds.

Commands are split like a shell line (`shlex`), after dropping `#` comment lines and joining
lines (a YAML `|` block); `${PORT}` is replaced by the engine's port. The process gets the
adapter's environment plus the engine's `env`, and its output goes to `<log_dir>/<name>.log`.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

log = logging.getLogger("statebudget.adapter.supervisor")
BACKOFF_S, BACKOFF_MAX_S = 1.0, 30.0


def command_argv(cmd: str, port: int) -> list[str]:
    """The argv of a command template: comment lines dropped, lines joined, `${PORT}` replaced."""
    lines = [ln.rstrip().removesuffix("\\") for ln in cmd.splitlines() if not ln.strip().startswith("#")]
    argv = shlex.split(" ".join(lines).replace("${PORT}", str(port)))
    if not argv:
        raise ValueError(f"empty command: {cmd!r}")
    return argv


@dataclass
class Managed:
    name: str                 # "coder@gpu:0"
    cmd: str
    url: str                  # http://127.0.0.1:PORT
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    wanted: bool = False      # the planner wants it up: an exit is a crash
    asleep: bool = False      # slept by the adapter: a crash now loses its weights in DRAM
    restarts: int = 0
    next_try_s: float = 0.0
    backoff_s: float = BACKOFF_S

    @property
    def port(self) -> int:
        return urlsplit(self.url).port


class Supervisor:
    def __init__(self, engines: dict[str, tuple[str, str, dict]], log_dir: str | Path | None = None,
                 health_path: str = "/health", clock=time.monotonic):
        """`engines`: name ("MODEL@gpu:I") -> (command template, local URL with its port, extra
        environment)."""
        self.engines = {n: Managed(n, cmd, url.rstrip("/"), dict(env)) for n, (cmd, url, env) in engines.items()}
        self.by_url = {m.url: m for m in self.engines.values()}
        self.log_dir = Path(log_dir) if log_dir else None
        self.health_path, self.clock = health_path, clock
        self.http = httpx.Client(timeout=2.0)
        for m in self.engines.values():
            command_argv(m.cmd, m.port)  # a bad template fails at start, not at its first op

    def supervises(self, url: str) -> bool:
        return url.rstrip("/") in self.by_url

    def running(self, url: str) -> bool:
        m = self.by_url[url.rstrip("/")]
        return m.proc is not None and m.proc.poll() is None

    def start(self, url: str, budget_s: float) -> None:
        """Start the engine at `url` (if it is not running) and wait until it answers its health
        check, at most `budget_s`; raises TimeoutError (the process is left running) or
        RuntimeError (it exited)."""
        m = self.by_url[url.rstrip("/")]
        m.wanted, m.asleep = True, False
        if not self.running(url):
            self._spawn(m)
        self._wait_healthy(m, budget_s)

    def stop(self, url: str, grace_s: float = 10.0) -> None:
        """Stop the engine: SIGTERM, then SIGKILL after `grace_s`. Not wanted any more."""
        m = self.by_url[url.rstrip("/")]
        m.wanted = m.asleep = False
        if m.proc is None or m.proc.poll() is not None:
            return
        self._signal(m, signal.SIGTERM)
        try:
            m.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self._signal(m, signal.SIGKILL)
            m.proc.wait(grace_s)
        log.info("engine %s stopped", m.name)

    def check(self, budget_s: float = 300.0) -> list[str]:
        """Each wanted engine whose process exited: started again (after its back-off) and waited
        for, at most `budget_s`, so that the inventory the adapter sends next holds it; one that
        crashed asleep is not (a fresh server would load its weights onto GPUs the planner gave
        away): it is no longer wanted, and its weights in DRAM are lost. The URLs of the engines
        that crashed, for the adapter to forget what it knew of them and send its inventory."""
        out, now = [], self.clock()
        for m in self.engines.values():
            if not m.wanted or (m.proc is not None and m.proc.poll() is None) or now < m.next_try_s:
                continue
            code = m.proc.returncode if m.proc is not None else None
            out.append(m.url)
            if m.asleep:
                log.warning("engine %s exited (code %s) asleep: its weights in DRAM are lost", m.name, code)
                m.wanted = m.asleep = False
                continue
            log.warning("engine %s exited (code %s) while wanted: starting it again (restart %d)", m.name, code,
                        m.restarts + 1)
            m.restarts += 1
            m.next_try_s = now + m.backoff_s
            m.backoff_s = min(m.backoff_s * 2, BACKOFF_MAX_S)
            try:
                self._spawn(m)
                self._wait_healthy(m, budget_s)
            except (RuntimeError, TimeoutError) as e:
                log.error("engine %s did not come back: %s", m.name, e)
        return out

    def slept(self, url: str, asleep: bool) -> None:
        """The adapter put the engine to sleep (or woke it)."""
        self.by_url[url.rstrip("/")].asleep = asleep

    def close(self) -> None:
        for m in self.engines.values():
            self.stop(m.url)
        self.http.close()

    def status(self) -> dict:
        return {m.name: {"url": m.url, "pid": m.proc.pid if m.proc is not None else None,
                         "running": m.proc is not None and m.proc.poll() is None, "wanted": m.wanted,
                         "restarts": m.restarts} for m in self.engines.values()}

    def _spawn(self, m: Managed) -> None:
        argv = command_argv(m.cmd, m.port)
        out = subprocess.DEVNULL
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            out = open(self.log_dir / (m.name.replace("@", "_").replace(":", "").replace(",", "-") + ".log"), "ab")
        try:
            m.proc = subprocess.Popen(argv, env={**os.environ, **m.env}, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)  # a signal to the adapter's group spares it
        except OSError as e:
            raise RuntimeError(f"engine {m.name}: cannot start {argv[0]!r}: {e.strerror}") from None
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        log.info("engine %s started: pid %d, port %d", m.name, m.proc.pid, m.port)

    def _wait_healthy(self, m: Managed, budget_s: float) -> None:
        """Until its health check answers 200 (a starting process: nothing to wait on but its
        port); RuntimeError if it exits first, TimeoutError past `budget_s`."""
        from .http import PollTimeout, poll_until

        def healthy() -> bool:
            if m.proc.poll() is not None:
                raise RuntimeError(f"engine {m.name} exited with code {m.proc.returncode} before it was healthy")
            try:
                return self.http.get(m.url + self.health_path).status_code == 200
            except httpx.HTTPError:
                return False
        try:
            poll_until(healthy, budget_s, 0.05, f"engine {m.name} to be healthy")
        except PollTimeout as e:
            raise TimeoutError(str(e)) from None
        m.backoff_s = BACKOFF_S  # healthy again: the next crash starts from the short back-off

    @staticmethod
    def _signal(m: Managed, sig: int) -> None:
        """To the engine's whole process group (its own session): tensor-parallel workers and the
        processes a wrapper (`sh -c`, `docker run`) starts go with it."""
        try:
            os.killpg(m.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self, url: str) -> int:
        """SIGKILL the engine's process group, as a crash would (for drills and tests); its pid."""
        m = self.by_url[url.rstrip("/")]
        proc = m.proc
        self._signal(m, signal.SIGKILL)
        proc.wait(10)
        return proc.pid
