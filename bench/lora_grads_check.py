"""LoRA B's backward on the frontier's step, two ways: PyTorch's two GEMMs over the output gradient (dy B for the
gradient into the adapter's rank, dy^T h for B's) against ftbench.build.lora_grads' one Triton kernel that reads dy once
(knob lora_b_one_read). Qwen3-8B's seven projections at two rows of 4,096 tokens (M = 8,192; r = 8; bf16 dy and h,
fp32 B as PEFT keeps it), and a strided dy (a column slice of a wider gradient, as a fused group's split gives).

Prints for each shape: the largest difference of each result from the fp32 reference over the reference's largest
value (the kernel's and the GEMMs'), and the time of each way as a training step runs it, replayed from a CUDA graph
(so no host launch cost: 3 warm-up calls, capture, then 5 timings of 20 replays each by CUDA events; median and CV
across the 5), with the bytes of dy each read over that time (GB/s: what a memory-bound pass is judged by).

    python3 bench/lora_grads_check.py          (a CUDA GPU with Triton; ~30 s)
    python3 bench/lora_grads_check.py --aliased-form   (also the first form of the autograd function, compiled)
    python3 bench/lora_grads_check.py --copies --only=1   (device-to-device copies of a compiled step, each form)
    python3 bench/lora_grads_check.py --sweep [--only=4096,12288]
                                               (also the kernel's tile and launch settings, each timed the same way,
                                               for the shapes with those column counts: how
                                               ftbench.build.lora_grads.config_for was chosen)

First, the product through autograd under torch.compile against eager (compiled_autograd_check: what a training
step needs of it beyond the kernel). Exit status 1 where a compiled gradient differs from eager's by more than 2e-2
of its largest value, or a kernel result differs from the reference by more than 1e-2 of its largest value (bf16
operands: the GEMMs' own difference is of that order) or is not finite; 2 without a CUDA GPU."""
from __future__ import annotations

import statistics
import sys

import torch

from ftbench.build.lora_grads import config_for, reference_lora_b_grads, triton_lora_b_grads

M, R, SCALE = 8192, 8, 2.0
SHAPES = {"q_proj / o_proj / down_proj": 4096, "k_proj / v_proj": 1024, "gate_proj / up_proj": 12288}
WARMUP, REPLAYS, TIMINGS = 3, 20, 5
SWEEP = [{"BM": bm, "BN": bn, "num_warps": w, "num_stages": st}
         for bm, bn in ((64, 256), (32, 512), (16, 512), (16, 1024), (32, 256), (64, 128), (128, 256))
         for w, st in ((2, 3), (4, 3), (4, 4), (8, 3))]


def gemms(dy, h, b, scale):
    """PyTorch's two GEMMs, as autograd runs them under autocast (bf16 operands, B's gradient rounded to bf16)."""
    b16 = b.to(dy.dtype)
    return (dy @ b16) * scale, ((dy.t() @ h) * scale).float()


def timed(fn) -> tuple[float, float]:
    """(median ms a call, CV) replayed from a CUDA graph of one call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(TIMINGS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / REPLAYS)
    return statistics.median(times), statistics.stdev(times) / statistics.mean(times)


def rel(x, ref) -> float:
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max())


class AliasedForm(torch.autograd.Function):
    """The first form of lora_grads.LoRAProduct (ftbench 45b9027): reshapes and casts inside, its output a view of an
    intermediate. Kept here to show what torch 2.11's Dynamo did with it (--aliased-form)."""

    @staticmethod
    def forward(ctx, o, h, b, scale, epilogue):
        flat_o, flat_h = o.reshape(-1, o.shape[-1]), h.reshape(-1, h.shape[-1])
        b_op = b.to(flat_h.dtype)
        out = (torch.addmm(flat_o.to(flat_h.dtype), flat_h, b_op.t(), alpha=scale) if epilogue
               else flat_o + (flat_h @ b_op.t()) * scale)
        ctx.save_for_backward(h, b)
        ctx.scale = scale
        return out.reshape(o.shape).to(o.dtype)

    @staticmethod
    def backward(ctx, grad):
        h, b = ctx.saved_tensors
        dh, db = torch.ops.ftbench.lora_b_grads(grad.reshape(-1, grad.shape[-1]), h.reshape(-1, h.shape[-1]), b,
                                                ctx.scale)
        return grad, dh.reshape(h.shape), db, None, None


def compiled_autograd_check(g, aliased: bool = False) -> bool:
    """The product through autograd as a training step runs it: a frozen projection in FP8 (ftbench.build.fp8's static
    linear, an autograd.Function of its own), LoRA A, `lora_grads.product` under autocast, eager against
    torch.compile (Inductor); the input's and both adapters' gradients must agree. (Under torch 2.11 a first form,
    whose output aliased an intermediate, lost the frozen projection's input gradient when compiled.)"""
    from ftbench.build.fp8 import frozen_fp8, static_fp8_linear
    from ftbench.build.lora_grads import product

    m, k, n = 1024, 512, 768
    w8, w_inv, _ = frozen_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05)
    x0 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    a0 = torch.randn(R, k, device="cuda", generator=g) * 0.05
    b0 = torch.randn(n, R, device="cuda", generator=g) * 0.05
    ok = True
    for epilogue in (False, True):
        def step(x, a, b):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                o = static_fp8_linear(x, w8, w_inv, None)
                h = torch.nn.functional.linear(x, a)
                out = AliasedForm.apply(o, h, b, SCALE, epilogue) if aliased else product(o, h, b, SCALE, epilogue)
            return (out.float() ** 2).mean()

        grads = []
        for fn in (step, torch.compile(step)):
            leaves = [t.clone().requires_grad_() for t in (x0, a0, b0)]
            fn(*leaves).backward()
            grads.append([t.grad for t in leaves])
        errs = [rel(c, e) for e, c in zip(*grads)]
        ok &= max(errs) < 2e-2
        print(f"compiled against eager{' (the aliased form)' if aliased else ''}, epilogue {epilogue}: gradient differences x {errs[0]:.1e}, A {errs[1]:.1e}, "
              f"B {errs[2]:.1e}{'' if max(errs) < 2e-2 else '  WRONG'}")
    return ok


class ProductWithoutO(torch.autograd.Function):
    """s * h B^T alone, its backward the one-read op: the form whose caller adds o itself (--copies compares it)."""

    @staticmethod
    def forward(ctx, h, b, scale):
        ctx.save_for_backward(h, b)
        ctx.scale = scale
        return (h @ b.to(h.dtype).t()) * scale

    @staticmethod
    def backward(ctx, grad):
        h, b = ctx.saved_tensors
        dh, db = torch.ops.ftbench.lora_b_grads(grad, h, b, ctx.scale)
        return dh, db, None


def copies_check(g) -> None:
    """Device-to-device copies and kernel time of one compiled step (reduce-overhead: CUDA graphs) through each form
    of the product, at the gate projection's shape: a frozen FP8 projection, LoRA A, the product, a loss; counted
    by PyTorch's profiler over 3 replayed steps."""
    from torch.profiler import ProfilerActivity, profile

    from ftbench.build.fp8 import frozen_fp8, static_fp8_linear
    from ftbench.build.lora_grads import product

    k, n = 4096, 12288
    w8, w_inv, _ = frozen_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02)
    forms = {"product, epilogue": lambda o, h, b: product(o, h, b, SCALE, True),
             "product, add": lambda o, h, b: product(o, h, b, SCALE, False),
             "without o, add outside": lambda o, h, b: o + ProductWithoutO.apply(h, b, SCALE),
             "two GEMMs (autograd), add": lambda o, h, b: o + torch.nn.functional.linear(h, b) * SCALE}
    for name, form in forms.items():
        x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        a = (torch.randn(R, k, device="cuda", generator=g) * 0.02).requires_grad_()
        b = (torch.randn(n, R, device="cuda", generator=g) * 0.02).requires_grad_()

        def step(x, a, b):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                o = static_fp8_linear(x, w8, w_inv, None)
                out = form(o, torch.nn.functional.linear(x, a), b)
            return out.float().square().mean()

        compiled = torch.compile(step, mode="reduce-overhead")
        for _ in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            compiled(x, a, b).backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                compiled(x, a, b).backward()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        copies = [e for e in events if "Memcpy DtoD" in e.key]
        total = sum(e.device_time_total for e in events) / 3e3
        print(f"{name}: {sum(e.count for e in copies) / 3:.0f} device copies a step "
              f"({sum(e.device_time_total for e in copies) / 3e3:.3f} ms), kernels {total:.3f} ms a step")


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    cases = [(name, torch.randn(M, n, device="cuda", dtype=torch.bfloat16, generator=g)) for name, n in SHAPES.items()]
    wide = torch.randn(M, 6144, device="cuda", dtype=torch.bfloat16, generator=g)
    cases.append(("strided: v's slice of q/k/v's 6,144 columns", wide[:, 5120:]))
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; M={M}, r={R}")
    bad = 0 if compiled_autograd_check(g) else 1
    if "--aliased-form" in argv:
        compiled_autograd_check(g, aliased=True)
    if "--copies" in argv:
        copies_check(g)
    only = [int(x) for a in argv if a.startswith("--only=") for x in a.removeprefix("--only=").split(",")]
    for name, dy in cases:
        n = dy.shape[1]
        if only and n not in only:
            continue
        h = torch.randn(M, R, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, R, device="cuda", generator=g) * 0.01
        ref_dh, ref_db = reference_lora_b_grads(dy, h, b, SCALE)
        dh, db = triton_lora_b_grads(dy, h, b, SCALE)
        g_dh, g_db = gemms(dy, h, b, SCALE)
        errs = (rel(dh, ref_dh), rel(db, ref_db))
        finite = bool(torch.isfinite(dh).all() and torch.isfinite(db).all())
        if not finite or max(errs) > 1e-2:
            bad += 1
        t_k, cv_k = timed(lambda: triton_lora_b_grads(dy, h, b, SCALE))
        t_g, cv_g = timed(lambda: gemms(dy, h, b, SCALE))
        gb = M * n * dy.element_size() / 1e9
        print(f"{name} (N={n}): kernel dh {errs[0]:.2e}, dB {errs[1]:.2e} (GEMMs {rel(g_dh, ref_dh):.2e}, "
              f"{rel(g_db, ref_db):.2e}){'' if finite else ', NOT FINITE'}; "
              f"kernel {t_k * 1e3:.1f} us (CV {cv_k:.1%}, {gb / t_k * 1e3:.0f} GB/s of dy), "
              f"two GEMMs {t_g * 1e3:.1f} us (CV {cv_g:.1%}, {2 * gb / t_g * 1e3:.0f} GB/s of dy read twice): "
              f"{t_g / t_k:.2f}x")
        if "--sweep" in argv:
            for cfg in SWEEP:
                try:
                    t, cv = timed(lambda: triton_lora_b_grads(dy, h, b, SCALE, cfg))
                    out = triton_lora_b_grads(dy, h, b, SCALE, cfg)
                    err = max(rel(out[0], ref_dh), rel(out[1], ref_db))
                    print(f"  {cfg}: {t * 1e3:.1f} us (CV {cv:.1%}, {gb / t * 1e3:.0f} GB/s), error {err:.1e}"
                          f"{'  <- chosen' if cfg == config_for(n) else ''}")
                except Exception as e:  # a setting the compiler refuses (shared memory, registers): say so, go on
                    print(f"  {cfg}: failed: {type(e).__name__}: {str(e)[:160]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
