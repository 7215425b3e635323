"""The operations console: ``GET /console`` and its files (``gateway/console/``), served by every
node. No build step and no library: a page, a stylesheet and a few ES modules of our own, which
read and act through the admin API with the key the operator enters (docs/console.md).

The answers carry a strict Content-Security-Policy: only this origin's scripts and stylesheet,
requests only to this origin, no frames, forms or plugins. With it, a value from the API that
held markup could not run even if the page put it in as HTML (it puts every value in as text).
The files are read once per process; they are public (no key: the data is behind the API). The
one thing the page is told by the node is ``report_url`` (where the lag report is published),
escaped into a ``<meta>`` element: no endpoint of its own for one setting.
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from ..core.errors import unknown
from .access import route
from .http import services

_DIR = resources.files("gateway") / "console"
_JS, _CSS = "text/javascript", "text/css"
#: The files under /console/, and their media types; nothing else is served.
FILES = {"console.css": _CSS, "console.js": _JS, "api.js": _JS, "ui.js": _JS,
         "consumers.js": _JS, "consumer.js": _JS, "settings.js": _JS, "reset.js": _JS,
         "deadletters.js": _JS, "topics.js": _JS, "access.js": _JS, "delayed.js": _JS}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer", "x-frame-options": "DENY",
           "cache-control": "no-cache"}
_REPORT = b'<meta name="mqgw-report-url" content="">'


@cache
def _read(name: str) -> bytes:
    return (_DIR / name).read_bytes()


@cache
def _page(report_url: str) -> bytes:
    page = _read("index.html")
    assert _REPORT in page, "index.html lost its report meta element"
    meta = f'<meta name="mqgw-report-url" content="{html.escape(report_url, quote=True)}">'
    return page.replace(_REPORT, meta.encode())


async def console_route(request: Request) -> Response:
    page = _page(services(request).settings.report_url)
    return Response(page, media_type="text/html; charset=utf-8", headers=HEADERS)


async def console_file_route(request: Request) -> Response:
    name = request.path_params["asset"]
    media = FILES.get(name)
    if media is None:
        raise unknown("not_found", f"the console has no file {name!r}")
    return Response(_read(name), media_type=f"{media}; charset=utf-8", headers=HEADERS)


console_routes = [
    route("/console", console_route, methods=["GET"]),
    route("/console/{asset}", console_file_route, methods=["GET"]),
]
