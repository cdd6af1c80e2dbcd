"""How busy the GPU was during each step of a logged run: a sampler, and a report that cuts its samples by the log.

    python bench/gpu_busy.py sample SAMPLES.csv &          # NVML utilisation every 100 ms until killed
    python bench/gpu_busy.py run LOG -- CMD ...            # CMD's output, each line stamped with the epoch time
    python bench/gpu_busy.py report SAMPLES.csv LOG        # per step of a `kd distill` log: wall s, GPU busy %

NVML's utilisation is the share of the last sample period in which any kernel ran: a GPU 100 % "busy" may still
be far from its arithmetic peak, but one under 50 % is certainly waiting on the host. A step is a line that starts
with `[k/n]` (kd distill's step lines); the report's last row is the whole run.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time

STEP = re.compile(r"^\[(\d+)/(\d+)\] ([^·]+)")


def sample(path: str, every: float = 0.1) -> None:
    import pynvml  # nvidia-ml-py: on the GPU machine's image

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with open(path, "w", buffering=1) as f:
        while True:
            u = pynvml.nvmlDeviceGetUtilizationRates(h)
            f.write(f"{time.time():.3f},{u.gpu},{pynvml.nvmlDeviceGetMemoryInfo(h).used >> 20}\n")
            time.sleep(every)


def run(log: str, cmd: list[str]) -> int:
    """Run `cmd`, writing each output line (\\r updates too) to stdout and `log` as 'EPOCH_SECONDS line'."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
    buf = b""
    with open(log, "w", buffering=1) as f:
        f.write(f"{time.time():.3f} == start {' '.join(cmd)}\n")
        while True:
            r, _, _ = select.select([p.stdout], [], [], 1.0)
            if not r:
                continue
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            *lines, buf = (buf + chunk).replace(b"\r", b"\n").split(b"\n")
            for line in lines:
                if line.strip():
                    text = line.decode(errors="replace")
                    f.write(f"{time.time():.3f} {text}\n")
                    print(text, flush=True)
        rc = p.wait()
        f.write(f"{time.time():.3f} == end rc {rc}\n")
    return rc


def report(samples: str, log: str) -> str:
    rows = [tuple(map(float, line.split(","))) for line in open(samples) if line.count(",") == 2]
    marks: list[tuple[float, str]] = []
    for line in open(log):
        t, _, text = line.rstrip("\n").partition(" ")
        m = STEP.match(text)
        if m and (not marks or marks[-1][1] != m.group(0).strip()):
            marks.append((float(t), m.group(0).strip()))
        if text.startswith("== "):
            marks.append((float(t), text))
    start, end = marks[0][0], marks[-1][0]
    out = ["| step | wall s | GPU busy % (mean of 100 ms samples) | GPU memory MiB (max) |", "|---|---|---|---|"]
    spans = [(a, b, name) for (a, name), (b, _) in zip(marks, marks[1:]) if not name.startswith("== end")]
    for a, b, name in [*spans, (start, end, "whole run")]:
        inside = [r for r in rows if a <= r[0] < b]
        busy = sum(r[1] for r in inside) / len(inside) if inside else float("nan")
        mem = max((r[2] for r in inside), default=float("nan"))
        out.append(f"| {name.removeprefix('== start ')[:70]} | {b - a:.1f} | {busy:.1f} | {mem:.0f} |")
    return "\n".join(out)


if __name__ == "__main__":
    verb = sys.argv[1]
    if verb == "sample":
        sample(sys.argv[2])
    elif verb == "run":
        sys.exit(run(sys.argv[2], sys.argv[sys.argv.index("--") + 1:]))
    else:
        print(report(sys.argv[2], sys.argv[3]))
