"""A real one-node SLURM cluster on this machine (Debian's slurm-wlm and munge), for tests/test_slurm.py: munged,
slurmctld and slurmd started as root with a generated slurm.conf, stopped afterwards. Needs root."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

PACKAGES = ["slurm-wlm", "munge"]
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
MARK = "# written by ftbench's tests/slurm_cluster.py"

SLURM_CONF = """\
ClusterName=ftbench-test
SlurmctldHost={host}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmdSpoolDir={state}/slurmd
StateSaveLocation={state}/ctld
SlurmUser=root
SlurmdUser=root
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=3600
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
NodeName={host} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def ensure_installed() -> None:
    if shutil.which("slurmctld") and shutil.which("munged"):
        return
    if os.geteuid() != 0:
        raise RuntimeError("SLURM tests need slurm-wlm and munge (apt-get install slurm-wlm munge) and root")
    subprocess.run(["apt-get", "install", "-y", "-q", *PACKAGES], check=True, capture_output=True,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 1024
    return 4096


@contextmanager
def cluster(state: Path):
    """Start munged, slurmctld and slurmd; yield the environment for SLURM clients (SLURM_CONF)."""
    ensure_installed()
    state.mkdir(parents=True, exist_ok=True)
    for sub in ("slurmd", "ctld"):
        (state / sub).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    # the daemons read -f; srun inside a job reads the default path only, so the config goes there (never over
    # a real cluster's: a machine with its own /etc/slurm/slurm.conf is refused)
    conf = DEFAULT_CONF
    if conf.exists() and MARK not in conf.read_text():
        raise RuntimeError(f"{conf} exists and is not this test's: run the SLURM test on a machine without SLURM")
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(MARK + "\n" + SLURM_CONF.format(host=host, state=state, cpus=os.cpu_count(), mem_mb=_mem_mb(),
                                      ctld_port=_free_port(), d_port=_free_port()))
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = []
    munge_dir = Path("/run/munge")
    munge_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(munge_dir, "munge", "munge")
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
        subprocess.run(["runuser", "-u", "munge", "--", "munged", "--force"], check=True)
    try:
        procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", host], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while True:  # the node is up when sinfo reports it idle
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout
            if "idle" in out:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                logs = "\n".join((state / f).read_text()[-2000:] for f in ("slurmctld.log", "slurmd.log")
                                 if (state / f).is_file())
                raise RuntimeError(f"the local SLURM did not come up (sinfo: {out!r})\n{logs}")
            time.sleep(1)
        yield env
    finally:
        subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        conf.unlink(missing_ok=True)
