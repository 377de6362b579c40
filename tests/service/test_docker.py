"""Lint docker/ without a Docker engine: compose parses and is consistent, Dockerfiles are
well-formed, and every COPY source exists in the build context (and is not .dockerignored)."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"

INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip
JSON_FORM = {"CMD", "ENTRYPOINT", "SHELL", "VOLUME", "RUN", "HEALTHCHECK"}


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    start = 0
    for no, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are ignored by Docker
        if not pending:
            start = no
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, args = text.partition(" ")
        out.append(Instruction(start, keyword, args.strip()))
    assert not pending, f"{path.name}: dangling line continuation at the end"
    return out


def json_args(inst: Instruction) -> list[str] | None:
    """The exec-form array of an instruction, None for shell form."""
    args = inst.args
    if inst.keyword == "HEALTHCHECK":
        m = re.search(r"\bCMD\s+(.*)$", args)
        assert m, f"line {inst.line}: HEALTHCHECK without CMD"
        args = m.group(1)
    if not args.startswith("["):
        return None
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), inst
    return value


def dockerignore_patterns() -> list[str]:
    path = ROOT / ".dockerignore"
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes ``rel`` (the last matching pattern wins, ``!`` negates)."""
    hit = False
    for raw in patterns:
        negate = raw.startswith("!")
        pat = raw.removeprefix("!").rstrip("/")
        # A pattern that matches a parent directory excludes everything below it.
        if any(
            fnmatch.fnmatch(prefix, pat) or fnmatch.fnmatch(prefix, pat.removeprefix("**/"))
            for prefix in _prefixes(rel)
        ):
            hit = not negate
    return hit


def _prefixes(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))


def test_dockerfiles_exist() -> None:
    names = {p.name for p in DOCKERFILES}
    assert {"service.Dockerfile", "tuner.Dockerfile"} <= names


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_well_formed(path: Path) -> None:
    insts = parse_dockerfile(path)
    assert insts, f"{path.name} is empty"
    # Only ARGs may precede the first FROM.
    first_from = next(i for i, inst in enumerate(insts) if inst.keyword == "FROM")
    assert all(inst.keyword == "ARG" for inst in insts[:first_from])
    for inst in insts:
        assert inst.keyword in INSTRUCTIONS, f"{path.name}:{inst.line}: {inst.keyword!r}"
        assert inst.keyword == inst.keyword.upper()
        assert inst.args, f"{path.name}:{inst.line}: {inst.keyword} without arguments"
        if inst.keyword in JSON_FORM and inst.args.lstrip().startswith("["):
            json_args(inst)  # raises on malformed JSON
        if inst.keyword == "HEALTHCHECK":
            json_args(inst)
    # Exactly one final CMD/ENTRYPOINT each at most (Docker keeps only the last).
    assert sum(inst.keyword == "ENTRYPOINT" for inst in insts) <= 1
    assert sum(inst.keyword == "CMD" for inst in insts) <= 1


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_are_not_ignored(path: Path) -> None:
    patterns = dockerignore_patterns()
    for inst in parse_dockerfile(path):
        if inst.keyword not in ("COPY", "ADD"):
            continue
        words = [w for w in inst.args.split() if not w.startswith("--")]
        assert len(words) >= 2, f"{path.name}:{inst.line}: COPY needs source(s) and a destination"
        if any(w.startswith("--from") for w in inst.args.split()):
            continue  # copies from another stage, not the context
        for src in words[:-1]:
            assert (ROOT / src).exists(), f"{path.name}:{inst.line}: {src} not in the context"
            assert not ignored(src.rstrip("/"), patterns), f"{src} is excluded by .dockerignore"


def test_service_dockerfile_contract() -> None:
    insts = parse_dockerfile(DOCKER / "service.Dockerfile")
    by = {inst.keyword: inst for inst in insts}
    assert by["FROM"].args.startswith("python:3.12-slim")
    run = " ".join(inst.args for inst in insts if inst.keyword == "RUN")
    assert "pip install" in run and "gpu" not in run, "the service installs no gpu extra"
    user = [inst.args for inst in insts if inst.keyword == "USER"]
    assert user and user[-1] not in ("root", "0"), "the service must not run as root"
    assert "/healthz" in by["HEALTHCHECK"].args
    command = (json_args(by["ENTRYPOINT"]) or []) + (json_args(by["CMD"]) or [])
    assert command[:2] == ["fa2tune", "serve"] and "0.0.0.0" in command


def test_tuner_dockerfile_contract() -> None:
    insts = parse_dockerfile(DOCKER / "tuner.Dockerfile")
    froms = [inst.args for inst in insts if inst.keyword == "FROM"]
    assert froms and froms[0].startswith("nvidia/cuda:") and "devel" in froms[0]
    cuda = next(
        inst.args for inst in insts if inst.keyword == "ARG" and "CUDA_VERSION" in inst.args
    )
    assert re.search(r"CUDA_VERSION=1[23]\.\d+", cuda), "CUDA 12.x or 13.x"
    run = " ".join(inst.args for inst in insts if inst.keyword == "RUN")
    assert ".[gpu,postgres]" in run, "the tuner installs the gpu extra and psycopg"
    entry = next(inst for inst in insts if inst.keyword == "ENTRYPOINT")
    assert json_args(entry) == ["fa2tune", "tune"]


def test_compose_parses_and_references_dockerfiles() -> None:
    data = compose()
    services = data["services"]
    assert {"postgres", "service"} <= set(services)
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        if "build" in svc:
            build = svc["build"]
            context = (COMPOSE.parent / build["context"]).resolve()
            assert context == ROOT, f"{name}: the build context must be the repository root"
            assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']}"
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in (data.get("volumes") or {}), f"{name}: undeclared volume {source}"


def test_compose_tuner_per_gpu_and_shared_database() -> None:
    services = compose()["services"]
    tuners = {name: svc for name, svc in services.items() if name.startswith("tuner")}
    assert tuners, "at least one tuner worker"
    device_ids: list[str] = []
    for name, svc in tuners.items():
        assert svc["build"]["dockerfile"] == "docker/tuner.Dockerfile"
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1 and devices[0]["driver"] == "nvidia", name
        assert "gpu" in devices[0]["capabilities"]
        ids = devices[0]["device_ids"]
        assert len(ids) == 1, f"{name}: one GPU per worker"
        device_ids += ids
    assert len(device_ids) == len(set(device_ids)), "two workers share a GPU"
    for name in [*tuners, "service"]:
        url = services[name]["environment"]["FA2TUNE_DB_URL"]
        assert url.startswith("postgresql") and "@postgres:" in url, name
        assert "postgres" in services[name]["depends_on"]


def test_dockerignore_keeps_context_small() -> None:
    patterns = dockerignore_patterns()
    for heavy in (".git", ".venv", "fa2tune.db", "x/__pycache__"):
        assert ignored(heavy, patterns), heavy
    for needed in ("pyproject.toml", "README.md", "fa2tune", "service", "db", "codegen"):
        assert not ignored(needed, patterns), needed
