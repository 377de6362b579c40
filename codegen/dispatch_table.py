"""``dispatch_table.inc``: the data the exported header's dispatch reads, for both modes.

dispatch.cuh (its contract is written at its top) dispatches a dense call
(``fa2tune_forward``) and a packed variable-length one (``fa2tune_forward_varlen``) by one
rule: per (D, dtype, causal) a table of tuned entries, each a shape and a config, of which it
takes the nearest to the call's shape (``fa_shape.cuh``, the C++ twin of :mod:`core.shape`),
passing over entries whose family's guard says they cannot run here, else the key's default.
The two modes differ only in what an entry points at, so both are rendered here by the same
code (:func:`render_table`), from plain values:

- dense: one ``Choice`` per tuned shape (Nq, Nk, batch, heads, KV heads): the family's
  launcher, guard and caller-workspace entry points; the defaults are FlashAttention-2's;
- packed: one ``VarlenChoice`` per tuned varlen problem, at the shape the store compares
  packed batches by (:func:`core.shape.varlen_shape`: the count of sequences at their mean
  length, with the problem's heads): the family's varlen launcher and varlen guard (no
  workspace); the defaults are the packed twins of FlashAttention-2's (:func:`varlen_twin`),
  so every head dim the header serves it also serves packed.

Only a family whose :class:`~codegen.families.HeaderPart` names ``varlen_kernel`` and
``varlen_launcher`` has packed entries (:func:`has_varlen_launcher`); winners of another
family are left out by the exporter with a warning. This module reads no database and imports
nothing of the exporter (:mod:`codegen.export` imports it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from codegen.cpp_text import DATA_DECL, braced, c_string, cpp_bool
from codegen.families import FAMILIES, family_of
from core.config import Dtype
from core.elements import element
from core.fa2_config import Fa2Config
from core.family import AnyConfig
from core.gpu_name import normalize_gpu_name
from core.shape import Shape

#: (head dim, dtype, causal): what a dispatch table is keyed by, in both modes.
TableKey = tuple[int, Dtype, bool]


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
class TableMode:
    """What the C++ names and says differently for one mode of a table (dense or packed;
    plain or variant: :mod:`codegen.dispatch_variants` uses it too); the rest is shared."""

    choice: str  # the entry struct
    table: str  # the per-key table struct
    key_table: str  # the prefix of one key's entries
    tuned: str  # the tuned tables' array (and, + "Count", their number)
    defaults: str  # the prefix of the default arrays
    heading: tuple[str, ...]
    defaults_heading: tuple[str, ...]


_DENSE = TableMode(
    "Choice", "Table", "kTuned", "kTuned", "kDefault",
    ("// Tuned configs, one table per (D, dtype, causal): one entry per tuned shape",
     "// {nq, nk, batch, heads, kv_heads}, sorted by shape."),
    ("// FlashAttention-2 defaults, used for other GPUs and untuned shapes; after each, for head",
     "// dims split-KV takes, split-KV's default, which decode steps (Nq <= 16) take instead."),
)  # fmt: skip
_PACKED = TableMode(
    "VarlenChoice", "VarlenTable", "kVarlen", "kVarlenTuned", "kVarlenDefault",
    ("",
     "// Packed variable-length (_vl) configs, one table per (D, dtype, causal): one entry per",
     "// tuned varlen problem, {mean, mean, sequences, heads, kv_heads} (the count of",
     "// sequences at their mean length, core.shape.varlen_shape), sorted by shape."),
    ("// The varlen twins of FlashAttention-2's defaults (the same tiles), for other GPUs and",
     "// keys without tuned varlen results."),
)  # fmt: skip


def _choice(shape: Shape | None, config: AnyConfig, packed: bool) -> str:
    """One entry: the tuned shape (all 0 for a default), launcher, name and guard (nullptr in
    C++ for a family that runs everywhere); a dense one also its caller-workspace entry
    points (``Workspace<alias>``, dispatch.cuh finds a family's by its Traits)."""
    part = family_of(config).header
    alias = f"fa2tune_configs::{config.name}"
    dims = braced(*((0,) * 5 if shape is None else
                    (shape.nq, shape.nk, shape.batch, shape.heads, shape.kv_heads)))  # fmt: skip
    if not packed:
        guard = "nullptr" if part.guard is None else f"&{part.guard}<{alias}>"
        workspace = f"Workspace<{alias}>"
        return braced(dims, f"&{part.launcher}<{alias}>", c_string(config.name), guard,
                      f"{workspace}::size", f"{workspace}::launch")  # fmt: skip
    if part.varlen_launcher is None or not has_varlen_launcher(config):
        raise ValueError(f"{config.name} has no varlen launcher in the header")
    guard = "nullptr" if part.varlen_guard is None else f"&{part.varlen_guard}<{alias}>"
    return braced(dims, f"&{part.varlen_launcher}<{alias}>", c_string(config.name), guard)


def _table_row(key: TableKey, choices: str, count: int) -> str:
    d, dtype, causal = key
    return "    " + braced(d, element(dtype).header_enum, cpp_bool(causal), choices, count) + ","


def _tables(
    mode: TableMode,
    tables: Mapping[TableKey, Mapping[Shape, AnyConfig]],
    defaults: Sequence[AnyConfig],
    decode: Mapping[TableKey, AnyConfig] | None = None,
) -> list[str]:
    """One mode's tuned tables (sorted by shape, as :func:`core.shape.nearest_shape` must see
    them for the C++ and Python tie-breaks to agree) and its defaults: one choice per key,
    then the key's ``decode`` default when it has one (``dispatch.cuh``'s ``select`` takes
    it for decode steps)."""
    packed = mode is _PACKED
    out = list(mode.heading)
    rows: list[str] = []
    for key in sorted(tables):
        d, dt, causal = key
        ident = f"{mode.key_table}_d{d}_{dt}_{'causal' if causal else 'full'}"
        by_shape = sorted(tables[key].items())
        out.append(f"{DATA_DECL} {mode.choice} {ident}[] = " + "{")
        out += [f"    {_choice(shape, cfg, packed)}," for shape, cfg in by_shape]
        out.append("};")
        rows.append(_table_row(key, ident, len(by_shape)))
    if not rows:  # C++ has no empty arrays: a sentinel, never read (the count is 0)
        rows.append("    " + braced(0, 0, "false", "nullptr", 0) + ",")
    # Each key's default, then its decode default if any, one after the other.
    choices: list[AnyConfig] = []
    rows_of: list[tuple[TableKey, int, int]] = []
    decode = decode or {}
    for c in defaults:
        key = (c.d, c.dtype, c.causal)
        extra = decode.get(key)
        rows_of.append((key, len(choices), 1 if extra is None else 2))
        choices += [c] if extra is None else [c, extra]
    return [
        *out,
        f"{DATA_DECL} int {mode.tuned}Count = {len(tables)};",
        f"{DATA_DECL} {mode.table} {mode.tuned}[] = {{",
        *rows,
        "};",
        "",
        *mode.defaults_heading,
        f"{DATA_DECL} int {mode.defaults}Count = {len(defaults)};",
        f"{DATA_DECL} {mode.choice} {mode.defaults}Choices[] = {{",
        ",\n".join(f"    {_choice(None, c, packed)}" for c in choices),
        "};",
        f"{DATA_DECL} {mode.table} {mode.defaults}s[] = {{",
        *(_table_row(key, f"&{mode.defaults}Choices[{at}]", n) for key, at, n in rows_of),
        "};",
    ]


def config_instantiations(
    configs: Sequence[AnyConfig], variant: bool = False, cache: bool = False
) -> list[str]:
    """The header lines that compile ``configs`` (each name once, in name order): an alias
    per config in ``fa2tune_configs``, then each family's explicit instantiations of it
    (``variant``: the variant kernels and launchers, for the variant tables' include;
    ``cache``: the KV-cache kernels, their launchers and append kernels, for the KV-cache
    table's)."""
    unique: dict[str, AnyConfig] = {}
    for cfg in configs:
        unique.setdefault(cfg.name, cfg)
    which = "attention-variant configs" if variant else "configs"
    kernel = "variant kernel" if variant else "kernel"
    if cache:
        which, kernel = "KV-cache configs", "cache and append kernels"
    out = [
        f"// The {which} compiled into this header: one alias per config ...",
        "namespace fa2tune_configs {",
        *(f"using {name} = {family_of(c).header.traits(c)};" for name, c in sorted(unique.items())),
        "}  // namespace fa2tune_configs",
        "",
        f"// ... and their explicit instantiations ({kernel}, host launcher, guard if any).",
    ]
    for name, c in sorted(unique.items()):
        extra = {"variant": True} if variant else {}
        if cache:
            extra = {"cache": True}
        out += family_of(c).header.instantiations(
            f"fa2tune_configs::{name}", varlen=is_varlen(c), **extra
        )
    return out


def render_table(
    gpu: str,
    tables: Mapping[TableKey, Mapping[Shape, AnyConfig]],
    defaults: Sequence[AnyConfig],
    varlen: Mapping[TableKey, Mapping[Shape, AnyConfig]] | None = None,
    varlen_defaults: Sequence[AnyConfig] = (),
    decode_defaults: Mapping[TableKey, AnyConfig] | None = None,
) -> str:
    """``dispatch_table.inc``: the data dispatch.cuh dispatches on (see its contract).

    Args:
        gpu: the tuned GPU's name; the header stores its :func:`normalize_gpu_name` key.
        tables: (D, dtype, causal) -> {tuned shape: winning config}.
        defaults: one default config per supported (D, dtype, causal).
        varlen: (D, dtype, causal) -> {varlen shape: winning ``_vl`` config}.
        varlen_defaults: one ``_vl`` config per supported (D, dtype, causal)
            (:func:`varlen_twin`).
        decode_defaults: (D, dtype, causal) -> the config decode steps take where no tuned
            decode shape answers (split-KV's default): its key's default table gets it as a
            second choice.

    Returns:
        C++ text: config aliases, explicit instantiations, tuned and default tables (dense,
        then packed).

    Raises:
        ValueError: a packed entry whose family has no varlen launcher in the header.
    """
    varlen = varlen or {}
    decode = dict(decode_defaults or {})
    out = config_instantiations([
        *(c for k in sorted(tables) for _, c in sorted(tables[k].items())),
        *defaults,
        *decode.values(),
        *(c for k in sorted(varlen) for _, c in sorted(varlen[k].items())),
        *varlen_defaults,
    ])  # fmt: skip
    out += [
        "",
        "namespace fa2tune_detail {",
        "",
        f"{DATA_DECL} char kTunedGpu[] = {c_string(normalize_gpu_name(gpu))};"
        "  // normalised device name",
        "",
        *_tables(_DENSE, tables, defaults, decode),
        *_tables(_PACKED, varlen, varlen_defaults),
        "",
        "}  // namespace fa2tune_detail",
    ]
    return "\n".join(out) + "\n"
