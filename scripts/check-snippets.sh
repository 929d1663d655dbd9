#!/usr/bin/env bash
# Checks that documentation snippets are code that is compiled. In a markdown
# file, a line "<!-- snippet: FILE NAME -->" followed by a ```cpp block names
# the lines of FILE (relative to the repository root) between
# "// [snippet NAME]" and "// [end snippet]"; the block must equal them, less
# the first line's indentation. usage: check-snippets.sh <repo-root> <doc.md>...
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 <repo-root> <doc.md>...  (e.g. $0 . README.md docs/training.md)" >&2
  exit 2
fi
root=$1
shift
status=0 count=0
for md in "$@"; do
  while read -r file name; do
    count=$((count + 1))
    doc=$(awk -v m="<!-- snippet: $file $name -->" '$0 == m {s = 1; next} s && /^```cpp/ {c = 1; next} c && /^```/ {exit} c {print}' "$md")
    code=$(awk -v b="// [snippet $name]" '{t = $0; sub(/^ */, "", t)} t == b {s = 1; next} s && t == "// [end snippet]" {exit} s {print}' "$root/$file")
    # the first line's leading spaces, without a pipe into head (head exits
    # after one line; printf's next write then dies of SIGPIPE, which
    # pipefail made this script's failure on long snippets, now and then)
    first=${code%%$'\n'*}
    lead=${first%%[! ]*}
    code=$(printf '%s\n' "$code" | sed "s/^ \{0,${#lead}\}//")
    if [ -z "$doc" ] || [ -z "$code" ]; then
      echo "$md: snippet '$name' of $file not found" >&2; status=1
    elif ! diff <(printf '%s\n' "$doc") <(printf '%s\n' "$code"); then
      echo "$md: snippet '$name' differs from $file" >&2; status=1
    fi
  done < <(sed -n 's/^<!-- snippet: \([^ ]*\) \([^ ]*\) -->$/\1 \2/p' "$md")
done
echo "$count snippet(s) checked"
exit $status
