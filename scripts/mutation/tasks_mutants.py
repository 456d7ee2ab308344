"""The mutants of the task layer (issue 51: any model on any task: which data is which task, labels and outputs of
any batch, the loss and the predictions, keyed randomness, exact evaluation over rank blocks, the metrics and the
monitor, the data's identity, the refusals), a part of ``mutants.MUTANTS`` kept in a file of its own."""

from __future__ import annotations

from mutation.base import Mutant, _m

T = "tests/integration/test_task_layer.py"
EVAL, BEST, TRUST, RESUME, OWN = (
    "distributed evaluation", "best and early stopping", "data you can trust", "resume state", "your own data",
)  # fmt: skip
# fmt: off
TASKS_MUTANTS: tuple[Mutant, ...] = (
    # ---- the monitor and its direction: best/ and early stopping kept the worst eval_mse
    _m("mse-higher-is-better", BEST, "tasks/scores.py",
       'LOWER_IS_BETTER = ("loss", "mse", "rmse",', 'LOWER_IS_BETTER = ("loss", "rmse",',
       f"{T}::test_the_monitor_and_its_direction"),
    _m("direction-inverted", BEST, "tasks/scores.py",
       'self.higher = monitor_mode == "max" if monitor_mode else _higher(self.monitor)',
       'self.higher = monitor_mode == "max" if monitor_mode else not _higher(self.monitor)',
       f"{T}::test_the_monitor_and_its_direction"),
    _m("monitor-mode-ignored", BEST, "tasks/scores.py",
       'self.higher = monitor_mode == "max" if monitor_mode else _higher(self.monitor)',
       "self.higher = _higher(self.monitor)",
       f"{T}::test_the_monitor_and_its_direction"),
    _m("monitor-default-the-last-metric", BEST, "tasks/scores.py",
       'f"eval_{self.metrics[0][0]}"', 'f"eval_{self.metrics[-1][0]}"', f"{T}::test_the_monitor_and_its_direction"),
    _m("monitor-not-computed-accepted", BEST, "tasks/scores.py",
       '        if self.monitor != "eval_loss" and self.monitor not in out:\n', "        if False:\n",
       f"{T}::test_a_monitor_that_no_metric_computes_is_refused"),
    _m("metric-named-twice-accepted", BEST, "tasks/scores.py", "    if len(set(names)) != len(names):\n",
       "    if False:\n", f"{T}::test_a_metric_named_twice_is_refused"),
    # ---- the scores: two classes macro-averaged (the hub's modules score the positive class)
    _m("scores-macro-for-two-classes", BEST, "metrics/scores/scores.py",
       'average = "binary" if set(labels) <= {0, 1} else "macro"', 'average = "macro"',
       f"{T}::test_two_classes_score_the_positive_class_not_the_macro_average"),
    # ---- exact evaluation over rank blocks
    _m("rank-blocks-drop-the-remainder", EVAL, "tasks/generic.py",
       "range(n * rank // world, n * (rank + 1) // world)", "range(rank * (n // world), (rank + 1) * (n // world))",
       f"{T}::test_the_eval_blocks_of_the_ranks_hold_every_sample_once_in_order"),
    _m("eval-scores-its-own-block-only", EVAL, "tasks/generic.py",
       "ranks = gather_object([mine]) if acc.num_processes > 1 else [mine]", "ranks = [mine]",
       f"{T}::test_evaluate_gathers_the_ranks_blocks_in_order"),
    _m("gathered-predictions-out-of-order", EVAL, "tasks/generic.py",
       "preds_all = torch.cat([r[0] for r in ranks if r[0] is not None])",
       "preds_all = torch.cat([r[0] for r in ranks[::-1] if r[0] is not None])",
       f"{T}::test_evaluate_gathers_the_ranks_blocks_in_order"),
    _m("eval-loss-weighted-by-the-loader-batch", EVAL, "tasks/generic.py",
       "                loss_sum += loss.double() * counted\n",
       "                loss_sum += loss.double() * loader.batch_size\n",
       f"{T}::test_evaluate_a_regression_weights_each_batch_by_its_size",
       f"{T}::test_evaluate_on_one_process_equals_an_independent_computation"),
    # ---- labels, the call, the outputs, the loss, the predictions
    _m("label-before-labels", OWN, "tasks/generic.py",
       'LABEL_KEYS = ("labels", "label", "target", "targets")', 'LABEL_KEYS = ("label", "labels", "target", "targets")',
       f"{T}::test_labels_of_a_dict_and_of_a_tuple"),
    _m("call-passes-the-dict-whole", OWN, "tasks/generic.py", "        return model(**batch)\n",
       "        return model(batch)\n", f"{T}::test_call_takes_a_dict_as_keywords_and_a_tuple_without_its_target"),
    _m("call-passes-the-target", OWN, "tasks/generic.py", "    return model(*batch[:-1])\n",
       "    return model(*batch)\n", f"{T}::test_call_takes_a_dict_as_keywords_and_a_tuple_without_its_target"),
    _m("outputs-first-value-not-logits", OWN, "tasks/generic.py",
       'logits = outputs.get("logits") if isinstance(outputs, Mapping)',
       "logits = next(iter(outputs.values())) if isinstance(outputs, Mapping)",
       f"{T}::test_output_tensor_picks_the_logits_not_the_loss"),
    _m("model-s-own-loss-ignored", OWN, "tasks/generic.py", "        elif (own := _own_loss(outputs)) is not None:",
       "        elif (own := None) is not None:", f"{T}::test_the_loss_fn_wins_then_the_model_s_own_loss"),
    _m("a-loss-of-many-numbers-taken", OWN, "tasks/generic.py",
       "if not isinstance(loss, torch.Tensor) or loss.numel() != 1:", "if not isinstance(loss, torch.Tensor):",
       f"{T}::test_a_loss_that_is_not_one_number_is_one_line"),
    _m("classification-scores-the-values", OWN, "tasks/generic.py",
       "        if self.classification:\n            if values.dim() == labels.dim() + 1:",
       "        if not self.classification:\n            if values.dim() == labels.dim() + 1:",
       f"{T}::test_predictions_are_the_argmax_the_values_or_predict_fn_s"),
    _m("regression-values-not-squeezed", OWN, "tasks/generic.py",
       "        return values.reshape(labels.shape)\n", "        return values\n",
       f"{T}::test_the_default_losses_are_cross_entropy_and_mse_of_the_squeezed_values"),
    # ---- randomness inside forward keyed on the micro-batch
    _m("keyed-rng-without-the-epoch", "parity", "tasks/generic.py", 'f"{seed}:{epoch}:".encode()',
       'f"{seed}:".encode()',
       f"{T}::test_keyed_rng_draws_by_seed_epoch_and_indices_and_leaves_the_outer_state"),
    _m("keyed-rng-misreports-draws", "parity", "tasks/generic.py", "            drew.append(not all(",
       "            drew.append(all(",
       f"{T}::test_keyed_rng_draws_by_seed_epoch_and_indices_and_leaves_the_outer_state"),
    # ---- which data is which task
    _m("float-labels-trained-as-classes", OWN, "tasks/data.py", "        return flat or is_float_label(sample[-1])\n",
       "        return flat\n", f"{T}::test_which_samples_train_the_generic_task"),
    _m("task-options-ignored", OWN, "tasks/data.py",
       "    if any(options.get(name) is not None for name in TASK_OPTIONS):\n", "    if False:\n",
       f"{T}::test_any_task_option_means_the_generic_task"),
    # ---- the data's identity: a resume on changed data taken
    _m("identity-without-tensor-bytes", TRUST, "tasks/data.py",
       '        h.update(t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b"")\n', "        pass\n",
       f"{T}::test_the_identity_follows_the_data"),
    _m("identity-without-dict-keys", TRUST, "tasks/data.py", '            h.update(f"\\0{key}\\0".encode())\n',
       "            pass\n", f"{T}::test_the_identity_sees_each_field_and_the_key_it_is_under"),
    _m("identity-without-subset-indices", TRUST, "tasks/data.py",
       "h.update(part.digest.encode() + np.asarray(data.indices, dtype=np.int64).tobytes())",
       "h.update(part.digest.encode())", f"{T}::test_the_identity_of_a_subset_follows_its_indices"),
    _m("identity-without-table-buffers", TRUST, "tasks/data.py",
       "            for buffer in column.buffers():\n                if buffer is not None:\n"
       "                    h.update(memoryview(buffer))\n",
       "            for buffer in column.buffers():\n                if buffer is not None:\n"
       "                    pass\n",
       f"{T}::test_the_identity_follows_the_data"),
    # ---- refusals
    _m("image-options-taken-silently", OWN, "tasks/__init__.py",
       '    given = [name for name in IMAGE_ONLY if name in (getattr(cfg, "given", None) or ())]\n',
       "    given = []\n", f"{T}::test_image_only_options_are_refused_on_the_generic_task"),
    _m("resume-of-another-task-taken", RESUME, "tasks/__init__.py",
       "    if record == now or (record is None and now is None):\n",
       "    if record == now or record is None or now is None:\n",
       f"{T}::test_a_resume_must_score_the_run_as_its_checkpoint_did"),
)
# fmt: on
