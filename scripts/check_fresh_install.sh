#!/usr/bin/env bash
# Does a fresh machine pass the tests? Clones this checkout's HEAD (committed work only: a clean clone, so the
# editable install points at the clone, never at your tree), makes a new virtual environment beside it, runs the
# README's two set-up commands there (trains the quickstart run, installs the dev tools), prints the versions that
# matter and runs the default suite.
#
#   scripts/check_fresh_install.sh                 # the NEWEST versions requirements*.txt allow (the README's
#                                                  # commands without -c constraints.txt): tells you when a new
#                                                  # release breaks us
#   scripts/check_fresh_install.sh --constrained   # the README's exact commands (through constraints.txt)
#   scripts/check_fresh_install.sh [--constrained] [--dir DIR] [--keep] [-- PYTEST ARGS...]
#
# Exit status: the suite's (2 for a bad option, the failing command's when a set-up step fails). The clone and
# the venv go in DIR/src and DIR/venv; without --dir, a new temporary folder, removed at the end unless --keep
# (a DIR you name is never removed). torch and its CUDA libraries (several GB) come from wherever pip finds them.
set -euo pipefail

constrained=0 keep=0 dir=""
while (($#)); do
  case "$1" in
    --constrained) constrained=1 ;;
    --keep) keep=1 ;;
    --dir) dir="${2:?--dir needs a folder}"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -z "$dir" ]]; then
  dir="$(mktemp -d -t accel-fresh-XXXXXX)"
  if ((keep == 0)); then trap 'rm -rf "$dir"' EXIT; fi
fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
c=""
((constrained)) && c="-c constraints.txt "
mode="$([[ $constrained == 1 ]] && echo "constrained" || echo "newest allowed, no constraints")"

git clone -q "$repo" "$dir/src"              # HEAD, as a clean clone: no build outputs, no local files
echo "== $(git -C "$dir/src" log -1 --format='%h %s' | cut -c1-100)"
python3 -m venv "$dir/venv"
# shellcheck disable=SC1091
. "$dir/venv/bin/activate"
cd "$dir/src"
echo "== $(python3 --version), $(python3 -m pip --version | cut -d' ' -f1-2), in $dir ($mode)"
start=$SECONDS
# The README's two commands; ${c} is empty without --constrained.
echo "== python3 -m pip install ${c}-r requirements.txt -e . && python3 scripts/train.py"
# shellcheck disable=SC2086
python3 -m pip install -q $c -r requirements.txt -e . && python3 scripts/train.py
echo "== python3 -m pip install ${c}-r requirements-dev.txt  (set-up took $((SECONDS - start)) s so far)"
# shellcheck disable=SC2086
python3 -m pip install -q $c -r requirements-dev.txt
echo "== set-up took $((SECONDS - start)) s"
python3 - <<'PY'
import importlib.metadata as md

def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"

names = ["torch", "torchvision", "accelerate", "datasets", "evaluate", "pyyaml", "pytest", "safetensors", "numpy",
         "pytest-xdist", "mlflow-skinny", "tensorboard", "matplotlib", "scikit-learn", "huggingface-hub", "pandas", "transformers", "tokenizers"]
print("== versions: " + ", ".join(f"{n} {version(n)}" for n in names))
PY
echo "== python3 -m pytest $*"
start=$SECONDS
set +e
python3 -m pytest "$@"
status=$?
set -e
echo "== suite exit status $status after $((SECONDS - start)) s ($mode)"
exit $status
