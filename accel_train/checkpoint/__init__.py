"""Checkpoints: resumable training state (``state``) and weights from anywhere (``weights``)."""

from accel_train.checkpoint.state import (
    TrainState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
)

_WEIGHTS_API = (
    "read_state_dict",
    "load_weights",
    "load_model",
    "export_weights",
    "inspect_checkpoint",
    "unwrap_state_dict",
)

__all__ = [
    "TrainState",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "resolve_resume",
    "save_checkpoint",
    *_WEIGHTS_API,
]


def __getattr__(name):  # weights pulls in safetensors/torch.load only when used
    if name in _WEIGHTS_API:
        from accel_train.checkpoint import weights

        return getattr(weights, name)
    raise AttributeError(name)
