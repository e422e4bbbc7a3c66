"""The command-line options every benchmark takes (device, repeats, budgets, outputs) and the
choice of implementations to compare."""

from __future__ import annotations



import torch


def add_common_args(p, *, repeats_help: str = "samples per median (default: CPU 5, CUDA 20)"):
    """Options every benchmark takes: device, quick mode, timing, time budget, outputs."""
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=None, help=repeats_help)
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (default: CPU 1, CUDA 3)")
    p.add_argument("--budget", type=float, default=5.0,
                   help="stop repeating a measurement after this many seconds (>= 1 sample)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="whole-run budget in seconds: cases that would start later are skipped "
                        "and listed (the report is still written)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the markdown report here (rewritten after every case)")
    p.add_argument("--json", help="write the raw results here (rewritten after every case)")


def add_decode_sweep_args(p, *, rounds: int):
    """The case options of the CPU decode scripts that time variants in turn (decode_huge_pages.py,
    decode_paged_layout.py, build_ab.py): dtypes, batch, context and rounds."""
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float16", "float32"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=rounds)


def finish_common_args(p, args, *, quick_repeats: int = 3) -> None:
    """Defaults that depend on the device; fails when --device cuda has no GPU."""
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but torch.cuda.is_available() is False")
    cuda = args.device == "cuda"
    if args.repeats is None:
        args.repeats = (10 if cuda else quick_repeats) if getattr(args, "quick", False) \
            else (20 if cuda else 5)
    if args.warmup is None:
        args.warmup = 3 if cuda else 1


def select_impls(args, cuda_impls: list[str], cpu_impls: list[str],
                 cuda_only: tuple[str, ...]) -> list[str]:
    """--impls (default: the device's list), CUDA-only ones dropped on CPU, "ours" always first."""
    impls = args.impls or (cuda_impls if args.device == "cuda" else cpu_impls)
    if args.device != "cuda":
        impls = [i for i in impls if i not in cuda_only]
    return impls if "ours" in impls else ["ours"] + impls
