"""The report's charts: PNGs made with matplotlib (imported on first use) and embedded as
``data:`` URIs, so the page needs nothing from elsewhere."""

from __future__ import annotations

import base64
import io
import itertools
from dataclasses import dataclass
from typing import Any

from grader.analysis.report.listing import mean_score, scored_rows, status_kind
from grader.analysis.summary import Tally

_GREEN, _AMBER, _RED, _GREY, _BLUE = "#3a8f5c", "#d9a441", "#c8553d", "#8c8c8c", "#4a72b0"


@dataclass(frozen=True)
class Chart:
    """One PNG for an ``<img>``: its CSS size and a ``data:`` URI made here, never from results."""

    alt: str
    width: int
    height: int
    src: str


class Charts:
    """PNG charts as ``data:`` URIs. matplotlib is imported on first use."""

    # Rendered at twice the CSS size so they stay sharp on high-density screens.
    SCALE = 2
    DPI = 96

    def __init__(self) -> None:
        self.count = 0

    def _figure(self, width: float, height: float) -> Any:
        # Figure, not pyplot: no global state, no backend switch; savefig renders with Agg.
        from matplotlib.figure import Figure

        figure = Figure(figsize=(width, height), dpi=self.DPI)
        return figure, figure.add_subplot()

    def _img(self, figure: Any, alt: str) -> Chart:
        width, height = figure.get_size_inches()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=self.DPI * self.SCALE, metadata={"Software": None})
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        self.count += 1
        return Chart(alt, round(width * self.DPI), round(height * self.DPI),
                     f"data:image/png;base64,{data}")

    def _done(self, figure: Any, axes: Any, alt: str) -> Chart:
        """The chart styled, laid out and made a PNG."""
        for side in ("top", "right"):
            axes.spines[side].set_visible(False)
        axes.tick_params(labelsize=10)
        figure.tight_layout()
        return self._img(figure, alt)

    @staticmethod
    def _label_bars(axes: Any, bars: Any, horizontal: bool = False) -> None:
        labels = [f"{bar.get_width() if horizontal else bar.get_height():g}" for bar in bars]
        axes.bar_label(bars, labels=labels, padding=3, fontsize=9)

    def score_histogram(self, counts: list[int]) -> Chart:
        """``counts``: ok rows per score 0-5."""
        from matplotlib.ticker import MaxNLocator

        figure, axes = self._figure(5.2, 3.0)
        bars = axes.bar(range(6), counts, color=_BLUE, width=0.7)
        self._label_bars(axes, bars)
        axes.set_xticks(range(6))
        axes.set_xlabel("recomputed score")
        axes.set_ylabel("ok rows")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylim(0, max(counts) * 1.18 + 0.5)
        return self._done(figure, axes, "histogram of recomputed scores 0-5 over ok rows")

    def result_histogram(self, values: list[tuple[float, bool | None]]) -> Chart:
        from matplotlib.ticker import MaxNLocator

        figure, axes = self._figure(6.0, 3.0)
        kinds = [(label, color, chosen) for label, color, flag in (
            ("passed", _GREEN, True), ("failed", _RED, False), ("no threshold", _BLUE, None))
            if (chosen := [v for v, p in values if p is flag])]
        distinct = sorted({v for v, _ in values})
        if len(distinct) <= 12:
            self._stacked_bars(axes, kinds, distinct)
        else:
            axes.hist([k[2] for k in kinds], bins=20, stacked=True, color=[k[1] for k in kinds],
                      label=[k[0] for k in kinds])
        axes.set_xlabel("result")
        axes.set_ylabel("rows")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        if len(kinds) > 1 or kinds[0][0] != "no threshold":
            axes.legend(frameon=False, fontsize=9)
        return self._done(figure, axes, "histogram of score_model results, passed and failed")

    @staticmethod
    def _stacked_bars(axes: Any, kinds: list[tuple[str, str, list[float]]],
                      distinct: list[float]) -> None:
        """Few distinct results (integer grades): one bar each rather than arbitrary bins,
        each kind's count stacked on the last's."""
        step = min((b - a for a, b in itertools.pairwise(distinct)), default=1.0)
        bottom = [0] * len(distinct)
        for label, color, chosen in kinds:
            counts = [chosen.count(v) for v in distinct]
            axes.bar(distinct, counts, width=step * 0.7, bottom=bottom, color=color, label=label)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        axes.set_xticks(distinct)

    def statuses(self, order: list[str], counts: list[int]) -> Chart:
        palette = {"ok": _GREEN, "zero": _AMBER, "null": _RED}
        colors = [palette.get(status_kind(s), _GREY) for s in order]
        figure, axes = self._figure(4.6, 0.5 + 0.42 * len(order))
        bars = axes.barh(range(len(order)), counts, color=colors, height=0.65)
        self._label_bars(axes, bars, horizontal=True)
        axes.set_yticks(range(len(order)), labels=order)
        axes.invert_yaxis()
        axes.set_xlim(0, max(counts + [1]) * 1.15)
        axes.set_xlabel("rows")
        return self._done(figure, axes, "rows per status")

    def group_means(self, groups: dict[str, Tally]) -> Chart:
        names = [n for n in sorted(groups) if scored_rows(groups[n])]
        means = [mean_score(groups[n]) for n in names]
        labels = [n if len(n) <= 28 else n[:27] + "…" for n in names]
        figure, axes = self._figure(7.0, 0.6 + 0.36 * len(names))
        bars = axes.barh(range(len(names)), means, color=_BLUE, height=0.6)
        axes.bar_label(bars, labels=[f"{m:.2f}  (n={scored_rows(groups[n])})"
                                     for m, n in zip(means, names, strict=True)],
                       padding=3, fontsize=9)
        axes.set_yticks(range(len(names)), labels=labels)
        axes.invert_yaxis()
        axes.set_xlim(0, 5.9)
        axes.set_xticks(range(6))
        axes.set_xlabel("mean recomputed score (ok rows)")
        return self._done(figure, axes, "mean score per group")

    def rating_intervals(self, models: list[str], ratings: list[float],
                         intervals: list[list[float] | None], label: str) -> Chart:
        """``grader rank``'s interval plot: each model's rating, its bootstrap interval as a
        bar across it, best at the top."""
        figure, axes = self._figure(7.0, 0.9 + 0.45 * len(models))
        ys = list(range(len(models)))
        low = [r - i[0] if i else 0.0 for r, i in zip(ratings, intervals, strict=True)]
        high = [i[1] - r if i else 0.0 for r, i in zip(ratings, intervals, strict=True)]
        axes.errorbar(ratings, ys, xerr=[low, high], fmt="o", color=_BLUE, ecolor=_GREY,
                      elinewidth=2, capsize=4)
        for y, rating in zip(ys, ratings, strict=True):
            axes.annotate(f"{rating:.0f}", (rating, y), textcoords="offset points", xytext=(0, 7),
                          ha="center", fontsize=9)
        names = [n if len(n) <= 28 else n[:27] + "…" for n in models]
        axes.set_yticks(ys, labels=names)
        axes.set_ylim(len(models) - 0.5, -0.7)
        axes.axvline(1000, color=_GREY, linewidth=0.8, linestyle=":")
        axes.set_xlabel(label)
        return self._done(figure, axes, "ratings with their intervals, best first")

    def calibration(self, estimates: list[tuple[str, float | None, list[float] | None]],
                    label: str) -> Chart:
        """The calibration section's plot: each estimate of the mean human score (judge only,
        labels only, calibrated) as a point with its interval as a bar across it."""
        figure, axes = self._figure(7.0, 0.9 + 0.5 * len(estimates))
        colors = [_AMBER, _GREY, _GREEN]
        for y, ((_, mean, interval), color) in enumerate(zip(estimates, colors, strict=False)):
            if mean is None:
                continue
            low, high = (mean - interval[0], interval[1] - mean) if interval else (0.0, 0.0)
            axes.errorbar([mean], [y], xerr=[[low], [high]], fmt="o", color=color, ecolor=color,
                          elinewidth=3, capsize=5)
            axes.annotate(f"{mean:.2f}", (mean, y), textcoords="offset points", xytext=(0, 7),
                          ha="center", fontsize=9)
        axes.set_yticks(range(len(estimates)), labels=[name for name, _, _ in estimates])
        axes.set_ylim(len(estimates) - 0.5, -0.7)
        axes.set_xlabel(label)
        return self._done(figure, axes, "the mean human score three ways, each with its 95% interval")
