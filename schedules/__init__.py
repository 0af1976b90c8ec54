"""Run schedules: plans run by cron or every interval (docs/schedules.md)."""
