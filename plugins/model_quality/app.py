"""The plugin's FastAPI app: the "Model quality" page and its JSON endpoints.

Mounted by the api-server under :data:`~embedfresh.plugins.model_quality.settings.URL_PREFIX`.
Every route, the OpenAPI schema included (FastAPI's own docs routes are off: they
ignore app-level dependencies), requires a user the api-server's auth manager accepts
(the JWT cookie the Airflow login sets, or an ``Authorization: Bearer`` token) and who
may see the Airflow website; ids in URLs are checked with :func:`embedfresh.core.layout.safe_id` before they reach the
store; errors come back as a message (HTML for the page, JSON for ``/api``), never as
a stack trace. The endpoints are documented in docs/UI.md.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from embedfresh.core import layout
from embedfresh.core.exit_codes import BadInputError
from embedfresh.core.storage import ArtifactStore
from embedfresh.plugins.model_quality import actions, reports
from embedfresh.plugins.model_quality.chart import curve_chart
from embedfresh.plugins.model_quality.page import message_page, render_page
from embedfresh.plugins.model_quality.settings import URL_PREFIX, artifact_root, storage_options

log = logging.getLogger(__name__)

_bearer = HTTPBearer(auto_error=False)


async def authorized_user(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Any:
    """The Airflow user behind the request, checked by the api-server's auth manager.

    :raises HTTPException: 401 without a valid token, 403 when the user may not see
        the Airflow website.
    """
    # Imported here: the plugin module is loaded by every Airflow component, the
    # api-server's security machinery is needed only when a request arrives.
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
    from airflow.api_fastapi.core_api.security import get_user

    user = await get_user(request, None, bearer)
    if not get_auth_manager().is_authorized_view(access_view=AccessView.WEBSITE, user=user):
        raise HTTPException(status_code=403, detail="you may not view the Airflow website")
    return user


def _store(request: Request) -> ArtifactStore:
    root = request.app.state.artifact_root or artifact_root()
    return ArtifactStore(root, storage_options(root))


Store = Annotated[ArtifactStore, Depends(_store)]
#: The request's user (FastAPI resolves the app-wide ``authorized_user`` once per request).
User = Annotated[Any, Depends(authorized_user)]


def _model(model: str) -> str:
    return layout.safe_id(model, "model")


def _wants_html(request: Request) -> bool:
    return not request.url.path.startswith(f"{request.scope.get('root_path', '')}/api")


def _error(request: Request, status: int, message: str) -> Response:
    if not _wants_html(request):
        return JSONResponse({"detail": message}, status_code=status)
    link = None
    if status == 401:
        link = (_login_url(request), "Log in to Airflow")
    return HTMLResponse(message_page("Model quality", message, link), status_code=status)


def _login_url(request: Request) -> str:
    try:
        from airflow.api_fastapi.app import get_auth_manager

        return get_auth_manager().get_url_login(next_url=str(request.url))
    except Exception:  # no auth manager initialised: the message still stands
        return "/"


router = APIRouter()

#: The page's sections by the name ``/api/models/{model}/{section}`` takes.
SECTION_READERS = {
    "registry": reports.registry,
    "release": reports.live_release,
    "decisions": reports.decisions,
    "curve": reports.latest_curve,
    "health": reports.health,
    "compile-cache": reports.compile_cache,
    "embeddings": reports.embeddings,
    "costs": reports.costs,
    "search-checks": reports.search_checks,
}


@router.get("/", response_class=HTMLResponse, summary="The Model quality page")
def page(store: Store, user: User, model: str | None = None) -> HTMLResponse:
    names = reports.models(store)
    if model is None:
        if not names:
            return HTMLResponse(
                message_page(
                    "Model quality",
                    f"no model in the artifact store {store.root} yet: run a DAG first",
                )
            )
        model = names[0]
    model = _model(model)
    return HTMLResponse(
        render_page(
            model,
            names,
            reports.overview(store, model),
            store.root,
            store=store,
            overrides=actions.permitted(user),
        )
    )


@router.get("/chart.svg", summary="The latest candidate's evaluation curve as SVG")
def chart(store: Store, model: str) -> Response:
    model = _model(model)  # an invalid id is 400, not "no chart"
    section = reports.guarded("evaluation curve", lambda: reports.latest_curve(store, model))
    if not section.available:
        raise HTTPException(status_code=404, detail=section.message)
    return Response(curve_chart(section.data), media_type="image/svg+xml")


@router.get("/api/models", summary="Models found in the artifact store")
def list_models(store: Store) -> dict[str, Any]:
    return {"artifact_root": store.root, "models": reports.models(store)}


@router.get("/api/models/{model}", summary="Every section of the page for one model")
def overview(store: Store, model: str) -> dict[str, Any]:
    sections = reports.overview(store, _model(model))
    return {"model": model, **{k: s.as_dict() for k, s in sections.items()}}


@router.get("/api/models/{model}/{section}", summary="One section of the page")
def section(store: Store, model: str, section: str) -> dict[str, Any]:
    reader = SECTION_READERS.get(section)
    if reader is None:
        raise HTTPException(
            status_code=404,
            detail=f"unknown section {section!r}; one of {', '.join(SECTION_READERS)}",
        )
    model = _model(model)
    return reports.guarded(section, lambda: reader(store, model)).as_dict()


@router.get("/api/models/{model}/runs/{run_id}/gate", summary="One run's gate.json, whole")
def gate(store: Store, model: str, run_id: str) -> dict[str, Any]:
    model, run_id = _model(model), layout.safe_id(run_id, "run id")
    doc = reports.gate_report(store, model, run_id)
    if doc is None:
        raise HTTPException(
            status_code=404,
            detail=f"no gate report for {model} run {run_id} "
            f"({store.url(layout.report(model, run_id, 'gate'))})",
        )
    return doc


@router.get("/openapi.json", summary="The OpenAPI schema of these endpoints")
def openapi(request: Request) -> dict[str, Any]:
    return request.app.openapi()


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(request, exc.status_code, str(exc.detail))


async def _bad_input(request: Request, exc: Exception) -> Response:
    return _error(request, 400, str(exc))


async def _bad_report(request: Request, exc: Exception) -> Response:
    return _error(request, 422, str(exc))


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("model quality page failed")
    return _error(request, 500, f"the page failed: {type(exc).__name__}: {exc}")


def create_app(root: str | None = None) -> FastAPI:
    """The plugin app; ``root`` overrides the artifact root (tests), else the DAGs' root."""
    app = FastAPI(
        title="Model quality",
        description="The live release, its history, gate decisions, curves, search checks, "
        "health, compile cache and embeddings.",
        dependencies=[Depends(authorized_user)],
        # FastAPI's own docs routes ignore the app's dependencies: they would answer
        # without login. The schema is served by :func:`openapi` as an ordinary,
        # authenticated route; the interactive docs (Swagger UI, ReDoc) would load
        # scripts from a CDN, so they are off.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.artifact_root = root
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(BadInputError, _bad_input)
    app.add_exception_handler(reports.ReportError, _bad_report)
    app.add_exception_handler(Exception, _crash)
    app.include_router(router)
    return app


def plugin_app_spec() -> dict[str, Any]:
    """The ``fastapi_apps`` entry of the AirflowPlugin."""
    return {"app": create_app(), "url_prefix": URL_PREFIX, "name": "Model quality"}
