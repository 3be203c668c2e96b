"""``grader rank --html``: the leaderboard as one self-contained page, with the report's
templates, style and charts (an interval plot), autoescaped."""

from __future__ import annotations

from pathlib import Path

from grader.analysis.rank import Entry, Ranking, _interval
from grader.analysis.report.charts import Charts
from grader.analysis.report.page import _environment, _fmt, _Section
from grader.io.results import write_atomic


def _place(place: list[int] | None) -> str:
    if place is None:
        return ""
    return f"{place[0]}" if place[0] == place[1] else f"{place[0]}–{place[1]}"


def _rows(board: list[Entry]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for e in board:
        row = {"model": e["model"], "rating": _fmt(e["rating"], 0),
               "interval": _interval(e["interval"]), "place": _place(e["place"]),
               "win_rate": _fmt(e["win_rate"], 3), "wins": e["wins"], "ties": e["ties"],
               "losses": e["losses"], "mean_score": _fmt(e.get("mean_score"), 2)}
        if "lc_rating" in e:
            row |= {"lc_rating": _fmt(e["lc_rating"], 0), "lc_interval": _interval(e["lc_interval"]),
                    "lc_win_rate": _fmt(e["lc_win_rate"], 3)}
        rows.append(row)
    return rows


def render_rank_page(result: Ranking, charts: Charts | None = None) -> str:
    """The page's HTML from :func:`grader.analysis.rank.rank`'s result."""
    charts = charts or Charts()
    board = result["leaderboard"]
    lc = result["length_controlled"]
    models = [e["model"] for e in board]
    chart = charts.rating_intervals(models, [e["rating"] for e in board],
                                    [e["interval"] for e in board], "Bradley-Terry rating (Elo scale)")
    lc_chart = (charts.rating_intervals(models, [e["lc_rating"] for e in board],
                                        [e["lc_interval"] for e in board],
                                        "length-controlled rating (Elo scale)") if lc else None)
    boot = result["bootstrap"]
    method = [f"{result['fit']['model']}; {result['fit']['scale']}; bootstrap {boot['rounds']} "
              f"rounds, seed {boot['seed']}, {boot['method']}.",
              "win rate: (wins + ties / 2) / games against every other model; place: the "
              "interval of the model's place over the bootstrap rounds."]
    if lc:
        length = result["length"]
        method.append(f"LC (length-controlled, AlpacaEval-style): {length['feature']}, coefficient "
                      f"{length['coefficient']:.3f}; LC win rate: the fit's win rate at equal lengths.")
    view = {"rows": _rows(board), "lc": lc, "chart": chart, "lc_chart": lc_chart,
            "pct": f"{round(boot['confidence'] * 100, 1):g}%", "method": method,
            "notes": result["notes"]}
    incomplete = [(str(row), ", ".join(f"{m}: {s}" for m, s in where.items())
                   if isinstance(where, dict) else str(where))
                  for row, where in result["rows"]["incomplete"].items()]
    sections = [_Section("leaderboard", "Leaderboard", view),
                _Section("pairs", "Games per pair", {"pairs": result["pairs"],
                                                     "incomplete": incomplete})]
    files = [file for e in board if (file := e.get("file"))]
    meta = [", ".join(files)] if files else []
    meta.append(f"{result['games']} games")
    template = _environment().get_template("report.html.j2")
    return template.render(title="grader rank", meta=meta, sections=sections, verdict=None)


def write_rank_page(result: Ranking, output: Path) -> Path:
    """Write the page (replaced atomically); returns its path."""
    text = render_rank_page(result)
    write_atomic(Path(output), text.encode("utf-8", "backslashreplace"))
    return Path(output)
