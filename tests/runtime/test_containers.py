"""Real OCI containers (Debian's runc and crun) with cgwatch inside, held against the kernel.

Each container runs one Python process (tests/runtime/inside.py) that performs every case of
its shape and prints one JSON result; the tests below check parts of that result. A container
costs ~0.5 s here but ~10-15 s under the VM's emulation (runc's start alone is several
seconds of emulated Go), hence one process per container and four containers in the VM.

Shapes: with and without a private cgroup namespace, the cgroup file system read-only
(Docker's default) or read-write, a 1 GiB limit, the container's cgroup under the test's own
memory cgroup. On cgroup v1 (this host) crun alone (runc 1.1.5 insists on v1 hierarchies
outside our memory cgroup: tests/runtime/oci.py); on cgroup v2 (the VM, `tests/vm/run` with
VM_MEM=2G so that 1 GiB is below guest RAM) runc with the cgroupfs driver and crun, two
shapes each, so that every runtime sees both namespace modes and both mount modes.

Cases inside:
  A  the container's own limit binds (total, the marked level, available against
     limit - (usage - inactive_file) read from the files);
  B  a child made inside (rw) with 256 MiB binds;
  C  a child without a limit under a 512 MiB child that also holds a 32 MiB sibling: that
     parent binds both answers;
  events: v1 eventfd registration (cgroup.event_control) fails with EROFS on a ro mount, and
     the events fall back to polling while the monitor still says `watching` (inotify works
     on a ro mount); v2 needs no write to watch memory.events, but its PSI trigger for
     headroom alerts is a write to memory.pressure: alerts fall back to the timer;
  update: `RUNTIME update --memory 64M` from outside, seen by the monitor already running;
  oom: `cgwatch run --report` around an allocation loop at that 64 MiB limit: exit 137, the
     kill counted, the culprit is the container's own level and its limit;
  hidden parent: the container under a 700 MiB parent, no cgroup namespace (v1:
     total_memory() is the parent's, from hierarchical_memory_limit, as a `hidden` level);
     on v2 the parent is hidden only by a cgroup namespace, and status.above says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, NamedTuple, Optional

import pytest

from cgwatch.envswitch import switch_on
from tests.cgroup_helpers import (
    MiB,
    Tree,
    cgroup_tree,
    own_memory_cgroup,
    real_kernel_marks,
    writable_reason,
)
from tests.runtime.oci import Container, GiB, Shape, missing_reason, runtimes

pytestmark = real_kernel_marks()

IN_VM = switch_on("CGWATCH_IN_VM", os.environ)
# Guest code runs ~30x slower (TCG): a limit write is seen within 0.1 s there, but allow more
SEEN_WITHIN = 15.0 if IN_VM else 5.0
OOM_LIMIT = 64 * MiB
HIDDEN_LIMIT = 700 * MiB
CHILD_B, PARENT_P, SIBLING_HELD = 256 * MiB, 512 * MiB, 32 * MiB
# available_memory() and the files are read a few ms apart while python allocates
SLACK = 4 * MiB


class Case(NamedTuple):
    runtime: str
    shape: Shape
    hidden_parent: bool  # the container's cgroup under a parent limited to 700 MiB

    @property
    def id(self) -> str:
        s = self.shape
        return (f"{self.runtime}-{'cgroupns' if s.cgroupns else 'no-cgroupns'}-"
                f"{'ro' if s.cgroup_ro else 'rw'}{'-hidden-parent' if self.hidden_parent else ''}")


def _version() -> int:
    res, _ = own_memory_cgroup()
    return res.version if res is not None else 1


def cases(version: int) -> list[Case]:
    if version == 1:
        # crun only (oci.py); every namespace/mount pair, and the hidden parent apart because
        # it changes what case A expects
        return [Case("crun", Shape(cgroupns=ns, cgroup_ro=ro), False)
                for ns in (True, False) for ro in (False, True)] + \
               [Case("crun", Shape(cgroupns=False, cgroup_ro=True), True)]
    # v2, the VM: four boots. A namespace is the only thing that hides a v2 parent (both
    # runtimes mount the whole cgroup2 hierarchy without one), so the namespaced shapes sit
    # under the 700 MiB parent.
    runc, crun = runtimes(2)
    return [Case(runc, Shape(cgroupns=True, cgroup_ro=False), True),
            Case(runc, Shape(cgroupns=False, cgroup_ro=True), False),
            Case(crun, Shape(cgroupns=True, cgroup_ro=True), True),
            Case(crun, Shape(cgroupns=False, cgroup_ro=False), False)]


VERSION = _version()
CASES = cases(VERSION)


class Ran(NamedTuple):
    case: Case
    version: int
    result: dict[str, Any]
    host_dir: str  # the container's cgroup directory on the host
    host_path: str  # its path in the hierarchy, as seen from the host
    update_seconds: float


def plan(case: Case, version: int) -> dict[str, Any]:
    # `show` (the cgwatch command's JSON and table) while the container has its 1 GiB
    steps: list[dict[str, Any]] = [{"op": "own"}, {"op": "show"}, {"op": "events"}]
    if v1_hidden(case):
        return {"version": version, "steps": steps}
    if not case.shape.cgroup_ro:
        steps.append({"op": "children"})
    steps += [{"op": "update", "to": OOM_LIMIT, "timeout": SEEN_WITHIN}, {"op": "oom"}]
    return {"version": version, "steps": steps}


def run_case(case: Case, tree: Tree) -> Ran:
    parent = tree.make("parent", limit=HIDDEN_LIMIT) if case.hidden_parent else tree.base
    ctr = Container(case.runtime, tree.version, tree, parent, case.shape)
    try:
        steps = plan(case, tree.version)
        ctr.start(steps)
        update_seconds = 0.0
        if any(s["op"] == "update" for s in steps["steps"]):
            sync = ctr.line()
            assert sync == {"sync": "update", "total": sync["total"]}, sync
            update_seconds = ctr.update_memory(OOM_LIMIT)
        result = ctr.result()
        mount_point = "/sys/fs/cgroup/memory" if tree.version == 1 else "/sys/fs/cgroup"
        host_path = "/" + os.path.relpath(ctr.cgroup, mount_point)
        return Ran(case, tree.version, result, ctr.cgroup, host_path, update_seconds)
    finally:
        ctr.close()


@pytest.fixture(scope="module")
def ran_cases() -> Iterator[dict[str, Any]]:
    """Each container's outcome (a Ran, or the exception it raised), run once on first use:
    the tests are parametrized over the shapes they apply to and share the runs."""
    yield {}


def over(applies: Any) -> pytest.MarkDecorator:
    """Parametrize a test over the cases it applies to (no run-time skips: a skip of a
    runtime test is a failure where containers must run, tests/runtime/conftest.py)."""
    chosen = [c for c in CASES if applies(c)]
    return pytest.mark.parametrize("case", chosen, ids=[c.id for c in chosen])


def get(case: Case, runs: dict[str, Any]) -> Ran:
    if case.id not in runs:
        for reason in (writable_reason(), missing_reason(case.runtime)):
            if reason:
                pytest.skip(reason)
        try:
            with cgroup_tree() as tree:
                runs[case.id] = run_case(case, tree)
        except Exception as e:
            runs[case.id] = e
            raise
    got = runs[case.id]
    if isinstance(got, Exception):
        raise AssertionError(f"the {case.id} container failed earlier") from got
    assert isinstance(got, Ran)
    return got


def v1_hidden(c: Case) -> bool:
    return c.hidden_parent and VERSION == 1


def own_level_path(r: Ran) -> str:
    """The container's own level as cgwatch should name it: `/` in its cgroup namespace,
    else the host's path (no namespace: /proc/self/cgroup shows the full path)."""
    return "/" if r.case.shape.cgroupns else r.host_path


def bound_level(levels: list[dict[str, Any]], key: str) -> dict[str, Any]:
    marked = [lvl for lvl in levels if lvl[key]]
    assert len(marked) == 1, levels
    return marked[0]


def close_to(answer: int, measured: Optional[int]) -> bool:
    return measured is not None and abs(answer - measured) < SLACK


# ---- case A, and where the container's cgroup is seen ----------------------------------------

@over(lambda c: True)
def test_the_container_cgroup_is_found_where_the_runtime_put_it(
        case: Case, ran_cases: dict[str, Any]) -> None:
    ran = get(case, ran_cases)
    r, own = ran.result, ran.result["own"]
    expected = "/sys/fs/cgroup/memory" if ran.version == 1 else "/sys/fs/cgroup"
    if not ran.case.shape.cgroupns and ran.version == 2:
        # runc and crun mount the whole cgroup2 hierarchy when there is no namespace
        expected = "/sys/fs/cgroup" + ran.host_path
    # Both crun on v1 (own cgroup bind-mounted, mount root = its path) and a namespace put
    # the container's directory at the mount point itself
    assert r["own_dir"] == expected, r["cgroup_mounts"]
    status = own["status"]
    moved = r.get("moved_to")  # v2 with children: this process sits in a leaf `init`
    assert status["directory"] == (moved or expected)
    path = own_level_path(ran)
    assert status["cgroup_path"] == (path.rstrip("/") + "/init" if moved else path)
    assert status["mode"] == "watching", status["reason"]
    assert status["reason"] == ""


@over(lambda c: not v1_hidden(c))  # there the 700 MiB parent binds (test_a_hidden_...)
def test_a_the_container_limit_binds(case: Case, ran_cases: dict[str, Any]) -> None:
    ran = get(case, ran_cases)
    own = ran.result["own"]
    files = own["files"][0]  # the container's own directory, read by inside.py
    assert files["limit"] == 1 * GiB
    assert own["total"] == 1 * GiB
    for key in ("binds_total", "binds_available"):
        level = bound_level(own["levels"], key)
        assert level["directory"] == files["directory"]
        assert level["cgroup_path"] == own_level_path(ran)
        assert level["limit"] == 1 * GiB
    assert close_to(own["available"], files["headroom"]), (own["available"], files)


@over(lambda c: True)
def test_what_cannot_be_seen_above_is_said(case: Case, ran_cases: dict[str, Any]) -> None:
    ran = get(case, ran_cases)
    above = ran.result["own"]["status"]["above"]
    if ran.version == 2 and ran.case.shape.cgroupns:
        # No v2 file shows an ancestor's limit from inside a namespace: here a 700 MiB parent
        # exists, and all cgwatch can honestly do is say that it cannot see above
        assert ran.case.hidden_parent
        assert "cannot be seen" in above, above
        assert ran.result["own"]["total"] == 1 * GiB
    elif ran.case.hidden_parent:
        assert "hierarchical_memory_limit" in above, above
    else:
        # v1: hierarchical_memory_limit equals the container's own limit: nothing hidden;
        # v2 without a namespace: the whole path to the root is visible
        assert above == ""


@over(lambda c: c.hidden_parent)
def test_a_hidden_parent_limit(case: Case, ran_cases: dict[str, Any]) -> None:
    ran = get(case, ran_cases)
    if ran.version == 2:
        # The 700 MiB parent (the kernel enforces it: memory.max above the container) is
        # outside the namespace, and no v2 file inside shows it: the honest answer is the
        # visible 1 GiB, with status.above saying that limits above cannot be seen
        own = ran.result["own"]
        assert own["total"] == 1 * GiB
        assert HIDDEN_LIMIT not in [lvl["limit"] for lvl in own["levels"]]
        assert not any(lvl["hidden"] for lvl in own["levels"])
        assert "cannot be seen" in own["status"]["above"]
        assert "cannot be seen" in ran.result["show"]["table"]
        print(ran.result["show"]["table"])  # shown with -rP
        return
    own = ran.result["own"]
    files = own["files"][0]
    # The kernel's own words: the container's limit 1 GiB, the smallest on its path 700 MiB
    assert files["limit"] == 1 * GiB
    assert files["hierarchical_memory_limit"] == HIDDEN_LIMIT
    assert own["total"] == HIDDEN_LIMIT
    assert [lvl["hidden"] for lvl in own["levels"]] == [False, True]
    hidden = own["levels"][1]
    assert hidden["limit"] == HIDDEN_LIMIT and hidden["binds_total"]
    # its usage is the top visible level's (a floor): available is an upper bound from it
    working_set = files["usage"] - files["inactive_file"]
    assert abs(own["available"] - (HIDDEN_LIMIT - working_set)) < SLACK
    # the table's own row and note for it ("above ...", "v1 hierarchical_memory_limit")
    table = ran.result["show"]["table"]
    print(table)  # shown with -rP: the table inside a container with a hidden parent
    assert "hierarchical_memory_limit" in table and "TA  (above " in table, table


# ---- cases B and C: children made inside -----------------------------------------------------

def children(case: Case, runs: dict[str, Any]) -> dict[str, Any]:
    got: dict[str, Any] = get(case, runs).result["children"]
    return got


def rw(c: Case) -> bool:
    """Children can be made inside (a rw cgroup mount; not the v1 hidden-parent shape)."""
    return not c.shape.cgroup_ro and not v1_hidden(c)


@over(rw)
def test_b_a_smaller_child_limit_binds(case: Case, ran_cases: dict[str, Any]) -> None:
    b = children(case, ran_cases)["b"]
    files = b["files"][0]
    assert files["limit"] == CHILD_B
    assert b["total"] == CHILD_B
    assert b["status"]["directory"] == files["directory"]
    for key in ("binds_total", "binds_available"):
        assert bound_level(b["levels"], key)["directory"] == files["directory"]
    assert close_to(b["available"], files["headroom"]), (b["available"], files)
    # the walk goes on to the container's level above it
    assert b["levels"][1]["limit"] == 1 * GiB


@over(rw)
def test_c_a_child_without_a_limit_under_a_limited_parent(
        case: Case, ran_cases: dict[str, Any]) -> None:
    got = children(case, ran_cases)
    c = got["c"]
    c_files, p_files = c["files"]
    assert c_files["limit"] is None and p_files["limit"] == PARENT_P
    assert got["sib_usage"] >= SIBLING_HELD  # p's usage is more than c's own
    assert c["levels"][0]["directory"] == c_files["directory"]
    assert c["levels"][0]["limit"] is None and c["levels"][0]["headroom"] is None
    assert c["total"] == PARENT_P
    for key in ("binds_total", "binds_available"):
        assert bound_level(c["levels"], key)["directory"] == p_files["directory"]
    assert close_to(c["available"], p_files["headroom"]), (c["available"], p_files)
    assert c["available"] < PARENT_P - SIBLING_HELD + SLACK


# ---- events: eventfds on rw, polling on ro ---------------------------------------------------

@over(lambda c: True)
def test_events_are_noticed_in_a_documented_way(case: Case, ran_cases: dict[str, Any]) -> None:
    ran = get(case, ran_cases)
    ev = ran.result["events"]
    assert ev["mode"] == "watching", ev  # inotify works on a ro mount too
    assert ev["first_item"] == "HeadroomAlert", ev  # the 99% alert: armed and checked
    print(json.dumps(ev))  # shown with -rP
    events, alerts = ev["mechanisms"]["events"], ev["mechanisms"]["alerts"]
    ro = ran.case.shape.cgroup_ro
    # What registration opens for writing: on a ro mount open() fails with EROFS (v1
    # cgroup.event_control on 6.18, v2 memory.pressure on 6.1)
    assert ev["registration_file"] == ("EROFS" if ro else "writable"), ev
    if ran.version == 2:
        # watching memory.events needs no write: inotify either way
        assert events == "inotify on memory.events and memory.events.local of every level"
        if ro:  # the PSI trigger cannot be written: alerts fall back to the periodic check
            assert alerts.startswith("checked every") and "Read-only file system" in alerts
        elif "ok" in ev["psi_write"].values():
            # This process could write a trigger: seen with crun (no namespace) on 6.1, where
            # the 1 s window got EINVAL and the 2 s one was accepted (no CAP_SYS_RESOURCE:
            # psi_trigger_create() takes only whole 2 s windows from the unprivileged, with
            # EINVAL, since 6.5 and in Debian's 6.1.x). notify.psi_trigger widens the window
            # on that EINVAL, so cgwatch's alerts use PSI too.
            assert alerts.startswith("PSI trigger"), json.dumps(ev)
        else:
            # The kernel refused this process's own writes too: seen with runc in a cgroup
            # namespace, where the limited level is the namespace root and nsdelegate
            # refuses writes to its non-delegatable files from inside (EPERM, 6.1): the
            # periodic check, with the reason
            assert alerts.startswith("checked every") and "PSI trigger at " in alerts, alerts
    elif ro:
        # no eventfd: OOMs and failcnt are polled, and alerts checked on the timer
        assert "polled every" in events and "Read-only file system" in events, events
        assert alerts.startswith("checked every") and "Read-only file system" in alerts
    else:
        assert events.startswith("memory.oom_control OOM eventfd on 1 limited level"), events
        assert alerts.startswith("usage threshold eventfds"), alerts


# ---- a limit changed from outside ------------------------------------------------------------

@over(lambda c: not v1_hidden(c))
def test_update_memory_from_outside_is_seen_by_the_running_monitor(
        case: Case, ran_cases: dict[str, Any]) -> None:
    ran = get(case, ran_cases)
    up = ran.result["update"]
    assert up["before"] == 1 * GiB
    assert up["file"] == OOM_LIMIT  # the runtime wrote it
    assert up["seen_after"] is not None, up
    assert up["after"] == OOM_LIMIT and up["mode"] == "watching"
    assert ran.update_seconds < 60


# ---- an OOM kill explained -------------------------------------------------------------------

@over(lambda c: not v1_hidden(c))
def test_an_oom_kill_is_explained_with_the_container_level(
        case: Case, ran_cases: dict[str, Any]) -> None:
    ran = get(case, ran_cases)
    oom = ran.result["oom"]
    assert oom["returncode"] == 137, oom["stderr"]
    assert oom["counters"]["oom_kill"] >= 1  # the kernel counted it at the container level
    report = oom["report"]
    assert report is not None, oom
    assert report["exit_status"] == 137
    assert report["oom_kills"] >= 1
    culprit = report["culprit"]
    assert culprit is not None, report
    assert culprit["cgroup_path"] == own_level_path(ran)
    assert culprit["limit"] == OOM_LIMIT == oom["limit"]
    if "kind" in culprit:  # the kernel's counters say this level reached its limit
        assert culprit["kind"] == "hit"
