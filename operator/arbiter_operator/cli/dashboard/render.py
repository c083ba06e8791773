"""The dashboard's pages as HTML, from a snapshot of the store (pure: no I/O, `now` given). Server-side rendered,
semantic tables, every picture with its numbers next to it; the page's only script (app.js) swaps in the new page
when the server says something changed."""

from __future__ import annotations

import time
from html import escape
from typing import Any
from urllib.parse import quote

from ..printing import summary
from .charts import colour, gate_bar, stacked_bar, timeline
from .store import Key, ModelMetrics, Point


def _num(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return escape(str(value))
    return f"{value:.4g}"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.0f} ms"


def _ago(t: float, now: float) -> str:
    s = max(0, int(now - t))
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago" if s < 7200 else f"{s // 3600}h ago"


def page(title: str, body: str, version: int) -> str:
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><link rel=\"stylesheet\" href=\"/app.css\">"
            "<script src=\"/app.js\" defer></script>"
            "<noscript><meta http-equiv=\"refresh\" content=\"15\"></noscript></head>"
            f"<body data-version=\"{version}\"><header><a href=\"/\" class=\"home\">Arbiter</a> "
            "<span class=\"ro\">read-only, your own credentials</span></header>"
            f"<main id=\"main\">{body}</main></body></html>")


def _problems(problems: dict[str, str]) -> str:
    if not problems:
        return ""
    items = "".join(f"<li><strong>{escape(k)}</strong>: {escape(v)}</li>" for k, v in sorted(problems.items()))
    return f'<section class="problems" role="status"><h2>Could not read</h2><ul>{items}</ul></section>'


def model_href(key: Key) -> str:
    return f"/m/{quote(key[0], safe='')}/{quote(key[1], safe='')}"


def _badge(phase: str) -> str:
    return f'<span class="phase phase-{escape(phase)}">{escape(phase)}</span>'


def overview(snap: dict[str, Any], now: float) -> str:
    models: dict[Key, dict[str, Any]] = snap["models"]
    rows = []
    for key in sorted(models):
        r = summary(models[key])
        line = snap["timelines"].get(key) or []
        changed = _ago(line[-1].at, now) if line else ""
        weight = f"{r['weight']}%" if isinstance(r["weight"], (int, float)) else "-"
        ready = f'<span class="ready-{escape(r["ready"])}">{escape(r["ready"])}</span>'
        rows.append(f'<tr data-model="{escape(key[0])}/{escape(key[1])}"><td>{escape(key[0])}</td>'
                    f'<td><a href="{model_href(key)}">{escape(key[1])}</a></td><td>{_badge(str(r["phase"]))}</td>'
                    f'<td>{escape(str(r["active"] or "-"))}</td><td>{escape(str(r["candidate"] or "-"))}</td>'
                    f"<td>{weight}</td><td>{ready}</td><td>{escape(r['reason'] or '-')}</td><td>{changed}</td></tr>")
    state = "" if snap["synced"] else "<p>Listing DecisionModels...</p>"
    table = ('<table class="models"><caption>DecisionModels</caption><thead><tr><th scope="col">Namespace</th>'
             '<th scope="col">Name</th><th scope="col">Phase</th><th scope="col">Active</th>'
             '<th scope="col">Candidate</th><th scope="col">Weight</th><th scope="col">Ready</th>'
             '<th scope="col">Reason</th><th scope="col">Changed</th></tr></thead><tbody>'
             + "".join(rows) + "</tbody></table>") if rows else "<p>No DecisionModels found.</p>"
    return page("Arbiter: DecisionModels", f"<h1>DecisionModels ({len(rows)})</h1>{_problems(snap['problems'])}"
                f"{state}{table}", snap["version"])


def _versions(points: list[tuple[float, str, dict[str, float]]]) -> list[str]:
    return list(dict.fromkeys(v for _, _, weights in points for v in weights))


def _timeline_points(line: list[Point], metrics: ModelMetrics | None) -> list[tuple[float, str, dict[str, float]]]:
    """The watch-observed timeline, with the operator's weight series from Prometheus in front where it reaches back
    further (phases there are not known: shown as the first observed phase's predecessor, unnamed)."""
    points = [(p.at, p.phase, dict(p.weights)) for p in line]
    series = metrics.weights if metrics else []
    first = points[0][0] if points else time.time()
    earlier: dict[float, dict[str, float]] = {}
    for version, values in series:
        for t, w in values:
            if t < first:
                earlier.setdefault(t, {})[version] = w
    return [(t, "history", earlier[t]) for t in sorted(earlier)] + points


def _start(points: list[tuple[float, str, dict[str, float]]], now: float) -> float:
    """Where the timeline's axis begins: at the first point, a little before it; after a long quiet spell (over an
    hour in the first phase), ten minutes before the first change, the quiet phase drawn from the left edge."""
    first = points[0][0]
    if len(points) > 1 and now - first > 3600:
        first = max(first, points[1][0] - 600)
    return first - max(0.5, 0.05 * (now - first))


def _timeline_section(key: Key, snap: dict[str, Any], now: float) -> str:
    points = _timeline_points(snap["timeline"], snap["metrics"])
    if not points:
        return ""
    versions = _versions(points)
    start = _start(points, now)
    svg = timeline(points, versions, start, now, f"Promotion timeline of {key[1]}: phases and traffic per version")
    legend = "".join(f'<li><span class="swatch" style="background:{colour(i)}"></span>{escape(v)}</li>'
                     for i, v in enumerate(versions))
    rows = "".join(f"<tr><td>{time.strftime('%H:%M:%S', time.gmtime(t))}</td><td>{_badge(phase)}</td>"
                   f"<td>{escape(', '.join(f'{v} {w:g}%' for v, w in weights.items()) or '-')}</td></tr>"
                   for t, phase, weights in points)
    return (f'<section aria-labelledby="h-timeline"><h2 id="h-timeline">Promotion timeline and traffic split</h2>'
            f'{svg}<ul class="legend">{legend}</ul><details><summary>As a table</summary><table class="timeline-data">'
            f"<thead><tr><th>Time (UTC)</th><th>Phase</th><th>Traffic</th></tr></thead><tbody>{rows}</tbody>"
            "</table></details></section>")


def _gates_section(promo: dict[str, Any]) -> str:
    last = promo.get("lastAnalysis") or {}
    checks = [c for c in last.get("checks") or [] if isinstance(c, dict)]
    if not last:
        return ('<section aria-labelledby="h-gates"><h2 id="h-gates">Gates</h2><p>No analysis yet.</p></section>')
    rows = []
    for c in checks:
        verdict = str(c.get("verdict") or "")
        failing = verdict == "Fail"
        word = "<=" if c.get("direction", "max") == "max" else ">="
        bound = "-" if c.get("bound") is None else f"{word} {_num(c.get('bound'))}"
        mark = "✗ Fail" if failing else ("✓ Pass" if verdict == "Pass" else escape(verdict or "-"))
        value = c.get("value") if isinstance(c.get("value"), (int, float)) else None
        bar = gate_bar(value, c.get("bound") if isinstance(c.get("bound"), (int, float)) else None,
                       str(c.get("direction", "max")), failing,
                       f"{c.get('name')}: {_num(value)} against {bound}")
        rows.append(f'<tr class="gate{" fail" if failing else ""}" data-gate="{escape(str(c.get("name")))}">'
                    f"<th scope=\"row\">{escape(str(c.get('name')))}</th><td>{_num(value)}</td>"
                    f"<td>{escape(bound)}</td><td class=\"verdict\">{mark}</td><td>{bar}</td></tr>")
    head = (f"<p>Last analysis: <strong>{escape(str(last.get('verdict')))}</strong> at {escape(str(last.get('at')))}"
            f": {escape(str(last.get('message') or ''))}</p>")
    return (f'<section aria-labelledby="h-gates"><h2 id="h-gates">Gates: measured value against bound</h2>{head}'
            '<table class="gates"><thead><tr><th scope="col">Gate</th><th scope="col">Value</th>'
            '<th scope="col">Bound</th><th scope="col">Verdict</th><th scope="col">Value / bound</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></section>")


def _decisions_section(metrics: ModelMetrics | None, labels: list[str], prometheus: bool) -> str:
    title = '<section aria-labelledby="h-decisions"><h2 id="h-decisions">Decisions by version</h2>'
    if not prometheus:
        return title + "<p>Not shown: start the dashboard with <code>--prometheus URL</code> (or set " \
                       "<code>ARBITER_PROMETHEUS_URL</code>) for the decision mix, fallbacks and latency.</p></section>"
    if metrics is None:
        return title + "<p>Reading Prometheus...</p></section>"
    if metrics.error:
        return title + f"<p class=\"error\">{escape(metrics.error)}</p></section>"
    versions = sorted(set(metrics.rate) | set(metrics.mix) | set(metrics.latency))
    # The spec's labels in their order, then any other label a version answered (one colour per label throughout).
    labels = labels + sorted({n for mix in metrics.mix.values() for n in mix} - set(labels))
    rows = []
    for v in versions:
        mix = metrics.mix.get(v, {})
        names = labels
        shares = ", ".join(f"{n} {100 * mix.get(n, 0):.1f}%" for n in names)
        fallbacks = ", ".join(f"{r} {100 * s:.1f}%" for r, s in sorted(metrics.fallbacks.get(v, {}).items()) if s)
        p50, p99 = metrics.latency.get(v, (None, None))
        rows.append(f'<tr data-version="{escape(v)}"><th scope="row">{escape(v)}</th>'
                    f"<td>{metrics.rate.get(v, 0):.2f}</td><td>{stacked_bar(mix, names, f'decision mix of {v}')}"
                    f"<span class=\"mix-text\">{escape(shares)}</span></td><td>{escape(fallbacks or 'none')}</td>"
                    f"<td>{_ms(p50)}</td><td>{_ms(p99)}</td></tr>")
    legend = "".join(f'<li><span class="swatch" style="background:{colour(i)}"></span>{escape(n)}</li>'
                     for i, n in enumerate(labels))
    read_at = time.strftime("%H:%M:%S", time.gmtime(metrics.at))
    return (title + f"<p class=\"note\">Over the last window, from Prometheus at {read_at} UTC.</p>"
            '<table class="decisions"><thead><tr><th scope="col">Version</th><th scope="col">Decisions/s</th>'
            '<th scope="col">Decision mix</th><th scope="col">Fallbacks by reason</th><th scope="col">p50</th>'
            f'<th scope="col">p99</th></tr></thead><tbody>{"".join(rows) or "<tr><td colspan=6>no decisions</td></tr>"}'
            f'</tbody></table><ul class="legend">{legend}</ul></section>')


def _table(caption: str, head: list[str], rows: list[list[str]], css: str) -> str:
    if not rows:
        return ""
    th = "".join(f'<th scope="col">{escape(h)}</th>' for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return (f'<section><h2>{escape(caption)}</h2><table class="{css}"><thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table></section>")


def _history(promo: dict[str, Any]) -> str:
    rows = [[escape(str(r.get("finishedAt", ""))), escape(str(r.get("version", ""))),
             escape(str(r.get("fromVersion") or "-")), f'<span class="outcome-{escape(str(r.get("outcome")))}">'
             f'{escape(str(r.get("outcome", "")))}</span>', f"{r.get('durationSeconds', 0):.0f}s",
             escape(str(r.get("reason") or ""))]
            for r in reversed([r for r in promo.get("history") or [] if isinstance(r, dict)])]
    return _table("Promotion history", ["Finished", "Version", "From", "Outcome", "Duration", "Reason"], rows,
                  "history")


def _conditions(status: dict[str, Any]) -> str:
    rows = [[escape(str(c.get("type"))), f'<span class="status-{escape(str(c.get("status")))}">'
             f'{escape(str(c.get("status")))}</span>', escape(str(c.get("reason") or "")),
             escape(str(c.get("message") or ""))]
            for c in status.get("conditions") or [] if isinstance(c, dict)]
    return _table("Conditions", ["Type", "Status", "Reason", "Message"], rows, "conditions")


def _events(events: list[dict[str, Any]]) -> str:
    rows = []
    for e in reversed(events):
        obj = e.get("involvedObject") or {}
        when = e.get("lastTimestamp") or e.get("eventTime") or (e.get("metadata") or {}).get("creationTimestamp")
        rows.append([escape(str(when or "")), f'<span class="event-{escape(str(e.get("type")))}">'
                     f'{escape(str(e.get("type", "")))}</span>', escape(str(e.get("reason", ""))),
                     escape(f"{obj.get('kind', '')}/{obj.get('name', '')}"), escape(str(e.get("message") or ""))])
    return _table("Recent Events", ["Last seen", "Type", "Reason", "Object", "Message"], rows, "events")


def model_page(key: Key, snap: dict[str, Any], now: float, prometheus: bool) -> str:
    obj = snap["model"]
    if obj is None:
        body = (f"<h1>{escape(key[0])}/{escape(key[1])}</h1><p>Not found"
                f"{'' if snap['synced'] else ' yet (listing DecisionModels...)'}.</p>")
        return page(f"Arbiter: {key[1]}", body, snap["version"])
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    promo = status.get("promotion") or {}
    r = summary(obj)
    wanted = (spec.get("promote") or {}).get("version")
    strategy = (spec.get("promote") or {}).get("strategy", "Immediate")
    facts = (f'<dl class="facts"><dt>Phase</dt><dd>{_badge(str(r["phase"]))}</dd><dt>Wanted</dt>'
             f"<dd>{escape(str(wanted))} ({escape(str(strategy))})</dd><dt>Stable</dt>"
             f"<dd>{escape(str(promo.get('stable') or '-'))}</dd><dt>Candidate</dt>"
             f"<dd>{escape(str(r['candidate'] or '-'))}"
             + (f" at {r['weight']}%" if isinstance(r["weight"], (int, float)) else "") +
             f'</dd><dt>Ready</dt><dd><span class="ready-{escape(r["ready"])}">{escape(r["ready"])}</span> '
             f"{escape(r['reason'])}</dd></dl>")
    failure = (f'<p class="failure" role="alert"><strong>{escape(str(promo.get("failureReason")))}</strong>: '
               f'{escape(str(promo.get("failureMessage") or ""))}</p>') if promo.get("failureReason") else ""
    labels = [str(x) for x in (spec.get("decision") or {}).get("labels") or []]
    body = (f"<h1>{escape(key[0])}/{escape(key[1])}</h1>{_problems(snap['problems'])}{facts}{failure}"
            f"{_timeline_section(key, snap, now)}{_gates_section(promo)}"
            f"{_decisions_section(snap['metrics'], labels, prometheus)}{_history(promo)}{_conditions(status)}"
            f"{_events(snap['events'])}")
    return page(f"Arbiter: {key[1]}", body, snap["version"])


CSS = """
:root{--fg:#1b1b1b;--muted:#555;--line:#ccc;--bad:#a33a00;--good:#00664b;font-family:system-ui,sans-serif;color:var(--fg)}
body{margin:0 auto;max-width:1100px;padding:0 1rem 3rem}
header{display:flex;gap:1rem;align-items:baseline;padding:.6rem 0;border-bottom:1px solid var(--line)}
.home{font-weight:700;text-decoration:none;color:var(--fg)}.ro{color:var(--muted);font-size:.85rem}
table{border-collapse:collapse;width:100%;margin:.4rem 0 1rem}th,td{text-align:left;padding:.3rem .5rem;
border-bottom:1px solid var(--line);vertical-align:middle}caption{text-align:left;font-weight:600}
.phase{display:inline-block;padding:0 .45rem;border-radius:.6rem;background:#e6e6e6;font-size:.85rem}
.phase-Progressing,.phase-Shadowing{background:#d6e8f5}.phase-Paused{background:#f3e1ec}
.phase-Failed,.phase-RollingBack{background:#f7ddd0;color:var(--bad);font-weight:600}.phase-Cooling{background:#d5efe6}
.ready-True,.status-True{color:var(--good)}.ready-False{color:var(--bad);font-weight:600}
tr.gate.fail{background:#fbe9e1}tr.gate.fail .verdict{color:var(--bad);font-weight:700}
.failure{border-left:4px solid var(--bad);padding:.4rem .8rem;background:#fbe9e1}
.problems{border-left:4px solid #E69F00;padding:.2rem .8rem;background:#fdf3e1}
.facts{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}.facts dt{color:var(--muted)}
.legend{display:flex;gap:1rem;list-style:none;padding:0}.swatch{display:inline-block;width:.8rem;height:.8rem;
margin-right:.3rem;vertical-align:middle}.timeline{max-width:100%;height:auto}
.grid{stroke:#ddd}.axis{font-size:11px;fill:var(--muted)}.phase-label{font-size:11px;fill:#fff}
.track{fill:#eee}.bound-mark{stroke:#1b1b1b;stroke-width:2}.mix-text{display:block;font-size:.8rem;color:var(--muted)}
.event-Warning{color:var(--bad);font-weight:600}.note{color:var(--muted);font-size:.85rem}
""".strip()

# The page's one script: when the server says the state changed (Server-Sent Events), fetch the page again and
# swap its <main>; a reader's place and any open <details> stay as they were.
JS = """
(function(){
  if(!window.EventSource||!window.fetch){return;}
  var seen=document.body.getAttribute('data-version');
  var src=new EventSource('/events?since='+encodeURIComponent(seen));
  src.onmessage=function(e){
    if(e.data===seen){return;}
    seen=e.data;
    fetch(location.pathname,{headers:{'Accept':'text/html'}}).then(function(r){return r.text();}).then(function(t){
      var doc=new DOMParser().parseFromString(t,'text/html');
      var open=[].map.call(document.querySelectorAll('details[open] summary'),function(s){return s.textContent;});
      document.getElementById('main').replaceWith(doc.getElementById('main'));
      document.body.setAttribute('data-version',doc.body.getAttribute('data-version'));
      [].forEach.call(document.querySelectorAll('details summary'),function(s){
        if(open.indexOf(s.textContent)>=0){s.parentNode.open=true;}});
    });
  };
})();
""".strip()
