"""The results as tables: one row per scenario, then the findings."""

from __future__ import annotations

from typing import Any

from tests.robustness.checker import SAFETY

_ISSUE_ITEMS = {
    "36.1": "issue 36 item 1 (starvation across processes)",
    "36.2": "issue 36 item 2 (tokens backwards after a failover)",
    "36.3": "issue 36 item 3 (a compensation overtaken)",
    "36.4": "issue 36 item 4 (an outage reported as a timeout)",
    "36.5": "issue 36 item 5 (a loss noticed late)",
    "R1": "R1, found by this suite (waiters of a manager that detached a lock go unserved)",
}


def failing(result: dict[str, Any], fail_on: str) -> list[dict[str, Any]]:
    """The findings that fail the run: ``safety`` ones, ``any``, or ``none``."""
    if fail_on == "none":
        return []
    found = [f for f in result["findings"] if not f["expected"]]
    if fail_on == "safety":
        found = [f for f in found if f["severity"] == SAFETY]
    return found


def _cell(value: Any) -> str:
    return "-" if value in (None, "", {}) else str(value)


def _pair(metrics: dict[str, Any], name: str) -> str:
    return f"{metrics.get(name, 0)} / {metrics.get(name + '_in_fault_windows', 0)}"


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| scenario | traffic s (wall s) | bodies | faults | acting overlaps: outside / inside "
        "state-loss windows and client stops | belief overlaps: outside / inside fault "
        "windows | steps after loss | token inversions | stale writes accepted (refused) | "
        "lost updates | starved waits | timeouts | wait p99 / max s | longest unavailability "
        "s | findings |"
    )
    lines = [head, "|" + "---|" * 15]
    for r in results:
        m = r["metrics"]
        longest = m.get("longest_unavailability") or {}
        gap = max((g["seconds"] for g in longest.values()), default=None)
        faults = ", ".join(f"{k} x{v}" for k, v in sorted(m.get("faults", {}).items()))
        steps_after = sum(f["count"] for f in r["findings"] if f["check"] == "steps_after_loss")
        findings = ", ".join(
            f"{f['check']}{' (expected)' if f['expected'] else ''}"
            f"{' [' + f['known'] + ']' if f.get('known') else ''}"
            for f in r["findings"]
        )
        lines.append(
            "| "
            + " | ".join(
                [
                    r["scenario"],
                    f"{r['duration']:g} ({r.get('seconds', '?')})",
                    _cell(m.get("bodies")),
                    _cell(faults),
                    _pair(m, "acting_overlaps"),
                    _pair(m, "belief_overlaps"),
                    str(steps_after),
                    _cell(m.get("token_inversions", 0)),
                    f"{m.get('stale_writes_accepted', 0)} ({m.get('stale_writes_refused', 0)})",
                    str(m.get("lost_updates", 0)),
                    str(m.get("starved_waits", 0)),
                    str(m.get("timeouts_outside_faults", 0)),
                    f"{m.get('wait_p99', 0)} / {m.get('wait_max', 0)}",
                    _cell(gap),
                    findings or "none",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def details(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        for f in r["findings"]:
            known = _ISSUE_ITEMS.get(f.get("known") or "", f.get("known") or "")
            tag = "expected" if f["expected"] else f["severity"]
            lines.append(
                f"- {r['scenario']}: {f['check']} ({tag}"
                f"{'; known: ' + known if known else ''}): {f['summary']}"
            )
    return "\n".join(lines) if lines else "no findings"
