"""One line per run record under results/runs (status, samples/h, step time, noise, memory, build): what a lent
GPU's call prints before its records come back. Usage: python bench/show.py [GLOB]"""
import glob
import json
import sys

for f in sorted(glob.glob(sys.argv[1] if len(sys.argv) > 1 else "results/runs/*/*/full/*/*/bs*/metrics.json")):
    d = json.load(open(f))
    t, m, b = d["throughput"], d["memory"], d["model"].get("build") or {}
    print(f.split("llm/", 1)[-1].rsplit("/", 1)[0], d["status"], (d["reason"] or "")[:160],
          "| samples/h", t.get("samples_per_hour") and round(t["samples_per_hour"]), "step_s", d["timing"].get("step_time_s"),
          "noise", d["timing"].get("noise_cv"), "steps", d["measure"].get("steps_measured") if d.get("measure") else None,
          "| peak_reserved", m.get("peak_reserved_gib"), "at_failure", m.get("at_failure_gib"), "host", m.get("host_peak_rss_gib"),
          "| build_s", b.get("build_s"), "busy", (d.get("device_usage") or {}).get("gpu_util_mean_pct"))
