"""The lock's entries (pin and hashes) for the distributions a base image does not already have.

    python3 lock_beside_base.py requirements/runtime.txt base-freeze.txt > missing.txt

Dockerfile.runtime installs the decision server into vLLM's own Python: what vLLM already brings stays at vLLM's
version (the freeze is passed as constraints, so a lock entry that disagrees with the base fails the build instead of
changing vLLM), and everything else comes from the lock with its hashes. Standard library only: it runs in the base
image before anything is installed.
"""

from __future__ import annotations

import re
import sys


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(freeze: str) -> set[str]:
    return {canonical(line.split("==", 1)[0]) for line in freeze.splitlines() if "==" in line}


def entries(lock: str) -> list[tuple[str, str]]:
    """(canonical name, the entry's text with its hash lines) for each pin of a requirements file."""
    out = []
    for block in re.split(r"\n(?=\S)", lock):
        first = block.split("\n", 1)[0]
        if not first.strip() or first.startswith("#"):
            continue
        out.append((canonical(re.split(r"[\s=\[;]", first, maxsplit=1)[0]), block.rstrip()))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as lock, open(argv[1]) as freeze:
        have = installed(freeze.read())
        missing = [text for name, text in entries(lock.read()) if name not in have]
    sys.stdout.write("".join(text + "\n" for text in missing))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
