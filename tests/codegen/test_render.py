"""Rendering instantiation files and identifying the template."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codegen import render
from codegen.families.fa2 import render_instantiation
from codegen.render import (
    TemplateMissingError,
    template_dir,
    template_files,
    template_hash,
    write_if_changed,
)
from core.fa2_config import Fa2Config


def test_render_fp16_full() -> None:
    c = Fa2Config(128, "fp16", False, 128, 64, 4, 1, pad=8)
    assert render_instantiation(c) == (
        '#include "fa2_fwd.cuh"\n'
        "FA2_DEFINE_KERNEL(fa2_d128_fp16_full_br128_bc64_w4_s1_pad8, 128, __half, false, "
        "128, 64, 4, 1, 8, false)\n"
    )


def test_render_bf16_causal_swizzle() -> None:
    c = Fa2Config(64, "bf16", True, 64, 32, 2, 3, pad=0, swizzle=True)
    text = render_instantiation(c)
    assert text.splitlines() == [
        '#include "fa2_fwd.cuh"',
        "FA2_DEFINE_KERNEL(fa2_d64_bf16_causal_br64_bc32_w2_s3_swz, 64, __nv_bfloat16, true, "
        "64, 32, 2, 3, 0, true)",
    ]
    assert render_instantiation(c) == text  # pure


def test_render_rejects_unknown_dtype() -> None:
    c = Fa2Config(64, "fp8", False, 64, 64, 4, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype"):
        render_instantiation(c)


def test_write_if_changed(tmp_path: Path) -> None:
    path = tmp_path / "a dir" / "k.cu"
    assert write_if_changed(path, "one\n") is True
    assert path.read_text() == "one\n"
    os.utime(path, (1_000_000, 1_000_000))
    assert write_if_changed(path, "one\n") is False
    assert path.stat().st_mtime == 1_000_000, "an unchanged file keeps its timestamp"
    assert write_if_changed(path, "two\n") is True
    assert path.read_text() == "two\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["k.cu"], "no temp files left"


def test_template_dir_is_the_package_directory() -> None:
    assert template_dir() == Path(render.__file__).parent / "templates"


def test_template_hash_covers_the_family_template_and_its_includes(tmp_path: Path) -> None:
    (tmp_path / "fa2_fwd.cuh").write_text("#include <cuda_fp16.h>\n// v1\n")
    h1 = template_hash(tmp_path)
    assert len(h1) == 64 and h1 == template_hash(tmp_path)
    (tmp_path / "fa2_fwd.cuh").write_text("#include <cuda_fp16.h>\n// v2\n")
    h2 = template_hash(tmp_path)
    assert h2 != h1
    (tmp_path / "other_family.cuh").write_text("// another family's template\n")
    assert template_hash(tmp_path) == h2  # not read by fa2 builds
    (tmp_path / "fa2_fwd.cuh").write_text('#include "helper.cuh"\n// v2\n')
    with pytest.raises(TemplateMissingError, match=r"helper\.cuh"):
        template_hash(tmp_path)
    (tmp_path / "helper.cuh").write_text('  #  include "fa2_fwd.cuh"\n')  # a cycle is fine
    h3 = template_hash(tmp_path)
    assert template_files(directory=tmp_path) == ["fa2_fwd.cuh", "helper.cuh"]
    (tmp_path / "helper.cuh").write_text("// changed helper\n")
    assert template_hash(tmp_path) != h3
    assert template_hash(tmp_path, main="other_family.cuh") != template_hash(tmp_path)


def test_template_hash_defaults_to_the_package_templates() -> None:
    assert template_hash() == template_hash(template_dir())
