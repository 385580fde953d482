"""The project's Triton kernels compiled for an H100 (sm_90) at record #89's shapes, without a GPU:
what each costs in registers, shared memory and spills, and whether its K loop is pipelined.

    pip install "triton>=3.5,<4"          # its compiler, ptxas and cuobjdump (no GPU needed)
    python -m scripts.gpu_dryrun.kernels  # one line per kernel

Each kernel is compiled with the arguments a launch on the GPU specialises (Triton makes an
integer argument equal to 1 a constant and marks pointers and integers divisible by 16): the
record's layouts, T = 16,384 tokens, d = 768, V = 50,304, its tiles, warps and stages. A
pipelined loop loads its operands into `num_stages` shared-memory buffers asynchronously (the
line says `async`); `stack` above 0 bytes means registers spilled to local memory. The GPU dry
run (`python -m scripts.gpu_dryrun --set ...`) compiles the same kernels inside the model, at
its toy shapes, where a loop of one K-block has nothing to pipeline.
"""

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

TOKENS, D, VOCAB = 16384, 768, 50304


def kernels() -> list[dict[str, Any]]:
    """Per kernel: its module, name, argument types (the rest i32), constants (with the
    strides a launch makes 1), the arguments divisible by 16, and its launch options."""
    from model import triton_loss, triton_mlp

    tiles = {"BLOCK_M": 128, "BLOCK_N": 128, "EVEN_K": True}
    options = {"num_warps": triton_mlp.NUM_WARPS, "num_stages": triton_mlp.NUM_STAGES}
    block = min(triton_loss.MAX_BLOCK, 1 << (VOCAB - 1).bit_length())
    return [
        {
            "module": triton_mlp, "name": "_up_relu2_kernel",
            "types": {"n_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "pre_ptr": "*i16",
                      "post_ptr": "*i16", "post8_ptr": "*u8", "tile_max_ptr": "*fp32",
                      "a_scale_ptr": "*fp32", "s_up_ptr": "*fp32", "s_act_ptr": "*fp32"},
            # n₈ row-major, c_fc₈ (4d×d) row-major: the K strides are 1
            "constants": {"inner": D, "n_stride_k": 1, "w_stride_k": 1, **tiles,
                          "BLOCK_K": triton_mlp.BLOCKS[2]},
            "shape": f"T {TOKENS} × d {D} → 4d {4 * D}, e4m3",
            "options": {**options, "enable_fp_fusion": False},
        },
        {
            "module": triton_mlp, "name": "_relu2_grad_kernel",
            "types": {"g_ptr": "*bf16", "w_ptr": "*bf16", "pre_ptr": "*i16", "d_pre_ptr": "*i16"},
            # g row-major; c_proj (d×4d, (out, in)) seen as (4d, d): its 4d stride is 1
            "constants": {"inner": D, "g_stride_k": 1, "w_stride_f": 1, **tiles,
                          "BLOCK_K": triton_mlp.GRAD_BLOCKS[2], "UPCAST": False},
            "shape": f"T {TOKENS} × d {D} → 4d {4 * D}, bf16",
            "options": {**options, "enable_fp_fusion": False},
        },
        {
            "module": triton_loss, "name": "_record_loss_kernel",
            "types": {"z_ptr": "*bf16", "y_ptr": "*i64", "w_ptr": "*fp32", "s_w_ptr": "*fp32",
                      "coef_ptr": "*fp32", "loss_ptr": "*fp32", "g_ptr": "*u8", "cap": "fp32",
                      "shift": "fp32", "divisor": "fp32"},
            "constants": {"vocab": VOCAB, "K": 3, "K_LANES": 4, "BLOCK": block},
            "not_16": {"y_stride"},  # the targets' row: K = 3 int64s
            "shape": f"{TOKENS} rows × V {VOCAB}, 3 targets",
            "options": {"num_warps": 8, "num_stages": 3, "enable_fp_fusion": False},
        },
    ]  # fmt: skip


def compile_sm90(spec: dict[str, Any]) -> dict[str, Any]:
    """One kernel compiled for sm_90 by Triton's own compiler: its resources."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    code = spec["module"]._CODE
    jitted = {name: triton.jit(fn) for name, fn in code.functions.items()}
    code.namespace.update(jitted, tl=tl)  # what a launch binds (model/triton_code.py)
    names = list(inspect.signature(code.functions[spec["name"]]).parameters)
    consts = spec["constants"]
    signature = {n: "constexpr" if n in consts else spec["types"].get(n, "i32") for n in names}
    # pointers, and the sizes and strides the record's shapes make multiples of 16 (all but
    # those the spec names)
    odd = spec.get("not_16", set())
    aligned = [i for i, n in enumerate(names) if signature[n] not in ("constexpr", "fp32")]
    aligned = [i for i in aligned if names[i] not in odd]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    source = ASTSource(fn=jitted[spec["name"]], signature=signature, constexprs=consts, attrs=attrs)
    out = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=spec["options"])
    ttgir = out.asm["ttgir"]
    usage = _resource_usage(out.asm["cubin"])
    return {
        "kernel": spec["name"],
        "shape": spec["shape"],
        "triton": triton.__version__,
        "warps": spec["options"]["num_warps"],
        "stages": spec["options"]["num_stages"],
        "shared": out.metadata.shared,
        "async": "async_copy_global_to_local" in ttgir or "async_tma_copy" in ttgir,
        **usage,
    }


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers and stack bytes per thread of a cubin, by Triton's bundled cuobjdump."""
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
            check=True,
        ).stdout  # fmt: skip
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{text}")
    return {"registers": int(found[1]), "stack": int(found[2])}


def main() -> None:
    for spec in kernels():
        r = compile_sm90(spec)
        print(
            f"{r['kernel']} ({r['shape']}; Triton {r['triton']}, sm_90): {r['warps']} warps, "
            f"{r['registers']} registers, stack {r['stack']} B, shared {r['shared'] // 1024} "
            f"KB, {r['stages']} stages{', async' if r['async'] else ''}"
        )


if __name__ == "__main__":
    main()
