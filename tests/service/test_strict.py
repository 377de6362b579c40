"""Strict query parsing and the error contract of the HTTP API (issue 27).

One value has one spelling: integers are ASCII digits, booleans true/false/1/0, a scalar
parameter is given once, and no name or value holds a control character. Each case is asked
of both paths that answer ``/v1/best`` (the ASGI fast path and the FastAPI route), since a
client cannot choose which one serves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import DatabaseError

from core.settings import Settings
from db.store import Store
from service.deps import get_app_settings
from service.main import create_app
from tests.support.service_data import make_store, seed

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


#: Every case through the fast path and through the FastAPI route (the conftest's ``client``).
BOTH_PATHS = True


PLAIN = {"gpu": "H200", "dtype": "fp16", "d": "128", "n": "4096"}


def best(client: TestClient, **params: str) -> Any:
    """``/v1/best`` for the plain request with ``params`` replacing or adding values."""
    return client.get("/v1/best", params={**PLAIN, **params})


def _error(r: Any, param: str) -> str:
    """The 422's message, which must be about ``param`` alone."""
    assert r.status_code == 422, r.text
    body = r.json()
    assert [e["loc"][-1] for e in body["errors"]] == [param], body
    return str(body["detail"])


def test_plain_request_is_answered(client: TestClient) -> None:
    r = best(client)
    assert r.status_code == 200, r.text
    assert r.json()["n"] == 4096


@pytest.mark.parametrize("spelling", ["4_096", "+4096", "4096.0", " 4096", "4096 ", "0x1000"])
def test_integer_spellings_other_than_digits_are_refused(client: TestClient, spelling: str) -> None:
    r = best(client, n=spelling)
    assert "plain decimal integer" in _error(r, "n")


@pytest.mark.parametrize("param", ["nq", "nk", "batch", "heads", "kv_heads"])
def test_shape_integers_are_strict_too(client: TestClient, param: str) -> None:
    r = best(client, **{param: "+2"})
    assert "plain decimal integer" in _error(r, param)


def test_head_dim_must_be_digits(client: TestClient) -> None:
    assert "plain decimal integer" in _error(best(client, d="128.0"), "d")


@pytest.mark.parametrize("spelling", ["yes", "on", "t", "y", "2", ""])
def test_boolean_spellings_are_refused(client: TestClient, spelling: str) -> None:
    r = best(client, causal=spelling)
    assert "true or false" in _error(r, "causal")


@pytest.mark.parametrize("spelling", ["true", "True", "FALSE", "1", "0"])
def test_boolean_spellings_that_are_taken(client: TestClient, spelling: str) -> None:
    r = best(client, exact=spelling)
    assert r.status_code == 200, r.text


def test_repeated_scalar_parameter_is_refused(client: TestClient) -> None:
    # Starlette would take the last value: this asked for H100 and answered for it.
    r = client.get("/v1/best?gpu=H200&gpu=H100&d=128&n=4096")
    assert "given 2 times" in _error(r, "gpu")


def test_nul_in_a_value_is_refused(client: TestClient) -> None:
    r = client.get("/v1/best?gpu=H200%00&d=128&n=4096")
    assert "control characters" in _error(r, "gpu")


def test_control_character_in_a_name_is_refused(client: TestClient) -> None:
    r = client.get("/v1/best?gpu=H200&d=128&n=4096&x%01=1")
    assert "control characters" in _error(r, "x\x01")


def test_list_parameters_may_repeat(client: TestClient) -> None:
    r = client.get("/v1/export/header?gpu=H200&d=64&d=128&dtype=fp16&dtype=bf16")
    assert r.status_code == 200, r.text[:300]


def test_export_head_dims_are_strict(client: TestClient) -> None:
    r = client.get("/v1/export/header", params={"gpu": "H200", "d": "+64"})
    assert r.status_code == 422, r.text[:300]
    assert r.json()["detail"].startswith("d: "), r.text


@pytest.mark.parametrize("param,value", [("offset", "1_0"), ("limit", "+5"), ("n", "1e3")])
def test_result_pages_take_plain_integers(client: TestClient, param: str, value: str) -> None:
    r = client.get("/v1/results", params={"gpu": "H200", param: value})
    assert "plain decimal integer" in _error(r, param)


def test_trailing_slash_is_not_redirected_to_the_clients_host(client: TestClient) -> None:
    r = client.get("/v1/results/", headers={"Host": "evil.example"}, follow_redirects=False)
    assert r.status_code == 404
    assert "location" not in r.headers


def test_ingest_refuses_a_body_declared_as_not_json(client: TestClient) -> None:
    settings = Settings(ingest_token="t")
    app: Any = client.app
    app.dependency_overrides[get_app_settings] = lambda: settings
    try:
        r = client.post(
            "/v1/results",
            content=b"a=1",
            headers={"Authorization": "Bearer t", "Content-Type": FORM},
        )
    finally:
        app.dependency_overrides.clear()
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["detail"]


FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize("token", ["", " ", "\t\n"])
def test_blank_ingest_token_means_writes_disabled(token: str) -> None:
    assert Settings(ingest_token=token).ingest_token is None
    assert Settings(ingest_token=" t ").ingest_token == " t "


def test_any_database_error_is_a_json_503(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_store(tmp_path)
    seed(s)

    def broken(*args: object, **kwargs: object) -> object:
        # What SQLite raises for a truncated or overwritten file, wrapped by SQLAlchemy.
        raise DatabaseError("SELECT 1", {}, Exception("file is not a database"))

    try:
        with TestClient(create_app(s), raise_server_exceptions=False) as c:
            monkeypatch.setattr(Store, "gpus", broken)
            r = c.get("/v1/gpus")
    finally:
        s.close()
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.headers["retry-after"].isdigit()
    assert "Traceback" not in r.text and "database unavailable" in r.json()["detail"]
