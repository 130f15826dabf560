"""DeepSpeed, for real: its CPU accelerator inside a memory-limited cgroup, with and without
cgwatch.integrations.deepspeed.

Needs torch and deepspeed (tests/integration/setup makes .venv-integration with both) and
root on a host where the test may create memory cgroups under its own. Every DeepSpeed run
happens in a child process moved into a fresh limited cgroup (tests/cgroup_helpers.py); this
pytest process never imports torch or DeepSpeed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cgroup_helpers import MiB, Tree
from tests.integration.children import free_port, require, run_in

pytestmark = pytest.mark.integration

require("torch", "deepspeed")

HERE = Path(__file__).resolve().parent
ZERO_STEPS = HERE / "zero_steps.py"
LIMIT = 1024 * MiB  # far below host RAM; torch + deepspeed peak at ~250 MiB per process
LAUNCH_LIMIT = 2048 * MiB  # launcher, node launcher and rank share one cgroup


# Child prologue: read accelerator answers and cgwatch's at the same moment (retry until no
# allocation moved the usage during the three reads: cgwatch's, the accelerator's, cgwatch's).
PROBE = textwrap.dedent("""
    import json, os, sys
    import cgwatch

    def probe(accel):
        for _ in range(200):
            a1 = cgwatch.available_memory()
            got = accel.available_memory()
            a2 = cgwatch.available_memory()
            if a1 == got == a2:  # the accelerator's own read may be the one that moved
                break
        return {"class": type(accel).__name__, "name": accel._name,
                "backend": accel.communication_backend_name(),
                "total": accel.total_memory(), "available": got,
                "cgwatch_total": cgwatch.total_memory(), "cgwatch_available": [a1, a2],
                "export_envs": list(accel.export_envs())}

    def report(**kw):
        print("RESULT " + json.dumps(kw), flush=True)
""")


def assert_cgroup_answers(p: dict[str, Any], limit: int) -> None:
    assert p["class"] == "CgwatchCPUAccelerator"
    assert (p["name"], p["backend"]) == ("cpu", "gloo")
    assert p["total"] == p["cgwatch_total"] == limit
    a1, a2 = p["cgwatch_available"]
    assert a1 == a2 == p["available"], p
    assert 0 < p["available"] <= limit
    assert "CGWATCH" in p["export_envs"]


def test_install_replaces_host_values_with_the_cgroup_limit(tree: Tree,
                                                             env: dict[str, str]) -> None:
    cg = tree.make("install", limit=LIMIT)
    code = PROBE + textwrap.dedent("""
        import psutil
        from deepspeed.accelerator import get_accelerator
        from cgwatch.integrations import deepspeed as cgds
        host = psutil.virtual_memory()
        before = probe(get_accelerator())
        installed = cgds.install()
        after = probe(get_accelerator())
        again = cgds.install() is installed
        restored = cgds.uninstall()
        report(host_total=host.total, before=before, after=after, idempotent=again,
               restored=restored, after_uninstall=type(get_accelerator()).__name__)
    """)
    r = run_in(tree, cg, code, env)
    print(f"\nDeepSpeed CPU accelerator in a cgroup limited to {LIMIT} bytes:"
          f"\n  before install(): total_memory={r['before']['total']} "
          f"available_memory={r['before']['available']} ({r['before']['class']})"
          f"\n  after install():  total_memory={r['after']['total']} "
          f"available_memory={r['after']['available']} ({r['after']['class']})")
    before = r["before"]
    assert before["class"] == "CPU_Accelerator"
    assert before["total"] == r["host_total"] > LIMIT  # DeepSpeed alone: the host's RAM
    assert before["export_envs"] == []
    assert_cgroup_answers(r["after"], LIMIT)
    assert r["idempotent"] and r["restored"]
    assert r["after_uninstall"] == "CPU_Accelerator"


def test_env_switch_installs_before_deepspeed_binds_accelerator_methods(
        tree: Tree, env: dict[str, str], pth_installed: str) -> None:
    cg = tree.make("envswitch", limit=LIMIT)
    code = PROBE + textwrap.dedent("""
        import deepspeed.runtime.utils as ds_utils
        from deepspeed.accelerator import get_accelerator
        from cgwatch.integrations import deepspeed as cgds
        accel = get_accelerator()
        report(probe=probe(accel), status=cgds.autoload_status(),
               bound_to_ours=ds_utils.torch_memory_reserved.__self__ is accel)
    """)
    on = run_in(tree, cg, code, {**env, "CGWATCH_DEEPSPEED": "1"})
    assert on["status"] == "installed"
    assert_cgroup_answers(on["probe"], LIMIT)
    # Installed before deepspeed/runtime/utils.py bound accelerator methods at import time.
    assert on["bound_to_ours"]

    off = run_in(tree, cg, code, {**env, "CGWATCH_DEEPSPEED": "0"})
    assert off["status"] == "not armed"
    assert off["probe"]["class"] == "CPU_Accelerator"
    assert off["probe"]["total"] > LIMIT

    forced_cpu = run_in(tree, cg, code, {**env, "CGWATCH_DEEPSPEED": "1",
                                         "DS_ACCELERATOR": "cpu"})
    assert forced_cpu["status"] == "installed"
    assert_cgroup_answers(forced_cpu["probe"], LIMIT)


def test_import_order_enable_autoload_before_and_after_import_deepspeed(
        tree: Tree, env: dict[str, str]) -> None:
    """The sitecustomize form, no .pth needed: before `import deepspeed` the hook wins over the
    methods deepspeed/runtime/utils.py binds at import; after it, install() still answers for
    everything asked at run time, but those bindings keep the replaced accelerator."""
    cg = tree.make("order", limit=LIMIT)
    template = PROBE + textwrap.dedent("""
        from cgwatch.integrations import deepspeed as cgds
        BEFORE
        import deepspeed.runtime.utils as ds_utils
        from deepspeed.accelerator import get_accelerator
        AFTER
        accel = get_accelerator()
        report(probe=probe(accel), status=cgds.autoload_status(),
               bound_to_ours=ds_utils.torch_memory_reserved.__self__ is accel,
               bound_class=type(ds_utils.torch_memory_reserved.__self__).__name__)
    """)
    early_code = template.replace("BEFORE", "cgds.enable_autoload()").replace("AFTER", "")
    early = run_in(tree, cg, early_code, env)
    assert early["status"] == "installed"
    assert early["bound_to_ours"]
    assert_cgroup_answers(early["probe"], LIMIT)

    late_code = template.replace("BEFORE", "").replace("AFTER", "cgds.install()")
    late = run_in(tree, cg, late_code, env)
    assert late["status"] == "not armed"
    assert not late["bound_to_ours"]
    assert late["bound_class"] == "CPU_Accelerator"
    assert_cgroup_answers(late["probe"], LIMIT)


def test_the_class_asked_for_before_import_deepspeed_is_the_one_installed(
        tree: Tree, env: dict[str, str]) -> None:
    """The hook armed, then `accelerator_class()` before `import deepspeed`: building the class
    imports DeepSpeed, whose import runs the hook, which asks for the class again on the same
    thread (LazyClass's lock is reentrant for that). One class comes out: before, the build
    made two, the installed accelerator was not an instance of the one returned, and
    uninstall() refused (seen with DeepSpeed 0.19.8)."""
    cg = tree.make("classfirst", limit=LIMIT)
    code = PROBE + textwrap.dedent("""
        from cgwatch.integrations import deepspeed as cgds
        cgds.enable_autoload()
        cls = cgds.accelerator_class()
        from cgwatch.integrations.deepspeed import CgwatchCPUAccelerator
        from deepspeed.accelerator import get_accelerator
        accel = get_accelerator()
        report(probe=probe(accel), status=cgds.autoload_status(),
               same_class=type(accel) is cls is CgwatchCPUAccelerator,
               uninstalled=cgds.uninstall(), after=type(get_accelerator()).__name__)
    """)
    r = run_in(tree, cg, code, env)
    assert r["status"] == "installed" and r["same_class"]
    assert_cgroup_answers(r["probe"], LIMIT)
    assert r["uninstalled"] and r["after"] == "CPU_Accelerator"


def test_multinode_launcher_forwards_switch_to_remote_rank(
        tree: Tree, env: dict[str, str], pth_installed: str, tmp_path: Path) -> None:
    """DeepSpeed's real multi-node runner with a stand-in `pdsh` that runs the "remote" node's
    command locally under `env -i`: the rank sees only what the runner exported, so it gets
    CGWATCH_DEEPSPEED only through our accelerator's export_envs()."""
    cg = tree.make("launcher", limit=LAUNCH_LIMIT)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    pdsh_log = tmp_path / "pdsh-cmd.txt"
    pdsh = bindir / "pdsh"
    pdsh.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        # stand-in for pdsh: drop its options up to the host list, run the rest as node 0
        while [ "$#" -gt 0 ] && [ "$1" != "-w" ]; do shift; done
        shift 2
        cmd="$*"
        cmd="${{cmd//%n/0}}"
        printf '%s\\n' "$cmd" > {pdsh_log}
        exec env -i PATH=/usr/bin:/bin HOME="$HOME" bash -c "$cmd"
        """))
    pdsh.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    rank_out = tmp_path / "rank.json"
    rank_script = tmp_path / "rank.py"
    rank_script.write_text(PROBE + textwrap.dedent(f"""
        from deepspeed.accelerator import get_accelerator
        from cgwatch.integrations import deepspeed as cgds
        with open({str(rank_out)!r}, "w") as f:
            json.dump(dict(probe=probe(get_accelerator()), status=cgds.autoload_status(),
                           env_keys=sorted(os.environ), argv=sys.argv[1:]), f)
    """))
    runner = textwrap.dedent(f"""
        import os, sys
        os.chdir({str(tmp_path)!r})
        sys.argv = ["deepspeed", "--hostfile", {str(hostfile)!r}, "--force_multi",
                    "--launcher", "pdsh", "--no_ssh_check", "--master_addr", "127.0.0.1",
                    "--master_port", "{free_port()}", {str(rank_script)!r}]
        from deepspeed.launcher.runner import main
        main()
        from deepspeed.accelerator import get_accelerator
        print("RESULT " + __import__("json").dumps(type(get_accelerator()).__name__))
    """)
    launcher_env = {**env, "CGWATCH_DEEPSPEED": "1",
                    "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}"}
    assert run_in(tree, cg, runner, launcher_env) == "CgwatchCPUAccelerator"

    cmd = pdsh_log.read_text()
    assert "export CGWATCH_DEEPSPEED=1;" in cmd, cmd
    rank = json.loads(rank_out.read_text())
    assert rank["status"] == "installed"
    assert "CGWATCH_DEEPSPEED" in rank["env_keys"]
    assert_cgroup_answers(rank["probe"], LAUNCH_LIMIT)


def _zero_run(tree: Tree, cgroup: str, env: dict[str, str], mode: str) -> Any:
    env = {**env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    code = (f"import runpy, sys\nsys.argv = [{str(ZERO_STEPS)!r}, {mode!r}]\n"
            f"runpy.run_path({str(ZERO_STEPS)!r}, run_name='__main__')\n")
    return run_in(tree, cgroup, code, env)


def test_zero_stage_1_and_2_losses_identical_with_and_without_cgwatch(
        tree: Tree, env: dict[str, str], tmp_path: Path) -> None:
    cg = tree.make("zero", limit=LIMIT)
    plain = _zero_run(tree, cg, env, "plain")
    ours = _zero_run(tree, cg, env, "cgwatch")
    print(f"\nZeRO in a {LIMIT}-byte cgroup, available_memory() seen while flattening:"
          f"\n  DeepSpeed alone: {plain['zero_available_memory']}"
          f"\n  with cgwatch:    {ours['zero_available_memory']}"
          f"\n  losses: {ours['losses']}")
    assert plain["accelerator"] == "CPU_Accelerator"
    assert ours["accelerator"] == "CgwatchCPUAccelerator"
    assert plain["optimizer"] == ours["optimizer"] == {"1": "DeepSpeedZeroOptimizer",
                                                     "2": "DeepSpeedZeroOptimizer"}
    assert plain["losses"] == ours["losses"]  # bit-identical floats
    for stage in ("1", "2"):
        losses = ours["losses"][stage]
        assert len(losses) == 4 and all(loss > 0 for loss in losses)
        # ZeRO asked the accelerator how much memory is free when it planned its flat buffer:
        # DeepSpeed alone answers the host's, with cgwatch the cgroup's.
        assert plain["zero_available_memory"][stage]
        assert ours["zero_available_memory"][stage]
        assert all(v > LIMIT for v in plain["zero_available_memory"][stage])
        assert all(0 < v <= LIMIT for v in ours["zero_available_memory"][stage])
    assert plain["total_memory"] > LIMIT and ours["total_memory"] == LIMIT
    assert not (tmp_path / "torch_extensions").exists(), "a DeepSpeed op was JIT-compiled"


def test_importing_cgwatch_never_imports_torch_or_deepspeed() -> None:
    code = ("import sys, cgwatch, cgwatch.psutil_view, cgwatch.integrations.deepspeed\n"
            "cgwatch.total_memory(); cgwatch.psutil_view.virtual_memory()\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed'))\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"

