"""What-if specs as users type them (issue 46): `--intervene`, the app's form and a link's `intervene=`. A corpus of
malformed, out-of-range, duplicated and thousands-long specs, each refused with an InputError naming the problem
(the CLI: exit 2, one line; a link: a note, never an exception), and property-based tests (hypothesis) that any
text at all ends in an Intervention that round-trips or in that error, in bounded time."""
from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cli import main
from engine.request.interventions import (
    KINDS,
    MAX_INTERVENTIONS,
    MAX_TEXT_CHARS,
    Intervention,
    check_interventions,
    parse_intervention,
)
from engine.spec.config import load_config
from engine.spec.errors import InputError
from v41viz.inspect.url import MAX_CHANGES, parse_link

TINY = load_config("configs/tiny-v4.1.json")   # 10 layers, 8 experts top-2, Engram at 1 and 4, 3 DSpark stages
MESSAGE_MAX_CHARS = 400   # a refusal is one readable line, whatever the input's size
# Modest example counts keep each property near a second; no per-example deadline (the first example builds
# hypothesis's Unicode tables, ~1 s on a loaded machine), the corpus above bounds the time per case; no example
# database (its caches stay in the ignored .hypothesis folder).
PROPERTY = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# (case id, the specs of one run, what the message must say)
CORPUS = [
    # ---- malformed ----
    ("unknown-kind", ["ban-experts:1:2"], "unknown kind 'ban-experts'"),
    ("empty", [""], "unknown kind ''"),
    ("missing-expert", ["force-expert:3"], "'force-expert' is written force-expert:L:E"),
    ("extra-field", ["engram-off:1:2"], "'engram-off' is written engram-off:L"),
    ("sign", ["ban-expert:+3:1"], "layer '+3' is not a whole number ≥ 0"),
    ("arabic-digit", ["ban-expert:\u0663:1"], "layer '\u0663' is not a whole number ≥ 0"),
    ("superscript", ["engram-off:\u00b9"], "layer '\u00b9' is not a whole number ≥ 0"),
    ("float", ["mhc-identity:1.5"], "layer '1.5' is not a whole number ≥ 0"),
    ("two-spans", ["engram-off:1@2@3"], "positions '2@3' must be P, P-Q or P-"),
    ("open-start", ["engram-off:1@-4"], "positions '-4' must be P, P-Q or P-"),
    ("reversed-span", ["engram-off:1@9-2"], "position range 9-2 ends before it starts"),
    ("nul-byte", ["engram-off:1\x00"], "layer '1\\x00' is not a whole number ≥ 0"),
    ("newline", ["engram-off:1\nban-expert:2:1"], "'engram-off' is written engram-off:L"),
    ("spaces-inside", ["ban-expert: 1:2"], "layer ' 1' is not a whole number ≥ 0"),
    # ---- out of range, of the config (tiny-v4.1) or of any number ----
    ("layer-beyond-model", ["mhc-identity:10"], "layer 10 is out of range: the backbone has layers 0..9"),
    ("expert-beyond-model", ["ban-expert:2:8"], "expert 8 is out of range: layer 2 has experts 0..7"),
    ("no-engram-there", ["engram-off:2"], "layer 2 has no Engram (Engram layers: 1, 4)"),
    ("stage-beyond-drafter", ["drop-stage:3"], "the DSpark drafter has stages 0..2, not 3"),
    ("layer-10-digits", ["mhc-identity:1234567890"], "layer 1234567890 has more than 9 digits"),
    ("expert-5000-digits", ["ban-expert:1:" + "9" * 5000], "has 5,013 characters; one is at most 64"),
    ("position-20-digits", ["engram-off:1@" + "1" * 20], "token positions of at most 9 digits"),
    ("position-end-20-digits", ["engram-off:1@3-" + "1" * 20], "token positions of at most 9 digits"),
    ("position-1e9-ok-range", ["engram-off:1@999999999-"], None),
    # ---- duplicated and contradictory ----
    ("twice", ["engram-off:1", "engram-off:1"], "intervention 'engram-off:1': is given twice"),
    ("twice-canonical", ["ban-expert:2:1@4", " ban-expert:2:1@4-4 "],
     "intervention 'ban-expert:2:1@4': is given twice"),
    ("ban-and-force", ["ban-expert:2:1", "force-expert:2:1@3-"], "expert 1 is both banned and forced at layer 2"),
    ("force-beyond-top-k", ["force-expert:2:1", "force-expert:2:3", "force-expert:2:5"],
     "forces 3 experts at layer 2 at token 0, more than the top-k (2)"),
    ("ban-all-but-one", [f"ban-expert:2:{e}" for e in range(7)], "bans 7 experts at layer 2 at token 0, more than 6"),
    # ---- thousands long ----
    ("10k-characters", ["engram-off:1@" + "0" * 10_000], "has 10,013 characters; one is at most 64"),
    ("thousands-of-specs", [f"engram-off:1@{p}" for p in range(5000)],
     f"more than {MAX_INTERVENTIONS} interventions; a run takes at most {MAX_INTERVENTIONS}"),
]


def refusal(specs: list[str]) -> str | None:
    """check_interventions against tiny-v4.1: the message, or None when accepted; always within 0.5 s."""
    start = time.perf_counter()
    try:
        check_interventions(specs, TINY)
        message = None
    except InputError as e:
        message = str(e)
    assert time.perf_counter() - start < 0.5
    return message


@pytest.mark.parametrize("specs, message", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_a_bad_spec_is_refused_naming_the_problem(specs, message):
    got = refusal(specs)
    if message is None:
        assert got is None
    else:
        assert got is not None and message in got, got
        assert len(got) <= MESSAGE_MAX_CHARS and "\n" not in got.replace("\\n", "")


def test_the_corpus_is_large_and_every_refusal_clear():
    refusals = [refusal(c[1]) for c in CORPUS if c[2] is not None]
    assert len(CORPUS) >= 30 and len({c[0] for c in CORPUS}) == len(CORPUS)
    assert all(r is not None and len(r) <= MESSAGE_MAX_CHARS for r in refusals)


@pytest.mark.parametrize("case", ["expert-5000-digits", "thousands-of-specs"])
def test_the_cli_exits_2_with_one_line(case, capsys):
    """Refused before a model is built (in-process: ~0.2 s once torch is imported, which a first call does)."""
    specs = next(c[1] for c in CORPUS if c[0] == case)[:100]   # argparse takes seconds for thousands of options
    argv = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "hi", "--max-new-tokens", "1"]
    start = time.perf_counter()
    assert main(argv + [f"--intervene={s}" for s in specs]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --intervene") and err.count("\n") == 1 and "Traceback" not in err, err[:300]
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize("value, why", [
    ("ban-expert:1:" + "9" * 5000, "has 5,013 characters"),
    (",".join(["engram-off:1"] * (MAX_CHANGES + 1)), f"at most {MAX_CHANGES} comma-separated changes"),
    ("engram-off:1@" + "7" * 12, "token positions of at most 9 digits"),
    ("drop-stage:\u0661", "is not a whole number ≥ 0"),
])
def test_a_link_with_a_bad_intervene_gets_a_note(value, why):
    link, notes = parse_link({"intervene": value, "model": "tiny-v4.1"})
    assert link.interventions == () and link.model == "tiny-v4.1"
    assert len(notes) == 1 and notes[0].startswith("`intervene=") and why in notes[0]


# ---- properties -----------------------------------------------------------------------------------------------

SPEC_ALPHABET = st.sampled_from(list("0123456789:@-,") + ["ban-expert", "force-expert", "engram-off", "mhc-identity",
                                                          "no-candidate-filter", "drop-stage", " ", "x", "\u0663"])
spec_text = st.one_of(st.text(max_size=80), st.lists(SPEC_ALPHABET, max_size=12).map("".join))


@PROPERTY
@given(spec_text)
def test_any_text_parses_to_a_canonical_change_or_an_input_error(text):
    try:
        iv = parse_intervention(text)
    except InputError as e:
        assert 0 < len(str(e)) <= MESSAGE_MAX_CHARS
        return
    assert parse_intervention(iv.text) == iv and len(iv.text) <= MAX_TEXT_CHARS


interventions = st.builds(
    lambda kind, layer, expert, first, length: Intervention(
        kind, None if kind == "no-candidate-filter" else layer,
        expert if kind in ("ban-expert", "force-expert") else None,
        first, None if first is None or length is None else first + length),
    st.sampled_from(KINDS), st.integers(0, 12), st.integers(0, 10), st.none() | st.integers(0, 10**6),
    st.none() | st.integers(0, 50))


@PROPERTY
@given(interventions)
def test_every_change_round_trips_through_its_text(iv):
    assert parse_intervention(iv.text) == iv


@PROPERTY
@given(st.lists(interventions | spec_text, max_size=8))
def test_any_list_checks_against_a_config_or_is_refused(items):
    try:
        checked = check_interventions(items, TINY)
    except InputError as e:
        assert 0 < len(str(e)) <= MESSAGE_MAX_CHARS
        return
    assert len(checked) == len(items) and len(set(checked)) == len(checked)


url_value = st.one_of(st.text(max_size=60), st.from_regex(r"[0-9]{1,14}(\.[0-9]{0,10})?", fullmatch=True),
                      st.lists(SPEC_ALPHABET, max_size=10).map("".join))
URL_KEYS = ["model", "prompt", "pid", "max_new", "temperature", "top_p", "top_k", "seed", "attention", "dspark",
            "schedule", "threshold", "rep_penalty", "no_repeat", "intervene", "panel", "node", "layer", "seam",
            "token", "arch", "run", "other"]


@PROPERTY
@given(st.dictionaries(st.sampled_from(URL_KEYS), url_value | st.lists(url_value, max_size=3), max_size=10))
def test_any_link_parses_to_values_in_range_and_notes_never_an_exception(params):
    link, notes = parse_link(params)
    assert all(isinstance(n, str) and n.startswith("`") and len(n) <= MESSAGE_MAX_CHARS for n in notes)
    assert len(link.interventions) <= MAX_CHANGES
    assert all(parse_intervention(t).text == t for t in link.interventions)
    assert link.token is None or 0 <= link.token <= 10**7
    assert link.run_id == "" or (len(link.run_id) == 16 and int(link.run_id, 16) >= 0)
