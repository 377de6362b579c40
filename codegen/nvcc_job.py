"""One ninja edge: run nvcc on one instantiation, keep its log, time it, never fail.

Invoked by the generated ``build.ninja`` as a script (``python nvcc_job.py ...``), so it
imports nothing outside the standard library. It writes

- the cubin (compiled to a temporary name, renamed on success, so a cubin is never partial),
- ``--log``: nvcc's stdout and stderr (ptxas ``-v`` output goes to stderr),
- ``--result``: JSON ``{"finished", "returncode", "seconds", "cubin", "timed_out",
  "command"}``, written last and atomically: its presence means the job finished,

and exits 0 whatever nvcc did, so one failing config never stops the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT_VERSION = 1


def _write_atomic(path: Path, data: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
    os.replace(tmp, path)


def _run(command: list[str], timeout: float | None) -> tuple[str, int, bool]:
    """Run ``command`` in its own process group; on timeout or interrupt kill the whole group.

    nvcc forks cicc and ptxas, which inherit the output pipe: killing nvcc alone would leave
    them running and the pipe open, so the group is what gets killed.
    """
    posix = os.name == "posix"
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=posix
    )

    def kill() -> None:
        try:
            if posix:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass

    try:
        raw, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill()
        raw, _ = proc.communicate()
        text = raw.decode("utf-8", errors="replace")
        return f"{text}\nerror: nvcc timed out after {timeout} s\n", -9, True
    except BaseException:  # Ctrl-C in ninja: do not leave compilers behind
        kill()
        raise
    return raw.decode("utf-8", errors="replace"), proc.returncode, False


def run_job(
    nvcc: str,
    src: Path,
    cubin: Path,
    log: Path,
    result: Path,
    flags: list[str],
    timeout: float | None,
) -> dict[str, object]:
    """Compile ``src`` to ``cubin`` and record what happened.

    Args:
        nvcc: the nvcc executable.
        src: the ``.cu`` file.
        cubin: where the cubin goes.
        log: where nvcc's output goes.
        result: where the JSON summary goes.
        flags: nvcc flags (without ``-o`` and the source).
        timeout: seconds before nvcc is killed; None for no limit.

    Returns:
        The JSON summary that was written.
    """
    cubin.parent.mkdir(parents=True, exist_ok=True)
    tmp_cubin = cubin.with_name(f".{cubin.name}.{os.getpid()}.tmp")
    command = [nvcc, *flags, "-o", str(tmp_cubin), str(src)]
    timed_out = False
    start = time.perf_counter()
    try:
        output, returncode, timed_out = _run(command, timeout)
    except OSError as exc:  # nvcc missing or not executable
        output = f"error: cannot run {nvcc}: {exc}\n"
        returncode = 127
    seconds = time.perf_counter() - start

    ok = returncode == 0 and tmp_cubin.is_file()
    if ok:
        os.replace(tmp_cubin, cubin)
    else:
        tmp_cubin.unlink(missing_ok=True)
    _write_atomic(log, output)
    summary: dict[str, object] = {
        "version": RESULT_VERSION,
        "finished": True,
        "returncode": returncode,
        "seconds": round(seconds, 4),
        "cubin": cubin.name if ok else None,
        "timed_out": timed_out,
        # The command with the per-process temp name replaced: what a human would rerun.
        "command": [*command[:-2], str(cubin), str(src)],
    }
    _write_atomic(result, json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; always returns 0 unless its own arguments are wrong."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nvcc", required=True)
    parser.add_argument("--src", required=True, type=Path)
    parser.add_argument("--cubin", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds; 0 = no limit")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="nvcc flags after --")
    args = parser.parse_args(argv)
    flags = list(args.flags)
    if flags and flags[0] == "--":
        flags = flags[1:]
    try:
        run_job(
            args.nvcc,
            args.src,
            args.cubin,
            args.log,
            args.result,
            flags,
            args.timeout or None,
        )
    except Exception as exc:  # an unwritable cache dir, say: report it, keep ninja going
        sys.stderr.write(f"nvcc_job: {args.src}: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
