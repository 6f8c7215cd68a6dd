"""Op-level shadow diff of two backends: which ops-interface call first goes wrong.

    python3 scripts/backend_diff.py MODEL.gguf [--prompt-ids 1,2,3] [--decode 2] [--tree]
                                    [--backend cuda] [--ref numpy] [--tol 1e-3] [--all]

The model is loaded on a proxy backend (`ShadowBackend`). Every call the model makes (base.py's
ops, the family mixins' ops, any other backend method) runs on the test backend exactly as in a
plain run, and is recorded. After each forward() the recorded calls are replayed on the reference
backend in call order, each with its inputs converted to NumPy from the *test* backend's values
(`to_numpy`), so every op is checked on its own inputs and errors do not accumulate; the op whose
output deviates beyond --tol (relative L2) is the suspect. Replaying only after the forward keeps
the test backend's deferred-op fusion (cuda_backend.py: products, rope, kv writes and activations
launch lazily) exactly as in a plain run: reading an output early would launch it unfused.

Weights are prepared by both backends from the same GGUF bytes (the reference keeps its own).
Buffers written in place (KV caches from zeros(), recurrent states from ssm_state / state_copy:
"stateful") also have a reference copy of their own: in-place ops (kv_write, gated_delta_rule's
state, ssm_scan ...) update it on the reference side and the buffer is compared after the call,
and later ops (attention) read the reference's own copy, so a wrong cache write is caught where it
happens and the comparison continues. Within one forward each cache/state is written once, so
comparing the test buffer at replay time (end of the forward) sees the state right after its write.

--kv-from-test: attention on the reference reads the test's cache values instead of its own copy, so
a float16 KV cache (CUDA) does not count against the attention kernel; kv_write still shows the
storage rounding (~2e-4 relative for float16).

Prints the per-op table (calls, worst relative L2, worst max |diff|) and the first deviating call
(name, layer from the model's call stack, caller line, argument shapes and scalars such as n_rot,
freq_base, mode, window, scale), plus the end-to-end logits error of plain runs on both backends.
Exit status 1 when some op deviates.

--sensitivity EPS instead measures the model's conditioning on NumPy: how far its logits move when
one op kind's outputs get relative noise EPS, and with a float16 KV cache (see sensitivity()).
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from reflex.backends.base import Backend  # noqa: E402

STATEFUL_OPS = ("zeros", "ssm_state", "state_copy")  # their outputs are buffers written in place
_MODELS_DIR = os.sep + os.path.join("reflex", "models") + os.sep


def _reads_cache(name: str) -> bool:
    """Ops that only read a cache (never write it): with --kv-from-test they see the test's values."""
    return "attention" in name or "attn" in name


class Pair:
    """An array of the test backend; `ref` is the reference's own copy (weights, caches, states)
    or None (activations: the reference reads to_numpy(test))."""

    __slots__ = ("test", "ref", "stateful", "__weakref__")

    def __init__(self, test, ref=None, stateful=False):
        self.test, self.ref, self.stateful = test, ref, stateful

    shape = property(lambda self: tuple(self.test.shape))
    ndim = property(lambda self: len(self.test.shape))
    size = property(lambda self: int(np.prod(self.test.shape)))
    dtype = property(lambda self: getattr(self.test, "dtype", None))

    def __len__(self):
        return self.test.shape[0]

    def reshape(self, *shape):
        return Pair(self.test.reshape(*shape), None if self.ref is None else self.ref.reshape(*shape),
                    self.stateful)

    def __getitem__(self, key):
        return Pair(self.test[key], None if self.ref is None else self.ref[key], self.stateful)

    def __repr__(self):
        return f"Pair({self.test!r})"


def _caller():
    """(layer index or None, 'file:line function' of the innermost model frame)."""
    layer, where = None, None
    for fr in inspect.stack(context=0)[2:]:
        if _MODELS_DIR not in fr.filename:
            continue
        if where is None:
            where = f"{os.path.basename(fr.filename)}:{fr.lineno} {fr.function}"
        i = fr.frame.f_locals.get("i")
        if layer is None and isinstance(i, (int, np.integer)) and not isinstance(i, bool):
            layer = int(i)
    return layer, where


def _describe(v):
    if isinstance(v, Pair):
        return f"{'state' if v.stateful else 'array'}{tuple(v.shape)}"
    if isinstance(v, np.ndarray):
        return f"ndarray{v.shape}{':' + str(v.dtype) if v.dtype != np.float32 else ''}"
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__}[{len(v)}]"
    if v is None or isinstance(v, (bool, int, float, str, np.generic)):
        return repr(v.item() if isinstance(v, np.generic) else v)
    return type(v).__name__


def rel_l2(got, want) -> tuple[float, float]:
    got = np.nan_to_num(np.asarray(got, dtype=np.float64), nan=1e30, posinf=1e30, neginf=-1e30)
    want = np.nan_to_num(np.asarray(want, dtype=np.float64), nan=1e30, posinf=1e30, neginf=-1e30)
    if got.shape != want.shape:
        return float("inf"), float("inf")
    if not got.size:
        return 0.0, 0.0
    d = got - want
    return float(np.linalg.norm(d) / max(np.linalg.norm(want), 1e-30)), float(np.abs(d).max())


class _Call:
    __slots__ = ("seq", "name", "args", "kwargs", "out", "layer", "where", "desc")

    def __init__(self, seq, name, args, kwargs, out, layer, where):
        self.seq, self.name, self.args, self.kwargs, self.out = seq, name, args, kwargs, out
        self.layer, self.where = layer, where
        self.desc = ", ".join([_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()])


class ShadowBackend(Backend):
    """The proxy: runs the test backend, records every call, replays it on the reference (replay())."""

    _OWN = ("test", "ref", "tol", "log", "rows", "first", "_seq", "_queue")

    def __init__(self, test: Backend, ref: Backend, tol: float = 1e-3, stack: bool = True,
                 kv_from_test: bool = False):
        object.__setattr__(self, "test", test)
        object.__setattr__(self, "ref", ref)
        self.tol = tol
        self.kv_from_test = kv_from_test
        self.stack = stack
        self.rows = {}      # op name -> [calls, worst rel, worst abs, seq of worst]
        self.first = None   # the first deviating call, as a dict
        self.log = []       # every checked call: (seq, name, layer, rel, abs)
        self._seq = 0
        self._queue = []

    # attributes other than the ops (name, capturing, device_sampling ...) are the test backend's
    def __getattr__(self, name):
        attr = getattr(self.test, name)
        if callable(attr) and not name.startswith("_"):
            return lambda *a, **k: self._call(name, a, k)
        return attr

    @property
    def name(self):
        return self.test.name

    def _call(self, name, args, kwargs):
        test_args = [a.test if isinstance(a, Pair) else a for a in args]
        test_kwargs = {k: (v.test if isinstance(v, Pair) else v) for k, v in kwargs.items()}
        out = getattr(self.test, name)(*test_args, **test_kwargs)
        if name == "to_numpy":                      # the model reads a value: give it the test's
            return out
        stateful = name in STATEFUL_OPS
        ref_own = None
        if name == "prepare_weight" or stateful:    # the reference builds its own copy now
            ref_args = [self._ref_in(a) for a in args]
            ref_own = getattr(self.ref, name)(*ref_args, **kwargs)
        wrapped = self._wrap(out, ref_own, stateful)
        if name != "prepare_weight":
            layer, where = _caller() if self.stack else (None, None)
            self._queue.append(_Call(self._seq, name, args, kwargs, wrapped, layer, where))
            self._seq += 1
        return wrapped

    def _wrap(self, out, ref_own, stateful):
        if isinstance(out, tuple):
            return tuple(self._wrap(o, r, stateful)
                         for o, r in zip(out, ref_own if ref_own is not None else [None] * len(out)))
        if out is None or isinstance(out, (bool, int, float, str, np.generic)):
            return out  # (a NumPy test backend's arrays are np.ndarray: wrapped like any other)
        return Pair(out, ref_own, stateful)

    def _ref_in(self, a):
        if isinstance(a, Pair):
            return a.ref if a.ref is not None else self.test.to_numpy(a.test)
        if isinstance(a, (list, tuple)) and any(isinstance(e, Pair) for e in a):
            return type(a)(self._ref_in(e) for e in a)
        return a

    def _check(self, c, what, got, want):
        rel, mx = rel_l2(got, want)
        row = self.rows.setdefault(c.name, [0, 0.0, 0.0, -1])
        row[0] += 1
        if rel > row[1] or row[3] < 0:
            row[1], row[2], row[3] = max(rel, row[1]), max(mx, row[2]), c.seq
        row[2] = max(row[2], mx)
        self.log.append((c.seq, c.name, c.layer, rel, mx))
        if rel > self.tol and self.first is None:
            self.first = {"seq": c.seq, "op": c.name, "layer": c.layer, "where": c.where, "args": c.desc,
                          "output": what, "rel": rel, "max_abs": mx}

    def replay(self):
        """Run the recorded calls on the reference, in order, and compare."""
        q, self._queue = self._queue, []
        for c in q:
            if c.name in STATEFUL_OPS:
                continue  # made on both sides at call time (zeros compare trivially)
            fn = getattr(self.ref, c.name, None)
            if fn is None:
                row = self.rows.setdefault(c.name + " (no reference)", [0, 0.0, 0.0, -1])
                row[0] += 1
                continue
            if self.kv_from_test and _reads_cache(c.name):
                for a in list(c.args) + list(c.kwargs.values()):
                    if isinstance(a, Pair) and a.stateful and isinstance(a.ref, np.ndarray):
                        a.ref[...] = self.test.to_numpy(a.test)  # the test's (e.g. float16) cache values
            ref_args = [self._ref_in(a) for a in c.args]
            ref_kwargs = {k: self._ref_in(v) for k, v in c.kwargs.items()}
            want = fn(*ref_args, **ref_kwargs)
            outs = c.out if isinstance(c.out, tuple) else (c.out,)
            wants = want if isinstance(want, tuple) else (want,)
            for j, (o, w) in enumerate(zip(outs, wants)):
                if isinstance(o, Pair):
                    self._check(c, f"output {j}", self.test.to_numpy(o.test), w)
                    if o.stateful and o.ref is None and isinstance(w, np.ndarray):
                        o.ref = w
            for j, a in enumerate(list(c.args) + list(c.kwargs.values())):
                if isinstance(a, Pair) and a.stateful:  # written in place? compare after the call
                    self._check(c, f"in-place arg {j}", self.test.to_numpy(a.test), a.ref)

    def report(self, out=sys.stdout):
        print(f"{'op':<26}{'calls':>7}{'worst rel L2':>15}{'max |diff|':>13}  worst at call", file=out)
        for name, (n, rel, mx, seq) in sorted(self.rows.items(), key=lambda kv: -kv[1][1]):
            flag = "  <-- over tol" if rel > self.tol else ""
            print(f"{name:<26}{n:>7}{rel:>15.3e}{mx:>13.3e}  #{seq}{flag}", file=out)
        if self.first is None:
            print(f"no op deviates beyond rel L2 {self.tol:g}", file=out)
        else:
            f = self.first
            print(f"FIRST DEVIATION (tol {self.tol:g}): call #{f['seq']} {f['op']}({f['args']}) "
                  f"layer {f['layer']} at {f['where']}: {f['output']} rel L2 {f['rel']:.3e}, "
                  f"max |diff| {f['max_abs']:.3e}", file=out)


for _n in [m for m in dir(Backend) if not m.startswith("_") and callable(getattr(Backend, m))]:
    # every public Backend method (abstract or with a default body) goes through _call, so a
    # backend's own override (fused swiglu ...) is what runs, and is what is compared
    setattr(ShadowBackend, _n, (lambda n: lambda self, *a, **k: self._call(n, a, k))(_n))
ShadowBackend.__abstractmethods__ = frozenset()


def _logits(model, out):
    return model.backend.to_numpy(out.test if isinstance(out, Pair) else out)


def _tree(ids, n_ctx_keep=None):
    """A 2-branch tree after the first half of ids: (ctx, a, b, positions, mask) as system1 builds."""
    C = max(1, len(ids) // 2)
    ctx, rest = ids[:C], ids[C:]
    a, b = rest[: max(1, len(rest) // 2)], rest[max(1, len(rest) // 2):] or rest[:1]
    A, B = len(a), len(b)
    mask = np.zeros((A + B, C + A + B), dtype=bool)
    mask[:, :C] = True
    mask[:A, C:C + A] = np.tril(np.ones((A, A), dtype=bool))
    mask[A:, C + A:] = np.tril(np.ones((B, B), dtype=bool))
    pos = np.concatenate([np.arange(C, C + A), np.arange(C, C + B)])
    return ctx, a + b, pos, mask


def drive(model, ids, n_decode: int, tree: bool, on_forward=None) -> list:
    """The forwards the diff runs: prefill ids, n_decode greedy steps, optionally a tree-mask forward
    over a fresh cache. Returns each forward's logits (numpy)."""
    outs = []

    def fwd(*a, **k):
        o = model.forward(*a, **k)
        if on_forward is not None:
            on_forward()
        outs.append(_logits(model, o))
        return outs[-1]

    cache = model.new_cache(len(ids) + n_decode + 1)
    lg = fwd(ids, cache)
    for _ in range(n_decode):
        lg = fwd([int(np.argmax(lg[-1]))], cache)
    if tree and getattr(model, "tree_mask", True):
        ctx, branch, pos, mask = _tree(ids)
        c2 = model.new_cache(len(ctx) + len(branch))
        fwd(ctx, c2)
        fwd(branch, c2, positions=pos, attn_mask=mask)
    return outs


def run_diff(path, test: Backend, ref: Backend, ids, n_decode=2, tol=1e-3, tree=False, end_to_end=True,
             out=sys.stdout, kv_from_test=False):
    """Shadow-diff `path` on test vs ref. Returns the ShadowBackend (its .first, .rows, .log)."""
    from reflex.models import load_model

    shadow = ShadowBackend(test, ref, tol, kv_from_test=kv_from_test)
    model = load_model(path, shadow)
    got = drive(model, ids, n_decode, tree, on_forward=shadow.replay)
    shadow.report(out)
    if end_to_end:
        # plain runs (no proxy) on each backend: does the error the proxy localizes reproduce?
        plain_t = drive(load_model(path, test), ids, n_decode, tree)
        plain_r = drive(load_model(path, ref), ids, n_decode, tree)
        for k, (pt, pr, g) in enumerate(zip(plain_t, plain_r, got)):
            print(f"forward {k}: logits rel L2 plain {test.name} vs {ref.name} {rel_l2(pt, pr)[0]:.3e}; "
                  f"proxied {test.name} vs plain {test.name} {rel_l2(g, pt)[0]:.3e}", file=out)
    return shadow


SENSITIVITY_OPS = ("matmul", "rms_norm", "attention", "rope", "add", "mul", "embed")


def sensitivity(path, ids, eps=1e-4, ref_name="numpy", out=sys.stdout) -> dict:
    """How much the model's prompt logits move (max |d| / max |logit|) when every output of one op
    kind gets relative noise eps (seeded), and when the KV cache is stored in float16 (as the CUDA
    backend keeps it), all on the NumPy backend. A fixture whose logits move by >> eps amplifies any
    backend's rounding: a tolerance on it says more about the fixture than about the backend."""
    from reflex.backends.numpy_backend import NumpyBackend
    from reflex.models import load_model

    def logits(backend):
        m = load_model(path, backend)
        return m.forward(ids, m.new_cache(len(ids)))

    base = logits(NumpyBackend())
    res = {}
    for op in SENSITIVITY_OPS + ("float16 KV",):
        rng = np.random.default_rng(0)

        class Noisy(NumpyBackend):
            pass

        if op == "float16 KV":
            def kv_write(self, cache, x, start, _f=NumpyBackend.kv_write):
                _f(self, cache, np.asarray(x, np.float32).astype(np.float16).astype(np.float32), start)
            Noisy.kv_write = kv_write
        else:
            def noisy(self, *a, _f=getattr(NumpyBackend, op), **k):
                o = _f(self, *a, **k)
                return (o * (1 + np.float32(eps) * rng.standard_normal(o.shape).astype(np.float32))).astype(np.float32)
            setattr(Noisy, op, noisy)
        res[op] = float(np.abs(logits(Noisy()) - base).max() / max(np.abs(base).max(), 1e-30))
        label = op if op == "float16 KV" else f"{op} x (1 + {eps:g} noise)"
        print(f"{label:<34} logits move {res[op]:.2e} of max |logit|", file=out)
    return res


def _backend(name):
    from reflex.backends import get_backend
    return get_backend(name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--prompt-ids", default="2,10,20,30,40,50,60,70,80,90,100,110",
                    help="comma-separated token ids (default: 12 small ids)")
    ap.add_argument("--decode", type=int, default=2, help="greedy decode steps after the prefill")
    ap.add_argument("--tree", action="store_true", help="also a system1-style tree-mask forward")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--ref", default="numpy")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--kv-from-test", action="store_true",
                    help="attention on the reference reads the test backend's cache values (the CUDA "
                         "float16 KV): isolates the attention kernel from the cache's storage precision")
    ap.add_argument("--sensitivity", type=float, default=0.0, metavar="EPS",
                    help="instead: the fixture's conditioning on NumPy (logits movement under relative "
                         "noise EPS per op kind, and under a float16 KV cache)")
    ap.add_argument("--all", action="store_true", help="print every checked call over tol, not only the first")
    a = ap.parse_args(argv)
    ids = [int(s) for s in a.prompt_ids.split(",") if s.strip()]
    if a.sensitivity:
        sensitivity(a.model, ids, a.sensitivity)
        return 0
    shadow = run_diff(a.model, _backend(a.backend), _backend(a.ref), ids, a.decode, a.tol, a.tree,
                      kv_from_test=a.kv_from_test)
    if a.all:
        for seq, name, layer, rel, mx in shadow.log:
            if rel > a.tol:
                print(f"  #{seq} {name} layer {layer}: rel {rel:.3e} max {mx:.3e}")
    return 1 if shadow.first is not None else 0


if __name__ == "__main__":
    sys.exit(main())
