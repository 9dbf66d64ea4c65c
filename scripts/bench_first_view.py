"""Time the Architecture page's first view and box clicks in a real browser against a fresh `streamlit run app.py`.

(a) navigation → the V4.1-Flash diagram visible, in fresh browser sessions (the first one also pays for the
server's cold caches); (b) a click on a box → its details visible. Prints medians and ranges.
Usage: .venv/bin/python scripts/bench_first_view.py [--sessions 4] [--clicks 12]
"""
from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]
URL = "/architecture?config=deepseek-v4.1-flash"
BOXES = ("LM head", "Router", "Token embedding", "attn_norm")   # clicked in turn; each selects another node


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                             "--server.port", str(port), "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def first_view(browser, base: str) -> tuple[float, float]:
    """Seconds from navigation to the page's title, and to the diagram's LM head box, in a fresh browser session."""
    context = browser.new_context(viewport={"width": 1600, "height": 1400})
    page = context.new_page()
    t0 = time.perf_counter()
    page.goto(base + URL)
    page.get_by_role("heading", name="deepseek-v4.1-flash").first.wait_for(timeout=120_000)
    title = time.perf_counter() - t0
    page.locator(".js-plotly-plot g.annotation-text-g").filter(has_text="LM head").first.wait_for(timeout=120_000)
    elapsed = time.perf_counter() - t0
    context.close()
    return title, elapsed


def clicks(browser, base: str, n: int) -> list[float]:
    """Seconds from a click on a box to its node id shown in the details panel (browser round trip)."""
    page = browser.new_page(viewport={"width": 1600, "height": 2200})
    page.goto(base + URL)
    plot = page.locator(".js-plotly-plot").first
    plot.locator("g.annotation-text-g").filter(has_text="LM head").first.wait_for(timeout=120_000)
    panel = page.locator(".st-key-details_panel")
    times = []
    for i in range(n):
        target = plot.locator("g.annotation-text-g").filter(has_text=BOXES[i % len(BOXES)]).first
        box = target.bounding_box()
        before = page.evaluate("() => new URLSearchParams(location.search).get('node')")
        t0 = time.perf_counter()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function("b => new URLSearchParams(location.search).get('node') !== b", arg=before,
                               timeout=30_000)
        node = page.evaluate("() => new URLSearchParams(location.search).get('node')")
        panel.locator("code").filter(has_text=node).first.wait_for(timeout=30_000)
        times.append(time.perf_counter() - t0)
    page.close()
    return times


def summary(name: str, xs: list[float]) -> str:
    return (f"{name}: median {statistics.median(xs):.2f} s, range {min(xs):.2f}–{max(xs):.2f} s "
            f"over {len(xs)} ({', '.join(f'{x:.2f}' for x in xs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=4, help="fresh browser sessions for (a)")
    ap.add_argument("--clicks", type=int, default=12, help="box clicks for (b)")
    opts = ap.parse_args()
    proc, base = start_server()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            cold = first_view(browser, base)
            warm = [first_view(browser, base) for _ in range(opts.sessions)]
            taken = clicks(browser, base, opts.clicks)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"(a) first view, fresh server (cold caches): diagram {cold[1]:.2f} s (title {cold[0]:.2f} s)")
    print(summary("(a) first view, fresh browser session: diagram", [w[1] for w in warm]))
    print(summary("    of which navigation → page title", [w[0] for w in warm]))
    print(summary("(b) click → details", taken))


if __name__ == "__main__":
    main()
