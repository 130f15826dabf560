"""Observe mode and the record through a framework adapter, for real: Hugging Face's Trainer
with `GuardCallback(observe=True, record=FILE, reserve="90%")` in a 1.5 GiB v1 cgroup, torch
on the CPU, a tiny GPT-2 built locally. A 90 % reserve (1.35 GiB) is more headroom than the
job (~0.5 GiB of working set) ever has, so an acting guard would stop it at its first
sample; observing, it trains all its steps, saves no guard checkpoint and `stopped` stays
None, while its would-be stop is kept, judged false (the job went on and finished), and the
record replays through the decision to the same verdicts (`cgwatch replay`, exit 0).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.cgroup_helpers import MiB, Tree
from tests.integration.children import require, run_in

pytestmark = pytest.mark.integration

require("torch", "transformers")

LIMIT = 1536 * MiB
STEPS = 30

CHILD = textwrap.dedent("""
    import json, os, time
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from cgwatch.integrations.transformers import GuardCallback
    out, record, steps = ARGS
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, 1000, (64, 32), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    guard = GuardCallback(observe=True, record=record, reserve="90%")
    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=4,
                             save_strategy="no", report_to=[], logging_strategy="no",
                             use_cpu=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[guard])
    trainer.train()
    judged = guard.guard.would_stops(ended=time.monotonic())
    guard.guard.close()
    print("RESULT " + json.dumps({
        "steps": trainer.state.global_step, "stopped": guard.stopped is not None,
        "observe": guard.guard.observe,
        "judged": [(j.stop.trigger, j.judged) for j in judged],
        "saved": sorted(os.listdir(out))}), flush=True)
""")


def test_hf_callback_observes_records_and_replays(tree: Tree, env: dict[str, str],
                                                  tmp_path: Path) -> None:
    cgroup = tree.make(f"observe-hf-{uuid.uuid4().hex[:6]}", LIMIT)
    record = tmp_path / "hf.rec"
    out = tmp_path / "out"
    got = run_in(tree, cgroup, f"ARGS = {(str(out), str(record), STEPS)!r}\n" + CHILD, env,
                 timeout=600)
    assert (got["steps"], got["stopped"], got["observe"]) == (STEPS, False, True), got
    assert not any(name.startswith("checkpoint") for name in got["saved"]), got
    assert got["judged"] and got["judged"][0] == ["reserve", "false"], got
    assert all(judged == "false" for _, judged in got["judged"]), got
    proc = subprocess.run([sys.executable, "-m", "cgwatch.cli", "replay", "--json",
                           str(record)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    data = json.loads(proc.stdout)
    assert data["reproduced"] and data["first_stop"]["trigger"] == "reserve", data
    assert [s["judged"] for s in data["would_stops"]["stops"]] == [
        judged for _, judged in got["judged"]]
