"""Bounded load test of ``GET /v1/best`` against a running ``fa2tune serve``.

A fixed number of requests with mixed GPUs (spelled as users do), head dims, Ns (tuned and
untuned, log-uniform), dtypes and masks go out over ``--concurrency`` keep-alive connections
in a closed loop; requests/s and latency percentiles are reported.

The default client is a minimal asyncio HTTP/1.1 client, so the figures measure the server
rather than the client library (on a 2-core machine client and server share the CPUs);
``--client httpx`` uses httpx instead.

    # everything in one go: seed a temp DB, start `fa2tune serve` on loopback, load it
    python bench/loadtest.py --spawn --requests 20000 --concurrency 32

    # mixed load: /v1/best while 4 clients fetch /v1/export/header and 16 page through
    # /v1/results?limit=1000 (the figures are those of /v1/best; the others are reported too)
    python bench/loadtest.py --spawn --mixed --requests 20000 --concurrency 16

    # cache-missing mixed load: the same, but every header asks other head dims and every
    # page another offset and length, so each slow request renders (issue 27)
    python bench/loadtest.py --spawn --mixed-miss --requests 50000 --concurrency 16

    # connection flood: 1100 idle TCP connections to a server limited to 1024 descriptors,
    # then /v1/best probes on fresh connections; and 40 partial 16 MB request headers
    python bench/loadtest.py --spawn --server-nofile 1024 --flood 1100 --probes 30
    python bench/loadtest.py --spawn --header-flood 40 --header-mb 16 --probes 10

    # against a server you started yourself
    python bench/loadtest.py seed /tmp/fa2.db   # then: fa2tune --db sqlite:////tmp/fa2.db serve
    python bench/loadtest.py --url http://127.0.0.1:8000 --requests 20000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger("loadtest")

GPUS = [
    # (name as the driver reports it, compute capability, SMs, peak-ish TFLOP/s for FA2 fwd)
    ("NVIDIA H200", "9.0", 132, 420.0),
    ("NVIDIA H100 80GB HBM3", "9.0", 132, 380.0),
    ("NVIDIA A100-SXM4-80GB", "8.0", 108, 190.0),
]
SPELLINGS = {
    "NVIDIA H200": ["H200", "NVIDIA H200", "nvidia h200"],
    "NVIDIA H100 80GB HBM3": ["NVIDIA H100 80GB HBM3", "h100 80gb hbm3"],
    "NVIDIA A100-SXM4-80GB": ["A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"],
}
HEAD_DIMS = (64, 128, 256)
TUNED_NS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
TRIALS = 4  # OK measurements per problem


# ---------------------------------------------------------------------------- seeding


def seed(db_path: Path) -> int:
    """Fill a SQLite database with plausible results (one ingest, so it takes seconds).

    Returns:
        Measurements added.
    """
    from core.fa2_config import Fa2Config
    from core.problem import Problem
    from db.dump_format import DumpFile
    from db.store import Store
    from db.transfer import ingest

    rng = random.Random(7)
    gpus: list[dict[str, Any]] = []
    builds: dict[str, dict[str, Any]] = {}
    problems: list[dict[str, Any]] = []
    measurements: list[dict[str, Any]] = []
    t0 = datetime(2025, 6, 1, tzinfo=UTC)
    for name, cc, sms, peak in GPUS:
        arch = "sm_" + cc.replace(".", "")
        gpus.append(
            {"name": name, "compute_capability": cc, "sm_count": sms,
             "driver_version": "570.124.06", "cuda_version": "12.8"}
        )  # fmt: skip
        for d in HEAD_DIMS:
            for dtype in ("fp16", "bf16"):
                for causal in (False, True):
                    for n in TUNED_NS:
                        spec = Problem(gpu=name, d=d, n=n, dtype=dtype, causal=causal)
                        prob = {
                            "gpu": name, "compute_capability": cc, "d": d, "n": n, "nk": n,
                            "batch": spec.batch, "heads": spec.heads, "kv_heads": spec.heads,
                            "dtype": dtype, "causal": causal,
                        }  # fmt: skip
                        problems.append(prob)
                        # Throughput saturates with N, as it does on real GPUs.
                        eff = peak * (1 - math.exp(-n / 3000)) * (0.8 if causal else 1.0)
                        for trial in range(TRIALS):
                            br = rng.choice((64, 128)) if d < 256 else 64
                            bc = rng.choice((32, 64, 128)) if d < 256 else 64
                            stages = rng.choice((1, 2))
                            cfg = Fa2Config(
                                d=d, dtype=dtype, causal=causal, br=br, bc=bc, warps=4,
                                stages=stages, pad=8,
                            )  # fmt: skip
                            bkey = f"{cfg.name}/{arch}"
                            source = hashlib.sha256(bkey.encode()).hexdigest()[:12]
                            builds.setdefault(
                                bkey,
                                {
                                    "config_name": cfg.name, "config": cfg.to_dict(),
                                    "arch": arch, "status": "OK", "registers": 168,
                                    "source_hash": source,
                                    "nvcc_version": "Cuda compilation tools, release 12.8",
                                },
                            )  # fmt: skip
                            tflops = eff * rng.uniform(0.75, 1.0)
                            ms = spec.flops / (tflops * 1e12) * 1e3
                            measurements.append(
                                {
                                    "problem": prob,
                                    "build": {"config_name": cfg.name, "arch": arch,
                                              "source_hash": builds[bkey]["source_hash"]},
                                    "status": "OK", "median_ms": ms, "p10_ms": ms * 0.98,
                                    "p90_ms": ms * 1.03, "reps": 100, "tflops": tflops,
                                    "max_abs_err": 1e-3, "rel_err": 2e-4,
                                    "driver_version": "570.124.06", "cuda_version": "12.8",
                                    "trial_number": trial,
                                    "created_at": (t0 + timedelta(seconds=len(measurements)))
                                    .isoformat(),
                                }
                            )  # fmt: skip
    dump = DumpFile.model_validate(
        {"gpus": gpus, "builds": list(builds.values()), "problems": problems,
         "measurements": measurements}
    )  # fmt: skip
    with Store.from_url(f"sqlite:///{db_path}") as store:
        return ingest(store, dump).added


# ---------------------------------------------------------------------------- requests


def make_paths(count: int, rng: random.Random) -> list[str]:
    """``/v1/best`` request paths: mixed GPUs/spellings, D, log-uniform N, dtype, mask."""
    paths = []
    for _ in range(count):
        gpu = rng.choice(list(SPELLINGS))
        n = TUNED_NS[rng.randrange(len(TUNED_NS))] if rng.random() < 0.3 else int(
            math.exp(rng.uniform(math.log(64), math.log(131072)))
        )  # fmt: skip
        query = urllib.parse.urlencode(
            {
                "gpu": rng.choice(SPELLINGS[gpu]),
                "d": rng.choice(HEAD_DIMS),
                "n": n,
                "dtype": rng.choice(("fp16", "bf16")),
                "causal": rng.choice(("true", "false")),
            }
        )
        paths.append(f"/v1/best?{query}")
    return paths


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    refused: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str
) -> tuple[int, bytes]:
    """One GET on a keep-alive connection (the server sends Content-Length)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length)


async def _raw_worker(
    host: str, port: int, paths: list[str], queue: asyncio.Queue[int], stats: Stats
) -> None:
    """One keep-alive connection issuing requests back to back."""
    reader, writer = await asyncio.open_connection(host, port, limit=2**26)
    try:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            start = time.perf_counter()
            status, body = await _get(reader, writer, host, paths[i])
            elapsed = time.perf_counter() - start
            stats.latencies.append(elapsed)
            stats.statuses[status] = stats.statuses.get(status, 0) + 1
            if status != 200 or not body.startswith(b'{"n":'):
                stats.errors += 1
    finally:
        writer.close()


async def _httpx_worker(
    client: Any, base: str, paths: list[str], queue: asyncio.Queue[int], stats: Stats
) -> None:
    while True:
        try:
            i = queue.get_nowait()
        except asyncio.QueueEmpty:
            return
        start = time.perf_counter()
        r = await client.get(base + paths[i])
        stats.latencies.append(time.perf_counter() - start)
        stats.statuses[r.status_code] = stats.statuses.get(r.status_code, 0) + 1
        if r.status_code != 200:
            stats.errors += 1


_NEXT_OFFSET = re.compile(rb'"next_offset":(\d+|null)')


async def _background_worker(
    host: str, port: int, group: Background, paths: list[str], stop: Any, stats: Stats
) -> None:
    """Slow-endpoint load: one keep-alive connection cycling through ``paths`` until stopped.

    With ``group.follow``, ``/v1/results`` pages follow ``next_offset`` (starting over at the
    end). A refusal (429 or 503, the server's admission limits) counts as refused, not as an
    error; with ``group.polite`` the client then waits as ``Retry-After`` says, else it asks
    again at once (as a careless or hostile client would).
    """
    reader, writer = await asyncio.open_connection(host, port, limit=2**26)
    try:
        i = 0
        path = paths[0]
        while not stop.is_set():
            start = time.perf_counter()
            try:
                status, body = await _get(reader, writer, host, path)
            except (asyncio.IncompleteReadError, ConnectionError):
                # The server closed the connection (after a refusal, a timeout): reconnect.
                stats.statuses[0] = stats.statuses.get(0, 0) + 1
                writer.close()
                reader, writer = await asyncio.open_connection(host, port, limit=2**26)
                continue
            stats.latencies.append(time.perf_counter() - start)
            stats.statuses[status] = stats.statuses.get(status, 0) + 1
            if status in (429, 503):
                stats.refused += 1
                if group.polite:
                    await _sleep_unless_stopped(stop, 1.0)
            elif status != 200:
                stats.errors += 1
            i += 1
            path = paths[i % len(paths)]
            if group.follow and path.startswith("/v1/results") and status == 200:
                # A regex, not json.loads: the client must not spend the CPU it shares with
                # the server on decoding pages it does not look at.
                match = _NEXT_OFFSET.search(body)
                next_offset = match.group(1) if match else b"null"
                base = path.split("&offset=")[0]
                path = base if next_offset == b"null" else f"{base}&offset={int(next_offset)}"
    finally:
        writer.close()


async def _sleep_unless_stopped(stop: Any, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def _background_process(url: str, background: dict[str, Background], stop: Any, out: Any) -> None:
    """Run the slow-endpoint clients in their own process (so their work does not slow the
    client loop that times ``/v1/best``) until ``stop`` is set; put their stats on ``out``."""
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80

    async def go() -> dict[str, Stats]:
        stats: dict[str, Stats] = {}
        tasks = []
        for name, group in background.items():
            stats[name] = Stats()
            for k in range(group.clients):
                paths = group.paths[k]
                tasks.append(_background_worker(host, port, group, paths, stop, stats[name]))
        await asyncio.gather(*tasks)
        return stats

    out.put(asyncio.run(go()))


@dataclass(frozen=True)
class Background:
    """One group of slow-endpoint clients: ``paths[k]`` is client k's cycle of requests."""

    clients: int
    paths: list[list[str]]
    follow: bool = False
    polite: bool = False


# Clients per slow endpoint in --mixed and --mixed-miss mode, as in issues 15 and 27.
MIXED_HEADER_CLIENTS = 4
MIXED_RESULTS_CLIENTS = 16
# Requests per client in --mixed-miss: more than one run sends, so none repeats.
MISS_CYCLE = 4000


def _rotations(paths: list[str], clients: int) -> list[list[str]]:
    return [paths[k % len(paths) :] + paths[: k % len(paths)] for k in range(clients)]


def mixed_paths(*, polite: bool = False) -> dict[str, Background]:
    """Background load of ``--mixed``: the header of each GPU, and result pages of 1000
    (the same few requests again and again: after the first round, the caches answer)."""
    header = ["/v1/export/header?" + urllib.parse.urlencode({"gpu": g}) for g, *_ in GPUS]
    return {
        "export_header": Background(
            MIXED_HEADER_CLIENTS, _rotations(header, MIXED_HEADER_CLIENTS), polite=polite
        ),
        "results_limit_1000": Background(
            MIXED_RESULTS_CLIENTS,
            _rotations(["/v1/results?limit=1000"], MIXED_RESULTS_CLIENTS),
            follow=True,
            polite=polite,
        ),
    }


def mixed_miss_paths(
    seed_: int, *, polite: bool = False, page_clients: int = MIXED_RESULTS_CLIENTS
) -> dict[str, Background]:
    """Background load of ``--mixed-miss``: requests the caches have not seen.

    Each header client asks a GPU's header for two random head dims (any multiple of 8 from 8
    to 256) and a random choice of dtypes; each page client asks ``/v1/results`` at a random
    offset with a random length of 500 to 1000 rows (so a page holds 500 to 1000 rows of the
    seeded database's 1008). Every request of a run is distinct with near certainty, so every
    one is rendered.
    """
    rng = random.Random(seed_ + 1000)
    dims = list(range(8, 257, 8))
    total = len(GPUS) * len(HEAD_DIMS) * 2 * 2 * len(TUNED_NS) * TRIALS
    headers: list[list[str]] = []
    for _ in range(MIXED_HEADER_CLIENTS):
        paths = []
        for _ in range(MISS_CYCLE):
            gpu = rng.choice(GPUS)[0]
            pair = sorted(rng.sample(dims, 2))
            query = [("gpu", gpu), ("d", f"{pair[0]},{pair[1]}")]
            query += [("dtype", t) for t in rng.choice((["fp16"], ["bf16"], ["fp16", "bf16"]))]
            paths.append("/v1/export/header?" + urllib.parse.urlencode(query))
        headers.append(paths)
    pages: list[list[str]] = []
    for _ in range(page_clients):
        paths = []
        for _ in range(MISS_CYCLE):
            limit = rng.randint(500, 1000)
            offset = rng.randint(0, total - 500)
            paths.append(f"/v1/results?limit={limit}&offset={offset}")
        pages.append(paths)
    return {
        "export_header_varying_d": Background(MIXED_HEADER_CLIENTS, headers, polite=polite),
        "results_varying_offset": Background(page_clients, pages, polite=polite),
    }


async def _load(
    url: str,
    paths: list[str],
    concurrency: int,
    client: str,
    background: dict[str, Background] | None = None,
    background_stats: dict[str, Stats] | None = None,
) -> tuple[Stats, float]:
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(paths)):
        queue.put_nowait(i)
    stats = Stats()
    proc = None
    if background:
        ctx = multiprocessing.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_background_process, args=(url, background, stop, out))
        proc.start()
        await asyncio.sleep(2.0)  # let the slow endpoints get going first
    start = time.perf_counter()
    try:
        await _foreground(url, host, port, paths, queue, concurrency, client, stats)
    finally:
        wall = time.perf_counter() - start
        if proc is not None:
            stop.set()
            result = out.get(timeout=120)
            proc.join(timeout=30)
            if background_stats is not None:
                background_stats.update(result)
    return stats, wall


async def _foreground(
    url: str,
    host: str,
    port: int,
    paths: list[str],
    queue: asyncio.Queue[int],
    concurrency: int,
    client: str,
    stats: Stats,
) -> None:
    if client == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=30) as c:
            await asyncio.gather(
                *(_httpx_worker(c, url, paths, queue, stats) for _ in range(concurrency))
            )
    else:
        await asyncio.gather(
            *(_raw_worker(host, port, paths, queue, stats) for _ in range(concurrency))
        )


def _pct(lat: list[float], p: float) -> float:
    return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1e3 if lat else math.nan


def run_load(
    url: str,
    requests: int,
    concurrency: int,
    *,
    warmup: int,
    client: str,
    seed_: int,
    mixed: str | None = None,
    polite: bool = False,
    page_clients: int = MIXED_RESULTS_CLIENTS,
) -> dict[str, Any]:
    """Warm up, then time ``requests`` requests; returns the figures.

    With ``mixed`` (``"hit"`` or ``"miss"``), the slow endpoints are loaded at the same time
    (:func:`mixed_paths`, :func:`mixed_miss_paths`).
    """
    rng = random.Random(seed_)
    if warmup:
        asyncio.run(_load(url, make_paths(warmup, rng), concurrency, client))
    background = None
    if mixed == "hit":
        background = mixed_paths(polite=polite)
    elif mixed == "miss":
        background = mixed_miss_paths(seed_, polite=polite, page_clients=page_clients)
    background_stats: dict[str, Stats] = {}
    stats, wall = asyncio.run(
        _load(url, make_paths(requests, rng), concurrency, client, background, background_stats)
    )
    lat = sorted(stats.latencies)

    def pct(p: float) -> float:
        return _pct(lat, p)

    figures: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "url": url,
        "client": client,
        "requests": len(lat),
        "concurrency": concurrency,
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(pct(50), 3),
        "p90_ms": round(pct(90), 3),
        "p99_ms": round(pct(99), 3),
        "max_ms": round(lat[-1] * 1e3, 3),
        "mean_ms": round(statistics.fmean(lat) * 1e3, 3),
        "errors": stats.errors,
        "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
        "cpus": os.cpu_count(),
    }
    for name, bg in background_stats.items():
        bg_lat = sorted(bg.latencies)
        figures.setdefault("background", {})[name] = {
            "clients": (background or {})[name].clients,
            "requests": len(bg_lat),
            "requests_per_s": round(len(bg_lat) / wall, 1),
            "answered_per_s": round(bg.statuses.get(200, 0) / wall, 1),
            "p50_ms": round(_pct(bg_lat, 50), 1),
            "p99_ms": round(_pct(bg_lat, 99), 1),
            "errors": bg.errors,
            "refused": bg.refused,
            "statuses": {str(k): v for k, v in sorted(bg.statuses.items())},
        }
    return figures


# ---------------------------------------------------------------------------- floods


def _raise_nofile(wanted: int) -> int:
    """Raise this process's soft descriptor limit towards ``wanted`` (up to the hard limit);
    returns the limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


async def _probe(host: str, port: int, path: str, timeout: float) -> tuple[int | None, float]:
    """One GET on a fresh connection: (status or None when unanswered, seconds taken)."""
    start = time.perf_counter()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            status, _ = await _get(reader, writer, host, path)
            return status, time.perf_counter() - start
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        return None, time.perf_counter() - start
    finally:
        if writer is not None:
            writer.close()


async def _probes(
    host: str, port: int, count: int, timeout: float, gap: float
) -> list[tuple[int | None, float]]:
    paths = make_paths(count, random.Random(3))
    out = []
    for path in paths:
        out.append(await _probe(host, port, path, timeout))
        await asyncio.sleep(gap)
    return out


def _probe_figures(results: list[tuple[int | None, float]]) -> dict[str, Any]:
    answered = sorted(t for status, t in results if status == 200)
    return {
        "probes": len(results),
        "answered_200": len(answered),
        "statuses": {
            str(k): v
            for k, v in sorted(
                {s: sum(1 for x, _ in results if x == s) for s, _ in results}.items(),
                key=lambda kv: (kv[0] is None, kv[0] or 0),
            )
        },
        "p50_ms": round(_pct(answered, 50), 1),
        "max_ms": round(answered[-1] * 1e3, 1) if answered else math.nan,
    }


def _still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the server has not closed (no EOF or reset readable)."""
    import select

    poller = select.poll()  # not select(): descriptors past 1024
    for sock in sockets:
        poller.register(sock, select.POLLIN)
    ready = {fd for fd, _ in poller.poll(0)}
    open_ = 0
    for sock in sockets:
        if sock.fileno() not in ready:
            open_ += 1
            continue
        try:
            if sock.recv(1, socket.MSG_PEEK):
                open_ += 1  # data (an answer): still open
        except OSError:
            pass  # reset: closed
    return open_


def run_flood(
    url: str, idle: int, probes: int, *, timeout: float, gap: float, hold: float
) -> dict[str, Any]:
    """Open ``idle`` TCP connections that never send a byte, then ask ``probes`` ``/v1/best``
    requests on fresh connections (``timeout`` s each, ``gap`` s apart) while they are held;
    after ``hold`` s more, count how many idle connections the server still keeps."""
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    limit = _raise_nofile(idle + 256)
    sockets: list[socket.socket] = []
    failed = 0
    started = time.perf_counter()
    for _ in range(idle):
        sock = socket.socket()
        sock.settimeout(5)
        try:
            sock.connect((host, port))
        except OSError:
            failed += 1
            sock.close()
            continue
        sockets.append(sock)
    opened = time.perf_counter() - started
    log.info("flood: %d idle connections open (%d failed) in %.1f s", len(sockets), failed, opened)
    try:
        results = asyncio.run(_probes(host, port, probes, timeout, gap))
        kept_after_probes = _still_open(sockets)
        time.sleep(hold)
        kept_after_hold = _still_open(sockets)
    finally:
        for sock in sockets:
            sock.close()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "flood",
        "url": url,
        "idle_connections": len(sockets),
        "connect_failures": failed,
        "client_nofile": limit,
        "probe_timeout_s": timeout,
        **_probe_figures(results),
        "idle_still_open_after_probes": kept_after_probes,
        f"idle_still_open_after_{hold:g}s_more": kept_after_hold,
        "cpus": os.cpu_count(),
    }


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_header_flood(
    url: str, conns: int, megabytes: int, probes: int, *, timeout: float, pid: int | None
) -> dict[str, Any]:
    """``conns`` connections each send one request header of ``megabytes`` MB that never
    ends (one header line growing), in 64 kB writes, while the server's resident memory is
    sampled; then ``probes`` ``/v1/best`` probes. Reports what the server accepted."""
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    _raise_nofile(conns + 256)
    chunk = b"a" * 65536
    per_conn = megabytes * 1024 * 1024
    rss0 = _rss_mb(pid) if pid else None
    peak = rss0 or 0.0

    async def one(k: int) -> tuple[int, str]:
        nonlocal peak
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET /v1/best?k={k} HTTP/1.1\r\nHost: {host}\r\nX-Filler: ".encode())
        sent = 0
        outcome = "all sent"
        try:
            while sent < per_conn:
                writer.write(chunk)
                async with asyncio.timeout(timeout):
                    await writer.drain()
                sent += len(chunk)
                if pid and sent % (1024 * 1024) == 0:
                    peak = max(peak, _rss_mb(pid) or 0.0)
            # Anything the server answered meanwhile (a 431, say), without waiting long.
            outcome = "all sent, no answer"
            async with asyncio.timeout(1.0):
                head = await reader.read(200)
            outcome = head.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
        except TimeoutError:
            if outcome == "all sent":
                outcome = "stalled (server stopped reading)"
        except (ConnectionError, OSError):
            outcome = "closed by the server"
        finally:
            writer.close()
        return sent, outcome

    async def go() -> tuple[list[tuple[int, str]], list[tuple[int | None, float]]]:
        sent = await asyncio.gather(*(one(k) for k in range(conns)))
        return list(sent), await _probes(host, port, probes, timeout, 0.1)

    started = time.perf_counter()
    sent, results = asyncio.run(go())
    outcomes: dict[str, int] = {}
    for _, outcome in sent:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": "header-flood",
        "url": url,
        "connections": conns,
        "header_mb_each": megabytes,
        "wall_s": round(time.perf_counter() - started, 1),
        "bytes_accepted_mb": round(sum(n for n, _ in sent) / 2**20, 1),
        "outcomes": outcomes,
        "server_rss_mb_before": round(rss0, 1) if rss0 else None,
        "server_rss_mb_peak": round(peak, 1) if pid else None,
        **_probe_figures(results),
        "cpus": os.cpu_count(),
    }


# ---------------------------------------------------------------------------- server


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fa2tune serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    raise TimeoutError(f"no healthy server at {url} after {timeout:.0f} s")


def _mixed(args: argparse.Namespace) -> str | None:
    return "miss" if args.mixed_miss else "hit" if args.mixed else None


def run_mode(args: argparse.Namespace, url: str, pid: int | None) -> dict[str, Any]:
    """The figures of the mode ``args`` asks for, against the server at ``url``."""
    load0 = os.getloadavg()[0]
    if args.flood:
        figures = run_flood(
            url, args.flood, args.probes, timeout=args.probe_timeout, gap=0.1, hold=args.hold
        )
    elif args.header_flood:
        figures = run_header_flood(
            url, args.header_flood, args.header_mb, args.probes,
            timeout=args.probe_timeout, pid=pid,
        )  # fmt: skip
    else:
        figures = run_load(
            url, args.requests, args.concurrency, warmup=args.warmup, client=args.client,
            seed_=args.seed, mixed=_mixed(args), polite=args.polite,
            page_clients=args.page_clients,
        )  # fmt: skip
    figures["load_average_before_after"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return figures


def _server_limits(nofile: int | None) -> Any:
    """A ``preexec_fn`` that caps the server's descriptors (soft and hard), as ``ulimit -n``."""
    if nofile is None:
        return None

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return limit


def spawn_and_load(args: argparse.Namespace) -> dict[str, Any]:
    """Seed a temp DB, start ``fa2tune serve`` on loopback, load it, stop it."""
    with tempfile.TemporaryDirectory(prefix="fa2tune-load-") as tmp:
        db = Path(tmp) / "fa2tune.db"
        started = time.perf_counter()
        added = seed(db)
        log.info("seeded %s: %d measurements in %.1f s", db, added, time.perf_counter() - started)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "fa2tune.cli", "--db", f"sqlite:///{db}", "serve",
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        if not args.access_log:
            cmd.append("--no-access-log")
        log.info("starting: %s", " ".join(cmd))
        log_file = Path(tmp) / "server.log"
        with log_file.open("wb") as server_log:
            proc = subprocess.Popen(
                cmd,
                stdout=server_log,
                stderr=subprocess.STDOUT,
                preexec_fn=_server_limits(args.server_nofile),
            )
        try:
            _wait_healthy(url, proc, timeout=60)
            # CPU time per request separates the server's cost from the machine's load
            # (client and server share the CPUs; other jobs may too).
            cpu0, client0 = _cpu_seconds(proc.pid), time.process_time()
            figures = run_mode(args, url, proc.pid)
            cpu1, client1 = _cpu_seconds(proc.pid), time.process_time()
            if "requests" in figures and "mode" not in figures:
                total = args.requests + args.warmup
                if cpu0 is not None and cpu1 is not None and not _mixed(args):
                    figures["server_cpu_us_per_request"] = round((cpu1 - cpu0) / total * 1e6, 1)
                figures["client_cpu_us_per_request"] = round((client1 - client0) / total * 1e6, 1)
            figures["server_alive_after"] = proc.poll() is None
            if args.server_nofile:
                figures["server_nofile"] = args.server_nofile
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        text = log_file.read_text(errors="replace")
        figures["server_log_tracebacks"] = text.count("Traceback (most recent call last)")
        figures["server_log_lines"] = text.count("\n")
        if args.server_log:
            args.server_log.write_text(text)
        return figures


def _report(figures: dict[str, Any]) -> None:
    if figures.get("mode") in ("flood", "header-flood"):
        for key, value in figures.items():
            log.info("%s: %s", key, value)
        return
    log.info(
        "%d requests, concurrency %d, %s client: %.0f req/s; latency p50 %.2f ms, "
        "p90 %.2f ms, p99 %.2f ms, max %.2f ms; errors %d %s",
        figures["requests"], figures["concurrency"], figures["client"],
        figures["requests_per_s"], figures["p50_ms"], figures["p90_ms"], figures["p99_ms"],
        figures["max_ms"], figures["errors"], figures["statuses"],
    )  # fmt: skip
    for name, bg in figures.get("background", {}).items():
        log.info(
            "meanwhile %s (%d clients): %d requests, %.1f req/s (%.1f answered), p50 %.0f ms, "
            "p99 %.0f ms, errors %d, refused %d %s",
            name, bg["clients"], bg["requests"], bg["requests_per_s"], bg["answered_per_s"],
            bg["p50_ms"], bg["p99_ms"], bg["errors"], bg["refused"], bg["statuses"],
        )  # fmt: skip
    if "server_cpu_us_per_request" in figures:
        log.info(
            "CPU per request: server %.0f us, client %.0f us (%d CPUs)",
            figures["server_cpu_us_per_request"], figures["client_cpu_us_per_request"],
            figures["cpus"],
        )  # fmt: skip
    log.info(
        "load average before/after: %s; server log tracebacks: %s",
        figures.get("load_average_before_after"), figures.get("server_log_tracebacks", "-"),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("run", "seed"), default="run")
    parser.add_argument("db", nargs="?", type=Path, help="seed: the SQLite file to fill")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="server to load")
    parser.add_argument("--spawn", action="store_true", help="seed a temp DB and start a server")
    parser.add_argument("--requests", "-n", type=int, default=20000)
    parser.add_argument("--concurrency", "-c", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw")
    parser.add_argument("--access-log", action="store_true", help="--spawn: keep access logs")
    parser.add_argument("--server-log", type=Path, help="--spawn: save the server's log here")
    parser.add_argument(
        "--server-nofile", type=int, help="--spawn: the server's descriptor limit (ulimit -n)"
    )
    parser.add_argument("--seed", type=int, default=1, help="request mix seed")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--mixed",
        action="store_true",
        help=f"load /v1/best while {MIXED_HEADER_CLIENTS} clients fetch /v1/export/header and "
        f"{MIXED_RESULTS_CLIENTS} page through /v1/results?limit=1000",
    )
    mode.add_argument(
        "--mixed-miss",
        action="store_true",
        help=f"as --mixed, but the {MIXED_HEADER_CLIENTS} header clients vary d and dtype and "
        f"the {MIXED_RESULTS_CLIENTS} page clients offset and limit: every request renders",
    )
    mode.add_argument(
        "--flood",
        type=int,
        metavar="N",
        help="open N idle TCP connections, then probe /v1/best on fresh connections",
    )
    mode.add_argument(
        "--header-flood",
        type=int,
        metavar="N",
        help="N connections each send a --header-mb request header that never ends, then probes",
    )
    parser.add_argument("--header-mb", type=int, default=16, help="--header-flood: MB each")
    parser.add_argument("--probes", type=int, default=30, help="floods: /v1/best probes")
    parser.add_argument("--probe-timeout", type=float, default=5.0, help="floods: s per probe")
    parser.add_argument(
        "--hold", type=float, default=10.0, help="--flood: s to hold the idle connections after"
    )
    parser.add_argument(
        "--page-clients",
        type=int,
        default=MIXED_RESULTS_CLIENTS,
        help="--mixed-miss: clients asking /v1/results pages (issue 27's starvation case: 100)",
    )
    parser.add_argument(
        "--polite",
        action="store_true",
        help="mixed modes: slow clients wait after a 429/503 (else they ask again at once)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--target-rps", type=float, default=2000.0)
    parser.add_argument("--target-p99-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    for noisy in ("httpx", "alembic", "db", "sqlalchemy"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    if args.command == "seed":
        if args.db is None:
            parser.error("seed needs the SQLite file to fill")
        log.info("seeded %s: %d measurements", args.db, seed(args.db))
        return 0
    if args.requests < 1 or args.concurrency < 1:
        parser.error("--requests and --concurrency must be >= 1")

    figures = spawn_and_load(args) if args.spawn else run_mode(args, args.url, None)
    if args.json:
        log.info("%s", json.dumps(figures, indent=2))
    else:
        _report(figures)
    if figures.get("mode") in ("flood", "header-flood"):
        ok = figures["answered_200"] == figures["probes"]
        if not ok:
            log.info("not every probe was answered")
        return 0 if ok else 1
    ok = (
        figures["errors"] == 0
        and figures["requests_per_s"] >= args.target_rps
        and figures["p99_ms"] < args.target_p99_ms
    )
    if not ok:
        log.info(
            "below target (>= %.0f req/s, p99 < %.0f ms, no errors)",
            args.target_rps, args.target_p99_ms,
        )  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
