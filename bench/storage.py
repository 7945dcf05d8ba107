"""Throughput of stage outputs through the Parquet codec vs a raw byte copy of equal size.

A rollout batch like a GRPO generate/logprob stage writes (ragged int64 input_ids,
float32 logprob tensors padded beyond the lengths, per-sample message logs with tensors
inside) goes through the codec to local disk and through ``RunStorage`` to local disk and
to an S3 server (moto, started here), beside raw bytes of the same size written and read
the same way in the same run. Prints medians and codec/raw ratios of wall and CPU time;
reads are also compared with raw bytes that get the same integrity check as the codec's.

    .venv/bin/python bench/storage.py            # ~100 MB batch, 5 runs each
    .venv/bin/python bench/storage.py --smoke    # tiny, a few seconds (CI)
"""

import argparse
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage import codec
from nemo_rl_core.storage.codec import batch_from_bytes, batch_to_bytes, read_batch, write_batch
from nemo_rl_core.storage.run_storage import RunStorage


def rollout_batch(samples: int, max_len: int, seed: int = 0) -> BatchedDataDict:
    """A generate+logprob stage output: right-padded tensors and message logs."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max_len // 4, max_len + 1, (samples,), generator=gen)
    prompt_lengths = torch.randint(1, max_len // 4, (samples,), generator=gen)
    valid = torch.arange(max_len)[None, :] < lengths[:, None]
    ids = torch.randint(0, 49152, (samples, max_len), generator=gen).masked_fill(~valid, 0)

    def float_field() -> torch.Tensor:
        return torch.randn(samples, max_len, generator=gen).masked_fill(~valid, 0.0)

    logs = []
    for i in range(samples):
        prompt, total = int(prompt_lengths[i]), int(lengths[i])
        logs.append(
            [
                {"role": "user", "content": "Solve: " + "x" * 200, "token_ids": ids[i, :prompt]},
                {
                    "role": "assistant",
                    "content": "The answer is " + "y" * 400,
                    "token_ids": ids[i, prompt:total],
                    "generation_logprobs": torch.randn(total - prompt, generator=gen),
                },
            ]
        )
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=lengths,
        generation_logprobs=float_field(),
        prev_logprobs=float_field(),
        reference_policy_logprobs=float_field(),
        advantages=float_field(),
        token_mask=valid.clone(),
        sample_mask=torch.ones(samples),
        total_reward=torch.randn(samples, generator=gen),
        message_log=logs,
        extra_env_info=[{"ground_truth": str(i), "task": "math"} for i in range(samples)],
        task_name=["math"] * samples,
    )


def interleaved_medians(
    fns: dict[str, Callable[[], object]], runs: int
) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of each callable, run in turn so load swings hit all.

    CPU is the whole process's user+system time (all threads): on this shared machine a
    read() that copies in the kernel is rarely preempted while user-space decoding is, so
    wall ratios under load overstate the codec's cost and CPU ratios show the work done.
    """
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {
        name: (statistics.median(w for w, _ in pairs), statistics.median(c for _, c in pairs))
        for name, pairs in times.items()
    }


@contextmanager
def moto_server() -> Iterator[dict]:
    """A moto S3 server on a free local port; yields fsspec storage options."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(binary if binary.exists() else shutil.which("moto_server")), "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto_server did not start on {endpoint}")
        yield {
            "endpoint_url": endpoint,
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"region_name": "us-east-1"},
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bench_rows(batch: BatchedDataDict, runs: int, s3_options: dict) -> list[tuple]:
    """(target, op, codec (wall, cpu), raw (wall, cpu) or None) per measured pair.

    Reads are compared with raw bytes read the same way, and again with raw bytes that get
    the same integrity check the codec path does: CRC-32 (the page checksum's algorithm)
    for a codec file, sha256 for run storage.
    """
    rows = []
    payload = batch_to_bytes(batch)
    raw = os.urandom(len(payload))

    memory = interleaved_medians(
        {"write": lambda: batch_to_bytes(batch), "read": lambda: batch_from_bytes(payload)}, runs
    )
    rows.append(("memory (encode/decode only)", "write", memory["write"], None))
    rows.append(("memory (encode/decode only)", "read", memory["read"], None))

    with tempfile.TemporaryDirectory() as tmp:
        path, raw_path = Path(tmp) / "batch.parquet", Path(tmp) / "raw.bin"
        write_batch(batch, path)
        raw_path.write_bytes(raw)
        write = interleaved_medians(
            {"codec": lambda: write_batch(batch, path), "raw": lambda: raw_path.write_bytes(raw)},
            runs,
        )
        read = interleaved_medians(
            {
                "codec": lambda: read_batch(path),
                "codec, no CRC": lambda: read_batch(path, verify_checksums=False),
                "raw": raw_path.read_bytes,
                "raw + crc32": lambda: zlib.crc32(raw_path.read_bytes()),
            },
            runs,
        )
        rows.append(("local disk, codec file", "write", write["codec"], write["raw"]))
        rows.append(("local disk, codec file", "read", read["codec"], read["raw"]))
        rows.append(("  vs raw + crc32", "read", read["codec"], read["raw + crc32"]))
        rows.append(("  no page CRC vs raw", "read", read["codec, no CRC"], read["raw"]))

        for label, root, options in (
            ("local disk, RunStorage", f"file://{tmp}/store", None),
            ("S3 (moto), RunStorage", "s3://bench/root", s3_options),
        ):
            storage = RunStorage(root, "bench", storage_options=options)
            if options is not None:
                storage.fs.call_s3("create_bucket", Bucket="bench")
            raw_key = storage._path("raw.bin")
            storage.fs.makedirs(storage._path(""), exist_ok=True)
            ref = storage.write_batch(0, "generate", batch)
            storage.fs.pipe_file(raw_key, raw)
            write = interleaved_medians(
                {
                    "codec": lambda s=storage: s.write_batch(0, "generate", batch),
                    "raw": lambda s=storage, k=raw_key: s.fs.pipe_file(k, raw),
                },
                runs,
            )
            read = interleaved_medians(
                {
                    "codec": lambda s=storage, r=ref: s.read_batch(r),
                    "raw": lambda s=storage, k=raw_key: s.fs.cat_file(k),
                    "raw + sha256": lambda s=storage, k=raw_key: hashlib.sha256(s.fs.cat_file(k)),
                },
                runs,
            )
            rows.append((label, "write", write["codec"], write["raw"]))
            rows.append((label, "read", read["codec"], read["raw"]))
            rows.append(("  vs raw + sha256", "read", read["codec"], read["raw + sha256"]))
    return rows


def decode_profile(batch: BatchedDataDict, runs: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of each part of one local read: where the codec's time goes."""
    with tempfile.TemporaryDirectory() as tmp:
        path, raw_path = Path(tmp) / "batch.parquet", Path(tmp) / "raw.bin"
        write_batch(batch, path)
        raw_path.write_bytes(os.urandom(path.stat().st_size))
        table = pq.read_table(path)
        specs = json.loads(table.schema.metadata[codec.FORMAT_NAME.encode()])["columns"]
        groups: dict[str, list[str]] = {}
        for key, spec in specs.items():
            part = spec.get("layout", spec["kind"])
            groups.setdefault(f"Arrow -> batch: {part} columns", []).append(key)

        def decode(keys: list[str]) -> None:
            for key in keys:
                codec._decode_column(specs[key], table.column(key).chunk(0))

        parts: dict[str, Callable[[], object]] = {
            "raw file read": raw_path.read_bytes,
            "Parquet -> Arrow (mmap, page CRC)": lambda: pq.read_table(path, memory_map=True),
            "Parquet -> Arrow (mmap, no CRC)": lambda: pq.read_table(
                path, memory_map=True, page_checksum_verification=False
            ),
        }
        parts.update({name: lambda k=keys: decode(k) for name, keys in groups.items()})
        parts["read_batch (all of it)"] = lambda: read_batch(path)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return interleaved_medians(parts, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny batch, 2 runs (CI)")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="also time each part of a read")
    args = parser.parse_args()
    samples, max_len, runs = (16, 128, 2) if args.smoke else (args.samples, args.max_len, args.runs)

    torch.set_num_threads(1)
    batch = rollout_batch(samples, max_len)
    print(
        f"cpu: {platform.processor() or platform.machine()}, cores: {os.cpu_count()}, runs: {runs}"
    )
    print(f"batch: {samples} samples x {max_len} max tokens, keys: {', '.join(batch)}")
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with moto_server() as s3_options:
        rows = bench_rows(batch, runs, s3_options)
    profile = decode_profile(batch, runs) if args.profile else {}
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    size = len(batch_to_bytes(batch))
    print(f"\nParquet size: {size / 1e6:.1f} MB (raw copies use the same size)\n")
    print(
        f"{'target':30} {'op':5} {'codec MB/s':>11} {'raw MB/s':>9} "
        f"{'codec/raw wall':>15} {'codec/raw CPU':>14}"
    )
    for target, op, (codec_s, codec_cpu), raw_times in rows:
        raw_text, wall_ratio, cpu_ratio = f"{'-':>9}", f"{'-':>15}", f"{'-':>14}"
        if raw_times is not None:
            raw_s, raw_cpu = raw_times
            raw_text = f"{size / raw_s / 1e6:9.0f}"
            wall_ratio, cpu_ratio = f"{codec_s / raw_s:15.2f}", f"{codec_cpu / raw_cpu:14.2f}"
        print(
            f"{target:30} {op:5} {size / codec_s / 1e6:11.0f} {raw_text} {wall_ratio} {cpu_ratio}"
        )
    if profile:
        print(f"\n{'part of a local read':40} {'wall ms':>8} {'CPU ms':>7}")
        for part, (wall, cpu) in profile.items():
            print(f"{part:40} {wall * 1e3:8.1f} {cpu * 1e3:7.1f}")


if __name__ == "__main__":
    main()
