"""Build a run: config → data → model → optimizer → ``accelerator.prepare`` → resume → run folder → Trainer.

Every input is loaded and checked here, before the run folder is created or an
earlier run is replaced.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from accel_train.attempts import Attempts
from accel_train.checkpoint.branch import abandon_after, newer_checkpoints
from accel_train.checkpoint.sources import read_state_dict
from accel_train.checkpoint.state import (
    TrainState,
    install_unwrapped_weight_hooks,
    load_checkpoint,
    read_progress,
)
from accel_train.config import TrainConfig, save_config
from accel_train.data import build_dataset
from accel_train.data.base import DataSplits
from accel_train.data.folder import unaugmented_sample
from accel_train.data.identity import check_same_data
from accel_train.data.pipeline import BatchNormalizer, BatchPlan, place_on_device, plan_batches
from accel_train.data.settings import refuse_flags_that_do_not_apply
from accel_train.defaults import Defaults, choose
from accel_train.errors import CheckpointError, UserError
from accel_train.features import TrainFeatures, use_keyed_dropout
from accel_train.features.device_batch import AUTO, fit_device_batch
from accel_train.features.finetune import freeze, frozen_names, head_lr_scales, keep_statistics_said
from accel_train.fsio import writing
from accel_train.meters import StepTimer, Window
from accel_train.models import check_model_name, create_model
from accel_train.models.pretrained import PretrainedInfo, check_spec, is_file_spec, load_pretrained
from accel_train.models.pretrained import describe as describe_pretrained
from accel_train.optim import GradClipper, build_optimizer, build_scheduler, direct_backward, replan_schedule
from accel_train.photo_defaults import choose_for_photos
from accel_train.plan_warnings import warn_about_run
from accel_train.resume import check_extension
from accel_train.run_dir import ABANDONED, CONFIG, DATA_FILES, RunDir
from accel_train.runtime import Runtime, bf16_cpu_note, check_fsdp_batchnorm, configure_backends
from accel_train.sync_bn import apply_sync_bn, warn_parity_breakers
from accel_train.tasks import ImageTask, check_resumed_task, refuse_image_options
from accel_train.tracking import RunLogger, tracker_names
from accel_train.trainer import Trainer


def build_trainer(
    cfg: TrainConfig,
    rt: Runtime,
    run_dir: RunDir,
    resume_path: Path | None = None,
    resume_changes: dict[str, list[Any]] | None = None,
    **given: Any,
) -> Trainer:
    """Everything a run needs, prepared for this setup; the run folder is created and locked last.

    ``resume_path``: the checkpoint ``--resume`` resolved to, None for a fresh run (``loop.fit`` resolves it
    once, before the runtime); ``resume_changes``: what this attempt changed in that run's config
    (``resume.reconcile``).
    """
    acc = rt.accelerator
    cfg, picked = _with_defaults(cfg, fresh=resume_path is None)  # the user's own data: its defaults (defaults.py)
    _check_inputs(cfg, rt, run_dir, resume_path)
    cfg, picked, splits = _data(cfg, rt, picked, given.get("splits"))
    task = given.get("task") or ImageTask(splits.info.num_classes)  # what a batch is and how a run is scored
    refuse_image_options(cfg, task)
    if resume_path is not None:
        check_resumed_task((read_progress(resume_path).get("resolved") or {}).get("task"), task)
    ident = _check_resumed_data(cfg, rt, splits, run_dir, resume_path, given.get("splits"))  # before any model
    device_batch = None if cfg.max_device_batch == AUTO else cfg.max_device_batch  # auto: probed in _prepare
    plan = plan_batches(acc.num_processes, cfg.batch_size, cfg.grad_accum_steps, cfg.global_batch_size, device_batch)
    lr = cfg.lr * plan.global_batch / cfg.batch_size if cfg.scale_lr else cfg.lr
    pre = _pretrained_info(cfg, rt, splits)  # before the normalisation is chosen: the weights bring their own
    model, optimizer, train_dl, eval_dl, chosen, plan, feats = _prepare(
        cfg, rt, splits, plan, lr, task, given.get("model"), pre, fresh=resume_path is None
    )
    acc.gradient_accumulation_steps = plan.accum_steps
    bitwise = _bitwise(cfg, rt, model, plan)  # its refusals before the run folder is touched
    steps_per_epoch = len(train_dl) // plan.accum_steps
    cfg = _replaced(cfg, epochs=picked.epochs(cfg.epochs, steps_per_epoch))  # at least its minimum of steps
    total_steps = cfg.max_steps or steps_per_epoch * cfg.epochs
    warn_about_run(cfg, rt, splits, total_steps)  # settings that never fire in a run this short
    scheduler = _scheduler(cfg, optimizer.optimizer, total_steps)
    install_unwrapped_weight_hooks(acc)  # nothing is registered for checkpointing: see checkpoint.safe_load
    resolved = _resolved(acc, plan, lr, total_steps, steps_per_epoch, chosen)
    resolved["augment"] = splits.extra.get("augment")  # the description: random_crop(...)+hflip, or None
    resolved["task"] = task.record()  # None for images; the generic task's kind, metrics and monitor
    resolved["defaults"] = picked.record(cfg.epochs) if picked else _saved_defaults(resume_path)  # what, and why
    if picked.pretrained and pre is not None:
        resolved["defaults"].update(pre.record())  # the weights' file and sha256
    meta = _meta(cfg, splits, pre, resolved, ident, task, resume_path)
    state = _resume(cfg, rt, resume_path, scheduler, plan, total_steps, feats) if resume_path else TrainState()
    _open_run_folder(cfg, rt, run_dir, resume_path, resolved, ident)
    resumed = f"; resumed from {resume_path} at step {state.global_step}" if resume_path else ""
    plan_line = f"{plan.describe()}; lr {lr:g}; {total_steps} steps ({steps_per_epoch}/epoch){resumed}"
    _announce(cfg, rt, splits, plan_line, picked.describe(cfg.epochs, steps_per_epoch) if picked else None, task)
    logger, window = _logging(cfg, acc, run_dir, total_steps, state)
    if resume_path is not None:
        logger.event("resume", state.global_step, state.epoch, path=str(resume_path), changed=resume_changes or {})
    return Trainer(
        cfg,
        rt,
        model,
        optimizer,
        scheduler,
        train_dl,
        eval_dl,
        plan=plan,
        info=splits.info,
        total_steps=total_steps,
        steps_per_epoch=steps_per_epoch,
        logger=logger,
        task=task,
        meta=meta,
        run_dir=run_dir,
        state=state,
        resume_path=resume_path,
        features=feats,
        window=window,
        timer=StepTimer(train_s=_saved_seconds(state.extra.get("train_time_s"))),
        attempts=Attempts() if resume_path is None else Attempts.resumed(state.extra, state.global_step),
        clip=GradClipper(acc, model, cfg.max_grad_norm) if cfg.max_grad_norm > 0 else None,
        direct=direct_backward(acc, plan.accum_steps),
        bitwise=bitwise,
    )


def _bitwise(cfg: TrainConfig, rt: Runtime, model, plan: BatchPlan):
    """--bitwise: its refusals for this setup, then the step that sums the micro-batches in one order."""
    if not cfg.bitwise:
        return None
    from accel_train.bitwise import BitwiseStep, refuse_unless_bitwise

    refuse_unless_bitwise(rt.accelerator, model, rt.data_parallel, plan.micro_batch, cfg.max_device_batch)
    return BitwiseStep(rt.accelerator, model, plan.accum_steps)


def _logging(cfg: TrainConfig, acc, run_dir: RunDir, total_steps: int, state: TrainState) -> tuple[RunLogger, Window]:
    """The run's logger (metrics.jsonl, progress bar, trackers) and its loss window, restored on a resume."""
    eval_lines_every = cfg.log_every if cfg.eval_every == 0 else 1  # evaluations asked for by steps: every line
    logger = RunLogger(
        acc, run_dir.metrics, total_steps, state.global_step, cfg.progress, cfg.report_to != "none", eval_lines_every
    )
    window = Window(acc.device)
    window.restore(state.extra.get("log_window"), acc.is_main_process)
    return logger, window


def _announce(cfg: TrainConfig, rt: Runtime, splits: DataSplits, plan_line: str, picked: str | None, task) -> None:
    """The run's header: what trains on what, on which setup, with which batch, LR and length; the defaults chosen
    for the data (``picked``, None when none were), the task when it is not an image classification."""
    acc = rt.accelerator
    rt.print(  # before the progress bar exists, so the header does not end up on the bar's line
        f"accel_train: {cfg.model} on {cfg.dataset} ({len(splits.train)} train / {len(splits.test)} test) | "
        f"{acc.num_processes} process(es), {acc.distributed_type.value}, device {acc.device}, "
        f"mixed precision {acc.mixed_precision}, {rt.threads} thread(s)/process ({rt.threads_why})\n"
        f"accel_train: {plan_line}"
    )
    bf16_note = bf16_cpu_note(acc.mixed_precision, acc.device.type)
    if bf16_note:
        rt.print(f"accel_train: bf16 on CPU: {bf16_note}")
    if picked:
        rt.print(f"accel_train: {picked}")
    if task.kind != "image":
        rt.print(f"accel_train: task: {task.describe()}")


def _with_defaults(cfg: TrainConfig, fresh: bool) -> tuple[TrainConfig, Defaults]:
    """A fresh run's config with the defaults chosen for its data (``defaults.choose``: model, augmentation, least
    steps, for what the user did not set); a resume restores what its first attempt chose, and chooses nothing."""
    picked = choose(cfg.dataset, getattr(cfg, "given", None)) if fresh else Defaults(cfg.dataset)
    return _replaced(cfg, **picked.settings()), picked


def _saved_defaults(resume_path: Path | None) -> Any:
    """What the first attempt of a resumed run chose for its data (its checkpoint's record), None for a fresh run."""
    resolved = read_progress(resume_path).get("resolved") if resume_path is not None else None
    return resolved.get("defaults") if isinstance(resolved, dict) else None


def _replaced(cfg: TrainConfig, **changes: Any) -> TrainConfig:
    """``cfg`` with ``changes`` (itself when they change nothing), validated again, what the user set kept."""
    if all(getattr(cfg, name) == value for name, value in changes.items()):
        return cfg
    return dataclasses.replace(cfg, **changes).validate(given=getattr(cfg, "given", None))


def _saved_seconds(value: Any) -> float:
    """A checkpoint's training seconds so far (0 for a fresh run, an older checkpoint or a damaged value)."""
    return float(value) if isinstance(value, (int, float)) and 0 <= value < float("inf") else 0.0


def _resolved(acc, plan: BatchPlan, lr: float, total_steps: int, steps_per_epoch: int, chosen: dict) -> dict[str, Any]:
    """What this setup made of the config: recorded in config.yaml, checkpoints and summary.json."""
    return {
        "world_size": acc.num_processes,
        "distributed_type": acc.distributed_type.value,
        "mixed_precision": acc.mixed_precision,
        "device": str(acc.device),
        "global_batch": plan.global_batch,
        "micro_batch": plan.micro_batch,
        "accum_steps": plan.accum_steps,
        "lr": lr,
        "total_steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        **chosen,  # tf32, cudnn_benchmark, channels_last, data_on_device
    }


def _check_inputs(cfg: TrainConfig, rt: Runtime, run_dir: RunDir, resume_path: Path | None) -> None:
    """What can be refused before a possibly long dataset load: the model's name, an older checkpoint's branch,
    the --pretrained file a fresh run reads (a resume reads its checkpoint instead: a moved file is a note)."""
    check_model_name(cfg.model)  # before a possibly long dataset load
    if resume_path is not None:
        branch_if_older(cfg, rt, run_dir, resume_path, move=False)  # refuse early, move only once all loaded
        if cfg.pretrained and is_file_spec(cfg.pretrained) and not Path(cfg.pretrained).is_file():
            rt.print(f"accel_train: note: --pretrained {cfg.pretrained} is gone; the checkpoint holds the weights")
    elif cfg.pretrained:
        check_spec(cfg.model, cfg.pretrained)  # --resume auto without a checkpoint: a fresh run reads the file


def _pretrained_info(cfg: TrainConfig, rt: Runtime, splits: DataSplits) -> PretrainedInfo | None:
    """--pretrained: what the weights bring; their input normalisation replaces the dataset's (recorded in the
    export's config.json, so predict and eval normalise as the run did)."""
    if cfg.pretrained is None:
        return None
    info = splits.info
    pre = describe_pretrained(cfg.model, cfg.pretrained, info.in_channels, info.image_size, info.num_classes)
    if pre.mean is not None and pre.std is not None:
        splits.info = dataclasses.replace(info, mean=pre.mean, std=pre.std)
    mean, std = (", ".join(f"{v:g}" for v in values) for values in (splits.info.mean, splits.info.std))
    rt.print(f"accel_train: --pretrained: normalised with mean ({mean}) std ({std}) from {pre.norm_from}")
    return pre


def _load_pretrained(cfg: TrainConfig, rt: Runtime, model, pre: PretrainedInfo) -> None:
    """--pretrained: the weights into the new model (a resume loads its checkpoint's instead)."""
    rt.print(f"accel_train: --pretrained: {pre.source}")
    from_file = read_state_dict(cfg.pretrained)[0] if is_file_spec(cfg.pretrained) else None  # never unpickles code
    for note in load_pretrained(model, cfg.model, cfg.pretrained, pre, from_file):
        rt.print(f"accel_train: --pretrained: {note}")
    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:  # it would train to NaN losses and NaN metrics
        raise UserError(
            f"--pretrained {cfg.pretrained}: {len(bad)} tensor(s) hold NaN or Inf values ({', '.join(bad[:3])}"
            f"{', ...' if len(bad) > 3 else ''}); the weights file is damaged: download or export it again"
        )


def _freeze(cfg: TrainConfig, rt: Runtime, model, pre: PretrainedInfo | None) -> None:
    """--freeze: the chosen parameters out of the optimizer, their BatchNorm layers in eval mode."""
    names = frozen_names(model, cfg.freeze, pre.head if pre else ())
    kept = freeze(model, names)
    rt.print(
        f"accel_train: --freeze {cfg.freeze}: {len(names)} parameter tensors kept as loaded, "
        f"{len(kept)} BatchNorm layers with their statistics"
    )


def _data(cfg: TrainConfig, rt: Runtime, picked: Defaults, given: DataSplits | None):
    """(config, defaults, data): the run's data (``given``: accel_train.train's), read on process 0 first
    (downloads and caches happen once), a folder of photos with ImageNet weights when they are at hand
    (``photo_defaults``), the same on every process (``data.identity.check_same_data``)."""
    with rt.accelerator.main_process_first():
        splits = given or build_dataset(cfg.data_config())
    check_same_data(rt.accelerator, splits)  # before the photos' collective: ranks on other data leave here
    photos = choose_for_photos(cfg, rt, splits, picked) if given is None else picked
    if photos is not picked:
        cfg, picked, before = _replaced(cfg, **photos.settings()), photos, cfg
        if cfg.image_size != before.image_size:  # read again at the weights' size
            with rt.accelerator.main_process_first():
                splits = build_dataset(cfg.data_config())
            check_same_data(rt.accelerator, splits)
    return cfg, picked, splits


def _check_resumed_data(cfg: TrainConfig, rt: Runtime, splits: DataSplits, run_dir: RunDir, resume_path, given_data):
    """The data's identity (data.identity); a resume on other data than its checkpoint's is refused in one line
    (process 0 compares: machines' copies may differ in modification times alone), or with
    --resume-changed-data said and accepted."""
    from accel_train.data.identity import load_files, of_splits
    from accel_train.resume import data_change, data_refusal

    ident = of_splits(splits)
    own_split = splits.extra.get("split") in ("folders", "files", "splits")
    given = {name: getattr(cfg, name) for name in getattr(cfg, "given", None) or () if hasattr(cfg, name)}
    if given_data is None:  # (accel_train.train's own data takes no dataset flags)
        refuse_flags_that_do_not_apply(cfg.dataset, given, own_split)
    if resume_path is None:
        return ident
    change = shape = step = None
    if rt.is_main:
        progress = read_progress(resume_path)
        recorded = (progress.get("resolved") or {}).get("data") or {}
        files = load_files(run_dir / DATA_FILES, recorded.get("digest", "")) if recorded else None
        change, shape = data_change(progress, ident, files), _shape_change(progress.get("model_config"), splits.info)
        step = progress["state"]["global_step"]
    if rt.accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        change, shape, step = gather_object([(change, shape, step)])[0]
    if change is None and shape is None:
        return ident
    if shape is not None:  # no flag helps: the checkpoint's weights do not fit the model this data needs
        said = data_refusal(cfg.dataset, step, "; ".join(filter(None, [change, shape])))
        raise UserError(said.split("; --resume-changed-data")[0])
    if not cfg.resume_changed_data:
        raise UserError(data_refusal(cfg.dataset, step, change))
    rt.warn(f"resume is not exact: --resume-changed-data: the data changed since step {step}: {change}")
    return ident


def _prepare(
    cfg: TrainConfig,
    rt: Runtime,
    splits: DataSplits,
    plan: BatchPlan,
    lr: float,
    task,
    model=None,
    pre: PretrainedInfo | None = None,
    fresh: bool = True,
):
    """Model (identical init on every rank; or ``model``, the caller's), optimizer and loaders, prepared."""
    from accelerate.utils import set_seed

    acc = rt.accelerator
    set_seed(cfg.seed)
    if hasattr(splits.train, "augment_seed"):
        splits.train.augment_seed = cfg.seed
    info, built_here = splits.info, model is None and fresh  # a fresh model of ours: no statistics of its own
    if model is None:
        model = create_model(cfg.model, info.num_classes, info.in_channels, info.image_size)
        if pre is not None and fresh:
            _load_pretrained(cfg, rt, model, pre)
    _init_from_data(model, splits)
    model, dropout = use_keyed_dropout(model, cfg.seed)  # masks keyed on the sample, the same on any setup
    conv = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    backends = configure_backends(acc.device, acc.mixed_precision, cfg.tf32, cfg.channels_last, conv)
    check_fsdp_batchnorm(acc.distributed_type, acc.mixed_precision, acc.device.type, backends.channels_last, model)
    if cfg.max_device_batch == AUTO:  # probed before --sync-bn: no rank may wait in a collective meanwhile
        shape = (info.in_channels, info.image_size, info.image_size)
        step = getattr(task, "probe_step", None)  # a batch of the task's own samples (images: zeros)
        run = (lambda micro: step(model, splits, micro, acc)) if step else None
        plan = fit_device_batch(acc, model, plan, shape, dropout, cfg.mixup > 0 or cfg.cutmix > 0, run)
    if cfg.sync_bn:  # before DDP wrapping, which must see the synchronised layers
        model = apply_sync_bn(model, rt)
    if cfg.freeze:  # after --sync-bn, which replaces BatchNorm layers
        _freeze(cfg, rt, model, pre)
    if cfg.bn_stats == "loaded":  # said when the statistics are no one's: a fresh model without --pretrained
        said, warning = keep_statistics_said(model, cfg.model, untrained=built_here and pre is None)
        rt.print(f"accel_train: {said}")
        if warning:
            rt.warn(warning)
    warn_parity_breakers(model, rt, plan.micro_batch, cfg.model, cfg.sync_bn)
    scales = head_lr_scales(model, pre.head, lr, cfg.head_lr) if cfg.head_lr and pre else {}
    if backends.channels_last:
        model = model.to(memory_format=torch.channels_last)
    monitor = (task.monitor, task.higher)  # what early stopping follows
    features = TrainFeatures.for_run(cfg, model, dropout, acc, task.checked_classes, monitor)  # --ema copies the model
    if features.mixer is not None:
        features.mixer.check_micro_batch(plan.micro_batch)
    model = rt.prepare_model(model)  # --compile happens inside prepare, after DDP wrapping (runtime)
    optimizer = build_optimizer(model, lr, cfg.optimizer, cfg.weight_decay, cfg.momentum, cfg.nesterov, scales)
    workers = 0 if splits.in_memory else cfg.num_workers  # in-memory batches are one index op
    # in-memory splits that fit move to the GPU once: their batches are indexed and augmented there, unpinned
    on_device = place_on_device([splits.train, splits.test], acc.device, cfg.data_on_device)
    pin = tuple(acc.device.type == "cuda" and split not in on_device for split in (splits.train, splits.test))
    eval_batch = cfg.eval_batch_size or 2 * plan.micro_batch
    sizes = (plan.micro_batch, eval_batch, cfg.seed, plan.global_batch)
    train_dl, eval_dl = task.loaders(splits, *sizes, acc, workers, pin)
    task.ready(info, backends.channels_last, rt.print)  # images: their normalisation, in the model's layout
    task.check(acc, model, eval_dl)  # any task: one eval batch through the model and the metrics, before the run
    chosen = {**dataclasses.asdict(backends), "data_on_device": splits.train in on_device}
    if not task.eval_prepared:  # the task's own block of the eval set on each rank
        return (*acc.prepare(model, optimizer, train_dl), eval_dl, chosen, plan, features)
    return (*acc.prepare(model, optimizer, train_dl, eval_dl), chosen, plan, features)


def _init_from_data(model: torch.nn.Module, splits: DataSplits) -> None:
    """A model with ``init_from_data(images)`` (airbench's whitening layer) is given normalised training images:
    up to ``model.init_samples`` evenly spaced ones, unaugmented, from the whole split (not this process's
    shard), so every process computes the same initial weights."""
    init = getattr(model, "init_from_data", None)
    if not callable(init) or len(splits.train) == 0:
        return
    images = unaugmented_sample(splits.train, int(getattr(model, "init_samples", 5000)))
    init(BatchNormalizer(splits.info.mean, splits.info.std)(images))


def _scheduler(cfg: TrainConfig, optimizer, total_steps: int):
    """The LR schedule the flags describe (``optim`` takes plain values, not the config)."""
    shape = (cfg.lr_schedule, cfg.warmup_steps, cfg.lr_milestones, cfg.lr_gamma, cfg.warmup_from)
    return build_scheduler(optimizer, total_steps, *shape)


def _meta(cfg: TrainConfig, splits: DataSplits, pre, resolved: dict[str, Any], ident, task, resume_path=None) -> dict:
    """What every checkpoint carries: the model's config, the run's config, what this setup made of it, and
    (``resolved["data"]``, also in the export's config.json for eval.py) what the run trains on. A resume keeps
    its first attempt's record of the weights it started from, whatever the cache holds now."""
    resolved["data"] = ident.record() if ident is not None else None  # data.identity
    model_config = {**task.model_config(cfg, splits, pre), "data": resolved["data"]}
    if resume_path is not None and pre is not None:
        saved = read_progress(resume_path).get("model_config") or {}
        model_config = {k: v for k, v in model_config.items() if not k.startswith("pretrained")}
        model_config.update({k: v for k, v in saved.items() if k.startswith("pretrained")})
    return {"model_config": model_config, "config": cfg.to_dict(), "resolved": resolved}


def _resume(
    cfg: TrainConfig, rt: Runtime, resume_path: Path, scheduler, plan: BatchPlan, total_steps: int, feats: TrainFeatures
) -> TrainState:
    acc = rt.accelerator
    state, progress, notes = load_checkpoint(acc, resume_path, scheduler, cfg.resume_inexact, cfg.seed)
    feats.restore(state.extra, resume_path)  # EMA weights, early-stopping counter
    check_extension(cfg, state.global_step, total_steps)
    replan_schedule(scheduler, total_steps)
    for note in notes:
        rt.warn(f"resume is not exact: {note}")
    acc.step = 0  # micro-step counter: re-aligned to the (maybe different) accumulation of this setup
    old = progress.get("resolved", {})
    if old.get("global_batch") not in (None, plan.global_batch):
        rt.warn(
            f"resuming a run trained with global batch {old['global_batch']} at global batch "
            f"{plan.global_batch}: pass --global-batch-size {old['global_batch']} to continue it exactly"
        )
    return state


def _shape_change(saved: Any, info) -> str | None:
    """How the model the data gives now differs from the checkpoint's (classes, channels, size), in words."""
    if not isinstance(saved, dict):
        return None
    now = {"num_classes": info.num_classes, "in_channels": info.in_channels, "image_size": info.image_size}
    now["class_names"] = list(info.class_names)
    differ = [k for k, v in now.items() if k in saved and saved[k] != v]
    return "; ".join(f"it reads as {k} {str(now[k])[:80]}, the checkpoint's model has {str(saved[k])[:80]}"
                     for k in differ) or None  # fmt: skip


def _open_run_folder(
    cfg: TrainConfig, rt: Runtime, run_dir: RunDir, resume_path: Path | None, resolved: dict[str, Any], ident=None
) -> None:
    """Create, lock and (with --overwrite) stage the folder, branch if asked, write config.yaml (collective)."""
    acc = rt.accelerator
    if rt.is_main:
        replace = cfg.overwrite and cfg.resume == "none"
        for note in run_dir.prepare(overwrite=replace, restart=resume_path is None and cfg.resume != "none"):
            rt.print(f"accel_train: {note}")
    acc.wait_for_everyone()  # locked from here on
    if resume_path is not None:
        branch_if_older(cfg, rt, run_dir, resume_path, move=True)
    if rt.is_main:
        with writing(run_dir / CONFIG, "the run config"):
            save_config(cfg, run_dir / CONFIG, extra=resolved)
        if ident is not None:  # the file list a later resume names its changes by
            with writing(run_dir / DATA_FILES, "the data's file list"):
                ident.save_files(run_dir / DATA_FILES)
    if cfg.report_to != "none":
        # No config= here: TensorBoard's add_hparams writes a second, timestamped run into tb/ on every attempt,
        # so TensorBoard would show one run as two. The config goes in as text, into the run itself.
        acc.init_trackers("tb")
        if rt.is_main and "tensorboard" in tracker_names(cfg.report_to):
            text = (run_dir / CONFIG).read_text()
            acc.get_tracker("tensorboard", unwrap=True).add_text("config", f"```\n{text}\n```", 0)


def branch_if_older(cfg: TrainConfig, rt: Runtime, run_dir: RunDir, resume_path: Path, move: bool) -> None:
    """A resume from an older checkpoint: refuse, or with --branch move the newer timeline aside (main)."""
    step = read_progress(resume_path)["state"]["global_step"]
    newer = newer_checkpoints(run_dir, step, resume_path)
    if not newer:
        return
    if not cfg.branch:
        listed = ", ".join(f"step {s}" for s in newer[:5])
        raise CheckpointError(
            f"--resume {resume_path} is at step {step}, but {run_dir.checkpoints} holds newer checkpoints "
            f"({listed}) of the timeline you would leave; pass --branch to move them to "
            f"{run_dir / ABANDONED}/ and continue from step {step}, or resume into another --output-dir"
        )
    if move and rt.is_main:
        dest = abandon_after(run_dir, step, resume_path)
        rt.print(f"accel_train: --branch: moved the checkpoints after step {step} and their metrics to {dest}")
