"""Tests for transformer_lib.viz."""

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from transformer_lib import viz  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_rc():
    with matplotlib.rc_context():
        yield
    plt.close("all")


def _contrast(c1, c2):
    return float(viz.contrast_ratio(to_rgba(c1), to_rgba(c2)))


def test_contrast_ratio_follows_wcag():
    assert _contrast("black", "white") == pytest.approx(21.0)
    assert _contrast("#777777", "#777777") == pytest.approx(1.0)
    assert viz.contrast_ratio([[0, 0, 0], [1, 1, 1]], [1, 1, 1]) == pytest.approx([21.0, 1.0])
    # mid grey #808080: luminance 0.2159, so about 3.95:1 on white
    assert _contrast(viz.BOOK_GREY, "white") == pytest.approx(1.05 / (0.21586 + 0.05), rel=1e-3)


def test_book_style_is_transparent_and_grey():
    viz.use_book_style()
    rc = matplotlib.rcParams
    assert rc["savefig.transparent"] is True
    assert to_rgba(rc["figure.facecolor"])[3] == 0
    assert to_rgba(rc["axes.facecolor"])[3] == 0
    for key in ("text.color", "axes.labelcolor", "axes.edgecolor", "xtick.color", "ytick.color"):
        assert _contrast(rc[key], "white") >= 3.0, key
        assert _contrast(rc[key], "#1e1e1e") >= 3.0, key
    assert rc["image.cmap"] in ("viridis", "magma", "cividis", "inferno")
    assert 72 <= rc["figure.dpi"] <= 150


def test_saved_png_has_transparent_background():
    viz.use_book_style()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    buf.seek(0)
    img = plt.imread(buf)
    assert img.shape[-1] == 4 and img[0, 0, 3] == 0


def test_attention_heatmap_labels_and_annotations():
    w = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    ax = viz.attention_heatmap(w, ["a", "b", "c"], ["w", "x", "y", "z"], title="t")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w", "x", "y", "z"]
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query" and ax.get_title() == "t"
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 12 and texts[0] == format(float(w[0, 0]), ".2f")
    assert len(ax.figure.axes) == 2  # heatmap + colorbar


def test_annotation_colour_contrasts_with_cell():
    w = np.array([[0.0, 1.0]])
    ax = viz.attention_heatmap(w, ["q"], ["lo", "hi"], cmap="viridis")
    colours = [t.get_color() for t in ax.texts]
    assert colours == ["white", "black"]  # dark purple cell, bright yellow cell


def _wcag_luminance(rgba):
    """WCAG 2 relative luminance, written out here (independent of viz.relative_luminance)."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgba[:3]]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


@pytest.mark.parametrize("cmap", ["gray", "viridis", "magma"])
def test_every_annotation_takes_the_higher_contrast_ink(cmap):
    """Across 41 cell colours the annotation is the ink (black or white) of higher WCAG contrast
    with its cell; cells where both inks are within 3 % of each other may go either way."""
    w = np.linspace(0.0, 1.0, 41)[None, :]
    ax = viz.attention_heatmap(w, ["q"], [str(i) for i in range(41)], cmap=cmap, vmin=0.0, vmax=1.0)
    image = ax.images[0]
    checked = 0
    for text, value in zip(ax.texts, w[0]):
        lum = _wcag_luminance(image.cmap(image.norm(value)))
        on_black, on_white = (lum + 0.05) / 0.05, 1.05 / (lum + 0.05)
        if abs(on_black / on_white - 1) < 0.03:
            continue
        assert text.get_color() == ("black" if on_black > on_white else "white"), (cmap, value)
        checked += 1
    assert checked >= 38


def test_attention_heatmap_accepts_numpy_and_existing_axes():
    fig, ax = plt.subplots()
    out = viz.attention_heatmap(np.eye(2), ["a", "b"], ax=ax, annotate=False)
    assert out is ax and not ax.texts


def test_attention_heatmap_validates_labels():
    with pytest.raises(ValueError, match="row_labels"):
        viz.attention_heatmap(np.eye(3), ["a", "b"])
    with pytest.raises(ValueError, match="col_labels"):
        viz.attention_heatmap(np.ones((2, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="weights"):
        viz.attention_heatmap(np.ones((2, 2, 2)), ["a", "b"])


def test_head_grid():
    w = torch.rand(3, 2, 2)
    fig = viz.head_grid(w, ["a", "b"], titles=["h1", "h2", "h3"])
    heat = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in heat] == ["h1", "h2", "h3"]
    # one shared scale from 0 to the global maximum (weights here lie in [0.2, 0.9])
    w2 = torch.tensor([[[0.2, 0.8], [0.5, 0.5]], [[0.3, 0.7], [0.9, 0.1 + 0.2]]])
    fig2 = viz.head_grid(w2, ["a", "b"])
    limits = [ax.images[0].get_clim() for ax in fig2.axes if ax.images]
    assert len(limits) == 2 and all(lim == (0.0, pytest.approx(0.9)) for lim in limits)
    with pytest.raises(ValueError, match="labels"):
        viz.head_grid(w, ["a"])
    with pytest.raises(ValueError, match="titles"):
        viz.head_grid(w, ["a", "b"], titles=["x"])
    with pytest.raises(ValueError, match="weights"):
        viz.head_grid(w[0], ["a", "b"])


def test_animation_html_is_offline_and_transparent():
    import base64
    import re

    from matplotlib.animation import FuncAnimation
    from PIL import Image

    viz.use_book_style()
    fig, ax = plt.subplots(figsize=(2, 1.5), dpi=50)
    (line,) = ax.plot([0, 1], [0, 0])
    anim = FuncAnimation(fig, lambda i: line.set_ydata([0, i]), frames=3)
    html = viz.animation_html(anim, fps=2)
    plt.close(fig)
    assert "font-awesome" not in html and "cdn" not in html.lower()
    frames = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=\\\n]+)", html)
    frames = [f.replace("\\\n", "") for f in frames]
    assert len(frames) == 3, f"expected 3 embedded frames, got {len(frames)}"
    corner = Image.open(io.BytesIO(base64.b64decode(frames[0]))).convert("RGBA").getpixel((0, 0))
    assert corner[3] == 0, f"frame background is not transparent: corner pixel {corner}"
