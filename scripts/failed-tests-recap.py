#!/usr/bin/env python3
"""Prints the last lines of every failed test's output from ctest's Testing/Temporary/LastTest.log.

    failed-tests-recap.py BUILD_DIR [LINES]

ctest --output-on-failure prints a failed test's output where it finished, often thousands of
lines before the summary; a CI that keeps only the tail of its log then shows which test failed
but not why. scripts/test.sh runs this after a failed ctest, so the reasons come last.
"""
import re
import sys
from pathlib import Path

# A failure's own words: recovery/demo scripts ("FAIL: ...", "error: ..."), GoogleTest ("Failure",
# "Expected", "Which is"), ctest's timeout.
VERDICT = re.compile(r"FAIL|Failure|^Expected|Which is|[Ee]rror:|Timeout|timed out")


def main() -> int:
    build = Path(sys.argv[1])
    keep = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    log = build / "Testing" / "Temporary" / "LastTest.log"
    try:
        text = log.read_text(errors="replace")
    except OSError as e:
        print(f"failed-tests-recap: no ctest log ({e})")
        return 0
    # One block a test: "N/M Testing: NAME" ... "Output:" --- lines --- "<end of output>" ... "Test Failed."
    block = re.compile(r"^\d+/\d+ Testing: (?P<name>\S+)[^\n]*\n.*?^Output:\n-+\n(?P<out>.*?)^<end of output>\n"
                       r"(?P<tail>.*?)^Test (?P<verdict>Passed|Failed)", re.S | re.M)
    failed = [m for m in block.finditer(text) if m.group("verdict") != "Passed"]
    summary = []
    for m in failed:
        lines = m.group("out").rstrip("\n").splitlines()
        print(f"--- {m.group('name')} failed")
        # The verdict lines first (a script's "FAIL: why" may come before pages of logs it dumps).
        verdicts = [line for line in lines[:-keep] if VERDICT.search(line)]
        if verdicts:
            print("\n".join(verdicts[:12]))
        print(f"--- the last {min(keep, len(lines))} of its {len(lines)} output lines:")
        print("\n".join(lines[-keep:]))
        # One or two lines a test for the very end: its first verdicts, else its last line.
        why = [line for line in lines if VERDICT.search(line)][:2] or lines[-1:] or ["(no output)"]
        summary.append(f"{m.group('name')}: " + " | ".join(w.strip()[:200] for w in why))
    if summary:
        print(f"--- {len(summary)} failed, each in a line (the details are above):")
        print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
