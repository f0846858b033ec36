"""Every route of the "Model quality" app is behind Airflow's auth, the schema included;
ids are matched whole.

The routes come from the app's own route table, so a route added later is covered
without touching this file. Tokens are real (Airflow's SimpleAuthManager, the fixture of
tests/test_plugin_api.py).
"""

from __future__ import annotations

import re

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from tests.test_plugin_api import auth, store, token  # noqa: F401 (fixtures)


def _app(store_path):
    from embedfresh.plugins.model_quality import create_app

    return create_app(f"file://{store_path}")


def _urls(app) -> list[str]:
    """One URL per route of the table: path parameters and required query parameters
    filled with a valid id."""
    urls = []
    for route in app.routes:
        assert isinstance(route, APIRoute), f"{route!r} is not an APIRoute: is it behind auth?"
        path = re.sub(r"\{[^}]+\}", "tiny", route.path)
        query = [p.name for p in route.dependant.query_params if p.field_info.is_required()]
        urls.append(path + ("?" + "&".join(f"{q}=tiny" for q in query) if query else ""))
    return urls


def test_every_route_of_the_table_answers_401_unauthenticated(auth, store):  # noqa: F811
    app = _app(store)
    urls = _urls(app)
    assert "/openapi.json" in urls and "/" in urls  # the schema is one of the routes
    anonymous = TestClient(app, raise_server_exceptions=False)
    for url in urls:
        r = anonymous.get(url)
        assert r.status_code == 401, f"{url}: {r.status_code} {r.text[:200]}"
        assert "tiny" not in r.json().get("detail", "") if url.startswith("/api") else True


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_fastapis_own_docs_routes_do_not_answer_without_login(auth, store, path):  # noqa: F811
    r = TestClient(_app(store), raise_server_exceptions=False).get(path)
    assert r.status_code in (401, 404), r.text
    assert "swagger" not in r.text.lower() and '"paths"' not in r.text


def test_the_schema_is_served_to_a_logged_in_user(auth, store):  # noqa: F811
    c = TestClient(_app(store), raise_server_exceptions=False)
    r = c.get("/openapi.json", headers={"Authorization": f"Bearer {token(auth, 'viewer')}"})
    assert r.status_code == 200, r.text
    assert "/api/models/{model}" in r.json()["paths"]


@pytest.mark.parametrize("value", ["tiny\n", "tiny\r\n", "\ntiny", "tiny ", "r1\n"])
def test_safe_id_refuses_a_trailing_newline(value):
    with pytest.raises(BadInputError, match="invalid model"):
        layout.safe_id(value, "model")
    with pytest.raises(BadInputError):
        layout.run_index(value)


@pytest.mark.parametrize(
    "url",
    [
        "/?model=tiny%0A",
        "/chart.svg?model=tiny%0A",
        "/api/models/tiny%0A",
        "/api/models/tiny%0A/decisions",
        "/api/models/tiny/runs/demo-2026-01-01%0A/gate",
    ],
)
def test_ids_with_a_trailing_newline_are_400_through_the_routes(auth, store, url):  # noqa: F811
    c = TestClient(_app(store), raise_server_exceptions=False)
    r = c.get(url, headers={"Authorization": f"Bearer {token(auth, 'viewer')}"})
    assert r.status_code == 400, f"{url}: {r.status_code} {r.text[:300]}"
    assert "invalid" in r.text
