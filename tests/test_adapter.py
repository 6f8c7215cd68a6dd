"""reflex-adapter as users use it: the official `openai` client (and raw httpx for malformed input)
against a real adapter process supervising real `reflex uds` engine processes.

References are independent, recorded by committed scripts (no torch in CI): greedy ids / last-prompt
logits from transformers (tests/data/llama_ref_smollm2.json, scripts/make_llama_refs.py) and
sentence-transformers vectors (tests/data/embedding_ref_minilm.json.gz, scripts/make_embedding_refs.py).
Skipped without the SmolLM2 model or without fastapi/uvicorn/openai; embedding tests skip without the
MiniLM GGUF. One adapter process, two engine loads, plus one engine restart."""
import base64
import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
SMOL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
MINILM = os.path.join(MODELS, "all-MiniLM-L6-v2.F32.gguf")
DATA = os.path.join(os.path.dirname(__file__), "data")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "test-key-123"
Q = "What is the capital of France?"

pytestmark = pytest.mark.skipif(not os.path.exists(SMOL), reason=f"model not found: {SMOL}")
needs_minilm = pytest.mark.skipif(not os.path.exists(MINILM), reason=f"model not found: {MINILM}")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


DOCS = {
    "zorblax.md": "# Zorblax protocol\n\nThe Zorblax protocol listens on TCP port 4711. Zorblax "
                  "servers send a heartbeat every 9 seconds and drop clients after 3 missed beats.\n",
    "gardening.md": "# Tomatoes\n\nTomato plants need six hours of direct sun and deep watering twice "
                    "a week. Pinch the suckers that grow between the stem and the branches.\n",
}


def _can_rag() -> bool:
    try:
        import faiss  # noqa: F401
        import rag.retrieve  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(MINILM)


needs_rag = pytest.mark.skipif(not _can_rag(), reason="needs faiss, the rag package and the MiniLM GGUF")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    port = _free_port()
    cmd = [sys.executable, "-m", "adapter.main", "-m", f"smollm2={SMOL}", "--ctx", "256",
           "--port", str(port), "--api-key", KEY, "--max-body-bytes", "65536",
           "--max-prompt-chars", "20000", "--max-queue", "1", "--queue-timeout", "1"]
    if os.path.exists(MINILM):
        cmd += ["-m", f"minilm={MINILM}"]
    if _can_rag():  # a two-document index, built by reflex-rag at test time
        docs, idx = tmp_path_factory.mktemp("docs"), tmp_path_factory.mktemp("indexes")
        for name, text in DOCS.items():
            (docs / name).write_text(text)
        subprocess.run([sys.executable, "-m", "rag.cli", "ingest", str(docs), "--index", "kb",
                        "--indexes-dir", str(idx), "--embed-model", MINILM, "--quiet"],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), check=True, timeout=300)
        cmd += ["--rag", "docs-bot=kb:smollm2", "--indexes-dir", str(idx)]
    p = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert p.poll() is None, p.stderr.read().decode()
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "adapter did not become healthy"
        time.sleep(0.2)
    yield base
    p.terminate()
    p.wait(timeout=30)


@pytest.fixture(scope="module")
def client(adapter):
    # max_retries=0: the client would otherwise retry 429/503 itself and hide what the server said
    return openai.OpenAI(base_url=adapter + "/v1", api_key=KEY, max_retries=0, timeout=300)


def _post(adapter, path, body=None, content=None, key=KEY, headers=None):
    h = {"Authorization": f"Bearer {key}"} if key else {}
    h.update(headers or {})
    if content is not None:
        h.setdefault("Content-Type", "application/json")
        return httpx.post(adapter + path, content=content, headers=h, timeout=300)
    return httpx.post(adapter + path, json=body, headers=h, timeout=300)


def _oai_error(r, status, code=None, param=None):
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


def _llama_ref(i=0):
    with open(os.path.join(DATA, "llama_ref_smollm2.json")) as fh:
        return json.load(fh)["cases"][i]


# ------------------------------------------------------------------ chat
def test_health_models_openapi(adapter, client):
    h = httpx.get(adapter + "/health").json()
    assert h["status"] == "ok" and h["engines"]["smollm2"]["state"] == "ready"
    assert "smollm2" in [m.id for m in client.models.list().data]
    assert httpx.get(adapter + "/ping").json() == {"status": "healthy"}
    spec = httpx.get(adapter + "/openapi.json").json()
    assert "/v1/chat/completions" in spec["paths"] and "/v1/embeddings" in spec["paths"]


def test_chat_completion(client):
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": Q}],
                                       max_tokens=12, temperature=0)
    # the greedy answer transformers gives (tests/test_engine.py::test_chat_paris)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 7 and r.usage.total_tokens == r.usage.prompt_tokens + 7
    assert r.object == "chat.completion" and r.model == "smollm2"
    r2 = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": Q}],
                                        max_completion_tokens=3, temperature=0)
    assert r2.choices[0].finish_reason == "length" and r2.usage.completion_tokens == 3
    assert r.choices[0].message.content.startswith(r2.choices[0].message.content)


def test_chat_streaming(client):
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": Q}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7


def test_systemone_matches_transformers_logits(adapter):
    """log p(a) - log p(b) for single-token candidates is a logit difference: checked against the
    last-prompt logits transformers recorded."""
    case = _llama_ref(0)
    top_ids, top_vals = case["last_logits"]["top_ids"], case["last_logits"]["top_values"]
    picks = [0, 1, 7, 30]
    r = _post(adapter, "/v1/systemone", {"model": "smollm2", "context": case["prompt_ids"],
                                         "candidates": [[top_ids[k]] for k in picks]})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["object"] == "systemone" and d["best"] == 0
    lp = [c["total"] for c in d["candidates"]]
    scale = case["last_logits"]["max_abs"]
    for j, k in enumerate(picks[1:], 1):
        assert abs((lp[0] - lp[j]) - (top_vals[0] - top_vals[k])) < 2e-3 * scale
    # text candidates: " Paris" is the transformers argmax
    r = _post(adapter, "/v1/systemone", {"model": "smollm2", "context": case["prompt"],
                                         "candidates": [" London", " Paris"]})
    assert r.json()["best"] == 1 and r.json()["best_text"] == " Paris"


def test_classify(adapter):
    r = _post(adapter, "/v1/classify", {"model": "smollm2", "text": "The capital of France is Paris.",
                                        "labels": ["geography", "cooking"]})
    assert r.status_code == 200, r.text
    d = r.json()
    p = d["probs"]
    assert set(p) == {"geography", "cooking"} and abs(sum(p.values()) - 1) < 1e-6
    lp = np.array([d["logprobs"][k] for k in ("geography", "cooking")])
    assert np.allclose([p["geography"], p["cooking"]], np.exp(lp - lp.max()) / np.exp(lp - lp.max()).sum())
    _oai_error(_post(adapter, "/v1/classify", {"model": "smollm2", "text": "x", "labels": "ab"}), 400)


# ------------------------------------------------------------------ embeddings
def _emb_ref(n):
    with gzip.open(os.path.join(DATA, "embedding_ref_minilm.json.gz")) as fh:
        ref = json.load(fh)
    dim = int(ref["dim"])
    want = np.frombuffer(base64.b64decode(ref["embeddings_f16"]), dtype="<f2").astype(np.float32)
    return ref, want.reshape(-1, dim)[:n]


@needs_minilm
def test_embeddings_default_base64(client):
    ref, want = _emb_ref(3)
    r = client.embeddings.create(model="minilm", input=ref["texts"][:3])  # client asks for base64
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    assert got.shape == want.shape and np.abs(got - want).max() < 2e-3  # ref stored as f16
    assert [d.index for d in r.data] == [0, 1, 2]
    assert r.usage.prompt_tokens == sum(len(i) for i in ref["ids"][:3])
    f = client.embeddings.create(model="minilm", input=ref["texts"][0], encoding_format="float")
    assert np.abs(np.array(f.data[0].embedding) - got[0]).max() < 1e-6
    ids = client.embeddings.create(model="minilm", input=ref["ids"][0])
    assert np.abs(np.array(ids.data[0].embedding) - got[0]).max() < 1e-5
    ok = client.embeddings.create(model="minilm", input="x", dimensions=got.shape[1])
    assert len(ok.data[0].embedding) == got.shape[1]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="minilm", input="x", dimensions=8)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="minilm", input=[])


# ------------------------------------------------------------------ retrieval
@needs_rag
def test_chat_with_retrieval(client):
    q = "Which TCP port does the Zorblax protocol listen on?"
    plain = client.chat.completions.create(model="smollm2", max_tokens=2, temperature=0,
                                           messages=[{"role": "user", "content": q}])
    r = client.chat.completions.create(model="docs-bot", max_tokens=8, temperature=0,
                                       messages=[{"role": "user", "content": q}])
    src = r.model_extra["sources"]
    assert src and src[0]["source"].endswith("zorblax.md") and src[0]["n"] == 1
    assert "4711" in src[0]["text"]
    # the prompt carries the retrieved chunk(s): far more tokens than the bare question
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 30
    assert r.model == "docs-bot" and "docs-bot" in [m.id for m in client.models.list().data]
    # the extension field on a plain model does the same
    r2 = client.chat.completions.create(model="smollm2", max_tokens=8, temperature=0,
                                        messages=[{"role": "user", "content": q}],
                                        extra_body={"retrieval": {"index": "kb", "top_k": 1}})
    assert [s["source"] for s in r2.model_extra["sources"]] == [src[0]["source"]]
    assert r2.choices[0].message.content == r.choices[0].message.content or len(src) > 1
    # nothing relevant: said so, no sources, no generation
    r3 = client.chat.completions.create(model="docs-bot", max_tokens=8, temperature=0,
                                        messages=[{"role": "user", "content": "Who won the 1998 World Cup?"}])
    assert r3.model_extra["sources"] == [] and "nothing relevant" in r3.choices[0].message.content
    assert r3.usage.completion_tokens == 0
    # streaming: sources on the first chunk
    chunks = list(client.chat.completions.create(model="docs-bot", max_tokens=4, temperature=0,
                                                 stream=True, messages=[{"role": "user", "content": q}]))
    assert chunks[0].model_extra["sources"][0]["source"] == src[0]["source"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", max_tokens=2, messages=[{"role": "user", "content": q}],
                                       extra_body={"retrieval": {"index": "no-such-index"}})


# ------------------------------------------------------------------ errors
def test_errors(adapter, client):
    # malformed JSON, wrong types, missing fields
    _oai_error(_post(adapter, "/v1/chat/completions", content=b'{"model": "smollm2", "mess'), 400,
               code="invalid_json")
    _oai_error(_post(adapter, "/v1/chat/completions", {"model": "smollm2", "messages": "hi"}), 400,
               param="messages")
    _oai_error(_post(adapter, "/v1/chat/completions",
                     {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
                      "temperature": "hot"}), 400, param="temperature")
    _oai_error(_post(adapter, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
               400, param="model")
    _oai_error(_post(adapter, "/v1/chat/completions",
                     {"model": "smollm2", "messages": [{"role": "wizard", "content": "x"}]}), 400)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "x"}], n=2)
    assert e.value.body["param"] == "n"
    # unknown model
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found"
    # bad key, no key
    _oai_error(_post(adapter, "/v1/chat/completions", {"model": "smollm2", "messages": []},
                     key="wrong"), 401, code="invalid_api_key")
    assert httpx.get(adapter + "/v1/models").status_code == 401
    # too large: body, prompt; and a prompt past the engine context (256 tokens)
    big = {"model": "smollm2", "messages": [{"role": "user", "content": "a" * 70000}]}
    _oai_error(_post(adapter, "/v1/chat/completions", big), 413, code="request_too_large")
    _oai_error(_post(adapter, "/v1/chat/completions",
                     {"model": "smollm2", "messages": [{"role": "user", "content": "word " * 5000}]}),
               413, code="prompt_too_large")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", max_tokens=4,
                                       messages=[{"role": "user", "content": "word " * 400}])
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:  # the streamed form fails before streaming
        client.chat.completions.create(model="smollm2", max_tokens=4, stream=True,
                                       messages=[{"role": "user", "content": "word " * 400}])
    # unknown route, in OpenAI's shape too
    _oai_error(_post(adapter, "/v1/nothing", {}), 404)
    # and the engine still answers
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": Q}],
                                       max_tokens=3, temperature=0)
    assert r.choices[0].message.content == "The capital of"


# ------------------------------------------------------------------ queue, engine death, restart
def test_queue_then_engine_killed_mid_stream(adapter, client):
    """--max-queue 1 --queue-timeout 1: while one request streams, a second waits and gets 503 after
    1 s, a third (queue full) gets 429 at once; then the engine is killed mid-stream: the stream
    ends with an error (no hang), requests get 503 while it restarts, and it serves again."""
    stream = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Count from 1 to 500, one number per line."}],
        max_tokens=200, temperature=0, stream=True)
    it = iter(stream)
    next(it), next(it)  # role chunk + first token: the engine is busy now
    waiter = {}

    def second():
        waiter["r"] = _post(adapter, "/v1/chat/completions",
                            {"model": "smollm2", "max_tokens": 2,
                             "messages": [{"role": "user", "content": "hi"}]})

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.3)
    _oai_error(_post(adapter, "/v1/chat/completions", {"model": "smollm2", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "hi"}]}),
               429, code="queue_full")
    t.join(timeout=30)
    _oai_error(waiter["r"], 503, code="engine_unavailable")

    pid = httpx.get(adapter + "/health").json()["engines"]["smollm2"]["pid"]
    os.kill(pid, 9)
    got = []
    with pytest.raises(openai.APIError):
        for c in it:
            got.append(c)
    assert all(c.choices[0].finish_reason is None for c in got if c.choices)  # it did not "finish"
    h = httpx.get(adapter + "/health")
    if h.status_code == 503:  # restarting (the new engine may already be up on a fast machine)
        assert h.json()["engines"]["smollm2"]["state"] in ("restarting", "starting")
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="smollm2", max_tokens=2,
                                           messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503
    deadline = time.monotonic() + 120
    while httpx.get(adapter + "/health").status_code != 200:
        assert time.monotonic() < deadline, "engine was not restarted"
        time.sleep(0.2)
    h = httpx.get(adapter + "/health").json()["engines"]["smollm2"]
    assert h["restarts"] == 1 and h["pid"] != pid
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": Q}],
                                       max_tokens=12, temperature=0)
    assert r.choices[0].message.content == "The capital of France is Paris."


# ------------------------------------------------------------------ serverless handler
def test_serverless_handler_plain():
    """docker/handler.py: one cold process answers one JSON request from stdin."""
    env = dict(os.environ, PYTHONPATH=ROOT, REFLEX_BACKEND="numpy")
    req = {"model": SMOL, "messages": [{"role": "user", "content": Q}], "max_tokens": 12}
    p = subprocess.run([sys.executable, "docker/handler.py"], input=json.dumps(req).encode(),
                       capture_output=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    out = json.loads(p.stdout)
    assert out["text"] == "The capital of France is Paris." and out["finish_reason"] == "stop"
    assert out["process_s"] is None or out["process_s"] >= out["timings"]["load_s"]
    for bad in (b"{nope", b'{"model": "/no/such.gguf", "prompt": "x"}', b'{"x": 1}'):
        p = subprocess.run([sys.executable, "docker/handler.py"], input=bad, capture_output=True,
                           cwd=ROOT, env=env, timeout=120)
        assert p.returncode == 2 and "error" in json.loads(p.stdout), bad
