"""The exported header's packed variable-length (varlen) part, rendered from plain values.

``fa2tune_forward_varlen`` (codegen/templates/dispatch.cuh) launches packed batches
(``[total, heads, D]`` rows, ``cu_seqlens`` offsets) through the ``_vl`` configs' host
launchers, ``fa2::launch_varlen`` and ``fa3::launch_varlen``. Its data is rendered here, into
the same ``dispatch_table.inc`` as the dense tables (:func:`codegen.export.render_table`
calls :func:`render_varlen_tables`):

- per (D, dtype, causal), one entry per tuned varlen problem (:class:`VarlenPoint`): the
  shape the store compares varlen problems by (:func:`core.shape.varlen_shape`: the count of
  sequences at their mean length, with the problem's heads) and the problem's winning ``_vl``
  config. A call takes the entry nearest to its own such shape, by the dense tables' distance
  (``fa_shape.cuh``), as :meth:`db.store.Store.best_varlen` does for lengths it holds no
  exact match for;
- per (D, dtype, causal) the header serves densely, the varlen twin of FlashAttention-2's
  default config (:func:`varlen_twin`: its tiles with ``varlen`` set), used on other GPUs and
  for keys without tuned varlen results, so every head dim the header serves it also serves
  packed.

Only a family whose :class:`~codegen.families.HeaderPart` names ``varlen_kernel`` and
``varlen_launcher`` (fa2, fa3) has varlen kernels in the header. Each entry carries its
family's ``varlen_guard`` (fa3's ``fa3::can_launch_varlen``: compute capability 9.0, an
sm_90a build, views TMA can address), or nullptr (fa2's run wherever the header's code
does); the dispatch passes over entries that cannot run for the nearest that can, else the
twin (always fa2), as the dense dispatch does. Varlen entries take no workspace. Winners of
a family without varlen kernels in the header are left out with a warning, and their keys
fall back to the remaining entries or the twin.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from codegen.cpp_text import DATA_DECL, braced, c_string, cpp_bool
from codegen.families import FAMILIES, family_of
from core.config import Dtype
from core.elements import element
from core.fa2_config import Fa2Config
from core.family import AnyConfig
from core.shape import Shape

if TYPE_CHECKING:  # codegen.export imports this module; the annotation alone needs the name
    from codegen.export import TunedPoint

log = logging.getLogger(__name__)

#: (head dim, dtype, causal): what a varlen table is keyed by, as the dense tables are.
VarlenKey = tuple[int, Dtype, bool]


def is_varlen(config: AnyConfig) -> bool:
    """Whether ``config`` compiles a packed-batch kernel (a ``_vl`` config, of any family)."""
    return bool(getattr(config, "varlen", False))


def header_varlen_families() -> list[str]:
    """The families whose varlen configs the header can launch (their header part names a
    varlen kernel and launcher): the store's varlen winners are asked for among these."""
    return [
        f.name
        for f in FAMILIES.values()
        if f.header.varlen_kernel is not None and f.header.varlen_launcher is not None
    ]


def has_varlen_launcher(config: AnyConfig) -> bool:
    """Whether the header can launch ``config`` as a packed batch: a varlen config of a
    family whose header part has varlen kernels."""
    part = family_of(config).header
    return is_varlen(config) and part.varlen_kernel is not None and part.varlen_launcher is not None


def varlen_twin(config: AnyConfig) -> Fa2Config:
    """The varlen config with ``config``'s tiles: what packed calls run where nothing was
    tuned, when ``config`` is the dense default the header falls back to.

    The twin is always fa2's: it must run wherever the header's code does (the dense
    defaults are fa2's for the same reason).

    Raises:
        ValueError: ``config`` is not an fa2 config.
    """
    if not isinstance(config, Fa2Config):
        raise ValueError(f"{config.name}: the varlen defaults are fa2 configs")
    return replace(config, varlen=True)


@dataclass(frozen=True)
class VarlenPoint:
    """The winning ``_vl`` config of one tuned varlen problem.

    Attributes:
        point: the config and its measurement's provenance (``point.n`` is the longest
            sequence, ``point.batch`` their count, ``point.heads``/``kv_heads`` the heads).
        seqlens: the lengths the batch was measured on.
        shape: the shape the dispatch measures a call's distance to:
            :func:`core.shape.varlen_shape` of ``seqlens`` and the heads, computed by the
            caller with the store's rule (this module reads no database).

    Raises:
        ValueError: the config has no varlen kernel, or ``shape`` does not count
            ``seqlens``' sequences.
    """

    point: TunedPoint
    seqlens: tuple[int, ...]
    shape: Shape

    def __post_init__(self) -> None:
        if not is_varlen(self.point.config):
            raise ValueError(f"{self.point.config.name} is not a varlen (_vl) config")
        if self.shape.batch != len(self.seqlens):
            raise ValueError(
                f"a varlen shape counts the sequences: batch {self.shape.batch} != "
                f"{len(self.seqlens)} lengths"
            )

    @property
    def key(self) -> VarlenKey:
        return (self.point.d, self.point.dtype, self.point.causal)

    def describe(self) -> str:
        """The batch for people: count, mean (the shape's) and longest length, heads."""
        s = self.shape
        gqa = f"/{s.kv_heads}kv" if s.kv_heads != s.heads else ""
        return (
            f"varlen {s.batch} seqs, mean {s.nq}, max {max(self.seqlens)}, "
            f"total {sum(self.seqlens)} H={s.heads}{gqa}"
        )


def varlen_tables(
    points: Iterable[VarlenPoint], ds: Sequence[int], dtypes: Sequence[Dtype]
) -> dict[VarlenKey, dict[Shape, VarlenPoint]]:
    """(D, dtype, causal) -> {varlen shape: point}, for the head dims and dtypes asked for.

    Of several points with one key and shape the first is kept: given in problem-id order
    (:meth:`db.store.Store.varlen_winners`), that is the problem
    :meth:`~db.store.Store.best_varlen` would pick among them (it breaks ties by id).
    """
    tables: dict[VarlenKey, dict[Shape, VarlenPoint]] = {}
    for v in points:
        if v.point.d not in ds or v.point.dtype not in dtypes:
            continue
        if not has_varlen_launcher(v.point.config):
            log.warning(
                "varlen winner %s left out of the header: its family has no varlen kernels there",
                v.point.config.name,
            )
            continue
        tables.setdefault(v.key, {}).setdefault(v.shape, v)
    return tables


def _choice(shape: Shape | None, config: AnyConfig) -> str:
    """One ``VarlenChoice``: the tuned varlen shape (all 0 for a default), launcher, name,
    and the family's varlen guard (nullptr in C++ for a family that runs everywhere)."""
    part = family_of(config).header
    launcher = part.varlen_launcher
    if launcher is None or not has_varlen_launcher(config):
        raise ValueError(f"{config.name} has no varlen launcher in the header")
    dims = (
        (0,) * 5
        if shape is None
        else (shape.nq, shape.nk, shape.batch, shape.heads, shape.kv_heads)
    )
    alias = f"fa2tune_configs::{config.name}"
    guard = "nullptr" if part.varlen_guard is None else f"&{part.varlen_guard}<{alias}>"
    return braced(braced(*dims), f"&{launcher}<{alias}>", c_string(config.name), guard)


def _table_row(key: VarlenKey, choices: str, count: int) -> str:
    d, dtype, causal = key
    return "    " + braced(d, element(dtype).header_enum, cpp_bool(causal), choices, count) + ","


def render_varlen_tables(
    tables: Mapping[VarlenKey, Mapping[Shape, AnyConfig]], defaults: Sequence[AnyConfig]
) -> list[str]:
    """The varlen part of ``dispatch_table.inc`` (inside ``namespace fa2tune_detail``;
    the configs' aliases and instantiations are written with the others').

    Args:
        tables: (D, dtype, causal) -> {varlen shape: winning ``_vl`` config}; written sorted
            by shape, as the dense tables are, so ties go where core.shape's do.
        defaults: one ``_vl`` config per supported (D, dtype, causal) (:func:`varlen_twin`).

    Returns:
        C++ lines: the tuned tables (``kVarlenTuned``) and the defaults (``kVarlenDefaults``).
    """
    out = [
        "",
        "// Packed variable-length (_vl) configs, one table per (D, dtype, causal): one entry per",
        "// tuned varlen problem, {mean, mean, sequences, heads, kv_heads} (the count of",
        "// sequences at their mean length, core.shape.varlen_shape), sorted by shape.",
    ]
    rows: list[str] = []
    for key in sorted(tables):
        d, dt, causal = key
        ident = f"kVarlen_d{d}_{dt}_{'causal' if causal else 'full'}"
        by_shape = sorted(tables[key].items())
        out.append(f"{DATA_DECL} VarlenChoice {ident}[] = " + "{")
        out += [f"    {_choice(shape, cfg)}," for shape, cfg in by_shape]
        out.append("};")
        rows.append(_table_row(key, ident, len(by_shape)))
    if not rows:  # C++ has no empty arrays: a sentinel, never read (kVarlenTunedCount is 0)
        rows.append("    " + braced(0, 0, "false", "nullptr", 0) + ",")
    out += [
        f"{DATA_DECL} int kVarlenTunedCount = {len(tables)};",
        f"{DATA_DECL} VarlenTable kVarlenTuned[] = {{",
        *rows,
        "};",
        "",
        "// The varlen twins of FlashAttention-2's defaults (the same tiles), for other GPUs and",
        "// keys without tuned varlen results.",
        f"{DATA_DECL} int kVarlenDefaultCount = {len(defaults)};",
        f"{DATA_DECL} VarlenChoice kVarlenDefaultChoices[] = {{",
        ",\n".join(f"    {_choice(None, c)}" for c in defaults),
        "};",
        f"{DATA_DECL} VarlenTable kVarlenDefaults[] = {{",
        *(
            _table_row((c.d, c.dtype, c.causal), f"&kVarlenDefaultChoices[{i}]", 1)
            for i, c in enumerate(defaults)
        ),
        "};",
    ]
    return out
