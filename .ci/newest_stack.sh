#!/usr/bin/env bash
# The newest stack TPU users run: Python 3.13 (Colab's TPU runtime since Aug 2026) with the newest JAX the `jax`
# extra admits. A Debian trixie root (debootstrap, Python 3.13), cached between runs under
# ${TPUKIT_CI_CACHE:-~/.cache/tpukit-ci}; in it a fresh venv gets `pip install -e ".[jax,test]"` from this checkout's
# files, prints the versions it resolved, runs the jax engine's tests, then the README's main job on the jax engine.
# Python 3.11 with the oldest JAX stays the default tier's (.ci/run). Needs root (debootstrap, chroot, mounts).
#
#   .ci/newest_stack.sh                 # build or reuse the root, then install, test and train there
#   TESTS="tests/engines/jax/test_jax_threefry.py" .ci/newest_stack.sh   # fewer tests
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cache="${TPUKIT_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpukit-ci}"
root="$cache/trixie"
# The jax engine's tests that touch what a JAX or Python release changes (the engine, checkpoints, XLA:CPU flags, the
# PRNG, the compilation cache, activations); the recommender's, the steady-state and the export's (~3 minutes, Keras
# and keras-rs code alike on both stacks) run on Python 3.11 only, to keep CI within its budget.
TESTS="${TESTS:-$(printf 'tests/engines/jax/test_jax_%s.py ' engine checkpoint threefry xla_flags compilation_cache \
    activations multihost lost_process) tests/tools/test_smoke_jax.py tests/tools/test_doctor.py tests/test_quiet.py}"

if [ "$(id -u)" != 0 ]; then
    echo "newest_stack.sh: needs root (debootstrap, chroot, mounts); received uid $(id -u). Fix: run it as root," \
        "or skip it in .ci/run with TPUKIT_CI_NEWEST_STACK=0." >&2
    exit 1
fi
if [ ! -x "$root/usr/bin/python3.13" ]; then
    command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
    rm -rf "$root.partial"
    mkdir -p "$cache"
    echo "== building a Debian trixie root in $root (about a minute)" >&2
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        trixie "$root.partial" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 ||
        { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    mv "$root.partial" "$root"
fi
# The host's CA bundle and resolver: pip reaches the package index the way the host does.
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"

# This checkout's files (tracked and untracked, not ignored), as a fresh clone would have them.
rm -rf "$root/work"
mkdir -p "$root/work/tpukit" "$root/proc" "$root/sys" "$root/dev"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$root/work/tpukit"

unmount() {
    for point in dev/shm dev/pts dev sys proc; do
        mountpoint -q "$root/$point" && umount -l "$root/$point" || true
    done
}
trap unmount EXIT
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mountpoint -q /dev/shm && mount --bind /dev/shm "$root/dev/shm"

chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    PIP_DEFAULT_TIMEOUT=180 PIP_DISABLE_PIP_VERSION_CHECK=1 TESTS="$TESTS" /bin/bash -euo pipefail -c '
cd /work/tpukit
python3 -m venv /work/venv
/work/venv/bin/python -m pip install --quiet --upgrade pip
/work/venv/bin/python -m pip install --quiet -e ".[jax,test]"
/work/venv/bin/python - <<EOF
import importlib.metadata as m, platform
names = ("jax", "jaxlib", "keras", "tensorflow-cpu", "numpy", "keras-rs")
have = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in m.distributions()}
found = ", ".join(f"{n} {have[n]}" for n in names if n in have)
print(f"newest stack: Python {platform.python_version()}, {found}")
EOF
# No tensorflow-tpu wheel exists for 3.13: the `tpu` extra must resolve to none (setup.cfg markers), not fail.
/work/venv/bin/python -m pip install --dry-run --quiet --report /tmp/tpu.json ".[tpu]"
/work/venv/bin/python -c "
import json
names = {i[\"metadata\"][\"name\"].lower() for i in json.load(open(\"/tmp/tpu.json\"))[\"install\"]}
assert not names & {\"tensorflow-tpu\", \"libtpu\"}, names
print(\"newest stack: .[tpu] adds no tensorflow-tpu on Python 3.13\")
"
# The unit and integration tiers of those tests (the jax engine runs are integration tests).
/work/venv/bin/python -m pytest -q -p no:cacheprovider \
    -m "not slow and not cluster and not network and not root and not tpu_compile" $TESTS
# A new output directory: the cached root keeps /tmp, and a run there would resume, not train.
run="$(mktemp -d)"
cd "$run"
/work/venv/bin/python -m tpukit.train digits_cnn --output_dir "$run/out" --set runtime.engine=jax \
    --set train.epochs=2 --set train.warmup_steps=5
test -s "$run/out/metrics.json"
/work/venv/bin/python -c "import json, sys; m = json.load(open(sys.argv[1])); \
assert m[\"step\"] == 44 and not m[\"resumed_from_step\"], m" "$run/out/metrics.json"
echo "newest stack: the main job trained on the jax engine and wrote $(ls "$run/out" | tr "\n" " ")"
rm -rf "$run"
'
