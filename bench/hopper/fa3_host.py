"""Host side of the fa3 (Hopper, sm_90a) kernel family: configs, rendering, nvcc, TMA, launch.

Written to move into the product's GPU-measurement package later: no global state, small typed
functions, torch and cuda-bindings imported only inside the functions that need them, so CPU
machines can import this module (configs, names, ``smem_bytes``, ``render``, ``compile_config``).

The kernel ABI (docs/fa3_kernel.md): ``NAME(const Fa2Params p, CUtensorMap tma_q, CUtensorMap
tma_k, CUtensorMap tma_v)``; grid ``(ceil(nq / block_m), q_heads, batch)``; block
``(block_m / 64 + 1) * 128``; dynamic shared memory :func:`smem_bytes`. Each tensor map is 4-d
``(D, N, H, B)`` over the tensor's own strides (bytes), box ``(64, rows, 1, 1)`` with rows
``block_m`` for Q and ``block_n`` for K/V, 128-byte swizzle, zero fill out of bounds.
"""

from __future__ import annotations

import ctypes
import math
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

Dtype = Literal["fp16", "bf16"]
Layout = Literal["bnhd", "bhnd"]

REPO = Path(__file__).resolve().parents[2]
TEMPLATE_DIR = REPO / "codegen" / "templates"
TEMPLATE_HEADER = "fa3_fwd.cuh"
ARCH_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a",)
NVCC_FLAGS = ("-cubin", "-std=c++17", "-O3", "-Xptxas", "-v", *ARCH_FLAGS)

#: Hopper limits the space is checked against (mirrors the static_asserts of fa3::Traits).
MAX_SMEM_PER_BLOCK = 227 * 1024
REGS_PER_SM = 65536
BOX_COLS = 64  # one 128-byte swizzle row of 2-byte elements
ELEM_BYTES = 2
REG_HEADROOM = 32


@dataclass(frozen=True)
class Fa3Config:
    """One instantiation of ``FA3_DEFINE_KERNEL``.

    Attributes:
        d: head dimension.
        dtype: ``"fp16"`` or ``"bf16"``.
        causal: bottom-right causal mask.
        block_m: query rows per block (64 per consumer warpgroup).
        block_n: keys per K/V tile.
        stages: K/V ring depth.
        pv_regs: P operand of P·V from registers (RS) instead of shared memory (SS).
        overlap: intra-warpgroup overlap (issue tile j's Q·Kᵀ with tile j-1's P·V).
        pingpong: two consumer warpgroups take turns issuing GEMMs.
        consumer_regs: registers per consumer thread after ``setmaxnreg.inc``.
    """

    d: int
    dtype: Dtype = "fp16"
    causal: bool = False
    block_m: int = 128
    block_n: int = 128
    stages: int = 2
    pv_regs: bool = True
    overlap: bool = True
    pingpong: bool = True
    consumer_regs: int = 240

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        flags = ("rs" if self.pv_regs else "ss") + ("_ov" if self.overlap else "")
        flags += "_pp" if self.pingpong else ""
        return (
            f"fa3_d{self.d}_{self.dtype}_{mask}_m{self.block_m}_n{self.block_n}"
            f"_s{self.stages}_{flags}_r{self.consumer_regs}"
        )

    @property
    def consumer_wgs(self) -> int:
        return self.block_m // 64

    @property
    def threads(self) -> int:
        return (self.consumer_wgs + 1) * 128

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "name": self.name, "smem_bytes": smem_bytes(self)}


def smem_bytes(config: Fa3Config) -> int:
    """Dynamic shared memory of ``config`` (the traits' ``kSmemBytes``).

    ``1024 (alignment slack) + 128 * ceil(D/64) * (block_m + 2 * stages * block_n)
    + (SS: consumer_wgs * ceil(block_n/64) * 8192) + 256 (mbarriers)``.
    """
    boxes = math.ceil(config.d / BOX_COLS)
    tiles = 128 * boxes * (config.block_m + 2 * config.stages * config.block_n)
    p_bytes = 0 if config.pv_regs else config.consumer_wgs * math.ceil(config.block_n / 64) * 8192
    return 1024 + tiles + p_bytes + 256


def launch_regs(config: Fa3Config) -> int:
    """Registers per thread the launch bound ``(threads, 1)`` allows."""
    per = REGS_PER_SM // config.threads
    return 248 if per > 255 else per & ~7


def producer_regs(config: Fa3Config) -> int:
    """Registers the producer warpgroup keeps after ``setmaxnreg.dec``."""
    raw = (config.threads * launch_regs(config) - config.consumer_wgs * 128 * config.consumer_regs)
    return min(56, (raw // 128) & ~7)


def acc_regs(config: Fa3Config) -> int:
    """fp32 accumulator registers a consumer thread keeps live (S, O, packed P with overlap)."""
    extra = config.block_n // 4 if (config.overlap and config.pv_regs) else 0
    return config.block_n // 2 + config.d // 2 + extra


def invalid_reasons(config: Fa3Config) -> list[str]:
    """Why ``config`` is outside the space (empty when valid); the template's static_asserts."""
    c = config
    why: list[str] = []
    if c.dtype not in ("fp16", "bf16"):
        why.append("dtype must be fp16 or bf16")
    if c.d % 32 or not 32 <= c.d <= 256:
        why.append("head dim must be a multiple of 32 in 32..256")
    if c.d % 64 and c.d != 96:
        why.append("host TMA boxes are 64 columns: D must be a multiple of 64, or 96")
    if c.block_m not in (64, 128, 192):
        why.append("block_m must be 64, 128 or 192")
    if c.block_n % 16 or not 64 <= c.block_n <= 192:
        why.append("block_n must be a multiple of 16 in 64..192")
    if not 2 <= c.stages <= 4:
        why.append("stages must be 2..4")
    if c.pingpong and c.consumer_wgs != 2:
        why.append("ping-pong needs block_m = 128")
    if smem_bytes(c) > MAX_SMEM_PER_BLOCK:
        why.append(f"shared memory {smem_bytes(c)} > {MAX_SMEM_PER_BLOCK}")
    split = c.consumer_wgs > 1
    if c.consumer_regs % 8 or not 24 <= c.consumer_regs <= 256:
        why.append("consumer_regs must be a multiple of 8 in 24..256")
    if split:
        if c.consumer_regs < launch_regs(c):
            why.append("consumer_regs below the launch allocation")
        if producer_regs(c) < 24:
            why.append("register split leaves the producer under 24")
    budget = c.consumer_regs if split else 255
    if acc_regs(c) + REG_HEADROOM > budget:
        why.append(f"accumulators {acc_regs(c)} + {REG_HEADROOM} > {budget} registers")
    return why


def render(config: Fa3Config) -> str:
    """The instantiation .cu of ``config`` (one kernel named ``config.name``)."""
    elem = "__half" if config.dtype == "fp16" else "__nv_bfloat16"
    b = lambda x: "true" if x else "false"  # noqa: E731
    return (
        f'#include "{TEMPLATE_HEADER}"\n'
        f"FA3_DEFINE_KERNEL({config.name}, {config.d}, {elem}, {b(config.causal)}, "
        f"{config.block_m}, {config.block_n}, {config.stages}, {b(config.pv_regs)}, "
        f"{b(config.overlap)}, {b(config.pingpong)}, {config.consumer_regs})\n"
    )


@dataclass
class BuildResult:
    """One nvcc run: the cubin and what ptxas reported."""

    config: Fa3Config
    ok: bool
    cubin: Path | None
    seconds: float
    regs: int | None
    spill_stores: int | None
    spill_loads: int | None
    stack: int | None
    log: str

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "regs": self.regs,
            "spill_stores": self.spill_stores,
            "spill_loads": self.spill_loads,
            "stack": self.stack,
            "warnings": [ln for ln in self.log.splitlines() if "warning" in ln.lower()][:5],
        }


_RE_REGS = re.compile(r"Used (\d+) registers")
_RE_SPILL = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


def parse_ptxas(log: str) -> tuple[int | None, int | None, int | None, int | None]:
    """(registers, spill store bytes, spill load bytes, stack bytes) from ``-Xptxas -v``."""
    regs = _RE_REGS.search(log)
    spill = _RE_SPILL.search(log)
    return (
        int(regs.group(1)) if regs else None,
        int(spill.group(2)) if spill else None,
        int(spill.group(3)) if spill else None,
        int(spill.group(1)) if spill else None,
    )


def compile_source(
    source: str, name: str, workdir: Path, *, nvcc: str = "nvcc", extra: tuple[str, ...] = ()
) -> tuple[bool, Path, float, str]:
    """Write ``source`` to ``workdir/name.cu`` and build ``name.cubin``: (ok, cubin, s, log)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cu = workdir / f"{name}.cu"
    cubin = workdir / f"{name}.cubin"
    cu.write_text(source)
    cmd = [nvcc, *NVCC_FLAGS, f"-I{TEMPLATE_DIR}", *extra, str(cu), "-o", str(cubin)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    return proc.returncode == 0, cubin, seconds, proc.stdout + proc.stderr


def compile_config(config: Fa3Config, workdir: Path, *, nvcc: str = "nvcc") -> BuildResult:
    """Render and compile ``config`` into ``workdir``."""
    ok, cubin, seconds, log = compile_source(render(config), config.name, workdir, nvcc=nvcc)
    regs, st, ld, stack = parse_ptxas(log)
    return BuildResult(config, ok, cubin if ok else None, seconds, regs, st, ld, stack, log)


# ------------------------------------------------------------------------------------------
# CUDA driver (cuda.bindings) and the Fa2Params argument; self-contained so that this harness
# runs whatever state the product's packages are in.


class CudaError(RuntimeError):
    """A CUDA driver call returned an error (``name`` e.g. ``CUDA_ERROR_ILLEGAL_ADDRESS``)."""

    def __init__(self, call_name: str, code: int, name: str, detail: str = "") -> None:
        self.call = call_name
        self.code = code
        self.name = name
        super().__init__(f"{call_name} failed: {name} ({code}){': ' + detail if detail else ''}")


def driver() -> Any:
    """The ``cuda.bindings.driver`` module."""
    from cuda.bindings import driver as cu

    return cu


def _error_name(cu: Any, err: Any) -> str:
    try:
        res, name = cu.cuGetErrorName(err)
        if int(res) == 0 and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        pass
    return str(err)


def call(name: str, *args: Any) -> Any:
    """Call driver function ``name``; unwrap ``(CUresult, *values)``; raise on error."""
    cu = driver()
    err, *values = getattr(cu, name)(*args)
    if int(err) != 0:
        raise CudaError(name, int(err), _error_name(cu, err))
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def ensure_context(device: int = 0) -> None:
    """Make torch's primary context of ``device`` current (kernels and tensors share it)."""
    import torch

    torch.cuda.init()
    torch.cuda.set_device(device)
    torch.empty(1, device=f"cuda:{device}")
    call("cuInit", 0)
    ctx = call("cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        ctx = call("cuDevicePrimaryCtxRetain", call("cuDeviceGet", device))
        call("cuCtxSetCurrent", ctx)


class Fa2Params(ctypes.Structure):
    """The kernel's first argument (codegen/templates/fa_params.cuh); strides in elements."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        *[(f"{t}_{s}_stride", ctypes.c_int64) for t in "qkvo" for s in ("batch", "head", "row")],
        ("batch", ctypes.c_int32),
        ("q_heads", ctypes.c_int32),
        ("kv_heads", ctypes.c_int32),
        ("nq", ctypes.c_int32),
        ("nk", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
    ]


assert ctypes.sizeof(Fa2Params) == 160 and Fa2Params.softmax_scale.offset == 156


def _bnhd_dims(t: torch.Tensor, layout: Layout) -> tuple[int, int, int, int]:
    """(batch, rows, heads, head_dim)."""
    if layout == "bnhd":
        b, n, h, d = t.shape
    else:
        b, h, n, d = t.shape
    return int(b), int(n), int(h), int(d)


def _elem_strides(t: torch.Tensor, layout: Layout) -> tuple[int, int, int]:
    """(batch, head, row) strides in elements."""
    s = t.stride()
    return (s[0], s[2], s[1]) if layout == "bnhd" else (s[0], s[1], s[2])


def make_params(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor | None,
    scale: float,
    layout: Layout = "bnhd",
) -> Fa2Params:
    """The kernel argument from torch tensors (``[B,N,H,D]`` or ``[B,H,N,D]``, D contiguous).

    Raises:
        ValueError: on mismatched shapes/dtypes, a non-contiguous head dim, strides or pointers
            that are not 16-byte multiples, ``Hq % Hkv != 0`` or an empty sequence.
    """
    import torch

    for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        if t.dim() != 4 or t.stride(-1) != 1:
            raise ValueError(f"{name}: 4-d with a contiguous head dim required")
        strides = zip(t.stride()[:3], t.shape[:3], strict=True)
        if t.data_ptr() % 16 or any(x % 8 for x, n in strides if n > 1):
            raise ValueError(f"{name}: pointer and strides must be 16-byte multiples")
        if t.dtype != q.dtype or t.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError("q, k, v, o must share one dtype, fp16 or bf16")
    b, nq, hq, d = _bnhd_dims(q, layout)
    bk, nk, hkv, dk = _bnhd_dims(k, layout)
    if tuple(o.shape) != tuple(q.shape) or tuple(v.shape) != tuple(k.shape) or (bk, dk) != (b, d):
        raise ValueError("shape mismatch between q/o or k/v")
    if hq % hkv or nq < 1 or nk < 1:
        raise ValueError(f"bad heads {hq}/{hkv} or lengths {nq}/{nk}")
    if lse is not None and (lse.dtype != torch.float32 or tuple(lse.shape) != (b, hq, nq)
                            or not lse.is_contiguous()):
        raise ValueError("lse must be a contiguous float32 [B, Hq, Nq] tensor")
    return Fa2Params(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
        lse.data_ptr() if lse is not None else None,
        *_elem_strides(q, layout), *_elem_strides(k, layout), *_elem_strides(v, layout),
        *_elem_strides(o, layout), b, hq, hkv, nq, nk, float(scale),
    )


# ------------------------------------------------------------------------------------------
# TMA descriptors


def _dims_strides(t: torch.Tensor, layout: Layout) -> tuple[list[int], list[int]]:
    """Dimensions (D, N, H, B) and byte strides (row, head, batch) of a 4-d tensor."""
    if layout == "bnhd":
        b, n, h, d = t.shape
        sb, sn, sh, _ = t.stride()
    else:
        b, h, n, d = t.shape
        sb, sh, sn, _ = t.stride()
    es = t.element_size()
    dims = [int(d), int(n), int(h), int(b)]
    strides = [int(sn) * es, int(sh) * es, int(sb) * es]
    # A dimension of extent 1 is never stepped over; give it a stride TMA accepts.
    fallback = [int(d) * es, int(n) * strides[0], int(h) * strides[1]]
    for i, size in enumerate(dims[1:]):
        if size == 1 or strides[i] <= 0:
            strides[i] = max(16, math.ceil(fallback[i] / 16) * 16)
    return dims, strides


def encode_tensor_map(t: torch.Tensor, layout: Layout, box_rows: int) -> Any:
    """The 4-d tiled TMA descriptor of ``t``: box ``(64, box_rows, 1, 1)``, 128-byte swizzle.

    Raises:
        ValueError: when the head dim is not contiguous or strides/pointer are not 16-byte
            multiples (TMA's rules).
        CudaError: when the driver rejects the descriptor.
    """
    import torch

    cu = driver()
    if t.stride(-1) != 1:
        raise ValueError(f"head dim must be contiguous, strides {t.stride()}")
    dims, strides = _dims_strides(t, layout)
    if t.data_ptr() % 16 or any(s % 16 for s in strides):
        raise ValueError(f"TMA needs 16-byte aligned pointer and strides: {strides}")
    dtype = {
        torch.float16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        torch.bfloat16: cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    }[t.dtype]
    return call(
        "cuTensorMapEncodeTiled",
        dtype,
        4,
        t.data_ptr(),
        [cu.cuuint64_t(x) for x in dims],
        [cu.cuuint64_t(x) for x in strides],
        [cu.cuuint32_t(x) for x in (BOX_COLS, box_rows, 1, 1)],
        [cu.cuuint32_t(1)] * 4,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )


def encode_tma(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout, config: Fa3Config
) -> tuple[Any, Any, Any]:
    """The three tensor maps of one launch (Q boxes of block_m rows, K/V of block_n)."""
    return (
        encode_tensor_map(q, layout, config.block_m),
        encode_tensor_map(k, layout, config.block_n),
        encode_tensor_map(v, layout, config.block_n),
    )


# ------------------------------------------------------------------------------------------
# Loading and launching


class Fa3Kernel:
    """One fa3 kernel loaded from its cubin into torch's current context."""

    def __init__(self, config: Fa3Config, cubin: Path | bytes) -> None:
        cu = driver()
        self.config = config
        self.smem = smem_bytes(config)
        image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
        self._buf = ctypes.create_string_buffer(image, len(image))
        self._module = call("cuModuleLoadData", ctypes.addressof(self._buf))
        self._fn = call("cuModuleGetFunction", self._module, config.name.encode())
        attr = cu.CUfunction_attribute
        call(
            "cuFuncSetAttribute",
            self._fn,
            attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            self.smem,
        )
        self.num_regs = int(call("cuFuncGetAttribute", attr.CU_FUNC_ATTRIBUTE_NUM_REGS, self._fn))
        self.local_bytes = int(
            call("cuFuncGetAttribute", attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, self._fn)
        )

    def grid(self, nq: int, q_heads: int, batch: int) -> tuple[int, int, int]:
        return (math.ceil(nq / self.config.block_m), q_heads, batch)

    def bind(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: Layout = "bnhd",
    ) -> Any:
        """A zero-argument launcher (on torch's current stream) with everything prepared.

        Raises:
            ValueError: on shapes, dtypes, strides the ABI does not take, or a dtype/head dim
                that differs from the config's.
        """
        import torch

        c = self.config
        want = torch.float16 if c.dtype == "fp16" else torch.bfloat16
        if q.dtype != want or q.shape[-1] != c.d:
            raise ValueError(f"{c.name} takes {want} D={c.d}, got {q.dtype} D={q.shape[-1]}")
        params = make_params(q, k, v, o, lse, scale, layout)
        maps = encode_tma(q, k, v, layout, c)
        args = (ctypes.c_void_p * 4)(
            ctypes.addressof(params), *(int(m.getPtr()) for m in maps)
        )
        nq, hq, b = params.nq, params.q_heads, params.batch
        geometry = (*self.grid(nq, hq, b), c.threads, 1, 1, self.smem)
        stream_handle = torch.cuda.current_stream().cuda_stream
        cu = driver()
        stream = cu.CUstream(stream_handle)
        fn = self._fn
        keep = (params, maps, args, q, k, v, o, lse)

        def launch() -> None:
            _ = keep
            (err,) = cu.cuLaunchKernel(fn, *geometry, stream, ctypes.addressof(args), 0)
            if int(err) != 0:
                raise CudaError("cuLaunchKernel", int(err), _error_name(cu, err), c.name)

        return launch

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.bind(*args, **kwargs)()

    def unload(self) -> None:
        if self._module is not None:
            driver().cuModuleUnload(self._module)
            self._module = None
