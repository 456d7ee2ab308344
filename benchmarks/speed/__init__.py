"""The speed benchmark: the portable loop against a hand-written floor on this machine (``python -m benchmarks
[--quick]``, ``scripts/benchmark.py``; docs/performance.md has the results). ``run`` runs it from start to end, each
part from a module of its own:

* ``setups``: what is measured (setups, workloads, steps, ``--quick``'s cells, one run's options).
* ``portable``: ``scripts/train.py`` launched as users launch it (plainly, with bf16, or ``accelerate launch`` for 2
  gloo ranks) on the setup's synthetic workload (MNIST-shaped on CPU, CIFAR-shaped resnet18 at batch 512 on CUDA),
  read back from its ``summary.json``, with each rank's peak RSS and TF32 flags from a tiny wrapper.
* ``plain`` (served by ``plain_server``, one long-lived process per layout): the floor, a hand-written PyTorch
  loop on the same tensors, model, batch, threads, Adam and clipping, syncing only at log points, with a
  per-phase breakdown.
* ``devices``: TF32 set alike everywhere, and each CUDA child pinned to ONE GPU (else a single process would run
  ``nn.DataParallel``); ``machine``: cores, versions, the GEMM peak MFU is measured against, FLOPs per sample.
* ``study``: the bf16 study, every precision and memory-format variant stepped round-robin in one process, with a
  profile; ``report_bf16`` writes its section.
* ``time_to_accuracy``: launch to 97% on digits against the seed-000 recipe; ``mnist_rival``: launch to 98% on
  MNIST-format data against pytorch/examples' recipe (``examples_mnist``, a script run as a file).
* ``startup``: ``--help`` and the default run from process start, beside the same work as a plain script
  (``plain_default_run``, run as a file); ``step_overhead``: ``Trainer.step`` against a plain step
  (``python -m benchmarks.speed.step_overhead`` alone); ``speedrun``: airbench's CIFAR-10 recipe
  (``python -m benchmarks.speed.speedrun`` alone).
* ``results`` aggregates the runs; ``goals`` says which goal each figure meets (reported, never asserted);
  ``report`` writes benchmark.md, the README block and the chart.

Beside it, each with a command of its own: ``busy_threads`` (``python -m benchmarks busy-threads``: a run beside a
busy process) and ``augment`` (``python -m benchmarks.speed.augment``: per-sample against batched augmentation).
"""
