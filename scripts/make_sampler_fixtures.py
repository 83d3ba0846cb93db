"""Build tests/fixtures/sampler/*.json: llama.cpp's samplers (DRY, top-n-sigma, XTC, min_keep, dynamic
temperature, mirostat 1 and 2, infill, adaptive-p) applied to seeded logits over a real model's vocabulary.

    LLAMA_CPP_LIB_PATH=build/bin PYTHONPATH=llama_cpp_python-0.3.36 \
        python scripts/make_sampler_fixtures.py [NAME=GGUF ...]

Needs libllama (llama.cpp built as a shared library: `cmake -B build -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF
&& cmake --build build --target llama`) and llama-cpp-python's ctypes bindings (its sdist's `llama_cpp`
package; `pip install diskcache` for its imports). Defaults to smollm2-135m and qwen2.5-coder-0.5b from the
edgellm model store. The logits are `np.random.default_rng(seed).standard_normal(n_vocab) * scale` in
float32, so the fixture holds only seeds, parameters and llama.cpp's answers. Only this script imports
llama_cpp; tests/test_sampler_llamacpp.py reads the fixtures.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "sampler"

DRY_TEXTS = [
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the",
    "Name: Alice\nAge: 30\nName: Bob\nAge: 31\nName: Alice\nAge:",
    '"quote" *bold* "quote" *bold* "quote" *bo',
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor i in range(10",
    "Question: what is two plus two?\n\nAnswer: four.\n\nQuestion: what is two plus two?\n\nAnswer:",
    "la " * 120,
]
# (multiplier, base, allowed_length, penalty_last_n, breakers)
DRY_PARAMS = [
    (0.8, 1.75, 2, 64, ["\n", ":", '"', "*"]),
    (1.0, 1.1, 1, 1000, ["\n", ":", '"', "*"]),
    (2.0, 3.0, 0, 1000, ["\n", ":", '"', "*"]),
    (0.8, 1.75, 2, 16, ["\n", ":", '"', "*"]),
    (1.5, 2.0, 2, 1000, ["Name:", "\n\n", "Answer", "(10"]),
    (0.8, 1.75, 2, 1000, []),
]


def logits(seed: int, n: int, scale: float) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class Llama:
    def __init__(self, path: Path):
        import llama_cpp.llama_cpp as L

        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        b = text.encode()
        buf = (self.L.llama_token * (len(b) + 16))()
        n = self.L.llama_tokenize(self.vocab, b, len(b), buf, len(buf), False, False)
        return list(buf[:n])

    def apply(self, samplers: list, x: np.ndarray) -> tuple[np.ndarray, int, bool]:
        """Run the samplers in order over x (ids 0..n-1); returns the surviving (id, logit, p) rows, the
        selected index (-1 if none) and whether llama.cpp marked them sorted."""
        L = self.L
        data = np.zeros(x.size, TOKEN_DATA)
        data["id"] = np.arange(x.size)
        data["logit"] = x
        arr = L.llama_token_data_array(
            data=ctypes.cast(data.ctypes.data, ctypes.POINTER(L.llama_token_data)),
            size=x.size, selected=-1, sorted=False,
        )  # fmt: skip
        for s in samplers:
            L.llama_sampler_apply(s, ctypes.byref(arr))
        addr = ctypes.cast(arr.data, ctypes.c_void_p).value
        out = np.frombuffer((ctypes.c_char * (arr.size * TOKEN_DATA.itemsize)).from_address(addr), TOKEN_DATA)
        return out.copy(), int(arr.selected), bool(arr.sorted)

    def dry(self, mult, base, allowed, last_n, breakers, history):
        L = self.L
        c = (ctypes.c_char_p * max(1, len(breakers)))(*[b.encode() for b in breakers])
        s = L.llama_sampler_init_dry(self.vocab, mult, base, allowed, last_n, c, len(breakers))
        for t in history:
            L.llama_sampler_accept(s, t)
        return s


def fixture(name: str, path: Path) -> dict:
    ll = Llama(path)
    L, n = ll.L, ll.n_vocab
    out: dict = {"model": name, "n_vocab": n, "dry": [], "top_n_sigma": [], "xtc": [], "min_keep": [],
                 "dynatemp": [], "mirostat": []}  # fmt: skip

    for ti, text in enumerate(DRY_TEXTS):
        history = ll.tokenize(text)
        for pi, (mult, base, allowed, last_n, breakers) in enumerate(DRY_PARAMS):
            seed = 100 + ti * 10 + pi
            x = logits(seed, n, 2.0)
            res, _, _ = ll.apply([ll.dry(mult, base, allowed, last_n, breakers, history)], x)
            y = np.empty(n, np.float32)
            y[res["id"]] = res["logit"]
            changed = np.flatnonzero(y != x)
            out["dry"].append({
                "seed": seed, "text": text, "history": history, "multiplier": mult, "base": base,
                "allowed_length": allowed, "last_n": last_n, "breakers": breakers,
                "changed": changed.tolist(), "values": [float(v) for v in y[changed]],
            })  # fmt: skip

    for seed, scale, n_inf in ((1, 3.0, 0), (2, 3.0, 100), (3, 1.0, 0)):
        x = logits(seed, n, scale)
        x[np.random.default_rng(seed + 50).choice(n, n_inf, replace=False)] = -np.inf
        for sigma in (0.3, 1.0, 2.0, 3.5):
            res, _, _ = ll.apply([L.llama_sampler_init_top_n_sigma(sigma)], x)
            kept = np.sort(res["id"][np.isfinite(res["logit"])])
            out["top_n_sigma"].append({"seed": seed, "scale": scale, "n_inf": n_inf, "n": sigma,
                                       "kept": kept.tolist() if kept.size < 4000 else None,
                                       "n_kept": int(kept.size)})  # fmt: skip

    for seed, scale in ((4, 4.0), (5, 5.0), (6, 6.5)):
        x = logits(seed, n, scale)
        for threshold in (0.0001, 0.01, 0.05, 0.1, 0.3):
            for min_keep in (0, 2, n - 2):
                res, _, _ = ll.apply([L.llama_sampler_init_xtc(1.0, threshold, min_keep, 1234)], x)
                removed = np.setdiff1d(np.arange(n), res["id"])
                out["xtc"].append({"seed": seed, "scale": scale, "threshold": threshold,
                                   "min_keep": min_keep, "removed": removed.tolist()})  # fmt: skip

    for seed, scale in ((7, 4.0), (8, 2.0)):
        x = logits(seed, n, scale)
        for kind, p in (("top_p", 0.5), ("top_p", 0.9), ("min_p", 0.1), ("min_p", 0.5), ("typical_p", 0.3)):
            for min_keep in (0, 1, 12, 300):
                init = {"top_p": L.llama_sampler_init_top_p, "min_p": L.llama_sampler_init_min_p,
                        "typical_p": L.llama_sampler_init_typical}[kind]  # fmt: skip
                res, _, _ = ll.apply([L.llama_sampler_init_top_k(2000), init(p, min_keep)], x)
                kept = np.sort(res["id"]).tolist()
                out["min_keep"].append({"seed": seed, "scale": scale, "kind": kind, "p": p,
                                        "min_keep": min_keep, "kept": kept})  # fmt: skip

    for seed, scale in ((9, 2.0), (10, 5.0)):
        x = logits(seed, n, scale)
        for temp, delta, exponent, top_k in ((0.8, 0.5, 1.0, 0), (0.8, 0.5, 2.0, 40), (1.2, 1.5, 0.5, 200),
                                             (0.0, 0.3, 1.0, 40)):  # fmt: skip
            chain = [L.llama_sampler_init_top_k(top_k)] if top_k else []
            res, _, _ = ll.apply(chain + [L.llama_sampler_init_temp_ext(temp, delta, exponent)], x)
            order = np.argsort(res["id"])
            out["dynatemp"].append({"seed": seed, "scale": scale, "temp": temp, "delta": delta,
                                    "exponent": exponent, "top_k": top_k,
                                    "ids": res["id"][order][:50].tolist(),
                                    "logits": [float(v) for v in res["logit"][order][:50]],
                                    "n": int(res.size)})  # fmt: skip

    out["infill"] = []
    words = ["return", " return", " ret", " re", "re", " retur", "\n", "\n    ", " x", " x1", ")", "):"]
    boost_ids = sorted({t for w in words for t in ll.tokenize(w)[:1]})
    eog = [t for t in (L.llama_vocab_eos(ll.vocab), L.llama_vocab_eot(ll.vocab)) if t >= 0]
    for seed in range(8):
        rng = np.random.default_rng(300 + seed)
        x = logits(300 + seed, n, 1.0)
        x[boost_ids] += rng.uniform(5.0, 9.0, len(boost_ids)).astype(np.float32)
        if seed % 3 == 0:
            x[eog] += np.float32(6.0 + seed)  # end-of-generation likely: only those stay
        top_k = (10, 40)[seed % 2]
        res, _, _ = ll.apply([L.llama_sampler_init_top_k(top_k), L.llama_sampler_init_infill(ll.vocab)], x)
        order = np.argsort(res["id"])
        out["infill"].append({"seed": 300 + seed, "boost": boost_ids, "eog": eog, "top_k": top_k,
                              "kept": res["id"][order].tolist(),
                              "logits": [float(v) for v in res["logit"][order]]})  # fmt: skip

    out["adaptive_p"] = []
    for target, decay, top_k in ((0.3, 0.9, 40), (0.05, 0.5, 200), (0.8, 0.99, 0), (0.5, 1.5, 20)):
        s = L.llama_sampler_init_adaptive_p(target, decay, 7)
        steps = []
        for step in range(5):
            seed = 400 + step
            x = logits(seed, n, 2.5)
            chain = [L.llama_sampler_init_top_k(top_k)] if top_k else []
            res, sel, _ = ll.apply(chain + [s], x)
            L.llama_sampler_accept(s, int(res["id"][sel]))  # the moving average takes the drawn token
            order = np.argsort(res["id"])[:60]
            steps.append({"seed": seed, "selected": int(res["id"][sel]), "ids": res["id"][order].tolist(),
                          "logits": [float(v) for v in res["logit"][order]]})  # fmt: skip
        out["adaptive_p"].append({"target": target, "decay": decay, "top_k": top_k, "steps": steps})

    for version, temp, tau, eta in (
        (1, 1.0, 5.0, 0.1),
        (1, 0.7, 3.0, 0.3),
        (2, 1.0, 5.0, 0.1),
        (2, 0.8, 2.0, 0.5),
    ):
        if version == 1:
            s = L.llama_sampler_init_mirostat(n, 42, tau, eta, 100)
        else:
            s = L.llama_sampler_init_mirostat_v2(42, tau, eta)
        steps = []
        for step in range(6):
            seed = 200 + step
            x = logits(seed, n, 3.0)
            chain = [L.llama_sampler_init_temp(temp)] if temp != 1.0 else []
            res, sel, _ = ll.apply(chain + [s], x)
            steps.append({"seed": seed, "kept": int(res.size), "selected": int(res["id"][sel])})
        out["mirostat"].append({"version": version, "temp": temp, "tau": tau, "eta": eta, "steps": steps})
    return out


def main(argv: list[str]) -> None:
    from edgellm.store import resolve

    pairs = [a.split("=", 1) for a in argv] or [
        ["smollm2", str(resolve("smollm2-135m"))],
        ["qwen2.5-coder", str(resolve("qwen2.5-coder-0.5b"))],
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    for name, path in pairs:
        data = fixture(name, Path(path))
        dst = OUT / f"{name}.json"
        dst.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"{dst}: {dst.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
