"""Every measurement source the docs cite is in the repo, and every section of README.md and
docs/*.md that quotes a timed figure names one (issue 26, item 5).

A cited source is a path under ``docs/measurements/`` or ``docs/performance/`` written in
README.md or docs/*.md, with or without the leading ``docs/`` (the docs write both
``docs/measurements/...`` and ``measurements/...``), or under ``bench/hopper/results/`` (the
raw output of the fa3 kernel's first two H200 runs, docs/fa3_kernel.md). Brace groups
(``{fp16,bf16}``) are expanded and ``*`` / ``?`` are globbed; each expansion must match at
least one file or folder.

A section is a ``## `` heading with everything up to the next one (its ``### `` subsections
included), and the text before a file's first ``## `` heading is one more. A timed figure is a
number followed by µs, ms, TFLOP/s, TB/s, GB/s, tok/s or req/s (``p90 ms`` is not one: the
number must not be part of a word). A section that quotes one passes when it cites a source
as above; a measured figure whose raw output is not in the repo is removed, not annotated.

A figure that is not a measurement of this project (a datasheet rate, a paper's number, an
arithmetic bound) needs no source when it stands inside a parenthesis opened by
``(not measured here:``, which names where it comes from; only the figures inside that
parenthesis are exempt, not the rest of the section.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# A path starts at ``measurements/`` or ``performance/`` (optionally after ``docs/``), or at
# ``bench/hopper/results/``, and runs until whitespace, a backtick, a quote or a closing
# bracket. Trailing sentence punctuation is stripped afterwards. ``performance/`` paths count
# only with a data-file suffix.
_PATH = re.compile(
    r"(?<![\w./-])(?:(?:docs/)?(measurements|performance)/|bench/hopper/results/)"
    r"[^\s`'\"()\[\]<>|]*"
)
_PERF_SUFFIX = re.compile(r"\.(?:json|png|md|log)$")
_BRACE = re.compile(r"\{([^{}]*)\}")
_FOLDERS = ("docs/measurements", "docs/performance", "bench/hopper/results")

_UNIT_FIGURE = re.compile(r"(?<![\w.])\d[\d.,]*\s*(?:µs|ms|TFLOP/s|TB/s|GB/s|tok/s|req/s)(?![\w/])")
_SOURCE = re.compile(r"(?:docs/)?(?:measurements|performance)/\S|bench/hopper/results/\S")
# "(not measured here: ...)", with at most one level of parentheses inside
_NOT_MEASURED = re.compile(r"\(not measured here:[^()]*(?:\([^()]*\)[^()]*)*\)")


def doc_files() -> list[Path]:
    """README.md and every docs/*.md."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def expand_braces(text: str) -> list[str]:
    """``a{b,c}d{e,f}`` -> ``abde, abdf, acde, acdf`` (no nesting, as the docs write them)."""
    parts = _BRACE.split(text)
    # split() alternates literal text and the inside of a brace group
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def cited_paths(text: str) -> list[str]:
    """The source paths cited in ``text``, relative to the repo root, braces unexpanded."""
    found: list[str] = []
    for m in _PATH.finditer(text):
        path = m.group(0).rstrip(".,:;…")
        if m.group(1):  # measurements/ or performance/, with or without docs/
            path = "docs/" + path.removeprefix("docs/")
        if m.group(1) == "performance" and not _PERF_SUFFIX.search(path):
            continue
        if path.rstrip("/") in _FOLDERS:
            continue  # the folder itself, e.g. a path broken over two lines
        found.append(path)
    return found


def missing(path: str) -> list[str]:
    """The expansions of ``path`` (relative to the repo root) that match nothing in the repo."""
    absent = []
    for one in expand_braces(path):
        if any(ch in one for ch in "*?"):
            if not any(ROOT.glob(one.rstrip("/"))):
                absent.append(one)
        elif not (ROOT / one).exists():
            absent.append(one)
    return absent


def all_citations() -> list[tuple[str, str]]:
    """(file name, cited path) for every citation in the docs, each pair once."""
    seen: dict[tuple[str, str], None] = {}
    for f in doc_files():
        for path in cited_paths(f.read_text(encoding="utf-8")):
            seen[(f.relative_to(ROOT).as_posix(), path)] = None
    return list(seen)


CITATIONS = all_citations()


def test_docs_cite_measurements() -> None:
    # The extractor must see the docs' citations at all (a broken pattern passes vacuously).
    assert len(CITATIONS) > 50
    cited = {p for _, p in CITATIONS}
    assert "docs/measurements/2026-11-30-splitkv-decode-bench.{md,json}" in cited
    assert "docs/performance/compare_sdpa_families_2026-11-30.json" in cited
    assert "bench/hopper/results/2026-11-30-run{1,2}/" in cited


@pytest.mark.parametrize(("doc", "path"), CITATIONS, ids=[f"{d}:{p}" for d, p in CITATIONS])
def test_cited_source_exists(doc: str, path: str) -> None:
    absent = missing(path)
    assert not absent, f"{doc} cites {path}, but these are not in the repo: {absent}"


def test_checker_reports_missing_files() -> None:
    text = (
        "raw: docs/measurements/1999-01-01-nowhere/run.{json,log}; "
        "`measurements/2026-11-30-families-*`, performance/compare_sdpa_{fp16,nope}.png, "
        "bench/hopper/results/2026-11-30-run{2,9}/perf.log."
    )
    paths = cited_paths(text)
    assert paths == [
        "docs/measurements/1999-01-01-nowhere/run.{json,log}",
        "docs/measurements/2026-11-30-families-*",
        "docs/performance/compare_sdpa_{fp16,nope}.png",
        "bench/hopper/results/2026-11-30-run{2,9}/perf.log",
    ]
    assert missing(paths[0]) == [
        "docs/measurements/1999-01-01-nowhere/run.json",
        "docs/measurements/1999-01-01-nowhere/run.log",
    ]
    assert missing(paths[1]) == []
    assert missing(paths[2]) == ["docs/performance/compare_sdpa_nope.png"]
    assert missing(paths[3]) == ["bench/hopper/results/2026-11-30-run9/perf.log"]


def sections(doc: Path) -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section of ``doc``, subsections included; the text
    before the first ``## `` heading is headed ``(top)``."""
    chunks = re.split(r"^(?=## )", doc.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return [
        (chunk.splitlines()[0] if chunk.startswith("## ") else "(top)", chunk)
        for chunk in chunks
        if chunk.strip()
    ]


def uncited_figures(body: str) -> list[str]:
    """The timed figures of a section that lack a source: none when the section cites one;
    figures inside "(not measured here: ...)" never need one."""
    if _SOURCE.search(body):
        return []
    return _UNIT_FIGURE.findall(_NOT_MEASURED.sub("", body))


SECTIONS = [
    (doc.relative_to(ROOT).as_posix(), heading, body)
    for doc in doc_files()
    for heading, body in sections(doc)
]


def test_docs_have_sections() -> None:
    per_file = {doc for doc, _, _ in SECTIONS}
    assert per_file == {f.relative_to(ROOT).as_posix() for f in doc_files()}
    assert sum(doc == "docs/performance.md" for doc, _, _ in SECTIONS) >= 5


def test_section_check_rules() -> None:
    assert uncited_figures("## A\n\n1.2 ms and 600 TFLOP/s, 3,400 tok/s, 5,000 req/s.") == [
        "1.2 ms",
        "600 TFLOP/s",
        "3,400 tok/s",
        "5,000 req/s",
    ]
    assert uncited_figures("## A\n\nmedian/p10/p90 ms, 8 MiB, 30 s, 4.4 TFLOP.") == []
    assert uncited_figures("## A\n\n1.2 ms (raw: measurements/x/run.log).") == []
    vendor = "(not measured here: the H200's datasheet, 4.8 TB/s (HBM3e) and 990 TFLOP/s)"
    assert uncited_figures(f"## A\n\nthe bound {vendor}.") == []
    assert uncited_figures(f"## A\n\n1.1 ms at {vendor}.") == ["1.1 ms"]


@pytest.mark.parametrize(
    ("doc", "heading", "body"), SECTIONS, ids=[f"{d}:{h}" for d, h, _ in SECTIONS]
)
def test_section_cites_source(doc: str, heading: str, body: str) -> None:
    figures = uncited_figures(body)
    assert not figures, (
        f"{doc} section {heading!r} quotes timed figures ({figures[:3]}) but cites no"
        " docs/measurements/, docs/performance/ or bench/hopper/results/ source and does not"
        ' mark them "(not measured here: ...)"'
    )
