"""The goodput report for people: the full text of ``ft_launcher report`` and the two lines of the exit summary."""

from __future__ import annotations

from typing import Optional

from ft_core.launcher.observability.report.analysis import Report

__all__ = ["format_report", "seconds", "short_summary"]


def seconds(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def short_summary(report: Report) -> list[str]:
    """Two lines for the launcher's exit summary, then the budget by cause when the job had faults."""
    goodput = f"{report.goodput_pct:.1f} %" if report.goodput_pct is not None else "n/a"
    return [
        f"goodput    : {goodput} (training {seconds(report.productive_time_s)} of {seconds(report.wall_time_s)}"
        f" wall time)",
        f"time lost  : {seconds(report.lost_s)} (detection {seconds(report.detection_s)}, restart "
        f"{seconds(report.restart_s)}, recomputation {seconds(report.recompute_s)})",
        *budget_lines(report, "{:<11}"),
    ]


def budget_lines(report: Report, label: str) -> list[str]:
    """Why the job went on or stopped: restarts by cause, the stop's cause, the rejected checkpoints."""
    lines = []
    if report.restarts_by_cause:
        causes = ", ".join(f"{n} {cause}" for cause, n in report.restarts_by_cause.items())
        lines.append(f"{label.format('restarts')}: {sum(report.restarts_by_cause.values())} by cause: {causes}")
    if report.stopped_by:
        lines.append(f"{label.format('stopped by')}: {report.stopped_by}")
    if report.rejected_checkpoints:
        rejected = "; ".join(f"{path} ({why})" for path, why in report.rejected_checkpoints.items())
        lines.append(f"{label.format('rejected')}: {len(report.rejected_checkpoints)} checkpoint(s): {rejected}")
    return lines


def format_report(report: Report) -> str:
    """The human report (see the module docstring)."""
    lines = [f"goodput report: {len(report.files)} event log(s), {report.attempts} attempt(s), "
             f"{len(report.nodes)} node(s), {report.cycles} cycle(s)"
             + (f", run {', '.join(report.run_ids)}" if report.run_ids else "")]
    goodput = f"{report.goodput_pct:.1f} %" if report.goodput_pct is not None else "n/a"
    lines += [
        f"  wall time      : {seconds(report.wall_time_s)}",
        f"  training       : {seconds(report.training_time_s)} (productive {seconds(report.productive_time_s)})",
        f"  goodput        : {goodput}",
        f"  lost to faults : {seconds(report.lost_s)} (detection {seconds(report.detection_s)}, restart "
        f"{seconds(report.restart_s)}, recomputation {seconds(report.recompute_s)})",
        f"  other          : {seconds(report.other_s)} (start-up, rendezvous, shutdown)",
    ]
    by_kind = ", ".join(f"{n} {k}" for k, n in report.faults_by("kind").items()) or "none"
    lines.append(f"  faults         : {len(report.faults)} ({by_kind})")
    if report.faults:
        lines.append("  by rank        : " + ", ".join(f"rank {k}: {n}" for k, n in report.faults_by("culprit_rank").items()))
        lines.append("  by node        : " + ", ".join(f"{k}: {n}" for k, n in report.faults_by("culprit_node").items()))
        t0 = report.attempt_spans[0][0] if report.attempt_spans else 0.0
        lines.append("  #  attempt cycle kind     at        culprit             iteration ckpt  "
                     "detection restart   recompute")
        for i, f in enumerate(report.faults, 1):
            culprit = f"rank {f.culprit_rank}" if f.culprit_rank is not None else \
                f"ranks {','.join(map(str, f.ranks))}?"
            culprit += f" @ {f.culprit_node}" if f.culprit_node else ""
            lines.append(
                f"  {i:<2} {f.attempt:<7} {f.cycle:<5} {f.kind:<8} {'+' + seconds(f.time - t0):<9} {culprit:<19} "
                f"{_opt(f.iteration):<9} {_opt(f.checkpoint_iteration):<5} {seconds(f.detection_s):<9} "
                f"{seconds(f.restart_s):<9} {seconds(f.recompute_s)}")
            if f.diagnosis:
                lines.append(f"     diagnosis: {f.diagnosis}")
            if f.resumed_from == "snapshot":
                lines.append(f"     resumed from the snapshot of step {f.resume_step}: recomputation "
                             f"{seconds(f.recompute_s)} ({seconds(f.recompute_without_snapshots_s)} from disk)")
    lines += budget_lines(report, "  {:<15}")
    codes = sorted({str(code) for code in report.exit_codes})
    lines.append(f"  exit code(s)   : {', '.join(codes) or 'n/a'}"
                 + (f" ({report.exit_reasons[-1]})" if report.exit_reasons else ""))
    return "\n".join(lines)


def _opt(value: Optional[int]) -> str:
    return "-" if value is None else str(value)
