"""Shared test set-up: the slow stage, and the browser fixtures (a live Streamlit server, headless Chromium)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]

# The slow stage (`pytest -m slow`, run second by scripts/test.sh): whole files, or single tests as file::name, each
# with why. Chosen from a `--durations=0` run of the full suite on the shared 2-core machine (seconds in brackets);
# everything else is the fast stage, which must stay under 3 minutes there.
SLOW = {
    # browser: a live Streamlit server driven by headless Chromium
    "test_e2e_architecture.py": "browser tests [52 s]",
    "test_e2e_inspect.py": "browser tests [~4 min under load]",
    "test_e2e_inspect_actions.py": "browser tests of user actions on the Inspect page [~4 min under load]",
    "test_e2e_architecture_actions.py": "browser tests of user actions on Architecture and the sidebar [~110 s]",
    "test_e2e_architecture_diagram.py": "the diagram's zoom, fit, search, opened steps and export in a browser "
                                        "[28 s at load average 5]",
    "test_e2e_concurrency.py": "four browser sessions generating at once on Inspect, against serial engine runs "
                               "[65 s at load average 5, 150 s at 8]",
    "test_e2e_compare_runs.py": "browser tests of the Compare page's Runs tab: two tiny models run, downloaded, "
                                "uploaded and handed to Inspect [33 s at load average 3.5, 55 s at 6]",
    "test_e2e_overlay.py": "live data painted on the diagram in a browser: a run of the shipped model on Inspect, the "
                            "overlay, a token, a box to Inspect and back, a loaded trace, a run diff on Compare [51 s at load "
                            "average 3.4]",
    "test_e2e_what_if.py": "browser tests of Inspect's What if: a run of the shipped model, an expert banned, the rerun "
                           "checked against both downloaded traces; a 200-token rerun stopped [86-98 s at load average "
                           "5-7]",
    "test_e2e_uploads.py": "hostile config uploads through the browser, with the server's memory watched [30 s at "
                           "load average 5, 150 s at 12]",
    "test_e2e_logit_lens.py": "the logit-lens panel in a browser: a run of the shipped model on Inspect, the lens table "
                              "at two tokens checked against the downloaded trace, the trace replayed [27-47 s at load "
                              "average 4-4.6]",
    # a fresh process
    "test_app_no_torch.py": "builds three pages under AppTest in a fresh process to watch sys.modules [6 s idle, "
                            "13 s loaded]",
    "test_bench_revision.py::test_head_against_the_working_tree_prints_a_table": "a git worktree of HEAD and two "
        "`engine bench` launches plus two `bench --help` probes, each a fresh process importing torch [~12 s idle, "
        "25 s at load average 4]",
    # model-card measurement
    "test_default_checkpoint.py": "re-measures the shipped model's card: held-out loss, DSpark runs on eight held-out "
                                  "prompts, 2 × 8 greedy continuations of 200 tokens [207 s at load average 5]",
    "test_model_card.py": "measures a card end to end on a tiny checkpoint and re-measures it [60 s at load average "
                          "5]",
    # long training runs
    "test_train_drafter.py": "trains and resumes a drafter [8 s]",
    "test_continuations.py": "greedy continuations of training prompts, and drafter training on them [25 s]",
    # long equivalence and statistics runs (the kernel ones: a whole model in the Triton interpreter)
    "test_dspark_distribution.py": "a chi-square test over 1000 sampled rows, and its power check [14 s]",
    "test_dspark_fallback_distribution.py": "the same chi-square test with the auto schedule's plain steps [15 s]",
    "test_graphs.py::test_static_body_decodes_like_eager_step_by_step": "24+ decode steps, twice [12 s]",
    "test_graphs.py::test_greedy_dspark_with_graphs_equals_eager": "four speculative runs, twice each [9 s]",
    "test_graphs.py::test_compiled_dspark_equals_eager_without_graph_breaks": "torch.compile of the verify and "
        "draft bodies [~3-4 min cold]",
    "test_speedups_fast.py::test_compiled_decode_equals_eager_decode": "torch.compile of a decode body (inductor, "
        "gcc) [~2-3 min cold; ~30 s with inductor's disk cache]",
    "test_speedups_fast.py::test_compiled_bf16_decode_traces_whole_and_follows_eager_decode": "the same in bf16 "
        "[~2 min cold]",
    "test_kernels_engine.py::test_kernel_engine_matches_reference_prefill_and_decode": "Triton interpreter [6 s]",
    "test_kernels_engine.py::test_cli_generate_with_triton_kernels_prints_the_reference_text": "the same [6 s]",
    # host memory measured on a large official-format checkpoint
    "test_official_memory.py": "writes a 257 MiB and a 1 GiB official checkpoint, loads and generates from them in "
                               "fresh processes, measuring RSS [11 s + 35 s]",
    "test_official_checkpoint.py": "writes, reads and breaks tiny official-format checkpoints, generates from "
                                   "them [15 s]",
    "test_kernels_quant.py": "FP8 / FP4 GEMMs in the Triton interpreter, many shapes [9 s]",
    # tensor/expert parallelism: torchrun launches (each rank a fresh process importing torch), or long lockstep runs
    "test_parallel.py::test_two_ranks_generate_the_tokens_of_one_process": "greedy, DSpark and sampled generation "
        "on 2 rank threads and in one process [16 s at load average 9]",
    "test_parallel.py::test_a_shard_reads_its_slices_of_a_checkpoint": "the first meta-device build imports "
        "torch._refs [5-12 s at load average 9]",
    "test_serving.py::test_remote_engine_gives_what_the_engine_gives": "an engine service in a thread, and the same "
        "DSpark run in process [6 s at load average 9]",
    "test_parallel.py::test_torchrun_generate_prints_the_single_process_text": "torchrun, 2 ranks, and the CLI in "
        "process [34 s at load average 9]",
    "test_parallel.py::test_torchrun_bench_reports_once": "torchrun, 2 ranks [29 s at load average 9]",
    "test_parallel.py::test_four_ranks_in_float64_compute_what_one_process_does": "torchrun, 4 ranks, and the "
        "same cases in one process [59 s at load average 9]",
    "test_parallel.py::test_torchrun_ends_every_rank_when_one_fails_or_hangs": "torchrun, 2 ranks, twice (one "
        "waits out a 3 s timeout) [2 x 21 s at load average 9]",
    "test_serving.py::test_a_two_rank_service_serves_the_single_process_text_and_trace": "a 2-rank engine service "
        "under torchrun, and the same generation in process [37 s at load average 9]",
    "test_bad_traces.py::test_limits_admit_the_design_point": "records, writes and reads a 2048-token default-small "
                                                               "trace in three formats, the logit lens's 16 k read-outs "
                                                               "resolved [24 s at load average 4.8; 70 s on a busy "
                                                               "machine]",
    "test_bad_configs.py::test_a_memory_bomb_config_is_refused_fast_and_small": "five fresh `python -m engine` "
        "processes under a memory cap, each importing torch [~3 s each, 8-15 s on a loaded machine]",
    "test_bad_configs.py::test_random_init_of_a_model_too_big_for_memory_is_refused_up_front": "the same, once [~3 s]",
    "test_v4_family.py::test_official_layout": "writes, reads and runs two tiny V4 official-format checkpoints, "
                                               "quantized and dequantized [~4 s each on a busy machine]",
    "test_v4_family.py::test_static_decode_and_draft_bodies_decode_like_eager": "plain and DSpark decoding through "
        "the static (CUDA-graph) bodies, and both capture-safety checks on the meta device [~6 s]",
    "test_hf_differential.py": "imports transformers [5-10 s] and runs four V4 configs through it and the engine, "
                               "prefill and teacher-forced decode, plus two save_pretrained folders [~25 s]",
    "test_app_inspect.py::test_an_official_fp8_folder_is_picked_and_generates":
        "quantizes the shipped model, then loads and generates from it in the page [10 s]",
    # the slowest fast-stage tests of a `--durations` run (seconds at load average ~4, about 1.6× an idle machine),
    # moved here to keep the fast stage under 3 minutes
    "test_indexer_loss.py::test_training_steps_reduce_the_indexer_kl": "training steps with the KL collector [13 s]",
    "test_graphs.py::test_dspark_with_graphs_drafts_through_the_graphed_drafter": "DSpark through graphed bodies [11 s]",
    "test_graphs.py::test_dspark_with_graphs_at_the_model_and_cache_end": "the same up to max_seq_len [7 s]",
    "test_graphs.py::test_verify_blocks_with_rollback_match_eager_logits_taps_cache_and_trace": "many verify "
        "blocks, graphed and eager [6 s]",
    "test_graphs.py::test_generate_with_graphs_matches_plain_generate": "generation twice [5 s]",
    "test_graphs.py::test_dspark_trace_with_graphs_equals_eager": "traced DSpark runs twice, two cases [5 + 3 s]",
    "test_quant_model.py::test_plain_and_dspark_generation_follow_the_dequantized_run": "four generations [11 s]",
    "test_quant_model.py::test_logits_match_the_dequantized_run_with_activation_quantization": "two dtypes [5 + 2 s]",
    "test_kernels_compile.py::test_natively_imported_kernels_refuse_cpu_tensors_clearly": "imports every Triton "
        "kernel module natively in a fresh process [10 s]",
    "test_kernels_engine.py::test_kernel_drafter_matches_reference": "a drafter in the Triton interpreter [7 s]",
    "test_interventions.py::test_triton_kernels_apply_interventions_as_the_reference": "a whole tiny model in the "
        "Triton interpreter, twice a forward [10 s at load average ~4]",
    "test_dspark_verify.py::test_sampling_preserves_target_distribution": "thousands of sampled verifications [6 s]",
    "test_layout.py::test_layer_loads_without": "fresh processes with a module blocked [6 s + 2 s]",
    "test_v4_family.py::test_dspark_greedy_equals_plain_greedy": "speculative and plain V4 runs [5 s]",
    "test_bad_checkpoints.py::test_huge_declared_header_is_refused_in_bounded_time_and_memory": "a capped fresh "
        "process [5 s]",
    "test_idmap_checkpoint.py::test_generate_command_on_a_reduced_checkpoint": "the CLI on a new checkpoint [5 s]",
    "test_idmap_checkpoint.py::test_engine_round_trips_unknown_words_through_the_id_map": "tokenizer and model "
        "builds [4 s]",
}


def pytest_collection_modifyitems(config, items):
    """Mark the tests listed in SLOW; a listed name that matches nothing is an error, not a test silently made fast."""
    test_files = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    stale = [key for key in SLOW if key.partition("::")[0] not in test_files]
    unmatched = {key for key in SLOW if "::" in key}
    collected_files = set()
    for item in items:
        file = item.path.name
        test = f"{file}::{item.originalname}"
        collected_files.add(file)
        if file in SLOW or test in SLOW:
            item.add_marker(pytest.mark.slow)
            unmatched.discard(test)
    stale += sorted(key for key in unmatched if key.partition("::")[0] in collected_files)
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {stale}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A fresh `streamlit run app.py` per test module: yields (base URL, log path); waits for the health endpoint
    and always stops the process."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("streamlit") / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port",
             str(port), "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            deadline = time.time() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                        if r.read() == b"ok":
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("streamlit did not come up:\n" + log_path.read_text())
                time.sleep(0.3)
            yield f"http://127.0.0.1:{port}", log_path
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium under Playwright (scripts/test.sh installs it)."""
    from playwright import sync_api
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test.sh does it)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """artifacts/screenshots/, where the browser tests leave what they saw."""
    path = ROOT / "artifacts" / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def card_inputs(tmp_path_factory):
    """A tiny checkpoint and prepared data dir with the card measured on them (tests/card_helpers.py)."""
    from tests.card_helpers import build_card_inputs
    return build_card_inputs(tmp_path_factory.mktemp("card"))
