#!/usr/bin/env bash
# Does a fresh machine pass the tests? Clones this checkout's HEAD into a new folder, makes a new virtual
# environment there, installs, prints the versions that matter and runs the default suite.
#
#   scripts/check_fresh_install.sh                 # the NEWEST versions requirements*.txt allow (no constraints):
#                                                  # tells you when a new release breaks us
#   scripts/check_fresh_install.sh --constrained   # exactly the README's test command (through constraints.txt)
#   scripts/check_fresh_install.sh [--constrained] [--dir DIR] [--keep] [-- PYTEST ARGS...]
#
# Exit status: the suite's. The venv lives in DIR (default: a new temporary folder), removed at the end unless
# --keep. torch and its CUDA libraries (several GB) come from wherever pip finds them on this machine.
set -euo pipefail

constrained=0 keep=0 dir=""
while (($#)); do
  case "$1" in
    --constrained) constrained=1 ;;
    --keep) keep=1 ;;
    --dir) dir="$2"; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${dir:-$(mktemp -d -t accel-fresh-XXXXXX)}"
mkdir -p "$dir"
if ((keep == 0)); then trap 'rm -rf "$dir"' EXIT; fi

git clone -q "$repo" "$dir/src"              # HEAD, as a clean clone: no build outputs, no local files
python3 -m venv "$dir/venv"
# shellcheck disable=SC1091
. "$dir/venv/bin/activate"
cd "$dir/src"
python -m pip install -q --upgrade pip >/dev/null
if ((constrained)); then
  echo "== install: python3 -m pip install -c constraints.txt -r requirements-dev.txt (the README's command)"
  python -m pip install -q -c constraints.txt -r requirements-dev.txt
else
  echo "== install: python3 -m pip install -r requirements-dev.txt (newest allowed, no constraints)"
  python -m pip install -q -r requirements-dev.txt
fi
python - <<'PY'
import importlib.metadata as md
names = ["torch", "torchvision", "accelerate", "datasets", "evaluate", "safetensors", "numpy", "pyyaml", "pytest",
         "pytest-xdist", "mlflow-skinny", "tensorboard", "matplotlib", "scikit-learn"]
print("== versions: " + ", ".join(f"{n} {md.version(n)}" for n in names))
PY
echo "== python -m pytest $*"
set +e
python -m pytest "$@"
status=$?
set -e
echo "== suite exit status $status ($([[ $constrained == 1 ]] && echo constrained || echo newest allowed))"
exit $status
