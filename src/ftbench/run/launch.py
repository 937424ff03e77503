"""How a job's processes start: one process, or one per GPU through torchrun, on this host or over a SLURM
allocation's nodes (srun), with a free rendezvous port; and how they are killed together."""

from __future__ import annotations

import os
from pathlib import Path
import signal
import subprocess
import sys
import time


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_nodes(env: dict) -> list[str]:
    """The host names of the SLURM allocation this process runs in (scontrol expands SLURM_JOB_NODELIST), or []."""
    if not env.get("SLURM_JOB_ID") or not env.get("SLURM_JOB_NODELIST"):
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_JOB_NODELIST"]], capture_output=True, text=True,
                         env=env)
    return out.stdout.split() if out.returncode == 0 else []


def launch_plan(gpus: int, nodes: int, slots: list[str], job: Path, env: dict, run_id: str) -> list[dict]:
    """How the job's ranks start, one entry a launcher ({"cmd", "env", "where"}): one process for one GPU; one torchrun
    of `gpus` ranks (standalone); or, with `nodes` > 1, `nodes` torchrun launchers of gpus / nodes ranks each, joined
    by torchrun's c10d rendezvous as nodes of one job. Inside a SLURM allocation srun starts them (one a node where the
    allocation has that many nodes), the rendezvous on the allocation's first host and its id the SLURM job's; elsewhere
    they start side by side on this host, each with its share of the job's GPUs (a 2 x 2 job on one 4-GPU host), the
    first hosting the rendezvous."""
    child = ["-m", "ftbench.run.supervise", str(job)]
    if gpus <= 1:
        return [{"cmd": [sys.executable, *child], "env": env, "where": "one process"}]
    run = [sys.executable, "-m", "torch.distributed.run"]
    if nodes <= 1:
        return [{"cmd": [*run, "--standalone", f"--nproc-per-node={gpus}", *child], "env": env,
                 "where": f"torchrun, {gpus} ranks (standalone)"}]
    per = gpus // nodes
    rdzv = [f"--nnodes={nodes}", f"--nproc-per-node={per}", "--rdzv-backend=c10d", "--max-restarts=0"]
    hosts = slurm_nodes(env)
    if hosts:
        port = 29400 + int(env["SLURM_JOB_ID"]) % 500
        srun = ["srun", f"--ntasks={nodes}", "--kill-on-bad-exit=1", "--overlap"]
        if len(hosts) >= nodes:
            srun.append("--ntasks-per-node=1")
        cmd = [*srun, *run, *rdzv, f"--rdzv-id=slurm-{env['SLURM_JOB_ID']}", f"--rdzv-endpoint={hosts[0]}:{port}",
               *child]
        return [{"cmd": cmd, "env": env, "where": f"srun: {nodes} launchers of {per} ranks on {', '.join(hosts)}; "
                                                  f"c10d rendezvous at {hosts[0]}:{port}"}]
    port, out = _free_port(), []
    for i in range(nodes):
        e = dict(env)
        if slots:
            e["CUDA_VISIBLE_DEVICES"] = ",".join(slots[i * per:(i + 1) * per])
        cmd = [*run, *rdzv, f"--rdzv-id={run_id}", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-conf=is_host={1 if i == 0 else 0}", *child]
        out.append({"cmd": cmd, "env": e, "where": f"launcher {i} of {nodes} on this host, {per} ranks"
                                                   + (f" on GPUs {e['CUDA_VISIBLE_DEVICES']}" if slots else "")
                                                   + f"; c10d rendezvous at 127.0.0.1:{port}"})
    return out


class Launchers:
    """The job's launcher processes as one: alive while any is, its return code the first failure's (else 0). One
    launcher that ends in failure while others run is given LAUNCHER_GRACE_S for theirs to notice, then the rest are
    killed (a rank waiting in a collective for a peer on another launcher never returns by itself)."""

    def __init__(self, procs: list):
        self.procs, self.failed_at = procs, None

    def poll(self):
        codes = [p.poll() for p in self.procs]
        bad = [c for c in codes if c not in (None, 0)]
        if bad and None in codes:
            self.failed_at = self.failed_at or time.monotonic()
            if time.monotonic() - self.failed_at > LAUNCHER_GRACE_S:
                for p in self.procs:
                    _kill(p)
                codes = [p.poll() for p in self.procs]
        if None in codes:
            return None
        return next((c for c in codes if c != 0), 0)

    @property
    def returncode(self):
        return self.poll()

    def kill_all(self):
        for p in self.procs:
            _kill(p)


def _kill(proc) -> None:
    if isinstance(proc, Launchers):
        proc.kill_all()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


LAUNCHER_GRACE_S = 15
