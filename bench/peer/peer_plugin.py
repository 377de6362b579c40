"""A pytest plugin for running FlashAttention-3's test suite against fa2tune.flash_attn.

Loaded by bench/peer/run_fa3_tests.sh (``-p peer_plugin``, this folder on ``PYTHONPATH``);
it changes no test, only which run and how their outcomes are counted:

* a deterministic sample: of each test function's parametrised items (in collection order)
  every ``FA2TUNE_PEER_EVERY``-th from ``FA2TUNE_PEER_OFFSET`` runs (default every 1st, from
  0: all), the rest are deselected; every worker of pytest-xdist collects the same items in
  the same order, so all of them pick the same sample;
* ``FA2TUNE_PEER_WHERE``, when set, is a Python expression over an item's parameters (its
  parametrize names, e.g. ``(local or softcap > 0) and d in (96, 128, 256)``): only the items
  for which it is true are sampled; an item without a parameter the expression names, or on
  which it raises, is left out (the sample is taken within the kept items);
* tests of FlashAttention-3's own build rather than of its interface
  (:data:`NOT_APPLICABLE`) are deselected and listed as such;
* a test whose call raised NotImplementedError is counted ``unsupported`` (fa2tune.flash_attn
  refusing an argument or a call its kernels do not serve), with the message as its reason;
  other failures and errors are ``failed``;
* which of fa2tune's kernel families served each item: every item decides its calls afresh
  (``fa2tune.torch.clear_caches`` before it) and the choices fa2tune logs
  (``FA2TUNE_PRINT_CHOICE``, which the runner sets) name the configs; an item counts once for
  every family it ran (``none``: no kernel decided, e.g. a skip or a refusal);
* at the end a summary per test function (selected, passed, failed, skipped, unsupported), the most
  common unsupported reasons and failures and the items per kernel family, written as
  ``summary.json`` and ``summary.txt`` into ``FA2TUNE_PEER_OUT`` (default ``peer-results``) and
  printed; the session's exit status is 0 when nothing failed (unsupported tests are expected: they
  are what the interface says it does not run), 1 otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

#: Test functions that check FlashAttention-3's compiled extension itself (its registered
#: op schemas), not the interface: nothing of fa2tune's to test there.
NOT_APPLICABLE: dict[str, str] = {
    "test_flash3_bw_compatibility": "checks torch.ops.flash_attn_3's compiled op schemas",
}

_PROPERTY = "fa2tune_unsupported"
_KERNELS = "fa2tune_kernels"

#: A config name in a choice line: its family is the name's first part.
_CONFIG = re.compile(r"\b(fa2|fa3|splitkv)_d\d+_\w+")


class _ChoiceLog(logging.Handler):
    """The kernel families fa2tune's choice lines of the running item name."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.families: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.families.update(m.group(1) for m in _CONFIG.finditer(record.getMessage()))


_choices = _ChoiceLog()


def _function(nodeid: str) -> str:
    """``file.py::test_name`` of an item's node id (its parameters cut off)."""
    return nodeid.split("[", 1)[0]


def _setting(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw else default
    except ValueError:
        raise pytest.UsageError(f"{name} must be an integer, got {raw!r}") from None
    return value


def where_filter(expression: str) -> Any:
    """A predicate over a parameter dict for ``FA2TUNE_PEER_WHERE`` (None: keep every item).

    Raises:
        pytest.UsageError: an expression that does not parse.
    """
    if not expression.strip():
        return None
    try:
        code = compile(expression, "FA2TUNE_PEER_WHERE", "eval")
    except SyntaxError as exc:
        raise pytest.UsageError(f"FA2TUNE_PEER_WHERE does not parse: {exc.msg}") from None

    def keep(params: dict[str, Any]) -> bool:
        try:  # no builtins: the expression reads the parameters, nothing else
            return bool(eval(code, {"__builtins__": {}}, dict(params)))
        except Exception:
            return False

    return keep


def sample(nodeids: list[str], every: int, offset: int) -> list[bool]:
    """Which of ``nodeids`` (collection order) run: per test function, the items whose index
    ``i`` among that function's has ``(i - offset) % every == 0``."""
    if every < 1:
        raise pytest.UsageError(f"FA2TUNE_PEER_EVERY must be >= 1, got {every}")
    seen: Counter[str] = Counter()
    keep = []
    for nodeid in nodeids:
        fn = _function(nodeid)
        keep.append((seen[fn] - offset) % every == 0)
        seen[fn] += 1
    return keep


class _Summary:
    """Outcomes by node id, gathered where reports arrive (the xdist controller, or the one
    process without xdist)."""

    def __init__(self) -> None:
        self.collected: Counter[str] = Counter()
        self.not_applicable: dict[str, str] = {}
        self.outcome: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        self.kernels: dict[str, list[str]] = {}

    def record(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.passed:
            return  # a setup or teardown that passed says nothing about the test
        if self.outcome.get(report.nodeid) == "failed":
            return  # an error in teardown after a failure: still one failure
        unsupported = dict(report.user_properties).get(_PROPERTY)
        if report.skipped:
            outcome = "skipped"
        elif report.failed:
            outcome = "unsupported" if unsupported is not None else "failed"
            text = str(unsupported) if unsupported is not None else _first_line(report)
            self.reason[report.nodeid] = text
        else:
            outcome = "passed"
        self.outcome[report.nodeid] = outcome
        kernels = dict(report.user_properties).get(_KERNELS)
        if report.when == "call" and kernels is not None:
            self.kernels[report.nodeid] = str(kernels).split(",") if kernels else []

    def table(self) -> dict[str, Any]:
        by_fn: dict[str, Counter[str]] = defaultdict(Counter)
        for fn, n in self.collected.items():
            by_fn[fn]["collected"] = n
        for nodeid, outcome in self.outcome.items():
            counts = by_fn[_function(nodeid)]
            counts["selected"] += 1
            counts[outcome] += 1
        unsupported = Counter(_shape(self.reason[n]) for n, o in self.outcome.items()
                              if o == "unsupported")  # fmt: skip
        failures = Counter(_shape(self.reason[n]) for n, o in self.outcome.items()
                           if o == "failed")  # fmt: skip
        kernels: dict[str, Counter[str]] = defaultdict(Counter)
        for nodeid, families in self.kernels.items():
            kernels[_function(nodeid)].update(families or ["none"])
        total: Counter[str] = Counter()
        for counts in by_fn.values():
            total.update({k: v for k, v in counts.items() if k != "collected"})
        return {
            "functions": {fn: dict(c) for fn, c in sorted(by_fn.items())},
            "total": dict(total),
            "not_applicable": dict(self.not_applicable),
            "kernels": {fn: dict(sorted(c.items())) for fn, c in sorted(kernels.items())},
            "unsupported_reasons": unsupported.most_common(20),
            "failures": failures.most_common(20),
            "failed_tests": sorted(n for n, o in self.outcome.items() if o == "failed")[:200],
        }


def _first_line(report: pytest.TestReport) -> str:
    """The exception line of a failure (``E   ...``), else the report's last line."""
    text = str(report.longrepr or "")
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()[:300]
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "failed"


def _shape(reason: str) -> str:
    """A reason with its numbers blanked, so that one cause counts once."""
    return re.sub(r"\b\d+\b", "#", reason)[:200]


_summary = _Summary()

COLUMNS = ("collected", "selected", "passed", "failed", "unsupported", "skipped")


def render(table: dict[str, Any]) -> str:
    """The summary as text: one line per test function, the totals, the reasons."""
    width = max([len(fn.split("::")[-1]) for fn in table["functions"]] + [8])
    head = f"{'function':<{width}} " + " ".join(f"{c:>11}" for c in COLUMNS)
    lines = [head, "-" * len(head)]
    for fn, counts in table["functions"].items():
        name = fn.split("::")[-1]
        lines.append(f"{name:<{width}} " + " ".join(f"{counts.get(c, 0):>11}" for c in COLUMNS))
    total = table["total"]
    lines.append(f"{'total':<{width}} " + " ".join(
        f"{total.get(c, 0) if c != 'collected' else '':>11}" for c in COLUMNS))  # fmt: skip
    for name, why in table["not_applicable"].items():
        lines.append(f"not applicable: {name}: {why}")
    if table.get("kernels"):
        lines.append("items per kernel family that served them:")
        lines += [f"  {fn.split('::')[-1]}: " + ", ".join(f"{k} {n}" for k, n in c.items())
                  for fn, c in table["kernels"].items()]  # fmt: skip
    if table["unsupported_reasons"]:
        lines.append("unsupported (NotImplementedError), most common reasons:")
        lines += [f"  {n:>6}  {reason}" for reason, n in table["unsupported_reasons"]]
    if table["failures"]:
        lines.append("failures, most common:")
        lines += [f"  {n:>6}  {reason}" for reason, n in table["failures"]]
    return "\n".join(lines) + "\n"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    every = _setting("FA2TUNE_PEER_EVERY", 1)
    offset = _setting("FA2TUNE_PEER_OFFSET", 0)
    applicable = []
    dropped = []
    for item in items:
        name = _function(item.nodeid).split("::")[-1]
        if name in NOT_APPLICABLE:
            _summary.not_applicable[name] = NOT_APPLICABLE[name]
            dropped.append(item)
        else:
            applicable.append(item)
    for item in applicable:
        _summary.collected[_function(item.nodeid)] += 1
    where = where_filter(os.environ.get("FA2TUNE_PEER_WHERE", ""))
    if where is not None:
        wanted = [where(getattr(getattr(i, "callspec", None), "params", {})) for i in applicable]
        dropped += [item for item, k in zip(applicable, wanted, strict=True) if not k]
        applicable = [item for item, k in zip(applicable, wanted, strict=True) if k]
    worker = getattr(config, "workerinput", None)
    if worker is not None and worker.get("workerid") == "gw0":
        # Under xdist only workers collect: one of them leaves the counts for the controller.
        _out().mkdir(parents=True, exist_ok=True)
        (_out() / _COLLECTED).write_text(json.dumps({
            "collected": dict(_summary.collected),
            "not_applicable": _summary.not_applicable,
        }))  # fmt: skip
    keep = sample([item.nodeid for item in applicable], every, offset)
    dropped += [item for item, k in zip(applicable, keep, strict=True) if not k]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = [item for item, k in zip(applicable, keep, strict=True) if k]


def pytest_configure(config: pytest.Config) -> None:
    logger = logging.getLogger("fa2tune")
    logger.addHandler(_choices)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # the dense op's choice lines are INFO records


def pytest_runtest_setup(item: pytest.Item) -> None:
    _choices.families.clear()
    try:
        from fa2tune.torch import clear_caches
    except ImportError:  # without torch the tests cannot import the interface either
        return
    clear_caches()  # so this item's calls are decided (and their choices logged) again


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.when == "call":
        report.user_properties.append((_KERNELS, ",".join(sorted(_choices.families))))
    if call.excinfo is not None and call.excinfo.errisinstance(NotImplementedError):
        # Carried on the report (user_properties travel from xdist workers to the
        # controller, the exception itself does not).
        report.user_properties.append((_PROPERTY, str(call.excinfo.value)[:300]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _summary.record(report)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _out() -> Path:
    return Path(os.environ.get("FA2TUNE_PEER_OUT", "peer-results"))


_COLLECTED = "collected.json"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_worker(session.config):
        return
    out = _out()
    out.mkdir(parents=True, exist_ok=True)
    left = out / _COLLECTED
    if not _summary.collected and left.exists():  # xdist: the first worker's counts
        data = json.loads(left.read_text())
        _summary.collected.update(data["collected"])
        _summary.not_applicable.update(data["not_applicable"])
    left.unlink(missing_ok=True)
    table = _summary.table()
    text = render(table)
    (out / "summary.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "summary.txt").write_text(text)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        for line in text.splitlines():
            reporter.write_line(line)
        reporter.write_line(f"summary written to {out}/summary.json and summary.txt")
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        failed = table["total"].get("failed", 0)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK
