"""Certification rates per fairness variant and per demographic group (the paper's Tables 2-4),
and the soundness/accuracy figures against enumeration."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable


def summarize(records: Iterable[dict]) -> dict:
    """Aggregate per-input records ``{"variant", "group", "certified", "seconds", "truth"?}``
    (group: a string naming the input's protected values) into rates per variant and group.
    With ground truth: ``truth_rate``, ``unsound`` (certified but not truly fair; must be 0) and
    ``accuracy`` = certified / truly fair, as in the paper's Table 2."""
    by_variant: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_variant[r["variant"]].append(r)
    out = {}
    for variant, rows in by_variant.items():
        entry = {
            "inputs": len(rows),
            "certified": sum(r["certified"] for r in rows),
            "rate": sum(r["certified"] for r in rows) / len(rows),
            "mean_seconds": sum(r["seconds"] for r in rows) / len(rows),
        }
        groups: dict[str, list[bool]] = defaultdict(list)
        for r in rows:
            groups[r["group"]].append(r["certified"])
        entry["groups"] = {
            g: {"inputs": len(v), "rate": sum(v) / len(v)} for g, v in sorted(groups.items())
        }
        if all("truth" in r for r in rows):
            fair = sum(r["truth"] for r in rows)
            entry["truth_rate"] = fair / len(rows)
            entry["unsound"] = sum(r["certified"] and not r["truth"] for r in rows)
            entry["accuracy"] = entry["certified"] / fair if fair else 1.0
        out[variant] = entry
    return out


def format_summary(summary: dict) -> str:
    """A plain-text table of a summary."""
    lines = ["variant      inputs  certified  rate     mean time  truth    unsound  accuracy"]
    for variant, e in summary.items():
        truth = f"{e['truth_rate']:7.1%}" if "truth_rate" in e else "    n/a"
        unsound = f"{e['unsound']:7d}" if "unsound" in e else "    n/a"
        acc = f"{e['accuracy']:8.1%}" if "accuracy" in e else "     n/a"
        lines.append(
            f"{variant:<12} {e['inputs']:6d}  {e['certified']:9d}  {e['rate']:6.1%}  "
            f"{e['mean_seconds'] * 1e3:8.2f}ms  {truth}  {unsound}  {acc}"
        )
    lines.append("")
    lines.append("per group       " + "  ".join(f"{v:>12}" for v in summary))
    groups = sorted({g for e in summary.values() for g in e["groups"]})
    for g in groups:
        cells = []
        for e in summary.values():
            s = e["groups"].get(g)
            cells.append(f"{s['rate']:6.1%} ({s['inputs']:3d})" if s else " " * 12)
        lines.append(f"{g:<15} " + "  ".join(cells))
    return "\n".join(lines)
