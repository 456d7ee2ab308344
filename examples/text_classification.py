"""Text classification with a Hugging Face transformers model, trained by accel_train's loop on any setup.

    python examples/text_classification.py                      # bert-base-cased on GLUE MRPC (downloads both)
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml examples/text_classification.py
    python examples/text_classification.py --tiny --csv my.csv  # no download: a small BERT built from a config

Needs ``pip install -e .[text]`` (transformers). The dataset is tokenized here, in the script; each batch is padded
by ``DataCollatorWithPadding``, passed to the model as ``model(**batch)``, and the loss is the model's own
(``outputs.loss``). Accuracy and F1 are computed on the whole eval set on any number of processes. ``--csv``: a
file with ``text`` and ``label`` columns (``--tiny`` trains a word-level tokenizer on it).
"""

import argparse

import datasets
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

import accel_train


def tiny_model_and_tokenizer(texts, num_labels: int):
    """A two-layer BERT from a config and a word-level tokenizer trained on ``texts``: nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"], min_frequency=2))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=128, num_labels=num_labels)  # fmt: skip
    return lambda: BertForSequenceClassification(config), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base-cased", help="a Hugging Face model name (from_pretrained)")
    parser.add_argument("--csv", help="train on this CSV (text, label) instead of GLUE MRPC; a quarter is held out")
    parser.add_argument("--tiny", action="store_true", help="a small BERT from a config, nothing downloaded")
    parser.add_argument("--output-dir", default="runs/text_classification")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--overwrite", action="store_true", help="start over in --output-dir (default: resume there)")
    args = parser.parse_args()

    if args.csv:
        data = datasets.load_dataset("csv", data_files=args.csv)["train"].train_test_split(test_size=0.25, seed=0)
        train, test, text = data["train"], data["test"], ["text"]
    else:
        glue = datasets.load_dataset("glue", "mrpc")
        train, test, text = glue["train"], glue["validation"], ["sentence1", "sentence2"]
    num_labels = len(set(train["label"]))
    if args.tiny:
        texts = [" ".join(row) for row in zip(*(train[c] for c in text), strict=True)]
        model, tokenizer = tiny_model_and_tokenizer(texts, num_labels)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)

        def model():  # called by accel_train, seeded: the same initial head on every process
            return AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=num_labels)

    def tokenize(rows):
        return tokenizer(*(rows[c] for c in text), truncation=True, max_length=128)

    train, test = (d.map(tokenize, batched=True, remove_columns=[c for c in d.column_names if c != "label"])
                   for d in (train, test))  # fmt: skip
    train.set_format("torch")
    test.set_format("torch")
    accel_train.train(
        model,
        train,
        test,
        collate_fn=DataCollatorWithPadding(tokenizer),  # pads each batch; renames label to labels for the model
        metrics=["accuracy", "f1"],
        optimizer="adamw",
        lr=5e-5 if not args.tiny else 1e-3,
        weight_decay=0.01,
        warmup_steps=10,
        global_batch_size=32,
        epochs=args.epochs,
        output_dir=args.output_dir,
        resume=None if args.overwrite else "auto",  # run again after a stop (SIGTERM): it goes on from there
        overwrite=args.overwrite,
    )


if __name__ == "__main__":
    main()
