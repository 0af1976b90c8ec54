"""Plans built in Python (``orchestrator_client.tools.plan``): the same JSON as the plan
files of the repository, every field the server's plan model takes, the server's own
words for names and dependencies, mypy refusing a step's wrong params, and a built plan
run to its end by the live server and the session's worker."""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from mypy import api as mypy_api

from orchestrator_client import Client
from orchestrator_client.tools import Context, tool
from orchestrator_client.tools import plan as builder
from orchestrator_client.tools.plan import (
    Agent,
    Plan,
    PlanBuildError,
    Problem,
    Task,
    ref,
    step,
)
from runs.plan.checks import check_plan
from runs.plan.guard import Limits
from runs.plan.model import (
    AgentPlan,
    ConcurrencyPolicy,
    EscalationPolicy,
    PlanModel,
    RateLimitUse,
    ReplanPolicy,
    RetryPolicy,
    StepCache,
    StepPlan,
    TaskPlan,
    Timeouts,
    read_plan,
)
from runs.plan.model import Plan as PlanSchema

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLES = REPOSITORY / "examples"


class Tone(enum.Enum):
    PLAIN = "plain"
    BRIGHT = "bright"


@dataclasses.dataclass
class Style:
    tone: Tone
    bullets: bool = False


@tool(name="acme.summarize")
def summarize(ctx: Context, text: str, max_words: int = 50, style: Style | None = None) -> str:
    """Summarize a text."""
    return " ".join(text.split()[:max_words])


@tool(name="acme.count")
def count(text: str) -> int:
    return len(text.split())


def example(name: str) -> Any:
    return yaml.safe_load((EXAMPLES / name).read_text())


# --------------------------------------------------------------------------- the same JSON
def test_hello_yaml_built_in_python_is_the_same_plan() -> None:
    hello = step("echo", greeting=f"hello, {ref('variables.who')}").with_options(name="hello")
    plan = Plan(
        "hello",
        [
            Agent(
                "greeter",
                [
                    Task(
                        "greet",
                        [
                            hello,
                            step("sleep", seconds=1).with_options(name="think"),
                            step("echo", heard=ref(hello, "output.greeting")).with_options(
                                name="reply"
                            ),
                        ],
                    )
                ],
            )
        ],
        variables={"who": "world"},
    )

    assert plan.to_dict() == example("hello.yaml")


def test_dag_yaml_built_in_python_is_the_same_plan() -> None:
    fetch = Task(
        "fetch",
        [
            step("echo", topic=ref("variables.topic")).with_options(name="topic"),
            step("fail", code="service_unavailable", until_attempt=1).with_options(
                name="flaky",
                retry={"max_attempts": 3, "backoff": "exponential", "base_delay_ms": 200},
            ),
        ],
    )
    topic = ref("tasks.fetch.steps.topic.output.topic")
    gather = Task(
        "gather",
        [
            step("noop").with_options(name="a"),
            step("sleep", seconds=0.5).with_options(name="b", timeout="10s"),
            step(
                "python", callable="orchestrator.tools.examples.word_count", kwargs={"text": topic}
            ).with_options(name="c"),
        ],
        mode="parallel",
        failure_mode="continue",
        depends_on=[fetch],
    )
    analyse = Task(
        "analyse", [step("sleep", seconds=0.5).with_options(name="think")], depends_on=["fetch"]
    )
    report = Task(
        "report",
        [
            step("echo", topic=topic, words=ref("tasks.gather.steps.c.output.words")).with_options(
                name="summary",
                when="${tasks.gather.status} == 'completed'",
                on_error=[step("echo", note="summary failed").with_options(name="note")],
            )
        ],
        depends_on=[gather, analyse],
    )
    plan = Plan(
        "research pipeline",
        [Agent("researcher", [fetch, gather, analyse, report], mode="dag")],
        priority=3,
        variables={"topic": "AI chips"},
    )

    assert plan.to_dict() == example("dag.yaml")


def test_approval_runner_and_schedule_yamls_built_in_python_are_the_same_plans() -> None:
    draft = step("echo", notes="v1.2: faster starts").with_options(name="draft")
    approval = Plan(
        "release",
        [
            Agent(
                "publisher",
                [
                    Task(
                        "release",
                        [
                            draft,
                            step("approval").with_options(name="sign-off"),
                            step("echo", published=ref(draft, "output.notes")).with_options(
                                name="publish"
                            ),
                        ],
                    )
                ],
            )
        ],
    )
    research = step(
        "runner",
        prompt="Research ${variables.topic}",
        agent_name="researcher",
        demands={"tags": ["example"]},
        match_timeout="5m",
    ).with_options(name="research", timeout="10m")
    runner = Plan(
        "runner job",
        [
            Agent(
                "researcher",
                [
                    Task(
                        "research",
                        [
                            research,
                            step("echo", prompt=ref(research, "output.prompt")).with_options(
                                name="read"
                            ),
                        ],
                    )
                ],
            )
        ],
        variables={"topic": "AI chips"},
    )
    ping = step("echo", service=ref("variables.service"), run=ref("run.id")).with_options(
        name="ping"
    )
    schedule = Plan(
        "heartbeat",
        [Agent("checker", [Task("check", [ping])])],
        variables={"service": "example"},
    )

    assert approval.to_dict() == example("approval.yaml")
    assert runner.to_dict() == example("runner-job.yaml")
    assert schedule.to_dict() == example("schedule.yaml")


EVERY_FIELD_YAML = """
name: every field
priority: 2
failure_mode: continue
mode: dag
max_attempts: 2
max_agents: 4
credits: "12.5"
variables: {topic: chips, n: 3}
timeouts: {run: 1h, agent: 30m, task: 10m, step: 30s, pending: 5m, paused: 1d,
           resuming: 1m, retrying: 2m, escalated: 2h}
escalation: {enabled: true, window: 5m, max_errors: 3, max_error_rate: 0.25, min_attempts: 4}
replan: {enabled: false, agent_failure_ratio: 0.5, task_failures: 2, max_replans: 1,
         planner: rules}
concurrency: {key: "per-${variables.topic}", max_runs: 2}
agents:
  - name: first
    mode: parallel
    failure_mode: retry
    max_concurrent_tasks: 2
    timeout: 20m
    tasks:
      - name: only
        mode: dag
        failure_mode: fail-fast
        max_concurrent_steps: 7
        timeout: 5m
        steps:
          - name: summarize
            tool: acme.summarize
            params:
              text: "${variables.topic}"
              max_words: "${variables.n}"
              style: {tone: bright, bullets: true}
            when: "${variables.n} > 1"
            retry: {max_attempts: 4, max_failures: 2, backoff: linear, base_delay_ms: 10,
                    max_delay_ms: 100, multiplier: 1.5, jitter: 0.0,
                    retry_on: [timeout, service_unavailable], on_exhausted: escalate}
            timeout: 45s
            rate_limits: [{name: openai, units: 2, key: "${variables.topic}"}]
            cache: {key: "sum:${variables.topic}", ttl: 1h, inputs: false}
            on_error:
              - name: tell
                tool: echo
                params: {failed: "${steps.summarize.error.code}"}
                retry: {max_attempts: 1}
                timeout: 5s
          - name: count
            tool: acme.count
            params: {text: "${steps.summarize.output}", demands: {labels: [gpu]}}
            depends_on: [summarize]
          - name: child
            tool: run
            params: {plan: {name: child, agents: []}, execution_mode: async_callback}
            depends_on: [count]
            on_callback:
              - {name: heard, tool: echo, params: {status: "${callback.status}"}}
  - name: second
    depends_on: [first]
    tasks:
      - name: t
        steps:
          - {name: s, tool: noop}
"""


def every_field_plan() -> Plan:
    summary = step(
        summarize,
        text=ref("variables.topic"),
        max_words=ref("variables.n"),
        style=Style(Tone.BRIGHT, bullets=True),
    ).with_options(
        when="${variables.n} > 1",
        retry={
            "max_attempts": 4,
            "max_failures": 2,
            "backoff": "linear",
            "base_delay_ms": 10,
            "max_delay_ms": 100,
            "multiplier": 1.5,
            "jitter": 0.0,
            "retry_on": ["timeout", "service_unavailable"],
            "on_exhausted": "escalate",
        },
        timeout="45s",
        rate_limits=[{"name": "openai", "units": 2, "key": "${variables.topic}"}],
        cache={"key": "sum:${variables.topic}", "ttl": "1h", "inputs": False},
        on_error=[
            step("echo", failed="${steps.summarize.error.code}").with_options(
                name="tell", retry={"max_attempts": 1}, timeout="5s"
            )
        ],
    )
    counted = step(count, ref(summary, "output")).with_options(
        depends_on=[summary], demands={"labels": ["gpu"]}
    )
    child = step(
        "run", plan={"name": "child", "agents": []}, execution_mode="async_callback"
    ).with_options(
        name="child",
        depends_on=[counted],
        on_callback=[step("echo", status=ref("callback.status")).with_options(name="heard")],
    )
    first = Agent(
        "first",
        [
            Task(
                "only",
                [summary, counted, child],
                mode="dag",
                failure_mode="fail-fast",
                max_concurrent_steps=7,
                timeout="5m",
            )
        ],
        mode="parallel",
        failure_mode="retry",
        max_concurrent_tasks=2,
        timeout="20m",
    )
    return Plan(
        "every field",
        [
            first,
            Agent("second", [Task("t", [step("noop").with_options(name="s")])], depends_on=[first]),
        ],
        priority=2,
        failure_mode="continue",
        mode="dag",
        max_attempts=2,
        max_agents=4,
        credits="12.5",
        variables={"topic": "chips", "n": 3},
        timeouts={
            "run": "1h",
            "agent": "30m",
            "task": "10m",
            "step": "30s",
            "pending": "5m",
            "paused": "1d",
            "resuming": "1m",
            "retrying": "2m",
            "escalated": "2h",
        },
        escalation={
            "enabled": True,
            "window": "5m",
            "max_errors": 3,
            "max_error_rate": 0.25,
            "min_attempts": 4,
        },
        replan={
            "enabled": False,
            "agent_failure_ratio": 0.5,
            "task_failures": 2,
            "max_replans": 1,
            "planner": "rules",
        },
        concurrency={"key": "per-${variables.topic}", "max_runs": 2},
    )


def test_every_field_of_a_plan_file_is_written_by_the_builder() -> None:
    built = every_field_plan().to_dict()

    assert built == yaml.safe_load(EVERY_FIELD_YAML)
    # Read by the server's model as a plan (the tools aside, which are its checks').
    typed, problems = read_plan(json.loads(json.dumps(built)), Limits.from_settings())
    assert problems == []
    assert typed is not None
    assert typed.agents[0].tasks[0].steps[0].timeout_ms == 45_000


def _input_keys(model: type[PlanModel]) -> set[str]:
    return {
        field.validation_alias if isinstance(field.validation_alias, str) else name
        for name, field in model.model_fields.items()
    }


def _builder_keys(kind: Any) -> set[str]:
    if dataclasses.is_dataclass(kind):
        return {field.name for field in dataclasses.fields(kind)} - {"extra"}
    return set(typing.get_type_hints(kind))


@pytest.mark.parametrize(
    ("built", "model"),
    [
        (Plan, PlanSchema),
        (Agent, AgentPlan),
        (Task, TaskPlan),
        (builder.Step, StepPlan),
        (builder.Retry, RetryPolicy),
        (builder.Cache, StepCache),
        (builder.RateLimit, RateLimitUse),
        (builder.Timeouts, Timeouts),
        (builder.Escalation, EscalationPolicy),
        (builder.Replan, ReplanPolicy),
        (builder.Concurrency, ConcurrencyPolicy),
    ],
)
def test_the_builder_names_every_field_the_plan_model_takes(built: Any, model: Any) -> None:
    assert _builder_keys(built) == _input_keys(model)


def test_the_plan_is_json_and_yaml_that_read_back_as_its_dict() -> None:
    tricky = {
        "yes": "no",
        "on": True,
        "multi": "line one\nline two: with a colon",
        "float": 1e-07,
        "big": 1e20,
        "text": "1e-07",
        "unicode": "caf\u00e9 \U0001f600",
        "empty": {},
        "none": [],
        "nested": [[1, 2], [{"a": None}]],
        "${odd key}": "# not a comment",
    }
    plan = Plan(
        "round trip",
        [Agent("a", [Task("t", [step("echo", **tricky)])])],
        variables={"quoted": "'single' \"double\""},
    )

    assert json.loads(plan.to_json()) == plan.to_dict()
    assert yaml.safe_load(plan.to_yaml()) == plan.to_dict()
    assert yaml.safe_load(every_field_plan().to_yaml()) == every_field_plan().to_dict()
    assert plan.to_yaml().startswith('name: "round trip"\nvariables:\n')


# --------------------------------------------------------------------------- steps
def test_a_step_of_a_tool_binds_its_params_as_a_call_would() -> None:
    built = step(summarize, "some text", style=Style(Tone.PLAIN))

    assert (built.name, built.tool) == ("summarize", "acme.summarize")
    # By name, defaults left to the tool, values as JSON.
    assert built.params == {"text": "some text", "style": {"tone": "plain", "bullets": False}}
    with pytest.raises(
        TypeError, match=r"step\(acme.summarize\): missing a required argument: 'text'"
    ):
        step(summarize)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'txt'"):
        step(summarize, text="x", txt="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="by name"):
        step("echo", "positional")


def test_a_reference_is_a_template_that_fits_any_parameter() -> None:
    fetch = step("http", url="https://example.com").with_options(name="fetch")

    assert ref("variables.topic") == "${variables.topic}"
    assert ref(fetch, "output.body") == "${steps.fetch.output.body}"
    assert ref(fetch) == "${steps.fetch}"
    assert f"n={ref('variables.n')}" == "n=${variables.n}"
    assert (
        step(summarize, "x", max_words=ref("variables.n")).params["max_words"] == "${variables.n}"
    )
    for bad in ("", "variables.${x}", "steps.a}"):
        with pytest.raises(ValueError, match="a path such as"):
            ref(bad)


def test_with_options_keeps_what_it_is_not_given() -> None:
    first = step("echo", x=1).with_options(name="a", when="${variables.go}", timeout=5)
    second = first.with_options(retry={"max_attempts": 1}, extra={"future_field": True})

    assert second.to_dict() == {
        "name": "a",
        "tool": "echo",
        "params": {"x": 1},
        "when": "${variables.go}",
        "retry": {"max_attempts": 1},
        "timeout": 5,
        "future_field": True,
    }
    assert first.to_dict() == {
        "name": "a",
        "tool": "echo",
        "params": {"x": 1},
        "when": "${variables.go}",
        "timeout": 5,
    }


# --------------------------------------------------------------------------- checks
def problems_of(build: Any) -> list[Problem]:
    with pytest.raises(PlanBuildError) as raised:
        build()
    return raised.value.problems


def one_task(*steps: builder.Step, mode: builder.Mode | None = "dag") -> Plan:
    return Plan("p", [Agent("a", [Task("t", list(steps), mode=mode)])])


def test_dependency_problems_are_the_servers_own_paths_and_words() -> None:
    a = step("noop").with_options(name="a", depends_on=["c"])
    b = step("noop").with_options(name="b", depends_on=["a", "a", "b", "bb"])
    c = step("noop").with_options(name="c", depends_on=["b"])

    problems = problems_of(lambda: one_task(a, b, c))

    # What the server says of the same JSON (written by hand: the builder refuses it).
    data = {
        "name": "p",
        "agents": [
            {
                "name": "a",
                "tasks": [
                    {"name": "t", "mode": "dag", "steps": [a.to_dict(), b.to_dict(), c.to_dict()]}
                ],
            }
        ],
    }
    server = check_plan(data, Limits.from_settings())
    assert [(p.path, p.message) for p in problems] == [(p.path, p.message) for p in server]
    assert [p.message for p in problems] == [
        "duplicate dependency 'a'",
        "step 'b' cannot depend on itself",
        "unknown step 'bb'; did you mean 'b'?",
        "dependency cycle: a -> c -> b -> a",
    ]


def test_names_and_dependencies_at_every_level_are_checked_before_anything_is_sent() -> None:
    noop = step("noop")
    problems = problems_of(
        lambda: Plan(
            "p",
            [
                Agent("a", [Task("t", [noop, noop]), Task("u", [noop], depends_on=["t"])]),
                Agent("a", [Task("bad name!", [noop])], depends_on=["z"]),
                Agent("empty", []),
            ],
        )
    )

    assert [str(p) for p in problems] == [
        "agents[1].name: duplicate agent name 'a' (also agents[0])",
        "agents[1].depends_on: needs mode 'dag' on the run (it is 'parallel')",
        "agents[0].tasks[1].depends_on: needs mode 'dag' on agents[0] (it is 'sequential')",
        "agents[0].tasks[0].steps[1].name: duplicate step name 'noop' (also steps[0])",
        "agents[1].tasks[0].name: 'bad name!': letters, digits, '_', '-' and '.', starting "
        "with a letter or digit, at most 100 characters",
        "agents[2].tasks: needs at least one task",
    ]
    blank = problems_of(lambda: Plan(" ", [Agent("a", [Task("t", [noop])])]))
    assert [str(p) for p in blank] == ["name: must not be blank"]
    assert str(PlanBuildError(problems)).startswith(
        "the plan is invalid:\n  agents[1].name: duplicate agent name 'a' (also agents[0])\n"
    )


def test_handlers_and_extra_fields_are_held_to_what_a_plan_may_say() -> None:
    handler = step("echo").with_options(name="h", depends_on=["x"])
    problems = problems_of(
        lambda: one_task(
            step("noop").with_options(name="s", on_error=[handler, handler], extra={"when": "1"}),
            mode=None,
        )
    )

    assert [str(p) for p in problems] == [
        "agents[0].tasks[0].steps[0].on_error[1].name: "
        "duplicate handler name 'h' (also on_error[0])",
        "agents[0].tasks[0].steps[0].on_error[0].depends_on: a handler has none",
        "agents[0].tasks[0].steps[0].on_error[1].depends_on: a handler has none",
        "agents[0].tasks[0].steps[0].extra: 'when' is a field of its own here: give it as when=",
    ]


# --------------------------------------------------------------------------- mypy
TOOLS_SNIPPET = """
from orchestrator_client.tools import Context, tool


@tool(name="acme.summarize")
def summarize(ctx: Context, text: str, max_words: int = 50) -> str:
    return text


@tool(name="acme.count")
def count(text: str) -> int:
    return len(text)
"""

GOOD_SNIPPET = """
from orchestrator_client.tools.plan import Agent, Plan, Task, ref, step
from snippet_tools import count, summarize

plan = Plan("typed", [Agent("a", [Task("t", [
    step(summarize, "a text", max_words=ref("variables.n")),
    step(count, text="${steps.summarize.output}"),
    step("http", url="https://example.com", anything=[1, 2]),
], mode="parallel")])])
"""

BAD_SNIPPET = """
from orchestrator_client.tools.plan import Task, step
from snippet_tools import count, summarize

step(summarize, txt="a text")
step(summarize, "a text", max_words="${variables.n}")
step(count)
Task("t", [], mode="daggy")
"""


def test_mypy_refuses_a_step_whose_params_do_not_fit_its_tool(tmp_path: Path) -> None:
    (tmp_path / "snippet_tools.py").write_text(TOOLS_SNIPPET)
    (tmp_path / "good.py").write_text(GOOD_SNIPPET)
    (tmp_path / "bad.py").write_text(BAD_SNIPPET)
    (tmp_path / "mypy.ini").write_text(f"[mypy]\nstrict = True\nmypy_path = {REPOSITORY}\n")

    # mypy raises the process's recursion limit for itself and leaves it raised: put back,
    # or a later test in this process that counts on the limit no longer reaches it.
    limit = sys.getrecursionlimit()
    try:
        out, err, _ = mypy_api.run(
            [
                "--config-file", str(tmp_path / "mypy.ini"),
                "--cache-dir", str(tmp_path / "cache"),
                "--follow-imports", "silent",
                str(tmp_path / "good.py"),
                str(tmp_path / "bad.py"),
            ]
        )  # fmt: skip
    finally:
        sys.setrecursionlimit(limit)

    errors = [line.split(": error: ", 1) for line in out.splitlines() if ": error: " in line]
    assert not err
    assert {Path(where.split(":")[0]).name for where, _ in errors} == {"bad.py"}, out
    assert [message for _, message in errors] == [
        'Unexpected keyword argument "txt" for "step"; did you mean "text"?  [call-arg]',
        'Argument "max_words" to "step" has incompatible type "str"; expected "int"  [arg-type]',
        'Missing positional argument "text" in call to "step"  [call-arg]',
        'Argument "mode" to "Task" has incompatible type "Literal[\'daggy\']"; expected '
        "\"Literal['sequential', 'parallel', 'dag'] | None\"  [arg-type]",
    ]


# --------------------------------------------------------------------------- a real run
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("celery_worker")
def test_a_built_plan_is_submitted_and_runs_to_completion(client: Client) -> None:
    topic = step("echo", topic=ref("variables.topic")).with_options(name="topic")
    flaky = step("fail", code="service_unavailable", until_attempt=1).with_options(
        name="flaky", depends_on=[topic], retry={"max_attempts": 3, "base_delay_ms": 50}
    )
    told = step("echo", heard=ref(topic, "output.topic"), again=ref(flaky, "status")).with_options(
        name="told", depends_on=[topic, flaky], when="${steps.flaky.status} == 'completed'"
    )
    plan = Plan(
        "built",
        [Agent("builder", [Task("dag", [topic, flaky, told], mode="dag")])],
        variables={"topic": "chips"},
    )

    run = client.submit(plan)
    done = client.wait(run["id"], interval=0.2, timeout=60)

    assert run["plan"]["name"] == "built"
    assert done["status"] == "completed", done.get("last_error")
    assert done["outputs"]["builder.dag.topic"] == {"topic": "chips"}
    assert done["outputs"]["builder.dag.told"] == {"heard": "chips", "again": "completed"}


def test_a_built_plan_stays_as_it_was_checked_when_its_lists_change() -> None:
    steps = [step("noop")]
    agents = [Agent("a", [Task("t", steps)])]
    plan = Plan("p", agents)

    steps.append(step("noop"))  # a duplicate name, had it been taken
    agents.append(Agent("a", []))

    assert plan.to_dict() == {
        "name": "p",
        "agents": [
            {"name": "a", "tasks": [{"name": "t", "steps": [{"name": "noop", "tool": "noop"}]}]}
        ],
    }
