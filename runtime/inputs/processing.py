"""Processors for image-text models, built and loaded without torchvision.

transformers' Qwen-VL processors take an image processor, a tokenizer and a video processor; the
video processor's base class needs torchvision, which cannot be installed beside the local torch.
:func:`images_only` makes the same processor class without its video processor (images and
text only), so a processor saved with ``save_pretrained`` loads back with :func:`load_processor`
whether or not torchvision is there.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import NnatlasError


@cache
def images_only(cls: type) -> type:
    """``cls`` (a ProcessorMixin subclass taking image_processor, tokenizer, video_processor) without
    the video processor. The class keeps ``cls``'s name, so what it saves loads as ``cls`` elsewhere."""
    import inspect

    init: Any = cls.__dict__.get("__init__") or cls.__init__  # type: ignore[misc]
    params = inspect.signature(init).parameters
    if "video_processor" not in params:
        return cls

    def __init__(self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None,
                 **kwargs: Any) -> None:
        init(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    sub = type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                      "__doc__": f"{cls.__name__} for images and text (no video processor)."})
    return sub


def load_processor(path: str | Path) -> Any:
    """``AutoProcessor.from_pretrained(path)``; when its video processor cannot load (no torchvision),
    the same processor class built from the saved tokenizer and image processor, images only."""
    import transformers

    try:
        return transformers.AutoProcessor.from_pretrained(path)
    except (OSError, ImportError, ValueError, TypeError) as first:
        config = Path(path) / "processor_config.json"
        if not config.is_file():
            raise NnatlasError(f"cannot load a processor from {path}: {first}") from first
        name = json.loads(config.read_text()).get("processor_class")
        cls = getattr(transformers, name or "", None)
        if cls is None:
            raise NnatlasError(f"cannot load a processor from {path}: unknown processor_class {name!r}") from first
        tokenizer = _load_tokenizer(path)
        image_processor = transformers.AutoImageProcessor.from_pretrained(path)
        return images_only(cls)(image_processor=image_processor, tokenizer=tokenizer)


def _load_tokenizer(path: str | Path) -> Any:
    """The tokenizer class the directory's tokenizer_config.json names (AutoTokenizer would pick the
    model type's own tokenizer class from config.json instead, which may read the files differently)."""
    import transformers

    config = Path(path) / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    cls = getattr(transformers, name or "", None)
    if cls is not None and not getattr(cls, "is_dummy", False) and hasattr(cls, "from_pretrained"):
        return cls.from_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path)


def image_processor_class(name: str) -> type:
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None or getattr(cls, "is_dummy", False):
        raise NnatlasError(f"no image processor class {name} usable here (torchvision-free ones end in Pil)")
    return cls  # type: ignore[no-any-return]


# Qwen2-VL's and Qwen2.5-VL's processors do not name the tokens around an image, but their tokenizers
# hold them and the models need them: M-RoPE places each run of image tokens as one image, so two
# images with nothing between them would take one image's positions
QWEN_VISION_MARKS = ("<|vision_start|>", "<|vision_end|>")


def vision_marks(processor: Any) -> tuple[str, str]:
    """The tokens a prompt puts before and after an image's tokens: the processor's own, else Qwen's
    when its tokenizer knows them, else none."""
    start, end = getattr(processor, "vision_start_token", None), getattr(processor, "vision_end_token", None)
    if start is not None and end is not None:
        return start, end
    tokenizer = getattr(processor, "tokenizer", None)
    vocab = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else {}
    if all(mark in vocab for mark in QWEN_VISION_MARKS):
        return QWEN_VISION_MARKS
    return "", ""


def image_prompt(processor: Any, text: str, count: int) -> str:
    """``text`` with one ``<vision_start><image><vision_end>`` per image in front, unless it holds
    the image token already (as a chat template would place them)."""
    token = getattr(processor, "image_token", None)
    if not token or token in text or count == 0:
        return text
    start, end = vision_marks(processor)
    return "".join(f"{start}{token}{end}" for _ in range(count)) + " " + text


class PromptProcessor:
    """The model's processor, as ``model.processor``: everything is the wrapped processor's, except
    that a call with images and a prompt without image tokens gets one placeholder per image in
    front (the same prompt ``model.trace(prompt, images=[...])`` runs). ``.wrapped`` is the original."""

    def __init__(self, processor: Any):
        object.__setattr__(self, "wrapped", processor)

    def __call__(self, *args: Any, text: Any = None, images: Any = None, **kwargs: Any) -> Any:
        if images is not None and isinstance(text, str):
            count = len(images) if isinstance(images, list | tuple) else 1
            text = image_prompt(self.wrapped, text, count)
        return self.wrapped(*args, text=text, images=images, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.wrapped, name, value)

    def __repr__(self) -> str:
        return repr(self.wrapped)
