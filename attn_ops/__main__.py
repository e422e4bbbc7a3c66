"""``python -m attn_ops [--no-test] [--json]``: what this machine gets from attn_ops (versions, the CUDA
kernels of the build, the GPUs, the CPU and the instruction-set copy its kernels run), then a self-test of
every op against float64 references. Exit code 0 when every check passed, 1 when any failed."""
import argparse
import dataclasses
import json
import sys
import time

from . import _report, _selftest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attn_ops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-test", action="store_true", help="print the report only, without the self-test")
    parser.add_argument("--json", action="store_true", help="print the report and the results as one JSON object")
    return parser


def _self_test_text(checks) -> bool:
    """Runs the self-test, printing one line per check and a summary; whether every check passed."""
    devices, skipped = _selftest.devices()
    print(f"\nself-test on {', '.join(devices)} (error: max |ours - float64 reference| / (1 + |reference|))")
    start = time.perf_counter()
    results = _selftest.run_checks(checks, devices, lambda result: print(result.line(), flush=True))
    failed = sum(not result.passed for result in results)
    print(f"{len(results) - failed} of {len(results)} checks passed in {time.perf_counter() - start:.2f} s")
    for note in skipped:
        print(note)
    return failed == 0


def _json(facts, checks) -> bool:
    """Prints the report and (unless ``checks`` is None) the self-test's results as one JSON object; whether
    every check passed."""
    document = {"report": {fact.key: fact.value for fact in facts}, "self_test": None}
    passed = True
    if checks is not None:
        devices, skipped = _selftest.devices()
        results = _selftest.run_checks(checks, devices)
        passed = all(result.passed for result in results)
        document["self_test"] = {"passed": passed, "devices": devices, "skipped": skipped,
                                 "checks": [dict(dataclasses.asdict(r), passed=r.passed) for r in results]}
    print(json.dumps(document, indent=2))
    return passed


def main(argv=None, checks=None) -> int:
    """Runs the command with ``argv`` (default: the command line) and returns its exit code; ``checks``
    replaces the self-test's checks (default :data:`attn_ops._selftest.CHECKS`)."""
    args = _parser().parse_args(argv)
    checks = None if args.no_test else _selftest.CHECKS if checks is None else checks
    facts = _report.collect_facts()
    if args.json:
        return 0 if _json(facts, checks) else 1
    print(_report.format_facts(facts))
    return 0 if checks is None or _self_test_text(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
