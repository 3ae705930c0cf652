"""Faust's own floor: an agent that consumes raw bytes and does nothing else.

    python bench/faust_bare.py BOOTSTRAP TOPIC PARTITIONS EXPECTED

Prints the events per second between the first and the last event, then exits. The benchmark
runs it beside bare aiokafka and the pipeline, so the table shows where the cost per event is.
"""

from __future__ import annotations

import os
import sys
import time

import faust

bootstrap, topic, partitions, expected = (
    sys.argv[1],
    sys.argv[2],
    int(sys.argv[3]),
    int(sys.argv[4]),
)
app = faust.App(
    f"bare-{topic}",
    broker=f"kafka://{bootstrap}",
    store="memory://",
    web_enabled=False,
    topic_partitions=partitions,
    consumer_auto_offset_reset="earliest",
    datadir=f"/tmp/faust-bare-{os.getpid()}",
)
source = app.topic(
    topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)
seen = 0
first = 0.0


@app.agent(source)
async def count(stream: faust.StreamT) -> None:  # type: ignore[type-arg]
    global seen, first
    async for _ in stream.events():
        if seen == 0:
            first = time.monotonic()
        seen += 1
        if seen >= expected:
            elapsed = time.monotonic() - first
            print(f"RESULT {seen} {elapsed:.3f} {(seen - 1) / elapsed:.1f}", flush=True)
            os._exit(0)


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()
