"""Arrow codec in both containers (Arrow IPC, Parquet): exact round trips (property tests
over dtypes, ranks and ragged lengths), zero-copy reads, and errors naming the key or path."""

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.codec import (
    CodecError,
    batch_from_bytes,
    batch_to_bytes,
    batch_to_table,
    read_batch,
    table_to_batch,
    write_batch,
)
from nemo_rl_core.storage.containers import FORMATS, SUFFIXES

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(_BITS[tensor.element_size()])


def _random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random bit patterns (NaNs, infinities, -0.0 included) of the given dtype."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, size), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


def assert_identical(expected: object, actual: object, where: str = "batch") -> None:
    """Same type, and for tensors the same dtype, shape and bits."""
    assert type(actual) is type(expected), where
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, where
        assert actual.shape == expected.shape, where
        assert torch.equal(_bits(actual), _bits(expected)), where
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_identical(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), where
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_identical(e, a, f"{where}[{i}]")
    elif isinstance(expected, float) and expected != expected:
        assert actual != actual, where
    else:
        assert actual == expected, where


def _round_trip(batch: BatchedDataDict, fmt: str) -> BatchedDataDict:
    return batch_from_bytes(batch_to_bytes(batch, format=fmt))


each_format = pytest.mark.parametrize("fmt", FORMATS)


@each_format
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_dense_tensors_round_trip_bit_exact(
    fmt: str, dtype: torch.dtype, shape: list[int], seed: int
) -> None:
    batch = BatchedDataDict(x=_random_tensor(tuple(shape), dtype, seed))
    out = _round_trip(batch, fmt)
    assert_identical(batch.data, out.data)


@each_format
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    extra_width=st.integers(0, 3),
    trailing=st.lists(st.integers(1, 3), max_size=2),
    seed=st.integers(0, 2**31 - 1),
)
def test_right_padded_tensors_are_stored_ragged_and_restored_exactly(
    fmt: str,
    dtype: torch.dtype,
    lengths: list[int],
    extra_width: int,
    trailing: list[int],
    seed: int,
) -> None:
    width = max(lengths) + extra_width
    values = _random_tensor((len(lengths), width, *trailing), dtype, seed)
    pad = _random_tensor((1,), dtype, seed + 1)[0]
    for row, length in enumerate(lengths):
        values[row, length:] = pad
    batch = BatchedDataDict(input_ids=values, input_lengths=torch.tensor(lengths))
    table = batch_to_table(batch)
    assert pa.types.is_large_list(table.schema.field("input_ids").type)
    stored = table.column("input_ids").combine_chunks().values
    assert len(stored) == sum(lengths) * int(np.prod(trailing or [1]))  # no padding stored
    assert_identical(batch.data, _round_trip(batch, fmt).data)


def test_non_constant_padding_falls_back_to_dense_and_stays_exact() -> None:
    batch = BatchedDataDict(
        logprobs=torch.randn(3, 5), input_lengths=torch.tensor([2, 5, 0]), tokens=[[1], [], [2, 3]]
    )
    table = batch_to_table(batch)
    assert pa.types.is_fixed_size_list(table.schema.field("logprobs").type)
    assert_identical(batch.data, _round_trip(batch, "arrow").data)
    with pytest.raises(CodecError, match="'logprobs'.*'input_lengths'"):
        batch_to_table(batch, lengths_keys={"logprobs": "input_lengths"})
    with pytest.raises(CodecError, match="'nope'"):
        batch_to_table(batch, lengths_keys={"logprobs": "nope"})


_json_leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=5)
_json_leaf |= st.floats(allow_nan=True, allow_infinity=True)
_small_tensor = st.builds(
    _random_tensor,
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.sampled_from(DTYPES),
    st.integers(0, 1000),
)
_python_value = st.recursive(
    _json_leaf | _small_tensor,
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@each_format
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_python_value, min_size=0, max_size=5))
def test_lists_of_python_values_round_trip(fmt: str, values: list) -> None:
    batch = BatchedDataDict(meta=values)
    assert_identical(batch.data, _round_trip(batch, fmt).data)


@each_format
@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6), min_size=1, max_size=6)
)
def test_nested_ragged_lists_round_trip(fmt: str, rows: list[list[int]]) -> None:
    batch = BatchedDataDict(token_lists=rows, width=torch.tensor([len(r) for r in rows]))
    assert_identical(batch.data, _round_trip(batch, fmt).data)


def _message_log_batch() -> BatchedDataDict:
    logs = []
    for i in range(3):
        prompt = torch.arange(4 + i)
        response = torch.arange(2 * i)
        logs.append(
            [
                {"role": "system", "content": "be brief", "token_ids": torch.tensor([1, 2])},
                {"role": "user", "content": f"q{i}", "token_ids": prompt},
                {
                    "role": "assistant",
                    "content": "é" * i,
                    "token_ids": response,
                    "generation_logprobs": torch.randn(2 * i),
                },
            ]
        )
    return BatchedDataDict(
        message_log=logs,
        extra_env_info=[
            {"ground_truth": "4", "nested": {"k": [1, 2.5, None]}},
            {"__tensor__": ["float32", [1], 0]},  # looks like the codec's own markers
            {"__dict__": {"__tuple__": [1]}},
        ],
        task_name=["math", "math", "code"],
        loss_multiplier=[1.0, 0.0, 1.0],
        idx=[0, 1, 2],
        truncated=[False, True, False],
        rewards=torch.tensor([1.0, 0.0, 0.5]),
    )


@pytest.mark.parametrize(
    ("name", "magic"), [("b.parquet", b"PAR1"), ("b.arrow", b"ARROW1\0\0"), ("b", b"ARROW1\0\0")]
)
def test_the_container_follows_the_path_and_is_detected_on_read(
    tmp_path: Path, name: str, magic: bytes
) -> None:
    batch = _message_log_batch()
    write_batch(batch, tmp_path / name)
    assert (tmp_path / name).read_bytes()[: len(magic)] == magic
    out = read_batch(tmp_path / name)
    assert isinstance(out, BatchedDataDict)
    assert_identical(batch.data, out.data)
    write_batch(batch, tmp_path / name, format="parquet")  # an explicit format wins
    assert (tmp_path / name).read_bytes()[:4] == b"PAR1"
    assert_identical(batch.data, read_batch(tmp_path / name).data)


@each_format
def test_file_objects_and_filesystems_are_accepted(tmp_path: Path, fmt: str) -> None:
    import fsspec

    batch = _message_log_batch()
    buffer = io.BytesIO()
    write_batch(batch, buffer, format=fmt)
    buffer.seek(0)
    assert_identical(batch.data, read_batch(buffer).data)
    fs = fsspec.filesystem("file")
    path = str(tmp_path / f"fs{SUFFIXES[fmt]}")
    write_batch(batch, path, filesystem=fs)
    assert_identical(batch.data, read_batch(path, filesystem=fs).data)
    assert_identical(batch.data, read_batch(f"file://{path}").data)


@each_format
def test_empty_batch_round_trips(fmt: str) -> None:
    assert dict(_round_trip(BatchedDataDict(), fmt)) == {}
    batch = BatchedDataDict(x=torch.zeros(0, 3), names=[])
    assert_identical(batch.data, _round_trip(batch, fmt).data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_fixed_size_tensors_are_zero_copy_views_of_the_arrow_buffer(dtype: torch.dtype) -> None:
    batch = BatchedDataDict(x=_random_tensor((4, 3, 2), dtype, 0), y=_random_tensor((4,), dtype, 1))
    table = batch_to_table(batch)
    out = table_to_batch(table)
    for key in ("x", "y"):
        array = table.column(key).chunk(0)
        values = array.flatten() if pa.types.is_fixed_size_list(array.type) else array
        assert out[key].data_ptr() == values.buffers()[1].address, key
    assert_identical(batch.data, out.data)


def test_arrow_ipc_reads_are_zero_copy_views_of_the_bytes() -> None:
    batch = _message_log_batch()
    batch["dense"] = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    data = batch_to_bytes(batch, format="arrow")
    out = batch_from_bytes(data)
    start = np.frombuffer(data, np.uint8).ctypes.data
    views = [out["dense"], out["rewards"], out["message_log"][2][2]["generation_logprobs"]]
    for tensor in views:
        assert start <= tensor.data_ptr() < start + len(data)
    assert_identical(batch.data, out.data)


@each_format
def test_a_read_from_a_memory_mapped_file_survives_the_file_being_rewritten(
    tmp_path: Path, fmt: str
) -> None:
    """Local paths are memory-mapped copy-on-write on read and replaced by rename on write:
    writing to decoded tensors never reaches the file, rewriting the file never the tensors."""
    batch = _message_log_batch()
    batch["dense"] = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    path = tmp_path / f"b{SUFFIXES[fmt]}"
    write_batch(batch, path)
    out = read_batch(path)
    out["dense"] += 1.0
    out["message_log"][0][1]["token_ids"].zero_()
    assert_identical(batch.data, read_batch(path).data)
    out = read_batch(path)
    other = _message_log_batch()  # other random logprobs
    other["dense"] = torch.full((3, 4), -1.0)
    write_batch(other, path)
    assert_identical(batch.data, out.data)


# ---- bad input ------------------------------------------------------------------------


def test_damaged_metadata_record_raises_instead_of_decoding_another_shape() -> None:
    table = batch_to_table(BatchedDataDict(x=torch.zeros(2, 3)))
    record = table.schema.metadata[b"nemo_rl_core.batch"]
    assert b"[2, 3]" in record
    widened = record.replace(b"[2, 3]", b"[2, 7]")
    damaged = table.replace_schema_metadata(
        {**table.schema.metadata, b"nemo_rl_core.batch": widened}
    )
    with pytest.raises(CodecError, match="damaged.*CRC"):
        table_to_batch(damaged)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.uint16, torch.float8_e4m3fn])
def test_unsupported_dtype_names_the_key(dtype: torch.dtype) -> None:
    with pytest.raises(CodecError, match="'weird'.*unsupported dtype"):
        batch_to_table(BatchedDataDict(weird=torch.zeros(2, 2).to(dtype)))
    with pytest.raises(CodecError, match=r"msgs\[1\]\[0\]\['t'\]"):
        batch_to_table(BatchedDataDict(msgs=[[], [{"t": torch.zeros(2).to(dtype)}]]))


def test_non_batch_first_and_mismatched_sizes_name_the_keys() -> None:
    with pytest.raises(CodecError, match="'scalar'.*0-d"):
        batch_to_table(BatchedDataDict(scalar=torch.tensor(1.0)))
    with pytest.raises(CodecError, match="'a'.*'b'|'b'.*'a'"):
        batch_to_table(BatchedDataDict(a=torch.zeros(2), b=[1, 2, 3]))
    with pytest.raises(CodecError, match="'obj'.*set"):
        batch_to_table(BatchedDataDict(obj={1, 2}))
    with pytest.raises(CodecError, match=r"meta\[0\].*dict key 3"):
        batch_to_table(BatchedDataDict(meta=[{3: "x"}]))
    with pytest.raises(CodecError, match=r"meta\[0\].*object"):
        batch_to_table(BatchedDataDict(meta=[object()]))


def _big_batch_file(tmp_path: Path, fmt: str) -> Path:
    path = tmp_path / f"big{SUFFIXES[fmt]}"
    write_batch(BatchedDataDict(x=torch.arange(20000, dtype=torch.float32).reshape(100, 200)), path)
    return path


@pytest.mark.parametrize(
    ("fmt", "damage"),
    [
        *[(fmt, damage) for fmt in FORMATS for damage in ("truncate", "garbage", "empty")],
        ("parquet", "flip_data"),  # Arrow IPC has no value checksums (see containers)
    ],
)
def test_damaged_file_raises_codec_error_naming_the_path(
    tmp_path: Path, fmt: str, damage: str
) -> None:
    path = _big_batch_file(tmp_path, fmt)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip_data":
        data[len(data) // 2] ^= 0x40  # inside the tensor's data page
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"not parquet at all" * 10)
    path.write_bytes(bytes(data))
    with pytest.raises(CodecError, match=path.name):
        read_batch(path)
    with pytest.raises(CodecError, match="s3://b/x.batch"):
        batch_from_bytes(bytes(data), source="s3://b/x.batch")


def _structure(batch: BatchedDataDict) -> list[tuple]:
    return [
        (key, value.dtype, tuple(value.shape)) if isinstance(value, torch.Tensor) else (key,)
        for key, value in batch.items()
    ]


def test_damaged_arrow_ipc_raises_or_keeps_the_written_structure() -> None:
    """A truncated Arrow IPC file always raises; a flipped byte anywhere either raises
    ``CodecError`` or decodes to the written keys, dtypes and shapes (values may differ:
    Arrow IPC has no value checksums), never to other shapes or a crash."""
    batch = _message_log_batch()
    batch["input_ids"] = torch.tensor([[5, 6, 0], [7, 0, 0], [1, 2, 3]])
    batch["input_lengths"] = torch.tensor([2, 1, 3])
    data = batch_to_bytes(batch, format="arrow")
    for end in range(0, len(data), max(1, len(data) // 50)):
        with pytest.raises(CodecError, match="cut"):
            batch_from_bytes(data[:end], source="cut")
    raised = 0
    for position in range(0, len(data), 3):  # every third byte: ~1 s
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        try:
            out = batch_from_bytes(bytes(damaged), source="flipped")
        except CodecError as exc:
            assert "flipped" in str(exc)
            raised += 1
            continue
        assert _structure(out) == _structure(batch), position
    assert raised > len(data) // 30  # the structural checks do catch damage


def test_ragged_rows_that_do_not_fit_the_recorded_shape_raise_naming_the_column() -> None:
    """Rows are copied into one flat buffer: a row longer than the width must not spill."""
    lengths = torch.tensor([3, 1])
    batch = BatchedDataDict(input_ids=torch.tensor([[1, 2, 3], [4, 0, 0]]), input_lengths=lengths)
    table = batch_to_table(batch)
    metadata = json.loads(table.schema.metadata[b"nemo_rl_core.batch"])
    assert metadata["columns"]["input_ids"]["layout"] == "ragged"
    metadata["columns"]["input_ids"]["shape"] = [2, 2]
    narrowed = table.replace_schema_metadata({b"nemo_rl_core.batch": json.dumps(metadata)})
    with pytest.raises(CodecError, match=r"'input_ids'.*width 2"):
        table_to_batch(narrowed)


def test_unknown_version_and_foreign_files_raise_codec_error(tmp_path: Path) -> None:
    table = batch_to_table(BatchedDataDict(x=torch.zeros(2)))
    metadata = json.loads(table.schema.metadata[b"nemo_rl_core.batch"])
    metadata["version"] = 99
    future = table.replace_schema_metadata({b"nemo_rl_core.batch": json.dumps(metadata)})
    pq.write_table(future, tmp_path / "future.parquet")
    with pytest.raises(CodecError, match=r"future\.parquet.*version 99"):
        read_batch(tmp_path / "future.parquet")
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "foreign.parquet")
    with pytest.raises(CodecError, match=r"foreign\.parquet.*metadata"):
        read_batch(tmp_path / "foreign.parquet")
    with pytest.raises(FileNotFoundError):
        read_batch(tmp_path / "missing.parquet")


def test_codec_writes_and_reads_through_an_s3_filesystem(s3_server, s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_server.storage_options)
    batch = _message_log_batch()
    write_batch(batch, f"{s3_bucket}/direct/batch.parquet", filesystem=fs)
    assert_identical(
        batch.data, read_batch(f"{s3_bucket}/direct/batch.parquet", filesystem=fs).data
    )
    fs.pipe_file(f"{s3_bucket}/direct/broken.parquet", b"PAR1 not really")
    with pytest.raises(CodecError, match="broken.parquet"):
        read_batch(f"{s3_bucket}/direct/broken.parquet", filesystem=fs)


@pytest.mark.parametrize("padding", ["constant", "varied"])
def test_narrow_and_wide_rows_are_cut_to_the_same_bytes(
    padding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Narrow rows are cut with one mask, wide ones row by row: the file is the same."""
    from nemo_rl_core.storage import codec

    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([0, 3, 7, 5])
    ids = torch.randint(0, 50, (4, 7), generator=generator)
    pairs = torch.randn(4, 7, 2, generator=generator)
    for row, n in enumerate(lengths.tolist()):
        ids[row, n:] = -1
        pairs[row, n:] = 0.5
    if padding == "varied":
        ids[1, 5] = 9  # not one padding value: stored dense by both
    batch = BatchedDataDict(input_ids=ids, pairs=pairs, input_lengths=lengths)
    masked = batch_to_bytes(batch)
    monkeypatch.setattr(codec, "_MASKED_ROW_LIMIT", 0)
    assert batch_to_bytes(batch) == masked
    metadata = json.loads(batch_to_table(batch).schema.metadata[b"nemo_rl_core.batch"])
    layouts = {key: spec.get("layout") for key, spec in metadata["columns"].items()}
    ragged = "ragged" if padding == "constant" else "dense"
    assert layouts["input_ids"] == ragged and layouts["pairs"] == "ragged"
    restored = batch_from_bytes(masked)
    assert torch.equal(restored["input_ids"], ids) and torch.equal(restored["pairs"], pairs)
