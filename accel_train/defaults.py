"""The defaults chosen for the data when the user does not choose: one rule, in one place.

The built-in datasets (``digits``, ``synthetic``, ``mnist``, ``fashion_mnist``, ``cifar10``) keep their recipes:
``lenet`` (the flag's default), their own augmentation and the flag's epochs, so their runs, parity and resume
promises stay what they were. Any other data (``imagefolder:``, ``hf:``, ``shards:``, a registered dataset, the
data given to ``accel_train.train``) is the user's own, small more often than not, with classes that do not depend
on where the object is. When the user picks no model (no ``--model`` flag, YAML key or ``train()`` option), the
rest of the recipe is chosen with it, each part only where the user did not set it:

* the model is ``small_cnn_gn`` (``models/small_cnn.py``: per-image centred inputs, 3x3 convolutions normalised
  with GroupNorm, each image alone: the same weights on 1 and N processes, and ``--bitwise``; global max pooling:
  the same features wherever the object is). It learns such classes on a CPU in seconds, where ``lenet`` (its
  flattened layers tie every feature to a position) memorises a few hundred images;
* photos (:func:`looks_like_photos`) fine-tune :data:`PHOTO_MODEL` from ImageNet weights instead, with
  :data:`PHOTO_RECIPE`, when the weights are at hand (``photo_defaults.py`` looks, once the folder is listed);
* the augmentation is on for the sources whose builders have one (``imagefolder:``, ``hf:``, ``shards:``: random
  crop, and a horizontal flip for colour images); ``--no-augment`` turns it off;
* ``--channels-last``: its convolutions take 0.7x the time on a CPU (measured), the same on a GPU;
* the run takes at least :data:`MIN_STEPS` optimizer steps: ``--epochs`` is raised for a small dataset (120 images
  at batch 32 make 3 steps an epoch, 24 in the flag's 8 epochs), unless ``--epochs`` or ``--max-steps`` is given.

``build.py`` applies the choice to a fresh run's config, records it in ``config.yaml`` (``resolved.defaults``) and
says it in one line at the start. A resume never chooses again: it restores the saved config, choice included.
A user who picks the model keeps today's recipe for the rest (``--model resnet18`` trains as long as asked: at
8 s a step on 2 cores, 500 steps would be an hour). No torch and no ``TrainConfig`` here: plain values in, plain
values out (the config's validation uses it too).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

#: The datasets with a recipe of their own (model, augmentation, length): nothing is chosen for them.
BUILTIN_DATASETS = frozenset({"digits", "synthetic", "mnist", "fashion_mnist", "cifar10"})
#: The sources whose builders read ``--augment`` (``data/folder.py``'s ``augment_for``: crop + flip).
AUGMENTED_SOURCES = ("imagefolder:", "hf:", "shards:")
MODEL = "small_cnn_gn"
#: The least optimizer steps of a run on the user's own data (measured on six 120-image shapes folders,
#: ``benchmarks/data/own_folder.py``: 300 steps ended at 90-100% test accuracy, 400 at 90-100%, 500 at 96.7-100%).
MIN_STEPS = 500
#: Photos (:func:`looks_like_photos`) fine-tune the PyTorch transfer-learning tutorial's model from its ImageNet
#: weights when they are at hand (``photo_defaults.py``): the tutorial's recipe (SGD, momentum 0.9, lr 0.001 at
#: batch 4, scaled to batch 32; 25 epochs of its 245 ants/bees images, about 200 steps at batch 32), at the weights'
#: 224 pixels, BatchNorm on the weights' statistics (the same on 1 and N processes, and ``--bitwise``).
PHOTO_SIDE = 96
PHOTO_MODEL = "tv:resnet18"
PHOTO_RECIPE = {"optimizer": "sgd", "lr": 0.008, "bn_stats": "loaded", "image_size": 224}
PHOTO_MIN_STEPS = 200


@dataclass(frozen=True)
class Defaults:
    """What was chosen for a run (None: nothing chosen for that setting: the user's value or the flag's)."""

    dataset: str
    model: str | None = None
    augment: bool | None = None
    channels_last: bool | None = None
    min_steps: int | None = None
    # photos with ImageNet weights at hand (:func:`for_photos`): the fine-tuning recipe, and why
    pretrained: str | None = None
    image_size: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    bn_stats: str | None = None
    photos: str = ""  # what made the images photos, and where the weights are

    def __bool__(self) -> bool:
        return self.model is not None

    def settings(self) -> dict[str, object]:
        """The config fields this choice sets (``epochs`` follows, once the steps per epoch are known)."""
        chosen = {"model": self.model, "augment": self.augment, "channels_last": self.channels_last,
                  "pretrained": self.pretrained, "image_size": self.image_size, "optimizer": self.optimizer,
                  "lr": self.lr, "bn_stats": self.bn_stats}  # fmt: skip
        return {name: value for name, value in chosen.items() if value is not None}

    def epochs(self, epochs: int, steps_per_epoch: int) -> int:
        """``epochs``, raised so that the run takes at least ``min_steps`` optimizer steps."""
        if not self.min_steps or steps_per_epoch < 1 or epochs * steps_per_epoch >= self.min_steps:
            return epochs
        return math.ceil(self.min_steps / steps_per_epoch)

    def why(self) -> str:
        said = f"{self.dataset} is not a built-in dataset with a recipe of its own, and no --model was given"
        return f"{said}; {self.photos}" if self.photos else said

    def record(self, epochs: int) -> dict[str, object]:
        """``resolved.defaults`` in config.yaml and the checkpoints: what was chosen, and why."""
        return {**self.settings(), "epochs": epochs, "min_steps": self.min_steps, "why": self.why()}

    def describe(self, epochs: int, steps_per_epoch: int) -> str:
        """The run's start line (without the ``accel_train:`` prefix)."""
        if self.pretrained:
            parts = [f"--model {self.model} --pretrained (torchvision's ImageNet weights, fine-tuned)"]
            recipe = {name: getattr(self, name) for name in ("bn_stats", "optimizer", "lr", "image_size")}
            parts += [f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
                      for k, v in recipe.items() if v is not None]  # fmt: skip
        else:
            parts = [f"--model {self.model} (small CNN with global pooling: the class wherever the object is)"]
        if self.augment:
            parts.append("--augment (random crop, and flip for colour images; --no-augment turns it off)")
        if self.channels_last:
            parts.append("--channels-last")
        if self.min_steps:
            parts.append(f"--epochs {epochs} ({epochs * steps_per_epoch} steps: at least {self.min_steps})")
        instead = f"; --model {MODEL} trains from scratch instead" if self.pretrained else ""
        return f"defaults for your data ({self.why()}): {', '.join(parts)}; flags choose otherwise{instead}"

    def for_photos(self, given: Collection[str] | None, why: str, batch: int = 32) -> Defaults:
        """This choice for photos whose ImageNet weights are at hand (``why``: what made them photos, and where
        the weights are): :data:`PHOTO_MODEL` fine-tuned with :data:`PHOTO_RECIPE`, for what the user did not set.
        The recipe's lr is its optimizer's, at ``batch`` (the global batch if given, else the micro-batch: the
        same on any number of processes) scaled from 32; an optimizer the user picked keeps its own lr."""
        given = set(given or ())
        recipe = {k: v for k, v in PHOTO_RECIPE.items() if k not in given}
        if "optimizer" in given:
            recipe.pop("lr", None)
        elif "lr" in recipe:
            recipe["lr"] = round(PHOTO_RECIPE["lr"] * batch / 32, 8)
        steps = None if self.min_steps is None else PHOTO_MIN_STEPS
        return dataclasses.replace(self, model=PHOTO_MODEL, pretrained="DEFAULT", min_steps=steps, photos=why,
                                   **recipe)  # fmt: skip


def looks_like_photos(channels: int, short_sides: Mapping[int, int]) -> str:
    """Why images of ``channels`` channels are photos ("" if they are not), ``short_sides`` counting the images of
    each shorter side: colour, and the median image's shorter side :data:`PHOTO_SIDE` pixels or more. Digits,
    drawings, small grey images (MNIST's 28, CIFAR's 32, the shapes' 64) are not; nor are grey photos (ImageNet's
    weights see colour); a few photos among icons do not make them photos, nor a few thumbnails among photos."""
    total = sum(short_sides.values()) if short_sides else 0
    if channels != 3 or total < 1:
        return ""
    ordered = sorted(short_sides.items())
    counted = zip(ordered, itertools.accumulate(n for _, n in ordered), strict=True)
    side = next(s for (s, _), seen in counted if 2 * seen > total)  # the median image's
    if side < PHOTO_SIDE:
        return ""
    return f"colour images, {side} pixels a side (median)"


def choose(dataset: str, given: Collection[str] | None) -> Defaults:
    """The defaults for ``dataset`` when the user set the fields in ``given`` (None: every field, a config built
    in code). Empty (false) for the built-in datasets and when the user picked the model."""
    if given is None or dataset in BUILTIN_DATASETS or "model" in given:
        return Defaults(dataset)
    return Defaults(
        dataset,
        model=MODEL,
        augment=True if "augment" not in given and dataset.startswith(AUGMENTED_SOURCES) else None,
        channels_last=None if "channels_last" in given else True,
        min_steps=None if "epochs" in given or "max_steps" in given else MIN_STEPS,
    )


def model_for(dataset: str, given: Collection[str] | None, model: str) -> str:
    """The model a run of ``dataset`` builds (``model``: the config's value; ``given``: what the user set)."""
    return choose(dataset, given).model or model
