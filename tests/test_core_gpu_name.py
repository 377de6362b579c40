"""core.gpu_name: one GPU-name rule for the store, the service and the exported header's C++."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from core.gpu_name import normalize_gpu_name

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "db" / "data"


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA-H200", "h200"),  # matched in the header before; now in the store too
        ("h200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100 sxm4 80gb"),
        ("Tesla NVIDIA X", "tesla nvidia x"),
        ("nvidia nvidia h200", "nvidia h200"),
        ("NVIDIA", ""),
        ("NVIDIA H200 Überkarte", "h200 berkarte"),  # only ASCII counts, as in the C++
    ],
)
def test_rule(name: str, key: str) -> None:
    assert normalize_gpu_name(name) == key


def _old_store_rule(name: str) -> str:
    # db.store.normalize_gpu_name before the rules were merged: the keys stored in gpus.name_key.
    key = re.sub(r"\s+", " ", name.strip()).casefold()
    return re.sub(r"^nvidia\s+", "", key)


def test_shipped_gpu_names_keep_their_keys() -> None:
    files = sorted(SHIPPED.glob("*.json"))
    assert files, "no shipped results"
    for f in files:
        for gpu in json.loads(f.read_text())["gpus"]:
            name = gpu["name"]
            assert normalize_gpu_name(name) == _old_store_rule(name), name
            for query in (name, name.upper(), name.lower(), name.removeprefix("NVIDIA ")):
                assert normalize_gpu_name(query) == normalize_gpu_name(name)


def test_store_and_service_use_the_rule() -> None:
    import db.store
    import service.index

    assert db.store.normalize_gpu_name is normalize_gpu_name
    assert service.index.gpu_key("NVIDIA-H200") == "h200"
