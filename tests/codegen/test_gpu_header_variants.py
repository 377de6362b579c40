"""fa2tune_forward_variant on a real GPU: the exported header's variant entry points against
the float32 reference.

The header is rendered from a few hand-made variant winners (D=128, fp16, "tuned" on the
H200): fa2 and fa3 causal sliding windows, an fa2 full chunk, fa2 softcap with sinks, a
split-KV decode window with sinks, and an fa2 packed causal window. It is compiled once with
nvcc into a small shared library (extern "C" wrappers around fa2tune_forward_variant, its
workspace twin, its packed twin, and the config-name and device-free nearest-entry queries),
for sm_90a on a GPU of compute capability 9.0 (the fa3 kernel runs there), else for the
device's own architecture (the fa3 entry is a stub and never picked). It is called through
ctypes with the kernel arguments measure/params.py builds (make_params, packed_params,
FaVariant: the ABI's ground truth), with the variant as a model passes it (the header
normalises it); every output is checked against measure/reference.py's float32 reference of
that variant (check_output, check_varlen: every element written, dead rows, LSE).

On the H200 each call must run the tuned entry fa2tune_nearest_tuned_variant names (every
one can run there); on another GPU, the key's default (FlashAttention-2's default built with
the key's switches). A variant that normalises to plain attention runs the plain dispatch's
config; a switch the header has no kernels of is refused with cudaErrorNotSupported and
nothing is written.

Run on a GPU machine: ``pytest -m gpu tests/codegen/test_gpu_header_variants.py`` (one nvcc
build of about 20 s, then a few seconds of launches).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pytest

from codegen.dispatch_table import varlen_twin
from codegen.dispatch_variants import variant_key, with_switches
from codegen.export import TunedPoint, render_header
from codegen.families.fa2.space import fa2_default_config
from codegen.families.fa3.space import default_config as fa3_default_config
from codegen.families.splitkv.space import default_config as splitkv_default_config
from core.gpu_name import normalize_gpu_name
from core.problem import Problem
from core.variant import Variant, normalize
from fa2tune.ops.choice import effective_varlen_causal, normalize_call
from tests.support.factories import make_config
from tests.support.gpu import gpu_marks

if TYPE_CHECKING:
    import torch

pytestmark = [*gpu_marks(), pytest.mark.compile, pytest.mark.slow]

D = 128
CUDA_ERROR_NOT_SUPPORTED = 801

FA2_CAUSAL = make_config(D, "fp16", True, br=64, bc=64, stages=2, swizzle=True)
FA2_FULL = make_config(D, "fp16", False, br=64, bc=64, stages=2, swizzle=True)

#: The tuned winners: (config, variant, (nq, nk, batch, heads, kv_heads)), and a packed one.
POINTS = [
    TunedPoint(D, "fp16", True, 1024, replace(FA2_CAUSAL, local=True), nk=1024, batch=2,
               heads=8, kv_heads=8, variant=Variant(256, 0)),
    TunedPoint(D, "fp16", True, 4096, replace(fa3_default_config(D, "fp16", True), local=True),
               nk=4096, batch=2, heads=8, kv_heads=8, variant=Variant(256, 0)),
    TunedPoint(D, "fp16", False, 1000, replace(FA2_FULL, local=True), nk=1000, batch=2,
               heads=8, kv_heads=8, variant=Variant(-1, -1, 384)),
    TunedPoint(D, "fp16", False, 512, replace(FA2_FULL, softcap=True, sinks=True), nk=512,
               batch=2, heads=8, kv_heads=8, variant=Variant(softcap=30.0, sinks=True)),
    TunedPoint(D, "fp16", False, 1, replace(splitkv_default_config(D, "fp16", False), local=True,
               sinks=True), nk=4096, batch=4, heads=8, kv_heads=2,
               variant=Variant(128, -1, sinks=True)),
    TunedPoint(D, "fp16", True, 900, replace(FA2_CAUSAL, varlen=True, local=True), batch=4,
               heads=8, kv_heads=8, seqlens=(300, 17, 900, 5), variant=Variant(64, 0)),
]  # fmt: skip

WRAPPER = r"""
#include "fa2_tuned.cuh"
extern "C" int t_forward(const FaParams* p, const FaVariant* v, int causal, void* stream,
                         void* ws, unsigned long long ws_bytes, int with_ws,
                         unsigned long long* ws_need, const char** name) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  *name = fa2tune_config_name_variant(*p, *v, 128, FA2TUNE_FP16, causal != 0);
  *ws_need = fa2tune_workspace_size_variant(*p, *v, 128, FA2TUNE_FP16, causal != 0);
  if (with_ws)
    return static_cast<int>(fa2tune_forward_variant_with_workspace(
        *p, *v, 128, FA2TUNE_FP16, causal != 0, ws, ws_bytes, s));
  return static_cast<int>(fa2tune_forward_variant(*p, *v, 128, FA2TUNE_FP16, causal != 0, s));
}
extern "C" const char* t_nearest(const FaVariant* v, int causal, int nq, int nk, int b, int h,
                                 int kv) {
  fa2tune_tuned_variant_choice c{};
  return fa2tune_nearest_tuned_variant(*v, 128, FA2TUNE_FP16, causal != 0, nq, nk, b, h, kv,
                                       132, &c) ? c.name : nullptr;
}
extern "C" int t_varlen(const FaParams* p, const FaVarlen* vl, const FaVariant* v, int n,
                        int max_q, int max_k, int causal, void* stream, const char** name) {
  *name = fa2tune_config_name_varlen_variant(*p, *vl, *v, n, max_q, max_k, 128, FA2TUNE_FP16,
                                             causal != 0);
  return static_cast<int>(fa2tune_forward_varlen_variant(
      *p, *vl, *v, n, max_q, max_k, 128, FA2TUNE_FP16, causal != 0,
      static_cast<cudaStream_t>(stream)));
}
extern "C" const char* t_nearest_varlen(const FaVariant* v, int causal, int n, int total_q,
                                        int max_q, int max_k, int h, int kv) {
  fa2tune_tuned_variant_choice c{};
  return fa2tune_nearest_tuned_varlen_variant(*v, 128, FA2TUNE_FP16, causal != 0, n, total_q,
                                              max_q, max_k, h, kv, 132, &c) ? c.name : nullptr;
}
"""


@dataclass(frozen=True)
class Built:
    lib: ctypes.CDLL
    on_h200: bool
    sm90a: bool


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    import torch

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    major, minor = torch.cuda.get_device_capability()
    sm90a = (major, minor) == (9, 0)
    arch = "90a" if sm90a else f"{major}{minor}"
    tmp = tmp_path_factory.mktemp("header_variants")
    (tmp / "fa2_tuned.cuh").write_text(
        render_header("NVIDIA H200", POINTS, ds=[D], dtypes=["fp16"])
    )
    (tmp / "wrapper.cu").write_text(WRAPPER)
    proc = subprocess.run(
        [nvcc, "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC",
         f"-gencode=arch=compute_{arch},code=sm_{arch}", "wrapper.cu", "-o", "libwrapper.so"],
        cwd=tmp, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    lib = ctypes.CDLL(str(tmp / "libwrapper.so"))
    lib.t_forward.restype = ctypes.c_int
    lib.t_nearest.restype = ctypes.c_char_p
    lib.t_varlen.restype = ctypes.c_int
    lib.t_nearest_varlen.restype = ctypes.c_char_p
    on_h200 = normalize_gpu_name(torch.cuda.get_device_name()) == "h200"
    return Built(lib, on_h200, sm90a)


def _fa_variant(v: Variant, sinks: torch.Tensor | None) -> Any:
    from measure.params import FaVariant

    return FaVariant(v.window_left, v.window_right, v.chunk, v.softcap,
                     None if sinks is None else sinks.data_ptr())  # fmt: skip


def _default(causal: bool, v: Variant, packed: bool = False) -> str:
    """The key's default: FlashAttention-2's default with the key's switches (or its twin)."""
    cfg = with_switches(fa2_default_config(D, "fp16", causal), variant_key(D, "fp16", causal, v))
    return (varlen_twin(cfg) if packed else cfg).name


#: (name, causal, variant as a model passes it, (nq, nk, batch, heads, kv_heads))
CASES: list[tuple[str, bool, Variant, tuple[int, int, int, int, int]]] = [
    ("window, fa2 entry", True, Variant(256, 0), (1000, 1000, 2, 8, 8)),
    ("window, fa3 entry", True, Variant(256, 0), (3000, 3000, 2, 8, 8)),
    ("window, Nq < Nk", True, Variant(100, 0), (300, 1000, 2, 8, 8)),
    ("two-sided window", False, Variant(100, 50), (700, 900, 2, 8, 8)),
    ("chunk", False, Variant(-1, -1, 384), (1000, 1000, 2, 8, 8)),
    ("chunk, Nq > Nk (dead rows)", False, Variant(-1, -1, 200), (900, 500, 1, 8, 8)),
    ("softcap and sinks", False, Variant(softcap=30.0, sinks=True), (300, 500, 2, 8, 8)),
    (
        "decode window with sinks, as models spell it",
        True,
        Variant(128, 0, sinks=True),
        (1, 3000, 4, 8, 2),
    ),
]


def _run_dense(
    built: Built,
    causal: bool,
    v: Variant,
    shape: tuple[int, int, int, int, int],
    *,
    with_ws: bool = False,
) -> tuple[int, str, Any, Any]:
    """One call on fresh inputs: status, config named, output and inputs (checked by the
    caller)."""
    import torch

    from measure.params import make_params
    from measure.reference import make_inputset
    from measure.verify import poison

    nq, nk, b, h, kv = shape
    problem = Problem(gpu="test", d=D, n=nq, nk=nk if nk != nq else None, batch=b, heads=h,
                      kv_heads=kv if kv != h else None, dtype="fp16", causal=causal,
                      variant=v)  # fmt: skip
    inputs = make_inputset(problem, "bnhd", seed=7, full_limit=2**62)
    o, lse = inputs.outputs()
    poison(o, lse)
    params = make_params(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, "bnhd")
    var = _fa_variant(v, inputs.sinks)
    name = ctypes.c_char_p()
    need = ctypes.c_ulonglong()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    ws = None
    if with_ws:  # the size asked first, as a caller would: a zeroed buffer of that size
        built.lib.t_forward(
            ctypes.byref(params),
            ctypes.byref(var),
            int(causal),
            stream,
            None,
            ctypes.c_ulonglong(0),
            0,
            ctypes.byref(need),
            ctypes.byref(name),
        )
        torch.cuda.synchronize()
        poison(o, lse)
        ws = torch.zeros(max(int(need.value), 16), dtype=torch.uint8, device=o.device)
    err = built.lib.t_forward(
        ctypes.byref(params), ctypes.byref(var), int(causal), stream,
        None if ws is None else ctypes.c_void_p(ws.data_ptr()),
        ctypes.c_ulonglong(0 if ws is None else ws.numel()), int(with_ws), ctypes.byref(need),
        ctypes.byref(name),
    )  # fmt: skip
    torch.cuda.synchronize()
    return int(err), (name.value or b"").decode(), (o, lse), inputs


def _expected(built: Built, causal: bool, v: Variant, shape: tuple[int, ...]) -> str:
    nq, nk, b, h, kv = shape
    served, norm = normalize(causal, v.window_left, v.window_right, v.chunk, nq=nq, nk=nk,
                             softcap=v.softcap, sinks=v.sinks)  # fmt: skip
    if built.on_h200:
        fv = _fa_variant(v, None)
        fv.sinks = 16 if v.sinks else None  # the device-free query reads only whether
        tuned = built.lib.t_nearest(ctypes.byref(fv), int(causal), nq, nk, b, h, kv)
        assert tuned is not None
        if tuned.decode().startswith("fa3_"):
            assert built.sm90a
        return tuned.decode()
    return _default(served, norm)


@pytest.mark.parametrize(("what", "causal", "variant", "shape"), CASES, ids=[c[0] for c in CASES])
def test_forward_variant_matches_the_reference(
    built: Built, what: str, causal: bool, variant: Variant, shape: tuple[int, int, int, int, int]
) -> None:
    from measure.verify import check_output

    err, name, (o, lse), inputs = _run_dense(built, causal, variant, shape)
    assert err == 0, f"{what}: fa2tune_forward_variant returned cudaError {err}"
    assert name == _expected(built, causal, variant, shape), what
    got = check_output(o, lse, inputs)
    assert got.ok, f"{what} ({name}): {got.message}"


def test_decode_with_the_callers_workspace(built: Built) -> None:
    """The split-KV decode entry with a caller's zeroed workspace of the size asked."""
    from measure.verify import check_output

    v, shape = Variant(128, 0, sinks=True), (1, 3000, 4, 8, 2)
    err, name, (o, lse), inputs = _run_dense(built, True, v, shape, with_ws=True)
    assert err == 0 and name == _expected(built, True, v, shape)
    got = check_output(o, lse, inputs)
    assert got.ok, f"{name}: {got.message}"


def test_plain_after_normalising_runs_the_plain_dispatch(built: Built) -> None:
    """A window reaching past every key is plain causal: the plain dispatch's config (here
    FlashAttention-2's default: nothing plain is tuned) computes it."""
    from measure.verify import check_output

    err, name, (o, lse), inputs = _run_dense(built, True, Variant(5000, 0), (1000, 1000, 2, 8, 8))
    assert err == 0 and name == fa2_default_config(D, "fp16", True).name
    got = check_output(o, lse, inputs)
    assert got.ok, got.message


def test_untuned_switch_is_refused_and_writes_nothing(built: Built) -> None:
    import torch

    from measure.params import make_params
    from measure.reference import make_inputset
    from measure.verify import poison

    problem = Problem(gpu="test", d=D, n=256, dtype="fp16", causal=True,
                      variant=Variant(softcap=30.0))  # fmt: skip
    inputs = make_inputset(problem, "bnhd", seed=3)
    o, lse = inputs.outputs()
    poison(o, lse)
    before = o.clone()
    params = make_params(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, "bnhd")
    var = _fa_variant(problem.variant, None)
    name, need = ctypes.c_char_p(), ctypes.c_ulonglong()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    err = built.lib.t_forward(
        ctypes.byref(params),
        ctypes.byref(var),
        1,
        stream,
        None,
        ctypes.c_ulonglong(0),
        0,
        ctypes.byref(need),
        ctypes.byref(name),
    )
    torch.cuda.synchronize()
    assert err == CUDA_ERROR_NOT_SUPPORTED and name.value is None
    assert torch.equal(o.view(torch.int16), before.view(torch.int16))


def test_forward_varlen_variant_matches_the_reference(built: Built) -> None:
    import torch

    from measure.params import packed_params
    from measure.varlen import check_varlen, make_varlen_inputs
    from measure.verify import poison

    v, lens = Variant(64, 0), [1, 17, 255, 1000, 3, 64]
    inputs = make_varlen_inputs(lens, heads=8, kv_heads=8, d=D, causal=True, variant=v, seed=5)
    o, lse = inputs.outputs()
    poison(o, lse)
    params, vl = packed_params(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, inputs.packed)
    vl.reserved = int(inputs.k.shape[0])  # total_k, as the header's API asks
    var = _fa_variant(v, None)
    name = ctypes.c_char_p()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    max_q = max(lens)
    err = built.lib.t_varlen(ctypes.byref(params), ctypes.byref(vl), ctypes.byref(var),
                             len(lens), max_q, max_q, 1, stream, ctypes.byref(name))  # fmt: skip
    torch.cuda.synchronize()
    assert err == 0, f"fa2tune_forward_varlen_variant returned cudaError {err}"
    served, norm = normalize_call(True, 64, 0, 0, 0.0, False, max_q, max_q, True)
    served = effective_varlen_causal(served, max_q)
    if built.on_h200:
        tuned = built.lib.t_nearest_varlen(ctypes.byref(var), 1, len(lens), sum(lens), max_q,
                                           max_q, 8, 8)  # fmt: skip
        assert tuned is not None and name.value == tuned
    else:
        assert (name.value or b"").decode() == _default(served, norm, packed=True)
    got = check_varlen(o, lse, inputs)
    assert got.ok, f"{name.value!r}: {got.message}"
