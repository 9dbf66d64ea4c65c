"""Compile every kernel ahead of time for a CUDA target (no GPU needed): `python -m engine.kernels.compile_check`."""
from __future__ import annotations

import argparse
import os
import sys
import time

P = {"bf16": "*bf16", "f16": "*fp16", "f32": "*fp32", "i64": "*i64", "i8": "*i8", "u8": "*u8", "fp8": "*fp8e4nv"}


def cases(act: str):
    """(kernel name, pointer/scalar types of the non-constexpr arguments, constexprs) at V4.1-Flash's block sizes,
    for activations/weights of type `act` ("bf16", "f16" or "f32"). For f32 only the matmul kernels: their
    tl.dot lowers differently (IEEE fp32); the others only change load/store types (the FP8/FP4 GEMMs always
    multiply FP8 operands)."""
    a, f, i = P[act], P["f32"], P["i64"]
    precision = "ieee" if act == "f32" else "tf32"
    all_cases = [
        ("mhc_seam", [a, a, f, f, a, f, f, f, f, f, f, f, a, "i32", "i32", "fp32", "fp32"],
         dict(HC=4, BLOCK_D=64, EXPAND=True, MIX=True, COLLAPSE=True)),
        ("router", [a, a, f, f, P["i8"], f, i, f, "i32", "i32", "fp32", "fp32"],
         dict(K=6, BLOCK_K=8, BLOCK_E=512, BLOCK_DIM=16, HAS_VISION=True, NORMALIZE=True)),
        ("moe_gate_up", [a, i, f, a, a, a, i, i, i, "i32", "i32", "fp32"],
         dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, CLAMP=True, PRECISION=precision)),
        ("moe_down", [a, a, f, i, i, i, "i32", "i32"], dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, PRECISION=precision)),
        ("moe_combine", [f, i, f, "i32"], dict(K=6, BLOCK_D=256)),
        ("engram_gather", [a, i, a, "i32", "i32"], dict(BLOCK_C=32, BLOCK_H=256)),
        ("engram_gate_add", [a, a, a, a, P["i8"], a, f, "i32", "fp32", "fp32"], dict(HC=4, BLOCK_D=128, HAS_LIVE=True)),
        ("act_quant", [a, P["fp8"], f, "i32", "i32"], dict(BLOCK_R=1, BLOCK_G=16)),
        ("fp8_gemm", [P["fp8"], f, P["fp8"], P["u8"], a, "i32", "i32", "i32"], dict(BLOCK_M=64, BLOCK_N=128)),
        ("fp4_expert_gemm", [P["fp8"], f, i, P["u8"], P["u8"], a, i, i, i, "i32", "i32"],
         dict(BLOCK_M=16, BLOCK_N=128, GATHER=True)),
    ]
    return [c for c in all_cases if act != "f32" or c[0] in ("moe_gate_up", "moe_down")]


def kernels() -> dict:
    # the kernel modules import triton (optional, the gpu extra): only when compiling
    from . import engram, fp4_gemm, fp8_gemm, mhc_seam, moe_experts, router
    return {"mhc_seam": mhc_seam.mhc_seam_kernel, "router": router.router_kernel,
            "moe_gate_up": moe_experts.moe_gate_up_kernel, "moe_down": moe_experts.moe_down_kernel,
            "moe_combine": moe_experts.moe_combine_kernel, "engram_gather": engram.engram_gather_kernel,
            "engram_gate_add": engram.engram_gate_add_kernel, "act_quant": fp8_gemm.act_quant_kernel,
            "fp8_gemm": fp8_gemm.fp8_gemm_kernel, "fp4_expert_gemm": fp4_gemm.fp4_expert_gemm_kernel}


def compile_all(arch: int, dtypes: list[str]) -> list[str]:
    """Compile each case to a cubin; returns the failures (empty = all compiled)."""
    # triton is optional (the gpu extra): only when compiling
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target, table, failures = GPUTarget("cuda", arch, 32), kernels(), []
    for act in dtypes:
        for name, types, const in cases(act):
            fn = table[name]
            names = [n for n in fn.arg_names if n not in const]
            if len(names) != len(types):
                failures.append(f"{name}: {len(types)} argument types given for {len(names)} arguments {names}")
                continue
            sig = {**dict(zip(names, types)), **{k: "constexpr" for k in const}}
            t0 = time.perf_counter()
            try:
                compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=target)
            except Exception as e:  # report every kernel, not only the first failure
                failures.append(f"{name} [{act}]: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                continue
            print(f"{name:<16} {act:<5} sm_{arch}: {len(compiled.asm['cubin']):>7} B cubin "
                  f"in {time.perf_counter() - t0:.1f} s")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability × 10 (90 = H100/H200)")
    parser.add_argument("--dtypes", default="bf16,f32", help="comma-separated: bf16, f16, f32")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "").strip() in ("1", "true", "on"):
        print("compile_check needs the real compiler: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")   # Triton 3.9's default, without its warning
    try:
        import triton  # noqa: F401
    except ImportError as e:
        print(f"triton is not usable here: {e}", file=sys.stderr)
        return 3
    failures = compile_all(args.arch, args.dtypes.split(","))
    for f in failures:
        print("FAILED", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
