"""mkdocs hooks: bring the benchmark results into the documentation site.

The benchmark harness writes ``benchmarks/results/RESULTS.md`` and its plots; the site
publishes them as ``benchmarks/results.md`` and ``benchmarks/*.png`` without copying them
into ``docs/`` (a copy would go stale). The comparison page links to both, so a missing
file fails the strict build here, with a message that says which one and why.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
PLOTS = ("handoff_latency.png", "throughput.png")


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Make `mkdocs serve` rebuild when the benchmark results change."""
    config.watch.append(str(RESULTS))
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add RESULTS.md and the plots to the site, under ``benchmarks/``."""
    wanted = {"benchmarks/results.md": RESULTS / "RESULTS.md"}
    wanted.update({f"benchmarks/{plot}": RESULTS / plot for plot in PLOTS})
    for src_uri, path in wanted.items():
        if not path.is_file():
            raise PluginError(
                f"{path} is missing: the documentation publishes it as {src_uri}. "
                "Restore it from git, or run `python -m benchmarks` to produce it."
            )
        files.append(File.generated(config, src_uri, abs_src_path=str(path)))
    return files
