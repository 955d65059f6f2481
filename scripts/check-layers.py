#!/usr/bin/env python3
"""Fails on an #include that crosses a layer the wrong way.

    scripts/check-layers.py [--root DIR]

The layers, their folders and the edges allowed between them are those of cmake/layers.txt (the
build reads the same file). Every C/C++/CUDA source under a layer's folder is read; each
`#include "x"` is resolved as the compiler would (next to the including file, then from the
source root, then from include/), and an include of a file of another layer that the including
file's layer may not use is reported as FILE:LINE with both layers. Includes of files outside every
layer (system headers, tests/) from a layer's file are refused too: a layer sees only layers.
Exits 0 when every include is allowed, 1 otherwise (each offence on its own line), 2 on a
malformed layers.txt.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".inc", ".cuh", ".c", ".cc", ".cpp", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
ROW = re.compile(r"^([a-z_]+)\s*:([^>]*)->(.*)$")


def read_layers(path):
    """{layer: (folders, uses)} from layers.txt; exits 2 on a malformed row."""
    layers = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = ROW.match(line)
            if not m:
                sys.exit(f"{path}:{number}: expected 'layer : folders -> layers', got '{line}'")
            layers[m.group(1)] = (m.group(2).split(), m.group(3).split())
    for name, (_, uses) in layers.items():
        for used in uses:
            if used not in layers:
                sys.exit(f"{path}: layer '{name}' uses '{used}', which is no layer")
    return layers


def layer_of(rel, folders):
    """The layer whose longest folder contains `rel` (a path from the root), or None."""
    best, best_len = None, -1
    for folder, layer in folders:
        if (rel == folder or rel.startswith(folder + "/")) and len(folder) > best_len:
            best, best_len = layer, len(folder)
    return best


def resolve(root, including, target):
    """The path (from root) the compiler would open for `#include "target"` in `including`."""
    for base in (os.path.dirname(including), "", "include"):
        candidate = os.path.normpath(os.path.join(base, target))
        if not candidate.startswith("..") and os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def check(root):
    layers = read_layers(os.path.join(root, "cmake", "layers.txt"))
    folders = [(folder, name) for name, (fs, _) in layers.items() for folder in fs]
    offences = []
    seen = set()  # a sub-folder's files are walked from its parent's folder too
    for folder, _ in folders:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if rel in seen:
                    continue
                seen.add(rel)
                own = layer_of(rel, folders)
                with open(os.path.join(root, rel), errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = resolve(root, rel, m.group(1))
                        if target is None:
                            continue  # generated in the build tree, or a missing file the compiler reports
                        other = layer_of(target, folders)
                        if other == own:
                            continue
                        if other is None:
                            offences.append(f"{rel}:{number}: includes {target}, which is in no layer "
                                            f"(layer {own} may use: {' '.join(layers[own][1]) or 'nothing'})")
                        elif other not in layers[own][1]:
                            offences.append(f"{rel}:{number}: includes {target}: layer {own} may not use "
                                            f"layer {other} (cmake/layers.txt)")
    return sorted(set(offences))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    offences = check(args.root)
    for offence in offences:
        print(offence)
    if offences:
        print(f"check-layers: {len(offences)} include(s) cross a layer the wrong way", file=sys.stderr)
        return 1
    print("check-layers: every include stays within the layers of cmake/layers.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
