"""WIP probe (branch only): plain and DSpark, eager and torch.compile, tokens/s on two prompts (3 alternating repeats)."""
import sys, pathlib; sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import time, torch, statistics
torch.set_num_threads(1)
from engine.generation.engine import Engine
from engine.generation import DSparkConfig
e = Engine.load(checkpoint="checkpoints/default")
for prompt in ["MALVOLIO.\nFool, fool, fool, I", "ROMEO:\nBut soft, what light"]:
    ids = [e.encode(prompt)]
    e.generate(ids, max_new_tokens=64, compiled=True, stop_tokens=())
    e.generate(ids, max_new_tokens=64, dspark=DSparkConfig(schedule="all"), stop_tokens=(), compiled=True)
    rates = {k: [] for k in ("eager", "compiled", "dspark-compiled", "dspark-eager")}
    same = True
    for rep in range(3):
        a = e.generate(ids, max_new_tokens=64, stop_tokens=())
        b = e.generate(ids, max_new_tokens=64, compiled=True, stop_tokens=())
        c = e.generate(ids, max_new_tokens=64, dspark=DSparkConfig(schedule="all"), stop_tokens=(), compiled=True)
        d = e.generate(ids, max_new_tokens=64, dspark=DSparkConfig(schedule="all"), stop_tokens=())
        for k, r in zip(rates, (a, b, c, d)):
            rates[k].append(63 / r.decode_s)
        same &= a.tokens == b.tokens == c.tokens == d.tokens
    print(prompt.split("\n")[0], {k: round(statistics.median(v), 1) for k, v in rates.items()}, "same", same,
          "accepted", round(c.metrics.mean_accepted_length, 2) if hasattr(c.metrics, "mean_accepted_length") else c.metrics)
