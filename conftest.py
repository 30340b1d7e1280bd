"""Test-wide settings: tiny models run fastest on one thread (on 2 busy cores, default threading
made a tiny Qwen3-Next forward 10-30x slower)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
