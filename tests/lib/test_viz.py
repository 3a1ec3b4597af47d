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


# --- the style: what "transparent, mid-grey, readable on light and dark pages" implies ----------

def _png_rgba(fig, **kwargs):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **kwargs)
    buf.seek(0)
    return plt.imread(buf)


def test_book_style_saves_transparent_corners_with_tight_bbox_and_no_legend_box():
    """A tight-cropped PNG keeps all four corners fully transparent (no figure or axes face is
    painted), the top and right spines are hidden, and a legend draws no frame around its
    entries (a box that would sit on the page in both modes)."""
    viz.use_book_style()
    assert matplotlib.rcParams["savefig.bbox"] == "tight"
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1], label="a long legend label")
    legend = ax.legend(loc="upper left")
    img = _png_rgba(fig)
    assert img.shape[-1] == 4
    for corner in (img[0, 0], img[0, -1], img[-1, 0], img[-1, -1]):
        assert corner[3] == 0, corner
    assert not ax.spines["top"].get_visible() and not ax.spines["right"].get_visible()
    assert ax.spines["left"].get_visible() and ax.spines["bottom"].get_visible()
    assert legend.get_frame_on() is False


def test_book_style_transparent_colours_are_none():
    viz.use_book_style()
    rc = matplotlib.rcParams
    for key in ("figure.facecolor", "figure.edgecolor", "axes.facecolor", "savefig.facecolor",
                "savefig.edgecolor"):
        assert to_rgba(rc[key])[3] == 0, key


def test_book_figure_specification():
    """The book's figure specification (a design choice, pinned so that a change is deliberate):
    6 x 4 in at 100 dpi, body font 11 pt, titles 12, axis labels 11, ticks and legend 10."""
    spec = {"figure.figsize": [6.0, 4.0], "figure.dpi": 100, "savefig.dpi": 100, "font.size": 11,
            "axes.titlesize": 12, "axes.labelsize": 11, "xtick.labelsize": 10, "ytick.labelsize": 10,
            "legend.fontsize": 10}
    viz.use_book_style()
    for key, value in spec.items():
        assert matplotlib.rcParams[key] == value, key
    fig = plt.figure()
    assert tuple(fig.get_size_inches() * fig.dpi) == (600, 400)


def test_use_book_style_selects_png_inside_ipython():
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    shell = InteractiveShell.instance()
    try:
        png = shell.display_formatter.formatters["image/png"]
        png.pop(Figure, None)
        viz.use_book_style()
        assert Figure in png.type_printers, "no PNG formatter registered for Figure"
    finally:
        InteractiveShell.clear_instance()


# --- luminance and ink ----------------------------------------------------------------------------

def test_relative_luminance_matches_wcag_on_dark_colours_and_at_the_knee():
    """Dark channels (<= 0.04045) take the linear branch c / 12.92; the knee itself too."""
    for rgb in ([0.03, 0.02, 0.01], [0.04045, 0.0, 0.04045], [0.5, 0.04045, 0.9], [0.001, 0.2, 0.04]):
        assert float(viz.relative_luminance(rgb)) == pytest.approx(_wcag_luminance(rgb), rel=1e-12, abs=0)
    # integer input: black and white
    assert viz.relative_luminance([[0, 0, 0], [1, 1, 1]]) == pytest.approx([0.0, 1.0], abs=1e-12)


def test_relative_luminance_computes_in_float64_for_low_precision_colours():
    """A float32 or float16 colour (an image read as float32, say) is computed in float64:
    the luminance of its exact values, not one rounded to single or half precision."""
    for dtype in (np.float32, np.float16):
        rgb = np.array([[0.5, 0.3, 0.02], [0.9, 0.1, 0.7]], dtype=dtype)
        expected = [_wcag_luminance([float(c) for c in row]) for row in rgb]
        out = viz.relative_luminance(rgb)
        assert out.dtype == np.float64
        assert out == pytest.approx(expected, rel=1e-12, abs=0)


def test_ink_at_luminance_0179_is_white():
    """At luminance 0.179 white contrasts slightly more than black (4.585 vs 4.58:1); the ink
    changes to black only above it. The grey below has luminance 0.179 to float precision."""
    grey = 0.4601589182046939
    lum = _wcag_luminance([grey] * 3)
    assert lum == pytest.approx(0.179, abs=1e-15)
    assert 1.05 / (lum + 0.05) > (lum + 0.05) / 0.05
    assert viz._text_colour((grey, grey, grey, 1.0)) == "white"
    assert viz._text_colour((0.47, 0.47, 0.47, 1.0)) == "black"


# --- attention_heatmap ------------------------------------------------------------------------

def test_to_numpy_error_names_weights_by_default():
    with pytest.raises(TypeError, match=r"^weights: expected a tensor or array of numbers, got dict$"):
        viz._to_numpy({"a": 1})
    with pytest.raises(TypeError, match=r"^scores: expected a tensor or array of numbers, got str$"):
        viz._to_numpy("abc", name="scores")
    out = viz._to_numpy(torch.tensor([[1, 2]], requires_grad=False))
    assert out.dtype == np.float64 and out.tolist() == [[1.0, 2.0]]
    out = viz._to_numpy(torch.ones(2, requires_grad=True) * 3)  # a tensor that needs detaching
    assert out.dtype == np.float64 and out.tolist() == [3.0, 3.0]
    assert viz._to_numpy([[1, 2]]).dtype == np.float64


def test_heatmap_annotations_sit_on_their_cells():
    w = np.arange(6, dtype=float).reshape(2, 3) / 10
    ax = viz.attention_heatmap(w, ["a", "b"], ["x", "y", "z"])
    assert [t.get_position() for t in ax.texts] == [(j, i) for i in range(2) for j in range(3)]
    assert [t.get_text() for t in ax.texts] == ["0.00", "0.10", "0.20", "0.30", "0.40", "0.50"]
    for t in ax.texts:
        assert (t.get_ha(), t.get_va(), t.get_fontsize()) == ("center", "center", 9)


def test_heatmap_skips_non_finite_cells_and_annotates_the_rest():
    w = np.array([[np.nan, 0.5, 0.25], [np.inf, 1.0, -np.inf]])
    ax = viz.attention_heatmap(w, ["a", "b"], ["x", "y", "z"])
    assert [(t.get_position(), t.get_text()) for t in ax.texts] == [
        ((1, 0), "0.50"), ((2, 0), "0.25"), ((1, 1), "1.00")]
    assert (ax.images[0].norm.vmin, ax.images[0].norm.vmax) == (0.25, 1.0)


def test_heatmap_colour_limits():
    w = np.array([[0.2, 0.9], [0.5, np.nan]])
    norm = viz.attention_heatmap(w, ["a", "b"]).images[0].norm
    assert (norm.vmin, norm.vmax) == (0.2, 0.9)
    norm = viz.attention_heatmap(w, ["a", "b"], vmin=-1.0, vmax=2.0).images[0].norm
    assert (norm.vmin, norm.vmax) == (-1.0, 2.0)
    norm = viz.attention_heatmap(w, ["a", "b"], vmin=0.0).images[0].norm
    assert (norm.vmin, norm.vmax) == (0.0, 0.9)
    norm = viz.attention_heatmap(w, ["a", "b"], vmax=1.0).images[0].norm
    assert (norm.vmin, norm.vmax) == (0.2, 1.0)
    nothing = np.full((2, 2), np.nan)
    nothing[0, 1] = np.inf
    norm = viz.attention_heatmap(nothing, ["a", "b"]).images[0].norm
    assert (norm.vmin, norm.vmax) == (0.0, 1.0)


def test_heatmap_layout_aspect_and_spines():
    ax = viz.attention_heatmap(np.eye(2), ["a", "b"])
    assert ax.get_aspect() == "auto"
    assert all(ax.spines[s].get_visible() is False for s in ("top", "right", "bottom", "left"))


@pytest.mark.parametrize("labels, rotation, ha", [(["abc", "de"], 0.0, "center"), (["abcd", "e"], 45.0, "right")])
def test_heatmap_key_labels_rotate_only_when_longer_than_3_characters(labels, rotation, ha):
    ax = viz.attention_heatmap(np.eye(2), ["a", "b"], labels)
    for t in ax.get_xticklabels():
        assert (t.get_rotation(), t.get_ha()) == (rotation, ha), t.get_text()


@pytest.mark.filterwarnings("ignore:Attempting to set identical low and high xlims")
def test_heatmap_with_no_keys():
    ax = viz.attention_heatmap(np.zeros((2, 0)), ["a", "b"], [])
    assert ax.get_xticklabels() == [] and not ax.texts


def test_heatmap_size_rule():
    """The book's heatmap size rule (a design choice, pinned so that a change is deliberate):
    1 in + 0.55 in per key column wide, 0.8 in + 0.5 in per query row high."""
    ax = viz.attention_heatmap(np.ones((3, 5)) / 5, ["a", "b", "c"], list("vwxyz"))
    assert tuple(ax.figure.get_size_inches()) == pytest.approx((1.0 + 0.55 * 5, 0.8 + 0.5 * 3), abs=1e-9)


def test_heatmap_colorbar_is_attached_to_its_axes():
    """Colorbar on the right of the heatmap, for the heatmap's image, without an outline; it takes
    4.6 % of the axes width plus a 4 % gap (the book's design, pinned)."""
    fig, (other, ax) = plt.subplots(1, 2, figsize=(6, 3))
    other.imshow(np.ones((2, 2)), vmin=-5, vmax=5)
    plt.sca(other)
    width = ax.get_position().width
    viz.attention_heatmap(np.array([[0.2, 0.4], [0.6, 0.8]]), ["a", "b"], ax=ax)
    cbar = ax.images[0].colorbar
    assert cbar is not None and other.images[0].colorbar is None
    assert cbar.ax.get_ylim() == pytest.approx((0.2, 0.8))
    assert cbar.outline.get_visible() is False
    box, cbox = ax.get_position(), cbar.ax.get_position(original=True)
    assert cbox.x0 > box.x1 and cbox.x0 > other.get_position().x1
    assert box.width == pytest.approx(width * (1 - 0.046 - 0.04), rel=1e-6)
    assert cbox.width == pytest.approx(width * 0.046, rel=1e-6)
    assert cbox.x0 - box.x1 == pytest.approx(width * 0.04, rel=1e-6)
    assert viz.attention_heatmap(np.eye(2), ["a", "b"], colorbar=False).images[0].colorbar is None


# --- head_grid --------------------------------------------------------------------------------

def _panels(fig):
    return [ax for ax in fig.axes if ax.images]


def _bar_cmap(cax):
    """The colormap of a colorbar's colour strip (its QuadMesh)."""
    from matplotlib.collections import QuadMesh

    (mesh,) = [c for c in cax.collections if isinstance(c, QuadMesh)]
    return mesh.get_cmap().name


def _colorbars(fig):
    return [ax for ax in fig.axes if not ax.images and ax.get_visible()]


def test_head_grid_default_columns_hide_the_unused_axes():
    """h = 5 heads: min(5, 4) = 4 columns, 2 rows, the last 3 axes hidden; constrained layout."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    w = np.random.default_rng(0).random((5, 2, 2))
    fig = viz.head_grid(w, ["a", "b"])
    grid = fig.axes[0].get_gridspec()
    assert (grid.nrows, grid.ncols) == (2, 4)
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
    hidden = [ax for ax in fig.axes if ax.get_visible() is False]
    assert len(hidden) == 3 and len(_panels(fig)) == 5
    assert [ax.get_subplotspec().get_geometry()[2] for ax in hidden] == [5, 6, 7]
    # y labels only in the first column (panels 0 and 4)
    assert [ax.get_ylabel() for ax in _panels(fig)] == ["query", "", "", "", "query"]
    assert [[t.get_text() for t in ax.get_yticklabels()] for ax in _panels(fig)] == [
        ["a", "b"], ["", ""], ["", ""], ["", ""], ["a", "b"]]
    assert not any(ax.texts for ax in _panels(fig))  # not annotated by default


def test_head_grid_single_head_and_explicit_columns():
    fig = viz.head_grid(np.eye(2)[None], ["a", "b"])
    assert len(_panels(fig)) == 1 and _panels(fig)[0].get_title() == "head 0"
    fig = viz.head_grid(np.ones((3, 2, 2)) / 2, ["a", "b"], ncols=1)
    grid = fig.axes[0].get_gridspec()
    assert (grid.nrows, grid.ncols) == (3, 1)
    assert [ax.get_ylabel() for ax in _panels(fig)] == ["query"] * 3
    with pytest.raises(TypeError, match="ncols"):
        viz.head_grid(np.ones((3, 2, 2)), ["a", "b"], ncols=1.5)


def test_head_grid_shared_scale_has_one_colorbar():
    w = np.array([[[0.2, 0.8], [0.5, 0.5]], [[-0.3, 0.7], [0.9, 0.1]]])
    fig = viz.head_grid(w, ["a", "b"], cmap="magma")
    (cax,) = _colorbars(fig)
    assert cax.get_ylim() == pytest.approx((-0.3, 0.9))
    assert _bar_cmap(cax) == "magma"
    for ax in _panels(fig):
        assert ax.images[0].get_clim() == pytest.approx((-0.3, 0.9))
        assert ax.images[0].get_cmap().name == "magma"
        assert ax.images[0].colorbar is None
    # non-negative weights: the scale starts at 0
    (cax,) = _colorbars(viz.head_grid(np.abs(w) + 0.1, ["a", "b"]))
    assert cax.get_ylim() == pytest.approx((0.0, 1.0))
    assert _bar_cmap(cax) == viz.BOOK_CMAP


def test_head_grid_separate_scales_have_a_colorbar_each():
    w = np.array([[[0.2, 0.8], [0.5, 0.5]], [[0.3, 0.7], [0.9, 0.1]]])
    fig = viz.head_grid(w, ["a", "b"], share_scale=False)
    panels = _panels(fig)
    assert [ax.images[0].get_clim() for ax in panels] == [(0.2, 0.8), (0.1, 0.9)]
    assert len(_colorbars(fig)) == 2
    for ax in panels:
        assert ax.images[0].colorbar is not None


def test_head_grid_passes_its_options_to_every_panel():
    w = np.array([[[0.25, 0.5, 0.25], [0.5, 0.5, 0.0]], [[1.0, 0.0, 0.0], [0.125, 0.25, 0.625]]])
    fig = viz.head_grid(w, ["a", "b"], col_labels=["x", "y", "zz"], annotate=True, fmt=".1f", cmap="gray")
    for k, ax in enumerate(_panels(fig)):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y", "zz"]
        assert [t.get_text() for t in ax.texts] == [format(v, ".1f") for v in w[k].ravel()]
        assert ax.images[0].get_cmap().name == "gray"
    default = viz.head_grid(w, ["a", "b"], col_labels=["x", "y", "zz"], annotate=True)
    assert [t.get_text() for t in _panels(default)[1].texts] == ["1.00", "0.00", "0.00", "0.12", "0.25", "0.62"]


def test_head_grid_error_messages():
    w = np.ones((2, 2, 3))
    with pytest.raises(ValueError, match=r"^col_labels: expected 3 labels \(weights has m=3 keys\), got 2$"):
        viz.head_grid(w, ["a", "b"], col_labels=["x", "y"])
    with pytest.raises(ValueError, match=r"^labels: expected 2 labels \(weights has n=2 queries\), got 1$"):
        viz.head_grid(w, ["a"], col_labels=["x", "y", "z"])
    with pytest.raises(ValueError, match=r"^titles: expected 2 titles \(one per head\), got 3$"):
        viz.head_grid(w, ["a", "b"], titles=["p", "q", "r"], col_labels=["x", "y", "z"])
    with pytest.raises(ValueError, match=r"^weights: expected a 3-d array \(h, n, m\), got shape \(2, 3\)$"):
        viz.head_grid(w[0], ["a", "b"])
    with pytest.raises(ValueError, match=r"^row_labels: expected 2 labels \(weights has 2 rows\), got 1$"):
        viz.attention_heatmap(w[0], ["a"])
    with pytest.raises(ValueError, match=r"^col_labels: expected 3 labels \(weights has 3 columns\), got 2$"):
        viz.attention_heatmap(w[0], ["a", "b"])


def test_head_grid_size_rule_and_colorbar():
    """The book's grid size rule and shared colorbar (a design choice, pinned so that a change is
    deliberate): width 0.6 + (0.45 m + 0.8) per column, height (0.45 n + 0.9) per row; the
    colorbar takes 3 % of the panels' width after a 2 % gap, without an outline."""
    from matplotlib.transforms import Bbox

    n, m = 2, 3
    fig = viz.head_grid(np.random.default_rng(1).random((5, n, m)), ["a", "b"], col_labels=["x", "y", "z"])
    assert tuple(fig.get_size_inches()) == pytest.approx((0.6 + (0.45 * m + 0.8) * 4, (0.45 * n + 0.9) * 2))
    fig.canvas.draw()
    (cax,) = _colorbars(fig)
    panels = Bbox.union([ax.get_position() for ax in _panels(fig)])
    bar = cax.get_position(original=True)
    assert bar.width == pytest.approx(0.03 * panels.width, rel=1e-6)
    assert bar.x0 - panels.x1 == pytest.approx(0.02 * panels.width, rel=1e-6)
    assert cax.spines["outline"].get_visible() is False


# --- animation_html ---------------------------------------------------------------------------

def _tiny_animation():
    from matplotlib.animation import FuncAnimation

    fig, ax = plt.subplots(figsize=(1, 1), dpi=20)
    (line,) = ax.plot([0, 1], [0, 0])
    return fig, FuncAnimation(fig, lambda i: line.set_ydata([0, i]), frames=2)


def _checked_mode(html):
    import re

    return re.findall(r'value="(\w+)" id="[^"]*"\s*checked', html)


def _interval(html):
    import re

    return [int(v) for v in re.findall(r"new Animation\(frames, img_id, slider_id, (\d+),", html)]


def test_animation_html_defaults_and_options(tmp_path, monkeypatch):
    """Default 2 frames per second (a 500 ms interval in matplotlib's player) and loop mode;
    both passed through; the temporary file goes to a temporary folder, not the working one."""
    monkeypatch.chdir(tmp_path)
    fig, anim = _tiny_animation()
    html = viz.animation_html(anim)
    assert (_interval(html), _checked_mode(html)) == ([500], ["loop"])
    html = viz.animation_html(anim, fps=4, default_mode="reflect")
    assert (_interval(html), _checked_mode(html)) == ([250], ["reflect"])
    plt.close(fig)
    assert list(tmp_path.iterdir()) == []
    # the font-awesome link is removed with nothing in its place: the page opens with the script
    assert html.lstrip().startswith('<script language="javascript">')


def test_animation_html_frames_transparent_without_book_style():
    """Even with matplotlib's opaque white defaults, the frames keep a transparent background."""
    import base64
    import re

    from PIL import Image

    with matplotlib.rc_context():                      # the global style is restored afterwards
        matplotlib.rcdefaults()
        matplotlib.use("Agg")
        fig, anim = _tiny_animation()
        assert to_rgba(fig.get_facecolor())[3] == 1
        html = viz.animation_html(anim)
        plt.close(fig)
    frames = [f.replace("\\\n", "") for f in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=\\\n]+)", html)]
    assert len(frames) == 2
    corner = Image.open(io.BytesIO(base64.b64decode(frames[0]))).convert("RGBA").getpixel((0, 0))
    assert corner[3] == 0, corner
