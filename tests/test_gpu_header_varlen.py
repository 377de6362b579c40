"""fa2tune_forward_varlen on a real GPU: the exported header's packed entry against the reference.

The header is exported from the shipped H200 varlen results (D=128), compiled with nvcc into
a small shared library (one extern "C" wrapper around fa2tune_forward_varlen and
fa2tune_config_name_varlen) and called through ctypes with the kernel arguments
measure/varlen.py builds (varlen_params: the ABI's ground truth). Every sequence is checked
against its float32 reference with the dense rule (check_varlen). On an H200 the call must
run the shipped winner; elsewhere the default's varlen twin. More sequences than grid z
allows run in offset slices.

Run on a GPU machine: ``pytest -m gpu tests/test_gpu_header_varlen.py``.
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from gpu_support import gpu_marks
from test_service_data import make_store

from codegen.export_varlen import varlen_twin
from codegen.space import fa2_default_config
from core.config import Dtype
from core.gpu_name import normalize_gpu_name
from db.shipped import load_shipped_results
from service.header import export_header

if TYPE_CHECKING:
    import torch

    from measure.varlen import VarlenInputs

pytestmark = [*gpu_marks(), pytest.mark.compile, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_VARLEN = ROOT / "db" / "data" / "h200_results_varlen.json"

WRAPPER = r"""
#include "fa2_tuned.cuh"
extern "C" int fa2tune_test_varlen(const Fa2Params* p, const FaVarlen* v, int num_seqs,
                                   int max_q, int max_k, int dtype, int causal, void* stream,
                                   const char** name) {
  const fa2tune_dtype dt = static_cast<fa2tune_dtype>(dtype);
  *name = fa2tune_config_name_varlen(*p, *v, num_seqs, max_q, max_k, 128, dt, causal != 0);
  return static_cast<int>(fa2tune_forward_varlen(*p, *v, num_seqs, max_q, max_k, 128, dt,
                                                 causal != 0,
                                                 static_cast<cudaStream_t>(stream)));
}
"""

#: (query lengths, key lengths or None for the same), as tests/test_gpu_varlen.py's.
CASES: list[tuple[list[int], list[int] | None]] = [
    ([1, 17, 255, 1000, 3, 64, 129], None),
    ([300, 5, 77], [1000, 5, 40]),
    ([4000, 100, 2500, 1822, 7, 640, 3000, 1200], None),
]


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ctypes.CDLL, dict[tuple[str, bool], str]]:
    """The wrapper library, and the shipped winner per (dtype, causal) (one each, D=128)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    tmp = tmp_path_factory.mktemp("header_varlen")
    store = make_store(tmp)
    load_shipped_results(store, [SHIPPED_VARLEN])
    (tmp / "fa2_tuned.cuh").write_text(export_header(store, "H200", [128]))
    winners = {(b.dtype, b.causal): b.config.name for b, _ in store.varlen_winners("H200")}
    store.close()
    (tmp / "wrapper.cu").write_text(WRAPPER)
    proc = subprocess.run(
        [nvcc, "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC",
         "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_80,code=sm_80",
         "wrapper.cu", "-o", "libwrapper.so"],
        cwd=tmp, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    lib = ctypes.CDLL(str(tmp / "libwrapper.so"))
    lib.fa2tune_test_varlen.restype = ctypes.c_int
    return lib, winners


def _launch(lib: ctypes.CDLL, inputs: VarlenInputs, o: torch.Tensor, lse: torch.Tensor) -> str:
    """fa2tune_forward_varlen on ``inputs`` (synchronised); the config it named."""
    import torch

    from measure.varlen import varlen_params

    params, extra = varlen_params(inputs, o, lse)
    name = ctypes.c_char_p()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    err = lib.fa2tune_test_varlen(
        ctypes.byref(params), ctypes.byref(extra), inputs.batch, params.nq, params.nk,
        0 if inputs.dtype == "fp16" else 1, int(inputs.causal), stream, ctypes.byref(name),
    )  # fmt: skip
    torch.cuda.synchronize()
    assert err == 0, f"fa2tune_forward_varlen returned cudaError {err}"
    assert name.value is not None
    return name.value.decode()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_varlen_matches_the_reference(
    built: tuple[ctypes.CDLL, dict[tuple[str, bool], str]], dtype: Dtype, causal: bool
) -> None:
    import torch

    from measure.varlen import check_varlen, make_varlen_inputs
    from measure.verify import poison

    lib, winners = built
    on_h200 = normalize_gpu_name(torch.cuda.get_device_name()) == "h200"
    want = (
        winners[(dtype, causal)]
        if on_h200
        else (varlen_twin(fa2_default_config(128, dtype, causal)).name)
    )
    for lens_q, lens_k in CASES:
        inputs = make_varlen_inputs(
            lens_q, lens_k, heads=32, kv_heads=8, d=128, dtype=dtype, causal=causal
        )
        o, lse = inputs.outputs()
        poison(o, lse)
        assert _launch(lib, inputs, o, lse) == want, lens_q
        got = check_varlen(o, lse, inputs)
        assert got.ok, f"q={lens_q} k={lens_k}: {got.message}"


def test_forward_varlen_slices_past_grid_z(
    built: tuple[ctypes.CDLL, dict[tuple[str, bool], str]],
) -> None:
    """70,000 sequences of 1-3 tokens: more than grid z's 65,535, launched in offset slices;
    the sequences on both sides of the slice boundary against their reference."""
    import torch

    from measure.varlen import make_varlen_inputs, sequence_inputs
    from measure.verify import check_output, poison

    rng = random.Random(11)
    lens = [rng.randint(1, 3) for _ in range(70_000)]
    inputs = make_varlen_inputs(
        lens, heads=32, kv_heads=8, d=128, dtype="fp16", causal=True, reference=False
    )
    o, lse = inputs.outputs()
    poison(o, lse)
    _launch(built[0], inputs, o, lse)
    assert bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse).all())
    offs = inputs.offsets_q
    for i in (0, 1, 65_534, 65_535, 65_536, 69_999):
        seq = sequence_inputs(inputs, i, sdpa_ref=False)
        s, e = offs[i], offs[i + 1]
        got = check_output(o[s:e].unsqueeze(0), lse[:, s:e].unsqueeze(0), seq)
        assert got.ok, f"sequence {i}: {got.message}"
