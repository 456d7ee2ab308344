"""Checkpoints: resumable training state (``state``) and weights from anywhere (``weights``).

``load_weights(model, source, strict=True)`` loads any export, checkpoint or state dict into your module;
``load_model(source)`` rebuilds the model a config names and returns ``LoadedModel(model, config)``.
"""

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
    "LoadedModel",
    "saved_model_config",
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
