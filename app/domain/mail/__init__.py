"""Turn the raw bytes of an email into the few decoded fields Signalbox matches on.

Pure: bytes in, values out. ``parse_mail`` never raises, whatever it is given
(malformed MIME is "matched on what could be decoded, never a crash"). What
could not be decoded cleanly is named in ``ParsedMail.defects``.

Every string this module returns is valid Unicode (no lone surrogates) and
holds no NUL character, so callers can log it, JSON-encode it and store it in
PostgreSQL ``text`` columns without further cleaning.

Bounded time, whatever the input
--------------------------------
The stdlib parser builds the whole MIME tree before anything can stop it, and
parts of it are superlinear (a 400 KB folded Subject took 13 s, 10,000 flat
parts 14 s). So the raw bytes are checked first, with linear scans that build
nothing (``app.domain.mail.bounds``): the header block's size and line count,
the longest unfolded header, the number of body lines and MIME parts and the
nesting depth of multiparts. A message over a bound is never handed whole to the stdlib: it is
parsed on a bounded view (headers cut to the bound, the body cut before the
part that crossed it) and ``ParsedMail.defects`` names each bound hit as
``BoundExceeded:<bound>`` (``header_bytes``, ``header_lines``,
``header_length``, ``body_lines``, ``parts``, ``depth``, ``time``).

On top of the bounds, each parse has a hard budget of CPU time
(``PARSE_TIME_BUDGET_SECONDS``; CPU, not wall time, so a loaded machine does not
cut legitimate mail short), enforced where it can be:

- in a process's main thread (a Celery prefork child runs its tasks there, and
  so does a ``ProcessPoolExecutor`` worker), ``signal.setitimer(ITIMER_VIRTUAL)``
  interrupts the parse (the caller passes that budget in: ``parse_on_budget``
  of ``app/infra/parse_budget.py``; nothing here arms a timer); the result
  then holds the headers read by a linear
  fallback and ``BoundExceeded:time``. An outer virtual timer that would fire
  sooner is left alone, and one that would fire later is re-armed after;
- the SMTP sink never parses on its event loop: it stores the raw bytes,
  answers, and parses in a worker process (``app/infra/parse_pool.py``), where the
  first rule applies, and the sink stops waiting for a parse stuck past a
  generous wall-clock limit (its looks parse a message of at most 16 KiB in
  their own thread, where the bounds alone keep it to milliseconds);
- in any other thread (the API's request threads) signals cannot interrupt,
  and the bounds alone keep a parse short.

Callbacks registered with :func:`on_bound_exceeded` hear of every bound hit
(the metrics module counts them); they are the only side effect here.

The package, in the order a message goes through it: ``bounds`` (cut the raw
bytes), ``parse`` (``parse_mail``), ``mime`` (the guarded stdlib parser),
``addresses`` and ``charset`` (headers and bodies into clean text), ``html``
(the visible text of an HTML body), ``parsed`` (the result), ``observers``.
"""

from app.domain.mail.addresses import (
    PLAIN_ADDR_SPEC,
    header_block,
    header_block_recipients,
    header_recipients_within,
)
from app.domain.mail.bounds import MAX_HEADER_LENGTH, BoundedView, bound_view
from app.domain.mail.charset import normalize_whitespace
from app.domain.mail.html import HtmlEvent, html_events, strip_html
from app.domain.mail.observers import on_bound_exceeded, report_bounds
from app.domain.mail.parse import PARSE_TIME_BUDGET_SECONDS, parse_mail
from app.domain.mail.parsed import (
    BOUND_DEFECT_PREFIX,
    DEFAULT_TEXT_MAX_BYTES,
    ParsedMail,
    bounds_exceeded,
)

__all__ = [
    "BOUND_DEFECT_PREFIX",
    "DEFAULT_TEXT_MAX_BYTES",
    "MAX_HEADER_LENGTH",
    "PARSE_TIME_BUDGET_SECONDS",
    "PLAIN_ADDR_SPEC",
    "BoundedView",
    "HtmlEvent",
    "ParsedMail",
    "bound_view",
    "bounds_exceeded",
    "header_block",
    "header_block_recipients",
    "header_recipients_within",
    "html_events",
    "normalize_whitespace",
    "on_bound_exceeded",
    "parse_mail",
    "report_bounds",
    "strip_html",
]
