"""HF accelerate, unmodified, in a real 1 GiB memory cgroup: `get_max_memory()["cpu"]` (what
`device_map="auto"` and big-model inference plan CPU offload from) is psutil's
`virtual_memory().available`, the host's. With only `CGWATCH_PSUTIL=1` set (and the switches'
.pth installed in this venv by `python -m cgwatch.integrations install-pth`) it is the
cgroup's headroom.

Needs torch and accelerate (tests/integration/setup) and root; every accelerate run is a child
process inside a fresh limited cgroup; this pytest process never imports torch or accelerate.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.cgroup_helpers import MiB, Tree
from tests.integration.children import require, run_in

pytestmark = pytest.mark.integration

require("torch", "accelerate")

LIMIT = 1024 * MiB

# The child reads cgwatch only after accelerate has answered, and never imports it itself
# before: the switch alone must do it.
CHILD = textwrap.dedent("""
    import json, sys
    from accelerate.utils import get_max_memory
    import psutil
    first = get_max_memory()
    vm = psutil.virtual_memory()
    again = get_max_memory()
    cgwatch_loaded_by_switch = "cgwatch" in sys.modules
    import cgwatch
    from cgwatch.integrations import switches
    print("RESULT " + json.dumps(dict(
        cpu=first["cpu"], cpu_again=again["cpu"], keys=sorted(map(str, first)),
        vm_total=vm.total, host_total=psutil._psplatform.virtual_memory().total,
        host_available=psutil._psplatform.virtual_memory().available,
        cgwatch_total=cgwatch.total_memory(), cgwatch_loaded_by_switch=cgwatch_loaded_by_switch,
        hook=switches.switch_status()["switches"]["CGWATCH_PSUTIL"]["hook"])))
""")


def test_get_max_memory_cpu_is_the_cgroups_with_only_the_switch(
        tree: Tree, env: dict[str, str], pth_installed: str) -> None:
    cg = tree.make("accelerate", limit=LIMIT)
    on = run_in(tree, cg, CHILD, {**env, "CGWATCH_PSUTIL": "1"})
    off = run_in(tree, cg, CHILD, env)
    print(f"\naccelerate get_max_memory()['cpu'] in a cgroup limited to {LIMIT} bytes:"
          f"\n  CGWATCH_PSUTIL=1: {on['cpu']} ({on['cpu'] / MiB:.0f} MiB)"
          f"\n  unset:            {off['cpu']} ({off['cpu'] / MiB:.0f} MiB, host "
          f"{off['host_total'] / MiB:.0f} MiB)")
    assert on["keys"] == off["keys"] == ["cpu"]  # a CPU-only torch: no GPU entries

    assert on["hook"] == "installed" and on["cgwatch_loaded_by_switch"]
    assert on["vm_total"] == on["cgwatch_total"] == LIMIT < on["host_total"]
    assert 0 < on["cpu"] <= LIMIT and 0 < on["cpu_again"] <= LIMIT

    assert off["hook"] == "not armed" and not off["cgwatch_loaded_by_switch"]
    assert off["vm_total"] == off["host_total"] > LIMIT
    assert off["cpu"] > LIMIT  # the host's MemAvailable, not the cgroup's
