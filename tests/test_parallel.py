"""Several GPUs in one job (variant knobs gpus, parallel): the supervisor launches the ranks with torchrun, every
rank trains, rank 0 writes the record with the totals and each rank's figures. On a CPU the ranks use gloo."""

from pathlib import Path

import pytest
import torch

from ftbench.config import settings as ftc
from ftbench.config.settings import Variant
from ftbench.core.knobs import knob_problems
from test_robustness import one_run_config, supervise_training


def ranked_run(tmp_path, tiny_qwen, instruction_data, name, knobs, batch_size=2, **training):
    cfg = one_run_config(measure={"warmup_steps": 2, "steps": 3, "min_seconds": 0.5, "repeats": 2}, **training)
    cfg["variants"][name] = knobs
    cfg["studies"]["llm"]["matrix"][0]["variants"] = [name]
    cfg["studies"]["llm"]["matrix"][0]["batch_sizes"] = [batch_size]
    spec = ftc.RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", name, batch_size)
    rec = supervise_training(tmp_path, tiny_qwen, instruction_data, cfg, spec)
    return rec, (tmp_path / "job.log").read_text()


def test_two_data_parallel_ranks_train_and_rank_0_records_both(tmp_path, tiny_qwen, instruction_data):
    strategy = "ddp"
    rec, log = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp2", DDP2)
    assert rec["status"] == "ok", (rec["reason"], log[-3000:])
    par = rec["parallel"]
    assert par["strategy"] == strategy and par["world_size"] == 2 and par["backend"] == "gloo"
    assert [r["rank"] for r in par["per_rank"]] == [0, 1] and all(r["status"] == "ok" for r in par["per_rank"])
    # each rank's own clock and power (NVML; none on a CPU): cards of one host run at different clocks
    assert all(r["sm_clock_mean_mhz"] is None and "power_mean_w" in r for r in par["per_rank"])
    # the totals count both ranks: each rank trained batch 2 per step over its own window
    per_rank = [r["samples_per_s"] for r in par["per_rank"]]
    assert rec["throughput"]["samples_per_s"] == pytest.approx(sum(per_rank))
    assert par["samples_per_s_per_gpu"] == pytest.approx(sum(per_rank) / 2)
    # both ranks closed the same windows at the same steps (agreed after warm-up and after each window: a rank
    # closing alone would have met the other's next collective), each window at least its minimum steps
    steps = [w["steps"] for w in rec["measure"]["windows"]]
    assert len(steps) == 2 and min(steps) >= 3
    assert rec["timing"]["steps_measured"] == sum(steps)
    assert rec["extra"]["supervision"]["exit_code"] == 0
    assert rec["extra"]["parallel_wrapper"] == "DistributedDataParallel"


DDP2 = {"peft": "lora", "precision": "bf16", "gpus": 2, "parallel": "ddp"}


def test_two_ranks_stop_together_once_their_windows_noise_is_low_enough(tmp_path, tiny_qwen, instruction_data):
    """measure.cv_target over gloo ranks: the ranks decide in one collective after each window, so both stop after
    min_repeats windows (not `repeats`), the job ends cleanly (no rank left waiting in a collective) and the record
    says why it holds fewer windows; it is not truncated."""
    cfg = one_run_config(measure={"warmup_steps": 2, "steps": 3, "repeats": 4, "cv_target": 10.0, "min_repeats": 2})
    cfg["variants"]["lora-ddp2"] = DDP2
    cfg["studies"]["llm"]["matrix"][0]["variants"] = ["lora-ddp2"]
    cfg["studies"]["llm"]["matrix"][0]["batch_sizes"] = [2]
    spec = ftc.RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", "lora-ddp2", 2)
    rec = supervise_training(tmp_path, tiny_qwen, instruction_data, cfg, spec)
    assert rec["status"] == "ok", (rec["reason"], (tmp_path / "job.log").read_text()[-3000:])
    assert len(rec["measure"]["windows"]) == 2 and rec["measure"]["truncated"] is False
    assert rec["extra"]["measure_stop"]["windows"] == 2 and rec["extra"]["measure_stop"]["cv_target"] == 10.0
    assert rec["extra"]["supervision"]["exit_code"] == 0


def test_a_rank_that_dies_after_its_record_keeps_the_measurement(tmp_path, tiny_qwen, instruction_data):
    """Rank 0 aborts in teardown, after writing its record (as gloo's threads made it do at exit): the run is still
    `ok`, with its figures, and the failure is stated beside them, not in their place."""
    rec, log = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp2", DDP2,
                          inject={"abort_after_record": True})
    assert rec["status"] == "ok", (rec["reason"], log[-3000:])
    assert rec["throughput"]["samples_per_s"] > 0 and rec["parallel"]["world_size"] == 2
    sup = rec["extra"]["supervision"]
    assert sup["exit_code"] != 0 and "after writing its record" in rec["extra"]["teardown"]
    assert sup["log_tail"]
    from ftbench.judge.analysis import display_table, flatten
    import polars as pl

    table = display_table(pl.DataFrame([flatten(rec)]))
    assert "after writing its record" in table["failed after its record"][0]


def test_a_rank_that_dies_before_its_record_is_a_crash(tmp_path, tiny_qwen, instruction_data):
    rec, _ = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp2", DDP2, inject={"kill_at_step": 3})
    assert rec["status"] == "crashed" and "without a record" in rec["reason"], rec["reason"]
    assert "(last step reached: rank 0 at 3, rank 1 at 3" in rec["reason"], rec["reason"]
    assert "teardown" not in rec["extra"]


def test_one_rank_killed_mid_run_ends_the_job_with_a_record_naming_it(tmp_path, tiny_qwen, instruction_data):
    """Rank 1 dies by SIGKILL at step 3 (a host OOM kill, a segfault); rank 0 waits in the step's all-reduce. torchrun
    sees the death and stops rank 0; the supervisor's record names rank 1 (torchrun's first observed failure), how it
    ended and each rank's last step, well within a minute of the kill and long before the time limit."""
    import time

    t0 = time.monotonic()
    rec, log = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp2", {**DDP2, "time_limit_s": 300},
                          inject={"kill_at_step": 3, "fault_rank": 1})
    took = time.monotonic() - t0
    assert rec["status"] == "crashed", (rec["reason"], log[-3000:])
    assert rec["reason"].startswith("rank 1 killed by SIGKILL without a record"), rec["reason"]
    assert "rank 1 at 3" in rec["reason"] and rec["parallel"]["failed_rank"] == 1, rec["reason"]
    sup = rec["extra"]["supervision"]
    assert sup["failed_rank"] == 1 and sup["last_step_by_rank"]["1"] == 3 and sup["elapsed_s"] < took
    assert rec["extra"]["fault_injected"] == {"kill_at_step": 3, "fault_rank": 1}  # a test, not a measurement
    assert took < 120  # the whole job, start to record: the kill itself ends it within seconds


def test_a_job_whose_ranks_stop_stepping_is_ended_by_the_supervisor(tmp_path, tiny_qwen, instruction_data):
    """Rank 1 hangs at step 3 (no error, no exit: the job that trained and then never finished); rank 0 waits on it in
    a collective. Nothing reports progress, and after the stall limit the supervisor ends the job with a `timeout`
    record naming each rank's last step, not at the time limit."""
    import time

    t0 = time.monotonic()
    rec, log = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp2", {**DDP2, "time_limit_s": 600},
                          inject={"hang_at_step": 3, "fault_rank": 1}, stall_limit_s=8)
    assert rec["status"] == "timeout", (rec["reason"], log[-3000:])
    assert rec["reason"].startswith("stalled: no progress from any rank for"), rec["reason"]
    assert "rank 1 at 3" in rec["reason"], rec["reason"]
    assert time.monotonic() - t0 < 200


def test_the_supervisor_finds_and_kills_processes_in_sessions_of_their_own():
    """torchrun starts each rank in a session of its own, out of reach of a kill of the launcher's process group: the
    supervisor follows the process tree, and what is left when the launcher has gone is killed."""
    import subprocess
    import sys
    import time

    from ftbench.run.supervise import _family, _kill_left

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline, seen = time.monotonic() + 30, {}
    while len(seen) < 2 and time.monotonic() < deadline:
        seen.update(_family(parent.pid)[1])
        time.sleep(0.2)
    assert parent.pid in seen and len(seen) == 2
    orphan = next(p for p in seen if p != parent.pid)
    parent.kill()
    parent.wait()
    assert Path(f"/proc/{orphan}").exists()  # the rank outlives its launcher
    assert _kill_left(seen) == [orphan]
    for _ in range(50):
        if not Path(f"/proc/{orphan}").exists() or "Z" in Path(f"/proc/{orphan}/stat").read_text().split(")")[1][:3]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the orphaned rank is still running")


def test_a_rank_that_fails_alone_writes_the_record_and_the_job_ends(tmp_path, tiny_qwen, instruction_data):
    """Rank 1 fails at step 3 (as an oom on one GPU would); rank 0 goes on into the step's all-reduce, which rank 1
    never joins. Before, rank 1 went on to the gather of the ranks' figures, a collective of another kind, and both
    waited (no step of a Qwen3-32B FSDP2 job logged in 225 s, h100x2-2026-11-26). Now the failed rank writes the
    job's record and leaves, torchrun stops rank 0, and the job ends long before its time limit."""
    import time

    t0 = time.monotonic()
    rec, log = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp2", {**DDP2, "time_limit_s": 90},
                          inject={"raise_at_step": 3, "raise_rank": 1})
    assert rec["status"] == "error", (rec["status"], rec["reason"], log[-3000:])
    assert rec["reason"].startswith("rank 1: RuntimeError: injected failure at step 3"), rec["reason"]
    assert rec["parallel"]["failed_rank"] == 1 and rec["parallel"]["world_size"] == 2
    assert "torchrun stopped the other ranks" in rec["extra"]["teardown"], rec["extra"]
    assert rec["extra"]["supervision"]["exit_code"] != 0
    assert time.monotonic() - t0 < 80


def test_gpus_and_parallel_knobs_are_checked_before_any_job():
    assert "without parallel='ddp'" in knob_problems("causal_lm", Variant("x", ddp_bucket_mb=512))[0]
    assert "ddp_graph_split" in knob_problems("causal_lm", Variant("x", gpus=2, parallel="ddp", ddp_graph_split=True))[0]
    assert knob_problems("causal_lm", Variant("x", gpus=2, parallel="ddp", compile="default", ddp_graph_split=True)) == []
    assert knob_problems("causal_lm", Variant("x", gpus=2, parallel="ddp")) == []
    assert "without parallel" in knob_problems("causal_lm", Variant("x", gpus=2))[0]
    assert "needs 2 or more" in knob_problems("causal_lm", Variant("x", parallel="ddp"))[0]
    assert knob_problems("causal_lm", Variant("x", gpus=2, parallel="fsdp2", precision="nf4")) == []  # QLoRA sharded
    assert any("unsloth" in p for p in knob_problems("causal_lm", Variant("x", gpus=2, parallel="ddp",
                                                                          framework="unsloth")))
    assert any("gpus" in p for p in knob_problems("lmm", Variant("x", gpus=2, parallel="ddp")))


def test_a_host_with_too_few_gpus_records_unsupported(tmp_path, tiny_qwen, instruction_data, monkeypatch):
    monkeypatch.setenv("FTBENCH_GPU_IDS", "0")  # a host that shows one GPU
    monkeypatch.setenv("FTBENCH_GPU_LOCK_DIR", str(tmp_path / "locks"))
    rec, _ = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp4",
                        {"peft": "lora", "precision": "bf16", "gpus": 4, "parallel": "ddp"})
    assert rec["status"] == "unsupported" and "asks for 4 GPUs" in rec["reason"]


def test_fsdp2_on_cpu_ranks_is_unsupported_not_data_parallel(tmp_path, tiny_qwen, instruction_data):
    """accelerate applies FSDP to GPU ranks only: on a CPU the FSDP2 variant says so instead of training DDP."""
    rec, _ = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-fsdp2",
                        {"peft": "lora", "precision": "bf16", "gpus": 2, "parallel": "fsdp2"})
    assert rec["status"] == "unsupported" and "FSDP2" in rec["reason"], rec["reason"]


def test_one_bucket_data_parallel_reaches_the_trainer_and_rank_0_profiles_the_job(tmp_path, tiny_qwen, instruction_data):
    """ddp_bucket_mb is honoured (the trainer's DDP gets it), and a profile of a two-rank job is rank 0's trace:
    one summary, written once, with the collectives counted (gloo's on a CPU leave no NCCL kernels: no share)."""
    import json

    from test_robustness import ROOT

    from ftbench.run.supervise import supervise

    knobs = {**DDP2, "ddp_bucket_mb": 512, "compile": "default", "compile_scope": "layers"}
    rec, log = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-ddp2-flat", knobs)
    assert rec["status"] == "ok", (rec["reason"], log[-3000:])
    assert rec["extra"]["trainer_args"]["ddp_bucket_cap_mb"] == 512
    assert rec["extra"]["ddp_graph_split"] is False  # Dynamo's DDPOptimizer off unless the variant asks for it
    cfg = one_run_config(measure={"warmup_steps": 1, "steps": 3, "min_seconds": 0, "repeats": 1})
    cfg["variants"]["lora-ddp2-flat"] = knobs
    cfg["studies"]["llm"]["matrix"][0]["variants"] = ["lora-ddp2-flat"]
    spec = ftc.RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", "lora-ddp2-flat", 2)
    _, train, eval_ = instruction_data
    out = tmp_path / "profile"
    summary = supervise("profile", ftc.run_params(cfg, spec),
                        {"model": str(tmp_path / "model.json"), "train": str(train), "eval": str(eval_),
                         "base_dir": str(ROOT), "trace": str(out / "trace.json.gz"),
                         "summary": str(out / "summary.json")}, tmp_path / "profile.log")
    assert summary["status"] == "ok", (summary["reason"], (tmp_path / "profile.log").read_text()[-3000:])
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["ranks"] == 2 and on_disk["profiled_rank"] == 0 and on_disk["steps"] >= 1
    assert on_disk["communication_share"] is None  # no NCCL kernels on CPU ranks
    assert (out / "trace.json.gz").stat().st_size > 0


def test_balanced_ranks_deal_each_steps_rows_evenly_and_keep_the_steps_rows():
    """Each step's N x B rows are the same set as the seeded order's (the same averaged gradient), every rank gets B
    of them, the order is the same on every rank (seed and epoch) and changes with the epoch, and the slowest rank's
    excess attention work shrinks."""
    import random

    from ftbench.build.parallel import BalancedRanks

    rnd = random.Random(0)
    costs = [sum(rnd.choice([64, 512, 2048]) ** 2 for _ in range(rnd.randint(1, 6))) for _ in range(209)]
    s = BalancedRanks(costs, batch_size=2, ranks=4, seed=7)
    order = s.order()
    assert sorted(order) == list(range(209)) and len(s) == 209
    assert order == BalancedRanks(costs, 2, 4, 7).order()  # every rank draws the same
    import torch

    plain = torch.randperm(209, generator=torch.Generator().manual_seed(7)).tolist()
    for start in range(0, 208 - 8 + 1, 8):  # full groups: the same rows as the plain order's step
        assert set(order[start:start + 8]) == set(plain[start:start + 8])
    assert order[208:] == plain[208:]  # the partial group as drawn
    summary = s.summary()
    assert summary["slowest_rank_excess_balanced"] < summary["slowest_rank_excess_plain"] / 2
    s.set_epoch(1)
    assert s.order() != order


def test_balanced_ranks_train_two_cpu_ranks_on_rows_of_a_token_budget(tmp_path, tiny_qwen, instruction_data):
    knobs = {**DDP2, "padding_free": True, "token_budget": 512, "balance_ranks": True}
    rec, log = ranked_run(tmp_path, tiny_qwen, instruction_data, "lora-tb-ddp2-bal", knobs, max_seq_length=512)
    assert rec["status"] == "ok", (rec["reason"], log[-3000:])
    bal = rec["extra"]["balance_ranks"]
    assert bal["ranks"] == 2 and bal["rows"] == rec["extra"]["packing"]["rows"]
    assert bal["slowest_rank_excess_balanced"] <= bal["slowest_rank_excess_plain"]
    assert knob_problems("causal_lm", Variant("x", gpus=2, parallel="ddp", balance_ranks=True))  # no token budget


def test_the_fused_head_loss_over_several_ranks_is_scaled_as_trl_scales_it():
    """num_items_in_batch counts every rank's tokens; DDP and FSDP average the ranks' gradients, so each rank's loss
    is multiplied by the number of ranks (TRL's SFTTrainer and the Trainer do the same): the gradient then equals
    the one-GPU run's on the same rows, and the logged loss reads as a mean over this rank's tokens."""
    from types import SimpleNamespace

    from ftbench.run.runners.causal_lm import fused_head_loss

    log_probs = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    model = lambda **kw: SimpleNamespace(log_probs=log_probs, label_mask=log_probs != 0)  # noqa: E731
    mine = fused_head_loss(model, {}, None)  # this rank's 3 tokens, alone
    assert float(mine) == pytest.approx(2.0)
    # two ranks, 6 tokens in all (this rank's 3 and the other's 3): the rank's sum over all tokens, times 2
    two = fused_head_loss(model, {}, torch.tensor(6), ranks=2)
    assert float(two) == pytest.approx(6.0 / 6 * 2) == pytest.approx(float(mine))
    assert float(fused_head_loss(model, {}, torch.tensor(6), ranks=1)) == pytest.approx(1.0)


def test_two_launchers_rendezvous_into_one_job(tmp_path, tiny_qwen, instruction_data):
    """nodes: 2. Two torchrun launchers of one rank each start side by side on this host and meet through torchrun's
    c10d rendezvous as the two nodes of one job (on a 4-GPU host, 2 x 2 with two GPUs each): the same world of two
    ranks as one launcher of two, each rank naming its launcher, the same loss trace on the same rows."""
    for sub in ("two", "one"):
        (tmp_path / sub).mkdir()
    rec, log = ranked_run(tmp_path / "two", tiny_qwen, instruction_data, "lora-ddp2x2", {**DDP2, "nodes": 2})
    assert rec["status"] == "ok", (rec["reason"], log[-3000:])
    par, sup = rec["parallel"], rec["extra"]["supervision"]
    assert par["world_size"] == 2 and par["launchers"] == 2 and par["backend"] == "gloo"
    assert sorted((r["rank"], r["launcher"]) for r in par["per_rank"]) == [(0, 0), (1, 1)]
    assert len(sup["launchers"]) == 2 and all("c10d rendezvous at 127.0.0.1:" in w for w in sup["launchers"])
    assert sup["launcher"] == "2 torchrun launchers"
    one, _ = ranked_run(tmp_path / "one", tiny_qwen, instruction_data, "lora-ddp2", DDP2)
    assert one["status"] == "ok" and one["parallel"]["launchers"] == 1
    assert rec["loss"]["first"] == pytest.approx(one["loss"]["first"], rel=1e-5)


def test_the_launch_plan_for_nodes_on_this_host_and_in_a_slurm_allocation(tmp_path, monkeypatch):
    from ftbench.run import launch

    job = tmp_path / "job.json"
    plain = launch.launch_plan(4, 1, ["GPU-a", "GPU-b", "GPU-c", "GPU-d"], job, {}, "r")
    assert len(plain) == 1 and "--standalone" in plain[0]["cmd"] and "--nproc-per-node=4" in plain[0]["cmd"]
    local = launch.launch_plan(4, 2, ["GPU-a", "GPU-b", "GPU-c", "GPU-d"], job, {"X": "1"}, "r")
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in local] == ["GPU-a,GPU-b", "GPU-c,GPU-d"]
    assert all("--nnodes=2" in p["cmd"] and "--nproc-per-node=2" in p["cmd"] and "--rdzv-id=r" in p["cmd"]
               for p in local)
    assert ["--rdzv-conf=is_host=1" in p["cmd"] for p in local] == [True, False]
    endpoints = {c for p in local for c in p["cmd"] if c.startswith("--rdzv-endpoint=")}
    assert len(endpoints) == 1  # one rendezvous for both
    # inside an allocation of two nodes: srun starts one launcher a node, the rendezvous on the first
    monkeypatch.setattr(launch, "slurm_nodes", lambda env: ["gpu17", "gpu18"])
    slurm = launch.launch_plan(8, 2, [], job, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[17-18]"}, "r")
    (only,) = slurm
    cmd = only["cmd"]
    assert cmd[:5] == ["srun", "--ntasks=2", "--kill-on-bad-exit=1", "--overlap", "--ntasks-per-node=1"]
    assert "--rdzv-id=slurm-4242" in cmd and "--rdzv-endpoint=gpu17:29642" in cmd and "--nproc-per-node=4" in cmd


def test_records_of_injected_faults_are_left_out_of_runs_merged_from_elsewhere(tmp_path):
    """The lease that tested the supervisor on four H100s shipped its fault runs' records beside its measurements:
    merged, only the measurements are read (the faults' records say `extra.fault_injected`)."""
    import shutil

    from ftbench.judge.analysis import read_runs

    lease = Path(__file__).resolve().parents[1] / "measurements/h100x4-2026-11-27-b"
    shutil.copytree(lease / "llm", tmp_path / "llm")
    df = read_runs(tmp_path)
    assert len(list(tmp_path.rglob("metrics.json"))) == 5
    assert sorted(df["variant"].to_list()) == ["lora-tb-cg-lean-async-pinned-fp8-static-ddp4",
                                               "lora-tb-cg-lean-async-pinned-fp8-static-ddp4-2x2"]


def test_the_rank_named_is_the_one_killed_not_the_one_torchrun_stopped():
    """torchrun's summary on four H100s (measurements/h100x4-2026-11-27-b/job-logs/bs4.log): rank 0, stopped by torchrun's
    own SIGTERM, among the failures; rank 1, killed by SIGKILL, the root cause. And on gloo ranks the survivor may
    exit with its own error first and be the summary's root cause: the killed rank is still the one named."""
    from ftbench.run.supervise import first_failed_rank

    log = (Path(__file__).resolve().parents[1] / "measurements/h100x4-2026-11-27-b/job-logs/bs4.log").read_text()
    assert first_failed_rank(log) == (1, "killed by SIGKILL")
    gloo = ("Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 7)\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 3 (pid: 8)\n")
    assert first_failed_rank(gloo) == (1, "killed by SIGKILL")
    assert first_failed_rank("Root Cause (first observed failure):\n[0]:\n  rank      : 2 (local_rank: 0)\n"
                             "  exitcode  : 1 (pid: 9)\n") == (2, "exited with code 1")
    assert first_failed_rank("no summary") is None
