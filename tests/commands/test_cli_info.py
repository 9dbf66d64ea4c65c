"""`python -m engine info`: tables, --json keys, preset names and clear exit-2 errors."""
import json
import subprocess
import sys

import pytest

from engine.cli import main


def run_info(capsys, *argv):
    code = main(["info", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_for_v41(capsys):
    code, out, _ = run_info(capsys, "configs/deepseek-v4.1-flash.json", "--json")
    assert code == 0
    j = json.loads(out)
    assert {"total", "routed_experts", "shared_experts", "engram", "dspark", "activated_decode",
            "activated_prefill"} <= set(j["params"])
    assert {"checkpoint", "routed_experts", "engram"} <= set(j["bytes"])
    assert j["params"]["routed_experts"] == 543_581_798_400 and j["kv_bytes_per_token"]["global"] == 890
    assert len(j["layers"]) == 43 and j["layers"][20]["path"] == "layers.20"
    assert len(j["roles"]) == 43 and j["roles"][24]["indexer"] == "reindex"
    labels = [f["label"] for f in j["published_figures"]]
    assert "global KV bytes per token" in labels and all("difference" in f for f in j["published_figures"])


def test_human_table_for_a_preset_name(capsys):
    code, out, _ = run_info(capsys, "deepseek-v4.1-flash")
    assert code == 0
    assert "Published vs exact" in out and "Layer roles" in out and "890 B" in out
    role_rows = [line for line in out.splitlines() if line.strip().startswith(("layers.", "mtp."))]
    assert len(role_rows) == 43
    assert "source" in role_rows[20] and "yes" in role_rows[1]        # candidate source; Engram layer


@pytest.mark.parametrize("preset", ["tiny-v4.1", "tiny-v4", "deepseek-v4-flash-dspark"])
def test_presets_render(capsys, preset):
    code, out, _ = run_info(capsys, preset)
    assert code == 0 and "Activated parameters per token" in out and "Layer roles" in out


def test_v4_shows_hash_routed_layers(capsys):
    code, out, _ = run_info(capsys, "deepseek-v4-flash")
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("layers.")]
    assert [r[0] for r in rows if r[10] == "yes"] == ["layers.0", "layers.1", "layers.2"]
    assert "total parameters" in out and "284.000B" in out


def test_missing_file_and_unknown_preset_exit_2(capsys):
    code, _, err = run_info(capsys, "no-such-model")
    assert code == 2 and "'no-such-model' is neither a config file nor a preset" in err and "tiny-v4.1" in err
    code, _, err = run_info(capsys, "configs/missing.json")
    assert code == 2 and "missing.json: cannot read config (No such file or directory)" in err


def test_bad_config_exits_2_with_the_config_error(capsys, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 64}))
    code, _, err = run_info(capsys, str(bad))
    assert code == 2 and "missing required key(s)" in err
    bad.write_text("{not json")
    code, _, err = run_info(capsys, str(bad))
    assert code == 2 and "invalid JSON at line 1" in err


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "engine", "info", "tiny-v4.1", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["family"] == "v4.1"


def test_info_tokenizer_and_plan_import_no_torch():
    """The CLI builds only the chosen subcommand's options, so the describing commands start without torch."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys, io, contextlib; from engine.cli import main\n"
            "for argv in (['info', 'deepseek-v4.1-flash'], ['tokenizer', '--text', 'hi'], ['plan', 'tiny-v4.1']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()): assert main(argv) == 0\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False", out.stderr


def test_limits_imports_no_torch():
    """`python -m engine limits` reads every bound from torch-free modules: a fresh process prints them without
    loading torch."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys, io, contextlib; from engine.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out): assert main(['limits']) == 0\n"
            "assert 'temperature 0 (greedy) or at least 0.0001' in out.getvalue(), out.getvalue()\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False", out.stderr
