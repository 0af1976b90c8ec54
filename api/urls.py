"""Routes under /api/v1/ (namespace ``api``)."""

from __future__ import annotations

from django.urls import path

from api import views
from api.billing import BalanceApi, LedgerApi, SecretApi, SecretsApi

app_name = "api"

urlpatterns = [
    path("runs", views.RunsApi.as_view(), name="runs"),
    path("runs/<uuid:run_id>", views.RunApi.as_view(), name="run"),
    path("runs/<uuid:run_id>/start", views.RunStartApi.as_view(), name="run-start"),
    path("runs/<uuid:run_id>/cancel", views.RunCancelApi.as_view(), name="run-cancel"),
    path("runs/<uuid:run_id>/pause", views.RunPauseApi.as_view(), name="run-pause"),
    path("runs/<uuid:run_id>/resume", views.RunResumeApi.as_view(), name="run-resume"),
    path("runs/<uuid:run_id>/retry", views.RunRetryApi.as_view(), name="run-retry"),
    path("runs/<uuid:run_id>/approve", views.RunApproveApi.as_view(), name="run-approve"),
    path("runs/<uuid:run_id>/reject", views.RunRejectApi.as_view(), name="run-reject"),
    path("runs/<uuid:run_id>/agents", views.RunAgentsApi.as_view(), name="run-agents"),
    path("runs/<uuid:run_id>/tasks", views.RunTasksApi.as_view(), name="run-tasks"),
    path("runs/<uuid:run_id>/steps", views.RunStepsApi.as_view(), name="run-steps"),
    path("runs/<uuid:run_id>/events", views.RunEventsApi.as_view(), name="run-events"),
    path("billing/balance", BalanceApi.as_view(), name="billing-balance"),
    path("billing/ledger", LedgerApi.as_view(), name="billing-ledger"),
    path("secrets", SecretsApi.as_view(), name="secrets"),
    path("secrets/<str:name>", SecretApi.as_view(), name="secret"),
]
