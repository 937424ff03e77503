"""A campaign (bench/campaign.py): one command runs a study's cells on one host, one job per GPU, resumable, and
writes its folder with a README. On a host with four faked GPUs the Study A campaign asks Snakemake for four GPUs
and one per job (four at once); on this CPU a small campaign runs, a call cut at its limit loses only its running
jobs, the next finishes them, and a call after that starts no finished job again."""

import importlib.util
import json
import os
import re
import subprocess
import sys

from conftest import ROOT
from ftbench.core.records import SCHEMA_VERSION

CAMPAIGN = ROOT / "bench" / "campaign.py"


def load_campaign():
    """bench/campaign.py as a module (it is a script, not part of the library)."""
    spec = importlib.util.spec_from_file_location("campaign", CAMPAIGN)
    campaign = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(campaign)
    return campaign


def call(*args, env=None, timeout=900):
    return subprocess.run([sys.executable, str(CAMPAIGN), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


def test_the_study_a_campaign_on_four_gpus_runs_four_one_gpu_jobs_at_once():
    campaign = load_campaign()
    import yaml

    camp = campaign.plan("study_a", yaml.safe_load((ROOT / "bench" / "parts.yaml").read_text()))
    cells = [t for t in camp["targets"] if "/runs/" in t]
    assert len(cells) == 42 + 12 and len([t for t in camp["targets"] if "/profiles/" in t]) == 6
    proc = call("study_a", "--dry-run", env={"FTBENCH_GPU_IDS": "0,1,2,3"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    assert "--resources gpu=4" in proc.stdout
    # FP8 through Transformer Engine waits for a host that has it (a job without it would write an `unsupported`
    # record, which the campaign would keep as done); this CPU machine has none, a GPU host after its build has
    held = campaign.waiting(camp, camp["targets"])
    te = [t for t in camp["targets"] if "/fp8-te-" in t]
    has_te = importlib.util.find_spec("transformer_engine") is not None
    assert held == ({} if has_te else {t: "transformer_engine" for t in te}) and len(te) == 5 * 6 + 2 * 2
    assert has_te or f"held back, a package missing on this host: {len(te)} target(s) (transformer_engine)" in proc.stderr
    asked = re.findall(r"rule (?:train|profile):.*?resources: [^\n]*gpu=(\d+)", proc.stdout, re.S)
    assert len(asked) == 42 + 12 + 6 - len(held) and set(asked) == {"1"}  # each job one GPU: four run at once
    # the four longest jobs (plain compile, from earlier leases' records) start first, the short ones around them
    first = re.search(r"--prioritize (.*?) --configfile", proc.stdout).group(1).split()
    assert len(first) == 4 and sum("/compile-gc/" in t for t in first) >= 3
    # a study too long for one lease, split by batch size: each cell beside its baseline at the same batch
    first = campaign.only_batches(camp["targets"], "1,2,4,8")
    assert len(first) == 7 * 4 + 2 * 4 + 6 and all(re.search(r"/bs(1|2|4|8)/", t) for t in first)
    assert not set(first) & set(campaign.only_batches(camp["targets"], "16,24"))


def test_a_campaign_resumes_after_a_cut_and_never_reruns_a_finished_job(tmp_path):
    out, work = tmp_path / "campaign", tmp_path / "work"
    first = call("smoke", "--out", str(out), "--workdir", str(work), "--limit-s", "3")  # cut before its jobs end
    assert (out / "campaign.json").exists(), first.stderr[-2000:]
    state = json.loads((out / "campaign.json").read_text())
    assert state["calls"][0]["cut"] == "after 3 s (--limit-s)"
    assert "Cells with no record yet" in (out / "README.md").read_text()
    second = call("smoke", "--out", str(out), "--workdir", str(work))
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    records = sorted(out.rglob("metrics.json"))
    assert len(records) == 2 and all(json.loads(r.read_text())["status"] == "ok" for r in records)
    made = {r: r.stat().st_mtime_ns for r in (work / "results" / "runs").rglob("metrics.json")}
    third = call("smoke", "--out", str(out), "--workdir", str(work))
    assert third.returncode == 0 and json.loads((out / "campaign.json").read_text())["calls"][-1]["pending"] == 0
    assert {r: r.stat().st_mtime_ns for r in made} == made  # no finished job ran again
    fresh = call("smoke", "--out", str(out), "--workdir", str(tmp_path / "fresh-machine"))  # another machine
    assert fresh.returncode == 0 and not (tmp_path / "fresh-machine" / "results" / "runs").exists()
    text = (out / "README.md").read_text()
    state = json.loads((out / "campaign.json").read_text())
    assert len(state["calls"]) == 4 and "4 call(s)" in text and "Records: 2 of 2 cells; ok 2" in text
    assert "source digest " in text and "(one version" in text and "-hours in the jobs' own time" in text
    assert "after 3 s (--limit-s)" in text  # the cut call, in the calls' table
    assert "python3 bench/campaign.py smoke --out" in text and "Cells with no record yet" not in text


def test_a_record_another_run_left_in_the_working_directory_is_made_again_not_adopted(tmp_path):
    work = tmp_path / "work"
    first = call("smoke", "--out", str(tmp_path / "one"), "--workdir", str(work))
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    made = {r: r.stat().st_mtime_ns for r in (work / "results" / "runs").rglob("metrics.json")}
    assert len(made) == 2
    other = call("smoke", "--out", str(tmp_path / "two"), "--workdir", str(work))  # another campaign, same tree
    assert other.returncode == 0, (other.stdout + other.stderr)[-3000:]
    assert "run again: 2 target(s) whose file another run left in the working directory" in other.stderr
    assert all(r.stat().st_mtime_ns > t for r, t in made.items())  # both jobs ran again
    state = json.loads((tmp_path / "two" / "campaign.json").read_text())
    assert len(state["calls"][0]["run_again"]) == 2 and "--forcerun" in state["calls"][0]["command"]
    kept = {json.loads(r.read_text())["provenance"]["timestamp"] for r in (tmp_path / "two").rglob("metrics.json")}
    assert kept.isdisjoint(json.loads(r.read_text())["provenance"]["timestamp"]
                           for r in (tmp_path / "one").rglob("metrics.json"))


def test_cells_whose_noise_cannot_carry_a_verdict_get_more_repeats_and_the_readme_says_which(tmp_path):
    """--repeat-noisy: the cells whose 2 x noise CV is over the bound rerun with twice the repeats (a config file
    beside the records); here the bound is 0, so no cell can get under it and the rounds end it; the README names
    each cell's noise before and after and what ended its repeats."""
    out, work = tmp_path / "campaign", tmp_path / "work"
    proc = call("smoke", "--out", str(out), "--workdir", str(work), "--repeat-noisy", "600", "--bound", "0",
                "--rounds", "1")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    state = json.loads((out / "campaign.json").read_text())
    assert len(state["repeats"]) == 2 and all(e["ended"] == "the rounds ended" for e in state["repeats"].values())
    assert all(e["repeats"] == 2 and e["noise_after"] is not None for e in state["repeats"].values())
    import yaml

    assert yaml.safe_load((out / "repeats-x2.yaml").read_text()) == {
        "studies": {"llm": {"training": {"measure": {"repeats": 2}}}}}
    records = [json.loads(p.read_text()) for p in out.rglob("metrics.json")]
    assert {r["measure"]["repeats"] for r in records} == {2}  # the rerun records, with twice the repeats
    text = (out / "README.md").read_text()
    assert "## Repeats added where the noise could not carry a verdict" in text and "the rounds ended" in text


def test_a_campaign_is_costed_from_the_jobs_own_times_in_earlier_leases(tmp_path):
    """--estimate: each pending job at the wall time its run took before (the preferred GPU's record first), the
    median where none ran, a profile at its assumed time; the longest job first to the least loaded GPU; calls hold
    whole jobs; a job longer than a call is named."""
    campaign = load_campaign()
    run = "results/runs/lmm/m/full/beans/{}/bs{}/metrics.json"

    def lease(name, variant, batch, elapsed, gpu, status="ok"):
        f = tmp_path / name / "lmm" / "m" / "full" / "beans" / variant / f"bs{batch}" / "metrics.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"status": status, "extra": {"supervision": {"elapsed_s": elapsed}},
                                 "provenance": {"device": {"name": gpu}, "timestamp": f"2026-11-2{len(name)}"}}))

    lease("a", "bf16", 1, 85.0, "NVIDIA H100 80GB HBM3")
    lease("b", "bf16", 1, 185.0, "NVIDIA H200")  # the preferred GPU's record wins
    lease("a", "compile", 1, 385.0, "NVIDIA H100 80GB HBM3")
    lease("a", "fp8", 1, 600.0, "NVIDIA H100 80GB HBM3", status="timeout")  # ran longer: no time to take
    targets = [run.format("bf16", 1), run.format("compile", 1), run.format("fp8", 1), run.format("huge", 1),
               "results/profiles/lmm/m/full/beans/bf16/bs1/summary.json"]
    lease("c", "huge", 1, 900.0, "NVIDIA H200")
    est = campaign.estimate(targets, 2, 540.0, [tmp_path / n for n in "abc"], prefer="H200")
    o = campaign.JOB_OVERHEAD_S
    bf16, compile_, huge, profile = 185 + o, 385 + o, 900 + o, campaign.PROFILE_S
    fp8 = sorted([bf16, compile_, huge])[1]  # no usable record: the median of those found
    assert est["sources"][targets[0]] == "b (NVIDIA H200)" and est["assumed"] == [targets[2]]
    assert est["gpu_s"] == bf16 + compile_ + fp8 + huge + profile
    # longest first to the least loaded of 2 GPUs: huge | compile, fp8, bf16 | ... and the profile to the first
    assert est["wall_s"] == huge + profile and compile_ + fp8 + bf16 < huge + profile
    # calls of 540 s hold whole jobs: [compile + profile | fp8], then [bf16]; huge fits none
    assert est["too_long"] == [targets[3]] and est["calls"] == 2
    # the first wave on 2 GPUs: the two longest with a record (fp8's only record is a timeout: no time to go by)
    assert campaign.longest_first(targets, 2, [tmp_path / n for n in "abc"], "H200") == [targets[3], targets[1]]


def test_a_variant_needs_the_package_of_its_knobs():
    campaign = load_campaign()
    need = campaign.needed_packages
    assert need({"precision": "fp8", "fp8_backend": "te"}) == ["transformer_engine"]
    assert need({"precision": "fp8", "fp8_backend": "torchao"}) == ["torchao"]
    assert need({"precision": "nf4"}) == ["bitsandbytes"]
    assert need({"framework": "unsloth", "precision": "nf4"}) == ["unsloth", "bitsandbytes"]
    assert need({"liger": True}) == ["liger_kernel"] and need({"precision": "bf16", "compile": "default"}) == []
    # every package a variant needs: FP8 through torchao with FlashAttention-4 needs both
    assert need({"precision": "fp8", "fp8_backend": "torchao", "attention": "varlen", "flash_impl": "fa4"}) == [
        "torchao", "flash_attn"]


def test_the_repeats_pass_reads_the_noise_without_the_report_library(tmp_path):
    """A GPU host carries no polars (a report library): the repeats pass reads each record's noise from the record
    itself (the median step's windows, or their median steps' CV where a window met a new shape)."""
    rel = "lmm/m/full/beans/{}/bs1/metrics.json"
    for variant, timing, new in (("wide", {"noise_cv": 0.08}, 0), ("narrow", {"noise_cv": 0.02}, 0),
                                 ("shapes", {"noise_cv": 0.30, "cv_median_across_repeats": 0.01}, 2)):
        f = tmp_path / rel.format(variant)
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "status": "ok", "variant": {}, "timing": timing,
                                 "extra": {"new_shapes_measured": new}}))
    code = ("import sys, json; sys.modules['polars'] = None; sys.path[:0] = ['bench', 'src']; import campaign; "
            f"camp = {{'targets': ['results/runs/' + {rel!r}.format(v) for v in ('wide', 'narrow', 'shapes')]}}; "
            f"print(json.dumps(campaign.noisy(camp, __import__('pathlib').Path({str(tmp_path)!r}), 0.10)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"results/runs/" + rel.format("wide"): 0.08}


def test_a_detached_campaign_runs_its_second_pass_once_its_package_is_ready(tmp_path):
    """bench/campaign_detached.sh: `start` returns at once and the campaign runs on (setsid); `poll` comes back when
    the first pass has ended and the second waits for its ready file (Transformer Engine installed, on a GPU host);
    once the file exists the second pass runs, finds nothing pending, and the packed folder holds the records."""
    script = ROOT / "bench" / "campaign_detached.sh"
    out, ready, work = tmp_path / "camp", tmp_path / "ready", tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable}  # the suite's Python (CI's python3 on PATH has no snakemake)
    run = lambda *a: subprocess.run(["bash", str(script), *map(str, a)], capture_output=True, text=True, cwd=ROOT,
                                    timeout=900, env=env)  # noqa: E731
    started = run("start", "smoke", out, ready, "--", "--workdir", work)
    assert started.returncode == 0 and "detached" in started.stdout, started.stderr
    first = run("poll", out, 600)
    assert f"waiting for {ready}" in first.stdout and "pass1 0" in first.stdout and "pass2" not in first.stdout, (
        first.stdout + (out.parent / "camp.pass1.log").read_text()[-2000:])
    ready.touch()
    second = run("poll", out, 300, tmp_path / "camp.tgz")
    assert "pass2 0" in second.stdout and "done" in second.stdout and "records: 2" in second.stdout, second.stdout
    state = json.loads((out / "campaign.json").read_text())
    assert [c["pending"] for c in state["calls"]] == [2, 0]  # the second pass started no finished job again
    import tarfile

    with tarfile.open(tmp_path / "camp.tgz") as t:
        assert sum(n.endswith("metrics.json") for n in t.getnames()) == 2


def test_a_running_call_keeps_each_finished_record_at_once_and_never_an_earlier_calls(tmp_path):
    """A pass copies a job's record into its folder as soon as the job has written it, not when Snakemake ends: a
    machine lost mid-pass (2026-11-27) then loses only the jobs it was running. A record an earlier call left in the
    working directory is not taken for this call's."""
    import time

    campaign = load_campaign()
    work, out = tmp_path / "work", tmp_path / "camp"
    done, running, stale = (f"results/runs/llm/tiny/tiny/d/{v}/bs1/metrics.json" for v in ("done", "running", "old"))
    (work / stale).parent.mkdir(parents=True)
    (work / stale).write_text("{}")
    os.utime(work / stale, (time.time() - 3600,) * 2)
    since = time.time()
    # a "Snakemake" whose first job ends at once and whose second runs on
    script = (f"import pathlib, time; p = pathlib.Path({str(work / done)!r}); p.parent.mkdir(parents=True); "
              f"p.with_name('steps.csv').write_text('step'); p.write_text('{{}}'); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", script])
    seen = []

    def kept(new):
        seen.append((new, proc.poll()))
        proc.kill()

    campaign.wait_collecting(proc, [done, running, stale], out, work, since, every_s=0.2, on_collect=kept)
    assert seen == [([done], None)]  # kept while its "Snakemake" still ran
    assert campaign.kept_path(done, out).is_file() and campaign.kept_path(done, out).with_name("steps.csv").is_file()
    assert not campaign.kept_path(stale, out).exists() and not campaign.kept_path(running, out).exists()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        campaign.wait_collecting(proc, [running], out, work, since, limit_s=0.5, every_s=0.2)
        raise AssertionError("no timeout")
    except subprocess.TimeoutExpired:
        pass
    finally:
        proc.kill()


def test_polling_a_machine_that_started_no_campaign_fails_at_once(tmp_path):
    """A poll on a fresh machine (the one that ran `start` went back between calls) says so and exits 3 at once,
    instead of waiting its whole time on nothing."""
    import time

    t = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "bench" / "campaign_detached.sh"), "poll", str(tmp_path / "camp"), "600",
                           str(tmp_path / "camp.tgz")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "no campaign on this machine" in proc.stdout and time.monotonic() - t < 30
    assert not (tmp_path / "camp.tgz").exists()


def test_a_campaign_runs_the_files_of_the_commit_it_names_not_the_working_trees(tmp_path):
    """--code COMMIT: the jobs run from a checkout of that commit (a campaign split over leases keeps one source
    digest whatever the working tree became since). Here a commit made for the test (HEAD with a line added to
    config/config.yaml; no ref, no working-tree change) is run: its records name that commit and its files' digest,
    not the working tree's, and the README says which files ran."""
    from ftbench.harness.source import digest, file_blobs

    ident = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env = {**os.environ, **ident, "GIT_INDEX_FILE": str(tmp_path / "index")}

    def git(*args, text_in=None):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, env=env,
                              input=text_in).stdout.strip()

    changed = git("show", "HEAD:config/config.yaml") + "\n# a commit of its own (tests/test_campaign.py)\n"
    # and its library: the packages a record names one more, so that a record shows which library its job imported
    harness = git("show", "HEAD:src/ftbench/harness/meter.py").replace('PACKAGES = ["torch", ',
                                                                 'PACKAGES = ["code_under_test", "torch", ', 1)
    assert "code_under_test" in harness
    git("read-tree", "HEAD")
    for path, text in (("config/config.yaml", changed), ("src/ftbench/harness/meter.py", harness)):
        blob = git("hash-object", "-w", "--stdin", text_in=text + "\n")
        git("update-index", "--cacheinfo", f"100644,{blob},{path}")
    sha = git("commit-tree", git("write-tree"), "-p", "HEAD", "-m", "a campaign's code, for a test")
    out, work = tmp_path / "campaign", tmp_path / "work"
    proc = call("smoke", "--out", str(out), "--workdir", str(work), "--code", sha)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    code = work / "results" / "code" / sha[:12]
    ran = digest(file_blobs(code))
    assert ran != digest(file_blobs(ROOT)) and (code / "config" / "config.yaml").read_text() == changed + "\n"
    records = [json.loads(r.read_text()) for r in sorted(out.rglob("metrics.json"))]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)
    # the jobs imported the commit's library, not the working tree's (nor an installed copy of it)
    assert all("code_under_test" in r["provenance"]["versions"] for r in records)
    # so does Snakemake run in the checkout itself, with no campaign to set the jobs' path (rules/common.smk)
    target = next(p for p in (work / "results" / "runs").rglob("metrics.json")).relative_to(work)
    env_plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    direct = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--resources", "gpu=1", "--quiet",
                             "rules", "--", str(target)], capture_output=True, text=True, timeout=900, env=env_plain,
                            cwd=code)
    assert direct.returncode == 0, (direct.stdout + direct.stderr)[-3000:]
    rec = json.loads((code / target).read_text())
    assert "code_under_test" in rec["provenance"]["versions"] and rec["provenance"]["source_digest"] == ran
    assert {(r["provenance"]["git_commit"], r["provenance"]["source_digest"], r["provenance"]["source_matches_commit"])
            for r in records} == {(sha, ran, True)}
    text = (out / "README.md").read_text()
    assert f"ran commit {sha[:12]} (`--code`), not the working tree's files" in text and f"--code {sha[:12]}`" in text
    assert f"source digest {ran} (one version" in text


def test_a_campaign_split_over_two_leases_names_each_machine_and_counts_every_cell(tmp_path):
    """A campaign whose calls ran on two lent machines of one kind (2026-11-26 and -27, both named "vm") names each
    with its calls, batches and records, and the batch measured on both; its record count is of every cell of the
    campaign, not of the last call's `--batches`."""
    from test_analysis import record

    from ftbench.harness.gpus import machine_of

    campaign = load_campaign()
    out = tmp_path / "camp"
    hosts = [{"hostname": "vm", "cpus": 64, "memory_gib": 503.8,
              "gpus": [{"index": str(i), "name": "NVIDIA H200", "uuid": f"GPU-{m}{i}", "driver": "580",
                        "memory": "143771 MiB"} for i in range(2)]} for m in "ab"]
    calls = [{"start": f"2026-11-2{6 + i}T00:00:00Z", "end": f"2026-11-2{6 + i}T00:10:00Z", "gpus": 2,
              "hostname": "vm", "gpu_uuids": [g["uuid"] for g in h["gpus"]], "batches": b}
             for i, (h, b) in enumerate(zip(hosts, ("1,2", "1,8")))]
    ran = [("bf16-gc", 1, "GPU-a0"), ("bf16-gc", 2, "GPU-a1"), ("qlora-gc", 1, "GPU-b1"), ("bf16-gc", 8, "GPU-b0")]
    for variant, bs, uuid in ran:
        f = out / "lmm" / variant / f"bs{bs}" / "metrics.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        rec = record("lmm", variant, 1.0, gpu="NVIDIA H200", batch=bs, scale="full")
        rec["provenance"]["device"]["uuid"], rec["provenance"]["source_digest"] = uuid, "d1"
        f.write_text(json.dumps(rec))
    state = {"calls": calls, "host": hosts[1],
             "machines": {machine_of("vm", [g["uuid"] for g in h["gpus"]]): h for h in hosts}}
    targets = [f"results/runs/lmm/{v}/bs{b}/metrics.json" for v in ("bf16-gc", "qlora-gc") for b in (1, 2, 8)]
    text = campaign.readme({"name": "study_a", "targets": targets}, state, out)
    a, b = (machine_of("vm", [f"GPU-{m}0", f"GPU-{m}1"]) for m in "ab")
    assert "**Machines:** 2" in text and f"1. `{a}`" in text and f"2. `{b}`" in text, text
    assert "2 records, at batch 1, 2." in text and "2 records, at batch 1, 8." in text
    assert "**Batches measured on more than one machine:** 1:" in text
    assert "Records: 4 of 6 cells" in text
    assert f"| {a} | 2 | 1,2 |" in text and f"| {b} | 2 | 1,8 |" in text  # each call's machine and batches
    one = campaign.readme({"name": "study_a", "targets": targets}, {**state, "calls": calls[:1]}, out)
    assert "**Host:** vm, 64 CPUs" in one and "Machines" not in one


def test_a_campaign_longer_than_a_lease_is_split_into_whole_batches_that_each_fit(tmp_path):
    """--estimate splits a campaign longer than one lease into consecutive groups of whole batch sizes, so that each
    cell runs beside its baseline on one machine, each group's wall time plus a machine's start within the lease; a
    batch that alone does not fit is a group of its own, marked."""
    campaign = load_campaign()
    run = "results/runs/lmm/m/full/beans/{}/bs{}/metrics.json"
    times = {1: 100.0, 2: 200.0, 4: 400.0, 8: 800.0, 24: 3000.0}
    targets = []
    for b, t in times.items():
        for v in ("bf16", "fp8"):
            f = tmp_path / "a" / "lmm" / "m" / "full" / "beans" / v / f"bs{b}" / "metrics.json"
            f.parent.mkdir(parents=True)
            f.write_text(json.dumps({"status": "ok", "extra": {"supervision": {"elapsed_s": t}},
                                     "provenance": {"device": {"name": "NVIDIA H200"}}}))
            targets.append(run.format(v, b))
    o = campaign.JOB_OVERHEAD_S
    groups = campaign.split_by_batch(targets, 2, 1200.0, [tmp_path / "a"], start_s=100.0)
    # on 2 GPUs each batch's two jobs run side by side: 1+2+4 = 700 s + 3 overheads + 100 s start fits 1,200 s;
    # adding 8 would not; 8 alone fits; 24 alone does not
    assert [g["batches"] for g in groups] == ["1,2,4", "8", "24"], groups
    assert groups[0]["wall_s"] == 700 + 3 * o and groups[0]["jobs"] == 6
    assert [g["fits"] for g in groups] == [True, True, False]
    assert campaign.batch_of(run.format("bf16", 24)) == 24 and campaign.batch_of("results/x/metrics.json") is None


def test_a_batch_split_over_two_machines_is_named_before_the_call_runs(tmp_path):
    """A campaign resumed on a fresh lease names each batch it would finish here while the folder holds records of
    the same batch from another machine (2026-11-27: fixed-compile-gc at 1 ran on the second machine, its baseline
    on the first); a batch wholly pending, or wholly done, is not named."""
    from test_analysis import record

    from ftbench.harness.gpus import machine_of

    campaign = load_campaign()
    out = tmp_path / "camp"
    run = "results/runs/lmm/m/full/beans/{}/bs{}/metrics.json"
    targets = [run.format(v, b) for v in ("bf16-gc", "fixed-compile-gc") for b in (1, 2, 4)]
    calls = [{"hostname": "vm", "gpu_uuids": ["GPU-a0", "GPU-a1"]}]
    for v, b in (("bf16-gc", 1), ("bf16-gc", 2), ("fixed-compile-gc", 2)):  # batch 1 half done, 2 done, 4 pending
        rec = record("lmm", v, 1.0, gpu="NVIDIA H200", batch=b, scale="full")
        rec["provenance"]["device"]["uuid"] = "GPU-a1"
        f = campaign.kept_path(run.format(v, b), out)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(rec))
    first, second = machine_of("vm", ["GPU-a0", "GPU-a1"]), machine_of("vm", ["GPU-b0", "GPU-b1"])
    assert campaign.split_batches(targets, out, calls, second) == {1: [first]}
    assert campaign.split_batches(targets, out, calls, first) == {}


def test_each_studys_campaign_names_cells_its_own_config_can_run():
    """study_b, study_c and study_d (issue 63): every target is a run (or a profile of one) in the merged config of the
    campaign's own files, so one command on one host can run it; Study C's holds its sweep, stages, probes and baseline."""
    import yaml

    from ftbench.config import settings as ftc

    campaign = load_campaign()
    parts = yaml.safe_load((ROOT / "bench" / "parts.yaml").read_text())
    for name in ("study_b", "study_c", "study_d"):
        camp = campaign.plan(name, parts)
        config = campaign.merged_config(camp)
        for t in camp["targets"]:
            kind, study, model, scale, dataset, variant, bs = campaign.TARGET.match(t).groups()
            spec = ftc.find_run(config, study=study, model=model, scale=scale, dataset=dataset, variant=variant,
                                batch_size=bs)
            assert spec.scale == "full", t
    c = campaign.plan("study_c", parts)["targets"]
    assert {t.split("/")[-3] for t in c if "/runs/" in t} == {
        "workers-0", "workers-1", "workers-2", "workers-3", "workers-4", "workers-8", "workers-12", "compile", "pinned",
        "compile-ro", "cached-compile-ro"}


def test_a_studys_campaign_runs_end_to_end_at_tiny_scale_into_a_folder_the_report_reads(tmp_path):
    """`--tiny`: Study C's campaign (here its baseline and two cells, `--variants`) at tiny scale on this CPU: its
    records and profiles land in the campaign's folder with its README and state, the folder stands for the study it
    measured, and the report's tables read its runs."""
    from ftbench.judge.analysis import aggregate
    from ftbench.config.settings import campaign_owners

    out, work = tmp_path / "campaign", tmp_path / "work"
    proc = call("study_c", "--tiny", "--variants", "workers-0,workers-1", "--out", str(out), "--workdir", str(work))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    records = sorted(out.rglob("metrics.json"))
    assert [r.parent.parent.name for r in records] == ["workers-0", "workers-1"]
    assert all(json.loads(r.read_text())["run"]["scale"] == "tiny" for r in records)
    assert (out / "profiles/diffusion/stable-diffusion-v1-5/tiny/naruto/workers-0/bs1/summary.json").is_file()
    assert (out / "tiny-cells.yaml").is_file()
    text = (out / "README.md").read_text()
    assert "Records: 2 of 2 cells; ok 2" in text and "--tiny --variants workers-0,workers-1" in text
    assert campaign_owners([str(out)]) == {"diffusion": str(out)}
    df = aggregate([], [out], study="diffusion")
    assert sorted(df["variant"].to_list()) == ["workers-0", "workers-1"] and set(df["status"]) == {"ok"}
