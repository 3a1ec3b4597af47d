"""Figures for the book: a shared style, attention heatmaps, per-head grids and
pre-rendered animations for the static pages.

Every figure in the chapters is drawn on a transparent background with mid-grey
text, so the same PNG reads well on a light and on a dark page.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
from matplotlib import animation
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from transformer_lib._checks import require_int

__all__ = [
    "BOOK_GREY", "BOOK_CMAP", "book_rcparams", "use_book_style", "relative_luminance", "contrast_ratio",
    "attention_heatmap", "head_grid", "animation_html",
]

BOOK_GREY = "#808080"
"""Mid grey: contrast ratio about 4:1 on white and about 4.5:1 on near-black."""

BOOK_CMAP = "viridis"
"""Perceptually uniform colormap whose ends stay visible on light and dark pages."""

_CYCLE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def book_rcparams() -> dict[str, Any]:
    """The rcParams applied by :func:`use_book_style`, as a plain dict. Chapter 1, through `use_book_style`."""
    g = BOOK_GREY
    return {
        # transparent backgrounds: the page colour shows through
        "figure.facecolor": "none",
        "figure.edgecolor": "none",
        "axes.facecolor": "none",
        "savefig.transparent": True,
        "savefig.facecolor": "none",
        "savefig.edgecolor": "none",
        # mid-grey ink that has contrast on both light and dark backgrounds
        "text.color": g,
        "axes.labelcolor": g,
        "axes.titlecolor": g,
        "axes.edgecolor": g,
        "xtick.color": g,
        "ytick.color": g,
        "xtick.labelcolor": g,
        "ytick.labelcolor": g,
        "grid.color": g,
        "grid.alpha": 0.3,
        "legend.frameon": False,
        "legend.labelcolor": g,
        "axes.prop_cycle": mpl.cycler(color=_CYCLE),
        "image.cmap": BOOK_CMAP,
        # sizes
        "figure.figsize": (6.0, 4.0),
        "figure.dpi": 100,
        "savefig.dpi": 100,
        "savefig.bbox": "tight",
        "font.size": 11,
        "axes.titlesize": 12,
        "axes.labelsize": 11,
        "xtick.labelsize": 10,
        "ytick.labelsize": 10,
        "legend.fontsize": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }


def use_book_style() -> None:
    """Set matplotlib defaults for the book (transparent, mid-grey, png inline).

    Changes global ``matplotlib.rcParams``; when running inside IPython/Jupyter it also
    selects PNG as the inline figure format. Chapter 1.
    """
    mpl.rcParams.update(book_rcparams())
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is installed with Jupyter
        return
    shell = get_ipython()
    if shell is None:
        return
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png")
    except Exception:  # pragma: no cover - non-inline frontends
        pass


def _to_numpy(weights: Any, name: str = "weights") -> np.ndarray:
    """Tensor or array-like -> float numpy array (detached, on CPU)."""
    if hasattr(weights, "detach"):
        weights = weights.detach().cpu().numpy()
    try:
        return np.asarray(weights, dtype=float)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected a tensor or array of numbers, got {type(weights).__name__}") from err


def relative_luminance(rgb: Any) -> np.ndarray:
    """WCAG relative luminance of sRGB colours with channels in [0, 1] (an alpha channel is
    ignored): ``(…, 3) -> (…)``. Library: no chapter names it."""
    c = np.asarray(rgb, dtype=float)[..., :3]
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return c @ np.array([0.2126, 0.7152, 0.0722])


def contrast_ratio(a: Any, b: Any) -> np.ndarray:
    """WCAG contrast ratio, from 1 to 21, of sRGB colours in [0, 1]: ``(…, 3), (…, 3) -> (…)``.

    3:1 is the level the book asks of its figures' ink on both the light and the dark page.
    Library: no chapter names it.
    """
    la, lb = relative_luminance(a), relative_luminance(b)
    return (np.maximum(la, lb) + 0.05) / (np.minimum(la, lb) + 0.05)


def _text_colour(rgba: Sequence[float]) -> str:
    """Black or white, whichever contrasts more with a cell colour (relative luminance)."""
    return "black" if relative_luminance(rgba) > 0.179 else "white"


def attention_heatmap(
    weights: Any,
    row_labels: Sequence[str],
    col_labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool = True,
    fmt: str = ".2f",
    cmap: str | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar: bool = True,
) -> Axes:
    """Draw an attention matrix ``(n, m)`` with query tokens as rows, key tokens as columns.

    ``weights`` is a torch tensor or numpy array of shape ``(n, m)``; ``row_labels`` has n
    entries, ``col_labels`` m entries (default: ``row_labels``). Cells are annotated with
    ``format(w, fmt)`` in black or white, whichever contrasts with the cell. Returns the Axes.
    Chapter 2.
    """
    w = _to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"weights: expected a 2-d array (n, m), got shape {tuple(w.shape)}")
    n, m = w.shape
    row_labels = [str(t) for t in row_labels]
    col_labels = row_labels if col_labels is None else [str(t) for t in col_labels]
    if len(row_labels) != n:
        raise ValueError(f"row_labels: expected {n} labels (weights has {n} rows), got {len(row_labels)}")
    if len(col_labels) != m:
        raise ValueError(f"col_labels: expected {m} labels (weights has {m} columns), got {len(col_labels)}")
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.55 * m, 0.8 + 0.5 * n))
    cmap_obj = mpl.colormaps[cmap or BOOK_CMAP]
    finite = w[np.isfinite(w)]
    lo = vmin if vmin is not None else (float(finite.min()) if finite.size else 0.0)
    hi = vmax if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    image = ax.imshow(w, cmap=cmap_obj, vmin=lo, vmax=hi, aspect="auto")
    ax.set_xticks(range(m), col_labels, rotation=45 if max(map(len, col_labels), default=0) > 3 else 0,
                  ha="right" if max(map(len, col_labels), default=0) > 3 else "center")
    ax.set_yticks(range(n), row_labels)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if title is not None:
        ax.set_title(title)
    if annotate:
        for i in range(n):
            for j in range(m):
                if not np.isfinite(w[i, j]):
                    continue
                colour = _text_colour(cmap_obj(image.norm(w[i, j])))
                ax.text(j, i, format(w[i, j], fmt), ha="center", va="center", color=colour, fontsize=9)
    if colorbar:
        cbar = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        cbar.outline.set_visible(False)
    return ax


def head_grid(
    weights: Any,
    labels: Sequence[str],
    titles: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    annotate: bool = False,
    fmt: str = ".2f",
    cmap: str | None = None,
    ncols: int | None = None,
    share_scale: bool = True,
) -> Figure:
    """Per-head attention heatmaps side by side for weights ``(h, n, m)``.

    ``labels`` names the n query tokens (and the keys unless ``col_labels`` is given);
    ``titles`` has one entry per head (default ``"head 0"``, …). With ``share_scale`` all
    panels use one colour scale, from the smaller of 0 and the global minimum to the global
    maximum, and one colorbar. Returns the Figure. Chapter 5.
    """
    w = _to_numpy(weights)
    if w.ndim != 3:
        raise ValueError(f"weights: expected a 3-d array (h, n, m), got shape {tuple(w.shape)}")
    h, n, m = w.shape
    if len(labels) != n:
        raise ValueError(f"labels: expected {n} labels (weights has n={n} queries), got {len(labels)}")
    if col_labels is not None and len(col_labels) != m:
        raise ValueError(f"col_labels: expected {m} labels (weights has m={m} keys), got {len(col_labels)}")
    titles = [f"head {i}" for i in range(h)] if titles is None else list(titles)
    if len(titles) != h:
        raise ValueError(f"titles: expected {h} titles (one per head), got {len(titles)}")
    ncols = min(h, 4) if ncols is None else require_int("ncols", ncols)
    nrows = -(-h // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(0.6 + (0.45 * m + 0.8) * ncols, (0.45 * n + 0.9) * nrows),
                             squeeze=False, constrained_layout=True)
    finite = w[np.isfinite(w)]
    vmax = float(finite.max()) if (share_scale and finite.size) else None
    vmin = min(0.0, float(finite.min())) if (share_scale and finite.size) else None
    for k, ax in enumerate(axes.flat):
        if k >= h:
            ax.set_visible(False)
            continue
        attention_heatmap(w[k], labels, col_labels, ax=ax, title=titles[k], annotate=annotate, fmt=fmt,
                          cmap=cmap, vmin=vmin, vmax=vmax, colorbar=not share_scale)
        if k % ncols:
            ax.set_ylabel("")
            ax.set_yticklabels([])
    if share_scale and h:
        norm = mpl.colors.Normalize(vmin=vmin, vmax=vmax)
        sm = mpl.cm.ScalarMappable(norm=norm, cmap=mpl.colormaps[cmap or BOOK_CMAP])
        cbar = fig.colorbar(sm, ax=axes.ravel().tolist(), fraction=0.03, pad=0.02)
        cbar.outline.set_visible(False)
    return fig


class _TransparentHTMLWriter(animation.HTMLWriter):
    """Matplotlib's HTML writer, allowed to keep the figure's transparent background."""

    def _supports_transparency(self) -> bool:
        return True


def animation_html(anim: animation.Animation, fps: int = 2, default_mode: str = "loop") -> str:
    """A pre-rendered, scrubbable animation as self-contained HTML for the static book.

    Like ``anim.to_jshtml()``, but the frames keep their transparent background (readable
    in dark mode) and no stylesheet is fetched from a CDN (the page works offline; the
    book theme draws the buttons' icons). Chapter 2.
    """
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "animation.html")
        writer = _TransparentHTMLWriter(fps=fps, embed_frames=True, default_mode=default_mode)
        anim.save(str(path), writer=writer, savefig_kwargs={"transparent": True})
        html = path.read_text()
    return re.sub(r'<link rel="stylesheet"[^>]*font-awesome[^>]*>\s*', "", html)
