"""The mutants of the defaults for your own data (issue 50: photos start from ImageNet weights when they can, the
defaults keep the 1-vs-N-process promise), a part of ``mutants.MUTANTS`` kept in a file of its own."""

from __future__ import annotations

from mutation.base import Mutant, _m

T_PROMISES = "tests/unit/test_defaults_promises.py"
T_PHOTOS = "tests/integration/test_photo_defaults_runs.py"
P = "your own data"
# fmt: off
DEFAULTS_MUTANTS: tuple[Mutant, ...] = (
    # the default back to BatchNorm: 1 and 2 processes 0.75 apart, --bitwise refused
    _m("default-model-with-batchnorm", P, "defaults.py", 'MODEL = "small_cnn_gn"', 'MODEL = "small_cnn"',
       f"{T_PROMISES}::test_the_default_model_has_no_batch_statistics"),
    # --bn-stats loaded that keeps nothing: BatchNorm on batch statistics again
    _m("bn-stats-loaded-keeps-nothing", P, "features/finetune.py",
       "        if isinstance(module, _BatchNorm) and module.running_mean is not None:\n", "        if False:\n",
       f"{T_PROMISES}::test_bn_stats_loaded_normalises_each_image_alone_and_stays_so_after_train"),
    # --bitwise refusing BatchNorm on its loaded statistics (or worse: taking it on batch statistics)
    _m("bitwise-ignores-the-mode", P, "bitwise.py",
       "        and m.training  # --bn-stats loaded", "        and True  # --bn-stats loaded",
       f"{T_PROMISES}::test_bitwise_takes_batchnorm_on_its_loaded_statistics_and_refuses_it_on_batch_statistics"),
    # a BatchNorm model on 2 processes without a word
    _m("split-batch-warning-never", P, "sync_bn.py",
       "    if not live or (acc.num_processes < 2 and not data_parallel):\n", "    if True:\n",
       f"{T_PROMISES}::test_a_batchnorm_model_on_several_processes_gets_one_line"),
    # the photo rule's edge moved, or read on the largest image
    _m("photo-side-exclusive", P, "defaults.py", "    if side < PHOTO_SIDE:\n", "    if side <= PHOTO_SIDE:\n",
       f"{T_PROMISES}::test_which_images_are_photos"),
    _m("photo-side-the-smallest-image", P, "defaults.py", "if 2 * seen > total)", "if seen > 0)",
       f"{T_PROMISES}::test_which_images_are_photos"),
    _m("photo-sides-of-the-distinct-sizes", P, "data/folder.py", "        sides[min(h, w)] += n\n",
       "        sides[min(h, w)] = 1\n", f"{T_PROMISES}::test_short_sides_count_every_image"),
    # the photo recipe over the user's own flags
    _m("photo-recipe-over-the-users-flags", P, "defaults.py",
       "recipe = {k: v for k, v in PHOTO_RECIPE.items() if k not in given}", "recipe = dict(PHOTO_RECIPE)",
       f"{T_PROMISES}::test_the_photo_recipe_keeps_what_the_user_set"),
    # digits mirrored by the defaults
    _m("grey-images-flipped", P, "data/folder.py", "flip=channels != 1)", "flip=True)",
       f"{T_PROMISES}::test_augment_flips_colour_images_and_not_grey_ones"),
    # ACCEL_TRAIN_OFFLINE=1 that still downloads
    _m("offline-switch-ignored", P, "photo_defaults.py",
       '    offline = os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")\n',
       "    offline = False\n",
       f"{T_PHOTOS}::test_the_switch_off_skips_the_download_and_the_user_s_flags_win"),
    # the weights a run started from, unrecorded
    _m("photo-weights-unrecorded", P, "build.py", '        resolved["defaults"].update(pre.record())', "        pass",
       f"{T_PHOTOS}::test_photos_with_weights_in_the_cache_fine_tune_them_and_record_their_hash"),
    # fine-tuning at the folder's 64 pixels instead of the weights' 224
    _m("photos-not-read-again-at-224", P, "build.py",
       "        if cfg.image_size != before.image_size:  # read again", "        if False:  # read again",
       f"{T_PHOTOS}::test_photos_with_weights_in_the_cache_fine_tune_them_and_record_their_hash"),
    # --bitwise's gradients in the contiguous layout of channels_last weights: fused Adam pairs them by memory
    _m("bitwise-grads-in-another-layout", P, "bitwise.py",
       "            grad = torch.empty_like(p)  # the parameter's layout",
       "            grad = torch.empty(p.shape, dtype=p.dtype)  # the parameter's layout",
       "tests/integration/test_defaults_parity_runs.py::test_bitwise_trains_what_the_normal_mode_trains_with_the_defaults"),
    # a cached weights file unpickled: code in a shared cache runs in every default photo run
    _m("cached-weights-unpickled", P, "models/pretrained.py",
       "        state = weights.get_state_dict(progress=False, check_hash=True, weights_only=True)",
       "        state = weights.get_state_dict(progress=False, check_hash=True, weights_only=False)",
       f"{T_PROMISES}::test_a_cached_weights_file_is_read_as_tensors_only_and_a_bad_one_is_one_line"),
    # resnet34's weights under resnet18's name, its extra blocks dropped without a word
    _m("foreign-tensors-dropped", P, "models/pretrained.py", "    if foreign:  # resnet34's",
       "    if False:  # resnet34's",
       f"{T_PROMISES}::test_weights_of_a_larger_architecture_under_the_name_are_refused"),
    # a resume's export naming the file in the cache now, not the weights the run started from
    _m("resume-records-the-cache-now", P, "build.py", "    if resume_path is not None and pre is not None:\n",
       "    if False:\n",
       f"{T_PHOTOS}::test_a_resume_records_the_weights_the_run_started_from_not_the_cache_s_file_now"),
    # the SGD recipe's lr kept for the user's --optimizer adam
    _m("photo-lr-for-another-optimizer", P, "defaults.py", '            recipe.pop("lr", None)\n', "            pass\n",
       f"{T_PROMISES}::test_the_photo_recipe_s_lr_follows_its_optimizer_and_the_batch"),
    # meta, sparse or complex tensors, or keys that are not names: a traceback, or complex weights cast to real
    _m("odd-weights-accepted", P, "models/pretrained.py", "    if odd:  # a key that is not a name", "    if False:  #",
       f"{T_PROMISES}::test_weights_that_are_not_named_real_tensors_are_one_line"),
    # ACCEL_TRAIN_BUSY_CORES=inf: an OverflowError's traceback in every run
    _m("busy-cores-infinite", "threads beside other work", "cpu_load.py", "value >= 0.0 and math.isfinite(value)",
       "value >= 0.0", "tests/unit/test_cpu_load.py"),
    # --bitwise evaluation on a short last batch: eval_loss differs on CPUs whose kernels round by the batch size
    _m("bitwise-eval-short-batch", "parity", "evaluation.py", "            if 0 < real < full:  # repeats",
       "            if False:  # repeats",
       "tests/unit/test_promises.py::test_bitwise_evaluation_pads_a_short_last_batch_to_the_full_size"),
)
# fmt: on
