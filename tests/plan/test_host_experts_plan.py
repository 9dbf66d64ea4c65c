"""The memory plan with the routed experts in host RAM (`engine plan --experts host`): exactly the routed experts'
inventory bytes move from the GPU to the host, the totals still equal the accounting layer's, and V4.1-Flash fits
1 × 80 GiB + 512 GiB host."""
import json
import re

import pytest

from engine.accounting.accounting import GIB, account
from engine.accounting.inventory import inventory_tuple
from engine.cli import main
from engine.plan.memory_plan import Hardware, memory_plan, tensor_rule
from engine.spec.errors import InputError
from engine.spec.presets import resolve_config

V41 = "deepseek-v4.1-flash"
ROUTED = re.compile(r"^(layers|mtp)\.\d+\.ffn\.experts\.\d+\.")   # a routed expert's tensor, backbone or drafter


def routed_bytes(args) -> tuple[int, int]:
    """(backbone, drafter) bytes of the routed experts, summed from the tensor inventory by name."""
    backbone = sum(t.nbytes for t in inventory_tuple(args) if ROUTED.match(t.name) and t.name.startswith("layers."))
    drafter = sum(t.nbytes for t in inventory_tuple(args) if ROUTED.match(t.name) and t.name.startswith("mtp."))
    return backbone, drafter


def workstation(**kw) -> Hardware:
    return Hardware(**{"gpus": 1, "gpu_mem_gib": 80, "host_mem_gib": 512, **kw})


def test_the_host_placement_moves_exactly_the_routed_experts_from_the_gpu_to_the_host():
    a = resolve_config(V41)
    backbone, drafter = routed_bytes(a)
    assert backbone == account(a).bytes_by_kind["routed_experts"]       # the accounting's kind agrees with the names
    device, host = memory_plan(a, workstation()), memory_plan(a, workstation(experts="host"))
    moved = backbone + drafter
    assert host.experts_on_host == moved
    assert device.weights_on_gpus - host.weights_on_gpus == moved
    assert host.weights_on_host - device.weights_on_host == moved
    for plan in (device, host):   # the same exact total either way, equal to the accounting layer's
        assert plan.checkpoint_bytes == plan.weights_on_gpus + plan.weights_on_host == 509_315_486_040
    parts = {p.key: p for p in host.weights}
    assert parts["routed_experts"].gpu == (0,) and parts["routed_experts"].host == backbone
    assert parts["drafter"].host == drafter and parts["drafter"].gpu[0] == parts["drafter"].checkpoint - drafter
    assert parts["engram_tables"].host == host.engram_mapped == device.engram_mapped   # Engram stays as it was
    # the GPU sheds the experts and the routed share of the expert intermediates; nothing else changes
    s = 4096
    routed_intermediates = s * 2 * 6 * 2304 * 2                # S·2·top_k·moe_inter_dim·2 B
    assert device.gpus[0].need - host.gpus[0].need == moved + routed_intermediates
    host_buffers = s * 6 * 5120 * 4 * 2 + s * 6 * 2 * 2304 * 4 + 2304 * 5120 * 8
    assert sum(host.host_working.values()) == host_buffers
    assert host.host.need == moved + host_buffers + host.engram_touched + host.staging
    assert host.fits and not device.fits and host.gpus[0].need < 20 * GIB
    print(f"1 × 80 GiB + 512 GiB host, experts on host: GPU {host.gpus[0].need / GIB:.1f} GiB, "
          f"host {host.host.need / GIB:.1f} GiB ({moved / GIB:.1f} GiB of routed experts)")


def test_the_engram_page_cache_is_judged_beside_what_the_host_holds():
    a = resolve_config(V41)
    roomy, tight = memory_plan(a, workstation(experts="host")), memory_plan(a, workstation(experts="host",
                                                                                           host_mem_gib=400))
    for plan in (roomy, tight):
        held = plan.experts_on_host + sum(plan.host_working.values()) + plan.staging   # touched pages are table pages
        assert plan.page_cache_room == plan.host.capacity - held and plan.host.fits
    assert roomy.engram_cached and "the whole tables fit in the page cache" in roomy.notes[-1]
    assert not tight.engram_cached and "do not fit in the page cache" in tight.notes[-1]
    assert "read again from the shard files" in tight.notes[-1]


def test_the_host_placement_is_for_one_gpu():
    with pytest.raises(InputError, match="routed experts on the host are planned for one GPU"):
        Hardware(gpus=2, experts="host")
    with pytest.raises(InputError, match="experts must be one of device, host"):
        Hardware(experts="cpu")
    assert tensor_rule("layers.3.ffn.experts.17.w1.weight", "host") == ("routed_experts", "host", 0)
    assert tensor_rule("mtp.1.ffn.experts.5.w2.scale", "host") == ("drafter", "host", 0)
    assert tensor_rule("layers.3.ffn.shared_experts.w1.weight", "host") == ("shared_experts", "split", 0)


def test_engine_plan_experts_host_shows_what_sits_where_and_that_it_fits(capsys):
    argv = ["plan", V41, "--gpu-mem", "80", "--host-mem", "512", "--experts", "host"]   # one GPU by default
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{V41}: 1 GPU(s) × 80 GiB, host 512 GiB;") and "routed experts in host RAM" in out
    experts = next(line for line in out.splitlines() if line.startswith("  routed experts "))
    assert experts.split()[2:6] == ["268.945", "GiB", "-", "268.945"]   # checkpoint, GPU max "-", host
    assert "equals the accounting layer's checkpoint bytes (509,315,486,040 B)" in out
    assert "GPU 0        fits: " in out and "host         fits: " in out and "routed experts 275.669 GiB" in out
    assert out.rstrip().endswith(": fits")
    assert main([*argv, "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert j["fits"] and j["hardware"]["experts"] == "host" and j["hardware"]["gpus"] == 1
    assert j["checkpoint_bytes"] == j["accounting_checkpoint_bytes"] == 509_315_486_040
    assert j["weights_on_gpus_bytes"] + j["weights_on_host_bytes"] == 509_315_486_040
    assert j["experts_on_host_bytes"] == sum(routed_bytes(resolve_config(V41)))
    assert j["engram"]["tables_fit_in_page_cache"] is True
    assert main(["plan", V41, "--experts", "host", "--gpus", "2"]) == 2
    assert "planned for one GPU" in capsys.readouterr().err
