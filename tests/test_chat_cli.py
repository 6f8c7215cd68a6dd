"""`reflex chat` driven through a pipe, as a user would type into it (skipped without SmolLM2).

One process, one model load: two greedy turns, /reset, an unknown command, a turn that overflows
the context (reported, history unchanged: the next turn is identical to the earlier turn 2), then EOF. The greedy answer "The capital of France is
Paris." is the one transformers gives (tests/test_engine.py::test_chat_paris covers the engine side);
here we check the REPL keeps history, resets it and exits cleanly."""
import json
import os
import subprocess
import sys

import pytest

MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
MODEL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_model = pytest.mark.skipif(not os.path.exists(MODEL), reason=f"model not found: {MODEL}")


def _chat(stdin: str, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "reflex", "chat", "-m", MODEL, *args],
                          input=stdin.encode(), capture_output=True, env=env, cwd=ROOT, timeout=300)


@needs_model
def test_chat_repl_history_reset_overflow_eof():
    q = "What is the capital of France?"
    big = "word " * 400  # far beyond --ctx 160 with the template around it
    lines = [q, "And of Italy?", "/reset", q, "/bogus", big, "And of Italy?"]  # then EOF
    p = _chat("\n".join(lines) + "\n", "--json", "--ctx", "160", "--max-tokens", "12",
              "--temperature", "0")
    assert p.returncode == 0, p.stderr.decode()
    out = [json.loads(s) for s in p.stdout.decode().splitlines()]
    assert len(out) == 5, out
    t1, t2, t3, err, t4 = out
    assert "Paris" in t1["text"] and t1["turn"] == 1
    # turn 2 carries turn 1 (question + answer) in its prompt
    assert t2["turn"] == 2 and t2["usage"]["prompt_tokens"] > t1["usage"]["prompt_tokens"] \
        + t1["usage"]["completion_tokens"]
    # after /reset the same question is asked afresh: same prompt, same greedy answer
    assert t3["turn"] == 1 and t3["usage"] == t1["usage"] and t3["tokens"] == t1["tokens"]
    assert err["error"]["category"] == "context_overflow"
    # the failed turn left the history as it was: this is turn 2 again, identical to the first one
    assert t4["turn"] == 2 and t4["usage"] == t2["usage"] and t4["tokens"] == t2["tokens"]
    stderr = p.stderr.decode()
    assert "(conversation reset)" in stderr and "unknown command /bogus" in stderr


@needs_model
def test_chat_repl_plain_text_and_exit():
    p = _chat("What is the capital of France?\n/exit\nnever read\n", "--max-tokens", "12",
              "--temperature", "0")
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().strip() == "The capital of France is Paris."
