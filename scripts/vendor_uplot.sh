#!/bin/sh
# Fetch uPlot's files from the npm registry into gpt2/results/vendor/uplot/, unchanged,
# and print the sha256 of each for UPLOT_FILES in gpt2/results/charts.py.
#   scripts/vendor_uplot.sh 1.6.32
# npm checks the package against the registry's integrity hash as it downloads it.
# After a new version: set UPLOT_VERSION and UPLOT_FILES, run `make test`, and look at
# a run page and a matrix page in a browser (hover, drag, double-click).
set -eu
version=${1:?usage: scripts/vendor_uplot.sh VERSION}
case $version in
    *[!0-9.]*) echo "version must be digits and dots, e.g. 1.6.32" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
dest=$here/gpt2/results/vendor/uplot
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@$version" >/dev/null && tar xzf "uplot-$version.tgz")
mkdir -p "$dest"
cp "$work/package/dist/uPlot.iife.min.js" "$work/package/dist/uPlot.min.css" \
   "$work/package/LICENSE" "$dest/"
echo "UPLOT_VERSION = \"$version\""
(cd "$dest" && sha256sum uPlot.iife.min.js uPlot.min.css LICENSE |
    awk '{printf "    \"%s\": \"%s\",\n", $2, $1}')
