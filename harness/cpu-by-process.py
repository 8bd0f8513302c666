#!/usr/bin/env python3
"""Runs a command and says where the machine's CPU went meanwhile: every process's user + system
time (from /proc/<pid>/stat, sampled every 0.5 s, so a process that lived less than that may be
missed), summed by process name and by the test binary each descends from (an executable under a
`deps/` folder: cargo's test binaries), and the whole machine's busy time (/proc/stat).

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


def stat(pid):
    text = open(f"/proc/{pid}/stat").read()
    return text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()


def test_binary(pid):
    """The test binary `pid` is or descends from (its name without cargo's hash), or "-"."""
    while pid not in ("0", "1"):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            pid = stat(pid)[1][1]  # the parent
        except OSError:
            return "-"
        if f"{os.sep}deps{os.sep}" in exe:
            return os.path.basename(exe).rsplit("-", 1)[0]
    return "-"


def sample(seen):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name, fields = stat(pid)
        except OSError:
            continue
        # utime, stime; the start time tells a reused pid apart.
        key = (pid, fields[19])
        binary = seen[key][2] if key in seen else test_binary(pid)
        seen[key] = (name, (int(fields[11]) + int(fields[12])) / HZ, binary)


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
by_name, by_binary = collections.Counter(), collections.Counter()
for key, (name, cpu, binary) in seen.items():
    used = cpu - before.get(key, (name, 0.0))[1]
    by_name[name] += used
    by_binary[(binary, name)] += used
print(f"exit {command.returncode}, {time.time() - started:.0f} s, "
      f"machine busy {machine_busy() - busy:.0f} CPU-s")
for name, cpu in by_name.most_common(15):
    if cpu >= 0.5:
        print(f"{cpu:8.1f}  {name}")
print("\nby test binary:")
for (binary, name), cpu in by_binary.most_common(30):
    if cpu >= 2:
        print(f"{cpu:8.1f}  {binary:16} {name}")
sys.exit(command.returncode)
