"""``python -m tests.robustness``: run scenarios, check them, print the table.

Examples::

    python -m tests.robustness --profile short              # CI: at most 3 minutes
    python -m tests.robustness --profile long --out runs/   # about 30 minutes
    python -m tests.robustness --scenario starvation --duration 60 --seed 7
    python -m tests.robustness --check runs/                # the checker again, on runs

The exit status is 1 when a finding fails the run: by default (``--fail-on safety``) a
safety finding (an overlap, a step after a loss, a stale write accepted, a token out of
order, a lost update) or a negative control that found nothing; ``--strict`` fails on
any finding, the known defects included; ``--fail-on none`` only reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.robustness import checker, report
from tests.robustness.runner import run_scenario
from tests.robustness.scenarios import PROFILES, SCENARIOS, build


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.robustness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), help="a set of scenarios")
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME",
        help=f"a scenario (repeatable): {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of traffic of each --scenario (default: the profile's, else 20)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="folder of the runs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--strict", action="store_true", help="fail on any finding")
    parser.add_argument("--fail-on", choices=["safety", "any", "none"], default="safety")
    parser.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="RUN",
        help="only check again the runs in RUN (a scenario's folder, or a whole --out)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and profiles")
    args = parser.parse_args(argv)
    if args.strict:
        args.fail_on = "any"
    return args


def _run_folders(path: Path) -> list[Path]:
    """A scenario's folder, or every scenario folder of a run (in the order they ran)."""
    if (path / "run.json").exists():
        return [path]
    done = path / "results.json"
    if done.exists():
        return [path / r["scenario"] for r in json.loads(done.read_text())]
    return sorted(p.parent for p in path.glob("*/run.json"))


def _plan(args: argparse.Namespace) -> list[tuple[str, float]]:
    profile = dict(PROFILES.get(args.profile or "", []))
    if not args.scenario:
        return list(PROFILES[args.profile or "short"])
    plan = []
    for name in args.scenario:
        build(name, 1.0)  # an unknown name fails here, before anything starts
        duration = args.duration or profile.get(name) or dict(PROFILES["long"]).get(name, 20.0)
        if args.duration is None and not profile:
            duration = dict(PROFILES["short"]).get(name, 20.0)
        plan.append((name, duration))
    return plan


async def _run(plan: list[tuple[str, float]], seed: int, out: Path) -> list[dict[str, Any]]:
    results = []
    for name, duration in plan:
        scenario = build(name, duration)
        print(f"== {name}: {duration:g} s of traffic ({scenario.about})", flush=True)
        result = await run_scenario(scenario, seed, out)
        found = ", ".join(f["check"] for f in result["findings"]) or "no findings"
        print(f"   {result['seconds']} s: {found}", flush=True)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    if args.list:
        for name, make in SCENARIOS.items():
            print(f"{name}: {make(20.0).about}")
        for profile, plan in PROFILES.items():
            print(f"profile {profile}: " + ", ".join(f"{n} {d:g} s" for n, d in plan))
        return 0
    if args.check is not None:
        results = [checker.check(folder) for folder in _run_folders(args.check)]
    else:
        out = args.out or Path(tempfile.mkdtemp(prefix="aiolock-robustness-"))
        out.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        results = asyncio.run(_run(_plan(args), args.seed, out))
        elapsed = time.monotonic() - began
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "report.md").write_text(report.table(results) + "\n\n" + report.details(results))
        print(f"\nruns in {out} ({elapsed:.0f} s in all, seed {args.seed})")
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print()
        print(report.table(results))
        print()
        print(report.details(results))
    failed = [(r["scenario"], f) for r in results for f in report.failing(r, args.fail_on)]
    for scenario, finding in failed:
        print(f"FAIL {scenario}: {finding['check']}: {finding['summary']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
