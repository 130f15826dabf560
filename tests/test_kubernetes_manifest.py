"""The shipped Kubernetes Job (deploy/kubernetes/train-job.yml) that retries on exit 75: valid
against the Kubernetes API's own schemas, and holding what the requeue needs. No cluster
runs here, so a schema check is the proof there is: kubernetes-validate (the dev extra)
bundles the JSON schemas made from each release's OpenAPI document (1.25-1.37 in 1.37.0) and
validates offline; `strict` rejects a field the API does not know (a misspelt
`podFailurePolicy` would otherwise pass as an ignored extra key). The schemas leave `action`
and `operator` as free strings, so their values are checked here against the Job API's
documented ones. The manifest is shown verbatim in docs/deploy.md and
docs/never-lose-a-job.md: those blocks must stay this file."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.cgroup_helpers import PROJECT
from tests.extras import need

need("kubernetes-validate", extra="dev")

import kubernetes_validate  # noqa: E402
import yaml  # noqa: E402 - PyYAML, a dependency of kubernetes-validate

MANIFEST = os.path.join(PROJECT, "deploy", "kubernetes", "train-job.yml")
# podFailurePolicy is stable (GA) from Kubernetes 1.31: the oldest version it is checked on
VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
EXIT_STATUS = 75  # cgwatch.GUARD_EXIT_STATUS, written out: the manifest must say 75 itself


def manifest() -> dict[str, Any]:
    with open(MANIFEST) as f:
        data: dict[str, Any] = yaml.safe_load(f)
    return data


@pytest.mark.parametrize("version", VERSIONS)
def test_manifest_is_a_valid_job(version: str) -> None:
    checked = kubernetes_validate.validate(manifest(), version, strict=True)
    assert checked == version.rsplit(".", 1)[0]  # its own schema, not an older fallback


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The check can fail: a misspelt key in the pod spec is refused."""
    data = manifest()
    data["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicyy"):
        kubernetes_validate.validate(data, VERSIONS[0], strict=True)


def test_exit_75_is_retried_without_counting_as_a_failure() -> None:
    data = manifest()
    assert (data["apiVersion"], data["kind"]) == ("batch/v1", "Job")
    pod = data["spec"]["template"]["spec"]
    # The API refuses a podFailurePolicy unless the pod template's restartPolicy is Never.
    assert pod["restartPolicy"] == "Never"
    names = [c["name"] for c in pod["containers"]]
    rules = data["spec"]["podFailurePolicy"]["rules"]
    on_75 = [r for r in rules if EXIT_STATUS in r.get("onExitCodes", {}).get("values", [])]
    assert len(on_75) == 1, rules
    rule = on_75[0]
    # Ignore: a new pod, not counted against backoffLimit (Count would count it; FailJob and
    # FailIndex would end the Job: the documented actions)
    assert rule["action"] == "Ignore"
    assert rule["onExitCodes"]["operator"] == "In"  # the other is NotIn
    assert rule["onExitCodes"]["containerName"] in names
    assert isinstance(data["spec"]["backoffLimit"], int)
    # The guarded command, its checkpoint on a volume that outlives the pod.
    train = pod["containers"][names.index(rule["onExitCodes"]["containerName"])]
    command = train["command"]
    assert command[:3] == ["cgwatch", "run", "--guard"] and "--" in command
    ckpt = command[command.index("--checkpoint-dir") + 1]
    mount = [m for m in train["volumeMounts"] if m["mountPath"] == ckpt]
    assert len(mount) == 1
    volume = [v for v in pod["volumes"] if v["name"] == mount[0]["name"]]
    assert len(volume) == 1 and "persistentVolumeClaim" in volume[0]
    assert "memory" in train["resources"]["limits"]


@pytest.mark.parametrize("page", ["deploy.md", "never-lose-a-job.md"])
def test_docs_show_the_manifest_as_shipped(page: str) -> None:
    with open(MANIFEST) as f:
        body = f.read().split("apiVersion:", 1)[1]  # after the file's header comment
    with open(os.path.join(PROJECT, "docs", page)) as f:
        text = f.read()
    assert f"```yaml\napiVersion:{body}```" in text
