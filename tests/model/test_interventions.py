"""Interventions (issue 20 item 4): the text form and its refusals, what each one changes in the forward (and what it
leaves bit-identical), the fast model against the reference, DSpark staying lossless, the trace header, the CLI."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.cli import main
from engine.generation import DSparkConfig, Engine, generate, generate_speculative
from engine.generation.results import run_interventions
from engine.model import Transformer, init_weights
from engine.request import GenerationRequest
from engine.request.interventions import KINDS, Intervention, check_interventions, parse_intervention
from engine.spec.config import load_config
from engine.spec.errors import InputError
from engine.speedups import apply_speedups
from engine.trace import Trace, TraceBudget
from tests.model_helpers import RecordingTrace, random_tokens, synthetic_token_map

V = 64   # a small vocabulary: the head is the biggest cost of the tiny models
S = 16   # tokens per test sequence: long enough that layer 8's indexer sees more rows than its top-k (4)


def small_args(config: str = "configs/tiny-v4.1.json"):
    return load_config(config).replace(vocab_size=V, dspark_noise_token_id=V - 1)


def built(config: str = "configs/tiny-v4.1.json", fast: bool = True, dtype=torch.float64, **changes) -> Transformer:
    """A random-init tiny model (seed 0): the reference modules, or with the speed transforms applied."""
    a = small_args(config).replace(**changes)
    m = Transformer(a, synthetic_token_map(a) if a.has_engram else None, dtype=dtype)
    init_weights(m, 0)
    return (apply_speedups(m) if fast else m).eval()


@pytest.fixture(scope="module")
def model():
    return built()


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(1, S, seed=11, vocab=V)


def run(model, tokens, interventions=None, cache_len: int = 32):
    """One traced forward of every position → (logits [1, S, V], RecordingTrace, cache)."""
    trace, cache = RecordingTrace(), model.new_cache(1, cache_len)
    with torch.no_grad():
        logits = model(tokens, cache, logits="all", trace=trace, interventions=interventions).logits
    return logits, trace, cache


def recorded(trace, kind: str, path: str, site: str | None = None) -> dict:
    (entry,) = [e for e in getattr(trace, kind) if e["path"] == path and (site is None or e["site"] == site)]
    return entry


def routing(trace, layer: int) -> torch.Tensor:
    """[S, k] the routed expert ids of layer `layer` (row 0)."""
    return recorded(trace, "moe", f"layers.{layer}.ffn")["ids"][0]


# ---- the text form ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want, sentence", [
    ("engram-off:4", Intervention("engram-off", 4), "switch off Engram at layer 4, every token"),
    ("ban-expert:3:5@12", Intervention("ban-expert", 3, 5, 12, 12), "ban expert 5 at layer 3, token 12 only"),
    ("force-expert:2:0@3-7", Intervention("force-expert", 2, 0, 3, 7), "force expert 0 at layer 2, tokens 3–7"),
    ("mhc-identity:0@5-", Intervention("mhc-identity", 0, None, 5, None),
     "pin the mHC mixing matrices to the identity at layer 0, from token 5 on"),
    ("no-candidate-filter", Intervention("no-candidate-filter"), "skip the indexer's candidate filter, every token"),
    ("drop-stage:1@0", Intervention("drop-stage", 1, None, 0, 0), "drop DSpark stage 1, token 0 only"),
])
def test_text_round_trips_and_describes_itself(text, want, sentence):
    iv = parse_intervention(text)
    assert iv == want and iv.text == text and parse_intervention(iv.text) == iv
    assert iv.describe() == sentence
    assert set(KINDS) == {"engram-off", "ban-expert", "force-expert", "mhc-identity", "no-candidate-filter",
                          "drop-stage"}


def test_text_is_canonical():
    assert parse_intervention(" ban-expert:3:5@12-12 ").text == "ban-expert:3:5@12"
    assert Intervention("engram-off", 1, first=2, last=None).text == "engram-off:1@2-"


@pytest.mark.parametrize("text, message", [
    ("bogus:1", "intervention 'bogus:1': unknown kind 'bogus'; write one of engram-off:L"),
    ("ban-expert:3", "intervention 'ban-expert:3': 'ban-expert' is written ban-expert:L:E"),
    ("engram-off", "'engram-off' is written engram-off:L"),
    ("no-candidate-filter:2", "'no-candidate-filter' is written no-candidate-filter"),
    ("drop-stage:x", "stage 'x' is not a whole number ≥ 0"),
    ("ban-expert:3:-1", "expert '-1' is not a whole number ≥ 0"),
    ("engram-off:1@", "positions '' must be P, P-Q or P-"),
    ("engram-off:1@a-3", "positions 'a-3' must be P, P-Q or P-"),
    ("engram-off:1@7-3", "intervention 'engram-off:1@7-3': position range 7-3 ends before it starts"),
    ("engram-off:1@-3", "positions '-3' must be P, P-Q or P-"),
])
def test_bad_text_is_refused_naming_the_part(text, message):
    with pytest.raises(InputError) as e:
        parse_intervention(text)
    assert message in str(e.value)


@pytest.mark.parametrize("fields, message", [
    (("ban-expert", 3), "intervention 'ban-expert': needs an expert number"),
    (("engram-off", 1, 2), "intervention 'engram-off': takes no expert number"),
    (("nothing",), "intervention 'nothing': unknown kind"),
    (("engram-off", 1, None, None, 4), "a last position (4) needs a first position"),
    (("engram-off", -1), "the layer number must be a whole number ≥ 0, got -1"),
    (("drop-stage",), "intervention 'drop-stage': needs a stage number"),
    (("engram-off", 1, None, "3"), "the first position must be a whole number ≥ 0, got '3'"),
])
def test_inconsistent_fields_are_refused(fields, message):
    with pytest.raises(InputError) as e:
        Intervention(*fields)
    assert message in str(e.value)


V41 = "configs/tiny-v4.1.json"
V4 = "configs/tiny-v4.json"


@pytest.mark.parametrize("config, items, message", [
    (V41, ["engram-off:2"], "intervention 'engram-off:2': layer 2 has no Engram (Engram layers: 1, 4)"),
    (V41, ["mhc-identity:10"], "layer 10 is out of range: the backbone has layers 0..9"),
    (V41, ["ban-expert:3:8"], "expert 8 is out of range: layer 3 has experts 0..7"),
    (V41, ["drop-stage:3"], "the DSpark drafter has stages 0..2, not 3"),
    (V41, ["ban-expert:3:1@2-5", "force-expert:3:1@5"], "expert 1 is both banned and forced at layer 3"),
    (V41, ["force-expert:3:1@2-", "force-expert:3:2", "force-expert:3:4@9"],
     "forces 3 experts at layer 3 at token 9, more than the top-k (2)"),
    (V41, [f"ban-expert:5:{e}" for e in range(7)], "bans 7 experts at layer 5 at token 0, more than 6"),
    (V41, ["engram-off:1", "engram-off:1"], "intervention 'engram-off:1': is given twice"),
    (V4, ["engram-off:1"], "layer 1 has no Engram (Engram layers: none)"),
    (V4, ["ban-expert:1:0"], "layer 1 is hash-routed (V4's first 2 layers): its experts are fixed by the token id"),
    (V4, ["no-candidate-filter"], "has no candidate filter"),
    (V41, ["bogus"], "unknown kind 'bogus'"),
])
def test_check_against_a_config_refuses_what_it_cannot_do(config, items, message):
    with pytest.raises(InputError) as e:
        check_interventions(items, small_args(config))
    assert message in str(e.value)


def test_check_accepts_what_fits_and_keeps_the_order():
    a = small_args()
    items = ["ban-expert:3:1@2-4", "force-expert:3:1@5-", Intervention("force-expert", 3, 2), "no-candidate-filter",
             "force-expert:4:0@0", "force-expert:4:1@1", "force-expert:4:2@0-1"]   # two forced at every position
    assert [iv.text for iv in check_interventions(items, a)] == ["ban-expert:3:1@2-4", "force-expert:3:1@5-",
                                                                 "force-expert:3:2", "no-candidate-filter",
                                                                 "force-expert:4:0@0", "force-expert:4:1@1",
                                                                 "force-expert:4:2@0-1"]
    no_drafter = small_args("configs/deepseek-v4-flash.json")
    with pytest.raises(InputError, match="has no DSpark drafter"):
        check_interventions(["drop-stage:0"], no_drafter)


# ---- what each intervention changes ------------------------------------------------------------------------

LAYER, P = 3, S - 3   # the banned expert's layer and position (P within the cache's rollback margin of the end)


def test_no_intervention_and_one_that_reaches_no_position_change_nothing(model, tokens):
    plain, t0, _ = run(model, tokens)
    empty, t1, _ = run(model, tokens, ())
    far, t2, _ = run(model, tokens, ["ban-expert:3:0@400-", "mhc-identity:2@400", "engram-off:1@400",
                                     "no-candidate-filter@400-"])
    assert torch.equal(plain, empty) and torch.equal(plain, far)
    for a, b in zip(t0.moe, t2.moe, strict=True):
        assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["weights"], b["weights"])
    for a, b in zip(t0.mhc, t2.mhc, strict=True):
        assert torch.equal(a["comb"], b["comb"])


def test_banning_the_chosen_expert_changes_that_routing_and_nothing_before_it(model, tokens):
    logits, trace, cache = run(model, tokens)
    chosen = int(routing(trace, LAYER)[P, 0])
    ban = f"ban-expert:{LAYER}:{chosen}@{P}"
    b_logits, b_trace, b_cache = run(model, tokens, [ban])
    ids = routing(b_trace, LAYER)
    assert chosen not in ids[P].tolist() and chosen in routing(trace, LAYER)[P].tolist()
    assert len(set(ids[P].tolist())) == model.args.n_activated_experts and 0 <= int(ids[P].min())
    assert int(ids[P].max()) < model.args.n_routed_experts
    assert not torch.equal(ids[P], routing(trace, LAYER)[P])
    # the token's later layers see another input; every earlier position is bit-identical
    assert not torch.equal(b_logits[0, P], logits[0, P])
    assert torch.equal(b_logits[0, :P], logits[0, :P])
    for a, b in zip(trace.moe, b_trace.moe, strict=True):
        assert torch.equal(a["ids"][0, :P], b["ids"][0, :P]) and torch.equal(a["weights"][0, :P], b["weights"][0, :P])
    for layer in range(LAYER):  # layers before L route the banned position as before
        assert torch.equal(routing(trace, layer)[P], routing(b_trace, layer)[P])
    assert any(not torch.equal(x, y) for x, y in zip(cache.live_state(0).values(), b_cache.live_state(0).values()))
    cache.rollback(P, torch.tensor([0]))
    b_cache.rollback(P, torch.tensor([0]))
    want, got = cache.live_state(0), b_cache.live_state(0)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_forcing_an_expert_puts_it_in_the_chosen_set_weighted_as_the_gate_weighs(model, tokens):
    _, trace, _ = run(model, tokens)
    unchosen = sorted(set(range(model.args.n_routed_experts)) - set(routing(trace, LAYER)[P].tolist()))[0]
    _, f_trace, _ = run(model, tokens, [f"force-expert:{LAYER}:{unchosen}@{P}-"])
    entry = recorded(f_trace, "moe", f"layers.{LAYER}.ffn")
    ids, weights, scores = entry["ids"][0], entry["weights"][0], entry["scores"][0]
    assert all(unchosen in ids[p].tolist() for p in range(P, S))
    assert torch.equal(ids[:P], routing(trace, LAYER)[:P])
    gate = model.layers[LAYER].ffn.gate   # renormalised over the chosen, times route_scale, as for any expert
    torch.testing.assert_close(weights, scores / scores.sum(-1, keepdim=True) * gate.route_scale, rtol=1e-12, atol=0)


def test_engram_off_adds_nothing_there_and_records_gate_zero(model, tokens):
    logits, trace, _ = run(model, tokens)
    off, o_trace, _ = run(model, tokens, ["engram-off:4"])
    # the direct computation: the same model with layer 4's Engram projection zeroed adds exactly nothing
    zeroed = built()
    with torch.no_grad():
        zeroed.layers[4].engram.wkv.weight.zero_()
    direct, _, _ = run(zeroed, tokens)
    assert torch.equal(off, direct) and not torch.equal(off, logits)
    gates = recorded(o_trace, "engram", "layers.4.engram")["gates"]
    assert torch.equal(gates, torch.zeros_like(gates))
    assert bool((recorded(trace, "engram", "layers.4.engram")["gates"] > 0).all())
    # one position only: gates 0 there, the earlier positions untouched
    one, p_trace, _ = run(model, tokens, ["engram-off:1@5"])
    g = recorded(p_trace, "engram", "layers.1.engram")["gates"][0]
    assert bool((g[5] == 0).all()) and bool((g[torch.arange(S) != 5] > 0).all())
    assert torch.equal(one[0, :5], logits[0, :5]) and not torch.equal(one[0, 5], logits[0, 5])


def test_mhc_identity_records_the_identity_at_that_layer(model, tokens):
    logits, trace, _ = run(model, tokens)
    pinned, p_trace, _ = run(model, tokens, ["mhc-identity:2@4-"])
    eye = torch.eye(model.args.hc_mult, dtype=torch.float64)
    for site in ("attn", "ffn"):
        comb = recorded(p_trace, "mhc", "layers.2", site)["comb"][0]          # [S, hc, hc]
        assert all(torch.equal(comb[p], eye) for p in range(4, S))
        assert torch.equal(comb[:4], recorded(trace, "mhc", "layers.2", site)["comb"][0, :4])
        assert not torch.equal(recorded(p_trace, "mhc", "layers.3", site)["comb"][0, 4], eye)
    assert torch.equal(pinned[0, :4], logits[0, :4]) and not torch.equal(pinned[0, 4:], logits[0, 4:])


def test_no_candidate_filter_changes_which_rows_the_filtered_layer_reads(model, tokens):
    uses = [r.layer for r in model.args.roles[:model.args.n_layers] if r.uses_candidates]
    assert uses == [8]
    logits, trace, _ = run(model, tokens)
    free, f_trace, _ = run(model, tokens, ["no-candidate-filter"])
    picks, free_picks = (recorded(t, "attn", "layers.8.attn")["topk"][0] for t in (trace, f_trace))
    assert not torch.equal(picks, free_picks) and not torch.equal(free, logits)
    source = [recorded(t, "attn", "layers.6.attn")["topk"] for t in (trace, f_trace)]   # the candidate source's own
    assert torch.equal(*source)
    # the direct computation: the same weights in a config without a candidate filter
    unfiltered = built(candidate_source_layer=-1, candidate_topk_blocks=0, candidate_block_size=0)
    assert unfiltered.state_dict().keys() == model.state_dict().keys()
    direct, d_trace, _ = run(unfiltered, tokens)
    assert torch.equal(free, direct) and torch.equal(recorded(d_trace, "attn", "layers.8.attn")["topk"][0], free_picks)
    # from position 10 on only: the picks before it are the filtered ones
    late = recorded(run(model, tokens, ["no-candidate-filter@10-"])[1], "attn", "layers.8.attn")["topk"][0]
    assert torch.equal(late[:10], picks[:10]) and torch.equal(late[10:], free_picks[10:])


# ---- the fast model against the reference ------------------------------------------------------------------

@pytest.fixture(scope="module")
def pairs():
    """config → (reference model, prepared model), built once per config."""
    made = {}

    def pair(config):
        if config not in made:
            made[config] = built(config, fast=False), built(config)
        return made[config]
    return pair


@pytest.mark.parametrize("config, items", [
    (V41, ["ban-expert:3:1@5-"]), (V41, ["force-expert:5:7", "ban-expert:5:0@2-9"]), (V41, ["engram-off:1@3-"]),
    (V41, ["mhc-identity:6"]), (V41, ["no-candidate-filter@10-"]),
    (V4, ["ban-expert:3:1@4-"]), (V4, ["force-expert:2:6", "mhc-identity:4@7-"]),
])
def test_the_prepared_model_agrees_with_the_reference(pairs, config, items):
    ref, fast = pairs(config)
    toks = random_tokens(1, S, seed=5, vocab=V)
    out, traces = {}, {}
    for name, m in (("ref", ref), ("fast", fast)):
        traces[name], cache = RecordingTrace(), m.new_cache(1, 32)
        with torch.no_grad():   # a prefill (sorted or dense experts), then one-token decodes (gathered, scalar mHC)
            prefill = m(toks[:, :-2], cache, logits="all", trace=traces[name], interventions=items).logits
            steps = [m(toks[:, i:i + 1], cache, trace=traces[name], interventions=items).logits for i in (S - 2, S - 1)]
        out[name] = torch.cat([prefill[0], *steps])
    torch.testing.assert_close(out["fast"], out["ref"], atol=1e-10, rtol=1e-10)
    with torch.no_grad():
        plain = fast(toks[:, :-2], logits="all").logits
    assert not torch.equal(out["fast"][:S - 2], plain[0])   # each case changes the output somewhere
    for a, b in zip(traces["fast"].moe, traces["ref"].moe, strict=True):
        assert torch.equal(a["ids"], b["ids"]), a["path"]
    for a, b in zip(traces["fast"].mhc, traces["ref"].mhc, strict=True):
        torch.testing.assert_close(a["comb"], b["comb"], atol=1e-12, rtol=0)


@pytest.mark.slow  # a whole tiny model in the Triton interpreter, twice a forward [10 s at load average ~4]
def test_triton_kernels_apply_interventions_as_the_reference():
    helpers = pytest.importorskip("tests.kernel_helpers")   # the interpreter on a CPU, natively on CUDA
    from engine.speedups import apply_kernels
    items = ["ban-expert:3:1", "force-expert:5:2@2", "mhc-identity:2@1-", "engram-off:1@0"]
    ref = built(dtype=torch.float32).to(helpers.DEVICE)
    kern = apply_kernels(built(dtype=torch.float32).to(helpers.DEVICE), "triton")
    toks, out = random_tokens(1, 3, seed=2, vocab=V).to(helpers.DEVICE), {}
    with torch.no_grad():
        for name, m in (("ref", ref), ("kernels", kern)):
            trace, cache = RecordingTrace(attention=False), m.new_cache(1, 8)
            prefill = m(toks[:, :2], cache, logits="all", trace=trace, interventions=items).logits
            out[name] = (torch.cat([prefill[0], m(toks[:, 2:], cache, trace=trace, interventions=items).logits]), trace)
    (want, t_ref), (got, t_kern) = out["ref"], out["kernels"]
    helpers.assert_close(got, want, 1e-4, "logits under interventions")
    for a, b in zip(t_kern.moe, t_ref.moe, strict=True):
        helpers.assert_equal(a["ids"], b["ids"], f"{a['path']} expert ids")
    assert all(1 not in ids for ids in torch.cat([e["ids"] for e in t_kern.moe if e["path"] == "layers.3.ffn"], 1)[0])
    assert 2 in [e for e in t_kern.moe if e["path"] == "layers.5.ffn"][1]["ids"].flatten().tolist()
    pinned = [e["comb"] for e in t_kern.mhc if e["path"] == "layers.2"]            # prefill attn, ffn; decode attn, ffn
    eye = torch.eye(4, device=helpers.DEVICE)
    assert all(torch.equal(c[0, -1], eye) for c in pinned) and not torch.equal(pinned[0][0, 0], eye)
    gates = [e["gates"] for e in t_kern.engram if e["path"] == "layers.1.engram"]
    assert bool((gates[0][0, 0] == 0).all()) and bool((gates[0][0, 1] > 0).all())


# ---- DSpark -------------------------------------------------------------------------------------------------

PROMPTS = [[0, 5, 7, 9, 11], [0, 10, 20]]
BACKBONE = ["engram-off:4", "ban-expert:7:2@6-"]


@pytest.fixture(scope="module")
def dspark_model():
    return built(dtype=torch.float32)


def test_drop_stage_changes_drafts_and_dspark_stays_lossless(dspark_model):
    m, cfg = dspark_model, DSparkConfig("all")
    plain = generate(m, PROMPTS, GenerationRequest.of(12, seed=0))
    intervened = generate(m, PROMPTS, GenerationRequest.of(12, seed=0, interventions=BACKBONE))
    assert intervened.tokens != plain.tokens                      # the backbone interventions matter
    spec = generate_speculative(m, PROMPTS, GenerationRequest.of(12, seed=0, dspark=cfg))
    dropped = generate_speculative(m, PROMPTS,
                                   GenerationRequest.of(12, seed=0, dspark=cfg, interventions=[*BACKBONE,
                                                        "drop-stage:1"]))
    assert spec.tokens == plain.tokens and dropped.tokens == intervened.tokens
    again = generate_speculative(m, PROMPTS, GenerationRequest.of(12, seed=0, dspark=cfg, interventions=BACKBONE))
    assert again.tokens == intervened.tokens
    # step 1 drafts from the same target taps (the prefill's): the dropped stage changes the drafter's output
    # (its confidences; the random-init Markov head often drafts the same tokens)
    (kept,), (changed,) = ([s for s in r.steps if (s.row, s.step) == (0, 1)] for r in (again, dropped))
    assert kept.anchor_token == changed.anchor_token and not np.array_equal(kept.confidences, changed.confidences)


def test_plain_decoding_refuses_drop_stage_and_graphs_refuse_interventions(dspark_model):
    with pytest.raises(InputError, match="'drop-stage' changes the DSpark drafter"):
        generate(dspark_model, PROMPTS, GenerationRequest.of(2, interventions=["drop-stage:0"]))
    for kwargs in ({"cuda_graphs": True}, {"compiled": True}):
        with pytest.raises(InputError, match="CUDA-graphed and torch.compile'd steps"):
            generate(dspark_model, PROMPTS, GenerationRequest.of(2, interventions=["engram-off:1"], **kwargs))
    with pytest.raises(InputError, match="CUDA-graphed"):
        generate_speculative(dspark_model, PROMPTS,
                             GenerationRequest.of(2, interventions=["drop-stage:0"], cuda_graphs=True))
    split = SimpleNamespace(args=dspark_model.args, world=SimpleNamespace(size=2))   # a model under torchrun
    with pytest.raises(InputError, match="not supported on a model split over 2 ranks"):
        run_interventions(split, ["engram-off:1"])
    assert not run_interventions(split, ())


# ---- the trace header and the CLI ---------------------------------------------------------------------------

def test_the_trace_header_records_the_canonical_texts_and_round_trips(dspark_model, tmp_path):
    engine = Engine(dspark_model)
    ids = [[0, 7, 3, 9]]
    trace = Trace(TraceBudget(max_tokens=64), meta={"config": "tiny"})
    engine.generate(ids,
                    GenerationRequest.of(3, trace=trace, interventions=[Intervention("engram-off", 1, first=2),
                                         "ban-expert:3:1@2-2"]))
    assert trace.meta["interventions"] == ["engram-off:1@2-", "ban-expert:3:1@2"] == trace.interventions
    path = tmp_path / "run.json"
    trace.save(path)
    loaded = Trace.load(path)
    assert loaded.interventions == ["engram-off:1@2-", "ban-expert:3:1@2"] and loaded == trace
    assert check_interventions(loaded.interventions, engine.args) == (Intervention("engram-off", 1, None, 2, None),
                                                                      Intervention("ban-expert", 3, 1, 2, 2))
    plain_trace = Trace(TraceBudget(max_tokens=64))
    engine.generate(ids, GenerationRequest.of(3, trace=plain_trace))
    assert plain_trace.meta["interventions"] == [] and plain_trace.interventions == []


def test_cli_intervene_prints_the_intervention_and_records_it(tmp_path, capsys):
    out = tmp_path / "run.json"
    base = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "The cat", "--max-new-tokens", "3"]
    assert main(base + ["--intervene", "ban-expert:3:1@2-", "--intervene", "engram-off:4", "--trace", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout.startswith("The cat")
    assert "[intervention ban-expert:3:1@2-: ban expert 1 at layer 3, from token 2 on]" in stderr
    assert "[intervention engram-off:4: switch off Engram at layer 4, every token]" in stderr
    assert Trace.load(out).interventions == ["ban-expert:3:1@2-", "engram-off:4"]


@pytest.mark.parametrize("extra, message", [
    (["--intervene", "ban-expert:3"], "error: --intervene: intervention 'ban-expert:3': 'ban-expert' is written"),
    (["--intervene", "engram-off:2"], "error: --intervene: intervention 'engram-off:2': layer 2 has no Engram"),
    (["--intervene", "drop-stage:0"], "drop-stage changes the DSpark drafter; add --dspark"),
    (["--intervene", "engram-off:1", "--cuda-graphs"], "--intervene runs on the eager decode path"),
])
def test_cli_refuses_a_bad_intervention_with_exit_2(capsys, extra, message):
    base = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "The cat", "--max-new-tokens", "2"]
    assert main(base + extra) == 2
    assert message in capsys.readouterr().err
