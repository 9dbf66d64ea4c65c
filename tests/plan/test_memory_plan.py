"""Memory plan: exact weight totals, placement rules, KV and working bytes, verdicts, and `python -m engine plan`."""
import json
import shutil
from math import ceil

import pytest

from engine.accounting.accounting import GIB, account
from engine.accounting.inventory import inventory_tuple
from engine.cli import main
from engine.plan.memory_plan import Hardware, memory_plan, near_equal, tensor_rule
from engine.spec.errors import InputError
from engine.spec.presets import list_presets, resolve_config

V41 = "deepseek-v4.1-flash"


def run_plan(capsys, *argv):
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def placed_once(weights, gpus: int) -> int:
    """Each tensor counted once: sharded parts summed over GPUs, replicated copies once, host bytes."""
    return sum(sum(p["gpu_bytes"]) - (gpus - 1) * p["replicated_bytes"] + p["host_bytes"] for p in weights)


@pytest.mark.parametrize("gpus", [8, 4])
def test_v41_plan_totals_equal_the_accounting_checkpoint_bytes(capsys, gpus):
    code, out, _ = run_plan(capsys, V41, "--gpus", str(gpus), "--gpu-mem", "141", "--json")
    assert code == 0
    j = json.loads(out)
    acc = account(resolve_config(V41))
    assert j["checkpoint_bytes"] == j["accounting_checkpoint_bytes"] == acc.checkpoint_bytes == 509_315_486_040
    assert placed_once(j["weights"], gpus) == acc.checkpoint_bytes
    assert j["weights_on_gpus_bytes"] + j["weights_on_host_bytes"] == acc.checkpoint_bytes
    by_key = {p["key"]: p for p in j["weights"]}
    # 384 experts per layer split evenly: every GPU holds exactly 1/N of the routed-expert bytes
    assert by_key["routed_experts"]["gpu_bytes"] == [acc.bytes_by_kind["routed_experts"] // gpus] * gpus
    assert by_key["embedding"]["gpu_bytes"] == [acc.bytes_by_kind["embedding"] // gpus] * gpus
    assert by_key["engram_tables"]["host_bytes"] == acc.bytes_by_kind["engram_tables"]
    assert by_key["engram_tables"]["gpu_bytes"] == [0] * gpus
    assert j["engram"]["mapped_bytes"] == acc.bytes_by_kind["engram_tables"]
    gpu_devices = [d for d in j["devices"] if d["device"].startswith("GPU")]
    assert len(gpu_devices) == gpus and all(d["fits"] for d in gpu_devices) and j["fits"]
    assert all(d["capacity_bytes"] == 141 * GIB for d in gpu_devices)
    print(f"{gpus} GPUs: {gpu_devices[0]['verdict']}; {j['summary']}")


def test_human_table_names_every_part_and_a_verdict_per_device(capsys):
    code, out, _ = run_plan(capsys, V41, "--gpus", "4", "--gpu-mem", "141")
    assert code == 0
    for label in ("routed experts", "shared experts", "attention", "mHC", "norms", "router", "embedding", "LM head",
                  "Engram tables", "DSpark / MTP drafter", "window rings", "compressed KV", "index keys",
                  "working buffers"):
        assert f"  {label} " in out, label
    assert "equals the accounting layer's checkpoint bytes (509,315,486,040 B)" in out
    assert "GPUs 0-3     fits: " in out and " of 141 GiB (each)" in out
    assert "host         fits: " in out
    last_line = out.rstrip().splitlines()[-1]
    assert last_line.startswith("deepseek-v4.1-flash at 128k context × batch 1 on 4 × 141 GiB needs")


def test_a_plan_that_does_not_fit_says_by_how_much(capsys):
    code, out, _ = run_plan(capsys, V41, "--gpus", "1", "--gpu-mem", "80", "--host-mem", "16")
    assert code == 0
    assert "GPU 0        does not fit: needs " in out and "GiB short" in out
    assert "host         does not fit" in out
    assert out.rstrip().endswith(": does not fit")


def test_kv_bytes_follow_the_accounting_per_token_figures():
    a = resolve_config(V41)
    acc = account(a)
    for context, batch in ((131072, 1), (4096, 3), (1000, 2)):
        plan = memory_plan(a, Hardware(gpus=8, context=context, batch=batch))
        rt = {p.key: p for p in plan.runtime}
        # window: a ring of window_size tokens in each of the 40 + 3 layers; replicated on every GPU
        assert rt["window"].gpu == (batch * a.window_size * acc.kv_window_per_token,) * 8
        global_kv = rt["compressed"].gpu[0] + rt["index_keys"].gpu[0]
        if context % 2 == 0:  # whole ratio-2 groups: exactly the 890 B per token of spec §5
            assert global_kv == batch * context * acc.kv_global_per_token == batch * context * 890
        else:
            assert global_kv == batch * ((3 * ceil(context / 2) + context) * (288 + 68))
    assert rt["compressed"].replicated == rt["compressed"].gpu[0]


def test_working_terms_follow_the_stated_formula():
    a = resolve_config(V41)
    hw = Hardware(gpus=8, context=131072, batch=2, prefill_chunk=4096, reserve_gib=1.5)
    w = memory_plan(a, hw).working
    s = 2 * 4096
    assert w["residual streams"] == s * 2 * 4 * 5120 * 2
    assert w["attention"] == s * 2 * 8 * 512 * 2
    assert w["expert intermediates"] == s * 2 * ceil(7 * 2304 / 8) * 2
    assert w["index scores"] == s * 131072 * 4           # layer 20 (ratio 1) scores every position
    assert w["logits and fp32 head"] == 2 * 6 * 16160 * 4 + 16160 * 5120 * 4
    assert w["runtime reserve"] == 1.5 * GIB


@pytest.mark.parametrize("name", sorted(list_presets()))
@pytest.mark.parametrize("gpus", [1, 3, 5])
def test_every_preset_places_every_byte_once(name, gpus):
    a = resolve_config(name)
    plan = memory_plan(a, Hardware(gpus=gpus))
    assert plan.checkpoint_bytes == account(a).checkpoint_bytes
    assert placed_once([p.to_json() for p in plan.weights], gpus) == account(a).checkpoint_bytes
    assert all(len(p.gpu) == gpus for p in (*plan.weights, *plan.runtime))
    experts = next(p for p in plan.weights if p.key == "routed_experts")
    # near-equal expert blocks: GPUs differ by at most one expert per layer
    one_layer = sum(t.nbytes for t in inventory_tuple(a) if t.name.startswith("layers.0.ffn.experts.0."))
    assert max(experts.gpu) - min(experts.gpu) <= a.n_layers * one_layer


def test_tensor_rules():
    assert tensor_rule("layers.3.ffn.experts.17.w1.weight") == ("routed_experts", "expert", 0)
    assert tensor_rule("mtp.1.ffn.experts.5.w2.scale") == ("drafter", "expert", 0)
    assert tensor_rule("layers.3.attn.wq_b.weight") == ("attention", "split", 0)
    assert tensor_rule("layers.3.attn.wq_b.scale") == ("attention", "split", 0)
    assert tensor_rule("layers.3.attn.attn_sink") == ("attention", "split", 0)
    assert tensor_rule("layers.3.attn.wo_b.weight") == ("attention", "split", 1)
    assert tensor_rule("layers.3.attn.wq_a.weight") == ("attention", "replicate", 0)
    assert tensor_rule("layers.3.attn.indexer.wq_b.weight") == ("indexer", "replicate", 0)
    assert tensor_rule("layers.3.ffn.shared_experts.w2.weight") == ("shared_experts", "split", 1)
    assert tensor_rule("layers.14.engram.embed.scale") == ("engram_tables", "host", 0)
    assert tensor_rule("layers.14.engram.wkv.weight") == ("engram_projections", "replicate", 0)
    assert tensor_rule("head.weight") == ("head", "split", 0)
    assert tensor_rule("mtp.2.markov_head.head.weight") == ("drafter", "split", 0)
    assert tensor_rule("mtp.0.main_proj.weight") == ("drafter", "replicate", 0)
    assert near_equal(10, 4) == [3, 3, 2, 2] and near_equal(2, 3) == [1, 1, 0]


def test_wo_a_is_counted_as_bf16_on_the_gpus():
    a = resolve_config(V41)
    extra = next(p for p in memory_plan(a, Hardware(gpus=8)).runtime if p.key == "wo_a")
    per_layer = 8192 * 4096 - 256 * 128  # BF16 (2 B) minus FP8 (1 B) per value, minus the dropped scale
    assert sum(extra.gpu) == 43 * per_layer
    assert "wo_a" not in {p.key for p in memory_plan(resolve_config("tiny-v4.1"), Hardware(gpus=2)).runtime}


def test_a_checkpoint_folder_is_read_through_its_config(capsys, tmp_path):
    shutil.copy(list_presets()["tiny-v4.1"], tmp_path / "config.json")
    code, out, _ = run_plan(capsys, str(tmp_path), "--gpus", "2", "--json")
    assert code == 0 and json.loads(out)["model"] == tmp_path.name
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_plan(capsys, str(empty))
    assert code == 2 and "needs a config.json" in err


@pytest.mark.parametrize("flag, value", [("--gpus", "0"), ("--batch", "0"), ("--gpu-mem", "-1"), ("--context", "0")])
def test_bad_hardware_is_refused(capsys, flag, value):
    code, _, err = run_plan(capsys, "tiny-v4.1", flag, value)
    assert code == 2 and err.startswith("error: ")
    with pytest.raises(InputError):
        Hardware(gpus=0)
