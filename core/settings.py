"""The one place the environment is read.

Every setting has a default, an ``FA2TUNE_*`` environment variable and, where it makes sense,
a command-line flag that overrides both (the CLI passes flags in as keyword arguments).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from platformdirs import user_cache_dir, user_data_dir
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

APP_NAME = "fa2tune"


def _default_db_url() -> str:
    return f"sqlite:///{Path(user_data_dir(APP_NAME)) / 'fa2tune.db'}"


def _default_cache_dir() -> Path:
    return Path(user_cache_dir(APP_NAME)) / "build"


class Settings(BaseSettings):
    """Run-time settings of every fa2tune component."""

    model_config = SettingsConfigDict(env_prefix="FA2TUNE_", extra="ignore")

    db_url: str = Field(default_factory=_default_db_url, description="SQLAlchemy database URL")
    cache_dir: Path = Field(
        default_factory=_default_cache_dir, description="where rendered sources and cubins live"
    )
    host: str = Field(default="127.0.0.1", description="service bind address")
    port: int = Field(default=8000, ge=1, le=65535, description="service port")
    ingest_token: str | None = Field(
        default=None, description="bearer token for POST /v1/results; writes refused when unset"
    )
    service_threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description="service: requests served at a time per slow endpoint group (header "
        "export, result pages); more wait, so /v1/best keeps the CPU",
    )
    service_queue: int = Field(
        default=32,
        ge=0,
        le=1024,
        description="service: requests that may wait per slow endpoint group (header export, "
        "result pages, ingest) while the group is busy; one more is refused at once (429 "
        "with Retry-After)",
    )
    # 0.9 s: a request refused after its wait still gets its answer within 1 s (the render
    # that frees a slot and the refusal itself take the rest; docs/service.md, "Limits").
    service_queue_wait_s: float = Field(
        default=0.9,
        gt=0,
        le=60,
        description="service: longest wait in a slow endpoint group's queue; a request still "
        "waiting then is refused (503 with Retry-After)",
    )
    service_render_processes: int = Field(
        default=1,
        ge=0,
        le=64,
        description="service: processes that read and render result pages and headers, off "
        "the server's interpreter (so /v1/best keeps it); 0 renders in the server's threads",
    )
    service_max_connections: int = Field(
        default=1000,
        ge=8,
        le=1_000_000,
        description="fa2tune serve: open client connections at most (and 128 fewer than the "
        "process's descriptor limit); a new one past it closes the longest-idle one",
    )
    service_keep_alive_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="fa2tune serve: a connection that sends nothing for this long, since it "
        "opened or since its last answer, is closed",
    )
    service_header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="fa2tune serve: a request's line and headers must arrive within this "
        "many seconds of their first byte, else the connection is closed",
    )
    service_max_header_bytes: int = Field(
        default=16 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="fa2tune serve: largest request line plus headers; a larger one is "
        "answered 431 and its connection closed",
    )
    ingest_max_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="service: largest POST /v1/results body (a parsed body takes about 7x its "
        "size in memory); larger files go through `fa2tune ingest`",
    )
    ingest_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="service: seconds a POST /v1/results body may take to arrive, from the "
        "request's start; a slower one is refused (408) and its connection closed",
    )

    @field_validator("ingest_token")
    @classmethod
    def _no_blank_token(cls, value: str | None) -> str | None:
        # A blank token (compose passes "" or " " for an unset variable) means "no token":
        # writes stay refused rather than open to anyone who sends a blank bearer.
        if value is None or not value.strip():
            return None
        return value

    nvcc: str = Field(default="nvcc", description="the nvcc executable")
    compiler: Literal["auto", "nvcc", "nvrtc"] = Field(
        default="auto",
        description="what compiles the kernels: nvcc, NVRTC from the cuda-bindings and "
        "nvidia-cuda-nvrtc wheels (no CUDA toolkit needed), or auto: nvcc when it runs, else "
        "NVRTC",
    )
    build_jobs: int = Field(
        default_factory=lambda: os.cpu_count() or 1, ge=1, description="parallel nvcc jobs"
    )
    log_level: str = Field(default="INFO", description="logging level")
    print_choice: bool = Field(
        default=False,
        description="fa2tune.torch: log each (shape -> config, source) choice once per process",
    )
    check_kvcache: bool = Field(
        default=False,
        description="fa2tune.torch: attention_with_kvcache checks the values it cannot check "
        "cheaply (lengths, batch indices, block-table entries) on the device before each call, "
        "and raises naming the first bad entry (a debug mode: one host sync per call; read "
        "when a cache shape is first decided; not during CUDA-graph capture)",
    )
    fa3_cache: bool = Field(
        default=True,
        description="fa2tune.torch: attention_with_kvcache serves prefill-length calls (more "
        "than 16 query rows: chunked prefill) on compute capability 9.0 with the Hopper "
        "family's cache kernels ahead of split-KV's (H200, 2k new over 32k cached: 0.74-1.01x "
        "the dense kernel's rate from pages of 16 to a contiguous cache, against 0.16-0.32x on "
        "split-KV's; off: split-KV's cache kernels only; read when a cache shape is first "
        "decided)",
    )
    autotune: Literal["off", "cached", "on_first_call"] = Field(
        default="cached",
        description="fa2tune.torch: stored tuning results serve (cached), and untuned shapes "
        "are tuned on first use (on_first_call), or only family defaults run (off); "
        "fa2tune.torch.autotune() overrides it per process",
    )
    autotune_budget_s: float = Field(
        default=30.0,
        gt=0,
        le=24 * 3600,
        description="fa2tune.torch: wall-clock budget of one first-use tuning campaign (s)",
    )
    service_url: str | None = Field(
        default=None,
        description="fa2tune.torch: ask this fa2tune service's GET /v1/best for configs "
        "(e.g. http://host:8000) before the local database",
    )
    service_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="fa2tune.torch: seconds to wait for the service before using local results",
    )


@lru_cache(maxsize=1)
def _from_environment() -> Settings:
    return Settings()


_overrides: dict[str, object] = {}


def get_settings() -> Settings:
    """Settings from the environment (read once per process) with CLI overrides applied."""
    base = _from_environment()
    return base.model_copy(update=_overrides) if _overrides else base


def override_settings(**values: object) -> None:
    """Apply command-line values (``None`` means "not given") over the environment's."""
    _overrides.update({k: v for k, v in values.items() if v is not None})
    Settings.model_validate({**_from_environment().model_dump(), **_overrides})
