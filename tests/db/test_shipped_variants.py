"""The shipped variant results (db/data/h200_results_variants.json) answer the models' calls.

Each entry of the variants' model workloads (examples/workloads/) is asked as the model calls
it — ``causal=True`` on every call, decode steps included, a window spelled as
FlashAttention's ``window_size=(left, 0)`` — through the torch op's own steps
(:func:`fa2tune.ops.choice.normalize_call`, the effective mask, :func:`choose`), and must
get the config tuned for exactly that problem, not a default or a neighbour. The campaign
stores problems through :func:`core.variant.normalize` and the op asks through it too; this
is the check that the two spell every call the same way (a decode step with a window once
did not).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.shape import Shape, effective_causal
from db.store import Store
from fa2tune.ops.choice import Call, choose, normalize_call
from tests.support.shipped import shipped_store
from tuner.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "db" / "data" / "h200_results_variants.json"
MODELS = ("mistral_7b", "gemma2_9b", "gpt_oss_20b", "llama4_scout")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    yield from shipped_store(tmp_path_factory, [SHIPPED])


@pytest.mark.parametrize("model", MODELS)
def test_every_model_call_gets_its_tuned_config(store: Store, model: str) -> None:
    targets = load_workload(ROOT / "examples" / "workloads" / f"{model}.yaml").targets
    assert targets
    for t in targets:
        v, sh = t.variant, t.shape
        local = v.window_left >= 0 or v.chunk > 0
        left = v.window_left
        # The model's spelling: causal everywhere, a window as (left, 0).
        causal, variant = normalize_call(
            True if local else t.causal, left, 0 if left >= 0 else -1, v.chunk, v.softcap,
            v.sinks, sh.nq, sh.nk,
        )  # fmt: skip
        assert (causal, variant) == (t.causal, t.variant) or sh.nq == 1, t.describe()
        call = Call(
            device=0, gpu="NVIDIA H200", sm_count=132, compute_capability="9.0",
            shape=Shape(sh.nq, sh.nk, sh.batch, sh.heads, sh.kv_heads), dtype=t.dtype,
            causal=effective_causal(causal, sh.nq), d=t.d, variant=variant,
        )  # fmt: skip
        choice = choose(store, call)
        assert choice.source == "exact", f"{t.describe()}: {choice.describe(call.shape)}"
        switches = {"local": "_loc", "softcap": "_cap", "sinks": "_snk"}
        for need, on in variant.needs.items():
            assert (switches[need] in choice.config.name) == on, choice.config.name


def test_every_shipped_variant_build_round_trips_through_its_name_and_columns() -> None:
    from core.family import config_from_name, config_from_params
    from db.dump_format import load_dump

    builds = load_dump(SHIPPED).builds
    assert builds
    for name in {b.config_name for b in builds}:
        c = config_from_name(name)
        assert c.name == name
        assert config_from_params(c.family, c.d, c.dtype, c.causal, c.params()) == c
