"""Build the extension in place with one progress line per compiled file.

`python setup.py build_ext --inplace` prints every compiler command line and every warning (tens of thousands
of lines for a fresh build). This runs it with its whole output going to a log, and prints instead:

    [12/60] csrc/attention/cpu/prefill_cpu.cpp
    ...
    == extension built in 412 s (60 files); full log: build/build.log

On failure it prints the first compiler error with a few lines of context, the log's path, and exits with the
build's status. `make install` (and so `make demo` / `make test`) builds through it:

    python tools/build.py [--log PATH] [extra setup.py arguments...]
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
ERROR = re.compile(r"(\berror\b|FAILED: |ninja: build stopped)")
CONTEXT_LINES = 12


def compiled_file(command: str) -> str:
    """What a ninja step makes: the source it compiles (the last argument of a -c), "link <library>" for the link,
    else the step's first word."""
    words = command.split()
    sources = [words[i + 1] for i in range(len(words) - 1) if words[i] == "-c" and not words[i + 1].startswith("-")]
    if sources:
        source = sources[-1]
        return os.path.relpath(source, ROOT) if os.path.isabs(source) else source
    if "-shared" in words and "-o" in words[:-1]:
        return "link " + os.path.relpath(words[words.index("-o") + 1], ROOT)
    return words[0] if words else command


def first_error(lines):
    """The first compiler error and the lines after it, or [] when there is none."""
    for i, line in enumerate(lines):
        if ERROR.search(line) and "warning" not in line:
            return lines[i:i + CONTEXT_LINES]
    return []


def build(log_path: str, extra) -> int:
    command = [sys.executable, "setup.py", "-q", "build_ext", "--inplace", *extra]
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start, steps, lines = time.time(), 0, []
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace")
        for line in process.stdout:
            log.write(line)
            lines.append(line.rstrip("\n"))
            step = STEP.match(line)
            if step:
                steps = int(step.group(2))
                print(f"[{step.group(1)}/{step.group(2)}] {compiled_file(step.group(3))}", flush=True)
        status = process.wait()
    elapsed = time.time() - start
    shown_log = os.path.relpath(log_path, ROOT)
    if status != 0:
        error = first_error(lines) or lines[-CONTEXT_LINES:]
        print("== build failed; the first error:", *error, f"== full log: {shown_log}", sep="\n", file=sys.stderr)
        return status
    files = f" ({steps} files)" if steps else " (nothing to recompile)"
    print(f"== extension built in {elapsed:.0f} s{files}; full log: {shown_log}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", default=os.path.join(ROOT, "build", "build.log"), help="where the full output goes")
    args, extra = parser.parse_known_args()
    return build(os.path.abspath(args.log), extra)


if __name__ == "__main__":
    sys.exit(main())
