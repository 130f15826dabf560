"""The one spelling of on and off (cgwatch/envswitch.py) for every CGWATCH_* switch, and the one
integration mechanism (cgwatch/integrations/_autoload.py): a hook table row, its finder, its
status, as the next adapter (HF Trainer, Lightning) will use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple, Optional

import pytest

from cgwatch import Monitor
from cgwatch.envswitch import parse_switch, switch_off, switch_on
from cgwatch.integrations import switches
from tests.fake_tree import FakeHost, GiB

REPO = Path(__file__).resolve().parents[1]


class Row(NamedTuple):
    value: Optional[str]  # what the environment holds (None: unset)
    want: Optional[bool]  # on, off, or not given (the variable's default)


# Spellings seen in job scripts, Dockerfiles and CI configs.
ROWS = [
    pytest.param(Row(None, None), id="unset"),
    pytest.param(Row("", None), id="empty: `export CGWATCH_PSUTIL=`"),
    pytest.param(Row("  \n", None), id="blank-from-a-here-doc"),
    pytest.param(Row("1", True), id="1"),
    pytest.param(Row("yes", True), id="yes"),
    pytest.param(Row("True", True), id="True-from-yaml"),
    pytest.param(Row("on", True), id="on"),
    pytest.param(Row("2", True), id="any-other-value-is-on"),
    pytest.param(Row("0", False), id="0"),
    pytest.param(Row("false", False), id="false"),
    pytest.param(Row("FALSE", False), id="FALSE-shell-style"),
    pytest.param(Row("False", False), id="False-from-python-str"),
    pytest.param(Row("no", False), id="no"),
    pytest.param(Row("off", False), id="off"),
    pytest.param(Row(" 0\n", False), id="0-with-a-newline-from-a-file"),
]


@pytest.mark.parametrize("row", ROWS)
def test_parse_switch(row: Row) -> None:
    assert parse_switch(row.value) is row.want
    env = {} if row.value is None else {"CGWATCH_X": row.value}
    # A switch whose default is off (the integrations) is on only when said so; one whose
    # default is on (CGWATCH_THREAD) is off only when said so.
    assert switch_on("CGWATCH_X", env) is (row.want is True)
    assert switch_off("CGWATCH_X", env) is (row.want is False)


@pytest.mark.parametrize("row", ROWS)
def test_the_pth_line_reads_a_switch_as_envswitch_does(row: Row) -> None:
    """The .pth line inlines the test (no import while every switch is off): it must agree."""
    line = switches.pth_line()
    assert line.startswith("import os; ") and " and exec(" in line
    on = line[len("import os; "):line.index(" and exec(")]
    for var in (switches.PSUTIL_VAR, switches.DEEPSPEED_VAR):
        env = {} if row.value is None else {var: row.value}
        assert eval(on, {"os": SimpleNamespace(environ=env)}) is (row.want is True)


@pytest.mark.parametrize(("value", "thread"), [
    ("off", False), ("no", False), ("FALSE", False), ("0", False),
    ("", True), ("1", True), ("yes", True),
])
def test_cgwatch_thread_spells_off_like_every_switch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, thread: bool) -> None:
    host = FakeHost(str(tmp_path), 1)
    host.make_path({"/a": GiB, "/a/b": None, "/a/b/c": None})
    monkeypatch.setenv("CGWATCH_THREAD", value)
    m = Monitor(host.root)
    try:
        assert m.total_memory() == GiB
        assert m.status.thread is thread
    finally:
        m.close()


# --- the mechanism, with a made-up framework and adapter: the template of the next adapter ---

FRAMEWORK = 'print("framework runs")\nvalue = 41\n'
ADAPTER = textwrap.dedent("""
    def on_import(module):
        print("adapter sees", module.value)
        module.value += 1
        return "installed"
""")
CHILD = textwrap.dedent("""
    import json, sys
    from cgwatch import testdoor
    # The adapter's one row (integrations/_autoload.py's register() line).
    testdoor.register_hook("toy", "CGWATCH_TOY", "toyframework", "toyadapter:on_import")
    finders = lambda: sum(type(f).__name__ == "PostImportFinder" for f in sys.meta_path)
    testdoor.arm_hooks({"CGWATCH_TOY": sys.argv[1]})  # what the .pth line calls
    armed = [testdoor.hook_status["toy"], finders()]
    loaded_early = "toyadapter" in sys.modules
    import toyframework
    print("RESULT " + json.dumps(dict(
        armed=armed, loaded_early=loaded_early, value=toyframework.value,
        status=testdoor.hook_status["toy"], finders_left=finders(),
        again=testdoor.arm_hook("toy"))))  # what enable_autoload() calls
""")


def run_toy(tmp_path: Path, switch: str) -> tuple[list[str], dict[str, object]]:
    (tmp_path / "toyframework.py").write_text(FRAMEWORK)
    (tmp_path / "toyadapter.py").write_text(ADAPTER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGWATCH")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path)])
    out = subprocess.run([sys.executable, "-c", CHILD, switch], capture_output=True, text=True,
                         env=env, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    return lines[:-1], json.loads(lines[-1][len("RESULT "):])


def test_a_row_runs_its_adapter_right_after_its_trigger_module(tmp_path: Path) -> None:
    printed, r = run_toy(tmp_path, "1")
    # Right after the module's own code; the third line: arming once the trigger is imported
    # runs the adapter at once (a real adapter's on_import is idempotent, this toy's is not,
    # to show that it ran).
    assert printed == ["framework runs", "adapter sees 41", "adapter sees 42"]
    assert r["armed"] == ["armed", 1] and not r["loaded_early"]
    assert r["value"] == 42 and r["status"] == "installed"
    assert r["finders_left"] == 0  # the finder leaves sys.meta_path once its modules loaded
    assert r["again"] == "installed"


def test_a_row_whose_switch_is_off_arms_nothing(tmp_path: Path) -> None:
    printed, r = run_toy(tmp_path, "off")
    assert r["armed"] == ["not armed", 0] and r["value"] == 41 and r["status"] == "not armed"
    # The adapter ran only when code armed it by name (enable_autoload()'s way), switch or not.
    assert printed == ["framework runs", "adapter sees 41"] and r["again"] == "installed"


@pytest.mark.parametrize(("name", "var", "trigger", "adapter"), [
    pytest.param("deepspeed", "CGWATCH_DEEPSPEED", "deepspeed.accelerator.real_accelerator",
                 "cgwatch.integrations.deepspeed:on_import", id="the-same-row-again"),
    pytest.param("psutil", "CGWATCH_PSUTIL_TOO", "psutil", "toyadapter:on_import",
                 id="another-adapter-under-a-taken-name"),
])
def test_a_name_is_registered_once(name: str, var: str, trigger: str, adapter: str) -> None:
    # A second row under a name would silently replace the first's switch and adapter: the
    # table refuses it and stays as it was (the .pth line names the table's variables).
    from cgwatch import testdoor

    line, status = switches.pth_line(), dict(testdoor.hook_status)
    with pytest.raises(ValueError, match=f"hook '{name}' is already registered"):
        testdoor.register_hook(name, var, trigger, adapter)
    assert switches.pth_line() == line and testdoor.hook_status == status
