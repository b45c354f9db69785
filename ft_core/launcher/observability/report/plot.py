"""The job's timeline as a picture (``ft_launcher report --plot FILE.png``; needs matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ft_core.launcher.observability.report.analysis import Report
from ft_core.launcher.observability.report.text import seconds

__all__ = ["plot_timeline"]


def plot_timeline(report: Report, path: str) -> str:
    """Draw the job's timeline to ``path`` (PNG); one row per node. Needs matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'ft-suite-pytorch[report]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = _rows(report.launchers)
    axis = _TimeAxis(report.attempt_spans)
    colors = {"training": "#2e86c1", "startup": "#aed6f1", "recompute": "#f5b041", "detection": "#e74c3c",
              "restart": "#8e44ad", "alive": "#d5d8dc", "checkpoint": "#1e8449", "fault": "#922b21"}
    fig, ax = plt.subplots(figsize=(13, 1.9 + 0.75 * len(rows)), dpi=130)
    row_of = {node: i for i, (_, nodes) in enumerate(rows) for node in nodes}

    def bar(y: int, t0: float, t1: float, color: str, **style: Any) -> None:
        if t1 > t0:
            ax.barh(y, axis(t1) - axis(t0), left=axis(t0), height=style.pop("height", 0.46), color=color,
                    **style)

    def rows_of(attempt: int, number: int) -> set[int]:
        return {row_of[n] for c in report.cycle_spans if (c.attempt, c.number) == (attempt, number)
                for n in c.nodes if n in row_of}

    for node, start, end in report.launchers:
        bar(row_of[node], start, end, colors["alive"], height=0.12, zorder=1)
    for cycle in report.cycle_spans:
        for y in rows_of(cycle.attempt, cycle.number):
            bar(y, cycle.start, cycle.ready, colors["startup"], zorder=2)
            bar(y, cycle.ready, cycle.end, colors["training"], zorder=2)
            if axis(cycle.end) - axis(cycle.ready) > axis.total * 0.05:
                ax.text(axis(cycle.ready) + axis.total * 0.004, y, f"cycle {cycle.number}", ha="left",
                        va="center", fontsize=8, color="white", fontweight="bold", zorder=5,
                        bbox={"boxstyle": "round,pad=0.2", "fc": colors["training"], "ec": "none"})
    for fault in report.faults:
        hit = rows_of(fault.attempt, fault.cycle)
        for y in hit:
            if fault.recompute_s:
                bar(y, fault.time - fault.recompute_s, fault.time, colors["recompute"], hatch="////",
                    edgecolor="#b9770e", linewidth=0, zorder=3)
            bar(y, fault.time, fault.detected, colors["detection"], zorder=3)
            if fault.resumed is not None:
                bar(y, fault.detected, fault.resumed, colors["restart"], zorder=3)
        y_top = min(hit) if hit else 0
        ax.plot([axis(fault.detected)], [y_top - 0.33], marker="v", color=colors["fault"], markersize=8, zorder=6)
        label = fault.kind + (f" · rank {fault.culprit_rank}" if fault.culprit_rank is not None else "")
        label += f" · iter {fault.iteration}" if fault.iteration is not None else ""
        ax.annotate(label, (axis(fault.detected), y_top - 0.42), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8, color=colors["fault"], fontweight="bold", zorder=6)
    for time, _iteration, node in report.checkpoints:
        if node in row_of:
            ax.plot([axis(time)], [row_of[node] + 0.3], marker="^", color=colors["checkpoint"], markersize=4,
                    zorder=4)
    for boundary, queued in axis.breaks():
        ax.axvline(boundary, color="#7f8c8d", linestyle=":", zorder=0)
        ax.text(boundary, -0.95, f" requeue (+{seconds(queued)} queued)", fontsize=7, color="#566573",
                ha="left", va="top")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows])
    ax.set_ylim(len(rows) - 0.4, -1.0)
    ax.set_xlim(0, axis.total * 1.01 + 1e-9)
    ax.set_xlabel(f"time since the job started ({axis.unit}; queue time between requeues cut out)"
                  if axis.breaks() else f"time since the job started ({axis.unit})")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / axis.scale:g}"))
    ax.grid(axis="x", color="#eaecee", zorder=0)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    goodput = f"{report.goodput_pct:.1f} %" if report.goodput_pct is not None else "n/a"
    lost = report.detection_s + report.restart_s + (report.recompute_s or 0.0)
    title = (f"goodput {goodput}   ·   {len(report.faults)} fault(s), {seconds(lost)} lost   ·   "
             f"wall time {seconds(report.wall_time_s)}")
    ax.set_title(title, loc="left", fontsize=11, fontweight="bold")
    if report.run_ids:
        ax.set_title(f"run {', '.join(report.run_ids)}", loc="right", fontsize=8, color="#566573")
    handles = [Patch(color=colors["training"], label="training"),
               Patch(color=colors["startup"], label="worker start-up"),
               Patch(facecolor=colors["recompute"], edgecolor="#b9770e", hatch="////",
                     label="work lost (after last checkpoint)"),
               Patch(color=colors["detection"], label="fault → detection"),
               Patch(color=colors["restart"], label="restart"),
               Patch(color=colors["alive"], label="launcher"),
               Line2D([], [], color=colors["checkpoint"], marker="^", linestyle="", markersize=5, label="checkpoint")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / (1.9 + 0.75 * len(rows)), 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def _rows(launchers: Sequence[tuple[str, float, float]]) -> list[tuple[str, list[str]]]:
    """One row per host; launchers of one host that overlap in time (several on one machine) get their own."""
    rows: list[tuple[str, list[str], float]] = []
    for node, start, end in sorted(launchers, key=lambda lc: lc[1]):
        host = node.rsplit(":", 1)[0]
        for i, (label, nodes, row_end) in enumerate(rows):
            if label.split(" #")[0] == host and start >= row_end:
                rows[i] = (label, [*nodes, node], end)
                break
        else:
            same = sum(1 for label, _, _ in rows if label.split(" #")[0] == host)
            rows.append((host if same == 0 else f"{host} #{same + 1}", [node], end))
    return [(label, nodes) for label, nodes, _ in rows]


class _TimeAxis:
    """Seconds since the start, with the queue time between attempts cut out (shown as a gap)."""

    def __init__(self, spans: Sequence[tuple[float, float]]) -> None:
        self.spans = list(spans) or [(0.0, 0.0)]
        active = sum(end - start for start, end in self.spans)
        self.gap = max(active * 0.03, 1e-3) if len(self.spans) > 1 else 0.0
        self.total = active + self.gap * (len(self.spans) - 1)
        self.scale, self.unit = (3600.0, "h") if self.total >= 3 * 3600 else (60.0, "min") if self.total >= 300 \
            else (1.0, "s")

    def __call__(self, t: float) -> float:
        offset = 0.0
        for i, (start, end) in enumerate(self.spans):
            following = self.spans[i + 1][0] if i + 1 < len(self.spans) else float("inf")
            if t < following:
                return offset + max(0.0, t - start)
            offset += end - start + self.gap
        return offset

    def breaks(self) -> list[tuple[float, float]]:
        """(x, queued seconds) of each requeue boundary."""
        out, offset = [], 0.0
        for (start, end), (next_start, _) in zip(self.spans, self.spans[1:]):
            offset += end - start
            out.append((offset + self.gap / 2, next_start - end))
            offset += self.gap
        return out
