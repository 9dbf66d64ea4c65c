"""Every Triton kernel compiles to a CUDA binary for sm_90 (H100/H200) on this machine, no GPU needed: the
interpreter does not check what the real compiler does (dot shapes, types, control flow)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# not imported here: importing triton before tests.kernel_helpers sets TRITON_INTERPRET would pin native mode
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="the 'triton' package is not installed: kernels cannot be compiled")

ROOT = Path(__file__).resolve().parents[2]


def test_all_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "engine.kernels.compile_check", "--arch", "90", "--dtypes", "bf16,f32"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    if run.returncode == 3:
        pytest.skip(run.stderr.strip())
    assert run.returncode == 0, f"compile check failed:\n{run.stdout}\n{run.stderr}"
    compiled = [line.split()[0:2] for line in run.stdout.splitlines() if "cubin" in line]
    names = {"mhc_seam", "router", "moe_gate_up", "moe_down", "moe_combine", "engram_gather", "engram_gate_add",
             "act_quant", "fp8_gemm", "fp4_expert_gemm"}
    want = [[n, "bf16"] for n in names] + [["moe_gate_up", "f32"], ["moe_down", "f32"]]
    assert sorted(compiled) == sorted(want), run.stdout


def test_compile_check_refuses_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "engine.kernels.compile_check"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unset TRITON_INTERPRET" in run.stderr


@pytest.mark.slow  # imports every Triton kernel module natively in a fresh process [10 s]
def test_natively_imported_kernels_refuse_cpu_tensors_clearly():
    """Kernels imported without TRITON_INTERPRET cannot run on CPU tensors; the launcher says why."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import os, torch\n"
            "from engine.kernels import mhc_seam, launch\n"
            "os.environ['TRITON_INTERPRET'] = '1'\n"            # too late: the kernel is already compiled-mode
            "try:\n"
            "    launch.mhc_seam(torch.ones(1, 1, 4, 8), carry=torch.ones(1, 1, 4))\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if "triton" in run.stderr and "ImportError" in run.stderr:
        pytest.skip("triton does not import")
    assert "imported before TRITON_INTERPRET=1 was set" in run.stdout, run.stdout + run.stderr
