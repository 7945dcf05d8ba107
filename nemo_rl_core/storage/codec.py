"""Arrow codec for ``BatchedDataDict``: the one on-disk format of stage outputs.

Every key becomes one column. Tensors keep their exact dtype, shape and bits:
fixed-size rows are stored flat (primitive or fixed-size-list columns) so reading them
back is a numpy view of the Arrow buffer; right-padded rows whose true length is given
by a lengths key (``input_lengths`` and friends) are stored as list columns without
the padding, and the pad value and width come back exactly on read. Lists of Python
values (strings, numbers, message logs with tensors inside, nested metadata) are
stored as JSON text with their tensors as raw bytes beside it, one list of blobs per
dtype, so a reader cuts all tensors of a dtype out of one buffer in one call.

The schema metadata records every column's dtype, shape and layout plus a format
version and a CRC-32 of that record, so a reader of another version or a damaged file
fails with ``CodecError`` naming the path instead of returning wrong shapes.

One table, two file containers (``containers``): Arrow IPC, read zero-copy from a memory
map, for stage handoff; Parquet for export and analytics. Readers detect which one.
"""

import json
import math
import mmap
import os
import uuid
import warnings
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.containers import (
    ARROW,
    BatchFormat,
    check_format,
    format_for_path,
    read_source,
    read_table,
    write_table,
)
from nemo_rl_core.storage.fresh_memory import zeroed

FORMAT_NAME = "nemo_rl_core.batch"
FORMAT_VERSION = 2  # 2: non-null fields, message-log tensors grouped by dtype
_METADATA_KEY = FORMAT_NAME.encode()
# CRC-32 of the metadata record: a flipped digit in a shape must not decode as another shape.
# Optional on read, as files written before it have none.
_METADATA_CRC_KEY = f"{FORMAT_NAME}.crc32".encode()

# Keys that NeMo RL uses for the true length of right-padded [B, S, ...] tensors, tried in
# this order when the caller does not say which tensor is measured by which key.
DEFAULT_LENGTHS_KEYS = ("input_lengths", "unpadded_sequence_lengths", "generation_lengths")

# torch dtype -> (name in metadata, numpy dtype Arrow stores, torch dtype of that numpy dtype)
_TENSOR_DTYPES: dict[torch.dtype, tuple[str, np.dtype, torch.dtype]] = {
    torch.float64: ("float64", np.dtype(np.float64), torch.float64),
    torch.float32: ("float32", np.dtype(np.float32), torch.float32),
    torch.float16: ("float16", np.dtype(np.float16), torch.float16),
    torch.bfloat16: ("bfloat16", np.dtype(np.int16), torch.int16),  # Arrow has no bfloat16
    torch.int64: ("int64", np.dtype(np.int64), torch.int64),
    torch.int32: ("int32", np.dtype(np.int32), torch.int32),
    torch.int16: ("int16", np.dtype(np.int16), torch.int16),
    torch.int8: ("int8", np.dtype(np.int8), torch.int8),
    torch.uint8: ("uint8", np.dtype(np.uint8), torch.uint8),
    torch.bool: ("bool", np.dtype(np.uint8), torch.uint8),  # bytes, so reads stay zero-copy
}
_DTYPE_BY_NAME = {name: dtype for dtype, (name, _, _) in _TENSOR_DTYPES.items()}
_SUPPORTED = "convert it to one of " + ", ".join(_DTYPE_BY_NAME)
# Integer dtype of the same width, used to compare and restore padding bit for bit.
_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

_TENSOR_MARK = "__tensor__"
_TUPLE_MARK = "__tuple__"
_DICT_MARK = "__dict__"
_MARKS = (_TENSOR_MARK, _TUPLE_MARK, _DICT_MARK)
# Non-null fields: Parquet then stores no definition levels for values, and list columns
# read ~1.7x faster than with nullable fields.
_BLOB_LISTS = pa.large_list(pa.field("item", pa.large_binary(), nullable=False))


class CodecError(ValueError):
    """A batch cannot be encoded (names the key) or a file cannot be decoded (names the path)."""


def batch_to_table(
    batch: Mapping[str, Any], lengths_keys: Mapping[str, str] | None = None
) -> pa.Table:
    """Encode a batch as an Arrow table whose schema metadata describes every column.

    ``lengths_keys`` maps a right-padded tensor key to the key holding its true lengths;
    those tensors must have a constant pad beyond the lengths. Without it, tensors of
    rank >= 2 are stored ragged whenever one of ``DEFAULT_LENGTHS_KEYS`` measures them
    and their padding is constant, and dense otherwise, so the round trip is always exact.
    """
    data = batch.data if isinstance(batch, BatchedDataDict) else dict(batch)
    size = _batch_size(data)
    for key, lengths_key in (lengths_keys or {}).items():
        for name in (key, lengths_key):
            if name not in data:
                raise CodecError(f"lengths_keys names key {name!r}, which is not in the batch")
    columns: dict[str, pa.Array] = {}
    specs: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            columns[key], specs[key] = _encode_tensor(key, value, data, lengths_keys)
        else:
            columns[key], specs[key] = _encode_list(key, value)
    metadata = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "size": size,
        "columns": specs,
    }
    record = json.dumps(metadata).encode()
    schema = pa.schema(
        [_field(key, array.type) for key, array in columns.items()],
        metadata={_METADATA_KEY: record, _METADATA_CRC_KEY: str(zlib.crc32(record)).encode()},
    )
    if not columns:
        return pa.Table.from_batches([], schema)
    return pa.Table.from_arrays(list(columns.values()), schema=schema)


def _field(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=pa.types.is_null(type_))


def _non_null_list(values: pa.Array, list_size: int | None = None) -> pa.DataType:
    item = _field("item", values.type)
    return pa.large_list(item) if list_size is None else pa.list_(item, list_size)


def table_to_batch(table: pa.Table, source: str = "<table>") -> BatchedDataDict:
    """Decode a table written by ``batch_to_table``; ``source`` names it in errors."""
    metadata = _read_metadata(table.schema, source)
    batch: BatchedDataDict[Any] = BatchedDataDict()
    with warnings.catch_warnings():
        # Arrow buffers are read-only to numpy, but tensors over them may be written: they
        # are fresh Arrow memory (Parquet), the caller's bytes or a copy-on-write file map.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for key, spec in metadata["columns"].items():
            if key not in table.column_names:
                raise CodecError(f"{source}: column {key!r} listed in the metadata is missing")
            column = table.column(key)
            try:
                array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
                batch[key] = _decode_column(spec, array)
            except (LookupError, TypeError, ValueError, pa.ArrowException, RuntimeError) as exc:
                raise CodecError(f"{source}: column {key!r} cannot be decoded: {exc}") from exc
    return batch


def write_batch(
    batch: Mapping[str, Any],
    path_or_file: str | Path | IO[bytes],
    filesystem: Any = None,
    lengths_keys: Mapping[str, str] | None = None,
    format: BatchFormat | None = None,
) -> None:
    """Write a batch as one file: Arrow IPC, or Parquet (one row group, page CRCs on).

    ``format`` defaults to Parquet for a ``.parquet`` path and Arrow IPC otherwise. A local
    path is replaced by rename, never rewritten in place: batches read earlier may still
    view the old file's memory map. ``filesystem`` is an fsspec filesystem for the path.
    """
    fmt = check_format(format or format_for_path(_name_of(path_or_file)))
    table = batch_to_table(batch, lengths_keys)
    if filesystem is not None:
        with filesystem.open(str(path_or_file), "wb") as file:
            write_table(table, file, fmt)
    elif isinstance(path_or_file, str | Path) and "://" not in str(path_or_file):
        _replace_local(Path(path_or_file), lambda tmp: write_table(table, str(tmp), fmt))
    else:
        write_table(table, path_or_file, fmt)


def read_batch(
    path_or_file: str | Path | IO[bytes], filesystem: Any = None, verify_checksums: bool = True
) -> BatchedDataDict:
    """Read a batch written by ``write_batch`` (either container); a damaged or foreign
    file raises ``CodecError`` naming it.

    ``verify_checksums`` checks Parquet's page CRCs; turn it off only when the bytes were
    already verified as a whole (as run storage does with sha256). A local path is
    memory-mapped copy-on-write: Arrow IPC tensors that need no re-padding (dense columns,
    tensors inside message logs) stay views of the map, so the file must not be changed
    in place while the batch lives (``write_batch`` replaces files by rename).
    """
    source = _name_of(path_or_file)
    try:
        data = read_source(path_or_file, filesystem)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CodecError(f"{source}: cannot be read ({exc})") from exc
    return batch_from_bytes(data, source, verify_checksums)


def batch_to_bytes(
    batch: Mapping[str, Any],
    lengths_keys: Mapping[str, str] | None = None,
    format: BatchFormat = ARROW,
) -> bytes:
    """The file bytes of a batch (Arrow IPC unless ``format`` says Parquet), for stores
    that put whole objects."""
    sink = pa.BufferOutputStream()
    write_table(batch_to_table(batch, lengths_keys), sink, check_format(format))
    return sink.getvalue().to_pybytes()


def batch_from_bytes(
    data: bytes | memoryview | mmap.mmap,
    source: str = "<bytes>",
    verify_checksums: bool = True,
) -> BatchedDataDict:
    """Decode the bytes of either container; ``source`` names them in errors. Arrow IPC
    tensors that need no re-padding stay views of ``data`` (writing to them writes there)."""
    try:
        table = read_table(data, verify_checksums)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CodecError(f"{source}: not a readable batch file ({exc}); rewrite it") from exc
    return table_to_batch(table, source)


def _replace_local(path: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)`` on a temporary sibling of ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _name_of(file: Any) -> str:
    if isinstance(file, str | Path):
        return str(file)
    return str(getattr(file, "name", None) or getattr(file, "path", None) or "<file>")


def _batch_size(data: Mapping[str, Any]) -> int:
    sizes: dict[str, int] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise CodecError(f"key {key!r} is not a string; batch keys must be strings")
        if isinstance(value, torch.Tensor):
            if value.dim() == 0:
                raise CodecError(f"key {key!r} holds a 0-d tensor; values must be batch-first")
            sizes[key] = value.shape[0]
        elif isinstance(value, list):
            sizes[key] = len(value)
        else:
            raise CodecError(
                f"key {key!r} holds {type(value).__name__}; expected a tensor or a list"
            )
    if len(set(sizes.values())) > 1:
        raise CodecError(f"keys have different batch sizes: {sizes}")
    return next(iter(sizes.values()), 0)


# ---- tensors -------------------------------------------------------------------------


def _dtype_info(key: str, tensor: torch.Tensor) -> tuple[str, np.dtype, torch.dtype]:
    try:
        return _TENSOR_DTYPES[tensor.dtype]
    except KeyError:
        raise CodecError(
            f"key {key!r} has unsupported dtype {tensor.dtype}; {_SUPPORTED}"
        ) from None


def _to_numpy(key: str, tensor: torch.Tensor) -> np.ndarray:
    """The tensor's values as the numpy dtype Arrow stores (a view when already on CPU)."""
    _, _, storage_dtype = _dtype_info(key, tensor)
    return _cpu_flat(tensor, storage_dtype).numpy()


def _tensor_bytes(tensor: torch.Tensor, storage_dtype: torch.dtype) -> bytes:
    return _cpu_flat(tensor, storage_dtype).numpy().tobytes()


def _cpu_flat(tensor: torch.Tensor, storage_dtype: torch.dtype) -> torch.Tensor:
    """The tensor as a flat, contiguous CPU tensor of ``storage_dtype`` (a view where it can
    be: message logs hold thousands of small tensors, each already flat on the CPU)."""
    if tensor.requires_grad or not tensor.is_cpu or not tensor.is_contiguous():
        tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype != storage_dtype:
        tensor = tensor.view(storage_dtype)
    return tensor.view(-1) if tensor.dim() != 1 else tensor


def _encode_tensor(
    key: str,
    tensor: torch.Tensor,
    data: Mapping[str, Any],
    lengths_keys: Mapping[str, str] | None,
) -> tuple[pa.Array, dict[str, Any]]:
    name, _, _ = _dtype_info(key, tensor)
    spec: dict[str, Any] = {"kind": "tensor", "dtype": name, "shape": list(tensor.shape)}
    if lengths_keys is not None and key in lengths_keys:
        lengths_key = lengths_keys[key]
        ragged = _try_ragged(key, tensor, lengths_key, data[lengths_key])
        if ragged is None:
            raise CodecError(
                f"key {key!r} cannot be stored ragged by {lengths_key!r}: the lengths are not a "
                f"1-d integer tensor within the width, or the padding beyond them is not constant"
            )
        return ragged[0], {**spec, **ragged[1]}
    if lengths_keys is None and tensor.dim() >= 2:
        for lengths_key in DEFAULT_LENGTHS_KEYS:
            if lengths_key in data and lengths_key != key:
                ragged = _try_ragged(key, tensor, lengths_key, data[lengths_key])
                if ragged is not None:
                    return ragged[0], {**spec, **ragged[1]}
    return _dense_array(key, tensor), {**spec, "layout": "dense"}


def _dense_array(key: str, tensor: torch.Tensor) -> pa.Array:
    rows = tensor.shape[0]
    row_numel = math.prod(tensor.shape[1:])
    if row_numel == 0:
        return pa.nulls(rows)
    values = pa.array(_to_numpy(key, tensor))
    if tensor.dim() == 1:
        return values
    return pa.FixedSizeListArray.from_arrays(values, type=_non_null_list(values, row_numel))


def _try_ragged(
    key: str, tensor: torch.Tensor, lengths_key: str, lengths: Any
) -> tuple[pa.Array, dict[str, Any]] | None:
    """A list column of the rows cut at their lengths, if the padding is one constant."""
    width = tensor.shape[1]
    if (
        not isinstance(lengths, torch.Tensor)
        or lengths.dim() != 1
        or lengths.shape[0] != tensor.shape[0]
        or lengths.dtype.is_floating_point
        or lengths.dtype == torch.bool
    ):
        return None
    lengths = lengths.detach().cpu().to(torch.int64)
    if lengths.numel() and (lengths.min() < 0 or lengths.max() > width):
        return None
    row_numel = math.prod(tensor.shape[2:])
    bits = _cpu_flat(tensor, _BITS_DTYPE[tensor.element_size()]).numpy()
    bits = bits.reshape(tensor.shape[0], width, row_numel)
    cut = _cut_by_mask if width * row_numel <= _MASKED_ROW_LIMIT else _cut_row_by_row
    found = cut(bits, lengths.numpy())
    if found is None:
        return None
    flat, pad_bits = found
    values = pa.array(_to_numpy(key, torch.from_numpy(flat).view(tensor.dtype)))
    offsets = np.zeros(tensor.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths.numpy() * row_numel, out=offsets[1:])
    array = pa.LargeListArray.from_arrays(pa.array(offsets), values, type=_non_null_list(values))
    return array, {"layout": "ragged", "lengths_key": lengths_key, "pad_bits": pad_bits}


# Rows up to this many values are cut with one [B, W] mask (numpy's compare and boolean
# index: no Python loop over a small batch's rows); wider ones row by row, where the mask's
# copies cost more than the loop (~2x at 1024 x 4096; bench/codec_cut.py, issue 30).
_MASKED_ROW_LIMIT = 1024


def _cut_by_mask(bits: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, int] | None:
    """The [B, W, n] rows' values up to their lengths, flat, and the one padding value
    beyond them (None if the padding is not one value)."""
    padding = np.arange(bits.shape[1])[None, :] >= lengths[:, None]
    padded = bits[padding].reshape(-1)
    pad_bits = int(padded[0]) if padded.size else 0
    if padded.size and not (padded == pad_bits).all():
        return None
    return bits[~padding].reshape(-1), pad_bits


def _cut_row_by_row(bits: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, int] | None:
    """What ``_cut_by_mask`` returns, one row at a time: one pass over the data."""
    row_lengths = lengths.tolist()
    width = bits.shape[1]
    short = [row for row, n in enumerate(row_lengths) if n < width]
    pad_bits = 0
    if short and bits[0].size:
        pad_bits = int(bits[short[0], row_lengths[short[0]]].reshape(-1)[0])
        if not all((bits[row, row_lengths[row] :] == pad_bits).all() for row in short):
            return None
    rows = [bits[row, :n].reshape(-1) for row, n in enumerate(row_lengths)]
    return (np.concatenate(rows) if rows else bits.reshape(-1)[:0]), pad_bits


def _decode_tensor(spec: dict[str, Any], array: pa.Array) -> torch.Tensor:
    dtype = _DTYPE_BY_NAME[spec["dtype"]]
    shape = spec["shape"]
    _, numpy_dtype, storage_dtype = _TENSOR_DTYPES[dtype]
    if array.null_count and not pa.types.is_null(array.type):
        raise ValueError("unexpected nulls in a tensor column")
    if len(array) != shape[0]:
        raise ValueError(f"{len(array)} rows, metadata says {shape[0]}")
    if spec["layout"] == "dense":
        if math.prod(shape[1:]) == 0:
            return torch.empty(shape, dtype=dtype)
        flat = array.flatten() if pa.types.is_fixed_size_list(array.type) else array
        values = _values_view(flat, numpy_dtype)
        return values.view(dtype).reshape(shape)
    if spec["layout"] != "ragged":
        raise ValueError(f"unknown layout {spec['layout']!r}")
    row_numel = math.prod(shape[2:])
    row_size = shape[1] * row_numel
    offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    sizes = np.diff(offsets)
    if (sizes > row_size).any() or (row_numel and (sizes % row_numel).any()):
        raise ValueError(f"a row is not a whole number of elements within width {shape[1]}")
    first, total = int(offsets[0]), int(offsets[-1] - offsets[0])
    offsets = (offsets - first).tolist()
    values = _values_view(array.values.slice(first, total), numpy_dtype)
    bits_dtype = _BITS_DTYPE[torch.empty(0, dtype=dtype).element_size()]
    flat = values.view(storage_dtype).view(bits_dtype).numpy()
    pad = spec["pad_bits"]
    out = zeroed(math.prod(shape), flat.dtype)
    if pad:
        out.fill(pad)
    # Rows are copied as 1-d slices of the flat output (~20% faster than 2-d row slices).
    for row in range(shape[0]):
        start, end = offsets[row], offsets[row + 1]
        out[row * row_size : row * row_size + end - start] = flat[start:end]
    return torch.from_numpy(out).view(dtype).reshape(shape)


def _values_view(array: pa.Array, numpy_dtype: np.dtype) -> torch.Tensor:
    """A tensor over the Arrow buffer (no copy) in the dtype Arrow stored."""
    values = array.to_numpy(zero_copy_only=True)
    if values.dtype != numpy_dtype:
        raise ValueError(f"stored as {values.dtype}, expected {numpy_dtype}")
    return torch.from_numpy(values)


# ---- lists of Python values ----------------------------------------------------------


def _encode_list(key: str, values: list[Any]) -> tuple[pa.Array, dict[str, Any]]:
    if values and all(type(v) is str for v in values):
        return pa.array(values, type=pa.large_string()), {"kind": "str"}
    if values and all(type(v) is bool for v in values):
        return pa.array(values, type=pa.bool_()), {"kind": "bool"}
    if values and all(type(v) is float for v in values):
        return pa.array(values, type=pa.float64()), {"kind": "float"}
    if values and all(type(v) is int and -(2**63) <= v < 2**63 for v in values):
        return pa.array(values, type=pa.int64()), {"kind": "int"}
    texts: list[str] = []
    rows: list[dict[str, list[bytes]]] = []
    dumps = json.JSONEncoder(separators=(",", ":")).encode
    for index, value in enumerate(values):
        blobs: dict[str, list[bytes]] = {}
        try:
            encoded = _encode_object(value, blobs)
        except _Unstorable as err:
            raise CodecError(err.message(f"{key}[{index}]")) from None
        texts.append(dumps(encoded))
        rows.append(blobs)
    names = sorted({name for blobs in rows for name in blobs})
    children = [pa.array(texts, type=pa.large_string())] + [
        pa.array([blobs.get(name, []) for blobs in rows], type=_BLOB_LISTS) for name in names
    ]
    fields = [
        _field(name, child.type) for name, child in zip(["json", *names], children, strict=True)
    ]
    return pa.StructArray.from_arrays(children, fields=fields), {"kind": "object"}


class _Unstorable(Exception):
    """A value inside a list cell that cannot be stored. Its path (``[1]['t']``) is put
    together while the error unwinds, so encoding builds no path strings when all is well."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.steps: list[str] = []

    def within(self, step: str) -> "_Unstorable":
        self.steps.append(step)
        return self

    def message(self, root: str) -> str:
        return f"{root}{''.join(reversed(self.steps))} {self.problem}"


_SCALARS = (bool, int, float, str, type(None))


def _encode_object(value: Any, blobs: dict[str, list[bytes]]) -> Any:
    """JSON-able form of ``value``; a tensor's bytes go to ``blobs`` under its dtype's name
    (so a reader splits each dtype's bytes into tensors in one call) and its marker holds
    that name, its shape and its index in the row's blobs of that dtype."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, dict):
        encoded = {}
        for k, v in value.items():
            if type(k) is not str:
                raise _Unstorable(f"has dict key {k!r}; only string keys can be stored")
            try:
                encoded[k] = _encode_object(v, blobs)
            except _Unstorable as err:
                raise err.within(f"[{k!r}]") from None
        marked = len(encoded) == 1 and next(iter(encoded)) in _MARKS
        # A user dict that looks like a marker goes as pairs: the decoder's object hook
        # runs inner dicts first, so it must never see the look-alike as a dict.
        return {_DICT_MARK: [[k, v] for k, v in encoded.items()]} if marked else encoded
    if isinstance(value, torch.Tensor):
        stored_as = _TENSOR_DTYPES.get(value.dtype)
        if stored_as is None:
            raise _Unstorable(f"has unsupported dtype {value.dtype}; {_SUPPORTED}")
        name, _, storage_dtype = stored_as
        same_dtype = blobs.setdefault(name, [])
        same_dtype.append(_tensor_bytes(value, storage_dtype))
        return {_TENSOR_MARK: [name, list(value.shape), len(same_dtype) - 1]}
    if isinstance(value, list | tuple):
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_encode_object(item, blobs))
            except _Unstorable as err:
                raise err.within(f"[{index}]") from None
        return items if isinstance(value, list) else {_TUPLE_MARK: items}
    raise _Unstorable(
        f"holds {type(value).__name__}, which cannot be stored; use tensors, lists, "
        f"tuples, string-keyed dicts, str, int, float, bool or None"
    )


class _ObjectDecoder:
    """Turns an object column's rows back into values; its tensors are views of the Arrow
    buffers, cut for each dtype by one ``torch.split`` instead of one slice per tensor."""

    def __init__(self, fields: dict[str, pa.Array]) -> None:
        self.tensors: dict[str, tuple[torch.Tensor, ...]] = {}
        self.row_starts: dict[str, list[int]] = {}
        for name, lists in fields.items():
            self.row_starts[name] = lists.offsets.to_numpy(zero_copy_only=False).tolist()
            self.tensors[name] = _split_blobs(lists.values, _DTYPE_BY_NAME[name])
        self.row = 0

    def decode(self, texts: list[str]) -> list[Any]:
        parse = json.JSONDecoder(object_hook=self.hook).decode  # one decoder for all rows
        values = []
        for row, text in enumerate(texts):
            self.row = row
            values.append(parse(text))
        return values

    def hook(self, value: dict[str, Any]) -> Any:
        """``json.loads`` object hook: markers back into tensors, tuples and dicts."""
        if len(value) != 1:
            return value
        ((mark, inner),) = value.items()
        if mark == _TENSOR_MARK:
            name, shape, index = inner
            tensor = self.tensors[name][self.row_starts[name][self.row] + index]
            if len(shape) == 1 and tensor.shape[0] == shape[0]:  # skips a view
                return tensor
            return tensor.view(shape)
        if mark == _TUPLE_MARK:
            return tuple(inner)
        if mark == _DICT_MARK:
            return {k: v for k, v in inner}
        return value


def _split_blobs(blobs: pa.Array, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The blobs of a binary array as 1-d ``dtype`` tensors over its data buffer."""
    _, offsets, data = blobs.buffers()
    bounds = np.frombuffer(offsets, np.int64, count=blobs.offset + len(blobs) + 1)[blobs.offset :]
    itemsize = _TENSOR_DTYPES[dtype][1].itemsize
    if data is None or len(blobs) == 0:
        raw = torch.empty(0, dtype=torch.uint8)
    else:
        raw = torch.from_numpy(np.frombuffer(data, np.uint8))[bounds[0] : bounds[-1]]
    if raw.data_ptr() % itemsize:
        raw = raw.clone()  # a dtype view needs an address aligned to the dtype
    sizes = np.diff(bounds)
    if (sizes % itemsize).any():
        raise ValueError(f"a {dtype} tensor's byte size is not a multiple of {itemsize}")
    return torch.split(raw.view(dtype), (sizes // itemsize).tolist())


def _decode_column(spec: dict[str, Any], array: pa.Array) -> Any:
    kind = spec["kind"]
    if kind == "tensor":
        return _decode_tensor(spec, array)
    if kind in ("str", "bool", "float", "int"):
        return array.to_pylist()
    if kind == "object":
        fields = dict(zip([field.name for field in array.type], array.flatten(), strict=True))
        texts = fields.pop("json")
        return _ObjectDecoder(fields).decode(texts.to_pylist())
    raise ValueError(f"unknown column kind {kind!r}")


def _read_metadata(schema: pa.Schema, source: str) -> dict[str, Any]:
    raw = (schema.metadata or {}).get(_METADATA_KEY)
    if raw is None:
        raise CodecError(f"{source}: no {FORMAT_NAME} metadata; not written by this codec")
    crc = (schema.metadata or {}).get(_METADATA_CRC_KEY)
    if crc is not None and crc != str(zlib.crc32(raw)).encode():
        raise CodecError(f"{source}: damaged {FORMAT_NAME} metadata (CRC-32 mismatch)")
    try:
        metadata = json.loads(raw)
    except ValueError as exc:
        raise CodecError(f"{source}: damaged {FORMAT_NAME} metadata ({exc})") from exc
    version = metadata.get("version")
    if metadata.get("format") != FORMAT_NAME or version != FORMAT_VERSION:
        raise CodecError(
            f"{source}: format {metadata.get('format')!r} version {version!r} is not "
            f"{FORMAT_NAME!r} version {FORMAT_VERSION}; read it with the version that wrote it"
        )
    return metadata
