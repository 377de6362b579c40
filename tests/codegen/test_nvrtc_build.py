"""Building without a CUDA toolkit: NVRTC through cuda-bindings (codegen.compiler).

* CPU (no NVRTC needed): which compiler ``auto``, ``nvcc`` and ``nvrtc`` pick and what each
  refusal says; ``nvrtc_compile.py``'s command line and its exit status without NVRTC.
* NVRTC present (the ``cuda-bindings`` and ``nvidia-cuda-nvrtc`` wheels; skipped with the
  reason otherwise), nvcc hidden (``FA2TUNE_NVCC`` pointing nowhere): every family's default
  builds through the product's build path (ninja, the cache, ptxas's report read from
  NVRTC's log) for its target (sm_80 and sm_90 for the portable families, sm_90a for the
  Hopper one), a split-KV cache kernel too; the reports say NVRTC, the cubins are ELF files;
  a broken template is a COMPILE_FAILED report with NVRTC's error, not an exception; an
  NVRTC build and an nvcc build of one config never share a cache directory.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from codegen import compiler as compiler_mod
from codegen import nvrtc_compile
from codegen.build import NvccNotFoundError, build_configs
from codegen.compiler import RTC_DIR, Compiler, resolve_compiler
from codegen.families import family
from codegen.render import template_dir
from core import settings
from core.build_report import BuildStatus
from core.settings import get_settings


def _nvrtc_reason() -> str | None:
    try:
        nvrtc_compile.nvrtc_release()
    except ImportError as exc:
        return f"NVRTC is not available: {exc}"
    return None


NVRTC_REASON = _nvrtc_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_REASON is not None, reason=str(NVRTC_REASON))


@pytest.fixture
def no_nvcc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """nvcc hidden: FA2TUNE_NVCC names a file that does not exist, the compiler is auto."""
    monkeypatch.setenv("FA2TUNE_NVCC", "/nonexistent/nvcc")
    monkeypatch.setenv("FA2TUNE_COMPILER", "auto")
    settings._from_environment.cache_clear()
    yield
    settings._from_environment.cache_clear()


def _missing(name: str) -> str:
    raise NvccNotFoundError(f"cannot run nvcc ({name!r})")


def test_auto_takes_nvcc_when_it_runs() -> None:
    chosen = resolve_compiler("nvcc", "auto", lambda name: "release 13.0")
    assert chosen == Compiler("nvcc", "nvcc", "release 13.0")
    assert chosen.flags("sm_90", ["-O3"]) == ["-O3"]


def test_auto_falls_back_to_nvrtc_and_says_why_when_neither_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_nvrtc() -> str:
        raise ImportError("No module named 'cuda'")

    monkeypatch.setattr(nvrtc_compile, "nvrtc_release", no_nvrtc)
    with pytest.raises(NvccNotFoundError, match=r"cannot run nvcc.*NVRTC is not available"):
        resolve_compiler("nvcc", "auto", _missing)
    with pytest.raises(NvccNotFoundError, match="cannot run nvcc"):
        resolve_compiler("nvcc", "nvcc", _missing)
    with pytest.raises(compiler_mod.CompilerNotFoundError, match="pip install cuda-bindings"):
        resolve_compiler("nvcc", "nvrtc", lambda name: "release 13.0")
    monkeypatch.setattr(nvrtc_compile, "nvrtc_release", lambda: "NVRTC 13.0")
    chosen = resolve_compiler("nvcc", "auto", _missing)
    assert chosen.kind == "nvrtc" and chosen.release.startswith("NVRTC 13.0; fa2tune rtc shims")
    assert chosen.executable == sys.executable
    flags = chosen.command_flags("sm_90a", [], Path("/t"))
    assert flags[0] == nvrtc_compile.__file__ and "--gpu-architecture=sm_90a" in flags
    assert flags[-4:] == ["-I", "/t", "-I", str(RTC_DIR)]


def test_nvrtc_compile_command_line() -> None:
    script = nvrtc_compile.__file__
    usage = subprocess.run([sys.executable, script, "x.cu"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_the_shims_digest_follows_their_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = compiler_mod.rtc_digest()
    copy = tmp_path / "rtc"
    shutil.copytree(RTC_DIR, copy)
    monkeypatch.setattr(compiler_mod, "RTC_DIR", copy)
    compiler_mod.rtc_digest.cache_clear()
    try:
        assert compiler_mod.rtc_digest() == before
        (copy / "cstdint").write_text("// changed\n")
        compiler_mod.rtc_digest.cache_clear()
        assert compiler_mod.rtc_digest() != before
    finally:
        compiler_mod.rtc_digest.cache_clear()


@needs_nvrtc
@pytest.mark.compile
def test_every_family_builds_without_nvcc(no_nvcc: None, tmp_path: Path) -> None:
    splitkv = family("splitkv").default(128, "bf16", True)
    cache = replace(splitkv, kvcache=True, page=16)
    configs = [family("fa2").default(64, "fp16", False), splitkv, cache,
               family("fa3").default(128, "bf16", True)]  # fmt: skip
    for arch, wanted in (("sm_90", configs), ("sm_80", configs[:3])):
        reports = build_configs(wanted, arch, cache_dir=tmp_path, jobs=2)
        for r in reports:
            assert r.usable, f"{r.config.name} for {arch}: {r.error}"
            assert r.nvcc_version.startswith("NVRTC ") and r.registers and r.registers > 0
            assert r.cubin is not None and r.cubin.read_bytes()[:4] == b"\x7fELF"
    fa3 = build_configs([configs[3]], "sm_90", cache_dir=tmp_path)[0]
    assert fa3.arch == "sm_90a" and "--gpu-architecture=sm_90a" in fa3.flags


@needs_nvrtc
@pytest.mark.compile
def test_a_broken_template_is_a_failed_report(no_nvcc: None, tmp_path: Path) -> None:
    broken = tmp_path / "templates"
    shutil.copytree(template_dir(), broken)
    path = broken / "splitkv_fwd.cuh"
    path.write_text(path.read_text().replace("namespace splitkv {", "namespace splitkv { oops", 1))
    config = family("splitkv").default(64, "fp16", False)
    (report,) = build_configs([config], "sm_90", cache_dir=tmp_path / "cache",
                              template_dir=broken)  # fmt: skip
    assert report.status == BuildStatus.COMPILE_FAILED and report.error
    assert "error" in report.error


@needs_nvrtc
@pytest.mark.compile
@pytest.mark.skipif(shutil.which(get_settings().nvcc) is None, reason="nvcc is not on PATH")
def test_nvrtc_and_nvcc_builds_keep_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = family("splitkv").default(64, "fp16", False)
    (with_nvcc,) = build_configs([config], "sm_90", cache_dir=tmp_path)
    monkeypatch.setenv("FA2TUNE_COMPILER", "nvrtc")
    settings._from_environment.cache_clear()
    try:
        (with_nvrtc,) = build_configs([config], "sm_90", cache_dir=tmp_path)
    finally:
        settings._from_environment.cache_clear()
    assert with_nvcc.usable and with_nvrtc.usable
    assert with_nvcc.source_hash != with_nvrtc.source_hash
    assert with_nvrtc.nvcc_version.startswith("NVRTC") and "nvcc" not in with_nvrtc.nvcc_version
