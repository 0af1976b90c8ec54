"""Server-side SVG of the run page (``runs.admin.run_page.layout`` lays out, this draws): the run's
graph and its time line of step attempts. Plain strings, every name escaped; no script
and no external asset, so the page works offline. Colours come from the page's CSS by
class (``st-<status>``), which is what the page's poller changes as the run moves.
"""

from __future__ import annotations

from html import escape

from django.utils.safestring import SafeString, mark_safe

from common.units import duration_text
from runs.admin.run_page.layout import Gantt, Graph, Node

MARGIN = 4
GANTT_LABEL_W, GANTT_W, GANTT_ROW, GANTT_AXIS = 260, 900, 14, 22
AGENT_TEXT_Y, TASK_TEXT_Y = 16, 14  # a box's header line, under its top edge

# Status colours, strong (borders, small squares, the time line) and pale (labelled
# steps' fill), for every status a run, agent, task or step can have.
PALETTE: list[tuple[str, str, str]] = [
    ("created", "#b0bec5", "#eceff1"),
    ("pending", "#90a4ae", "#eceff1"),
    ("running", "#1e88e5", "#bbdefb"),
    ("waiting_approval", "#8e24aa", "#e1bee7"),
    ("paused", "#fb8c00", "#ffe0b2"),
    ("resuming", "#00897b", "#b2dfdb"),
    ("retrying", "#00897b", "#b2dfdb"),
    ("escalated", "#d81b60", "#f8bbd0"),
    ("completed", "#43a047", "#c8e6c9"),
    ("failed", "#e53935", "#ffcdd2"),
    ("skipped", "#9e9e9e", "#f5f5f5"),
    ("cancelled", "#6d4c41", "#d7ccc8"),
]


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "\u2026"


def _badge(node: Node) -> str:
    """Retries made: a step's attempts beyond the first, a task's or agent's reruns."""
    extra = node.attempts - 1 if node.kind == "step" else node.attempts
    return f"\u21bb{extra}" if extra > 0 else ""


def _step(node: Node) -> str:
    waited = f", waited {duration_text(node.waited_ms)}" if node.waited_ms else ""
    borrowed = f", {node.borrowed}: not run, not charged" if node.borrowed else ""
    title = escape(f"{node.name}: {node.status}, {node.attempts} attempt(s){waited}{borrowed}")
    classes = f"node step st-{node.status}" + (" handler" if node.handler else "")
    classes += f" {node.borrowed}" if node.borrowed else ""
    classes += " cell" if node.compact else ""
    head = (
        f'<g id="{node.dom_id}" class="{classes}" data-status="{node.status}">'
        f"<title>{title}</title>"
        f'<rect x="{node.x}" y="{node.y}" width="{node.w}" height="{node.h}" rx="3"/>'
    )
    if node.compact:
        return head + "</g>"
    return (
        head + f'<text x="{node.x + 6}" y="{node.y + 15}">{escape(_clip(node.name, 17))}</text>'
        f'<text class="badge" x="{node.x + node.w - 4}" y="{node.y + 15}" '
        f'text-anchor="end">{_badge(node)}</text></g>'
    )


def _box(node: Node, out: list[str]) -> None:
    """An agent or a task: a framed box with its name, status and retry badge, then
    what it holds."""
    head = AGENT_TEXT_Y if node.kind == "agent" else TASK_TEXT_Y
    title = escape(f"{node.kind} {node.name}: {node.status}")
    out.append(
        f'<g id="{node.dom_id}" class="node {node.kind} st-{node.status}" '
        f'data-status="{node.status}"><title>{title}</title>'
        f'<rect x="{node.x}" y="{node.y}" width="{node.w}" height="{node.h}" rx="5"/>'
        f'<text class="name" x="{node.x + 6}" y="{node.y + head}">'
        f'{escape(_clip(node.name, 28))}<tspan class="badge" dx="6">{_badge(node)}</tspan></text>'
        f'<text class="status" x="{node.x + node.w - 6}" y="{node.y + head}" '
        f'text-anchor="end">{node.status}</text></g>'
    )
    if node.hidden_steps:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(node.hidden_steps.items()))
        out.append(
            f'<text class="counts" x="{node.x + 6}" y="{node.y + head + 16}">'
            f"{escape(_clip(counts, 40))}</text>"
        )
    for child in node.children:
        if child.kind == "step":
            out.append(_step(child))
        else:
            _box(child, out)


def graph_svg(graph: Graph) -> SafeString:
    out = [
        f'<svg id="run-graph" xmlns="http://www.w3.org/2000/svg" '
        f'width="{graph.width + 2 * MARGIN}" height="{graph.height + 2 * MARGIN}">'
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z"/></marker></defs>'
        f'<g transform="translate({MARGIN},{MARGIN})">'
    ]
    for agent in graph.agents:
        _box(agent, out)
    out.append('<g class="edges">')
    for edge in graph.edges:
        source, target = edge.source, edge.target
        x1, y1 = source.x + source.w, source.y + source.h // 2
        x2, y2 = target.x, target.y + target.h // 2
        kind = "edge handler" if edge.handler else "edge"
        out.append(
            f'<line class="{kind}" x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" '
            'marker-end="url(#arrow)"/>'
        )
    out.append("</g></g></svg>")
    return mark_safe("".join(out))  # noqa: S308 - every name above went through escape()


def _ticks(span: float) -> list[float]:
    """About six round ticks over ``span`` seconds."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200):
        if span / step <= 6:
            break
    else:
        step = span / 6
    count = int(span // step) + 1
    return [round(i * step, 3) for i in range(count)]


def gantt_svg(gantt: Gantt) -> SafeString:
    span = gantt.span or 1.0
    scale = GANTT_W / span
    height = GANTT_AXIS + len(gantt.rows) * GANTT_ROW + MARGIN
    out = [
        # Scaled to the page's width (viewBox): a time line is read whole, not scrolled.
        f'<svg id="run-gantt" xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'viewBox="0 0 {GANTT_LABEL_W + GANTT_W + 30} {height}">'
        '<defs><pattern id="hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="2" height="4" class="hatch"/></pattern>'
        "</defs>"
    ]
    for tick in _ticks(span):
        x = GANTT_LABEL_W + tick * scale
        out.append(
            f'<line class="tick" x1="{x:.1f}" y1="{GANTT_AXIS - 6}" x2="{x:.1f}" y2="{height}"/>'
            f'<text class="axis" x="{x:.1f}" y="{GANTT_AXIS - 9}" text-anchor="middle">'
            f"{tick:g} s</text>"
        )
    for index, row in enumerate(gantt.rows):
        y = GANTT_AXIS + index * GANTT_ROW
        out.append(
            f'<g class="gantt-row" data-step="{row.step_id}">'
            f'<text class="label" x="{GANTT_LABEL_W - 6}" y="{y + 10}" text-anchor="end">'
            f"{escape(_clip(row.label, 40))}</text>"
        )
        for segment in row.segments:
            x = GANTT_LABEL_W + segment.start * scale
            width = max((segment.end - segment.start) * scale, 1.0)
            took = segment.end - segment.start
            if segment.kind == "run":
                css = f"seg run st-{segment.outcome}"
                title = f"attempt {segment.attempt}: ran {took:.3f} s, {segment.outcome}"
            elif segment.kind == "decision":
                css = f"seg decision st-{segment.outcome}"
                title = f"waited {took:.3f} s for a decision: {segment.outcome}"
            elif segment.kind == "backoff":
                css = "seg backoff"
                title = f"retry backoff after attempt {segment.attempt}: {took:.3f} s"
            elif segment.kind == "wait":
                css, title = "seg wait", f"waited {took:.3f} s parked (a rate limit, a timer)"
            else:
                css, title = "seg queue", f"waited {took:.3f} s for a worker"
            out.append(
                f'<rect class="{css}" x="{x:.1f}" y="{y + 2}" width="{width:.1f}" '
                f'height="{GANTT_ROW - 4}"><title>{escape(row.label)}: {escape(title)}</title>'
                "</rect>"
            )
        out.append("</g>")
    out.append("</svg>")
    return mark_safe("".join(out))  # noqa: S308 - every name above went through escape()
