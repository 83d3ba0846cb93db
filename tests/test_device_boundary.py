"""The device boundary (backends/base.py): a toy device backend whose arrays refuse implicit numpy
conversion (tests/toy_device.py) runs every architecture's forward and the engine end to end, with the
reference's numbers bit for bit, moving only token ids in and logits (or greedy ids) out."""

from __future__ import annotations

import numpy as np
import pytest
from test_arch_tiny import CASES, TOKENS, build, run
from toy_device import DeviceArray, ToyDeviceBackend, ToyKV

from edgellm.arch import load_model
from edgellm.backends import get_backend
from edgellm.engine import Engine, GenRequest
from edgellm.gguf import ModelFile
from edgellm.sampler import SamplingParams


def _toy_model(path):
    return load_model(ModelFile(path), ToyDeviceBackend())


def test_device_arrays_refuse_numpy():
    a = DeviceArray(np.ones((2, 3), np.float32))
    for bad in (lambda: np.asarray(a), lambda: a + 1, lambda: a[0], lambda: list(a), lambda: np.exp(a)):
        with pytest.raises(TypeError):
            bad()


@pytest.mark.parametrize("case", CASES)
def test_every_tiny_architecture_runs_on_the_device_with_the_references_bits(tmp_path, case):
    ref, *_ = build(tmp_path, CASES[case], "reference")
    toy = load_model(ModelFile(next(tmp_path.glob("*.gguf"))), ToyDeviceBackend())
    kv = toy.new_kv_cache(32, 2)
    assert isinstance(kv, ToyKV)
    np.testing.assert_array_equal(run(toy, TOKENS, kv=kv), run(ref, TOKENS))
    # prefill then decode through decode_step and decode_greedy, batch of two sequences
    want = run(ref, TOKENS[:5] + TOKENS[:3], [*range(5), *range(3)], [0] * 5 + [1] * 3)
    kv = toy.new_kv_cache(32, 2)
    got = run(toy, TOKENS[:5] + TOKENS[:3], [*range(5), *range(3)], [0] * 5 + [1] * 3, kv=kv)
    np.testing.assert_array_equal(got, want)
    step = (np.array([TOKENS[5], TOKENS[3]]), np.array([5, 3]), np.array([0, 1]), kv)
    b = toy.backend
    before = b.downloads
    ids = toy.decode_greedy(*step)
    assert b.downloads == before + 1 and ids.dtype == np.int64 and ids.shape == (2,)
    kv_ref = ref.new_kv_cache(32, 2)
    run(ref, TOKENS[:5] + TOKENS[:3], [*range(5), *range(3)], [0] * 5 + [1] * 3, kv=kv_ref)
    logits = ref.decode_step(*step[:3], kv_ref)
    np.testing.assert_array_equal(ids, np.argmax(logits, axis=1))
    assert b.uploads == 0  # activations never came from the host


@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma3_path"])
def test_real_models_run_on_the_device_with_the_references_bits(request, fixture):
    """SmolLM2 (llama, tied Q8_0 embedding) and Gemma 3 (softcap-free but sliding-window rings, GeGLU,
    scaled embeddings): a short prompt, logits bit-identical to the reference's."""
    path = request.getfixturevalue(fixture)
    ref = load_model(ModelFile(path), get_backend("reference"))
    toy = _toy_model(path)
    ids = np.array([1, 415, 3575, 282, 4649, 314, 2], np.int64) % ref.config.n_vocab
    args = (ids, np.arange(len(ids)), np.zeros(len(ids), np.int64))
    want = ref.forward(*args, ref.new_kv_cache(16, 1), logits_rows=np.array([len(ids) - 1]))
    got = toy.forward(*args, toy.new_kv_cache(16, 1), logits_rows=np.array([len(ids) - 1]))
    np.testing.assert_array_equal(got, want)


def test_engine_runs_end_to_end_on_the_device_and_syncs_the_block_table(tmp_path):
    """Greedy and sampled requests through the continuous-batching engine (paged KV with a prefix cache,
    so PagedKV rewrites the block table): the same tokens as on the reference backend."""
    from tiny_models import Spec, random_weights, write_gguf

    from edgellm.tokenizer import Tokenizer

    spec = Spec(**CASES["qwen2"])
    path = write_gguf(tmp_path / "q.gguf", spec, random_weights(spec))
    mf = ModelFile(path)
    tok = Tokenizer.from_gguf(mf)
    prompts = [[3, 77, 250, 9, 140, 141, 56], [3, 77, 250, 9, 140, 141, 56, 0, 263], [17, 88, 5]]
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=3),
    ]

    def tokens(model) -> list[list[int]]:
        e = Engine(model, tok, n_ctx=64, max_seqs=2, block_size=4, max_batch_tokens=8)
        e.start()
        try:
            streams = [e.submit(GenRequest(p, q, max_tokens=6)) for p, q in zip(prompts, params)]
            return [[ev.token for ev in s if ev.token is not None] for s in streams]
        finally:
            e.shutdown()

    toy = load_model(mf, ToyDeviceBackend())
    want = tokens(load_model(mf, get_backend("reference")))
    got = tokens(toy)
    assert got == want and all(len(t) == 6 for t in got)
    assert toy.backend.uploads == 0
    assert toy.backend.top_k_steps > 0  # the sampled row came back as top-k candidates: same tokens
