"""Strict ingest (issue 15): every value a measurement cannot have is refused, field by field.

Each rule gets a file that breaks only it; the refusal is a :class:`TransferError` whose message
names the field, nothing is written, and the boundary values are stored on every backend
(PostgreSQL's ``Integer`` is 32-bit). The shipped results files still ingest.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from db.dump_fields import (
    GPU_NAME_PATTERN,
    INT32_MAX,
    INT64_MAX,
    MAX_ERROR_CHARS,
    MAX_EXTRA_CHARS,
    GpuName,
    clip_text,
)
from db.dump_format import DumpFile, TransferError, parse_dump
from db.models import Measurement, Problem, utcnow
from db.queries import problem_flops
from db.shipped import shipped_files
from db.store import Store
from db.transfer import export as transfer_export
from db.transfer import ingest

Doc = dict[str, Any]


@cache
def _shipped_doc() -> str:
    files = shipped_files()
    if not files:
        pytest.skip("no results files shipped in db/data")
    return files[0].read_text(encoding="utf-8")


def _base() -> Doc:
    """One GPU, one build, one problem and one OK measurement taken from a shipped file."""
    full = json.loads(_shipped_doc())
    m = next(m for m in full["measurements"] if m["status"] == "OK" and m.get("p10_ms"))
    ref = m["build"]
    build = next(
        b
        for b in full["builds"]
        if (b["config_name"], b["arch"], b["source_hash"])
        == (ref["config_name"], ref["arch"], ref["source_hash"])
    )
    gpu = next(g for g in full["gpus"] if g["name"] == m["problem"]["gpu"])
    return {
        "format": full["format"],
        "format_version": full["format_version"],
        "gpus": [gpu],
        "builds": [build],
        "problems": [copy.deepcopy(m["problem"])],
        "measurements": [m],
    }


@pytest.fixture
def base() -> Doc:
    return _base()


def _set(*path: str | int, value: Any) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return apply


def _gpu_name(name: str) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        doc["gpus"][0]["name"] = name
        doc["problems"][0]["gpu"] = name
        doc["measurements"][0]["problem"]["gpu"] = name

    return apply


def _problem(field: str, value: Any) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        doc["problems"][0][field] = value
        doc["measurements"][0]["problem"][field] = value

    return apply


def _measurement(**fields: Any) -> Callable[[Doc], None]:
    def apply(doc: Doc) -> None:
        doc["measurements"][0].update(fields)

    return apply


M = "measurements.0"
REJECTED: list[Any] = [
    # integers that fit neither backend's column, or not PostgreSQL's 32-bit Integer
    pytest.param(_measurement(reps=10**30), f"{M}.reps", id="reps-1e30"),
    pytest.param(_measurement(reps=3e9), f"{M}.reps", id="reps-3e9"),
    pytest.param(_measurement(reps=-1), f"{M}.reps", id="reps-negative"),
    pytest.param(_measurement(trial_number=2**31), f"{M}.trial_number", id="trial-number"),
    pytest.param(_measurement(driver_registers=2**31), f"{M}.driver_registers", id="drv-regs"),
    pytest.param(_measurement(driver_local_bytes=2**40), f"{M}.driver_local_bytes", id="drv-local"),
    pytest.param(_measurement(sm_clock_mhz=2**31), f"{M}.sm_clock_mhz", id="sm-clock"),
    pytest.param(_measurement(mem_clock_mhz=10**20), f"{M}.mem_clock_mhz", id="mem-clock"),
    pytest.param(_set("builds", 0, "registers", value=2**31), "builds.0.registers", id="regs"),
    pytest.param(
        _set("builds", 0, "spill_stores", value=2**31), "builds.0.spill_stores", id="spills"
    ),
    pytest.param(
        _set("builds", 0, "static_smem", value=2**32), "builds.0.static_smem", id="static-smem"
    ),
    pytest.param(_set("gpus", 0, "sm_count", value=2**31), "gpus.0.sm_count", id="sm-count"),
    pytest.param(
        _set("gpus", 0, "memory_bytes", value=2**63), "gpus.0.memory_bytes", id="memory-bytes"
    ),
    pytest.param(
        _set("gpus", 0, "smem_optin_bytes", value=2**31),
        "gpus.0.smem_optin_bytes",
        id="smem-optin",
    ),
    # times: finite, positive, bounded, ordered
    pytest.param(_measurement(median_ms=1e308), f"{M}.median_ms", id="median-1e308"),
    pytest.param(_measurement(median_ms="Infinity"), f"{M}.median_ms", id="median-inf"),
    pytest.param(_measurement(median_ms=0), f"{M}.median_ms", id="median-zero"),
    pytest.param(_measurement(p90_ms=1e7), f"{M}.p90_ms", id="p90-over-bound"),
    pytest.param(_measurement(p10_ms="NaN"), f"{M}.p10_ms", id="p10-nan"),
    pytest.param(
        _measurement(p10_ms=2.0, median_ms=1.0, p90_ms=3.0, tflops=None), "p10_ms", id="p10>med"
    ),
    pytest.param(
        _measurement(p10_ms=1.0, median_ms=3.0, p90_ms=2.0, tflops=None), "p90_ms", id="med>p90"
    ),
    pytest.param(
        _measurement(p10_ms=3.0, median_ms=None, p90_ms=2.0, status="WRONG_RESULT"),
        "p90_ms",
        id="p10>p90",
    ),
    pytest.param(
        _set("builds", 0, "compile_seconds", value=1e300),
        "builds.0.compile_seconds",
        id="compile-seconds",
    ),
    # throughput: one measurement's figures agree, and are physically possible
    pytest.param(_measurement(tflops=1e6), f"{M}.tflops", id="tflops-over-bound"),
    pytest.param(_measurement(tflops=131.8), "tflops", id="tflops-not-the-median's"),
    pytest.param(
        _measurement(median_ms=1e-6, p10_ms=None, p90_ms=None, tflops=None),
        "median_ms",
        id="median-implies-impossible-tflops",
    ),
    # error figures: never negative
    pytest.param(_measurement(max_abs_err=-1.0), f"{M}.max_abs_err", id="max-err-negative"),
    pytest.param(_measurement(rel_err="-Infinity"), f"{M}.rel_err", id="rel-err-minus-inf"),
    pytest.param(_measurement(ref_err=-1e-9), f"{M}.ref_err", id="ref-err-negative"),
    # problem shape: the kernel's int32 and its head dims
    pytest.param(_problem("n", 10**12), "problems.0.n", id="n-1e12"),
    pytest.param(_problem("n", 2**31), "problems.0.n", id="n-2^31"),
    pytest.param(_problem("nk", 0), "problems.0.nk", id="nk-zero"),
    pytest.param(_problem("nk", 2**31), "problems.0.nk", id="nk-2^31"),
    pytest.param(_problem("d", 65), "problems.0.d", id="d-65"),
    pytest.param(_problem("d", 12), "problems.0.d", id="d-12"),
    pytest.param(_problem("d", 264), "problems.0.d", id="d-264"),
    pytest.param(_problem("d", 0), "problems.0.d", id="d-0"),
    pytest.param(_set("builds", 0, "config", "d", value=65), "builds.0.config.d", id="cfg-d"),
    pytest.param(_problem("batch", 2**31), "problems.0.batch", id="batch"),
    pytest.param(_problem("heads", 2**40), "problems.0.heads", id="heads"),
    pytest.param(_problem("kv_heads", 2**31), "problems.0.kv_heads", id="kv-heads"),
    # GPU names: non-blank, a GPU key, printable on one line, bounded
    pytest.param(_gpu_name("   "), "gpus.0.name", id="name-blank"),
    pytest.param(_gpu_name(""), "gpus.0.name", id="name-empty"),
    pytest.param(_gpu_name("NVIDIA"), "gpus.0.name", id="name-no-key"),
    pytest.param(_gpu_name("-- --"), "gpus.0.name", id="name-punctuation"),
    pytest.param(_gpu_name("NVIDIA\x00H200"), "gpus.0.name", id="name-nul"),
    pytest.param(_gpu_name("NVIDIA H200\n#define x"), "gpus.0.name", id="name-newline"),
    pytest.param(_gpu_name("NVIDIA H200\x1b[2J"), "gpus.0.name", id="name-escape"),
    pytest.param(_gpu_name("NVIDIA \u202eH200"), "gpus.0.name", id="name-bidi"),
    pytest.param(_gpu_name("H" * 129), "gpus.0.name", id="name-too-long"),
    pytest.param(
        _set("problems", 0, "gpu", value="H200\x00"), "problems.0.gpu", id="problem-gpu-nul"
    ),
    pytest.param(
        _set("gpus", 0, "compute_capability", value="\u0669.0"),
        "gpus.0.compute_capability",
        id="cc-unicode-digit",
    ),
    # other text that reaches the store or the header
    pytest.param(_measurement(driver_version="550\n"), f"{M}.driver_version", id="driver-nl"),
    pytest.param(_measurement(error="bad\x00"), f"{M}.error", id="error-nul"),
    pytest.param(
        _set("builds", 0, "nvcc_version", value="12.6\r"), "builds.0.nvcc_version", id="nvcc"
    ),
    pytest.param(_set("builds", 0, "flags", value=["-O3\x00"]), "builds.0.flags.0", id="flag-nul"),
    pytest.param(
        _measurement(created_at="9999-12-31T23:00:00-05:00"), f"{M}.created_at", id="when"
    ),
    # issue 27: nothing from the future, no megabyte texts
    pytest.param(_measurement(created_at="9999-01-01T00:00:00Z"), "in the future", id="year-9999"),
    pytest.param(
        _measurement(created_at=(utcnow() + timedelta(days=2)).isoformat()),
        f"{M}.created_at",
        id="two-days-ahead",
    ),
    pytest.param(
        _measurement(error="x" * (MAX_ERROR_CHARS + 1)), f"{M}.error", id="error-too-long"
    ),
    pytest.param(
        _set("builds", 0, "error", value="y" * (MAX_ERROR_CHARS + 1)),
        "builds.0.error",
        id="build-error-too-long",
    ),
    pytest.param(
        _measurement(extra={"log": "z" * MAX_EXTRA_CHARS}), "as compact JSON", id="extra-too-long"
    ),
    # JSON types as the published schema states them (issue 15: schemathesis found
    # "smem_optin_bytes": false stored as 0): no booleans or strings for numbers, no numbers
    # for booleans or timestamps, no fractions for integers
    pytest.param(
        _set("gpus", 0, "smem_optin_bytes", value=False),
        "gpus.0.smem_optin_bytes",
        id="int-false",
    ),
    pytest.param(_set("gpus", 0, "sm_count", value=True), "gpus.0.sm_count", id="int-true"),
    pytest.param(_set("gpus", 0, "memory_bytes", value="80"), "gpus.0.memory_bytes", id="int-str"),
    pytest.param(_measurement(reps="10"), f"{M}.reps", id="int-numeric-string"),
    pytest.param(_measurement(reps=10.5), f"{M}.reps", id="int-fraction"),
    pytest.param(_measurement(trial_number=True), f"{M}.trial_number", id="optional-int-true"),
    pytest.param(_problem("n", "4096"), "problems.0.n", id="n-str"),
    pytest.param(_problem("d", True), "problems.0.d", id="d-true"),
    pytest.param(_problem("causal", 0), "problems.0.causal", id="bool-int"),
    pytest.param(_problem("causal", "false"), "problems.0.causal", id="bool-str"),
    pytest.param(
        _set("builds", 0, "config", "causal", value="no"), "builds.0.config.causal", id="cfg-bool"
    ),
    pytest.param(_measurement(median_ms="1.5"), f"{M}.median_ms", id="float-str"),
    pytest.param(_measurement(tflops=True), f"{M}.tflops", id="float-true"),
    pytest.param(
        _set("builds", 0, "compile_seconds", value=False),
        "builds.0.compile_seconds",
        id="float-false",
    ),
    pytest.param(_measurement(max_abs_err="0.5"), f"{M}.max_abs_err", id="err-str"),
    pytest.param(_measurement(rel_err="inf"), f"{M}.rel_err", id="err-inf-spelling"),
    pytest.param(_measurement(created_at=0), f"{M}.created_at", id="when-number"),
    pytest.param(_set("format_version", value=True), "format_version", id="version-true"),
]


def test_texts_at_their_limit_and_times_within_a_day_are_taken(base: Doc) -> None:
    m = base["measurements"][0]
    m.update(
        error="e" * MAX_ERROR_CHARS,
        extra={"k": "v" * (MAX_EXTRA_CHARS - len('{"k":""}'))},
        created_at=(utcnow() + timedelta(hours=23)).isoformat(),  # a clock a little ahead
    )
    assert len(parse_dump(json.dumps(base)).measurements) == 1


def test_dump_clips_long_errors_so_its_file_ingests(base: Doc, target: Store) -> None:
    """A database may hold longer errors than an ingest takes (written before the limit, or
    by hand): ``fa2tune dump`` clips them, saying so, and the file ingests."""
    ingest(target, json.dumps(base))
    with target.engine.connect() as conn:
        conn.execute(update(Measurement).values(error="w" * (3 * MAX_ERROR_CHARS)))
        conn.commit()
    dumped = transfer_export(target)
    (record,) = dumped.measurements
    assert record.error is not None and len(record.error) == MAX_ERROR_CHARS
    assert record.error.endswith(f"[clipped: {3 * MAX_ERROR_CHARS} characters in all]")
    assert parse_dump(dumped.model_dump_json()).measurements[0].error == record.error
    assert clip_text("short") == "short" and clip_text(None) is None


@pytest.mark.parametrize(("mutate", "field"), REJECTED)
def test_rejected_with_the_field_named(
    base: Doc, mutate: Callable[[Doc], None], field: str
) -> None:
    mutate(base)
    with pytest.raises(TransferError) as info:
        parse_dump(json.dumps(base))
    message = str(info.value)
    assert field in message, message
    assert "invalid results file" in message


def test_the_base_file_is_valid(base: Doc) -> None:
    data = parse_dump(json.dumps(base))
    assert len(data.measurements) == 1


def test_nan_in_extra_is_refused(base: Doc) -> None:
    base["measurements"][0]["extra"] = {"x": math.nan}
    with pytest.raises(TransferError, match=rf"{M}\.extra"):
        parse_dump(base)


@pytest.mark.parametrize("figure", ["NaN", "Infinity"])
def test_wrong_result_error_figures_may_be_non_finite(base: Doc, figure: str) -> None:
    base["measurements"][0].update(
        status="WRONG_RESULT", max_abs_err=figure, rel_err=figure, ref_err=figure
    )
    m = parse_dump(json.dumps(base)).measurements[0]
    assert m.max_abs_err is not None and not math.isfinite(m.max_abs_err)


def test_gpu_name_is_stored_stripped(base: Doc) -> None:
    _gpu_name("  NVIDIA H200  ")(base)
    data = parse_dump(json.dumps(base))
    assert data.gpus[0].name == "NVIDIA H200"
    assert data.problems[0].gpu == "NVIDIA H200"


def test_rules_are_in_the_json_schema() -> None:
    """POST /v1/results publishes DumpFile's JSON schema: the bounds are stated there."""
    defs = DumpFile.model_json_schema()["$defs"]
    m = defs["MeasurementRecord"]
    assert m["properties"]["reps"]["maximum"] == INT32_MAX
    assert m["properties"]["median_ms"]["anyOf"][0]["maximum"] == 1e6
    assert "p10_ms <= median_ms" in m["description"]
    assert m["properties"]["max_abs_err"]["anyOf"] == [
        {"type": "number", "minimum": 0},
        {"enum": ["NaN", "Infinity"]},
        {"type": "null"},
    ]
    p = defs["ProblemRecord"]["properties"]
    assert p["n"]["maximum"] == INT32_MAX
    assert p["d"]["enum"] == list(range(8, 257, 8))  # every multiple of 8 up to 256
    g = defs["GpuRecord"]["properties"]
    assert g["memory_bytes"]["maximum"] == INT64_MAX
    assert g["name"]["maxLength"] == 128
    assert "pattern" in g["name"] and "printable" in g["name"]["description"]


# ----------------------------------------------------------------- storing and shipped files


def _count(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count(Measurement.id))).scalar_one())


def test_bad_file_writes_nothing(base: Doc, target: Store) -> None:
    base["measurements"][0]["reps"] = 10**30
    with pytest.raises(TransferError, match=rf"{M}\.reps"):
        ingest(target, json.dumps(base))
    assert _count(target) == 0


def test_boundary_values_are_stored_on_every_backend(base: Doc, target: Store) -> None:
    """The largest values the schema admits fit the columns (PostgreSQL Integer: 32-bit)."""
    m = base["measurements"][0]
    m.update(reps=INT32_MAX, trial_number=INT32_MAX, sm_clock_mhz=INT32_MAX)
    m.update(driver_registers=INT32_MAX, driver_local_bytes=INT32_MAX, mem_clock_mhz=INT32_MAX)
    base["gpus"][0].update(sm_count=INT32_MAX, memory_bytes=INT64_MAX, smem_optin_bytes=INT32_MAX)
    base["builds"][0].update(registers=INT32_MAX, spill_stores=INT32_MAX, stack_bytes=INT32_MAX)
    for problem in (base["problems"][0], m["problem"]):
        problem.update(n=INT32_MAX, nk=1)
    m.update(median_ms=1e6, p10_ms=1e6, p90_ms=1e6, tflops=None)
    assert ingest(target, json.dumps(base)).added == 1
    with target.engine.connect() as conn:
        assert conn.execute(select(Measurement.reps)).scalar_one() == INT32_MAX


def test_best_reports_the_throughput_of_its_median(base: Doc, target: Store) -> None:
    """A second spelling of the GPU merges into the first; /v1/best's figures are one
    measurement's: its TFLOP/s is the median's on its problem, whatever a row recorded."""
    other = copy.deepcopy(base)
    _gpu_name("nvidia  h200")(other)
    om = other["measurements"][0]
    om.update(median_ms=om["median_ms"] / 2, p10_ms=None, p90_ms=None, tflops=om["tflops"] * 2)
    om["created_at"] = "2020-01-01T00:00:00Z"  # another measurement: another time
    ingest(target, json.dumps(base))
    ingest(target, json.dumps(other))
    assert [g.name for g in target.gpus()] == [base["gpus"][0]["name"]]  # one GPU
    p = base["problems"][0]
    best = target.best("nvidia  h200", p["d"], p["n"], p["dtype"], p["causal"])
    assert best is not None and best.median_ms == om["median_ms"]
    with target.engine.connect() as conn:
        # A row recorded before ingest checked the figures: its tflops is not its median's.
        conn.execute(update(Measurement).values(tflops=131.8))
        conn.commit()
    best = target.best("H200", p["d"], p["n"], p["dtype"], p["causal"])
    assert best is not None
    with Session(target.engine) as s:
        flops = problem_flops(s.get_one(Problem, best.problem_id))
    assert best.tflops == pytest.approx(flops / (best.median_ms * 1e-3) / 1e12, rel=1e-12)
    assert best.tflops == pytest.approx(om["tflops"], rel=1e-9)


@pytest.mark.parametrize("db_url", ["sqlite-memory"], indirect=True)
def test_shipped_files_still_ingest(target: Store) -> None:
    files = shipped_files()
    if not files:
        pytest.skip("no results files shipped in db/data")
    for file in files:
        assert ingest(target, file.read_bytes()).added > 0, file.name


# ------------------------------------------------- the published schema says what is refused


def test_integral_numbers_are_integers(base: Doc) -> None:
    """JSON Schema's integer is any number with a zero fractional part, and OpenAPI tools
    send 5.0 as a valid integer, so integral floats are taken (and stored as integers)."""
    base["gpus"][0]["sm_count"] = 132.0
    base["problems"][0]["kv_heads"] = base["measurements"][0]["problem"]["kv_heads"] = 1.0
    base["format_version"] = 2.0
    dump = parse_dump(json.dumps(base))
    assert dump.gpus[0].sm_count == 132 and type(dump.gpus[0].sm_count) is int
    assert dump.problems[0].kv_heads == 1 and type(dump.problems[0].kv_heads) is int


@pytest.mark.parametrize(("text", "value"), [("NaN", math.nan), ("Infinity", math.inf)])
def test_error_figures_take_the_strings_the_format_writes(
    base: Doc, text: str, value: float
) -> None:
    base["measurements"][0].update(status="WRONG_RESULT", max_abs_err=text)
    figure = parse_dump(json.dumps(base)).measurements[0].max_abs_err
    assert figure is not None
    assert (math.isnan(figure) and math.isnan(value)) or figure == value


def test_records_built_in_code_still_validate(base: Doc) -> None:
    """fa2tune builds records from Python values (datetimes, ints): the JSON-type checks
    take those as before; the mapping path refuses what the JSON path refuses."""
    dump = parse_dump(json.dumps(base))
    assert DumpFile.model_validate(dump.model_dump()) == dump
    base["gpus"][0]["smem_optin_bytes"] = False
    with pytest.raises(TransferError, match="smem_optin_bytes"):
        parse_dump(base)


def test_lone_surrogates_are_still_refused(base: Doc) -> None:
    """The published patterns leave surrogates out (no regex engine of OpenAPI tools can name
    them); the validator still refuses a lone one, which only json.loads-decoded data holds."""
    _measurement(driver_version="550\ud800")(base)
    with pytest.raises(TransferError, match=re.escape(f"{M}.driver_version")):
        parse_dump(base)
    _gpu_name("NVIDIA H200\udfff")(base)
    with pytest.raises(TransferError, match=re.escape("gpus.0.name")):
        parse_dump(base)


def _patterns(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _patterns(item)


def test_published_patterns_compile_for_openapi_tools() -> None:
    """Every pattern of the results-file schema compiles as ECMA-262/Rust regex syntax
    (jsonschema-rs, which schemathesis uses and drops what it cannot compile)."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    patterns = set(_patterns(DumpFile.model_json_schema()))
    assert GPU_NAME_PATTERN in patterns
    for pattern in patterns:
        jsonschema_rs.Draft202012Validator({"pattern": pattern})  # raises when it cannot
    # and the tools read the GPU-name rule as Python does here
    name_schema = jsonschema_rs.Draft202012Validator(
        {"type": "string", "minLength": 1, "maxLength": 128, "pattern": GPU_NAME_PATTERN}
    )
    for name in GPU_NAMES:
        assert name_schema.is_valid(name) == _pattern_takes_gpu_name(name), name


GPU_NAMES = [
    "NVIDIA H200", "H200", "h200", "nvidia-h200", "NVIDIA A100-SXM4-80GB", "  H200  ",
    "NVIDIA", "nvidia", "NvIdIa", " NVIDIA ", "NVIDIA-", "-NVIDIA-", "NVIDIA NVIDIA",
    "NVIDIAX", "NVIDI", "xNVIDIA", "nvidib", "0", "é", "é1", "NVIDIA é", "NVIDIA 1",
    "Tesla NVIDIA", "", " ", "\t", "-- --", "H200\n", "\u202eH200", "H200\x00", "\u00a0A",
    "nvidia\u00a0h", "NVIDIA\u3000", "a" * 128, "a" * 129,
]  # fmt: skip


def _server_takes_gpu_name(name: str) -> bool:
    try:
        TypeAdapter(GpuName).validate_python(name)
    except ValidationError:
        return False
    return True


# JSON Schema's "$" (ECMA-262's) is the end of the string; Python's also matches before a
# final newline, so the closing "$" is read as "\Z" here.
_GPU_NAME_RE = re.compile(GPU_NAME_PATTERN.removesuffix("$") + r"\Z")


def _pattern_takes_gpu_name(name: str) -> bool:
    return 1 <= len(name) <= 128 and _GPU_NAME_RE.search(name) is not None


@pytest.mark.parametrize("name", GPU_NAMES)
def test_gpu_name_pattern_is_the_rule(name: str) -> None:
    """The published GPU-name schema (pattern and length) takes exactly the names the
    validator takes, "NVIDIA" alone (no key) included."""
    assert _pattern_takes_gpu_name(name) == _server_takes_gpu_name(name)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("NVIDIAnvidia0xZ -_.\t\n\u00a0\u200bé")), max_size=16))
def test_gpu_name_pattern_is_the_rule_on_random_names(name: str) -> None:
    assert _pattern_takes_gpu_name(name) == _server_takes_gpu_name(name)
