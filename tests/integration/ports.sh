# Loopback ports for the integration scripts (sourced):
#   free_ports N   the first of N consecutive free ports on 127.0.0.1
# The ports lie below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range,
# 32768-60999 by default): there, any test's outgoing connection may take a port between our
# check and the member's bind (CI: "cannot listen on tcp://127.0.0.1:39406: Address already in
# use"), or while a killed producer is down, before it binds its port again.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
try:
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[:2])
except (OSError, ValueError):
    low, high = 32768, 60999
# From 20000 to the ephemeral range, and above it.
starts = list(range(20000, low - n)) + list(range(high + 1, 65536 - n))
if not starts:
    sys.exit("free_ports: the ephemeral port range leaves no room")
for _ in range(500):
    base = random.choice(starts)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
else:
    sys.exit("free_ports: no run of free loopback ports")
PY
}
