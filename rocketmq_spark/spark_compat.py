"""What the running PySpark offers of the Python Data Source API, asked in one place.

The connector supports Spark 4.0 and newer. Later releases added to the API: admission
control, ``prepareForTriggerAvailableNow`` and ``reportLatestOffset`` for stream readers (4.2),
Arrow input for stream writers (4.1), filter push-down for batch readers (4.1). The rest of
the code asks the flags below whether this Spark has a feature (found by looking for it, not
by parsing version strings) and degrades where it is missing, as docs/spark-versions.md says.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import pyspark
from pyspark.sql import datasource as _datasource

try:  # Spark 4.2+: ReadLimit and the Trigger.AvailableNow mixin
    from pyspark.sql.streaming import datasource as _stream_datasource
except ImportError:
    _stream_datasource = None

log = logging.getLogger(__name__)

SPARK_VERSION: str = pyspark.__version__

#: ``latestOffset(start, limit)``, ``getDefaultReadLimit`` and ``ReadMaxRows`` (Spark 4.2+).
ADMISSION_CONTROL: bool = (
    _stream_datasource is not None and hasattr(_stream_datasource, "ReadMaxRows")
    and hasattr(_datasource.DataSourceStreamReader, "getDefaultReadLimit"))

#: ``SupportsTriggerAvailableNow.prepareForTriggerAvailableNow`` (Spark 4.2+).
TRIGGER_AVAILABLE_NOW: bool = (
    _stream_datasource is not None
    and hasattr(_stream_datasource, "SupportsTriggerAvailableNow"))

#: ``reportLatestOffset``: the progress's ``latestOffset`` is what the broker holds, not the
#: end the batch was planned to (Spark 4.2+).
REPORTS_LATEST_OFFSET: bool = hasattr(_datasource.DataSourceStreamReader, "reportLatestOffset")

#: ``DataSourceStreamArrowWriter`` (Spark 4.1+).
STREAM_ARROW_WRITER: bool = hasattr(_datasource, "DataSourceStreamArrowWriter")

#: ``DataSourceReader.pushFilters`` (Spark 4.1+): batch reads take the filters Spark pushes
#: when ``spark.sql.python.filterPushdown.enabled`` is on (docs/filter-pushdown.md).
FILTER_PUSHDOWN: bool = hasattr(_datasource.DataSourceReader, "pushFilters")


def stream_writer_bases() -> Tuple[type, ...]:
    """The base classes of the stream writer, so that its ``write`` gets Arrow record batches.

    Spark 4.1+ has ``DataSourceStreamArrowWriter``. Spark 4.0 lacks it, but its write worker
    (``pyspark/sql/worker/write_into_data_source.py``) hands record batches to any writer that
    is a ``DataSourceArrowWriter``, streaming or not; so there the stream writer is both."""
    if STREAM_ARROW_WRITER:
        return (_datasource.DataSourceStreamArrowWriter,)
    return (_datasource.DataSourceStreamWriter, _datasource.DataSourceArrowWriter)


def register_data_source(spark, source: type) -> bool:
    """``spark.dataSource.register(source)``; returns False, changing nothing, where Spark
    refuses because a data source it found by itself holds the name: Spark 4.0 does not let
    a registration replace one found by its lookup of ``pyspark_*`` modules (our
    ``pyspark_rocketmq``); 4.1+ does."""
    try:
        spark.dataSource.register(source)
    except Exception as exc:  # AnalysisException, classic or Spark Connect's
        condition = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
        if condition is None or condition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
        log.info("data source %r is already registered (found by Spark); kept", source.name())
        return False
    return True


def missing(max_messages_per_trigger: Optional[int] = None) -> List[str]:
    """What this Spark changes for the connector, one phrase each (empty on Spark 4.2+)."""
    out = []
    if not ADMISSION_CONTROL:
        cap = (f"maxMessagesPerTrigger={max_messages_per_trigger} caps every micro-batch, the "
               "single one of Trigger.AvailableNow and Trigger.Once included"
               if max_messages_per_trigger else "maxMessagesPerTrigger is applied by the source")
        out.append(f"no admission control: {cap}")
    if not TRIGGER_AVAILABLE_NOW:
        out.append("Trigger.AvailableNow runs as one micro-batch (Spark's fallback for "
                   "sources without prepareForTriggerAvailableNow) that reads what was "
                   "there when it started, new queues included")
    if not REPORTS_LATEST_OFFSET:
        out.append("no reportLatestOffset: RocketMQLagListener looks the latest offsets up "
                   "itself")
    if not STREAM_ARROW_WRITER:
        out.append("no DataSourceStreamArrowWriter: the stream sink takes Arrow batches as "
                   "a DataSourceArrowWriter")
    if not FILTER_PUSHDOWN:
        out.append("no pushFilters: batch reads push no filters down, Spark filters every "
                   "row read")
    return out


_announced = False


def announce(max_messages_per_trigger: Optional[int] = None) -> Optional[str]:
    """Log, once per process and at INFO, the Spark version and what it changes; returns the
    line (None when already logged, or when this Spark has every feature)."""
    global _announced
    changes = missing(max_messages_per_trigger)
    if _announced or not changes:
        return None
    _announced = True
    line = f"rocketmq connector on Spark {SPARK_VERSION}: " + "; ".join(changes)
    log.info(line)
    return line
