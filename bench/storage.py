"""Throughput of stage outputs through the Parquet codec vs a raw byte copy of equal size.

A rollout batch like a GRPO generate/logprob stage writes (ragged int64 input_ids,
float32 logprob tensors padded beyond the lengths, per-sample message logs with tensors
inside) goes through the codec to local disk and through ``RunStorage`` to local disk and
to an S3 server (moto, started here), beside raw bytes of the same size written and read
the same way in the same run. Prints medians and codec/raw ratios.

    .venv/bin/python bench/storage.py            # ~100 MB batch, 5 runs each
    .venv/bin/python bench/storage.py --smoke    # tiny, a few seconds (CI)
"""

import argparse
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
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


def paired_medians(
    codec: Callable[[], object], raw: Callable[[], object] | None, runs: int
) -> tuple[float, float | None]:
    """Median seconds of ``codec`` and ``raw``, run alternately so load swings hit both."""
    codec_times, raw_times = [], []
    for _ in range(runs):
        for fn, times in ((codec, codec_times), (raw, raw_times)):
            if fn is not None:
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
    return statistics.median(codec_times), statistics.median(raw_times) if raw_times else None


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
    """(target, op, codec seconds, raw seconds, bytes) per measured pair."""
    rows = []
    payload = batch_to_bytes(batch)
    size = len(payload)
    raw = os.urandom(size)

    enc, _ = paired_medians(lambda: batch_to_bytes(batch), None, runs)
    dec, _ = paired_medians(lambda: batch_from_bytes(payload), None, runs)
    rows.append(("memory (encode/decode only)", "write", enc, None, size))
    rows.append(("memory (encode/decode only)", "read", dec, None, size))

    with tempfile.TemporaryDirectory() as tmp:
        path, raw_path = Path(tmp) / "batch.parquet", Path(tmp) / "raw.bin"
        write_batch(batch, path)
        raw_path.write_bytes(raw)
        write = paired_medians(
            lambda: write_batch(batch, path), lambda: raw_path.write_bytes(raw), runs
        )
        read = paired_medians(lambda: read_batch(path), raw_path.read_bytes, runs)
        rows.append(("local disk, codec file", "write", *write, size))
        rows.append(("local disk, codec file", "read", *read, size))

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
            write = paired_medians(
                lambda s=storage: s.write_batch(0, "generate", batch),
                lambda s=storage, k=raw_key: s.fs.pipe_file(k, raw),
                runs,
            )
            read = paired_medians(
                lambda s=storage, r=ref: s.read_batch(r),
                lambda s=storage, k=raw_key: s.fs.cat_file(k),
                runs,
            )
            rows.append((label, "write", *write, size))
            rows.append((label, "read", *read, size))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny batch, 2 runs (CI)")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    samples, max_len, runs = (16, 128, 2) if args.smoke else (args.samples, args.max_len, args.runs)

    torch.set_num_threads(1)
    batch = rollout_batch(samples, max_len)
    print(
        f"cpu: {platform.processor() or platform.machine()}, cores: {os.cpu_count()}, runs: {runs}"
    )
    print(f"batch: {samples} samples x {max_len} max tokens, keys: {', '.join(batch)}")
    with moto_server() as s3_options:
        rows = bench_rows(batch, runs, s3_options)
    print(f"\nParquet size: {rows[0][4] / 1e6:.1f} MB (raw copies use the same size)\n")
    print(f"{'target':30} {'op':5} {'codec MB/s':>11} {'raw MB/s':>9} {'codec/raw time':>15}")
    for target, op, codec_s, raw_s, size in rows:
        raw_text = f"{size / raw_s / 1e6:9.0f}" if raw_s else f"{'-':>9}"
        ratio = f"{codec_s / raw_s:15.2f}" if raw_s else f"{'-':>15}"
        print(f"{target:30} {op:5} {size / codec_s / 1e6:11.0f} {raw_text} {ratio}")


if __name__ == "__main__":
    main()
