"""Workload files (tuner.workload): parsing YAML and JSON, defaults, one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from core.problem import Problem
from core.shape import MAX_DIM, Shape
from tuner.workload import Target, WorkloadError, load_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "workloads"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _entries_json(tmp_path: Path, *entries: dict[str, object]) -> Path:
    return _write(tmp_path, "w.json", json.dumps(list(entries)))


def test_yaml_mapping_with_name_and_lists(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "model.yaml",
        """
name: tiny
shapes:
  - label: decode
    d: 128
    heads: 32
    kv_heads: 8
    batch: [1, 8]
    nq: 1
    nk: [1024, 8192]
  - {d: 64, heads: 16, n: [512, 1024], causal: true, dtype: bf16}
""",
    )
    workload = load_workload(path)
    assert workload.name == "tiny" and workload.path == path
    decode = [t for t in workload.targets if t.d == 128]
    assert [(t.shape.batch, t.shape.nq, t.shape.nk) for t in decode] == [
        (1, 1, 1024), (1, 1, 8192), (8, 1, 1024), (8, 1, 8192),
    ]  # fmt: skip
    assert {(t.shape.heads, t.shape.kv_heads, t.label) for t in decode} == {(32, 8, "decode")}
    square = [t for t in workload.targets if t.d == 64]
    assert [(t.shape.nq, t.shape.nk, t.dtype, t.causal) for t in square] == [
        (512, 512, "bf16", True), (1024, 1024, "bf16", True),
    ]  # fmt: skip


def test_json_list_and_defaults(tmp_path: Path) -> None:
    path = _entries_json(tmp_path, {"d": 64, "heads": 8, "n": 256})
    workload = load_workload(path)
    assert workload.name is None
    (target,) = workload.targets
    assert target == Target(d=64, dtype="fp16", causal=False, shape=Shape(256, 256, 1, 8, 8))
    assert target.label == "entry 1"


@pytest.mark.parametrize("d", [8, 40, 80, 160, 192, 256])
def test_any_multiple_of_8_is_a_head_dim(tmp_path: Path, d: int) -> None:
    (target,) = load_workload(_entries_json(tmp_path, {"d": d, "heads": 8, "n": 256})).targets
    assert target.d == d


def test_nq_without_nk_is_square(tmp_path: Path) -> None:
    (target,) = load_workload(_entries_json(tmp_path, {"d": 64, "heads": 8, "nq": 300})).targets
    assert (target.shape.nq, target.shape.nk) == (300, 300)


def test_both_expands_dtype_and_mask(tmp_path: Path) -> None:
    path = _entries_json(
        tmp_path, {"d": 64, "heads": 8, "n": 256, "dtype": "both", "causal": "both"}
    )
    assert [(t.dtype, t.causal) for t in load_workload(path).targets] == [
        ("fp16", False), ("fp16", True), ("bf16", False), ("bf16", True),
    ]  # fmt: skip


def test_duplicates_are_tuned_once(tmp_path: Path) -> None:
    path = _entries_json(
        tmp_path,
        {"d": 64, "heads": 8, "n": [256, 512], "label": "a"},
        {"d": 64, "heads": 8, "nq": 512, "nk": 512, "kv_heads": 8, "label": "b"},
    )
    targets = load_workload(path).targets
    assert [(t.shape.nq, t.label) for t in targets] == [(256, "a"), (512, "a")]


def test_problems_keep_the_old_study_names(tmp_path: Path) -> None:
    """nk and kv_heads stay None when they equal n and heads: square, non-GQA problems are the
    ones (and the studies) the campaign always had."""
    path = _entries_json(
        tmp_path,
        {"d": 64, "heads": 16, "n": 512, "batch": 2},
        {"d": 128, "heads": 32, "kv_heads": 8, "nq": 1, "nk": 4096},
    )
    square, decode = (t.problem("NVIDIA H200") for t in load_workload(path).targets)
    assert square == Problem(gpu="NVIDIA H200", d=64, n=512, batch=2, heads=16)
    assert square.study_name == "nvidia-h200_d64_n512_b2_h16_fp16_full"
    assert (decode.nk, decode.kv_heads) == (4096, 8)
    assert decode.study_name == "nvidia-h200_d128_n1_nk4096_b1_h32_kv8_fp16_full"
    assert load_workload(path).targets[1].matches(decode)
    assert not load_workload(path).targets[0].matches(decode)


_OK = {"d": 64, "heads": 8, "n": 1}
_TOO_BIG = f"field 'n': must be between 1 and {MAX_DIM}, got {MAX_DIM + 1}"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**_OK, "heads": "8"}, "entry 1: field 'heads': Input should be a valid integer"),
        ({**_OK, "d": 65}, "entry 1: field 'd': must be a multiple of 8 from 8 to 256, got 65"),
        ({**_OK, "d": 264}, "entry 1: field 'd': must be a multiple of 8 from 8 to 256, got 264"),
        ({**_OK, "dtype": "fp32"}, "field 'dtype': Input should be"),
        ({**_OK, "causal": "maybe"}, "field 'causal': must be true, false or 'both'"),
        (
            {**_OK, "heads": 12, "kv_heads": 8},
            "field 'kv_heads': heads (12) must be a multiple of kv_heads (8)",
        ),
        ({**_OK, "n": 0}, "field 'n': must be between 1 and 2147483647, got 0"),
        ({**_OK, "n": MAX_DIM + 1}, _TOO_BIG),
        ({"d": 64, "heads": 8, "nq": 1, "nk": [4, 0]}, "field 'nk': must be between 1"),
        ({**_OK, "heads": 0}, "field 'heads': must be between 1"),
        ({**_OK, "kv_heads": 0}, "field 'kv_heads': must be between 1"),
        ({**_OK, "batch": 0}, "field 'batch': must be between 1"),
        ({**_OK, "batch": 99999999999}, "field 'batch': must be between"),
        ({"d": 64, "heads": 8, "seqlens": [100, 0]}, "field 'seqlens': must be between 1"),
        ({"d": 64, "heads": 8, "seqlens": []}, "field 'seqlens': must be a list of lengths"),
        ({"d": 64, "heads": 8, "seqlens": [[5], "x"]}, "field 'seqlens': must be a list"),
        ({"d": 64, "heads": 8, "seqlens": [5, 2.5]}, "field 'seqlens': lengths must be integers"),
        ({**_OK, "seqlens": [5, 6]}, "field 'seqlens': give seqlens or lengths"),
        ({"d": 64, "heads": 8, "batch": 2, "seqlens": [5, 6]}, "field 'batch': a seqlens entry"),
        ({**_OK, "windw": 128}, "entry 1: unknown field 'windw'"),
        ({"d": 64, "heads": 8}, "field 'n': needs n, or nq"),
        ({"d": 64, "heads": 8, "nk": 5}, "field 'nk': needs n, or nq"),
        ({**_OK, "nq": 4}, "field 'n': give either n (Nq = Nk) or nq"),
        ({"heads": 8, "n": 4}, "entry 1: field 'd' is required"),
        ({**_OK, "n": []}, "field 'n': must not be an empty list"),
        ({**_OK, "n": True}, "field 'n': Input should be a valid integer"),
    ],
)
def test_entry_errors_name_file_entry_and_field(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    path = _entries_json(
        tmp_path, {"d": 64, "heads": 8, "n": 1}, {"d": 64, "heads": 8, "n": 2}, entry
    )
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: entry 3: ")
    assert message.replace("entry 1", "entry 3") in text


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("w.txt", "[]", "unknown extension '.txt'; use .yaml, .yml, .json"),
        ("w", "[]", "unknown extension '(none)'"),
        ("w.json", "{", "not valid JSON"),
        ("w.yaml", "- [", "not valid YAML at line"),
        ("w.yaml", "42", "expected a list of entries or a mapping with 'shapes:'"),
        ("w.yaml", "[]", "no entries"),
        ("w.yaml", "shapes: []", "no entries"),
        ("w.yaml", "name: x", "'shapes': Field required"),
        ("w.yaml", "shapes: [{d: 64, heads: 8, n: 1}]\nmodel: x", "'model': unknown key"),
        ("w.yml", "- 5", "entry 1: expected a mapping, got 5"),
    ],
)
def test_file_errors(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(WorkloadError, match=r"nope\.yaml: cannot read"):
        load_workload(path)


def test_json_is_read_without_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """yaml is imported only for YAML files."""
    monkeypatch.setitem(sys.modules, "yaml", None)  # an import of yaml now fails
    assert load_workload(_entries_json(tmp_path, {"d": 64, "heads": 8, "n": 1})).targets


def test_shipped_examples_parse() -> None:
    llama = load_workload(EXAMPLES / "llama3_8b.yaml")
    assert llama.name == "llama3-8b"
    decode = [t for t in llama.targets if t.shape.nq == 1]
    prefill = [t for t in llama.targets if t.shape.nq > 1]
    assert len(decode) == 12 and len(prefill) == 25
    assert {t.shape.nk for t in decode} == {1024, 8192, 32768, 131072}
    assert {t.shape.batch for t in decode} == {1, 8, 64}
    assert not any(t.causal for t in decode) and all(t.causal for t in prefill)
    assert {t.shape.nq for t in prefill} == {512, 1024, 2048, 4096, 8192}
    assert all((t.d, t.shape.heads, t.shape.kv_heads) == (128, 32, 8) for t in llama.targets)
    smoke = load_workload(EXAMPLES / "smoke.yaml")
    assert 1 <= len(smoke.targets) <= 4


def test_seqlens_entries_are_varlen_problems(tmp_path: Path) -> None:
    path = _entries_json(
        tmp_path,
        {"d": 128, "heads": 32, "kv_heads": 8, "causal": "both", "seqlens": [100, 4000, 7]},
        {"d": 64, "heads": 8, "seqlens": [[1, 2], [3]]},
    )
    targets = load_workload(path).targets
    problems = [t.problem("NVIDIA H200") for t in targets]
    assert [p.seqlens for p in problems] == [(100, 4000, 7), (100, 4000, 7), (1, 2), (3,)]
    first = problems[0]
    assert (first.n, first.batch, first.nk, first.kv_heads, first.causal) == (
        4000,
        3,
        None,
        8,
        False,
    )
    assert first.flops == sum(4.0 * 32 * n * n * 128 for n in (100, 4000, 7))
    assert problems[1].flops == first.flops / 2 and problems[1].causal
    assert "_vl" in first.study_name and first.study_name != problems[2].study_name
    assert all(t.matches(p) for t, p in zip(targets, problems, strict=True))
    dense = Problem(gpu="NVIDIA H200", d=64, n=2, batch=2, heads=8)
    assert not targets[2].matches(dense)
    assert "varlen 2 sequences of 1-2 (3 tokens)" in targets[2].describe()


@pytest.mark.parametrize(
    ("name", "count"),
    [("decode_workload.yaml", 24), ("varlen_workload.yaml", 4), ("prefill_gqa_workload.yaml", 24)],
)
def test_device_run_workloads_load(name: str, count: int) -> None:
    """The workload files the H200 campaigns use (bench/h200/) parse to their problems."""
    path = Path(__file__).resolve().parents[2] / "bench" / "h200" / name
    workload = load_workload(path)
    assert len(workload.targets) == count
    assert {t.d for t in workload.targets} == {128}
    assert all(t.shape.heads == 32 and t.shape.kv_heads == 8 for t in workload.targets)


def test_shipped_variant_workloads_ask_their_models_variants() -> None:
    """The variants' model workloads (issue 23): each problem carries its model's variant,
    normalised (a window or chunk past every key would have made it plain; a decode step is
    unmasked, its window only a left bound)."""
    from core.variant import Variant

    def variants(name: str) -> set[Variant]:
        return {t.variant for t in load_workload(EXAMPLES / name).targets}

    assert variants("mistral_7b.yaml") == {Variant(4096, 0), Variant(4096, -1)}
    assert variants("gemma2_9b.yaml") == {Variant(softcap=50.0), Variant(4096, 0, softcap=50.0)}
    assert variants("gpt_oss_20b.yaml") == {
        Variant(sinks=True),
        Variant(128, 0, sinks=True),
        Variant(128, -1, sinks=True),
    }
    llama4 = load_workload(EXAMPLES / "llama4_scout.yaml").targets
    assert {t.variant for t in llama4} == {Variant(-1, 0, 8192), Variant(chunk=8192), Variant()}
    assert all((t.d, t.shape.heads, t.shape.kv_heads) == (128, 40, 8) for t in llama4)
    for target in (t for name in EXAMPLES.glob("*.yaml") for t in load_workload(name).targets):
        decode = target.shape.nq == 1
        assert not (decode and target.causal), target.describe()  # one rule: decode unmasked
        assert target.variant.window_right == (-1 if decode or not target.causal else 0) or (
            target.variant.window_left < 0 and target.variant.chunk == 0
        ), target.describe()
