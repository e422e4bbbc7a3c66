"""Short markdown summary of pytest junit xml files (used by benchmarks/gpu/gpu_check.sh).

  python benchmarks/gpu/junit_summary.py [--max-failures N] [--max-chars N] FILE.xml...

Prints, per file: totals (tests, passed, failed, errors, skipped, time); per test module the
failures; then the failures grouped by their first message line (the same message in many tests,
e.g. a sticky "CUDA error: an illegal memory access" that fails every later test of a process, is
listed once with a count and a few test ids, the first one in file order first); then the slowest
tests. A missing or unreadable file (a run killed before pytest wrote it) is reported as such.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import xml.etree.ElementTree as ET


def first_line(text: str | None, limit: int = 220) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


def summarize(path: str, max_failures: int) -> list[str]:
    name = os.path.basename(path)
    if not os.path.exists(path):
        return [f"### {name}", "", "no junit xml (pytest did not finish: killed or crashed; see its log)", ""]
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return [f"### {name}", "", f"unreadable junit xml: {e}", ""]
    cases = list(root.iter("testcase"))
    counts = collections.Counter()
    per_module = collections.Counter()
    groups = collections.OrderedDict()   # message -> [test ids]
    durations = []
    for c in cases:
        tid = f"{c.get('classname', '')}::{c.get('name', '')}"
        module = c.get("classname", "").split(".")[-1] if c.get("classname") else "?"
        durations.append((float(c.get("time", 0) or 0), tid))
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            el = c.find(tag)
            if el is not None:
                outcome = tag
                if tag in ("failure", "error"):
                    msg = first_line(el.get("message")) or first_line(el.text) or tag
                    groups.setdefault(f"{tag}: {msg}", []).append(tid)
                    per_module[module] += 1
                break
        counts[outcome] += 1
    total_time = sum(d for d, _ in durations)
    L = [f"### {name}", "",
         f"{len(cases)} tests: {counts['passed']} passed, {counts['failure']} failed, "
         f"{counts['error']} errors, {counts['skipped']} skipped; {total_time:.0f} s of test time", ""]
    if per_module:
        L.append("Failures per module: " + ", ".join(f"{m} {n}" for m, n in per_module.most_common()))
        L.append("")
    if groups:
        L.append(f"Failures by message ({len(groups)} distinct):")
        L.append("")
        for i, (msg, tids) in enumerate(groups.items()):
            if i >= max_failures:
                L.append(f"- ... {len(groups) - max_failures} more distinct messages (see the xml)")
                break
            more = f" (+{len(tids) - 3} more)" if len(tids) > 3 else ""
            L.append(f"- {len(tids)}x `{msg}`: {', '.join(tids[:3])}{more}")
        L.append("")
    slow = sorted(durations, reverse=True)[:5]
    if slow and slow[0][0] > 1:
        L.append("Slowest: " + ", ".join(f"{t} {d:.1f} s" for d, t in slow))
        L.append("")
    return L


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--max-failures", type=int, default=15, help="distinct failure messages listed")
    p.add_argument("--max-chars", type=int, default=6000, help="cut each file's summary here")
    args = p.parse_args(argv)
    for path in args.files:
        text = "\n".join(summarize(path, args.max_failures))
        if len(text) > args.max_chars:
            text = text[:args.max_chars] + "\n... (cut; see the xml)\n"
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
