#!/usr/bin/env bash
# The TensorFlow matrix: for each TensorFlow version, a fresh venv under /tmp, `pip install ".[tensorflow,test]"`
# with that TensorFlow pinned (nothing else added by hand: the package metadata must resolve to a working set),
# then the default test tier. Prints one table of pass/fail counts; exits non-zero if any version fails.
#
#   .ci/tf_matrix.sh                          # the versions tpukit declares (tpukit/environment/versions.py CPU rows)
#   .ci/tf_matrix.sh 2.19.1 2.21.0            # chosen versions
#   SOURCE=/path/to/clone .ci/tf_matrix.sh    # test another checkout (default: this one)
#   TESTS="tests/engines/tensorflow tests/data" .ci/tf_matrix.sh 2.19.1   # those tests only (.ci/run does this)
#
# Heavy: each version downloads and installs TensorFlow (~600 MB) and runs ~5-10 min of tests on 2 cores.
# On CPU only: this proves the Python code and the dependency metadata on each TensorFlow, not a TPU.
set -uo pipefail
SOURCE="${SOURCE:-$(cd "$(dirname "$0")/.." && pwd)}"
PYTHON="${PYTHON:-python3}"
if [ "$#" -gt 0 ]; then
    versions=("$@")
else
    versions=(2.19.1 2.20.0 2.21.0)
fi
work="$(mktemp -d /tmp/tpukit-tf-matrix.XXXXXX)"
trap 'rm -rf "$work"' EXIT
declare -A results
status=0
for version in "${versions[@]}"; do
    venv="$work/tf-$version"
    log="$work/tf-$version.log"
    echo "== tensorflow==$version: venv $venv" >&2
    start=$(date +%s)
    if ! { "$PYTHON" -m venv "$venv" &&
           "$venv/bin/python" -m pip install --quiet --upgrade pip &&
           "$venv/bin/python" -m pip install --quiet -e "$SOURCE[tensorflow,test]" "tensorflow==$version"; } >"$log" 2>&1; then
        results[$version]="install failed (see below)|-|-|-|-|$(($(date +%s) - start))"
        tail -20 "$log" >&2
        status=1
        continue
    fi
    installed=$("$venv/bin/python" -c "import importlib.metadata as m; print(' '.join(f'{d}={m.version(d)}' for d in ('tensorflow', 'keras', 'protobuf', 'tensorflow-metadata')))" 2>/dev/null)
    # JUnit XML gives exact counts whatever pytest's summary line looks like.
    # The jax engine's tests are left to the suite on the newest TensorFlow (.ci/run): here TensorFlow only feeds
    # their tf.data, and they would add ~4 min per version.
    # shellcheck disable=SC2086  # TESTS is a list of paths
    # The unit and integration tiers: what the default tier held before the integration marker.
    (cd "$SOURCE" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --ignore=tests/engines/jax \
        -m "not slow and not cluster and not network and not root and not tpu_compile" \
        --ignore=tests/tools/test_smoke_jax.py --junitxml="$work/tf-$version.xml" ${TESTS:-}) >>"$log" 2>&1
    code=$?
    counts=$("$PYTHON" - "$work/tf-$version.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(f"{tests - failures - errors - skipped}|{failures}|{errors}|{skipped}")
EOF
)
    [ -n "$counts" ] || counts="?|?|?|?"
    results[$version]="$installed|$counts|$(($(date +%s) - start))"
    if [ "$code" -ne 0 ]; then
        status=1
        grep -E "^(FAILED|ERROR) " "$log" | head -20 >&2
    fi
done
printf '\n| tensorflow | installed | passed | failed | errors | skipped | seconds |\n|---|---|---|---|---|---|---|\n'
for version in "${versions[@]}"; do
    IFS='|' read -r installed passed failed errors skipped seconds <<<"${results[$version]}"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$version" "$installed" "$passed" "$failed" "$errors" "$skipped" "$seconds"
done
exit $status
