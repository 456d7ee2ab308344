"""The mutants of the data modules (issue 49: a run trains on exactly the data it names; a cache only saves time;
labels by name; layouts as users mean them), a part of ``mutants.MUTANTS`` kept in a file of its own."""

from __future__ import annotations

from mutation.base import Mutant, _m

T_IDENTITY = "tests/unit/test_data_identity.py"
T_FOLDER_INDEX = "tests/unit/test_folder_index.py"
# fmt: off
DATA_MUTANTS: tuple[Mutant, ...] = (
    # ---- data you can trust (issue 49): a run trains on exactly the data it names; a cache only saves time ---------
    # WebDataset keys with dots of their own (img.001.png + img.001.cls) dropped without a word
    _m("tar-dotted-keys-dropped", "data you can trust", "data/shard_index.py",
       "        if last in TAR_IMAGES or last == TAR_LABEL:\n", "        if False:\n",
       f"{T_IDENTITY}::test_tar_keys_with_dots_of_their_own_are_samples_and_other_members_are_counted"),
    # an image rewritten in place with its time set back (cp -p) read with the facts of the old one
    _m("folder-cache-key-without-ctime", "data you can trust", "data/folder_index.py",
       'STAT_FIELDS = ("st_size", "st_mtime_ns", "st_ctime_ns", "st_ino", "st_dev")',
       'STAT_FIELDS = ("st_size", "st_mtime_ns", "st_ino", "st_dev")',
       f"{T_FOLDER_INDEX}::test_a_file_overwritten_in_place_is_another_cache_key"),
    # facts cached for one file list read for another (images added, the folder's time restored)
    _m("folder-cache-key-without-the-file-list", "data you can trust", "data/folder_index.py",
       '"files": stamp.hexdigest()}', '"files": ""}',
       f"{T_FOLDER_INDEX}::test_the_file_list_is_listed_at_every_launch_and_the_facts_follow_it"),
    # images in folders below a class folder left out
    _m("nested-folders-not-walked", "data you can trust", "data/folder_index.py",
       "            self.walk(os.path.join(top, name), prefix + name)\n",
       "            pass\n",
       f"{T_FOLDER_INDEX}::test_index_is_torchvisions_imagefolder"),
    # a class folder linked into another: the same images under two labels
    _m("class-linked-into-another-read-twice", "data you can trust", "data/folder_index.py",
       "        if real in self.seen:\n",
       "        if False:\n",
       f"{T_IDENTITY}::test_a_class_folder_linked_into_another_is_refused"),
    # a file touched in place (same size) is not a change to a resume
    _m("identity-without-mtimes", "data you can trust", "data/identity.py",
       "(index.offsets, index.blob, index.labels, index.sizes, index.mtimes)",
       "(index.offsets, index.blob, index.labels, index.sizes)",
       f"{T_IDENTITY}::test_a_modification_time_alone_is_a_change"),
    # F/{a,b}/ beside F/test/: a third class named test
    _m("split-folder-beside-classes-read-as-a-class", "data you can trust", "data/folder.py",
       "return _check_classes(root, exclude=frozenset(n for n in top_folders(root) if n.lower() in TEST_DIR_NAMES))",
       "return _check_classes(root)",
       f"{T_IDENTITY}::test_class_folders_beside_a_test_folder_are_the_training_split"),
    # a class folder of .HEIC photos dropped without a word
    _m("non-images-dropped-silently", "data you can trust", "data/folder.py",
       "        + _skipped_note(root, *([train_index, test_index] if split_layout else [train_index]))\n",
       "",
       "tests/unit/test_data_formats.py::test_imagefolder_leaves_out_other_files_in_one_line"),
    # a cut .npz or a .json holding a list: a traceback on every run
    _m("damaged-cache-file-a-traceback", "data you can trust", "data/index_cache.py",
       "    except Exception as exc:  # noqa: BLE001 - any unreadable entry (a cut zip, a JSON list, ...) is rebuilt",
       "    except OSError as exc:  # noqa: BLE001 - any unreadable entry (a cut zip, a JSON list, ...) is rebuilt",
       f"{T_FOLDER_INDEX}::test_a_damaged_cache_file_is_rebuilt_with_one_line"),
    # --label-column other read with the first column's labels from the cache
    _m("shard-cache-key-without-label-column", "data you can trust", "data/shard_index.py",
       "    key |= {\"image_column\": image_column, \"label_column\": label_column}\n",
       "    key |= {\"image_column\": image_column}\n",
       f"{T_IDENTITY}::test_the_shard_cache_is_keyed_by_the_label_column"),
    # two train shards listing the ClassLabel names in other orders, read by position
    _m("train-shards-labelled-by-position", "data you can trust", "data/shard_index.py",
       "        if names is not None:  # by name, never by position",
       "        if False:  # by name, never by position",
       f"{T_IDENTITY}::test_train_shards_that_list_names_in_other_orders_are_matched_by_name"),
    # test shards holding a subset of the classes labelled with train's map
    _m("test-shards-labelled-by-the-training-map", "data you can trust", "data/shards.py",
       "test_ds = ShardDataset(test or train, channels, size, test_rows, maps[-1])",
       "test_ds = ShardDataset(test or train, channels, size, test_rows, maps[0])",
       f"{T_IDENTITY}::test_test_shards_are_labelled_by_their_own_classlabel_names"),
    # eval.py on flat shards scores the rows the run trained on
    _m("eval-on-shards-scores-training-rows", "data you can trust", "data/shards.py",
       "cfg.val_split, cfg.seed)[1].numpy()",
       "cfg.val_split, cfg.seed)[0].numpy()",
       f"{T_IDENTITY}::test_eval_on_flat_shards_scores_the_rows_training_held_out"),
    # two machines' caches (or contents) differ: a parameter-shape traceback inside DDP
    _m("ranks-compare-only-the-file-list", "data you can trust", "data/identity.py",
       "    mine = (splits.extra.get(\"index_digest\"), repr(shape))",
       "    mine = (splits.extra.get(\"index_digest\"), \"\")",
       f"{T_FOLDER_INDEX}::test_ranks_that_index_other_files_are_refused"),
    # a same-size content swap with the times restored (or two class folders swapped) resumed silently
    _m("identity-ignores-the-local-part", "data you can trust", "data/identity.py",
       "            said.append(_local_change(name, was, now, (old_files or {}).get(name)))\n",
       "            pass\n",
       "tests/unit/test_data_redteam.py::test_r01_a_same_size_content_swap_with_times_restored_is_named_as_rewritten_in_place"),
    # a shard rewritten with every label flipped (same size, time restored) resumed silently
    _m("shard-identity-without-row-labels", "data you can trust", "data/identity.py",
       "    h.update(repr([str(v) for v in index.values]).encode() + np.ascontiguousarray(index.labels).tobytes())\n",
       "    h.update(repr([str(v) for v in index.values]).encode())\n",
       "tests/unit/test_data_redteam.py::test_r03_a_shard_rewritten_in_place_with_every_label_changed_is_named"),
    # hf .arrow labels edited with state.json untouched resumed silently
    _m("hf-identity-without-row-labels", "data you can trust", "data/identity.py",
       "        summary[\"row_labels\"] = h.hexdigest()[:16]\n",
       "        pass\n",
       "tests/unit/test_data_redteam.py::test_r04_hf_labels_edited_with_size_and_time_kept_are_named_on_another_machine_too"),
    # an hf test ClassLabel in another order scored 0.0 on data that reaches 1.0
    _m("hf-test-labels-by-position", "data you can trust", "data/hf.py",
       "    by_name = _test_by_name(train, test, label_col, name)",
       "    by_name = None",
       "tests/unit/test_data_redteam.py::test_r06_an_hf_test_classlabel_in_another_order_is_read_by_name"),
    # train/ + TEST/ trained the classes 'TEST' and 'train'
    _m("split-folder-names-case-sensitive", "data you can trust", "data/folder.py",
       "    return next((root / found[n] for n in names if n in found), None)",
       "    return next((root / n for n in names if n in found and found[n] == n), None)",
       "tests/unit/test_data_redteam.py::test_r07_an_uppercase_test_folder_is_the_test_split"),
    # test/ linking to train/ scored the training images as test images
    _m("test-linked-to-train-not-refused", "data you can trust", "data/folder.py",
       "        refuse_linked_twice(train_index, test_index)  # a test/ that links to train/, or test images linked"
       " in\n",
       "",
       "tests/unit/test_data_redteam.py::test_r08_a_test_folder_that_links_to_train_is_refused"),
    # a file linked from dog/ into cat/ trained under both labels
    _m("file-linked-into-another-class", "data you can trust", "data/folder_index.py",
       "    refuse_linked_twice(index)\n",
       "",
       "tests/unit/test_data_redteam.py::test_r16_a_file_linked_from_one_class_into_another_is_refused"),
    # a file linked twice in one class: held out and trained on
    _m("file-twice-held-out-and-trained", "data you can trust", "data/folder.py",
       "        refuse_linked_twice(train_index, same_class=True)  # one file twice could be held out and trained on\n",
       "",
       "tests/unit/test_data_redteam.py::test_one_file_twice_in_a_class_of_a_folder_split_by_val_split_is_refused"),
    # train/test/ became a class named test
    _m("split-name-inside-train-a-class", "data you can trust", "data/folder.py",
       "    if nested:\n",
       "    if False:\n",
       "tests/unit/test_data_redteam.py::test_r17_a_class_named_like_a_split_inside_train_is_refused"),
    # test-* shards without train-* pooled into training
    _m("test-shards-pooled-into-training", "data you can trust", "data/shards.py",
       "    if named:  # a test split without a training split: never pooled into training silently\n",
       "    if False:\n",
       "tests/unit/test_data_redteam.py::test_r09_test_shards_without_training_shards_are_refused_not_pooled"),
    # two Latin-1 .cls names merged into one class
    _m("tar-labels-decoded-with-replacement", "data you can trust", "data/shard_index.py",
       "                        entry[3] = raw.decode(\"utf-8\").strip()\n",
       "                        entry[3] = raw.decode(\"utf-8\", \"replace\").strip()\n",
       "tests/unit/test_data_redteam.py::test_r10_tar_labels_that_are_not_utf8_are_refused"),
    # numbers in one tar, names in another: four classes
    _m("tar-label-kinds-mixed", "data you can trust", "data/shard_index.py",
       "        if len(kinds) > 1:\n            raise UserError(\n                f\"the .cls labels of",
       "        if False:\n            raise UserError(\n                f\"the .cls labels of",
       "tests/unit/test_data_redteam.py::test_r11_tar_labels_numbers_in_one_shard_and_names_in_another_are_refused"),
    # hf: on Parquet files rewritten with their times set back read datasets' stale copy
    _m("hf-folder-read-from-a-stale-copy", "data you can trust", "data/hf.py",
       "download_mode=None if fresh else \"force_redownload\"",
       "download_mode=None",
       "tests/unit/test_data_redteam.py::test_r05_hf_on_a_folder_of_data_files_rewritten_in_place_reads_them_as_they_are"),
    # --val-split ignored on data with its own test split
    _m("val-split-ignored-for-own-splits", "data you can trust", "data/settings.py",
       "    if own_split and \"val_split\" in given:\n",
       "    if False:\n",
       "tests/unit/test_data_flags.py::test_flags_that_change_nothing_are_named"),
    # a folder moved elsewhere could never be resumed
    _m("moved-data-refused-as-another-dataset", "data you can trust", "resume.py",
       " or (name == \"dataset\" and _moved(old, new, resolved))",
       "",
       "tests/integration/test_data_trust_runs.py::test_a_folder_moved_elsewhere_resumes_from_its_new_path_and_is_still_compared"),
)
# fmt: on
