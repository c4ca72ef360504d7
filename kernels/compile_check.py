"""Compile every Triton kernel for a CUDA architecture on a machine without a GPU.

The interpreter accepts code the GPU compiler rejects; this runs the real pipeline (down to
ptxas) so such errors show on CPU-only CI: `python -m graft.kernels.compile_check --arch 90`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}


def _compile(fn, pointers: dict, floats: set, consts: dict, arch: int, num_warps: int = 4):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = "*" + pointers[name]
        else:
            sig[name] = "fp32" if name in floats else "i32"
    source = ASTSource(fn, sig, constexprs=consts)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})


def kernel_specs(dt: str):
    """(name, fn, pointer dtypes, float args, constexprs) for every kernel at cache dtype dt."""
    from graft.kernels import norm_rope, paged_attention as pa, triton_moe

    attn_ptrs = dict(q_ptr=dt, k_ptr=dt, v_ptr=dt, bt_ptr="i32", ctx_ptr="i32", out_ptr=dt)
    unit = dict(stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1)  # Triton specialises stride 1
    geo = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_SIZE=16, TILE_N=64, DOT_F32=dt == "fp32")
    return [
        ("decode_split", pa._decode_kernel, dict(attn_ptrs, part_acc_ptr="fp32", part_ml_ptr="fp32"),
         {"qk_scale"}, dict(unit, GROUP=8, BLOCK_G=16, PARTITION=512, SPLIT=True, **geo)),
        ("decode_reduce", pa._decode_reduce_kernel,
         dict(part_acc_ptr="fp32", part_ml_ptr="fp32", ctx_ptr="i32", out_ptr=dt), set(),
         dict(stride_od=1, HEAD_DIM=72, BLOCK_D=128, BLOCK_P=8, PARTITION=512)),
        ("prefill", pa._prefill_kernel, dict(attn_ptrs, cu_ptr="i32"), {"qk_scale"},
         dict(unit, GROUP=4, BLOCK_M=64, **geo)),
        ("rms_norm_residual", norm_rope._rms_norm_kernel,
         dict(x_ptr=dt, res_ptr=dt, w_ptr=dt, y_ptr=dt, new_res_ptr=dt), {"eps"},
         dict(HAS_RESIDUAL=True, BLOCK_N=4096)),
        ("rotary_partial_interleaved", norm_rope._rotary_kernel,
         dict(x_ptr=dt, cos_ptr="fp32", sin_ptr="fp32", out_ptr=dt), set(),
         dict(HALF=32, PASS=64, INTERLEAVED=True, BLOCK_H=32, BLOCK_R=32, BLOCK_P=64)),
        ("store_kv", norm_rope._store_kv_kernel,
         dict(k_ptr=dt, v_ptr=dt, kc_ptr=dt, vc_ptr=dt, slot_ptr="i64"), set(),
         dict(HEAD_DIM=72, BLOCK_H=8, BLOCK_D=128)),
        triton_moe.compile_spec(dt),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graft.kernels.compile_check", description=__doc__)
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 (H100/H200)")
    parser.add_argument("--dtypes", default="fp16,bf16,fp32", help="comma list of fp16, bf16, fp32")
    parser.add_argument("--only", default="", help="comma list of kernel names (default: all)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compile_check: unset TRITON_INTERPRET (the interpreter compiles nothing)", file=sys.stderr)
        return 2
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in _DTYPES]
    if bad:
        print(f"compile_check: --dtypes {bad} not in {sorted(_DTYPES)}", file=sys.stderr)
        return 2
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    failures = 0
    for dt in dtypes:
        for name, fn, pointers, floats, consts in kernel_specs(dt):
            if only and name not in only:
                continue
            start = time.perf_counter()
            try:
                kernel = _compile(fn, pointers, floats, consts, args.arch)
            except Exception as err:  # report every kernel, then fail
                failures += 1
                print(f"FAIL {name:<28} {dt}: {type(err).__name__}: {err}")
                continue
            meta = kernel.metadata
            print(f"ok   {name:<28} {dt}  sm_{args.arch}  shared={meta.shared:>6} B  "
                  f"{time.perf_counter() - start:.1f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
