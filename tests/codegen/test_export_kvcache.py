"""The exported header's KV-cache entry points (fa2tune_forward_kvcache and its twins).

CPU: page sizes are an export option (``kv_pages``; the CLI's ``--kv-pages``, the HTTP
``kv_pages``), checked (0 or powers of two up to 4096) before anything is rendered; without
it a header has no KV-cache code, kernel or table and its generated text is what it was (the
snapshot of test_export_variants holds that), and with it the generated text before the
KV-cache part is unchanged but for the comment's lines about it. The KV-cache table holds,
for every page size, the cache twin of every split-KV config the dispatch can pick (tuned
plain and variant entries) and of each key's split-KV decode default (the key's fallback,
with a variant key's switches), each with its alias and the explicit instantiations of its
cache kernel, launchers and append kernel; fa2 and fa3 configs get none.

``compile``: a host program including a header with page sizes 0 and 16 (made for a GPU no
device is, so every pick is a default) builds for sm_90 and for sm_80 + sm_90a, and without
touching a GPU it checks the cache config each call gets (contiguous and paged, plain decode
and causal chunks, a window, a prefill-length chunk: the split-KV default's twin) and the
refusals (cudaErrorInvalidValue for page sizes not built, missing or narrow block tables,
null lengths, bad appends, invalid parameters; cudaErrorNotSupported for a variant not
exported).

The GPU tier is tests/codegen/test_gpu_header_kvcache.py (bench/h200/kvcache_header_probe.cu).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from codegen.dispatch_kvcache import (
    KV_PAGE_SIZES,
    CacheTuned,
    cache_bases,
    cache_twin,
    check_kv_pages,
    parse_kv_pages,
    render_kvcache_table,
)
from codegen.dispatch_variants import variant_key, with_switches
from codegen.export import decode_defaults_for, render_header
from codegen.families.fa2.space import fa2_default_config
from core.splitkv_config import SplitKvConfig
from tests.support.header_probe import PARAMS_CPP
from tests.support.kvcache_header import (
    CACHE_WINNERS,
    WHEN,
    WINDOW_WINNER,
    WINNER,
    probe_header,
    probe_points,
)

#: A GPU no device is: every pick on any machine is a key's default.
NO_GPU = "Compile Test GPU"
NVCC = shutil.which("nvcc")
SM90A = "-gencode=arch=compute_90a,code=sm_90a"
TARGETS = {
    "sm_90": ("-gencode=arch=compute_90,code=sm_90",),
    "sm_80+sm_90a": ("-gencode=arch=compute_80,code=sm_80", SM90A),
}


def decode_default(causal: bool) -> SplitKvConfig:
    """The header's split-KV decode default of D=128 fp16 (fitted to every target)."""
    found = decode_defaults_for([fa2_default_config(128, "fp16", causal)])[(128, "fp16", causal)]
    assert isinstance(found, SplitKvConfig)
    return found


def kvcache_block(header: str) -> str:
    return header.split("// ---- begin kvcache_table.inc (rendered) ----\n")[1].split(
        "\n// ---- end ----"
    )[0]


def generated_before_kvcache(header: str) -> str:
    """The comment and the rendered tables (the header's text up to its KV-cache part), less
    the comment's lines about page sizes."""
    text = header.split("// ---- begin dispatch_kvcache.inc (rendered) ----")[0]
    text = re.sub(r" --kv-pages [0-9,]+", "", text)
    return re.sub(r"// KV-cache kernels \(fa2tune_forward_kvcache.*?\(plain attention\):\n"
                  r"(//   [^\n]*\n)*", "", text, flags=re.S)  # fmt: skip


# ------------------------------------------------------------------------------ CPU


@pytest.mark.parametrize("pages", [(3,), (0, 12), (-16,), (8192,), (16, 48)])
def test_page_sizes_that_are_not_powers_of_two_are_refused(pages: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="is not 0 \\(a contiguous cache\\) or a power of two"):
        render_header(NO_GPU, probe_points(), ds=[128], dtypes=["fp16"], kv_pages=pages)


def test_page_sizes_parse_and_sort() -> None:
    assert parse_kv_pages(["16,0", "256"]) == (0, 16, 256) == check_kv_pages([256, 16, 0, 16])
    assert KV_PAGE_SIZES[:3] == (0, 1, 2) and KV_PAGE_SIZES[-1] == 4096
    for bad in (["x"], ["16,"], ["-1"], ["1e3"], ["٣"]):
        with pytest.raises(ValueError, match="page size"):
            parse_kv_pages(bad)


def test_header_without_page_sizes_has_no_kvcache_part() -> None:
    header = render_header(NO_GPU, probe_points(), ds=[128], dtypes=["fp16"], generated_at=WHEN)
    assert header == probe_header(NO_GPU, ())
    assert "#define FA2TUNE_HAS_KVCACHE" not in header
    assert "kvcache_table.inc" not in header.split("// PUBLIC API")[0]
    assert "_kvc = splitkv::CacheTraits<" not in header
    assert "splitkv::fwd_cache_kernel<fa2tune_configs::" not in header
    assert "(no KV-cache kernels in this header: re-export with --kv-pages" in header
    assert "inline cudaError_t fa2tune_forward_kvcache(" not in header


def test_page_sizes_only_add_to_the_header() -> None:
    plain = probe_header(NO_GPU, ())
    paged = probe_header(NO_GPU, (0, 16))
    assert generated_before_kvcache(paged) == generated_before_kvcache(plain)
    assert "fa2tune export --gpu 'Compile Test GPU' --d 128 --dtype fp16 --kv-pages 0,16" in paged
    assert "page sizes 0 (contiguous), 16:" in paged
    assert paged.rstrip().endswith("#endif  // FA2TUNE_EXPORTED_HEADER_")


def test_table_holds_the_twin_of_every_split_kv_pick() -> None:
    block = kvcache_block(probe_header(NO_GPU, (0, 16))).split("kKvTunedCount")[0]
    window = SplitKvConfig.from_name(WINDOW_WINNER)
    default_window = with_switches(
        decode_default(False), variant_key(128, "fp16", False, probe_points()[1].variant)
    )
    bases = {  # base name -> (is its key's fallback)
        WINNER: False,
        window.name: False,
        decode_default(False).name: True,
        decode_default(True).name: True,
        default_window.name: True,
    }
    entries = re.findall(
        r"\{128, FA2TUNE_FP16, (true|false), (true|false), false, false, (\d+), (true|false), "
        r'"(\w+)", "(\w+)", &splitkv::launch_cache<fa2tune_configs::(\w+)>, '
        r"&splitkv::launch_cache_with_workspace<fa2tune_configs::(\w+)>, "
        r"&splitkv::workspace_size<fa2tune_configs::(\w+)>, "
        r"&splitkv::launch_append<fa2tune_configs::(\w+)>\}",
        block,
    )
    assert len(entries) == 2 * len(bases) == int(re.findall(r"kKvCacheCount = (\d+);", block)[0])
    assert "kKvPages[] = {0, 16};" in block
    for causal, local, page, fallback, base, name, *pointed in entries:
        config = SplitKvConfig.from_name(base)
        twin = replace(config, kvcache=True, page=int(page))
        assert name == twin.name == cache_twin(config, int(page)).name
        assert set(pointed) == {name}
        assert (causal, local) == (str(config.causal).lower(), str(config.local).lower())
        assert fallback == str(bases[base]).lower()
        assert f"using {name} = splitkv::CacheTraits<" in block
        for what in ("fwd_cache_kernel", "append_kernel"):
            assert f"template __global__ void splitkv::{what}<fa2tune_configs::{name}>(" in block
    assert {e[4] for e in entries} == set(bases)
    # One fallback per key and page size; the fa2 prefill winner has no twin.
    keys = [(e[0], e[1], e[2]) for e in entries if e[3] == "true"]
    assert len(keys) == len(set(keys)) == 3 * 2
    assert "fa2_d128" not in block


def tuned_entries(header: str) -> list[tuple[str, ...]]:
    """The kKvTuned entries: (nq, nk, batch, heads, kv_heads, causal, page, fallback, base,
    name, the names the four launchers point at)."""
    block = kvcache_block(header).split("kKvTuned[] = {")[1].split("\n};")[0]
    return re.findall(
        r"\{\{(\d+), (\d+), (\d+), (\d+), (\d+)\}, \{128, FA2TUNE_FP16, (true|false), false, "
        r'false, false, (\d+), (true|false), "(\w+)", "(\w+)", '
        r"&splitkv::launch_cache<fa2tune_configs::(\w+)>, "
        r"&splitkv::launch_cache_with_workspace<fa2tune_configs::(\w+)>, "
        r"&splitkv::workspace_size<fa2tune_configs::(\w+)>, "
        r"&splitkv::launch_append<fa2tune_configs::(\w+)>\}\},",
        block,
    )


def test_tuned_cache_problems_get_entries_of_the_page_sizes_exported() -> None:
    header = probe_header(NO_GPU, (0, 16))
    entries = tuned_entries(header)
    assert int(re.findall(r"kKvTunedCount = (\d+);", header)[0]) == len(entries) == 2
    for entry, want in zip(entries, (0, 16), strict=True):
        shape, (causal, page, fallback, base, name), pointed = entry[:5], entry[5:10], entry[10:]
        assert shape == ("1", "8192", "8", "32", "8") and causal == "false"
        assert int(page) == want and fallback == "false"
        assert base == name == CACHE_WINNERS[want] and set(pointed) == {name}
        # Compiled once, beside the twins: an alias and its cache and append kernels.
        assert header.count(f"using {name} = splitkv::CacheTraits<") == 1
        assert (
            f"template __global__ void splitkv::append_kernel<fa2tune_configs::{name}>(" in header
        )
        # The comment's provenance, with the length pattern the entry was timed on.
        assert f"Nk=8192, every sequence at the capacity: {name} (family splitkv)" in header
    # Page size 256 was not asked for: its winner is not in the header at all.
    assert CACHE_WINNERS[256] not in header
    assert CACHE_WINNERS[256] in probe_header(NO_GPU, (256,))
    # Cache problems never enter the dense tables: a header without page sizes is the one
    # without cache points.
    plain_points = [p for p in probe_points() if p.kv_page is None]
    assert probe_header(NO_GPU, ()) == render_header(
        NO_GPU, plain_points, ds=[128], dtypes=["fp16"], generated_at=WHEN
    )
    assert "kKvTunedCount = 0;" in render_header(
        NO_GPU, plain_points, ds=[128], dtypes=["fp16"], generated_at=WHEN, kv_pages=(0, 16)
    )


def test_a_cache_point_must_be_its_layouts_kernel() -> None:
    point = probe_points()[-1]
    with pytest.raises(ValueError, match="not the cache kernel of layout 16"):
        replace(point, kv_page=16)
    with pytest.raises(ValueError, match="not the cache kernel of layout None"):
        replace(point, kv_page=None)
    with pytest.raises(ValueError, match="two tuned KV-cache entries"):
        twice = CacheTuned.of(point.config, point.shape)
        render_kvcache_table([], (256,), [twice, twice])


def test_a_variant_cache_winner_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    window = probe_points()[1]
    cached = replace(window, config=cache_twin(window.config, 16), kv_page=16)
    header = render_header(NO_GPU, [*probe_points(), cached], ds=[128], dtypes=["fp16"],
                           generated_at=WHEN, kv_pages=(0, 16))  # fmt: skip
    assert len(tuned_entries(header)) == 2
    assert "of a variant left out of the header" in caplog.text


def test_bases_skip_families_without_cache_kernels() -> None:
    fa2 = fa2_default_config(128, "fp16", False)
    bases = cache_bases([fa2, SplitKvConfig.from_name(WINNER)], {}, [])
    assert [(b.name, b.fallback) for b in bases] == [(WINNER, False)]
    with pytest.raises(ValueError, match="no KV-cache kernels"):
        cache_twin(fa2, 16)


# ------------------------------------------------------------------------------ compile

PROBE = (
    r"""
#include "fa2_tuned.cuh"
#include <cstdint>
#include <cstdio>
// Host-only (the header's GPU is no device's, so every pick is a default): refusals, then the
// cache config each call gets. Nothing is launched.
"""
    + PARAMS_CPP
    + r"""
static const int32_t kLens[8] = {};
static const int32_t kTable[8 * 300] = {};

static FaParams cache(int nq, int page) {
  FaParams p = params(128, nq, 4096, 8, 32, 8);
  if (page > 0) p.k_batch_stride = p.v_batch_stride = 1LL * page * 8 * 128;  // page strides
  return p;
}

static FaKvCache kc(int page, int added = 0) {
  return {kLens, nullptr, page > 0 ? kTable : nullptr, page > 0 ? 4096 / page : 0, added};
}

static const char* name(const FaParams& p, const FaKvCache& c, const FaKvAppend* a, int page,
                        const FaVariant* v, bool causal) {
  const char* n = fa2tune_config_name_kvcache(p, c, a, page, v, 128, FA2TUNE_FP16, causal);
  return n ? n : "null";
}

int main() {
  std::printf("pages %d %d %d %d\n", fa2tune_kvcache_has_page_size(0),
              fa2tune_kvcache_has_page_size(16), fa2tune_kvcache_has_page_size(32),
              fa2tune_kvcache_has_page_size(3));
  FaKvAppend a{};
  a.k_new = a.v_new = reinterpret_cast<void*>(std::uintptr_t{1} << 22);
  a.k_batch_stride = a.v_batch_stride = 4 * 8 * 128;
  a.k_row_stride = a.v_row_stride = 8 * 128;
  a.k_head_stride = a.v_head_stride = 128;
  a.rows = 4;
  // Refusals (cudaErrorInvalidValue, nothing launched), each with otherwise valid arguments.
  FaKvCache no_lens = kc(16); no_lens.seqlens = nullptr;
  FaKvCache no_table = kc(16); no_table.block_table = nullptr;
  FaKvCache narrow = kc(16); narrow.table_stride = 4096 / 16 - 1;
  FaKvCache odd = kc(16); odd.seqlens = reinterpret_cast<const int32_t*>(
      reinterpret_cast<const char*>(kLens) + 2);
  FaKvCache too_many = kc(0, 4097);
  FaKvCache padded_pages = kc(16); padded_pages.leftpad = kLens;
  FaKvCache odd_pad = kc(0); odd_pad.leftpad = odd.seqlens;
  FaKvAppend short_rows = a; short_rows.rows = 3;
  FaKvAppend misaligned = a; misaligned.k_row_stride = 8 * 128 + 4;
  FaParams empty = cache(1, 0); empty.nk = 0;
  struct { const char* what; FaParams p; FaKvCache c; const FaKvAppend* a; int page; } bad[] = {
      {"page32", cache(1, 16), kc(16), nullptr, 32},
      {"page3", cache(1, 16), kc(16), nullptr, 3},
      {"no-lengths", cache(1, 16), no_lens, nullptr, 16},
      {"no-table", cache(1, 16), no_table, nullptr, 16},
      {"narrow-table", cache(1, 16), narrow, nullptr, 16},
      {"table-for-contiguous", cache(1, 0), kc(16), nullptr, 0},
      {"misaligned-lengths", cache(1, 16), odd, nullptr, 16},
      {"added-past-capacity", cache(1, 0), too_many, nullptr, 0},
      {"leftpad-over-pages", cache(1, 16), padded_pages, nullptr, 16},
      {"misaligned-leftpad", cache(1, 0), odd_pad, nullptr, 0},
      {"append-rows-not-added", cache(4, 16), kc(16, 4), &short_rows, 16},
      {"append-stride", cache(4, 16), kc(16, 4), &misaligned, 16},
      {"no-capacity", empty, kc(0), nullptr, 0},
      {"invalid-params", FaParams{}, kc(0), nullptr, 0},
  };
  for (const auto& b : bad) {
    char ws[64];
    const bool refused =
        fa2tune_forward_kvcache(b.p, b.c, b.a, b.page, nullptr, 128, FA2TUNE_FP16, false) ==
            cudaErrorInvalidValue &&
        fa2tune_forward_kvcache_with_workspace(b.p, b.c, b.a, b.page, nullptr, 128,
                                               FA2TUNE_FP16, false, ws, sizeof ws) ==
            cudaErrorInvalidValue &&
        fa2tune_config_name_kvcache(b.p, b.c, b.a, b.page, nullptr, 128, FA2TUNE_FP16,
                                    false) == nullptr &&
        fa2tune_workspace_size_kvcache(b.p, b.c, b.a, b.page, nullptr, 128, FA2TUNE_FP16,
                                       false) == 0;
    std::printf("refused %s %d\n", b.what, int(refused));
  }
  const FaVariant window{256, -1, 0, 0.f, nullptr}, none{-1, -1, 0, 0.f, nullptr};
  const FaVariant cap{-1, -1, 0, 30.f, nullptr};
  for (int page : {0, 16}) {
    const FaParams one = cache(1, page), four = cache(4, page), long_chunk = cache(200, page);
    const FaKvCache none_added = kc(page), four_added = kc(page, 4);
    std::printf("decode %d %s\n", page, name(one, none_added, nullptr, page, nullptr, true));
    if (page == 0) {  // left padding: taken over a contiguous cache (refused over pages above)
      FaKvCache padded = none_added;
      padded.leftpad = kLens;
      std::printf("leftpad %d %s\n", page, name(one, padded, nullptr, page, nullptr, true));
    }
    std::printf("plainvar %d %s\n", page, name(one, none_added, nullptr, page, &none, false));
    std::printf("spec %d %s\n", page, name(four, four_added, &a, page, nullptr, true));
    std::printf("window %d %s\n", page, name(one, none_added, nullptr, page, &window, false));
    std::printf("prefill %d %s\n", page,
                name(long_chunk, none_added, nullptr, page, nullptr, false));
    std::printf("softcap %d %s %d\n", page, name(one, none_added, nullptr, page, &cap, false),
                fa2tune_forward_kvcache(one, none_added, nullptr, page, &cap, 128, FA2TUNE_FP16,
                                        false) == cudaErrorNotSupported);
  }
  // The tuned cache entries (on the tuned GPU they answer first), asked directly with an
  // H200's SM count: the nearest of the call's key, page size and phase, else none.
  for (int page : {0, 16, 256}) {
    const auto tuned = [page](int nq, int nk, int batch, bool causal) {
      FaParams p = cache(nq, page);
      p.nk = nk;
      p.batch = batch;
      const fa2tune_detail::KvCacheChoice* c =
          fa2tune_detail::tuned_cache(p, 128, FA2TUNE_FP16, causal, page, 132);
      return c ? c->name : "null";
    };
    std::printf("tuned-exact %d %s\n", page, tuned(1, 8192, 8, false));
    std::printf("tuned-nearest %d %s\n", page, tuned(2, 100000, 64, false));
    std::printf("tuned-prefill %d %s\n", page, tuned(200, 8192, 8, false));
    std::printf("tuned-causal %d %s\n", page, tuned(2, 8192, 8, true));
    std::printf("tuned-bf16 %d %s\n", page,
                [&] {
                  const fa2tune_detail::KvCacheChoice* c = fa2tune_detail::tuned_cache(
                      cache(1, page), 128, FA2TUNE_BF16, false, page, 132);
                  return c ? c->name : "null";
                }());
  }
  // A head dim or dtype the header was not generated for.
  std::printf("refused head-dim %d\n",
              int(fa2tune_forward_kvcache(cache(1, 0), kc(0), nullptr, 0, nullptr, 64,
                                          FA2TUNE_FP16, false) == cudaErrorInvalidValue));
  std::printf("refused dtype %d\n",
              int(fa2tune_forward_kvcache(cache(1, 0), kc(0), nullptr, 0, nullptr, 128,
                                          FA2TUNE_BF16, false) == cudaErrorInvalidValue));
  return 0;
}
"""
)


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """PROBE built against a header with page sizes 0 and 16, for each of TARGETS."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH")
    nvcc = NVCC
    header = probe_header(NO_GPU, (0, 16))

    def build(target: str) -> Path:
        tmp = tmp_path_factory.mktemp("kvcache_probe")
        (tmp / "fa2_tuned.cuh").write_text(header)
        (tmp / "probe.cu").write_text(PROBE)
        proc = subprocess.run(
            [nvcc, "-std=c++17", "-Xcicc", "-O0", *TARGETS[target], "probe.cu", "-o", "probe"],
            cwd=tmp, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, f"nvcc {target} failed:\n{proc.stdout}\n{proc.stderr}"
        assert "warning" not in proc.stderr.lower(), proc.stderr
        return tmp / "probe"

    with ThreadPoolExecutor(len(TARGETS)) as pool:
        return dict(zip(TARGETS, pool.map(build, TARGETS), strict=True))


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
def test_client_builds_and_picks_the_split_kv_defaults_twins(
    probes: dict[str, Path], target: str
) -> None:
    out = subprocess.run([str(probes[target])], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {tuple(line.split()[:2]): line.split()[2:] for line in out.stdout.splitlines()}
    assert got[("pages", "1")] == ["1", "0", "0"]
    full, causal = decode_default(False), decode_default(True)
    window = with_switches(full, variant_key(128, "fp16", False, probe_points()[1].variant))
    for page in (0, 16):
        suffix = "_kvc" if page == 0 else f"_kvc_pg{page}"
        p = str(page)
        assert got[("decode", p)] == [full.name + suffix]  # one causal row: unmasked
        if page == 0:  # the same kernel: the padding is a pointer it reads
            assert got[("leftpad", p)] == [full.name + suffix]
        assert got[("plainvar", p)] == [full.name + suffix]  # a plain FaVariant: plain
        assert got[("spec", p)] == [causal.name + suffix]
        assert got[("window", p)] == [window.name + suffix]
        # A long chunk picks fa2's default, which has no twin: the split-KV default's.
        assert got[("prefill", p)] == [full.name + suffix]
        assert got[("softcap", p)] == ["null", "1"]
    for page in (0, 16):  # the tuned entries: the one of the key and page size, same phase
        p = str(page)
        assert got[("tuned-exact", p)] == got[("tuned-nearest", p)] == [CACHE_WINNERS[page]]
        for other in ("tuned-prefill", "tuned-causal", "tuned-bf16"):
            assert got[(other, p)] == ["null"], other
    assert all(got[(w, "256")] == ["null"] for w in ("tuned-exact", "tuned-nearest"))
    refusals = {k[1]: v for k, v in got.items() if k[0] == "refused"}
    assert len(refusals) == 16 and all(v == ["1"] for v in refusals.values()), refusals
