"""Write the engine's OpenAPI document deterministically (sorted keys), or check a file against it.

python -m marft_engine.openapi OUT.json         writes the document
python -m marft_engine.openapi --check FILE     exits 1 when FILE differs from what would be written
"""

from __future__ import annotations

import argparse
import json
import sys

from .server import create_app


def document() -> str:
    app = create_app(None, token="unused")
    return json.dumps(app.openapi(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="marft_engine.openapi")
    parser.add_argument("file")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = document()
    if args.check:
        try:
            with open(args.file, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            print(f"{args.file} does not exist: run make openapi", file=sys.stderr)
            return 1
        if current != text:
            print(f"{args.file} is stale: run make openapi", file=sys.stderr)
            return 1
        return 0
    with open(args.file, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
