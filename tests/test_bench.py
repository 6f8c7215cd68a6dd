"""`reflex bench` end to end on a committed fixture (tests/data/fixtures/qwen3.gguf, 2 layers).

What is checked is the shape and sanity of the report (every field present, positive, stage stamps
increasing, the cold run's token equal to the engine's greedy token), not timings against
thresholds: those live in docs/benchmarks.md. The llama.cpp side runs against stand-in
llama-simple / llama-bench scripts written here (CI has no llama.cpp build): what is under test is
that the same file and lengths are passed and that their output is parsed into the ratios. The CUDA
test skips without a GPU and built kernels (same marker as tests/test_cuda_kernels.py)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "data" / "fixtures" / "qwen3.gguf"
PT, GT = 48, 8

FAKE_BENCH = """#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
# answer only for the file and lengths reflex bench used itself
ok = a[a.index("-m") + 1] == {model!r} and a[a.index("-p") + 1] == "{pt}" and a[a.index("-n") + 1] == "{gt}"
if not ok:
    sys.exit("unexpected arguments: " + " ".join(a))
print(json.dumps([{{"n_prompt": {pt}, "n_gen": 0, "avg_ts": 2000.0}}, {{"n_prompt": 0, "n_gen": {gt}, "avg_ts": 50.0}}]))
"""
FAKE_SIMPLE = """#!/usr/bin/env python3
import sys, time
a = sys.argv[1:]
if a[a.index("-m") + 1] != {model!r} or a[a.index("-n") + 1] != "1":
    sys.exit("unexpected arguments")
time.sleep(0.05)
print("Hello my name is X", flush=True)
time.sleep(0.1)   # teardown after the token: first_token must be timed apart from exit
"""


def _cli(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "reflex", "bench", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def _exe(path: Path, text: str):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    _exe(d / "llama-bench", FAKE_BENCH.format(model=str(FIX), pt=PT, gt=GT))
    _exe(d / "llama-simple", FAKE_SIMPLE.format(model=str(FIX)))
    r = _cli(FIX, "--runs", 2, "--prompt-tokens", PT, "--gen-tokens", GT, "--drop-caches", "--llama-cpp", d, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _pos(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def test_report_fields(report):
    assert report["backend"] == "numpy" and report["runs"] == 2
    assert report["prompt_tokens"] == PT and report["gen_tokens"] == GT
    (m,) = report["models"]
    assert Path(m["model"]) == FIX and m["arch"] == "qwen3" and m["n_layer"] == 2
    c = m["cold"]
    assert c["runs"] == 2 and len(c["all_s"]) == 2
    assert c["min_s"] <= c["median_s"] <= c["max_s"] and all(_pos(t) for t in c["all_s"])
    ft = c["first_token"]   # spawn -> first stdout byte, before the process has exited
    assert all(_pos(t) for t in ft["all_s"]) and all(a <= b for a, b in zip(ft["all_s"], c["all_s"]))
    assert _pos(c["python_noop_s"]) and _pos(c["import_numpy_alone_s"])
    # dropping caches either happened (a timed run) or says why not
    dc = c["dropped_caches"]
    assert _pos(dc["s"]) if "s" in dc else dc["skipped"]
    assert m["prefill"]["n_tokens"] == PT and _pos(m["prefill"]["tok_s"]) and _pos(m["prefill"]["median_s"])
    assert abs(m["prefill"]["tok_s"] * m["prefill"]["median_s"] - PT) < 1e-6 * PT
    d = m["decode"]
    assert d["n_tokens"] == GT and _pos(d["tok_s"]) and _pos(d["ms_per_tok"]) and _pos(d["first_step_s"])
    assert abs(d["tok_s"] * d["ms_per_tok"] - 1e3) < 1e-6 * 1e3
    mem = m["memory"]
    assert _pos(mem["peak_rss_bytes"]) and mem["weight_bytes"] >= m["gguf_tensor_bytes"] > 0
    # NumPy backend: energy is reported unavailable with a reason, never as a made-up number
    assert m["energy"]["available"] is False and m["energy"]["reason"]


def test_stage_stamps_increase(report):
    c = report["models"][0]["cold"]
    st = list(c["stages"].values())
    assert list(c["stages"]) == ["interpreter_start", "numpy", "engine_module", "imports", "open", "tokenizer", "weights_staged",
                                 "prefill", "first_token", "exit"]
    assert all(_pos(v) for v in st) and all(a <= b for a, b in zip(st, st[1:])), c["stages"]
    assert sum(c["stage_durations_s"].values()) == pytest.approx(st[-1], abs=1e-3)
    # the probe's process wall time is the exit stamp; the greedy token came from a real forward
    assert c["stages"]["exit"] == pytest.approx(c["probe"]["wall_s"], abs=1e-4)
    assert c["probe"]["gen"]["prefill_s"] > 0


def test_llama_cpp_ratios(report):
    m = report["models"][0]
    lc = m["llama_cpp"]
    assert lc["ngl"] == 0 and lc["pp_tok_s"] == 2000.0 and lc["tg_tok_s"] == 50.0
    assert lc["llama_simple"]["runs"] == 2 and lc["llama_simple"]["median_s"] >= 0.15
    ft = lc["llama_simple"]["first_token"]
    assert 0.05 <= ft["median_s"] <= lc["llama_simple"]["median_s"] - 0.09
    r = m["ratios"]
    assert r["prefill"] == pytest.approx(m["prefill"]["tok_s"] / 2000.0)
    assert r["decode"] == pytest.approx(m["decode"]["tok_s"] / 50.0)
    assert r["cold_speedup"] == pytest.approx(lc["llama_simple"]["median_s"] / m["cold"]["median_s"])
    assert r["first_token_speedup"] == pytest.approx(lc["llama_simple"]["first_token"]["median_s"]
                                                     / m["cold"]["first_token"]["median_s"])


def test_table_output():
    r = _cli(FIX, "--no-cold", "--runs", 1, "--prompt-tokens", 16, "--gen-tokens", 2)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:6] == ["model", "ttft", "med", "s", "cold", "med"] and lines[2].startswith("qwen3.gguf")
    assert lines[2].split()[1:3] == ["-", "-"]  # no cold numbers with --no-cold


@pytest.mark.parametrize("args,category,code", [
    (["/nonexistent/model.gguf"], "model_not_found", 3),
    ([FIX, "--prompt-tokens", 4000], "context_overflow", 6),   # fixture context is 2048
    ([FIX, "--prompt-tokens", 2000, "--gen-tokens", 128], "context_overflow", 6),
    ([FIX, "--runs", 0], "invalid_request", 2),
    ([FIX, "--llama-cpp", "/nonexistent/dir"], "invalid_request", 2),
])
def test_errors_are_categorized(args, category, code):
    r = _cli(*args, "--json", timeout=60)
    assert r.returncode == code, r.stderr
    assert json.loads(r.stdout)["error"]["category"] == category


def test_malformed_model(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    r = _cli(bad, "--json", timeout=60)
    assert r.returncode == 4, r.stderr
    assert json.loads(r.stdout)["error"]["category"] == "model_format"


def test_nvml_absent_is_reported():
    from reflex.bench import _nvml

    nv, why = _nvml()
    if nv is not None:
        pytest.skip("NVML present here")
    assert "NVML unavailable" in why


def _gpu():
    from reflex.backends import cuda_driver
    return os.path.exists(cuda_driver.default_fatbin()) and cuda_driver.available()


def test_cuda_unavailable_is_categorized():
    if _gpu():
        pytest.skip("a GPU and the kernels are here")
    r = _cli(FIX, "--backend", "cuda", "--json", timeout=60)
    assert r.returncode == 70, r.stderr
    assert json.loads(r.stdout)["error"]["category"] == "backend_unavailable"


@pytest.mark.skipif(not _gpu(), reason="no CUDA GPU or kernels not built")
def test_bench_cuda():
    r = _cli(FIX, "--backend", "cuda", "--runs", 2, "--prompt-tokens", 64, "--gen-tokens", 16, "--json")
    assert r.returncode == 0, r.stderr
    (m,) = json.loads(r.stdout)["models"]
    st = list(m["cold"]["stages"].values())
    assert all(a <= b for a, b in zip(st, st[1:])), m["cold"]["stages"]
    cc = m["cold"]["probe"]["cuda_context"]
    assert 0 < cc["started"] <= cc["context_ready"] <= cc["module_loaded"] <= m["cold"]["stages"]["weights_staged"]
    assert m["decode"]["graph"] is True and _pos(m["decode"]["graph_capture_s"]) and _pos(m["decode"]["tok_s"])
    assert _pos(m["decode_eager"]["tok_s"])
    mem = m["memory"]
    assert mem["peak_allocated_bytes"] >= mem["weight_bytes"] > 0
    e = m["energy"]
    assert (e["available"] and _pos(e["j_per_request_total"]) and e["requests"] >= 1) or e["reason"]
