"""The report as one self-contained HTML page: summary, chart, a table row per flagged decision
with its witness ids, and a data block the script draws a selected decision's detail from.

Everything from the inputs is escaped (``html.escape`` in markup; ``<`` as ``\\u003c`` in the
data block, so no string can close the script element). The Content-Security-Policy allows
only this page's own style and script (by hash): nothing is fetched, nothing injected runs."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

import orjson

from vigil import __version__
from vigil.connectors.events import now_iso
from vigil.daemon.report.alerts import Alert
from vigil.daemon.report.assets import CSS, JS
from vigil.daemon.report.chart import flagged_chart
from vigil.daemon.report.decisions import Decisions

PAGE_ROWS = 100
SELECT_LIMIT = 200  # distinct outputs offered in a list; more get a text field

GroupKey = tuple[str, str, str, float, float | None]  # rule, model, metric, eps, delta


@dataclass
class _Group:
    key: GroupKey
    alerts: list[Alert]


def render_page(
    alerts: Sequence[Alert], alerts_source: str, decisions: Decisions | None = None
) -> str:
    """The whole page for ``alerts`` (in stream order), with features from ``decisions``."""
    groups: dict[GroupKey, _Group] = {}
    for a in alerts:
        key = (a.rule, a.model, a.metric, a.eps, a.delta)
        groups.setdefault(key, _Group(key, [])).alerts.append(a)
    index = {key: g for g, key in enumerate(groups)}
    refs: dict[tuple[Any, str], int] = {}
    ids: list[Any] = []

    def ref(model: str, ident: str | int) -> int:
        key = (model, str(ident)) if decisions is None else decisions.key(model, ident)
        if key not in refs:
            refs[key] = len(ids)
            ids.append(ident)
        return refs[key]

    texts: dict[Any, str] = {}

    def text(y: Any) -> str:  # labels repeat: each is formatted once (1 and 1.0 apart)
        if type(y) not in (str, int, float):
            return _text(y)
        key = (type(y), y)
        if key not in texts:
            texts[key] = _text(y)
        return texts[key]

    rows = [  # witnesses flat: id ref, output, distance, id ref, ...
        [
            index[(a.rule, a.model, a.metric, a.eps, a.delta)],
            ref(a.model, a.id),
            text(a.y),
            [v for w in a.witnesses for v in (ref(a.model, w.id), text(w.y), w.distance)],
            a.count,
            None if a.lipschitz is None else list(a.lipschitz),
            int(a.history_complete),
        ]
        for a in alerts
    ]
    data = {
        "page": PAGE_ROWS,
        "groups": [_group_data(g.key, decisions) for g in groups.values()],
        "ids": ids,
        "x": None if decisions is None else _features(refs, decisions),
        "alerts": rows,
    }
    missing = 0 if decisions is None else sum(k not in decisions.found for k in refs)
    block = orjson.dumps(data).replace(b"<", b"\\u003c").decode()
    title = f"Vigil report: {len(alerts)} flagged decisions"
    return "".join(
        [
            "<!doctype html>\n<html lang=en><head><meta charset=utf-8>",
            f'<meta http-equiv="Content-Security-Policy" content="{_policy()}">',
            '<meta name=viewport content="width=device-width, initial-scale=1">',
            f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>",
            f"<h1>{escape(title)}</h1>",
            _meta(alerts, alerts_source, decisions),
            "<h2>Summary</h2>",
            _summary(list(groups.values()), decisions),
            _notes(alerts, decisions, missing),
            "<h2>Flagged decisions over the stream</h2>",
            _chart(list(groups.values()), decisions),
            "<h2>Flagged decisions</h2>",
            "<p class=note>Select a decision (click, or Enter) to see it beside its witnesses, "
            "with exact distances. Sort by a column's heading.</p>",
            _controls(alerts),
            _table(alerts, len(groups) > 1),
            "<section id=detail hidden></section>\n",
            f"<script type=application/json id=data>{block}</script>\n",
            f"<script>{JS}</script></body></html>\n",
        ]
    )


def _policy() -> str:
    def digest(text: str) -> str:
        return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()

    return (
        f"default-src 'none'; script-src 'sha256-{digest(JS)}'; "
        f"style-src 'sha256-{digest(CSS)}'; base-uri 'none'; form-action 'none'"
    )


def _text(value: Any) -> str:
    """An output as the page shows it: labels as written, probability vectors in brackets."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(map(_text, value)) + "]"
    if value is None:
        return "\u2014"
    return orjson.dumps(value).decode()


def _group_data(key: GroupKey, decisions: Decisions | None) -> dict[str, Any]:
    rule, model, metric, eps, delta = key
    names = None if decisions is None else decisions.features_of(model)
    out: dict[str, Any] = {
        "rule": rule,
        "model": model,
        "metric": metric,
        "eps": eps,
        "delta": delta,
        "features": names,
    }
    if names is not None:
        out["ignored"] = [n in decisions.ignored for n in names]
        out["scale"] = [decisions.scale.get(n, 1.0) for n in names]
    return out


def _features(refs: dict[tuple[Any, str], int], decisions: Decisions) -> list[Any]:
    """Each referenced decision's inputs (padded to its model's names), or None if absent."""
    x: list[Any] = [None] * len(refs)
    for key, r in refs.items():
        found = decisions.found.get(key)
        if found is not None:
            width = len(decisions.names.get(key[0], ()))
            values = [v if v is None or not v.is_integer() else int(v) for v in found[1]]
            x[r] = values + [None] * (width - len(values))  # integral values: 0, not 0.0
    return x


def _meta(alerts: Sequence[Alert], source: str, decisions: Decisions | None) -> str:
    pairs = sum(a.count for a in alerts)
    said = (
        "no decision stream (no features)" if decisions is None else f"decisions: {decisions.path}"
    )
    return (
        f"<p class=meta>{len(alerts)} alerts, {pairs} witness pairs \u00b7 alerts: "
        f"{escape(source)} \u00b7 {escape(said)} \u00b7 generated {now_iso()} by vigil "
        f"{__version__}</p>"
    )


def _summary(groups: list[_Group], decisions: Decisions | None) -> str:
    deltas = any(g.key[4] is not None for g in groups)
    ratios = any(a.lipschitz for g in groups for a in g.alerts)
    head = ["rule", "model", "metric", "eps", *(["delta"] if deltas else [])]
    head += ["decisions", "flagged decisions", "flagged share", "witness pairs"]
    head += [*(["largest d_out / d_in"] if ratios else []), "history incomplete"]
    lines = ["<table id=summary><thead><tr>"]
    lines += [f"<th>{h}</th>" for h in head]
    lines.append("</tr></thead><tbody>")
    for g in groups:
        rule, model, metric, eps, delta = g.key
        total = None if decisions is None else decisions.decisions_of(model)
        flagged = len(g.alerts)
        cells = [escape(rule), escape(model), escape(metric), _num(eps)]
        if deltas:
            cells.append("" if delta is None else _num(delta))
        cells += [
            "\u2014" if total is None else str(total),
            str(flagged),
            "\u2014" if not total else f"{100 * flagged / total:.2f}%",
            str(sum(a.count for a in g.alerts)),
        ]
        if ratios:
            cells.append(_largest_ratio(g.alerts))
        cells.append(str(sum(not a.history_complete for a in g.alerts)))
        lines.append("<tr>" + "".join(_cell(c, i >= 3) for i, c in enumerate(cells)) + "</tr>")
    lines.append("</tbody></table>")
    if decisions is not None:
        named = (decisions.features_of(g.key[1]) for g in groups)
        for names in dict.fromkeys(tuple(n) for n in named if n):
            lines.append(f"<p class=note>Features: {escape(_feature_list(names, decisions))}</p>")
    return "".join(lines)


def _feature_list(names: Sequence[str], decisions: Decisions) -> str:
    def label(name: str) -> str:
        if name in decisions.ignored:
            return f"{name} (not in d_in)"
        factor = decisions.scale.get(name, 1.0)
        return name if factor == 1.0 else f"{name} (\u00d7{factor!r})"

    return ", ".join(map(label, names))


def _cell(text: str, numeric: bool) -> str:
    return f"<td class=n>{text}</td>" if numeric else f"<td>{text}</td>"


def _num(value: float) -> str:
    return escape(repr(value))


def _largest_ratio(alerts: list[Alert]) -> str:
    ratios = [a.lipschitz[0] for a in alerts if a.lipschitz]
    if not ratios:
        return ""
    return "\u221e" if None in ratios else _num(max(r for r in ratios if r is not None))


def _notes(alerts: Sequence[Alert], decisions: Decisions | None, missing: int) -> str:
    notes = []
    incomplete = sum(not a.history_complete for a in alerts)
    if incomplete:
        notes.append(
            f"<p class=warn>{incomplete} alerts say history_complete: false. Retention deleted "
            "decisions before a snapshot covered them; their witness sets may lack those.</p>"
        )
    truncated = sum(a.count > len(a.witnesses) for a in alerts)
    if truncated:
        notes.append(
            f"<p class=note>{truncated} alerts list only the nearest witnesses of a larger set "
            "(the rule's max_witnesses); counts are of the whole sets.</p>"
        )
    if missing:
        notes.append(
            f"<p class=warn>{missing} decisions the alerts name are not in "
            f"{escape(str(decisions.path))}: their features are not shown.</p>"
        )
    return "".join(notes)


def _chart(groups: list[_Group], decisions: Decisions | None) -> str:
    """Positions are stream positions when every flagged decision is in the decision stream,
    else the source rows or offsets of the alerts, else their order."""
    flagged = [a for g in groups for a in g.alerts]
    if decisions is not None and all(
        decisions.key(a.model, a.id) in decisions.found for a in flagged
    ):
        series = [
            (
                f"{g.key[0]} \u00b7 {g.key[1]}",
                [decisions.found[decisions.key(a.model, a.id)][0] for a in g.alerts],
            )
            for g in groups
        ]
        return flagged_chart(series, decisions.count, "decision in the stream")
    kinds = {a.source_at[0] if a.source_at else None for a in flagged}
    if len(kinds) == 1 and None not in kinds:
        (kind,) = kinds
        series = [
            (f"{g.key[0]} \u00b7 {g.key[1]}", [a.source_at[1] for a in g.alerts]) for g in groups
        ]
        extent = 1 + max((p for _, ps in series for p in ps), default=0)
        axis = "row of the source file" if kind == "row" else "source offset (each partition)"
        return flagged_chart(series, extent, axis)
    order = iter(range(len(flagged)))
    series = [(f"{g.key[0]} \u00b7 {g.key[1]}", [next(order) for _ in g.alerts]) for g in groups]
    return flagged_chart(series, len(flagged), "alert in the input")


def _controls(alerts: Sequence[Alert]) -> str:
    outputs = sorted({_text(a.y) for a in alerts}, key=_natural)
    if len(outputs) <= SELECT_LIMIT:
        options = "".join(f'<option value="{escape(y)}">{escape(y)}</option>' for y in outputs)
        output = f"<select id=f-y><option value=''>any</option>{options}</select>"
    else:
        output = "<input id=f-y placeholder='exact text'>"
    return (
        "<div class=filters>"
        "<label>decision id contains <input id=f-id></label>"
        "<label>witness id <input id=f-wid placeholder=exact></label>"
        f"<label>output {output}</label>"
        "<label>witnesses from <input id=f-min type=number min=1></label>"
        "<label>to <input id=f-max type=number min=1></label>"
        "<button type=button id=f-clear>clear</button></div>"
        "<div class=pager><button type=button id=f-order>stream order</button>"
        "<button type=button id=prev>\u2039 previous</button>"
        "<span id=page-info></span><button type=button id=next>next \u203a</button></div>"
    )


def _natural(text: str) -> tuple[int, float, str]:
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def _table(alerts: Sequence[Alert], many_groups: bool) -> str:
    ratios = any(a.lipschitz for a in alerts)
    head = [
        "<div class=rows><table id=alerts><thead><tr>",
        "<th data-k=id><button type=button>decision</button></th>",
        "<th data-k=y><button type=button>output</button></th>",
        "<th data-k=n><button type=button>witnesses</button></th>",
        "<th data-k=d><button type=button>nearest d_in</button></th>",
    ]
    if ratios:
        head.append("<th data-k=r><button type=button>d_out / d_in</button></th>")
    if many_groups:
        head.append("<th>rule \u00b7 model</th>")
    head.append("<th>witness ids</th></tr></thead>\n<tbody id=rows>")
    out = ["".join(head)]
    for i, a in enumerate(alerts):
        cells = [
            f"<td>{escape(str(a.id))}<td>{escape(_text(a.y))}<td>{a.count}",
            f"<td>{min(w.distance for w in a.witnesses):.6g}",
        ]
        if ratios:
            cells.append(f"<td>{_ratio(a)}")
        if many_groups:
            cells.append(f"<td>{escape(a.rule)} \u00b7 {escape(a.model)}")
        witnesses = "<li>".join(escape(str(w.id)) for w in a.witnesses)
        on = " class=on" if i < PAGE_ROWS else ""
        out.append(f"<tr{on}>{''.join(cells)}<td><ul><li>{witnesses}</ul></tr>\n")
    out.append("</tbody></table></div>\n")
    return "".join(out)


def _ratio(a: Alert) -> str:
    if a.lipschitz is None:
        return ""
    return "\u221e" if a.lipschitz[0] is None else f"{a.lipschitz[0]:.6g}"
