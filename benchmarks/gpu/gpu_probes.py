"""The CUDA kernels' highest-risk cases, each checked against a float64 reference and timed, in one run.

These are the probes a GPU run starts with, before the full test suite (docs/gpu_check.md): the
cases where a launch-configuration, shared-memory, split or indexing defect would show first.
  (a) mla_decode bfloat16, B=1, H=128, context 16384, contiguous and paged (block 64): reference
      check, time, GB/s of the latent cache, and the launch record of the kernel (V read from the K
      tile, dynamic shared memory bytes, splits).
  (b) attention forward + backward, bfloat16, causal, D=128, B=1, T=16384, Hq=32 with Hkv=32 and
      Hkv=1: time and TFLOP/s next to SDPA's, out / dq / dk / dv checked head by head against float64
      (a dense float64 reference of all heads at once would need 68 GB).
  (c) attention_with_kvcache bfloat16, B=1, Hq=32, Hkv=8, D=128, 2048 cached tokens in a cache of
      capacity 2048 and 32768: both times (the splits must follow the length, not the capacity).
  (d) a correctness sweep: float16 / bfloat16 x head dims 64, 96, 128, 192/128, 256, 576/512 x
      Tq in {1, 17, 65} x Tk in {1, 63, 64, 65, 2049} x {plain, causal, window (17, 5), softcap 30},
      the GQA group size cycling through 1, 8, 128, plus varlen batches with empty sequences; forward
      and backward, each against float64 with the tests' tolerance rule.
(e), the split-KV kernels under racecheck, is gpu_check.sh's racecheck stage.

Each check is one line of the report: pass, FAIL (the tolerance rule's message) or error (the
exception). The exit status is 1 when any check failed or raised, so gpu_check.sh marks the stage.
--tiny runs every probe at small sizes: a dry run of this script on a CPU (tests/test_gpu_probes.py).

  python benchmarks/gpu/gpu_probes.py --device cuda --out probes.md --json probes.json
  python benchmarks/gpu/gpu_probes.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(BENCHMARKS, "lib"))
sys.path.insert(0, os.path.join(os.path.dirname(BENCHMARKS), "tests"))

from machine import import_attn_ops, machine_info  # noqa: E402
from reporting import fmt_time, markdown_table, write_outputs  # noqa: E402
from timing import measure  # noqa: E402

attn_ops = import_attn_ops()

# The tests' own checks and references (tests/ is on sys.path above).
from kvcache_reference import kvcache_inputs  # noqa: E402
from mla_reference import mla_inputs  # noqa: E402
from reference import assert_close_to_ref, attention_ref, dense_inputs, varlen_inputs  # noqa: E402
from test_attention_backward import check_backward, op_grads, ref_grads  # noqa: E402
from test_attention_forward import check_forward  # noqa: E402
from test_attention_with_kvcache import check_kvcache  # noqa: E402
from test_mla_ops import check_mla, scale_for  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16

# Problem sizes: the (full) and a CPU dry run's (tiny).
SIZES = {
    "full": dict(mla_heads=128, mla_context=16384, mla_rank=512, mla_rope=64, long_t=16384, long_hq=32,
                 long_hkv=(32, 1), long_d=128, cache_len=2048, cache_capacities=(2048, 32768),
                 dims=((64, 64), (96, 96), (128, 128), (192, 128), (256, 256), (576, 512)),
                 tq=(1, 17, 65), tk=(1, 63, 64, 65, 2049), groups=(1, 8, 128)),
    "tiny": dict(mla_heads=8, mla_context=300, mla_rank=64, mla_rope=16, long_t=96, long_hq=4,
                 long_hkv=(4, 1), long_d=32, cache_len=40, cache_capacities=(40, 200),
                 dims=((32, 32), (48, 32)), tq=(1, 17), tk=(65,), groups=(1, 4)),
}
MASKS = {"plain": {}, "causal": dict(causal=True), "window": dict(window_left=17, window_right=5),
         "softcap": dict(softcap=30.0)}


class Report:
    """Every check's outcome, the timings, and the deadline of the whole run."""

    def __init__(self, args):
        self.args = args
        self.start = time.perf_counter()
        self.checks: list[dict] = []   # {"probe", "case", "status", "detail"}
        self.timings: list[dict] = []  # {"probe", "case", columns...}
        self.launches: list[dict] = []  # {"probe", "case", "record"}
        self.info = machine_info(args.device)

    def time_left(self) -> float:
        return self.args.time_budget - (time.perf_counter() - self.start) if self.args.time_budget else 1e9

    def check(self, probe: str, case: str, fn) -> bool:
        """Runs fn() (which asserts); records pass, FAIL (an AssertionError) or error (anything else)."""
        try:
            fn()
            status, detail = "pass", ""
        except AssertionError as e:
            status, detail = "FAIL", str(e).splitlines()[0][:300] if str(e) else "assertion failed"
        except Exception as e:  # noqa: BLE001 -- every error is a finding of the probe
            status, detail = "error", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            if self.args.verbose:
                traceback.print_exc()
        self.checks.append({"probe": probe, "case": case, "status": status, "detail": detail})
        print(f"[{probe}] {case}: {status} {detail}", flush=True)
        if self.args.device == "cuda":
            torch.cuda.synchronize()  # an asynchronous fault surfaces here, in its own check
        return status == "pass"

    def skip(self, probe: str, case: str, why: str) -> None:
        self.checks.append({"probe": probe, "case": case, "status": "not run", "detail": why})

    def launch(self, probe: str, case: str) -> None:
        """The launch record of the tensor-core forward kernel (CUDA builds only)."""
        if self.args.device != "cuda":
            return
        rec = list(torch.ops.attn_ops._cuda_last_launch(torch.empty(0, device="cuda"), "forward_mma"))
        self.launches.append({"probe": probe, "case": case, "record": rec})

    def counts(self) -> dict:
        c = {"pass": 0, "FAIL": 0, "error": 0, "not run": 0}
        for x in self.checks:
            c[x["status"]] += 1
        return c

    def markdown(self) -> str:
        c = self.counts()
        L = ["# attn_ops GPU probes: long-context cases and the dtype x head-dim sweep", ""]
        L += [f"- {k}: {v}" for k, v in (("machine", self.info["cpu"]), ("GPU", self.info.get("gpu", "none")),
                                        ("torch", self.info["torch"]), ("git", self.info["git_commit"]),
                                        ("date", self.info["date"]), ("command", f"`{self.info['command']}`"))]
        L += [f"- sizes: {'tiny (dry run)' if self.args.tiny else 'full'}; run took "
              f"{time.perf_counter() - self.start:.0f} s",
              f"- checks: {c['pass']} passed, {c['FAIL']} failed, {c['error']} raised, {c['not run']} not run", ""]
        for probe in dict.fromkeys(t["probe"] for t in self.timings):  # one table per probe, in order
            rows = [t for t in self.timings if t["probe"] == probe]
            cols = list(dict.fromkeys(k for t in rows for k in t if k not in ("probe", "case")))
            L += [f"## Timings ({probe})", ""]
            L.append(markdown_table(["case"] + cols, [[t["case"]] + [str(t.get(k, "")) for k in cols]
                                                      for t in rows]))
            L.append("")
        if self.launches:
            L += ["## Launch records (forward_mma: dim_qk, dim_v, v_in_k, dynamic smem bytes, max splits, "
                  "split_min_keys)", ""]
            L.append(markdown_table(["probe", "case", "record"],
                                    [[x["probe"], x["case"], str(x["record"])] for x in self.launches]))
            L.append("")
        bad = [x for x in self.checks if x["status"] != "pass"]
        L += ["## Checks not passed" if bad else "## Every check passed", ""]
        if bad:
            L.append(markdown_table(["probe", "case", "status", "detail"],
                                    [[x["probe"], x["case"], x["status"], x["detail"].replace("|", "/")]
                                     for x in bad[:200]]))
            if len(bad) > 200:
                L.append(f"\n... and {len(bad) - 200} more (see the JSON)")
        per_probe = {}
        for x in self.checks:
            per_probe.setdefault(x["probe"], {"pass": 0, "FAIL": 0, "error": 0, "not run": 0})[x["status"]] += 1
        L += ["", "## Per probe", ""]
        L.append(markdown_table(["probe", "pass", "FAIL", "error", "not run"],
                                [[p] + [str(v[k]) for k in ("pass", "FAIL", "error", "not run")]
                                 for p, v in per_probe.items()]))
        return "\n".join(L)

    def write(self, final: bool = False) -> None:
        payload = {"info": self.info, "checks": self.checks, "timings": self.timings,
                   "launches": self.launches, "counts": self.counts()}
        write_outputs(self.args, self.markdown(), payload, final=final)


def timed_ms(fn, args) -> float:
    return measure(fn, device=args.device, repeats=args.repeats, warmup=1, budget_s=3.0)["median_s"] * 1e3


# ---------------------------------------------------------------------------------------------- (a)
def probe_mla(r: Report, s: dict) -> None:
    H, ctx, d_c, d_r = s["mla_heads"], s["mla_context"], s["mla_rank"], s["mla_rope"]
    for block in (None, 64):
        case = f"B=1 H={H} ctx={ctx} {d_c + d_r}/{d_c} " + ("contiguous" if block is None else f"paged{block}")
        ql, qr, cache, sl, bt, _ = mla_inputs(1, 1, H, d_c, d_r, [ctx], dtype=BF16, device=r.args.device,
                                              block_size=block)
        scale = scale_for(d_c, d_r)
        if not r.check("a", case, lambda: check_mla(ql, qr, cache, sl, bt, scale=scale)):
            continue
        r.launch("a", case)
        ms = timed_ms(lambda: attn_ops.mla_decode(ql, qr, cache, sl, scale=scale, block_table=bt), r.args)
        gbs = ctx * (d_c + d_r) * 2 / (ms * 1e-3) / 1e9
        r.timings.append({"probe": "a", "case": case, "ours": fmt_time(ms / 1e3), "GB/s": f"{gbs:.0f}"})


# ---------------------------------------------------------------------------------------------- (b)
def check_long_per_head(q, k, v, dout, out, grads) -> None:
    """Compares out, dq, dk, dv of causal attention with float64, one query head at a time: each head's
    reference materializes only its own [T, T] scores. dK / dV of a KV head are the sums over its group
    (float64; the same-dtype reference's sums in float32, then rounded)."""
    Hq, Hkv = q.shape[2], k.shape[2]
    group = Hq // Hkv
    dq, dk, dv = grads
    r_dk = torch.zeros(k.shape, dtype=torch.float64, device=k.device)
    r_dv = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    s_dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    s_dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for h in range(Hq):
        g = h // group
        qh, kh, vh, doh = q[:, :, h:h + 1], k[:, :, g:g + 1], v[:, :, g:g + 1], dout[:, :, h:h + 1]
        with torch.no_grad():
            r_out, _ = attention_ref(qh, kh, vh, causal=True)
            s_out, _ = attention_ref(qh, kh, vh, causal=True, compute_dtype=q.dtype)
        assert_close_to_ref(out[:, :, h:h + 1], r_out, s_out, name=f"out head {h}")
        r64 = ref_grads(qh, kh, vh, doh, None, torch.float64, causal=True)
        same = ref_grads(qh, kh, vh, doh, None, q.dtype, causal=True)
        assert_close_to_ref(dq[:, :, h:h + 1], r64[0], same[0], name=f"dq head {h}")
        r_dk[:, :, g:g + 1] += r64[1]
        r_dv[:, :, g:g + 1] += r64[2]
        s_dk[:, :, g:g + 1] += same[1].float()
        s_dv[:, :, g:g + 1] += same[2].float()
        del r64, same, r_out, s_out
    assert_close_to_ref(dk, r_dk, s_dk.to(k.dtype), name="dk")
    assert_close_to_ref(dv, r_dv, s_dv.to(v.dtype), name="dv")


def sdpa_fwdbwd(q, k, v, dout):
    """SDPA's own backend choice on [B, H, T, D] copies, GQA through enable_gqa."""
    qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    gqa = {"enable_gqa": True} if q.shape[2] != k.shape[2] else {}

    def fwd():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, **gqa)

    def fwdbwd():
        o = fwd()
        return torch.autograd.grad(o, (qt, kt, vt), dout.transpose(1, 2))
    return fwd, fwdbwd


def probe_long(r: Report, s: dict) -> None:
    for Hkv in s["long_hkv"]:
        probe_long_case(r, s, Hkv)
        # The case's tensors died with its frame: return their memory before the next case allocates.
        if r.args.device == "cuda":
            torch.cuda.empty_cache()


def probe_long_case(r: Report, s: dict, Hkv: int) -> None:
    T, Hq, D = s["long_t"], s["long_hq"], s["long_d"]
    dev = r.args.device
    case = f"bf16 causal B=1 T={T} Hq={Hq} Hkv={Hkv} D={D}"
    q, k, v = dense_inputs(1, T, T, Hq, Hkv, D, D, BF16, dev)
    dout = torch.randn(1, T, Hq, D, dtype=BF16, device=dev)

    def run_and_check():
        out, _ = attn_ops.attention(q, k, v, causal=True)
        grads = op_grads(q, k, v, dout, None, causal=True)
        check_long_per_head(q, k, v, dout, out, grads)
    if not r.check("b", case, run_and_check):
        return
    flops = 4 * Hq * T * T * D / 2  # causal forward
    unit, div = ("TFLOP/s", 1e9) if dev == "cuda" else ("GFLOP/s", 1e6)  # flops / ms / div
    fwd_ms = timed_ms(lambda: attn_ops.attention(q, k, v, causal=True), r.args)
    both_ms = timed_ms(lambda: op_grads(q, k, v, dout, None, causal=True), r.args)
    row = {"probe": "b", "case": case, "ours fwd": f"{fmt_time(fwd_ms / 1e3)} ({flops / fwd_ms / div:.0f} {unit})",
           "ours fwd+bwd": f"{fmt_time(both_ms / 1e3)} ({3.5 * flops / both_ms / div:.0f} {unit})"}
    try:
        sf, sfb = sdpa_fwdbwd(q, k, v, dout)
        s_fwd, s_both = timed_ms(sf, r.args), timed_ms(sfb, r.args)
        row["sdpa fwd / ours"] = f"{s_fwd / fwd_ms:.2f}"
        row["sdpa fwd+bwd / ours"] = f"{s_both / both_ms:.2f}"
    except RuntimeError as e:
        row["sdpa fwd / ours"] = f"n/a ({str(e).splitlines()[0][:80]})"
    r.timings.append(row)


# ---------------------------------------------------------------------------------------------- (c)
def probe_cache_capacity(r: Report, s: dict) -> None:
    L = s["cache_len"]
    times = {}
    for cap in s["cache_capacities"]:
        case = f"bf16 B=1 Hq=32 Hkv=8 D=128 length {L} capacity {cap}"
        q, kc, vc, sl, _ = kvcache_inputs(1, 1, 32, 8, 128, 128, [L], dtype=BF16, device=r.args.device,
                                          capacity=cap)
        if not r.check("c", case, lambda: check_kvcache(q, kc, vc, sl)):
            continue
        r.launch("c", case)
        times[cap] = timed_ms(lambda: attn_ops.attention_with_kvcache(q, kc, vc, sl), r.args)
        r.timings.append({"probe": "c", "case": case, "ours": fmt_time(times[cap] / 1e3)})
    if len(times) == 2:
        lo, hi = s["cache_capacities"]
        r.timings.append({"probe": "c", "case": f"time at capacity {hi} / at {lo}",
                          "ours": f"{times[hi] / times[lo]:.2f} (1.0: splits follow the length)"})


# ---------------------------------------------------------------------------------------------- (d)
def sweep_cases(s: dict):
    """(dtype, (Dqk, Dv), Tq, Tk, mask, group) for the dense sweep: every dtype x dims x Tq x Tk x mask,
    the group size cycling so that each (dims, mask) pair meets every group size over the lengths."""
    n = 0
    for dtype in (FP16, BF16):
        for dims in s["dims"]:
            for tq in s["tq"]:
                for tk in s["tk"]:
                    for mask in MASKS:
                        yield dtype, dims, tq, tk, mask, s["groups"][n % len(s["groups"])]
                        n += 1


def probe_sweep(r: Report, s: dict) -> None:
    dev = r.args.device
    for dtype, (dqk, dv), tq, tk, mask, group in sweep_cases(s):
        name = str(dtype).replace("torch.", "")
        case = f"{name} {dqk}/{dv} Tq={tq} Tk={tk} {mask} group={group}"
        if r.time_left() < 5:
            r.skip("d", case, "time budget")
            continue
        hkv = 2 if group < 64 else 1
        q, k, v = dense_inputs(2 if group < 64 else 1, tq, tk, hkv * group, hkv, dqk, dv, dtype, dev)
        kw = MASKS[mask]
        r.check("d", case + " fwd", lambda: check_forward(q, k, v, **kw))
        r.check("d", case + " bwd", lambda: check_backward(q, k, v, **kw))
    # varlen batches with empty sequences: every dims pair, both dtypes, causal and plain
    for dtype in (FP16, BF16):
        for dqk, dv in s["dims"]:
            for mask in ("plain", "causal"):
                lens_q, lens_k = [0, 17, 1, 65], [5, 0, 63, 2 * max(s["tk"]) // 3]
                case = f"varlen {str(dtype).replace('torch.', '')} {dqk}/{dv} {mask} q {lens_q} k {lens_k}"
                if r.time_left() < 5:
                    r.skip("d", case, "time budget")
                    continue
                q, k, v, cq, ck = varlen_inputs(lens_q, lens_k, 8, 2, dqk, dv, dtype, dev)
                kw = dict(MASKS[mask], cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens_q),
                          max_seqlen_k=max(lens_k))
                r.check("d", case + " fwd", lambda: check_forward(q, k, v, **kw))
                r.check("d", case + " bwd", lambda: check_backward(q, k, v, **kw))


PROBES = {"a": probe_mla, "b": probe_long, "c": probe_cache_capacity, "d": probe_sweep}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--tiny", action="store_true", help="small sizes: a dry run of the script (CPU)")
    p.add_argument("--only", default="abcd", help="the probes to run, e.g. 'ad' (default: abcd)")
    p.add_argument("--repeats", type=int, default=None, help="samples per median (default: CUDA 10, CPU 3)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: sweep cases that would start later are listed as not run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="print the traceback of every error")
    p.add_argument("--out", help="markdown report (rewritten after every probe)")
    p.add_argument("--json", help="raw results (rewritten after every probe)")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    if args.repeats is None:
        args.repeats = 10 if args.device == "cuda" else 3
    torch.manual_seed(args.seed)
    r = Report(args)
    sizes = SIZES["tiny" if args.tiny else "full"]
    for key in args.only:
        if key not in PROBES:
            p.error(f"--only: unknown probe {key!r} (expected letters of abcd)")
        PROBES[key](r, sizes)
        r.write()
    r.write(final=True)
    c = r.counts()
    print(f"checks: {c['pass']} passed, {c['FAIL']} failed, {c['error']} raised, {c['not run']} not run")
    return 1 if c["FAIL"] or c["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
