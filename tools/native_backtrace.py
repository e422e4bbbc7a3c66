"""Run a command with a native crash handler and name the C++ functions of its crash.

Python's faulthandler prints only the Python frames of a segfault. This builds
tools/native_backtrace/segv_backtrace.c (gcc), runs the command with it preloaded, and rewrites the
frames it prints (module + offset) as function, file and line with addr2line where the module has them
(attn_ops' extension is built with -g). Used on the GPU machine, where there is no gdb:

    python tools/native_backtrace.py -- python -m pytest -p no:faulthandler -x tests/test_x.py

Exit status: the command's (128 + the signal number when a signal ended it, as a shell reports it).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FRAME = re.compile(r"^=== (?:frame|pc   ) +(\d+) (\S+) \+0x([0-9a-f]+) (\S+)$")


def build_handler(workdir):
    lib = os.path.join(workdir, "segv_backtrace.so")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        sys.exit("native_backtrace: no C compiler (gcc / cc) on PATH")
    source = os.path.join(HERE, "native_backtrace", "segv_backtrace.c")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", lib, source], check=True)
    return lib


def symbolize(module, offset):
    """'function at file:line' (inlined frames joined by ' <- ') or '' without addr2line or debug info."""
    tool = shutil.which("addr2line")
    if tool is None or not os.path.exists(module):
        return ""
    out = subprocess.run([tool, "-f", "-C", "-i", "-e", module, hex(offset)], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    pairs = [f"{fn} at {os.path.basename(loc)}" for fn, loc in zip(lines[::2], lines[1::2]) if fn != "??"]
    return " <- ".join(pairs)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given")
    with tempfile.TemporaryDirectory() as workdir:
        env = dict(os.environ)
        env["LD_PRELOAD"] = " ".join(filter(None, [build_handler(workdir), env.get("LD_PRELOAD", "")]))
        proc = subprocess.run(command, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
    for line in proc.stderr.splitlines():
        m = FRAME.match(line)
        # system and torch libraries print their exported names; the extension's frames get file and line
        if m and ("attn_ops" in m.group(2) or m.group(4) == "?"):
            where = symbolize(m.group(2), int(m.group(3), 16))
            line = f"{line}  {where}" if where else line
        print(line, file=sys.stderr)
    sys.exit(128 - proc.returncode if proc.returncode < 0 else proc.returncode)  # a signal: as the shell says


if __name__ == "__main__":
    main()
