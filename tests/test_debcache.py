"""tests/debcache's one rule: a tier's package cache holds the whole dependency closure of what
the tier runs, the same on a bare host and on one that has the packages installed.

The rule it replaces asked apt which packages the host lacked: with Debian's qemu-system-x86
installed the VM cache had no seabios ("seabios missing after tests/vm/setup"), with slurm-wlm
installed the Slurm cache had no slurmd-wlm. Here a host "with the packages installed" is this
host's dpkg status plus records that say so (APT_CONFIG names it as Dir::State::status), so the
test needs no install and leaves the machine as it was. Needs apt-get and dpkg, and package
lists apt can resolve with (as root tests/debcache runs `apt-get update` itself when they are
stale); the fetch case downloads munge's few small packages (~150 kB) into a temporary
DEB_CACHE. ~25 s of CPU (apt's solver runs nine times): 1-3 min of wall time here, loaded."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEBCACHE = str(REPO / "tests" / "debcache")
STATUS = Path("/var/lib/dpkg/status")
# A loaded 2-core machine: each listing runs apt's solver three times (~3-15 s each here).
TIMEOUT = 600

if not (shutil.which("apt-get") and shutil.which("dpkg") and STATUS.is_file()):
    pytest.skip("needs apt-get and dpkg (a Debian-like host): tests/debcache fetches with them",
                allow_module_level=True)

# What the tiers ask for, as tests/tools, tests/vm/setup and tests/slurm/run name them.
TIERS = {
    "runtime": ["prometheus", "runc", "crun", "lxcfs"],
    "vm": ["qemu-system-x86", "busybox-static", "cpio", "kmod", "e2fsprogs", "xz-utils"],
    "slurm": ["slurm-wlm", "munge", "slurm-client"],
}
# What each tier reads from its cache, and the package it comes in: the VM tier's firmware
# (bios-256k.bin, `-L`) and qemu's TCG module, the Slurm daemons run as slurmd-wlm etc. and
# their plugins, crun's and lxcfs's libraries.
NEEDED = {
    "runtime": {"prometheus", "runc", "crun", "lxcfs", "libfuse3-3", "libyajl2"},
    "vm": {"qemu-system-x86", "qemu-system-common", "qemu-system-data", "seabios",
           "busybox-static", "cpio", "kmod", "e2fsprogs", "xz-utils", "libext2fs2"},
    "slurm": {"slurmd", "slurmctld", "slurm-client", "slurm-wlm-basic-plugins", "munge",
              "libmunge2"},
}
# Every host that runs tests/debcache has these (Essential, or apt's): never in a cache, libc6
# least of all (its libraries must match the host's loader).
NEVER = {"libc6", "libc-bin", "bash", "dash", "coreutils", "perl-base", "dpkg", "apt"}


def run_debcache(*args: str, status: Path | None = None,
                 env: dict[str, str] | None = None) -> str:
    """tests/debcache ARGS; with `status`, apt reads that file as dpkg's status."""
    full = {**os.environ, **(env or {})}
    if status is not None:
        conf = status.with_suffix(".conf")
        conf.write_text(f'Dir::State::status "{status}";\n')
        full["APT_CONFIG"] = str(conf)
    proc = subprocess.run([DEBCACHE, *args], capture_output=True, text=True, env=full,
                          timeout=TIMEOUT)
    if proc.returncode != 0:
        if os.geteuid() != 0 and "apt cannot resolve" in proc.stderr:
            pytest.skip(f"apt cannot resolve the tiers' packages as a normal user: {proc.stderr}")
        raise AssertionError(f"tests/debcache {' '.join(args)}: {proc.returncode}\n{proc.stderr}")
    return proc.stdout


def status_with_installed(tmp_path: Path, packages: list[str]) -> Path:
    """This host's dpkg status, plus `packages` as installed (the archive's records with a
    Status line), so apt takes them, and what they depend on, as already on the host."""
    text = STATUS.read_text(errors="replace")
    have = set(re.findall(r"^Package: (\S+)", text, re.M))
    records = subprocess.run(["apt-cache", "show", "--no-all-versions",
                              *[p for p in packages if p not in have]],
                             capture_output=True, text=True, check=True, timeout=TIMEOUT).stdout
    added = [f"Status: install ok installed\n{r.strip()}\n"
             for r in records.split("\n\n") if r.strip()]
    status = tmp_path / "status"
    status.write_text(text.rstrip("\n") + "\n\n" + "\n".join(added))
    return status


@pytest.fixture(scope="module")
def bare() -> list[str]:
    """The packages of every tier, asked with this host's own dpkg status."""
    return run_debcache("--list", *sorted({p for names in TIERS.values() for p in names})).split()


def test_every_tier_gets_the_same_closure_whether_or_not_the_host_has_the_packages(
        bare: list[str], tmp_path: Path) -> None:
    wanted = sorted({p for names in TIERS.values() for p in names})
    # the host "with Debian's qemu-system-x86, slurm-wlm, munge, lxcfs, runc, crun and
    # prometheus installed": everything the bare host's cache would hold is installed
    installed = run_debcache("--list", *wanted, status=status_with_installed(tmp_path, bare))
    assert installed.split() == bare
    for tier, needed in NEEDED.items():
        assert needed <= set(bare), (tier, sorted(needed - set(bare)))
    assert not NEVER & set(bare), sorted(NEVER & set(bare))


def test_a_fresh_cache_beside_installed_packages_holds_and_runs_them(
        bare: list[str], tmp_path: Path) -> None:
    cache = tmp_path / "debs"
    # munge and libmunge2 "installed", as every package of the tiers
    out = run_debcache("probe", "munge", status=status_with_installed(tmp_path, bare),
                       env={"DEB_CACHE": str(cache)})
    bin_dir = cache / "probe" / "bin"
    assert out.strip() == str(bin_dir)
    listed = (cache / "probe" / "packages").read_text().split()
    assert {"munge", "libmunge2"} <= set(listed) <= set(bare)
    assert (cache / "probe" / "root" / "usr" / "sbin" / "munged").is_file()
    # the wrapper runs the unpacked daemon with the unpacked libmunge2 first
    version = subprocess.run([str(bin_dir / "munged"), "--version"], capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0 and "munge-" in version.stdout + version.stderr, version
    # a second call finds it built (the stamp names the rule) and prints the same directory
    assert run_debcache("probe", "munge", env={"DEB_CACHE": str(cache)}).strip() == str(bin_dir)
