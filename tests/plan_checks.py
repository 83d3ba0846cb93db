"""Tiny models and checks for captured decode plans (native_plan.CapturedDecode: the native and numba
backends): a plan's replay must give the eager forward's bits."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from tiny_models import N_VOCAB, Spec, random_weights, write_gguf

from edgellm.arch import load_model
from edgellm.gguf import ModelFile

TINY = {
    "llama": dict(arch="llama"),
    "qwen2": dict(arch="qwen2", qkv_bias=True, output_bias=True, tied=True),
    "qwen3": dict(arch="qwen3", key_length=32, qk_norm=True, tied=True),
    "phi3": dict(arch="phi3", fused_qkv=True, fused_gate_up=True, n_rot=12),
}


def tiny_model(tmp_path, arch: str, backend, **options):
    spec = Spec(**TINY[arch], **options)
    w = random_weights(spec)
    qtypes = {n: T.Q4_0 if ".ffn_" in n else T.Q8_0 for n in w if n.endswith(".weight") and "norm" not in n}
    return load_model(ModelFile(write_gguf(tmp_path / f"{arch}.gguf", spec, w, qtypes)), backend)


def eager_and_planned(model, steps) -> None:
    """Run decode steps eagerly on one cache and through decode_step (capture, then replays) on another:
    logits and caches must be the same bits."""
    kv_a, kv_b = model.new_kv_cache(32, 3), model.new_kv_cache(32, 3)
    for tokens, pos, seqs in steps:
        args = (np.array(tokens), np.array(pos), np.array(seqs))
        a = model.forward(*args, kv_a)
        b = model.decode_step(*args, kv_b)
        assert np.array_equal(a, b)
    assert np.array_equal(kv_a.k, kv_b.k) and np.array_equal(kv_a.v, kv_b.v)
    for batch in {len(t) for t, _, _ in steps}:
        assert model.backend.captured(model, kv_b, batch) is not None, f"the capture of B={batch} was refused"


BATCH_STEPS = [  # one prompt token per sequence, then two decode rounds of B = 3, then B = 2 (a new plan)
    ([5, 6, 7], [0, 0, 0], [0, 1, 2]),
    ([8, 9, 10], [1, 1, 1], [0, 1, 2]),
    ([11, 12, 13], [2, 2, 2], [0, 1, 2]),
    ([14, 15], [3, 3], [2, 0]),
    ([16, 17], [4, 4], [2, 0]),
]


assert N_VOCAB > 17  # the token ids BATCH_STEPS uses
