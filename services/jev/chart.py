"""Probabilities as a small horizontal bar chart for a terminal."""

from __future__ import annotations

_EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(p: float, width: int, unicode: bool = True) -> str:
    """A bar of p * width cells (eighth-cell resolution in unicode, '#' otherwise), padded to width."""
    p = min(max(p, 0.0), 1.0)
    if not unicode:
        return ("#" * round(p * width)).ljust(width)
    eighths = round(p * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


def chart(
    rows: list[tuple[str, float]],
    *,
    mark: str | None = None,
    width: int = 30,
    unicode: bool = True,
    max_label: int = 40,
) -> str:
    """One line per (label, p): label, bar, p to 3 decimals; the row named `mark` gets a '>'."""
    labels = [label if len(label) <= max_label else label[: max_label - 1] + "…" for label, _ in rows]
    pad = max((len(label) for label in labels), default=0)
    lines = []
    for label, (name, p) in zip(labels, rows):
        pointer = ">" if name == mark else " "
        lines.append(f"{pointer} {label.ljust(pad)}  {bar(p, width, unicode)}  {p:.3f}")
    return "\n".join(lines)
