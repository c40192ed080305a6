"""Runs one scenario: servers, the store, the workers and the nemesis, then the checker.

Everything it starts it stops by pid: workers get until the scenario's stop time plus a
grace to finish their bodies and close their managers, then SIGKILL (after SIGCONT, for
one the nemesis left stopped). The scenario's folder gets ``logs/<worker>.jsonl``,
``nemesis.jsonl``, ``store.sqlite``, ``run.json`` (what ran, when, with which pids) and
``result.json`` (the checker's verdict).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tests._support.paths import REPO_ROOT
from tests.robustness import checker
from tests.robustness.nemesis import Nemesis
from tests.robustness.scenarios import Scenario
from tests.robustness.topology import Topology

#: seconds the workers get after the stop time to finish bodies and close managers
STOP_GRACE = 25.0


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclasses.dataclass
class _Process:
    label: str
    spec: dict[str, Any]
    popen: subprocess.Popen[bytes]
    started: int
    output: TextIO
    paused: bool = False
    killed_at: int | None = None


class Fleet:
    """The worker processes of a run (the nemesis's view: :class:`nemesis.Fleet`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.processes: dict[str, _Process] = {}
        self.respawns = 0

    def spawn(self, label: str, spec: dict[str, Any]) -> None:
        spec = {**spec, "proc": label, "log": str(self.folder / "logs" / f"{label}.jsonl")}
        output = open(self.folder / "logs" / f"{label}.out", "w")  # noqa: SIM115 - closed at stop
        popen = subprocess.Popen(
            [sys.executable, "-m", "tests.robustness.traffic", json.dumps(spec)],
            cwd=str(REPO_ROOT),
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        self.processes[label] = _Process(label, spec, popen, time.monotonic_ns(), output)

    def live(self) -> list[str]:
        return [p.label for p in self.processes.values() if p.popen.poll() is None]

    def kill(self, label: str) -> None:
        process = self.processes[label]
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGKILL)  # also ends a stopped process
            process.killed_at = time.monotonic_ns()
            process.popen.wait(timeout=10)

    def respawn(self, label: str) -> str:
        self.respawns += 1
        base = label.split("r", 1)[0]
        new = f"{base}r{self.respawns}"
        self.spawn(new, self.processes[label].spec)
        return new

    def pause(self, label: str) -> None:
        process = self.processes[label]
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGSTOP)
            process.paused = True

    def resume(self, label: str) -> None:
        process = self.processes[label]
        if process.paused and process.popen.poll() is None:
            process.popen.send_signal(signal.SIGCONT)
        process.paused = False

    async def wait(self, deadline_ns: int) -> list[str]:
        """Until every worker exits or *deadline_ns*; then SIGKILL the rest. Returns
        the labels of the ones killed here."""
        while self.live() and time.monotonic_ns() < deadline_ns:  # noqa: ASYNC110 - polls pids
            await asyncio.sleep(0.1)
        killed = []
        for label in self.live():
            self.resume(label)
            self.kill(label)
            killed.append(label)
        return killed

    def close(self) -> None:
        for process in self.processes.values():
            if process.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.popen.send_signal(signal.SIGCONT)
                    process.popen.send_signal(signal.SIGKILL)
                process.popen.wait(timeout=10)
            process.output.close()

    def describe(self) -> dict[str, Any]:
        return {
            p.label: {
                "pid": p.popen.pid,
                "started": p.started,
                "killed_at": p.killed_at,
                "exit": p.popen.returncode,
            }
            for p in self.processes.values()
        }


class _StoreProcess:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port_file = folder / "store.port"
        self.output = open(folder / "store.out", "w")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.robustness.store",
                str(folder / "store.sqlite"),
                str(self.port_file),
            ],
            cwd=str(REPO_ROOT),
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )

    async def port(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_file.exists():
                return int(self.port_file.read_text())
            if self.popen.poll() is not None:
                break
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the store did not start: {(self.folder / 'store.out').read_text()}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self.output.close()


async def run_scenario(scenario: Scenario, seed: int, out: Path) -> dict[str, Any]:
    """Run *scenario* into ``out/<name>`` and return the checker's result."""
    folder = out / scenario.name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "logs").mkdir(parents=True)
    prefix = f"rb-{scenario.name}-{seed}"
    topology = Topology(scenario.topology, aof=scenario.aof, proxied=scenario.proxied, seed=seed)
    fleet = Fleet(folder)
    store: _StoreProcess | None = None
    began = time.monotonic()
    run: dict[str, Any] = {"scenario": scenario.to_json(), "seed": seed, "prefix": prefix}
    try:
        await asyncio.to_thread(topology.start_servers)
        await topology.start_proxies()
        store = _StoreProcess(folder)
        store_port = await store.port()
        start_ns = time.monotonic_ns()
        stop_ns = start_ns + int(scenario.duration * 1e9)
        manager = {"prefix": prefix, "lease": scenario.lease, **scenario.manager}
        for w_index, workers in enumerate(scenario.workers):
            spec = {
                "seed": seed,
                "store_port": store_port,
                "stop_at_ns": stop_ns,
                "connect": topology.connect(proxied=workers.get("proxied", False)),
                "manager": manager,
                "client": {**scenario.client, **workers.get("client", {})},
                "groups": workers["groups"],
                # the starvation check counts from when a process listens (checker.py)
                "log_listening": "starvation_grants" in scenario.checks,
            }
            if scenario.topology == "single":  # a hand-off's adopting manager
                spec["adopt_url"] = topology.url(0, proxied=workers.get("adopt_proxied", False))
            for i in range(workers.get("count", 1)):
                fleet.spawn(f"w{w_index}p{i}", spec)
        nemesis = Nemesis(
            scenario.nemesis, topology, fleet, str(folder / "nemesis.jsonl"), seed, prefix
        )
        try:
            await nemesis.run(start_ns, stop_ns)
        finally:
            # heal whatever a failed fault left behind before the workers wind down
            for index in list(topology.paused):
                topology.resume(index)
            for proxy in topology.proxies.values():
                proxy.set_latency(0.0)
        killed = await fleet.wait(stop_ns + int(STOP_GRACE * 1e9))
        run.update(
            start_ns=start_ns,
            stop_ns=stop_ns,
            end_ns=time.monotonic_ns(),
            killed_at_end=killed,
            nemesis_failures=nemesis.failures,
            topology=topology.describe(),
        )
    finally:
        fleet.close()
        run["workers"] = fleet.describe()
        if store is not None:
            store.stop()
        await topology.stop()
        run["seconds"] = round(time.monotonic() - began, 1)
        (folder / "run.json").write_text(json.dumps(run, indent=1))
    result = checker.check(folder)
    result["seconds"] = run["seconds"]
    (folder / "result.json").write_text(json.dumps(result, indent=1))
    return result
