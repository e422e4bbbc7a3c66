"""Plant known bugs in a copy of the package, one at a time, and report which tests catch each.

    python tools/mutation_check.py              # every mutation; a table on stdout
    python tools/mutation_check.py --list       # the mutations and the tests each runs
    python tools/mutation_check.py --only scale_decode_1pct --out report.md

The copy lives in --work (default .mutation/, git-ignored) with its own build directory, so the first run
builds the whole CPU extension once and later runs recompile only the files a mutation touches. Before the
mutations, the copy runs every selection unmutated: a selection that fails there makes its mutation's
result meaningless, and the script stops. Exit status 1 when any mutation survives (no test failed).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # relative to the repository root
    old: str   # must occur exactly once in the file
    new: str
    tests: tuple  # pytest arguments (files, -k expressions)


MUTATIONS = (
    Mutation("scale_decode_1pct", "the decode kernel's softmax scale 1% too large",
             "csrc/attention/cpu/decode_cpu.cpp",
             "const acc_t scale = static_cast<acc_t>(p.scale);",
             "const acc_t scale = static_cast<acc_t>(p.scale * 1.01);",
             ("tests/test_decode_cpu.py", "tests/test_attention_with_kvcache.py")),
    Mutation("bf16_prefill_out_1pct", "bfloat16 prefill outputs 1% too large (float32 and float16 exact)",
             "csrc/attention/cpu/forward_tiles.h",
             "            convert_row(acc_row, out + out_layout.at(b, pos, h), Dv);",
             "            if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {\n"
             "              scale_row(acc_row, Dv, acc_t(1.01));\n"
             "            }\n"
             "            convert_row(acc_row, out + out_layout.at(b, pos, h), Dv);",
             ("tests/test_attention_forward.py", "tests/test_prefill_forward_paths.py")),
    Mutation("window_left_unmasks_one_key", "a sliding window sees one key more on its left (attention)",
             "csrc/attention/cpu/attention_cpu.cpp",
             "  p.set_windows(opts.window_left, opts.effective_window_right());",
             "  p.set_windows(opts.window_left > 0 ? opts.window_left + 1 : opts.window_left,\n"
             "                opts.effective_window_right());",
             ("tests/test_attention_forward.py", "tests/test_attention_backward.py")),
    Mutation("block_table_row_shifted", "the last sequence of a paged batch reads the block-table row above its own",
             "csrc/attention/cpu/attention_cpu.cpp",
             "    l.table_row = cache_row;\n",
             "    l.table_row = cache_row;\n"
             "    if (l.table_row.size() > 1) {\n"
             "      l.table_row.back() = l.table_row[l.table_row.size() - 2];\n"
             "    }\n",
             ("tests/test_attention_with_kvcache.py", "tests/test_decode_cpu.py", "tests/test_mla_ops.py")),
    Mutation("rotary_theta_fixed", "rotary tables built with theta 10000 whatever theta the module is given",
             "attn_ops/ops.py",
             "inv_freq = theta ** (",
             "inv_freq = 10000.0 ** (",
             ("tests/test_nn_modules.py", "tests/test_nn_mla.py", "tests/test_rotary.py")),
    Mutation("valid_head_dim_refused", "head dims 577..1024 refused though documented valid",
             "csrc/attention/validation.cpp",
             "  TORCH_CHECK(head_dim_qk <= kMaxHeadDim && head_dim_v <= kMaxHeadDim,",
             "  TORCH_CHECK(head_dim_qk <= 576 && head_dim_v <= 576,",
             ("tests/test_attention_errors.py", "tests/test_valid_edge_inputs.py")),
)


def sources():
    """Every file git tracks or would track (untracked, not ignored), relative to the root."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                         capture_output=True).stdout.decode()
    return [p for p in out.split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]


def sync(work):
    """Make the copy's sources equal the tree's. Only files whose bytes differ are written, with a new mtime, so
    that the copy's incremental build recompiles what changed (a restored file after a mutation included)."""
    wanted = set(sources())
    for rel in wanted:
        src, dst = os.path.join(ROOT, rel), os.path.join(work, rel)
        data = open(src, "rb").read()
        if not os.path.exists(dst) or open(dst, "rb").read() != data:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(data)
    for rel in ("csrc", "attn_ops", "tests"):
        for dirpath, _, files in os.walk(os.path.join(work, rel)):
            for name in files:
                path = os.path.join(dirpath, name)
                rel_path = os.path.relpath(path, work)
                if rel_path not in wanted and not name.endswith(".so") and "__pycache__" not in rel_path:
                    os.remove(path)


def plant(work, m):
    path = os.path.join(work, m.path)
    text = open(path).read()
    count = text.count(m.old)
    if count != 1:
        sys.exit(f"{m.name}: expected the text to mutate exactly once in {m.path}, found it {count} times; "
                 "update the mutation to the current source")
    with open(path, "w") as f:
        f.write(text.replace(m.old, m.new))


def build(work, log):
    env = dict(os.environ, ATTN_OPS_CUDA="0")
    start = time.time()
    with open(log, "a") as f:
        rc = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=work, env=env,
                            stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"build failed in {work}; see {log}")
    return time.time() - start


def run_tests(work, tests):
    """(failed test ids, number of tests run) of pytest over `tests` in the copy."""
    with tempfile.NamedTemporaryFile(suffix=".xml") as xml:
        subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider",
                        f"--junitxml={xml.name}"], cwd=work, capture_output=True)
        root = ET.parse(xml.name).getroot()
    failed, total = [], 0
    for case in root.iter("testcase"):
        outcome = {child.tag for child in case}
        if "skipped" in outcome:
            continue
        total += 1
        if outcome & {"failure", "error"}:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return failed, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(ROOT, ".mutation"), help="the copy (kept between runs)")
    ap.add_argument("--only", nargs="*", help="mutation names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--out", help="also write the report (markdown) to this file")
    ap.add_argument("--show", type=int, default=5, help="failing tests named per mutation")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.only and len(chosen) != len(args.only):
        sys.exit(f"unknown mutation in {args.only}; known: {[m.name for m in MUTATIONS]}")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.what}\n    {m.path}\n    tests: {' '.join(m.tests)}")
        return 0

    os.makedirs(args.work, exist_ok=True)
    log = os.path.join(args.work, "build.log")
    sync(args.work)
    print(f"unmutated build: {build(args.work, log):.0f} s", flush=True)
    for tests in sorted({m.tests for m in chosen}):
        failed, total = run_tests(args.work, tests)
        if failed or not total:
            sys.exit(f"unmutated copy: {len(failed)} of {total} tests fail in {' '.join(tests)} "
                     f"(first: {failed[:3]}); fix those before judging mutations")
        print(f"unmutated: {total} tests pass in {' '.join(tests)}", flush=True)

    rows = []
    for m in chosen:
        sync(args.work)
        plant(args.work, m)
        seconds = build(args.work, log)
        failed, total = run_tests(args.work, m.tests)
        rows.append((m, failed, total))
        print(f"{m.name}: {len(failed)} of {total} failed (build {seconds:.0f} s)", flush=True)
    sync(args.work)
    build(args.work, log)  # leave the copy unmutated

    lines = ["| mutation | what | caught | tests failed / run | first failing tests |",
             "|---|---|---|---|---|"]
    for m, failed, total in rows:
        names = "<br>".join(f.split(".")[-1] for f in failed[:args.show])
        lines.append(f"| `{m.name}` | {m.what} | {'yes' if failed else '**NO**'} | {len(failed)} / {total} | "
                     f"{names} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 0 if all(failed for _, failed, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
