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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from codegen.dispatch_kvcache import KV_PAGE_SIZES
from core.config import HEAD_DIMS
from db.dump_fields import GPU_NAME_PATTERN
from service.params import N_OR_NQ, NAME_PATTERN
from service.routers.best import KV_LENGTHS_NEED_A_PAGE
from service.routers.export import HEAD_DIMS_PATTERN, KV_PAGES_PATTERN
from tests.support.service_data import set_token

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
    # Each error is a line indented by two blanks; split there, not at every "\n" nor with
    # splitlines(): a quoted bad value may hold a newline, \x1c, \x85, U+2028 ...
    lines = [line.strip() for line in detail.split("\n  ")[1:]]
    listed = [line for line in lines if line and not re.fullmatch(r"\.\.\. and \d+ more", line)]
    return bool(listed) and all(": Value error, " in line for line in listed)


def _integer_with_zero_fraction(found: Found) -> bool:
    """Every refused value is a whole number written with a zero fraction ("30.0")."""
    try:
        errors = json.loads(found.body)["errors"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(errors) and all(
        "plain decimal integer" in str(e.get("msg"))
        and re.fullmatch(r"[0-9]+\.0+", str(e.get("input")))
        for e in errors
    )


def _heads_not_a_multiple(found: Found) -> bool:
    return "must be a multiple of kv_heads" in found.body


def _n_and_nq_differ(found: Found) -> bool:
    return "differs from n" in found.body and '"loc":["query","nq"]' in found.body


def _lengths_without_a_page(found: Found) -> bool:
    """The only refusal is of ``kv_lengths`` given without ``kv_page``."""
    try:
        errors = json.loads(found.body)["errors"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(errors) and all(
        e.get("loc") == ["query", "kv_lengths"] and e.get("msg") == KV_LENGTHS_NEED_A_PAGE
        for e in errors
    )


def _lengths_past_int32(found: Found) -> bool:
    """The only refusal is of lengths past int32, each or in all (the pattern caps digits)."""
    try:
        errors = json.loads(found.body)["errors"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(errors) and all(
        e.get("loc") == ["query", "seqlens"]
        and re.match(r"(each length must be between 1 and|the lengths add up to)", str(e["msg"]))
        for e in errors
    )


# (operation, check, predicate): failures understood, each a rule OpenAPI 3.1 / JSON Schema
# cannot state; the document says them in words instead.
KNOWN: list[tuple[str, str, Callable[[Found], bool]]] = [
    # /v1/best needs n or nq. OpenAPI describes query parameters one by one, so it cannot say
    # "one of two parameters is required": both are optional in the document, whose
    # parameter and operation descriptions state the rule, and schemathesis sends requests
    # with neither, which get the 422 naming n (pinned below).
    ("GET /v1/best", "positive_data_acceptance", _lacks_n_and_nq),
    # A results file has rules across fields and records that JSON Schema cannot state
    # (heads a multiple of kv_heads, config parameters per kernel family, config_name
    # matching config, p10 <= median <= p90, TFLOP/s agreeing with the median, references
    # that resolve inside the file; all in DumpFile's descriptions), so random schema-valid
    # files are refused with a 422 naming them. Only refusals that are all such rules match.
    ("POST /v1/results", "positive_data_acceptance", _only_rules_beyond_the_schema),
    # /v1/best/varlen: heads must be a multiple of kv_heads, a rule across two parameters.
    ("GET /v1/best/varlen", "positive_data_acceptance", _heads_not_a_multiple),
    # ... and each length, and their sum, at most 2^31-1: the published pattern caps a length
    # at ten digits, which a regex cannot bound by value (nor bound a sum); the parameter's
    # description says it.
    ("GET /v1/best/varlen", "positive_data_acceptance", _lengths_past_int32),
    # /v1/best: n and nq, when both are given, must be equal (N_OR_NQ says it in words).
    ("GET /v1/best", "positive_data_acceptance", _n_and_nq_differ),
    # /v1/best: kv_lengths needs kv_page, a rule across two parameters (its description says
    # "Without kv_page: a 422").
    ("GET /v1/best", "positive_data_acceptance", _lengths_without_a_page),
    # A query integer has one spelling, its digits (issue 27: "4096.0" was taken as 4096);
    # JSON Schema counts 30.0 as an integer, so schemathesis sends "30.0" for a
    # schema-valid 30. Only refusals of such values match.
    *(
        (operation, "positive_data_acceptance", _integer_with_zero_fraction)
        for operation in ("GET /v1/best", "GET /v1/best/varlen", "GET /v1/results")
    ),
]


def _known(found: Found) -> bool:
    return any(
        found.operation == operation and found.check == check and matches(found)
        for operation, check, matches in KNOWN
    )


@pytest.fixture
def app(app: FastAPI) -> FastAPI:
    """The service over the seeded store (``tests/service/conftest.py``), with an ingest token
    configured."""
    set_token(app, TOKEN)
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


def test_header_d_is_documented_as_the_route_reads_it(client: TestClient) -> None:
    """``d`` was documented as any string, so schemathesis sent schema-valid values the
    route refused with a 422; the document now states the accepted form."""
    doc = client.get("/openapi.json").json()
    (param,) = (
        p for p in doc["paths"]["/v1/export/header"]["get"]["parameters"] if p["name"] == "d"
    )
    items = param["schema"]["anyOf"][0]["items"]
    assert items == {"type": "string", "pattern": HEAD_DIMS_PATTERN}


def test_head_dims_pattern_is_the_rule() -> None:
    """The documented pattern takes exactly the supported head dims, alone or in a list."""
    pattern = re.compile(HEAD_DIMS_PATTERN)
    for d in range(0, 600):
        assert bool(pattern.fullmatch(str(d))) == (d in HEAD_DIMS), d
    assert pattern.fullmatch(",".join(map(str, HEAD_DIMS)))
    assert pattern.fullmatch("80,8,256,40")
    for bad in ("8,", ",8", "8,,16", "08", "2560", "80 ", "8,7"):
        assert not pattern.fullmatch(bad), bad


def test_kv_pages_pattern_is_the_rule() -> None:
    """The documented ``kv_pages`` pattern takes exactly the page sizes the exporter takes."""
    pattern = re.compile(KV_PAGES_PATTERN)
    for p in range(0, 5000):
        assert bool(pattern.fullmatch(str(p))) == (p in KV_PAGE_SIZES), p
    assert pattern.fullmatch(",".join(map(str, KV_PAGE_SIZES)))
    for bad in ("16,", ",16", "016", "16 ", "8192", ""):
        assert not pattern.fullmatch(bad), bad


@pytest.mark.parametrize("d", ["64", "64,128", "32,64,96,128,256", "8", "40,80,160,192", "256"])
def test_header_takes_documented_head_dims(client: TestClient, d: str) -> None:
    r = client.get("/v1/export/header", params={"gpu": "H200", "d": d})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("d", "why"),
    [
        ("12", "must be a multiple of 8 from 8 to 256 (got 12)"),
        ("64,264", "must be a multiple of 8 from 8 to 256 (got 264)"),
        ("0", "must be a multiple of 8 from 8 to 256 (got 0)"),
        ("x", "not a plain decimal integer: 'x'"),
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


# /v1/best: n or nq


def test_best_documents_that_n_or_nq_is_required(client: TestClient) -> None:
    """OpenAPI cannot require one of two parameters; both parameters and the operation
    say it in words (the one KNOWN entry left for /v1/best)."""
    op = client.get("/openapi.json").json()["paths"]["/v1/best"]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    for name in ("n", "nq"):
        assert not params[name]["required"]
        assert N_OR_NQ in params[name]["description"], name
    assert "Give ``n`` or ``nq``" in op["description"]
    r = client.get("/v1/best", params={"gpu": "H200", "d": 64, "batch": 1})
    assert r.status_code == 422
    assert r.json()["detail"] == "n: required: give n, or nq for a whole shape"


def test_api_description_names_whole_shapes(client: TestClient) -> None:
    description = client.get("/openapi.json").json()["info"]["description"]
    for name in ("`nq`", "`nk`", "`batch`", "`heads`", "`kv_heads`", "`measured_problem`"):
        assert name in description, name


# gpu: not blank


def _gpu_param(doc: dict[str, Any], path: str) -> dict[str, Any]:
    (param,) = (p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == "gpu")
    return dict(param["schema"])


@pytest.mark.parametrize("path", ["/v1/best", "/v1/export/header"])
def test_gpu_documents_not_blank(client: TestClient, path: str) -> None:
    """A blank name ("\\t") was schema-valid (minLength 1) and got a 422; the pattern says
    "has a non-blank character", in the sense of str.strip, for every regex engine, and no
    control character (a NUL, U+0001: refused with their own message)."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = _gpu_param(client.get("/openapi.json").json(), path)
    assert schema["pattern"] == NAME_PATTERN
    validator = jsonschema_rs.Draft202012Validator(schema)
    for blank in ["\t", " ", "\x1c", "\u3000 \u00a0", "\u2028"]:
        assert not validator.is_valid(blank), repr(blank)
        r = client.get(path, params={"gpu": blank, "d": 64, "n": 1024})
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("gpu: must not be blank"), r.text
    for bad in ["H200\x00", "\x01H200", "H2\x7f00"]:
        assert not validator.is_valid(bad), repr(bad)
        r = client.get(path, params={"gpu": bad, "d": 64, "n": 1024})
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("gpu: must not contain control"), r.text
    for name in [" H200 ", "\tH200", "h200"]:
        assert validator.is_valid(name)
        r = client.get(path, params={"gpu": name, "d": 64, "n": 1024})
        assert r.status_code == 200, r.text


# POST /v1/results: JSON types and patterns


def _one_gpu_file(**gpu: Any) -> dict[str, Any]:
    record = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132}
    record.update(driver_version="550.54", cuda_version="12.4")
    return {"format": "fa2tune-results", "gpus": [{**record, **gpu}]}


@pytest.mark.parametrize(
    ("gpu", "status"),
    [
        ({"smem_optin_bytes": False}, 422),  # what schemathesis found stored as 0
        ({"sm_count": "132"}, 422),
        ({"memory_bytes": True}, 422),
        ({"sm_count": 132.0}, 200),  # an integer in JSON Schema: taken
        ({"name": "NVIDIA"}, 422),
        ({"name": "H200\u0086"}, 422),
    ],
)
def test_ingest_answers_as_the_document_says(
    client: TestClient, gpu: dict[str, Any], status: int
) -> None:
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    doc = client.get("/openapi.json").json()
    schema = {"$ref": "#/components/schemas/DumpFile", "components": doc["components"]}
    body = _one_gpu_file(**gpu)
    assert jsonschema_rs.validator_for(schema).is_valid(body) == (status == 200)
    r = client.post("/v1/results", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == status, r.text


def test_results_file_patterns_are_kept_by_schemathesis(client: TestClient) -> None:
    """The printable-text and GPU-name patterns held a \\ud800-\\udfff range that the
    regex engine of schemathesis cannot compile, so it dropped them (and sent control
    characters as valid text); every pattern of the document is now kept."""
    from schemathesis.core.jsonschema.patterns import enforced_pattern

    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert schemas["GpuRecord"]["properties"]["name"]["pattern"] == GPU_NAME_PATTERN
    patterns = set(_patterns(doc))
    assert GPU_NAME_PATTERN in patterns
    assert all(enforced_pattern(pattern) == pattern for pattern in patterns), patterns


def _patterns(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(node, list):
        for item in node:
            yield from _patterns(item)
