"""Export the tuned configs of one GPU as ONE self-contained CUDA header.

The header is C++ from two templates and data from Python:

- ``codegen/templates/dispatch.cuh``: the dispatch and launch code and the public API,
  with its local includes inlined: each kernel family's part (its
  :attr:`~codegen.families.HeaderPart.template`, e.g. ``fa3_launch.cuh`` with ``fa3_fwd.cuh``)
  once, in registry order, only for the families with a config in the header (through
  ``dispatch_families.inc``, rendered here as their ``#include`` lines), the GPU-name rule
  (``gpu_name.cuh``), the shape distance (``fa_shape.cuh``, the C++ twin of
  :mod:`core.shape`) and ``dispatch_table.inc``, the table rendered here;
- rendered here, from plain values (:class:`TunedPoint`): the comment naming the GPU with the
  provenance (and family) of every tuned config, and the table the dispatch reads: aliases and
  explicit instantiations of the tuned winners plus FlashAttention-2's default config per head
  dim, the tuned GPU's name key, and per (D, dtype, causal) one entry per tuned problem: its
  whole shape (Nq, Nk, batch, heads, KV heads) and its config, from which the dispatch takes
  the nearest shape to the call's. The table's contract is written at the top of
  dispatch.cuh.

The entry points it defines (dispatch.cuh documents them all)::

    cudaError_t fa2tune_forward(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                bool causal, cudaStream_t stream = 0);
    size_t fa2tune_workspace_size(const FaParams& p, int head_dim, fa2tune_dtype dtype,
                                  bool causal);
    cudaError_t fa2tune_forward_with_workspace(const FaParams& p, int head_dim,
                                               fa2tune_dtype dtype, bool causal,
                                               void* workspace, size_t workspace_bytes,
                                               cudaStream_t stream = 0);
    cudaError_t fa2tune_forward_varlen(const FaParams& p, const FaVarlen& v, int num_seqs,
                                       int max_seqlen_q, int max_seqlen_k, int head_dim,
                                       fa2tune_dtype dtype, bool causal,
                                       cudaStream_t stream = 0);
    cudaError_t fa2tune_forward_variant(const FaParams& p, const FaVariant& var, int head_dim,
                                        fa2tune_dtype dtype, bool causal,
                                        cudaStream_t stream = 0);

With page sizes (``kv_pages``, ``fa2tune export --kv-pages 0,16``), the header also defines
``fa2tune_forward_kvcache`` and its workspace and config-name twins: attention over a KV cache
whose lengths live on the device, with an optional in-place append, on the split-KV family's
cache kernels (``_kvc``, paged ``_kvc_pg<P>``) of the tiles the dispatch can pick
(:mod:`codegen.dispatch_kvcache` renders their table, ``kvcache_dispatch.cuh`` holds the code).
Its tuned cache entries are the store's KV-cache winners of those page sizes, of both length
patterns (``kv_lengths``, :mod:`core.kv_lengths`), those timed on a length mix first
(:func:`cache_points`): the nearest entry answers and a tie goes to the mixed one, as the op
picks (:func:`core.kv_lengths.answering_pattern`, :mod:`fa2tune.ops.cache_choice`).
Without page sizes the header is what it was before (only the include's comment says how to get
them).

The packed variable-length entry (``fa2tune_forward_varlen``, its config-name and nearest-entry
queries) is the same dispatch in its packed mode: a :class:`TunedPoint` with ``seqlens`` is a
tuned varlen problem's ``_vl`` winner (fa2's or fa3's, the latter only where they can run),
its table's default the varlen twin of the dense default. :mod:`codegen.dispatch_table`
renders the tables of both modes.

Attention variants (``fa2tune_forward_variant`` and its workspace, config-name, nearest-entry
and packed twins) are the same dispatch keyed by the variant's switches too: a
:class:`TunedPoint` with a non-plain ``variant`` is a tuned variant problem's winner (built
with the variant's switches), rendered by :mod:`codegen.dispatch_variants` into
``dispatch_variants.inc``, with FlashAttention-2's default built with the same switches as
its key's default. Plain points render as they did before variants existed (the same
comment and ``dispatch_table.inc`` text).

It compiles with plain nvcc (``-std=c++17``, sm_80 and up; a family whose targets are all
architecture-specific, like the Hopper family's sm_90a, runs from that code only, and the
header says how to build for it) and needs no Python. This module
reads no database: the caller (``fa2tune export``, ``/v1/export/header``, both through
:mod:`service.header`) queries the store and passes the rows.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from codegen.cpp_text import NOT_IN_COMMENT as _NOT_IN_COMMENT
from codegen.cpp_text import comment_safe as _comment_safe
from codegen.cpp_text import number as _fmt
from codegen.cpp_text import seal_comments as _seal_comments
from codegen.dispatch_kvcache import (
    CacheTuned,
    cache_bases,
    check_kv_pages,
    config_key,
    render_kvcache_table,
)
from codegen.dispatch_table import TableKey, has_varlen_launcher, render_table, varlen_twin
from codegen.dispatch_variants import (
    VariantEntry,
    VariantKey,
    has_variant_launcher,
    render_variant_tables,
    variant_key,
    with_switches,
)
from codegen.families import FAMILIES, Family
from codegen.families.fa2.space import fa2_default_config
from codegen.render import template_hash
from codegen.targets import TARGETS, compute_capability_of
from core.config import COMMON_HEAD_DIMS, DTYPES, HEAD_DIMS, HEAD_DIMS_RULE, Dtype
from core.family import AnyConfig
from core.gpu_name import normalize_gpu_name
from core.kv_lengths import CALL_ORDER, check_kv_lengths, describe_kv_lengths
from core.problem import Problem, kv_page_of
from core.shape import Shape, varlen_shape
from core.variant import PLAIN, Variant
from core.version import __version__

log = logging.getLogger(__name__)

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "fa2_fwd.cuh"  # the kernel template
DISPATCH_TEMPLATE = "dispatch.cuh"  # the header's C++ around the kernel template
TABLE_INCLUDE = "dispatch_table.inc"  # what dispatch.cuh includes; rendered here
FAMILIES_INCLUDE = "dispatch_families.inc"  # the used families' parts; rendered here
VARIANTS_INCLUDE = "dispatch_variants.inc"  # the attention-variant tables; rendered here
KVCACHE_INCLUDE = "dispatch_kvcache.inc"  # the KV-cache part's #include, or a comment
KVCACHE_TEMPLATE = "kvcache_dispatch.cuh"  # the KV-cache entry points (with page sizes only)
KVCACHE_TABLE_INCLUDE = "kvcache_table.inc"  # the KV-cache table; rendered here
#: What a header without page sizes says in the KV-cache part's place.
_NO_KVCACHE = (
    "// (no KV-cache kernels in this header: re-export with --kv-pages, e.g. --kv-pages 0,16,\n"
    "// for fa2tune_forward_kvcache)"
)

_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"(?P<path>[^"]+)"[^\n]*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[^\n]*\n?", re.MULTILINE)


class ExportError(RuntimeError):
    """The header cannot be produced (missing template, non-local include, ...)."""


@dataclass(frozen=True)
class TunedPoint:
    """The winning config of one tuned problem, with what is known about its measurement.

    Attributes:
        d: head dim.
        dtype: element type.
        causal: causal mask.
        n: query length the config was tuned at.
        config: the winning kernel config (any family's).
        median_ms: measured median time per launch.
        tflops: measured throughput.
        arch: target architecture of the build, e.g. ``"sm_90"``.
        source_hash: hash of the build's sources and flags.
        nvcc_version: compiler release.
        driver_version: driver the measurement ran under.
        cuda_version: CUDA version of the measuring process.
        measured_at: when it was measured.
        nk: key length (None: ``n``, a square problem).
        batch, heads: batch size and query heads of the problem (a campaign's defaults,
            :class:`core.problem.Problem`'s, when not given).
        kv_heads: KV heads (None: ``heads``).
        seqlens: a packed varlen problem's lengths (its sequence descriptor; ``n`` is then
            the longest, ``batch`` their count); None for a dense problem.
        variant: the attention variant the problem was tuned for, in the store's form
            (:func:`core.variant.normalize`); plain by default.
        kv_page: a KV-cache problem's layout (0 contiguous, P paged: ``config`` is then its
            cache kernel and ``nk`` the cache's capacity); None for a dense problem.
        kv_lengths: a KV-cache problem's length pattern (:mod:`core.kv_lengths`): ``full``
            (every sequence at the capacity; the default, and a dense problem's) or
            ``mixed``.

    Raises:
        ValueError: ``seqlens`` given with a config that has no varlen kernel, or a
            ``batch`` that does not count them; a config whose variant switches are not
            the variant's; a ``kv_page`` that is not the config's cache layout, or with
            ``seqlens``; a ``kv_lengths`` that is not a pattern, or ``mixed`` without
            ``kv_page``.
    """

    d: int
    dtype: Dtype
    causal: bool
    n: int
    config: AnyConfig
    median_ms: float | None = None
    tflops: float | None = None
    arch: str | None = None
    source_hash: str | None = None
    nvcc_version: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    measured_at: datetime | None = None
    nk: int | None = None
    batch: int = Problem.batch
    heads: int = Problem.heads
    kv_heads: int | None = None
    seqlens: tuple[int, ...] | None = None
    variant: Variant = PLAIN
    kv_page: int | None = None
    kv_lengths: str = "full"

    def __post_init__(self) -> None:
        check_kv_lengths(self.kv_lengths, self.kv_page)
        switches = getattr(self.config, "variant_switches", {})
        if {k: bool(switches.get(k, False)) for k in self.variant.needs} != self.variant.needs:
            raise ValueError(
                f"{self.config.name} is not built with the switches of {self.variant.describe()}"
            )
        if kv_page_of(self.config) != self.kv_page:
            raise ValueError(
                f"{self.config.name} is not the cache kernel of layout {self.kv_page} (None: dense)"
            )
        if self.kv_page is not None and self.seqlens is not None:
            raise ValueError("a KV-cache problem is a dense batch: no seqlens")
        if self.seqlens is None:
            return
        if not getattr(self.config, "varlen", False):
            raise ValueError(f"{self.config.name} is not a varlen (_vl) config")
        if self.batch != len(self.seqlens):
            raise ValueError(
                f"a varlen shape counts the sequences: batch {self.batch} != "
                f"{len(self.seqlens)} lengths"
            )

    @property
    def shape(self) -> Shape:
        """The shape it was measured at (the dispatch's distance is to this): a packed
        problem's is its count of sequences at their mean length (:func:`varlen_shape`).

        Raises:
            core.shape.ShapeError: when the fields make no shape.
        """
        kv_heads = self.heads if self.kv_heads is None else self.kv_heads
        if self.seqlens is not None:
            return varlen_shape(self.seqlens, self.heads, kv_heads)
        return Shape(
            nq=self.n,
            nk=self.n if self.nk is None else self.nk,
            batch=self.batch,
            heads=self.heads,
            kv_heads=kv_heads,
        )

    def describe(self) -> str:
        """The shape for people; a packed batch says its count, mean, longest and total."""
        if self.seqlens is None:
            return self.shape.describe()
        s = self.shape
        gqa = f"/{s.kv_heads}kv" if s.kv_heads != s.heads else ""
        return (
            f"varlen {s.batch} seqs, mean {s.nq}, max {max(self.seqlens)}, "
            f"total {sum(self.seqlens)} H={s.heads}{gqa}"
        )


def inline_template(
    template_dir: Path = TEMPLATE_DIR,
    name: str = TEMPLATE_NAME,
    *,
    generated: Mapping[str, str] | None = None,
    included: Mapping[str, str] | None = None,
) -> str:
    """The template with every ``#include "..."`` of its directory inlined, recursively.

    Each local file is inlined once (they are ``#pragma once`` headers); system includes
    (``<...>``) stay as they are.

    Args:
        template_dir: the directory the template and its local includes live in.
        name: the template's file name, relative to ``template_dir``.
        generated: rendered files by their name relative to ``template_dir``: an include of
            one of these names is replaced by the given text (as is, not expanded further)
            instead of a file's.
        included: rendered files as ``generated``, but expanded like a file: their own
            local includes are inlined in turn (each file still once).

    Raises:
        ExportError: when the template is missing or includes a file outside its directory.
    """
    seen: set[Path] = set()
    root = template_dir.resolve()
    rendered = dict(generated or {})
    expanded = dict(included or {})

    def expand(path: Path) -> str:
        if not path.is_file():
            raise ExportError(f"template not found: {path.name} (looked in {root})")
        seen.add(path)
        return expand_text(path, _PRAGMA_ONCE.sub("", path.read_text(encoding="utf-8")))

    def expand_text(path: Path, text: str) -> str:
        def replace(m: re.Match[str]) -> str:
            inc = (path.parent / m["path"]).resolve()
            rel = inc.relative_to(root).as_posix() if inc.is_relative_to(root) else None
            if rel is not None and rel in rendered:
                body = rendered.pop(rel).rstrip()  # inlined once, like the files
                return f"// ---- begin {m['path']} (rendered) ----\n{body}\n// ---- end ----"
            if rel is not None and rel in expanded:
                body = expand_text(inc, expanded.pop(rel)).rstrip()
                return f"// ---- begin {m['path']} (rendered) ----\n{body}\n// ---- end ----"
            if rel is None or not inc.is_file():
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


# ------------------------------------------------------------------------------------------
# Rendering: data only; every line of C++ logic is in templates/dispatch.cuh.


def _shell_arg(s: str) -> str:
    """``s`` quoted for a POSIX shell, for the re-export command in the header comment.

    A value the comment cannot hold as is (a control character, say) is replaced by its GPU
    key (:func:`~core.gpu_name.normalize_gpu_name`), which ``fa2tune export --gpu`` matches
    the same GPU by."""
    if _NOT_IN_COMMENT.search(s):
        s = normalize_gpu_name(s)
    return shlex.quote(s)


def _provenance_lines(points: Sequence[TunedPoint]) -> list[str]:
    """Two comment lines per point (:meth:`TunedPoint.describe` says its shape or batch, and
    a variant point its variant)."""
    lines: list[str] = []
    for p in points:
        mask = "causal" if p.causal else "full"
        when = p.measured_at.isoformat(timespec="seconds") if p.measured_at else "?"
        shape = p.describe()
        if not p.variant.plain:
            shape += f", {p.variant.describe()}"
        if p.kv_page is not None:  # a cache entry says the lengths it was timed on
            shape += f", {describe_kv_lengths(p.kv_lengths)}"
        lines.append(
            f"//   D={p.d} {p.dtype} {mask} {shape}: {p.config.name} "
            f"(family {p.config.family})  "
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


_VARIANTS = """\
// Attention-variant results, one per tuned problem (fa2tune_forward_variant and
// fa2tune_forward_varlen_variant take, among the tuned problems of a call's switches, those
// of its window and chunk, else the nearest, then the nearest shape; see "Variant dispatch"),
// with their provenance:
{lines}
"""


_PREAMBLE = """\
// {filename} -- generated by fa2tune {version} on {date}. Do not edit; re-export instead:
//   fa2tune export --gpu {gpu_arg}{ds_arg}{dtype_arg}{kv_arg} -o {filename_arg}
//
// FlashAttention-2 forward kernels tuned for: {gpu}
{templates}
// dispatch: codegen/templates/{dispatch}. All are inlined below, so this header depends on
// nothing but the CUDA toolkit. Needs sm_80 or newer and C++17:
{nvcc}
//
// Head dims: {ds} (others: re-export with --d); dtypes: {dtypes}.
// Tuned results, one per tuned shape (the dispatch takes the nearest to a call's shape;
// see "Dispatch" below), with their provenance:
{provenance}
// Packed variable-length (varlen) results, one per tuned batch (fa2tune_forward_varlen takes
// the nearest by count of sequences and mean length), with their provenance:
{varlen}
{variants}{kvcache}//
"""

_KVCACHE = """\
// KV-cache kernels (fa2tune_forward_kvcache: lengths on the device, an optional append) for
// page sizes {pages}: the split-KV tile the dispatch picks for a call, else the key's
// split-KV default, built as its cache twin (see "KV caches" below); on the tuned GPU, ahead
// of that, the nearest tuned KV-cache problem of the call's page size, timed on mixed lengths
// or with every sequence full, a tie going to the mixed one, as the op picks: the call's
// lengths are on the device (plain attention):
{tuned}
"""


_NVCC_PLAIN = """\
//   nvcc -std=c++17 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_80,code=sm_80 ..."""


def _nvcc_note(f: Family) -> str | None:
    """How to build for a family that runs from architecture-specific code only (its targets
    all end in ``a``, like the Hopper family's sm_90a); None for a portable family, whose
    configs every sm_80+ target in the plain command line runs."""
    specific = [a for a in f.archs if a.endswith("a")]
    if not specific or len(specific) != len(f.archs):
        return None
    arch = specific[0]
    digits = arch.removeprefix("sm_").rstrip("a")
    plain, cc = arch.rstrip("a"), compute_capability_of(arch)
    gencode = f"-gencode=arch=compute_{digits}a,code={arch}"
    return "\n".join(
        [
            f"// The configs of the {f.name} family run from {arch} code, on GPUs of compute "
            f"capability",
            f"// {cc} only; for any other target they compile to stubs the dispatch never "
            "picks (it takes",
            "// the nearest config that can run, or FlashAttention-2's default). To run them, "
            "compile",
            f"// for {arch} (in place of {plain}: that code runs the other families' configs "
            "as well):",
            f"//   nvcc -std=c++17 {gencode} ...",
            f"//   nvcc -std=c++17 {gencode}",
            "//        -gencode=arch=compute_80,code=sm_80 ...            (and sm_80+ GPUs)",
        ]
    )


def decode_defaults_for(defaults: Sequence[AnyConfig]) -> dict[TableKey, AnyConfig]:
    """The split-KV default each dense default's key gets for decode steps (a call that no
    tuned decode shape answers takes it, as ``fa2tune.torch``'s choice does), fitted to the
    smallest shared memory per block of any target, since a header's defaults must run
    wherever its code does; keys of head dims split-KV does not take get none."""
    splitkv = FAMILIES["splitkv"]
    least = min(t.smem_per_block for t in TARGETS.values())
    out: dict[TableKey, AnyConfig] = {}
    for c in defaults:
        if c.d in splitkv.head_dims:
            fitted = splitkv.default_within(c.d, c.dtype, c.causal, least)
            if fitted is not None:
                out[(c.d, c.dtype, c.causal)] = fitted
    return out


def render_header(
    gpu: str,
    points: Iterable[TunedPoint],
    *,
    ds: Sequence[int] | None = None,
    dtypes: Sequence[Dtype] = DTYPES,
    template_dir: Path = TEMPLATE_DIR,
    generated_at: datetime | None = None,
    filename: str = "fa2_tuned.cuh",
    kv_pages: Sequence[int] = (),
) -> str:
    """Render the header from tuned points (plain values: no database involved).

    Args:
        gpu: the GPU name as stored (the device name the header compares with).
        points: winning configs, one per tuned problem, dense ones and packed ones (with
            ``seqlens``: ``_vl`` configs, their tables apart), plain ones and variant ones
            (their tables apart too, keyed by the variant's switches as well); those outside
            ``ds``/``dtypes`` are ignored, and of several for the same mode, key, shape (and
            variant window and chunk) the first is kept. Dense problems that differ only in
            Nk, batch, heads or KV heads keep an entry each; a winner of a family without
            kernels of its mode in the header (varlen, variant) is left out with a warning.
            Every supported (D, dtype, causal) also gets its default and the default's varlen
            twin; every variant key with a winner, the default built with its switches and
            that default's varlen twin. Variant entries tied in the lookup are ranked as the
            store ranks them: dense by throughput (then median, then the order given),
            packed by the order given (pass them in problem-id order). KV-cache points
            (``kv_page`` set) of the page sizes in ``kv_pages`` become the tuned cache
            entries, plain ones only, a mixed-length winner ahead of a full one at the same
            shape (:func:`cache_points`).
        ds: head dims the header supports (each gets its default config); None for
            :data:`~core.config.COMMON_HEAD_DIMS` plus every head dim of the dense points (every
            default config is compiled into the user's program, so not all
            :data:`~core.config.HEAD_DIMS`).
        dtypes: element types the header supports.
        template_dir: where ``fa2_fwd.cuh`` and ``dispatch.cuh`` live.
        generated_at: timestamp for the comment (now when None).
        filename: the header's file name, for the comment.
        kv_pages: page sizes of the KV-cache kernels (``fa2tune_forward_kvcache``), 0 for
            contiguous caches (:data:`~codegen.dispatch_kvcache.KV_PAGES_RULE`); none (the
            default) leaves the header without KV-cache code or kernels.

    Returns:
        The header text.

    Raises:
        ExportError: when the templates cannot be inlined.
        ValueError: for an unsupported head dim, dtype or page size.
    """
    kv_pages = check_kv_pages(kv_pages)
    points = list(points)
    dense = [p for p in points if p.seqlens is None]
    dtypes = [t for t in DTYPES if t in set(dtypes)]
    asked = ds is not None
    if ds is None:
        ds = [*COMMON_HEAD_DIMS, *(p.d for p in dense if p.dtype in dtypes and p.d in HEAD_DIMS)]
    ds = sorted(set(ds))
    for d in ds:
        if d not in HEAD_DIMS:
            raise ValueError(f"unsupported head dim {d}: not {HEAD_DIMS_RULE}")
    if not dtypes:
        raise ValueError(f"no dtype selected; supported: {', '.join(DTYPES)}")

    # Per mode, (d, dtype, causal) -> {shape: point}, the first of equal shapes kept; variant
    # points per mode and (d, dtype, causal, switches), the first of equal shape and window.
    tables: dict[TableKey, dict[Shape, TunedPoint]] = {}
    packed: dict[TableKey, dict[Shape, TunedPoint]] = {}
    variants: dict[VariantKey, dict[tuple[Shape, int, int, int], TunedPoint]] = {}
    packed_variants: dict[VariantKey, dict[tuple[Shape, int, int, int], TunedPoint]] = {}
    # KV-cache problems per (key, page size, shape), the first kept; only for the page sizes
    # asked for (their kernels are built only then).
    caches: dict[tuple[VariantKey, int, Shape], TunedPoint] = {}
    selected = [p for p in points if p.d in ds and p.dtype in dtypes]
    for p in cache_points(selected, kv_pages):
        assert p.kv_page is not None  # cache_points keeps cache points only
        caches.setdefault((config_key(p.config), p.kv_page, p.shape), p)
    for p in selected:
        if p.kv_page is not None:
            continue  # gathered above
        if not p.variant.plain:
            if not has_variant_launcher(p.config):
                log.warning(
                    "variant winner %s left out of the header: its family has no variant "
                    "kernels of its mode there",
                    p.config.name,
                )
                continue
            v = p.variant
            into = variants if p.seqlens is None else packed_variants
            into.setdefault(variant_key(p.d, p.dtype, p.causal, v), {}).setdefault(
                (p.shape, v.window_left, v.window_right, v.chunk), p
            )
            continue
        if p.seqlens is not None and not has_varlen_launcher(p.config):
            log.warning(
                "varlen winner %s left out of the header: its family has no varlen kernels there",
                p.config.name,
            )
            continue
        mode = tables if p.seqlens is None else packed
        mode.setdefault((p.d, p.dtype, p.causal), {}).setdefault(p.shape, p)
    # Listed in the tables' order, so an entry's index (fa2tune_nearest_tuned) is its rank
    # in the provenance too.
    kept = [tables[k][s] for k in sorted(tables) for s in sorted(tables[k])]
    packed_kept = [packed[k][s] for k in sorted(packed) for s in sorted(packed[k])]
    defaults = [fa2_default_config(d, t, c) for d in ds for t in dtypes for c in (False, True)]
    decode_defaults = decode_defaults_for(defaults)
    table = render_table(
        gpu,
        {k: {s: p.config for s, p in v.items()} for k, v in tables.items()},
        defaults,
        {k: {s: p.config for s, p in v.items()} for k, v in packed.items()},
        [varlen_twin(c) for c in defaults],
        decode_defaults=decode_defaults,
    )
    variant_keys = sorted({*variants, *packed_variants})
    variant_defaults = [
        (k, with_switches(fa2_default_config(k[0], k[1], k[2]), k)) for k in variant_keys
    ]
    variant_table = render_variant_tables(
        {k: _variant_entries(v.values(), packed=False) for k, v in variants.items()},
        variant_defaults,
        {k: _variant_entries(v.values(), packed=True) for k, v in packed_variants.items()},
        [(k, varlen_twin(c)) for k, c in variant_defaults],
    )
    # Listed in the tables' order (key, then shape and window), as kept is.
    variant_kept = [
        e for mode in (variants, packed_variants) for k in sorted(mode)
        for _, e in sorted(mode[k].items(), key=lambda item: item[0])
    ]  # fmt: skip
    tuned_dense = [
        *(p.config for p in kept),
        *(p.config for v in variants.values() for p in v.values()),
    ]
    cache_table, cache_families = _kvcache_part(
        tuned_dense, decode_defaults, variant_keys, kv_pages,
        [CacheTuned.of(p.config, p.shape, p.kv_lengths) for p in caches.values()],
    )  # fmt: skip
    # Listed in the table's order (key, page size, shape).
    cache_kept = [caches[k] for k in sorted(caches)]

    # The families with a config in the header, in registry order (fa2 and split-KV for any
    # head dim split-KV takes: the defaults);
    # a family with only varlen winners (fa3 _vl) needs its part as much as a dense one.
    used = (
        {c.family for c in [*defaults, *decode_defaults.values()]}
        | {p.config.family for p in [*kept, *packed_kept, *variant_kept]}
        | cache_families
    )
    families = [f for f in FAMILIES.values() if f.name in used]
    templates = [
        f"codegen/templates/{f.templates[0]} (template hash "
        f"{template_hash(template_dir, main=f.templates[0])})"
        for f in families
    ]
    nvcc = "\n".join([_NVCC_PLAIN, *filter(None, map(_nvcc_note, families))])
    # Each used family's part once, in registry order (two families may share a template);
    # a family without configs here is left out, with a comment in its place.
    parts: list[str] = []
    for f in FAMILIES.values():
        line = (
            f'#include "{f.header.template}"'
            if f.name in used
            else f"// ({f.name}: no config of this family in the header)"
        )
        if line not in parts:
            parts.append(line)

    when = (generated_at or datetime.now(UTC)).isoformat(timespec="seconds")
    provenance = _provenance_lines(kept) or ["//   (none: every shape uses the defaults)"]
    untuned = [d for d in ds if not any(k[0] == d for k in tables)]
    if untuned:
        provenance.append(
            f"//   No tuned results for D={', '.join(map(str, untuned))}: defaults only."
        )
    preamble = _PREAMBLE.format(
        filename=_comment_safe(filename),
        filename_arg=shlex.quote(_comment_safe(filename)),
        version=__version__,
        date=when,
        gpu=_comment_safe(gpu),
        gpu_arg=_shell_arg(gpu),
        ds_arg=f" --d {','.join(map(str, ds))}" if asked else "",
        dtype_arg="" if tuple(dtypes) == DTYPES else f" --dtype {','.join(dtypes)}",
        kv_arg=f" --kv-pages {','.join(map(str, kv_pages))}" if kv_pages else "",
        templates="// Kernel templates: " + ",\n//   ".join(templates) + ";",
        nvcc=nvcc,
        dispatch=DISPATCH_TEMPLATE,
        ds=", ".join(map(str, ds)),
        dtypes=", ".join(dtypes),
        provenance="\n".join(provenance),
        varlen="\n".join(
            _provenance_lines(packed_kept)
            or ["//   (none: packed batches run the defaults' varlen twins)"]
        ),
        # Only with variant results: a plain header's comment is what it always was.
        variants=_VARIANTS.format(lines="\n".join(_provenance_lines(variant_kept)))
        if variant_kept
        else "",
        # Only with page sizes, likewise.
        kvcache=_KVCACHE.format(
            pages=", ".join(_page_words(kv_pages)),
            tuned="\n".join(_provenance_lines(cache_kept) or ["//   (none)"]),
        )
        if kv_pages
        else "",
    )
    generated = {TABLE_INCLUDE: table, VARIANTS_INCLUDE: variant_table}
    if cache_table is not None:
        generated[KVCACHE_TABLE_INCLUDE] = cache_table
    kvcache_part = f'#include "{KVCACHE_TEMPLATE}"' if cache_table is not None else _NO_KVCACHE
    body = inline_template(
        template_dir,
        DISPATCH_TEMPLATE,
        generated=generated,
        included={FAMILIES_INCLUDE: "\n".join(parts), KVCACHE_INCLUDE: kvcache_part},
    )
    return f"{_seal_comments(preamble)}{body.rstrip()}\n"


def cache_points(points: Iterable[TunedPoint], kv_pages: Sequence[int]) -> list[TunedPoint]:
    """The KV-cache points a header with page sizes ``kv_pages`` holds: the plain ones (a
    variant's is left out, with a warning) of those page sizes, those timed on mixed lengths
    first, each pattern in the order given.

    Both patterns stay: the header's cache call cannot see its lengths (they are on the
    device), so it answers as the op does (:func:`core.kv_lengths.answering_pattern`): the
    nearest entry of either pattern, a tie going to the mixed one. The exporter keeps the
    first point of each (key, page size, shape), the mixed one where both were tuned there,
    and the C++ nearest-entry pick breaks a tie on distance by the shape, as the op does.
    """
    kept: list[TunedPoint] = []
    for p in points:
        if p.kv_page is None or p.kv_page not in kv_pages:
            continue
        if not p.variant.plain:
            log.warning("KV-cache winner %s of a variant left out of the header: its "
                        "tuned cache entries are plain", p.config.name)  # fmt: skip
            continue
        kept.append(p)
    return sorted(kept, key=lambda p: CALL_ORDER.index(p.kv_lengths))


def _kvcache_part(
    tuned: Sequence[AnyConfig],
    decode_defaults: Mapping[TableKey, AnyConfig],
    variant_keys: Sequence[VariantKey],
    kv_pages: Sequence[int],
    caches: Sequence[CacheTuned],
) -> tuple[str | None, set[str]]:
    """``kvcache_table.inc`` (None without page sizes) and the families of its configs: the
    cache twins, per page size, of every config the dispatch can pick for a cache call (the
    dense and variant tuned ones, the decode defaults), and the tuned cache problems'
    winners."""
    if not kv_pages:
        return None, set()
    bases = cache_bases(tuned, decode_defaults, variant_keys)
    families = {b.config.family for b in bases} | {c.config.family for c in caches}
    return render_kvcache_table(bases, kv_pages, caches), families


def _page_words(pages: Sequence[int]) -> list[str]:
    """Page sizes for the comment: 0 says what it means."""
    return ["0 (contiguous)" if p == 0 else str(p) for p in pages]


def _variant_entries(points: Iterable[TunedPoint], *, packed: bool) -> list[VariantEntry]:
    """One key's entries, each ranked as :func:`core.lookup.pick` breaks ties: a packed
    problem by the order given (the store's problem ids), a dense one by throughput, then
    median, then the order given (the store's last tie-break, the measurement id, is not a
    point's)."""
    pts = list(points)

    def store_rank(i: int) -> tuple[float, float, int]:
        tflops, median = pts[i].tflops, pts[i].median_ms
        return (-(tflops or 0.0), float("inf") if median is None else median, i)

    order = list(range(len(pts))) if packed else sorted(range(len(pts)), key=store_rank)
    rank = {i: r for r, i in enumerate(order)}
    entries = []
    for i, p in enumerate(pts):
        v = p.variant
        entries.append(
            VariantEntry(p.shape, v.window_left, v.window_right, v.chunk, rank[i], p.config)
        )
    return entries
