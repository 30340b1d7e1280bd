"""``nnatlas cache``'s processes: the ranks and data-parallel groups of a torchrun launch (:class:`Dist`), a step
checked on every rank at once (:func:`checked`), and the thread that writes shards while the next forwards run
(:class:`Background`)."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..cache.data import CacheError
from ..cache.store import (
    ShardWriter,
)
from ..errors import NnatlasError


class Dist:
    """This process's rank among ``world`` (torchrun's environment), and the group they talk over."""

    def __init__(self, rank: int, world: int, local_rank: int):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.group = False
        self.owned = False  # whether start() made the process group (close() then ends it)
        self.tp = 1  # ranks per copy of the model (--tp): ranks g*tp .. g*tp + tp - 1 are data-parallel rank g
        self.cleanups: list[Callable[[], None]] = []  # run at close (the lock on --out)

    @property
    def dp_rank(self) -> int:
        """The data-parallel rank: which share of the batches this rank's group runs (and whose shards it writes)."""
        return self.rank // self.tp

    @property
    def dp_world(self) -> int:
        return self.world // self.tp

    @property
    def writes(self) -> bool:
        """Whether this rank writes its group's shards (the group's first rank; every rank without --tp)."""
        return self.rank % self.tp == 0

    @classmethod
    def from_env(cls) -> Dist:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return cls(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))

    def start(self, device: torch.device) -> None:
        if self.world > 1 and not self.group:
            import torch.distributed as td

            if device.type == "cuda":  # (NCCL's object collectives run on the current device: the rank's own)
                torch.cuda.set_device(device)
            if not td.is_initialized():  # (a caller that made the group, as the TP oracle's launch, keeps it)
                td.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
                self.owned = True
            self.group = True

    def agree(self, error: str | None) -> None:
        """Every rank raises when any did (the first failing rank's words), so none waits for another."""
        if self.group:
            import torch.distributed as td

            errors: list[str | None] = [None] * self.world
            td.all_gather_object(errors, error)
            error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise CacheError(error)

    def barrier(self) -> None:
        self.agree(None)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (on every rank)."""
        if not self.group:
            return [value]
        import torch.distributed as td

        values: list[Any] = [None] * self.world
        td.all_gather_object(values, value)
        return values

    def close(self) -> None:
        while self.cleanups:
            self.cleanups.pop()()
        if self.group:
            import torch.distributed as td

            if self.owned:
                td.destroy_process_group()
            self.group = self.owned = False


def checked(dist: Dist, step: Callable[[], Any]) -> Any:
    """Run ``step`` on every rank; a bad input on any rank stops them all, with its message."""
    try:
        result = step()
    except NnatlasError as e:
        dist.agree(str(e))
        raise
    dist.agree(None)
    return result


def groups_text(dist: Dist) -> str:
    return f" ({dist.dp_world} group{'s' if dist.dp_world > 1 else ''} of {dist.tp} tensor-parallel ranks)" \
        if dist.tp > 1 else ""


class Idle:
    """What a rank that writes nothing (a tensor-parallel group's other ranks) has for a :class:`Background`."""

    cpu = 0.0

    def add(self, rows: dict[str, torch.Tensor], ready: Any = None) -> None:
        return None

    def __enter__(self) -> Idle:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class Background:
    """``ShardWriter.add`` / ``close`` on one thread, fed through a queue of at most ``limit`` bytes of rows
    (one batch always fits): the shard writes, and the copies from a GPU, overlap the next forwards.

    Used as a context: leaving it normally waits for the last shard; an error on the thread is raised in
    the caller (at its next :meth:`add` or at the end, the thread's own exception); leaving it by an
    error (a KeyboardInterrupt included) stops the thread once the shard it is writing, if any, is whole.
    No thread outlives the block.
    """

    def __init__(self, writer: ShardWriter, limit: int):
        self.writer, self.limit = writer, limit
        self.items: queue.SimpleQueue[tuple[dict[str, torch.Tensor], Any, int] | None] = queue.SimpleQueue()
        self.held = 0  # bytes of rows queued, not yet given to the writer
        self.room = threading.Condition()
        self.error: BaseException | None = None
        self.stopping = False
        self.cpu = 0.0  # seconds of CPU the thread took
        self.thread = threading.Thread(target=self._work, name="nnatlas-cache-writer", daemon=True)

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def add(self, rows: dict[str, torch.Tensor], ready: Any = None) -> None:
        """Queue one batch's rows (``ready``: an event to wait for before they are read, or None)."""
        size = sum(v.numel() * v.element_size() for v in rows.values())
        with self.room:
            while self.held and self.held + size > self.limit and self.error is None:
                self.room.wait(0.5)
            self.held += size
        self._raise()
        self.items.put((rows, ready, size))

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _work(self) -> None:
        start = time.thread_time()
        try:
            self._loop()
        except BaseException as e:  # raised again in the caller's thread
            self.error = e
            with self.room:
                self.room.notify()
        finally:
            self.cpu = time.thread_time() - start

    def _loop(self) -> None:
        while True:
            item = self.items.get()
            if self.stopping:
                return
            if item is None:
                self.writer.close()
                return
            rows, ready, size = item
            if ready is not None:
                ready.synchronize()
            self.writer.add(rows)
            del rows, item
            with self.room:
                self.held -= size
                self.room.notify()

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is not None:
            self.stopping = True
        self.items.put(None)
        try:
            self.thread.join()
        except BaseException:  # interrupted while the last shards are written: stop after the current one
            self.stopping = True
            self.thread.join()
            raise
        if kind is None:
            self._raise()


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports kB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024
