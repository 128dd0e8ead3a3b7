"""What every console page uses: templates, the answers (page, error page,
redirect), and the session as a dependency.

A page takes ``session: SignedIn`` (GET) or ``posted: SignedPost`` (POST).
Without a valid session the answer is the redirect to the login page; a POST
without the session's CSRF token gets 403; a use case's refusal or a form it
refuses gets an error page. Each is a :class:`PageAnswer` the app answers with
(see :func:`install_handlers`), so no page repeats the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from app.console import session as sessions
from app.domain import masking
from app.errors import SignalboxError
from app.settings import Settings
from app.usecases import auth, triage

CONSOLE_DIR = Path(__file__).parent.parent
STATIC_DIR = CONSOLE_DIR / "static"
templates = Jinja2Templates(directory=str(CONSOLE_DIR / "templates"))

_T = TypeVar("_T")

FILTER_FIELDS = ("state", "reason", "provider", "run_id", "namespace", "why", "test_case")
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


def _clock(value: str | datetime | None) -> str:
    """A timestamp as `HH:MM` UTC (a cause's "since"), with the day when not today."""
    if value is None:
        return "—"
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    value = value.astimezone(UTC)
    if value.date() == datetime.now(UTC).date():
        return value.strftime("%H:%M")
    return value.strftime("%Y-%m-%d %H:%M")


templates.env.filters["mask"] = mask_subject
templates.env.filters["when"] = _when
templates.env.filters["clock"] = _clock


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def key_of(request: Request) -> bytes:
    """The key that signs this deployment's session cookies and CSRF tokens."""
    return sessions.secret_key(settings_of(request))


def render(
    request: Request,
    name: str,
    status_code: int = 200,
    session: sessions.Session | None = None,
    **context: Any,
) -> HTMLResponse:
    """The template `name` with the security headers; signed in, with the
    session's CSRF token and who is signed in."""
    if session is not None:
        context.setdefault("csrf", sessions.csrf_token(key_of(request), session.sid))
        p = session.principal
        who = f"operator {p.operator}" if p.is_ops else f"namespace {p.namespace}"
        context.setdefault("who", who)
        context.setdefault("is_ops", p.is_ops)
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


def error_page(
    request: Request,
    session: sessions.Session | None,
    status_code: int,
    title: str,
    message: str = "",
) -> HTMLResponse:
    return render(request, "error.html", status_code, session, title=title, message=message)


def redirect(url: str) -> RedirectResponse:
    """A 303 to `url` (after a POST, the browser GETs it)."""
    response = RedirectResponse(url, status_code=303)
    response.headers.update(SECURITY_HEADERS)
    return response


def set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    """A console cookie: HTTP-only, same-site lax, `Secure` unless the API
    binds loopback (SIGNALBOX_CONSOLE_SECURE_COOKIES decides when set)."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/console",
        httponly=True,
        samesite="lax",
        secure=settings_of(request).console_cookies_secure,
    )


def forbidden(request: Request, session: sessions.Session | None) -> HTMLResponse:
    return error_page(
        request,
        session,
        403,
        "Refused",
        "This form was stale or not sent by the console (CSRF check failed). "
        "Reload the page and try again.",
    )


async def read_form(request: Request) -> dict[str, str]:
    form = await request.form()
    return {k: v for k, v in form.items() if isinstance(v, str)}


# ---------------------------------------------------------------- the session


class PageAnswer(Exception):
    """An answer given instead of the page: the redirect to the login page, a
    403, an error page. Raised by the session dependencies, :func:`call` and
    :func:`form_input`; the app answers with `response` (see
    :func:`install_handlers`)."""

    def __init__(self, response: Response) -> None:
        super().__init__()
        self.response = response


async def signed_in(request: Request) -> sessions.Session:
    """The signed-in session, if its cookie holds, it was not signed out and
    its token is still configured; else the redirect to the login page."""
    key = key_of(request)
    found = sessions.decode(key, request.cookies.get(sessions.SESSION_COOKIE))
    if found is None:
        raise PageAnswer(redirect("/console/login"))
    valid = await run_in_threadpool(
        triage.principal_still_valid,
        settings_of(request),
        found.principal,
        found.fingerprint,
        lambda h: sessions.fingerprint(key, h),
    )
    if not valid or await run_in_threadpool(auth.console_session_revoked, found.sid):
        raise PageAnswer(redirect("/console/login"))
    return found


async def signed_post(
    request: Request, session: Annotated[sessions.Session, Depends(signed_in)]
) -> tuple[sessions.Session, dict[str, str]]:
    """The session and form of a signed-in POST whose CSRF token holds; else 403."""
    form = await read_form(request)
    if not sessions.csrf_valid(key_of(request), session.sid, form.get("csrf_token")):
        raise PageAnswer(forbidden(request, session))
    return session, form


SignedIn = Annotated[sessions.Session, Depends(signed_in)]
SignedPost = Annotated[tuple[sessions.Session, dict[str, str]], Depends(signed_post)]


def install_handlers(app: FastAPI) -> None:
    """Answer a :class:`PageAnswer` from any page with its response."""

    async def page_answer(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PageAnswer)
        return exc.response

    app.add_exception_handler(PageAnswer, page_answer)


# ---------------------------------------------------------------- use cases


async def call(
    request: Request, session: sessions.Session, fn: Callable[..., Any], *args: Any
) -> Any:
    """Run a use case; a refusal is answered with an error page of its status."""
    try:
        return await run_in_threadpool(fn, *args)
    except SignalboxError as exc:
        title = {404: "Not found", 409: "Not possible now"}.get(exc.status_code, "Error")
        raise PageAnswer(error_page(request, session, exc.status_code, title, exc.message)) from exc


def form_input(
    request: Request, session: sessions.Session, build: Callable[[], _T], title: str, message: str
) -> _T:
    """The use case's input built from a form; a value it refuses (a pydantic
    ValidationError, or a number that is not one) is answered with a 422 page."""
    try:
        return build()
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise PageAnswer(error_page(request, session, 422, title, message)) from exc


async def render_signal_page(
    request: Request, session: sessions.Session, name: str, signal_id: str, **context: Any
) -> HTMLResponse:
    """A page about one signal: `context`, the signal's checks (the first 500,
    oldest first) and the notice of an action just done."""
    checks, _ = await run_in_threadpool(
        lambda: triage.check_list(session.principal, signal_id, limit=500, cursor=None)
    )
    return render(
        request,
        name,
        session=session,
        **context,
        checks=checks,
        notice=notice(request.query_params),
    )


def notice(query: Any) -> str | None:
    """A fixed sentence for a done action: the query names it, never writes it."""
    done, count = query.get("done"), query.get("count", "")
    if done not in ("redriven", "discarded"):
        return None
    if count.isdigit():
        return f"{int(count)} dead letter(s) {done}."
    if done == "redriven":
        return "Redriven: the signal waits again with a new deadline and check budget."
    return "Discarded."


def chosen_filters(values: dict[str, str]) -> dict[str, str]:
    """The dead-letter filter fields given a non-blank value, stripped."""
    return {k: values[k].strip() for k in FILTER_FIELDS if values.get(k, "").strip()}
