"""docs/howto-schedule-the-flow.md, as written: the `make serve` lines of the page, their environment applied, give
the deployment that flows/serve.py registers with the cron and the timezone they set; without them, the page's default
cron in the machine's own zone, always given to Prefect explicitly (a cron without one runs in UTC)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys

import pytest

import docrefs

PAGE = docrefs.ROOT / "docs" / "howto-schedule-the-flow.md"
sys.path.insert(0, str(docrefs.ROOT / "flows"))  # serve.py imports the flow as `pipeline`, as when run as a script
spec = importlib.util.spec_from_file_location("scalelab_serve", docrefs.ROOT / "flows" / "serve.py")
serve = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve)


def _serve_lines() -> list[dict[str, str]]:
    """The environment of each `... make serve` command in the page's bash blocks."""
    found = []
    for m in docrefs.FENCE.finditer(PAGE.read_text()):
        for line in m["body"].splitlines() if m["lang"].strip() == "bash" else []:
            words = shlex.split(line, comments=True)
            if words[-2:] == ["make", "serve"]:
                found.append(dict(w.split("=", 1) for w in words[:-2]))
    return found


def _schedule(env: dict[str, str]):
    (when,) = serve.deployment(env).schedules
    return when.schedule


def test_each_make_serve_line_of_the_page_registers_its_cron_and_timezone():
    lines = _serve_lines()
    assert any(serve.CRON_ENV in env for env in lines), "the page shows no SCALELAB_CRON line"
    for env in lines:
        when = _schedule(env)
        assert when.cron == env.get(serve.CRON_ENV, serve.DEFAULT_CRON)
        assert when.timezone == env.get(serve.TZ_ENV, serve.local_timezone()) and when.timezone


def test_the_default_is_the_pages_time_in_the_machines_zone(monkeypatch):
    """The page's default (its first cron in backticks) is serve's; with no SCALELAB_TZ the zone is TZ's (or the
    system's), given explicitly; a name that is no zone is refused in one line."""
    assert f"cron '{serve.DEFAULT_CRON}'" in PAGE.read_text()
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert _schedule({}).timezone == "Asia/Tokyo"
    monkeypatch.delenv("TZ")
    assert _schedule({}).timezone == serve.local_timezone() != ""
    with pytest.raises(SystemExit, match=r"SCALELAB_TZ='Mars/Olympus' is not an IANA timezone name"):
        _schedule({serve.TZ_ENV: "Mars/Olympus"})
    assert re.search(r"in the machine's timezone", PAGE.read_text())
