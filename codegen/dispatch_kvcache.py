"""``kvcache_table.inc``: the exported header's KV-cache kernels, for ``fa2tune_forward_kvcache``.

A header exported with page sizes (``fa2tune export --kv-pages 0,16``, ``/v1/export/header``'s
``kv_pages``) serves calls over a KV cache whose lengths live on the device, as
``fa2tune.torch.attention_with_kvcache`` does (:mod:`fa2tune.ops.cache_choice`'s rule): the
call's tile is the one the header's dense (or variant) dispatch gives the contiguous call of
the same shape with the cache's capacity as its key count, when that pick is a config of a
family with cache kernels (split-KV); otherwise the key's split-KV decode default (the one
:func:`codegen.export.decode_defaults_for` renders), with the variant's switches. That tile is
built as its cache twin (``_kvc``, paged ``_kvc_pg<P>``) for each page size asked for.

So for every page size the table holds the cache twin of every config the dispatch can name
for a cache call (each tuned split-KV entry, plain or variant) and of each key's split-KV
default, marked as the key's fallback. The C++ side (``kvcache_dispatch.cuh``, whose contract
is at its top) finds an entry by the picked config's name and the page size, else the key's
fallback. Each entry points at its cache kernel's launchers and its append kernel's.

Ahead of that rule, as in the op, come the tuned KV-cache problems (``fa2tune tune
--kv-page``; :class:`CacheTuned`): each winner with the shape it was measured at, for the
header's page sizes; on the tuned GPU a plain cache call runs the one of its key and page size
nearest to its shape (the store's distance, of the same phase). Variant cache problems are not
in the header yet (the op serves them; the header's variant calls keep the rule above).

A tuned cache problem is timed on one length pattern (:mod:`core.kv_lengths`): every sequence
at the capacity (``full``) or a serving batch's spread (``mixed``). The call's lengths are on
the device, so the table holds the winners of both, one per (key, page size, shape), the
mixed one where both were tuned at a shape (:func:`codegen.export.cache_points` orders them),
and the nearest answers, as the op's rule (:func:`core.kv_lengths.answering_pattern`).

Rendered apart from the other tables: a header exported without page sizes has none of it
(the exporter leaves its include empty). This module reads no database and imports nothing of
the exporter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from codegen.cpp_text import DATA_DECL, braced, c_string, cpp_bool
from codegen.dispatch_table import TableKey, config_instantiations
from codegen.dispatch_variants import VariantKey, with_switches
from codegen.families import FAMILIES, family_of
from codegen.families.splitkv.space import MAX_PAGE_SIZE
from core.elements import element
from core.family import AnyConfig
from core.kv_lengths import kv_lengths_error
from core.problem import kv_page_of
from core.shape import Shape

#: What a page size may be, for messages.
KV_PAGES_RULE = f"0 (a contiguous cache) or a power of two from 1 to {MAX_PAGE_SIZE}"
#: Every page size a header may be generated for (the split-KV cache kernels' domain).
KV_PAGE_SIZES: tuple[int, ...] = (0, *(1 << i for i in range(MAX_PAGE_SIZE.bit_length())))
#: A shared-memory limit no config reaches: a twin's shared memory is its tile's, checked
#: already by the table it comes from (as fa2tune.ops.cache_choice checks a twin).
_ANY_SMEM = 1 << 40


def check_kv_pages(pages: Iterable[int]) -> tuple[int, ...]:
    """The page sizes a header is generated for, sorted and each once.

    Raises:
        ValueError: a page size that is not :data:`KV_PAGES_RULE`.
    """
    out = sorted(set(pages))
    for p in out:
        if p not in KV_PAGE_SIZES:
            raise ValueError(f"page size {p} is not {KV_PAGES_RULE}")
    return tuple(out)


def parse_kv_pages(values: Iterable[str]) -> tuple[int, ...]:
    """Page sizes written as the CLI and the HTTP API take them: comma-separated decimal
    integers, in one or several values (``"0,16"``, ``["0", "16"]``).

    Raises:
        ValueError: an item that is not a plain decimal integer, or not a page size.
    """
    pages: list[int] = []
    for item in ",".join(values).split(","):
        item = item.strip()
        if not item.isascii() or not item.isdigit():
            raise ValueError(f"not a page size: {item!r} (each {KV_PAGES_RULE})")
        pages.append(int(item))
    return check_kv_pages(pages)


def header_cache_families() -> list[str]:
    """The families whose cache kernels the header can launch: the store's KV-cache winners
    are asked for among these."""
    return [f.name for f in FAMILIES.values() if f.header.caches]


def has_cache_launcher(config: AnyConfig) -> bool:
    """Whether the header can launch ``config``'s cache twin: its family's header part has
    cache kernels (split-KV's)."""
    return family_of(config).header.caches and hasattr(config, "kvcache")


def cache_twin(config: AnyConfig, page: int) -> AnyConfig:
    """``config``'s KV-cache kernel for page size ``page`` (0: a contiguous cache).

    Raises:
        ValueError: the family has no cache kernels in the header, or rejects the twin.
    """
    if not has_cache_launcher(config):
        raise ValueError(f"{config.name}: its family has no KV-cache kernels in the header")
    # A family with cache kernels declares the kvcache switch and the page (has_cache_launcher).
    twin: AnyConfig = replace(cast(Any, config), kvcache=True, page=page)
    ok, why = family_of(twin).check(twin, _ANY_SMEM)
    if not ok:
        raise ValueError(f"{twin.name}: {why}")
    return twin


def config_key(config: AnyConfig) -> VariantKey:
    """The (D, dtype, causal, local, softcap, sinks) a config serves."""
    switches = getattr(config, "variant_switches", {})
    return (
        config.d,
        config.dtype,
        config.causal,
        bool(switches.get("local", False)),
        bool(switches.get("softcap", False)),
        bool(switches.get("sinks", False)),
    )


@dataclass(frozen=True, order=True)
class CacheBase:
    """A config the dispatch can name for a cache call, whose cache twins the header holds.

    Attributes:
        name: the config's name (what the dispatch's pick is compared with).
        fallback: the split-KV default of its key, taken when the pick is not a config of
            a family with cache kernels.
        config: the config (a split-KV one, plain or with its key's switches).
    """

    name: str
    fallback: bool
    config: AnyConfig


def cache_bases(
    tuned: Iterable[AnyConfig],
    decode_defaults: Mapping[TableKey, AnyConfig],
    variant_keys: Iterable[VariantKey],
) -> list[CacheBase]:
    """Every config whose cache twins a header with page sizes needs: the tuned configs
    (plain and variant) of families with cache kernels, the decode default of every plain key
    and, built with its switches, of every variant key the header serves (one per name;
    sorted by name).
    """
    fallbacks: dict[str, AnyConfig] = {c.name: c for c in decode_defaults.values()}
    for key in variant_keys:
        default = decode_defaults.get(key[:3])
        if default is not None:
            switched = with_switches(default, key)
            fallbacks[switched.name] = switched
    picked = {c.name: c for c in tuned if has_cache_launcher(c)}
    return sorted(
        CacheBase(name, name in fallbacks, c) for name, c in {**picked, **fallbacks}.items()
    )


@dataclass(frozen=True)
class CacheTuned:
    """A tuned KV-cache problem's winner (``fa2tune tune --kv-page``): a cache kernel, the
    page size it reads, the shape it was measured at (``nk``: the cache's capacity) and the
    length pattern it was timed on (``full`` or ``mixed``, :mod:`core.kv_lengths`).

    Sorted by key, page size, then shape: the order of the header's tuned cache entries.

    Raises:
        ValueError: ``config`` is not a cache kernel of a family with cache kernels in the
            header, or serves a variant (the header's tuned cache entries are plain); a
            ``kv_lengths`` that is not a pattern.
    """

    key: VariantKey
    page: int
    shape: Shape
    config: AnyConfig
    kv_lengths: str = "full"

    @classmethod
    def of(cls, config: AnyConfig, shape: Shape, kv_lengths: str = "full") -> CacheTuned:
        page = kv_page_of(config)
        if page is None or not family_of(config).header.caches:
            raise ValueError(f"{config.name}: not a KV-cache kernel the header can launch")
        key = config_key(config)
        if any(key[3:]):
            raise ValueError(f"{config.name}: the header's tuned KV-cache entries are plain")
        why = kv_lengths_error(kv_lengths)
        if why is not None:
            raise ValueError(f"{config.name}: {why}")
        return cls(key, page, shape, config, kv_lengths)


def _entry(base: str, key_config: AnyConfig, page: int, fallback: bool, twin: AnyConfig) -> str:
    """One KvCacheChoice: the key of ``key_config``, the page size, whether it is the key's
    fallback, the base's and the cache config's names, the cache config's launchers and its
    append launcher."""
    part = family_of(twin).header
    alias = f"fa2tune_configs::{twin.name}"
    d, dtype, causal, local, softcap, sinks = config_key(key_config)
    flags = map(cpp_bool, (causal, local, softcap, sinks))
    return braced(
        d, element(dtype).header_enum, *flags, page, cpp_bool(fallback),
        c_string(base), c_string(twin.name), f"&{part.cache_launcher}<{alias}>",
        f"&{part.cache_workspace_launcher}<{alias}>", f"&{part.cache_workspace_size}<{alias}>",
        f"&{part.append_launcher}<{alias}>",
    )  # fmt: skip


def _choice(base: CacheBase, page: int) -> str:
    """A base's entry for page size ``page``: its cache twin."""
    return _entry(base.name, base.config, page, base.fallback, cache_twin(base.config, page))


def _tuned(t: CacheTuned) -> str:
    """A tuned cache entry: its shape, then its config as its own base (never a fallback)."""
    s = t.shape
    shape = braced(s.nq, s.nk, s.batch, s.heads, s.kv_heads)
    return braced(shape, _entry(t.config.name, t.config, t.page, False, t.config))


def render_kvcache_table(
    bases: Sequence[CacheBase], pages: Sequence[int], tuned: Sequence[CacheTuned] = ()
) -> str:
    """``kvcache_table.inc``: the data kvcache_dispatch.cuh reads (see its contract).

    Args:
        bases: :func:`cache_bases`.
        pages: the page sizes (:func:`check_kv_pages`), 0 for contiguous caches.
        tuned: the tuned cache problems' winners, of page sizes in ``pages`` (each
            (key, page size, shape) once).

    Returns:
        C++ text: the cache configs' aliases and explicit instantiations, the page sizes,
        one entry per (base, page size), sorted by base name, then page size, and the tuned
        entries, sorted.

    Raises:
        ValueError: a base whose family has no cache kernels, no page size, or a tuned entry
            of a page size not in ``pages`` or given twice.
    """
    pages = check_kv_pages(pages)
    if not pages:
        raise ValueError("a KV-cache table needs at least one page size")
    for t in tuned:
        if t.page not in pages:
            raise ValueError(f"{t.config.name}: page size {t.page} is not among {pages}")
    if len({(t.key, t.page, t.shape) for t in tuned}) != len(tuned):
        raise ValueError("two tuned KV-cache entries of one key, page size and shape")
    tuned = sorted(tuned, key=lambda t: (t.key, t.page, t.shape))
    twins = [cache_twin(b.config, p) for b in bases for p in pages]
    entries = [f"    {_choice(b, p)}," for b in bases for p in pages]
    sentinel = braced(0, 0, *["false"] * 4, 0, "false", *["nullptr"] * 6)
    out = config_instantiations([*twins, *(t.config for t in tuned)], cache=True)
    out += [
        "",
        "namespace fa2tune_detail {",
        "",
        "// The page sizes this header has KV-cache kernels for (0: contiguous caches).",
        f"{DATA_DECL} int kKvPageCount = {len(pages)};",
        f"{DATA_DECL} int kKvPages[] = {braced(*pages)};",
        "",
        "// One KV-cache config per (config the dispatch can name, page size): its key, page",
        "// size, whether it is its key's fallback, the picked config's name and its own.",
        f"{DATA_DECL} int kKvCacheCount = {len(entries)};",
        f"{DATA_DECL} KvCacheChoice kKvCache[] = {{",
        *(entries or [f"    {sentinel},"]),  # C++ has no empty arrays: a sentinel, never read
        "};",
        "",
        "// The tuned KV-cache problems' winners (fa2tune tune --kv-page), each at the shape it",
        "// was measured at, sorted by key, page size and shape: on the tuned GPU a plain call",
        "// runs the nearest of its key and page size, ahead of the rule above, of either",
        "// length pattern (the mixed-length winner where both were tuned at a shape; the",
        "// provenance above names each entry's).",
        f"{DATA_DECL} int kKvTunedCount = {len(tuned)};",
        f"{DATA_DECL} KvTunedChoice kKvTuned[] = {{",
        *([f"    {_tuned(t)}," for t in tuned] or [f"    {{{{0, 0, 0, 0, 0}}, {sentinel}}},"]),
        "};",
        "",
        "}  // namespace fa2tune_detail",
    ]
    return "\n".join(out) + "\n"
