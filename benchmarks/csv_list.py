"""What reading a ``csv:`` list of 120,000 images costs (``kdml.data.formats.csv_list``).

Writes, in a temporary folder (or ``--folder``, kept for the next run), the CSV of 120,000
rows ``path,label,split`` and its images: hard links of 12 small JPEGs, 10,000 in each of 12
folders (Stanford Online Products' shape: 120,053 images in 12 folders), about 8 MB of disk
whatever the number of links. Then times ``load_csv`` ``--repeats`` times (median and range):
reading the rows, the check that no image is listed twice (links resolved), and the check
that every listed image is a file.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/csv_list.py --repeats 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import machine_description
from measure import positive_count
from PIL import Image

from kdml.data.formats.csv_list import load_csv

ROWS, FOLDERS, PER_CLASS = 120_000, 12, 6


def write_list(root: Path) -> Path:
    """The CSV and its hard-linked images under ``root`` (reused where already written)."""
    csv_file = root / "list.csv"
    if csv_file.is_file():
        return csv_file
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "JPEG", quality=80)
    rows = ["path,label,split"]
    for folder in range(FOLDERS):  # one source file a folder: ext4 allows 65,000 links a file
        (root / f"super{folder:02d}_final").mkdir(parents=True, exist_ok=True)
        (root / f"source{folder:02d}.jpg").write_bytes(buffer.getvalue())
    for number in range(ROWS):
        folder = number % FOLDERS
        relative = f"super{folder:02d}_final/{number:06d}.jpg"
        if not (root / relative).exists():
            os.link(root / f"source{folder:02d}.jpg", root / relative)
        label = number // PER_CLASS
        rows.append(f"{relative},{label},{'train' if label < ROWS // PER_CLASS // 2 else 'test'}")
    csv_file.write_text("\n".join(rows) + "\n")
    return csv_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_count, default=3)
    parser.add_argument("--folder", type=Path, help="where to write the list (kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        csv_file = write_list(args.folder or Path(temporary))
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            parts = load_csv(csv_file)
            times.append(time.perf_counter() - start)
    print(machine_description())
    print(f"load_csv of {len(parts.dataset):,} rows: {statistics.median(times):.2f} s "
          f"(median; {min(times):.2f}-{max(times):.2f})")


if __name__ == "__main__":
    main()
