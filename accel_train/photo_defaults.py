"""The defaults for a folder of photos: fine-tune ImageNet weights when they are at hand (``defaults.py``).

``build.py`` chooses the defaults before the data is read (``defaults.choose``); once the folder is listed,
:func:`choose_for_photos` looks at its images. Colour images whose median image is 96 pixels a side or more
(``looks_like_photos``) fine-tune ``tv:resnet18`` from torchvision's ImageNet weights when they are in
torchvision's cache (``$TORCH_HOME/hub/checkpoints/``) or can be downloaded there now, with the recipe of
``defaults.PHOTO_RECIPE``; ``build.py`` applies it and reads the folder again at the weights' 224 pixels. Without
the weights (offline, nothing in the cache, or ``ACCEL_TRAIN_OFFLINE=1``) the run trains the from-scratch default
and says in one line what the weights would bring and where to put them. Process 0 decides (and downloads); every
process trains what it decided.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from accel_train.config import TrainConfig
from accel_train.data.base import DataSplits
from accel_train.defaults import MODEL, PHOTO_MODEL, Defaults, looks_like_photos
from accel_train.runtime import Runtime

#: What fine-tuning brings on real photos, for the line of a run that cannot: the PyTorch tutorial's ants/bees
#: (245 training, 153 validation photos): about 94% fine-tuned from ImageNet, 68% trained from scratch here.
BRINGS = (
    "on the PyTorch tutorial's ants/bees photos, about 94% fine-tuned where accel_train's earlier from-scratch "
    "default reached 68%"
)
OFFLINE_ENV = "ACCEL_TRAIN_OFFLINE"


def choose_for_photos(cfg: TrainConfig, rt: Runtime, splits: DataSplits, picked: Defaults) -> Defaults:
    """``picked`` with the photo recipe (``Defaults.for_photos``) for a folder of photos whose weights are at hand
    (the module docstring); ``picked`` itself for anything else, for a run whose model the user picked, and for a
    resume (``picked`` empty: it restores what its first attempt chose). ``build.py`` applies it."""
    if not picked or picked.model != MODEL or not cfg.dataset.startswith("imagefolder:"):
        return picked
    what = looks_like_photos(splits.info.in_channels, splits.extra.get("short_sides") or {})
    if not what:
        return picked
    path, why = _agreed(rt, _weights_here)
    if path is None:
        url, where = _where()
        rt.print(
            f"accel_train: your images look like photos ({what}): ImageNet weights would bring a lot ({BRINGS}), "
            f"but {why}; training {MODEL} from scratch. To fine-tune: download {url} to {where} (TORCH_HOME sets "
            "the folder) and run again"
        )
        return picked
    batch = cfg.global_batch_size or cfg.batch_size
    return picked.for_photos(getattr(cfg, "given", None), f"they look like photos ({what}); ImageNet weights "
                             f"at hand: {path}{why}", batch)  # fmt: skip


def _weights_here() -> tuple:
    from accel_train.models.pretrained import fetch_default_weights, is_torchvisions

    offline = os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")
    path, why = fetch_default_weights(PHOTO_MODEL, download=not offline)
    if path is not None:  # at hand: "" or what is odd about the file
        return path, "" if is_torchvisions(path) else " (its sha256 is not torchvision's: a replaced or damaged file?)"
    return path, f"{why} ({OFFLINE_ENV} is set)" if offline else why


def _where():
    from accel_train.models.pretrained import weights_url

    return weights_url(PHOTO_MODEL)


def _agreed(rt: Runtime, decide: Callable[[], tuple]):
    """``decide()`` on process 0, the same answer on every process (a rank that lacks the file reads it when the
    weights are loaded: torchvision downloads it, or the line names where to put it)."""
    acc = rt.accelerator
    answer = decide() if acc.is_main_process else None
    if acc.num_processes == 1:
        return answer[0], answer[1]
    from accelerate.utils import broadcast_object_list

    box = [None if answer is None else (None if answer[0] is None else str(answer[0]), answer[1])]
    broadcast_object_list(box, from_process=0)
    path, why = box[0]
    return path, why
