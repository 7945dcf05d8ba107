"""Throughput of stage outputs through the codec (Arrow IPC and Parquet containers) vs a
raw byte copy of equal size.

A rollout batch like a GRPO generate/logprob stage writes (ragged int64 input_ids,
float32 logprob tensors padded beyond the lengths, per-sample message logs with tensors
inside) goes through the codec in both containers to local disk and through
``RunStorage`` to local disk and to an S3 server (moto, started here), beside raw bytes
of each file's size written and read the same way in the same run. Prints medians and
codec/raw ratios of wall and CPU time; reads are also compared with raw bytes that get
the same integrity check as the codec's (Parquet page CRCs, RunStorage's sha256).

    .venv/bin/python bench/storage.py            # ~100 MB batch, 5 runs each
    .venv/bin/python bench/storage.py --profile  # also where a local read's time goes
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
from unittest import mock

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage import codec, fresh_memory
from nemo_rl_core.storage.codec import batch_from_bytes, batch_to_bytes, read_batch, write_batch
from nemo_rl_core.storage.containers import FORMATS, SUFFIXES, read_source, read_table
from nemo_rl_core.storage.run_storage import RunStorage

Times = tuple[float, float]  # median wall and CPU seconds
Row = tuple[str, str, int, Times, Times | None]  # target, op, bytes, codec, raw


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


def bench_rows(batch: BatchedDataDict, runs: int, s3_options: dict) -> list[Row]:
    """(target, op, bytes, codec times, raw times or None) per measured pair.

    Both containers and raw bytes of each container's size run in one interleaved loop
    per comparison. Reads are compared with raw bytes read the same way, and again with
    raw bytes that get the codec path's integrity check: CRC-32 (the page checksum's
    algorithm) for a Parquet file, sha256 for run storage (both containers).
    """
    rows: list[Row] = []
    payloads = {fmt: batch_to_bytes(batch, format=fmt) for fmt in FORMATS}
    raws = {fmt: os.urandom(len(payload)) for fmt, payload in payloads.items()}
    sizes = {fmt: len(payload) for fmt, payload in payloads.items()}

    fns: dict[str, Callable[[], object]] = {}
    for fmt in FORMATS:
        fns[f"{fmt} write"] = lambda f=fmt: batch_to_bytes(batch, format=f)
        fns[f"{fmt} read"] = lambda f=fmt: batch_from_bytes(payloads[f])
    memory = interleaved_medians(fns, runs)
    for fmt in FORMATS:
        for op in ("write", "read"):
            rows.append((f"memory, {fmt}", op, sizes[fmt], memory[f"{fmt} {op}"], None))

    with tempfile.TemporaryDirectory() as tmp:
        paths = {fmt: Path(tmp) / f"batch{SUFFIXES[fmt]}" for fmt in FORMATS}
        raw_paths = {fmt: Path(tmp) / f"raw-{fmt}.bin" for fmt in FORMATS}
        for fmt in FORMATS:
            write_batch(batch, paths[fmt])
            raw_paths[fmt].write_bytes(raws[fmt])
        fns = {}
        for fmt in FORMATS:
            fns[f"{fmt} codec"] = lambda f=fmt: write_batch(batch, paths[f])
            fns[f"{fmt} raw"] = lambda f=fmt: raw_paths[f].write_bytes(raws[f])
        write = interleaved_medians(fns, runs)
        fns = {}
        for fmt in FORMATS:
            fns[f"{fmt} codec"] = lambda f=fmt: read_batch(paths[f])
            fns[f"{fmt} raw"] = raw_paths[fmt].read_bytes
        fns["parquet codec, no CRC"] = lambda: read_batch(paths["parquet"], verify_checksums=False)
        fns["parquet raw + crc32"] = lambda: zlib.crc32(raw_paths["parquet"].read_bytes())
        read = interleaved_medians(fns, runs)
        for fmt in FORMATS:
            target, size = f"local disk, {fmt} file", sizes[fmt]
            rows.append((target, "write", size, write[f"{fmt} codec"], write[f"{fmt} raw"]))
            rows.append((target, "read", size, read[f"{fmt} codec"], read[f"{fmt} raw"]))
        parquet = sizes["parquet"]
        no_crc = read["parquet codec, no CRC"]
        rows.append(
            (
                "  parquet vs raw + crc32",
                "read",
                parquet,
                read["parquet codec"],
                read["parquet raw + crc32"],
            )
        )
        rows.append(("  parquet no page CRC", "read", parquet, no_crc, read["parquet raw"]))

        for label, root, options in (
            ("local disk, RunStorage", f"file://{tmp}/store", None),
            ("S3 (moto), RunStorage", "s3://bench/root", s3_options),
        ):
            rows += _storage_rows(label, root, options, batch, raws, runs)
    return rows


def _storage_rows(
    label: str,
    root: str,
    options: dict | None,
    batch: BatchedDataDict,
    raws: dict[str, bytes],
    runs: int,
) -> list[Row]:
    """RunStorage write/read of each container beside ``pipe_file``/``cat_file`` of raw
    bytes of the same size (and ``cat_file`` + sha256, the check every read does)."""
    stores = {fmt: RunStorage(root, "bench", options, batch_format=fmt) for fmt in FORMATS}
    fs = stores["arrow"].fs
    if options is not None:
        fs.call_s3("create_bucket", Bucket="bench")
    fs.makedirs(stores["arrow"].objects.path(""), exist_ok=True)
    raw_keys = {fmt: stores[fmt].objects.path(f"raw-{fmt}.bin") for fmt in FORMATS}
    refs = {}
    fns: dict[str, Callable[[], object]] = {}
    for fmt, store in stores.items():
        refs[fmt] = store.write_batch(0, "generate", batch)
        fs.pipe_file(raw_keys[fmt], raws[fmt])
        fns[f"{fmt} codec"] = lambda s=store: s.write_batch(0, "generate", batch)
        fns[f"{fmt} raw"] = lambda f=fmt: fs.pipe_file(raw_keys[f], raws[f])
    write = interleaved_medians(fns, runs)
    fns = {}
    for fmt, store in stores.items():
        fns[f"{fmt} codec"] = lambda s=store, r=refs[fmt]: s.read_batch(r)
        fns[f"{fmt} raw"] = lambda k=raw_keys[fmt]: fs.cat_file(k)
        fns[f"{fmt} raw + sha256"] = lambda k=raw_keys[fmt]: hashlib.sha256(fs.cat_file(k))
    read = interleaved_medians(fns, runs)
    rows: list[Row] = []
    for fmt in FORMATS:
        size, codec_read = len(raws[fmt]), read[f"{fmt} codec"]
        rows.append((f"{label}, {fmt}", "write", size, write[f"{fmt} codec"], write[f"{fmt} raw"]))
        rows.append((f"{label}, {fmt}", "read", size, codec_read, read[f"{fmt} raw"]))
        rows.append(("  vs raw + sha256", "read", size, codec_read, read[f"{fmt} raw + sha256"]))
    return rows


def decode_profile(batch: BatchedDataDict, runs: int) -> dict[str, Times]:
    """Median (wall, CPU) seconds of each part of one local read: where the codec's time goes.

    The column decodes start from the Arrow IPC table (zero-copy, so they include faulting
    in the mapped file); ragged columns are also decoded into 4 KiB pages populated by one
    ``mmap`` call, the fallback when the kernel has no free 2 MiB blocks for huge pages.
    """
    with tempfile.TemporaryDirectory() as tmp:
        paths = {fmt: Path(tmp) / f"batch{SUFFIXES[fmt]}" for fmt in FORMATS}
        for path in paths.values():
            write_batch(batch, path)
        raw_path = Path(tmp) / "raw.bin"
        raw_path.write_bytes(os.urandom(paths["arrow"].stat().st_size))
        table = read_table(read_source(paths["arrow"]))
        specs = json.loads(table.schema.metadata[codec.FORMAT_NAME.encode()])["columns"]
        groups: dict[str, list[str]] = {}
        for key, spec in specs.items():
            groups.setdefault(spec.get("layout", spec["kind"]), []).append(key)

        def decode(keys: list[str]) -> None:
            fresh = read_table(read_source(paths["arrow"]))  # a new map: faults counted
            for key in keys:
                codec._decode_column(specs[key], fresh.column(key).chunk(0))

        def small_pages(keys: list[str]) -> None:
            with mock.patch.object(fresh_memory, "_free_huge_block_bytes", return_value=0):
                decode(keys)

        parts: dict[str, Callable[[], object]] = {
            "raw file read (Arrow IPC size)": raw_path.read_bytes,
            "Arrow IPC -> Arrow (mmap, validated)": lambda: read_table(read_source(paths["arrow"])),
            "Parquet -> Arrow (mmap, page CRC)": lambda: read_table(read_source(paths["parquet"])),
            "Parquet -> Arrow (mmap, no CRC)": lambda: read_table(
                read_source(paths["parquet"]), verify_checksums=False
            ),
        }
        for part, keys in groups.items():
            parts[f"Arrow -> batch: {part} columns"] = lambda k=keys: decode(k)
        parts["  ragged, 4 KiB pages populated"] = lambda: small_pages(groups["ragged"])
        parts["read_batch, Arrow IPC (all of it)"] = lambda: read_batch(paths["arrow"])
        parts["read_batch, Parquet (all of it)"] = lambda: read_batch(paths["parquet"])
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
    for fmt in FORMATS:
        print(f"{fmt} file: {len(batch_to_bytes(batch, format=fmt)) / 1e6:.1f} MB", end="; ")
    print("raw copies use each file's size\n")
    print(
        f"{'target':34} {'op':5} {'codec MB/s':>10} {'raw MB/s':>8} {'codec ms wall/CPU':>17} "
        f"{'raw ms wall/CPU':>15} {'codec/raw wall':>14} {'codec/raw CPU':>13}"
    )
    for target, op, size, (codec_s, codec_cpu), raw_times in rows:
        codec_ms = f"{codec_s * 1e3:.0f}/{codec_cpu * 1e3:.0f}"
        raw_text, raw_ms, wall_ratio, cpu_ratio = f"{'-':>8}", "-", f"{'-':>14}", f"{'-':>13}"
        if raw_times is not None:
            raw_s, raw_cpu = raw_times
            raw_text, raw_ms = (
                f"{size / raw_s / 1e6:8.0f}",
                f"{raw_s * 1e3:.0f}/{raw_cpu * 1e3:.0f}",
            )
            wall_ratio, cpu_ratio = f"{codec_s / raw_s:14.2f}", f"{codec_cpu / raw_cpu:13.2f}"
        print(
            f"{target:34} {op:5} {size / codec_s / 1e6:10.0f} {raw_text} {codec_ms:>17} "
            f"{raw_ms:>15} {wall_ratio} {cpu_ratio}"
        )
    if profile:
        print(f"\n{'part of a local read':40} {'wall ms':>8} {'CPU ms':>7}")
        for part, (wall, cpu) in profile.items():
            print(f"{part:40} {wall * 1e3:8.1f} {cpu * 1e3:7.1f}")


if __name__ == "__main__":
    main()
