"""The Runpod queue worker (`docker/handler.py --runpod`) run by the real `runpod` SDK.

runpod's `serverless.start` with `--test_input` runs exactly one job locally through the same code
path a queue endpoint uses (job -> handler -> result) and exits, so this is the worker as Runpod
runs it, minus the network. Runs where the `runpod` package is importable (`pip install
reflex[runpod]`, which the runpod-lb image has); skipped otherwise -- CI does not install it, its
dependency tree (boto3, aiohttp, paramiko...) is large. The plain stdin mode is tested in CI
(tests/test_adapter.py::test_serverless_handler_plain).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))
SMOL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("runpod") is None, reason="runpod SDK not installed"),
              pytest.mark.skipif(not os.path.exists(SMOL), reason=f"model not found: {SMOL}")]


def _job(inp, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + sys.path[1:]), REFLEX_BACKEND="numpy")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "docker", "handler.py"), "--runpod",
                        "--test_input", json.dumps({"input": inp})],
                       capture_output=True, cwd=tmp_path, env=env, timeout=300)
    text = p.stdout.decode() + p.stderr.decode()
    import ast
    # runpod logs the result (or, for a handler output with a top-level "error", the failed job's
    # error: that is how a Runpod job is marked FAILED) as a Python dict repr
    for ln in text.splitlines():
        for tag in ("Job result:", "failed with error:"):
            if tag in ln:
                return p.returncode, tag, ast.literal_eval(ln.split(tag, 1)[1].strip())
    raise AssertionError(text[-2000:])


def test_runpod_queue_job(tmp_path):
    rc, tag, res = _job({"model": SMOL, "prompt": "The capital of France is", "max_tokens": 4}, tmp_path)
    assert rc == 0 and tag == "Job result:"
    out = res["output"]
    assert out["text"].startswith(" Paris") and out["usage"]["completion_tokens"] == 4
    assert out["process_s"] is None or out["process_s"] >= out["timings"]["load_s"]


def test_runpod_queue_bad_request(tmp_path):
    """A categorized engine error marks the Runpod job FAILED with that error (not a crash)."""
    rc, tag, err = _job({"model": "/no/such.gguf", "prompt": "x"}, tmp_path)
    assert tag == "failed with error:" and err["category"] == "model_not_found", err
    rc, tag, err = _job({"x": 1}, tmp_path)
    assert tag == "failed with error:" and err["category"] == "invalid_request", err
