"""A server process for test_embed.py: a deltacast.Receiver serving refits into its own torch
model's parameters.

    embed_server.py URL RANK

Joins the producer at URL as RANK, prints the manifest, attaches zero-filled tensors (its model's
Parameters and the extra tensors of embed_model.py), starts, then answers commands on stdin, one
JSON line on stdout each:
    check V      wait for version V; its version, digest, tensor hashes, whether every tensor's
                 data_ptr is still the one attached (and still its model's parameter), and the
                 events seen since the last answer (from poll_event and from the callback)
    rolled_back  the same, once the callback has seen a rolled_back event (no wait_version)
    end          wait for the "ended" event (the producer closed), close; the same answer
A failure prints {"error": ...} and exits 1.
"""

import json
import sys
import threading
import time
import traceback

import deltacast
import embed_model


def main():
    url, rank = sys.argv[1], int(sys.argv[2])
    say = lambda obj: print(json.dumps(obj), flush=True)  # noqa: E731

    receiver = deltacast.Receiver(producer=url, rank=rank, listen="tcp://127.0.0.1:0", log_level="warn")
    manifest = receiver.join(timeout=60)
    say({"manifest": [[name, dtype, list(shape)] for name, dtype, shape in manifest]})

    model, tensors = embed_model.server_tensors()
    receiver.attach(tensors)
    pointers = {name: t.data_ptr() for name, t in tensors.items()}

    seen = []  # events from the callback (a deltacast thread), in order
    seen_changed = threading.Condition()

    def on_event(event):
        with seen_changed:
            seen.append(event)
            seen_changed.notify_all()

    receiver.on_event(on_event)
    receiver.start()

    def wait_for_event(kind, timeout=60):
        deadline = time.monotonic() + timeout
        with seen_changed:
            while not any(e.kind == kind for e in seen):
                if not seen_changed.wait(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"no '{kind}' event within {timeout} s (seen: {seen})")

    reported = 0

    def answer():
        nonlocal reported
        polled = []
        while (event := receiver.poll_event()) is not None:
            polled.append(event)
        with seen_changed:
            from_callback, reported = seen[reported:], len(seen)
        params = {f"model.{name}": p.data_ptr() for name, p in model.named_parameters()}
        same = all(tensors[name].data_ptr() == ptr for name, ptr in pointers.items()) and \
            all(pointers[name] == ptr for name, ptr in params.items())
        say({"version": receiver.version, "digest": receiver.digest, "hashes": embed_model.hashes(tensors),
             "pointers_unchanged": same,
             "polled": [list(e) for e in polled], "callback": [list(e) for e in from_callback]})

    for line in sys.stdin:
        command = line.split()
        if command[0] == "check":
            receiver.wait_version(int(command[1]), timeout=60)
        elif command[0] == "rolled_back":
            wait_for_event("rolled_back")
        elif command[0] == "end":
            wait_for_event("ended")
            answer()
            receiver.close()
            return
        answer()


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # noqa: BLE001 (the test reads the reason)
        print(json.dumps({"error": traceback.format_exc()}), flush=True)
        sys.exit(1)
