"""The service against its own OpenAPI document: schemathesis with every check (issue 15).

The slow test runs what ``st run --checks all`` runs (examples, coverage, fuzzing and
stateful phases through schemathesis's engine) in-process over the ASGI app, on a temporary
SQLite store seeded with a few results, once with the ingest token and once without. The
number of examples per operation is bounded so both runs together take well under a minute.

Failures whose cause is known and reported, but lies outside the service code this file
guards, are listed in :data:`KNOWN`, each matched narrowly, so anything new still fails.
The other tests pin the fixes of what schemathesis found.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from db.store import Store
from fa2tune.settings import get_settings
from service.deps import get_app_settings
from service.main import create_app
from service.routers.export import HEAD_DIMS_PATTERN
from tests.test_service_data import make_store, seed

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOKEN = "s3cret-token"
# Examples per operation and phase: enough for every check to see each operation several
# times, few enough that the two runs stay around 10 s each on a shared 2-core machine.
MAX_EXAMPLES = 25
SEED = 15  # a fixed seed: a CI failure reproduces locally


@dataclass(frozen=True)
class Found:
    """One failed check, with what is needed to reproduce and judge it."""

    phase: str
    operation: str
    check: str
    title: str
    message: str
    request: str
    status: int | None
    body: str

    def __str__(self) -> str:
        return (
            f"[{self.phase}] {self.operation}: {self.check} ({self.title})\n"
            f"    {self.message.strip()}\n    {self.request}\n"
            f"    -> {self.status} {self.body[:300]}"
        )


def _lacks_n_and_nq(found: Found) -> bool:
    query = found.request.partition("?")[2].split("'")[0]
    names = {part.partition("=")[0] for part in query.split("&")}
    return not {"n", "nq"} & names and "give n, or nq" in found.body


def _only_rules_beyond_the_schema(found: Found) -> bool:
    """Every error the server listed comes from one of the results file's own validators
    (pydantic's "Value error, ..."), none from a type or bound the JSON schema states."""
    try:
        detail = str(json.loads(found.body)["detail"])
    except (ValueError, KeyError, TypeError):
        return False
    # split("\n"), not splitlines(): a quoted bad value may hold \x1c, \x85, U+2028 ...
    lines = [line.strip() for line in detail.split("\n")[1:]]
    listed = [line for line in lines if line and not re.fullmatch(r"\.\.\. and \d+ more", line)]
    return bool(listed) and all(": Value error, " in line for line in listed)


def _blank_gpu(found: Found) -> bool:
    try:
        detail = str(json.loads(found.body)["detail"])
    except (ValueError, KeyError, TypeError):
        return False
    return detail.startswith("gpu: must not be blank")


# (operation, check, predicate): failures understood. All but the results file's rules that
# JSON Schema cannot state are to be fixed in code this module does not guard (reported with
# issue 15).
KNOWN: list[tuple[str, str, Callable[[Found], bool]]] = [
    # /v1/best's shape parameters are being reworked (service/params.py, routers/best.py):
    # n and nq are each optional in the document, but one of them is required, which the
    # document does not say, so a request with neither is schema-valid and gets a 422.
    ("GET /v1/best", "positive_data_acceptance", _lacks_n_and_nq),
    # service/params.py's GpuQuery states minLength 1 but refuses blank names ("\t"), so a
    # whitespace-only gpu is schema-valid and gets a 422 (a pattern like "\\S" would say it).
    *(
        (operation, "positive_data_acceptance", _blank_gpu)
        for operation in ("GET /v1/best", "GET /v1/export/header", "GET /v1/results")
    ),
    # A results file has rules JSON Schema cannot state (heads a multiple of kv_heads, config
    # parameters per kernel family, p10 <= median <= p90, TFLOP/s agreeing with the median,
    # references that resolve), so random schema-valid files are refused with a 422 naming
    # them. One such rule could be stated but is not, in db/dump_format.py: the printable-text
    # and GPU-name patterns hold a \ud800-\udfff range, which ECMA-262/Rust regexes reject,
    # so schemathesis (jsonschema-rs) drops both patterns and sends control characters too.
    ("POST /v1/results", "positive_data_acceptance", _only_rules_beyond_the_schema),
    # db/dump_format.py validates in pydantic's lax mode: JSON true/false and numeric strings
    # are taken for integer fields (gpus[].smem_optin_bytes: false is stored as 0). Integral
    # floats (5.0) are integers in JSON Schema too, so a fix must keep accepting those.
    (
        "POST /v1/results",
        "negative_data_rejection",
        lambda found: "Incorrect type" in found.message,
    ),
]


def _known(found: Found) -> bool:
    return any(
        found.operation == operation and found.check == check and matches(found)
        for operation, check, matches in KNOWN
    )


@pytest.fixture(scope="module")
def seeded_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("seeded")
    with make_store(directory) as store:
        seed(store)
    return directory / "fa2tune.db"


@pytest.fixture
def store(tmp_path: Path, seeded_file: Path) -> Iterator[Store]:
    shutil.copyfile(seeded_file, tmp_path / "fa2tune.db")
    s = make_store(tmp_path)
    yield s
    s.close()


@pytest.fixture
def app(store: Store) -> FastAPI:
    """The service over the seeded store, with an ingest token configured."""
    app = create_app(store)
    settings = get_settings().model_copy(update={"ingest_token": TOKEN})
    app.dependency_overrides[get_app_settings] = lambda: settings
    return app


def run_schemathesis(app: FastAPI, headers: dict[str, str]) -> list[Found]:
    """Every phase and every check of schemathesis over ``app``; every failed check."""
    import schemathesis
    from schemathesis.engine import events, from_schema

    # No max_time: with one, the fuzzing phase repeats until the time is up.
    config = schemathesis.Config(seed=SEED)
    project = config.projects.override
    project.checks.update(included_check_names=["all"])
    # database "none": no .hypothesis directory in the working tree, and every run the same.
    project.generation.update(max_examples=MAX_EXAMPLES, database="none")
    if headers:
        project.update(headers=headers)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)

    found: list[Found] = []
    finished = None
    for event in from_schema(schema).execute():
        if isinstance(event, events.FatalError):
            raise AssertionError(f"schemathesis could not run: {event.exception!r}")
        if isinstance(event, events.NonFatalError):
            raise AssertionError(f"schemathesis error on {event.label}: {event.value!r}")
        if isinstance(event, events.EngineFinished):
            finished = event
        if not isinstance(event, events.ScenarioFinished):
            continue
        recorder = event.recorder
        for case_id, nodes in recorder.checks.items():
            for node in nodes:
                if node.failure_info is None:
                    continue
                failure = node.failure_info.failure
                interaction = recorder.interactions.get(case_id)
                response: Any = interaction.response if interaction is not None else None
                item = Found(
                    phase=str(event.phase.value),
                    operation=recorder.label,
                    check=node.name,
                    title=failure.title,
                    message=failure.message,
                    request=node.failure_info.code_sample.replace("\n", " "),
                    status=None if response is None else response.status_code,
                    body="" if response is None else response.content.decode("utf-8", "replace"),
                )
                found.append(item)
    assert finished is not None, "schemathesis did not finish"
    assert str(finished.stop_reason.value) == "completed", finished.stop_reason
    return found


@pytest.mark.slow
@pytest.mark.parametrize("token", [True, False], ids=["with-token", "without-token"])
def test_schemathesis_all_checks(app: FastAPI, token: bool) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if token else {}
    found = run_schemathesis(app, headers)
    # One example of each kind of unexpected failure.
    unexpected = list(
        {(f.operation, f.check, f.title): f for f in reversed(found) if not _known(f)}.values()
    )
    assert not unexpected, "schemathesis found:\n" + "\n".join(map(str, unexpected))


# ------------------------------------------------------ what schemathesis found, pinned


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def test_header_d_is_documented_as_the_route_reads_it(client: TestClient) -> None:
    """``d`` was documented as any string, so schemathesis sent schema-valid values the
    route refused with a 422; the document now states the accepted form."""
    doc = client.get("/openapi.json").json()
    (param,) = (
        p for p in doc["paths"]["/v1/export/header"]["get"]["parameters"] if p["name"] == "d"
    )
    items = param["schema"]["anyOf"][0]["items"]
    assert items == {"type": "string", "pattern": HEAD_DIMS_PATTERN}


@pytest.mark.parametrize("d", ["64", "64,128", "32,64,96,128,256"])
def test_header_takes_documented_head_dims(client: TestClient, d: str) -> None:
    r = client.get("/v1/export/header", params={"gpu": "H200", "d": d})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("d", "why"),
    [
        ("48", "32, 64, 96, 128, 256"),
        ("x", "not an integer: 'x'"),
        (" 64", "write head dims like 64 or 64,128 (got ' 64')"),
        ("064", "write head dims like 64 or 64,128 (got '064')"),
        ("64,,128", "write head dims like 64 or 64,128"),
        ("", "write head dims like 64 or 64,128 (got '')"),
    ],
)
def test_header_refuses_what_the_document_does_not_allow(
    client: TestClient, d: str, why: str
) -> None:
    """What the pattern excludes is refused, so no schema-invalid request is served."""
    r = client.get("/v1/export/header", params={"gpu": "H200", "d": d})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == ["query", "d"]
    assert why in r.json()["detail"], r.json()["detail"]
