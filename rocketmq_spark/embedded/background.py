"""A broker's periodic service (delayed delivery, transaction checks): one asyncio task on the
server's loop, started with the broker and cancelled when it stops."""
from __future__ import annotations

import asyncio
from typing import Optional


class BackgroundService:
    """Subclasses implement ``async _run()``; :meth:`start` (on the loop) and :meth:`stop`
    are idempotent."""

    _task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        raise NotImplementedError
