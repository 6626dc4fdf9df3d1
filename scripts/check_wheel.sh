#!/usr/bin/env bash
# Build the kztts wheel, install it (non-editable, with the qnn and export extras) into a fresh venv
# and run the CLI from an empty folder with a fresh cache, so nothing comes from the source tree:
#   kztts synth on the demo model, kztts export --target simulator of the demo's tiny checkpoint,
#   kztts inspect --target x-elite of the demo bundle (a target found inside the installed package;
#   the bundle's static Code Predictor graph opens on the QNN HTP simulator).
# The dependencies come from the machine's package index / pip cache (scripts/setup.sh filled it).
# Usage: bash scripts/check_wheel.sh    (KEEP=1 keeps the temporary folder; PYTHON picks the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
BUILD_PY=${BUILD_PY:-$ROOT/.venv/bin/python}   # has setuptools: the wheel is built offline
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kztts-wheel.XXXXXX")
START=$SECONDS
cleanup() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "check_wheel: FAILED (exit $rc) after $((SECONDS - START)) s; files kept in $TMP" >&2
    elif [ "${KEEP:-0}" = 1 ]; then
        echo "check_wheel: files kept in $TMP"
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
step() { echo "==> [$((SECONDS - START)) s] $*"; }

step "building the wheel from a copy of the sources"
mkdir -p "$TMP/src"
for f in setup.cfg pyproject.toml README.md runtime export qnn_configs; do
    cp -R "$f" "$TMP/src/"
done
find "$TMP/src" -name __pycache__ -prune -exec rm -rf {} +
"$BUILD_PY" -m pip wheel "$TMP/src" --no-deps --no-build-isolation --no-index -q -w "$TMP/dist"
WHEEL=$(ls "$TMP"/dist/kztts-*.whl)
echo "    $(basename "$WHEEL"): $(du -k "$WHEEL" | cut -f1) KB"

step "creating a fresh venv and installing the wheel with [qnn,export] (+ qwen-tts --no-deps)"
"$PYTHON" -m venv "$TMP/venv"
V=$TMP/venv/bin
# --no-compile: no .pyc for torch & co (most of the install time; the steps below compile what they use)
"$V/python" -m pip install -q --no-compile "$WHEEL[qnn,export]"
"$V/python" -m pip install -q --no-compile --no-deps qwen-tts==0.1.1

# an empty folder, no source tree anywhere on sys.path, a cache of its own
mkdir -p "$TMP/run"
cd "$TMP/run"
unset PYTHONPATH KZTTS_QNN_CONFIGS
export KZTTS_CACHE=$TMP/cache

step "kztts is imported from the venv's site-packages"
SITE=$("$V/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
PKG=$("$V/python" -c "import kztts; print(kztts.__file__)")
echo "    $PKG"
case "$PKG" in
    "$SITE"/kztts/__init__.py) ;;
    *) echo "check_wheel: kztts comes from $PKG, not from $SITE" >&2; exit 1 ;;
esac
"$V/python" -c "import kztts.htp.targets as t; d = t.configs_dir(); print('    targets', t.list_targets(), 'in', d); \
assert str(d).startswith('$SITE') and t.list_targets(), d"

step "kztts synth \"Hello.\" -o x.wav (the embedded demo model, built into the fresh cache)"
"$V/kztts" synth "Hello." -o x.wav
test -s x.wav

step "kztts export TINY --target simulator -o B (TINY: the demo's random-weight checkpoint)"
TINY=$(ls -d "$KZTTS_CACHE"/models/tiny-equal-*)
"$V/kztts" export "$TINY" --target simulator -o B
"$V/python" -c "from kztts.bundle.manifest import read_manifest as r; m = r('B'); \
s = sorted(n for n, g in m.graphs.items() if g.variant == 'static'); print('    static graphs:', s); assert s"

step "kztts inspect DEMO --target x-elite (DEMO: the demo bundle in the cache)"
DEMO=$(ls -d "$KZTTS_CACHE"/bundles/tiny-equal-*)
"$V/kztts" inspect "$DEMO" --target x-elite

step "all steps passed in $((SECONDS - START)) s"
times  # the second line: the CPU time of the steps (user, sys)
