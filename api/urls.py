"""Routes under /api/v1/ (namespace ``api``)."""

from __future__ import annotations

from django.urls import path

from api import artifacts as artifact_api
from api import callbacks as callback_api
from api import escalations as escalation_api
from api import index, streams
from api import ratelimits as rate_limit_api
from api import reuse as reuse_api
from api import runners as runner_api
from api import runs as run_api
from api import schedules as schedule_api
from api import tools as tool_api
from api import webhooks as webhook_api
from api.billing import BalanceApi, LedgerApi, OrganizationApi, SecretApi, SecretsApi

app_name = "api"

urlpatterns = [
    path("", index.ApiIndexApi.as_view(), name="index"),
    path("runs", run_api.RunsApi.as_view(), name="runs"),
    path("runs/<uuid:run_id>", run_api.RunApi.as_view(), name="run"),
    path("runs/<uuid:run_id>/start", run_api.RunStartApi.as_view(), name="run-start"),
    path("runs/<uuid:run_id>/cancel", run_api.RunCancelApi.as_view(), name="run-cancel"),
    path("runs/<uuid:run_id>/pause", run_api.RunPauseApi.as_view(), name="run-pause"),
    path("runs/<uuid:run_id>/resume", run_api.RunResumeApi.as_view(), name="run-resume"),
    path("runs/<uuid:run_id>/retry", run_api.RunRetryApi.as_view(), name="run-retry"),
    path("runs/<uuid:run_id>/fork", reuse_api.RunForkApi.as_view(), name="run-fork"),
    path("cache/invalidate", reuse_api.CacheInvalidateApi.as_view(), name="cache-invalidate"),
    path("runs/<uuid:run_id>/callback", callback_api.RunCallbackApi.as_view(), name="run-callback"),
    path("runs/<uuid:run_id>/approve", run_api.RunApproveApi.as_view(), name="run-approve"),
    path("runs/<uuid:run_id>/reject", run_api.RunRejectApi.as_view(), name="run-reject"),
    path("runs/<uuid:run_id>/agents", run_api.RunAgentsApi.as_view(), name="run-agents"),
    path("runs/<uuid:run_id>/tasks", run_api.RunTasksApi.as_view(), name="run-tasks"),
    path("runs/<uuid:run_id>/steps", run_api.RunStepsApi.as_view(), name="run-steps"),
    path("runs/<uuid:run_id>/events", run_api.RunEventsApi.as_view(), name="run-events"),
    path(
        "runs/<uuid:run_id>/events/stream",
        streams.RunEventsStreamApi.as_view(),
        name="run-events-stream",
    ),
    path(
        "runs/<uuid:run_id>/artifacts", artifact_api.RunArtifactsApi.as_view(), name="run-artifacts"
    ),
    path(
        "runs/<uuid:run_id>/artifacts/uploads",
        artifact_api.RunArtifactUploadsApi.as_view(),
        name="run-artifact-uploads",
    ),
    path("artifacts/<uuid:artifact_id>", artifact_api.ArtifactApi.as_view(), name="artifact"),
    path(
        "artifacts/<uuid:artifact_id>/complete",
        artifact_api.ArtifactCompleteApi.as_view(),
        name="artifact-complete",
    ),
    path(
        "artifacts/<uuid:artifact_id>/content",
        artifact_api.ArtifactContentApi.as_view(),
        name="artifact-content",
    ),
    path(
        "artifacts/<uuid:artifact_id>/download",
        artifact_api.ArtifactDownloadApi.as_view(),
        name="artifact-download",
    ),
    path("billing/balance", BalanceApi.as_view(), name="billing-balance"),
    path("organization", OrganizationApi.as_view(), name="organization"),
    path("billing/ledger", LedgerApi.as_view(), name="billing-ledger"),
    path("secrets", SecretsApi.as_view(), name="secrets"),
    path("secrets/<str:name>", SecretApi.as_view(), name="secret"),
    path("rate-limits", rate_limit_api.RateLimitsApi.as_view(), name="rate-limits"),
    path("rate-limits/<str:name>", rate_limit_api.RateLimitApi.as_view(), name="rate-limit"),
    path("tools", tool_api.ToolsApi.as_view(), name="tools"),
    path("tools/<str:name>", tool_api.ToolApi.as_view(), name="tool"),
    # The runner protocol (docs/runners.md)
    path("runner/register", runner_api.RegisterApi.as_view(), name="runner-register"),
    path("runner/jobs", runner_api.PollApi.as_view(), name="runner-poll"),
    path("runner/heartbeat", runner_api.HeartbeatApi.as_view(), name="runner-heartbeat"),
    path("runner/deregister", runner_api.DeregisterApi.as_view(), name="runner-deregister"),
    path("runner/jobs/<uuid:job_id>/started", runner_api.StartedApi.as_view(), name="job-started"),
    path(
        "runner/jobs/<uuid:job_id>/completed",
        runner_api.CompletedApi.as_view(),
        name="job-completed",
    ),
    path("runner/jobs/<uuid:job_id>/failed", runner_api.FailedApi.as_view(), name="job-failed"),
    path("runner/jobs/<uuid:job_id>/stopped", runner_api.StoppedApi.as_view(), name="job-stopped"),
    path("runner/reports", runner_api.ReportsApi.as_view(), name="runner-reports"),
    path(
        "runner/jobs/<uuid:job_id>/artifacts",
        artifact_api.JobArtifactsApi.as_view(),
        name="job-artifacts",
    ),
    path("runners", runner_api.RunnersApi.as_view(), name="runners"),
    path("runner-jobs", runner_api.RunnerJobsApi.as_view(), name="runner-jobs"),
    path("runner-jobs/<uuid:job_id>", runner_api.RunnerJobApi.as_view(), name="runner-job"),
    path(
        "runner-jobs/<uuid:job_id>/stop",
        runner_api.RunnerJobStopApi.as_view(),
        name="runner-job-stop",
    ),
    # Asynchronous steps (docs/runners.md): no API key, the token is the credential.
    path("callbacks/<str:token>", callback_api.CallbackApi.as_view(), name="callback"),
    path("escalations", escalation_api.EscalationsApi.as_view(), name="escalations"),
    path(
        "escalations/<uuid:escalation_id>",
        escalation_api.EscalationApi.as_view(),
        name="escalation",
    ),
    path(
        "escalations/<uuid:escalation_id>/acknowledge",
        escalation_api.EscalationAcknowledgeApi.as_view(),
        name="escalation-acknowledge",
    ),
    path(
        "escalations/<uuid:escalation_id>/resolve",
        escalation_api.EscalationResolveApi.as_view(),
        name="escalation-resolve",
    ),
    # Run schedules (docs/schedules.md)
    path("schedules", schedule_api.SchedulesApi.as_view(), name="schedules"),
    path("schedules/<uuid:schedule_id>", schedule_api.ScheduleApi.as_view(), name="schedule"),
    path(
        "schedules/<uuid:schedule_id>/pause",
        schedule_api.SchedulePauseApi.as_view(),
        name="schedule-pause",
    ),
    path(
        "schedules/<uuid:schedule_id>/resume",
        schedule_api.ScheduleResumeApi.as_view(),
        name="schedule-resume",
    ),
    path(
        "schedules/<uuid:schedule_id>/trigger",
        schedule_api.ScheduleTriggerApi.as_view(),
        name="schedule-trigger",
    ),
    path(
        "schedules/<uuid:schedule_id>/fires",
        schedule_api.ScheduleFiresApi.as_view(),
        name="schedule-fires",
    ),
    # Run webhooks (docs/webhooks.md)
    path("webhooks", webhook_api.WebhooksApi.as_view(), name="webhooks"),
    path("webhooks/<uuid:webhook_id>", webhook_api.WebhookApi.as_view(), name="webhook"),
    path(
        "webhooks/<uuid:webhook_id>/test", webhook_api.WebhookTestApi.as_view(), name="webhook-test"
    ),
    path(
        "webhooks/<uuid:webhook_id>/deliveries",
        webhook_api.WebhookDeliveriesApi.as_view(),
        name="webhook-deliveries",
    ),
    path(
        "webhooks/<uuid:webhook_id>/deliveries/<uuid:delivery_id>/redeliver",
        webhook_api.WebhookRedeliverApi.as_view(),
        name="webhook-redeliver",
    ),
]
