#!/usr/bin/env bash
# cli_docs.sh: docs/cli.md and each tool's --help list the same options.
#
# For every moe-* program built: (1) every option --help lists (its option lines, and its own
# command lines such as usage synopses) must appear in the program's `## moe-<tool>` section
# of docs/cli.md, or in its preamble (the options all programs share); (2) every option the section documents (first cell of its table rows, and
# the program's own commands in its code blocks) must appear in --help. Also: --help exits 0,
# --version's first line is `moe-<tool> (moe-genomics) X.Y.Z`, its next two the copyright
# line of LICENSE and `License: MIT ...`; the README states the same licence.
# The one thing to know: a command line is split into the commands of a pipe, and only the
# program's own commands count, so `moe-tokenize x.fa | moe-train --data -` in the
# moe-tokenize section documents no moe-train option; prose is searched only in direction (1).
set -euo pipefail
src=${MOE_SRC_DIR:?MOE_SRC_DIR is not set}
bin=${MOE_BUILD_DIR:?MOE_BUILD_DIR is not set}
command -v python3 >/dev/null || { echo "SKIP: python3 is needed"; exit 77; }
doc=$src/docs/cli.md
[ -r "$doc" ] || { echo "FAIL: $doc is missing" >&2; exit 1; }

status=0
ntools=0
copyright=$(grep -m 1 '^Copyright' "$src/LICENSE") || { echo "FAIL: LICENSE has no Copyright line" >&2; exit 1; }
head -n 1 "$src/LICENSE" | grep -qx 'MIT License' || { echo "FAIL: LICENSE is not the MIT licence" >&2; exit 1; }
grep -qF "MIT licence ([LICENSE](LICENSE)), $copyright" "$src/README.md" ||
    { echo "FAIL: README.md does not state 'MIT licence ([LICENSE](LICENSE)), $copyright'" >&2; exit 1; }
for exe in "$bin"/moe-*; do
    [ -x "$exe" ] && [ -f "$exe" ] || continue
    tool=$(basename "$exe")
    case "$tool" in *.*) continue ;; esac # build artefacts, not programs
    ntools=$((ntools + 1))
    if ! "$exe" --help >"$tool.help" 2>"$tool.help.err"; then
        echo "FAIL: $tool --help exits non-zero" >&2; status=1; continue
    fi
    first=$("$exe" --version | head -n 1)
    if ! [[ "$first" =~ ^$tool\ \(moe-genomics\)\ [0-9]+\.[0-9]+\.[0-9]+$ ]]; then
        echo "FAIL: $tool --version first line is '$first'" >&2; status=1
    fi
    if [ "$("$exe" --version | sed -n 2p)" != "$copyright" ] ||
        ! "$exe" --version | sed -n 3p | grep -q '^License: MIT '; then
        echo "FAIL: $tool --version lines 2-3 are not '$copyright' and 'License: MIT ...'" >&2; status=1
    fi
    python3 - "$tool" "$tool.help" "$doc" <<'EOF' || status=1
import re, sys
tool, help_path, doc_path = sys.argv[1:]
OPT = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[A-Za-z@])(?![\w-])")
CMD = re.compile(r"^(?:\$\s*)?([A-Za-z][\w.-]*)(?![\w.-])")


def own_segments(line, carried):
    """Parts of a shell line that belong to `tool`: split at pipes and ;/&&, each command is
    owned by its first word; `carried` is the owner of a line ended by a backslash."""
    out, owner = [], carried
    for i, part in enumerate(re.split(r"\|\||&&|;|(?<!\\)\|", line)):
        if not (i == 0 and carried):
            m = CMD.match(part.strip())
            owner = m.group(1) if m else None
        if owner == tool:
            out.append(part)
    return out, owner


def has(text, opt):
    return re.search(r"(?<![\w-])" + re.escape(opt) + r"(?![\w-])", text) is not None


# --help: option lines (definition part, before the description) and the tool's commands.
help_text = open(help_path).read()
listed = set()
for line in help_text.splitlines():
    s = line.strip()
    if s.startswith("-"):
        listed.update(OPT.findall(re.split(r"\s{2,}", s)[0]))
    else:
        segs, _ = own_segments(re.sub(r"^Usage:\s*", "", s), None)
        for seg in segs:
            listed.update(OPT.findall(seg))
            listed.update(OPT.findall(" ".join(re.findall(r"\[([^\]]*)\]", seg))))

# docs/cli.md: the `## <tool>` section up to the next `## `.
doc = open(doc_path).read()
m = re.search(r"^## " + re.escape(tool) + r"\s*$(.*?)(?=^## |\Z)", doc, re.S | re.M)
if not m:
    print(f"FAIL: docs/cli.md has no '## {tool}' section", file=sys.stderr)
    sys.exit(1)
# The preamble (before the first `## `) states the options every program shares.
section = m.group(1)
shared = doc[: doc.find("\n## ")]
documented = set()
in_code, carried = False, None
for line in section.splitlines():
    if line.startswith("```"):
        in_code, carried = not in_code, None
        continue
    if in_code:
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        segs, last = own_segments(code, carried)
        carried = last if code.rstrip().endswith("\\") else None
        for seg in segs:
            documented.update(OPT.findall(seg))
    elif line.startswith("|") and not re.match(r"^\|\s*-+\s*\|", line):
        cell = line.split("|")[1]
        documented.update(OPT.findall(cell))

fail = False
for opt in sorted(listed):
    if not has(section, opt) and not has(shared, opt):
        print(f"FAIL: {tool}: --help lists {opt}, docs/cli.md's '## {tool}' section does not",
              file=sys.stderr)
        fail = True
for opt in sorted(documented):
    if not has(help_text, opt):
        print(f"FAIL: {tool}: docs/cli.md documents {opt}, {tool} --help does not", file=sys.stderr)
        fail = True
print(f"{tool}: {len(listed)} options in --help, {len(documented)} in docs/cli.md"
      + ("" if fail else ", consistent"))
sys.exit(1 if fail else 0)
EOF
done
[ "$ntools" -gt 0 ] || { echo "FAIL: no moe-* program in $bin" >&2; exit 1; }
# a bad option: exit 2 and one message of ours naming it (getopt's own line switched off),
# then the --help hint
for exe in "$bin"/moe-*; do
    [ -x "$exe" ] && [ -f "$exe" ] || continue
    name=$(basename "$exe")
    sub=(); [ "$name" = moe-score ] && sub=(seq) # its options follow a command
    for bad in "--bogus=1:unknown option '--bogus' (or an ambiguous abbreviation)" "-Z:unknown option '-Z'"; do
        set +e; "$exe" "${sub[@]}" "${bad%%:*}" > /dev/null 2> bad.err; rc=$?; set -e
        want="$name: error: ${bad#*:}
hint: see $name --help"
        if [ "$rc" != 2 ] || [ "$(cat bad.err)" != "$want" ]; then
            echo "FAIL: $name ${bad%%:*}: exit $rc, stderr:" >&2; cat bad.err >&2; status=1
        fi
    done
done
exit $status
