"""Serverless worker: one invocation = one cold process. The engine runs in this process (no IPC,
no HTTP): load, answer, exit.

    python docker/handler.py < request.json        # plain: JSON request on stdin, JSON answer on stdout
    python docker/handler.py --runpod              # Runpod queue worker: runpod.serverless.start

Request (`input` of a Runpod job, or the whole stdin document):
    {"messages": [...]} | {"prompt": "..."}        chat / generate; max_tokens, temperature, top_p, seed, stop
    {"question": "...", "index": "docs"}           docs-bot: retrieve, answer with sources (rag.ask)
    {"input": [...texts], "op": "embed"}           embeddings
  plus optional "model" (default smollm2; minilm for embed), "backend" (default $REFLEX_BACKEND or numpy).
Answer: the GenerationResult dict / rag's answer dict / {"data": [...]}, plus "process_s" (launch to
answer, from /proc) — or {"error": {"category", "message"}}.
"""
from __future__ import annotations

import json
import os
import sys
import time

_T0 = time.perf_counter()
_GEN = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty")


def _since_launch() -> float | None:
    """Seconds since this process was started (Linux /proc), so the answer reports true cold start."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return round(up - start_ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None


def handle(inp: dict) -> dict:
    from reflex.errors import InvalidRequest, ReflexError

    try:
        if not isinstance(inp, dict):
            raise InvalidRequest("the request must be a JSON object")
        backend = inp.get("backend", os.environ.get("REFLEX_BACKEND", "numpy"))
        kw = {k: inp[k] for k in _GEN if k in inp}
        if "question" in inp:
            out = _docs_bot(inp, backend, kw)
        elif inp.get("op") == "embed":
            from reflex.engine import Engine

            eng = Engine(inp.get("model", "minilm"), backend=backend)
            v = eng.embed(inp.get("input"))
            out = {"data": v.tolist() if v.ndim == 2 else [v.tolist()]}
        else:
            from reflex.engine import Engine

            eng = Engine(inp.get("model", "smollm2"), backend=backend)
            kw.setdefault("temperature", 0)
            if "messages" in inp:
                res = eng.chat(inp["messages"], **kw)
            elif "prompt" in inp:
                res = eng.generate(inp["prompt"], **kw)
            else:
                raise InvalidRequest("give 'messages', 'prompt', 'question' (+ 'index') or op 'embed'")
            out = res.to_dict()
    except ReflexError as e:
        return e.to_json()
    out["process_s"] = _since_launch()
    return out


def _docs_bot(inp, backend, kw):
    from rag.ask import ask
    from rag.embedder import load_embedder
    from rag.index import Index, default_indexes_dir
    from reflex.engine import Engine
    from reflex.errors import InvalidRequest

    if not isinstance(inp.get("index"), str):
        raise InvalidRequest("'question' needs 'index' (the index name)")
    index = Index.open(os.environ.get("REFLEX_INDEXES", str(default_indexes_dir())), inp["index"])
    emb = load_embedder(index.identity["name"], backend=backend)
    return ask(inp["question"], index, emb, lambda: Engine(inp.get("model", "smollm2"), backend=backend),
               k=inp.get("top_k", 4), max_tokens=kw.get("max_tokens", 256))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--runpod"]:
        import runpod  # only in the runpod image

        runpod.serverless.start({"handler": lambda job: handle(job.get("input") or {})})
        return 0
    try:
        req = json.load(sys.stdin)
    except ValueError as e:
        req = None
        print(json.dumps({"error": {"category": "invalid_request", "message": f"malformed JSON: {e}"}}))
        return 2
    out = handle(req)
    print(json.dumps(out, ensure_ascii=False))
    return 2 if "error" in out and len(out) == 1 else 0


if __name__ == "__main__":
    sys.exit(main())
