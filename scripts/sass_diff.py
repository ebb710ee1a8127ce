#!/usr/bin/env python3
"""Compare the SASS of two builds of libmemra_cuda.so kernel by kernel (issue 17: kernels that only
moved keep identical SASS).

Each kernel's instructions are taken from ``cuobjdump -sass`` with the addresses and encodings
dropped, so two kernels compare equal when they run the same instructions on the same registers
and constant-bank offsets. Prints one JSON line per kernel that differs or exists in one build
only, then a summary line; exits 1 when any kernel differs (or is missing) unless --allow lists it.

    python3 scripts/sass_diff.py OLD.so NEW.so [--allow NAME_SUBSTRING ...]
    python3 scripts/sass_diff.py OLD.sass.txt NEW.so      # a saved cuobjdump -sass listing works too
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys


def listing(path: str) -> str:
    if path.endswith(".txt"):
        return open(path).read()
    return subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True, text=True).stdout


# Kernels in an anonymous namespace carry a hash of their file in the mangled name
# (_GLOBAL__N__<hash>_<n>_<file>_<hash>): dropped, so a kernel compares equal after its file changed
# or it moved to another file (a name that then appears twice is reported as ambiguous).
ANON = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}")


def kernels(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = ANON.sub("ANON", m.group(1))
            if name in out:
                name += "#ambiguous"
            out[name] = []
            continue
        if name is None:
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            out[name].append(re.sub(r"\s+", " ", m.group(1)).strip())
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--allow", nargs="*", default=[], help="kernels (substrings of the mangled name) allowed to differ")
    args = p.parse_args()
    a, b = kernels(listing(args.old)), kernels(listing(args.new))
    same = differ = 0
    bad = 0
    for name in sorted(set(a) | set(b)):
        allowed = any(s in name for s in args.allow)
        if name in a and name in b:
            if a[name] == b[name]:
                same += 1
                continue
            differ += 1
            print(json.dumps({"kernel": name, "status": "differs", "old_insts": len(a[name]),
                              "new_insts": len(b[name]), "allowed": allowed}))
        else:
            print(json.dumps({"kernel": name, "status": "only_old" if name in a else "only_new",
                              "allowed": allowed}))
        bad += not allowed
    print(json.dumps({"summary": True, "identical": same, "differ": differ, "old_kernels": len(a),
                      "new_kernels": len(b), "not_allowed": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
