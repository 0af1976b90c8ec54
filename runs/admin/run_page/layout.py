"""What the operators' run page shows: the run as a graph, its step attempts on a time
line, its progress and credits, the steps waiting for a decision, and the small live
state the page polls while the run moves.

Reads only, a fixed number of queries whatever the size of the run (one per level of the
hierarchy, one for the step events of the time line), and layouts computed in one pass
over the rows: a 2,000-step run is a few thousand rows and no per-row query. Drawing is
``runs.admin.run_page.svg``'s; the admin (``runs.admin.run_page.view``) wires both into the page.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from runs.models import Agent, HistoryEvent, Run, Step, Task
from runs.selectors import (
    RunSummary,
    attach_credits,
    run_history,
    run_summary,
    with_paths,
    with_work,
)
from runs.states import RUN_TERMINAL, StepStatus

# Past this many steps in the current attempt the graph draws agents and tasks with their
# step counts, not every step: the page stays a page (and its SVG under a megabyte).
GRAPH_MAX_STEPS = 5_000
# Rows of the time line: the first steps to have started. The API's events have all.
GANTT_MAX_ROWS = 400
EVENTS_PER_PAGE = 50

# A task drawing more steps than this uses small unlabelled squares (the name and the
# status are in each square's tooltip).
LABELLED_STEPS_MAX = 40
STEP_W, STEP_H, STEP_GAP = 150, 22, 6
CELL, CELL_GAP = 12, 3
TASK_HEAD, TASK_PAD = 20, 6
AGENT_HEAD, AGENT_PAD = 24, 8
# Wrapping: a column taller than this is split beside itself; a row of columns wider
# than this continues below (a 2,000-step sequential task is a few lines, not a
# 2,000-column strip).
STEPS_MAX_H, STEPS_MAX_W = 600, 1200
TASKS_MAX_H, TASKS_MAX_W = 1400, 1800
AGENTS_MAX_H, AGENTS_MAX_W = 100_000, 100_000


@dataclass
class Node:
    """One agent, task or step of the graph: where it is drawn (relative to its parent
    until ``absolute`` runs) and what it shows."""

    kind: str  # "agent", "task" or "step"
    pk: int
    name: str
    status: str
    position: int
    w: int = 0
    h: int = 0
    x: int = 0
    y: int = 0
    attempts: int = 0  # steps: attempts made; agents and tasks: times retried
    waited_ms: int = 0  # steps: the time parked (a rate limit's line, a timer)
    handler: bool = False  # an on_error or on_callback step
    borrowed: str = ""  # a step completed without running: "reused" or "cached"
    compact: bool = False
    dependents: list[str] = field(default_factory=list)
    after: int | None = None  # a handler step: the step it handles
    children: list[Node] = field(default_factory=list)
    hidden_steps: dict[str, int] = field(default_factory=dict)  # counts when not drawn

    @property
    def dom_id(self) -> str:
        return f"n-{self.kind[0]}{self.pk}"


@dataclass
class Edge:
    source: Node
    target: Node
    handler: bool = False


@dataclass
class Graph:
    agents: list[Node]
    edges: list[Edge]
    width: int
    height: int
    steps_drawn: bool
    step_count: int


@dataclass
class Segment:
    # "queue", "backoff", "run", "decision" (waiting for an approval) or "wait" (parked:
    # in a rate limit's line, on a timer)
    kind: str
    start: float  # seconds from the time line's origin
    end: float
    outcome: str = ""  # a run segment: how the attempt ended ("running" while it runs)
    attempt: int = 0


@dataclass
class GanttRow:
    step_id: int
    label: str
    segments: list[Segment]


@dataclass
class Gantt:
    rows: list[GanttRow]
    origin: datetime | None
    span: float  # seconds from the origin to the last end
    steps_total: int  # steps that started at least once (rows beyond the cap included)


@dataclass(frozen=True)
class Credits:
    reserved: Decimal
    charged: Decimal
    refunded: Decimal
    held: Decimal


@dataclass(frozen=True)
class Waiting:
    step_id: int
    path: str
    since: datetime


@dataclass(frozen=True)
class Work:
    """A step whose work runs elsewhere: a runner's job, or a child run."""

    step_id: int
    path: str
    tool: str
    status: str
    job: Any  # UUID or None
    child_run: Any  # UUID or None
    waiting_reason: str = ""  # a worker tool's: no_worker_offers_tool while none offers it


@dataclass
class RunPage:
    run: Run
    summary: RunSummary
    credits: Credits
    graph: Graph
    gantt: Gantt
    waiting: list[Waiting]
    work: list[Work]
    live: bool
    reload_token: str


# --------------------------------------------------------------------------- layout
def _columns(nodes: Sequence[Node], handlers_after: dict[int, list[Node]]) -> list[list[Node]]:
    """``nodes`` in columns by their depth in the DAG their ``dependents`` draw (the
    longest path from a root), each column in plan order. A handler step goes one column
    after the step it handles."""
    by_name = {node.name: node for node in nodes if not node.handler}
    depth: dict[int, int] = {}
    waiting: defaultdict[int, int] = defaultdict(int)
    for node in by_name.values():
        for name in node.dependents:
            if name in by_name:
                waiting[by_name[name].pk] += 1
    ready = [node for node in by_name.values() if not waiting[node.pk]]
    for node in ready:
        depth[node.pk] = 0
    while ready:
        node = ready.pop()
        for name in node.dependents:
            nxt = by_name.get(name)
            if nxt is None:
                continue
            depth[nxt.pk] = max(depth.get(nxt.pk, 0), depth[node.pk] + 1)
            waiting[nxt.pk] -= 1
            if not waiting[nxt.pk]:
                ready.append(nxt)
    for node in by_name.values():  # a cycle the plan would have refused: drawn first
        depth.setdefault(node.pk, 0)
    for node in nodes:
        if node.handler:
            continue
        for index, handler in enumerate(handlers_after.get(node.pk, ())):
            depth[handler.pk] = depth[node.pk] + 1 + index
    for node in nodes:  # a handler whose step is not drawn (another generation)
        depth.setdefault(node.pk, 0)
    columns: list[list[Node]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for node in sorted(nodes, key=lambda n: (n.position, n.pk)):
        columns[depth[node.pk]].append(node)
    return columns


def _flow(columns: list[list[Node]], gap: int, max_h: int, max_w: int) -> tuple[int, int]:
    """Place sized nodes column by column (relative to 0, 0): a column taller than
    ``max_h`` continues beside itself, and the columns continue below once a line is
    wider than ``max_w``. Returns the size taken."""
    split: list[list[Node]] = []
    for column in columns:
        chunk: list[Node] = []
        height = 0
        for node in column:
            if chunk and height + node.h > max_h:
                split.append(chunk)
                chunk, height = [], 0
            chunk.append(node)
            height += node.h + gap
        if chunk:
            split.append(chunk)
    spacing = gap * 3  # between columns: room for the edges
    x = y = line_h = width = 0
    for chunk in split:
        chunk_w = max(node.w for node in chunk)
        if x and x + chunk_w > max_w:
            x, y, line_h = 0, y + line_h + spacing, 0
        top = y
        for node in chunk:
            node.x, node.y = x, top
            top += node.h + gap
        line_h = max(line_h, top - gap - y)
        width = max(width, x + chunk_w)
        x += chunk_w + spacing
    return width, y + line_h


def _place_task(task: Node, steps: list[Node], handlers_after: dict[int, list[Node]]) -> None:
    compact = len(steps) > LABELLED_STEPS_MAX
    for step in steps:
        step.compact = compact
        step.w, step.h = (CELL, CELL) if compact else (STEP_W, STEP_H)
    gap = CELL_GAP if compact else STEP_GAP
    width, height = _flow(_columns(steps, handlers_after), gap, STEPS_MAX_H, STEPS_MAX_W)
    for step in steps:
        step.x += TASK_PAD
        step.y += TASK_HEAD
    task.children = steps
    task.w = max(width + 2 * TASK_PAD, STEP_W + 2 * TASK_PAD)
    task.h = TASK_HEAD + height + TASK_PAD


def _place_parent(
    parent: Node, children: list[Node], head: int, pad: int, max_h: int, max_w: int
) -> None:
    width, height = _flow(_columns(children, {}), 10, max_h, max_w)
    for child in children:
        child.x += pad
        child.y += head
    parent.children = children
    parent.w = max(width + 2 * pad, 180)
    parent.h = head + height + pad


def _absolute(nodes: Iterable[Node], dx: int, dy: int) -> None:
    for node in nodes:
        node.x += dx
        node.y += dy
        _absolute(node.children, node.x, node.y)


def _edges(parents: Iterable[Node], edges: list[Edge]) -> None:
    """Every DAG edge among siblings (and each handler from its step), depth first."""
    for parent in parents:
        siblings = {node.name: node for node in parent.children if not node.handler}
        by_pk = {node.pk: node for node in parent.children}
        for node in parent.children:
            if node.handler and node.after in by_pk:
                edges.append(Edge(by_pk[node.after], node, handler=True))
            for name in node.dependents:
                if name in siblings and not node.handler:
                    edges.append(Edge(node, siblings[name]))
        _edges(parent.children, edges)


def run_graph(run: Run, step_count: int | None = None) -> Graph:
    """The current attempt laid out: agents side by side as their DAG orders them, each
    holding its tasks, each task its steps; the latest generation of each (a task's
    earlier generations are its retries, counted on its badge). Three queries."""
    attempt = run.attempt_number
    agents = [
        Node("agent", a.pk, a.name, a.status, a.position, attempts=a.retry_count,
             dependents=list(a.dependents))
        for a in Agent.objects.filter(run=run, attempt_number=attempt).only(
            "id", "name", "status", "position", "retry_count", "dependents"
        )
    ]  # fmt: skip
    tasks_of: dict[int, list[Node]] = defaultdict(list)
    task_rows = Task.objects.filter(run=run, attempt_number=attempt).values_list(
        "id", "agent_id", "name", "status", "position", "retry_count", "dependents", "generation"
    )
    latest_task_gen: dict[int, int] = {}
    rows = list(task_rows)
    for _, agent_id, _, _, _, _, _, generation in rows:
        latest_task_gen[agent_id] = max(latest_task_gen.get(agent_id, 0), generation)
    for pk, agent_id, name, status, position, retries, dependents, generation in rows:
        if generation == latest_task_gen[agent_id]:
            node = Node("task", pk, name, status, position, attempts=retries,
                        dependents=list(dependents))  # fmt: skip
            tasks_of[agent_id].append(node)
    if step_count is None:  # run_page knows it from the run's summary
        step_count = Step.objects.filter(run=run, attempt_number=attempt).count()
    draw_steps = step_count <= GRAPH_MAX_STEPS
    steps_of: dict[int, list[Node]] = defaultdict(list)
    hidden: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    handlers_after: dict[int, list[Node]] = defaultdict(list)
    if draw_steps:
        step_rows = list(
            Step.objects.filter(run=run, attempt_number=attempt).values_list(
                "id", "task_id", "name", "status", "position", "attempts", "dependents",
                "generation", "handler_for_id", "callback_for_id", "waited_ms", "reused_from",
                "cached_from",
            )
        )  # fmt: skip
        latest_step_gen: dict[int, int] = {}
        for row in step_rows:
            latest_step_gen[row[1]] = max(latest_step_gen.get(row[1], 0), row[7])
        for (pk, task_id, name, status, position, attempts, deps, gen, handles, calls, waited,
             reused, cached) in step_rows:  # fmt: skip
            if gen != latest_step_gen[task_id]:
                continue
            after = handles or calls
            borrowed = "reused" if reused else "cached" if cached else ""
            node = Node("step", pk, name, status, position, attempts=attempts,
                        handler=after is not None, after=after, dependents=list(deps),
                        waited_ms=waited, borrowed=borrowed)  # fmt: skip
            steps_of[task_id].append(node)
            if after is not None:
                handlers_after[after].append(node)
    else:
        counted = (
            Step.objects.filter(run=run, attempt_number=attempt)
            .values_list("task_id", "status")
            .order_by()
        )
        for task_id, status, n in counted.annotate(n=Count("*")).values_list(
            "task_id", "status", "n"
        ):
            hidden[task_id][status] += n
    for tasks in tasks_of.values():
        for task in tasks:
            if draw_steps:
                _place_task(task, steps_of.get(task.pk, []), handlers_after)
            else:
                task.hidden_steps = dict(hidden.get(task.pk, {}))
                task.w, task.h = 200, TASK_HEAD + 20
    for agent in agents:
        _place_parent(agent, tasks_of.get(agent.pk, []), AGENT_HEAD, AGENT_PAD,
                      TASKS_MAX_H, TASKS_MAX_W)  # fmt: skip
    root = Node("run", 0, run.name, run.status, 0)
    _place_parent(root, agents, 0, 0, AGENTS_MAX_H, AGENTS_MAX_W)
    _absolute(agents, 0, 0)
    edges: list[Edge] = []
    _edges([root], edges)
    return Graph(agents, edges, root.w, root.h, draw_steps, step_count)


# --------------------------------------------------------------------------- time line
def _seconds(moment: datetime, origin: datetime) -> float:
    return (moment - origin).total_seconds()


def run_gantt(run: Run, now: datetime | None = None) -> Gantt:
    """Each step's attempts on one time line, from the step events of the current attempt
    (two queries): an attempt runs from its claim (``pending -> running``) to the next
    transition of the step; before it, the wait in the queue (from the dispatch for the
    first attempt, from the end of the backoff for a retry) and the backoff itself (the
    retry event's ``delay_ms``). A step parked (a rate limit's line, a wait's timer: the
    claim gave back, its event names ``until``) waits from that claim to the next: the
    time its ``waited_ms`` counts, drawn as its own bar."""
    now = now or timezone.now()
    attempt = run.attempt_number
    steps = {
        pk: (f"{agent}.{task}.{name}", dispatched)
        for pk, agent, task, name, dispatched in Step.objects.filter(
            run=run, attempt_number=attempt
        ).values_list("id", "task__agent__name", "task__name", "name", "dispatched_at")
    }
    events = (
        run_history(run)
        .filter(attempt_number=attempt, entity="step", kind__in=("transition", "retry"))
        .values_list("entity_id", "from_status", "to_status", "payload", "created_at")
    )
    per_step: dict[int, list[tuple[str, str, Any, datetime]]] = defaultdict(list)
    for entity_id, source, target, payload, at in events:
        per_step[int(entity_id)].append((source, target, payload, at))
    started = sorted(
        (next(at for _, target, _, at in history if target in _BEGINS), pk)
        for pk, history in per_step.items()
        if pk in steps and any(target in _BEGINS for _, target, _, _ in history)
    )
    origin = min((at for at, _ in started), default=None)
    if origin is not None:
        for _, pk in started:
            dispatched_at = steps[pk][1]
            if dispatched_at is not None and dispatched_at < origin:
                origin = dispatched_at
    rows: list[GanttRow] = []
    span = 0.0
    for _, pk in started[:GANTT_MAX_ROWS]:
        assert origin is not None
        label, dispatched_at = steps[pk]
        segments = _segments(per_step[pk], dispatched_at, origin, now)
        span = max(span, *(segment.end for segment in segments))
        rows.append(GanttRow(pk, label, segments))
    return Gantt(rows, origin, span, len(started))


# What starts a row of the time line: a claim by a worker, or a wait for people.
_BEGINS = (StepStatus.RUNNING, StepStatus.WAITING_APPROVAL)


def _segments(
    history: list[tuple[str, str, Any, datetime]],
    dispatched_at: datetime | None,
    origin: datetime,
    now: datetime,
) -> list[Segment]:
    segments: list[Segment] = []
    ready_at = dispatched_at
    running: tuple[datetime, int] | None = None
    deciding = False  # ``running`` is a wait for an approval, not a worker's attempt
    parked: datetime | None = None  # since when the step waits parked
    for source, target, payload, at in history:
        payload = payload if isinstance(payload, dict) else {}
        if target == StepStatus.WAITING_APPROVAL:
            running = (at, int(payload.get("attempt") or 0))
            ready_at = None
            deciding = True
            continue
        if target == StepStatus.RUNNING:
            if parked is not None:
                segments.append(Segment("wait", _seconds(parked, origin), _seconds(at, origin)))
                parked = None
            elif ready_at is not None and ready_at < at:
                segments.append(Segment("queue", _seconds(ready_at, origin), _seconds(at, origin)))
            running = (at, int(payload.get("attempt") or 0))
            ready_at = None
        elif source == StepStatus.RUNNING and running is not None and "until" in payload:
            # A park: the claim ran no tool, it gave the attempt back to wait.
            parked, running, ready_at = running[0], None, None
        elif source in _BEGINS and running is not None:
            start, number = running
            kind = "decision" if deciding else "run"
            segments.append(
                Segment(kind, _seconds(start, origin), _seconds(at, origin), target, number)
            )
            deciding = False
            running = None
            delay = payload.get("delay_ms")
            if target == StepStatus.PENDING and isinstance(delay, int | float) and delay > 0:
                until = at + timedelta(milliseconds=delay)
                backoff = Segment("backoff", _seconds(at, origin), _seconds(until, origin))
                backoff.attempt = number
                segments.append(backoff)
                ready_at = until
            elif target == StepStatus.PENDING:
                ready_at = at
    if parked is not None:
        segments.append(Segment("wait", _seconds(parked, origin), _seconds(now, origin)))
    if running is not None:
        start, number = running
        kind, outcome = ("decision", "waiting_approval") if deciding else ("run", "running")
        segments.append(
            Segment(kind, _seconds(start, origin), _seconds(now, origin), outcome, number)
        )
    return segments


# --------------------------------------------------------------------------- the page
def run_credits(run: Run) -> Credits:
    row = attach_credits([{"id": run.pk}])[0]
    return Credits(
        reserved=row["credits_reserved"],
        charged=row["credits_charged"],
        refunded=row["credits_refunded"],
        held=row["credits_held"],
    )


def waiting_steps(run: Run) -> list[Waiting]:
    """The current attempt's steps waiting for an approval, in plan order."""
    rows = (
        Step.objects.filter(
            run=run, attempt_number=run.attempt_number, status=StepStatus.WAITING_APPROVAL
        )
        .order_by("task__agent__position", "task__position", "generation", "position")
        .values_list("id", "task__agent__name", "task__name", "name", "status_changed_at")
    )
    return [Waiting(pk, f"{a}.{t}.{s}", since) for pk, a, t, s, since in rows[:100]]


WORK_SHOWN = 100


def work_elsewhere(run: Run) -> list[Work]:
    """The current attempt's `runner` and `run` steps and worker tools' steps (parked on a
    job), in plan order, with the job or the child run each one's current attempt started
    (``selectors.with_work``)."""
    steps = Step.objects.filter(run=run, attempt_number=run.attempt_number).filter(
        Q(tool__in=("runner", "run")) | Q(tool__contains=".")
    )
    rows = (
        with_work(steps.select_related("task__agent"))
        .filter(Q(tool__in=("runner", "run")) | Q(job__isnull=False))
        .order_by("task__agent__position", "task__position", "generation", "position")
    )[:WORK_SHOWN]
    return [
        Work(
            step.pk,
            f"{step.task.agent.name}.{step.task.name}.{step.name}",
            step.tool,
            step.status,
            step.job,  # type: ignore[attr-defined]
            step.child_run,  # type: ignore[attr-defined]
            step.waiting_reason,
        )
        for step in rows
    ]


def _reload_token(run: Run, step_count: int, waiting: list[Waiting]) -> str:
    """Changes when the page must be drawn again rather than patched: the run's status or
    attempt, the steps it holds (a re-plan, a handler), the steps waiting for people."""
    text = f"{run.status}|{run.attempt_number}|{step_count}|{[w.step_id for w in waiting]}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _step_count(summary: RunSummary) -> int:
    """Every step of the current attempt, handlers included (the summary's counts)."""
    return sum(summary.counts["steps"].values())


def run_page(run: Run) -> RunPage:
    summary = run_summary(run)
    graph = run_graph(run, _step_count(summary))
    waiting = waiting_steps(run)
    return RunPage(
        run=run,
        summary=summary,
        credits=run_credits(run),
        graph=graph,
        gantt=run_gantt(run),
        waiting=waiting,
        work=work_elsewhere(run),
        live=run.status not in RUN_TERMINAL,
        reload_token=_reload_token(run, graph.step_count, waiting),
    )


def run_live(run: Run) -> dict[str, Any]:
    """The small state the page polls while the run is live: every drawn node's status
    (and a step's attempts), the progress, the credits, and when to draw it again."""
    attempt = run.attempt_number
    nodes: dict[str, list[Any]] = {}
    for pk, status, retries in Agent.objects.filter(run=run, attempt_number=attempt).values_list(
        "id", "status", "retry_count"
    ):
        nodes[f"n-a{pk}"] = [status, retries]
    for pk, status, retries in Task.objects.filter(run=run, attempt_number=attempt).values_list(
        "id", "status", "retry_count"
    ):
        nodes[f"n-t{pk}"] = [status, retries]
    summary = run_summary(run)
    step_count = _step_count(summary)
    if step_count <= GRAPH_MAX_STEPS:
        steps = Step.objects.filter(run=run, attempt_number=attempt)
        for pk, status, attempts in steps.values_list("id", "status", "attempts"):
            nodes[f"n-s{pk}"] = [status, attempts]
    credits = run_credits(run)
    waiting = waiting_steps(run)
    return {
        "status": run.status,
        "live": run.status not in RUN_TERMINAL,
        "progress": {
            "percent": summary.percent,
            "steps_finished": summary.steps_finished,
            "steps_total": summary.steps_total,
        },
        "counts": summary.counts,
        "credits": {name: str(value) for name, value in credits.__dict__.items()},
        "nodes": nodes,
        "reload_token": _reload_token(run, step_count, waiting),
    }


def event_page(run: Run, before: int | None) -> tuple[list[HistoryEvent], int | None]:
    """One page of the run's events (its history), newest first, before the event id
    ``before`` (the newest page when None), and the id to ask for the next (older) page,
    None at the end. Keyset paging on the history's (run, id) indexes: any page costs the
    same."""
    events = with_paths(run_history(run))
    if before is not None:
        events = events.filter(id__lt=before)
    page = list(events.order_by("-id")[: EVENTS_PER_PAGE + 1])
    older = page[EVENTS_PER_PAGE - 1].pk if len(page) > EVENTS_PER_PAGE else None
    return page[:EVENTS_PER_PAGE], older
