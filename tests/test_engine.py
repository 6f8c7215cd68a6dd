"""Engine / sampler / CLI end to end on SmolLM2-135M-Instruct Q4_1 (skipped without the model).

Kept short (few generated tokens, one Engine per module) so it runs in well under a minute."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex.errors import ContextOverflow, InvalidRequest
from reflex.sampling import Sampler

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
MODEL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
REF = os.path.join(os.path.dirname(__file__), "data", "llama_ref_smollm2.json")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_model = pytest.mark.skipif(not os.path.exists(MODEL), reason=f"model not found: {MODEL}")


# ------------------------------------------------------------------ sampler (no model needed)
def test_sampler_top_k_1_is_greedy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.normal(size=500).astype(np.float32)
        assert Sampler(temperature=1.0, top_k=1, seed=3).sample(x) == int(np.argmax(x))
        assert Sampler(temperature=0).sample(x) == int(np.argmax(x))


def test_sampler_seeded_reproducible_and_varies():
    x = np.zeros(1000, dtype=np.float32)
    a = [Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7) for _ in range(2)]
    s1 = [a[0].sample(x) for _ in range(30)]
    s2 = [a[1].sample(x) for _ in range(30)]
    assert s1 == s2
    b = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=8)
    assert [b.sample(x) for _ in range(30)] != s1


def test_sampler_truncation():
    x = np.array([5.0, 4.9, 0.0, -10.0, -20.0])
    s = Sampler(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=0)
    assert {s.sample(x) for _ in range(200)} == {0, 1}
    s = Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=0)  # min-p drops 2, 3, 4
    assert {s.sample(x) for _ in range(200)} <= {0, 1}
    s = Sampler(temperature=1.0, top_k=0, top_p=0.1, min_p=0.0, seed=0)  # top-p keeps the best one
    assert {s.sample(x) for _ in range(50)} == {0}


def test_sampler_repeat_penalty():
    x = np.array([2.0, 1.9, 0.0])
    assert Sampler(temperature=0).sample(x, history=[0]) == 0
    assert Sampler(temperature=0, repeat_penalty=1.5).sample(x, history=[0]) == 1


@pytest.mark.parametrize("kw", [
    {"temperature": -1}, {"temperature": float("nan")}, {"top_k": -1}, {"top_k": 1.5},
    {"top_p": 0.0}, {"top_p": 1.5}, {"min_p": -0.1}, {"min_p": 2}, {"repeat_penalty": 0},
    {"repeat_last_n": -2}, {"seed": "x"}, {"temperature": "hot"},
])
def test_sampler_invalid_params(kw):
    with pytest.raises(InvalidRequest):
        Sampler(**kw)


# ------------------------------------------------------------------ engine on the real model
@pytest.fixture(scope="module")
def eng():
    if not os.path.exists(MODEL):
        pytest.skip(f"model not found: {MODEL}")
    from reflex.engine import Engine

    return Engine(MODEL)


@needs_model
def test_load_timings(eng):
    assert eng.n_ctx == min(eng.model.hp.n_ctx_train, 4096)
    assert eng.load_timings["load_s"] > 0


@needs_model
def test_greedy_matches_transformers(eng):
    with open(REF) as fh:
        case = json.load(fh)["cases"][0]
    n = 12
    # same text -> same prompt ids (SmolLM2 adds no BOS), and same ids -> same greedy tokens
    assert eng.tokenizer.encode(case["prompt"]) == case["prompt_ids"]
    r = eng.generate(case["prompt_ids"], max_tokens=n, temperature=0)
    assert r.tokens == case["greedy_ids"][:n]
    assert r.finish_reason == "length"
    assert r.usage == {"prompt_tokens": len(case["prompt_ids"]), "completion_tokens": n,
                       "total_tokens": len(case["prompt_ids"]) + n}
    assert case["greedy_text"].startswith(r.text)
    t = r.timings
    for k in ("load_s", "prefill_s", "prefill_tok_s", "decode_s", "decode_tok_s", "first_token_s"):
        assert t[k] is not None and t[k] > 0, k


@needs_model
def test_greedy_until_eog_matches_transformers(eng):
    # case 0 greedily reaches <|im_end|> (an end-of-generation token): it stops there, unemitted
    with open(REF) as fh:
        case = json.load(fh)["cases"][0]
    ref = case["greedy_ids"]
    cut = next(i for i, t in enumerate(ref) if t in eng.tokenizer.eog_ids)
    r = eng.generate(case["prompt"], max_tokens=len(ref), temperature=0)
    assert r.tokens == ref[:cut]
    assert r.finish_reason == "stop"
    assert r.text == eng.tokenizer.decode(ref[:cut])


@needs_model
def test_special_tokens_in_prompt(eng):
    # the chat-formatted case: special tokens must be parsed, and generation stops at <|im_end|>
    with open(REF) as fh:
        case = json.load(fh)["cases"][5]
    assert eng.tokenizer.encode(case["prompt"], parse_special=True) == case["prompt_ids"]
    r = eng.generate(case["prompt"], parse_special=True, max_tokens=16, temperature=0)
    ref = case["greedy_ids"]
    cut = next(i for i, t in enumerate(ref) if t in eng.tokenizer.eog_ids)
    assert r.tokens == ref[:cut] and r.finish_reason == "stop"
    assert r.text == "The answer is 4."


def test_stop_matcher_holds_back_prefixes():
    from reflex.engine import _StopMatcher

    m = _StopMatcher(["STOP", "xyz"])
    out = [m.push(p) for p in ["ab", "cS", "T", "x", "O", "P tail"]]
    assert out == ["ab", "c", "", "ST", "xO", "P tail"] and not m.hit  # "x" may start "xyz"
    m = _StopMatcher(["STOP"])
    assert m.push("abS") == "ab" and m.push("TO") == "" and m.push("Pzz") == "" and m.hit
    m = _StopMatcher(["STOP"])
    assert m.push("abST") == "ab" and m.push("x") == "STx" and m.flush() == "" and not m.hit
    m = _StopMatcher(["STOP"])
    assert m.push("abSTO") == "ab" and m.flush() == "STO"


@needs_model
def test_seeded_sampling(eng):
    kw = dict(max_tokens=6, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = eng.generate("Once upon a time", seed=1, **kw)
    b = eng.generate("Once upon a time", seed=1, **kw)
    c = eng.generate("Once upon a time", seed=2, **kw)
    assert a.tokens == b.tokens and a.text == b.text
    assert a.tokens != c.tokens


@needs_model
def test_stop_string_across_tokens(eng):
    # greedy continuation is " Paris" "." "\n" "\n" "The" ...; the stop spans four tokens
    r = eng.generate("The capital of France is", max_tokens=10, temperature=0, stop=[".\n\nThe"])
    assert r.finish_reason == "stop"
    assert r.text == " Paris"
    assert ".\n\nThe" not in r.text


@needs_model
def test_max_tokens_length(eng):
    r = eng.generate("Water boils at a temperature of", max_tokens=3, temperature=0)
    assert r.finish_reason == "length"
    assert r.usage["completion_tokens"] == 3 == len(r.tokens)


@needs_model
def test_streaming_matches(eng):
    kw = dict(max_tokens=8, temperature=0, stop=["answer"])
    whole = eng.generate("The capital of France is", **kw)
    it = eng.generate("The capital of France is", stream=True, **kw)
    pieces = list(it)
    assert "".join(pieces) == whole.text == it.result.text
    assert it.result.tokens == whole.tokens and it.result.finish_reason == whole.finish_reason == "stop"
    assert len(pieces) > 1


@needs_model
def test_context_overflow(eng):
    with pytest.raises(ContextOverflow):
        eng.generate([504] * eng.n_ctx, max_tokens=4)
    with pytest.raises(ContextOverflow):
        eng.generate("hello " * (eng.n_ctx + 10), max_tokens=4)


@needs_model
def test_invalid_requests(eng):
    with pytest.raises(InvalidRequest):
        eng.generate("")
    with pytest.raises(InvalidRequest):
        eng.generate([])
    with pytest.raises(InvalidRequest):
        eng.generate("hi", max_tokens=0)
    with pytest.raises(InvalidRequest):
        eng.generate("hi", temperature=-1)
    with pytest.raises(InvalidRequest):
        eng.generate("hi", bogus=1)


@needs_model
def test_chat_paris(eng):
    r = eng.chat([{"role": "user", "content": "What is the capital of France?"}],
                 max_tokens=12, temperature=0)
    assert "Paris" in r.text
    assert "<|im_start|>" not in r.text and "<|im_end|>" not in r.text


@needs_model
def test_smoke_cli():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "reflex", "smoke", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["ok"] and "Paris" in d["answer"] and d["usage"]["completion_tokens"] >= 1


def test_tokenize_command_json():
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "reflex", "tokenize", "--json", "--no-special",
                          "Hello world"], capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    assert d["ids"] == [19556, 905] and d["pieces"] == ["Hello", " world"]


def test_memory_reports_resident_weights(eng):
    """NumPy keeps one float32 copy per tensor (tied output shares the embedding's), so its resident
    weight bytes are 4 bytes per element of every tensor in the GGUF's table; the GGUF bytes are
    the table's own sizes."""
    import numpy as np

    m = eng.memory()
    tensors = eng.gguf.tensors.values()
    assert m["gguf_tensor_bytes"] == sum(t.nbytes for t in tensors)
    assert m["weight_bytes"] == sum(4 * int(np.prod(t.shape)) for t in tensors)
    assert m["process_rss_bytes"] is None or m["process_rss_bytes"] >= m["weight_bytes"] // 2
