"""The ptxas parser against real nvcc 13 output captured in tests/codegen/data/ptxas (README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.ptxas import classify_errors, error_excerpt, parse_ptxas
from core.build_report import BuildStatus

DATA = Path(__file__).parent / "data" / "ptxas"


def sample(name: str) -> str:
    return (DATA / name).read_text()


def test_multi_kernel_picks_the_named_entry() -> None:
    text = sample("sm90_multi_kernel.log")
    info = parse_ptxas(text, "simple_kernel")
    assert info.found and info.arch == "sm_90"
    assert (info.registers, info.barriers, info.static_smem) == (10, 1, 1024)
    assert (info.spill_stores, info.spill_loads, info.stack_bytes) == (0, 0, 0)
    assert not info.spills
    assert info.compile_ms == pytest.approx(3.942)
    mangled = parse_ptxas(text, "_Z11tmpl_kernelILi3EEvPf")
    assert (mangled.registers, mangled.static_smem) == (12, 0)


@pytest.mark.parametrize("log", ["sm90_spills_launch_bounds.log", "sm90_spills_maxrreg32.log"])
def test_spills(log: str) -> None:
    text = sample(log)
    heavy = parse_ptxas(text, "heavy_kernel")
    assert heavy.registers == 32
    assert (heavy.spill_stores, heavy.spill_loads) == (868, 936)
    assert heavy.stack_bytes == 464 and heavy.cumulative_stack == 464
    assert heavy.spills
    # The other kernel in the same file does not inherit the spill line.
    other = parse_ptxas(text, "stack_kernel")
    assert other.registers == 30 and not other.spills and other.stack_bytes == 0


def test_stack_frame_without_spills() -> None:
    info = parse_ptxas(sample("sm90_stack_frame.log"), "stack_kernel")
    assert (info.registers, info.stack_bytes, info.spill_stores) == (34, 256, 0)
    assert info.cmem == {}  # sm_90 output leaves cmem out


def test_sm80_cmem_fields() -> None:
    info = parse_ptxas(sample("sm80_stack_frame.log"), "stack_kernel")
    assert info.arch == "sm_80"
    assert info.registers == 36
    assert info.cmem == {0: 372}
    assert info.stack_bytes == 256


def test_fa2_template_samples() -> None:
    ok = parse_ptxas(sample("sm90_fa2_d128_ok.log"), "k_d128")
    assert (ok.registers, ok.spills, ok.barriers) == (255, False, 1)
    spills = parse_ptxas(sample("sm90_fa2_d128_spills.log"), "k_d128b")
    assert (spills.spill_stores, spills.spill_loads, spills.stack_bytes) == (776, 752, 520)


def test_multi_arch_output_selects_by_arch() -> None:
    text = sample("multi_arch_fa2_d32.log")
    assert parse_ptxas(text, "k_d32").arch == "sm_80"  # first section by default
    sm80 = parse_ptxas(text, "k_d32", arch="sm_80")
    sm90 = parse_ptxas(text, "k_d32", arch="sm_90")
    assert (sm80.registers, sm80.cmem) == (202, {0: 512})
    assert (sm90.registers, sm90.cmem) == (185, {})
    assert not parse_ptxas(text, "k_d32", arch="sm_89").found


def test_missing_kernel_is_not_found() -> None:
    info = parse_ptxas(sample("sm90_multi_kernel.log"), "nope")
    assert not info.found and info.registers is None
    failed = parse_ptxas(sample("sm90_frontend_error.log"), "err_kernel")
    assert not failed.found


def test_spill_warning_lines_count_as_spills() -> None:
    text = (
        "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
        "ptxas warning : Registers are spilled to local memory in function 'k', "
        "8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 255 registers, 384 bytes cmem[0]\n"
    )
    info = parse_ptxas(text, "k")
    assert (info.registers, info.spill_stores, info.spill_loads) == (255, 8, 12)
    assert info.barriers is None and info.cmem == {0: 384}


def test_no_error_in_successful_output() -> None:
    for log in ("sm90_multi_kernel.log", "sm90_spills_maxrreg32.log", "sm90_fa2_d128_ok.log"):
        assert classify_errors(sample(log), 0) is None


def test_smem_overflow() -> None:
    err = classify_errors(sample("sm90_smem_overflow.log"), 255)
    assert err is not None
    assert err.status == BuildStatus.SMEM_OVERFLOW and err.kind == "smem"
    assert "uses too much shared data" in err.excerpt


@pytest.mark.parametrize(
    ("log", "fragment"),
    [
        ("sm90_ptxas_param_space.log", "uses too much parameter space"),
        ("sm90_param_overflow.log", "Formal parameter space overflowed"),
    ],
)
def test_resource_errors(log: str, fragment: str) -> None:
    err = classify_errors(sample(log), 255)
    assert err is not None
    assert err.status == BuildStatus.COMPILE_FAILED and err.kind == "resources"
    assert fragment in err.excerpt


@pytest.mark.parametrize(
    ("log", "fragment"),
    [
        ("sm90_frontend_error.log", 'identifier "undefined_symbol" is undefined'),
        ("sm90_static_assert.log", "static assertion failed"),
    ],
)
def test_other_errors_carry_an_excerpt(log: str, fragment: str) -> None:
    err = classify_errors(sample(log), 1)
    assert err is not None
    assert err.status == BuildStatus.COMPILE_FAILED and err.kind == "other"
    assert err.excerpt.splitlines()[0].endswith(fragment) or fragment in err.excerpt
    assert all("error" in line.lower() for line in err.excerpt.splitlines())


def test_failure_without_error_text_still_explains() -> None:
    err = classify_errors("Segmentation fault (core dumped)\n", -11)
    assert err is not None and err.status == BuildStatus.COMPILE_FAILED
    assert "Segmentation fault" in err.excerpt
    silent = classify_errors("", 3)
    assert silent is not None and "status 3" in silent.excerpt


def test_error_excerpt_is_bounded() -> None:
    text = "\n".join(f"x.cu({i}): error: bad {i}" for i in range(100))
    assert len(error_excerpt(text).splitlines()) == 8
