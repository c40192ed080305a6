"""The scenarios: a deployment, the traffic on it, the nemesis, and what the checker
should hold it to. Each is made for a duration, so that one definition serves both
profiles; :data:`PROFILES` says which run in ``short`` (CI, at most 3 minutes on two
cores) and ``long`` (about 30 minutes).

A scenario's ``checks`` tune the checker (see :mod:`tests.robustness.checker`):
``starvation_grants`` (a wait that saw this many grants to other processes and none to
its own is starved), ``unavailability_max`` (seconds a name may stay free with waiters
outside the excused fault windows), ``excuse`` (the faults whose windows excuse an
unavailability), ``late_loss_max`` (seconds a force-released holder may go on),
``expect`` (findings the scenario must produce: the negative control).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tests._support.starvation import grants_bound

#: holds as in the independent review: 5-30 ms, one in eight 0.5-3 s
REVIEW_HOLD: dict[str, Any] = {"short_ms": [5, 30], "long_ms": [500, 3000], "long_every": 8}
SHORT_HOLD: dict[str, Any] = {"short_ms": [2, 10], "long_every": 0, "step_ms": 5}
#: the manager options of scenarios with faults: a command that hangs fails in 1 s
FAULT_MANAGER: dict[str, Any] = {"command_timeout": 1.0}


@dataclasses.dataclass
class Scenario:
    name: str
    about: str
    duration: float
    workers: list[dict[str, Any]]
    topology: str = "single"
    aof: bool = False
    #: data nodes with a fault proxy in front (workers with ``proxied`` use it)
    proxied: tuple[int, ...] = ()
    lease: float = 3.0
    manager: dict[str, Any] = dataclasses.field(default_factory=dict)
    client: dict[str, Any] = dataclasses.field(default_factory=dict)
    nemesis: dict[str, Any] = dataclasses.field(default_factory=dict)
    checks: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the defects this scenario reproduces: items of issue 36, or R1 (found by the suite)
    reproduces: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _group(kind: str, tasks: int, names: list[str], **options: Any) -> dict[str, Any]:
    return {"kind": kind, "tasks": tasks, "names": names, **options}


def _repeat(
    duration: float,
    start: float,
    period: float,
    steps: list[tuple[float, str, dict[str, Any]]],
    tail: float = 3.0,
) -> list[list[Any]]:
    """*steps* (offset, fault, params) every *period* seconds from *start*, while the
    last one begins *tail* seconds before the end."""
    schedule: list[list[Any]] = []
    at = start
    while True:
        batch: list[list[Any]] = [[at + offset, fault, params] for offset, fault, params in steps]
        if batch[-1][0] + tail > duration:
            return schedule
        schedule += batch
        at += period


# -- the scenarios ------------------------------------------------------------------------


def mixed(duration: float) -> Scenario:
    """Every kind of one server at once, no faults: the baseline every check must pass."""
    groups = [
        _group("lock", 2, ["n0", "n1"], hold=REVIEW_HOLD),
        _group("multi", 1, ["n0", "n1"], hold=REVIEW_HOLD),
        _group("fair", 1, ["f0"], hold=REVIEW_HOLD),
        _group("rw", 2, ["r0"], hold=REVIEW_HOLD),
        _group("semaphore", 2, ["s0"], limit=2, hold=REVIEW_HOLD),
        _group("leader", 1, ["L"], hold={**REVIEW_HOLD, "long_every": 2}),
    ]
    return Scenario(
        "mixed",
        "every kind (lock, multi-lock, fair, read-write, semaphore, leader) on one server, "
        "3 processes, no faults",
        duration,
        workers=[{"count": 3, "groups": groups}],
    )


def client_faults(duration: float) -> Scenario:
    """Workers killed and stopped (holders among them), their connections killed."""
    groups = [
        _group("lock", 2, ["n0"], hold=REVIEW_HOLD),
        _group("fair", 1, ["f0"], hold=REVIEW_HOLD),
        _group("semaphore", 1, ["s0"], limit=2, hold=REVIEW_HOLD),
        _group("leader", 1, ["L"], hold={**REVIEW_HOLD, "long_every": 2}),
    ]
    return Scenario(
        "client-faults",
        "SIGKILL (respawned) and SIGSTOP (4 s, past the 3 s lease) of workers, CLIENT KILL; "
        "lock, fair, semaphore, leader; 3 processes",
        duration,
        workers=[{"count": 3, "groups": groups}],
        manager=FAULT_MANAGER,
        nemesis={
            "faults": {
                "kill_client": {"respawn": 0.5, "weight": 1},
                "pause_client": {"seconds": 4.0, "weight": 1},
                "client_kill": {"weight": 1},
            },
            "gap": [0.5, 2.0],
            "start_after": 2.0,
        },
    )


def pause_holder(duration: float) -> Scenario:
    """The case fencing exists for: a holder stopped past its lease, mid-step."""
    hold = {"short_ms": [50, 100], "long_every": 0, "step_ms": 0, "think_ms": [0, 2]}
    return Scenario(
        "pause-holder",
        "2 processes x 1 task on one name, bodies writing to the store back to back; a "
        "worker stopped (SIGSTOP) for 4 s, past the 3 s lease, every 6 s: a write it had "
        "begun lands after the next grant, and fencing must refuse it",
        duration,
        workers=[{"count": 2, "groups": [_group("lock", 1, ["n0"], hold=hold)]}],
        manager=FAULT_MANAGER,
        nemesis={
            "schedule": _repeat(duration, 1.0, 6.0, [(0.0, "pause_client", {"seconds": 4.0})])
        },
    )


def server_faults(duration: float) -> Scenario:
    """Redis stopped, slowed and restarted from its AOF, behind a proxy."""
    groups = [
        _group("lock", 2, ["n0"], hold=REVIEW_HOLD),
        _group("multi", 1, ["n0", "n1"], hold=REVIEW_HOLD),
        _group("rw", 2, ["r0"], hold=REVIEW_HOLD),
        _group("fair", 1, ["f0"], hold=REVIEW_HOLD),
    ]
    return Scenario(
        "server-faults",
        "SIGSTOP of Redis (1-2 s, lease 3 s), latency with jitter on the proxy, SIGKILL "
        "and restart from the AOF (appendfsync always), CLIENT KILL; 3 processes",
        duration,
        workers=[{"count": 3, "groups": groups, "proxied": True}],
        aof=True,
        proxied=(0,),
        manager=FAULT_MANAGER,
        nemesis={
            "faults": {
                "pause_redis": {"seconds": 1.5, "weight": 1},
                "latency": {"latency": 0.05, "jitter": 0.1, "seconds": 2.0, "weight": 1},
                "restart_redis": {"weight": 1},
                "client_kill": {"weight": 1},
            },
            "gap": [0.5, 2.0],
            "start_after": 2.0,
        },
    )


def restart_empty(duration: float) -> Scenario:
    """Redis restarted without persistence and down for a while: state lost."""
    groups = [
        _group("lock", 2, ["n0"], hold=REVIEW_HOLD),
        _group("fair", 1, ["f0"], hold=REVIEW_HOLD),
        _group("semaphore", 1, ["s0"], limit=2, hold=REVIEW_HOLD),
    ]
    return Scenario(
        "restart-empty",
        "SIGKILL and restart without persistence, and outages of 2-4 s ending in one; "
        "overlaps inside these windows are measured, not violations; 3 processes",
        duration,
        workers=[{"count": 3, "groups": groups}],
        manager=FAULT_MANAGER,
        nemesis={
            "faults": {
                "restart_redis": {"weight": 2},
                "outage": {"seconds": 3.0, "weight": 1},
            },
            "gap": [3.0, 6.0],
            "start_after": 3.0,
        },
    )


def starvation(duration: float) -> Scenario:
    """Issue 36 item 1: 8 processes x 3 tasks on one name, no fault."""
    return Scenario(
        "starvation",
        "8 processes x 3 tasks on one plain lock, lease 3 s, acquire timeout 30 s, no "
        "faults (issue 36 item 1)",
        duration,
        workers=[
            {"count": 8, "groups": [_group("lock", 3, ["n0"], timeout=30.0, hold=REVIEW_HOLD)]}
        ],
        checks={"starvation_grants": grants_bound(8) + 1},
        reproduces=["1"],
    )


def starvation_latency(duration: float) -> Scenario:
    """Issue 36 item 1, second part: one process 20 ms further from Redis."""
    return Scenario(
        "starvation-latency",
        "1 process x 1 task through a proxy adding 20 ms (each way), against 1 local "
        "process x 8 tasks on one plain lock, no other fault (issue 36 item 1)",
        duration,
        workers=[
            {"count": 1, "groups": [_group("lock", 8, ["n0"], timeout=30.0, hold=SHORT_HOLD)]},
            {
                "count": 1,
                "proxied": True,
                "groups": [_group("lock", 1, ["n0"], timeout=30.0, hold=SHORT_HOLD)],
            },
        ],
        proxied=(0,),
        nemesis={
            "schedule": [
                [0.0, "latency", {"latency": 0.02, "seconds": duration, "condition": True}]
            ]
        },
        checks={"starvation_grants": grants_bound(2) + 1},
        reproduces=["1"],
    )


def outage(duration: float) -> Scenario:
    """Issue 36 item 4: Redis refuses connections while tasks wait with timeout=2."""
    groups = [_group("lock", 5, ["n0"], timeout=2.0, hold=SHORT_HOLD)]
    return Scenario(
        "outage",
        "Redis killed (connection refused) for 6 s while 5 tasks per process wait on one "
        "name with timeout=2: a client with redis-py's default retries (Redis(host=, "
        "port=)) and one made by Redis.from_url (issue 36 item 4)",
        duration,
        workers=[
            {"count": 1, "groups": groups, "client": {"style": "default"}},
            {"count": 1, "groups": groups, "client": {"style": "url"}},
        ],
        nemesis={"schedule": [[3.0, "outage", {"seconds": 6.0}]]},
        reproduces=["4"],
    )


def force_release(duration: float) -> Scenario:
    """Issue 36 item 5: an administrator force-releases a held name."""
    # in the long profile, bodies outlast the renewal period (a third of the lease, 10 s)
    low, high = (3, 6) if duration < 40 else (6, 14)
    hold = {"short_ms": [low * 1000, high * 1000], "long_every": 0, "step_ms": 50}
    return Scenario(
        "force-release",
        "force_release() by another manager (the CLI's way) every 7 s while 2 processes x "
        f"2 tasks hold one name for {low}-{high} s, lease 30 s (issue 36 item 5)",
        duration,
        workers=[{"count": 2, "groups": [_group("lock", 2, ["n0"], timeout=30.0, hold=hold)]}],
        lease=30.0,
        nemesis={
            "schedule": _repeat(duration, 2.0, 7.0, [(0.0, "force_release", {"names": ["n0"]})])
        },
        checks={"late_loss_max": 1.0},
        reproduces=["5"],
    )


def handoff(duration: float) -> Scenario:
    """Issue 36 item 3 (hand-off): an adopt delayed past its deadline."""
    group = _group(
        "handoff",
        1,
        ["n0"],
        adopters=1,
        adopt_deadline=0.05,
        hold=SHORT_HOLD,
        adopt_manager={"max_in_flight": 1},
    )
    return Scenario(
        "handoff",
        "detach() in one manager, adopt() in a second one (max_in_flight=1) through a "
        "proxy that slows the connections open at a window's start by 300 ms (a slow "
        "flow; new ones go through); the first adopt is given 50 ms, retried 0.5 s later; "
        "2 processes, one giving task each (issue 36 item 3)",
        duration,
        workers=[{"count": 2, "adopt_proxied": True, "groups": [group]}],
        proxied=(0,),
        nemesis={
            "schedule": _repeat(
                duration,
                1.0,
                3.0,
                [(0.0, "latency", {"latency": 0.3, "existing_only": True, "seconds": 1.5})],
            )
        },
        checks={"unavailability_max": 1.0, "excuse": []},
        reproduces=["3"],
    )


def handoff_waiters(duration: float) -> Scenario:
    """Found by this suite (R1): the waiters of a manager one of whose tasks detached."""
    return Scenario(
        "handoff-waiters",
        "two tasks of one manager take one name and detach it (inside 'async with', the "
        "recipe's form) for a second manager to adopt and release; a second process takes "
        "the name now and then; no fault",
        duration,
        workers=[
            {
                "count": 1,
                "groups": [
                    _group(
                        "handoff",
                        2,
                        ["n0"],
                        adopters=1,
                        detach_in_block=True,
                        timeout=10.0,
                        hold=SHORT_HOLD,
                    )
                ],
            },
            {
                "count": 1,
                "groups": [_group("lock", 1, ["n0"], hold={**SHORT_HOLD, "think_ms": [50, 100]})],
            },
        ],
        checks={"known": {"idle_waits": "R1", "timeouts": "R1", "starved_waits": "R1"}},
        reproduces=["R1"],
    )


def redlock(duration: float) -> Scenario:
    """Issue 36 item 3 (Redlock): one master's acquire delayed past the release."""
    groups = [_group("redlock", 2, ["n0"], hold=SHORT_HOLD)]
    return Scenario(
        "redlock",
        "Redlock over 3 masters; master 0 behind a proxy that slows the connections open "
        "at a window's start by 150 ms (under the 0.25 s node timeout) for 2 s, then "
        "master 1 stopped (SIGSTOP) for 4 s; 2 processes x 2 tasks on one name, lease 3 s "
        "(issue 36 item 3)",
        duration,
        topology="redlock",
        workers=[{"count": 2, "groups": groups, "proxied": True}],
        proxied=(0,),
        nemesis={
            "schedule": _repeat(
                duration,
                1.0,
                7.0,
                [
                    (
                        0.0,
                        "latency",
                        {"node": 0, "latency": 0.15, "existing_only": True, "seconds": 2.0},
                    ),
                    (2.0, "pause_redis", {"node": 1, "seconds": 4.0}),
                ],
            )
        },
        checks={"unavailability_max": 1.0, "excuse": []},
        reproduces=["3"],
    )


def redlock_control(duration: float) -> Scenario:
    """The redlock scenario without its latency: what a stopped master alone costs."""
    scenario = redlock(duration)
    scenario.name = "redlock-control"
    scenario.about = (
        "control of the redlock scenario: the same traffic and the same SIGSTOPs of master "
        "1, no latency on master 0"
    )
    scenario.nemesis = {"schedule": [s for s in scenario.nemesis["schedule"] if s[1] != "latency"]}
    scenario.reproduces = []
    return scenario


def sentinel(duration: float) -> Scenario:
    """Issue 36 item 2: the primary killed (restarted empty) and failed over."""
    groups = [_group("lock", 3, ["n0", "n1"], hold=REVIEW_HOLD)]
    return Scenario(
        "sentinel",
        "1 primary, 1 replica, 3 sentinels (down-after 1000 ms); SIGKILL of the primary "
        "(restarted empty after the failover), SENTINEL FAILOVER, SIGSTOP of the primary; "
        "4 processes x 3 tasks on 2 names (issue 36 item 2)",
        duration,
        topology="sentinel",
        workers=[{"count": 4, "groups": groups}],
        manager=FAULT_MANAGER,
        nemesis={
            "faults": {
                "kill_primary": {"down": 1.0, "weight": 2},
                "failover": {"weight": 1},
                "pause_redis": {"seconds": 2.0, "weight": 1},
            },
            "gap": [2.0, 5.0],
            "start_after": 3.0,
        },
        reproduces=["2"],
    )


#: the names of the Redis Cluster scenarios: their slots are on all three primaries
CLUSTER_NAMES = [f"n{i}" for i in range(12)]


def cluster_failover(duration: float) -> Scenario:
    """Issue 36 item 2 on Redis Cluster: primaries killed, their replicas promoted."""
    groups = [_group("lock", 3, CLUSTER_NAMES, hold=REVIEW_HOLD)]
    kill = {"names": CLUSTER_NAMES, "down": 1.0}
    lagging = {**kill, "lag": 0.5, "takeover": True}
    steps = [(0.0, "kill_primary", kill), (9.0, "kill_primary", lagging)]
    return Scenario(
        "cluster-failover",
        "Redis Cluster, 3 primaries with a replica each (node timeout 2 s); every 9 s "
        "SIGKILL of the primary of one of the names (its replica promoted by the cluster, "
        "the node restarted empty 1 s later to rejoin as a replica); every other kill "
        "with the replica stopped and cut off (CLIENT KILL TYPE replica) for its last "
        "0.5 s and promoted at once (CLUSTER FAILOVER TAKEOVER: its copy lacks the last "
        "grants, its holds still live); 4 processes x 3 tasks of the plain lock on "
        "12 names, lease 3 s (issue 36 item 2)",
        duration,
        topology="cluster",
        workers=[{"count": 4, "groups": groups}],
        manager=FAULT_MANAGER,
        nemesis={"schedule": _repeat(duration, 3.0, 18.0, steps, 8.0)},
        reproduces=["2"],
    )


def cluster_migrate(duration: float) -> Scenario:
    """Redis Cluster: the slots of the names moved between primaries under traffic."""
    # bodies of 1-4 s: their renewals (every second) meet the half-migrated slot
    renewed = {"short_ms": [1000, 4000], "long_every": 0, "step_ms": 100}
    groups = [
        _group("lock", 3, CLUSTER_NAMES, hold=REVIEW_HOLD),
        _group("lock", 1, CLUSTER_NAMES, hold=renewed),
        _group("multi", 1, CLUSTER_NAMES, hold=REVIEW_HOLD),
    ]
    move = {"names": CLUSTER_NAMES, "batch": 1, "pause": 0.5}
    return Scenario(
        "cluster-migrate",
        "Redis Cluster, 3 primaries with a replica each; every 3 s the slot of one of the "
        "names migrated to another primary (SETSLOT IMPORTING/MIGRATING, MIGRATE of one "
        "key at a time after 0.5 s each, SETSLOT NODE on every primary), no kills; 4 "
        "processes x 5 tasks on 12 names: 3 of the plain lock, 1 holding it 1-4 s "
        "(renewed during migrations), 1 of the multi-lock (2 names at a time); lease 3 s",
        duration,
        topology="cluster",
        workers=[{"count": 4, "groups": groups}],
        manager=FAULT_MANAGER,
        nemesis={"schedule": _repeat(duration, 2.0, 3.0, [(0.0, "migrate_slot", move)])},
    )


def mixed_faults(duration: float) -> Scenario:
    """Every kind, every fault that keeps acknowledged writes."""
    scenario = mixed(duration)
    scenario.name = "mixed-faults"
    scenario.about = (
        "every kind on one server with an AOF, behind a proxy; SIGKILL and SIGSTOP of "
        "workers, CLIENT KILL, SIGSTOP of Redis, latency with jitter, restart from the AOF"
    )
    scenario.aof = True
    scenario.proxied = (0,)
    scenario.workers[0]["proxied"] = True
    scenario.manager = FAULT_MANAGER
    scenario.nemesis = {
        "faults": {
            "kill_client": {"respawn": 0.5},
            "pause_client": {"seconds": 4.0},
            "client_kill": {},
            "pause_redis": {"seconds": 1.5},
            "latency": {"latency": 0.05, "jitter": 0.1, "seconds": 2.0},
            "restart_redis": {},
        },
        "gap": [0.5, 2.5],
        "start_after": 2.0,
    }
    return scenario


def control(duration: float) -> Scenario:
    """The negative control: no lock at all; the checker must see the violations."""
    return Scenario(
        "control-no-lock",
        "negative control: the same traffic taking no lock; the checker must report "
        "acting overlaps and lost updates",
        duration,
        workers=[{"count": 2, "groups": [_group("none", 2, ["n0"], hold=REVIEW_HOLD)]}],
        checks={"expect": ["acting_overlap", "belief_overlap", "lost_updates"]},
    )


Builder = Callable[[float], Scenario]

#: scenario builders by name
SCENARIOS: dict[str, Builder] = {
    "mixed": mixed,
    "client-faults": client_faults,
    "pause-holder": pause_holder,
    "server-faults": server_faults,
    "restart-empty": restart_empty,
    "starvation": starvation,
    "starvation-latency": starvation_latency,
    "outage": outage,
    "force-release": force_release,
    "handoff": handoff,
    "handoff-waiters": handoff_waiters,
    "redlock": redlock,
    "redlock-control": redlock_control,
    "sentinel": sentinel,
    "cluster-failover": cluster_failover,
    "cluster-migrate": cluster_migrate,
    "mixed-faults": mixed_faults,
    "control-no-lock": control,
}

#: (scenario, seconds of traffic) per profile
PROFILES: dict[str, list[tuple[str, float]]] = {
    "short": [
        ("control-no-lock", 4.0),
        ("mixed", 10.0),
        ("client-faults", 12.0),
        ("server-faults", 12.0),
        ("outage", 12.0),
        ("force-release", 12.0),
        ("handoff", 8.0),
        ("handoff-waiters", 6.0),
        ("redlock", 14.0),
        ("starvation-latency", 8.0),
    ],
    "long": [
        ("control-no-lock", 10.0),
        ("mixed", 120.0),
        ("starvation", 60.0),
        ("starvation-latency", 20.0),
        ("outage", 15.0),
        ("force-release", 60.0),
        ("handoff", 60.0),
        ("handoff-waiters", 30.0),
        ("redlock", 120.0),
        ("redlock-control", 60.0),
        ("client-faults", 180.0),
        ("pause-holder", 60.0),
        ("server-faults", 180.0),
        ("restart-empty", 150.0),
        ("sentinel", 240.0),
        ("cluster-failover", 120.0),
        ("cluster-migrate", 60.0),
        ("mixed-faults", 300.0),
    ],
}


def build(name: str, duration: float) -> Scenario:
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name](duration)
