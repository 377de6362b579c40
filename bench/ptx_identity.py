"""Prove a template change leaves the shipped kernels alone: PTX hashes per config, compared.

Compiles configs to PTX with the product's own nvcc flags for their target (``-cubin``
replaced by ``-ptx``, ``-Xptxas <arg>`` dropped, ``-I`` the template directory of the tree
that is imported), strips what only describes the source (``.loc``/``.file`` lines, the
``.debug_*`` sections they point into, any line naming a path) and records the sha256 of what
is left per config into a JSON manifest. Two manifests compare equal exactly when every config
compiles to the same instructions, data and symbols.

The configs (default: every shipped winner) are read from the results files with the
product's dump reader (:func:`db.dump_format.load_dump`): for every problem of every
``db/data/*.json`` the fastest measurement whose status is OK; its build's architecture is the
target. ``--all`` takes every measured (config, arch), ``--sample N`` a seeded sample of those,
``--config NAME`` (repeatable) names configs (their family's newest target unless ``--arch``).

It uses only APIs present both in the tree before the kernel refactor (commit 93a12fb) and
after it, so the "before" manifest is computed by putting the old tree on PYTHONPATH:

    PYTHONPATH=<old tree> python bench/ptx_identity.py --out bench/ptx/before.json
    PYTHONPATH=. python bench/ptx_identity.py --out after.json
    python bench/ptx_identity.py --compare bench/ptx/before.json after.json

``--compare`` prints every config that differs (or is missing on one side, or failed to
compile on either) and exits 1 if any does. ``--keep DIR`` writes the stripped PTX per config
for a diff.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("ptx_identity")

MANIFEST_FORMAT = "fa2tune-ptx-manifest"
#: The source file's name inside each config's temporary directory: fixed, because nvcc
#: derives internal symbol names from it.
SOURCE_NAME = "kernel.cu"
DEFAULT_DATA = Path(__file__).resolve().parent.parent / "db" / "data"

_DEBUG_DIRECTIVE = re.compile(r"^\s*\.(loc|file)\b")
_SECTION = re.compile(r"^\s*\.section\s+(\S+)")
# A quoted string with a slash, or an absolute path outside quotes: the source's location.
_PATH = re.compile(r'"[^"]*/[^"]*"|(?<![\w.])/(?:usr|tmp|home|work|opt|root)/')


@dataclass(frozen=True)
class Target:
    """One config to compile: its name and the architecture its build targets."""

    name: str
    arch: str


def strip_debug(ptx: str) -> str:
    """``ptx`` without source locations: ``.loc``/``.file`` lines, ``.debug_*`` sections
    (their braces included) and lines naming a path. Everything else is kept verbatim."""
    out: list[str] = []
    lines = ptx.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        section = _SECTION.match(line)
        if section and section.group(1).startswith(".debug"):
            # The section body is a brace block on the following lines: skip to its end.
            i += 1
            depth = 0
            while i < len(lines):
                depth += lines[i].count("{") - lines[i].count("}")
                i += 1
                if depth <= 0:
                    break
            continue
        if not _DEBUG_DIRECTIVE.match(line) and not _PATH.search(line):
            out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def ptx_flags(arch: str) -> list[str]:
    """The product's nvcc flags for ``arch`` with ``-cubin`` -> ``-ptx`` and no ``-Xptxas``."""
    from codegen.build import nvcc_flags

    flags: list[str] = []
    skip = False
    for flag in nvcc_flags(arch):
        if skip:
            skip = False
            continue
        if flag == "-Xptxas":
            skip = True
            continue
        flags.append("-ptx" if flag == "-cubin" else flag)
    return flags


def _fastest_ok(paths: Iterable[Path]) -> tuple[list[Target], list[Target]]:
    """(winners, every measured target) over the results files, both sorted and unique."""
    from db.dump_format import load_dump

    winners: set[Target] = set()
    everything: set[Target] = set()
    for path in paths:
        dump = load_dump(path)
        best: dict[Any, tuple[float, Target]] = {}
        for m in dump.measurements:
            target = Target(m.build.config_name, m.build.arch)
            everything.add(target)
            if str(m.status) != "OK" or m.median_ms is None:
                continue
            key = m.problem.key
            if key not in best or m.median_ms < best[key][0]:
                best[key] = (m.median_ms, target)
        winners.update(t for _, t in best.values())
    order = lambda t: (t.name, t.arch)  # noqa: E731
    return sorted(winners, key=order), sorted(everything, key=order)


def select_targets(args: argparse.Namespace) -> list[Target]:
    """The targets the command line asks for."""
    if args.config:
        from codegen.families import family_of
        from core.family import config_from_name

        return [
            Target(name, args.arch or family_of(config_from_name(name)).archs[0])
            for name in args.config
        ]
    files = sorted(Path(args.data).glob("*.json"))
    if not files:
        raise SystemExit(f"no results files (*.json) in {args.data}")
    winners, everything = _fastest_ok(files)
    if args.all or args.sample:
        if args.sample:
            rng = random.Random(args.seed)
            return sorted(
                rng.sample(everything, min(args.sample, len(everything))),
                key=lambda t: (t.name, t.arch),
            )
        return everything
    return winners


def compile_one(target: Target, nvcc: str, keep: Path | None) -> dict[str, Any]:
    """Render, compile and hash one target; a failure is recorded, never raised."""
    from codegen.families import family_of
    from codegen.render import template_dir
    from core.family import config_from_name

    config = config_from_name(target.name)
    text = family_of(config).render(config)
    with tempfile.TemporaryDirectory(prefix="ptx-") as tmp:
        work = Path(tmp)
        (work / SOURCE_NAME).write_text(text, encoding="utf-8")
        command = [
            nvcc,
            *ptx_flags(target.arch),
            "-I",
            str(template_dir().resolve()),
            "-o",
            "kernel.ptx",
            SOURCE_NAME,
        ]
        proc = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
        ptx_path = work / "kernel.ptx"
        if proc.returncode != 0 or not ptx_path.is_file():
            message = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            return {"arch": target.arch, "sha256": None, "error": "\n".join(message)}
        stripped = strip_debug(ptx_path.read_text(encoding="utf-8"))
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{target.name}.{target.arch}.ptx").write_text(stripped, encoding="utf-8")
    digest = hashlib.sha256(stripped.encode()).hexdigest()
    return {"arch": target.arch, "sha256": digest, "lines": stripped.count("\n")}


def build_manifest(targets: Sequence[Target], nvcc: str, jobs: int, keep: Path | None) -> dict:
    """Compile ``targets`` with ``jobs`` parallel nvcc runs; the manifest as a dict."""
    from codegen.build import nvcc_version

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda t: compile_one(t, nvcc, keep), targets))
    seconds = time.perf_counter() - start
    names = [t.name for t in targets]
    keys = [t.name if names.count(t.name) == 1 else f"{t.name}@{t.arch}" for t in targets]
    configs = dict(zip(keys, results, strict=True))
    failed = [k for k, r in configs.items() if r["sha256"] is None]
    log.info("%d configs in %.1f s with -j %d, %d failed", len(configs), seconds, jobs, len(failed))
    for key in failed:
        log.warning("%s: %s", key, configs[key]["error"])
    return {
        "format": MANIFEST_FORMAT,
        "nvcc": nvcc_version(nvcc),
        "flags": {arch: ptx_flags(arch) for arch in sorted({t.arch for t in targets})},
        "seconds": round(seconds, 1),
        "configs": dict(sorted(configs.items())),
    }


def compare(a_path: Path, b_path: Path, out: Any = sys.stdout) -> int:
    """Print every config whose PTX differs between two manifests; 1 if any, else 0."""
    a = json.loads(a_path.read_text(encoding="utf-8"))["configs"]
    b = json.loads(b_path.read_text(encoding="utf-8"))["configs"]
    differing = 0
    common = set(a) & set(b)
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if left is None or right is None:
            side = a_path.name if left is None else b_path.name
            out.write(f"MISSING {key}: not in {side}\n")
        elif left["sha256"] is None or right["sha256"] is None:
            out.write(f"FAILED  {key}: did not compile in one manifest\n")
        elif left["sha256"] != right["sha256"] or left["arch"] != right["arch"]:
            out.write(f"DIFFER  {key} ({left['arch']})\n")
        else:
            continue
        differing += 1
    identical = sum(a[k]["sha256"] is not None and a[k]["sha256"] == b[k]["sha256"] for k in common)
    out.write(f"{len(common)} configs compared, {identical} identical, {differing} differing\n")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="the manifest to write")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="results files folder")
    parser.add_argument("--all", action="store_true", help="every measured config")
    parser.add_argument("--sample", type=int, default=0, help="a seeded sample of --all")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--config", action="append", default=[], help="a config name")
    parser.add_argument("--arch", help="target for --config (default the family's newest)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--nvcc", default=os.environ.get("FA2TUNE_NVCC", "nvcc"))
    parser.add_argument("--keep", type=Path, help="write the stripped PTX here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        parser.error("--out is required (or --compare A B)")
    manifest = build_manifest(select_targets(args), args.nvcc, max(1, args.jobs), args.keep)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return 1 if any(r["sha256"] is None for r in manifest["configs"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
