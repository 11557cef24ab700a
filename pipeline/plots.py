"""PNG figures the stages render for the Prefect UI (matplotlib, headless)."""

from collections.abc import Mapping
from pathlib import Path


def share_bars(path: Path, title: str, shares: Mapping[str, Mapping[str, float]], xlabel: str) -> Path:
    """Horizontal stacked bars: one bar per group (a domain, a pool), one segment per part.

    `shares` maps group -> {part: share}; parts keep the order they first appear in.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(shares)
    parts = list(dict.fromkeys(part for values in shares.values() for part in values))
    figure, axes = plt.subplots(figsize=(8, 0.6 * len(groups) + 1.6))
    left = [0.0] * len(groups)
    for part in parts:
        widths = [shares[group].get(part, 0.0) for group in groups]
        axes.barh(groups, widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths)]
    axes.set_xlabel(xlabel)
    axes.set_title(title)
    axes.invert_yaxis()
    axes.legend(
        loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=min(len(parts), 7), fontsize="small", frameon=False
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(path, dpi=100)
    finally:  # a failed write (a full disk) must not leave the figure open in a long-lived process
        plt.close(figure)
    return path
