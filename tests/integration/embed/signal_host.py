"""A Python host embedding deltacast keeps its signal handlers (run by install_test.sh against
the installed package; numpy from Debian).

Python's own SIGINT handler (KeyboardInterrupt) and a SIGTERM handler set by the host before
`import deltacast` must survive the import and a producer opened on each transport named on the
command line (tcp, ucx, ofi+tcp: libfabric's and UCX's providers load then). Checked twice: every
C-level disposition (handler, flags without glibc's SA_RESTORER, the kernel's 64-signal mask) is
the same as before the import, and the signals really reach Python: SIGTERM runs the host's
handler, SIGINT raises KeyboardInterrupt. Exits 0, or 1 naming what changed."""

import ctypes
import os
import signal
import sys
import time

LIBC = ctypes.CDLL(None, use_errno=True)
SA_RESTORER = 0x04000000


def dispositions() -> dict:
    # glibc's struct sigaction on x86_64: handler (8 bytes), sa_mask (128), sa_flags (int), ...
    out = {}
    for sig in range(1, signal.NSIG):
        buf = ctypes.create_string_buffer(152)
        if LIBC.sigaction(sig, None, buf) == 0:
            flags = int.from_bytes(buf[136:140], "little") & ~SA_RESTORER
            out[sig] = (bytes(buf[0:8]), flags, bytes(buf[8:16]))
    return out


terms = []
signal.signal(signal.SIGTERM, lambda sig, frame: terms.append(sig))
before = dispositions()

import deltacast  # noqa: E402  (the point of the test: what importing does)
import numpy as np  # noqa: E402

for transport in sys.argv[1:]:
    p = deltacast.Producer({"w": np.zeros(4, np.float32)}, receivers=1, listen=f"{transport}://127.0.0.1:0",
                           transport=transport)
    p.close()
after = dispositions()
changed = [f"{sig} ({signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig})"
           for sig in before if before[sig] != after.get(sig)]
if changed:
    print("signal_host.py: dispositions changed by deltacast:", ", ".join(changed))
    sys.exit(1)

os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.05)
if terms != [signal.SIGTERM]:
    print("signal_host.py: the host's SIGTERM handler did not run")
    sys.exit(1)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1.0)
    print("signal_host.py: SIGINT raised no KeyboardInterrupt")
    sys.exit(1)
except KeyboardInterrupt:
    pass
print(f"signal_host.py: {len(before)} dispositions kept through {len(sys.argv) - 1} transports; "
      "SIGTERM reached the host's handler, SIGINT raised KeyboardInterrupt")
