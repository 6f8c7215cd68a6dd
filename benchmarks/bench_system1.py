"""system1 benchmark: N candidates scored in one tree-masked forward vs one plain forward over the
context plus the longest candidate (the issue's 1.3x goal) and vs N separate forwards.

python benchmarks/bench_system1.py [model.gguf] [--ctx 200] [--cands 8] [--len 8] [--reps 5]

Context and candidates are token ids cut from tests/data/tokenizer_corpus.txt (candidates start at
different offsets, so they share no prefix: the tree has N*(len-1) nodes, the worst case). Each
timing is the best of --reps after one warm-up; every forward gets a fresh KV cache.
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
MODELS = os.environ.get("REFLEX_MODELS", os.path.expanduser("~/.cache/reflex/models"))


def best(fn, reps):
    fn()  # warm-up (first-touch of weights, BLAS threads)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), sorted(ts)[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ctx", type=int, default=200)
    ap.add_argument("--cands", type=int, default=8)
    ap.add_argument("--len", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backend", default="numpy")
    a = ap.parse_args()

    from reflex import system1
    from reflex.gguf import GGUFFile
    from reflex.models import load_model
    from reflex.tokenizer import Tokenizer

    f = GGUFFile(a.model)
    tok = Tokenizer.from_gguf(f)
    model = load_model(f, a.backend)
    with open(os.path.join(ROOT, "tests", "data", "tokenizer_corpus.txt"), encoding="utf-8") as fh:
        ids = tok.encode(fh.read(), add_special=False)
    ctx = ids[:a.ctx]
    cands = [ids[a.ctx + 100 * (i + 1):a.ctx + 100 * (i + 1) + a.len] for i in range(a.cands)]
    assert len(ctx) == a.ctx and all(len(c) == a.len for c in cands)
    longest = ctx + cands[0]

    def plain():
        model.forward(longest, model.new_cache(len(longest)), last_only=True)

    def tree():
        system1.score_ids(model, ctx, cands)

    def separate():
        for c in cands:
            x = ctx + c
            model.forward(x, model.new_cache(len(x)))

    t_plain, m_plain = best(plain, a.reps)
    t_tree, m_tree = best(tree, a.reps)
    t_sep, m_sep = best(separate, max(1, a.reps // 2))
    n_tree = a.ctx + system1.build_tree(a.ctx, cands).n_nodes
    print(f"{os.path.basename(a.model)} backend={a.backend} context={a.ctx} candidates={a.cands}x{a.len} "
          f"(tree forward over {n_tree} tokens) | os.cpu_count()={os.cpu_count()} "
          f"loadavg={os.getloadavg()[0]:.2f}")
    print(f"  one forward, context + longest candidate ({len(longest)} tok, last logits): "
          f"best {t_plain*1e3:.0f} ms, median {m_plain*1e3:.0f} ms")
    print(f"  system1 score, one tree-masked forward:                  "
          f"best {t_tree*1e3:.0f} ms, median {m_tree*1e3:.0f} ms")
    print(f"  {a.cands} separate full forwards:                            "
          f"best {t_sep*1e3:.0f} ms, median {m_sep*1e3:.0f} ms")
    print(f"  ratio system1 / one forward: best {t_tree/t_plain:.3f}, median {m_tree/m_plain:.3f} (goal <= 1.3); "
          f"separate / system1: {t_sep/t_tree:.2f}x")


if __name__ == "__main__":
    main()
