"""The Grafana dashboard (docs/dashboards/aiolock-grafana.json) queries what the exporter
emits: every metric a PromQL expression names is in a real scrape of
:class:`~aiolock.contrib.prometheus.PrometheusObserver`, with every label the expression
uses on it (in a selector, a ``by``/``without`` clause or an ``on``/``ignoring`` one).

The expressions are read by a small PromQL reader (:func:`uses`), enough for dashboard
queries: selectors, range vectors, functions, aggregations, binary operators. What it
cannot read it refuses, so a query it does not understand fails the test instead of
passing unchecked.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

import aiolock
from aiolock.contrib.prometheus import PrometheusObserver
from tests._support.helpers import eventually
from tests._support.paths import REPO_ROOT

DASHBOARD = REPO_ROOT / "docs" / "dashboards" / "aiolock-grafana.json"

#: metric (a sample name of the scrape) -> the labels a query needs on its series
Uses = dict[str, set[str]]
#: sample name -> the label names of each of its samples
Scrape = dict[str, list[frozenset[str]]]

AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
    | {"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)
_FUNCTION_NAMES = """
    abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min
    count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv exp
    floor histogram_avg histogram_count histogram_fraction histogram_quantile
    histogram_stddev histogram_stdvar histogram_sum hour idelta increase irate label_join
    label_replace last_over_time ln log10 log2 max_over_time min_over_time minute month
    predict_linear present_over_time quantile_over_time rate resets round scalar sgn sort
    sort_desc sqrt stddev_over_time stdvar_over_time sum_over_time time timestamp vector
    year
"""
FUNCTIONS = frozenset(_FUNCTION_NAMES.split())
#: words that are not metrics where an operand may stand
CONSTANTS = frozenset({"inf", "nan"})
BINARY = frozenset({"+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<="})
BINARY_WORDS = frozenset({"and", "or", "unless"})
MATCH_OPERATORS = frozenset({"=", "!=", "=~", "!~"})


class PromQLError(ValueError):
    """An expression the reader cannot read (or a query it does not know)."""


_TOKEN = re.compile(
    r"""(?P<space>\s+)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<range>\[[^\]]*\])
    | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?(?:ms|[smhdwy])*)
    | (?P<word>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^=<>(){},])""",
    re.X,
)


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    """(kind, text) of each token: string, range (``[5m]``, ``[$__rate_interval]``, a
    subquery's ``[1h:1m]``), number (or duration), word, op."""
    at = 0
    while at < len(expr):
        match = _TOKEN.match(expr, at)
        if match is None:
            raise PromQLError(f"cannot read {expr[at:]!r} in {expr!r}")
        at = match.end()
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            yield kind, match.group()


class _Reader:
    """Reads one PromQL expression; :attr:`uses` then has each metric it names and the
    labels the expression needs on that metric's series."""

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.tokens = list(_tokens(expr))
        self.at = 0
        self.uses: Uses = {}

    def read(self) -> Uses:
        self.expression()
        if self.at != len(self.tokens):
            self.fail("unexpected")
        return self.uses

    def fail(self, what: str) -> None:
        got = self.tokens[self.at][1] if self.at < len(self.tokens) else "the end"
        raise PromQLError(f"{what} {got!r} in {self.expr!r}")

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token[0] == "end":
            self.fail("expected more than")
        self.at += 1
        return token

    def expect(self, text: str) -> None:
        if self.peek()[1] != text:
            self.fail(f"expected {text!r}, not")
        self.at += 1

    def need(self, metrics: set[str], labels: list[str]) -> None:
        for metric in metrics:
            self.uses.setdefault(metric, set()).update(labels)

    def expression(self) -> set[str]:
        """Operands joined by binary operators. Precedence is not needed: the labels of
        an ``on``/``ignoring``/``group_*`` clause are asked of every metric of the
        expression it stands in (stricter than PromQL, never looser)."""
        metrics = self.operand()
        matching: list[str] = []
        while self.peek()[1] in BINARY or self.peek() in {("word", w) for w in BINARY_WORDS}:
            self.take()
            if self.peek() == ("word", "bool"):
                self.take()
            if self.peek() in {("word", "on"), ("word", "ignoring")}:
                self.take()
                matching += self.labels()
            if self.peek() in {("word", "group_left"), ("word", "group_right")}:
                self.take()
                if self.peek()[1] == "(":
                    matching += self.labels()
            metrics |= self.operand()
        self.need(metrics, matching)
        return metrics

    def operand(self) -> set[str]:
        kind, text = self.take()
        metrics: set[str] = set()
        if text == "(":
            metrics = self.expression()
            self.expect(")")
        elif text in {"-", "+"}:
            metrics = self.operand()
        elif kind in {"number", "string"} or (kind == "word" and text in CONSTANTS):
            pass
        elif kind == "word" and text in AGGREGATIONS:
            metrics = self.aggregation()
        elif kind == "word" and self.peek()[1] == "(":
            if text not in FUNCTIONS:
                raise PromQLError(f"unknown function {text!r} in {self.expr!r}")
            metrics = self.arguments()
        elif kind == "word":
            metrics = {text}
            self.need(metrics, self.matchers() if self.peek()[1] == "{" else [])
        else:
            self.at -= 1
            self.fail("expected an operand, not")
        while True:  # a range, a subquery's range, an offset
            if self.peek()[0] == "range":
                self.take()
            elif self.peek() == ("word", "offset"):
                self.take()
                if self.peek()[1] == "-":
                    self.take()
                if self.take()[0] != "number":
                    self.fail("expected a duration after offset, not")
            else:
                return metrics

    def aggregation(self) -> set[str]:
        """``sum by (a, b) (expr)`` or ``sum (expr) by (a, b)``; ``topk(10, expr)``."""
        grouping: list[str] = []
        if self.peek() in {("word", "by"), ("word", "without")}:
            self.take()
            grouping = self.labels()
        metrics = self.arguments()
        if self.peek() in {("word", "by"), ("word", "without")}:
            self.take()
            grouping = self.labels()
        self.need(metrics, grouping)
        return metrics

    def arguments(self) -> set[str]:
        self.expect("(")
        metrics: set[str] = set()
        while self.peek()[1] != ")":
            metrics |= self.expression()
            if self.peek()[1] != ",":
                break
            self.take()
        self.expect(")")
        return metrics

    def labels(self) -> list[str]:
        """``(a, b)`` after by, without, on, ignoring, group_left, group_right."""
        self.expect("(")
        labels: list[str] = []
        while self.peek()[1] != ")":
            kind, label = self.take()
            if kind != "word":
                self.at -= 1
                self.fail("expected a label, not")
            labels.append(label)
            if self.peek()[1] != ",":
                break
            self.take()
        self.expect(")")
        return labels

    def matchers(self) -> list[str]:
        """``{a="x", b=~"y"}``: the label names."""
        self.expect("{")
        labels: list[str] = []
        while self.peek()[1] != "}":
            kind, label = self.take()
            if kind != "word" or self.take()[1] not in MATCH_OPERATORS:
                self.at -= 1
                self.fail("expected label, operator and string, near")
            if self.take()[0] != "string":
                self.at -= 1
                self.fail("expected a string, not")
            labels.append(label)
            if self.peek()[1] != ",":
                break
            self.take()
        self.expect("}")
        return labels


def uses(expr: str) -> Uses:
    """The metrics *expr* names, each with the labels it needs on them."""
    return _Reader(expr).read()


_LABEL_VALUES = re.compile(r"\s*label_values\((?P<selector>.+),\s*(?P<label>\w+)\s*\)\s*")


def variable_uses(query: str) -> Uses:
    """A template variable's query: ``label_values(selector, label)`` (Grafana's, not
    PromQL) or a PromQL ``query_result(expr)``."""
    match = _LABEL_VALUES.fullmatch(query)
    if match is not None:
        found = uses(match["selector"])
        if len(found) != 1:
            raise PromQLError(f"label_values of one metric expected: {query!r}")
        for labels in found.values():
            labels.add(match["label"])
        return found
    match = re.fullmatch(r"\s*query_result\((?P<expr>.+)\)\s*", query)
    if match is None:
        raise PromQLError(f"a variable query this test cannot read: {query!r}")
    return uses(match["expr"])


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, Uses]]:
    """(where, uses) of every query of *dashboard*: its panels' targets (rows' nested
    panels too) and its template variables of type ``query``."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", uses(target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            yield f"variable {variable['name']!r}", variable_uses(text)


def parse_scrape(text: str) -> Scrape:
    """The exposition format, as each sample name with its samples' label names."""
    scrape: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scrape.setdefault(sample.name, []).append(frozenset(sample.labels))
    return scrape


def problems(where: str, used: Uses, scrape: Scrape) -> list[str]:
    """What *used* asks of the scrape that it lacks: a metric, or a label of a series."""
    found = []
    for metric, labels in sorted(used.items()):
        series = scrape.get(metric)
        if not series:
            found.append(f"{where}: {metric} is not emitted")
            continue
        for missing in sorted({label for names in series for label in labels - names}):
            found.append(f"{where}: {metric} has no label {missing!r}")
    return found


def load_dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text("utf-8"))
    return loaded


# -- the reader and the checker, on expressions written to be wrong -------------------------

#: A scrape of a few families, as prometheus_client writes them.
SMALL_SCRAPE = """\
# HELP aiolock_acquisitions_total Acquires.
# TYPE aiolock_acquisitions_total counter
aiolock_acquisitions_total{kind="lock",result="acquired"} 1.0
# HELP aiolock_wait_seconds Waits.
# TYPE aiolock_wait_seconds histogram
aiolock_wait_seconds_bucket{kind="lock",le="0.1",result="acquired"} 1.0
aiolock_wait_seconds_bucket{kind="lock",le="+Inf",result="acquired"} 1.0
aiolock_wait_seconds_count{kind="lock",result="acquired"} 1.0
aiolock_wait_seconds_sum{kind="lock",result="acquired"} 0.01
# HELP aiolock_waiters Waiting.
# TYPE aiolock_waiters gauge
aiolock_waiters{prefix="p"} 0.0
"""


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("aiolock_waiters", {"aiolock_waiters": set()}),
        (
            "histogram_quantile(0.99, sum by (le, kind) (rate(aiolock_wait_seconds_bucket"
            '{kind=~"$kind", result="acquired"}[$__rate_interval])))',
            {"aiolock_wait_seconds_bucket": {"le", "kind", "result"}},
        ),
        (
            "topk(10, sum(a{x='1'} + b offset 5m) without (y)) / on (z) group_left (w) c[1h:1m]",
            {"a": {"x", "y", "z", "w"}, "b": {"y", "z", "w"}, "c": {"z", "w"}},
        ),
        ("max(-rate(a[5m])) by (k) > bool 0 or vector(1)", {"a": {"k"}}),
    ],
)
def test_the_reader_finds_metrics_and_labels(expr: str, expected: Uses) -> None:
    assert uses(expr) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "rat(aiolock_waiters[5m])",  # a misspelled function
        '{__name__="aiolock_waiters"}',  # a selector without a metric: not read
        "sum by (prefix (aiolock_waiters)",
        "aiolock_waiters{prefix=p}",
        "aiolock_waiters[$__interval",
        "sum(aiolock_waiters) $x",
    ],
)
def test_the_reader_refuses_what_it_cannot_read(expr: str) -> None:
    with pytest.raises(PromQLError):
        uses(expr)


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("rate(aiolock_acquisition_total[5m])", "aiolock_acquisition_total is not emitted"),
        # a histogram is queried by its series, not its family's name
        ("rate(aiolock_wait_seconds[5m])", "aiolock_wait_seconds is not emitted"),
        # the event counters carry no prefix
        (
            'sum by (prefix) (rate(aiolock_acquisitions_total{kind="lock"}[5m]))',
            "aiolock_acquisitions_total has no label 'prefix'",
        ),
        ('aiolock_waiters{kind="lock"}', "aiolock_waiters has no label 'kind'"),
        # le is a label of the buckets only
        (
            "sum by (le) (aiolock_wait_seconds_count)",
            "aiolock_wait_seconds_count has no label 'le'",
        ),
        (
            "aiolock_waiters / ignoring (kind) aiolock_acquisitions_total",
            "aiolock_waiters has no label 'kind'",
        ),
    ],
)
def test_the_checker_catches_a_wrong_query(expr: str, problem: str) -> None:
    assert problems("q", uses(expr), parse_scrape(SMALL_SCRAPE)) == [f"q: {problem}"]


def test_the_checker_passes_right_queries_and_fails_the_dashboard_on_a_small_scrape() -> None:
    scrape = parse_scrape(SMALL_SCRAPE)
    for expr in (
        'sum by (kind, result) (rate(aiolock_acquisitions_total{kind=~"$kind"}[5m]))',
        "histogram_quantile(0.5, sum by (le, kind) (rate(aiolock_wait_seconds_bucket[5m])))",
        'sum by (prefix) (aiolock_waiters{prefix=~"$prefix"})',
    ):
        assert problems("q", uses(expr), scrape) == []
    # The dashboard asks for more than these few families: the check does fail.
    found = [
        p
        for where, used in dashboard_queries(load_dashboard())
        for p in problems(where, used, scrape)
    ]
    assert any("aiolock_name_wait_seconds is not emitted" in p for p in found), found
    assert any("aiolock_held is not emitted" in p for p in found), found


# -- the dashboard against a real scrape ----------------------------------------------------


def test_the_dashboard_is_importable() -> None:
    """One Prometheus data source variable every panel and query uses, unique panel ids,
    and the template variables the queries filter on."""
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"prefix", "kind"} <= set(variables)
    source = {"type": "prometheus", "uid": "${datasource}"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    charts = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert len(charts) >= 15
    for panel in charts:
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
            assert target["expr"].strip(), panel["title"]
    for name in ("prefix", "kind"):
        assert variables[name]["datasource"] == source
    text = (REPO_ROOT / "docs" / "observability.md").read_text("utf-8")
    assert "(dashboards/aiolock-grafana.json)" in text  # linked from the docs


async def test_every_query_names_a_metric_the_exporter_emits_with_its_labels(
    redis: Redis, prefix: str
) -> None:
    """Contention, a timeout, a renewal round and a loss, so every family has samples (the
    per-name gauges included), then a scrape while the manager is open."""
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    async with aiolock.LockManager(redis, prefix=prefix, observers=[observer]) as locks:

        async def take(name: str) -> None:
            async with locks.lock(name):
                pass

        async with locks.lock("hot"):
            waiting = [asyncio.create_task(take("hot")) for _ in range(3)]
            await eventually(lambda: locks.statistics().hub.waiters == 3, what="the waiters")
            with pytest.raises(aiolock.LockTimeoutError):
                await asyncio.create_task(locks.lock("hot").acquire(timeout=0.05))
            assert await locks._open_engine().watchdog.renew_all()
        await asyncio.gather(*waiting)
        lost = locks.lock("lost")
        with pytest.raises(aiolock.LockLostError):
            async with lost:
                await lost.force_release()
                await asyncio.sleep(30)  # the loss, not the body's end, must end it
        scrape = parse_scrape(generate_latest(registry).decode())

    assert any(labels >= {"prefix", "kind", "name"} for labels in scrape["aiolock_name_waits"])
    queries = list(dashboard_queries(load_dashboard()))
    named = {metric for _, used in queries for metric in used}
    assert len(named) >= 20, sorted(named)  # the reader found the queries' metrics
    found = [problem for where, used in queries for problem in problems(where, used, scrape)]
    assert not found, "\n".join(found)
