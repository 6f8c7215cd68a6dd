"""Client side of the Reflex IPC protocol v1 (JSON lines over a Unix socket), written from the
documented protocol alone: no engine import."""
from __future__ import annotations

import itertools
import json
import socket

VERSION = 1


class EngineGone(Exception):
    """The engine closed the connection or stopped answering (it died or was killed)."""


class EngineBusy(Exception):
    """The engine is serving another client."""


class EngineError(Exception):
    """An `error` event: category + message as the engine sent them."""

    def __init__(self, category: str, message: str):
        super().__init__(message)
        self.category, self.message = category, message


class EngineClient:
    def __init__(self, path: str, connect_timeout: float = 5.0, hello_timeout: float = 600.0,
                 read_timeout: float = 600.0):
        self.path = path
        self.read_timeout = read_timeout
        self._ids = itertools.count(1)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(connect_timeout)
        try:
            s.connect(path)
            s.settimeout(hello_timeout)  # the hello comes once the model has loaded
            self.sock, self.rfile = s, s.makefile("rb")
            ev = self._read()
        except OSError as e:
            s.close()
            raise EngineGone(f"cannot connect to {path}: {e}")
        except EngineGone:
            s.close()
            raise
        if ev.get("event") == "error":
            s.close()
            err = ev.get("error") or {}
            if err.get("category") == "busy":
                raise EngineBusy(err.get("message", "busy"))
            raise EngineError(err.get("category", "internal"), err.get("message", ""))
        if ev.get("event") != "hello" or ev.get("v") != VERSION:
            s.close()
            raise EngineGone(f"unexpected greeting from {path}: {ev!r}")
        self.hello = ev
        s.settimeout(read_timeout)

    def _read(self) -> dict:
        try:
            line = self.rfile.readline()
        except OSError as e:
            raise EngineGone(f"engine connection lost: {e}")
        if not line:
            raise EngineGone("engine closed the connection")
        try:
            return json.loads(line)
        except ValueError:
            raise EngineGone(f"engine sent a malformed line: {line[:200]!r}")

    def request(self, op: str, **params):
        """Send one request; yield its events (token ... then result or error) as dicts."""
        rid = next(self._ids)
        data = json.dumps({"v": VERSION, "id": rid, "op": op, **params}) + "\n"
        try:
            self.sock.sendall(data.encode("utf-8"))
        except OSError as e:
            raise EngineGone(f"engine connection lost: {e}")
        while True:
            ev = self._read()
            if ev.get("id") != rid:
                continue  # not ours (e.g. an unsolicited error): skip
            yield ev
            if ev.get("event") in ("result", "error"):
                return

    def call(self, op: str, **params) -> dict:
        """A request whose only interesting event is the final one: result dict, or EngineError."""
        ev = None
        for ev in self.request(op, stream=False, **params) if op in ("generate", "chat") \
                else self.request(op, **params):
            pass
        if ev["event"] == "error":
            err = ev.get("error") or {}
            raise EngineError(err.get("category", "internal"), err.get("message", ""))
        return ev["result"]

    def close(self):
        try:
            self.rfile.close()
            self.sock.close()
        except OSError:
            pass
