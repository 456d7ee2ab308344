"""``--pretrained``: start a ``tv:NAME`` model from torchvision's weights or a local file.

``DEFAULT`` (the flag without a value) is the architecture's default weights, a name such as ``IMAGENET1K_V1``
one of its weights enum, and anything else a local ``.pth``/``.pt``/``.safetensors`` file, read safely by the
caller (tensors only, ``checkpoint.sources``: the checkpoint package sits above the models). torchvision's own
loader and cache are used: a file already in ``$TORCH_HOME/hub/checkpoints/`` is used as it is (offline
machines), else it is downloaded as torchvision does;
a file that is neither there nor downloadable is one line naming where to put it.

The weights are copied into the model the run built for its data (:func:`load_pretrained`):

* tensors whose shape depends on the number of classes (the head) keep their fresh initialisation when the
  dataset's classes differ from the weights' (found by building the architecture twice on the meta device);
* a first convolution for 1 input channel gets the RGB filters summed (what a gray image replicated into 3
  channels would give), for more than 3 channels the filters repeated and scaled by 3/C (as timm does);
* every other tensor must fit exactly: anything else is one line naming the first tensors that do not.

Pure model code: no devices, processes or configs; the loop decides what to freeze (``features/finetune.py``).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
import torch.nn as nn

from accel_train.errors import UserError
from accel_train.models import tv

DEFAULT = "DEFAULT"
_FILE_SUFFIXES = (".pth", ".pt", ".safetensors", ".bin", ".ckpt")


@dataclass(frozen=True)
class PretrainedInfo:
    """What the weights bring besides their tensors: where from, their input normalisation, their head."""

    source: str  # the weights enum (e.g. ResNet18_Weights.IMAGENET1K_V1) or the file
    mean: tuple[float, ...] | None  # per input channel of the model (None: the weights do not say)
    std: tuple[float, ...] | None
    crop_size: int | None  # the image side the weights were trained at
    head: tuple[str, ...]  # parameter names whose shape follows the number of classes
    file: str | None = None  # the weights file read (a local file, or torchvision's cached one)
    sha256: str | None = None  # its hash (None: not on disk yet, torchvision downloads it with its hash checked)
    norm_from: str = ""  # where mean/std come from, in words

    def record(self) -> dict[str, str]:
        """What config.json keeps of the weights: the source, and the file with its hash when one was read."""
        return {"pretrained": self.source, **({"pretrained_file": self.file} if self.file else {}),
                **({"pretrained_sha256": self.sha256} if self.sha256 else {})}  # fmt: skip


def is_file_spec(spec: str) -> bool:
    return os.sep in spec or "/" in spec or spec.endswith(_FILE_SUFFIXES)


def check_spec(model: str, spec: str, file_needed: bool = True) -> None:
    """``--pretrained`` names weights ``model`` has (a one-line UserError otherwise); nothing is loaded.
    ``file_needed``: a weights file must exist (a fresh run reads it; a resume reads its checkpoint instead)."""
    if not model.startswith(tv.PREFIX):
        raise UserError(
            f"--pretrained works with torchvision models: pass --model tv:NAME with it, not {model!r} (without "
            "--model, a folder of photos fine-tunes tv:resnet18's ImageNet weights by itself); for your own model, "
            "load its weights in your code before accel_train.train(model, ...)"
        )
    if is_file_spec(spec):
        if file_needed and not Path(spec).is_file():
            raise UserError(f"--pretrained {spec}: no such file; pass a .pth or .safetensors file, or DEFAULT")
        return
    _weights_enum(model.removeprefix(tv.PREFIX), spec)


def _weights_enum(name: str, spec: str):
    import torchvision.models as tvm

    try:
        enum = tvm.get_model_weights(name)
    except (ValueError, KeyError):
        raise UserError(f"--pretrained: torchvision has no weights for tv:{name}; pass a weights file") from None
    if spec == DEFAULT:
        return enum.DEFAULT
    short = spec.rpartition(".")[2]  # ResNet18_Weights.IMAGENET1K_V1 or IMAGENET1K_V1
    if short not in enum.__members__:
        known = ", ".join(enum.__members__)
        raise UserError(f"--pretrained {spec}: tv:{name} has the weights {known} (or DEFAULT, or a file)")
    return enum[short]


def cache_path(weights) -> Path:
    """Where torchvision keeps ``weights`` (``$TORCH_HOME/hub/checkpoints/<file of the URL>``)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(urlparse(weights.url).path).name


def _enum_state_dict(weights) -> dict[str, torch.Tensor]:
    """torchvision's weights, tensors only (``weights_only``: a file in a shared cache never runs code; torch.hub's
    default would unpickle anything), downloaded with their hash checked when the cache lacks them."""
    path = cache_path(weights)
    try:
        state = weights.get_state_dict(progress=False, check_hash=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a failed download, a cut, empty, foreign or code-carrying file
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:160]
        if path.is_file():  # there, and refused: no download was tried
            raise UserError(
                f"--pretrained {weights}: {path} cannot be read as weights ({why}...); delete it, then download "
                f"{weights.url} to {path} again (or let the run download it)"
            ) from None
        raise UserError(
            f"--pretrained {weights}: {path} is missing or unreadable and the download failed ({why}); download "
            f"{weights.url} on a machine with network and copy it to {path} (TORCH_HOME sets the folder), or pass "
            "--pretrained PATH"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(f"--pretrained {weights}: {path} holds a {type(state).__name__}, not a state dict of "
                        f"tensors; delete it, and download {weights.url} to {path} again")  # fmt: skip
    return state


def fetch_default_weights(model: str, download: bool = True, timeout_s: float = 30.0) -> tuple[Path | None, str]:
    """``model``'s default weights in torchvision's cache: (the file, "") when they are there or were just
    downloaded into it (``download``; a socket ``timeout_s``: an unreachable index fails in seconds, not hangs),
    else (None, why in words)."""
    import socket

    weights = _weights_enum(model.removeprefix(tv.PREFIX), DEFAULT)
    path = cache_path(weights)
    try:
        if path.is_file():
            return path, ""
    except OSError as exc:  # a cache folder of another user's (mode 700)
        return None, f"{path} cannot be read ({exc.strerror})"
    if not download:
        return None, f"{path} is missing and downloads are off"
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)
    try:
        weights.get_state_dict(progress=False, check_hash=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - URLError is an OSError; a damaged download a RuntimeError
        return None, f"{path} is missing and {weights.url} cannot be downloaded ({' '.join(str(exc).split())[:80]})"
    finally:
        socket.setdefaulttimeout(before)
    return (path, "") if path.is_file() else (None, f"{path} is missing after its download")


def is_torchvisions(path: Path) -> bool:
    """Whether the file in torchvision's cache has torchvision's hash (its name carries the first hex digits)."""
    named = _named_hash(Path(path))
    return named is not None and _sha256(Path(path)).startswith(named)


def _named_hash(path: Path) -> str | None:
    """The first hex digits of its sha256 that a torchvision weights file's name carries (``resnet18-f37072fd``)."""
    found = re.search(r"-([a-f0-9]+)\.", path.name)
    return found.group(1) if found else None


def weights_url(model: str) -> tuple[str, Path]:
    """Where ``model``'s default weights are downloaded from, and where torchvision's cache keeps them."""
    weights = _weights_enum(model.removeprefix(tv.PREFIX), DEFAULT)
    return weights.url, cache_path(weights)


@functools.lru_cache(maxsize=16)
def head_names(name: str, in_channels: int, image_size: int, num_classes: int) -> tuple[str, ...]:
    """The tensors of ``tv:name`` whose shape follows the number of classes (meta device: nothing allocated)."""
    shapes = {
        k: tuple(v.shape) for k, v in tv.meta_build(name, num_classes, in_channels, image_size).state_dict().items()
    }
    other = tv.meta_build(name, num_classes + 1, in_channels, image_size).state_dict()
    return tuple(k for k, v in other.items() if shapes.get(k) != tuple(v.shape))


def describe(model: str, spec: str, in_channels: int, image_size: int, num_classes: int) -> PretrainedInfo:
    """What ``--pretrained spec`` brings for ``model`` on this data, without reading the tensors."""
    name = model.removeprefix(tv.PREFIX)
    head = head_names(name, in_channels, image_size, num_classes)
    source, weights = spec, None
    if not is_file_spec(spec):
        weights = _weights_enum(name, spec)
        source = f"{type(weights).__name__}.{weights.name}"
    else:  # a file: the normalisation of the architecture's default weights, the convention it was trained with
        try:
            weights = _weights_enum(name, DEFAULT)
        except UserError:
            weights = None
    transforms = weights.transforms() if weights is not None else None
    mean, std = getattr(transforms, "mean", None), getattr(transforms, "std", None)
    crop = getattr(transforms, "crop_size", None)
    file, sha256, source = _provenance(spec, weights, source)
    if mean is None:
        norm_from = "the training images (the weights name no normalisation)"
    elif is_file_spec(spec):
        convention = f"{type(weights).__name__}.{weights.name}"
        norm_from = f"{convention}'s convention (a weights file carries none: the architecture's default assumed)"
    else:
        norm_from = f"the weights ({source})"
    return PretrainedInfo(source=source, mean=_per_channel(mean, in_channels), std=_per_channel(std, in_channels),
                          crop_size=int(crop[0]) if crop else None, head=head, file=file, sha256=sha256,
                          norm_from=norm_from)  # fmt: skip


def _provenance(spec: str, weights, source: str) -> tuple[str | None, str | None, str]:
    """(the file, its sha256, the source to record). Named weights are recorded as such only when the file in
    torchvision's cache has torchvision's hash (its name carries the hash's first hex digits); any other file
    there is recorded as the file it is."""
    path = Path(spec) if is_file_spec(spec) else cache_path(weights)
    if not path.is_file():
        return None, None, source  # a resume after the file moved; or torchvision downloads it, hash checked
    sha256, named = _sha256(path), _named_hash(path)
    if not is_file_spec(spec) and named and not sha256.startswith(named):
        source = f"{path} (a file under the name of {source}'s, but not torchvision's: its sha256 differs)"
    return str(path), sha256, source


def _sha256(path: Path) -> str:
    """The file's sha256, read once a process while the file stays as it was (the photo defaults and
    :func:`describe` both ask for it)."""
    st = path.stat()
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@functools.lru_cache(maxsize=8)
def _sha256_of(path: str, *stamp: int) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _per_channel(values, channels: int) -> tuple[float, ...] | None:
    """RGB statistics for a model of ``channels`` inputs: as they are for 3, their average for another count."""
    if not values:
        return None
    values = [float(v) for v in values]
    if channels == len(values):
        return tuple(values)
    return tuple([sum(values) / len(values)] * channels)


def load_pretrained(
    model: nn.Module, name: str, spec: str, info: PretrainedInfo, from_file: dict[str, torch.Tensor] | None = None
) -> list[str]:
    """Copy the weights ``spec`` names into ``model`` (``tv:name``, built for the data); returns notes.

    ``from_file``: the state dict of a weights file (``spec`` a path), read by the caller with the checkpoint
    package's safe reader; torchvision's weights are read here. The head keeps its fresh initialisation where its
    shape differs; a first convolution is adapted to the model's input channels (module docstring). Any other
    tensor that does not fit is a one-line UserError.
    """
    arch = name.removeprefix(tv.PREFIX)
    source = from_file if from_file is not None else _enum_state_dict(_weights_enum(arch, spec))
    odd = [str(k) for k, v in source.items() if not isinstance(k, str) or not _plain(v)]
    if odd:  # a key that is not a name; a tensor on the meta device, sparse or complex: no weights to train from
        raise UserError(
            f"--pretrained {info.source}: {len(odd)} entr(ies) are not named real tensors with values "
            f"({', '.join(odd[:3])}): the file is damaged or not a weights file; download or export it again"
        )
    target = model.state_dict()
    loaded, fresh, notes = {}, [], []
    for key, value in target.items():
        got = source.get(key)
        if got is not None and got.shape == value.shape:
            loaded[key] = got
        elif got is not None and _is_first_conv(key, got, value):
            loaded[key] = adapt_first_conv(got, value.shape[1])
            notes.append(f"{key}: {got.shape[1]} input channels adapted to {value.shape[1]}")
        elif key in info.head:
            fresh.append(key)
        else:
            shown = "missing" if got is None else f"{tuple(got.shape)}, the model has {tuple(value.shape)}"
            raise UserError(
                f"--pretrained {info.source}: tensor {key} is {shown}; the weights do not fit this architecture "
                "(pass weights of the same tv: model)"
            )
    foreign = [key for key in source if key not in target and not key.endswith("num_batches_tracked")]
    if foreign:  # resnet34's weights hold every tensor of resnet18's, and more
        raise UserError(
            f"--pretrained {info.source}: the weights hold {len(foreign)} tensor(s) this architecture has not "
            f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): they are another architecture's; pass "
            "weights of the same tv: model"
        )
    model.load_state_dict({**target, **loaded})
    if fresh:
        notes.append(f"new head for the data's classes: {', '.join(fresh)}")
    return notes


def _plain(value) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and not value.is_meta
        and value.layout == torch.strided
        and not (value.is_complex())
    )


def _is_first_conv(key: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    return (
        got.dim() == 4
        and want.dim() == 4
        and got.shape[1] == 3
        and got.shape[0] == want.shape[0]
        and (got.shape[2:] == want.shape[2:])
    )


def adapt_first_conv(weight: torch.Tensor, channels: int) -> torch.Tensor:
    """RGB filters ``[out, 3, k, k]`` for ``channels`` inputs: summed for 1 (a gray image in 3 channels gives the
    same response), repeated and scaled by 3/channels for more (as timm's ``adapt_input_conv``)."""
    if channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeats = -(-channels // 3)
    return weight.repeat(1, repeats, 1, 1)[:, :channels] * (3 / channels)
