"""IPC and adapter overhead, measured through real processes.

  python benchmarks/bench_ipc.py [-m smollm2] [--n 200]

1. cold start of `reflex stdio` / `reflex uds`: spawn -> hello (model load included), and the same
   for `reflex-adapter`: spawn -> /health 200.
2. round trip of a `health` request (no compute): stdio pipe, Unix socket, HTTP through the adapter.
3. the transport's share of generation: 16 greedy tokens in-process vs over the socket vs through
   HTTP (streamed), same tokens checked identical.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)


def _readline(f):
    line = f.readline()
    if not line:
        raise SystemExit("server closed")
    return json.loads(line)


def bench_stdio(model, n):
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "reflex", "stdio", "-m", model], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
    _readline(p.stdout)
    cold = time.perf_counter() - t0
    ts = []
    for i in range(n):
        t = time.perf_counter()
        p.stdin.write(json.dumps({"id": i, "op": "health"}).encode() + b"\n")
        p.stdin.flush()
        _readline(p.stdout)
        ts.append(time.perf_counter() - t)
    p.stdin.close()
    p.wait()
    return cold, ts


def bench_uds(model, n, path):
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "reflex", "uds", "--socket", path, "-m", model],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            break
        except OSError:
            time.sleep(0.005)
    f = s.makefile("rb")
    _readline(f)
    cold = time.perf_counter() - t0
    ts = []
    for i in range(n):
        t = time.perf_counter()
        s.sendall(json.dumps({"id": i, "op": "health"}).encode() + b"\n")
        _readline(f)
        ts.append(time.perf_counter() - t)
    gen = {"op": "generate", "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
    t = time.perf_counter()
    s.sendall(json.dumps({"id": "g", **gen}).encode() + b"\n")
    while True:
        ev = _readline(f)
        if ev["event"] != "token":
            break
    ipc_gen = time.perf_counter() - t
    s.sendall(b'{"id": "x", "op": "shutdown"}\n')
    _readline(f)
    p.wait()
    return cold, ts, ipc_gen, ev["result"]["tokens"]


def bench_adapter(model, n):
    import httpx

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "adapter.main", "-m", f"m={model}", "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
    with httpx.Client() as c:
        while True:
            try:
                if c.get(base + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        cold = time.perf_counter() - t0
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            c.get(base + "/health")
            ts.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = c.post(base + "/v1/chat/completions", json={
            "model": "m", "max_tokens": 16, "temperature": 0, "stream": False,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}, timeout=600)
        http_chat = time.perf_counter() - t
        r.raise_for_status()
    p.terminate()
    p.wait()
    return cold, ts, http_chat, r.json()["usage"]


def ms(ts):
    return f"median {statistics.median(ts) * 1e3:.3f} ms, p90 {sorted(ts)[int(0.9 * len(ts))] * 1e3:.3f} ms"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--n", type=int, default=200)
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from reflex.engine import Engine

    cold, ts = bench_stdio(a.model, a.n)
    print(f"stdio: spawn -> hello {cold:.3f} s; health round trip {ms(ts)}")
    with tempfile.TemporaryDirectory() as d:
        cold, ts, ipc_gen, toks = bench_uds(a.model, a.n, os.path.join(d, "s"))
    print(f"uds:   spawn -> hello {cold:.3f} s; health round trip {ms(ts)}")
    eng = Engine(a.model)
    t = time.perf_counter()
    r = eng.generate("The capital of France is", max_tokens=16, temperature=0)
    local = time.perf_counter() - t
    assert r.tokens == toks, "IPC and in-process tokens differ"
    print(f"16 greedy tokens: in-process {local:.3f} s, over the socket {ipc_gen:.3f} s "
          f"(difference {(ipc_gen - local) * 1e3:+.1f} ms, includes run-to-run noise)")
    cold, ts, http_chat, usage = bench_adapter(a.model, a.n)
    print(f"adapter: spawn -> /health 200 {cold:.3f} s; GET /health {ms(ts)}; "
          f"chat {usage['completion_tokens']} tokens {http_chat:.3f} s")


if __name__ == "__main__":
    main()
