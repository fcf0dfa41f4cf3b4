"""`make test-durations`: run the suite and write what each test cost, sorted by cost.

The picture the suite's budget is kept by (docs/testing.md, "Keeping it fast"): every
test's seconds (setup, call and teardown together, as its worker spent them) and its
tier, the first of reliability, slurm, e2e, slow that it carries, else unit. Writes

    results/test-durations/<commit>.tsv    test, seconds, tier: the most costly first
    results/test-durations/<commit>.md     the total per tier and the top 30

and prints the markdown. The run is pytest itself with the Makefile's workers; any
arguments are pytest's (`make test-durations DURATIONS_ARGS="-m 'not reliability'"`),
and without them the whole suite runs, both of CI's parts in one session. The load
average before and after is written beside the figures: a table measured on a busy
machine says so.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "test-durations"
TIERS = ("reliability", "slurm", "e2e", "slow")  # the first a test carries is its tier
TOP = 30


def tier_of(keywords) -> str:
    return next((t for t in TIERS if t in keywords), "unit")


class Recorder:
    """A pytest plugin in the controlling process: under xdist every worker's reports
    arrive here, each with its phase's duration and the test's keywords (its marks)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.tier: dict[str, str] = {}
        self.outcome: dict[str, str] = {}
        self.worker: dict[str, str] = {}
        self.span: dict[str, list[float]] = defaultdict(list)  # worker -> [first start, last stop]

    def pytest_runtest_logreport(self, report):
        nodeid = report.nodeid
        if nodeid.rfind("@") > nodeid.rfind("]"):  # (xdist's group: test@group)
            nodeid = nodeid[:nodeid.rfind("@")]
        self.seconds[nodeid] += report.duration
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None) or "main"
        self.worker[nodeid] = worker
        span = self.span[worker]
        span[:] = [min(span[0], report.start), max(span[1], report.stop)] if span else \
            [report.start, report.stop]
        self.tier[nodeid] = tier_of(report.keywords)
        if report.failed or nodeid not in self.outcome or report.when == "call":
            if self.outcome.get(nodeid) != "failed":
                self.outcome[nodeid] = report.outcome


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def summary(rec: Recorder, wall: float, loads: tuple, args: list[str], rev: str) -> str:
    rows = sorted(rec.seconds.items(), key=lambda kv: -kv[1])
    per_tier: dict[str, list[float]] = defaultdict(list)
    for nodeid, s in rows:
        per_tier[rec.tier[nodeid]].append(s)
    total = sum(s for _, s in rows)
    lines = [f"commit {rev}, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; "
             f"pytest {' '.join(shlex.quote(a) for a in args)}",
             f"wall {wall / 60:.1f} min; load average {loads[0]:.2f} before, "
             f"{loads[1]:.2f} after (1 min)", "",
             "| tier | tests | seconds | share |", "|---|---:|---:|---:|"]
    for tier in ("unit", "slow", "e2e", "slurm", "reliability"):
        if per_tier.get(tier):
            s = sum(per_tier[tier])
            lines.append(f"| {tier} | {len(per_tier[tier])} | {s:,.0f} | "
                         f"{s / total:.0%} |")
    lines.append(f"| all | {len(rows)} | {total:,.0f} | 100% |")
    if rec.span:
        start = min(s[0] for s in rec.span.values())
        busy: dict[str, float] = defaultdict(float)
        for nodeid, s in rows:
            busy[rec.worker[nodeid]] += s
        lines += ["", "Each worker's tests in all, and when its last one ended (the suite's "
                  "tail is the gap between them):", ""]
        lines += [f"- {w}: {busy[w]:,.0f} s of tests, done {rec.span[w][1] - start:,.0f} s "
                  "after the first test began" for w in sorted(rec.span)]
    lines += ["", f"The {TOP} most costly:", "", "| seconds | tier | test |",
              "|---:|---|---|"]
    lines += [f"| {s:.1f} | {rec.tier[n]} | `{n}` |" for n, s in rows[:TOP]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra = shlex.split(os.environ.get("DURATIONS_ARGS", ""))
    args = ["-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", *extra, *args]
    rec = Recorder()
    before = os.getloadavg()[0]
    start = time.perf_counter()
    code = pytest.main(args, plugins=[rec])
    wall = time.perf_counter() - start
    after = os.getloadavg()[0]
    if not rec.seconds:
        print("test-durations: no test ran", file=sys.stderr)
        return int(code) or 1
    rev = commit()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = sorted(rec.seconds.items(), key=lambda kv: -kv[1])
    (OUT / f"{rev}.tsv").write_text("test\tseconds\ttier\toutcome\tworker\n" + "".join(
        f"{n}\t{s:.3f}\t{rec.tier[n]}\t{rec.outcome.get(n, '')}\t{rec.worker.get(n, '')}\n"
        for n, s in rows))
    text = summary(rec, wall, (before, after), args, rev)
    (OUT / f"{rev}.md").write_text(text)
    print(text)
    print(f"test-durations: {OUT.relative_to(REPO)}/{rev}.tsv and .md")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
