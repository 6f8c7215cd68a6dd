"""Engine supervision: one `reflex uds` process (or a given socket) per served model, one request at
a time per engine, a bounded wait for the rest, and a restart when an engine dies."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time

from adapter.ipc_client import EngineBusy, EngineClient, EngineError, EngineGone


def _die_with_parent():
    """Linux: the engine gets SIGTERM if the adapter dies (even by SIGKILL), so none is orphaned."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass


class Unavailable(Exception):
    """No engine can take the request now (starting, restarting, or the wait ran out): HTTP 503."""


class QueueFull(Exception):
    """Too many requests already waiting for this engine: HTTP 429."""


class EngineSlot:
    """One engine: its process (unless `socket` was given), its connection and its queue."""

    def __init__(self, name: str, model: str | None = None, socket_path: str | None = None,
                 ctx: int | None = None, backend: str = "numpy", max_queue: int = 8,
                 queue_timeout: float = 30.0, load_timeout: float = 600.0, python: str | None = None,
                 log=None):
        if model is None and socket_path is None:
            raise ValueError("an engine needs a model to start or a socket to connect to")
        self.name, self.model, self.ctx, self.backend = name, model, ctx, backend
        self.spawn = model is not None
        self._tmp = None
        if socket_path is None:
            self._tmp = tempfile.mkdtemp(prefix="reflex-adapter-")
            socket_path = os.path.join(self._tmp, "engine.sock")
        self.socket_path = socket_path
        self.max_queue, self.queue_timeout, self.load_timeout = max_queue, queue_timeout, load_timeout
        self.python = python or sys.executable
        self.log = log or (lambda msg: print(f"reflex-adapter: {msg}", file=sys.stderr, flush=True))
        self.proc: subprocess.Popen | None = None
        self.client: EngineClient | None = None
        self.state = "stopped"      # starting | ready | restarting | failed | stopped
        self.last_error = None
        self.restarts = 0
        self.info: dict = {}
        self._lock = threading.Lock()      # held by the request being served
        self._waiting = 0
        self._wlock = threading.Lock()
        self._stop = threading.Event()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self):
        self._stop.clear()
        self.state = "starting"
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
        self._thread.start()

    def _spawn(self):
        cmd = [self.python, "-m", "reflex", "uds", "--socket", self.socket_path, "-m", self.model,
               "--backend", self.backend]
        if self.ctx:
            cmd += ["--ctx", str(self.ctx)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        self.log(f"engine {self.name}: started pid {self.proc.pid} ({self.model})")

    def _connect(self):
        deadline = time.monotonic() + self.load_timeout
        while not self._stop.is_set():
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineGone(f"engine exited with code {self.proc.returncode} while starting")
            try:
                return EngineClient(self.socket_path, hello_timeout=self.load_timeout)
            except EngineGone:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # socket not bound yet
            except EngineBusy:
                time.sleep(0.2)
        raise EngineGone("stopping")

    def _run(self):
        """Bring the engine up; then watch it and bring it back whenever it dies."""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if self.spawn and (self.proc is None or self.proc.poll() is not None):
                    self._spawn()
                client = self._connect()
                info = client.call("info")
                with self._cv:
                    self.client, self.info, self.state, self.last_error = client, info, "ready", None
                    self._cv.notify_all()
                backoff = 0.5
                self.log(f"engine {self.name}: ready")
            except (EngineGone, EngineError, OSError) as e:
                if self._stop.is_set():
                    return
                self.last_error = str(e)
                self.log(f"engine {self.name}: not up ({e}); retrying in {backoff:.1f} s")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            # watch: the process exiting, or the connection marked broken by a request
            while not self._stop.is_set() and self.state == "ready":
                if self.proc is not None and self.proc.poll() is not None:
                    self._mark_broken(f"engine process exited with code {self.proc.returncode}")
                    break
                self._stop.wait(0.1)
            if self._stop.is_set():
                return
            self.restarts += 1
            self.log(f"engine {self.name}: restarting ({self.last_error})")

    def _mark_broken(self, why: str):
        with self._cv:
            if self.state == "ready":
                self.state = "restarting"
                self.last_error = why
            if self.client is not None:
                self.client.close()
                self.client = None
        if self.proc is not None and self.proc.poll() is None and self.spawn:
            # a connection that broke while the process lives: do not trust that process either
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self._stop.set()
        c, self.client = self.client, None
        if c is not None:
            with contextlib.suppress(Exception):
                c.call("shutdown")
            c.close()
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                self.proc.wait()
        self.state = "stopped"
        if self._tmp:
            with contextlib.suppress(OSError):
                os.rmdir(self._tmp)

    def wait_ready(self, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self.state == "ready", timeout)

    def status(self) -> dict:
        return {"state": self.state, "pid": self.proc.pid if self.proc and self.proc.poll() is None
                else self.info.get("pid"), "restarts": self.restarts, "error": self.last_error,
                "model": self.info.get("model") or self.model, "waiting": self._waiting}

    # ---------------------------------------------------------------- serving
    def acquire(self) -> EngineClient:
        """Exclusive use of the engine for one request; pair with release(). Raises QueueFull (429)
        or Unavailable (503) instead of waiting without bound."""
        if self.state != "ready":
            raise Unavailable(self._why_down())
        with self._wlock:
            if self._waiting >= self.max_queue:
                raise QueueFull(f"engine {self.name} is busy and {self._waiting} request(s) are "
                                f"already waiting")
            self._waiting += 1
        try:
            got = self._lock.acquire(timeout=self.queue_timeout)
        finally:
            with self._wlock:
                self._waiting -= 1
        if not got:
            raise Unavailable(f"engine {self.name} stayed busy for {self.queue_timeout:g} s")
        client = self.client
        if self.state != "ready" or client is None:
            self._lock.release()
            raise Unavailable(self._why_down())
        return client

    def release(self):
        self._lock.release()

    def broken(self, why: str):
        """A request saw the connection die: restart the engine (the watcher notices)."""
        self._mark_broken(why)

    def _why_down(self) -> str:
        if self.state in ("starting", "restarting"):
            return f"engine {self.name} is {self.state}; retry shortly"
        return f"engine {self.name} is {self.state}" + (f": {self.last_error}" if self.last_error else "")
