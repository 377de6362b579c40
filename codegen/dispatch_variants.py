"""``dispatch_variants.inc``: the exported header's tables of attention-variant configs.

dispatch.cuh dispatches a call with a variant (``fa2tune_forward_variant`` and its packed
twin ``fa2tune_forward_varlen_variant``) by :func:`core.lookup.pick`'s rule, the store's:
the call's variant is normalised (:func:`core.variant.normalize`), its mask and switches
(:attr:`core.variant.Variant.needs`) pick one table, and among that table's tuned entries
the ones whose window and chunk are the asked ones (else the nearest,
:func:`core.lookup.variant_distance`) come first, then the shape (``fa_variant.cuh``, the
C++ twin, holds the rule). So a table is keyed by (D, dtype, causal, local, softcap, sinks)
(:data:`VariantKey`) and each entry carries, besides its shape and config, the tuned
problem's window and chunk and its rank (the order :func:`core.lookup.pick` breaks ties in:
throughput for dense problems, the first tuned for packed ones). The cap's value and the sink
logits are run-time values (``FaVariant``), never keys.

Every key with tuned entries also gets a default: FlashAttention-2's default config of its
(D, dtype, causal) with the key's switches (and its packed twin), which runs wherever the
header's code does (other GPUs, builds without a tuned entry's code). A key without tuned
entries has no config in the header at all: the dispatch refuses it.

Rendered apart from ``dispatch_table.inc`` (:mod:`codegen.dispatch_table`), so a header of
plain results has the same table text as before variants existed. This module reads no
database and imports nothing of the exporter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from codegen.cpp_text import DATA_DECL, braced, c_string, cpp_bool
from codegen.dispatch_table import TableMode, config_instantiations, is_varlen
from codegen.families import FAMILIES, family_of
from core.config import Dtype
from core.elements import element
from core.family import AnyConfig
from core.shape import Shape
from core.variant import Variant

#: (head dim, dtype, causal, local, softcap, sinks): what a variant table is keyed by.
VariantKey = tuple[int, Dtype, bool, bool, bool, bool]

#: The config-name suffix of each switch (a table's C++ name ends with those it has).
_SUFFIX = {"local": "loc", "softcap": "cap", "sinks": "snk"}


def variant_key(d: int, dtype: Dtype, causal: bool, variant: Variant) -> VariantKey:
    """The table a problem of this D, dtype, mask and (normalised) variant belongs to."""
    needs = variant.needs
    return (d, dtype, causal, needs["local"], needs["softcap"], needs["sinks"])


def header_variant_families(*, packed: bool = False) -> list[str]:
    """The families whose variant configs (``packed``: packed variant configs) the header
    can launch: the store's variant winners are asked for among these."""
    return [
        f.name
        for f in FAMILIES.values()
        if (f.header.varlen_variants if packed else f.header.variants)
    ]


def has_variant_launcher(config: AnyConfig) -> bool:
    """Whether the header can launch ``config``, a config with a variant switch, in its mode
    (dense, or packed for a ``_vl`` config)."""
    part = family_of(config).header
    return bool(config.has_variant) and (
        part.varlen_variants if is_varlen(config) else part.variants
    )


def with_switches(config: AnyConfig, key: VariantKey) -> AnyConfig:
    """``config`` (a plain default) built with ``key``'s switches: the key's default."""
    _, _, _, local, softcap, sinks = key
    out: AnyConfig = replace(config, local=local, softcap=softcap, sinks=sinks)
    return out


@dataclass(frozen=True, order=True)
class VariantEntry:
    """One tuned variant problem's entry: where it was tuned and what runs it.

    Attributes:
        shape: the shape it was measured at (a packed problem's ``varlen_shape``).
        window_left, window_right, chunk: its window and chunk in the store's form.
        rank: its place in the table's order of the store's rank (0 first).
        config: the winning config (built with the key's switches).
    """

    shape: Shape
    window_left: int
    window_right: int
    chunk: int
    rank: int
    config: AnyConfig = field(compare=False)


_DENSE = TableMode(
    "VariantChoice", "VariantTable", "kVariant", "kVariantTuned", "kVariantDefault",
    ("// Tuned attention-variant configs, one table per (D, dtype, causal, switches): one",
     "// entry per tuned problem, {nq, nk, batch, heads, kv_heads}, its window_left,",
     "// window_right and chunk, its rank (0: the fastest), sorted by shape, then window."),
    ("// FlashAttention-2's defaults with each tuned key's switches, for other GPUs and calls",
     "// no tuned entry of the key can run."),
)  # fmt: skip
_PACKED = TableMode(
    "VarlenVariantChoice", "VarlenVariantTable", "kVarlenVariant", "kVarlenVariantTuned",
    "kVarlenVariantDefault",
    ("",
     "// Packed (_vl) attention-variant configs, one table per (D, dtype, causal, switches):",
     "// one entry per tuned varlen problem, {mean, mean, sequences, heads, kv_heads}, its",
     "// window and chunk, its rank (0: the first tuned), sorted by shape, then window."),
    ("// The varlen twins of the variant defaults.",),
)  # fmt: skip


def _choice(entry: VariantEntry | None, config: AnyConfig, packed: bool) -> str:
    part = family_of(config).header
    alias = f"fa2tune_configs::{config.name}"
    if entry is None:
        dims, window = braced(0, 0, 0, 0, 0), (-1, -1, 0, 0)
    else:
        s = entry.shape
        dims = braced(s.nq, s.nk, s.batch, s.heads, s.kv_heads)
        window = (entry.window_left, entry.window_right, entry.chunk, entry.rank)
    if not has_variant_launcher(config):
        raise ValueError(f"{config.name} has no variant launcher in the header")
    if packed:
        guard = "nullptr" if part.varlen_guard is None else f"&{part.varlen_guard}<{alias}>"
        launcher = f"&{part.varlen_variant_launcher}<{alias}>"
        return braced(dims, *window, launcher, c_string(config.name), guard)
    guard = "nullptr" if part.guard is None else f"&{part.guard}<{alias}>"
    workspace = f"VariantWorkspace<{alias}>"
    return braced(dims, *window, f"&{part.variant_launcher}<{alias}>", c_string(config.name),
                  guard, f"{workspace}::size", f"{workspace}::launch")  # fmt: skip


def _key_row(key: VariantKey, choices: str, count: int) -> str:
    d, dtype, causal, local, softcap, sinks = key
    flags = map(cpp_bool, (causal, local, softcap, sinks))
    return "    " + braced(d, element(dtype).header_enum, *flags, choices, count) + ","


def _ident(mode: TableMode, key: VariantKey) -> str:
    d, dtype, causal, *switches = key
    names = "".join(f"_{s}" for s, on in zip(_SUFFIX.values(), switches, strict=True) if on)
    return f"{mode.key_table}_d{d}_{dtype}_{'causal' if causal else 'full'}{names}"


def _tables(
    mode: TableMode,
    tables: Mapping[VariantKey, Sequence[VariantEntry]],
    defaults: Sequence[tuple[VariantKey, AnyConfig]],
) -> list[str]:
    packed = mode is _PACKED
    out = list(mode.heading)
    rows: list[str] = []
    for key in sorted(tables):
        entries = sorted(tables[key])
        out.append(f"{DATA_DECL} {mode.choice} {_ident(mode, key)}[] = " + "{")
        out += [f"    {_choice(e, e.config, packed)}," for e in entries]
        out.append("};")
        rows.append(_key_row(key, _ident(mode, key), len(entries)))
    sentinel_table = "    " + braced(0, 0, *["false"] * 4, "nullptr", 0) + ","
    null = ", ".join(["nullptr"] * (3 if packed else 5))
    sentinel_choice = "    " + braced(braced(0, 0, 0, 0, 0), -1, -1, 0, 0, null) + ","
    return [
        *out,
        f"{DATA_DECL} int {mode.tuned}Count = {len(tables)};",
        f"{DATA_DECL} {mode.table} {mode.tuned}[] = {{",
        *(rows or [sentinel_table]),  # C++ has no empty arrays: a sentinel, never read
        "};",
        "",
        *mode.defaults_heading,
        f"{DATA_DECL} int {mode.defaults}Count = {len(defaults)};",
        f"{DATA_DECL} {mode.choice} {mode.defaults}Choices[] = {{",
        *([f"    {_choice(None, c, packed)}," for _, c in defaults] or [sentinel_choice]),
        "};",
        f"{DATA_DECL} {mode.table} {mode.defaults}s[] = {{",
        *(
            [_key_row(k, f"&{mode.defaults}Choices[{i}]", 1) for i, (k, _) in enumerate(defaults)]
            or [sentinel_table]
        ),
        "};",
    ]


def render_variant_tables(
    tables: Mapping[VariantKey, Sequence[VariantEntry]],
    defaults: Sequence[tuple[VariantKey, AnyConfig]],
    varlen: Mapping[VariantKey, Sequence[VariantEntry]] | None = None,
    varlen_defaults: Sequence[tuple[VariantKey, AnyConfig]] = (),
) -> str:
    """``dispatch_variants.inc``: the data dispatch.cuh's variant dispatch reads (see its
    contract).

    Args:
        tables: key -> its tuned dense entries (configs with the key's switches).
        defaults: (key, default config with the key's switches), one per key served.
        varlen: key -> its tuned packed entries (``_vl`` configs with the key's switches).
        varlen_defaults: (key, the default's varlen twin), one per key served.

    Returns:
        C++ text: config aliases, explicit instantiations, tuned and default tables (dense,
        then packed); with no variant at all, the empty tables (sentinels, counts 0).

    Raises:
        ValueError: an entry whose family has no variant launcher of its mode in the header.
    """
    varlen = varlen or {}
    out = config_instantiations(
        [
            *(e.config for k in sorted(tables) for e in sorted(tables[k])),
            *(c for _, c in defaults),
            *(e.config for k in sorted(varlen) for e in sorted(varlen[k])),
            *(c for _, c in varlen_defaults),
        ],
        variant=True,
    )
    out += [
        "",
        "namespace fa2tune_detail {",
        "",
        *_tables(_DENSE, tables, defaults),
        *_tables(_PACKED, varlen, varlen_defaults),
        "",
        "}  // namespace fa2tune_detail",
    ]
    return "\n".join(out) + "\n"
