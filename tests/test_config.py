"""Config validation: bad input stops before any job, with a message naming the key."""

import copy
import re
from pathlib import Path
import dataclasses

import pytest
import yaml

from conftest import ROOT, snakemake
from ftbench.config import settings as ftc

DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())
from ftbench.config.settings import config_schema  # noqa: E402

SCHEMA = config_schema(ROOT / "config/schema/config.schema.yaml")  # the file with the knob table's block


def dry_run_with(tmp_path, mutate):
    cfg = copy.deepcopy(DEFAULT)
    mutate(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return snakemake("-n", "--configfile", str(path), "-d", str(tmp_path / "wd"), cwd=tmp_path)


@pytest.mark.parametrize("mutate, key", [
    (lambda c: c["variants"]["lora"].update(turbo=True), "turbo"),
    (lambda c: c["studies"]["llm"]["matrix"][0].update(batch_sizes=[0, 2]), "batch_sizes"),
    (lambda c: c["models"]["qwen3-8b"].update(architecture="no-such-model.yaml"), "models.qwen3-8b.architecture"),
    (lambda c: c["studies"]["llm"]["matrix"][0].update(datasets=["japanese_alpaca", "imagenet"]), "imagenet"),
    # a knob value its runner does not act on: the causal-LM runner's FP8 is torchao's, the diffusion runner has
    # no shape policy
    (lambda c: c["variants"]["lora"].update(precision="fp8", fp8_backend="te", fp8_recipe="static"),
     "fp8_backend='te'"),
    (lambda c: c["studies"]["diffusion"]["variants"]["workers-0"].update(shape_policy="fixed"),
     "variant 'workers-0' on stable-diffusion-v1-5 (diffusion runner): shape_policy='fixed'"),
    # names become paths and patterns: refused before they can write outside results/ or break a regex
    (lambda c: c["datasets"].update({"../../../d": c["datasets"]["naruto"]}), "name '../../../d' is not allowed"),
    (lambda c: c["variants"].update({"lora(v2)": {"peft": "lora"}}), "name 'lora(v2)' is not allowed"),
    (lambda c: c["datasets"]["japanese_alpaca"].update(source="/no/such/alpaca.parquet"),
     "datasets.japanese_alpaca.source: no such file or directory: /no/such/alpaca.parquet"),
    (lambda c: c.update(only_studies=[]), "only_studies"),
    # a LLaVA model on text data: refused before any job, in one line (it failed in its job with KeyError: 'image')
    (lambda c: c["studies"]["lmm"]["matrix"][0].update(datasets=["japanese_alpaca"]),
     "model llava-v1.6-mistral-7b (lmm) cannot train on dataset japanese_alpaca (kind instruction)"),
    (lambda c: c["studies"]["diffusion"]["matrix"][0].update(datasets=["wikipedia_ja"]),
     "(diffusion) cannot train on dataset wikipedia_ja (kind wikipedia); its runner trains on image_caption"),
    # an architecture path that leaves config/architectures/ is refused, as the schema says
    (lambda c: c["models"]["qwen3-8b"].update(architecture="../../../elsewhere/qwen3-8b.yaml"),
     "models.qwen3-8b.architecture: '../../../elsewhere/qwen3-8b.yaml' leaves config/architectures/"),
    # a local checkpoint folder that is not there is named as missing
    (lambda c: (c["models"]["qwen3-8b"].update(source="your_model/checkpoint"),
                c["models"]["qwen3-8b"].pop("architecture")),
     "models.qwen3-8b.source: no checkpoint folder at"),
], ids=["unknown-knob", "batch-size-0", "missing-architecture", "unknown-dataset", "te-with-a-torchao-recipe",
        "diffusion-shape-policy", "path-in-name", "regex-in-name", "missing-source", "only-studies-empty",
        "llava-on-text", "sd-on-text", "architecture-outside", "missing-checkpoint-folder"])
def test_bad_config_stops_before_any_job(tmp_path, mutate, key):
    proc = dry_run_with(tmp_path, mutate)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr
    assert not (tmp_path / "wd" / "results").exists()


def test_schema_errors_are_one_short_line_naming_the_key(tmp_path):
    proc = dry_run_with(tmp_path, lambda c: c["studies"]["llm"]["matrix"][0].update(batch_sizes=[0, 2]))
    err = proc.stdout + proc.stderr
    assert "config.studies.llm.matrix[0].batch_sizes[0]: 0 is less than the minimum of 1" in err
    assert len(err.splitlines()) < 15 and "$schema" not in err  # neither the schema nor the config printed


def test_local_dataset_files_are_read_by_format_and_their_columns_checked(tmp_path):
    import polars as pl

    from ftbench.data.datasets import prepare_dataset

    rows = {"instruction": [f"say {i}" for i in range(12)], "output": [f"{i}" for i in range(12)]}
    good, wrong = tmp_path / "alpaca.parquet", tmp_path / "wrong.parquet"
    pl.DataFrame(rows).write_parquet(good)
    pl.DataFrame({"prompt": rows["instruction"], "answer": rows["output"]}).write_parquet(wrong)
    jsonl = tmp_path / "alpaca.jsonl"
    pl.DataFrame(rows).write_ndjson(jsonl)
    for source in (good, jsonl):  # a file (not only a directory) is a dataset, read by its suffix
        ddef = {"kind": "instruction", "source": str(source), "num_samples": 8, "eval_samples": 2}
        summary = prepare_dataset(ddef, 0, tmp_path / "t.parquet", tmp_path / "e.parquet")
        assert summary["train"] == 8 and summary["eval"] == 2
    proc = dry_run_with(tmp_path, lambda c: c["datasets"]["japanese_alpaca"].update(source=str(wrong)))
    assert proc.returncode != 0
    assert "datasets.japanese_alpaca: kind instruction needs column(s) ['instruction', 'output']" in proc.stdout + proc.stderr
    short = dry_run_with(tmp_path, lambda c: c["datasets"]["japanese_alpaca"].update(
        source=str(wrong), columns={"instruction": "prompt", "output": "answer"}))
    assert short.returncode != 0 and "wrong.parquet has 12 rows; num_samples 64 + eval_samples 8 need 72" in \
        short.stdout + short.stderr  # issue 79: too few rows, refused before any job
    mapped = dry_run_with(tmp_path, lambda c: c["datasets"]["japanese_alpaca"].update(
        source=str(wrong), columns={"instruction": "prompt", "output": "answer"}, num_samples=8, eval_samples=2))
    assert mapped.returncode == 0, mapped.stderr[-2000:]


def test_an_architecture_file_without_its_required_fields_is_named(tmp_path):
    arch = tmp_path / "config/architectures"
    arch.mkdir(parents=True)
    (arch / "broken.yaml").write_text("hub_id: x/y\nconfig: {hidden_size: 8}\n")
    with pytest.raises(ftc.ConfigError, match=r"broken.yaml: family: missing \(required\)"):
        ftc.check_architecture(arch / "broken.yaml")


def test_default_config_dry_run_is_fast(tmp_path):
    import time

    t0 = time.perf_counter()
    proc = snakemake("-n", "--configfile", str(ROOT / "config/config.yaml"), "-d", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert time.perf_counter() - t0 < 15  # the target is < 5 s; the margin absorbs a loaded CI machine


def test_schema_variant_knobs_match_the_dataclass():
    props = SCHEMA["$defs"]["variants"]["additionalProperties"]["properties"]
    fields = {f.name for f in dataclasses.fields(ftc.Variant)} - {"name"}
    assert set(props) - {"base", "adds"} == fields
    from ftbench.config.techniques import TECHNIQUES  # the schema's techniques are the library's list, in its order
    assert props["adds"]["items"]["enum"] == list(TECHNIQUES)


def test_unknown_knob_raises_in_python_too():
    with pytest.raises(ftc.ConfigError, match="turbo"):
        ftc.Variant.from_config("x", {"turbo": True})


def test_matrix_is_the_union_of_block_products():
    cfg = copy.deepcopy(DEFAULT)
    cfg["studies"]["llm"]["matrix"] = [
        {"models": ["qwen3-8b"], "datasets": ["japanese_alpaca", "wikipedia_ja"], "variants": ["lora"],
         "batch_sizes": [1, 2]},
        {"models": ["qwen3-8b"], "datasets": ["japanese_alpaca"], "variants": ["lora"], "batch_sizes": [2, 8]},
    ]
    runs = [s for s in ftc.expand_matrix(cfg) if s.study == "llm"]
    assert len(runs) == 5  # (1,2)x2 datasets + 8 on alpaca; the duplicate (alpaca, 2) counted once
    assert runs[0].run_dir == "results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora/bs1"
    assert ftc.find_run(cfg, study="llm", model="qwen3-8b", scale="tiny", dataset="japanese_alpaca",
                        variant="lora", batch_size="8").batch_size == 8


def test_config_hash_changes_with_a_knob():
    spec = ftc.expand_matrix(DEFAULT)[0]
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"]["lora"]["gradient_checkpointing"] = True
    assert ftc.config_hash(ftc.run_config(DEFAULT, spec)) != ftc.config_hash(ftc.run_config(cfg, spec))


def test_only_studies_selects_the_studies_that_run():
    cfg = copy.deepcopy(DEFAULT)
    cfg["only_studies"] = ["diffusion"]
    assert {s.study for s in ftc.expand_matrix(cfg)} == {"diffusion"}
    cfg["only_studies"] = ["nope"]
    with pytest.raises(ftc.ConfigError, match="only_studies"):
        ftc.check_config(cfg, ROOT)


def test_profile_selector_must_match_a_run():
    cfg = copy.deepcopy(DEFAULT)
    cfg["profile"] = [{"study": "llm", "batch_size": 64}]
    with pytest.raises(ftc.ConfigError, match="profile"):
        ftc.check_config(cfg, ROOT)


@pytest.mark.parametrize("extra, length", [([], 512), (["study_b.yaml"], 2048), (["study_b_random.yaml"], 2048)])
def test_tiny_default_keeps_sequences_short_and_the_study_b_configs_publish_length(extra, length):
    """Config files merge recursively, so a value the tiny default sets inside a study would leak into a full
    config that does not set it again: Study B's configs set the published 2048 themselves."""
    from snakemake.utils import update_config

    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    for name in extra:
        update_config(config, yaml.safe_load((ROOT / "config" / name).read_text()))
    spec = ftc.RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", "lora", 4)
    assert ftc.train_settings(config, spec).max_seq_length == length


def test_config_check_names_a_yaml_syntax_error_by_file_and_line(tmp_path, capsys):
    """Snakemake's own message for a --configfile with a syntax error names neither file nor line; the
    pre-flight check (python -m ftbench.config.settings FILE) does, and runs the same checks as a run on a good file."""
    bad = tmp_path / "mine.yaml"
    bad.write_text("studies:\n  llm:\n    training: {measure: [1, 2}\n")
    assert ftc.main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{bad}:3:") and "mine.yaml" in out
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("only_studies: [nope]\n")
    assert ftc.main([str(unknown)]) == 1 and "only_studies: unknown study 'nope'" in capsys.readouterr().out
    assert ftc.main([str(ROOT / "config/study_b_random.yaml")]) == 0
    assert capsys.readouterr().out.startswith("ok:")


def test_cpu_parallel_jobs_ask_for_no_gpu_only_on_a_local_host_without_one(tmp_path):
    """The default runs GPU jobs side by side on a CPU-only host; with the setting off, or with a GPU visible
    (FTBENCH_GPU_IDS stands in for one), every such job asks for its GPU again."""
    import os
    import re
    import subprocess
    import sys

    def gpu_requests(*extra, env=None):
        exe = str(Path(sys.executable).parent / "snakemake")
        proc = subprocess.run([exe, "-s", str(ROOT / "Snakefile"), "-n", "--cores", "2", "--resources", "gpu=1",
                               "--configfile", str(ROOT / "config/config.yaml"), "-d", str(tmp_path), *extra],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **(env or {})})
        assert proc.returncode == 0, proc.stderr[-2000:]
        jobs = re.findall(r"rule (train|profile|materialize_model|generate|cache_latents):.*?resources: ([^\n]*)",
                          proc.stdout, re.S)
        assert len(jobs) > 20
        return {re.search(r"gpu=(\d+)", res).group(1) if "gpu=" in res else "0" for _, res in jobs}

    env = {k: "" for k in ("FTBENCH_GPU_IDS", "CUDA_VISIBLE_DEVICES")}
    assert gpu_requests(env=env) == {"0"}  # this machine has no CUDA GPU
    off = tmp_path / "off.yaml"
    off.write_text("cpu_parallel_jobs: false\n")
    assert gpu_requests("--configfile", str(ROOT / "config/config.yaml"), str(off), env=env) >= {"1"}
    assert gpu_requests(env={"FTBENCH_GPU_IDS": "0"}) == {"0", "1"}  # a GPU host: tiny training jobs share it
    one = tmp_path / "one.yaml"
    one.write_text("tiny_jobs_per_gpu: 1\n")
    assert gpu_requests("--configfile", str(ROOT / "config/config.yaml"), str(one),
                        env={"FTBENCH_GPU_IDS": "0"}) == {"1"}


def test_merge_runs_expands_patterns_in_name_order_and_refuses_an_entry_that_names_nothing(tmp_path, monkeypatch):
    """`merge_runs: ["measurements/*"]` merges every lease's folder (not the README beside them), in name order;
    a path or pattern that matches nothing stops the run before any job, naming it."""
    for name in ("h200-2026-11-24", "h100-2026-11-25-b", "h100-2026-11-25"):
        (tmp_path / "m" / name).mkdir(parents=True)
    (tmp_path / "m" / "README.md").write_text("notes")
    (tmp_path / "runs.parquet").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    cfg = {"merge_runs": ["m/*", "runs.parquet", "m/h100-2026-11-25"]}
    assert ftc.merge_sources(cfg) == ["m/h100-2026-11-25", "m/h100-2026-11-25-b", "m/h200-2026-11-24", "runs.parquet"]
    for bad in ("m/h100-2026-11-26", "other/*"):
        with pytest.raises(ftc.ConfigError, match=f"merge_runs: '{re.escape(bad)}' names no runs table or folder"):
            ftc.merge_sources({"merge_runs": [bad]})


QWEN32 = ROOT / "config/architectures/qwen3-32b.yaml"


def _cut(text: str, after: str) -> str:
    return text[:text.index(after) + len(after)] + "\n"


@pytest.mark.parametrize("edit, message", [
    # cut after num_key_value_heads, as the issue found it: no head_dim, no vocab_size, no scales
    (lambda t: _cut(t, "num_key_value_heads: 8"), "scales: missing (required)"),
    (lambda t: t.replace("  tiny: {", "  tiny_: {"), "scales: Additional properties are not allowed ('tiny_' was"),
    (lambda t: t.replace("  proxy: {num_hidden_layers: 4}\n", ""), "scales.proxy: missing (its overrides"),
    (lambda t: t.replace("  vocab_size: 151936\n", ""), "config.vocab_size: missing (required)"),
    (lambda t: t.replace("num_hidden_layers: 4}", "num_hiden_layers: 4}"), "scales.proxy.num_hiden_layers: not a key"),
    (lambda t: _cut(t, "rope_parameters: {rope_type: default, rope_th"), ":16:1: expected ',' or '}'"),
], ids=["cut-short", "no-tiny", "no-proxy", "missing-key", "override-typo", "syntax-error"])
def test_an_architecture_file_cut_short_is_refused_in_one_line_naming_file_and_key(tmp_path, edit, message):
    bad = tmp_path / "qwen3-32b.yaml"
    bad.write_text(edit(QWEN32.read_text()))
    with pytest.raises(ftc.ConfigError) as e:
        ftc.check_architecture(bad)
    assert str(e.value).startswith(str(bad)) and message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_truncated_architecture_stops_the_pipeline_before_any_job(tmp_path):
    bad = tmp_path / "qwen3-32b.yaml"
    bad.write_text(_cut(QWEN32.read_text(), "num_key_value_heads: 8"))
    proc = dry_run_with(tmp_path, lambda c: c["models"]["qwen3-8b"].update(architecture=str(bad)))
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"{bad}: scales: missing (required)" in err
    assert "Traceback" not in err and not (tmp_path / "wd" / "results").exists()


def test_a_scale_the_architecture_says_it_lacks_is_refused_never_the_full_model(tmp_path):
    from ftbench.config.architectures import load_architecture

    arch = tmp_path / "qwen3-32b.yaml"
    arch.write_text(QWEN32.read_text().replace("  proxy: {num_hidden_layers: 4}\n", "")
                    + "scales_absent: {proxy: not measured at proxy scale}\n")
    ftc.check_architecture(arch)  # a stated reason is accepted ...
    with pytest.raises(ValueError, match="no proxy scale: not measured at proxy scale"):
        load_architecture(arch, "proxy")  # ... and the scale is refused, never built as the full model
    proc = dry_run_with(tmp_path, lambda c: c["models"]["qwen3-8b"].update(architecture=str(arch), scale="proxy"))
    assert proc.returncode != 0 and "has no proxy scale: not measured at proxy scale" in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "config/architectures").glob("*.yaml")))
def test_every_shipped_architecture_passes_its_familys_schema_with_tiny_and_proxy(name):
    arch = ftc.check_architecture(ROOT / "config/architectures" / name)
    assert {"tiny", "proxy"} <= set(arch["scales"])


def test_study_a_sweeps_compile_budget_reaches_the_supervisor_and_lets_a_cold_compile_finish():
    """A compile variant's budget is its time_limit_s, over the study's; the sweep gives plain compile 900 s (at
    batches 1 and 2 it compiles three times: 490-547 s alone, past 570 s beside three other jobs compiling) and the
    FP8 compile pair 570 s (a cold compile of LLaVA-NeXT-7B takes ~200 s; the 180 s before ended every bf16 cell as a
    timeout)."""
    from snakemake.utils import update_config

    cfg = copy.deepcopy(DEFAULT)
    for extra in ("config/study_a_random.yaml", "bench/study_a_sweep.yaml"):
        update_config(cfg, yaml.safe_load((ROOT / extra).read_text()))
    for variant, budget in (("compile-gc", 900), ("fp8-te-compile-gc", 570)):
        spec = ftc.RunSpec("lmm", "llava-v1.6-mistral-7b", "full", "beans", variant, 1)
        limit, _ = ftc.run_limits(ftc.run_params(cfg, spec))
        assert limit == budget
    spec = ftc.RunSpec("lmm", "llava-v1.6-mistral-7b", "full", "beans", "bf16-gc", 1)
    assert ftc.run_limits(ftc.run_params(cfg, spec))[0] == cfg["training"]["time_limit_s"]


def test_a_record_says_how_many_batch_shapes_its_windows_saw_and_how_many_were_new():
    from ftbench.harness.summary import window_shapes

    steps = [{"phase": "warmup", "shape": "1x2900"}, {"phase": "warmup", "shape": "1x2100"},
             {"phase": "measure", "shape": "1x2900"}, {"phase": "measure", "shape": "1x3400"},
             {"phase": "measure", "shape": "1x3400"}, {"phase": "measure", "shape": "1x1800"}]
    assert window_shapes(steps) == {"shapes_measured": 3, "new_shapes_measured": 2}
    assert window_shapes([{"phase": "measure"}]) == {}


def test_coordinate_descent_tuning_reaches_inductor_with_the_modes_own_options():
    """coordinate_descent_tuning: torch.compile gets the mode's own Inductor options (reduce-overhead: CUDA graphs)
    and coordinate-descent tuning, as options (it takes a mode or options, not both); a compiled layer runs with them;
    refused where no layer is compiled by Inductor."""
    import torch

    from ftbench.core.knobs import Variant, knob_problems
    from ftbench.build.variants import compile_kwargs

    tuned = Variant("t", compile="reduce-overhead", compile_scope="layers", coordinate_descent_tuning=True)
    assert compile_kwargs(tuned) == {"options": {"triton.cudagraphs": True, "coordinate_descent_tuning": True}}
    assert compile_kwargs(Variant("p", compile="reduce-overhead", compile_scope="layers")) == {"mode": "reduce-overhead"}
    assert knob_problems("causal_lm", tuned) == []
    for bad in (Variant("m", compile="default", coordinate_descent_tuning=True),
                Variant("n", coordinate_descent_tuning=True),
                Variant("b", compile="default", compile_scope="layers", compile_backend="aot_eager",
                        coordinate_descent_tuning=True)):
        assert any("coordinate_descent_tuning" in p for p in knob_problems("causal_lm", bad)), bad.name
    layer = torch.nn.Linear(8, 8)
    compiled = torch.compile(layer, **compile_kwargs(Variant("d", compile="default", compile_scope="layers",
                                                             coordinate_descent_tuning=True)))
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), layer(x))


def test_each_knob_is_declared_once_in_the_knob_table():
    """The knob table (ftbench.core.knob_table) is the one place a knob is declared: the Variant type's fields, the
    runners' HONOURED table, the schema's variant block and docs/techniques.md's knobs are made from it; the schema
    file and knobs.py declare none of their own."""
    import ast

    from ftbench.core import knob_table, knobs

    names = [k.name for k in knob_table.KNOBS]
    assert len(names) == len(set(names)) > 40
    assert [f.name for f in dataclasses.fields(ftc.Variant)] == ["name", *names]
    assert all(knobs.DEFAULTS[k.name] == k.default for k in knob_table.KNOBS)
    assert {k for family in knobs.HONOURED.values() for k in family} == set(names)
    assert all(knobs.HONOURED[f][k.name] == v for k in knob_table.KNOBS for f, v in k.honoured.items())
    raw = yaml.safe_load((ROOT / "config/schema/config.schema.yaml").read_text())
    assert set(raw["$defs"]["variants"]["additionalProperties"]["properties"]) == {"base", "adds"}
    props = SCHEMA["$defs"]["variants"]["additionalProperties"]["properties"]
    assert all(props[k.name]["description"] == k.words and k.words for k in knob_table.KNOBS)
    tree = ast.parse((ROOT / "src/ftbench/core/knobs.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)]  # no field declared by hand there
    page = (ROOT / "docs/techniques.md").read_text()
    assert all(f"| `{k}` |" in page for k in names)
