#!/usr/bin/env bash
# library-floors.sh prints the floors that the library's modules (api/ and
# pkg/) set for the operators that import them: each module's go line and
# every requirement of its go.mod, as `go mod graph` lists them. With Go's module graph pruning an
# importer's minimal version selection takes each of them as a minimum, so a
# requirement that rises here raises the importer's own (a newer client-go,
# a newer Go).
#
#   hack/library-floors.sh           print them
#   hack/library-floors.sh --check   fail, with the difference, unless they
#                                    are hack/library-floors.txt (make verify)
#   hack/library-floors.sh --write   write hack/library-floors.txt
#
# A change here is a decision: write the file and say why in the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
expected=hack/library-floors.txt

floors() {
	echo "# The library's floors: written by hack/library-floors.sh --write, checked by make verify."
	for m in api pkg; do
		(
			cd "$m"
			mod=$(go list -m -f '{{.Path}}')
			echo "# $mod"
			# The module's own edges in its module graph: its go line
			# (go@VERSION) and its go.mod's requirements, as path@version.
			go mod graph | awk -v mod="$mod" '$1 == mod { print $2 }' | sort
		)
	done
}

case "${1:-}" in
"") floors ;;
--write) floors >"$expected" ;;
--check)
	if ! floors | diff -u "$expected" -; then
		echo "The library's floors (api/go.mod, pkg/go.mod) are not those of $expected (above: - expected, + now)." >&2
		echo "Importers inherit them as minimums. If the change is intended, run hack/library-floors.sh --write and say why in the commit." >&2
		exit 1
	fi
	;;
*)
	echo "usage: hack/library-floors.sh [--check|--write]" >&2
	exit 2
	;;
esac
