#!/usr/bin/env bash
# On a lent host, after bench/stage.sh: wait until every staged part has ended, N records exist, or SECONDS pass; print
# a line a record (status, real tokens/s, CV across windows, energy a real token, power, SM clock, busy, peak), then
# pack each tree's records into OUT/<tree>/records.tar.gz (bench/collect.sh) with the parts' logs. Pack in every poll:
# a machine that goes back takes /tmp with it, and only what a call wrote under its OUT comes back.
#   bash bench/poll.sh SECONDS OUT [N]
set -u
end=$(( $(date +%s) + ${1:?usage: bash bench/poll.sh SECONDS OUT [N]} ))
out=${2:?usage: bash bench/poll.sh SECONDS OUT [N]}
count() { ls /tmp/ftb*/results/runs/*/*/*/*/*/*/metrics.json 2>/dev/null | wc -l; }
while [ "$(date +%s)" -lt "$end" ] && pgrep -f "[m]easure_check" > /dev/null && [ "$(count)" -lt "${3:-999999}" ]; do
  sleep 5
done
python3 - <<'PY'
import glob, json, os
for path in sorted(glob.glob("/tmp/ftb*/results/runs/*/*/*/*/*/*/metrics.json"), key=os.path.getmtime):
    d = json.load(open(path))
    t, e, u = d.get("timing") or {}, d.get("energy") or {}, d.get("device_usage") or {}
    parts = path.split("/")
    print(parts[2], parts[-3], parts[-2], d["status"], (d.get("reason") or "")[:300],
          f"{(d.get('throughput') or {}).get('tokens_per_s') or 0:,.0f} real tokens/s",
          f"CV {100 * (t.get('noise_cv_tokens') or 0):.1f} %", f"{1000 * (e.get('per_token_j') or 0):.2f} mJ/token",
          f"{u.get('power_mean_w') or 0:.0f} W", f"{u.get('sm_clock_mean_mhz') or 0:.0f} MHz",
          f"busy {u.get('gpu_util_mean_pct') or 0:.1f} %", f"peak {(d.get('memory') or {}).get('peak_reserved_gib') or 0:.1f} GiB")
PY
for tree in /tmp/ftb*/; do
  [ -f "$tree/bench/collect.sh" ] || continue
  name=$(basename "$tree")
  (cd "$tree" && bash bench/collect.sh "$out/$name" > /dev/null && cp -r mc "$out/$name/" 2> /dev/null)
done
pgrep -f "[m]easure_check" > /dev/null && echo "still running" || echo "done"
