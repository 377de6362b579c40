"""Export the tuned configs of one GPU as ONE self-contained CUDA header.

The header inlines the kernel template (``codegen/templates/fa2_fwd.cuh`` and whatever it
includes from that directory), explicitly instantiates only the configs that won a tuning
problem plus FlashAttention-2's default config per head dim, and defines the dispatch entry
point::

    cudaError_t fa2tune_forward(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
                                bool causal, cudaStream_t stream = 0);

which picks a config by GPU (the device name, cached per device), head dim, N bucket, dtype
and causal. It compiles with plain nvcc (``-std=c++17``, sm_80 and up) and needs no Python.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from codegen.space import fa2_default_config
from core.config import DTYPES, HEAD_DIMS, Dtype, KernelConfig
from db.store import BestResult, Store, normalize_gpu_name
from fa2tune import __version__

log = logging.getLogger(__name__)

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "fa2_fwd.cuh"

_ELEM = {"fp16": "__half", "bf16": "__nv_bfloat16"}
_ENUM = {"fp16": "FA2TUNE_FP16", "bf16": "FA2TUNE_BF16"}
_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"(?P<path>[^"]+)"[^\n]*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[^\n]*\n?", re.MULTILINE)


class ExportError(RuntimeError):
    """The header cannot be produced (missing template, non-local include, ...)."""


class UnknownGpuError(LookupError):
    """The store holds no results for the requested GPU."""


@dataclass(frozen=True)
class TunedPoint:
    """The winning config of one tuned problem, with what is known about its measurement.

    Attributes:
        d: head dim.
        dtype: element type.
        causal: causal mask.
        n: sequence length the config was tuned at (the bucket's centre).
        config: the winning kernel config.
        median_ms: measured median time per launch.
        tflops: measured throughput.
        arch: target architecture of the build, e.g. ``"sm_90"``.
        source_hash: hash of the build's sources and flags.
        nvcc_version: compiler release.
        driver_version: driver the measurement ran under.
        cuda_version: CUDA version of the measuring process.
        measured_at: when it was measured.
    """

    d: int
    dtype: Dtype
    causal: bool
    n: int
    config: KernelConfig
    median_ms: float | None = None
    tflops: float | None = None
    arch: str | None = None
    source_hash: str | None = None
    nvcc_version: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    measured_at: datetime | None = None


def normalise_device_name(name: str) -> str:
    """The comparison key the header uses for device names (mirrored in C++ below).

    Lower case, every run of non-alphanumeric characters one space, a leading ``nvidia``
    dropped: ``"NVIDIA H200"``, ``"nvidia-h200"`` and ``"H200"`` all give ``"h200"``.
    """
    words = re.sub(r"[^0-9a-z]+", " ", name.lower()).split()
    if words and words[0] == "nvidia":
        words = words[1:]
    return " ".join(words)


def inline_template(template_dir: Path = TEMPLATE_DIR, name: str = TEMPLATE_NAME) -> str:
    """The template with every ``#include "..."`` of its directory inlined, recursively.

    Each local file is inlined once (they are ``#pragma once`` headers); system includes
    (``<...>``) stay as they are.

    Raises:
        ExportError: when the template is missing or includes a file outside its directory.
    """
    seen: set[Path] = set()
    root = template_dir.resolve()

    def expand(path: Path) -> str:
        if not path.is_file():
            raise ExportError(f"kernel template not found: {path.name} (looked in {root})")
        seen.add(path)
        text = _PRAGMA_ONCE.sub("", path.read_text(encoding="utf-8"))

        def replace(m: re.Match[str]) -> str:
            inc = (path.parent / m["path"]).resolve()
            if not inc.is_relative_to(root) or not inc.is_file():
                raise ExportError(
                    f"{path.name} includes {m['path']!r}, which is not a file of {root}; "
                    "the exported header must not depend on anything else"
                )
            if inc in seen:
                return f"// (already inlined: {m['path']})"
            body = expand(inc)
            return f"// ---- begin {m['path']} ----\n{body}\n// ---- end {m['path']} ----"

        return _LOCAL_INCLUDE.sub(replace, text)

    return expand(root / name)


def template_hash(template_dir: Path = TEMPLATE_DIR) -> str:
    """Short sha256 of the inlined template: identifies the kernel source in the header."""
    return hashlib.sha256(inline_template(template_dir).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------
# Rendering


def _traits(c: KernelConfig) -> str:
    return (
        f"fa2::Traits<{c.d}, {_ELEM[c.dtype]}, {str(c.causal).lower()}, {c.br}, {c.bc}, "
        f"{c.warps}, {c.stages}, {c.pad}, {str(c.swizzle).lower()}>"
    )


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _comment_safe(s: str) -> str:
    # Values from the database end up in // comments: keep them on one line.
    return " ".join(str(s).split())


def _fmt(x: float | None, spec: str) -> str:
    return "?" if x is None or not math.isfinite(x) else format(x, spec)


def _provenance_lines(points: Sequence[TunedPoint]) -> list[str]:
    lines: list[str] = []
    for p in points:
        mask = "causal" if p.causal else "full"
        when = p.measured_at.isoformat(timespec="seconds") if p.measured_at else "?"
        lines.append(
            f"//   D={p.d} {p.dtype} {mask} N={p.n}: {p.config.name}  "
            f"{_fmt(p.median_ms, '.4f')} ms  {_fmt(p.tflops, '.1f')} TFLOP/s"
        )
        lines.append(
            "//       "
            + _comment_safe(
                f"{p.arch or '?'}, nvcc {p.nvcc_version or '?'}, driver {p.driver_version or '?'}, "
                f"CUDA {p.cuda_version or '?'}, source {p.source_hash or '?'}, measured {when}"
            )
        )
    return lines


_PREAMBLE = """\
// {filename} -- generated by fa2tune {version} on {date}. Do not edit; re-export instead:
//   fa2tune export --gpu {gpu_arg}{ds_arg}{dtype_arg} -o {filename}
//
// FlashAttention-2 forward kernels tuned for: {gpu}
// Kernel template: codegen/templates/{template} (sha256 {template_hash}), inlined below, so
// this header depends on nothing but the CUDA toolkit. Needs sm_80 or newer and C++17:
//   nvcc -std=c++17 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_80,code=sm_80 ...
//
// PUBLIC API (everything else is an implementation detail):
//
//   enum fa2tune_dtype {{ FA2TUNE_FP16, FA2TUNE_BF16 }};
//
//   cudaError_t fa2tune_forward(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
//                               bool causal, cudaStream_t stream = 0);
//     Launches softmax(Q K^T * p.softmax_scale) V on `stream` (asynchronously). Fa2Params is
//     the kernel ABI struct defined below: Q, K, V, O pointers (16-byte aligned), element
//     strides (multiples of 8; the head dim is contiguous), batch, q_heads, kv_heads
//     (q_heads % kv_heads == 0), nq, nk, softmax_scale, and an optional float32 LSE output
//     [batch, q_heads, nq]. Causal is bottom-right aligned (query i sees key j iff
//     j <= i + nk - nq). Returns cudaErrorInvalidValue for a head dim or dtype this header
//     was not generated for or for misaligned/invalid parameters; otherwise the launch's
//     status.
//
//   const char* fa2tune_config_name(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
//                                   bool causal);
//     The config fa2tune_forward would launch (nullptr when it would refuse).
//
// Dispatch: on a device whose name (cudaGetDeviceProperties, cached per device) matches
//   "{gpu}"
// the config tuned at the N nearest to sqrt(nq * nk) on a log scale is used (bucket boundaries
// at the geometric midpoints of the tuned Ns). On other GPUs, and for head dims, dtypes or
// masks without tuned results, FlashAttention-2's default config for the head dim is used.
//
// Head dims: {ds}; dtypes: {dtypes}.
// Tuned results (the bucket centres), with their provenance:
{provenance}
"""

_DETAIL = """\
#include <atomic>
#include <cstdint>
#include <cstring>

enum fa2tune_dtype : int {{ FA2TUNE_FP16 = 0, FA2TUNE_BF16 = 1 }};

// ------------------------------------------------------------------------------------------
// The configs compiled into this header: one alias per config ...
namespace fa2tune_configs {{
{aliases}
}}  // namespace fa2tune_configs

// ... and their explicit instantiations (kernel and host launcher).
{instantiations}

namespace fa2tune_detail {{

using LaunchFn = cudaError_t (*)(const Fa2Params&, cudaStream_t);

struct Choice {{
  long long n;  // the N this config was tuned at (0 for a default)
  LaunchFn launch;
  const char* name;
}};

struct Table {{
  int d;
  int dtype;
  bool causal;
  const Choice* choices;  // sorted by n
  int count;
}};

// Tuned configs, one table per (D, dtype, causal), sorted by N.
{tuned_arrays}
inline constexpr int kTunedCount = {tuned_count};
inline constexpr Table kTuned[] = {{
{tuned_tables}
}};

// FlashAttention-2 defaults, used for other GPUs and untuned shapes.
inline constexpr int kDefaultCount = {default_count};
inline constexpr Choice kDefaultChoices[] = {{
{default_choices}
}};
inline constexpr Table kDefaults[] = {{
{default_tables}
}};

inline constexpr char kTunedGpu[] = {gpu_key};  // normalised device name

// Same key as codegen.export.normalise_device_name: lower case, runs of other characters one
// space, a leading "nvidia" dropped ("NVIDIA H200" -> "h200").
inline void normalise_name(const char* in, char* out, std::size_t cap) {{
  std::size_t len = 0;
  bool pending_space = false;
  for (const char* c = in; *c != '\\0' && len + 2 < cap; ++c) {{
    char ch = *c;
    if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    const bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
    if (!alnum) {{
      pending_space = len > 0;
      continue;
    }}
    if (pending_space) out[len++] = ' ';
    pending_space = false;
    out[len++] = ch;
  }}
  out[len] = '\\0';
  if (std::strncmp(out, "nvidia ", 7) == 0) std::memmove(out, out + 7, len - 7 + 1);
  else if (std::strcmp(out, "nvidia") == 0) out[0] = '\\0';
}}

// Whether the current device is the tuned GPU. cudaGetDeviceProperties is slow, so the
// answer is cached per device ordinal (0 = not looked up yet, 1 = tuned GPU, 2 = other).
inline bool on_tuned_gpu() {{
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  const bool cacheable = dev >= 0 && dev < kMaxDevices;
  if (cacheable) {{
    const int hit = cache[dev].load(std::memory_order_relaxed);
    if (hit != 0) return hit == 1;
  }}
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
  char key[sizeof(prop.name) + 1];
  normalise_name(prop.name, key, sizeof(key));
  const bool match = std::strcmp(key, kTunedGpu) == 0;
  if (cacheable) cache[dev].store(match ? 1 : 2, std::memory_order_relaxed);
  return match;
}}

// The config tuned at the N nearest to n on a log scale: n^2 is compared with the product of
// neighbouring tuned Ns, i.e. the boundaries are their geometric midpoints (exact in int64).
inline const Choice* bucket(const Table& t, long long n2) {{
  int i = 0;
  while (i + 1 < t.count && n2 >= t.choices[i].n * t.choices[i + 1].n) ++i;
  return &t.choices[i];
}}

inline const Choice* select(const Fa2Params& p, int head_dim, int dtype, bool causal) {{
  if (kTunedCount > 0 && on_tuned_gpu()) {{
    const long long n2 = static_cast<long long>(p.nq) * static_cast<long long>(p.nk);
    for (int i = 0; i < kTunedCount; ++i) {{
      const Table& t = kTuned[i];
      if (t.d == head_dim && t.dtype == dtype && t.causal == causal) return bucket(t, n2);
    }}
  }}
  for (int i = 0; i < kDefaultCount; ++i) {{
    const Table& t = kDefaults[i];
    if (t.d == head_dim && t.dtype == dtype && t.causal == causal) return t.choices;
  }}
  return nullptr;
}}

// The ABI's requirements: 16-byte aligned pointers, strides in multiples of 8 elements
// (the kernel moves 16-byte vectors), whole GQA groups, and grid dimensions CUDA allows.
inline bool aligned(const void* ptr) {{
  return (reinterpret_cast<std::uintptr_t>(ptr) & 15u) == 0;
}}
inline bool valid(const Fa2Params& p) {{
  if (p.q == nullptr || p.k == nullptr || p.v == nullptr || p.o == nullptr) return false;
  if (!aligned(p.q) || !aligned(p.k) || !aligned(p.v) || !aligned(p.o)) return false;
  const int64_t strides[] = {{p.q_batch_stride, p.q_head_stride, p.q_row_stride,
                             p.k_batch_stride, p.k_head_stride, p.k_row_stride,
                             p.v_batch_stride, p.v_head_stride, p.v_row_stride,
                             p.o_batch_stride, p.o_head_stride, p.o_row_stride}};
  for (int64_t s : strides)
    if (s % 8 != 0) return false;
  if (p.batch < 1 || p.q_heads < 1 || p.kv_heads < 1 || p.nq < 1 || p.nk < 0) return false;
  if (p.q_heads % p.kv_heads != 0) return false;
  return p.q_heads <= 65535 && p.batch <= 65535;
}}

}}  // namespace fa2tune_detail

// ------------------------------------------------------------------------------------------
// Public entry points (see the top of this file).

inline const char* fa2tune_config_name(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
                                       bool causal) {{
  if (!fa2tune_detail::valid(p)) return nullptr;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  return c == nullptr ? nullptr : c->name;
}}

inline cudaError_t fa2tune_forward(const Fa2Params& p, int head_dim, fa2tune_dtype dtype,
                                   bool causal, cudaStream_t stream = 0) {{
  if (!fa2tune_detail::valid(p)) return cudaErrorInvalidValue;
  const fa2tune_detail::Choice* c =
      fa2tune_detail::select(p, head_dim, static_cast<int>(dtype), causal);
  if (c == nullptr) return cudaErrorInvalidValue;
  return c->launch(p, stream);
}}
"""


def render_header(
    gpu: str,
    points: Iterable[TunedPoint],
    *,
    ds: Sequence[int] = HEAD_DIMS,
    dtypes: Sequence[Dtype] = DTYPES,
    template_dir: Path = TEMPLATE_DIR,
    generated_at: datetime | None = None,
    filename: str = "fa2_tuned.cuh",
) -> str:
    """Render the header from tuned points (the store-free half of :func:`export_header`).

    Args:
        gpu: the GPU name as stored (the device name the header compares with).
        points: winning configs; those outside ``ds``/``dtypes`` are ignored, and of several
            for the same (D, dtype, causal, N) the first is kept.
        ds: head dims the header supports (each gets its default config).
        dtypes: element types the header supports.
        template_dir: where ``fa2_fwd.cuh`` lives.
        generated_at: timestamp for the comment (now when None).
        filename: the header's file name, for the comment.

    Returns:
        The header text.

    Raises:
        ExportError: when the template cannot be inlined.
        ValueError: for an unsupported head dim or dtype.
    """
    ds = sorted(set(ds))
    dtypes = [t for t in DTYPES if t in set(dtypes)]
    for d in ds:
        if d not in HEAD_DIMS:
            raise ValueError(f"unsupported head dim {d}; supported: {HEAD_DIMS}")
    if not dtypes:
        raise ValueError(f"no dtype selected; supported: {', '.join(DTYPES)}")

    # (d, dtype, causal) -> {n: point}
    tables: dict[tuple[int, Dtype, bool], dict[int, TunedPoint]] = {}
    for p in points:
        if p.d in ds and p.dtype in dtypes:
            tables.setdefault((p.d, p.dtype, p.causal), {}).setdefault(p.n, p)
    kept = [tables[k][n] for k in sorted(tables) for n in sorted(tables[k])]

    defaults = [fa2_default_config(d, t, c) for d in ds for t in dtypes for c in (False, True)]
    configs: dict[str, KernelConfig] = {}
    for cfg in [p.config for p in kept] + defaults:
        configs.setdefault(cfg.name, cfg)

    aliases = "\n".join(f"using {name} = {_traits(c)};" for name, c in sorted(configs.items()))
    instantiations = "\n".join(
        f"template __global__ void fa2::fwd_kernel<fa2tune_configs::{name}>(const Fa2Params);\n"
        f"template cudaError_t fa2::launch<fa2tune_configs::{name}>(const Fa2Params&, "
        "cudaStream_t);"
        for name in sorted(configs)
    )

    def choice(n: int, cfg: KernelConfig) -> str:
        return f"{{{n}, &fa2::launch<fa2tune_configs::{cfg.name}>, {_c_string(cfg.name)}}}"

    tuned_arrays: list[str] = []
    tuned_tables: list[str] = []
    for d, dt, causal in sorted(tables):
        ident = f"kTuned_d{d}_{dt}_{'causal' if causal else 'full'}"
        rows = sorted(tables[(d, dt, causal)].items())
        body = ",\n".join(f"    {choice(n, p.config)}" for n, p in rows)
        tuned_arrays.append(f"inline constexpr Choice {ident}[] = {{\n{body}\n}};")
        tuned_tables.append(
            f"    {{{d}, {_ENUM[dt]}, {str(causal).lower()}, {ident}, {len(rows)}}},"
        )
    if not tuned_tables:  # C++ has no empty arrays: a sentinel, never read (kTunedCount is 0)
        tuned_tables.append("    {0, 0, false, nullptr, 0},")

    default_choices = ",\n".join(f"    {choice(0, c)}" for c in defaults)
    default_tables = "\n".join(
        f"    {{{c.d}, {_ENUM[c.dtype]}, {str(c.causal).lower()}, &kDefaultChoices[{i}], 1}},"
        for i, c in enumerate(defaults)
    )

    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    all_ds = tuple(ds) == HEAD_DIMS
    provenance = _provenance_lines(kept) or ["//   (none: every shape uses the defaults)"]
    untuned = [d for d in ds if not any(k[0] == d for k in tables)]
    if untuned:
        provenance.append(
            f"//   No tuned results for D={', '.join(map(str, untuned))}: defaults only."
        )
    preamble = _PREAMBLE.format(
        filename=filename,
        version=__version__,
        date=when,
        gpu=_comment_safe(gpu),
        gpu_arg=_comment_safe(repr(gpu).replace("'", '"')),
        ds_arg="" if all_ds else f" --d {','.join(map(str, ds))}",
        dtype_arg="" if tuple(dtypes) == DTYPES else f" --dtype {','.join(dtypes)}",
        template=TEMPLATE_NAME,
        template_hash=template_hash(template_dir),
        ds=", ".join(map(str, ds)),
        dtypes=", ".join(dtypes),
        provenance="\n".join(provenance),
    )
    detail = _DETAIL.format(
        aliases=aliases,
        instantiations=instantiations,
        tuned_arrays="\n".join(tuned_arrays),
        tuned_count=len(tables),
        tuned_tables="\n".join(tuned_tables),
        default_count=len(defaults),
        default_choices=default_choices,
        default_tables=default_tables,
        gpu_key=_c_string(normalise_device_name(gpu)),
    )
    return (
        f"{preamble}\n#ifndef FA2TUNE_EXPORTED_HEADER_\n#define FA2TUNE_EXPORTED_HEADER_\n\n"
        f"// ======== begin codegen/templates/{TEMPLATE_NAME} (inlined) ========\n"
        f"{inline_template(template_dir).rstrip()}\n"
        f"// ======== end codegen/templates/{TEMPLATE_NAME} ========\n\n"
        f"{detail}\n#endif  // FA2TUNE_EXPORTED_HEADER_\n"
    )


# ------------------------------------------------------------------------------------------
# From the store

_OK = "OK"  # core.records.MeasureStatus.OK; only OK measurements can win
_PAGE = 1000  # db.store.MAX_PAGE


def tuned_results(
    store: Store,
    gpu: str | None = None,
    *,
    ds: Sequence[int] | None = None,
    dtypes: Sequence[str] | None = None,
) -> list[BestResult]:
    """The winner of every square problem (N == Nk) with an OK measurement.

    The distinct problems are collected by paging through the OK measurements once, then
    :meth:`db.store.Store.best` ranks each, so the answers are exactly the store's.

    Args:
        store: the results database.
        gpu: only this GPU (matched like users write it); None for every GPU.
        ds: only these head dims; None for all.
        dtypes: only these dtypes; None for all.

    Returns:
        One result per (GPU, D, dtype, causal, N), sorted by those.
    """
    problems: dict[tuple[str, int, str, bool, int], str] = {}
    for d in sorted(set(ds)) if ds else [None]:
        offset = 0
        while True:
            page = store.results(gpu, d, status=_OK, offset=offset, limit=_PAGE)
            for row in page.items:
                if row.nk != row.n or (dtypes is not None and row.dtype not in dtypes):
                    continue
                key = (normalize_gpu_name(row.gpu), row.d, row.dtype, row.causal, row.n)
                problems.setdefault(key, row.gpu)
            offset += len(page.items)
            if not page.items or offset >= page.total:
                break
    results: list[BestResult] = []
    for (_, d_, dtype, causal, n), name in sorted(problems.items()):
        best = store.best(name, d_, n, dtype, causal)
        if best is not None:
            results.append(best)
    return results


def point_from_best(best: BestResult) -> TunedPoint:
    """A :class:`TunedPoint` from the store's :class:`~db.store.BestResult`."""
    return TunedPoint(
        d=best.d,
        dtype=best.config.dtype,
        causal=best.causal,
        n=best.n,
        config=best.config,
        median_ms=best.median_ms,
        tflops=best.tflops,
        arch=best.arch,
        source_hash=best.source_hash,
        nvcc_version=best.nvcc_version,
        driver_version=best.driver_version,
        cuda_version=best.cuda_version,
        measured_at=best.measured_at,
    )


def export_header(
    store: Store,
    gpu: str,
    ds: Sequence[int] | None = None,
    *,
    dtypes: Sequence[Dtype] | None = None,
    generated_at: datetime | None = None,
    filename: str = "fa2_tuned.cuh",
) -> str:
    """The tuned header for one GPU: template inlined, tuned configs plus defaults, dispatch.

    Args:
        store: the results database.
        gpu: the GPU, as users write it (``"H200"``, ``"NVIDIA H200"``).
        ds: head dims to support (each gets FA2's default config, tuned ones their winners);
            None for every supported head dim.
        dtypes: element types to support; None for both.
        generated_at: timestamp for the header comment (now when None).
        filename: the header's file name, for the comment.

    Returns:
        The header text; it compiles with nvcc alone.

    Raises:
        UnknownGpuError: the store has no OK measurement for ``gpu``.
        ValueError: unsupported head dim or dtype.
        ExportError: the kernel template cannot be inlined.
    """
    ds = tuple(HEAD_DIMS if ds is None else ds)
    dtypes = tuple(DTYPES if dtypes is None else dtypes)
    for d in ds:
        if d not in HEAD_DIMS:
            raise ValueError(f"unsupported head dim {d}; supported: {HEAD_DIMS}")
    for t in dtypes:
        if t not in DTYPES:
            raise ValueError(f"unsupported dtype {t!r}; supported: {', '.join(DTYPES)}")
    key = normalize_gpu_name(gpu)
    known = [g for g in store.gpus() if normalize_gpu_name(g.name) == key]
    if not any(g.ok_measurements for g in known):
        names = sorted({g.name for g in store.gpus() if g.ok_measurements})
        raise UnknownGpuError(
            f"no results for GPU {gpu!r}; GPUs with results: {', '.join(names) or 'none'}"
        )
    results = tuned_results(store, gpu, ds=ds, dtypes=dtypes)
    name = results[0].gpu if results else known[0].name
    log.info(
        "exporting %d tuned configs for %s (D=%s, %s)",
        len(results),
        name,
        ",".join(map(str, ds)),
        ",".join(dtypes),
    )
    return render_header(
        name,
        [point_from_best(b) for b in results],
        ds=ds,
        dtypes=dtypes,
        generated_at=generated_at,
        filename=filename,
    )
