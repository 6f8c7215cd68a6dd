"""Local IPC: the engine behind JSON lines, on stdin/stdout (`reflex stdio`) or a Unix socket
(`reflex uds --socket PATH`). Protocol version 1, documented in docs/reference.md ("IPC protocol").

One line = one JSON object, UTF-8, newline-terminated, both ways. Every server line carries
`"v": 1` and an `"event"`; every event caused by a request echoes that request's `"id"`.

    server -> {"v": 1, "event": "hello", "protocol": "reflex-ipc", "model": ..., "ops": [...]}
    client -> {"v": 1, "id": 7, "op": "generate", "prompt": "Hi", "max_tokens": 8}
    server -> {"v": 1, "id": 7, "event": "token", "text": " there"}      (0..n, when streaming)
    server -> {"v": 1, "id": 7, "event": "result", "result": {...}}      (exactly one) or
              {"v": 1, "id": 7, "event": "error", "error": {"category": ..., "message": ...}}

Requests are served one at a time, in order. A bad request gets an error event and changes nothing;
the server keeps serving. On a socket one client is served at a time; any other client that connects
meanwhile gets one `busy` error event and is disconnected (it never waits silently).
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import stat
import sys
import threading
import traceback

from reflex.errors import InvalidRequest, ReflexError

PROTOCOL = "reflex-ipc"
VERSION = 1
MAX_LINE = 8 << 20  # bytes per request line; a longer line is answered with an error and skipped

_COMMON = {"v", "id", "op"}
_SAMPLING = {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed"}
_GEN = {"max_tokens", "stop", "stream"} | _SAMPLING


def error_event(category: str, message: str, rid=None) -> dict:
    return {"v": VERSION, "id": rid, "event": "error",
            "error": {"category": category, "message": message}}


def _jsonable(x):
    """Results of Engine methods -> plain JSON values (dataclasses with to_dict, numpy arrays)."""
    if hasattr(x, "to_dict"):
        return _jsonable(x.to_dict())
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist"):  # numpy array or scalar
        return x.tolist()
    return x


def _check_keys(req: dict, allowed: set):
    extra = set(req) - _COMMON - allowed
    if extra:
        raise InvalidRequest(f"unknown parameter(s) for op {req['op']!r}: {', '.join(sorted(extra))}")


def _gen_kwargs(req: dict) -> dict:
    kw = {k: req[k] for k in _GEN - {"stream"} if k in req}
    stream = req.get("stream", True)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"stream must be true or false, got {stream!r}")
    return kw


def _run_generation(it, req, emit) -> dict:
    """Drain a GenerationStream, emitting token events unless the request asked for stream=false."""
    stream = req.get("stream", True)
    try:
        for piece in it:
            if stream:
                emit({"event": "token", "text": piece})
    finally:
        it.close()  # a client gone mid-stream (BrokenPipe from emit) stops generation here
    return it.result.to_dict()


# ------------------------------------------------------------------ ops: one small function each
def op_generate(srv, req, emit):
    _check_keys(req, _GEN | {"prompt", "parse_special"})
    if "prompt" not in req:
        raise InvalidRequest("generate needs 'prompt' (a string or a list of token ids)")
    ps = req.get("parse_special", False)
    if not isinstance(ps, bool):
        raise InvalidRequest(f"parse_special must be true or false, got {ps!r}")
    it = srv.engine.generate(req["prompt"], stream=True, parse_special=ps, **_gen_kwargs(req))
    return _run_generation(it, req, emit)


def _check_messages(msgs):
    if not isinstance(msgs, list) or not msgs:
        raise InvalidRequest("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                or not isinstance(m.get("content"), str):
            raise InvalidRequest(f"messages[{i}] must be an object with string 'role' and 'content'")


def op_chat(srv, req, emit):
    _check_keys(req, _GEN | {"messages"})
    _check_messages(req.get("messages"))
    it = srv.engine.chat(req["messages"], stream=True, **_gen_kwargs(req))
    return _run_generation(it, req, emit)


def _engine_method(srv, name: str):
    fn = getattr(srv.engine, name, None)
    if fn is None:
        raise InvalidRequest(f"op {name!r} is not available: this engine has no Engine.{name}()")
    return fn


def _is_ids(x) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(i, int) and not isinstance(i, bool)
                                                   for i in x)


def _embed_ids(eng, seqs: list, normalize: bool):
    """Token-id input (OpenAI allows it): the ids go to the encoder exactly as given."""
    from reflex.embed import context_limit, hidden_states, l2_normalize, pool, pooling_of
    import numpy as np

    n_vocab, limit = eng.model.hp.n_vocab, context_limit(eng.model, eng.n_ctx)
    for i, s in enumerate(seqs):
        if min(s) < 0 or max(s) >= n_vocab:
            raise InvalidRequest(f"input[{i}]: token id out of range [0, {n_vocab})")
        if len(s) > limit:
            from reflex.errors import ContextOverflow
            raise ContextOverflow(f"input[{i}] is {len(s)} tokens; the limit is {limit}")
    p = pooling_of(eng.model, metadata=eng.gguf.metadata)
    v = np.stack([pool(h, p) for h in hidden_states(eng.model, seqs)])       # (N, n_embd)
    return l2_normalize(v) if normalize else v


def op_embed(srv, req, emit):
    """input: a string, a list of strings (or [query, document] pairs), a list of token ids or a
    list of such lists.
    encoding_format "float" (lists of numbers) or "base64" (little-endian float32 bytes)."""
    import base64

    import numpy as np

    _check_keys(req, {"input", "normalize", "truncate", "encoding_format"})
    eng = srv.engine
    _engine_method(srv, "embed")
    inp = req.get("input")
    norm, trunc = req.get("normalize", True), req.get("truncate", False)
    if not isinstance(norm, bool) or not isinstance(trunc, bool):
        raise InvalidRequest("normalize and truncate must be true or false")
    fmt = req.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise InvalidRequest(f"encoding_format must be 'float' or 'base64', got {fmt!r}")
    if _is_ids(inp):
        inp = [inp]
    if isinstance(inp, list) and inp and all(_is_ids(x) for x in inp):
        vecs = _embed_ids(eng, inp, norm)
        n_tok = sum(len(x) for x in inp)
    else:
        vecs = eng.embed(inp if isinstance(inp, list) else [inp] if isinstance(inp, str) else inp,
                         normalize=norm, truncate=trunc)
        lim = eng.n_ctx
        # a [query, document] pair counts the tokens of both texts
        n_tok = sum(min(sum(len(eng.tokenizer.encode(x, add_special=True)) for x in
                            (t if isinstance(t, (list, tuple)) else [t])), lim) for t in
                    ([inp] if isinstance(inp, str) else inp))
    vecs = np.asarray(vecs, dtype=np.float32)
    if vecs.ndim != 2:
        raise InvalidRequest("this model gives no single vector per input (pooling none)")
    if fmt == "base64":
        data = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vecs]
    else:
        data = vecs.tolist()
    return {"data": data, "encoding_format": fmt, "n_embd": int(vecs.shape[1]),
            "usage": {"prompt_tokens": n_tok, "total_tokens": n_tok}}


def op_score(srv, req, emit):
    """system1: context + candidates -> log-probabilities and the best candidate."""
    _check_keys(req, {"context", "candidates", "normalize", "parse_special"})
    fn = _engine_method(srv, "score")
    if "context" not in req or "candidates" not in req:
        raise InvalidRequest("score needs 'context' and 'candidates'")
    for k in ("normalize", "parse_special"):
        if not isinstance(req.get(k, False), bool):
            raise InvalidRequest(f"{k} must be true or false")
    return _jsonable(fn(req["context"], req["candidates"], normalize=req.get("normalize", False),
                        parse_special=req.get("parse_special", False)))


def op_classify(srv, req, emit):
    _check_keys(req, {"text", "labels", "template", "normalize", "chat"})
    fn = _engine_method(srv, "classify")
    for k in ("normalize", "chat"):
        if not isinstance(req.get(k, False), bool):
            raise InvalidRequest(f"{k} must be true or false")
    t = req.get("template")
    if t is not None and not isinstance(t, str):
        raise InvalidRequest("template must be a string")
    return _jsonable(fn(req.get("text"), req.get("labels"), template=t,
                        normalize=req.get("normalize", False), chat=req.get("chat", False)))


def op_info(srv, req, emit):
    _check_keys(req, set())
    return srv.info()


def op_health(srv, req, emit):
    _check_keys(req, set())
    return {"status": "ok", "pid": os.getpid()}


def op_shutdown(srv, req, emit):
    _check_keys(req, set())
    srv.stop.set()
    return {"status": "shutting_down"}


OPS = {
    "generate": op_generate,
    "chat": op_chat,
    "embed": op_embed,
    "score": op_score,
    "classify": op_classify,
    "info": op_info,
    "health": op_health,
    "shutdown": op_shutdown,
}
_ENGINE_OPS = ("embed", "score", "classify")  # present only when the Engine has the method


# ------------------------------------------------------------------ server core
class Server:
    """Holds the engine and dispatches request lines; transport-independent."""

    def __init__(self, engine, backend: str = "numpy"):
        self.engine = engine
        self.backend = backend
        self.stop = threading.Event()

    def ops(self) -> list:
        return [n for n in OPS if n not in _ENGINE_OPS or hasattr(self.engine, n)]

    def hello(self) -> dict:
        return {"v": VERSION, "event": "hello", "protocol": PROTOCOL, "model": str(self.engine.path),
                "n_ctx": self.engine.n_ctx, "ops": self.ops(), "pid": os.getpid()}

    def info(self) -> dict:
        e = self.engine
        hp = getattr(e.model, "hp", None)
        return {"protocol": PROTOCOL, "v": VERSION, "model": str(e.path),
                "name": e.gguf.get("general.name", None),
                "architecture": e.gguf.get("general.architecture", None),
                "n_ctx": e.n_ctx, "n_ctx_train": getattr(hp, "n_ctx_train", None),
                "n_vocab": getattr(hp, "n_vocab", None), "n_embd": getattr(hp, "n_embd", None),
                "chat_template": e.template is not None,
                "backend": self.backend, "load_timings": e.load_timings, "ops": self.ops(),
                "pid": os.getpid()}

    def handle_line(self, line: bytes, write) -> None:
        """Answer one request line. `write(dict)` sends one event; it may raise OSError (peer gone),
        which propagates so the transport can drop the client."""
        rid = None
        try:
            try:
                req = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise InvalidRequest(f"malformed JSON line: {e}")
            if not isinstance(req, dict):
                raise InvalidRequest("a request must be a JSON object")
            rid = req.get("id")
            if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int, float))):
                rid = None
                raise InvalidRequest("id must be a string or a number")
            v = req.get("v", VERSION)
            if v != VERSION or isinstance(v, bool):
                raise InvalidRequest(f"unsupported protocol version {v!r} (this server speaks {VERSION})")
            op = req.get("op")
            fn = OPS.get(op) if isinstance(op, str) else None
            if fn is None:
                raise InvalidRequest(f"unknown op {op!r} (ops: {', '.join(self.ops())})")

            def emit(ev):
                write({"v": VERSION, "id": rid, **ev})

            result = fn(self, req, emit)
            emit({"event": "result", "result": result})
        except ReflexError as e:
            write(error_event(e.category, str(e), rid))
        except MemoryError:
            write(error_event("out_of_memory", "out of memory while serving the request", rid))
        except OSError:
            raise
        except Exception as e:  # a bug of ours: report it, keep serving
            traceback.print_exc(file=sys.stderr)
            write(error_event("internal", f"{type(e).__name__}: {e}", rid))

    def serve(self, rfile, write) -> None:
        """Read request lines from a binary file until EOF or shutdown."""
        while not self.stop.is_set():
            line = rfile.readline(MAX_LINE + 1)
            if not line:
                return
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while True:  # skip the rest of the oversize line
                    rest = rfile.readline(1 << 20)
                    if not rest or rest.endswith(b"\n"):
                        break
                write(error_event("invalid_request", f"request line longer than {MAX_LINE} bytes"))
                continue
            if not line.strip():
                continue
            self.handle_line(line, write)


def _line_writer(f):
    lock = threading.Lock()

    def write(ev: dict):
        data = (json.dumps(ev, ensure_ascii=False) + "\n").encode("utf-8")
        with lock:
            f.write(data)
            f.flush()
    return write


# ------------------------------------------------------------------ stdio transport
def protocol_stdout():
    """The real stdout as a binary stream for protocol lines; sys.stdout is pointed at stderr so a
    stray print() anywhere can never corrupt the protocol."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout.flush()
    sys.stdout = sys.stderr
    return out


def serve_stdio(server: Server, out) -> None:
    write = _line_writer(out)
    write(server.hello())
    try:
        server.serve(sys.stdin.buffer, write)
    except BrokenPipeError:
        pass  # the client closed our stdout: nothing left to serve


# ------------------------------------------------------------------ Unix socket transport
def bind_unix_socket(path: str) -> tuple[socket.socket, int]:
    """Bind a listening socket at `path` with mode 0600. An existing socket nobody listens on is
    removed (stale); a live one, or anything that is not a socket, is left alone and refused."""
    if len(os.fsencode(path)) > 107:
        raise InvalidRequest(f"socket path is too long for AF_UNIX (max 107 bytes): {path}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise InvalidRequest(f"{path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # stale: its server is gone
        except OSError as e:
            raise InvalidRequest(f"cannot tell whether {path} is in use: {e}")
        else:
            raise InvalidRequest(f"another server is listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is born 0600: no window where others can connect
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise InvalidRequest(f"cannot bind {path}: {e}")
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock, os.stat(path).st_ino


def _send_busy(conn: socket.socket):
    try:
        conn.settimeout(1.0)
        conn.sendall((json.dumps(error_event(
            "busy", "engine is serving another client (one client at a time); retry later")) + "\n")
            .encode())
    except OSError:
        pass
    finally:
        conn.close()


def serve_uds(server: Server, sock: socket.socket, path: str, ino: int) -> None:
    """Accept clients one at a time; each gets a hello, then its request lines are served until it
    disconnects. Connections arriving meanwhile get a `busy` error and are closed."""
    wake_r, wake_w = os.pipe()
    busy = threading.Lock()

    def session(conn):
        try:
            rfile = conn.makefile("rb")
            write = _line_writer(conn.makefile("wb"))
            write(server.hello())
            server.serve(rfile, write)
        except OSError:
            pass  # client went away: drop it, keep serving others
        finally:
            try:
                conn.close()
            finally:
                busy.release()
                if server.stop.is_set():
                    try:
                        os.write(wake_w, b"x")
                    except OSError:
                        pass

    def on_term(signum, frame):
        server.stop.set()
        os.write(wake_w, b"x")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        while not server.stop.is_set():
            ready, _, _ = select.select([sock, wake_r], [], [])
            if wake_r in ready:
                break
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            if busy.acquire(blocking=False):
                threading.Thread(target=session, args=(conn,), daemon=True).start()
            else:
                _send_busy(conn)
    finally:
        sock.close()
        try:  # remove the socket only if it is still ours (not replaced by someone else)
            if os.stat(path).st_ino == ino:
                os.unlink(path)
        except OSError:
            pass
        os.close(wake_r)
        os.close(wake_w)
