"""The CPU forward of additive_attention in its two score forms, for two or more builds in turn: each round runs
every build once, in a fresh process, and the report gives per case the median over rounds of each build's median
call time.

Forms: "exp" is the default (tanh from exp(2 qp) exp(2 kp), with tanh's Taylor polynomial where |qp + kp| is
small), "tanh" the vectorized tanh per element, which a batch entry takes when some |qp| or |kp| exceeds the exp
form's limit (one value of qp is set to 50 to force it). A build is a folder holding a built `attn_ops` package.

  cp -r attn_ops /tmp/ab/old/            # before the change (built)
  python benchmarks/experiments/additive_forms.py old=/tmp/ab/old new=. --rounds 5
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from timing import medians_in_turn  # noqa: E402

B, T, A, DV = 4, 512, 256, 64


def worker(folder, repeats):
    """One build's round: the median forward time of each form, as one json line."""
    sys.path.insert(0, os.path.abspath(folder))
    import torch

    import attn_ops

    torch.manual_seed(0)
    qp, kp, w, v = torch.randn(B, T, A), torch.randn(B, T, A), torch.randn(A), torch.randn(B, T, DV)
    tanh_qp = qp.clone()
    tanh_qp[:, 0, 0] = 50.0  # past the exp form's limit (40 in float32): every batch entry takes the tanh form
    calls = {"exp": lambda: attn_ops.additive_attention(qp, kp, w, v),
             "tanh": lambda: attn_ops.additive_attention(tanh_qp, kp, w, v)}
    for call in calls.values():
        call()  # warm-up
    print(json.dumps({"attn_ops": attn_ops.__file__, "s": medians_in_turn(calls, repeats)}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("builds", nargs="*", help="name=folder holding a built attn_ops package (one or more)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=7, help="calls per form and process")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.repeats)
    builds = dict(b.split("=", 1) for b in args.builds)
    if not builds:
        p.error("name one or more builds as name=folder")
    runs = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, folder in builds.items():
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", os.path.abspath(folder),
                   "--repeats", str(args.repeats)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd="/").stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"command: python benchmarks/experiments/additive_forms.py {' '.join(args.builds)} --rounds {args.rounds} "
          f"--repeats {args.repeats}")
    for name in builds:
        print(f"{name}: {runs[name][0]['attn_ops']}")
    print(f"\nfloat32, B={B}, Tq = Tk = {T}, A={A}, Dv={DV}; median over {args.rounds} rounds of each process's median "
          f"forward time.\n")
    print("| build | exp form | tanh form | tanh / exp |")
    print("|---|---|---|---|")
    for name in builds:
        exp_s = statistics.median(r["s"]["exp"] for r in runs[name])
        tanh_s = statistics.median(r["s"]["tanh"] for r in runs[name])
        print(f"| {name} | {exp_s * 1e3:.1f} ms | {tanh_s * 1e3:.1f} ms | {tanh_s / exp_s:.1f}x |")


if __name__ == "__main__":
    main()
