#!/bin/bash
# Renders each built man page as man(1) shows it, with groff's warnings on (TAP): a page fails
# on any warning, an empty rendering, or a rendering without its NAME section.
#   test-man-render.sh PAGE...
set -uo pipefail
echo "1..$#"
i=0
status=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT
for page in "$@"; do
    i=$((i + 1))
    name=${page##*/}
    # man -l: the real path a reader takes (preprocessors, the pager's width); groff -ww -z:
    # every warning groff knows, where man's --warnings keeps some quiet.
    out=$(LC_ALL=C.UTF-8 MANWIDTH=80 MANPAGER=cat man --warnings=w -l "$page" 2>"$err")
    rc=$?
    warn=$(cat "$err")
    warn+=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$page" 2>&1)
    if [ $rc -eq 0 ] && [ -z "$warn" ] && grep -q '^NAME' <<<"$out" && [ "$(wc -l <<<"$out")" -gt 20 ]; then
        echo "ok $i - $name renders without warnings ($(wc -l <<<"$out") lines)"
    else
        echo "not ok $i - $name renders without warnings"
        printf '# man exit %s\n' "$rc"
        sed 's/^/# /' <<<"$warn" | head -20
        status=1
    fi
done
exit $status
