# Loopback ports for the integration scripts (sourced):
#   free_ports N   the first of N consecutive free ports on 127.0.0.1
# dcfleet.pick_base_port's (recovery/dcfleet.py, the Python tests' picker): outside the kernel's
# ephemeral range, where any test's outgoing connection may take a port between the check and a
# member's bind, or while a killed producer is down.
free_ports() {
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import dcfleet; print(dcfleet.pick_base_port(int(sys.argv[2])))' \
    "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/recovery" "$1"
}
