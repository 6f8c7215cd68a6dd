"""Fixtures shared by test files."""
import os

import pytest


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    """A vocab-only GGUF (SmolLM2's tokenizer) for synthetic models: $REFLEX_VOCAB_GGUF, else
    written from the store's smollm2; skips when neither exists."""
    p = os.environ.get("REFLEX_VOCAB_GGUF")
    if p and os.path.exists(p):
        return p
    from reflex.store import resolve
    try:
        real = resolve("smollm2")
    except Exception:
        pytest.skip("no vocab GGUF (set REFLEX_VOCAB_GGUF) and no smollm2 in the store")
    from reflex.synth import synthesize
    out = tmp_path_factory.mktemp("vocab") / "vocab.gguf"
    synthesize(real, out, vocab_only=True)
    return str(out)
