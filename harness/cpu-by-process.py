#!/usr/bin/env python3
"""Runs a command and says where the machine's CPU went meanwhile: every process's user + system
time (from /proc/<pid>/stat, sampled every 0.5 s, so a process that lived less than that may be
missed), summed by process name, and the whole machine's busy time (/proc/stat).

    python3 harness/cpu-by-process.py make test

Used for docs/performance-notes.md, "Where make test's CPU goes". The command's output is kept
in cpu-by-process.log (or $CPU_BY_PROCESS_LOG)."""
import collections
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def machine_busy():
    fields = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(fields) - fields[3] - fields[4]) / HZ  # without idle and iowait


def sample(seen):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        # utime, stime; the start time tells a reused pid apart.
        seen[(pid, fields[19])] = (name, (int(fields[11]) + int(fields[12])) / HZ)


if len(sys.argv) < 2:
    sys.exit(__doc__)
before = {}
sample(before)
seen = dict(before)
busy, started = machine_busy(), time.time()
with open(os.environ.get("CPU_BY_PROCESS_LOG", "cpu-by-process.log"), "w") as log:
    command = subprocess.Popen(sys.argv[1:], stdout=log, stderr=subprocess.STDOUT)
    while command.poll() is None:
        sample(seen)
        time.sleep(0.5)
sample(seen)
by_name = collections.Counter()
for key, (name, cpu) in seen.items():
    by_name[name] += cpu - before.get(key, (name, 0.0))[1]
print(f"exit {command.returncode}, {time.time() - started:.0f} s, "
      f"machine busy {machine_busy() - busy:.0f} CPU-s")
for name, cpu in by_name.most_common(15):
    if cpu >= 0.5:
        print(f"{cpu:8.1f}  {name}")
sys.exit(command.returncode)
