"""Encoding a stage output: right-padded tensors cut at their lengths with one [B, W] mask
vs row by row, side by side, on a small and a large rollout batch (bench/storage.py's).

The codec cuts rows of up to ``_MASKED_ROW_LIMIT`` values with the mask and wider ones
row by row; this shows both ways on both sizes, so the limit can be checked where it
sits. The bytes are the same either way (checked here too).

    .venv/bin/python bench/codec_cut.py
    .venv/bin/python bench/codec_cut.py --smoke   # one small batch, 2 runs (CI)
"""

import argparse
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from storage import interleaved_medians, rollout_batch  # noqa: E402

from nemo_rl_core.storage import codec  # noqa: E402

SIZES = ((256, 133), (1024, 4096))  # the overhead bench's 16x16 batch; bench/storage.py's


def encode_with(limit: int, batch: object) -> bytes:
    with mock.patch.object(codec, "_MASKED_ROW_LIMIT", limit):
        return codec.batch_to_bytes(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    sizes, runs = (((32, 40),), 2) if args.smoke else (SIZES, args.runs)
    print(f"median of {runs}, wall/CPU ms; the codec's limit: {codec._MASKED_ROW_LIMIT} values")
    for samples, max_len in sizes:
        batch = rollout_batch(samples, max_len)
        everything = max_len + 1  # every row narrower than this: the mask
        assert encode_with(everything, batch) == encode_with(0, batch), "the cuts differ"
        times = interleaved_medians(
            {
                "mask": lambda b=batch, limit=everything: encode_with(limit, b),
                "row by row": lambda b=batch: encode_with(0, b),
            },
            runs,
        )
        (mask_wall, mask_cpu), (rows_wall, rows_cpu) = times["mask"], times["row by row"]
        print(
            f"{samples} x {max_len}: mask {mask_wall * 1e3:.1f}/{mask_cpu * 1e3:.1f}, row by row "
            f"{rows_wall * 1e3:.1f}/{rows_cpu * 1e3:.1f}, mask/rows wall {mask_wall / rows_wall:.2f}"
        )


if __name__ == "__main__":
    main()
