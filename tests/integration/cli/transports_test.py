#!/usr/bin/env python3
"""`deltacast transports`: each backend's capability report comes from the libraries at run time.

    transports_test.py DELTACAST

CUDA memory, per scheme, must agree with what the libraries' own tools say on this machine:
ucx with `ucx_info -d` (a cuda transport or memory domain listed), ofi+tcp / ofi+shm with
`fi_info -p PROVIDER -c FI_HMEM` (a provider found with FI_HMEM) where the CUDA driver's
libcuda.so.1 loads (FI_HMEM is asked for only then: shm offers it without a GPU too). Each report says how CUDA
memory is registered or why it can not be (for ucx, the memory types UCX reports, host among
them). The table form names every scheme. Exit 0: passed; 1: failed.
"""

import ctypes
import json
import subprocess
import sys


def fail(why: str) -> None:
    print(f"FAIL: {why}", file=sys.stderr)
    sys.exit(1)


def tool(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def main() -> int:
    dc = sys.argv[1]
    out = tool(dc, "transports", "--json")
    if out.returncode != 0:
        fail(f"deltacast transports --json exited {out.returncode}: {out.stderr}")
    rows = {r["scheme"]: r for r in json.loads(out.stdout)}
    for scheme in ("tcp", "ucx", "ofi+tcp", "ofi+shm", "loop"):
        if scheme not in rows:
            fail(f"{scheme} is not in the report: {sorted(rows)}")
    built = {s: r for s, r in rows.items() if r["built"] and "error" not in r}
    for scheme, row in built.items():
        if not row["cuda_memory_detail"]:
            fail(f"{scheme}: no cuda_memory_detail")
    for scheme in ("tcp", "loop"):
        if scheme in built and built[scheme]["cuda_memory"]:
            fail(f"{scheme} says it registers CUDA memory")
    if "ucx" in built:
        ucx = built["ucx"]
        listed = tool("ucx_info", "-d").stdout
        cuda_listed = any(line.split(":")[-1].strip().startswith("cuda") for line in listed.splitlines()
                          if "Transport:" in line or "Memory domain:" in line)
        if ucx["cuda_memory"] != cuda_listed:
            fail(f"ucx says cuda_memory {ucx['cuda_memory']}, ucx_info -d lists cuda: {cuda_listed}")
        if "memory types host" not in ucx["cuda_memory_detail"]:
            fail(f"ucx's detail does not list the memory types UCX reports: {ucx['cuda_memory_detail']}")
    try:
        ctypes.CDLL("libcuda.so.1")
        driver = True
    except OSError:
        driver = False
    for provider in ("tcp", "shm"):
        row = built.get(f"ofi+{provider}")
        if row is None:
            continue
        hmem = tool("fi_info", "-p", provider, "-c", "FI_HMEM").returncode == 0
        if row["cuda_memory"] != (hmem and driver):
            fail(f"ofi+{provider} says cuda_memory {row['cuda_memory']}, fi_info -c FI_HMEM finds it: {hmem}, "
                 f"libcuda.so.1 loads: {driver}")
        if not driver and "no CUDA driver" not in row["cuda_memory_detail"]:
            fail(f"ofi+{provider}'s detail does not say there is no CUDA driver: {row['cuda_memory_detail']}")
        if f"provider {provider}" not in row["cuda_memory_detail"]:
            fail(f"ofi+{provider}'s detail does not name its provider: {row['cuda_memory_detail']}")
    table = tool(dc, "transports")
    if table.returncode != 0 or any(f"{s} " not in table.stdout for s in rows):
        fail(f"the table does not name every scheme:\n{table.stdout}{table.stderr}")
    for scheme, row in sorted(rows.items()):
        print(f"ok: {scheme}: cuda_memory {row.get('cuda_memory')} ({row.get('cuda_memory_detail', row.get('error'))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
