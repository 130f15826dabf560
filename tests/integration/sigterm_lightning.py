"""A Lightning job that saves on SIGTERM with Lightning's own machinery: its signal connector
(always installed at `fit()`, Slurm or not) turns SIGTERM into `SIGTERMException` at the next
batch boundary, and the stock `OnExceptionCheckpoint` callback saves `on_exception.ckpt`
then; the next `fit()` resumes from it by itself. No cgwatch and no signal handler in it. Run
by tests/integration/test_run_guard_lightning.py under `cgwatch run --guard`.

    python sigterm_lightning.py OUT STEPS LEAK_MIB

OUT: default_root_dir and the checkpoint's directory. LEAK_MIB MiB are written and kept after
every training step (a leak that restarts with the process; 0: none, the reference run).
Every step's loss goes to OUT/losses.log as `<CGWATCH_RESTART or 0> <step> <loss repr>`.
A tiny regression model on seeded random data, read in order through torchdata's
StatefulDataLoader (a plain DataLoader restarts its epoch on a mid-epoch resume:
training.NOTES §6).
"""

from __future__ import annotations

import os
import sys
import time

STEP_SECONDS = 0.02  # a leaking step's pause (the reference goes at full speed)


def main() -> None:
    out, steps, leak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import OnExceptionCheckpoint
    from torchdata.stateful_dataloader import StatefulDataLoader

    life = os.environ.get("CGWATCH_RESTART", "0")
    log = open(os.path.join(out, "losses.log"), "a")  # noqa: SIM115 (open for the run)
    kept: list[bytes] = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                           torch.nn.Linear(64, 1))

        def training_step(self, batch, index):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = ((self.net(x).squeeze(1) - y) ** 2).mean()
            log.write(f"{life} {self.global_step + 1} {loss.item()!r}\n")
            log.flush()
            return loss

        def on_train_batch_end(self, *args):  # type: ignore[no-untyped-def]
            if leak:
                kept.append(b"\x5a" * (leak << 20))  # written: a zero page may not be charged
                time.sleep(STEP_SECONDS)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(800, 16, generator=g)
    y = x @ (torch.arange(16, dtype=torch.float32) / 16) + 0.1 * torch.randn(800, generator=g)
    # Not shuffled: with shuffle=True and a seeded generator, a resumed run's next epoch came
    # in another order than an uninterrupted run's (losses equal to step 400 of a stop at
    # 334, then not; torchdata 0.11, Lightning 2.6.6): the position within an epoch is
    # restored, the next epoch's draw is not.
    loader = StatefulDataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    ckpt = os.path.join(out, "on_exception.ckpt")
    if os.path.exists(ckpt):
        step = torch.load(ckpt, weights_only=False)["global_step"]
        print(f"resumed from step {step}", flush=True)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out,
                        callbacks=[OnExceptionCheckpoint(out)])
    trainer.fit(Module(), loader)  # ckpt_path=None: on_exception.ckpt when there is one
    print(f"ended at step {trainer.global_step}", flush=True)
    log.close()


if __name__ == "__main__":
    main()
