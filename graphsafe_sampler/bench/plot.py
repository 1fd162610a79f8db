"""`graphsafe-sampler bench --plot FILE.png`: time per call against rows, one line per provider.

matplotlib is an optional extra (`pip install "graphsafe-sampler[plot]"`); it is imported
only here, and only when a plot is asked for.
"""

from __future__ import annotations

import os
from collections import defaultdict

from graphsafe_sampler.bench.results import Results


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise PlotUnavailable, saying how to install it, when matplotlib does not import."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'graphsafe-sampler[plot]' "
            "(or pip install 'matplotlib>=3.7')"
        ) from None


def plot_results(results: Results, path: str | os.PathLike[str]) -> None:
    """Draw µs per call (median, p20-p80 band) against rows: one panel per stage, vocab and
    dtype, one line per provider; writes the figure to `path` (format from its suffix)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    if not results.cases:
        raise ValueError("no cases to plot")
    panels: dict[tuple[str, int, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for case in sorted(results.cases, key=lambda c: c.rows):
        panels[(case.stage, case.vocab, case.dtype)][case.provider].append(case)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False, layout="constrained"
    )
    for ax, ((stage, vocab, dtype), providers) in zip(axes[0], panels.items(), strict=True):
        for provider, cases in providers.items():
            rows = [c.rows for c in cases]
            (line,) = ax.plot(rows, [c.median_us for c in cases], marker="o", label=provider)
            ax.fill_between(
                rows,
                [c.p20_us for c in cases],
                [c.p80_us for c in cases],
                color=line.get_color(),
                alpha=0.2,
            )
        ax.set_xscale("log", base=2)
        all_rows = sorted({c.rows for cases in providers.values() for c in cases})
        ax.set_xticks(all_rows, [str(r) for r in all_rows])  # 1 8 64 256, not 2^k
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("rows")
        ax.set_ylabel("µs per step" if stage == "step" else "µs per call")
        ax.set_title(f"{stage}, vocab {vocab:,}, {dtype}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    device = results.context.get("device_name", "?")
    fig.suptitle(f"graphsafe-sampler bench on {device} (median, p20-p80 band)")
    fig.savefig(path, dpi=120)
    plt.close(fig)
