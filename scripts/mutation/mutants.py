"""The mutant list (``MUTANTS``, with ``data_mutants.DATA_MUTANTS``; what a mutant is: ``base.py``), the tests
that should catch each, reading another list from JSON, and whether a mutant is stale (its ``old`` snippet not
exactly once in its file, because the code moved)."""

from __future__ import annotations

import json
from pathlib import Path

from mutation.base import PACKAGE, PROMISES, CheckError, Mutant, _m
from mutation.data_mutants import DATA_MUTANTS
from mutation.defaults_mutants import DEFAULTS_MUTANTS
from mutation.tasks_mutants import TASKS_MUTANTS

__all__ = [
    "DATA_MUTANTS",
    "DEFAULTS_MUTANTS",
    "MUTANTS",
    "PACKAGE",
    "PROMISES",
    "TASKS_MUTANTS",
    "CheckError",
    "Mutant",
    "load_mutants",
    "select",
]

T_PROMISES = "tests/integration/test_promises_runs.py"
T_DEFAULTS_RUNS = "tests/integration/test_defaults_runs.py"
# fmt: off
MUTANTS: tuple[Mutant, ...] = (
    # ---- unwrapping and export -------------------------------------------------------------------------------------
    _m("export-keeps-wrapper-prefix", "unwrapping and export", "checkpoint/weights.py",
       "    sd, _ = _strip_uniform(dict(sd))\n", "    sd = dict(sd)\n",
       "tests/unit/test_promises.py::test_a_compiled_models_export_has_no_wrapper_prefix"),
    _m("reader-keeps-wrapper-prefix", "unwrapping and export", "checkpoint/sources.py",
       "    sd, prefixes = _strip_uniform(raw)\n", "    sd, prefixes = dict(raw), []\n",
       "tests/unit/test_weights.py::test_prefixes_reported_in_order"),
    # matters where accelerate's save_state sees a wrapper: DataParallel (rt.prepare_model wraps before accelerate)
    # and a model the caller compiled (accel_train.train(torch.compile(m))); under DDP it saves the inner module
    _m("checkpoint-keeps-wrapper-prefix", "unwrapping and export", "checkpoint/state.py",
       "weights[i] = _standalone_tensors({strip_key(k): v for k, v in sd.items()})",
       "weights[i] = _standalone_tensors({k: v for k, v in sd.items()})",
       "tests/integration/test_promises_runs.py::test_a_caller_compiled_model_checkpoints_without_prefix_and_resumes"),
    _m("checkpoint-keeps-channels-last-strides", "resume state", "checkpoint/state.py",
       "weights[i] = _standalone_tensors({strip_key(k): v for k, v in sd.items()})",
       "weights[i] = {strip_key(k): v for k, v in sd.items()}",
       "tests/integration/test_resume.py::test_channels_last_run_checkpoints_and_resumes_bitwise"),
    _m("strip-key-strips-one-prefix", "unwrapping and export", "checkpoint/keys.py",
       "    while key.startswith(WRAPPER_PREFIXES):", "    if key.startswith(WRAPPER_PREFIXES):",
       "tests/unit/test_runtime.py::test_data_parallel_wrapper_uses_every_visible_gpu_and_checkpoints_stay_unwrapped"),
    # ---- resume state ----------------------------------------------------------------------------------------------
    _m("scheduler-not-restored", "resume state", "checkpoint/state.py",
       "    if scheduler is not None:\n        _restore_scheduler(",
       "    if scheduler is None:\n        _restore_scheduler(",
       "tests/integration/test_trainer_runs.py::test_stop_at_step_then_resume_logs_what_an_uninterrupted_run_logs",
       "tests/integration/test_resume.py::test_exact_resume_one_process_is_bitwise"),
    _m("log-window-not-restored", "resume state", "build.py",
       'window.restore(state.extra.get("log_window"), acc.is_main_process)',
       "window.restore(None, acc.is_main_process)",
       "tests/integration/test_trainer_runs.py::test_stop_at_step_then_resume_logs_what_an_uninterrupted_run_logs"),
    _m("early-stop-counter-not-restored", "resume state", "features/__init__.py",
       'self.early.restore(extra.get("early_stop"), str(checkpoint))', "self.early.restore(None, str(checkpoint))",
       "tests/integration/test_features_runs.py::test_early_stopping_stops_cleanly_and_resumes_to_the_same_step"),
    # accelerate's load_state restores its micro-step counter (14 after 7 steps of 2 x 2 on 2 processes); on 1
    # process x 4 the first resumed step then ends after 2 micro-batches, and every later one across two global batches
    _m("resume-keeps-old-micro-step-count", "resume state", "build.py",
       "    acc.step = 0  # micro-step counter: re-aligned to the (maybe different) accumulation of this setup\n", "",
       "tests/integration/test_resume.py::test_resume_across_setups"),
    # ---- data order ------------------------------------------------------------------------------------------------
    _m("sampler-ignores-epoch", "data order", "data/pipeline.py",
       "manual_seed(self.seed * 100_003 + self.epoch)", "manual_seed(self.seed * 100_003)",
       "tests/unit/test_runtime.py::test_sampler_order_depends_on_seed_and_epoch_only"),
    _m("loader-epoch-not-set", "data order", "trainer.py",
       "        self.train_dl.set_epoch(state.epoch)\n        loader = self.train_dl\n",
       "        loader = self.train_dl\n",
       "tests/integration/test_resume.py::test_exact_resume_one_process_is_bitwise"),
    _m("resume-skips-steps-not-micro-batches", "data order", "trainer.py",
       "state.step_in_epoch * self.plan.accum_steps)", "state.step_in_epoch)",
       f"{T_PROMISES}::test_mid_epoch_resume_with_gradient_accumulation_is_bit_identical"),
    # ---- global batch and accumulation -----------------------------------------------------------------------------
    _m("global-batch-ignores-accumulation", "global batch and accumulation", "data/pipeline.py",
       "BatchPlan(batch_size * world_size * grad_accum_steps, batch_size,",
       "BatchPlan(batch_size * world_size, batch_size,",
       "tests/unit/test_runtime.py::test_batch_plans"),
    # 12 per process under a cap of 5: ceil gives 3 x 4, the floor 2 x 6, a micro-batch over the cap (a GPU OOM)
    _m("accumulation-steps-rounded-down", "global batch and accumulation", "data/pipeline.py",
       "accum = math.ceil(per_process / cap)", "accum = per_process // cap",
       "tests/unit/test_runtime.py::test_batch_plans"),
    _m("accelerator-accumulation-not-set", "global batch and accumulation", "build.py",
       "    acc.gradient_accumulation_steps = plan.accum_steps\n", "    acc.gradient_accumulation_steps = 1\n",
       f"{T_PROMISES}::test_mid_epoch_resume_with_gradient_accumulation_is_bit_identical",
       "tests/integration/test_data_e2e.py::test_global_batch_gives_the_same_weights_on_every_setup"),
    _m("direct-backward-under-accumulation", "global batch and accumulation", "optim.py",
       "        accum_steps == 1\n        and accelerator.gradient_accumulation_steps == 1\n",
       "        accum_steps >= 1\n        and accelerator.gradient_accumulation_steps >= 1\n",
       f"{T_PROMISES}::test_the_loss_is_a_mean_so_accumulation_changes_nothing",
       f"{T_PROMISES}::test_mid_epoch_resume_with_gradient_accumulation_is_bit_identical"),
    _m("samples-seen-counts-micro-batches", "global batch and accumulation", "trainer.py",
       "state.samples_seen += self.plan.global_batch", "state.samples_seen += self.plan.micro_batch",
       "tests/integration/test_trainer_runs.py::test_step_accounting_with_accumulation_and_checkpoint_cadence"),
    # 80 samples as 2 x 16 accumulated: a fifth, lone micro-batch ends the epoch with a step of its own (3 + 1 steps)
    _m("epoch-cut-to-micro-batches", "global batch and accumulation", "tasks/image.py",
       "drop_to_multiple_of=global_batch,", "drop_to_multiple_of=micro,",
       "tests/integration/test_trainer_runs.py::test_an_epoch_is_whole_global_batches_under_accumulation",
       "tests/integration/test_data_e2e.py::test_global_batch_gives_the_same_weights_on_every_setup"),
    # issue 49: the default recipe's least steps (defaults.py: 500 optimizer steps) counted in micro-batches: with
    # 2 accumulation steps a small folder's default run took 252 optimizer steps
    _m("least-steps-count-micro-batches", "global batch and accumulation", "build.py",
       "picked.epochs(cfg.epochs, steps_per_epoch)", "picked.epochs(cfg.epochs, len(train_dl))",
       f"{T_DEFAULTS_RUNS}::test_the_least_steps_are_optimizer_steps_under_accumulation"),
    # ---- distributed evaluation ------------------------------------------------------------------------------------
    _m("eval-counts-padded-samples", "distributed evaluation", "evaluation.py",
       "acc.gather_for_metrics((preds, labels, losses))", "acc.gather((preds, labels, losses))",
       "tests/integration/test_train_e2e.py::test_parity_one_process_vs_two_and_exact_eval"),
    # eval_loss becomes about eval_loss / batch size, and depends on the eval batch and the number of processes
    _m("eval-loss-averages-batch-means", "distributed evaluation", "evaluation.py",
       "loss_sum += losses.double().sum()", "loss_sum += losses.double().mean()",
       "tests/unit/test_promises.py::test_eval_loss_is_the_mean_over_samples_with_uneven_batches"),
    # the loop counts accuracy itself now (no evaluate metric): divided by the batches instead of the samples
    _m("eval-accuracy-over-batches", "distributed evaluation", "evaluation.py",
       "accuracy = int((preds == refs).sum()) / n if n else 0.0",
       "accuracy = int((preds == refs).sum()) / len(preds_all) if n else 0.0",
       "tests/unit/test_promises.py::test_eval_accuracy_is_the_exact_count_and_the_evaluate_metric_agrees"),
    # each rank's own losses over the global count: about half the loss on 2 processes (0.485 for 0.915)
    _m("eval-loss-of-one-rank", "distributed evaluation", "evaluation.py",
       "preds, labels, losses = acc.gather_for_metrics((preds, labels, losses))",
       "preds, labels = acc.gather_for_metrics((preds, labels))",
       "tests/integration/test_train_e2e.py::test_parity_one_process_vs_two_and_exact_eval",
       "tests/integration/test_ecosystem_runs.py::test_two_process_run_and_evaluation_write_no_metric_files"),
    # ---- main-process writes ---------------------------------------------------------------------------------------
    _m("export-on-every-rank", "main-process writes", "trainer.py",
       '        if self.rt.is_main:\n            export_weights(state_dict, out_dir, self.meta["model_config"])\n',
       '        export_weights(state_dict, out_dir, self.meta["model_config"])\n',
       f"{T_PROMISES}::test_only_rank_0_writes_the_run_files"),
    _m("summary-on-every-rank", "main-process writes", "trainer.py",
       '        if rt.is_main:\n            self._write_results(summary, final.get("confusion"), open_window)\n',
       '        self._write_results(summary, final.get("confusion"), open_window)\n',
       f"{T_PROMISES}::test_only_rank_0_writes_the_run_files"),
    # issue 49: summary.json, config.yaml and the other text files renamed into place before their data is on disk
    # (a machine's crash can leave them empty under their final names)
    _m("atomic-write-not-synced", "main-process writes", "fsio.py",
       "            _sync(tmp)  # on disk before its name is: a crash never leaves an empty file under the final name"
       "\n", "", "tests/unit/test_fsio.py::test_atomic_writes_are_synced_before_the_rename"),
    # two ranks' error lines on one stderr: a line written in two pieces had the other rank's line inside it
    _m("rank-line-in-two-writes", "main-process writes", "cli.py",
       '    sys.stderr.write(line + "\\n")\n', "    print(line, file=sys.stderr, flush=True)\n",
       "tests/unit/test_input_families.py::test_a_ranks_error_line_is_one_write"),
    # ---- run-folder replacement ------------------------------------------------------------------------------------
    _m("overwrite-discards-before-first-checkpoint", "run-folder replacement", "run_dir.py",
       "                self._stage()\n", "                self._stage()\n                self.commit_replace()\n",
       "tests/integration/test_run_folder_runs.py::test_overwrite_that_fails_leaves_the_previous_run_intact"),
    _m("overwrite-never-discards", "run-folder replacement", "run_dir.py",
       "        if not self.staged:\n            return\n", "        if self.staged:\n            return\n",
       "tests/integration/test_run_folder_runs.py::test_overwrite_removes_exactly_what_a_run_wrote"),
    _m("overwrite-takes-a-foreign-folder", "run-folder replacement", "run_dir.py",
       "if present and not self.holds_run():", "if present and not overwrite and not self.holds_run():",
       "tests/integration/test_run_folder_runs.py::test_roots_home_and_foreign_folders_are_refused"),
    _m("run-lock-never-refuses", "run-folder replacement", "run_lock.py",
       "        except BlockingIOError:\n            os.close(fd)\n            raise self._busy(info) from None\n",
       "        except BlockingIOError:\n            pass\n",
       "tests/integration/test_run_integrity.py::test_two_overwrite_runs_at_once_leave_one_whole_run"),
    # without flock the record decides: another host's run holds the folder whatever its PID means here
    _m("run-lock-taken-from-another-host", "run-folder replacement", "run_lock.py",
       "(not mine or pid_alive(pid))", "(mine and pid_alive(pid))",
       "tests/unit/test_run_folder.py::test_lock_without_flock_is_never_taken_from_another_host"),
    _m("run-lock-judges-another-hosts-pid-here", "run-folder replacement", "run_lock.py",
       "(not mine or pid_alive(pid))", "pid_alive(pid)",
       "tests/unit/test_run_folder.py::test_lock_without_flock_is_never_taken_from_another_host"),
    # ---- safe loading ----------------------------------------------------------------------------------------------
    _m("weights-reader-unpickles-code", "safe loading", "checkpoint/sources.py",
       'return torch.load(path, map_location="cpu", weights_only=True)',
       'return torch.load(path, map_location="cpu", weights_only=False)',
       "tests/unit/test_weights.py::test_malicious_pickle_is_refused_and_never_runs"),
    _m("checkpoint-verify-unpickles-code", "safe loading", "checkpoint/safe_load.py",
       'torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)',
       'torch.load(source, map_location="cpu", weights_only=False, mmap=mmap)',
       "tests/integration/test_checkpoint_integrity.py::test_malicious_state_file_is_refused"),
    _m("checkpoint-verify-accepts-unknown-files", "safe loading", "checkpoint/safe_load.py",
       "if not entry.is_file() or not _KNOWN_FILE.match(entry.name):",
       "if not entry.is_file() and not _KNOWN_FILE.match(entry.name):",
       "tests/integration/test_checkpoint_integrity.py::test_unknown_entry_in_checkpoint_is_refused"),
    # PyYAML's full loader runs `!!python/object/apply:os.system [...]` while constructing the document
    _m("yaml-config-full-loader", "safe loading", "config_yaml.py",
       'base = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader',
       'base = getattr(yaml, "CLoader", None) or yaml.Loader',
       "tests/unit/test_yaml_safety.py", "tests/integration/test_yaml_safety_runs.py",
       "tests/integration/test_input_families_runs.py::test_yaml_surprises_for_text_fields_are_one_line"),
    # ---- schedule --------------------------------------------------------------------------------------------------
    _m("cosine-half-period", "schedule", "schedule.py",
       "math.cos(math.pi * progress)", "math.cos(0.5 * math.pi * progress)",
       "tests/unit/test_runtime.py::test_lr_schedule_is_a_pure_function_of_the_step"),
    _m("warmup-starts-a-step-late", "schedule", "schedule.py",
       "(1.0 - warmup_from) * (step + 1) / warmup_steps", "(1.0 - warmup_from) * step / warmup_steps",
       "tests/unit/test_runtime.py::test_lr_schedule_is_a_pure_function_of_the_step"),
    # after a warm-up the LR drops at once to the value warmup_steps later (test_airbench derives its expected LRs
    # from lr_factor itself, so it moves with the mutant)
    _m("decay-counts-warmup-steps", "schedule", "schedule.py",
       "progress = min(1.0, (step - warmup_steps) / span)", "progress = min(1.0, step / span)",
       "tests/unit/test_runtime.py::test_lr_schedule_is_a_pure_function_of_the_step",
       "tests/integration/test_airbench_runs.py::test_the_recipe_trains_with_its_settings"),
    # ---- clipping --------------------------------------------------------------------------------------------------
    _m("clipping-switched-off", "clipping", "build.py",
       "cfg.max_grad_norm > 0 else None", "cfg.max_grad_norm < 0 else None",
       f"{T_PROMISES}::test_clipping_bounds_the_gradient_norm_at_every_optimizer_step"),
    _m("clipping-by-value", "clipping", "optim.py",
       "torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)",
       "torch.nn.utils.clip_grad_value_(self.params, self.max_norm)",
       f"{T_PROMISES}::test_clipping_bounds_the_gradient_norm_at_every_optimizer_step"),
    _m("max-grad-norm-zero-clips", "clipping", "build.py",
       "cfg.max_grad_norm > 0 else None", "cfg.max_grad_norm >= 0 else None",
       f"{T_PROMISES}::test_max_grad_norm_zero_really_does_not_clip"),
    # ---- best and early stopping -----------------------------------------------------------------------------------
    _m("best-chosen-in-reverse", "best and early stopping", "trainer.py",
       "if improves(value, best, self.task.higher):", "if improves(value, best, not self.task.higher):",
       f"{T_PROMISES}::test_best_step_is_the_best_eval_and_best_holds_its_weights"),
    _m("early-stop-patience-off-by-one", "best and early stopping", "features/early_stop.py",
       "if self.bad_evals < self.patience:", "if self.bad_evals <= self.patience:",
       "tests/unit/test_features.py::test_early_stopping_counts_each_step_once_and_refuses_a_corrupt_state",
       "tests/integration/test_features_runs.py::test_early_stopping_stops_cleanly_and_resumes_to_the_same_step"),
    _m("early-stop-ignores-min-delta", "best and early stopping", "features/early_stop.py",
       "improves(value, self.best, self.higher, self.min_delta)", "improves(value, self.best, self.higher)",
       "tests/integration/test_features_runs.py::test_early_stopping_stops_cleanly_and_resumes_to_the_same_step",
       "tests/unit/test_features.py::test_early_stopping_counts_each_step_once_and_refuses_a_corrupt_state"),
    _m("epoch-end-evaluates-the-same-step-again", "best and early stopping", "trainer.py",
       "early = self._evaluate_in_training() if state.last_eval_step != state.global_step else None",
       "early = self._evaluate_in_training()",
       "tests/integration/test_train_records.py::"
       "test_a_step_that_ends_an_epoch_on_the_eval_every_schedule_is_evaluated_once_even_across_a_resume"),
    # issue 49: the end-of-run memorisation warning, which judges a run by its evaluations. Without the absolute
    # gap, 100% in training vs 99% in evaluation (twice the error) warns
    _m("memorisation-gap-without-floor", "best and early stopping", "memorisation.py",
       "train_acc is None or eval_acc is None or train_acc - eval_acc < GAP:", "train_acc is None or eval_acc is None:",
       "tests/unit/test_defaults.py::test_a_near_perfect_run_is_not_memorisation"),
    # a run shorter than --log-every logs no train record: without the open window, nothing is judged
    _m("memorisation-ignores-the-open-window", "best and early stopping", "memorisation.py",
       'train, evals = _with_open_window(records.get("train", []), open_window), records.get("eval", [])',
       'train, evals = records.get("train", []), records.get("eval", [])',
       "tests/unit/test_defaults.py::test_the_steps_after_the_last_train_record_count_as_the_last_window",
       f"{T_DEFAULTS_RUNS}::test_a_memorising_run_shorter_than_log_every_still_warns"),
    # ---- retention -------------------------------------------------------------------------------------------------
    _m("keep-last-keeps-one-more", "retention", "checkpoint/state.py",
       "ckpts[: max(0, len(ckpts) - keep_last)]", "ckpts[: max(0, len(ckpts) - keep_last - 1)]",
       "tests/integration/test_resume.py::test_checkpoint_naming_after_resume_and_keep_last"),
    _m("resumed-checkpoint-protected-one-save-longer", "retention", "trainer.py",
       "self.saves + 1 < cfg.keep_last", "self.saves < cfg.keep_last",
       f"{T_PROMISES}::test_retention_after_a_resume_keeps_exactly_keep_last_after_every_save"),
    # ---- parity (same global batch, same weights on any number of processes) ---------------------------------------
    _m("global-batch-not-split-across-processes", "parity", "data/pipeline.py",
       "per_process = global_batch_size // world_size", "per_process = global_batch_size",
       "tests/unit/test_runtime.py::test_batch_plans"),
    # 1 x 32 sums 32 losses, 2 x 16 sums 16 per rank and DDP averages the ranks: gradients half as large (hidden by
    # clipping, which rescales both to --max-grad-norm, and by Adam, which is scale-invariant)
    _m("loss-summed-not-averaged", "parity", "features/__init__.py",
       "return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)",
       'return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing, reduction="sum")',
       "tests/integration/test_promises_runs.py::test_the_loss_is_a_mean_so_accumulation_changes_nothing"),
    _m("dropout-keyed-on-batch-position", "parity", "features/dropout.py",
       "keyed_bits(self.keys.seed, self.keys.epoch, indices, per_sample,",
       "keyed_bits(self.keys.seed, self.keys.epoch, torch.arange(x.shape[0], device=x.device), per_sample,",
       "tests/unit/test_features.py::test_keyed_dropout_masks_follow_the_sample_not_the_batch"),
    # issue 49: training and accel-predict read the same pixels from the user's files (data/pixels.py): a dark
    # 16-bit image (its values under 256) read as 8-bit, 150 of 65535 becoming 150 of 255
    _m("dark-16-bit-read-as-8-bit", "parity", "data/pixels.py",
       "if arr.dtype == np.uint16 or high > 255:", "if high > 255:",
       "tests/unit/test_pixels.py::test_a_dark_16_bit_png_keeps_the_16_bit_scale"),
    # a 16-bit image converted by PIL's convert("L"): clipped at 255, most of it white, a dark one read as 8-bit
    _m("16-bit-converted-as-8-bit", "parity", "data/pixels.py",
       'WIDE_GRAY_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I", "F"})',
       'WIDE_GRAY_MODES = frozenset({"I;16L", "I;16B", "I;16N", "I", "F"})',
       "tests/unit/test_pixels.py::test_a_dark_16_bit_png_keeps_the_16_bit_scale",
       "tests/unit/test_pixels.py::test_a_16_bit_png_is_scaled_not_clipped"),
    # ---- fine-tuning weights ---------------------------------------------------------------------------------------
    # a backbone tensor the file lacks stays random, trains as if pretrained, and is named as part of the new head
    _m("pretrained-missing-tensor-left-fresh", "fine-tuning weights", "models/pretrained.py",
       "        elif key in info.head:", "        elif got is None or key in info.head:",
       "tests/integration/test_finetune.py::test_weights_without_a_backbone_tensor_are_refused_naming_it"),
    _m("pretrained-misshapen-tensor-left-fresh", "fine-tuning weights", "models/pretrained.py",
       "        elif key in info.head:", "        elif got is not None or key in info.head:",
       "tests/integration/test_finetune.py::test_weights_without_a_backbone_tensor_are_refused_naming_it"),
    # ---- ONNX check ------------------------------------------------------------------------------------------------
    _m("onnx-check-signed-difference", "ONNX check", "onnx_export.py",
       "(torch.from_numpy(got).double() - expected.double()).abs().max()",
       "(torch.from_numpy(got).double() - expected.double()).max()",
       "tests/integration/test_onnx_export.py::test_a_file_off_by_a_constant_either_way_fails_the_check"),
    _m("onnx-check-signed-difference-reversed", "ONNX check", "onnx_export.py",
       "(torch.from_numpy(got).double() - expected.double()).abs().max()",
       "(expected.double() - torch.from_numpy(got).double()).max()",
       "tests/integration/test_onnx_export.py::test_a_file_off_by_a_constant_either_way_fails_the_check"),
    # ---- tracker runs ----------------------------------------------------------------------------------------------
    # an attempt reporting to CSV only saves no MLflow id: the next attempt with MLflow opens a second run
    _m("tracker-ids-dropped-by-other-trackers", "tracker runs", "trainer.py",
       "tracker_run_ids(self.acc, state.extra.get(TRACKER_RUNS))", "tracker_run_ids(self.acc)",
       "tests/integration/test_tracker_runs.py::test_an_attempt_with_other_trackers_keeps_the_mlflow_run_for_the_next"),
    # ---- socket interface ------------------------------------------------------------------------------------------
    # GLOO_SOCKET_IFNAME="" names no interface; taken as the user's choice, none is chosen
    _m("empty-socket-ifname-is-a-choice", "socket interface", "netif.py",
       "for k in SOCKET_IFNAME_VARS if env.get(k))", "for k in SOCKET_IFNAME_VARS if k in env)",
       "tests/unit/test_netif.py::test_an_empty_socket_ifname_is_no_choice_of_the_users"),
    # ---- threads beside other work (issue 50: 2 threads beside a busy process trained 10-30x slower) ---------------
    _m("threads-ignore-other-work", "threads beside other work", "cpu_load.py",
       "    threads = max(1, min(cores, int(cores - busy + 0.5)))\n", "    threads = cores\n",
       "tests/unit/test_cpu_load.py::test_configure_threads_takes_one_thread_beside_a_busy_core"),
    # the start-up's seconds of imports are the window; without it every run sleeps a probe first
    _m("threads-probe-despite-start-window", "threads beside other work", "cpu_load.py",
       "    if start is None or start.cpus != now.cpus or not", "    if True or start.cpus != now.cpus or not",
       "tests/unit/test_cpu_load.py::test_a_start_up_window_is_used_without_a_probe"),
)
# fmt: on
MUTANTS += DATA_MUTANTS  # data_mutants.py: the data modules' part of the list
MUTANTS += DEFAULTS_MUTANTS  # defaults_mutants.py: the defaults for your own data (issue 50)
MUTANTS += TASKS_MUTANTS  # tasks_mutants.py: the task layer, any model on any task (issue 51)


# ---- the mutant list -------------------------------------------------------------------------------------------------
def load_mutants(path: Path) -> tuple[Mutant, ...]:
    """Mutants from a JSON list of objects with the fields of :class:`Mutant` (``file`` from the repository root)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        mutants = tuple(Mutant(**{**item, "tests": tuple(item["tests"])}) for item in data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckError(
            f"--mutants {path}: {exc}; pass a JSON list of {{name, promise, file, old, new, tests}}"
        ) from None
    return mutants


def occurrences(repo: Path, mutant: Mutant) -> int:
    """How often ``mutant.old`` occurs in its file (-1: no such file)."""
    path = repo / mutant.file
    if not path.is_file():
        return -1
    return path.read_text(encoding="utf-8").count(mutant.old)


def stale_reason(repo: Path, mutant: Mutant) -> str:
    """Why the mutant cannot be planted at this commit ("" when its snippet occurs exactly once)."""
    found = occurrences(repo, mutant)
    if found == 1:
        return ""
    where = "its file does not exist" if found < 0 else f"its old snippet occurs {found} times, not once"
    return f"{mutant.file}: {where}; update the mutant in scripts/mutation/mutants.py to where the code moved"


def select(mutants: tuple[Mutant, ...], only: list[str] | None) -> tuple[Mutant, ...]:
    names = [m.name for m in mutants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CheckError(f"mutant names must be unique: {', '.join(duplicates)}; rename one")
    if not only:
        return mutants
    unknown = [n for n in only if n not in names]
    if unknown:
        raise CheckError(f"unknown mutant {', '.join(unknown)}; --list shows the names")
    return tuple(m for m in mutants if m.name in only)
