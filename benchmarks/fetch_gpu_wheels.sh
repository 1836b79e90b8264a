#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.py needs on an offline GPU machine (docs/gpu.md), into .whl/.
#
#   bash benchmarks/fetch_gpu_wheels.sh
#
# Such a machine (Python 3.12, torch 2.11 CUDA, numpy, numba, scipy, rich, tensorboard, matplotlib, pyyaml,
# pytest, pytest-timeout, cloudpickle, pandas, nvidia-ml-py, no network) lacks gymnasium, ale-py,
# ray and stable-baselines3. hetrl runs there from the tree (PYTHONPATH), not pip-installed: its
# pinned dependencies would not resolve offline. Versions are our venv's where it has the package.
#   .whl/        the set for the device: pure-Python wheels + cp312 builds of the compiled ones;
#                installed there with
#                python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   .whl/cp311/  cp311 builds of the compiled ones, only to rehearse the install on this Python 3.11
#                machine (docs/gpu.md); `.whl/*.whl` does not pick them up.
# Not fetched: pandas (SB3 imports it only in its plotting / monitor-reading helpers), matplotlib,
# torch, numpy, numba, scipy (there), typing-extensions and cloudpickle are fetched although the device
# has them (tiny; gymnasium needs typing-extensions >= 4.12, the device's version is unknown), and so is
# threadpoolctl (tiny; the compiled CPU kernel sets its BLAS threads with it, and the device's package
# list does not name it).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
DEST=.whl
MAX_MB=40
PLAT=(--only-binary=:all: --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

ver() {  # our venv's version of $1, else $2
    "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo "$2"
}

PURE=("gymnasium==$(ver gymnasium 1.4.0)"
      "farama-notifications==$(ver farama-notifications 0.0.6)"
      "cloudpickle==$(ver cloudpickle 3.1.2)"
      "typing-extensions==$(ver typing-extensions 4.16.0)"
      "threadpoolctl==$(ver threadpoolctl 3.8.0)"
      "stable-baselines3==$(ver stable-baselines3 2.9.2)")
COMPILED=("ale-py==$(ver ale-py 0.12.1)")

# the folder must stay out of git (it travels to the GPU machine beside the tree, by name)
if ! git check-ignore -q "$DEST/probe.whl"; then
    echo "/$DEST/" >> "$(git rev-parse --git-path info/exclude)"
    echo "added /$DEST/ to $(git rev-parse --git-path info/exclude)"
fi
mkdir -p "$DEST/cp311"
rm -f "$DEST"/*.whl "$DEST"/cp311/*.whl   # one version of each: two would stop the install there

"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DEST" "${PURE[@]}"
for w in "$DEST"/*.whl; do
    case "$w" in *-none-any.whl) ;; *) echo "error: $w is not a pure-Python wheel" >&2; exit 1 ;; esac
done
for pkg in "${COMPILED[@]}"; do
    "$PY" -m pip download -q --no-deps "${PLAT[@]}" --python-version 3.12 -d "$DEST" "$pkg"
    "$PY" -m pip download -q --no-deps "${PLAT[@]}" --python-version 3.11 -d "$DEST/cp311" "$pkg"
done

echo "wheels for the GPU machine ($DEST/*.whl):"
ls -l "$DEST"/*.whl | awk '{printf "  %8.1f kB  %s\n", $5 / 1024, $NF}'
echo "rehearsal only ($DEST/cp311/*.whl):"
ls -l "$DEST"/cp311/*.whl | awk '{printf "  %8.1f kB  %s\n", $5 / 1024, $NF}'
total=$(cat "$DEST"/*.whl | wc -c)
all=$(du -sb "$DEST" | cut -f1)
awk -v t="$total" -v a="$all" -v d="$DEST" 'BEGIN { printf "total: %.1f MB for the device (%.1f MB with the cp311 rehearsal set; carried: all of %s)\n", t / 1048576, a / 1048576, d }'
if [ "$all" -gt $((MAX_MB * 1048576)) ]; then
    echo "error: $DEST is over $MAX_MB MB" >&2
    exit 1
fi
