"""benchmarks/gpu/gpu_probes.py, the GPU session's risk probes, on the CPU: the dry run at tiny sizes runs
every probe to the end with every check passing, and the harness reports a failing or raising check
as such (so a GPU run's report can be trusted to show them)."""

import importlib.util
import json
import os
import subprocess
import sys
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu", "gpu_probes.py")


def load_probes():
    spec = importlib.util.spec_from_file_location("gpu_probes", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_passes_every_probe(tmp_path):
    out, js = tmp_path / "probes.md", tmp_path / "probes.json"
    p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--repeats", "1",
                        "--out", str(out), "--json", str(js)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads(js.read_text())
    counts = result["counts"]
    assert counts["FAIL"] == 0 and counts["error"] == 0 and counts["not run"] == 0, counts
    assert {c["probe"] for c in result["checks"]} == set("abcd")
    # (d): both dtypes, each tiny head-dim pair, every mask, forward and backward, and the varlen batches
    sweep = [c["case"] for c in result["checks"] if c["probe"] == "d"]
    assert len(sweep) == 2 * (2 * 2 * 2 * 1 * 4) + 2 * (2 * 2 * 2)
    for word in ("float16", "bfloat16", "causal", "window", "softcap", "varlen", " fwd", " bwd"):
        assert any(word in c for c in sweep), word
    text = out.read_text()
    assert "Every check passed" in text and "## Timings (b)" in text


def test_report_classifies_outcomes(tmp_path):
    probes = load_probes()
    args = SimpleNamespace(device="cpu", time_budget=None, verbose=False, tiny=True,
                           out=str(tmp_path / "r.md"), json=None)
    r = probes.Report(args)

    def fails():
        assert 1 == 2, "wrong answer"

    def raises():
        raise RuntimeError("attn_ops.attention: boom")

    assert r.check("x", "ok", lambda: None)
    assert not r.check("x", "bad", fails)
    assert not r.check("x", "boom", raises)
    r.skip("x", "later", "time budget")
    assert r.counts() == {"pass": 1, "FAIL": 1, "error": 1, "not run": 1}
    r.write(final=True)
    text = (tmp_path / "r.md").read_text()
    assert "wrong answer" in text and "RuntimeError: attn_ops.attention: boom" in text
    assert "1 passed, 1 failed, 1 raised, 1 not run" in text
