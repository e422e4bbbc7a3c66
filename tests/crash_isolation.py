"""Run a test module's risky cases in child processes first, so an input that crashes the process
(segfault, abort) fails only its own test instead of killing the whole pytest run."""
import os
import subprocess
import sys

_CHILD = r"""
import sys
sys.path[:0] = {paths!r}
import {module} as t
for name in {names!r}:
    print("START " + name, flush=True)
    try:
        getattr(t, {table!r})[name]()
    except BaseException:
        pass
    print("DONE " + name, flush=True)
"""


def crash_report(module: str, table: str, names, timeout: float):
    """Runs ``module.<table>[name]()`` for every name in child processes; name -> None when the call
    returned or raised, else a description of how the process died. A crashed child restarts with the
    cases it did not reach."""
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [here] + [p for p in sys.path if p != here]
    report, todo = {}, list(names)
    while todo:
        script = _CHILD.format(paths=paths, module=module, table=table, names=todo)
        try:
            p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                               timeout=timeout, cwd=os.getcwd())
            stdout, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = f"timeout ({timeout:g} s)"
        done = [ln[5:] for ln in stdout.splitlines() if ln.startswith("DONE ")]
        started = [ln[6:] for ln in stdout.splitlines() if ln.startswith("START ")]
        for n in done:
            report[n] = None
        if len(started) > len(done):
            report[started[-1]] = f"child process died while running it (exit status {rc})"
        elif len(done) < len(todo):  # died before starting anything (import error, ...)
            for n in todo:
                report.setdefault(n, f"child process failed before running it (exit status {rc})")
        todo = [n for n in todo if n not in report]
    return report
