"""Decode pull bodies straight to Arrow columns, without one Python object per message.

The work is done by the optional C accelerator (``native/client/rmq_native.c``): it validates
every record (sizes, magic, CRC, UTF-8) and writes each column into buffers taken from
Arrow's memory pool, which become the arrays without another copy. Its pure-Python twin in
:mod:`.pull_decode_numpy` gives the same results where the accelerator is not built.
"""
from __future__ import annotations

from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from .. import accelerator
from ..errors import MessageDecodeError
from . import message
from .pull_columns import SCHEMA

# The optional C decoder (native/client/rmq_native.c), None when it is not built.
_native = accelerator.built_module()

# ROCKETMQ_SPARK_PURE_PYTHON=1: the numpy decoder even when the C one is built (tests flip it).
FORCE_PURE_PYTHON = accelerator.FORCE_PURE_PYTHON

def decode_columns(body, verify_crc: bool = True, decompress: bool = True,
                   properties: bool = True, offset_ids: bool = True) -> pa.RecordBatch:
    """Every record of a FOUND pull body (or of several, concatenated) as one RecordBatch of
    :data:`SCHEMA`, with compressed bodies inflated unless ``decompress`` is false.

    ``properties=False`` and ``offset_ids=False`` leave those two columns null, which saves
    copying them when nobody reads them (``msg_id`` is filled either way).
    Raises :class:`~rocketmq_spark.client.errors.MessageDecodeError` naming the byte position
    and queue offset of the first bad record; nothing after it is returned.
    """
    if _native is not None and not FORCE_PURE_PYTHON:
        batch = _decode_native(body, verify_crc, properties, offset_ids)
    else:
        from .pull_decode_numpy import decode as decode_numpy

        batch = decode_numpy(bytes(body), verify_crc)
        if not (properties and offset_ids):
            columns = dict(zip(batch.schema.names, batch.columns))
            for name, keep in (("properties", properties), ("offset_msg_id", offset_ids)):
                if not keep:
                    columns[name] = pa.nulls(batch.num_rows, pa.string())
            batch = pa.RecordBatch.from_arrays(list(columns.values()), schema=SCHEMA)
    return _inflate(batch) if decompress else batch


def _inflate(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decompress the bodies whose sysFlag says so. ``sys_flag`` keeps the stored value (the
    COMPRESSED bit included), which is what Java's client reports for a compressed message."""
    sys_flag = batch.column("sys_flag")
    compressed = pc.not_equal(pc.bit_wise_and(sys_flag, message.SYSFLAG_COMPRESSED), 0)
    if not pc.any(compressed).as_py():
        return batch
    rows = pc.indices_nonzero(compressed).to_pylist()
    bodies, flags, offsets = (batch.column(name) for name in ("body", "sys_flag",
                                                                "queue_offset"))
    inflated = []
    for i in rows:
        try:
            inflated.append(message.decompress_body(bodies[i].as_py(), flags[i].as_py()))
        except Exception as exc:
            raise MessageDecodeError(f"compressed body does not inflate: {exc}", None, None,
                                     offsets[i].as_py()) from None
    columns = dict(zip(batch.schema.names, batch.columns))
    columns["body"] = pc.replace_with_mask(bodies, compressed, pa.array(inflated, pa.binary()))
    return pa.RecordBatch.from_arrays(list(columns.values()), schema=SCHEMA)


_WANT_PROPERTIES, _WANT_OFFSET_IDS = 1, 2


def _decode_native(data, verify_crc: bool, properties: bool = True,
                   offset_ids: bool = True) -> pa.RecordBatch:
    try:
        state, n, sizes, any_v6 = _native.scan(data, verify_crc)
    except ValueError as exc:
        kind, start = exc.args
        # Re-decode the bad record in Python for an error that names the exact bytes.
        data = bytes(data)
        message.decode_message(data, start, len(data), verify_crc=kind == "crc", decompress=False)
        raise MessageDecodeError(f"record fails validation ({kind})", start, data) from None
    wanted = [True, True, properties, True, True, True, offset_ids, not any_v6, not any_v6]
    # Outputs come from Arrow's pool, which reuses memory: fresh bytes objects of a few MB
    # per batch cost more in page faults than the decoding itself.
    allocate = pa.allocate_buffer
    ints, longs = allocate(16 * n), allocate(32 * n)
    offsets = [allocate(4 * (n + 1)) if w else None for w in wanted]
    datas = [allocate(size) if w else None for w, size in zip(wanted, sizes)]
    valid = [allocate((n + 7) // 8), allocate((n + 7) // 8)]
    _native.fill(state, (_WANT_PROPERTIES if properties else 0)
                 | (_WANT_OFFSET_IDS if offset_ids else 0), ints, longs, offsets, datas, valid)
    def ints32(k: int) -> pa.Array:
        return pa.Array.from_buffers(pa.int32(), n, [None, ints.slice(4 * k * n, 4 * n)])

    def ints64(k: int) -> pa.Array:
        return pa.Array.from_buffers(pa.int64(), n, [None, longs.slice(8 * k * n, 8 * n)])

    def column(index: int, kind=pa.string(), validity=None) -> Optional[pa.Array]:
        if offsets[index] is None:
            return None
        return pa.Array.from_buffers(kind, n, [validity, offsets[index], datas[index]])

    def text(index: int, validity=None) -> Optional[pa.Array]:
        # The accelerator checked the UTF-8 of topic and properties (and so of their pieces).
        return column(index, pa.string(), validity)

    def null_strings(array: Optional[pa.Array]) -> pa.Array:
        return pa.nulls(n, pa.string()) if array is None else array

    born_hosts, store_hosts = column(7), column(8)
    if any_v6:  # let the numpy path format IPv6 hosts
        import numpy as np

        from .pull_decode_numpy import host_strings, walk

        data = bytes(data)
        u8 = np.frombuffer(data, dtype=np.uint8)
        starts = walk(data)
        sys_flag = ints32(2).to_numpy().astype(np.int64)
        born_v6 = (sys_flag & message.SYSFLAG_BORNHOST_V6) != 0
        store_v6 = (sys_flag & message.SYSFLAG_STOREHOST_V6) != 0
        born_hosts = host_strings(u8, starts + 48, born_v6)
        store_hosts = host_strings(u8, starts + 48 + np.where(born_v6, 20, 8) + 8, store_v6)
    return pa.RecordBatch.from_arrays([
        text(1), ints32(0), ints64(0), ints64(1), ints32(1), ints32(2), ints64(2), born_hosts,
        ints64(3), store_hosts, ints32(3), column(0, pa.binary()), null_strings(text(2)),
        text(3, valid[0]), text(4, valid[1]), text(5), null_strings(column(6)),
    ], schema=SCHEMA)
