#!/usr/bin/env python3
"""Count the CUDA ABI's entry points and their arguments (issue 17: no entry over eight arguments
outside a Params struct). Reads the X-macro lists of cpp/include/memra/cuda_abi/*.h; an entry's
arguments are counted with the context.

    python3 scripts/abi_count.py [REPO_ROOT] [--list]
"""

from __future__ import annotations

import glob
import json
import re
import sys


def entries(root: str) -> list[tuple[int, str, str]]:
    rows = []
    for f in sorted(glob.glob(root + "/cpp/include/memra/cuda_abi/*.h")):
        s = re.sub(r"/\*.*?\*/", "", open(f).read(), flags=re.S).replace("\\\n", " ")
        for m in re.finditer(r"\bX\(\s*(\w+)\s*,\s*\(", s):
            i = j = m.end()
            depth = 1
            while depth:
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                j += 1
            args = [a for a in s[i:j - 1].split(",") if a.strip()]
            rows.append((len(args), m.group(1), f.split("/")[-1]))
    return sorted(rows)


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--list"]
    rows = entries(args[0] if args else ".")
    if "--list" in sys.argv:
        for n, name, header in rows:
            print(n, name, header)
    print(json.dumps({"entries": len(rows), "over_8_args": sum(r[0] > 8 for r in rows),
                      "longest": max(rows)[0] if rows else 0, "longest_entry": max(rows)[1] if rows else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
