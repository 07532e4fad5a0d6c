"""Open a page in headless Chromium and report what a reader's browser would see, over the DevTools
protocol (the ``websocket-client`` package of the test extra): console errors and uncaught
exceptions, every network request, the DOM after load, and a screenshot.

    python tests/chromium.py results/quickstart/report.html results/quickstart/report-screenshot.png

writes the screenshot the README shows.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell")


def find_chromium() -> str | None:
    env = os.environ.get("PHAZE_CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageVisit:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)     # every URL the page asked for
    dom: dict = field(default_factory=dict)                # what the probe script returned
    screenshot_png: bytes = b""

    def network_requests(self, page_url: str) -> list[str]:
        """Requests other than the page itself and inline ``data:`` URLs."""
        return [u for u in self.requests if u != page_url and not u.startswith("data:")]


class _Cdp:
    def __init__(self, ws_url: str):
        import websocket
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60.0):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(method)

    def wait_for(self, method: str, timeout: float = 60.0) -> dict:
        for e in self.events:
            if e.get("method") == method:
                return e
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            e = json.loads(self.ws.recv())
            self.events.append(e)
            if e.get("method") == method:
                return e
        raise TimeoutError(method)

    def drain(self, seconds: float) -> None:
        import websocket
        self.ws.settimeout(0.2)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                continue
        self.ws.settimeout(60)

    def close(self) -> None:
        self.ws.close()


PROBE = """(() => {
  const figs = [...document.querySelectorAll('figure.plot')].map(f => ({
    name: f.dataset.plot,
    plotly: !!f.querySelector('.plotly-graph-div .main-svg'),
    points: f.querySelectorAll('.plotly-graph-div .scatterlayer .point, .plotly-graph-div .bars .point').length,
    svg: !!f.querySelector(':scope > svg'),
    height: f.getBoundingClientRect().height}));
  const table = document.querySelector('table#best-designs');
  return {title: document.title, figures: figs,
          bestRows: table ? [...table.querySelectorAll('tbody tr')].map(r =>
              [...r.querySelectorAll('td')].map(td => td.textContent)) : null,
          bestHead: table ? [...table.querySelectorAll('thead th')].map(th => th.textContent) : null,
          answer: (document.querySelector('#answer') || {}).textContent || '',
          text: document.body.innerText.length};
})()"""


def visit(page: Path, width: int = 1280, height: int = 1800, settle_s: float = 1.0) -> PageVisit:
    """Load ``page`` (a local file) in headless Chromium and collect what happened."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("chromium not found")
    url = Path(page).resolve().as_uri()
    out = PageVisit()
    # Chromium's helper processes may still be writing to the profile as it is removed
    with tempfile.TemporaryDirectory(prefix="phaze-chromium-", ignore_cleanup_errors=True) as profile:
        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={profile}",
                f"--window-size={width},{height}", "about:blank"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            ws_url, end = None, time.monotonic() + 60
            lines = []
            while time.monotonic() < end and ws_url is None:
                line = proc.stderr.readline()
                if not line and proc.poll() is not None:
                    break
                lines.append(line)
                m = re.search(r"DevTools listening on (ws://\S+)", line)
                if m:
                    ws_url = m.group(1)
            if ws_url is None:
                raise RuntimeError("chromium did not start: " + "".join(lines[-10:]))
            cdp = _Cdp(ws_url)
            try:
                target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
                session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
                for domain in ("Page", "Runtime", "Log", "Network"):
                    cdp.send(f"{domain}.enable", session=session)
                cdp.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                               "deviceScaleFactor": 1, "mobile": False},
                         session=session)
                cdp.events.clear()
                cdp.send("Page.navigate", {"url": url}, session=session)
                cdp.wait_for("Page.loadEventFired", timeout=120)
                cdp.drain(settle_s)
                res = cdp.send("Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, session=session)
                out.dom = res.get("result", {}).get("value") or {}
                shot = cdp.send("Page.captureScreenshot", {"format": "png"}, session=session)
                out.screenshot_png = base64.b64decode(shot["data"])
                for e in cdp.events:
                    m, p = e.get("method"), e.get("params", {})
                    if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                        out.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                           for a in p.get("args", [])))
                    elif m == "Runtime.exceptionThrown":
                        d = p.get("exceptionDetails", {})
                        out.console_errors.append(d.get("exception", {}).get("description") or d.get("text", ""))
                    elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                        out.console_errors.append(p["entry"].get("text", ""))
                    elif m == "Network.requestWillBeSent":
                        out.requests.append(p.get("request", {}).get("url", ""))
            finally:
                cdp.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return out


if __name__ == "__main__":
    page, shot = Path(sys.argv[1]), Path(sys.argv[2])
    v = visit(page)
    shot.write_bytes(v.screenshot_png)
    print(f"{len(v.console_errors)} console errors, {len(v.network_requests(page.resolve().as_uri()))} network "
          f"requests, {len(v.dom.get('figures', []))} figures; wrote {shot}")
