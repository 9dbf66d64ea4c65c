"""End-to-end: four browser sessions generating on the Inspect page at once get exactly what the engine gives
each prompt alone (issue 16): greedy, the default model, different prompts, run in-process one after another."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.request import GenerationRequest
from tests.browser_helpers import settled

# four browser sessions generating at once on Inspect, against serial engine runs [65 s at load average 5, 150 s at 8]
pytestmark = pytest.mark.slow

DEFAULT = Path(__file__).resolve().parents[2] / "checkpoints" / "default"   # the model the page opens with
PROMPTS = ("ROMEO:", "JULIET: O", "To be, or not", "The king is")
MAX_NEW = 12
FINISHED = ("() => { const s = document.querySelector('.st-key-inspect_status');"
            " return !!s && /max new tokens|end of text|context length/.test(s.innerText); }")


@pytest.fixture(scope="module")
def serial_outputs() -> dict[str, str]:
    """Each prompt's generated text from the engine in this process, one prompt at a time, with the page's
    settings (greedy with its default decoding options, BOS, whole characters as streamed) and its torch thread
    count."""
    import torch

    from engine.generation import Engine
    from engine.request.decoding import SUGGESTED_NO_REPEAT_NGRAM, SUGGESTED_REPETITION_PENALTY
    from v41viz.ui.engine_session import TORCH_THREADS
    threads = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    try:
        engine = Engine.load(checkpoint=DEFAULT)
        out = {}
        request = GenerationRequest.of(MAX_NEW, temperature=0.0, repetition_penalty=SUGGESTED_REPETITION_PENALTY,
                                       no_repeat_ngram=SUGGESTED_NO_REPEAT_NGRAM)
        for prompt in PROMPTS:
            pieces: list[str] = []
            engine.generate_text(prompt, request, on_text=lambda _row, piece: pieces.append(piece))
            out[prompt] = "".join(pieces)
        return out
    finally:
        torch.set_num_threads(threads)


def test_four_sessions_generating_at_once_get_the_serial_outputs(server, browser, screenshots, serial_outputs):
    base, log_path = server
    contexts = [browser.new_context(viewport={"width": 1400, "height": 1100}) for _ in PROMPTS]
    pages = [c.new_page() for c in contexts]
    for page, prompt in zip(pages, PROMPTS):
        page.set_default_timeout(120_000)
        page.goto(base + "/inspect")
        page.get_by_role("button", name="Generate").wait_for()
        page.get_by_label("Prompt").fill(prompt)
        box = page.get_by_label("max new tokens")
        box.fill(str(MAX_NEW))
        box.press("Tab")
        settled(page)
    for page in pages:  # all four runs are requested before any has finished
        page.get_by_role("button", name="Generate").click()
    shown = {}
    for page, prompt in zip(pages, PROMPTS):
        page.wait_for_function(FINISHED, timeout=180_000)
        settled(page)
        text = page.locator(".st-key-inspect_output [data-testid='stHtml']").first.text_content()
        assert text.startswith(prompt), (prompt, text)
        shown[prompt] = text[len(prompt):]
    pages[-1].screenshot(path=str(screenshots / "inspect_four_sessions.png"), full_page=True)
    for c in contexts:
        c.close()
    assert shown == serial_outputs
    assert len(set(shown.values())) == len(PROMPTS)    # four different prompts gave four different texts
    assert "Traceback" not in log_path.read_text()
