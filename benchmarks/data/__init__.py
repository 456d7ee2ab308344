"""The data benchmarks: the user's own images, at scale and in a first folder.

* ``scale``: ``python -m benchmarks data-scale --root DIR [--train 100000]``, an image folder of 100,000 or 1,000,000
  files: time to the first step (a first and a second launch, a resume), indexing memory and the pipeline's
  images/s, ours beside torchvision's ``ImageFolder`` (``imagefolder_rival``, a script run as a file).
* ``own_folder``: ``python -m benchmarks shapes`` (the README's folder command on drawn shapes, 3 seeds) and
  ``python -m benchmarks photos`` (photos: fine-tuned beside from scratch); docs/performance.md has the results.
* ``folders``: the folders they generate (at scale, drawn shapes, photo-like JPEGs); the tests draw their shapes
  folders from it too.
"""
