"""Local IPC end to end: real `python -m reflex stdio` / `reflex uds` processes, real pipes and sockets.

Greedy tokens are checked against the transformers outputs recorded by scripts/make_llama_refs.py
(tests/data/llama_ref_smollm2.json), so no torch is needed in CI. Skipped without the SmolLM2 model.
Two model loads in all (one stdio server, one socket server) keep this to well under a minute."""
import json
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
MODEL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
REF = os.path.join(os.path.dirname(__file__), "data", "llama_ref_smollm2.json")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120

needs_model = pytest.mark.skipif(not os.path.exists(MODEL), reason=f"model not found: {MODEL}")


def _ref(i=0):
    with open(REF) as fh:
        return json.load(fh)["cases"][i]


class LineReader:
    """Newline-delimited JSON from a raw fd, with a deadline (a hung server fails the test)."""

    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def event(self, timeout=TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError("timed out waiting for an event")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError("server closed the stream")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        ev = json.loads(line)
        assert ev["v"] == 1
        return ev

    def until_done(self, rid):
        """Token texts and the final result/error event of request `rid`."""
        toks = []
        while True:
            ev = self.event()
            assert ev["id"] == rid, ev
            if ev["event"] == "token":
                toks.append(ev["text"])
            else:
                assert ev["event"] in ("result", "error"), ev
                return toks, ev


def _spawn(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "reflex", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                            bufsize=0)


# ------------------------------------------------------------------ stdio
@pytest.fixture(scope="module")
def stdio():
    p = _spawn("stdio", "-m", MODEL, "--ctx", "64")
    r = LineReader(p.stdout.fileno())

    def req(obj, raw=None):
        p.stdin.write(raw if raw is not None else (json.dumps(obj) + "\n").encode())
        return r.until_done(obj.get("id") if raw is None else None)

    hello = r.event()
    yield p, r, req, hello
    if p.poll() is None:
        p.kill()
    p.wait()


@needs_model
def test_stdio_hello(stdio):
    _, _, _, hello = stdio
    assert hello["event"] == "hello" and hello["protocol"] == "reflex-ipc"
    assert hello["model"] == os.path.realpath(MODEL) or hello["model"].endswith(os.path.basename(MODEL))
    assert hello["n_ctx"] == 64
    assert {"generate", "chat", "info", "health", "shutdown"} <= set(hello["ops"])


@needs_model
def test_stdio_generate_matches_transformers(stdio):
    _, _, req, _ = stdio
    case = _ref(0)
    n = 6
    toks, ev = req({"id": 1, "op": "generate", "prompt": case["prompt_ids"], "max_tokens": n,
                    "temperature": 0})
    res = ev["result"]
    assert res["tokens"] == case["greedy_ids"][:n]
    assert res["finish_reason"] == "length"
    assert "".join(toks) == res["text"] and case["greedy_text"].startswith(res["text"])
    assert res["usage"] == {"prompt_tokens": len(case["prompt_ids"]), "completion_tokens": n,
                            "total_tokens": len(case["prompt_ids"]) + n}
    assert res["timings"]["first_token_s"] > 0
    # the same prompt as text, with a string id: same tokens
    toks2, ev2 = req({"id": "t", "op": "generate", "prompt": case["prompt"], "max_tokens": n,
                      "temperature": 0, "stream": False})
    assert toks2 == [] and ev2["result"]["tokens"] == res["tokens"]


@needs_model
def test_stdio_bad_requests_keep_serving(stdio):
    p, _, req, _ = stdio
    bad = [
        (None, b"this is not json\n", "invalid_request"),
        (None, b"[1, 2]\n", "invalid_request"),
        (None, b'{"op": "health", "id": {"x": 1}}\n', "invalid_request"),
        (None, b"\xff\xfe{}\n", "invalid_request"),
        ({"id": 2, "op": "frobnicate"}, None, "invalid_request"),
        ({"id": 3, "v": 2, "op": "health"}, None, "invalid_request"),
        ({"id": 4, "op": "generate"}, None, "invalid_request"),
        ({"id": 5, "op": "generate", "prompt": "Hi", "temperature": "hot"}, None, "invalid_request"),
        ({"id": 6, "op": "generate", "prompt": "Hi", "max_tokens": 0}, None, "invalid_request"),
        ({"id": 7, "op": "generate", "prompt": "Hi", "bogus": 1}, None, "invalid_request"),
        ({"id": 8, "op": "generate", "prompt": "Hi", "stream": "yes"}, None, "invalid_request"),
        ({"id": 9, "op": "generate", "prompt": ""}, None, "invalid_request"),
        ({"id": 10, "op": "generate", "prompt": [1, "a"]}, None, "invalid_request"),
        ({"id": 11, "op": "chat", "messages": "hello"}, None, "invalid_request"),
        ({"id": 12, "op": "chat", "messages": [{"role": "user"}]}, None, "invalid_request"),
        ({"id": 13, "op": "health", "extra": True}, None, "invalid_request"),
        # 100 tokens into a 64-token context: context_overflow, never truncation
        ({"id": 14, "op": "generate", "prompt": [504] * 100}, None, "context_overflow"),
    ]
    for obj, raw, cat in bad:
        if raw is not None:
            p.stdin.write(raw)
            toks, ev = stdio[1].until_done(None)
        else:
            toks, ev = req(obj)
        assert toks == [] and ev["event"] == "error", (obj, raw, ev)
        assert ev["error"]["category"] == cat, (obj, raw, ev)
        assert ev["error"]["message"]
    # a line longer than the protocol limit is refused and skipped as a whole
    from reflex.ipc import MAX_LINE
    p.stdin.write(b'{"id": 99, "op": "generate", "prompt": "' + b"a" * MAX_LINE + b'"}\n')
    toks, ev = stdio[1].until_done(None)
    assert ev["error"]["category"] == "invalid_request" and "longer than" in ev["error"]["message"]
    # still serving, and still right
    _, ev = req({"id": 15, "op": "health"})
    assert ev["result"]["status"] == "ok" and ev["result"]["pid"] == p.pid
    case = _ref(0)
    _, ev = req({"id": 16, "op": "generate", "prompt": case["prompt_ids"], "max_tokens": 3,
                 "temperature": 0})
    assert ev["result"]["tokens"] == case["greedy_ids"][:3]


@needs_model
def test_stdio_chat_and_info(stdio):
    _, _, req, _ = stdio
    toks, ev = req({"id": "c", "op": "chat", "max_tokens": 12, "temperature": 0,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert "Paris" in ev["result"]["text"] and "".join(toks) == ev["result"]["text"]
    _, ev = req({"id": "i", "op": "info"})
    info = ev["result"]
    assert info["architecture"] == "llama" and info["n_vocab"] == 49152 and info["n_ctx"] == 64
    assert info["chat_template"] is True and info["protocol"] == "reflex-ipc" and info["v"] == 1


@needs_model
def test_stdio_engine_ops_absent_or_present(stdio):
    # embed / score / classify answer only when the Engine has the method; never a fake result
    from reflex.engine import Engine
    _, _, req, hello = stdio
    for i, op in enumerate(("embed", "score", "classify")):
        if hasattr(Engine, op):
            assert op in hello["ops"]
            continue
        assert op not in hello["ops"]
        _, ev = req({"id": 100 + i, "op": op, "text": "x"})
        assert ev["event"] == "error" and ev["error"]["category"] == "invalid_request"
        assert op in ev["error"]["message"]


@needs_model
def test_stdio_eof_exits_cleanly(stdio):
    p, _, _, _ = stdio
    p.stdin.close()
    assert p.wait(timeout=30) == 0


def test_stdio_model_not_found():
    p = _spawn("stdio", "-m", "/nonexistent/model.gguf")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3
    ev = json.loads(out.decode().strip().splitlines()[-1])
    assert ev["event"] == "error" and ev["error"]["category"] == "model_not_found"


# ------------------------------------------------------------------ Unix socket
def _connect(path) -> tuple[socket.socket, LineReader]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s, LineReader(s.fileno())


def _send(s, obj):
    s.sendall((json.dumps(obj) + "\n").encode())


@pytest.fixture()
def sockdir():
    with tempfile.TemporaryDirectory(prefix="rx") as d:
        yield d


def test_uds_refuses_non_socket(sockdir):
    path = os.path.join(sockdir, "not-a-socket")
    with open(path, "w") as fh:
        fh.write("precious")
    p = _spawn("uds", "--socket", path, "-m", MODEL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and b"not a socket" in err
    assert open(path).read() == "precious"


def test_uds_sigterm_during_load_removes_socket(sockdir):
    path = os.path.join(sockdir, "s")
    p = _spawn("uds", "--socket", path, "-m", MODEL)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    p.terminate()
    p.wait(timeout=30)
    assert not os.path.exists(path)


@needs_model
def test_uds_end_to_end(sockdir):
    path = os.path.join(sockdir, "engine.sock")
    # a stale socket (bound, its server gone) is replaced
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    p = _spawn("uds", "--socket", path, "-m", MODEL, "--ctx", "64")
    try:
        deadline = time.monotonic() + 60
        while True:  # the old file is unlinked, then ours bound
            try:
                a, ra = _connect(path)
                hello = ra.event()
                break
            except (ConnectionRefusedError, FileNotFoundError):
                assert time.monotonic() < deadline and p.poll() is None
                time.sleep(0.05)
        assert hello["event"] == "hello" and hello["n_ctx"] == 64
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

        case = _ref(0)
        _send(a, {"id": 1, "op": "generate", "prompt": case["prompt_ids"], "max_tokens": 4,
                  "temperature": 0})
        toks, ev = ra.until_done(1)
        assert ev["result"]["tokens"] == case["greedy_ids"][:4] and "".join(toks) == ev["result"]["text"]
        a.sendall(b"{broken\n")
        _, ev = ra.until_done(None)
        assert ev["error"]["category"] == "invalid_request"

        # a second client while the first is connected: one busy event, then closed
        b, rb = _connect(path)
        ev = rb.event()
        assert ev["event"] == "error" and ev["error"]["category"] == "busy"
        with pytest.raises(EOFError):
            rb.event(timeout=10)
        b.close()
        # a second server on the same live socket is refused, and ours keeps its socket
        q = _spawn("uds", "--socket", path, "-m", MODEL)
        _, err = q.communicate(timeout=60)
        assert q.returncode == 2 and b"another server" in err
        _send(a, {"id": 2, "op": "health"})
        assert ra.until_done(2)[1]["result"]["status"] == "ok"

        # a client that disappears mid-stream: generation stops, the next client is served
        _send(a, {"id": 3, "op": "generate", "prompt": "Once upon a time", "max_tokens": 60,
                  "temperature": 0})
        assert ra.event()["event"] == "token"
        a.close()
        deadline = time.monotonic() + 60
        while True:
            c, rc = _connect(path)
            ev = rc.event()
            if ev["event"] == "hello":
                break
            assert ev["error"]["category"] == "busy" and time.monotonic() < deadline
            c.close()
            time.sleep(0.1)
        _send(c, {"id": 4, "op": "shutdown"})
        assert rc.until_done(4)[1]["result"] == {"status": "shutting_down"}
        assert p.wait(timeout=30) == 0
        assert not os.path.exists(path)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


# ------------------------------------------------------------------ embeddings over IPC
MINILM = os.path.join(MODELS, "all-MiniLM-L6-v2.F32.gguf")
EMB_REF = os.path.join(os.path.dirname(__file__), "data", "embedding_ref_minilm.json.gz")


@pytest.mark.skipif(not os.path.exists(MINILM), reason=f"model not found: {MINILM}")
def test_stdio_embed_matches_sentence_transformers():
    """Against sentence-transformers' vectors recorded in tests/data/embedding_ref_minilm.json.gz."""
    import base64
    import gzip

    import numpy as np

    with gzip.open(EMB_REF) as fh:
        ref = json.load(fh)
    n, dim = 4, int(ref["dim"])
    want = np.frombuffer(base64.b64decode(ref["embeddings_f16"]), dtype="<f2").astype(np.float32)
    want = want.reshape(-1, dim)[:n]
    p = _spawn("stdio", "-m", MINILM)
    r = LineReader(p.stdout.fileno())
    try:
        hello = r.event()
        assert "embed" in hello["ops"]

        def req(obj):
            p.stdin.write((json.dumps(obj) + "\n").encode())
            return r.until_done(obj["id"])[1]

        ev = req({"id": 1, "op": "embed", "input": ref["texts"][:n]})
        got = np.array(ev["result"]["data"], dtype=np.float32)
        assert got.shape == (n, dim) and ev["result"]["n_embd"] == dim
        assert np.abs(got - want).max() < 2e-3  # the reference is stored as f16
        assert ev["result"]["usage"]["prompt_tokens"] == sum(len(i) for i in ref["ids"][:n])
        ev = req({"id": 2, "op": "embed", "input": ref["ids"][:n], "encoding_format": "base64"})
        b64 = np.stack([np.frombuffer(base64.b64decode(s), dtype="<f4") for s in ev["result"]["data"]])
        assert np.abs(b64 - got).max() < 1e-5  # token-id input = the same tokens as the text
        ev = req({"id": 3, "op": "embed", "input": [[1, 2], "mixed"]})
        assert ev["event"] == "error" and ev["error"]["category"] == "invalid_request"
        ev = req({"id": 4, "op": "embed", "input": [[10 ** 9]]})
        assert ev["event"] == "error" and "out of range" in ev["error"]["message"]
        ev = req({"id": 5, "op": "embed", "input": "x", "encoding_format": "int8"})
        assert ev["event"] == "error" and ev["error"]["category"] == "invalid_request"
        assert req({"id": 6, "op": "health"})["result"]["status"] == "ok"
    finally:
        p.stdin.close()
        assert p.wait(timeout=30) == 0
