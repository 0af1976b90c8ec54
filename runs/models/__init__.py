"""The run app's models, one module per room of the app (Django registers the models
it finds here; every module of the app imports them from ``runs.models``):

- ``hierarchy``: Run -> RunAttempt -> Agent -> Task -> Step, and the step cache;
- ``events``: a run's history, its event rows and the view over them and its steps' rows;
- ``waits``: runners and their jobs, and a callback's or poll's wait (``runs.waits``);
- ``tools``: the catalogue of published tools (``runs.catalogue``);
- ``people``: failures on record, escalation tickets, notifications, re-plans
  (``runs.people``);
- ``admission``: fair turns and step slots (``runs.admission``).
"""

from runs.models.admission import FairTurn, StepSlot
from runs.models.base import Timestamps
from runs.models.events import Event, EventKind, HistoryEvent, HistoryManager, RunEvent
from runs.models.hierarchy import (
    Agent,
    FailureMode,
    Mode,
    Node,
    Run,
    RunAttempt,
    Step,
    StepCacheEntry,
    Task,
)
from runs.models.people import (
    EscalationReason,
    EscalationStatus,
    EscalationTicket,
    Notification,
    NotificationChannel,
    Replan,
    ReplanStatus,
    ReplanTrigger,
    Resolution,
    Severity,
    StepFailure,
)
from runs.models.tools import PublishedTool, ToolPlacement
from runs.models.waits import (
    NO_WORKER_OFFERS_TOOL,
    Runner,
    RunnerJob,
    RunnerJobStatus,
    StepWait,
    StepWaitKind,
    StepWaitStatus,
)

__all__ = [
    "NO_WORKER_OFFERS_TOOL",
    "Agent",
    "EscalationReason",
    "EscalationStatus",
    "EscalationTicket",
    "Event",
    "EventKind",
    "FailureMode",
    "FairTurn",
    "HistoryEvent",
    "HistoryManager",
    "Mode",
    "Node",
    "Notification",
    "NotificationChannel",
    "PublishedTool",
    "Replan",
    "ReplanStatus",
    "ReplanTrigger",
    "Resolution",
    "Run",
    "RunAttempt",
    "RunEvent",
    "Runner",
    "RunnerJob",
    "RunnerJobStatus",
    "Severity",
    "Step",
    "StepCacheEntry",
    "StepFailure",
    "StepSlot",
    "StepWait",
    "StepWaitKind",
    "StepWaitStatus",
    "Task",
    "Timestamps",
    "ToolPlacement",
]
