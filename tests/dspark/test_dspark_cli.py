"""`generate --dspark`: the same greedy text as plain decoding, DSpark metrics on stderr and in the trace."""
from __future__ import annotations

import json

import torch

from engine.cli import main
from engine.trace import Trace

torch.set_num_threads(1)
BASE = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "The cat", "--max-new-tokens", "5"]


def test_dspark_cli_prints_plain_greedy_text_and_writes_dspark_steps(tmp_path, capsys):
    assert main(BASE) == 0
    plain = capsys.readouterr().out
    out = tmp_path / "run.json"
    assert main(BASE + ["--dspark", "--schedule", "threshold", "--threshold", "0.3", "--trace", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout == plain
    assert "DSpark:" in stderr and "mean accepted length" in stderr
    trace = Trace.load(out)
    assert trace.meta["dspark"] == "threshold" and trace.dspark_steps
    assert sum(s.accepted + 1 for s in trace.dspark_steps) == 4   # 5 tokens: the first came from the prefill


def test_dspark_cli_errors_are_named(tmp_path, capsys):
    assert main(BASE + ["--dspark", "--schedule", "threshold", "--threshold", "2"]) != 0
    assert "threshold must lie in" in capsys.readouterr().err
    cfg = json.loads(open("configs/tiny-v4.1.json").read())
    cfg.update(dspark_block_size=0, n_mtp_layers=0, dspark_target_layer_ids=[], dspark_markov_rank=0,
               compress_ratios=cfg["compress_ratios"][:cfg["n_layers"]])
    (tmp_path / "plain.json").write_text(json.dumps(cfg))
    args = ["generate", "--config", str(tmp_path / "plain.json")] + BASE[3:] + ["--dspark"]
    assert main(args) != 0
    assert "has no DSpark drafter" in capsys.readouterr().err


def test_bench_adds_dspark_on_off_rows(capsys):
    argv = ["bench", "--threads", "1", "--prompt-len", "4", "--new-tokens", "3", "--repeats", "1", "--dspark"]
    assert main(argv + ["--json"]) == 0
    row = json.loads(capsys.readouterr().out)["dspark"]
    assert row["outputs_equal"] is True and row["schedule"] == "all"
    assert row["speedup"] == row["dspark_tokens_per_s"] / row["plain_tokens_per_s"] > 0
    assert row["mean_accepted_length"] >= 1 and row["tokens_per_target_forward"] >= 1
