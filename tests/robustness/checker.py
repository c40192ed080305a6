"""The checker: what happened, from the workers' logs, the nemesis's log and the store.

It believes nothing the library says about itself beyond what a user sees (an acquire
returned, a body was cancelled, an exception was raised), and nothing of Redis: only
the JSON lines the workers wrote (times on the host's monotonic clock, one clock for
all processes) and the store's tables (the order the resource saw writes in).

A *body* is one acquisition: its *belief* interval runs from the acquire's return to the
end of the body (before the release is sent), to the body's cancellation, or to its
process's death. It *acts* at each step it logs (the time is taken before the write is
sent: the body's code ran then); two bodies act at once when one acted between the
other's first and last act. A request the body sent may reach the store later (the
process was stopped between the step and the send): the store's record of it counts
for the fencing checks, not as an act. Checks, per resource (``<family>:<name>``):

``acting_overlap``
    two bodies of one exclusive resource acting at once (a read-write lock: a writer
    with anyone; a semaphore: more bodies than permits). *Safety*, except inside a
    state-loss window (Redis forgot the lock: a restart without persistence, a failover,
    a force-release), where overlaps measure how late holders learned, and except where
    one body acted around the other's acts only because its process was stopped past its
    lease (its closing act within 0.5 s of the resume, then told of the loss: what
    fencing is for, judged by the fencing checks).
``belief_overlap``
    two bodies *believing* they hold at once, outside every fault window (a paused
    holder believes until it runs again: inside fault windows this is expected).
``steps_after_loss``
    a step logged after the body was told of its loss (cancelled, ``LockLostError``).
``token_inversions``
    a grant (in the order the acquires returned) whose fencing token is not above
    every earlier grant's on the resource.
``stale_writes_accepted`` / ``legit_writes_refused``
    the store accepted a write of a superseded holder (another grant of the resource
    came after the writer's own and before the write landed: fencing could not refuse
    it, the new holder had not written yet), outside state-loss windows and client
    pauses; the store refused the newest grant's write (a higher token came from an
    older grant).
``lost_updates``
    the unfenced counter: a write-back that overwrote an increment it never read,
    outside state-loss windows and client pauses (a stopped process's write-back lands
    after its lease: the unfenced counter shows what fencing is for).
``starved_waits``, ``timeouts``, ``process_starved``
    a wait during which other processes were granted the resource at least
    ``starvation_grants`` times and its own process never (faults of other processes
    do not excuse it: the name went to others meanwhile), counted from when its process
    could hear a release where the workers log it (``listening`` events: the starvation
    scenarios, whose threshold is one more than the bound of docs/semantics.md); a wait
    that timed out outside every fault window; a process that waited
    ``starvation_seconds`` in all (undisturbed, as above) and was granted nothing while
    others were granted ``starvation_grants`` times meanwhile.
``idle_waits``
    a wait not served while its resource was free (nobody held it) for at least
    ``idle_wait_seconds`` and half of the wait, outside every fault window.
``unavailability``
    the longest time the resource had waiters and no holder, outside the windows of the
    faults the scenario excuses (default: all).
``outage_as_timeout``
    a wait that ended with ``LockTimeoutError`` while Redis refused connections.
``late_loss``
    after a force-release, how long the holder went on acting.
``adopt_dead_after_cancel``
    a hand-off token no longer adoptable after an adopt was cancelled in flight.
``errors``
    errors other than timeouts outside fault windows; tracebacks in a worker's output.

Fault windows come from the nemesis log, each extended by the lease plus one second
(the time a holder may need to learn). Findings carry a severity: ``safety`` or
``liveness``; and the known defect they show, when there is one.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import json
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

SAFETY = "safety"
LIVENESS = "liveness"

#: families whose holds exclude each other (``rw``: writes; ``sem``: up to the limit)
EXCLUSIVE_FAMILIES = frozenset({"lock", "fair", "redlock", "none"})
#: families with fencing tokens ordered per name
TOKEN_FAMILIES = frozenset({"lock", "fair", "rw"})
SHARED_KINDS = frozenset({"read", "semaphore"})
#: faults that strike one worker process (``target``)
CLIENT_FAULTS = frozenset({"kill_client", "pause_client"})
#: ns after a stopped process resumes within which a body of it may still act once
#: before its loss timer runs (see Run.resumed)
RESUME_GRACE = 500_000_000

#: faults after which a request sent before them may land late: a process stopped
#: between a step and its send sends on waking, after its lease ended (the limit that
#: fencing exists for: the store refuses the fenced write unless the new holder has not
#: written yet; the unfenced counter loses an update)
IN_FLIGHT = frozenset({"pause_client"})

#: the open defects each check shows, by issue item (``checks.known`` of a scenario
#: overrides): none since issue 36's items were fixed, so every finding is news
KNOWN: dict[str, str] = {}

_EXAMPLES = 5


@dataclasses.dataclass
class Window:
    fault: str
    cls: str
    t0: int
    t1: int
    detail: dict[str, Any]


@dataclasses.dataclass
class Body:
    id: str
    proc: str
    task: str
    kind: str = ""
    res: list[str] = dataclasses.field(default_factory=list)
    wait_t: int | None = None
    wait_end: int | None = None
    acq_t: int | None = None
    end_t: int | None = None
    lost_t: int | None = None
    last_t: int = 0
    tokens: dict[str, int | None] = dataclasses.field(default_factory=dict)
    steps: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    outcome: str = "open"
    error: str = ""
    limit: int | None = None
    adopt_cancelled: int = 0
    died: bool = False

    @property
    def shared(self) -> bool:
        return self.kind in SHARED_KINDS


class Run:
    """Everything the checker reads, parsed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.run = json.loads((folder / "run.json").read_text())
        self.scenario: dict[str, Any] = self.run["scenario"]
        self.checks: dict[str, Any] = self.scenario.get("checks", {})
        self.start: int = self.run.get("start_ns", 0)
        self.end: int = self.run.get("end_ns", 0)
        self.grace = int((self.scenario["lease"] + 1.0) * 1e9)
        self.topology: str = self.scenario.get("topology", "single")
        self.windows = list(self._windows())
        self.bodies = self._bodies()
        db = sqlite3.connect(f"file:{folder / 'store.sqlite'}?mode=ro", uri=True)
        try:
            self.writes = db.execute(
                "SELECT t, resource, token, body, accepted FROM writes ORDER BY seq"
            ).fetchall()
            self.counter_ops = db.execute(
                "SELECT t, resource, op, value, body FROM counter_ops ORDER BY seq"
            ).fetchall()
        finally:
            db.close()

    def rel(self, t: int | None) -> float | None:
        return None if t is None else round((t - self.start) / 1e9, 3)

    def _windows(self) -> Iterator[Window]:
        path = self.folder / "nemesis.jsonl"
        if not path.exists():
            return
        begun: dict[int, dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["ev"] == "begin":
                begun[record["n"]] = record
            elif record["ev"] == "fault":
                begun.pop(record["n"], None)
                detail = {
                    k: v
                    for k, v in record.items()
                    if k not in ("ev", "n", "fault", "cls", "t0", "t1", "w")
                }
                cls = record["cls"]
                if record["fault"] == "pause_redis" and self.topology == "sentinel":
                    cls = "state_loss"  # longer than down-after: the sentinels may fail over
                if cls != "condition":
                    yield Window(record["fault"], cls, record["t0"], record["t1"], detail)
        for record in begun.values():  # never healed: to the end of the run
            yield Window(record["fault"], "state_loss", record["t"], self.end, {})

    def _deaths(self) -> dict[str, int]:
        return {
            label: info["killed_at"]
            for label, info in self.run.get("workers", {}).items()
            if info.get("killed_at")
        }

    def _bodies(self) -> dict[str, Body]:
        bodies: dict[str, Body] = {}
        events: list[dict[str, Any]] = []
        for path in sorted((self.folder / "logs").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by SIGKILL cannot happen (one
                    continue  # write(2) each), but a checker trusts nothing
        events.sort(key=lambda e: e["t"])
        self.crashes = [e for e in events if e["ev"] == "crash"]
        #: per process: when its manager started (True) and stopped (False) listening for
        #: releases, in order; only the starvation scenarios' workers log it
        self.listening: dict[str, list[tuple[int, bool]]] = collections.defaultdict(list)
        for e in events:
            if e["ev"] == "listening":
                self.listening[e["p"]].append((e["t"], bool(e["on"])))
        for e in events:
            if "b" not in e:
                continue
            body = bodies.get(e["b"])
            if body is None:
                body = bodies[e["b"]] = Body(e["b"], e["p"], e["k"])
            _apply(body, e)
        deaths = self._deaths()
        for body in bodies.values():
            death = deaths.get(body.proc)
            if body.acq_t is not None and body.end_t is None:
                body.end_t = death if death is not None else body.last_t
                body.died = death is not None
            if body.wait_t is not None and body.wait_end is None:
                body.wait_end = death if death is not None else body.last_t
                if body.acq_t is None:
                    body.outcome = "died" if death is not None else "open"
        return bodies

    # -- windows ---------------------------------------------------------------------------

    def inside(
        self, t: int, classes: Iterable[str] | None = None, faults: Iterable[str] | None = None
    ) -> Window | None:
        wanted = None if classes is None else set(classes)
        names = None if faults is None else set(faults)
        for w in self.windows:
            if wanted is not None and w.cls not in wanted:
                continue
            if names is not None and w.fault not in names:
                continue
            if w.t0 <= t <= w.t1 + self.grace:
                return w
        return None

    def resumed(self, body: Body, other: Body, res: str) -> bool:
        """Whether *body*'s acts beside *other*'s on *res* all came just after its process
        was stopped (SIGSTOP) past its lease and resumed: within :data:`RESUME_GRACE` of
        the resume, after which *body* was told of its loss. On waking, a body whose own
        request completed may act before its loss timer runs: what fencing is for (its
        writes are the fencing checks' to judge), not two holders the lock let in."""
        if body.lost_t is None:
            return False
        mine, theirs = body.steps.get(res, []), other.steps.get(res, [])
        if not mine or not theirs:
            return False
        lo, hi = theirs[0], theirs[-1]
        # its acts inside the other's span, and, if it acted around that span, the first
        # act that closes it
        beside = [t for t in mine if lo <= t <= hi]
        after = bisect.bisect_right(mine, hi)
        if mine[0] < lo and after < len(mine):
            beside.append(mine[after])
        return bool(beside) and any(
            w.fault in IN_FLIGHT
            and w.detail.get("target") == body.proc
            and all(w.t1 <= t <= w.t1 + RESUME_GRACE for t in beside)
            for w in self.windows
        )

    def heard_from(self, proc: str, t: int, until: int) -> int:
        """When *proc*, waiting from *t*, could first hear a release: *t* if its manager
        was listening then, else when it started to (at most *until*). A process that
        logged nothing of it (a scenario that does not ask) counts from *t*."""
        changes = self.listening.get(proc)
        if not changes:
            return t
        at = bisect.bisect_right(changes, (t, True))
        if at and changes[at - 1][1]:
            return t
        for when, on in changes[at:]:
            if on:
                return min(when, until)
        return until

    def disturbs(self, body: Body) -> bool:
        """Whether a fault could have delayed *body*'s wait: one of the servers', or one
        of its own process's (latency on a proxy only slows; another process killed or
        stopped holds the name up for everyone alike, granting nobody meanwhile)."""
        assert body.wait_t is not None and body.wait_end is not None
        for w in self.windows:
            if not (w.t0 <= body.wait_end and body.wait_t <= w.t1 + self.grace):
                continue
            if w.fault in CLIENT_FAULTS:
                if w.detail.get("target") == body.proc:
                    return True
            elif w.fault != "latency":
                return True
        return False

    def touches(self, t0: int, t1: int, faults: Iterable[str] | None = None) -> bool:
        names = None if faults is None else set(faults)
        return any(
            w.t0 <= t1 and t0 <= w.t1 + self.grace
            for w in self.windows
            if names is None or w.fault in names
        )


def _apply(body: Body, e: dict[str, Any]) -> None:
    ev, t = e["ev"], e["t"]
    body.last_t = max(body.last_t, t)
    if ev == "wait":
        body.wait_t, body.kind, body.res = t, e["kind"], list(e["res"])
    elif ev == "acquired":
        if body.acq_t is None:
            body.acq_t = body.wait_end = t
            body.outcome = "held"
        body.tokens[e["res"]] = e.get("tok")
        if e.get("limit") is not None:
            body.limit = e["limit"]
    elif ev == "adopted":
        body.tokens.setdefault(e["res"], e.get("tok"))
    elif ev == "step":
        body.steps.setdefault(e["res"], []).append(t)
    elif ev == "end":
        body.end_t = body.end_t or t
    elif ev == "released":
        body.outcome = "released"
        body.end_t = body.end_t or t
    elif ev == "cancelled":
        if e.get("where") == "body":
            body.lost_t = body.lost_t or t
        body.end_t = body.end_t or t
    elif ev == "lost":
        body.outcome = "lost"
        if body.acq_t is not None:
            body.lost_t = body.lost_t or t
            body.end_t = body.end_t or t
        else:
            body.wait_end = t
    elif ev in ("timeout", "abandoned"):
        body.outcome = ev
        body.wait_end = t
    elif ev == "error":
        body.outcome = "error"
        body.error = e.get("err", "")
        if body.acq_t is not None:
            body.end_t = body.end_t or t
        else:
            body.wait_end = t
    elif ev == "adopt_cancelled":
        body.adopt_cancelled += 1
    elif ev in ("adopt_dead", "adopt_gave_up"):
        body.outcome = "dead"
        body.end_t = body.end_t or t


# -- findings ----------------------------------------------------------------------------


class Findings:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.items: list[dict[str, Any]] = []
        self.metrics: dict[str, Any] = {}

    def add(
        self, check: str, severity: str, count: int, summary: str, examples: list[Any] | None = None
    ) -> None:
        known = self.run.checks.get("known", {}).get(check, KNOWN.get(check))
        self.items.append(
            {
                "check": check,
                "severity": severity,
                "count": count,
                "summary": summary,
                "known": known,
                "expected": check in self.run.checks.get("expect", []),
                "examples": (examples or [])[:_EXAMPLES],
            }
        )


def _intervals(run: Run, acting: bool) -> dict[str, list[tuple[int, int, Body]]]:
    by_res: dict[str, list[tuple[int, int, Body]]] = collections.defaultdict(list)
    for body in run.bodies.values():
        if acting:
            for res, steps in body.steps.items():
                by_res[res].append((min(steps), max(steps), body))
        elif body.acq_t is not None and body.end_t is not None:
            for res in body.res:
                by_res[res].append((body.acq_t, body.end_t, body))
    return by_res


def _overlaps(intervals: list[tuple[int, int, Body]]) -> Iterator[tuple[int, int, Body, Body, int]]:
    """(start, end, a, b, holders) of each moment two intervals conflict: any two of
    exclusive holds, a writer with anyone, more holders than a semaphore's limit."""
    intervals = sorted(intervals, key=lambda i: i[0])
    active: list[tuple[int, int, int, Body]] = []  # (end, start, seq, body)
    for seq, (s, e, body) in enumerate(intervals):
        while active and active[0][0] < s:
            heapq.heappop(active)
        if body.kind == "semaphore":
            holders = [a for a in active if a[3].kind == "semaphore"]
            limit = body.limit or 1
            if len(holders) + 1 > limit:
                latest = max(holders, key=lambda a: a[1])
                yield s, min(e, latest[0]), latest[3], body, len(holders) + 1
        else:
            for end, _start, _, other in active:
                if body.shared and other.shared:
                    continue
                if body.id == other.id:
                    continue
                yield s, min(e, end), other, body, 2
        heapq.heappush(active, (e, s, seq, body))


def _example(run: Run, a: Body, b: Body, s: int, e: int, res: str) -> dict[str, Any]:
    return {
        "res": res,
        "at": run.rel(s),
        "seconds": round((e - s) / 1e9, 3),
        "a": {"body": a.id, "kind": a.kind, "token": a.tokens.get(res), "outcome": a.outcome},
        "b": {"body": b.id, "kind": b.kind, "token": b.tokens.get(res), "outcome": b.outcome},
        "window": _window_name(run.inside(s)),
    }


def _window_name(w: Window | None) -> str | None:
    return None if w is None else f"{w.fault}({w.cls})"


def _acts_inside(a: Body, b: Body, res: str) -> tuple[list[int], Body | None]:
    """The acts of one body on *res* between the other's first and last act, and the
    other body: the one whose exclusivity was broken least visibly (for a holder stopped
    past its lease that acted once more on waking: the new holders it acted around), or
    ([], None) when neither acted inside the other."""
    found = []
    for one, other in ((a, b), (b, a)):
        acts, span = one.steps[res], other.steps[res]
        lo = bisect.bisect_left(acts, span[0])
        hi = bisect.bisect_right(acts, span[-1])
        if hi > lo:
            found.append((acts[lo:hi], other))
    if not found:
        return [], None
    return min(found, key=lambda f: len(f[0]))


def check_overlaps(run: Run, out: Findings) -> None:
    for acting in (True, False):
        what = "acting" if acting else "belief"
        counted: list[dict[str, Any]] = []
        excused: list[dict[str, Any]] = []
        in_faults = 0
        #: bodies that acted around another (before and after its acts)
        broken: set[str] = set()
        for res, intervals in _intervals(run, acting).items():
            if (
                res.startswith("sem:")
                or res.startswith("rw:")
                or res.split(":")[0] in EXCLUSIVE_FAMILIES
            ):
                for s, e, a, b, _ in _overlaps(intervals):
                    start, end = s, e
                    around: Body | None = None
                    if acting and b.kind != "semaphore":
                        inside, around = _acts_inside(a, b, res)
                        if around is None:
                            continue  # the spans cross, but neither acted in the other's
                        start, end = inside[0], inside[-1]
                    example = _example(run, a, b, start, end, res)
                    if acting:
                        if run.inside(start, classes=["state_loss"]) or (
                            run.resumed(a, b, res) or run.resumed(b, a, res)
                        ):
                            excused.append(example)
                        else:
                            counted.append(example)
                            if around is not None:
                                broken.add(around.id)
                    elif run.inside(s) is not None:
                        in_faults += 1
                        excused.append(example)
                    else:
                        counted.append(example)
        out.metrics[f"{what}_overlaps"] = len(counted)
        out.metrics[f"{what}_overlaps_in_fault_windows"] = len(excused)
        if excused:
            out.metrics[f"{what}_overlap_longest_in_fault_windows"] = max(
                x["seconds"] for x in excused
            )
        if counted:
            where = (
                "outside state-loss windows and client stops"
                if acting
                else "outside every fault window"
            )
            note = f" (by {len(broken)} bodies acting around others)" if acting else ""
            out.add(
                f"{what}_overlap",
                SAFETY,
                len(counted),
                f"{len(counted)} pairs of bodies {'acting' if acting else 'believing they held'} "
                f"at once {where}{note}; longest "
                f"{max(x['seconds'] for x in counted):.3f} s",
                counted,
            )


def check_steps_after_loss(run: Run, out: Findings) -> None:
    bad = []
    landed = 0
    writes_by_body: dict[str, list[int]] = collections.defaultdict(list)
    for t, _res, _tok, body, _acc in run.writes:
        writes_by_body[body].append(t)
    for body in run.bodies.values():
        if body.lost_t is None:
            continue
        after = [t for steps in body.steps.values() for t in steps if t > body.lost_t]
        if after:
            bad.append(
                {
                    "body": body.id,
                    "lost_at": run.rel(body.lost_t),
                    "steps_after": len(after),
                    "last": run.rel(max(after)),
                }
            )
        landed += sum(1 for t in writes_by_body.get(body.id, []) if t > body.lost_t)
    out.metrics["bodies_told_of_a_loss"] = sum(1 for b in run.bodies.values() if b.lost_t)
    out.metrics["writes_landing_after_the_loss"] = landed
    if bad:
        out.add(
            "steps_after_loss",
            SAFETY,
            len(bad),
            f"{len(bad)} bodies stepped after they were told of their loss",
            bad,
        )


def _grants(run: Run) -> dict[str, list[tuple[int, int, Body]]]:
    """Per token-ordered resource: (acquire time, token, body) of exclusive grants."""
    grants: dict[str, list[tuple[int, int, Body]]] = collections.defaultdict(list)
    for body in run.bodies.values():
        if body.acq_t is None or body.shared:
            continue
        for res, token in body.tokens.items():
            if token is not None and res.split(":")[0] in TOKEN_FAMILIES:
                grants[res].append((body.acq_t, token, body))
    for items in grants.values():
        items.sort(key=lambda g: g[0])
    return grants


def check_tokens(run: Run, out: Findings) -> None:
    grants = _grants(run)
    inversions = []
    for res, items in grants.items():
        best: tuple[int, int, Body] | None = None
        for t, token, body in items:
            if best is not None and token <= best[1]:
                inversions.append(
                    {
                        "res": res,
                        "at": run.rel(t),
                        "token": token,
                        "body": body.id,
                        "earlier_token": best[1],
                        "earlier_body": best[2].id,
                        "earlier_at": run.rel(best[0]),
                        "window": _window_name(run.inside(t)),
                        "back_by": best[1] - token,
                    }
                )
            if best is None or token > best[1]:
                best = (t, token, body)
    out.metrics["grants_with_tokens"] = sum(len(v) for v in grants.values())
    out.metrics["token_inversions"] = len(inversions)
    if inversions:
        out.add(
            "token_inversions",
            SAFETY,
            len(inversions),
            f"{len(inversions)} grants with a token not above an earlier grant's",
            inversions,
        )
    # the store's side: a write is stale when another grant of its resource came after
    # its own and before the write landed (its writer had been superseded); else it is
    # the newest grant's, which the store must accept
    granted: dict[str, list[int]] = collections.defaultdict(list)
    for body in run.bodies.values():
        if body.acq_t is not None:
            for res in body.res:
                granted[res].append(body.acq_t)
    for times in granted.values():
        times.sort()
    stale_ok: list[dict[str, Any]] = []
    stale_ok_excused = 0
    stale_refused = 0
    legit_refused: list[dict[str, Any]] = []
    for t, res, token, body_id, accepted in run.writes:
        writer = run.bodies.get(body_id)
        if token is None or writer is None or writer.acq_t is None:
            continue
        times = granted[res]
        superseded = bisect.bisect_right(times, writer.acq_t) < bisect.bisect_left(times, t)
        example = {
            "res": res,
            "at": run.rel(t),
            "token": token,
            "body": body_id,
            "window": _window_name(run.inside(t)),
        }
        if superseded and accepted:
            if run.inside(t, classes=["state_loss"]) or run.inside(t, faults=IN_FLIGHT):
                stale_ok_excused += 1
            else:
                stale_ok.append(example)
        elif superseded:
            stale_refused += 1
        elif not accepted:
            legit_refused.append(example)
    out.metrics["fenced_writes"] = sum(1 for w in run.writes if w[2] is not None)
    out.metrics["stale_writes_refused"] = stale_refused
    out.metrics["stale_writes_accepted"] = len(stale_ok)
    out.metrics["stale_writes_accepted_in_state_loss_or_pauses"] = stale_ok_excused
    out.metrics["legit_writes_refused"] = len(legit_refused)
    if stale_ok:
        out.add(
            "stale_writes_accepted",
            SAFETY,
            len(stale_ok),
            f"{len(stale_ok)} writes accepted from holders that had lost the lock "
            "(outside state-loss windows)",
            stale_ok,
        )
    if legit_refused:
        out.add(
            "legit_writes_refused",
            SAFETY,
            len(legit_refused),
            f"{len(legit_refused)} writes of the newest grant refused: a higher token "
            "came from an older grant",
            legit_refused,
        )


def check_counter(run: Run, out: Findings) -> None:
    current: dict[str, int] = collections.defaultdict(int)
    lost: list[dict[str, Any]] = []
    excused = 0
    increments = 0
    for t, res, op, value, body in run.counter_ops:
        if op != "set":
            continue
        increments += 1
        if value <= current[res]:
            example = {"res": res, "at": run.rel(t), "body": body, "lost": current[res] + 1 - value}
            if run.inside(t, classes=["state_loss"]) or run.inside(t, faults=IN_FLIGHT):
                excused += example["lost"]
            else:
                lost.append(example)
        current[res] = value  # what the counter holds now
    total = sum(x["lost"] for x in lost)
    out.metrics["counter_increments"] = increments
    out.metrics["lost_updates"] = total
    out.metrics["lost_updates_in_state_loss_or_pauses"] = excused
    if lost:
        out.add(
            "lost_updates",
            SAFETY,
            total,
            f"{total} increments of the unfenced counter lost (outside state-loss windows)",
            lost,
        )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def check_waits(run: Run, out: Findings) -> None:
    threshold = int(run.checks.get("starvation_grants", 20))
    patience = float(run.checks.get("starvation_seconds", 5.0))
    grants: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    per_proc: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for body in run.bodies.values():
        if body.acq_t is None:
            continue
        for res in body.res:
            grants[res].append((body.acq_t, body.proc))
            per_proc[res][body.proc] += 1
    for items in grants.values():
        items.sort()
    starved, timeouts, waits = [], [], []
    waits_by_res: dict[str, list[float]] = collections.defaultdict(list)
    #: per resource and process: seconds waited undisturbed, and the grants to other
    #: processes meanwhile
    waited_by_proc: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(lambda: [0.0, 0.0])
    )
    for body in run.bodies.values():
        if body.wait_t is None or body.wait_end is None or len(body.res) != 1:
            continue
        res = body.res[0]
        if res.split(":")[0] not in ("lock", "fair", "redlock"):
            continue
        seconds = (body.wait_end - body.wait_t) / 1e9
        quiet = not run.disturbs(body)
        if body.outcome not in (
            "held",
            "released",
            "lost",
            "timeout",
            "dead",
            "error",
            "abandoned",
        ) or (body.outcome == "error" and body.acq_t is None):
            continue
        if body.outcome != "abandoned":  # a wait cut by the run's end counts for starvation
            waits.append(seconds)
            waits_by_res[res].append(seconds)
        if body.outcome == "timeout" and not run.touches(body.wait_t, body.wait_end):
            timeouts.append(
                {
                    "res": res,
                    "proc": body.proc,
                    "at": run.rel(body.wait_t),
                    "waited": round(seconds, 3),
                }
            )
        items = grants[res]
        # the bound counts from when the process can hear a release (docs/semantics.md):
        # a first wait through a slow link opens its connections before that
        heard = run.heard_from(body.proc, body.wait_t, body.wait_end)
        lo = bisect.bisect_right(items, (heard, "\uffff"))
        hi = bisect.bisect_left(items, (body.wait_end, ""))
        window = items[lo:hi]
        own = sum(1 for _, p in window if p == body.proc)
        others = len(window) - own
        if quiet:
            waited_by_proc[res][body.proc][0] += seconds
            waited_by_proc[res][body.proc][1] += others
        if quiet and own == 0 and others >= threshold:
            starved.append(
                {
                    "res": res,
                    "proc": body.proc,
                    "at": run.rel(body.wait_t),
                    "waited": round(seconds, 3),
                    "grants_to_others": others,
                    "outcome": body.outcome,
                }
            )
    out.metrics["waits"] = len(waits)
    out.metrics["wait_p50"] = round(_percentile(waits, 0.5), 3)
    out.metrics["wait_p99"] = round(_percentile(waits, 0.99), 3)
    out.metrics["wait_max"] = round(max(waits, default=0.0), 3)
    out.metrics["waits_by_resource"] = {
        res: {"waits": len(w), "p99": round(_percentile(w, 0.99), 3), "max": round(max(w), 3)}
        for res, w in sorted(waits_by_res.items())
    }
    out.metrics["grants_per_process"] = {
        res: dict(sorted(c.items())) for res, c in per_proc.items()
    }
    out.metrics["starved_waits"] = len(starved)
    out.metrics["timeouts_outside_faults"] = len(timeouts)
    if starved:
        worst = max(starved, key=lambda s: float(s["grants_to_others"] or 0))
        out.add(
            "starved_waits",
            LIVENESS,
            len(starved),
            f"{len(starved)} waits saw >= {threshold} grants to other processes and none "
            f"to their own (worst: {worst['grants_to_others']} grants in "
            f"{worst['waited']} s)",
            sorted(starved, key=lambda s: -s["waited"]),
        )
    if timeouts:
        out.add(
            "timeouts",
            LIVENESS,
            len(timeouts),
            f"{len(timeouts)} waits timed out outside every fault window",
            sorted(timeouts, key=lambda s: -s["waited"]),
        )
    starved_procs = []
    for res, counts in per_proc.items():
        if res.split(":")[0] not in ("lock", "fair", "redlock"):
            continue
        for proc, (waited, elsewhere) in waited_by_proc[res].items():
            if counts.get(proc, 0) == 0 and waited >= patience and elsewhere >= threshold:
                starved_procs.append(
                    {
                        "res": res,
                        "proc": proc,
                        "waited": round(waited, 3),
                        "grants_to_others_meanwhile": int(elsewhere),
                    }
                )
    if starved_procs:
        out.add(
            "process_starved",
            LIVENESS,
            len(starved_procs),
            f"{len(starved_procs)} processes waited >= {patience} s in all and never got a "
            f"resource that others got >= {threshold} times meanwhile",
            starved_procs,
        )


def check_unavailability(run: Run, out: Findings) -> None:
    excuse = run.checks.get("excuse")
    limit = run.checks.get("unavailability_max")
    edges: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for body in run.bodies.values():
        if body.acq_t is not None and body.end_t is not None:
            for res in body.res:
                edges[res] += [(body.acq_t, 0, 1), (body.end_t, 1, -1)]  # holders: kind 0/1
        if body.wait_t is None or body.wait_end is None:
            continue
        if len(body.res) == 1:
            edges[body.res[0]] += [(body.wait_t, 2, 1), (body.wait_end, 3, -1)]
        else:  # a multi-lock holds its first names while it waits for the next ones
            for res in body.res:
                edges[res] += [(body.wait_t, 0, 1), (body.wait_end, 1, -1)]
    longest: dict[str, dict[str, Any]] = {}
    worst_unexcused: dict[str, Any] | None = None
    for res, items in edges.items():
        items.sort()
        holders = waiters = 0
        gap_start: int | None = None
        for t, kind, delta in items:
            if kind in (0, 1):
                holders += delta
            else:
                waiters += delta
            free = waiters > 0 and holders == 0
            if free and gap_start is None:
                gap_start = t
            elif not free and gap_start is not None:
                seconds = (t - gap_start) / 1e9
                gap = {
                    "res": res,
                    "at": run.rel(gap_start),
                    "seconds": round(seconds, 3),
                    "window": _window_name(run.inside(gap_start)),
                }
                if seconds > longest.get(res, {}).get("seconds", -1):
                    longest[res] = gap
                if not run.touches(gap_start, t, faults=excuse) and (
                    worst_unexcused is None or seconds > worst_unexcused["seconds"]
                ):
                    worst_unexcused = gap
                gap_start = None
    out.metrics["longest_unavailability"] = longest
    out.metrics["longest_unavailability_unexcused"] = worst_unexcused
    if limit is not None and worst_unexcused is not None and worst_unexcused["seconds"] > limit:
        out.add(
            "unavailability",
            LIVENESS,
            1,
            f"{worst_unexcused['res']} had waiters and no holder for "
            f"{worst_unexcused['seconds']} s (limit {limit} s)",
            [worst_unexcused],
        )


def _held(run: Run) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """Per resource, the union of the times someone held it (a multi-lock's wait counts:
    it holds its first names meanwhile), as sorted disjoint (starts, ends, covered
    before each start)."""
    spans: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for body in run.bodies.values():
        if body.acq_t is not None and body.end_t is not None:
            for res in body.res:
                spans[res].append((body.acq_t, body.end_t))
        if len(body.res) > 1 and body.wait_t is not None and body.wait_end is not None:
            for res in body.res:
                spans[res].append((body.wait_t, body.wait_end))
    union: dict[str, tuple[list[int], list[int], list[int]]] = {}
    for res, items in spans.items():
        starts: list[int] = []
        ends: list[int] = []
        for s, e in sorted(items):
            if ends and s <= ends[-1]:
                ends[-1] = max(ends[-1], e)
            else:
                starts.append(s)
                ends.append(e)
        before, total = [], 0
        for s, e in zip(starts, ends, strict=True):
            before.append(total)
            total += e - s
        union[res] = (starts, ends, before)
    return union


def _covered(union: tuple[list[int], list[int], list[int]], t0: int, t1: int) -> int:
    """How much of [t0, t1] the union covers."""
    starts, ends, before = union

    def upto(t: int) -> int:  # covered time before t
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return 0
        return before[i] + min(t, ends[i]) - starts[i]

    return upto(t1) - upto(t0)


def check_idle_waits(run: Run, out: Findings) -> None:
    """Waits not served while the resource was free: at least ``idle_wait_seconds`` (1 s)
    and half of the wait with nobody holding it, outside every fault window."""
    least = float(run.checks.get("idle_wait_seconds", 1.0))
    union = _held(run)
    idle = []
    for body in run.bodies.values():
        if body.wait_t is None or body.wait_end is None or len(body.res) != 1:
            continue
        res = body.res[0]
        if res.split(":")[0] not in ("lock", "fair", "redlock") or res not in union:
            continue
        seconds = (body.wait_end - body.wait_t) / 1e9
        free = seconds - _covered(union[res], body.wait_t, body.wait_end) / 1e9
        if free >= least and free >= seconds / 2 and not run.touches(body.wait_t, body.wait_end):
            idle.append({"res": res, "proc": body.proc, "at": run.rel(body.wait_t),
                         "waited": round(seconds, 3), "free": round(free, 3),
                         "outcome": body.outcome})  # fmt: skip
    out.metrics["idle_waits"] = len(idle)
    if idle:
        worst = max(idle, key=lambda w: float(w["free"] or 0))
        out.add(
            "idle_waits",
            LIVENESS,
            len(idle),
            f"{len(idle)} waits went unserved while their resource was free for most of the "
            f"wait (worst: free {worst['free']} s of {worst['waited']} s)",
            sorted(idle, key=lambda w: -float(w["free"] or 0)),
        )


def check_outage(run: Run, out: Findings) -> None:
    downs = [w.detail["down"] for w in run.windows if w.fault == "outage" and "down" in w.detail]
    if not downs:
        return
    settle = int(0.2e9)
    outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    bad = []
    for body in run.bodies.values():
        if body.wait_end is None or body.acq_t is not None:
            continue
        for down, up in downs:
            if down + settle <= body.wait_end <= up:
                label = body.error or body.outcome
                outcomes[body.proc][label] += 1
                if body.outcome == "timeout":
                    bad.append(
                        {
                            "proc": body.proc,
                            "at": run.rel(body.wait_end),
                            "since_down": round((body.wait_end - down) / 1e9, 3),
                        }
                    )
    out.metrics["waits_ended_during_outage"] = {p: dict(c) for p, c in sorted(outcomes.items())}
    if bad:
        out.add(
            "outage_as_timeout",
            LIVENESS,
            len(bad),
            f"{len(bad)} waits ended with LockTimeoutError while Redis refused "
            "connections (LockConnectionError expected)",
            bad,
        )


def check_force_release(run: Run, out: Findings) -> None:
    limit = float(run.checks.get("late_loss_max", 1.0))
    rows = []
    for w in run.windows:
        if w.fault != "force_release" or "at" not in w.detail:
            continue
        at, res = w.detail["at"], w.detail["res"]
        for body in run.bodies.values():
            if res not in body.res or body.acq_t is None or body.end_t is None:
                continue
            if not body.acq_t <= at <= body.end_t:
                continue
            steps = [t for t in body.steps.get(res, []) if t > at]
            late = ((max(steps) - at) / 1e9) if steps else 0.0
            beside = []
            for other in run.bodies.values():
                if other is body or not steps:
                    continue
                theirs = [t for t in other.steps.get(res, []) if at < t <= max(steps)]
                if theirs:
                    beside.append("same process" if other.proc == body.proc else "other process")
            rows.append(
                {
                    "res": res,
                    "at": run.rel(at),
                    "holder": body.id,
                    "late": round(late, 3),
                    "told": None if body.lost_t is None else round((body.lost_t - at) / 1e9, 3),
                    "outcome": body.outcome,
                    "acted_beside": sorted(set(beside)),
                }
            )
    if not rows:
        return
    out.metrics["force_releases_of_a_held_name"] = len(rows)
    out.metrics["late_loss_max"] = max(r["late"] for r in rows)
    late = [r for r in rows if r["late"] > limit]
    if late:
        same = sum(1 for r in late if "same process" in r["acted_beside"])
        out.add(
            "late_loss",
            LIVENESS,
            len(late),
            f"{len(late)} of {len(rows)} force-released holders went on acting > {limit} s "
            f"(longest {max(r['late'] for r in late):.2f} s; {same} beside a task of "
            "their own process)",
            sorted(late, key=lambda r: -r["late"]),
        )


def check_handoff(run: Run, out: Findings) -> None:
    cancelled = [b for b in run.bodies.values() if b.adopt_cancelled]
    if not cancelled and not any(b.kind == "handoff" for b in run.bodies.values()):
        return
    dead = [b for b in cancelled if b.outcome == "dead"]
    out.metrics["adopts_cancelled"] = len(cancelled)
    out.metrics["tokens_dead_after_a_cancelled_adopt"] = len(dead)
    if dead:
        out.add(
            "adopt_dead_after_cancel",
            LIVENESS,
            len(dead),
            f"{len(dead)} of {len(cancelled)} hand-off tokens whose first adopt was "
            "cancelled could not be adopted again (LockHandoffError)",
            [{"body": b.id, "at": run.rel(b.end_t)} for b in dead],
        )


def check_errors(run: Run, out: Findings) -> None:
    inside: collections.Counter[str] = collections.Counter()
    outside: collections.Counter[str] = collections.Counter()
    examples = []
    for body in run.bodies.values():
        if body.outcome != "error":
            continue
        t = body.end_t if body.acq_t is not None else body.wait_end
        if t is not None and run.inside(t) is not None:
            inside[body.error] += 1
        else:
            outside[body.error] += 1
            examples.append({"body": body.id, "error": body.error, "at": run.rel(t)})
    out.metrics["errors_in_fault_windows"] = dict(inside)
    out.metrics["errors_outside_fault_windows"] = dict(outside)
    if outside:
        out.add(
            "errors",
            LIVENESS,
            sum(outside.values()),
            f"errors outside fault windows: {dict(outside)}",
            examples,
        )
    tracebacks = []
    for path in sorted((run.folder / "logs").glob("*.out")):
        text = path.read_text(errors="replace")
        if "Traceback" in text:
            tracebacks.append({"worker": path.stem, "tail": text[-600:]})
    if run.crashes or tracebacks:
        out.add(
            "worker_crashes",
            LIVENESS,
            len(run.crashes) + len(tracebacks),
            "a worker task crashed or printed a traceback",
            [*run.crashes, *tracebacks],
        )


def check(folder: Path) -> dict[str, Any]:
    run = Run(folder)
    out = Findings(run)
    bodies = run.bodies.values()
    out.metrics["bodies"] = sum(1 for b in bodies if b.acq_t is not None)
    out.metrics["steps"] = sum(len(s) for b in bodies for s in b.steps.values())
    outcomes = collections.Counter(b.outcome for b in bodies)
    out.metrics["outcomes"] = dict(sorted(outcomes.items()))
    out.metrics["faults"] = dict(collections.Counter(w.fault for w in run.windows))
    for step in (
        check_overlaps,
        check_steps_after_loss,
        check_tokens,
        check_counter,
        check_waits,
        check_idle_waits,
        check_unavailability,
        check_outage,
        check_force_release,
        check_handoff,
        check_errors,
    ):
        step(run, out)
    found = {f["check"] for f in out.items}
    for missing in sorted(set(run.checks.get("expect", [])) - found):
        out.items.append(
            {
                "check": "expected_missing",
                "severity": SAFETY,
                "count": 1,
                "known": None,
                "expected": False,
                "examples": [],
                "summary": f"the negative control did not produce {missing}: the checker is blind",
            }
        )
    if not out.metrics["bodies"]:
        out.items.append(
            {
                "check": "no_traffic",
                "severity": SAFETY,
                "count": 1,
                "known": None,
                "expected": False,
                "examples": [],
                "summary": "no body ran: the run checked nothing",
            }
        )
    failures = run.run.get("nemesis_failures") or []
    if failures:
        out.items.append(
            {
                "check": "nemesis_failed",
                "severity": LIVENESS,
                "count": len(failures),
                "known": None,
                "expected": False,
                "examples": failures[:_EXAMPLES],
                "summary": "faults that could not be injected",
            }
        )
    return {
        "scenario": run.scenario["name"],
        "about": run.scenario["about"],
        "reproduces": run.scenario.get("reproduces", []),
        "duration": run.scenario["duration"],
        "seconds": run.run.get("seconds"),
        "metrics": out.metrics,
        "findings": out.items,
    }
