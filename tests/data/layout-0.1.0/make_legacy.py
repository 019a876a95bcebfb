"""Write a preempted run and its uninterrupted twin with the code of this commit (the fixture of the
layout-compatibility test)."""
import os
import signal

import vitlab.train.trainer as loop
from vitlab.train import resolve_config, run

TINY = {"depth": 1, "width": 32, "num_heads": 2, "mlp_dim": 64}
def tiny(out, **kw):
    base = dict(out=out, model="ViT-Ti/4", model_args=TINY, image_size=8, batch_size=16, steps=4, warmup=1,
                eval_every=0, save_every=2, keep_last=3, log_every=1, workers=0, dropout=0.1, eval_batch_size=512)
    return resolve_config("demo", **{**base, **kw})

ref = run(tiny("reference"))
real = loop.Trainer._train_step
def step_then_signal(self, batches):
    stats = real(self, batches)
    if self.step == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return stats
loop.Trainer._train_step = step_then_signal
first = run(tiny("preempted"))
print(ref.status, ref.step, first.status, first.step)
