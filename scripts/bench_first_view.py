"""Time the Architecture page's first view and box clicks in a real browser against a fresh `streamlit run app.py`.

(a) navigation → the V4.1-Flash diagram visible, in fresh browser contexts (no cache; the first one also pays for
the server's cold caches); (b) a click on a box: the server time (the rerun request leaving the browser → the
server's "script finished" message, read off the websocket) and the browser round trip (click → the node's details
shown). Beside each wall time, the CPU seconds the server process used (from /proc: what the server did, which a busy
machine delays but does not inflate), and for a fresh view the browser's main-thread busy time and its JavaScript
share (CDP Performance metrics: how much of the view is Streamlit's frontend loading and rendering the page). Prints
medians and ranges.
Usage: .venv/bin/python scripts/bench_first_view.py [--sessions 5] [--clicks 12] [--root DIR] [--results OUT]
--root serves another copy of the app (for a before/after: `git archive REV | tar -x -C DIR`); the diagram labels
are found both as SVG text (the diagram component) and as plotly annotations (the plotly diagram before it).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
URL = "/architecture?config=deepseek-v4.1-flash"
BOXES = ("LM head", "Router", "Token embedding", "attn_norm")   # clicked in turn; each selects another node
DIAGRAM_LABEL = ".v41-diagram text, .js-plotly-plot g.annotation-text-g"


def start_server(root: Path = ROOT) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.port", str(port), "--browser.gatherUsageStats", "false"],
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/_stcore/health", timeout=2) as r:
                if r.read() == b"ok":
                    return proc, base
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("streamlit did not come up")


class ScriptRuns:
    """Rerun requests sent and script-finished messages received on a page's Streamlit websocket, timestamped."""

    def __init__(self, page):
        self.sent: list[float] = []
        self.finished: list[float] = []
        page.on("websocket", self._watch)

    def _watch(self, ws) -> None:
        ws.on("framesent", self._sent)
        ws.on("framereceived", self._received)

    def _sent(self, payload) -> None:
        if isinstance(payload, bytes):
            msg = BackMsg()
            msg.ParseFromString(payload)
            if msg.WhichOneof("type") == "rerun_script":
                self.sent.append(time.perf_counter())

    def _received(self, payload) -> None:
        if isinstance(payload, bytes):
            msg = ForwardMsg()
            msg.ParseFromString(payload)
            if msg.WhichOneof("type") == "script_finished":
                self.finished.append(time.perf_counter())

    def server_time_after(self, page, t0: float) -> float:
        """Seconds from the first rerun request sent after t0 to the next script-finished message (waiting, up to
        30 s, for the page's events to arrive)."""
        for _ in range(600):
            start = next((t for t in self.sent if t >= t0), None)
            end = next((t for t in self.finished if start is not None and t >= start), None)
            if end is not None:
                return end - start
            page.wait_for_timeout(50)
        raise RuntimeError("no script run followed the click")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def first_view(browser, base: str, pid: int) -> tuple[float, float, float, float, float, int]:
    """Seconds from navigation to the page's title, and to the diagram's LM head box, in a fresh browser context;
    the server's CPU seconds for it (until the page's script run is over); the browser's main-thread busy seconds
    and, of them, JavaScript's until the diagram shows (CDP Performance metrics TaskDuration, ScriptDuration: the
    share of a view that is Streamlit's frontend and the page's rendering); and the script runs it took."""
    context = browser.new_context(viewport={"width": 1600, "height": 1400})
    page = context.new_page()
    runs = ScriptRuns(page)
    cdp = context.new_cdp_session(page)
    cdp.send("Performance.enable")
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    page.goto(base + URL)
    page.get_by_role("heading", name="deepseek-v4.1-flash").first.wait_for(timeout=120_000)
    title = time.perf_counter() - t0
    page.locator(DIAGRAM_LABEL).filter(has_text="LM head").first.wait_for(timeout=120_000)
    elapsed = time.perf_counter() - t0
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    page.get_by_text("How the plan is made").wait_for(timeout=120_000)   # the first run is over
    cpu = cpu_seconds(pid) - cpu0
    context.close()
    return title, elapsed, cpu, metrics["TaskDuration"], metrics["ScriptDuration"], len(runs.finished)


def clicks(browser, base: str, n: int, pid: int) -> tuple[list[float], list[float], list[float]]:
    """Per click on a box: the server's script time, the browser round trip until the details show the node, and
    the server's CPU seconds for it."""
    page = browser.new_page(viewport={"width": 1600, "height": 2200})
    runs = ScriptRuns(page)
    page.goto(base + URL)
    page.locator(DIAGRAM_LABEL).filter(has_text="LM head").first.wait_for(timeout=120_000)
    page.get_by_text("How the plan is made").wait_for(timeout=120_000)   # the first run is over
    panel = page.locator(".st-key-details_panel")
    server, round_trip, cpu = [], [], []
    for i in range(n):
        target = page.locator(DIAGRAM_LABEL).filter(has_text=BOXES[i % len(BOXES)]).first
        before = page.evaluate("() => new URLSearchParams(location.search).get('node')")
        page.wait_for_timeout(300)
        target.scroll_into_view_if_needed()
        box = target.bounding_box()
        cpu0 = cpu_seconds(pid)
        t0 = time.perf_counter()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function("b => new URLSearchParams(location.search).get('node') !== b", arg=before,
                               timeout=30_000)
        node = page.evaluate("() => new URLSearchParams(location.search).get('node')")
        panel.locator("code").filter(has_text=node).first.wait_for(timeout=30_000)
        round_trip.append(time.perf_counter() - t0)
        server.append(runs.server_time_after(page, t0))
        cpu.append(cpu_seconds(pid) - cpu0)
    page.close()
    return server, round_trip, cpu


def summary(name: str, xs: list[float]) -> str:
    return (f"{name}: median {statistics.median(xs):.2f} s, range {min(xs):.2f}–{max(xs):.2f} s "
            f"over {len(xs)} ({', '.join(f'{x:.2f}' for x in xs)})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=5, help="fresh browser contexts for (a)")
    ap.add_argument("--clicks", type=int, default=12, help="box clicks for (b)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the app folder to serve (default: this checkout)")
    ap.add_argument("--results", help="also write the timings as a results file (docs/results/first_view.json)")
    opts = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from engine.bench.results_file import ResultsRecorder, spread
    recorder = ResultsRecorder(opts.results, "first_view", "scripts/bench_first_view.py", argv)
    proc, base = start_server(opts.root)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            cold = first_view(browser, base, proc.pid)
            warm = [first_view(browser, base, proc.pid) for _ in range(opts.sessions)]
            server, round_trip, click_cpu = clicks(browser, base, opts.clicks, proc.pid)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"app: {opts.root}")
    print(f"(a) first view, fresh server (cold caches): diagram {cold[1]:.2f} s (title {cold[0]:.2f} s)")
    print(summary("(a) first view, fresh browser context: diagram", [w[1] for w in warm]))
    print(summary("    of which navigation → page title", [w[0] for w in warm]))
    print(summary("    server CPU seconds per fresh view", [w[2] for w in warm]))
    print(summary("    browser main thread busy until the diagram", [w[3] for w in warm]))
    print(summary("      of which JavaScript", [w[4] for w in warm]))
    print(f"    script runs per fresh view: {[w[5] for w in warm]}")
    print(summary("(b) click → server script run", server))
    print(summary("(b) click → details shown in the browser", round_trip))
    print(summary("    server CPU seconds per click", click_cpu))
    print(f"load average at the end (1/5/15 min): {' '.join(load)} on {len(os.sched_getaffinity(0))} CPU(s)")
    rows = [{"measure": "first view, fresh server (cold caches): diagram", "seconds": spread([cold[1]]), "n": 1},
            {"measure": "first view, fresh browser context: diagram", "seconds": spread([w[1] for w in warm]),
             "n": len(warm)},
            {"measure": "of which navigation → page title", "seconds": spread([w[0] for w in warm]), "n": len(warm)},
            {"measure": "server CPU per fresh view", "seconds": spread([w[2] for w in warm]), "n": len(warm)},
            {"measure": "browser main thread busy until the diagram", "seconds": spread([w[3] for w in warm]),
             "n": len(warm)},
            {"measure": "of which JavaScript", "seconds": spread([w[4] for w in warm]), "n": len(warm)},
            {"measure": "click → server script run", "seconds": spread(server), "n": len(server)},
            {"measure": "click → details shown in the browser", "seconds": spread(round_trip), "n": len(round_trip)},
            {"measure": "server CPU per click", "seconds": spread(click_cpu), "n": len(click_cpu)}]
    recorder.write(rows, None, settings={"app": "this checkout" if opts.root == ROOT else str(opts.root),
                                         "sessions": opts.sessions, "clicks": opts.clicks})


if __name__ == "__main__":
    main()
