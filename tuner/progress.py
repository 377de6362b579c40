"""Live campaign display (rich) and the end-of-campaign summary table.

:class:`RichProgress` is a :class:`tuner.summary.CampaignObserver`: two progress bars, the
whole campaign and the problem being tuned (trial i/n, best so far, ETA), plus one line per
finished problem printed above them. :func:`render_summary` prints the final table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from core.problem import Problem
from tuner.summary import CampaignSummary, ProblemSummary, TrialEvent


def problem_label(problem: Problem) -> str:
    """Short human label, e.g. ``d128 n4096 fp16 causal b2 h16``; every part of the key that
    tells two problems of one campaign apart is in it (keys, KV heads, varlen, variant, cache
    layout and length pattern), as in ``d128 n2048 nk34816 bf16 causal b1 h32:8 pg16`` or
    ``d128 n1 nk32768 bf16 full b32 h32:8 pg16 mix``."""
    mask = "causal" if problem.causal else "full"
    keys = f" nk{problem.nk}" if problem.nk is not None and problem.nk != problem.n else ""
    heads = f"h{problem.heads}"
    if problem.n_kv_heads != problem.heads:
        heads += f":{problem.n_kv_heads}"
    parts = [f"d{problem.d} n{problem.n}{keys} {problem.dtype} {mask} b{problem.batch} {heads}"]
    if problem.seqlens is not None:
        parts.append(f"varlen {min(problem.seqlens)}-{max(problem.seqlens)}")
    if not problem.variant.plain:
        parts.append(problem.variant.describe())
    if problem.kv_page is not None:
        parts.append(f"pg{problem.kv_page}" if problem.kv_page else "kvc")
        if problem.kv_lengths != "full":
            parts.append("mix")
    return " ".join(parts)


def _fmt_ms(ms: float | None) -> str:
    return f"{ms:.4f}" if ms is not None else "-"


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "-:--:--"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class _EtaColumn(ProgressColumn):
    """Time left: until the task's deadline under a time budget, else rich's estimate."""

    def render(self, task: Task) -> Text:
        deadline = task.fields.get("deadline")
        if deadline is not None:
            left: float | None = max(0.0, deadline - time.monotonic())
        else:
            left = task.time_remaining
        return Text(f"ETA {_fmt_duration(left)}", style="progress.remaining")


class RichProgress:
    """A rich live display of a running campaign (use as a context manager).

    Args:
        console: where to draw; a new stderr console when None.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console if console is not None else Console(stderr=True)
        self._progress = Progress(
            TextColumn("{task.description}", justify="left"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TimeElapsedColumn(),
            _EtaColumn(),
            console=self.console,
            transient=False,
        )
        self._overall: TaskID | None = None
        self._current: TaskID | None = None
        self._current_index = -1
        # GPU trials of finished problems, by index: a problem continued with leftover time
        # finishes twice and must not count twice.
        self._trials_by_problem: dict[int, int] = {}
        self._n_problems = 0
        self._trials: int | None = None

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    # ---------------------------------------------------------------- observer

    def campaign_started(
        self, problems: Sequence[Problem], trials: int | None, time_budget_s: float | None
    ) -> None:
        self._n_problems = len(problems)
        self._trials = trials
        total = trials * len(problems) if trials is not None else None
        deadline = time.monotonic() + time_budget_s if time_budget_s is not None else None
        self._overall = self._progress.add_task(
            f"campaign ({len(problems)} problems)", total=total, best="", deadline=deadline
        )

    def problem_started(
        self, index: int, problem: Problem, target: int | None, deadline: float | None
    ) -> None:
        if self._current is not None:
            self._progress.remove_task(self._current)
        self._current_index = index
        self._current = self._progress.add_task(
            f"[{index + 1}/{self._n_problems}] {problem_label(problem)}",
            total=target,
            best="best -",
            deadline=deadline,
        )

    def trial_finished(self, event: TrialEvent) -> None:
        if self._current is None:
            return
        best = (
            f"best {_fmt_ms(event.best_ms)} ms {event.best_config or ''}".strip()
            if event.best_ms is not None
            else "best -"
        )
        self._progress.update(self._current, completed=event.trials, best=best)
        if self._overall is not None:
            done = sum(n for i, n in self._trials_by_problem.items() if i != self._current_index)
            self._progress.update(self._overall, completed=done + event.trials)

    def problem_finished(self, index: int, summary: ProblemSummary) -> None:
        self._trials_by_problem[index] = summary.trials
        if self._overall is not None:
            self._progress.update(self._overall, completed=sum(self._trials_by_problem.values()))
        tflops = f"{summary.best_tflops:.0f} TFLOP/s" if summary.best_tflops else ""
        self._progress.console.print(
            f"[bold]{problem_label(summary.problem)}[/bold]: "
            f"{summary.best_config or 'no OK config'} {_fmt_ms(summary.best_ms)} ms {tflops} "
            f"({summary.trials} GPU trials, {summary.evaluated}/{summary.space_size} evaluated)"
        )

    def campaign_finished(self, summary: CampaignSummary) -> None:
        if self._current is not None:
            self._progress.remove_task(self._current)
            self._current = None


def summary_table(summary: CampaignSummary) -> Table:
    """The campaign's results as a rich table (one row per problem)."""
    title = f"fa2tune tune: {len(summary.problems)} problems, sampler {summary.sampler}"
    if summary.interrupted:
        title += " (interrupted)"
    table = Table(title=title)
    table.add_column("problem")
    table.add_column("best config", overflow="fold")  # the name is the result: never cut
    table.add_column("ms", justify="right")
    table.add_column("TFLOP/s", justify="right")
    table.add_column("GPU trials", justify="right")
    table.add_column("evaluated", justify="right")
    table.add_column("statuses", overflow="fold")
    for p in summary.problems:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(p.statuses.items()))
        table.add_row(
            problem_label(p.problem),
            p.best_config or "-",
            _fmt_ms(p.best_ms),
            f"{p.best_tflops:.1f}" if p.best_tflops is not None else "-",
            str(p.trials),
            f"{p.evaluated}/{p.space_size}",
            statuses,
        )
    t = summary.times
    table.caption = (
        f"wall {_fmt_duration(t.wall_s)}: GPU verify+time {t.measure_s:.1f} s, "
        f"waiting for builds {t.build_wait_s:.1f} s, search overhead {t.search_s:.1f} s; "
        f"compiling {t.build_s:.1f} s (mostly in the background); "
        f"{summary.total_measured} new measurements"
    )
    return table


def render_summary(summary: CampaignSummary, console: Console | None = None) -> None:
    """Print :func:`summary_table` (to stdout by default)."""
    (console if console is not None else Console()).print(summary_table(summary))
