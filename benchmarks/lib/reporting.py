"""The benchmarks' output: markdown tables and number formats, the report header (machine,
versions, command, measured ceilings), the bandwidth tables of the memory-bound benchmarks, the list of
skipped cases, and writing the markdown / json files."""

from __future__ import annotations

import json
import os
from typing import Callable


GiB = 1024**3


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    cells = [header] + rows
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]

    def line(r):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows[:]])


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 1024**2:.0f} MiB"


def fmt_num(x: float) -> str:
    """3 significant-ish digits: 1234 -> '1234', 12.3 -> '12.3', 0.123 -> '0.12'."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def fmt_time(seconds: float) -> str:
    """ms with 3 significant digits, or us below 0.1 ms."""
    ms = seconds * 1e3
    if ms >= 0.1:
        return f"{ms:.3g} ms" if ms < 1000 else f"{ms:.0f} ms"
    return f"{ms * 1e3:.3g} us"


def header_lines(info: dict, ceilings: dict, elapsed_s: float, device: str) -> list[str]:
    """Markdown bullet lines: machine, GPU, versions, git commit, date, exact command, and the
    ceilings measured in this run."""
    L = []
    mach = (f"{info['cpu']}, {info['usable_cores']} usable cores ({info['logical_cores']} logical), "
            f"torch.get_num_threads() = {info['torch_threads']}, CPU capability "
            f"{info['cpu_capability']}, {info['memory_total_gib']} GiB RAM")
    L.append(f"- machine: {mach}")
    if "gpu" in info:
        L.append(f"- GPU: {info['gpu']} ({info['gpu_memory_gib']} GiB, {info.get('gpu_sms')} SMs, "
                 f"L2 {info.get('gpu_l2_mib')} MiB, sm_{info.get('gpu_capability', '?').replace('.', '')}), "
                 f"CUDA {info['cuda']}, cuDNN {info['cudnn']}")
    load = info["loadavg_at_start"]
    L.append(f"- torch {info['torch']}, Python {info['python']}, {info['platform']}")
    if "attn_ops" in info:
        L.append(f"- attn_ops {info['attn_ops']}, git {info['git_commit']}")
    L.append(f"- date: {info['date']}; load average at start: "
             f"{', '.join(f'{x:.2f}' for x in load) if load else 'n/a'}; "
             f"run took {elapsed_s / 60:.1f} min")
    L.append(f"- command: `{info['command']}`")
    unit, div = ("TFLOP/s", 1e3) if device == "cuda" else ("GFLOP/s", 1.0)
    mm = "; ".join(f"{c['dtype']} matmul {c['n']}x{c['n']}x{c['n']}: {c['gflops'] / div:.1f} {unit}"
                   for c in ceilings["matmul"])
    cp = ceilings["copy"]
    L.append(f"- measured ceilings (this run): {mm}; copy of {fmt_bytes(cp['bytes'])}: "
             f"{cp['gbps']:.1f} GB/s (bytes read + written)")
    return L


def skipped_lines(notes: dict) -> list[str]:
    """'Skipped or failed' list: notes maps (impl, status, why) -> case labels."""
    if not notes:
        return []
    L = ["", "Skipped or failed:"]
    for (impl, status, why), labels in notes.items():
        where = labels[0] if len(labels) == 1 else f"{len(labels)} cases, e.g. {labels[0]}"
        L.append(f"- {impl}: {status} ({where}): {why}")
    return L


def note(notes: dict, impl: str, entry: dict, label: str) -> None:
    """Prints and records a skipped / failed entry (notes: (impl, status, why) -> labels)."""
    if entry["status"] != "ok":
        print(f"  {label}: {impl} -> {entry['status']} ({entry['why']})", flush=True)
        notes.setdefault((impl, entry["status"], entry["why"]), []).append(label)


def bw_cell(entry: dict | None) -> str:
    """'0.123 ms (1234)': median time and GB/s, or the entry's status."""
    if entry is None:
        return "-"
    if entry["status"] != "ok":
        return entry["status"]
    return f"{fmt_time(entry['median_ms'] / 1e3)} ({fmt_num(entry['gbps'])})"


def time_ratio(impls: dict, impl: str, ref: str) -> str:
    """impls[impl] time / impls[ref] time ('> 1': ref is faster), or the status of the missing one."""
    a, o = impls.get(impl), impls.get(ref)
    if not a:
        return "-"
    if a["status"] != "ok":
        return a["status"]
    if not o or o["status"] != "ok":
        return "-"
    return f"{a['median_ms'] / o['median_ms']:.2f}"


def bandwidth_tables(results: list[dict], keys: list[tuple[str, Callable[[dict], object]]],
                     impls: list[str], copy_gbps: float, diffs: list[tuple[str, str]],
                     appends_intro: str, read_gbps: float | None = None) -> list[str]:
    """Markdown lines of a memory-bound benchmark (bench_decode.py, bench_mla.py): one row per
    case with the key columns, one cell per implementation (bw_cell), X/ours ratios, ours' share
    of the copy bandwidth (and of the read bandwidth when read_gbps is given), ours' sample count
    and the rel. diff columns (diffs: (header, row key)); then, when the rows have "appends", a
    table of those."""
    shares = [("copy", copy_gbps)] + ([("read", read_gbps)] if read_gbps else [])
    header = [h for h, _ in keys] + impls + [f"{i}/ours" for i in impls if i != "ours"] + \
        [f"ours % {name}" for name, _ in shares] + ["n"] + [h for h, _ in diffs]
    rows = []
    for r in results:
        o = r["impls"].get("ours", {})
        rows.append([f(r) for _, f in keys] + [bw_cell(r["impls"].get(i)) for i in impls] +
                    [time_ratio(r["impls"], i, "ours") for i in impls if i != "ours"] +
                    [f"{100 * o['gbps'] / gbps:.0f}%" if o.get("status") == "ok" else "-"
                     for _, gbps in shares] + [o.get("n", "-")] +
                    [f"{r[k]:.1e}" if k in r else "-" for _, k in diffs])
    L = [markdown_table(header, [[str(c) for c in x] for x in rows])]
    names = []
    for r in results:
        names += [n for n in r.get("appends", {}) if n not in names]
    names.sort(key=lambda n: (n != "append", n))
    if names:
        L += ["", appends_intro, ""]
        rows = [[f(r) for h, f in keys if h != "cache"] + [bw_cell(r["appends"].get(n)) for n in names]
                for r in results]
        L.append(markdown_table([h for h, _ in keys if h != "cache"] + names,
                                [[str(c) for c in x] for x in rows]))
    return L


def bw_line(label: str, row: dict, impls: list[str], diff_key: str, diff_name: str) -> str:
    """The progress line of a memory-bound case."""
    return (f"  {label}: " + ", ".join(f"{i} {bw_cell(row['impls'].get(i))}" for i in impls) +
            (f", {diff_name} {row[diff_key]:.1e}" if diff_key in row else ""))


def print_table_report(title: str, info: dict, description: str, header: list[str], rows: list[list[str]],
                       out: str | None) -> None:
    """A one-table report of a small probe script: title, machine line (machine.machine_info("cpu")), command,
    a description of the table, the table; printed, and written to `out` when given."""
    lines = [f"# {title}", "",
             f"- machine: {info['cpu']}, {info['usable_cores']} usable cores, torch threads "
             f"{info['torch_threads']}; torch {info['torch']}; git {info['git_commit']}; {info['date']}",
             f"- command: `{info['command']}`", "", description, "", markdown_table(header, rows)]
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def write_outputs(args, markdown: str, payload: dict, *, final: bool = True) -> None:
    """Writes --out (markdown) and --json (payload) when given; called after every case too
    (final=False, quiet), so a run stopped by an outer time limit leaves its results so far."""
    for path, text in ((args.out, markdown + "\n"),
                       (args.json, None)):
        if not path:
            continue
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            if text is not None:
                f.write(text)
            else:
                json.dump(payload, f, indent=1, default=str)
        os.replace(tmp, path)
        if final:
            print(f"wrote {path}")


def print_and_write(lines: list[str], path: str | None) -> None:
    """Prints a report's lines and, when `path` is given, writes them there."""
    report = "\n".join(lines) + "\n"
    print(report)
    if path:
        with open(path, "w") as f:
            f.write(report)
