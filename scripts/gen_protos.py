"""Generate the Python code for protos/ and check that the committed copy is current.

    python scripts/gen_protos.py          # regenerate in place
    python scripts/gen_protos.py --check  # exit 1 and name the files if the committed code is stale

Generated modules sit next to their .proto files (protos/godel/v1/*_pb2*.py) with mypy stubs,
and are imported as ``protos.godel.v1.objects_pb2``.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos" / "godel" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generate(out_root: Path) -> list[Path]:
    from grpc_tools import protoc  # dev dependency

    # protoc finds the mypy plugins on $PATH; they sit beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    protos = sorted(PROTO_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *[str(p.relative_to(ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    out_dir = out_root / PROTO_DIR.relative_to(ROOT)
    return sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        committed = {p.name for p in PROTO_DIR.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
        if opts.check:
            stale = [
                p.name
                for p in fresh
                if not (PROTO_DIR / p.name).exists()
                or not filecmp.cmp(p, PROTO_DIR / p.name, shallow=False)
            ]
            stale += sorted(committed - {p.name for p in fresh})
            if stale:
                print("generated protobuf code is stale: " + ", ".join(stale), file=sys.stderr)
                print("run: python scripts/gen_protos.py", file=sys.stderr)
                return 1
            print(f"generated protobuf code is current ({len(fresh)} files)")
            return 0
        for name in committed - {p.name for p in fresh}:
            (PROTO_DIR / name).unlink()
        for p in fresh:
            shutil.copyfile(p, PROTO_DIR / p.name)
        print(f"wrote {len(fresh)} files to {PROTO_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
