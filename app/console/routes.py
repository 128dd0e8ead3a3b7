"""Console pages: thin front doors over the triage use cases.

Every page works without JavaScript; every POST carries the session's CSRF
token (else 403). Content (bodies, links, codes) is never shown, and
subjects are masked.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from app.console import session as sessions
from app.domain import masking
from app.domain.ids import token_hash
from app.errors import SignalboxError
from app.settings import Settings
from app.usecases import triage, webhooks
from app.usecases.auth import Principal, principal_for_token
from app.usecases.inputs import Discard, Redrive
from app.usecases.triage import BulkDiscard, BulkRedrive, DeadLetterFilter

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(directory=str(HERE / "templates"))

router = APIRouter(prefix="/console", include_in_schema=False)

FILTER_FIELDS = ("state", "reason", "provider", "run_id", "namespace")
STATES = ("open", "redriven", "discarded")
REASONS = ("deadline", "check_budget", "provider_errors", "claims_exhausted")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def mask_subject(subject: str | None) -> str:
    """A subject as the console shows it: codes, links and addresses masked."""
    return masking.mask_subject(subject or "")


def _when(value: str | datetime | None) -> str:
    """A timestamp as `YYYY-MM-DD HH:MM:SS UTC`."""
    if value is None:
        return "—"
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters["mask"] = mask_subject
templates.env.filters["when"] = _when


# ---------------------------------------------------------------- plumbing


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _key(request: Request) -> bytes:
    return sessions.secret_key(_settings(request))


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _render(
    request: Request,
    name: str,
    status_code: int = 200,
    session: sessions.Session | None = None,
    **context: Any,
) -> HTMLResponse:
    if session is not None:
        context.setdefault("csrf", sessions.csrf_token(_key(request), session.sid))
        p = session.principal
        who = f"operator {p.operator}" if p.is_ops else f"namespace {p.namespace}"
        context.setdefault("who", who)
        context.setdefault("is_ops", p.is_ops)
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


def _redirect(url: str) -> RedirectResponse:
    response = RedirectResponse(url, status_code=303)
    response.headers.update(SECURITY_HEADERS)
    return response


async def _session(request: Request) -> sessions.Session | None:
    """The signed-in session, if its cookie holds and its token is still configured."""
    key = _key(request)
    found = sessions.decode(key, request.cookies.get(sessions.SESSION_COOKIE))
    if found is None:
        return None
    valid = await run_in_threadpool(
        triage.principal_still_valid,
        _settings(request),
        found.principal,
        found.fingerprint,
        lambda h: sessions.fingerprint(key, h),
    )
    return found if valid else None


def _forbidden(request: Request, session: sessions.Session | None) -> HTMLResponse:
    return _render(
        request,
        "error.html",
        403,
        session,
        title="Refused",
        message="This form was stale or not sent by the console (CSRF check failed). "
        "Reload the page and try again.",
    )


async def _form(request: Request) -> dict[str, str]:
    form = await request.form()
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def _signed_post(request: Request) -> tuple[sessions.Session, dict[str, str]] | Response:
    """The session and form of a signed-in POST; else the answer to give:
    to the login page without a session, 403 without a valid CSRF token."""
    session = await _session(request)
    if session is None:
        return _redirect("/console/login")
    form = await _form(request)
    if not sessions.csrf_valid(_key(request), session.sid, form.get("csrf_token")):
        return _forbidden(request, session)
    return session, form


async def _call(
    request: Request, session: sessions.Session, fn: Callable[..., Any], *args: Any
) -> Any:
    """Run a use case; a refusal becomes an error page with its status."""
    try:
        return await run_in_threadpool(fn, *args)
    except SignalboxError as exc:
        return _render(
            request,
            "error.html",
            exc.status_code,
            session,
            title={404: "Not found", 409: "Not possible now"}.get(exc.status_code, "Error"),
            message=exc.message,
        )


def _notice(query: Any) -> str | None:
    """A fixed sentence for a done action: the query names it, never writes it."""
    done, count = query.get("done"), query.get("count", "")
    if done not in ("redriven", "discarded"):
        return None
    if count.isdigit():
        return f"{int(count)} dead letter(s) {done}."
    if done == "redriven":
        return "Redriven: the signal waits again with a new deadline and check budget."
    return "Discarded."


def _filters(values: dict[str, str]) -> dict[str, str]:
    return {k: values[k].strip() for k in FILTER_FIELDS if values.get(k, "").strip()}


# ---------------------------------------------------------------- sign in and out


@router.get("/login")
async def login_page(request: Request) -> Response:
    sid = secrets.token_urlsafe(16)
    response = _render(
        request, "login.html", csrf=sessions.csrf_token(_key(request), sid), error=None
    )
    response.set_cookie(
        sessions.LOGIN_COOKIE,
        sid,
        max_age=3600,
        path="/console",
        httponly=True,
        samesite="lax",
        secure=_secure(request),
    )
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    key = _key(request)
    form = await _form(request)
    login_sid = request.cookies.get(sessions.LOGIN_COOKIE)
    if not sessions.csrf_valid(key, login_sid, form.get("csrf_token")):
        return _forbidden(request, None)
    token = form.get("token", "").strip()
    principal: Principal | None = None
    if token and len(token) <= 512:
        principal = await run_in_threadpool(principal_for_token, _settings(request), token)
    if principal is None:
        assert login_sid is not None
        return _render(
            request,
            "login.html",
            401,
            csrf=sessions.csrf_token(key, login_sid),
            error="That is not a valid API or operator token.",
        )
    new = sessions.new_session(
        key, principal, token_hash(token), _settings(request).console_session_hours
    )
    response = _redirect("/console")
    response.set_cookie(
        sessions.SESSION_COOKIE,
        sessions.encode(key, new),
        max_age=int(_settings(request).console_session_hours * 3600),
        path="/console",
        httponly=True,
        samesite="lax",
        secure=_secure(request),
    )
    response.delete_cookie(sessions.LOGIN_COOKIE, path="/console")
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    posted = await _signed_post(request)
    if isinstance(posted, Response):
        return posted
    # Signed in with a valid CSRF token: sign out.
    response = _redirect("/console/login")
    response.delete_cookie(sessions.SESSION_COOKIE, path="/console")
    return response


# ---------------------------------------------------------------- pages


@router.get("")
async def overview(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return _redirect("/console/login")
    caller = session.principal
    data = await run_in_threadpool(triage.overview, caller)
    breakers = await run_in_threadpool(triage.breaker_states, _settings(request))
    hooks = await run_in_threadpool(webhooks.delivery_status, caller.scope())
    open_items, _ = await run_in_threadpool(
        lambda: triage.dead_letter_list(
            caller, DeadLetterFilter(state="open"), limit=20, cursor=None
        )
    )
    by_status: dict[str, int] = {}
    for row in data["counts"]:
        by_status[row["status"]] = by_status.get(row["status"], 0) + row["count"]
    return _render(
        request,
        "overview.html",
        session=session,
        data=data,
        by_status=by_status,
        breakers=breakers,
        hooks=hooks,
        open_items=open_items,
    )


@router.get("/dead-letters")
async def dead_letters(request: Request) -> Response:
    session = await _session(request)
    if session is None:
        return _redirect("/console/login")
    query = dict(request.query_params)
    chosen = _filters(query)
    try:
        filters = DeadLetterFilter(**chosen)  # type: ignore[arg-type]  # validated here
    except ValidationError as exc:
        field = ".".join(str(p) for p in exc.errors()[0]["loc"])
        return _render(
            request,
            "error.html",
            422,
            session,
            title="Invalid filter",
            message=f"The filter {field!r} has a value the console does not know.",
        )
    cursor = query.get("cursor") or None
    result = await _call(
        request,
        session,
        lambda: triage.dead_letter_list(session.principal, filters, limit=50, cursor=cursor),
    )
    if isinstance(result, Response):
        return result
    items, next_cursor = result
    next_url = (
        "/console/dead-letters?" + urlencode({**chosen, "cursor": next_cursor})
        if next_cursor
        else None
    )
    return _render(
        request,
        "dead_letters.html",
        session=session,
        items=items,
        chosen=chosen,
        states=STATES,
        reasons=REASONS,
        next_url=next_url,
        notice=_notice(query),
    )


@router.post("/dead-letters/{action}")
async def dead_letters_bulk(request: Request, action: str) -> Response:
    posted = await _signed_post(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    if action not in ("redrive", "discard"):
        return _render(request, "error.html", 404, session, title="Not found", message="")
    chosen = _filters(form)
    try:
        if action == "redrive":
            req: BulkRedrive | BulkDiscard = BulkRedrive(
                filter=DeadLetterFilter(**chosen),  # type: ignore[arg-type]
                limit=int(form.get("limit") or 50),
                expires_in_seconds=int(form.get("expires_in_seconds") or 120),
                max_checks=int(form.get("max_checks") or 30),
            )
        else:
            req = BulkDiscard(
                filter=DeadLetterFilter(**chosen),  # type: ignore[arg-type]
                limit=int(form.get("limit") or 50),
                note=form.get("note", ""),
            )
    except (ValidationError, ValueError):
        return _render(
            request,
            "error.html",
            422,
            session,
            title="Invalid form",
            message="Check the numbers (limit 1 to 500) and, to discard, write a note.",
        )
    fn = triage.dead_letters_redrive if action == "redrive" else triage.dead_letters_discard
    result = await _call(request, session, fn, session.principal, req)
    if isinstance(result, Response):
        return result
    done = "redriven" if action == "redrive" else "discarded"
    return _redirect(
        "/console/dead-letters?" + urlencode({**chosen, "done": done, "count": result["count"]})
    )


@router.get("/dead-letters/{dead_letter_id}")
async def dead_letter(request: Request, dead_letter_id: str) -> Response:
    session = await _session(request)
    if session is None:
        return _redirect("/console/login")
    caller = session.principal
    found = await _call(request, session, triage.dead_letter_read, caller, dead_letter_id)
    if isinstance(found, Response):
        return found
    checks, _ = await run_in_threadpool(
        lambda: triage.check_list(caller, found["signal_id"], limit=500, cursor=None)
    )
    return _render(
        request,
        "dead_letter.html",
        session=session,
        dl=found,
        checks=checks,
        notice=_notice(request.query_params),
    )


@router.post("/dead-letters/{dead_letter_id}/redrive")
async def dead_letter_redrive(request: Request, dead_letter_id: str) -> Response:
    posted = await _signed_post(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    try:
        req = Redrive(
            expires_in_seconds=int(form.get("expires_in_seconds") or 120),
            max_checks=int(form.get("max_checks") or 30),
        )
    except (ValidationError, ValueError):
        return _render(
            request,
            "error.html",
            422,
            session,
            title="Invalid form",
            message="expires_in_seconds is 1 to 86400 and max_checks 1 to 10000.",
        )
    view = await _call(
        request, session, triage.dead_letter_redrive, session.principal, dead_letter_id, req
    )
    if isinstance(view, Response):
        return view
    return _redirect(f"/console/signals/{view['signal_id']}?done=redriven")


@router.post("/dead-letters/{dead_letter_id}/discard")
async def dead_letter_discard(request: Request, dead_letter_id: str) -> Response:
    posted = await _signed_post(request)
    if isinstance(posted, Response):
        return posted
    session, form = posted
    try:
        req = Discard(note=form.get("note", ""))
    except ValidationError:
        return _render(
            request,
            "error.html",
            422,
            session,
            title="A note is needed",
            message="Say why this dead letter is discarded (1 to 2000 characters).",
        )
    found = await _call(
        request, session, triage.dead_letter_discard, session.principal, dead_letter_id, req
    )
    if isinstance(found, Response):
        return found
    return _redirect(f"/console/dead-letters/{dead_letter_id}?done=discarded")


@router.get("/signals/{signal_id}")
async def signal(request: Request, signal_id: str) -> Response:
    session = await _session(request)
    if session is None:
        return _redirect("/console/login")
    caller = session.principal
    view = await _call(request, session, triage.signal_read, caller, signal_id)
    if isinstance(view, Response):
        return view
    checks, _ = await run_in_threadpool(
        lambda: triage.check_list(caller, signal_id, limit=500, cursor=None)
    )
    return _render(
        request,
        "signal.html",
        session=session,
        s=view,
        checks=checks,
        notice=_notice(request.query_params),
        refresh=view["status"] == "waiting",
    )


@router.get("/runs/{run_id}")
async def run(request: Request, run_id: str) -> Response:
    session = await _session(request)
    if session is None:
        return _redirect("/console/login")
    caller = session.principal
    namespace = request.query_params.get("namespace") or None
    items = await run_in_threadpool(triage.run_signals, caller, run_id, namespace)
    try:
        run_filter = DeadLetterFilter(run_id=run_id, namespace=namespace)
    except ValidationError:
        return _render(request, "error.html", 404, session, title="Not found", message="")
    dls, _ = await run_in_threadpool(
        lambda: triage.dead_letter_list(caller, run_filter, limit=500, cursor=None)
    )
    if not items and not dls:
        return _render(
            request,
            "error.html",
            404,
            session,
            title="Not found",
            message=f"No signals for run {run_id}.",
        )
    by_status: dict[str, int] = {}
    for item in items:
        by_status[item["status"]] = by_status.get(item["status"], 0) + 1
    return _render(
        request,
        "run.html",
        session=session,
        run_id=run_id,
        items=items,
        dead_letters=dls,
        by_status=by_status,
    )
