"""fa2tune_forward_varlen on a real GPU: the exported header's packed entry against the reference.

The header is exported from the shipped H200 varlen results of both families (D=128: fa3's
win every problem), compiled with nvcc into a small shared library (one extern "C" wrapper
around fa2tune_forward_varlen and fa2tune_config_name_varlen) twice: for sm_90a + sm_80,
where the Hopper family's kernels run, and for plain sm_90 + sm_80, where they are stubs.
It is called through ctypes with the kernel arguments measure/varlen.py builds
(packed_params: the ABI's ground truth) plus total_k in FaVarlen.reserved, as the header's
API asks. Every sequence is checked against its float32 reference with the dense rule
(check_varlen). On an H200 the sm_90a build must run the shipped fa3 winner and the plain
sm_90 build the fa2 fallback (the default's varlen twin: no tuned entry can run there);
elsewhere both run the twin. More sequences than grid z allows run in offset slices; an fa3
pick refuses a call without total_k.

Run on a GPU machine: ``pytest -m gpu tests/test_gpu_header_varlen.py`` (two nvcc builds of
about 15 s each, then a few seconds of launches).
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from codegen.dispatch_table import varlen_twin
from codegen.families.fa2.space import fa2_default_config
from core.config import Dtype
from core.gpu_name import normalize_gpu_name
from db.shipped import load_shipped_results
from service.header import export_header
from tests.support.gpu import gpu_marks
from tests.support.service_data import make_store

if TYPE_CHECKING:
    import torch

    from measure.varlen import VarlenInputs

pytestmark = [*gpu_marks(), pytest.mark.compile, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_VARLEN = ROOT / "db" / "data" / "h200_results_varlen.json"
SHIPPED_VARLEN_FA3 = ROOT / "db" / "data" / "h200_results_varlen_fa3.json"
SM80 = "-gencode=arch=compute_80,code=sm_80"
#: The builds: sm_90a code runs the fa3 kernels on an H200; plain sm_90 code has only stubs.
TARGETS = {
    "sm_90a": ("-gencode=arch=compute_90a,code=sm_90a", SM80),
    "sm_90": ("-gencode=arch=compute_90,code=sm_90", SM80),
}
CUDA_ERROR_INVALID_VALUE = 1

WRAPPER = r"""
#include "fa2_tuned.cuh"
extern "C" int fa2tune_test_varlen(const FaParams* p, const FaVarlen* v, int num_seqs,
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


@dataclass(frozen=True)
class Built:
    """One build of the wrapper: its library, target and the shipped winners."""

    lib: ctypes.CDLL
    target: str
    winners: dict[tuple[str, bool], str]  # (dtype, causal) -> the store's winner (fa3's)

    def expected(self, dtype: Dtype, causal: bool) -> str:
        """The config a packed call must run: the shipped winner where it can run (an H200,
        sm_90a code), else the fa2 fallback (no other tuned entry: the default's twin)."""
        import torch

        on_h200 = normalize_gpu_name(torch.cuda.get_device_name()) == "h200"
        if on_h200 and self.target == "sm_90a":
            return self.winners[(dtype, causal)]
        return varlen_twin(fa2_default_config(128, dtype, causal)).name


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[tuple[str, bool], str]]:
    """The header of both families' shipped varlen results, and the winner per (dtype,
    causal) (one each, D=128, every one fa3's)."""
    tmp = tmp_path_factory.mktemp("header_varlen_store")
    store = make_store(tmp)
    load_shipped_results(store, [SHIPPED_VARLEN, SHIPPED_VARLEN_FA3])
    text = export_header(store, "H200", [128])
    winners = {
        (b.dtype, b.causal): b.config.name for b, _ in store.varlen_winners("H200", ["fa2", "fa3"])
    }
    store.close()
    assert len(winners) == 4 and all(n.startswith("fa3_") for n in winners.values())
    return text, winners


@pytest.fixture(scope="module", params=list(TARGETS))
def built(
    request: pytest.FixtureRequest,
    header: tuple[str, dict[tuple[str, bool], str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Built:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    target: str = request.param
    tmp = tmp_path_factory.mktemp(f"header_varlen_{target}")
    (tmp / "fa2_tuned.cuh").write_text(header[0])
    (tmp / "wrapper.cu").write_text(WRAPPER)
    proc = subprocess.run(
        [nvcc, "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC", *TARGETS[target],
         "wrapper.cu", "-o", "libwrapper.so"],
        cwd=tmp, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    lib = ctypes.CDLL(str(tmp / "libwrapper.so"))
    lib.fa2tune_test_varlen.restype = ctypes.c_int
    return Built(lib, target, header[1])


def _call(
    lib: ctypes.CDLL, inputs: VarlenInputs, o: torch.Tensor, lse: torch.Tensor, total_k: int
) -> tuple[int, str]:
    """fa2tune_forward_varlen on ``inputs`` with ``total_k`` in FaVarlen.reserved
    (synchronised): its status and the config it named."""
    import torch

    from measure.params import packed_params

    params, extra = packed_params(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, inputs.packed)
    extra.reserved = total_k  # the header's ABI: total_k = cu_seqlens_k[num_seqs]
    name = ctypes.c_char_p()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    err = lib.fa2tune_test_varlen(
        ctypes.byref(params), ctypes.byref(extra), inputs.batch, params.nq, params.nk,
        0 if inputs.dtype == "fp16" else 1, int(inputs.causal), stream, ctypes.byref(name),
    )  # fmt: skip
    torch.cuda.synchronize()
    assert name.value is not None
    return int(err), name.value.decode()


def _launch(lib: ctypes.CDLL, inputs: VarlenInputs, o: torch.Tensor, lse: torch.Tensor) -> str:
    """fa2tune_forward_varlen on ``inputs`` with the right total_k; the config it named."""
    err, name = _call(lib, inputs, o, lse, total_k=int(inputs.k.shape[0]))
    assert err == 0, f"fa2tune_forward_varlen returned cudaError {err}"
    return name


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_varlen_matches_the_reference(built: Built, dtype: Dtype, causal: bool) -> None:
    from measure.varlen import check_varlen, make_varlen_inputs
    from measure.verify import poison

    want = built.expected(dtype, causal)
    for lens_q, lens_k in CASES:
        inputs = make_varlen_inputs(
            lens_q, lens_k, heads=32, kv_heads=8, d=128, dtype=dtype, causal=causal
        )
        o, lse = inputs.outputs()
        poison(o, lse)
        assert _launch(built.lib, inputs, o, lse) == want, lens_q
        got = check_varlen(o, lse, inputs)
        assert got.ok, f"{built.target} {want} q={lens_q} k={lens_k}: {got.message}"


def test_fa3_pick_needs_total_k(built: Built) -> None:
    """total_k left at 0 (reserved, as before fa3 had a host launcher): an fa3 pick refuses
    the call and writes nothing; the fa2 fallback ignores it and runs correctly."""
    import torch

    from measure.varlen import check_varlen, make_varlen_inputs
    from measure.verify import poison

    lens_q, lens_k = CASES[1]  # keys longer than queries: total_k != total_q
    assert lens_k is not None
    inputs = make_varlen_inputs(lens_q, lens_k, heads=32, kv_heads=8, d=128, causal=True)
    o, lse = inputs.outputs()
    poison(o, lse)
    before = o.clone()
    want = built.expected("fp16", True)
    err, name = _call(built.lib, inputs, o, lse, total_k=0)
    assert name == want
    if want.startswith("fa3_"):
        assert err == CUDA_ERROR_INVALID_VALUE
        assert torch.equal(o.view(torch.int16), before.view(torch.int16))  # nothing launched
        err, _ = _call(built.lib, inputs, o, lse, total_k=max(lens_k) - 1)
        assert err == CUDA_ERROR_INVALID_VALUE
    else:
        assert err == 0
        got = check_varlen(o, lse, inputs)
        assert got.ok, got.message


def test_forward_varlen_slices_past_grid_z(built: Built) -> None:
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
    assert _launch(built.lib, inputs, o, lse) == built.expected("fp16", True)
    assert bool(torch.isfinite(o).all()) and bool(torch.isfinite(lse).all())
    offs = inputs.offsets_q
    for i in (0, 1, 65_534, 65_535, 65_536, 69_999):
        seq = sequence_inputs(inputs, i, sdpa_ref=False)
        s, e = offs[i], offs[i + 1]
        got = check_output(o[s:e].unsqueeze(0), lse[:, s:e].unsqueeze(0), seq)
        assert got.ok, f"sequence {i}: {got.message}"
