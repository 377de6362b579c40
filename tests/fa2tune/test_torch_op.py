"""fa2tune.torch's torch-free parts: the config choice, the fallback reasons, the setting.

The op itself needs torch and a GPU (tests/test_gpu_torch_op.py); here the rules it applies
are checked on a store seeded through tests/factories.py, and the module layout is checked
not to shadow ``import torch`` nor to make the base package import torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from codegen.families.fa2.space import fa2_default_config
from codegen.families.splitkv.host import splitkv_workspace_sizes
from codegen.families.splitkv.space import default_config as splitkv_default
from core.config import HEAD_DIMS, HEAD_DIMS_RULE
from core.fa3_config import Fa3Config
from core.problem import Problem
from core.settings import Settings
from core.shape import Shape
from db.store import Store
from fa2tune.ops.choice import (
    SUPPORTED_HEAD_DIMS,
    Unsupported,
    arch_of,
    call_reason,
    choose_config,
    default_config,
    unsupported_head_dim,
)
from tests.support.factories import H200, make_config, ok_result, seed_measurement

REPO = Path(__file__).resolve().parents[2]
GPU = "NVIDIA H200"
SMS = 132


@pytest.fixture
def store() -> Iterator[Store]:
    with Store.from_url("sqlite://") as s:
        yield s


def _seed(store: Store, shape: Shape, config: object, ms: float = 1.0, d: int = 128) -> None:
    problem = Problem(
        gpu=GPU, d=d, n=shape.nq, nk=shape.nk, batch=shape.batch, heads=shape.heads,
        kv_heads=shape.kv_heads, dtype="fp16", causal=False,
    )  # fmt: skip
    seed_measurement(store, problem=problem, config=config, result=ok_result(ms, problem))  # type: ignore[arg-type]


def test_exact_shape_wins(store: Store) -> None:
    shape = Shape(4096, 4096, 2, 16, 16)
    tuned = make_config(br=64, bc=64)
    _seed(store, shape, tuned)
    choice = choose_config(store, GPU, SMS, shape, "fp16", False, 128)
    assert (choice.config, choice.source, choice.measured) == (tuned, "exact", shape)
    assert "(exact, database)" in choice.describe(shape)


def test_nearest_shape_when_not_tuned(store: Store) -> None:
    near, far = Shape(4096, 4096, 2, 16, 16), Shape(256, 256, 2, 16, 16)
    _seed(store, near, make_config(br=64, bc=64))
    _seed(store, far, make_config(br=128, bc=32))
    asked = Shape(3000, 3000, 2, 16, 16)
    choice = choose_config(store, "h200", SMS, asked, "fp16", False, 128)  # names normalised
    assert choice.source == "nearest"
    assert choice.config == make_config(br=64, bc=64)
    assert choice.measured == near
    assert f"(nearest, measured at {near.describe()}, database)" in choice.describe(asked)


def test_default_when_nothing_tuned(store: Store) -> None:
    _seed(store, Shape(4096, 4096, 2, 16, 16), make_config())
    # Another GPU, another dtype and another mask have nothing tuned: FA2's default.
    prefill = Shape(1000, 1000, 2, 16, 16)
    for gpu, dtype, causal in (("NVIDIA A100", "fp16", False), (GPU, "bf16", False),
                               (GPU, "fp16", True)):  # fmt: skip
        choice = choose_config(
            store, gpu, 108, prefill, dtype, causal, 128, compute_capability="8.0"
        )
        assert choice.source == "default"
        assert choice.config == fa2_default_config(128, dtype, causal)  # type: ignore[arg-type]
    # No store at all (the database could not be opened): defaults too.
    assert choose_config(None, GPU, SMS, prefill, "fp16", False, 64).source == "default"


def test_default_for_decode_is_splitkv() -> None:
    decode = Shape(1, 8192, 2, 32, 8)
    assert default_config(128, "fp16", False, decode, SMS) == splitkv_default(128, "fp16", False)
    # A decode step goes to split-KV however many blocks it launches (it reads each K/V
    # head once for its whole GQA group; FA2's tile once per query head), MHA too.
    for wide in (Shape(1, 8192, 64, 32, 8), Shape(1, 8192, 16, 64, 8), Shape(4, 4096, 64, 32, 32)):
        assert default_config(128, "fp16", False, wide, SMS) == splitkv_default(128, "fp16", False)
    # More rows than a decode step and enough query blocks to fill the GPU: FA2's default,
    # even for rows split-KV would pack.
    wide = Shape(32, 8192, 64, 32, 32)
    assert default_config(128, "fp16", False, wide, SMS) == fa2_default_config(128, "fp16", False)
    few = Shape(32, 8192, 2, 16, 16)
    assert default_config(128, "fp16", False, few, SMS) == splitkv_default(128, "fp16", False)
    # A head dim only split-KV has (if any: fa2 may take every multiple of 8) is served by it
    # on any shape.
    from codegen.families.fa2 import space
    from codegen.families.splitkv import space as splitkv_space

    for d in sorted(set(splitkv_space.HEAD_DIMS) - set(space.VALID_HEAD_DIMS)):
        prefill = Shape(2048, 2048, 2, 8, 8)
        assert default_config(d, "fp16", True, prefill, SMS) == splitkv_default(d, "fp16", True)
    assert default_config(264, "fp16", False, decode, SMS) is None


def test_tuned_config_of_a_family_that_does_not_build_here(store: Store) -> None:
    shape = Shape(4096, 4096, 2, 16, 16)
    fa3 = Fa3Config(d=128, dtype="fp16", causal=False)
    _seed(store, shape, fa3)
    assert choose_config(store, GPU, SMS, shape, "fp16", False, 128).config == fa3
    # fa3 builds for exactly sm_90a: an sm_89 GPU of the same name gets the default.
    other = choose_config(store, GPU, SMS, shape, "fp16", False, 128, compute_capability="8.9")
    assert other.source == "default"
    assert other.config.family == "fa2"


@pytest.mark.parametrize(
    ("d", "dtype", "cc", "words"),
    [
        (264, "fp16", "9.0", "head dim 264"),
        (128, "fp32", "9.0", "dtype fp32"),
        (128, "fp16", "7.5", "compute capability 7.5"),
        # A new major version: no machine code fa2tune builds runs there (12.0 is served).
        (128, "fp16", "13.0", "compute capability 13.0"),
    ],
)
def test_unsupported_reasons(d: int, dtype: str, cc: str, words: str) -> None:
    with pytest.raises(Unsupported) as info:
        choose_config(None, GPU, SMS, Shape(128, 128, 1, 1, 1), dtype, False, d,
                      compute_capability=cc)  # fmt: skip
    assert words in info.value.reason


def test_database_errors_give_defaults(store: Store) -> None:
    store.close()  # a lookup on a disposed in-memory database fails: the choice still stands

    class Broken(Store):
        def best_for_shape(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
            raise RuntimeError("database gone")

    broken = Broken(store.engine)
    choice = choose_config(broken, GPU, SMS, Shape(512, 512, 1, 8, 8), "fp16", False, 64)
    assert choice.source == "default"


def test_call_reasons() -> None:
    ok = {"device_type": "cuda", "dtype": "float16", "d": 128}
    assert call_reason(**ok) is None  # type: ignore[arg-type]
    assert call_reason(**{**ok, "dtype": "bfloat16"}) is None  # type: ignore[arg-type]
    cases = {
        "tensors on cpu": {**ok, "device_type": "cpu"},
        "dtype float32": {**ok, "dtype": "float32"},
        "head dim 264": {**ok, "d": 264},
        "3-d tensors": {**ok, "ndim": 3},
        "forward-only": {**ok, "requires_grad": True},
    }
    for words, kwargs in cases.items():
        reason = call_reason(**kwargs)  # type: ignore[arg-type]
        assert reason is not None and words in reason, (words, reason)


def test_supported_head_dims_and_arch() -> None:
    assert {32, 64, 96, 128, 256} <= set(SUPPORTED_HEAD_DIMS)
    assert 264 not in SUPPORTED_HEAD_DIMS  # past 256: no family
    # The refusal states the rule, so the rule must be exactly the families' union.
    assert tuple(HEAD_DIMS) == SUPPORTED_HEAD_DIMS
    assert HEAD_DIMS_RULE in unsupported_head_dim(65)
    assert arch_of("9.0") == "sm_90"
    assert arch_of("8.6") == "sm_86"
    assert arch_of("7.5") is None
    assert arch_of("bogus") is None


def test_print_choice_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FA2TUNE_PRINT_CHOICE", raising=False)
    assert Settings().print_choice is False
    monkeypatch.setenv("FA2TUNE_PRINT_CHOICE", "1")
    assert Settings().print_choice is True


def test_splitkv_workspace_sizes() -> None:
    # GQA 32:8, Nq=1, B=2: 4 packed rows per KV head fit one 16-row tile -> 8 * 2 row tiles;
    # 8192 keys in 32-key tiles allow all 16 splits.
    config = splitkv_default(128, "fp16", False)
    assert (config.rows, config.block_n, config.splits) == (16, 32, 16)
    assert splitkv_workspace_sizes(config, Shape(1, 8192, 2, 32, 8)) == (16, 16 * 16 * 16)
    # Fewer key tiles than splits: as many splits as tiles (3 here).
    assert splitkv_workspace_sizes(config, Shape(1, 96, 1, 8, 8)) == (8, 8 * 3 * 16)
    # One key tile: one split, no workspace.
    assert splitkv_workspace_sizes(config, Shape(1, 32, 2, 32, 8)) == (0, 0)


def _run(code: str, *, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = [str(REPO)] + ([str(extra_path)] if extra_path is not None else [])
    env = {"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_base_package_does_not_import_torch() -> None:
    done = _run(
        """
        import sys
        import fa2tune, fa2tune.cli, fa2tune.ops, fa2tune.ops.choice
        import fa2tune.ops.autotune, fa2tune.ops.remote, fa2tune.ops.selection
        assert "torch" not in sys.modules, "torch was imported"
        """
    )
    assert done.returncode == 0, done.stderr


def test_fa2tune_torch_does_not_shadow_torch(tmp_path: Path) -> None:
    # A stand-in torch package: the module named fa2tune.torch must not be what `import torch`
    # finds, inside fa2tune's modules or outside them.
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("STAND_IN = True\n")
    done = _run(
        """
        import importlib.util, sys
        spec = importlib.util.find_spec("torch")
        assert spec is not None and "STAND_IN" in open(spec.origin).read(), spec
        import fa2tune.ops.choice, core.settings
        import torch
        assert getattr(torch, "STAND_IN", False), torch
        """,
        extra_path=tmp_path,
    )
    assert done.returncode == 0, done.stderr


def test_fa2tune_torch_without_torch_says_what_to_install() -> None:
    done = _run(
        """
        import sys
        sys.modules["torch"] = None  # as if not installed, also where it is
        try:
            import fa2tune.torch
        except ImportError as exc:
            assert "fa2tune[gpu]" in str(exc), exc
        else:
            raise SystemExit("imported without torch")
        """
    )
    assert done.returncode == 0, done.stderr


def test_h200_factory_matches_the_test_gpu() -> None:
    assert H200.name == GPU and H200.sm_count == SMS
