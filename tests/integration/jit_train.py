"""An HF Trainer job that saves on SIGTERM with transformers' own jit checkpoint
(`TrainingArguments(enable_jit_checkpoint=True)`): no cgwatch in it, no signal handler of its
own. Run by tests/integration/test_run_guard_jit.py under `cgwatch run --guard`.

    python jit_train.py OUT STEPS MODE [LEAK_MIB]

OUT: the Trainer's output_dir (its `checkpoint-<step>/`); the job resumes from the newest
there (`resume_from_checkpoint=True`) when there is one. MODE: `train` (LEAK_MIB MiB written
and kept after every training step: a leak that restarts with the process; 0: none, the
reference run), `eval` (no training leak; an evaluation at step EVAL_AT that gathers every
batch's logits, ~1 MiB a batch, until EVAL_BATCHES: past a 1.5 GiB limit). Every training
step's loss goes to OUT/losses.log as `<CGWATCH_RESTART or 0> <step> <loss repr>`, written
as the step computes it: a step that ran again after a resume logs its loss again.

The model is built here after `transformers.set_seed(0)` (the Trainer seeds in its own
`__init__`, after the model exists: built first, two runs differ; training.NOTES §6); the
data are seeded random ids; nothing is downloaded. A leaking step also sleeps STEP_SECONDS (a
real step's length, and a leak rate the guard's forecast can follow; the reference run goes
at full speed: a pause changes no loss).
"""

from __future__ import annotations

import os
import sys
import time

STEP_SECONDS = 0.02
EVAL_AT = 5  # eval mode: the evaluation after this step
EVAL_BATCHES = 1500  # eval mode: ~1.5 GiB of logits if nothing stops it
EVAL_PAUSE = 0.04  # eval mode: seconds per evaluation batch (~25 MiB/s of logits)

_kept: list[bytes] = []


def main() -> None:
    out, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    leak = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    import torch
    import transformers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers.trainer_utils import get_last_checkpoint

    life = os.environ.get("CGWATCH_RESTART", "0")
    log = open(os.path.join(out, "losses.log"), "a")  # noqa: SIM115 (open for the run)

    class Recorded(Trainer):
        def compute_loss(self, model, inputs, *args, **kwargs):  # type: ignore[no-untyped-def]
            result = super().compute_loss(model, inputs, *args, **kwargs)
            if model.training:  # evaluation computes losses too: not a step's
                loss = result[0] if isinstance(result, tuple) else result
                log.write(f"{life} {self.state.global_step + 1} {loss.item()!r}\n")
                log.flush()
            return result

    class Shape(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if leak:
                _kept.append(b"\x5a" * (leak << 20))  # written: a zero page may not be charged
                time.sleep(STEP_SECONDS)

        def on_prediction_step(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(EVAL_PAUSE)

    transformers.set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000,
                                       n_positions=32, bos_token_id=0, eos_token_id=0,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    ids = torch.randint(0, 1000, (800, 32), generator=torch.Generator().manual_seed(1234))
    train = [{"input_ids": row, "labels": row} for row in ids]
    evaluating = mode == "eval"
    if evaluating:
        more = torch.randint(0, 1000, (8 * EVAL_BATCHES, 32),
                             generator=torch.Generator().manual_seed(99))
        held_out = [{"input_ids": row, "labels": row} for row in more]
    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, learning_rate=1e-3, use_cpu=True, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, enable_jit_checkpoint=True,
        eval_strategy="steps" if evaluating else "no", eval_steps=EVAL_AT,
        # the evaluation keeps every batch's logits, as one that computes metrics on them
        # does, in a list (no concatenation at each batch: its copies would come and go)
        eval_do_concat_batches=False)
    # compute_metrics given: the evaluation keeps the logits (without it, HF keeps only the
    # losses: prediction_loss_only)
    trainer = Recorded(model=model, args=args, train_dataset=train,
                       eval_dataset=held_out if evaluating else None, callbacks=[Shape()],
                       compute_metrics=(lambda p: {"batches": len(p.predictions)})
                       if evaluating else None)
    resume = get_last_checkpoint(out)
    if resume:
        print(f"resumed from {os.path.basename(resume)}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print(f"ended at step {trainer.state.global_step}", flush=True)
    log.close()


if __name__ == "__main__":
    main()
