"""Long operator jobs streamed as NDJSON progress lines, for the CLI's progress display."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from api.http import dumps
from ingest.domain.errors import TallyError
from ingest.progress import Progress


def summary_view(summary: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(summary) and not isinstance(summary, type):
        return dataclasses.asdict(summary)
    return dict(summary)


def progress_stream(work: Callable[[Progress], Any]) -> StreamingResponse:
    """Run `work(on_progress)` in a thread; stream `{"progress": {...}}` lines, then one
    `{"data": ...}` (or `{"error": ...}`) line."""

    async def lines() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        def on_progress(stage: str, done: int, total: int) -> None:
            line = dumps({"progress": {"stage": stage, "done": done, "total": total}}) + b"\n"
            loop.call_soon_threadsafe(queue.put_nowait, line)

        async def run() -> None:
            try:
                result = await asyncio.to_thread(work, on_progress)
                await queue.put(dumps({"data": summary_view(result)}) + b"\n")
            except TallyError as exc:
                await queue.put(dumps({"error": {"code": exc.code, "message": exc.message}}) + b"\n")
            finally:
                await queue.put(None)

        task = asyncio.create_task(run())
        while (line := await queue.get()) is not None:
            yield line
        await task

    return StreamingResponse(lines(), media_type="application/x-ndjson")
