"""What converting a GGUF base model costs with the file read once (`pipeline/training/gguf_base.py`,
`_gguf_read_once`) against transformers reading it its own way, measured alternately in one run and printed
as a ratio; and whether both write the same folder.

    python bench/gguf_conversion.py [--gguf smollm2-135m-instruct] [--repeats 2]

Each conversion runs in a fresh Python process (as `simulacra run`'s background converter does), so that
neither variant finds the other's imports or parses warm; a process's time is counted from before its
imports to the folder's publication. The variants alternate (transformers' reads, read once, ...) so that
load from other processes on a shared machine falls on both alike. The check: every file of the two
folders byte for byte (`gguf_source.json` included: it records the file's digest, not where it was written).
"""

import argparse
import filecmp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONVERT = """
import sys
from pathlib import Path
from pipeline.training.gguf_base import _convert, resolve_gguf
base = resolve_gguf(sys.argv[1], Path(sys.argv[2]))
_convert(base, read_once=sys.argv[3] == "once")
print(base.folder)
"""


def convert(ref: str, workspace: Path, variant: str) -> tuple[float, Path]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CONVERT, ref, str(workspace), variant],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"conversion ({variant}) failed:\n{done.stderr[-2000:]}")
    return seconds, Path(done.stdout.strip().splitlines()[-1])


def differing(left: Path, right: Path) -> list[str]:
    names = sorted({p.name for p in left.iterdir()} | {p.name for p in right.iterdir()})
    return [
        name
        for name in names
        if not ((left / name).is_file() and (right / name).is_file())
        or not filecmp.cmp(left / name, right / name, shallow=False)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default="smollm2-135m-instruct", help="a packaged model's name or a .gguf path")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    times: dict[str, list[float]] = {"transformers": [], "once": []}
    folders: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="gguf-bench-") as scratch:
        for repeat in range(args.repeats):
            for variant in times:
                workspace = Path(scratch) / f"{variant}-{repeat}"
                seconds, folder = convert(args.gguf, workspace, variant)
                times[variant].append(seconds)
                folders.setdefault(variant, folder)
                print(f"{variant:>12} #{repeat + 1}: {seconds:6.1f} s", flush=True)
        differ = differing(folders["transformers"], folders["once"])
    slow, fast = statistics.median(times["transformers"]), statistics.median(times["once"])
    print(f"transformers' reads {slow:.1f} s, read once {fast:.1f} s: {fast / slow:.2f}x (medians, whole processes)")
    print("the same folder, byte for byte" if not differ else f"the folders differ in: {', '.join(differ)}")
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
