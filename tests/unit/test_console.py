"""The console's server side (gateway/api/console.py): which files it serves, and the one
setting it puts into the page (``report_url``), escaped. The page itself runs in a browser in
tests/system/test_console.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.api.console import FILES, _page
from gateway.config import Settings, SettingsError

CONSOLE = Path(__file__).resolve().parents[2] / "gateway" / "console"


def test_every_script_the_page_loads_is_served_and_nothing_else() -> None:
    on_disk = {p.name for p in CONSOLE.iterdir() if p.suffix in (".js", ".css")}
    assert set(FILES) == on_disk
    imported = set()
    for p in CONSOLE.glob("*.js"):
        imported |= set(re.findall(r'from "\./([\w.]+)"', p.read_text()))
    page = (CONSOLE / "index.html").read_text()
    imported |= set(re.findall(r'(?:src|href)="/console/([\w.]+)"', page))
    assert imported == on_disk  # each module reached from the page, each one served


def test_the_report_url_is_escaped_into_the_page() -> None:
    url = 'https://r.example/lag.html?a=1&b="><script>alert(1)</script>'
    page = _page(url).decode()
    assert page.count("<script") == 1  # the page's own module only
    assert ('<meta name="mqgw-report-url" content="https://r.example/lag.html?a=1&amp;b=&quot;'
            '&gt;&lt;script&gt;alert(1)&lt;/script&gt;">') in page
    assert '<meta name="mqgw-report-url" content="">' in _page("").decode()


@pytest.mark.parametrize("url", ["javascript:alert(1)", "//evil.example/r", "r.html", "ftp://x/r"])
def test_a_report_url_that_is_no_http_url_or_path_is_refused(url: str) -> None:
    with pytest.raises(SettingsError, match="report_url"):
        Settings.load({"MQGW_REPORT_URL": url})


def test_report_urls_that_are_fine() -> None:
    for url in ("", "https://reports.example/lag/report.html", "http://h:8000/r", "/lag/report.html"):
        assert Settings.load({"MQGW_REPORT_URL": url}).report_url == url
