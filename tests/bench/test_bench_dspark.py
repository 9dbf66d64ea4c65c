"""scripts/bench_dspark.py: the sampling options reach every mode's generate call (with the repeat's seed), bad
values are refused, and the table labels differing outputs as expected only when sampling."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.script_helpers import script_module


def load_script():
    return script_module("bench_dspark.py")


class FakeEngine:
    """Records each generate call's request; every call gives the same tokens and DSpark figures."""

    def __init__(self, accepted_length: float, plain_steps: int):
        self.calls, self.accepted_length, self.plain_steps = [], accepted_length, plain_steps

    def generate(self, prompts, request):
        self.calls.append(request)
        metrics = SimpleNamespace(mean_accepted_length=self.accepted_length, steps=3)
        return SimpleNamespace(tokens=[[5, 6]], decode_tokens_per_s=10.0, metrics=metrics, plain_steps=self.plain_steps)


@pytest.mark.parametrize("argv", [["--temperature", "-1"], ["--temperature", "nan"], ["--temperature", "inf"],
                                  ["--repetition-penalty", "0"], ["--repetition-penalty", "nan"],
                                  ["--repetition-penalty", "-2"]])
def test_bad_decoding_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        load_script().parse_args(argv)
    assert "--temperature must be" in capsys.readouterr().err


def test_each_mode_decodes_with_the_options_and_the_repeats_seed():
    script, engine = load_script(), FakeEngine(2.0, 1)
    calls = engine.calls
    configs = {"plain": None, "all": object()}
    sampling = {"temperature": 0.7, "repetition_penalty": 1.3}
    plain = script.run(engine, [1, 2], "plain", configs, 8, False, sampling, seed=4)
    drafted = script.run(engine, [1, 2], "all", configs, 8, False, sampling, seed=4)
    assert [c.sampling.seed for c in calls] == [4, 4] and [c.dspark for c in calls] == [None, configs["all"]]
    assert all(c.sampling.temperature == 0.7 and c.sampling.repetition_penalty == 1.3 and c.max_new_tokens == 8
               and c.stop_tokens == () for c in calls)
    assert "accepted_length" not in plain and drafted["accepted_length"] == 2.0 and drafted["plain_steps"] == 1


def test_differing_outputs_read_as_drawn_when_sampling_and_as_a_failure_when_greedy():
    script = load_script()

    def mode(tokens):
        return {"tokens": tokens, "tokens_per_s": 10.0, "cpu_s": 1.0, "accepted_length": 2.0, "drafting_steps": 2,
                "plain_steps": 0}
    runs = [{"repeat": 0, "prompt": 0, "plain": mode([1, 2]), "auto": mode([1, 3]), "all": mode([1, 2])}]
    greedy = script.table(["P"], runs)[2]
    sampled = script.table(["P"], runs, sampled=True)[2]
    assert greedy.endswith("| NO |") and sampled.endswith("| no (sampled) |")
    runs[0]["auto"]["tokens"] = [1, 2]
    assert script.table(["P"], runs)[2].endswith("| yes |")
    rows = script.result_rows(["P"], runs)                # what --results writes: the table's rows, unformatted
    assert rows[0]["identical"] == "yes" and rows[0]["auto"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert rows[-1]["prompt"] == "all prompts" and set(rows[-1]) == {"prompt", "auto", "all", "auto_cpu", "all_cpu"}


def test_traced_modes_record_the_inspect_pages_trace_and_report_their_overhead_per_pair():
    script, engine = load_script(), FakeEngine(4.0, 0)
    calls = engine.calls
    configs = {"plain": None, "auto": object()}
    traced = script.run(engine, [1, 2], "auto traced", configs, 8)
    script.run(engine, [1, 2], "plain", configs, 8)
    assert calls[0].dspark is configs["auto"] and calls[1].trace is None and traced["accepted_length"] == 4.0
    budget = calls[0].trace.budget
    assert budget.attention and budget.lens and budget.max_tokens is None    # what the Inspect page records

    def mode(wall, rate, tokens=(1, 2)):
        return {"tokens": list(tokens), "tokens_per_s": rate, "wall_s": wall, "cpu_s": wall,
                "accepted_length": 4.0, "drafting_steps": 2, "plain_steps": 0}
    runs = [{"repeat": rep, "prompt": 0, "plain": mode(1.0, 20.0), "plain traced": mode(1.1, 16.0),
             "auto": mode(0.5, 40.0), "auto traced": mode(0.6 + rep / 10, 40.0), "all": mode(0.5, 40.0)}
            for rep in range(3)]
    rows = script.result_rows(["P"], runs)
    over = rows[0]["trace_overhead"]
    assert over["plain"]["wall"]["median"] == pytest.approx(1.1) and over["plain"]["decode"]["median"] == 1.25
    assert over["auto"]["wall"] == pytest.approx({"median": 1.4, "min": 1.2, "max": 1.6})
    assert over["auto"]["same_tokens"] and rows[-1]["trace_overhead"] == over      # one prompt: pooled = its own
    runs[1]["auto traced"]["tokens"] = [1, 3]                                        # a trace that changed the text
    rows = script.result_rows(["P"], runs)
    assert not rows[0]["trace_overhead"]["auto"]["same_tokens"]
    assert script.overhead_table(rows)[2].endswith("| NO |")
