"""Prints the kdsync distribution's dependencies from pyproject.toml, one per line.

Used inside image builds (docker/*.Dockerfile) so that the dependencies get their own
cached layer, installed before the sources are copied in. Needs only the standard library.

    python3 requirements.py pyproject.toml [--without NAME ...]
"""

from __future__ import annotations

import argparse
import re
import tomllib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pyproject")
    parser.add_argument("--without", action="append", default=[], metavar="NAME")
    args = parser.parse_args()
    with open(args.pyproject, "rb") as file:
        dependencies = tomllib.load(file)["project"]["dependencies"]
    skipped = {name.lower() for name in args.without}
    for requirement in dependencies:
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()
        if name not in skipped:
            print(requirement)


if __name__ == "__main__":
    main()
