"""The measurement stage on a real GPU, with deliberately broken kernels.

Run on a GPU machine (torch and cuda-bindings installed, the repository on PYTHONPATH)::

    PYTHONPATH=. pytest -m gpu tests/measure/test_gpu_faults.py

The kernels under ``tests/measure/gpu_kernels/`` are compiled by the tests themselves: with nvcc
when it is on PATH, else with NVRTC from cuda-bindings (the ``nvidia-cuda-nvrtc`` wheel torch
depends on). Each broken kernel must be recorded with the right status and the worker must
measure a good kernel correctly afterwards:

=================  ==========================================  ================
kernel             fault                                       status
=================  ==========================================  ================
``fa2_test_trap``  ``__trap()``                                ``RUNTIME_FAILED``
``fa2_test_hang``  never returns                               ``TIMEOUT``
``fa2_test_oob``   writes 1 TiB past ``o``                     ``RUNTIME_FAILED``
``fa2_test_wrong`` O = Q, LSE = 0                              ``WRONG_RESULT``
=================  ==========================================  ================

The "good" kernel is a naive one-thread-per-row attention (``naive_attention.cu``), so these
tests do not depend on the real template.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.fa2_config import Fa2Config
from core.problem import Problem
from core.records import MeasureResult, MeasureStatus
from measure.jobs import BenchJob, MeasureOptions
from measure.timing import TimingOptions
from measure.worker import BenchWorker
from tests.support.gpu import gpu_marks

log = logging.getLogger(__name__)

KERNELS = Path(__file__).parent / "gpu_kernels"
JOB_TIMEOUT_S = 8.0
FAST = TimingOptions(warmup=2, target_ms=20.0, min_reps=5, max_reps=200)


pytestmark = gpu_marks()


# --------------------------------------------------------------------------- building


def _nvcc() -> str | None:
    try:
        from core.settings import get_settings

        name = get_settings().nvcc
    except ImportError:  # the repository on PYTHONPATH without its dependencies
        name = "nvcc"
    return shutil.which(name)


def _compile_nvrtc(src: Path, out: Path, arch: str) -> None:
    from cuda.bindings import nvrtc

    def ok(result: tuple[Any, ...], what: str) -> Any:
        err, *rest = result
        if int(err) != 0:
            raise RuntimeError(f"{what}: {err}")
        return rest[0] if len(rest) == 1 else rest

    header = (KERNELS / "fa2_params.cuh").read_bytes()
    prog = ok(
        nvrtc.nvrtcCreateProgram(
            src.read_bytes(), src.name.encode(), 1, [header], [b"fa2_params.cuh"]
        ),
        "nvrtcCreateProgram",
    )
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if int(err) != 0:
        size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        raise RuntimeError(f"NVRTC failed on {src.name}:\n{buf.decode(errors='replace')}")
    size = ok(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
    cubin = b" " * size
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    nvrtc.nvrtcDestroyProgram(prog)
    out.write_bytes(cubin)


def compile_cubin(src: Path, out: Path, arch: str) -> Path:
    """Compile ``src`` to a cubin for ``arch`` (nvcc, else NVRTC)."""
    nvcc = _nvcc()
    if nvcc is not None:
        cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-I", str(KERNELS)]
        proc = subprocess.run(
            [*cmd, "-o", str(out), str(src)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{proc.stderr}")
    else:
        _compile_nvrtc(src, out, arch)
    return out


@pytest.fixture(scope="module")
def arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


@pytest.fixture(scope="module")
def cubins(tmp_path_factory: pytest.TempPathFactory, arch: str) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gpu_kernels")
    try:
        return {
            name: compile_cubin(KERNELS / f"{name}.cu", out / f"{name}.cubin", arch)
            for name in ("naive_attention", "faults")
        }
    except (RuntimeError, ImportError, OSError) as exc:
        pytest.skip(f"cannot compile the test kernels (no nvcc, NVRTC failed): {exc}")


# --------------------------------------------------------------------------- jobs


def good_config(dtype: str = "fp16", causal: bool = False) -> Fa2Config:
    mask = "causal" if causal else "full"
    return Fa2Config.from_name(f"fa2_d64_{dtype}_{mask}_br64_bc64_w2_s1_pad0")


def problem(**kw: Any) -> Problem:
    base: dict[str, Any] = {"gpu": "test", "d": 64, "n": 256, "batch": 2, "heads": 4}
    return Problem(**{**base, **kw})


def good_job(cubins: dict[str, Path], layout: str = "bnhd", **kw: Any) -> BenchJob:
    p = problem(**kw)
    return BenchJob.make(
        good_config(p.dtype, p.causal),
        cubins["naive_attention"],
        p,
        MeasureOptions(layout=layout, timing=FAST),  # type: ignore[arg-type]
    )


def fault_job(cubins: dict[str, Path], symbol: str) -> BenchJob:
    return BenchJob.make(
        good_config(), cubins["faults"], problem(), MeasureOptions(timing=FAST, symbol=symbol)
    )


@pytest.fixture(scope="module")
def worker(cubins: dict[str, Path]) -> Iterator[BenchWorker]:
    w = BenchWorker(device=0, job_timeout_s=JOB_TIMEOUT_S, start_timeout_s=300, kill_wait_s=60)
    with w:
        # Warm the child (cuBLAS, SDPA kernels) so later phases stay far inside the timeout.
        first = w.measure(good_job(cubins))
        assert first.status == MeasureStatus.OK, first.error
        yield w


def assert_good(worker: BenchWorker, cubins: dict[str, Path]) -> MeasureResult:
    res = worker.measure(good_job(cubins))
    assert res.status == MeasureStatus.OK, res.error
    assert res.median_ms is not None and res.median_ms > 0
    assert res.tflops is not None and res.tflops > 0
    return res


# --------------------------------------------------------------------------- good kernel


GOOD_CASES = [
    pytest.param({}, "bnhd", id="fp16-full"),
    pytest.param({"n": 300, "kv_heads": 2}, "bhnd", id="fp16-full-ragged-gqa-bhnd"),
    pytest.param({"causal": True}, "bnhd", id="fp16-causal"),
    pytest.param({"causal": True, "n": 200, "nk": 300}, "bnhd", id="fp16-causal-nq<nk"),
    pytest.param({"causal": True, "n": 300, "nk": 200}, "bhnd", id="fp16-causal-dead-rows"),
    pytest.param({"dtype": "bf16"}, "bnhd", id="bf16-full"),
    pytest.param(
        {"dtype": "bf16", "causal": True, "n": 128, "nk": 384, "kv_heads": 1},
        "bnhd",
        id="bf16-causal-mqa",
    ),
]


@pytest.mark.parametrize(("kw", "layout"), GOOD_CASES)
def test_good_kernel_measures_ok(
    worker: BenchWorker, cubins: dict[str, Path], kw: dict[str, Any], layout: str
) -> None:
    res = worker.measure(good_job(cubins, layout, **kw))
    assert res.status == MeasureStatus.OK, res.error
    assert res.max_abs_err is not None and res.rel_err is not None
    assert res.max_abs_err < 1e-2
    assert res.reps >= FAST.min_reps
    assert res.p10_ms is not None and res.p90_ms is not None and res.median_ms is not None
    assert res.p10_ms <= res.median_ms <= res.p90_ms
    assert res.driver_registers is not None and res.driver_registers > 0
    assert res.extra["layout"] == layout
    assert res.extra["seed"] is not None


def test_inputs_are_reused_across_configs_of_a_problem(
    worker: BenchWorker, cubins: dict[str, Path]
) -> None:
    a = worker.measure(good_job(cubins, n=192))
    b = worker.measure(good_job(cubins, n=192))
    assert a.status == b.status == MeasureStatus.OK
    assert a.extra["seed"] == b.extra["seed"]  # one InputSet, one reference


# --------------------------------------------------------------------------- broken kernels


def test_wrong_values_are_wrong_result_and_the_worker_stays(
    worker: BenchWorker, cubins: dict[str, Path]
) -> None:
    pid = worker.pid
    res = worker.measure(fault_job(cubins, "fa2_test_wrong"))
    assert res.status == MeasureStatus.WRONG_RESULT, res.error
    assert res.error and ("LSE" in res.error or "max |O - ref|" in res.error)
    assert res.median_ms is None  # never timed
    assert worker.pid == pid
    assert_good(worker, cubins)


def test_trap_is_runtime_failed_and_the_worker_is_replaced(
    worker: BenchWorker, cubins: dict[str, Path]
) -> None:
    pid, restarts = worker.pid, worker.restarts
    res = worker.measure(fault_job(cubins, "fa2_test_trap"))
    assert res.status == MeasureStatus.RUNTIME_FAILED, res.error
    assert res.error and "CUDA_ERROR" in res.error
    assert res.extra.get("worker_restarted") is True
    assert worker.restarts == restarts + 1
    good = assert_good(worker, cubins)
    assert good.extra["worker_pid"] != pid


def test_out_of_bounds_write_is_runtime_failed(
    worker: BenchWorker, cubins: dict[str, Path]
) -> None:
    res = worker.measure(fault_job(cubins, "fa2_test_oob"))
    assert res.status == MeasureStatus.RUNTIME_FAILED, res.error
    assert res.error and "CUDA_ERROR" in res.error
    assert res.extra.get("worker_restarted") is True
    assert_good(worker, cubins)


def test_hang_is_timeout_and_the_worker_is_replaced(
    worker: BenchWorker, cubins: dict[str, Path]
) -> None:
    pid = worker.pid
    res = worker.measure(fault_job(cubins, "fa2_test_hang"))
    assert res.status == MeasureStatus.TIMEOUT, res.error
    assert res.extra["phase"] == "launch"
    good = assert_good(worker, cubins)
    assert good.extra["worker_pid"] != pid


def test_missing_symbol_is_runtime_failed_without_a_restart(
    worker: BenchWorker, cubins: dict[str, Path]
) -> None:
    pid = worker.pid
    res = worker.measure(fault_job(cubins, "fa2_no_such_kernel"))
    assert res.status == MeasureStatus.RUNTIME_FAILED
    assert res.error and "CUDA_ERROR_NOT_FOUND" in res.error
    assert worker.pid == pid
    assert_good(worker, cubins)


def test_sdpa_backends_are_timed_in_the_same_job(
    worker: BenchWorker, cubins: dict[str, Path]
) -> None:
    p = problem(n=512)
    job = BenchJob.make(
        good_config(),
        cubins["naive_attention"],
        p,
        MeasureOptions(timing=FAST, sdpa=True),
    )
    res = worker.measure(job)
    assert res.status == MeasureStatus.OK, res.error
    sdpa = res.extra["sdpa"]
    assert set(sdpa) == {"flash", "efficient", "cudnn"}
    for name, t in sdpa.items():
        assert t["status"] in ("OK", "UNSUPPORTED", "FAILED"), name
        if t["status"] == "OK":
            assert t["median_ms"] > 0 and t["max_abs_err"] < 1e-2, (name, t)
        else:
            assert t["note"], name
    assert sdpa["flash"]["status"] == "OK", sdpa["flash"]
    assert res.ref_err is not None and res.ref_err < 5e-3


# --------------------------------------------------------------------------- in-process


@pytest.fixture(scope="module")
def context() -> None:
    from measure.loader import ensure_context

    ensure_context(0)


@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
def test_loader_launches_in_process(context: None, cubins: dict[str, Path], layout: str) -> None:
    import torch

    from measure.loader import LoadedKernel, grid_for, synchronize
    from measure.params import make_params
    from measure.reference import make_inputset
    from measure.verify import check_output, poison

    cfg = good_config(causal=True)
    p = problem(causal=True, n=200, nk=260, kv_heads=2)
    kernel = LoadedKernel.for_config(cfg, cubins["naive_attention"])
    assert kernel.num_regs > 0 and kernel.local_bytes >= 0 and kernel.max_threads >= cfg.threads
    inputs = make_inputset(p, layout, device="cuda:0")  # type: ignore[arg-type]
    o, lse = inputs.outputs()
    poison(o, lse)
    params = make_params(inputs.q, inputs.k, inputs.v, o, lse, inputs.scale, layout)  # type: ignore[arg-type]
    grid, block = grid_for(cfg, p)
    stream = torch.cuda.current_stream().cuda_stream
    kernel.launch(params, grid, block, cfg.smem_bytes, stream)
    synchronize(stream)
    res = check_output(o, lse, inputs)
    assert res.ok, res.message
    kernel.unload()
    kernel.unload()


def test_make_params_rejects_bad_tensors(context: None) -> None:
    import torch

    from measure.params import make_params

    def t(*shape: int) -> Any:
        return torch.zeros(shape, dtype=torch.float16, device="cuda")

    q, k, v, o = t(2, 64, 4, 64), t(2, 64, 4, 64), t(2, 64, 4, 64), t(2, 64, 4, 64)
    lse = torch.zeros((2, 4, 64), dtype=torch.float32, device="cuda")
    p = make_params(q, k, v, o, lse, 0.125, "bnhd")
    assert (p.q_row_stride, p.q_head_stride, p.q_batch_stride) == (256, 64, 16384)
    p = make_params(q, k, v, o, None, 0.125, "bhnd")
    assert (p.nq, p.q_heads, p.q_row_stride, p.q_head_stride) == (4, 64, 64, 256)
    assert p.lse is None
    with pytest.raises(ValueError, match="contiguous"):
        make_params(t(2, 64, 4, 128)[..., ::2], k, v, o, lse, 0.1, "bnhd")
    with pytest.raises(ValueError, match="multiple of 8"):
        make_params(t(2, 64, 4, 68)[..., :64], k, v, o, lse, 0.1, "bnhd")
    flat = torch.zeros(2 * 64 * 4 * 64 + 4, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="16-byte"):
        make_params(flat[4:].view(2, 64, 4, 64), k, v, o, lse, 0.1, "bnhd")
    with pytest.raises(ValueError, match="dtype"):
        make_params(q.float(), k, v, o, lse, 0.1, "bnhd")
    with pytest.raises(ValueError, match="kv heads"):
        make_params(q, t(2, 64, 3, 64), t(2, 64, 3, 64), o, lse, 0.1, "bnhd")
    with pytest.raises(ValueError, match="lse"):
        make_params(q, k, v, o, lse[:, :, :32], 0.1, "bnhd")
    with pytest.raises(ValueError, match="CUDA"):
        make_params(q.cpu(), k.cpu(), v.cpu(), o.cpu(), None, 0.1, "bnhd")


def test_time_launches_on_a_torch_op(context: None) -> None:
    import torch

    from measure.timing import time_launches

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    stats = time_launches(lambda: a @ a, target_ms=20.0, min_reps=5, max_reps=100)
    assert 5 <= stats.reps <= 100
    assert 0 < stats.p10_ms <= stats.median_ms <= stats.p90_ms
    copies = [(torch.randn(1024, 1024, device="cuda"),) for _ in range(3)]
    stats = time_launches(lambda x: x.mul_(1.0), reps=12, rotate=copies, flush_l2=False)
    assert stats.reps == 12


def test_current_gpu_info(context: None) -> None:
    from measure.gpuinfo import current_gpu_info

    info = current_gpu_info(0)
    assert info.name and info.sm_count > 0 and info.memory_bytes > 0
    assert info.compute_capability.count(".") == 1
    assert info.smem_optin_bytes >= 48 * 1024
    assert info.driver_version and info.driver_version != "unknown"
    log.info("GPU: %s", info)


def test_bench_cli_end_to_end(cubins: dict[str, Path]) -> None:
    try:
        from typer.testing import CliRunner

        from fa2tune.cli import app
    except ImportError as exc:
        pytest.skip(f"CLI dependencies missing: {exc}")
    cfg = good_config()
    res = CliRunner().invoke(
        app,
        [
            "bench", "--config", cfg.name, "--n", "512", "--batch", "1", "--heads", "4",
            "--cubin", str(cubins["naive_attention"]), "--sdpa", "--json", "--target-ms", "20",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["result"]["status"] == "OK"
    assert data["gpu"]["name"]
    assert data["sdpa"]["flash"]["speedup_vs_sdpa"] is not None
