"""Write GSM8K's train split as the JSONL file examples/qwen-gsm8k.toml names.

    pip install datasets
    python scripts/export_gsm8k.py --out data/gsm8k_train.jsonl

Needs network access to the Hugging Face hub once (or the dataset in the local cache). Each
line is `{"question": ..., "answer": ...}`; the answer keeps GSM8K's `reasoning #### 72`
form, of which the math task takes what follows the last `####` as the reference.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def write_rows(rows: Iterable[Mapping[str, Any]], out: Path) -> int:
    """Write the rows' question and answer fields as JSONL; returns how many."""
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({"question": row["question"], "answer": row["answer"]}) + "\n")
            count += 1
    tmp.replace(out)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/gsm8k_train.jsonl"))
    parser.add_argument("--split", default="train", help="train or test")
    args = parser.parse_args()
    try:
        from datasets import load_dataset
    except ImportError:
        raise SystemExit("error: this script needs datasets: pip install datasets") from None
    rows = load_dataset("openai/gsm8k", "main", split=args.split)
    print(f"wrote {write_rows(rows, args.out)} problems to {args.out}")


if __name__ == "__main__":
    main()
