"""Bad input: every input is accepted and works, or refused with one clear message; no traceback
reaches the user and nothing is started on a refused input.

Property-based (hypothesis) over the command-line grammar (``freeride_lab.cli.app``), ``RunConfig``,
``GpuLimits`` and side-task names and references (``tasks/registry.py``). Nothing here launches a
real run:
``Session._start`` (the one place that starts processes, after every check) is replaced by a
stub that records the accepted config, so validation runs for real and a refusal is proven to
come before any process. A refused input must raise ``ValueError``/``TypeError`` (API) or exit
with code 2 and exactly one ``freeride-lab: error:`` line (CLI); an accepted one must give
well-typed, finite values that round-trip through JSON.

A known gap is pinned by an ``xfail(strict=True)`` test named after the claim it breaks, its
reason naming the fix (see RELIABILITY.md); when the fix lands strict mode fails the test, and
the marker is removed. (None is open today.)

Over 500 lines: one place for every public entry point's refusals, so a new entry point shows what
it must refuse.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any
from unittest import mock

import psutil
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from freeride_lab.cli.app import SUBCOMMANDS, UsageError, build_parser, main
from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.core.schedule import SCHEDULES
from freeride_lab.lab.session import Session
from freeride_lab.sidetasks.api import ImperativeSideTask, IterativeSideTask
from freeride_lab.sidetasks.limits import GpuLimits, env_for, parse_bytes
from freeride_lab.sidetasks.spec import TaskSpec
from freeride_lab.tasks.registry import BUILTIN_TASKS
from freeride_lab.tasks.registry import load as load_task_class

REPO = Path(__file__).resolve().parents[2]
FAST = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
REFUSALS = (ValueError, TypeError)


# -- harness -------------------------------------------------------------------------------------


class Launched(Exception):
    """Raised by the stub in place of starting processes: the input was accepted."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        self.config = config


def _refuse_to_start(self: Session, *args: Any, **kwargs: Any) -> None:
    raise Launched(self.config)


def outcome(name: str) -> None:
    """Count an outcome in hypothesis' statistics (``--hypothesis-show-statistics``)."""
    with contextlib.suppress(InvalidArgument):  # called outside a hypothesis test
        event(name)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


@contextlib.contextmanager
def nothing_started() -> Iterator[None]:
    """No process may be left behind by the block (Session._start is stubbed out)."""
    before = children()
    with mock.patch.object(Session, "_start", _refuse_to_start):
        yield
    assert children() <= before, f"new processes: {children() - before}"


@contextlib.contextmanager
def in_fresh_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
        yield Path(d)


def run_cli(argv: list[str]) -> tuple[int | RunConfig, str, str]:
    """``main(argv)`` in-process: (exit code, or the config it would launch; stdout; stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result: int | RunConfig = main(argv)
        except Launched as launched:
            result = launched.config
    return result, out.getvalue(), err.getvalue()


def assert_one_line_usage_error(code: int | RunConfig, out: str, err: str) -> None:
    assert code == 2, (code, out, err)
    assert err.startswith("freeride-lab: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in out + err


INT_FIELDS = ("stages", "microbatches", "chunks", "steps", "layers", "d_model", "heads",
              "seq_len", "microbatch_size", "seed", "nnodes", "node_rank",
              "master_port")  # fmt: skip
FLOAT_FIELDS = ("t_forward_ms", "t_backward_input_ms", "t_backward_weight_ms", "lr")
STR_FIELDS = ("schedule", "workload", "device", "dtype", "backend", "master_addr", "bus_host")
OPTIONAL_STR_FIELDS = ("text_path", "run_dir")


def assert_well_typed(config: RunConfig) -> None:
    """What "accepted and works" means for a config: every field has its type, finite numbers,
    and the config survives the JSON round trip that run.json gives it."""
    for name in INT_FIELDS:
        value = getattr(config, name)
        if value is None and name == "master_port":
            continue
        assert type(value) is int, f"{name}={value!r} accepted but not an int"
    for name in FLOAT_FIELDS:
        value = getattr(config, name)
        assert type(value) in (int, float) and math.isfinite(value), f"{name}={value!r}"
    for name in STR_FIELDS:
        assert isinstance(getattr(config, name), str), f"{name}={getattr(config, name)!r}"
    for name in OPTIONAL_STR_FIELDS:
        value = getattr(config, name)
        assert value is None or isinstance(value, str), f"{name}={value!r}"
    assert isinstance(config.runtime, RuntimeOptions), f"runtime={config.runtime!r}"
    assert isinstance(config.notes, dict), f"notes={config.notes!r}"
    assert config.schedule in SCHEDULES
    assert RunConfig.from_dict(config.to_dict()) == config
    assert RunConfig.from_dict(json.loads(config.to_json())) == config


# -- the command line ----------------------------------------------------------------------------

GARBAGE = st.sampled_from(
    ["", " ", "-", "--", "abc", "nan", "NaN", "inf", "-inf", "1e400", "1e30", "0x10", "1_0",
     "4GB", "None", "True", "\uff13", "-0", "1.5", "1e-300", "99999999999999999999", "'", '"',
     "$(touch x)", "a;b"]
)  # fmt: skip
SMALL_INT = st.integers(-3, 9).map(str)
VALID_SIZE = st.integers(1, 8).map(str)
SIZE = st.one_of(VALID_SIZE, SMALL_INT, GARBAGE)  # sizes that feed torch's planner stay small
ANY_INT = st.one_of(st.integers(-(10**12), 10**12).map(str), GARBAGE)
ANY_FLOAT = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), SMALL_INT, GARBAGE)
NAME = st.one_of(
    st.sampled_from(list(SCHEDULES)).map(lambda n: n.swapcase()),
    st.sampled_from(list(SCHEDULES)),
    st.text(max_size=8),
)
SHAPE_OPTIONS: dict[str, st.SearchStrategy[str]] = {
    "--schedule": NAME,
    "--stages": SIZE,
    "--microbatches": SIZE,
    "--chunks": SIZE,
    "--t-forward-ms": ANY_FLOAT,
    "--t-backward-input-ms": ANY_FLOAT,
    "--t-backward-weight-ms": ANY_FLOAT,
}
RUN_OPTIONS: dict[str, st.SearchStrategy[str]] = {
    **SHAPE_OPTIONS,
    "--steps": ANY_INT,
    "--workload": st.one_of(st.sampled_from(["text", "synthetic"]), GARBAGE),
    "--device": st.one_of(st.sampled_from(["cpu", "cuda"]), GARBAGE),
    "--layers": ANY_INT,
    "--d-model": ANY_INT,
    "--seq-len": ANY_INT,
    "--microbatch-size": ANY_INT,
    "--seed": ANY_INT,
    "--nnodes": SIZE,
    "--node-rank": SIZE,
    "--master-addr": st.one_of(st.just("127.0.0.1"), GARBAGE),
    "--master-port": st.one_of(st.sampled_from(["0", "1", "65535", "65536", "-1"]), GARBAGE),
    "--grace-s": st.one_of(st.sampled_from(["0", "3", "-1", "nan"]), GARBAGE),
    "--min-bubble-ms": st.sampled_from(["0", "0.5", "5", "abc", "", "-1", "nan", "inf"]),
    "--mps": st.one_of(st.sampled_from(["auto", "on", "off"]), GARBAGE),
}
SIMULATE_OPTIONS: dict[str, st.SearchStrategy[str]] = {
    **SHAPE_OPTIONS,
    "--comm-ms": ANY_FLOAT,
    "--dispatch-ms": ANY_FLOAT,
}
FLAGS = {"run": ["--no-progress", "--no-side-tasks"], "simulate": []}


@st.composite
def command_lines(
    draw: st.DrawFn, command: str, options: dict[str, st.SearchStrategy[str]]
) -> list[str]:
    names = draw(st.lists(st.sampled_from(sorted(options)), max_size=5, unique=True))
    argv = [command]
    for name in names:
        argv += [name, draw(options[name])]
    if FLAGS[command]:
        argv += draw(st.lists(st.sampled_from(FLAGS[command]), max_size=2, unique=True))
    if draw(st.integers(0, 3)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(GARBAGE))  # a stray word
    return argv


@FAST
@given(argv=command_lines("run", RUN_OPTIONS))
def test_run_command_line_is_launched_well_typed_or_refused_in_one_line(argv: list[str]) -> None:
    with in_fresh_dir() as cwd, nothing_started():
        result, out, err = run_cli([*argv, "--run-dir", str(cwd / "run")])
    outcome("launched" if isinstance(result, RunConfig) else "refused")
    if isinstance(result, RunConfig):
        assert_well_typed(result)
        assert err == ""
    else:
        assert_one_line_usage_error(result, out, err)
        assert not (cwd / "run").exists(), "a refused run left a run directory"


@FAST
@given(argv=command_lines("simulate", SIMULATE_OPTIONS))
def test_simulate_command_line_prints_a_table_or_is_refused_in_one_line(argv: list[str]) -> None:
    with in_fresh_dir(), nothing_started():
        result, out, err = run_cli(argv)
    outcome("simulated" if result == 0 else "refused")
    if result == 0:
        assert "theory_pct" in out and err == ""
    else:
        assert_one_line_usage_error(result, out, err)


# No control characters: the parser echoes words as they are; ``main`` escapes newlines
# (test_an_argument_holding_a_newline_is_refused_on_one_line).
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    command=st.sampled_from(sorted(SUBCOMMANDS)),
    words=st.lists(st.one_of(GARBAGE, PRINTABLE, st.sampled_from(
        ["--stages", "--schedule", "--memory", "--sm", "--priority", "--budget-ms", "--steps",
         "--run-dir", "--log-level", "--quick", "--full", "--profile", "--json"]
    )), max_size=6),
)  # fmt: skip
def test_every_subcommand_parses_or_raises_one_usage_error(command: str, words: list[str]) -> None:
    """The grammar alone (no handler runs): parse, or ``UsageError``; never exit or crash."""
    words = [w for w in words if w not in ("-h", "--help")]
    try:
        build_parser().parse_args([command, *words])
    except UsageError as e:
        assert str(e) and "\n" not in str(e)


# The notebook face: ``%freeride LINE`` splits LINE like a shell and uses the same parser.
MAGIC_SESSION_WORDS = st.lists(
    st.one_of(GARBAGE, PRINTABLE, st.sampled_from(
        ["pagerank", "resnet18", "t1", "--stage", "1", "--memory", "4GB", "--sm", "50",
         "--priority", "2", "--budget-ms", "-1", "--option", "a=1", "/nonexistent/run"]
    )), max_size=4,
)  # fmt: skip


@st.composite
def magic_lines(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["run", "launch", "simulate", "session"]))
    if kind == "session":  # commands on the current run, of which this kernel has none
        command = draw(st.sampled_from(["attach", "tune", "detach", "status", "stop", "report"]))
        argv = [command, *draw(MAGIC_SESSION_WORDS)]
    elif kind == "simulate":
        argv = draw(command_lines("simulate", SIMULATE_OPTIONS))
    else:
        argv = draw(command_lines("run", RUN_OPTIONS))
        argv[0] = kind
    if draw(st.integers(0, 4)) == 0:
        return " ".join(argv)  # unquoted: quotes and spaces in values now split or unbalance
    return shlex.join(argv)


@pytest.fixture(scope="module")
def shell() -> Iterator[Any]:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "freeride_lab")
    yield ip
    ip.run_line_magic("unload_ext", "freeride_lab")


@FAST
@given(line=magic_lines())
def test_freeride_magic_line_is_launched_or_refused_in_one_line(shell: Any, line: str) -> None:
    from IPython.core.error import UsageError as MagicUsageError

    out = io.StringIO()
    with in_fresh_dir(), nothing_started(), contextlib.redirect_stdout(out):
        try:
            shell.run_line_magic("freeride", line)
        except Launched as launched:
            outcome("launched")
            assert_well_typed(launched.config)
        except MagicUsageError as e:
            outcome("refused")
            assert str(e) and "\n" not in str(e).strip(), str(e)
        else:
            outcome("ran")
    assert "Traceback" not in out.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--stages", "-1"], "stages=-1"),
        (["run", "--steps", "0"], "steps=0"),
        (["run", "--t-forward-ms", "nan", "--workload", "synthetic"], "t_forward_ms=nan"),
        (["run", "--t-forward-ms", "-5", "--workload", "synthetic"], "t_forward_ms=-5"),
        (["run", "--schedule", "1F2B"], "'1F2B'"),
        (["run", "--schedule", "Interleaved1F1B", "--chunks", "0"], "chunks=0"),
        (["run", "--schedule", "1F1B", "--chunks", "2"], "chunks=2"),
        (["run", "--stages", "9", "--layers", "8"], "layers=8"),
        (["run", "--master-port", "65536"], "master_port=65536"),
        (["run", "--device", "tpu"], "'tpu'"),
        (["run", "--grace-s", "-1"], "grace_s=-1"),
        (["run", "--grace-s", "nan"], "grace_s=nan"),
        (["simulate", "--comm-ms", "-1"], "comm_ms=-1"),
        (["simulate", "--stages", "4", "--microbatches", "2"], "microbatches"),
        (["simulate", "--t-forward-ms", "0", "--t-backward-input-ms", "0",
          "--t-backward-weight-ms", "0"], "not all 0"),
    ],
)  # fmt: skip
def test_cli_names_the_bad_value_in_its_one_error_line(argv: list[str], message: str) -> None:
    with in_fresh_dir() as cwd, nothing_started():
        result, out, err = run_cli(
            [*argv, "--run-dir", str(cwd / "r")] if argv[0] == "run" else argv
        )
    assert_one_line_usage_error(result, out, err)
    assert message in err


def test_cli_refusal_in_a_real_process_prints_one_line_and_starts_nothing(tmp_path: Path) -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "freeride_lab.cli", "run", "--stages", "0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    grandchildren: set[int] = set()
    while proc.poll() is None:  # sample whatever it starts, for as long as it runs
        with contextlib.suppress(psutil.Error):
            grandchildren |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        time.sleep(0.01)
    out, err = proc.communicate(timeout=120)
    assert_one_line_usage_error(proc.returncode, out, err)
    assert grandchildren == set()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_bad_min_bubble_ms_is_refused_before_anything_starts(value: str) -> None:
    with in_fresh_dir() as cwd, nothing_started():
        result, out, err = run_cli(["run", "--min-bubble-ms", value, "--run-dir", str(cwd / "r")])
    assert_one_line_usage_error(result, out, err)


def test_an_argument_holding_a_newline_is_refused_on_one_line() -> None:
    result, out, err = run_cli(["simulate", "a\nb"])
    assert_one_line_usage_error(result, out, err)


def test_infinite_grace_is_refused_before_anything_starts() -> None:
    with in_fresh_dir() as cwd, nothing_started():
        result, out, err = run_cli(["run", "--grace-s", "inf", "--run-dir", str(cwd / "r")])
    assert_one_line_usage_error(result, out, err)


def test_huge_sizes_are_refused_within_seconds(tmp_path: Path) -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    argv = ["run", "--workload", "synthetic", "--stages", "100000", "--microbatches", "100000"]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "freeride_lab.cli", *argv],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("no answer within 20 s")
    assert_one_line_usage_error(proc.returncode, proc.stdout, proc.stderr)


def test_an_existing_directory_with_other_files_is_refused_as_run_dir(tmp_path: Path) -> None:
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    os.chmod(crowded, 0o755)
    (crowded / "notes.txt").write_text("not a run")
    config = RunConfig(workload="synthetic", stages=2, microbatches=2, steps=1)
    try:
        with nothing_started(), pytest.raises(ValueError, match="crowded"):
            Session.launch(config, run_dir=crowded)
    finally:
        mode = stat.S_IMODE(crowded.stat().st_mode)
        os.chmod(crowded, 0o755)
    assert mode == 0o755
    assert sorted(p.name for p in crowded.iterdir()) == ["notes.txt"]


# -- RunConfig -----------------------------------------------------------------------------------

NASTY: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70),
    st.sampled_from([2**31, 2**63, 10**30, 10**400, -(2**63)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from([[1], {"a": 1}, b"x", (), object()]),
)
SIZE_VALUES: st.SearchStrategy[Any] = st.one_of(  # fields that feed torch's planner: small
    st.none(), st.booleans(), st.integers(-5, 12), st.floats(allow_nan=True), st.text(max_size=4),
    st.sampled_from([[1], 2.0, "4"]),
)  # fmt: skip
SIZES = ("stages", "microbatches", "chunks", "nnodes")


def config_field_values(names: tuple[str, ...], *, known_gaps: bool) -> st.SearchStrategy[Any]:
    """(field, value) pairs; without ``known_gaps``, the nastiest values (non-str schedules,
    bools and huge ints as numbers) are left out, so the checks of the commonest fields get
    more examples; the test over every field tries them all."""

    def values(name: str) -> st.SearchStrategy[Any]:
        if name in SIZES:
            return SIZE_VALUES
        if known_gaps:
            return NASTY
        if name == "schedule":
            return st.one_of(st.text(max_size=8), st.sampled_from(list(SCHEDULES)))
        if name in FLOAT_FIELDS:
            return st.one_of(
                st.integers(-5, 10**6),
                st.floats(allow_nan=True, allow_infinity=True),
                st.text(max_size=4),
                st.none(),
                st.sampled_from([[1], "5"]),
            )
        return NASTY

    return st.sampled_from(names).flatmap(lambda n: st.tuples(st.just(n), values(n)))


BASE = {"workload": "synthetic", "stages": 2, "microbatches": 2, "steps": 1}
# The commonest fields, tried with ordinary bad values.
CHECKED = ("schedule", "stages", "microbatches", "steps", "layers", "d_model", "heads",
           "seq_len", "microbatch_size", "nnodes", "workload", "device", "dtype", "backend",
           "lr", "t_forward_ms", "t_backward_input_ms", "t_backward_weight_ms")  # fmt: skip
ALL_FIELDS = tuple(f.name for f in fields(RunConfig))


def check_config(name: str, value: Any) -> None:
    try:
        config = RunConfig(**{**BASE, name: value})
    except REFUSALS as e:
        outcome("refused")
        message = str(e)
        assert message and "\n" not in message, message
        named = [f for f in ALL_FIELDS if f"{f}=" in message]  # e.g. "stages=2, microbatches=2"
        assert name in message or repr(value) in message or named, f"{name}={value!r}: {message}"
        return
    outcome("accepted")
    assert_well_typed(config)


@FAST
@given(pair=config_field_values(CHECKED, known_gaps=False))
def test_run_config_field_is_well_typed_or_refused_naming_it(pair: tuple[str, Any]) -> None:
    check_config(*pair)


@settings(max_examples=300, deadline=None)
@given(pair=config_field_values(ALL_FIELDS, known_gaps=True))
def test_every_run_config_field_is_well_typed_or_refused_naming_it(pair: tuple[str, Any]) -> None:
    check_config(*pair)


def test_unknown_run_config_keys_are_named_with_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown RunConfig field\(s\) \['stage'\]; valid: .*stages"
    ):
        RunConfig.from_dict({"stage": 4})


# -- GpuLimits -----------------------------------------------------------------------------------

MEMORY: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([None, "4GB", "512MiB", "3G", " 4 GiB ", 2**30, "8e18B"]),
    st.sampled_from(["-1GB", "nan", "1e30GB", "12 parsecs", "0", "0GB", "1e-3B", "inf GB", "",
                     "GB", "4.5.6GB", "1e400GB", "9" * 40, "9.3e18B", "0.5B", b"4GB", [4], True]),
    st.one_of(st.text(max_size=8), st.integers(-(2**70), 2**70),
              st.floats(allow_nan=True, allow_infinity=True)),
)  # fmt: skip
PERCENT: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([None, 100, 50, 0.5, 12.5]),
    st.sampled_from([0, 101, math.nan, math.inf, -0.0, "50", True, -1]),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-200, 200)),
)
PRIORITY: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([0, 1]), st.sampled_from([1.0, 0.0, 2, -1, "1", True, None, math.nan])
)
BUDGET: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([None, 0.01, 1, 2.5]),
    st.sampled_from([0, -1, math.nan, math.inf, "1", True]),
    st.floats(allow_nan=True, allow_infinity=True),
)


LIMITS = {"memory_bytes": MEMORY, "sm_pct": PERCENT, "priority": PRIORITY, "budget_s": BUDGET}


@st.composite
def limit_values(draw: st.DrawFn) -> dict[str, Any]:
    """Up to two fields drawn from everything, the rest left at their defaults."""
    chosen = draw(st.sets(st.sampled_from(sorted(LIMITS)), min_size=1, max_size=2))
    return {name: draw(LIMITS[name]) for name in sorted(chosen)}


@settings(max_examples=300, deadline=None)
@given(values=limit_values())
def test_gpu_limits_are_usable_or_refused_naming_the_value(values: dict[str, Any]) -> None:
    try:
        limits = GpuLimits(**values)
    except REFUSALS as e:
        message = str(e)
        assert message and "\n" not in message
        assert any(repr(v) in message or k in message for k, v in values.items()), message
        outcome("refused")
        return
    outcome("accepted")
    assert limits.memory_bytes is None or type(limits.memory_bytes) is int
    assert limits.memory_bytes is None or 0 < limits.memory_bytes < 2**63
    assert limits.sm_pct is None or (type(limits.sm_pct) is float and 0 < limits.sm_pct <= 100)
    assert type(limits.priority) is int and limits.priority in (0, 1)
    assert limits.budget_s is None or (math.isfinite(limits.budget_s) and limits.budget_s > 0)
    assert GpuLimits.from_dict(limits.to_dict()) == limits
    for mps in (True, False):
        env = env_for(limits, mps_active=mps, device_index=0)
        assert all(isinstance(v, str) and v and "\n" not in v for v in env.values()), env


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-1GB", "'-1GB'"),
        ("nan", "'nan'"),
        ("1e30GB", "more than any device holds"),
        ("12 parsecs", "unknown unit 'parsecs'"),
        ("0GB", "use None for no memory cap"),
    ],
)
def test_memory_sizes_from_the_issue_are_refused_with_their_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GpuLimits(memory_bytes=text)


def test_a_plain_memory_size_is_accepted_in_bytes() -> None:
    assert GpuLimits(memory_bytes="4GB").memory_bytes == 4 * 10**9
    assert parse_bytes("4GiB") == 4 * 2**30


@pytest.mark.parametrize("pct", [0, 101, math.nan, -1, "50"])
def test_sm_share_outside_0_100_or_not_a_number_is_refused(pct: Any) -> None:
    with pytest.raises(REFUSALS, match="sm_pct"):
        GpuLimits(sm_pct=pct)


def test_unknown_limit_names_are_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown limit.*'memory'.*valid: memory_bytes"):
        GpuLimits.from_dict({"memory": "4GB"})


# -- side-task references --------------------------------------------------------------------------

NOT_A_TASK = "class NotATask:\n    pass\n"
NO_CLASS = "X = 1\n"
BROKEN = "def broken(:\n"
EXITS = "import sys\nsys.exit(3)\n"
GOOD = (
    "from freeride_lab.sidetasks.api import IterativeSideTask\n\n"
    "class Good(IterativeSideTask):\n"
    "    unit = 'iterations'\n\n"
    "    def step(self) -> float:\n"
    "        return 1.0\n"
)


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Task files in a directory outside the project (a temporary directory)."""
    root = tmp_path_factory.mktemp("outside-the-project")
    for name, text in [("not_a_task.py", NOT_A_TASK), ("no_class.py", NO_CLASS),
                       ("broken.py", BROKEN), ("exits.py", EXITS), ("good.py", GOOD)]:  # fmt: skip
        (root / name).write_text(text)
    assert REPO not in root.parents
    return root


def reference_examples(outside: Path) -> list[str]:
    return [
        "", "  ", "nope", "resnet", "nope:", ":Cls", "a:b:c", "x.py:1abc", "os:path",
        "json:JSONDecoder", "builtins:object", "..foo:Bar", "/etc/passwd:X",
        "../../../../etc/passwd:X", "/nonexistent/x.py:Y", "freeride_lab:__version__",
        "freeride_lab.sidetasks.api:IterativeSideTask", "nonexistent_pkg_zz.mod:Cls",
        f"{outside}:Good", f"{outside}/good.py:good", f"{outside}/not_a_task.py:NotATask",
        f"{outside}/no_class.py:Task", f"{outside}/broken.py:X", f"{outside}/exits.py:X",
        f"{outside}/missing.py:X", "a" * 300 + ":X",
    ]  # fmt: skip


def check_reference(ref: Any) -> None:
    try:
        cls = load_task_class(ref)
    except ValueError as e:
        outcome("refused")
        message = str(e)
        shown = {repr(ref), repr(ref.strip())} if isinstance(ref, str) else {repr(ref)}
        assert any(r in message or r[:60] in message for r in shown), message
        return
    outcome("loaded")
    assert issubclass(cls, IterativeSideTask | ImperativeSideTask)
    assert cls not in (IterativeSideTask, ImperativeSideTask)


def test_listed_task_references_load_a_side_task_or_are_refused_naming_them(
    outside: Path,
) -> None:
    for ref in reference_examples(outside):
        check_reference(ref)


@FAST
@given(data=st.data())
def test_any_task_reference_loads_a_side_task_or_is_refused_naming_it(
    outside: Path, data: st.DataObject
) -> None:
    pieces = st.sampled_from(
        ["", ":", ".", "..", "/", ".py", "resnet18", "os", "path", "Good", "good.py",
         str(outside), "/etc", "passwd", "freeride_lab", "tasks", "vision", "ResNet18Task"]
    )  # fmt: skip
    ref = data.draw(
        st.one_of(
            st.lists(pieces, max_size=5).map("".join),
            st.text(max_size=10),
            st.sampled_from(list(BUILTIN_TASKS)).map(str.upper),
            st.sampled_from([None, 5, b"resnet18", ["resnet18"]]),
        )
    )
    check_reference(ref)


def test_a_task_file_outside_the_project_is_accepted_and_works(outside: Path) -> None:
    cls = load_task_class(f"{outside}/good.py:Good")
    assert issubclass(cls, IterativeSideTask) and cls.unit == "iterations"
    assert cls().step() == 1.0


def test_a_file_without_the_class_is_refused_naming_file_and_class(outside: Path) -> None:
    with pytest.raises(ValueError, match=r"no_class.py' has no class 'Task'; it defines no side"):
        load_task_class(f"{outside}/no_class.py:Task")


def test_a_class_that_is_not_a_side_task_is_refused_with_the_fix(outside: Path) -> None:
    with pytest.raises(ValueError, match="NotATask is not a subclass of IterativeSideTask or "):
        load_task_class(f"{outside}/not_a_task.py:NotATask")


def test_a_task_file_that_exits_on_import_is_refused_not_obeyed(outside: Path) -> None:
    with pytest.raises(ValueError, match="SystemExit"):
        load_task_class(f"{outside}/exits.py:X")


@pytest.mark.parametrize("task", ["", "nope", "a:1b", ":Cls"])
def test_task_spec_refuses_a_reference_of_no_known_form_at_once(task: str) -> None:
    with pytest.raises(ValueError, match=repr(task)[1:-1] or "empty"):
        TaskSpec.from_dict({"task": task})
