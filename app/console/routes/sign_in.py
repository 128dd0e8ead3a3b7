"""Sign in with an API or operator token, and sign out.

The login form carries a CSRF token bound to a one-hour login cookie; a
valid token gets a session cookie that names the principal, never the token.
A wrong token counts as a failure of the client's address (after 20 in a
minute: 429, `app.usecases.auth.failure_record`). Signing out revokes the
session on the server.
"""

from __future__ import annotations

import math
import secrets

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from app.console import session as sessions
from app.console.routes.common import (
    SignedPost,
    forbidden,
    key_of,
    read_form,
    redirect,
    render,
    set_cookie,
    settings_of,
)
from app.domain.ids import token_hash
from app.usecases.auth import (
    Principal,
    console_session_revoke,
    failure_record,
    principal_for_token,
)

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/login")
async def login_page(request: Request) -> Response:
    sid = secrets.token_urlsafe(16)
    response = render(
        request, "login.html", csrf=sessions.csrf_token(key_of(request), sid), error=None
    )
    set_cookie(request, response, sessions.LOGIN_COOKIE, sid, max_age=3600)
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    key = key_of(request)
    form = await read_form(request)
    login_sid = request.cookies.get(sessions.LOGIN_COOKIE)
    if not sessions.csrf_valid(key, login_sid, form.get("csrf_token")):
        return forbidden(request, None)
    token = form.get("token", "").strip()
    principal: Principal | None = None
    if token and len(token) <= 512:
        principal = await run_in_threadpool(principal_for_token, settings_of(request), token)
    if principal is None:
        assert login_sid is not None
        address = request.client.host if request.client else "unknown"
        wait = await run_in_threadpool(failure_record, settings_of(request), address)
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            refused = render(
                request,
                "login.html",
                429,
                csrf=sessions.csrf_token(key, login_sid),
                error=f"Too many failed sign-ins from this address; try again in {seconds} s.",
            )
            refused.headers["Retry-After"] = str(seconds)
            return refused
        return render(
            request,
            "login.html",
            401,
            csrf=sessions.csrf_token(key, login_sid),
            error="That is not a valid API or operator token.",
        )
    hours = settings_of(request).console_session_hours
    new = sessions.new_session(key, principal, token_hash(token), hours)
    # A tenant lands on its inbox; an operator (no content) on the overview.
    response = redirect("/console" if principal.is_ops else "/console/inbox")
    set_cookie(
        request,
        response,
        sessions.SESSION_COOKIE,
        sessions.encode(key, new),
        max_age=int(hours * 3600),
    )
    response.delete_cookie(sessions.LOGIN_COOKIE, path="/console")
    return response


@router.post("/logout")
async def logout(posted: SignedPost) -> Response:
    # Signed in with a valid CSRF token (else SignedPost answered): sign out
    # on the server too, so a copy of the cookie is refused from now on.
    session, _ = posted
    await run_in_threadpool(console_session_revoke, session.sid, session.expires)
    response = redirect("/console/login")
    response.delete_cookie(sessions.SESSION_COOKIE, path="/console")
    return response
