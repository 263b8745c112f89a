"""Bars drawn as one image whose cost is bounded by its pixels, not by its bars.

A dense timeline (a 1024-GPU run: ~400 thousand bars on rows two pixels high) was drawn
as polygons: matplotlib built a path per bar and Agg filled each one, 2-3 s for a
picture in which most bars are narrower than a pixel. Here every bar's share of every
pixel it touches is summed per kind with array arithmetic (a prefix sum along each
pixel row), and the pixel's colour is the coverage-weighted mix of the kinds' colours,
its opacity the covered fraction — what an antialiased renderer approximates when it
fills the same rectangles, without a path per bar. The image is then drawn once,
pixel for pixel onto the axes (same size, nearest-neighbour), so nothing is resampled.

The work is a few passes over arrays of the bars (O(bars)) plus a few over the image
(O(pixels x kinds)), all in numpy; no Python loop runs per bar.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np


def coverage(
    x0: np.ndarray,
    x1: np.ndarray,
    y0: np.ndarray,
    y1: np.ndarray,
    width: int,
    height: int,
    weight: "np.ndarray | None" = None,
) -> np.ndarray:
    """(height, width) array: the area of each pixel covered by the rectangles
    [x0, x1) x [y0, y1), given in pixel units (pixel (r, c) is [c, c+1) x [r, r+1)),
    summed over the rectangles. Coordinates are clipped to the image.

    Along x the covered length of pixel c by [a, b) is F(b, c) - F(a, c) with F(x, c) =
    clip(x - c, 0, 1): 1 left of floor(x), the fraction at floor(x), 0 after — a step
    (a difference array, then a running sum) plus a point term. Along y a rectangle
    covers a few pixel rows, each with its overlap as the weight. ``weight`` (one per
    rectangle, default 1) scales a rectangle's coverage: an aggregated row of n GPUs
    gives each GPU's bar 1/n, so a fully busy row is covered once."""
    x0 = np.clip(x0, 0.0, width)
    x1 = np.clip(x1, 0.0, width)
    y0 = np.clip(y0, 0.0, height)
    y1 = np.clip(y1, 0.0, height)
    keep = (x1 > x0) & (y1 > y0)
    x0, x1, y0, y1 = x0[keep], x1[keep], y0[keep], y1[keep]
    scale = np.ones(len(x0)) if weight is None else np.asarray(weight, dtype=float)[keep]
    stride = width + 1  # column `width` takes the step of a bar ending on the right edge
    size = height * stride
    if not len(x0):
        return np.zeros((height, width))
    fa = np.floor(x0).astype(np.int64)
    fb = np.floor(x1).astype(np.int64)
    frac_a, frac_b = x0 - fa, x1 - fb
    first_row = np.floor(y0).astype(np.int64)
    rows = int((np.ceil(y1).astype(np.int64) - first_row).max())
    steps = np.zeros(size)
    points = np.zeros(size)
    for j in range(rows):  # the j-th pixel row each rectangle touches (a few at most)
        row = first_row + j
        w = (np.minimum(y1, row + 1) - np.maximum(y0, row)) * scale
        on = w > 0
        if not on.any():
            continue
        base = row[on] * stride
        a, b, w = base + fa[on], base + fb[on], w[on]
        both = np.concatenate((a, b))
        steps += np.bincount(both, np.concatenate((w, -w)), minlength=size)
        points += np.bincount(both, np.concatenate((-w * frac_a[on], w * frac_b[on])), minlength=size)
    covered = steps.reshape(height, stride)
    np.cumsum(covered, axis=1, out=covered)  # (in place: this runs on a ~2000 x 850 image per kind)
    covered += points.reshape(height, stride)
    del points
    covered = covered[:, :width]
    return np.clip(covered, 0.0, 1.0, out=covered)


def bar_image(
    x0: np.ndarray,
    x1: np.ndarray,
    y0: np.ndarray,
    y1: np.ndarray,
    codes: np.ndarray,
    colours: Sequence[Tuple[float, ...]],
    width: int,
    height: int,
    weight: "np.ndarray | None" = None,
) -> np.ndarray:
    """(height, width, 4) RGBA bytes of the bars (pixel units, see :func:`coverage`), bar
    i in ``colours[codes[i]]`` (RGB in [0, 1]): each pixel the mix of the colours weighted
    by their coverage, opaque as far as it is covered (uncovered pixels are transparent,
    so the grid drawn under the bars shows there, as it does between bars). Built in
    float32, one kind at a time: a few tens of MB for a 1200 x 2100 picture."""
    rgb = np.zeros((height, width, 3), dtype=np.float32)
    covered = np.zeros((height, width), dtype=np.float32)
    for code, colour in enumerate(colours):
        mine = codes == code
        if not mine.any():
            continue
        part = coverage(
            x0[mine], x1[mine], y0[mine], y1[mine], width, height, None if weight is None else weight[mine]
        ).astype(np.float32)
        covered += part
        for channel in range(3):
            if colour[channel]:
                rgb[:, :, channel] += part * np.float32(colour[channel])
        del part
    image = np.empty((height, width, 4), dtype=np.uint8)
    rgb /= np.maximum(covered, np.float32(1e-12))[:, :, None]
    np.clip(rgb, 0.0, 1.0, out=rgb)
    rgb *= 255
    image[:, :, :3] = np.rint(rgb, out=rgb)
    np.minimum(covered, 1.0, out=covered)
    covered *= 255
    image[:, :, 3] = np.rint(covered, out=covered)
    return image
