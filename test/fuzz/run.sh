#!/usr/bin/env bash
# Runs every Fuzz* target of the repository for FUZZTIME each (default 10s),
# one after the other, and fails when a target finds a crasher or has no
# committed seed corpus (f.Add in its body, or testdata/fuzz/<Target>/).
#
#   test/fuzz/run.sh                 # every target, 10s each
#   FUZZTIME=1m test/fuzz/run.sh     # longer
#   FUZZMINIMIZETIME=30s ...         # minimize a crasher longer (default 1s)
#   test/fuzz/run.sh ./registry      # only the targets under these folders
#
# Fuzzing processes start no test control plane (testenv.Fuzzing), so the
# packages whose other tests use one fuzz without kube-apiserver or etcd.
# A crasher is written to testdata/fuzz/<Target>/ of its package: commit it
# with the fix, as a regression seed. A target that fails without writing
# one (Go's coordinator racing the -fuzztime deadline on a loaded machine)
# is run once more; it fails if that run fails too.
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZTIME=${FUZZTIME:-10s}
# Minimizing a new interesting input holds a worker (a long input takes
# seconds), and the -fuzztime deadline arriving meanwhile fails the target
# with "context deadline exceeded": minimize for a second at most.
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-1s}
roots=("$@")
[ ${#roots[@]} -gt 0 ] || roots=(.)

# "<dir> <Target> <file>" for every fuzz target, skipping the binaries and
# the tools modules.
targets=$(grep -rE --include='*_test.go' -n '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' "${roots[@]}" \
	| grep -vE '^(\./)?(bin|test/tools)/' \
	| sed -E 's#^(\./)?(.*)/([^/]+_test\.go):[0-9]+:func (Fuzz[A-Za-z0-9_]*)\(.*#\2 \4 \3#' | sort)
if [ -z "$targets" ]; then
	echo "fuzz: no Fuzz targets found under ${roots[*]}" >&2
	exit 1
fi

failed=()
count=0
start=$SECONDS
while read -r dir target file; do
	count=$((count + 1))
	# The seed corpus must be committed: f.Add in the target, or files in
	# testdata/fuzz/<Target>/.
	body=$(awk -v t="func $target(" 'index($0, t) == 1 {on = 1} on {print} on && /^}/ {exit}' "$dir/$file")
	if ! grep -q 'f\.Add(' <<<"$body" && ! compgen -G "$dir/testdata/fuzz/$target/*" >/dev/null; then
		echo "fuzz: $dir $target has no seed corpus (f.Add or $dir/testdata/fuzz/$target/)" >&2
		failed+=("$dir:$target (no seed corpus)")
		continue
	fi
	t0=$SECONDS
	corpus="$dir/testdata/fuzz/$target"
	before=$(ls "$corpus" 2>/dev/null | sort || true)
	ok=false
	for attempt in 1 2; do
		echo "=== fuzz ./$dir $target for $FUZZTIME (attempt $attempt)"
		if go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" -fuzzminimizetime="$FUZZMINIMIZETIME" "./$dir"; then
			ok=true
			break
		fi
		# A failure that wrote a failing input is a finding: no retry. One
		# that wrote none is Go's fuzzing coordinator racing its -fuzztime
		# deadline ("context deadline exceeded" with no input), which a
		# loaded machine hits: tried once more.
		after=$(ls "$corpus" 2>/dev/null | sort || true)
		if [ "$after" != "$before" ]; then
			echo "fuzz: ./$dir $target wrote a failing input to $corpus:" >&2
			comm -13 <(echo "$before") <(echo "$after") >&2
			break
		fi
		echo "fuzz: ./$dir $target failed without a failing input (the coordinator's deadline race)" >&2
	done
	$ok || failed+=("$dir:$target")
	echo "--- ./$dir $target: $((SECONDS - t0)) s"
done <<<"$targets"

echo "fuzz: $count targets in $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'fuzz: FAILED %s\n' "${failed[@]}" >&2
	exit 1
fi
