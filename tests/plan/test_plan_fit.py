"""`engine plan --fit`: the configurations that fit, fewest GPUs first, each GPU count one the parallel layout can
split the config over, at the longest context that fits; why the smaller ones do not; the results file for the
docs."""
import json

from engine.accounting.accounting import GIB
from engine.bench.results_file import load
from engine.cli import main
from engine.plan.fit import LADDER, fit_options, impossible_counts
from engine.plan.memory_plan import Hardware, memory_plan
from engine.spec.parallel_degree import parallel_degrees, uneven_counts
from engine.spec.presets import resolve_config
from tests.script_helpers import script_module

V41 = "deepseek-v4.1-flash"


def test_the_allowed_gpu_counts_follow_the_layout_rule():
    a = resolve_config(V41)   # n_heads 64, o_groups 8, 384 routed experts, 128 drafter experts
    assert parallel_degrees(a, 16) == [1, 2, 4, 8]
    assert uneven_counts(a, 3) == ["n_heads = 64", "o_groups = 8", "dspark_n_routed_experts = 128"]   # 384 = 3·128
    assert uneven_counts(a, 16) == ["o_groups = 8"]
    assert parallel_degrees(resolve_config("tiny-v4.1"), 8) == [1, 2]   # o_groups 2
    assert impossible_counts(a, 8).startswith("3, 5, 6, 7 GPUs: no even split (n_heads 64, o_groups 8")


def test_v41_what_fits_on_141_and_80_gib_gpus():
    a = resolve_config(V41)
    for gpu_mem, fitting in ((141, {(1, "host"), (4, "device"), (8, "device")}),
                             (80, {(1, "host"), (4, "device"), (8, "device")})):
        options = fit_options(a, gpu_mem, 512)
        assert [(o.gpus, o.experts) for o in options] == [(1, "device"), (1, "host"), (2, "device"), (4, "device"),
                                                          (8, "device")]
        assert {(o.gpus, o.experts) for o in options if o.fits} == fitting
        for o in options:
            p = o.plan
            assert p.checkpoint_bytes == 509_315_486_040 and p.hardware.gpu_mem_gib == gpu_mem
            if o.fits:   # the longest context on the ladder: the next one up does not fit
                assert p.fits and p.hardware.context in LADDER
                if p.hardware.context < LADDER[-1]:
                    longer = Hardware(**{**p.hardware.__dict__, "context": 2 * p.hardware.context})
                    assert not memory_plan(a, longer).fits
            else:        # judged at the shortest context, and the reason names the shortfall
                assert p.hardware.context == LADDER[0]
                assert f"needs {o.per_gpu / GIB:.1f} GiB per GPU, has {gpu_mem} GiB" in o.reason
    four_80 = next(o for o in fit_options(a, 80, 512) if o.gpus == 4)
    assert four_80.plan.hardware.context == 256 * 1024          # 4 × 80 GiB holds 256k, not 512k
    one = fit_options(a, 80, 256)[1]                             # experts on host, too little host RAM
    assert not one.fits and "GiB host RAM, has 256 GiB" in one.reason


def test_a_given_context_is_the_only_one_tried():
    options = fit_options(resolve_config(V41), 141, 512, context=131072)
    assert {o.plan.hardware.context for o in options} == {131072}
    eight = options[-1]
    assert eight.per_gpu == memory_plan(resolve_config(V41), Hardware(gpus=8, gpu_mem_gib=141)).gpus[0].need


def test_engine_plan_fit_prints_the_table_and_the_fewest_that_fit(capsys):
    assert main(["plan", V41, "--fit", "--gpu-mem", "80", "--host-mem", "512"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{V41}: what fits on GPUs of 80 GiB with 512 GiB host RAM")
    assert "does not fit even at context 4k: needs 292.4 GiB per GPU, has 80 GiB" in out
    assert "fewest GPUs that fit: 1 × 80 GiB + 512 GiB host, experts on host, up to 1M context" in out
    assert "fewest with the experts on the devices: 4 × 80 GiB, experts on device, up to 256k context" in out
    assert "not tried: 3, 5, 6, 7 GPUs" in out
    assert "every row places the whole checkpoint, 509,315,486,040 B: equal to the accounting layer's" in out
    assert main(["plan", V41, "--fit", "--gpu-mem", "141", "--gpu-mem", "80", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert [s["gpu_mem_gib"] for s in j["searches"]] == [141, 80] and j["accounting_checkpoint_bytes"] == 509315486040
    rows = {(o["gpus"], o["experts"]): o for o in j["searches"][0]["options"]}
    assert rows[(8, "device")]["fits"] and rows[(4, "device")]["fits"] and not rows[(2, "device")]["fits"]
    assert rows[(4, "device")]["parallel_degree"] == 4


def test_bad_fit_arguments_are_named(capsys):
    assert main(["plan", V41, "--fit", "--gpus", "2"]) == 2
    assert "give --max-gpus instead of --gpus" in capsys.readouterr().err
    assert main(["plan", V41, "--gpu-mem", "80", "--gpu-mem", "141"]) == 2
    assert "more than one size needs --fit" in capsys.readouterr().err


def test_the_results_file_holds_every_row_and_renders_with_the_verdicts(tmp_path, capsys, monkeypatch):
    path = tmp_path / "plan.json"
    argv = ["plan", V41, "--fit", "--gpu-mem", "141", "--host-mem", "512", "--results", str(path)]
    monkeypatch.setattr("sys.argv", ["engine", *argv])
    assert main(argv) == 0
    capsys.readouterr()
    results = load(path)
    assert results["kind"] == "plan" and results["torch"] == "not used"
    assert results["command"] == "python -m engine " + " ".join(argv)
    assert [(r["gpus"], r["experts"], r["fits"]) for r in results["rows"]] == [
        (1, "device", False), (1, "host", True), (2, "device", False), (4, "device", True), (8, "device", True)]
    render = script_module("render_results.py")
    text = "\n".join(render.plan(results, ""))
    assert "| 1 × 141 GiB + 512 GiB host | 1 | host RAM | 1M |" in text
    assert "| 8 × 141 GiB | 8 | on the GPUs | 1M |" in text and "**fits at context 1M" in text
    assert "509,315,486,040 B (equal to the accounting layer's checkpoint bytes)" in text
