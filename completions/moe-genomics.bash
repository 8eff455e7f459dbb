# moe-genomics.bash: bash completion for every moe-* program (installed by `cmake --install`
# as share/bash-completion/completions/<program>, one copy per program name).
#
# Options and subcommands are read from the program's own --help when TAB is pressed, so
# this file never lists them and cannot fall behind the tools: `--...` completes the long
# options --help names; the first word completes the subcommands its Usage lines name
# (`moe-tokenize stats`, `moe-convert to-hf`, ...) and file names; anything else is a file
# name. The one thing to know: it registers itself for every moe-* command on $PATH.

# _moe_genomics_complete: the completion function (COMP_WORDS/COMP_CWORD in, COMPREPLY out).
_moe_genomics_complete() {
    local prog=${COMP_WORDS[0]} cur=${COMP_WORDS[COMP_CWORD]} help words
    help=$("$prog" --help 2>/dev/null) || return 0
    COMPREPLY=()
    if [[ $cur == -* ]]; then
        words=$(printf '%s\n' "$help" | grep -o -- '--[a-z][a-z0-9-]*' | sort -u)
        mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
        return 0
    fi
    if [ "$COMP_CWORD" -eq 1 ]; then
        words=$(printf '%s\n' "$help" |
            sed -n "s/^\(Usage:\)\{0,1\} *${prog##*/} \([a-z][a-z-]*\)\( .*\)\{0,1\}$/\2/p" | sort -u)
        mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
    fi
    mapfile -t -O "${#COMPREPLY[@]}" COMPREPLY < <(compgen -f -- "$cur")
    return 0
}

_moe_genomics_names=$(compgen -c moe- | sort -u)
# shellcheck disable=SC2086 # one word per command name
[ -z "$_moe_genomics_names" ] || complete -o filenames -F _moe_genomics_complete $_moe_genomics_names
unset _moe_genomics_names
