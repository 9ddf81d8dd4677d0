"""Steady state of kernels taking host TMA descriptors: lazytriton's launch
(descriptors encoded in C++ on every call) beside Triton's own launch of the
same config (its Python launcher encodes them per call too), for Triton's
tutorial 09 (persistent matmul) and tutorial 06 (fused attention forward,
host-descriptor variant).

lazytriton tunes first (the tutorial's pre_hook autotune); Triton then
launches its jit function with the winner's meta-parameters and options, its
descriptors given the block shapes the winner's pre_hook sets, so both launch
the same compiled config. Rows are interleaved (lazytriton.bench.timing's
`interleaved`), medians over rounds:

  host    host us per launch (BATCH launches enqueued, no sync inside)
  step    us per launch with the GPU: BATCH launches, then a sync

    python benchmarks/tma_steady_state.py [--quick]

or, from Python: `run(which=("matmul", "attention"), quick=False) -> dict`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import lazytriton  # noqa: E402
from lazytriton.bench.timing import interleaved, summary  # noqa: E402

BATCH, ROUNDS = 50, 30


def _winner(k):
    rec = k.records[-1]
    return k.spec.configs[rec.winner_index]


def _same_config_for_triton(k, descs: dict, named: dict):
    """The winner's meta-parameters and options, and Triton's descriptors given
    the block shapes the winner's pre_hook sets (as Triton's autotuner would)."""
    cfg = _winner(k)
    if cfg.pre_hook is not None:
        cfg.pre_hook({**named, **descs, **cfg.all_kwargs()})
    opts = {f: getattr(cfg, f) for f in ("num_warps", "num_stages", "num_ctas") if getattr(cfg, f, None) is not None}
    return {**cfg.kwargs, **opts}


def _measure(lt_call, triton_call, sync) -> dict:
    paths = {
        "lazytriton host": lambda n: [lt_call() for _ in range(n)] and None,
        "triton host": lambda n: [triton_call() for _ in range(n)] and None,
        "lazytriton step": lambda n: ([lt_call() for _ in range(n)], sync()) and None,
        "triton step": lambda n: ([triton_call() for _ in range(n)], sync()) and None,
    }
    samples = interleaved(paths, sync, rounds=ROUNDS, batch=BATCH)
    return {name: summary(v) for name, v in samples.items()}


def matmul(M: int, N: int, K: int) -> dict:
    import torch
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kernels import tma

    sms = torch.cuda.get_device_properties("cuda").multi_processor_count
    a = torch.randn((M, K), device="cuda").half()
    b = torch.randn((N, K), device="cuda").half()
    c = torch.empty((M, N), device="cuda", dtype=torch.float16)
    stream = torch.cuda.current_stream().cuda_stream

    def grid(META):
        return (min(sms, triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"])),)

    k = lazytriton.kernel(tma.matmul_kernel_tma_persistent)
    lt_descs = [TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]
    extra = dict(FP8_OUTPUT=False, NUM_SMS=sms, WARP_SPECIALIZE=False)

    def lt_call():
        k[grid](*lt_descs, M, N, K, stream=stream, **extra)

    lt_call()  # compile + tune
    torch.cuda.synchronize()
    tr_descs = {n: TensorDescriptor.from_tensor(t, [1, 1]) for n, t in zip(("a_desc", "b_desc", "c_desc"), (a, b, c))}
    meta = _same_config_for_triton(k, tr_descs, dict(M=M, N=N, K=K, **extra))
    jit = tma.matmul_kernel_tma_persistent.fn
    tgrid = grid(meta)

    def triton_call():
        jit[tgrid](tr_descs["a_desc"], tr_descs["b_desc"], tr_descs["c_desc"], M, N, K, **extra, **meta)

    triton_call()  # Triton's compile of that config
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    assert torch.allclose(c.float(), ref, atol=1e-1, rtol=1e-2)
    return {"shape": [M, N, K], "config": str(_winner(k)), **_measure(lt_call, triton_call, torch.cuda.synchronize)}


def attention(Z: int, H: int, N_CTX: int, D: int, causal: bool) -> dict:
    import torch
    import triton
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kernels import tma

    q, k_, v = (torch.randn((Z, H, N_CTX, D), device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    M = torch.empty((Z, H, N_CTX), device="cuda", dtype=torch.float32)
    y = Z * H * N_CTX
    stream = torch.cuda.current_stream().cuda_stream
    names = ("desc_q", "desc_k", "desc_v", "desc_o")

    def descs():
        return {n: TensorDescriptor(t, shape=[y, D], strides=[D, 1], block_shape=[1, 1]) for n, t in zip(names, (q, k_, v, o))}

    extra = dict(N_CTX=N_CTX, HEAD_DIM=D, FP8_OUTPUT=False, STAGE=3 if causal else 1, warp_specialize=False,
                 IS_HOPPER=True)

    def grid(META):
        return (triton.cdiv(N_CTX, META["BLOCK_M"]), Z * H, 1)

    k = lazytriton.kernel(tma._attn_fwd)
    lt = descs()

    def lt_call():
        k[grid](0.5, M, Z, H, *lt.values(), stream=stream, **extra)

    lt_call()
    torch.cuda.synchronize()
    tr = descs()
    meta = _same_config_for_triton(k, tr, dict(sm_scale=0.5, M=M, Z=Z, H=H, **extra))
    jit = tma._attn_fwd.fn
    tgrid = grid(meta)

    def triton_call():
        jit[tgrid](0.5, M, Z, H, *tr.values(), **extra, **meta)

    triton_call()
    torch.cuda.synchronize()
    return {"shape": [Z, H, N_CTX, D], "causal": causal, "config": str(_winner(k)),
            **_measure(lt_call, triton_call, torch.cuda.synchronize)}


def run(which=("matmul", "attention"), quick: bool = False) -> dict:
    ok, why = lazytriton.gpu_available()
    if not ok:
        raise RuntimeError(f"no GPU: {why}")
    out = {}
    if "matmul" in which:
        sizes = [(512, 512, 512)] if quick else [(512, 512, 512), (4096, 4096, 4096)]
        out["matmul"] = [matmul(*s) for s in sizes]
    if "attention" in which:
        sizes = [(1, 4, 512, 64)] if quick else [(1, 4, 512, 64), (4, 32, 2048, 128)]
        out["attention"] = [attention(*s, causal=True) for s in sizes]
    return out


def _table(results: dict) -> str:
    lines = ["| kernel | shape | lazytriton host us | Triton host us | lazytriton step us | Triton step us | "
             "step ratio |", "|---|---|---|---|---|---|---|"]
    for name, rows in results.items():
        for r in rows:
            ratio = r["lazytriton step"]["median"] / r["triton step"]["median"]
            lines.append(f"| {name} | {r['shape']} | {r['lazytriton host']['median']:.2f} | "
                         f"{r['triton host']['median']:.2f} | {r['lazytriton step']['median']:.2f} | "
                         f"{r['triton step']['median']:.2f} | {ratio:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results = run(quick=args.quick)
    print(_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
