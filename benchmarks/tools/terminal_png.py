"""A terminal screenshot for the docs, drawn from a command's real output.

``python -m benchmarks.tools.terminal_png OUTPUT.txt IMAGE.png [--command TEXT]``

Draws the text as a terminal would show it (a light monospace font on a dark window, the
command line first), with matplotlib (the ``bench`` extra). docs/cli.md's picture of
``aiolock top`` is one: the text is the command's output in a real run, as captured.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

#: points per character cell of the font, and the cell's height in points
FONT_SIZE = 9.0
CELL_WIDTH = 0.61 * FONT_SIZE
LINE_HEIGHT = 1.45 * FONT_SIZE


def draw(lines: list[str], image: Path, command: str | None) -> None:
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    shown = ([f"$ {command}"] if command else []) + lines
    columns = max(len(line) for line in shown) + 6
    width_in = columns * CELL_WIDTH / 72
    height_in = (len(shown) + 2) * LINE_HEIGHT / 72
    fig = plt.figure(figsize=(width_in, height_in), dpi=144)
    fig.patch.set_facecolor("#1e1e1e")
    for row, line in enumerate(shown):
        colour = "#8ae234" if command and row == 0 else "#e0e0e0"
        if row == (1 if command else 0) + 1:
            colour = "#fce94f"  # the table's header
        fig.text(
            2 * CELL_WIDTH / 72 / width_in,
            1 - (row + 1.2) * LINE_HEIGHT / 72 / height_in,
            line,
            family="DejaVu Sans Mono",
            size=FONT_SIZE,
            color=colour,
            va="baseline",
        )
    fig.savefig(image, facecolor=fig.get_facecolor())
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the captured text")
    parser.add_argument("image", type=Path, help="the PNG to write")
    parser.add_argument("--command", help="the command line shown above the output")
    args = parser.parse_args(argv)
    lines = args.output.read_text().rstrip("\n").splitlines()
    draw(lines, args.image, args.command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
