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
compile on either) and exits 1 if any does. ``--family NAME`` keeps one family's configs;
``--keep DIR`` writes the stripped PTX per config for a diff.
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


def _product_flags(arch: str) -> list[str]:
    """The product's nvcc flags for ``arch`` without ``-Xptxas <arg>`` (ptxas's report)."""
    from codegen.build import nvcc_flags

    flags: list[str] = []
    skip = False
    for flag in nvcc_flags(arch):
        if skip:
            skip = False
        elif flag == "-Xptxas":
            skip = True
        else:
            flags.append(flag)
    return flags


def ptx_flags(arch: str) -> list[str]:
    """The product's nvcc flags for ``arch`` with ``-cubin`` -> ``-ptx`` and no ``-Xptxas``."""
    return ["-ptx" if flag == "-cubin" else flag for flag in _product_flags(arch)]


def cubin_flags(arch: str) -> list[str]:
    """The product's flags for ``arch`` without ``-Xptxas`` and ``-lineinfo``: the cubin's line
    table names source lines, which move with any edit; the machine code does not."""
    return [flag for flag in _product_flags(arch) if flag != "-lineinfo"]


#: Cubin sections that only name things (symbols, section names): left out of ``code_sha256``.
_NAME_SECTIONS = frozenset((b".symtab", b".strtab", b".shstrtab"))


def code_hash(cubin: bytes) -> str:
    """sha256 over a cubin's sections (name and bytes, in file order) other than the symbol
    and string tables: the machine code, constants and relocations without the names.

    Two cubins with equal code hashes run the same instructions; they may differ in the name
    of a symbol (a renamed parameter type changes the mangled name of a function-local
    ``__shared__`` variable, not the code that uses it). A minimal ELF64 little-endian reader:
    cubins are nothing else.
    """
    import struct

    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [
        struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)
    ]
    names_at = headers[shstrndx][4]
    digest = hashlib.sha256()
    for name_off, kind, _flags, _addr, offset, size, *_ in headers:
        end = cubin.index(b"\0", names_at + name_off)
        name = cubin[names_at + name_off : end]
        if name in _NAME_SECTIONS or kind == 8:  # SHT_NOBITS: no bytes in the file
            continue
        digest.update(len(name).to_bytes(8, "little") + name)
        digest.update(size.to_bytes(8, "little") + cubin[offset : offset + size])
    return digest.hexdigest()


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

        def h200_target(name: str) -> str:  # the manifests' machine: an sm_90 GPU
            fam = family_of(config_from_name(name))
            return fam.arch_for("9.0") or fam.archs[0]

        return [Target(name, args.arch or h200_target(name)) for name in args.config]
    files = sorted(Path(args.data).glob("*.json"))
    if not files:
        raise SystemExit(f"no results files (*.json) in {args.data}")
    winners, everything = _fastest_ok(files)
    chosen = everything if (args.all or args.sample) else winners
    if args.family:
        chosen = [t for t in chosen if t.name.split("_", 1)[0] in args.family]
    if args.sample:
        rng = random.Random(args.seed)
        chosen = sorted(
            rng.sample(chosen, min(args.sample, len(chosen))), key=lambda t: (t.name, t.arch)
        )
    return chosen


def _nvcc(command: list[str], work: Path, output: str) -> tuple[bytes | None, str]:
    """Run one nvcc command in ``work``; (the output file's bytes or None, error text)."""
    proc = subprocess.run(command, cwd=work, capture_output=True, text=True, check=False)
    path = work / output
    if proc.returncode != 0 or not path.is_file():
        return None, "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
    return path.read_bytes(), ""


def compile_one(target: Target, nvcc: str, keep: Path | None, cubin: bool) -> dict[str, Any]:
    """Render, compile and hash one target; a failure is recorded, never raised.

    The entry: ``arch``, ``sha256`` of the stripped PTX (None when nvcc failed, with
    ``error``), ``lines``, and with ``cubin`` also ``cubin_sha256``: the cubin ptxas makes of
    it for the target (:func:`cubin_flags`), byte for byte.
    """
    from codegen.families import family_of
    from codegen.render import template_dir
    from core.family import config_from_name

    config = config_from_name(target.name)
    text = family_of(config).render(config)
    include = ["-I", str(template_dir().resolve())]
    entry: dict[str, Any] = {"arch": target.arch}
    with tempfile.TemporaryDirectory(prefix="ptx-") as tmp:
        work = Path(tmp)
        (work / SOURCE_NAME).write_text(text, encoding="utf-8")
        flags = ptx_flags(target.arch)
        ptx, error = _nvcc([nvcc, *flags, *include, "-o", "k.ptx", SOURCE_NAME], work, "k.ptx")
        if ptx is None:
            return {**entry, "sha256": None, "error": error}
        stripped = strip_debug(ptx.decode("utf-8"))
        entry["sha256"] = hashlib.sha256(stripped.encode()).hexdigest()
        entry["lines"] = stripped.count("\n")
        if cubin:
            flags = cubin_flags(target.arch)
            data, error = _nvcc(
                [nvcc, *flags, *include, "-o", "k.cubin", SOURCE_NAME], work, "k.cubin"
            )
            entry["cubin_sha256"] = hashlib.sha256(data).hexdigest() if data else None
            entry["code_sha256"] = code_hash(data) if data else None
            if data is None:
                entry["error"] = error
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{target.name}.{target.arch}.ptx").write_text(stripped, encoding="utf-8")
    return entry


def build_manifest(
    targets: Sequence[Target], nvcc: str, jobs: int, keep: Path | None, cubin: bool = False
) -> dict[str, Any]:
    """Compile ``targets`` with ``jobs`` parallel nvcc runs; the manifest as a dict."""
    from codegen.build import nvcc_version

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda t: compile_one(t, nvcc, keep, cubin), targets))
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
        "cubin_flags": (
            {arch: cubin_flags(arch) for arch in sorted({t.arch for t in targets})}
            if cubin
            else None
        ),
        "seconds": round(seconds, 1),
        "configs": dict(sorted(configs.items())),
    }


def compare(a_path: Path, b_path: Path, level: str = "ptx", out: Any = sys.stdout) -> int:
    """Print every config whose PTX differs between two manifests (and whether its cubin does,
    where both have cubin hashes); 1 if any differs at ``level`` ("ptx" or "cubin"), else 0.

    A config in one manifest only, or one that failed to compile in either, counts as
    differing at both levels.
    """
    a = json.loads(a_path.read_text(encoding="utf-8"))["configs"]
    b = json.loads(b_path.read_text(encoding="utf-8"))["configs"]
    common = set(a) & set(b)
    ptx_same = cubin_same = code_same = 0
    bad = 0
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if left is None or right is None:
            out.write(f"MISSING {key}: not in {a_path.name if left is None else b_path.name}\n")
            bad += 1
            continue
        if left["sha256"] is None or right["sha256"] is None:
            out.write(f"FAILED  {key}: did not compile in one manifest\n")
            bad += 1
            continue
        same = left["sha256"] == right["sha256"] and left["arch"] == right["arch"]
        lc, rc = left.get("cubin_sha256"), right.get("cubin_sha256")
        cubin = None if lc is None or rc is None else lc == rc
        lk, rk = left.get("code_sha256"), right.get("code_sha256")
        code = None if lk is None or rk is None else lk == rk
        ptx_same += same
        cubin_same += bool(cubin)
        code_same += bool(code)
        if not same:
            status = {None: "no cubin hashes", True: "cubin identical", False: "cubin DIFFERS"}
            tail = {None: "", True: ", code identical", False: ", code DIFFERS"}[code]
            out.write(f"DIFFER  {key} ({left['arch']}): PTX differs, {status[cubin]}{tail}\n")
        if (
            (level == "ptx" and not same)
            or (level == "cubin" and not cubin)
            or (level == "code" and not code)
        ):
            bad += 1
    out.write(
        f"{len(common)} configs compared: PTX identical {ptx_same}, cubin identical "
        f"{cubin_same}, code identical {code_same}; {len(set(a) ^ set(b))} in one manifest "
        "only\n"
    )
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="the manifest to write")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="results files folder")
    parser.add_argument("--all", action="store_true", help="every measured config")
    parser.add_argument("--sample", type=int, default=0, help="a seeded sample of --all")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--config", action="append", default=[], help="a config name")
    parser.add_argument(
        "--family", action="append", default=[], help="only this family's configs (repeatable)"
    )
    parser.add_argument(
        "--arch", help="target for --config (default: the family's target on an sm_90 GPU)"
    )
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--nvcc", default=os.environ.get("FA2TUNE_NVCC", "nvcc"))
    parser.add_argument("--keep", type=Path, help="write the stripped PTX here")
    parser.add_argument(
        "--cubin", action="store_true", help="also hash each config's cubin (ptxas's output)"
    )
    parser.add_argument(
        "--level",
        choices=("ptx", "cubin", "code"),
        default="ptx",
        help="--compare: what must be identical (default ptx; cubin: the whole cubin; code: "
        "the cubin but for its symbol and string tables)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.compare:
        return compare(*args.compare, level=args.level)
    if args.out is None:
        parser.error("--out is required (or --compare A B)")
    manifest = build_manifest(
        select_targets(args), args.nvcc, max(1, args.jobs), args.keep, args.cubin
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    failed = any(r["sha256"] is None or "error" in r for r in manifest["configs"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
