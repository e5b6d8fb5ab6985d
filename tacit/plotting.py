"""matplotlib for --plot, imported only when a plot is asked for: it is the optional `bench`
extra, and `tacit bench`, `tacit predict --validate` and `tacit eval plot-kld` all draw with it."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display), or a ValueError saying how
    to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install -e '.[bench]'") from None
    return plt


def require_plotting(path: str | None) -> None:
    """Refuse --plot before a benchmark runs, not after it (matplotlib missing once cost a whole
    run's minutes before the error)."""
    if path is not None:
        pyplot()
